"""Warm process groups: the cells that share a launch layout run in one torchrun launch.

Each launch pays torchrun's agent, the worker's torch import, joining the process group and DDP's
first import of ``torch._dynamo`` (about 8.5 s on a 2-vCPU VM) before its first step. With
``launch: per_group`` (the default) the sweep runs every cell of the same layout (ranks per node,
nodes, backend) back to back in one launch (``torchscale.worker.warm_group_loop``); per cell the
worker builds a fresh model, DDP wrapper, optimizer and data stream and releases memory afterwards.

What a launch per cell gives is kept: every cell has its own folder, ``cell.json``, rank
progress, step and error files and per-rank logs; its record is appended and fsynced as soon as
it ends (the launcher reads the writer's ``progress.jsonl`` while the group runs); its
``cell_timeout_s`` is timed from when the cell before it ended. A crash or a hang ends the
launch: the cell that was running is recorded (``failed``/``timeout``, with its cause from its
own files) and the group is relaunched from the next cell. An OOM on every rank at the same
place is recorded ``oom`` and the group goes on in the same launch.

Cells that need a process of their own run per cell (:func:`per_cell_reason`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from torchscale.config.settings import CellSettings
from torchscale.launch.cell import _failure, _now, ended_stuck, prepare_cell_dir
from torchscale.launch.flight_recorder import dump_note, flight_recorder_env
from torchscale.launch.liveness import clear_owner, start_ticks, write_owner
from torchscale.launch.process import python_env, run_process
from torchscale.launch.rank_exits import clear_exits, end_launch, exits_env
from torchscale.launch.stall import Stalled, stall_watch
from torchscale.launch.torchrun import SINGLE_NODE, torchrun_command
from torchscale.plan.kind_protocol import common_identity, get_kind
from torchscale.plan.planned_cell import Cell
from torchscale.plan.profile_request import ProfileRequest
from torchscale.results.files import atomic_write_json, atomic_write_text, open_for_read
from torchscale.results.files import ensure_dir as make_dir
from torchscale.results.json_input import parse_json
from torchscale.results.layout import (
    CELL_FILE,
    GROUP_FILE,
    GROUPS_DIR,
    LAUNCH_LOG,
    PROFILE_DIR,
    PROGRESS_FILE,
    RESULT_FILE,
    TORCHRUN_LOGS,
)
from torchscale.results.rank_files import WRITES_RESULT_ENV, read_json
from torchscale.results.schema import CellStatus, ResultBase
from torchscale.results.store import ExperimentStore

PER_GROUP, PER_CELL = "per_group", "per_cell"
LAUNCH_MODES = (PER_GROUP, PER_CELL)
WORKER_MODULE = "torchscale.worker.warm_group_loop"


def per_cell_reason(
    cell: Cell, launcher: str, nnodes: int, profile: Optional[ProfileRequest]
) -> Optional[str]:
    """Why ``cell`` needs a torchrun launch of its own, or None when it can join a warm group."""
    if not get_kind(cell.kind).joins_warm_groups:
        return f"{cell.kind} cells set their own per-launch state (one launch per cell)"
    if launcher != "torchrun":
        return f"--launcher {launcher} starts every cell's ranks itself"
    if nnodes > 1 or cell.settings.nnodes > 1:
        return "multi-node cells meet in lock step, one rendezvous per cell"
    if profile is not None and profile.tool == "nsys":
        return "nsys profiles a whole process"
    if isinstance(cell.settings, CellSettings) and cell.settings.compile:
        return (
            "torch.compile caches compiled code per process: a later cell of the same model "
            "would reuse it (and its recompile limit), so its warm-up would not be its own"
        )
    return None


def group_key(cell: Cell) -> Tuple[int, int, str]:
    """Cells with the same key can share one process group."""
    s = cell.settings
    return (s.nproc_per_node, s.nnodes, s.backend)


def launch_units(
    cells: Sequence[Cell], mode: str, alone: Callable[[Cell], bool]
) -> List[List[Cell]]:
    """The launches of a sweep, in order: warm groups (each at its first cell's place, the plan's
    order kept inside) and single cells (``alone``, or every cell with ``per_cell``). A group of
    one cell is a single cell."""
    units: List[List[Cell]] = []
    groups: Dict[Tuple[int, int, str], List[Cell]] = {}
    for cell in cells:
        if mode == PER_CELL or alone(cell):
            units.append([cell])
            continue
        key = group_key(cell)
        if key not in groups:
            groups[key] = []
            units.append(groups[key])
        groups[key].append(cell)
    return units


def run_order(
    cells: Callable[[], Iterable[Cell]], mode: str, alone: Callable[[Cell], bool]
) -> Iterator[Cell]:
    """The cells of ``cells()`` in the order the sweep runs them (:func:`launch_units`, flattened),
    streamed: one more pass over ``cells()`` per warm group, so that a dry run of a matrix of any
    size shows the run's order without holding the matrix."""
    if mode == PER_CELL:
        yield from cells()
        return
    started = set()
    for cell in cells():
        if alone(cell):
            yield cell
            continue
        key = group_key(cell)
        if key in started:
            continue
        started.add(key)
        yield cell
        yield from (
            later
            for later in cells()
            if later.index > cell.index and not alone(later) and group_key(later) == key
        )


class _Overdue(Exception):
    """The running cell passed its ``cell_timeout_s``: run_process ends the launch."""


@dataclass
class _Launch:
    """What the launcher knows of one group launch while it runs."""

    cells: List[Cell]
    progress: Path
    started: float
    seen: int = 0  # progress lines handled
    clock: float = 0.0  # when the running cell's timeout clock started (monotonic)
    since: float = field(default_factory=time.time)  # when its wall time started (epoch s)
    running: Optional[int] = None  # index of the running cell
    done: List[int] = field(default_factory=list)
    wall: Dict[int, Tuple[str, float]] = field(default_factory=dict)  # started_at, epoch s

    def events(self) -> List[Dict[str, Any]]:
        try:
            with open(open_for_read(self.progress), encoding="utf-8") as handle:
                lines = handle.read().split("\n")
        except FileNotFoundError:
            return []
        new = []
        for line in lines[self.seen : len(lines) - 1]:  # the last piece may be half-written
            self.seen += 1
            try:
                event = parse_json(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                new.append(event)
        return new


GroupCallback = Callable[[Cell, List[ResultBase]], None]


def run_group(
    cells: Sequence[Cell],
    store: ExperimentStore,
    experiment: str,
    *,
    env: Optional[Dict[str, str]] = None,
    profile: Optional[ProfileRequest] = None,
    on_started: Callable[[Cell], None],
    on_poll: Optional[Callable[[float], None]] = None,
    on_tick: Optional[Callable[[], None]] = None,
    on_finished: GroupCallback,
) -> None:
    """Run ``cells`` in warm launches; every cell is handed to ``on_finished`` with its records
    as soon as it ends. Relaunches from the cell after one that crashed or hung.

    ``on_poll(elapsed_s)`` is called while a cell runs; ``on_tick()`` at every poll from the
    launch's start, a cell seen running or not (a group's first cell can be measuring before its
    start event is read, or the folder holding that event be gone): what it raises ends the
    launch."""
    pending = list(cells)
    attempt = 0
    while pending:
        pending = _launch(
            pending, store, experiment, attempt, env, profile, on_started, on_poll, on_tick,
            on_finished,
        )  # fmt: skip
        attempt += 1


def _launch(
    cells: List[Cell],
    store: ExperimentStore,
    experiment: str,
    attempt: int,
    env: Optional[Dict[str, str]],
    profile: Optional[ProfileRequest],
    on_started: Callable[[Cell], None],
    on_poll: Optional[Callable[[float], None]],
    on_tick: Optional[Callable[[], None]],
    on_finished: GroupCallback,
) -> List[Cell]:
    """One torchrun launch of ``cells``; returns those it did not get to."""
    store.check_owned()
    make_dir(store.root / GROUPS_DIR)
    group_dir = store.root / GROUPS_DIR / cells[0].cell_id
    make_dir(group_dir)
    progress = group_dir / PROGRESS_FILE
    progress.unlink(missing_ok=True)
    clear_exits(group_dir)
    dirs = [prepare_cell_dir(store, cell, experiment, profile) for cell in cells]
    atomic_write_json(
        group_dir / GROUP_FILE,
        {
            "cells": [{"cell": str(d / CELL_FILE), "out": str(d / RESULT_FILE)} for d in dirs],
            "progress": str(progress),
            "timeout_s": max(cell.settings.cell_timeout_s for cell in cells),
        },
        make_parents=False,
    )
    for cell_dir in dirs:
        atomic_write_text(
            cell_dir / LAUNCH_LOG,
            f"ran in a warm group launch (launch {attempt} of this sweep's group); torchrun's "
            f"log: {group_dir / LAUNCH_LOG}; this cell's rank logs: "
            f"{cell_dir / TORCHRUN_LOGS / 'warm'}\n",
            make_parents=False,
        )
    argv = torchrun_command(
        WORKER_MODULE,
        ["--group", str(group_dir / GROUP_FILE)],
        nproc_per_node=cells[0].settings.nproc_per_node,
        log_dir=group_dir / TORCHRUN_LOGS,
    )
    state = _Launch(cells, progress, time.monotonic())
    state.clock = state.started
    watches = [stall_watch(cell, cell_dir) for cell, cell_dir in zip(cells, dirs)]

    def handle(event: Dict[str, Any]) -> None:
        index = next((i for i, c in enumerate(cells) if c.cell_id == event.get("cell")), None)
        if index is None:
            return
        if event.get("event") == "start":
            state.running = index
            state.wall[index] = (_now(), state.since)
            on_started(cells[index])
        elif event.get("event") == "end":
            state.running = None
            state.done.append(index)
            state.clock = time.monotonic()
            clear_owner(dirs[index])
            ended = float(event.get("time") or time.time())
            on_finished(
                cells[index], _records(state, index, dirs[index], experiment, profile, ended)
            )
            state.since = ended

    stopped_at: List[float] = []  # when the timeout or the stall watch ended the launch

    def poll(elapsed_s: float) -> None:
        if on_tick is not None:
            on_tick()
        for event in state.events():
            handle(event)
        current = len(state.done)
        if current < len(cells):
            limit = cells[current].settings.cell_timeout_s
            if time.monotonic() - state.clock > limit:
                stopped_at.append(time.time())
                raise _Overdue()
            if state.running == current:
                try:
                    watches[current].check(time.monotonic())
                except Stalled:
                    stopped_at.append(time.time())
                    raise
            if on_poll is not None and state.running is not None:
                on_poll(time.monotonic() - state.clock)

    launched: List[Tuple[int, Optional[int]]] = []

    def owned(pid: int) -> None:
        launched.append((pid, start_ticks(pid)))
        for cell_dir in dirs:
            write_owner(cell_dir, pid, "torchrun")

    timed_out, stalled = False, False
    try:
        outcome = run_process(
            argv,
            timeout_s=None,
            log_path=group_dir / LAUNCH_LOG,
            env=python_env(
                {
                    **flight_recorder_env(group_dir),
                    **exits_env(group_dir),
                    **(env or {}),
                    WRITES_RESULT_ENV: "1",
                }
            ),
            on_poll=poll,
            on_start=owned,
        )
        returncode: Optional[int] = outcome.returncode
    except _Overdue:
        timed_out, returncode = True, None
    except Stalled:
        stalled, returncode = True, None
    finally:
        for cell_dir in dirs:
            clear_owner(cell_dir)
        end_launch(launched, group_dir)
    for event in state.events():
        handle(event)
    culprit = len(state.done)
    if culprit >= len(cells):
        return []
    cell, cell_dir = cells[culprit], dirs[culprit]
    if state.running != culprit:  # it never started (the launch died in its start-up)
        state.wall[culprit] = (_now(), state.since)
        on_started(cell)
    status: CellStatus
    if timed_out or stalled:
        limit = None if stalled else cell.settings.cell_timeout_s
        status, reason = ended_stuck(cell_dir, cell, limit, group_dir, stopped_at[0])
        reason += dump_note(group_dir)
    else:
        status, reason = _failure(cell_dir, cell, returncode, SINGLE_NODE, group_dir)
        if returncode == 0:
            reason = "the group launch ended before this cell ran"
        reason += dump_note(group_dir)
    identity = _identity(state, culprit, cell, experiment)
    on_finished(cell, get_kind(cell.kind).failed(cell, identity, status, reason))
    return cells[culprit + 1 :]


def _identity(
    state: _Launch, index: int, cell: Cell, experiment: str, ended: Optional[float] = None
) -> Dict[str, Any]:
    """Identity and timing: a cell's wall time runs from the end of the cell before it in the
    launch (the first: from the launch) to its own end, as the writer stamped them."""
    started_at, since = state.wall[index]
    return {
        **common_identity(cell, experiment),
        "started_at": started_at,
        "finished_at": _now(),
        "wall_s": round((ended or time.time()) - since, 3),
        "launch": {"mode": PER_GROUP, "group": state.cells[0].cell_id, "position": index},
    }


def _records(
    state: _Launch,
    index: int,
    cell_dir: Path,
    experiment: str,
    profile: Optional[ProfileRequest],
    ended: float,
) -> List[ResultBase]:
    """The records of a cell the group finished: its result, or its rank error files (OOM)."""
    cell = state.cells[index]
    identity = _identity(state, index, cell, experiment, ended)
    kind = get_kind(cell.kind)
    result = read_json(cell_dir / RESULT_FILE)
    if result:
        if profile is not None and (result.get("profile") or {}).get("profiled"):
            result["profile"].update(kind.analyze_traces(cell_dir / PROFILE_DIR, profile.target))
        return kind.records(cell, identity, result)
    status, reason = _failure(cell_dir, cell, 0, SINGLE_NODE)
    return kind.failed(cell, identity, status, reason)
