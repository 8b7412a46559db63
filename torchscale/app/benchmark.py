"""The ``benchmark`` use case: which launch this is, the plan, the resume check, the sweep, the
summaries.

:func:`run_benchmark` is what ``torchscale benchmark`` runs once the options are read; the CLI
only renders its :class:`BenchmarkOutcome`. The dry run is :mod:`torchscale.app.preview`, the
Slurm ``--submit`` is :mod:`torchscale.app.submit`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional, Protocol, Sequence, Set, Tuple

from torchscale.app import Notify
from torchscale.errors import TorchscaleError
from torchscale.results.layout import experiment_dir, experiment_dirname

if TYPE_CHECKING:
    from pandas import DataFrame

    from torchscale.config.settings import BenchmarkConfig
    from torchscale.integrations.sinks import Integrations
    from torchscale.launch.multinode import Launch
    from torchscale.plan.matrix import Plan
    from torchscale.plan.planned_cell import Cell
    from torchscale.results.schema import ResultBase
    from torchscale.results.store import ExperimentStore


class LiveEvents(Protocol):
    """The sweep's events, shown live while the sweep runs (the console's progress display)."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> Any: ...

    def cell_started(self, cell: Cell, position: int, total: int, cell_dir: Path) -> None: ...

    def cell_polled(self, elapsed_s: float) -> None: ...

    def cell_finished(
        self, cell: Cell, records: List[ResultBase], table: Optional[DataFrame]
    ) -> None: ...


@dataclass(frozen=True)
class LaunchRequest:
    """How this process takes part in the launch (``--launcher`` and the multi-node options)."""

    launcher: str = "torchrun"
    nnodes: Optional[int] = None
    node_rank: Optional[int] = None
    rdzv_endpoint: Optional[str] = None
    rdzv_id: Optional[str] = None
    join_timeout: float = 600.0
    mpirun_args: Sequence[str] = ()


@dataclass(frozen=True)
class BenchmarkRequest:
    config: BenchmarkConfig
    output_dir: Path
    benchmark: str = "all"  # all, training, memory, comm
    launch: LaunchRequest = field(default_factory=LaunchRequest)
    max_cells: Optional[int] = None  # None: plan.matrix.DEFAULT_MAX_CELLS
    resume: bool = False
    retry_failed: bool = False
    force: bool = False
    integrations: Optional[Integrations] = None
    launch_mode: Optional[str] = None  # per_group / per_cell; None: the config's ``launch:``
    history: Optional[str] = None  # --history; else TORCHSCALE_HISTORY, else the config's


@dataclass
class BenchmarkOutcome:
    experiment: str
    store_root: Path
    results_path: Path
    recorded: bool  # False on a node other than 0: it records nothing
    node_rank: int
    nnodes: int
    records: List[ResultBase] = field(default_factory=list)
    table: Optional[DataFrame] = None  # the training summary (summary.csv's rows), when recorded
    stopped_by: Optional[str] = None  # "Interrupted" (Ctrl-C) or "Terminated" (SIGTERM)
    records_safe: int = 0  # records in results.jsonl when the sweep was stopped

    @property
    def failed_cells(self) -> Set[str]:
        """Cells, not records: a communication cell has one record per collective x size."""
        return {r.cell_id for r in self.records if r.status in ("failed", "timeout", "invalid")}

    @property
    def any_invalid(self) -> bool:
        return any(r.status == "invalid" for r in self.records)


def node_size(config: BenchmarkConfig, known: Optional[int] = None) -> Optional[int]:
    """GPUs (or CPU slots) of one node, needed only when the config does not say how cells
    spread over nodes."""
    if config.nodes is not None or config.gpus_per_node is not None:
        return None
    if known:
        return known
    from torchscale.hardware.environment import node_devices

    return node_devices().count


def launch_for(config: BenchmarkConfig, request: LaunchRequest) -> Tuple[Launch, Optional[int]]:
    """This launch, and the node size cells spread by (None: the config says)."""
    from torchscale.launch.multinode import resolve_launch, split_endpoint
    from torchscale.launch.slurm import SlurmLaunch

    launch: Launch
    if request.launcher == "slurm":
        if request.nnodes is not None or request.node_rank is not None:
            raise TorchscaleError(
                "--nnodes and --node-rank go with --launcher torchrun; under Slurm the "
                "allocation gives the nodes"
            )
        port = split_endpoint(request.rdzv_endpoint)[1] if request.rdzv_endpoint else None
        slurm = SlurmLaunch.from_env(os.environ, port, request.join_timeout)
        per_node = node_size(config, slurm.allocation.gpus_per_node if slurm.allocation else None)
        launch = slurm
    elif request.launcher == "mpirun":
        from torchscale.launch.mpirun import resolve_mpirun_launch

        if request.node_rank is not None:
            raise TorchscaleError("--node-rank goes with --launcher torchrun; mpirun places ranks")
        launch = resolve_mpirun_launch(
            nnodes=request.nnodes,
            endpoint=request.rdzv_endpoint,
            mpirun_args=request.mpirun_args,
            join_timeout_s=request.join_timeout,
        )
        per_node = node_size(config) if launch.nnodes > 1 else None
    else:
        launch = resolve_launch(
            nnodes=request.nnodes,
            node_rank=request.node_rank,
            endpoint=request.rdzv_endpoint,
            run_id=request.rdzv_id,
            join_timeout_s=request.join_timeout,
            experiment=experiment_dirname(config.experiment_name),
        )
        per_node = node_size(config) if launch.nnodes > 1 else None
    return launch, per_node


def plan_and_launch(request: BenchmarkRequest) -> Tuple[Plan, Launch]:
    """The expanded plan (bad input raises here, before anything runs) and this launch."""
    from torchscale.plan.matrix import DEFAULT_MAX_CELLS, expand

    launch, per_node = launch_for(request.config, request.launch)
    cap = DEFAULT_MAX_CELLS if request.max_cells is None else request.max_cells
    plan = expand(request.config, request.benchmark, gpus_per_node=per_node, max_cells=cap)
    return plan, launch


def results_store(launch: Launch, output_dir: Path, config: BenchmarkConfig) -> ExperimentStore:
    """The experiment folder this launch writes (a node other than 0: its own view of it)."""
    from torchscale.launch.multinode import store_for

    return store_for(launch, experiment_dir(output_dir, config.experiment_name))


def profiling_warning(config: BenchmarkConfig, device_kind: str) -> Optional[str]:
    """Why the config's nsys request will be traced by torch.profiler instead, if it will."""
    from torchscale.launch.nsys import tool_warning

    return tool_warning(config.profiling.tool, device_kind) if config.profiling.enabled else None


def size_warnings(request: BenchmarkRequest, device_kind: str) -> List[str]:
    """GPU-sized models planned on CPU processes, each with the time a cell will take."""
    from torchscale.plan.cpu_size import gpu_sized_warnings

    if request.benchmark == "comm":
        return []
    return gpu_sized_warnings(request.config, device_kind)


def run_benchmark(
    request: BenchmarkRequest, events: LiveEvents, notify: Notify
) -> BenchmarkOutcome:
    """Plan, check the folder, run the sweep (``events`` live around it) and write the
    summaries. Ctrl-C or SIGTERM ends the sweep with ``stopped_by`` set; what finished is safe."""
    from torchscale.analysis.training_tables import training_table
    from torchscale.hardware.environment import node_devices
    from torchscale.integrations.sinks import SinkEvents
    from torchscale.launch.cpu_threads import threads_lines
    from torchscale.launch.process import Terminated
    from torchscale.launch.sweep import SweepOptions, check_resumable, run_sweep
    from torchscale.results.store import check_writable

    plan, launch = plan_and_launch(request)
    check_writable(request.output_dir)
    store = results_store(launch, request.output_dir, plan.config)
    if launch.records_results:
        check_resumable(store, request.resume)
        notify(f"> Results go to {store.root}")
    device_kind = node_devices().kind
    warning = profiling_warning(plan.config, device_kind)
    if warning:
        notify(f"> [WARN] {warning}")
    for line in size_warnings(request, device_kind):
        notify(f"> [WARN] {line}")
    for line in threads_lines(plan.cells, device_kind):
        notify(f"> [INFO] {line}")
    options = SweepOptions(
        resume=request.resume, retry_failed=request.retry_failed, force=request.force, launch=launch
    )
    options.launch_mode = request.launch_mode
    sinks = []
    integrations = request.integrations
    if integrations is not None and launch.records_results:
        sinks = integrations.open(plan.config.experiment_name, store.root, plan.swept)
    forwarded = SinkEvents(events, sinks, *([integrations.timeout_s] if integrations else []))
    outcome = BenchmarkOutcome(
        experiment=plan.config.experiment_name,
        store_root=store.root,
        results_path=store.results_path,
        recorded=launch.records_results,
        node_rank=launch.node_rank,
        nnodes=launch.nnodes,
    )
    try:
        with events:
            outcome.records = run_sweep(plan, store, options, forwarded)
    except KeyboardInterrupt as exc:
        forwarded.abort()
        outcome.records_safe = len(store.records())
        outcome.stopped_by = "Terminated" if isinstance(exc, Terminated) else "Interrupted"
        return outcome
    if launch.records_results:
        # The sweep wrote summary.csv from what results.jsonl holds, and returned that.
        outcome.table = training_table(outcome.records)
        store.check_owned()
        write_documents(store.root)
        forwarded.close(outcome.records, outcome.table)
        from torchscale.app.history import history_location, record_run

        record_run(history_location(request.history, plan.config.history), store.root, notify)
    return outcome


def write_documents(experiment: Path) -> List[Path]:
    """The JSON document of each GPU count in distributed_benchmarks' format
    (``benchmark_4gpu.json``), built as ``report --format json`` builds the experiment's."""
    from torchscale.analysis.report_data import load_experiment
    from torchscale.analysis.report_tables import gpu_count_tables
    from torchscale.report.document import write_gpu_documents

    return write_gpu_documents(gpu_count_tables(load_experiment(experiment)))


def check_benchmark_flags(*, force: bool, resume: bool) -> None:
    if force and not resume:
        raise TorchscaleError("--force goes with --resume: pass --resume --force")


class _QuietEvents:
    """Shows nothing (the Python API runs quietly)."""

    def __enter__(self) -> _QuietEvents:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def cell_started(self, cell: Cell, position: int, total: int, cell_dir: Path) -> None:
        return None

    def cell_polled(self, elapsed_s: float) -> None:
        return None

    def cell_finished(
        self, cell: Cell, records: List[ResultBase], table: Optional[DataFrame]
    ) -> None:
        return None


def quiet_events() -> LiveEvents:
    return _QuietEvents()
