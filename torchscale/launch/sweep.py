"""Run a plan: every cell in order, each result appended (and fsynced) as soon as it exists.

The experiment folder is locked for the whole sweep. Ctrl-C ends the running cell's processes and
propagates KeyboardInterrupt; everything recorded before it is intact and ``--resume`` runs only
the cells without a record.

Before anything runs, the sweep refuses a cell that a live process still runs (left by a
torchscale that was killed) and, on ``--resume``, cells whose settings changed since their stored
results (unless ``--force``). A full or read-only disk ends the sweep with one line
(:class:`~torchscale.results.files.StorageError`): what finished is intact, and the cell it
killed is recorded with that cause, in the space the sweep set aside for it.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Protocol, Sequence, Tuple

from torchscale.config.base import flatten_settings
from torchscale.errors import TorchscaleError
from torchscale.escaping import csv_text
from torchscale.hardware.environment import (
    NodeDevices,
    collect_environment,
    node_devices,
)
from torchscale.launch.backends import backend_skip_reason
from torchscale.launch.cell import node_environments, run_cell, skipped_records
from torchscale.launch.cpu_threads import cell_env
from torchscale.launch.dataset_fetch import fetch_datasets
from torchscale.launch.liveness import live_owner
from torchscale.launch.multinode import Launch, check_node_zero, merge_node_environments
from torchscale.launch.nsys import resolve_tool
from torchscale.launch.process import sigterm_as_interrupt
from torchscale.launch.strategy_support import compile_skip_reason, strategy_skip_reason
from torchscale.launch.warm_groups import PER_CELL, launch_units, per_cell_reason, run_group
from torchscale.plan.kind_protocol import cell_kinds, get_kind
from torchscale.plan.matrix import Plan
from torchscale.plan.planned_cell import NON_IDENTITY_FIELDS, Cell
from torchscale.plan.profile_request import ProfileRequest
from torchscale.results.cell_files import write_cell_files
from torchscale.results.files import StorageError, atomic_write_text, storage_cause
from torchscale.results.layout import SUMMARY
from torchscale.results.schema import SCHEMA_VERSION, ResultBase
from torchscale.results.store import ExperimentStore, FolderLostError, storage_problem
from torchscale.results.validity import INVALID, checked_record, latest_runs
from torchscale.version import __version__

if TYPE_CHECKING:
    from pandas import DataFrame

    from torchscale.config.settings import BenchmarkConfig

RETRYABLE = {"failed", "timeout", INVALID}


class SweepEvents(Protocol):
    """What the console shows; the sweep itself prints nothing."""

    def cell_started(self, cell: Cell, position: int, total: int, cell_dir: Path) -> None:
        """``cell`` (the ``position``-th of ``total`` to run) started in ``cell_dir``."""

    def cell_polled(self, elapsed_s: float) -> None: ...

    def cell_finished(
        self, cell: Cell, records: List[ResultBase], table: Optional[DataFrame]
    ) -> None: ...


@dataclass
class SweepOptions:
    resume: bool = False
    retry_failed: bool = False
    force: bool = False  # with resume: record cells whose settings changed beside the old ones
    launch: Launch = field(default_factory=Launch)
    env: Optional[Dict[str, str]] = None
    launch_mode: Optional[str] = None  # per_group or per_cell; None: the config's ``launch:``


def _timestamp() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def build_manifest(plan: Plan, previous: Dict[str, Any], command: List[str]) -> Dict[str, Any]:
    now = _timestamp()
    # The creation time is part of a run's identity in the history: to the microsecond, so two
    # runs of one experiment started on one host in the same second stay two runs.
    created = datetime.now(timezone.utc).isoformat(timespec="microseconds")
    return {
        "schema_version": SCHEMA_VERSION,
        "experiment": plan.config.experiment_name,
        "torchscale": __version__,
        "created_at": previous.get("created_at", created),
        "updated_at": now,
        "runs": [*previous.get("runs", []), {"started_at": now, "command": command}],
        "config": plan.config.model_dump(mode="json"),
        "swept": plan.swept,
        "cells": [c.cell_id for c in plan.cells],
        "environment": collect_environment(),
    }


def skip_reason(cell: Cell, devices: NodeDevices, launch: Launch) -> Optional[str]:
    s = cell.settings
    reason = launch.skip_reason(cell) or backend_skip_reason(
        getattr(s, "backend", "auto"), devices.kind, launch.launcher
    )
    reason = (
        reason
        or strategy_skip_reason(getattr(s, "strategy", "ddp"), s.nnodes)
        or compile_skip_reason(getattr(s, "compile", False))
    )
    if reason:
        return reason
    if s.nproc_per_node > devices.count:
        return (
            f"needs {devices.describe(s.nproc_per_node)} per node; this node has "
            f"{devices.describe(devices.count)}"
        )
    return None


def sweep_profile(config: BenchmarkConfig, devices: NodeDevices) -> Optional[ProfileRequest]:
    """What the config's ``profiling:`` section asks of every profiled cell (None: off)."""
    profiling = config.profiling
    if not profiling.enabled:
        return None
    return ProfileRequest.from_settings(profiling, resolve_tool(profiling.tool, devices.kind))


def launch_mode(option: Optional[str], config: BenchmarkConfig) -> str:
    """``--launch`` when given, else the config's ``launch:`` key."""
    return str(option or getattr(config, "launch", PER_CELL))


def write_summary(store: ExperimentStore, records: List[ResultBase]) -> Optional[DataFrame]:
    """Rewrite every kind's summary CSVs from the records (``summary.csv``, the communication
    CSVs, ...), each atomically; returns summary.csv's table (the training cells) for the
    console."""
    records = latest_runs(records, None)  # said by report and compare, not after every cell
    tables: Dict[str, DataFrame] = {}
    for kind in cell_kinds().values():
        tables.update(kind.summary_tables(records))
    store.check_owned()
    for name, table in tables.items():
        atomic_write_text(store.root / name, csv_text(table), make_parents=False)
    return tables.get(SUMMARY)


def check_resumable(store: ExperimentStore, resume: bool) -> None:
    """Refuse to mix a new sweep into existing results unless asked to resume."""
    if not resume and store.results_path.exists() and store.results_path.stat().st_size > 0:
        raise TorchscaleError(
            f"{store.root} already holds results: pass --resume to run only the missing cells, "
            "or choose another --output-dir"
        )


def base_id(cell_id: str) -> str:
    """A cell id without its settings digest: the same cell of the matrix, whatever its knobs."""
    return cell_id.rsplit("-", 1)[0]


def settings_changes(old: Dict[str, Any], new: Dict[str, Any]) -> List[str]:
    """``measure_steps 8 -> 30`` for every setting that differs (those outside a cell's identity
    left out)."""
    before, after = dict(flatten_settings(old)), dict(flatten_settings(new))
    return [
        f"{key} {before.get(key)!r} -> {after.get(key)!r}"
        for key in sorted(set(before) | set(after))
        if key.split(".")[0] not in NON_IDENTITY_FIELDS and before.get(key) != after.get(key)
    ]


def changed_cells(cells: Sequence[Cell], known: Sequence[ResultBase]) -> List[Dict[str, Any]]:
    """Planned cells that have stored results of other settings: the same model, batch, GPU
    count, precision and repeat (the same cell id but for its settings digest). Where several
    planned cells share that much (a swept knob), the stored record is set against the closest."""
    planned: Dict[str, List[Cell]] = {}
    for cell in cells:
        planned.setdefault(base_id(cell.cell_id), []).append(cell)
    ids = {cell.cell_id for cell in cells}
    changes: Dict[str, Dict[str, Any]] = {}
    for record in known:
        # The base id names the kind too (``script-...``, ``comm-...``, a model's name): a kind
        # may write another's records (a script cell writes training records).
        siblings = planned.get(base_id(record.cell_id), [])
        if record.cell_id in ids or not siblings:
            continue
        diffs = [
            (settings_changes(record.settings, c.settings.model_dump(mode="json")), c)
            for c in siblings
        ]
        diff, cell = min(diffs, key=lambda pair: len(pair[0]))
        changes.setdefault(
            cell.cell_id,
            {
                "cell_id": cell.cell_id,
                "stored_cell_id": record.cell_id,
                "changes": diff or ["settings"],
            },
        )
    return list(changes.values())


def describe_changes(changes: Sequence[Dict[str, Any]], limit: int = 3) -> str:
    shown = [f"{c['cell_id']} ({', '.join(c['changes'][:3])})" for c in changes[:limit]]
    more = f" and {len(changes) - limit} more" if len(changes) > limit else ""
    return "; ".join(shown) + more


def check_changed_settings(
    store: ExperimentStore, cells: Sequence[Cell], known: Sequence[ResultBase], force: bool
) -> List[Dict[str, Any]]:
    """Refuse (unless ``force``) to add results of changed settings beside the stored ones."""
    changes = changed_cells(cells, known)
    if changes and not force:
        raise TorchscaleError(
            f"settings changed since the results stored in {store.root} for {len(changes)} "
            f"cell(s): {describe_changes(changes)}; pass --resume --force to record the new "
            "results beside the old ones, or choose another --output-dir"
        )
    return changes


def check_live_owners(store: ExperimentStore, cells: Sequence[Cell]) -> None:
    """Refuse to start a cell that a live process (left by a killed torchscale) still runs."""
    busy: List[Tuple[str, str]] = []
    for cell in cells:
        owner = live_owner(store.cell_dir(cell.cell_id))
        if owner:
            busy.append((cell.cell_id, owner))
    if busy:
        cell_id, owner = busy[0]
        more = f" ({len(busy) - 1} more cell(s) too)" if len(busy) > 1 else ""
        raise TorchscaleError(
            f"cell {cell_id} is still being run by {owner}, left by an earlier torchscale{more}; "
            "wait for it to end or kill it, then run again"
        )


@contextlib.contextmanager
def _storage_errors(store: ExperimentStore, progress: Dict[str, Any]) -> Iterator[None]:
    """A full or read-only disk as one line: exit 2 before any cell ran, 1 after. A folder that
    vanished took the results with it: exit 2, whatever ran."""
    try:
        yield
    except FolderLostError as exc:
        raise _lost(exc, progress) from None
    except OSError as exc:
        cause = storage_cause(exc)
        if cause is None:
            try:  # a file that vanished with its folder (deleted mid-write)
                store.check_owned()
            except FolderLostError as lost:
                raise _lost(lost, progress) from None
            raise
        raise _stopped(store, cause, progress) from None


def _lost(exc: FolderLostError, progress: Dict[str, Any]) -> FolderLostError:
    recorded = progress["recorded"]
    told = f" ({recorded} cell result(s) this run recorded were in it)" if recorded else ""
    return FolderLostError(f"{exc}{told}; the sweep stopped")


def _stopped(store: ExperimentStore, cause: str, progress: Dict[str, Any]) -> StorageError:
    if not progress["started"]:
        return StorageError(store.root, cause, detail="nothing was run; fix it and run again")
    lost = progress.get("lost")
    dying = progress.get("dying")
    told = f"{progress['recorded']} cell result(s) recorded by this run are intact"
    if dying:
        told += f"; cell {dying} died of it and is recorded as failed with that cause"
    if lost:
        told += f"; the result of cell {lost} could not be recorded (it runs again on --resume)"
    return StorageError(
        store.root, cause, exit_code=1, detail=f"{told}; fix it, then run again with --resume"
    )


def _append(store: ExperimentStore, records: Sequence[ResultBase]) -> List[ResultBase]:
    """Append ``records`` and return them as results.jsonl now holds them (what the console and
    summary.csv show is what was written); on a full disk, give the reserve back and try once
    more."""
    offset = store.results_size()
    _write(store, records)
    written = store.records_from(offset)
    if [r.cell_id for r in written] != [r.cell_id for r in records]:
        raise FolderLostError(
            f"{store.results_path} changed while this torchscale was appending to it (another "
            "process wrote or replaced it); nothing more is written there"
        )
    return written


def _write(store: ExperimentStore, records: Sequence[ResultBase]) -> None:
    done = 0
    try:
        for record in records:
            store.append(record)
            done += 1
    except OSError as exc:
        if storage_cause(exc) is None or not store.release_reserve():
            raise
        for record in records[done:]:
            store.append(record)


def run_sweep(
    plan: Plan, store: ExperimentStore, options: SweepOptions, events: SweepEvents
) -> List[ResultBase]:
    """Run every cell without a record; return all records of the experiment, as results.jsonl
    holds them at the end (summary.csv is written from them).

    On a lock-step node other than node 0, run the multi-node cells it takes part in, record
    nothing, and return what this node saw fail.
    """
    devices = node_devices()
    profile = sweep_profile(plan.config, devices)
    fetch_datasets(plan.cells)  # before anything is written: a failure leaves nothing behind
    progress: Dict[str, Any] = {"started": False, "recorded": 0}
    with contextlib.ExitStack() as held:
        held.enter_context(store.lock())
        held.enter_context(options.launch.serve())
        held.enter_context(sigterm_as_interrupt())
        held.enter_context(_storage_errors(store, progress))
        return _sweep(plan, store, options, events, held, devices, profile, progress)


def _sweep(
    plan: Plan,
    store: ExperimentStore,
    options: SweepOptions,
    events: SweepEvents,
    held: contextlib.ExitStack,
    devices: NodeDevices,
    profile: Optional[ProfileRequest],
    progress: Dict[str, Any],
) -> List[ResultBase]:
    """The body of :func:`run_sweep`, with the folder locked (``held`` releases what it takes)."""
    launch = options.launch
    recording = launch.records_results
    # Another node reads node 0's records where the folder is shared, to skip the same cells.
    known = store.records() if options.resume or recording else []
    done = {r.cell_id for r in known if not (options.retry_failed and r.status in RETRYABLE)}
    remaining = [cell for cell in plan.cells if cell.cell_id not in done]
    todo = [cell for cell in remaining if launch.visits(cell)]
    check_live_owners(store, todo)
    manifest: Dict[str, Any] = {}
    if recording:
        check_resumable(store, options.resume)
        changes = check_changed_settings(store, todo, known, options.force)
        # A disk too full for the reserve stops us here, before anything is written.
        held.enter_context(store.reserved())
        previous = store.manifest()
        manifest = build_manifest(plan, previous, sys.argv)
        if changes:
            manifest["runs"][-1]["changed_settings"] = changes
        manifest.update(launch=launch.describe(), nodes=previous.get("nodes", []))
        store.write_manifest(manifest)
    records = known if recording else []  # elsewhere: what this node saw fail
    waits = launch.join_waits(remaining)
    env = dict(options.env or {})  # each cell's threads: launch.cpu_threads.cell_env
    experiment = plan.config.experiment_name
    started = [0]

    def start(cell: Cell) -> None:
        started[0] += 1
        events.cell_started(cell, started[0], len(todo), store.cell_dir(cell.cell_id))
        progress["started"] = True

    def finish(cell: Cell, new: List[ResultBase]) -> None:
        new = [checked_record(record) for record in new]
        if not recording:
            records.extend(new)
            events.cell_finished(cell, new, None)
            check_node_zero(launch, new)
            return
        # A cell that failed while the disk is full (or read-only) died of it: record it in the
        # reserved space and stop, since every later cell would die the same way.
        failed = any(r.status == "failed" for r in new)
        problem = storage_problem(store.cell_dir(cell.cell_id)) if failed else None
        if problem:
            store.release_reserve()
        progress["lost"] = cell.cell_id
        new = _append(store, new)
        write_cell_files(
            store, new
        )  # run_summary.json, metrics_epoch.jsonl (GPU Training Benchmark Suite)
        records.extend(new)
        progress["lost"] = None
        progress["recorded"] += 1
        if problem:
            progress["dying"] = cell.cell_id
            with contextlib.suppress(OSError):
                write_summary(store, records)
            raise _stopped(store, problem, progress)
        if merge_node_environments(manifest, node_environments(store, cell)):
            store.write_manifest(manifest)
        events.cell_finished(cell, new, write_summary(store, records))

    def still_owned() -> None:
        # A folder deleted under a running launch stops the sweep now, not when its cell ends.
        if recording:
            store.check_owned()

    def polled(elapsed_s: float) -> None:
        still_owned()
        events.cell_polled(elapsed_s)

    reasons = {cell.cell_id: skip_reason(cell, devices, launch) for cell in todo}
    mode = launch_mode(options.launch_mode, plan.config)

    def alone(cell: Cell) -> bool:
        return bool(reasons[cell.cell_id]) or bool(
            per_cell_reason(cell, launch.launcher, launch.nnodes, profile)
        )

    for unit in launch_units(todo, mode, alone):
        if len(unit) > 1:
            run_group(
                unit, store, experiment, env=cell_env(unit[0], env, devices.kind),
                profile=profile, on_started=start,
                on_poll=events.cell_polled, on_tick=still_owned, on_finished=finish,
            )  # fmt: skip
            continue
        cell = unit[0]
        start(cell)
        reason = reasons[cell.cell_id]
        if reason:
            finish(cell, skipped_records(cell, experiment, reason) if recording else [])
            continue
        finish(cell, run_cell(
            cell, store, experiment, rendezvous=launch.rendezvous(cell, waits.get(cell.cell_id)),
            env=cell_env(cell, env, devices.kind), on_poll=polled,
            profile=profile if get_kind(cell.kind).profiled else None, prefix=launch.prefix(cell),
            records_results=recording,
            command=launch.worker_command(cell, store.cell_dir(cell.cell_id)),
        ))  # fmt: skip
    if recording:
        # What the console and summary.csv show is what results.jsonl holds, read back.
        records = store.records()
        write_summary(store, records)
    return records


def noop_events() -> SweepEvents:
    class _Quiet:
        def cell_started(self, cell: Cell, position: int, total: int, cell_dir: Path) -> None:
            pass

        def cell_polled(self, elapsed_s: float) -> None:
            pass

        def cell_finished(
            self, cell: Cell, records: List[ResultBase], table: Optional[DataFrame]
        ) -> None:
            pass

    return _Quiet()
