"""Launch one cell with torchrun and turn however it ended into a result record.

ok: rank 0 wrote result.json. oom / failed: the first rank to leave, from its error file and from
how its process ended (``launch/failure_cause.py``: a rank killed by a signal is named, its peers'
lost connections are shown as what followed). timeout: the launch was killed after
``cell_timeout_s`` (or the stall watch fired); the progress files say which rank was stuck in which
phase, unless a rank wrote an error file: an error always wins over the hang it left behind. A
launch that ended without a word while the folder could not be written (a full disk, a read-only
mount) is recorded as ``failed`` with that cause: its ranks could not write their error files, so
the silence is the disk's, not a signal's. Once the launch is over, whatever its ranks started is
ended too (``process.end_sessions``).
"""

from __future__ import annotations

import logging
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from torchscale.launch.failure_cause import departures, failure_cause, rank_files
from torchscale.launch.flight_recorder import (
    collective_timed_out,
    dump_note,
    flight_recorder_env,
    process_group_timeout_s,
)
from torchscale.launch.liveness import clear_owner, start_ticks, write_owner
from torchscale.launch.nsys import wrapper as nsys_wrapper
from torchscale.launch.process import ProcessOutcome, python_env, run_process
from torchscale.launch.rank_exits import clear_exits, end_launch, exits_env
from torchscale.launch.stall import Stalled, stall_limit, stall_reason, stall_watch
from torchscale.launch.torchrun import (
    SINGLE_NODE,
    Rendezvous,
    format_command,
    torchrun_command,
)
from torchscale.plan.kind_protocol import common_identity, get_kind
from torchscale.plan.planned_cell import Cell
from torchscale.plan.profile_request import ProfileRequest
from torchscale.results.files import atomic_write_json
from torchscale.results.layout import (
    CELL_FILE,
    FLIGHT_RECORDER_DIR,
    LAUNCH_LOG,
    PROFILE_DIR,
    RANKS_DIR,
    RESULT_FILE,
    TORCHRUN_LOGS,
)
from torchscale.results.rank_files import (
    STEP_PHASES,
    WRITES_RESULT_ENV,
    read_json,
    read_steps,
    steps_path,
)
from torchscale.results.schema import CellStatus, ResultBase
from torchscale.results.store import ExperimentStore, storage_problem

log = logging.getLogger("torchscale")

WINDOW_ORDER = (
    "start",
    "init",
    "build",
    "warmup",
    "measure",
    "sync_probe",
    "gradient_check",
    "profile",
    "gather",
    "done",
)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def cell_command(
    cell: Cell,
    cell_dir: Path,
    rendezvous: Rendezvous = SINGLE_NODE,
    profile: Optional[ProfileRequest] = None,
) -> List[str]:
    nsys = profile is not None and profile.tool == "nsys"
    return torchrun_command(
        get_kind(cell.kind).worker_module,
        ["--cell", str(cell_dir / CELL_FILE), "--out", str(cell_dir / RESULT_FILE)],
        nproc_per_node=cell.settings.nproc_per_node,
        rendezvous=rendezvous,
        log_dir=cell_dir / TORCHRUN_LOGS,
        wrapper=nsys_wrapper(cell_dir / PROFILE_DIR, profile.target)
        if nsys and profile is not None
        else (),
    )


def node_environments(store: ExperimentStore, cell: Cell) -> Optional[List[Dict[str, Any]]]:
    """The environment of each node the cell ran on, as its ranks reported it."""
    return (read_json(store.cell_dir(cell.cell_id) / RESULT_FILE) or {}).get("nodes")


def skipped_records(cell: Cell, experiment: str, reason: str) -> List[ResultBase]:
    return get_kind(cell.kind).failed(cell, common_identity(cell, experiment), "skipped", reason)


RENDEZVOUS_ERRORS = {
    "RendezvousTimeoutError": "the other node(s) did not join within {wait:g} s",
    "RendezvousConnectionError": "could not reach the rendezvous store at {endpoint}",
    "RendezvousClosedError": "the rendezvous was closed by another node",
}


def _rendezvous_failure(cell_dir: Path, rendezvous: Rendezvous) -> Optional[str]:
    """Why a multi-node launch never started its ranks, from torchrun's log."""
    if rendezvous.standalone:
        return None
    try:
        log = (cell_dir / LAUNCH_LOG).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for name, text in RENDEZVOUS_ERRORS.items():
        if name in log:
            reason = text.format(wait=rendezvous.join_timeout_s or 0, endpoint=rendezvous.endpoint)
            log_path = cell_dir / LAUNCH_LOG
            return f"rendezvous '{rendezvous.run_id}' failed: {reason} ({name}); see {log_path}"
    return None


def _failure(
    cell_dir: Path,
    cell: Cell,
    returncode: Optional[int],
    rendezvous: Rendezvous,
    exits: Optional[Path] = None,
    stopped_at: Optional[float] = None,
) -> Tuple[CellStatus, str]:
    """(status, error text) of a launch that wrote no result. ``exits``: the folder of the
    launch's exits file (the cell's, or its warm group's); ``stopped_at``: when torchscale began
    ending the launch, if it did."""
    errors = rank_files(cell_dir, "error")
    if collective_timed_out(errors, cell_dir):
        waited = process_group_timeout_s(cell.settings.cell_timeout_s)
        where = _stuck_ranks(cell_dir, cell.settings.gpus)
        return "timeout", (
            f"a collective timed out after {waited:g} s (the process-group timeout): {where}"
        )
    left = departures(cell_dir, exits, stopped_at)
    if errors:
        return failure_cause(left)
    log = cell_dir / LAUNCH_LOG
    storage = storage_problem(cell_dir)
    if storage:
        return "failed", (
            f"{storage} in {cell_dir}: the ranks could not write their files (torchrun exit "
            f"code {returncode})"
        )
    if left:
        return failure_cause(left)
    rendezvous_error = _rendezvous_failure(cell_dir, rendezvous)
    if rendezvous_error:
        return "failed", rendezvous_error
    if returncode is not None and returncode < 0:
        return "failed", f"torchrun was killed by signal {-returncode}; see {log}"
    return "failed", (
        f"torchrun exited with code {returncode} and no rank reported an error (a rank killed by "
        f"a signal, e.g. the host's OOM killer?); see {log}"
    )


def _where(progress: Dict[str, Any], steps: Optional[Tuple[int, str]]) -> str:
    """``'measure', step 3 forward`` or, for workers that say what they do, ``'measure' (all_reduce
    float32 at 4096 B)``: the ``where`` of the rank's progress file."""
    text = f"'{progress['phase']}'" + (f", step {steps[0]} {steps[1]}" if steps else "")
    return text + (f" ({progress['where']})" if progress.get("where") else "")


def _stuck_ranks(cell_dir: Path, world_size: int, timeout_s: Optional[float] = None) -> str:
    """Who stopped where. Ranks blocked in a collective have moved past the rank that hangs, so
    the rank(s) furthest behind in (window, step, phase) are named as stuck."""
    progress = {doc["rank"]: doc for doc in rank_files(cell_dir, "progress")}
    windows = {rank: doc["phase"] for rank, doc in progress.items()}
    steps = {
        rank: read_steps(steps_path(Path(doc["_dir"]), rank)) for rank, doc in progress.items()
    }

    def position(rank: int) -> Tuple[int, int, int]:
        window = WINDOW_ORDER.index(windows[rank]) if windows[rank] in WINDOW_ORDER else -1
        step, phase = steps[rank] or (0, STEP_PHASES[0])
        return (window, step, STEP_PHASES.index(phase))

    parts = []
    silent = [r for r in range(world_size) if r not in windows]
    if silent:
        parts.append(f"rank(s) {silent} never started")
    if windows:
        behind = min(position(rank) for rank in windows)
        stuck = [rank for rank in sorted(windows) if position(rank) == behind]
        ahead = [rank for rank in sorted(windows) if position(rank) != behind]
        names = ", ".join(map(str, stuck))
        parts.append(f"rank {names} stuck in {_where(progress[stuck[0]], steps[stuck[0]])}")
        parts += [f"rank {r} waiting in {_where(progress[r], steps[r])}" for r in ahead]
    where = "; ".join(parts)
    return where if timeout_s is None else f"no result after {timeout_s:g} s: {where}"


def ended_stuck(
    cell_dir: Path,
    cell: Cell,
    timeout_s: Optional[float],
    exits: Path,
    stopped_at: Optional[float],
) -> Tuple[CellStatus, str]:
    """A launch ended by torchscale (from ``stopped_at`` on): the cell's timeout (``timeout_s``)
    or its stall watch (None). A rank that wrote an error file is the cause (a MemoryError, say,
    whose peers then waited in a collective), not the hang that followed; else the ranks stuck
    furthest behind."""
    if rank_files(cell_dir, "error"):
        status, reason = _failure(cell_dir, cell, None, SINGLE_NODE, exits, stopped_at)
        ended = (
            f"no result after {timeout_s:g} s"
            if timeout_s is not None
            else f"no rank moved for {stall_limit(cell):g} s"
        )
        return status, f"{reason}; the launch was then ended ({ended})"
    if timeout_s is None:
        return "timeout", stall_reason(cell, _stuck_ranks(cell_dir, cell.settings.gpus))
    return "timeout", _stuck_ranks(cell_dir, cell.settings.gpus, timeout_s)


def prepare_cell_dir(
    store: ExperimentStore, cell: Cell, experiment: str, profile: Optional[ProfileRequest] = None
) -> Path:
    """A clean folder for this attempt, holding the cell's input."""
    cell_dir = store.make_cell_dir(cell.cell_id)
    stale_paths = (RESULT_FILE, RANKS_DIR, PROFILE_DIR, FLIGHT_RECORDER_DIR)
    for stale in (cell_dir / name for name in stale_paths):
        if stale.is_symlink() or not stale.is_dir():
            stale.unlink(missing_ok=True)
        else:
            shutil.rmtree(stale)
    atomic_write_json(
        cell_dir / CELL_FILE,
        {
            "cell_id": cell.cell_id,
            "kind": cell.kind,
            "experiment": experiment,
            "settings": cell.settings.model_dump(mode="json"),
            "profile": profile.to_json() if profile else None,
        },
        make_parents=False,  # never re-create a results folder deleted meanwhile
    )
    return cell_dir


def run_cell(
    cell: Cell,
    store: ExperimentStore,
    experiment: str,
    *,
    rendezvous: Rendezvous = SINGLE_NODE,
    env: Optional[Dict[str, str]] = None,
    on_poll: Optional[Callable[[float], None]] = None,
    profile: Optional[ProfileRequest] = None,
    prefix: Sequence[str] = (),
    records_results: bool = True,
    command: Optional[Sequence[str]] = None,
) -> List[ResultBase]:
    """Launch ``cell`` and return its records (never raises for a failing cell).

    ``prefix`` runs torchrun on the cell's nodes (``srun ...``). A node that does not record
    results (lock-step node R > 0) returns no records when its launch succeeds: the result is
    written on node 0. ``command`` replaces the torchrun launch (``--launcher mpirun``).
    """
    cell_dir = prepare_cell_dir(store, cell, experiment, profile)
    started, started_at = time.monotonic(), _now()
    # A multi-node launch may first wait for the other nodes at the rendezvous.
    timeout_s = cell.settings.cell_timeout_s + (rendezvous.join_timeout_s or 0.0)
    argv = list(command or [*prefix, *cell_command(cell, cell_dir, rendezvous, profile)])
    log.debug("cell %s: %s (log: %s)", cell.cell_id, format_command(argv), cell_dir / LAUNCH_LOG)
    what = Path(argv[0]).name if command or prefix else "torchrun"
    # Other nodes' ranks report on their own hosts: the watch sees a single node's only.
    single = rendezvous is SINGLE_NODE and not prefix
    watch = stall_watch(cell, cell_dir) if single else None

    stopped_at: List[float] = []  # when the stall watch ended the launch

    def poll(elapsed_s: float) -> None:
        if watch is not None:
            try:
                watch.check(time.monotonic())
            except Stalled:
                stopped_at.append(time.time())
                raise
        if on_poll is not None:
            on_poll(elapsed_s)

    stalled = False
    clear_exits(cell_dir)
    launched: List[Tuple[int, Optional[int]]] = []
    try:
        outcome = run_process(
            argv,
            timeout_s=timeout_s,
            log_path=cell_dir / LAUNCH_LOG,
            env=python_env(
                {
                    **flight_recorder_env(cell_dir),
                    **exits_env(cell_dir),
                    **(env or {}),
                    WRITES_RESULT_ENV: "1" if records_results else "0",
                }
            ),
            on_poll=poll,
            on_start=lambda pid: _owned(launched, cell_dir, pid, what),
        )
    except Stalled:
        stalled, outcome = True, ProcessOutcome(None, True, time.monotonic() - started)
    finally:
        clear_owner(cell_dir)
        end_launch(launched, cell_dir)
    timing = {
        "started_at": started_at,
        "finished_at": _now(),
        "wall_s": round(time.monotonic() - started, 3),
    }
    kind = get_kind(cell.kind)
    identity = {**common_identity(cell, experiment), **timing, "launch": {"mode": "per_cell"}}
    result = read_json(cell_dir / RESULT_FILE)
    if stalled or outcome.timed_out:
        limit = None if stalled else timeout_s
        ended = stopped_at[0] if stopped_at else outcome.killed_at
        status, reason = ended_stuck(cell_dir, cell, limit, cell_dir, ended)
        return kind.failed(cell, identity, status, reason + dump_note(cell_dir))
    finished = outcome.returncode == 0 or _only_nsys_failed(cell_dir, cell, profile, result)
    if finished and not records_results:
        return []
    if finished and result:
        if profile is not None and (result.get("profile") or {}).get("profiled"):
            result["profile"].update(kind.analyze_traces(cell_dir / PROFILE_DIR, profile.target))
        return kind.records(cell, identity, result)
    status, reason = _failure(cell_dir, cell, outcome.returncode, rendezvous, cell_dir)
    return kind.failed(cell, identity, status, reason + dump_note(cell_dir))


def _owned(launched: List[Tuple[int, Optional[int]]], cell_dir: Path, pid: int, what: str) -> None:
    launched.append((pid, start_ticks(pid)))
    write_owner(cell_dir, pid, what)


def _only_nsys_failed(
    cell_dir: Path,
    cell: Cell,
    profile: Optional[ProfileRequest],
    result: Optional[Dict[str, Any]],
) -> bool:
    """A non-zero exit that is only nsys saying it wrote no report: the trigger decided not to
    profile, so the capture range never opened. Every rank reached ``done``, none failed."""
    if profile is None or profile.tool != "nsys" or rank_files(cell_dir, "error"):
        return False
    if result is not None and (result.get("profile") or {}).get("profiled") is not False:
        return False  # a traced cell must have its report
    phases = [doc.get("phase") for doc in rank_files(cell_dir, "progress")]
    return len(phases) >= cell.settings.nproc_per_node and set(phases) == {"done"}
