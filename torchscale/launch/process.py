"""Run a launcher process (torchrun, srun) with a hard timeout and no orphans.

torchrun starts each worker in a session of its own, so killing the launcher's process group is not
enough: a hung cell is ended by snapshotting the whole descendant tree first, then terminating every
process in it (SIGTERM, a grace period, then SIGKILL).

A rank can start processes of its own (data loader workers, helpers) in its session; when the
rank dies they are orphans outside the launcher's tree. :func:`end_sessions` ends every process
left in the sessions of a launch's ranks and launcher once the launch is over, however it ended.

That needs torchscale alive. When torchscale itself is killed (SIGKILL, the OOM killer), the
kernel kills the launcher (``PR_SET_PDEATHSIG``) and each worker's watchdog kills the worker
(``torchscale.launch.liveness``): nothing of the cell outlives torchscale.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import psutil

from torchscale.launch.liveness import die_with_parent, orchestrator_env, start_ticks
from torchscale.results.files import open_for_write

KILL_GRACE_S = 5.0
"""How long a process gets after SIGTERM to flush logs before SIGKILL."""


@dataclass(frozen=True)
class ProcessOutcome:
    """How a launched command ended."""

    returncode: Optional[int]
    timed_out: bool
    wall_s: float
    killed_at: Optional[float] = None  # when a timed-out launch began to be ended (epoch s)


def kill_process_tree(pid: int, grace_s: float = KILL_GRACE_S) -> List[int]:
    """Terminate ``pid`` and all its descendants, whatever session they are in.

    Returns the pids that were signalled.
    """
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return []
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = [root]
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    return [p.pid for p in procs]


def end_sessions(leaders: Iterable[Tuple[int, Optional[int]]]) -> List[int]:
    """SIGKILL every process still in a session led by one of ``leaders``: (pid, start ticks)
    of each rank (torchrun starts each as a session leader) and of the launcher (one, see
    :func:`run_process`). Returns their pids.

    A session's id stays taken while any process is in it. So where a live process has the
    leader's pid but not its start ticks, that pid was reused and the old session is empty: it
    is left alone (with no start ticks known, a live pid is never taken for the leader).
    torchscale's own session is never touched.
    """
    sessions = set()
    for pid, ticks in leaders:
        now = start_ticks(pid)
        if pid > 1 and (now is None or (ticks is not None and now == ticks)):
            sessions.add(pid)
    sessions.discard(os.getsid(0))
    if not sessions:
        return []
    left = []
    for pid in psutil.pids():
        with contextlib.suppress(OSError):
            if pid != os.getpid() and os.getsid(pid) in sessions:
                os.kill(pid, signal.SIGKILL)
                left.append(pid)
    return left


def run_process(
    cmd: Sequence[str],
    *,
    timeout_s: Optional[float],
    log_path: Optional[Path] = None,
    env: Optional[Dict[str, str]] = None,
    cwd: Optional[Path] = None,
    on_poll: Optional[Callable[[float], None]] = None,
    on_start: Optional[Callable[[int], None]] = None,
    poll_s: float = 0.2,
) -> ProcessOutcome:
    """Run ``cmd`` to completion or until ``timeout_s``; output goes to ``log_path``.

    The child runs in a new session, so a Ctrl-C in the terminal reaches only torchscale, which then
    ends the child's whole tree here and re-raises KeyboardInterrupt for the caller to handle.
    The kernel kills the child if torchscale dies first. ``on_start(pid)`` is called once the
    child runs (the cell's owner file); ``on_poll(elapsed_s)`` while waiting (progress display).
    """
    start = time.monotonic()
    log_file = open_for_write(log_path, append=True) if log_path else subprocess.DEVNULL
    env = {**(os.environ if env is None else env), **orchestrator_env()}
    try:
        proc = subprocess.Popen(
            list(cmd),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        try:
            if on_start is not None:
                on_start(proc.pid)
            while True:
                elapsed = time.monotonic() - start
                remaining = None if timeout_s is None else timeout_s - elapsed
                if remaining is not None and remaining <= 0:
                    killed_at = time.time()
                    kill_process_tree(proc.pid)
                    proc.wait()
                    return ProcessOutcome(None, True, time.monotonic() - start, killed_at)
                try:
                    code = proc.wait(
                        timeout=poll_s if remaining is None else min(poll_s, remaining)
                    )
                    return ProcessOutcome(code, False, time.monotonic() - start)
                except subprocess.TimeoutExpired:
                    if on_poll is not None:
                        on_poll(elapsed)
        except BaseException:
            # KeyboardInterrupt or anything else: never leave workers behind.
            kill_process_tree(proc.pid)
            proc.wait()
            raise
    finally:
        if log_path:
            os.close(log_file)


class Terminated(KeyboardInterrupt):
    """SIGTERM received: handled like Ctrl-C (workers ended, finished results kept)."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM (``kill``, a Slurm time limit) raises :class:`Terminated`.

    Python's default SIGTERM action exits at once, skipping the cleanup that ends the workers:
    they live in sessions of their own and would run on as orphans.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def python_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment for launched workers: ours, unbuffered, plus ``extra``."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env
