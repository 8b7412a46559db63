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
from torchscale.launch.cell import run_cell, skipped_records
from torchscale.launch.torchrun import Rendezvous
from torchscale.plan.matrix import Cell, Plan
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
    rendezvous: Rendezvous = field(default_factory=Rendezvous)
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


def skip_reason(cell: Cell, devices: NodeDevices, rendezvous: Rendezvous) -> Optional[str]:
    s = cell.settings
    if s.nnodes != rendezvous.nnodes:
        return f"needs {s.nnodes} node(s); this launch has {rendezvous.nnodes}"
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
    """Run every cell without a record; return all records of the experiment."""
    with store.lock():
        check_resumable(store, options.resume)
        store.write_manifest(build_manifest(plan, store.manifest(), sys.argv))
        records = store.records()
        done = {r.cell_id for r in records if not (options.retry_failed and r.status in RETRYABLE)}
        todo = [cell for cell in plan.cells if cell.cell_id not in done]
        devices = node_devices()
        env = dict(options.env or {})
        if devices.kind == "cpu":
            # torchrun sets OMP_NUM_THREADS=1 only for multi-process launches; make every cell
            # use the same per-rank thread count.
            env.setdefault("OMP_NUM_THREADS", str(threads_per_cpu_slot()))
        experiment = plan.config.experiment_name
        for position, cell in enumerate(todo, 1):
            events.cell_started(cell, position, len(todo))
            reason = skip_reason(cell, devices, options.rendezvous)
            if reason:
                new = skipped_records(cell, experiment, reason)
            else:
                new = run_cell(
                    cell,
                    store,
                    experiment,
                    rendezvous=options.rendezvous,
                    env=env,
                    on_poll=events.cell_polled,
                )
            for record in new:
                store.append(record)
            records.extend(new)
            events.cell_finished(cell, new, write_summary(store, records))
        if not todo:
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
