"""Run a plan: every cell in order, each result appended (and fsynced) as soon as it exists.

The experiment folder is locked for the whole sweep. Ctrl-C ends the running cell's processes and
propagates KeyboardInterrupt; everything recorded before it is intact and ``--resume`` runs only
the cells without a record.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Protocol

from torchscale import __version__
from torchscale.errors import TorchscaleError
from torchscale.hardware.environment import (
    NodeDevices,
    collect_environment,
    node_devices,
    threads_per_cpu_slot,
)
from torchscale.launch.backends import backend_skip_reason
from torchscale.launch.cell import node_environments, run_cell, skipped_records
from torchscale.launch.multinode import Launch, check_node_zero, merge_node_environments
from torchscale.launch.nsys import resolve_tool
from torchscale.launch.process import sigterm_as_interrupt
from torchscale.plan.matrix import Cell, Plan
from torchscale.plan.profile_request import ProfileRequest
from torchscale.results.schema import SCHEMA_VERSION, ResultBase
from torchscale.results.store import ExperimentStore, atomic_write_text

RETRYABLE = {"failed", "timeout"}


class SweepEvents(Protocol):
    """What the console shows; the sweep itself prints nothing."""

    def cell_started(self, cell: Cell, position: int, total: int) -> None: ...

    def cell_polled(self, elapsed_s: float) -> None: ...

    def cell_finished(self, cell: Cell, records: List[ResultBase], table: Any) -> None: ...


@dataclass
class SweepOptions:
    resume: bool = False
    retry_failed: bool = False
    launch: Launch = field(default_factory=Launch)
    env: Optional[Dict[str, str]] = None


def _timestamp() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def build_manifest(plan: Plan, previous: Dict[str, Any], command: List[str]) -> Dict[str, Any]:
    now = _timestamp()
    return {
        "schema_version": SCHEMA_VERSION,
        "experiment": plan.config.experiment_name,
        "torchscale": __version__,
        "created_at": previous.get("created_at", now),
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
    if reason:
        return reason
    if s.nproc_per_node > devices.count:
        return (
            f"needs {devices.describe(s.nproc_per_node)} per node; this node has "
            f"{devices.describe(devices.count)}"
        )
    return None


def write_summary(store: ExperimentStore, records: List[ResultBase]) -> Any:
    """Rewrite summary.csv (and the communication CSVs) from the records; returns the training
    table for the console."""
    from torchscale.analysis.tables import training_table
    from torchscale.comm.tables import write_comm_summaries

    table = training_table(records)
    atomic_write_text(store.summary_path, table.drop(columns=["config_key"]).to_csv(index=False))
    write_comm_summaries(store.root, records)
    return table


def check_resumable(store: ExperimentStore, resume: bool) -> None:
    """Refuse to mix a new sweep into existing results unless asked to resume."""
    if not resume and store.results_path.exists() and store.results_path.stat().st_size > 0:
        raise TorchscaleError(
            f"{store.root} already holds results: pass --resume to run only the missing cells, "
            "or choose another --output-dir"
        )


def run_sweep(
    plan: Plan, store: ExperimentStore, options: SweepOptions, events: SweepEvents
) -> List[ResultBase]:
    """Run every cell without a record; return all records of the experiment.

    On a lock-step node other than node 0, run the multi-node cells it takes part in, record
    nothing, and return what this node saw fail.
    """
    devices = node_devices()
    profiling = plan.config.profiling
    profile = (
        ProfileRequest.from_settings(profiling, resolve_tool(profiling.tool, devices.kind))
        if profiling.enabled
        else None
    )
    launch = options.launch
    recording = launch.records_results
    with store.lock(), launch.serve(), sigterm_as_interrupt():
        manifest: Dict[str, Any] = {}
        if recording:
            check_resumable(store, options.resume)
            previous = store.manifest()
            manifest = build_manifest(plan, previous, sys.argv)
            manifest.update(launch=launch.describe(), nodes=previous.get("nodes", []))
            store.write_manifest(manifest)
        # Another node reads node 0's records where the folder is shared, to skip the same cells.
        known = store.records() if options.resume or recording else []
        done = {r.cell_id for r in known if not (options.retry_failed and r.status in RETRYABLE)}
        records = known if recording else []  # elsewhere: what this node saw fail
        remaining = [cell for cell in plan.cells if cell.cell_id not in done]
        todo = [cell for cell in remaining if launch.visits(cell)]
        waits = launch.join_waits(remaining)
        env = dict(options.env or {})
        if devices.kind == "cpu":
            # torchrun sets OMP_NUM_THREADS=1 only for multi-process launches; make every cell
            # use the same per-rank thread count.
            env.setdefault("OMP_NUM_THREADS", str(threads_per_cpu_slot()))
        experiment = plan.config.experiment_name
        for position, cell in enumerate(todo, 1):
            events.cell_started(cell, position, len(todo))
            reason = skip_reason(cell, devices, launch)
            if reason:
                new = skipped_records(cell, experiment, reason) if recording else []
            else:
                new = run_cell(
                    cell,
                    store,
                    experiment,
                    rendezvous=launch.rendezvous(cell, waits.get(cell.cell_id)),
                    env=env,
                    on_poll=events.cell_polled,
                    profile=profile if cell.kind == "training" else None,
                    prefix=launch.prefix(cell),
                    records_results=recording,
                    command=launch.worker_command(cell, store.cell_dir(cell.cell_id)),
                )
            records.extend(new)
            if not recording:
                events.cell_finished(cell, new, None)
                check_node_zero(launch, new)
                continue
            for record in new:
                store.append(record)
            if merge_node_environments(manifest, node_environments(store, cell)):
                store.write_manifest(manifest)
            events.cell_finished(cell, new, write_summary(store, records))
        if not todo and recording:
            write_summary(store, records)
        return records


def noop_events() -> SweepEvents:
    class _Quiet:
        def cell_started(self, cell: Cell, position: int, total: int) -> None:
            pass

        def cell_polled(self, elapsed_s: float) -> None:
            pass

        def cell_finished(self, cell: Cell, records: List[ResultBase], table: Any) -> None:
            pass

    return _Quiet()
