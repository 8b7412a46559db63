"""``torchscale benchmark``: expand the YAML matrix into torchrun launches, record the results."""

from __future__ import annotations

import itertools
import logging
import sys
import textwrap
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, List, Optional, Tuple

import typer
from typing_extensions import Annotated

from torchscale.cli.console import err_console, print_json, user_errors
from torchscale.errors import TorchscaleError

if TYPE_CHECKING:
    from torchscale.config.schema import BenchmarkConfig
    from torchscale.integrations.sinks import Integrations
    from torchscale.launch.multinode import Launch
    from torchscale.plan.matrix import Cell, Plan

log = logging.getLogger("torchscale")

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_TERMINATED = 143  # 128 + SIGTERM
EXIT_CELLS_FAILED = 1
NODES_PANEL = "Multi-node"
INTEGRATIONS_PANEL = "Integrations"


class LaunchMode(str, Enum):
    per_group = "per-group"
    per_cell = "per-cell"


class Launcher(str, Enum):
    torchrun = "torchrun"
    slurm = "slurm"
    mpirun = "mpirun"


def register(app: typer.Typer) -> None:
    @app.command(
        "benchmark",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    @user_errors
    def benchmark(
        ctx: typer.Context,
        config: Annotated[
            Optional[Path],
            typer.Option(
                "--config", "-c", help="Benchmark configuration YAML file.", dir_okay=False
            ),
        ] = None,
        output_dir: Annotated[
            Path,
            typer.Option("--output-dir", "-o", help="Results go to OUTPUT_DIR/<experiment_name>/."),
        ] = Path("results"),
        set_: Annotated[
            Optional[List[str]],
            typer.Option(
                "--set",
                help="Override a config key, e.g. --set ddp.bucket_cap_mb=50 (repeatable). "
                "The form --ddp.bucket_cap_mb=50 works too.",
            ),
        ] = None,
        benchmark_kind: Annotated[
            str,
            typer.Option(
                "--benchmark",
                help="What to run: all (everything the config defines), training (the model "
                "cells), memory (the model cells with a short window that records memory per "
                "rank), comm (the communication: section).",
            ),
        ] = "all",
        dry_run: Annotated[
            bool,
            typer.Option("--dry-run", help="Print the expanded plan and its torchrun commands."),
        ] = False,
        resume: Annotated[
            bool, typer.Option("--resume", help="Run only the cells that have no result yet.")
        ] = False,
        retry_failed: Annotated[
            bool, typer.Option("--retry-failed", help="With --resume, re-run failed/timeout cells.")
        ] = False,
        force: Annotated[
            bool,
            typer.Option(
                "--force",
                help="With --resume: also when settings changed since the stored results (the "
                "new results are recorded beside the old ones, and the report says so).",
            ),
        ] = False,
        max_cells: Annotated[
            int,
            typer.Option(
                "--max-cells",
                help="Refuse a matrix of more cells than this (counted before it is expanded).",
                min=1,
            ),
        ] = 10_000,
        list_models: Annotated[
            bool, typer.Option("--list-models", help="List the built-in models and exit.")
        ] = False,
        schema: Annotated[
            bool, typer.Option("--schema", help="Print the JSON Schema of result records and exit.")
        ] = False,
        json_output: Annotated[
            bool, typer.Option("--json", help="Print the results (or the plan) as JSON on stdout.")
        ] = False,
        verbose: Annotated[
            bool, typer.Option("--verbose", "-v", help="Enable verbose logging.")
        ] = False,
        launcher: Annotated[
            Launcher,
            typer.Option(
                "--launcher",
                help="torchrun: this node (with --nnodes: one torchscale per node, in lock step); "
                "slurm: every cell through srun inside an allocation; mpirun: every cell's ranks "
                "started by Open MPI or MPICH.",
                rich_help_panel=NODES_PANEL,
            ),
        ] = Launcher.torchrun,
        submit: Annotated[
            bool,
            typer.Option(
                "--submit",
                help="With --launcher slurm: write an sbatch script for the whole matrix and "
                "submit it (with --dry-run: print it).",
                rich_help_panel=NODES_PANEL,
            ),
        ] = False,
        nnodes: Annotated[
            Optional[int],
            typer.Option(
                "--nnodes",
                help="Nodes in this launch (env PET_NNODES).",
                rich_help_panel=NODES_PANEL,
            ),
        ] = None,
        node_rank: Annotated[
            Optional[int],
            typer.Option(
                "--node-rank",
                help="This node's rank; node 0 records the results (env PET_NODE_RANK).",
                rich_help_panel=NODES_PANEL,
            ),
        ] = None,
        rdzv_endpoint: Annotated[
            Optional[str],
            typer.Option(
                "--rdzv-endpoint",
                help="HOST:PORT of node 0, where the nodes meet (env PET_RDZV_ENDPOINT, or "
                "MASTER_ADDR and MASTER_PORT).",
                rich_help_panel=NODES_PANEL,
            ),
        ] = None,
        rdzv_id: Annotated[
            Optional[str],
            typer.Option(
                "--rdzv-id",
                help="Run id shared by the nodes; cells meet as ID-CELL (env PET_RDZV_ID; "
                "default: torchscale-EXPERIMENT, or the Slurm job id).",
                rich_help_panel=NODES_PANEL,
            ),
        ] = None,
        join_timeout: Annotated[
            float,
            typer.Option(
                "--join-timeout",
                help="Seconds a node waits at a cell for the others (plus the cells node 0 runs "
                "without it meanwhile).",
                rich_help_panel=NODES_PANEL,
            ),
        ] = 600.0,
        tensorboard: Annotated[
            Optional[Path],
            typer.Option(
                "--tensorboard",
                help="Also write TensorBoard event files here, one run per cell "
                "(needs torchscale\\[tensorboard]).",
                file_okay=False,
                rich_help_panel=INTEGRATIONS_PANEL,
            ),
        ] = None,
        mlflow: Annotated[
            Optional[str],
            typer.Option(
                "--mlflow",
                help="Also log to MLflow: a folder, sqlite:///PATH.db or a server URL; one run per "
                "cell under a run per experiment (needs torchscale\\[mlflow]).",
                rich_help_panel=INTEGRATIONS_PANEL,
            ),
        ] = None,
        mpirun_arg: Annotated[
            Optional[List[str]],
            typer.Option(
                "--mpirun-arg",
                help="Extra mpirun argument for --launcher mpirun, e.g. "
                "--mpirun-arg=--hostfile=hosts "
                "(repeatable).",
                rich_help_panel=NODES_PANEL,
            ),
        ] = None,
        launch_mode: Annotated[
            Optional[LaunchMode],
            typer.Option(
                "--launch",
                help="per-group: cells of the same launch layout share one torchrun launch (a "
                "warm process group); per-cell: a torchrun launch per cell. Default: the config's "
                "launch: key (per_group).",
            ),
        ] = None,
        sbatch_arg: Annotated[
            Optional[List[str]],
            typer.Option(
                "--sbatch-arg",
                help="Extra #SBATCH line for --submit, e.g. --sbatch-arg=--partition=gpu "
                "(repeatable).",
                rich_help_panel=NODES_PANEL,
            ),
        ] = None,
    ) -> None:
        """Run throughput/latency tests across GPU configs."""
        if verbose:
            log.setLevel(logging.DEBUG)
        if list_models:
            _list_models(json_output)
            return
        if schema:
            from torchscale.results.schema import TrainingResult

            print_json(TrainingResult.model_json_schema())
            return
        if config is None:
            raise TorchscaleError(
                "missing --config: pass the benchmark YAML, e.g. --config benchmark_config.yaml"
            )

        from torchscale.cli.benchmark_nodes import launch_for, plan_and_launch, submit_matrix
        from torchscale.config.loader import load_config, parse_overrides
        from torchscale.integrations.sinks import Integrations

        if force and not resume:
            raise TorchscaleError("--force goes with --resume: pass --resume --force")
        loaded = load_config(config, parse_overrides(set_ or [], ctx.args))
        if benchmark_kind != "comm":
            _check_models(loaded)
        integrations = Integrations(tensorboard, mlflow)
        integrations.check()
        if submit:
            forwarded = [
                f"--benchmark={benchmark_kind}",
                *(f"--set={item}" for item in set_ or []),
                *ctx.args,
            ]
            submit_matrix(
                loaded, config, output_dir, launcher.value, forwarded, sbatch_arg or [],
                resume=resume, dry_run=dry_run, join_timeout=join_timeout, benchmark=benchmark_kind,
                max_cells=max_cells,
            )  # fmt: skip
            return
        if dry_run:
            launch, per_node = launch_for(
                loaded, launcher.value, nnodes, node_rank, rdzv_endpoint, rdzv_id, join_timeout,
                mpirun_arg or [],
            )  # fmt: skip
            _print_plan(
                loaded, benchmark_kind, per_node, max_cells, launch, output_dir, json_output
            )
            return
        plan, launch = plan_and_launch(
            loaded, launcher.value, nnodes, node_rank, rdzv_endpoint, rdzv_id, join_timeout,
            benchmark=benchmark_kind, mpirun_args=mpirun_arg or [], max_cells=max_cells,
        )  # fmt: skip
        code = _run(
            plan,
            launch,
            output_dir,
            resume=resume,
            retry_failed=retry_failed,
            json_output=json_output,
            integrations=integrations,
            force=force,
            launch_mode=launch_mode.value.replace("-", "_") if launch_mode else None,
        )
        if code:
            raise typer.Exit(code)


def _list_models(json_output: bool) -> None:
    from torchscale.cli.benchmark_view import models_table
    from torchscale.models.registry import list_models

    entries = list_models()
    if json_output:
        print_json([entry.__dict__ for entry in entries])
    else:
        err_console.print(models_table(entries))


def _check_models(config: BenchmarkConfig) -> None:
    """Every ``module:function`` model imports and returns a ModelSpec, before anything runs."""
    from torchscale.models.registry import check_model_factories

    check_model_factories(config.models, seq_len=config.seq_len[0])


def _warn_profiling(config: BenchmarkConfig, device_kind: str) -> None:
    """One WARN line when the config asks for nsys and torch.profiler will trace instead."""
    from torchscale.launch.nsys import tool_warning

    warning = tool_warning(config.profiling.tool, device_kind) if config.profiling.enabled else None
    if warning:
        err_console.print(f"> [WARN] {warning}", soft_wrap=True, markup=False)


DRY_RUN_CHUNK = 500
"""Cells per table when a dry run prints a large plan (a plan up to this size is one table)."""


def _chunks(cells: Iterator[Cell], size: int) -> Iterator[List[Cell]]:
    while True:
        chunk = list(itertools.islice(cells, size))
        if not chunk:
            return
        yield chunk


def _print_plan(
    config: BenchmarkConfig,
    benchmark: str,
    per_node: Optional[int],
    max_cells: int,
    launch: Launch,
    output_dir: Path,
    json_output: bool,
) -> None:
    """Print the plan as it is expanded, so a matrix of any size (up to --max-cells) prints in
    bounded memory: tables of ``DRY_RUN_CHUNK`` cells, each followed by its commands; with
    ``--json``, one array written element by element."""
    from torchscale.cli.benchmark_view import plan_table
    from torchscale.hardware.environment import probe_devices
    from torchscale.launch.cell import cell_command
    from torchscale.launch.multinode import store_for
    from torchscale.launch.sweep import skip_reason
    from torchscale.launch.torchrun import format_command
    from torchscale.plan.matrix import Plan, experiment_dirname, iter_cells, swept_knobs
    from torchscale.results.files import dumps

    def cells() -> Iterator[Cell]:
        return iter_cells(config, benchmark, per_node, max_cells)

    store = store_for(launch, output_dir / experiment_dirname(config.experiment_name))
    # A lock-step node's wait at a cell depends on the cells before it: one pass to know them.
    waits = launch.join_waits(list(cells())) if launch.nnodes > 1 else {}

    devices = probe_devices()
    skipped: List[str] = []

    def command(cell: Cell) -> Tuple[str, Optional[str]]:
        """The cell's command, or why this node would skip it (as the run decides it)."""
        reason = skip_reason(cell, devices, launch)
        if reason:
            skipped.append(cell.cell_id)
            return f"skipped: {reason}", reason
        cell_dir = store.cell_dir(cell.cell_id)
        own = launch.worker_command(cell, cell_dir)  # mpirun starts the ranks itself
        rendezvous = launch.rendezvous(cell, waits.get(cell.cell_id))
        text = format_command(
            own or [*launch.prefix(cell), *cell_command(cell, cell_dir, rendezvous)]
        )
        return text, None

    stream = cells()
    # Bad input (a matrix over --max-cells, ...) raises at the first cell: before any output.
    stream = itertools.chain(list(itertools.islice(stream, 1)), stream)
    _warn_profiling(config, devices.kind)
    if json_output:
        separator = "\n"
        sys.stdout.write("[")
        for cell in stream:
            if launch.visits(cell):
                text, reason = command(cell)
                document = {
                    "cell_id": cell.cell_id,
                    "settings": cell.settings.model_dump(mode="json"),
                    "command": text,
                    "skip_reason": reason,
                }
                sys.stdout.write(separator + textwrap.indent(dumps(document, indent=2), "  "))
                separator = ",\n"
        sys.stdout.write("]\n" if separator == "\n" else "\n]\n")
        sys.stdout.flush()
        return
    swept = swept_knobs(config, benchmark)
    chunks = _chunks(stream, DRY_RUN_CHUNK)
    chunk = next(chunks, [])
    done = 0
    while chunk:
        following = next(chunks, [])
        table = plan_table(Plan(config, chunk, swept))
        if done or following:  # one of several tables: say which cells it holds
            table.title = f"{config.experiment_name}: cells {done + 1}-{done + len(chunk)}"
        err_console.print(table)
        for cell in chunk:
            if launch.visits(cell):
                err_console.print(
                    f"[{cell.index + 1}] {command(cell)[0]}", soft_wrap=True, markup=False
                )
        done += len(chunk)
        chunk = following
    note = f"; {len(skipped)} of {done} cells would be skipped on this node" if skipped else ""
    err_console.print(
        f"dry run: nothing was run or written (results would go to {store.root}){note}",
        soft_wrap=True,
        markup=False,
    )


def _run(
    plan: Plan,
    launch: Launch,
    output_dir: Path,
    *,
    resume: bool,
    retry_failed: bool,
    json_output: bool,
    integrations: Optional[Integrations] = None,
    force: bool = False,
    launch_mode: Optional[str] = None,
) -> int:
    from torchscale.cli.benchmark_nodes import follower_summary
    from torchscale.cli.benchmark_view import ConsoleEvents, results_table
    from torchscale.hardware.environment import node_devices
    from torchscale.integrations.sinks import SinkEvents
    from torchscale.launch.multinode import store_for
    from torchscale.launch.process import Terminated
    from torchscale.launch.sweep import SweepOptions, check_resumable, run_sweep, write_summary
    from torchscale.plan.matrix import experiment_dirname
    from torchscale.results.store import check_writable

    check_writable(output_dir)
    store = store_for(launch, output_dir / experiment_dirname(plan.config.experiment_name))
    if launch.records_results:
        check_resumable(store, resume)
        err_console.print(f"> Results go to {store.root}", soft_wrap=True, markup=False)
    _warn_profiling(plan.config, node_devices().kind)
    options = SweepOptions(resume=resume, retry_failed=retry_failed, force=force, launch=launch)
    options.launch_mode = launch_mode
    sinks = []
    if integrations is not None and launch.records_results:
        sinks = integrations.open(plan.config.experiment_name, store.root, plan.swept)
    console = ConsoleEvents()
    events = SinkEvents(console, sinks)
    try:
        with console:
            records = run_sweep(plan, store, options, events)
    except KeyboardInterrupt as exc:
        events.abort()
        done = len(store.records())
        how = "Terminated" if isinstance(exc, Terminated) else "Interrupted"
        err_console.print(
            f"[bold yellow]{how}.[/bold yellow] {done} cell result(s) are safe in "
            f"{store.results_path}; run again with --resume to finish the rest."
        )
        return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
    if not launch.records_results:
        return follower_summary(launch, store, records)
    table = write_summary(store, records)
    events.close(records, table)
    title = f"{plan.config.experiment_name} ({store.root})"
    if not table.empty:
        err_console.print(results_table(table, title))
    _print_comm_summary(records, title)
    if json_output:
        print_json(
            {
                "experiment": plan.config.experiment_name,
                "results_dir": str(store.root),
                "records": [r.model_dump(mode="json") for r in records],
            }
        )
    # Count cells, not records: a communication cell has one record per collective x size.
    failed = {r.cell_id for r in records if r.status in ("failed", "timeout", "invalid")}
    if failed:
        invalid = any(r.status == "invalid" for r in records)
        what = "failed, timed out or are invalid" if invalid else "failed or timed out"
        err_console.print(f"{len(failed)} cell(s) {what}; see their errors above.")
        return EXIT_CELLS_FAILED
    return 0


def _print_comm_summary(records: list, title: str) -> None:
    from torchscale.comm.tables import collective_table, tp_gemm_table
    from torchscale.comm.view import comm_results_table

    collectives, tp_gemm = collective_table(records), tp_gemm_table(records)
    if not collectives.empty or not tp_gemm.empty:
        err_console.print(comm_results_table(collectives, tp_gemm, f"{title}: communication"))
