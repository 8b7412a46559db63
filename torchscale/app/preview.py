"""``benchmark --dry-run``: the plan as it would run, cell by cell, without running or writing.

The cells come in the order the run takes them (warm groups together, as the sweep launches
them) and, with ``--resume``, only those the run would run (cells with a result are left out).
They are expanded lazily, so a matrix of any size (up to ``--max-cells``) is previewed in bounded
memory; the CLI renders them as they come.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Set

from torchscale.app.benchmark import (
    BenchmarkRequest,
    launch_for,
    profiling_warning,
    results_store,
    size_warnings,
)

if TYPE_CHECKING:
    from pathlib import Path

    from torchscale.hardware.environment import NodeDevices
    from torchscale.launch.multinode import Launch
    from torchscale.plan.planned_cell import Cell
    from torchscale.results.store import ExperimentStore


@dataclass(frozen=True)
class PlannedCell:
    cell: Cell
    visited: bool  # whether this node takes part in the cell (node 0 takes part in all)
    command: Optional[str] = None  # what this node would run, when it takes part
    skip_reason: Optional[str] = None  # why this node would skip it (as the run decides it)


@dataclass
class PlanPreview:
    request: BenchmarkRequest
    launch: Launch
    per_node: Optional[int]
    store: ExperimentStore
    devices: NodeDevices
    waits: Dict[str, float]
    skipped: List[str] = field(default_factory=list)  # cells this node would skip, so far
    done: Set[str] = field(default_factory=set)  # planned cells --resume would not run again

    @property
    def swept(self) -> List[str]:
        from torchscale.plan.matrix import swept_knobs

        return swept_knobs(self.request.config, self.request.benchmark)

    @property
    def warnings(self) -> List[str]:
        """The run's warnings: nsys that cannot run here, GPU-sized models on CPU processes,
        datasets the run would download first."""
        from torchscale.launch.dataset_fetch import download_notes

        nsys = profiling_warning(self.request.config, self.devices.kind)
        return [
            *([nsys] if nsys else []),
            *size_warnings(self.request, self.devices.kind),
            *download_notes([self.request.config.data] if self.request.config.models else []),
        ]

    def planned(self) -> Iterator[Cell]:
        """Every cell of the plan, results or not, expanded as it is asked for."""
        from torchscale.plan.matrix import DEFAULT_MAX_CELLS, iter_cells

        cap = DEFAULT_MAX_CELLS if self.request.max_cells is None else self.request.max_cells
        return iter_cells(self.request.config, self.request.benchmark, self.per_node, cap)

    @property
    def store_root(self) -> Path:
        return self.store.root

    def cells(self) -> Iterator[PlannedCell]:
        """Every cell the run would run, in its order, with this node's command, expanded as it
        is asked for: bad input (a matrix over ``--max-cells``, ...) raises at the first cell."""
        from torchscale.launch.sweep import launch_mode, skip_reason, sweep_profile
        from torchscale.launch.warm_groups import per_cell_reason, run_order

        launch, devices = self.launch, self.devices
        profile = sweep_profile(self.request.config, devices)

        def alone(cell: Cell) -> bool:
            return (
                not launch.visits(cell)
                or bool(skip_reason(cell, devices, launch))
                or bool(per_cell_reason(cell, launch.launcher, launch.nnodes, profile))
            )

        def todo() -> Iterator[Cell]:
            return (cell for cell in self.planned() if cell.cell_id not in self.done)

        mode = launch_mode(self.request.launch_mode, self.request.config)
        return map(self._planned, run_order(todo, mode, alone))

    def _planned(self, cell: Cell) -> PlannedCell:
        from torchscale.launch.cell import cell_command
        from torchscale.launch.sweep import skip_reason
        from torchscale.launch.torchrun import format_command

        if not self.launch.visits(cell):
            return PlannedCell(cell, visited=False)
        reason = skip_reason(cell, self.devices, self.launch)
        if reason:
            self.skipped.append(cell.cell_id)
            return PlannedCell(cell, True, f"skipped: {reason}", reason)
        cell_dir = self.store.cell_dir(cell.cell_id)
        own = self.launch.worker_command(cell, cell_dir)  # mpirun starts the ranks itself
        rendezvous = self.launch.rendezvous(cell, self.waits.get(cell.cell_id))
        prefix = [*self.launch.prefix(cell), *cell_command(cell, cell_dir, rendezvous)]
        return PlannedCell(cell, True, format_command(own or prefix))


def preview_plan(request: BenchmarkRequest) -> PlanPreview:
    """The dry run of ``request``: this launch, where results would go, each cell's command."""
    from torchscale.hardware.environment import probe_devices
    from torchscale.plan.matrix import DEFAULT_MAX_CELLS, iter_cells

    launch, per_node = launch_for(request.config, request.launch)
    store = results_store(launch, request.output_dir, request.config)
    waits: Dict[str, float] = {}
    if launch.nnodes > 1:  # a lock-step node's wait at a cell depends on the cells before it
        cap = DEFAULT_MAX_CELLS if request.max_cells is None else request.max_cells
        waits = launch.join_waits(
            list(iter_cells(request.config, request.benchmark, per_node, cap))
        )
    preview = PlanPreview(request, launch, per_node, store, probe_devices(), waits)
    if request.resume:
        from torchscale.launch.sweep import RETRYABLE

        retry = request.retry_failed
        kept = {r.cell_id for r in store.records() if not (retry and r.status in RETRYABLE)}
        # Only this plan's cells: the folder may hold others (an earlier, larger config).
        if kept:
            preview.done = {cell.cell_id for cell in preview.planned() if cell.cell_id in kept}
    return preview
