"""Why a launch ended without a result: the first rank to leave, and what followed from it.

torchrun names the ranks that had failed when it last polled and then stops the rest; the peers
of a rank killed by a signal (the kernel's OOM killer sends SIGKILL) or of one that called
``os._exit(0)`` see it vanish and fail with "Connection reset by peer" in a collective. So the
cause is taken from the processes, not from the survivors: each rank's departure is the earlier of
its error file (what it raised, when) and its end as the launcher saw it (exit code or signal, and
when: the agent's exits file, ``launch/torchrun_agent.py``; else torchrun's or mpirun's own log
lines, which carry no time; under srun, srun's line on a node's torchrun for the ranks whose
agent went with it). The first rank to leave is the cause; a peer's later error is shown as its
consequence::

    rank 1 was killed by signal 9 (SIGKILL: the kernel's OOM killer?) in measure at step 2
    (forward); rank 0 then lost its peer (RuntimeError: Connection reset by peer)

An out-of-memory error file is the cause whenever there is one (status ``oom``).
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

from torchscale.launch.rank_exits import (
    launcher_log_exits,
    log_text,
    read_exits,
    srun_task_ends,
    srun_tasks,
)
from torchscale.results.layout import LAUNCH_LOG, NODE_DIR_GLOB, RANKS_DIR, rank_file_glob
from torchscale.results.rank_files import read_json, read_steps, steps_path
from torchscale.results.schema import CellStatus

STEPPING_WINDOWS = ("warmup", "measure", "sync_probe")
SIGNAL_HINTS = {
    signal.SIGKILL: "the kernel's OOM killer?",
    signal.SIGSEGV: "a crash in native code",
    signal.SIGABRT: "an abort in native code",
    signal.SIGBUS: "a bad memory access; a full /dev/shm?",
    signal.SIGTERM: "stopped from outside",
}
PEER_LOST = re.compile(
    r"connection (?:reset|closed) by peer|broken pipe|connection refused|socket closed"
    r"|remote process exited|peer (?:closed|disconnected)",
    re.IGNORECASE,
)
MAX_CONSEQUENCES = 3
PEER_LOST_SLACK_S = 2.0
"""How long after a peer reported it lost a rank that rank may be seen ending: its exit closes
its sockets before its parent is told, and the agent's watcher must then be scheduled
(milliseconds; longer on a loaded host)."""


def rank_dirs(cell_dir: Path) -> List[Path]:
    """This node's rank folder, then other nodes' where they are visible (a shared filesystem
    in a lock-step launch: ``node<R>/ranks``)."""
    return [cell_dir / RANKS_DIR, *sorted(cell_dir.glob(f"{NODE_DIR_GLOB}/{RANKS_DIR}"))]


def rank_files(cell_dir: Path, suffix: str) -> List[Dict[str, Any]]:
    found = []
    for folder in rank_dirs(cell_dir):
        for path in sorted(folder.glob(rank_file_glob(suffix))):
            doc = read_json(path)
            if doc:
                found.append({**doc, "_dir": str(folder.parent)})
    return found


# --- who left first ------------------------------------------------------------------------------


@dataclass
class Departure:
    """One rank that left the launch: raised (``error``), or ended by a signal or an exit."""

    rank: int
    time: Optional[float]  # when it raised or ended, whichever came first; None: not known
    where: str  # in measure at step 2 (forward)
    window: Optional[str]  # the phase its progress file names
    error: Optional[Dict[str, Any]] = None
    exitcode: Optional[int] = None
    signal: Optional[int] = None
    srun: Optional[Dict[str, Any]] = None  # srun's end of the node's torchrun they went with
    ranks: Tuple[int, ...] = ()  # under srun: every rank that went with that torchrun


def _where(progress: Optional[Dict[str, Any]], steps: Optional[Tuple[int, str]]) -> str:
    """``in measure at step 2 (forward)``: the window, and the step within it."""
    if not progress:
        return "before it reported a phase"
    window = str(progress.get("phase"))
    if window in STEPPING_WINDOWS and steps:
        before = progress.get("steps_before")
        step = steps[0] - before if isinstance(before, int) and steps[0] > before else steps[0]
        return f"in {window} at step {step} ({steps[1]})"
    return f"in {window}"


def departures(
    cell_dir: Path, exits_folder: Optional[Path], stopped_at: Optional[float] = None
) -> List[Departure]:
    """Every rank that raised, was killed, or exited before the cell was done, but for those
    the launcher ended: torchrun after another rank failed, or torchscale from ``stopped_at`` on
    (the cell's timeout or its stall watch)."""
    errors = {e["rank"]: e for e in rank_files(cell_dir, "error") if isinstance(e.get("rank"), int)}
    progress = {p["rank"]: p for p in rank_files(cell_dir, "progress")}
    ends = read_exits(exits_folder)
    log = log_text((exits_folder or cell_dir) / LAUNCH_LOG)
    placed = srun_tasks(exits_folder)
    if not ends:
        ends = launcher_log_exits(log, placed)
    found = []
    for rank in sorted(set(errors) | set(ends)):
        error, end, state = errors.get(rank), ends.get(rank, {}), progress.get(rank)
        code, killed = end.get("exitcode"), end.get("signal")
        finished = (state or {}).get("phase") == "done"
        if error is None and not killed and (code is None or (code == 0 and finished)):
            continue
        ended = end.get("time")
        ended_by_us = stopped_at is not None and isinstance(ended, float) and ended >= stopped_at
        if error is None and (end.get("stopped") or ended_by_us):
            continue
        times = [
            float(t)
            for t in ((error or {}).get("time"), end.get("time"))
            if isinstance(t, (int, float)) and not isinstance(t, bool)
        ]
        folder = Path(state["_dir"]) if state else cell_dir
        where = _where(state, read_steps(steps_path(folder, rank)))
        window = (state or {}).get("phase")
        found.append(
            Departure(rank, min(times) if times else None, where, window, error, code, killed)
        )
    return found + _srun_departures(log, placed, ends, {d.rank for d in found}, progress)


def _srun_departures(
    log: str,
    placed: Dict[Tuple[int, int], int],
    ends: Dict[int, Dict[str, Any]],
    known: Set[int],
    progress: Dict[int, Dict[str, Any]],
) -> List[Departure]:
    """One per srun task (a node's torchrun) that srun says ended badly, for its ranks that
    left no word of their own (no error file, no end in the exits file: their agent went with
    them). SIGTERM is srun or Slurm ending the step (``--kill-on-bad-exit``, a time limit)."""
    found = []
    for task, end in srun_task_ends(log).items():
        if end.get("exitcode") == 0 or end.get("signal") == signal.SIGTERM:
            continue
        silent = sorted(
            rank
            for (placed_task, _), rank in placed.items()
            if placed_task == task
            and rank not in known
            and not {"exitcode", "signal", "time", "stopped"} & set(ends.get(rank, {}))
        )
        if not silent:
            continue
        first = silent[0]
        state = progress.get(first)
        folder = Path(state["_dir"]) if state else None
        steps = read_steps(steps_path(folder, first)) if folder else None
        found.append(
            Departure(
                first, None, _where(state, steps), (state or {}).get("phase"),
                exitcode=end.get("exitcode"), signal=end.get("signal"),
                srun={**end, "task": task}, ranks=tuple(silent),
            )
        )  # fmt: skip
    return found


def _when(departure: Departure) -> float:
    return float("-inf") if departure.time is None else float(departure.time)


def _order(departure: Departure) -> Tuple[float, int]:
    """When it left; those without a time (only their launcher saw them end) first, in the
    order their launcher saw them: srun writes a line as each task's end reaches it."""
    return _when(departure), int((departure.srun or {}).get("order", 0))


def first_to_leave(found: List[Departure]) -> Departure:
    """An out-of-memory error if any; else the earliest to leave. A rank that ended without a
    word (a signal, an exit) is seen ending only after its exit has closed its sockets, so a peer
    can report the lost connection a little before: a lost peer within ``PEER_LOST_SLACK_S`` of
    a silent end (or of one whose time nobody knows) is that end's consequence."""
    ooms = [d for d in found if d.error and d.error.get("kind") == "oom"]
    pool = ooms or found
    silent = sorted((d for d in pool if d.error is None), key=_order)
    errors = sorted((d for d in pool if d.error is not None), key=_when)
    if not errors:
        return silent[0]
    first = errors[0]
    if silent:
        quiet = silent[0]
        lost = _peer_lost(first.error or {}) is not None
        soon = _when(quiet) <= _when(first) + PEER_LOST_SLACK_S
        if _when(quiet) < _when(first) or (lost and soon):
            return quiet
    return first


def _peer_lost(error: Dict[str, Any]) -> Optional[str]:
    match = PEER_LOST.search(str(error.get("message") or ""))
    return match.group(0) if match else None


def signal_text(number: int) -> str:
    """``9 (SIGKILL: the kernel's OOM killer?)``."""
    try:
        sig = signal.Signals(number)
    except ValueError:
        return str(number)
    hint = SIGNAL_HINTS.get(sig)
    return f"{number} ({sig.name}: {hint})" if hint else f"{number} ({sig.name})"


def _who(departure: Departure) -> Tuple[str, str]:
    """(``rank 2`` or ``ranks 2, 3``, ``its`` or ``their``)."""
    if len(departure.ranks) > 1:
        return f"ranks {', '.join(map(str, departure.ranks))}", "their"
    return f"rank {departure.rank}", "its"


def _srun_end(departure: Departure) -> str:
    """``ranks 2, 3 on gpu02 ended with their node's torchrun, which srun reports as task 1:
    Killed, signal 9 (SIGKILL: the kernel's OOM killer?), in measure at step 2 (forward)``."""
    end = departure.srun or {}
    who, their = _who(departure)
    said = f"task {end.get('task')}: {end.get('said')}"
    if end.get("oom"):
        said += " (Slurm's memory limit)"
    elif departure.signal:
        said += f", signal {signal_text(departure.signal)}"
    where = departure.where
    if len(departure.ranks) > 1:
        where = where.replace("before it reported", "before they reported")
    return (
        f"{who} on {end.get('host')} ended with {their} node's torchrun, which srun reports as "
        f"{said}, {where}"
    )


def describe(departure: Departure) -> str:
    d = departure
    if d.srun is not None:
        return _srun_end(d)
    if d.error is not None:
        message = str(d.error.get("message") or "")
        phase = d.error.get("phase")
        where = d.where if d.window == phase else f"in {phase}"
        return f"rank {d.rank} on {d.error.get('host')} failed {where}: {d.error.get('type')}" + (
            f": {message}" if message else ""
        )
    if d.signal:
        return f"rank {d.rank} was killed by signal {signal_text(d.signal)} {d.where}"
    return (
        f"rank {d.rank} exited with code {d.exitcode} {d.where} without reporting an error "
        "(os._exit or sys.exit in the model's code?)"
    )


def _consequence(departure: Departure) -> Optional[str]:
    d = departure
    if d.srun is not None:
        who, their = _who(d)
        return f"{who} then ended with {their} node's torchrun (srun: {d.srun.get('said')})"
    if d.error is not None:
        lost = _peer_lost(d.error)
        if lost:
            return f"rank {d.rank} then lost its peer ({d.error.get('type')}: {lost})"
        message = str(d.error.get("message") or "")[:120]
        return f"rank {d.rank} then failed in {d.error.get('phase')}: {d.error.get('type')}" + (
            f": {message}" if message else ""
        )
    if d.signal and d.signal != signal.SIGTERM:  # SIGTERM: torchrun stopping the others
        return f"rank {d.rank} then was killed by signal {signal_text(d.signal)}"
    if d.exitcode:
        return f"rank {d.rank} then exited with code {d.exitcode}"
    return None


def failure_cause(found: List[Departure]) -> Tuple[CellStatus, str]:
    """(status, error text): the first to leave, then what followed, in order."""
    root = first_to_leave(found)
    later = sorted(
        (d for d in found if d is not root),
        key=lambda d: (d.time is None, float(d.time or 0.0), d.rank),
    )
    then = [text for text in map(_consequence, later) if text]
    if len(then) > MAX_CONSEQUENCES:
        then = [*then[:MAX_CONSEQUENCES], f"and {len(then) - MAX_CONSEQUENCES} more rank(s)"]
    oom = (root.error or {}).get("kind") == "oom" or bool((root.srun or {}).get("oom"))
    status: CellStatus = "oom" if oom else "failed"
    return status, "; ".join([describe(root), *then])
