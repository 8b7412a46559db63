"""Ranks of torchscale's own workers forked from the torchrun agent, on a node without GPUs.

Each rank of a launch used to start a fresh interpreter that imported torch (~1.5 s of CPU on a
2-core VM), torchscale's worker (~0.2 s) and, through ``DistributedDataParallel.__init__``,
``torch._dynamo`` (~1.4 s): the same CPU again on every rank of every launch. The agent loads
those modules once (:func:`preload`) and starts each rank as a fork of itself instead of an
``exec`` (:class:`ForkingPopen`): a 2-rank launch of one tiny cell took 10.0 s of CPU and
6.9 s of wall time on a 2-core VM, and takes 5.6 s and 5.5 s (``benchmarks/forked_ranks.py``).

A forked rank is still a ``subprocess.Popen`` child of torchrun's agent, with the pid, session,
file descriptors, environment, working directory, signal dispositions and exit status that the
``exec`` of ``python -u -m <worker>`` would have given it, so torchrun, its log redirects and
error files, and the agent's exit log see the same process. It differs where a fresh interpreter
cannot be copied: its command line is the agent's (the worker's arguments are in it), and the
modules the agent loaded are already imported.

Forked only where all of these hold, and otherwise started exactly as torchrun starts it:

- the worker is one of :data:`FORKED_WORKERS` (torchscale's training and communication
  workers). A user's script (``--script``) starts in a fresh interpreter as under plain torchrun,
  and so does validate's smoke test, which checks that one can;
- torchrun runs it as ``python -u -m <worker>``: a wrapper (``nsys profile``, torchrun's
  ``--no-python``) must ``exec``;
- the node has no GPU device file: CUDA does not survive a fork once a process has initialised
  it, and on GPU nodes the fresh start is the one proven on a GPU (docs/perf-gpu.md);
- ``TORCHSCALE_FORK_RANKS`` is not ``0``.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import io
import os
import resource
import runpy
import signal
import subprocess
import sys
import threading
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

FORK_ENV = "TORCHSCALE_FORK_RANKS"
"""``0``: every rank starts in a fresh interpreter, as torchrun starts it."""

FORKED_LINE = (
    "torchscale: each rank is a fork of this agent, which loaded the worker's modules once "
    f"({FORK_ENV}=0 starts every rank in a fresh interpreter)"
)
"""What the agent says in its launch log when it forks its ranks."""

FORKED_WORKERS: Dict[str, Tuple[str, bool]] = {
    "torchscale.worker": ("torchscale.worker.main", True),
    "torchscale.worker.warm_group_loop": ("torchscale.worker.warm_group_loop", True),
    "torchscale.comm.worker": ("torchscale.comm.worker", False),
}
"""Worker module -> (the module to load in the agent, whether its ranks build DDP, which
imports ``torch._dynamo``)."""

_POPEN = subprocess.Popen
_KILLPG = os.killpg


def _unbuffered_python(argv: Sequence[str]) -> Optional[str]:
    """The worker module of ``python -u -m <module> ...`` (torchrun's command for a worker)."""
    python = os.environ.get("PYTHON_EXEC", sys.executable)
    if len(argv) >= 4 and argv[0] == python and list(argv[1:3]) == ["-u", "-m"]:
        return argv[3]
    return None


def forked_worker(agent_argv: Sequence[str]) -> Optional[str]:
    """The worker module whose ranks this agent (its torchrun arguments) forks, or None."""
    args = list(agent_argv)
    if os.environ.get(FORK_ENV, "1") == "0" or "--no-python" in args or "--run-path" in args:
        return None
    module = next(
        (args[i + 1] for i, arg in enumerate(args[:-1]) if arg in ("-m", "--module")), None
    )
    if module not in FORKED_WORKERS:
        return None
    from torchscale.hardware.environment import gpu_device_files

    return None if gpu_device_files() else module


def preload(module: str) -> None:
    """Load what each rank of ``module`` would import, once, in the agent. The objects loaded are
    then frozen out of the collector's sight (``gc.freeze``): a rank's collections would otherwise
    walk every one of them and so copy their pages from the agent's (its exit's collection too)."""
    code, builds_ddp = FORKED_WORKERS[module]
    importlib.import_module(code)
    if builds_ddp:
        importlib.import_module("torch._dynamo")
    gc.collect()
    gc.freeze()


def _exec_like_signals() -> None:
    """The dispositions ``exec`` and a new interpreter would give: handlers the agent installed
    are reset (SIGINT to Python's KeyboardInterrupt), ignored signals stay ignored."""
    for sig in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError, TypeError):
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
    if signal.getsignal(signal.SIGINT) == signal.SIG_DFL:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # what Python's start-up ignores
        signal.signal(sig, signal.SIG_IGN)


def _std_streams(fds: Tuple[int, int, int], keep: Sequence[int]) -> None:
    """``fds`` (stdin, stdout, stderr; -1: the agent's) as 0, 1 and 2, every other descriptor
    closed but ``keep``, and new unbuffered stdio objects on them (``python -u``)."""
    lifted = [os.dup(fd) if 0 <= fd < 3 else fd for fd in fds]
    for target, fd in enumerate(lifted):
        if fd >= 0:
            os.dup2(fd, target)
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = limit if 0 < limit < (1 << 20) else (1 << 20)
    low = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, limit)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace"
    )


def exit_code(exc: SystemExit) -> int:
    """The status an interpreter ends with on ``exc`` (a message is printed, and is 1)."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)  # what Python prints for sys.exit("message")
    return 1


def _run_rank(module: str, args: List[str], env: Dict[str, str], child: Dict[str, Any]) -> None:
    """In the forked child: become what ``exec`` of ``python -u -m module args`` would have
    started, run it, and end as that interpreter would. ``child``: ``_execute_child``'s arguments
    by name. Never returns."""
    code = 1
    try:
        if child["start_new_session"]:
            os.setsid()
        fds = (child["p2cread"], child["c2pwrite"], child["errwrite"])
        _std_streams(fds, tuple(child["pass_fds"] or ()))
        if child["cwd"] is not None:
            os.chdir(child["cwd"])
        os.environ.clear()
        os.environ.update(env)
        subprocess.Popen = _POPEN  # type: ignore[misc]  # the agent's exit-log hooks stay its own
        os.killpg = _KILLPG
        _exec_like_signals()
        atexit._clear()
        with contextlib.suppress(ImportError):
            import numpy

            numpy.random.seed()  # a fresh interpreter's numpy draws its own seed
        sys.argv = [module, *args]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exit_code(exc)
        except KeyboardInterrupt:
            traceback.print_exc()
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)  # as Python ends on an uncaught Ctrl-C
        except BaseException:
            traceback.print_exc()
            code = 1
        with contextlib.suppress(BaseException):
            threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads, as at exit
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


class ForkingPopen(subprocess.Popen):  # type: ignore[type-arg]
    """``Popen`` that forks, without ``exec``, a ``python -u -m <worker>`` of
    :data:`FORKED_WORKERS`; any other command starts as ``Popen`` starts it."""

    def _execute_child(self, args: Any, executable: Any, *rest: Any) -> None:
        names = _EXECUTE_CHILD_PARAMS
        given = dict(zip(names, (args, executable, *rest)))
        argv = [os.fsdecode(a) for a in args] if isinstance(args, (list, tuple)) else []
        module = _unbuffered_python(argv)
        env = given.get("env")
        plain = given.get("preexec_fn") is None and given.get("shell") is False
        if module not in FORKED_WORKERS or env is None or not plain:
            super()._execute_child(args, executable, *rest)  # type: ignore[misc]
            return
        environment = {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
        pid = os.fork()
        if pid == 0:
            _run_rank(module, argv[4:], environment, given)
        self.pid = pid
        self._child_created = True
        self._close_pipe_fds(  # type: ignore[attr-defined]
            given["p2cread"], given["p2cwrite"], given["c2pread"], given["c2pwrite"],
            given["errread"], given["errwrite"],
        )  # fmt: skip


def _parameters() -> Tuple[str, ...]:
    import inspect

    return tuple(inspect.signature(_POPEN._execute_child).parameters)[1:]  # type: ignore[attr-defined]


_EXECUTE_CHILD_PARAMS = _parameters()
"""``Popen._execute_child``'s parameters after ``self`` (they differ across Python versions)."""
