"""A worker stand-in for tests/test_forked_ranks.py: what a rank's process looks like from inside.

``python -u -m tests.support.forked_probe REPORT [exit CODE | raise | interrupt]`` writes one JSON
document to REPORT (its process, session, working directory, environment, descriptors, signal
dispositions and stdio), prints a line on stdout and stderr, then ends as asked.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any, Dict


def _target(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "closed"


def _disposition(sig: signal.Signals) -> str:
    handler = signal.getsignal(sig)
    if handler is signal.default_int_handler:
        return "KeyboardInterrupt"
    return {signal.SIG_DFL: "default", signal.SIG_IGN: "ignored"}.get(handler, "python")  # type: ignore[call-overload]


def report() -> Dict[str, Any]:
    return {
        "pid": os.getpid(),
        "parent": os.getppid(),
        "session_leader": os.getsid(0) == os.getpid(),
        "cwd": os.getcwd(),
        "argv": sys.argv[1:],
        "argv0": os.path.basename(sys.argv[0]),
        "rank": os.environ.get("RANK"),
        "probe_env": os.environ.get("FORKED_PROBE"),
        "agent_only": os.environ.get("FORKED_PROBE_AGENT_ONLY"),
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2),
        "stdout": _target(1),
        "stderr": _target(2),
        "signals": {
            sig.name: _disposition(sig)
            for sig in (
                signal.SIGINT,
                signal.SIGTERM,
                signal.SIGHUP,
                signal.SIGPIPE,
                signal.SIGUSR1,
            )
        },
        "main": __name__,
        "stdout_write_through": getattr(sys.stdout, "write_through", None),
    }


def main() -> None:
    path, *how = sys.argv[1:]
    doc = report()
    doc["fds"] = [fd for fd in doc["fds"] if _target(fd) != "closed"]  # listdir's own, closed
    with open(path, "w") as out:
        json.dump(doc, out)
    print("probe says hello on stdout")
    print("probe says hello on stderr", file=sys.stderr)
    if how[:1] == ["exit"]:
        sys.exit(int(how[1]))
    if how[:1] == ["raise"]:
        raise ValueError("the probe failed as asked")
    if how[:1] == ["interrupt"]:
        raise KeyboardInterrupt


if __name__ == "__main__":
    main()
