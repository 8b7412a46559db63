"""torchrun itself (``torch.distributed.run.main``, what the ``torchrun`` script calls), ended
without the interpreter's teardown once its workers are done, and telling how each worker ended.

With torch loaded, Python's teardown of the agent process takes ~0.6 s after ``main`` has
returned (measured on a 2-vCPU VM: workers done, ``main`` back 0.1 s later, the process gone
0.6 s after that), on every launch. Everything the agent does (rendezvous, workers, their exit
codes, the error file) is torchrun's; only the exit is ``os._exit``, with torchrun's exit code.

Where ``TORCHSCALE_EXITS`` names a file (``{host}`` in it becomes this host's name), each worker's
start and end are appended to it as JSON lines: rank, pid (and under srun its task,
``SLURM_PROCID``), and at its end the exit code or the signal that killed it, with the time it
ended to the millisecond; and each ``stop``, when torchrun
itself signals a worker it is ending after another failed. torchrun itself polls its
workers and reports only those that failed before it stopped the rest; a rank killed by SIGKILL
or one that called ``os._exit(0)`` is named here, and the launcher can tell who left first
(``torchscale.launch.failure_cause``). The end is seen through a pidfd, at once, and read with
``WNOWAIT``, so torchrun still reaps its workers as usual.

On a node without GPUs the ranks of torchscale's own workers are forks of this agent, which has
loaded their modules once (``torchscale.launch.forked_ranks``); anything else starts as torchrun
starts it.

The agent is a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): a process a rank started and
detached (a daemon that forks twice and calls ``setsid``) is re-parented to the agent instead of
to init, so it stays in the launch's process tree (a timed-out launch's tree is ended whole).
Once torchrun is done, every process still below the agent is one its ranks left behind: each is
ended (SIGTERM, then SIGKILL) and named on stderr, before the agent exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Set, Tuple

from torchscale.launch import forked_ranks

EXITS_ENV = "TORCHSCALE_EXITS"
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
LEFT_GRACE_S = 1.0  # what a left-behind process gets after SIGTERM
POLL_S = 0.02  # without pidfds (old kernels): how often each worker is checked


def _ended(pid: int, how: int) -> Optional[Tuple[int, int]]:
    """(si_code, si_status) of an ended child, left unreaped; None while it runs or once reaped."""
    try:
        info = os.waitid(how, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError):
        return None
    return None if info is None else (info.si_code, info.si_status)


def _start_ticks(pid: int) -> Optional[int]:
    """When ``pid`` started, in clock ticks since boot (field 22 of ``/proc/<pid>/stat``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read()
        return int(text[text.rfind(b")") + 2 :].split()[19])
    except (OSError, IndexError, ValueError):
        return None


class ExitLog:
    """Appends each worker's start and end to the exits file, from a watcher thread."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)
        self.lock = threading.Lock()
        self.workers: Dict[int, Dict[str, Any]] = {}  # by pid
        self.popens: List[subprocess.Popen] = []  # type: ignore[type-arg]
        self.read_end, self.wake = os.pipe()
        threading.Thread(target=self._watch, name="torchscale-exits", daemon=True).start()

    def write(self, doc: Dict[str, Any]) -> None:
        with self.lock:
            os.write(self.fd, (json.dumps(doc) + "\n").encode())

    def started(self, proc: subprocess.Popen, env: Dict[str, str]) -> None:  # type: ignore[type-arg]
        worker = {"rank": int(env["RANK"]), "local_rank": int(env["LOCAL_RANK"]), "pid": proc.pid}
        task = os.environ.get("SLURM_PROCID", "")
        if task.isdigit():  # under srun: which task this torchrun is, for srun's own lines
            worker["srun_task"] = int(task)
        self.workers[proc.pid] = worker
        self.popens.append(proc)
        ticks = _start_ticks(proc.pid)  # with the pid: which process it was, once pids are reused
        self.write({"event": "start", **worker, "ticks": ticks, "time": time.time()})
        os.write(self.wake, b"\0")

    def _end(self, pid: int, status: Optional[Tuple[int, int]]) -> None:
        doc: Dict[str, Any] = {"event": "end", **self.workers[pid], "time": time.time()}
        if status is not None:
            code, value = status
            doc["signal" if code in (os.CLD_KILLED, os.CLD_DUMPED) else "exitcode"] = value
        self.write(doc)

    def _watch(self) -> None:
        pidfd_open = getattr(os, "pidfd_open", None)
        how = getattr(os, "P_PIDFD", None)
        poller = select.poll()
        poller.register(self.read_end, select.POLLIN)
        watched: Dict[int, int] = {}  # pidfd -> pid
        polled: List[int] = []  # pids without a pidfd
        seen: Set[int] = set()  # pids watched or ended
        while True:
            for fd, _ in poller.poll(int(POLL_S * 1000) if polled else None):
                if fd == self.read_end:
                    os.read(self.read_end, 4096)
                    continue
                pid = watched.pop(fd)
                poller.unregister(fd)
                self._end(pid, _ended(fd, how) if how is not None else None)
                os.close(fd)
            for pid in [p for p in list(self.workers) if p not in seen]:
                seen.add(pid)
                opened: Optional[int] = None
                with contextlib.suppress(OSError):
                    opened = pidfd_open(pid) if pidfd_open and how is not None else None
                if opened is None:
                    polled.append(pid)
                else:
                    watched[opened] = pid
                    poller.register(opened, select.POLLIN)
            for pid in list(polled):
                status = _ended(pid, os.P_PID)
                if status is not None:
                    polled.remove(pid)
                    self._end(pid, status)

    def close(self) -> None:
        """torchrun is done: every worker's exit code as torchrun reaped it (a worker the watcher
        saw end after torchrun reaped it has no status in its ``end`` line)."""
        for proc in self.popens:
            if proc.returncode is not None:
                worker = self.workers[proc.pid]
                self.write({"event": "reaped", **worker, "returncode": proc.returncode})


def record_workers(path: str) -> ExitLog:
    """Workers started from here on (a ``Popen`` whose environment has ``LOCAL_RANK``) are
    watched. torch's launcher binds ``Popen`` when it is imported: this runs first."""
    exits = ExitLog(path.replace("{host}", socket.gethostname()))

    class WorkerPopen(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            env = kwargs.get("env") or {}
            if "LOCAL_RANK" in env and "RANK" in env:
                exits.started(self, env)

    killpg = os.killpg

    def stopping(pgid: int, sig: int) -> None:
        """torchrun stops the workers still running after a failure with ``os.killpg``: those
        ends are its doing, not a departure."""
        if pgid in exits.workers:
            worker = exits.workers[pgid]
            exits.write({"event": "stop", **worker, "signal": int(sig), "time": time.time()})
        killpg(pgid, sig)

    subprocess.Popen = WorkerPopen  # type: ignore[misc]
    os.killpg = stopping
    return exits


def become_subreaper() -> bool:
    """Orphans below this process are re-parented to it (Linux); False where that is not so."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def end_left_behind() -> List[str]:
    """End every process still below this one (torchrun is done: its workers are reaped) and
    reap it. Returns them as ``pid (name)``."""
    import psutil

    try:
        left = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    named = []
    for proc in left:
        with contextlib.suppress(psutil.Error):
            named.append(f"{proc.pid} ({proc.name()})")
            proc.terminate()
    _, alive = psutil.wait_procs(left, timeout=LEFT_GRACE_S)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=LEFT_GRACE_S)
    return named


def main() -> None:
    subreaper = become_subreaper()
    forked = forked_ranks.forked_worker(sys.argv[1:])
    if forked is not None:  # before torch's launcher binds Popen, and below the exit log's
        subprocess.Popen = forked_ranks.ForkingPopen  # type: ignore[misc]
    path = os.environ.get(EXITS_ENV)
    exits = None
    if path and hasattr(os, "waitid"):  # Linux (not macOS): read an end without reaping it
        try:
            exits = record_workers(path)
        except OSError as exc:  # never cost the launch: torchrun's own log still tells
            print(f"torchscale: cannot record the workers' exits in {path}: {exc}", file=sys.stderr)
    from torch.distributed.run import main as torchrun

    if forked is not None:
        forked_ranks.preload(forked)
        print(forked_ranks.FORKED_LINE, file=sys.stderr, flush=True)
    code = 0
    try:
        torchrun()
    except SystemExit as exc:
        code = forked_ranks.exit_code(exc)
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # a failed worker (ChildFailedError), a signal: as Python would report
        traceback.print_exc()
        code = 1
    if exits is not None:
        exits.close()
    if subreaper:
        left = end_left_behind()
        if left:
            print(
                f"torchscale: ended {len(left)} process(es) the ranks left running: "
                f"{', '.join(left)}",
                file=sys.stderr,
            )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
