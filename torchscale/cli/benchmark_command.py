"""``torchscale benchmark``: expand the YAML matrix into torchrun launches, record the results."""

from __future__ import annotations

import logging
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer
from typing_extensions import Annotated

from torchscale.cli.console import (
    err_console,
    markup_text,
    print_json,
    result_console,
    say,
    show_result,
    user_errors,
    write_stdout,
)
from torchscale.cli.job_options import (
    JOB_LAUNCHERS,
    AcceleratorOption,
    EmitOption,
    ImageOption,
    K8sApi,
    K8sApiOption,
    NamespaceOption,
    OverlayOption,
    QueueOption,
    ResultsPvcOption,
    ServiceAccountOption,
    job_settings,
    script_words,
    show_job,
)
from torchscale.cli.script_args import (
    SCRIPT_PANEL,
    SamplesPerStepOption,
    StepAtOption,
    ThreadsOption,
    script_args,
    script_options_alone,
    step_at_value,
)
from torchscale.integrations.deadline import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:
    from torchscale.app.benchmark import BenchmarkOutcome
    from torchscale.app.benchmark_modes import BenchmarkResult
    from torchscale.app.submit import SubmitOutcome
    from torchscale.models.registry import ModelEntry

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
    k8s = "k8s"
    skypilot = "skypilot"
    dstack = "dstack"


@user_errors
def benchmark(
    ctx: typer.Context,
    config: Annotated[
        Optional[Path],
        typer.Option("--config", "-c", help="Benchmark configuration YAML file.", dir_okay=False),
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
    warmup: Annotated[
        Optional[int],
        typer.Option(
            "--warmup",
            help="Warm-up steps of every cell (another tool's flag, docs/seeds.md; with "
            "--script: the script's own steps): "
            "warmup_steps, and communication.warmup when the config has that section.",
            min=0,
        ),
    ] = None,
    iters: Annotated[
        Optional[int],
        typer.Option(
            "--iters",
            help="Measured steps of every cell (another tool's flag, docs/seeds.md; with "
            "--script: the script's own steps): "
            "measure_steps, and communication.iterations when the config has that section.",
            min=1,
        ),
    ] = None,
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
            "started by Open MPI or MPICH; k8s, skypilot, dstack: write the multi-node job "
            "(docs/kubernetes.md).",
            rich_help_panel=NODES_PANEL,
        ),
    ] = Launcher.torchrun,
    submit: Annotated[
        bool,
        typer.Option(
            "--submit",
            help="With --launcher slurm: write an sbatch script for the whole matrix and "
            "submit it (with --dry-run: print it); with --launcher k8s: apply the manifest "
            "with kubectl, follow node 0 and copy the results out.",
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
        str,
        typer.Option(
            "--join-timeout",
            help="How long a node waits at a cell for the others: 600 (seconds), 90s, 10min "
            "(plus the cells node 0 runs without it meanwhile).",
            rich_help_panel=NODES_PANEL,
        ),
    ] = "600",
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
            help="Also log to MLflow: a folder (or file:///PATH), sqlite:///PATH.db or a "
            "server URL; one run per cell under a run per experiment (needs "
            "torchscale\\[mlflow]).",
            rich_help_panel=INTEGRATIONS_PANEL,
        ),
    ] = None,
    integration_timeout: Annotated[
        str,
        typer.Option(
            "--integration-timeout",
            help="How long one call to an MLflow tracking server may take (5, 10s; local "
            "stores: 60 s, or this if longer); one that does not answer in time is one "
            "warning and the benchmark goes on without it.",
            rich_help_panel=INTEGRATIONS_PANEL,
        ),
    ] = f"{DEFAULT_TIMEOUT_S:g}",
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
    history: Annotated[
        Optional[str],
        typer.Option(
            "--history",
            help="Record the run in this history at its end: a file path or sqlite:///PATH, "
            "or postgresql://... Default: TORCHSCALE_HISTORY, else the config's history: key.",
            show_default=False,
        ),
    ] = None,
    sbatch_arg: Annotated[
        Optional[List[str]],
        typer.Option(
            "--sbatch-arg",
            help="Extra #SBATCH line for --submit, e.g. --sbatch-arg=--partition=gpu (repeatable).",
            rich_help_panel=NODES_PANEL,
        ),
    ] = None,
    script: Annotated[
        Optional[str],
        typer.Option(
            "--script",
            help="Your own DDP training script, run unmodified (its arguments after --): "
            "one cell per --gpus; --config then adds its other keys, not models "
            "(docs/own-job.md).",
            rich_help_panel=SCRIPT_PANEL,
        ),
    ] = None,
    gpus: Annotated[
        Optional[List[int]],
        typer.Option(
            "--gpus",
            "-g",
            min=1,
            help="With --script: ranks per cell, GPUs or CPU processes (repeatable: "
            "--gpus 1 --gpus 2).",
            rich_help_panel=SCRIPT_PANEL,
        ),
    ] = None,
    steps: Annotated[
        Optional[int],
        typer.Option(
            "--steps",
            min=1,
            help="With --script: the script's steps measured (measure_steps).",
            rich_help_panel=SCRIPT_PANEL,
        ),
    ] = None,
    samples_per_step: SamplesPerStepOption = None,
    step_at: StepAtOption = None,
    k8s_api: K8sApiOption = K8sApi.trainjob,
    image: ImageOption = None,
    namespace: NamespaceOption = None,
    k8s_queue: QueueOption = None,
    k8s_service_account: ServiceAccountOption = None,
    k8s_results_pvc: ResultsPvcOption = None,
    k8s_overlay: OverlayOption = None,
    emit: EmitOption = None,
    accelerator: AcceleratorOption = "H100",
    threads: ThreadsOption = None,
) -> None:
    """Run throughput/latency tests across GPU configs, or your own training script."""
    if verbose:
        log.setLevel(logging.DEBUG)
    from torchscale.app.benchmark_modes import BenchmarkArgs
    from torchscale.app.benchmark_modes import benchmark as run_command
    from torchscale.app.k8s_submit import JobRequest
    from torchscale.app.own_script import ScriptOptions
    from torchscale.cli.benchmark_view import ConsoleEvents

    own = None
    if script is not None:
        own = ScriptOptions(
            script, script_args(ctx), gpus or [], steps, samples_per_step,
            step_at_value(step_at), threads,
        )  # fmt: skip
    elif not (list_models or schema):
        script_options_alone(
            "a config gives its own gpu_counts and window",
            gpus=gpus, steps=steps, samples_per_step=samples_per_step, step_at=step_at,
            threads=threads,
        )  # fmt: skip
    job = None
    if launcher.value in JOB_LAUNCHERS:
        job = JobRequest(submit=submit, dry_run=dry_run, settings=job_settings(
            launcher.value, output_dir, api=k8s_api, image=image, namespace=namespace,
            queue=k8s_queue, service_account=k8s_service_account, results_pvc=k8s_results_pvc,
            overlay=k8s_overlay, emit=emit, accelerator=accelerator,
        ))  # fmt: skip
    args = BenchmarkArgs(
        config=config,
        output_dir=output_dir,
        benchmark=benchmark_kind,
        overrides=set_ or [],
        extra=list(ctx.args),
        warmup=warmup,
        iters=iters,
        script=own,
        script_words=(
            script_words(script, gpus, steps, samples_per_step, step_at, script_args(ctx))
            if script is not None
            else []
        ),
        launcher=launcher.value,
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_id=rdzv_id,
        join_timeout=join_timeout,
        mpirun_args=mpirun_arg or [],
        max_cells=max_cells,
        resume=resume,
        retry_failed=retry_failed,
        force=force,
        tensorboard=tensorboard,
        mlflow=mlflow,
        integration_timeout=integration_timeout,
        launch_mode=launch_mode.value.replace("-", "_") if launch_mode else None,
        history=history,
        submit=submit,
        sbatch_args=sbatch_arg or [],
        dry_run=dry_run,
        job=job,
        list_models=list_models,
        schema=schema,
    )
    result = run_command(args, ConsoleEvents(), _note)
    if result.models is not None:
        _list_models(result.models, json_output)
    elif result.schema is not None:
        print_json(result.schema)
    elif result.job is not None:
        show_job(result.job)
    elif result.submitted is not None:
        _submitted(result.submitted)
    elif result.preview is not None and result.request is not None:
        from torchscale.cli.plan_view import print_plan

        print_plan(result.preview, result.request.config, json_output)
    elif result.outcome is not None:
        code = _ran(result, result.outcome, json_output)
        if code:
            raise typer.Exit(code)


def _list_models(entries: List[ModelEntry], json_output: bool) -> None:
    from torchscale.cli.benchmark_view import models_table

    if json_output:
        print_json([entry.__dict__ for entry in entries])
    else:
        err_console.print(models_table(entries))


def _note(line: str) -> None:
    say(line)


def _submitted(done: SubmitOutcome) -> None:
    if done.script_path is None:
        write_stdout(done.script)
        err_console.print("dry run: nothing was written or submitted")
        return
    err_console.print(
        f"submitted Slurm job {done.job_id} ({done.cells} cells, script {done.script_path}); "
        f"results go to {done.store_root}, the job's log to {done.job_log}",
        markup=False,
    )


def _ran(result: BenchmarkResult, outcome: BenchmarkOutcome, json_output: bool) -> int:
    from torchscale.cli.benchmark_view import results_table

    if outcome.stopped_by:
        result_console.print(
            f"[bold yellow]{outcome.stopped_by}.[/bold yellow] {outcome.records_safe} cell "
            f"result(s) are safe in {markup_text(outcome.results_path)}; run again with --resume "
            "to finish "
            "the rest."
        )
        return EXIT_TERMINATED if outcome.stopped_by == "Terminated" else EXIT_INTERRUPTED
    if not outcome.recorded:
        return _follower_summary(outcome)
    from torchscale.hardware.device_noun import CPU_NOTE, is_cpu, records_device_kind

    table = outcome.table
    title = f"{outcome.experiment} ({outcome.store_root})"
    device_kind = records_device_kind(outcome.records)
    busy = set(result.busy_cells)
    if table is not None and not table.empty:
        show_result(results_table(table, title, device_kind, busy))
    if result.busy_line is not None:
        _note(result.busy_line)
    for kind in result.kinds:  # each kind's own tables of the run (the communication summary)
        for kind_table in kind.console_tables(outcome.records, title, result_console):
            show_result(kind_table)
    if is_cpu(device_kind) and outcome.records:
        _note(f"> [INFO] {CPU_NOTE}.")
    for line in result.layout_lines:
        _note(line)
    if json_output:
        print_json(
            {
                "experiment": outcome.experiment,
                "results_dir": str(outcome.store_root),
                "busy_host_cells": result.busy_cells,
                "records": [r.model_dump(mode="json") for r in outcome.records],
            }
        )
    failed = outcome.failed_cells
    if failed:
        what = "failed, timed out or are invalid" if outcome.any_invalid else "failed or timed out"
        show_result(f"{len(failed)} cell(s) {what}; see their errors above.")
        return EXIT_CELLS_FAILED
    return 0


def _follower_summary(outcome: BenchmarkOutcome) -> int:
    """What a node other than node 0 says at the end (it records nothing)."""
    show_result(
        f"node {outcome.node_rank} of {outcome.nnodes}: done; node 0 records the results in "
        f"{outcome.store_root}"
    )
    if outcome.records:
        show_result(f"{len(outcome.records)} cell(s) failed on this node; see their errors above.")
        return 1
    return 0
