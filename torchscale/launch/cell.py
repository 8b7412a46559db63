"""Launch one cell with torchrun and turn however it ended into a result record.

ok: rank 0 wrote result.json. oom / failed: the root-cause rank is the one that reported an
out-of-memory error, else the first to fail (later failures are usually peers losing it).
timeout: the launch was killed after ``cell_timeout_s``; the progress files say which rank was
stuck in which phase.
"""

from __future__ import annotations

import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Dict, List, Optional

from torchscale.launch.kinds import common_identity, get_kind
from torchscale.launch.process import python_env, run_process
from torchscale.launch.torchrun import SINGLE_NODE, Rendezvous, torchrun_command
from torchscale.plan.matrix import Cell
from torchscale.results.schema import CellStatus, ResultBase
from torchscale.results.store import ExperimentStore, atomic_write_json
from torchscale.worker.reporting import (
    RANKS_DIR,
    STEP_PHASES,
    read_json,
    read_steps,
    steps_path,
)

CELL_FILE = "cell.json"
RESULT_FILE = "result.json"
LAUNCH_LOG = "launch.log"
TORCHRUN_LOGS = "torchrun"
WINDOW_ORDER = (
    "start",
    "init",
    "build",
    "warmup",
    "measure",
    "sync_probe",
    "profile",
    "gather",
    "done",
)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def cell_command(cell: Cell, cell_dir: Path, rendezvous: Rendezvous = SINGLE_NODE) -> List[str]:
    return torchrun_command(
        get_kind(cell.kind).worker_module,
        ["--cell", str(cell_dir / CELL_FILE), "--out", str(cell_dir / RESULT_FILE)],
        nproc_per_node=cell.settings.nproc_per_node,
        rendezvous=rendezvous,
        log_dir=cell_dir / TORCHRUN_LOGS,
    )


def skipped_records(cell: Cell, experiment: str, reason: str) -> List[ResultBase]:
    return get_kind(cell.kind).failed(cell, common_identity(cell, experiment), "skipped", reason)


def _rank_files(cell_dir: Path, suffix: str) -> List[dict]:
    found = (read_json(p) for p in sorted((cell_dir / RANKS_DIR).glob(f"rank*.{suffix}.json")))
    return [doc for doc in found if doc]


def _failure(cell_dir: Path, returncode: Optional[int]) -> tuple:
    """(status, error text) of a launch that wrote no result."""
    errors = _rank_files(cell_dir, "error")
    if errors:
        ooms = [e for e in errors if e.get("kind") == "oom"]
        root = min(ooms or errors, key=lambda e: e.get("time", 0.0))
        status: CellStatus = "oom" if ooms else "failed"
        others = sorted(e["rank"] for e in errors if e is not root)
        also = f" (then ranks {others} failed too)" if others else ""
        return status, (
            f"rank {root['rank']} on {root.get('host')} failed in {root.get('phase')}: "
            f"{root.get('type')}: {root.get('message')}{also}"
        )
    log = cell_dir / LAUNCH_LOG
    if returncode is not None and returncode < 0:
        return "failed", f"torchrun was killed by signal {-returncode}; see {log}"
    return "failed", (
        f"torchrun exited with code {returncode} and no rank reported an error (a rank killed by "
        f"a signal, e.g. the host's OOM killer?); see {log}"
    )


def _where(progress: dict, steps: Optional[tuple]) -> str:
    """``'measure', step 3 forward`` or, for workers that say what they do, ``'measure' (all_reduce
    float32 at 4096 B)``: the ``where`` of the rank's progress file."""
    text = f"'{progress['phase']}'" + (f", step {steps[0]} {steps[1]}" if steps else "")
    return text + (f" ({progress['where']})" if progress.get("where") else "")


def _stuck_ranks(cell_dir: Path, world_size: int, timeout_s: float) -> str:
    """Who stopped where. Ranks blocked in a collective have moved past the rank that hangs, so
    the rank(s) furthest behind in (window, step, phase) are named as stuck."""
    progress = {doc["rank"]: doc for doc in _rank_files(cell_dir, "progress")}
    windows = {rank: doc["phase"] for rank, doc in progress.items()}
    steps = {rank: read_steps(steps_path(cell_dir, rank)) for rank in windows}

    def position(rank: int) -> tuple:
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
    return f"no result after {timeout_s:g} s: " + "; ".join(parts)


def prepare_cell_dir(store: ExperimentStore, cell: Cell, experiment: str) -> Path:
    """A clean folder for this attempt, holding the cell's input."""
    cell_dir = store.cell_dir(cell.cell_id)
    for stale in (cell_dir / RESULT_FILE, cell_dir / RANKS_DIR):
        if stale.is_dir():
            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    cell_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        cell_dir / CELL_FILE,
        {
            "cell_id": cell.cell_id,
            "kind": cell.kind,
            "experiment": experiment,
            "settings": cell.settings.model_dump(mode="json"),
        },
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
) -> List[ResultBase]:
    """Launch ``cell`` and return its records (never raises for a failing cell)."""
    cell_dir = prepare_cell_dir(store, cell, experiment)
    started, started_at = time.monotonic(), _now()
    outcome = run_process(
        cell_command(cell, cell_dir, rendezvous),
        timeout_s=cell.settings.cell_timeout_s,
        log_path=cell_dir / LAUNCH_LOG,
        env=python_env(env),
        on_poll=on_poll,
    )
    timing = {
        "started_at": started_at,
        "finished_at": _now(),
        "wall_s": round(time.monotonic() - started, 3),
    }
    kind = get_kind(cell.kind)
    identity = {**common_identity(cell, experiment), **timing}
    result = read_json(cell_dir / RESULT_FILE)
    if outcome.timed_out:
        reason = _stuck_ranks(cell_dir, cell.settings.gpus, cell.settings.cell_timeout_s)
        return kind.failed(cell, identity, "timeout", reason)
    if outcome.returncode == 0 and result:
        return kind.records(cell, identity, result)
    status, reason = _failure(cell_dir, outcome.returncode)
    return kind.failed(cell, identity, status, reason)
