"""The suite's two pytest workers share the machine: the fast tests in the background.

README's test command runs two pytest-xdist workers (``-n 2``, pyproject.toml).
The *foreground* worker runs, in file order, every test that launches torchrun (``slow``) or
reads a time, a speed, a verdict or a time bound (``timed``); the *background* worker runs the
rest, in-process tests of one core each, at Linux's idle scheduling class (``SCHED_IDLE``):
it gets a core only when no other process wants it, so it fills the cores a launch leaves idle
(its start-ups' waits, a one-rank cell, the rendezvous) and a rank that wants a core preempts it
at once: the run-queue wait, which the busy-host verdicts read, stays the rank's own.

A foreground test that reads a time (and the ``session_runs`` fixture's lanes, which fill both
cores) takes the machine to itself, unless all it reads is a time bound or two clocks over the
same steps (``timed(alone=False)``: a neighbour preempted at once cannot move those); such a test
runs beside the background like a launch that reads no time. One that takes the machine
(:func:`alone`) waits for the background test in flight to end and holds the next one back until
it is done. Two ``flock`` files in the session's tmp folder, which both workers share, make that
a readers-writer lock whose writer is not starved: the background passes through the gate before
each test; the foreground holds the gate while it waits.

Without xdist (``-n 0``, one process) every function here does nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Callable, Dict, Iterator, Optional

GATE_FILE = "machine-gate.lock"
SHARE_FILE = "machine-share.lock"
GROUPS_FILE = "test-groups.json"
"""Each collected test and whether it runs in the background, written by the workers (who
collect) for the controller's scheduler (which does not)."""

_root: Optional[Path] = None
_alone_depth = 0
_idle_class = False
_kept: Optional[contextlib.ExitStack] = None


def configure(worker_basetemp: Optional[Path]) -> None:
    """In an xdist worker: the session's folder both workers share (its basetemp's parent)."""
    global _root
    _root = worker_basetemp.parent if worker_basetemp is not None else None


def _open(name: str) -> IO[bytes]:
    assert _root is not None
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(_root / name, flags, 0o600), "r+b")


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """The machine to this worker alone while in the block (re-entrant; a lane run inside a
    timed test's fixture takes it once)."""
    global _alone_depth
    if _root is None or _alone_depth:
        _alone_depth += 1
        try:
            yield
        finally:
            _alone_depth -= 1
        return
    with _open(GATE_FILE) as gate, _open(SHARE_FILE) as share:
        fcntl.flock(gate, fcntl.LOCK_EX)  # no new background test starts ...
        fcntl.flock(share, fcntl.LOCK_EX)  # ... and the one in flight has ended
        _alone_depth += 1
        try:
            yield
        finally:
            _alone_depth -= 1
            fcntl.flock(share, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


@contextlib.contextmanager
def alone_until(keep: bool) -> Iterator[None]:
    """:func:`alone` for one test, kept past its end while ``keep`` (the next test takes the
    machine alone too): no background test starts between the two, so the next one never waits
    for a background test in flight (~60 s over a whole run, in the gaps between timed tests)."""
    global _kept
    if _kept is None:
        _kept = contextlib.ExitStack()
        _kept.enter_context(alone())
    try:
        yield
    finally:
        if not keep:
            _kept.close()
            _kept = None


@contextlib.contextmanager
def in_background() -> Iterator[None]:
    """One background test: at the idle scheduling class, and never while the foreground has
    the machine to itself."""
    global _idle_class
    if _root is None:
        yield
        return
    if not _idle_class:
        # The calling thread's class; threads and processes it starts inherit it.
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        _idle_class = True
    with _open(GATE_FILE) as gate, _open(SHARE_FILE) as share:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(gate, fcntl.LOCK_UN)
        fcntl.flock(share, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(share, fcntl.LOCK_UN)


def write_groups(root: Path, background: Dict[str, bool]) -> None:
    """The workers' collection, for :func:`two_workers` (each worker writes the same map)."""
    with tempfile.NamedTemporaryFile("w", dir=root, suffix=".tmp", delete=False) as out:
        json.dump(background, out)
    os.replace(out.name, root / GROUPS_FILE)


def scope_of(root: Path) -> Callable[[str], str]:
    """A collected test's scope for the scheduler: ``background`` or ``foreground`` (a test the
    workers did not list runs in the foreground). The map is read at the first call, once the
    workers have collected."""
    groups: Dict[str, bool] = {}

    def scope(nodeid: str) -> str:
        if not groups:
            path = root / GROUPS_FILE
            groups.update(json.loads(path.read_text()) if path.exists() else {})
        return "background" if groups.get(nodeid, False) else "foreground"

    return scope


def two_workers(config: Any, log: Any, root: Path) -> Any:
    """xdist's scope scheduler with two scopes, :func:`scope_of`'s, each in file order, so each
    goes to a worker of its own. (xdist's ``loadgroup`` would say the same with marks, but its
    group reaches the scheduler through a node id that pytest 9.2 no longer lets it change.)"""
    from xdist.scheduler import LoadScopeScheduling

    scope = scope_of(root)

    class TwoWorkers(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

    return TwoWorkers(config, log)
