"""The use case of ``torchscale benchmark``, whatever it is asked: list the built-in models,
give the record schema, or read the config (or the user's own script) and then run the matrix
here, preview it (``--dry-run``), submit it to Slurm (``--submit``) or write it as a job for a
cluster (``--launcher k8s|skypilot|dstack``).

Nothing is printed here: what the command prints comes back in :class:`BenchmarkResult`; lines
meant for the user while it works go through ``notify`` and the run's ``events``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from torchscale.app import Notify
from torchscale.errors import TorchscaleError

if TYPE_CHECKING:
    from torchscale.app.benchmark import BenchmarkOutcome, BenchmarkRequest, LiveEvents
    from torchscale.app.k8s_submit import JobRequest, LaunchedJob
    from torchscale.app.own_script import ScriptOptions
    from torchscale.app.preview import PlanPreview
    from torchscale.app.submit import SubmitOutcome
    from torchscale.models.registry import ModelEntry
    from torchscale.plan.kind_base import KindBase
    from torchscale.results.schema import ResultBase

JOB_LAUNCHERS = ("k8s", "skypilot", "dstack")


@dataclass(frozen=True)
class BenchmarkArgs:
    """The command line of ``torchscale benchmark``, parsed but not yet read (no file opened)."""

    config: Optional[Path] = None
    output_dir: Path = Path("results")
    benchmark: str = "all"
    overrides: List[str] = field(default_factory=list)
    extra: List[str] = field(default_factory=list)
    """``key=value`` words after the options (Click's extra arguments)."""
    warmup: Optional[int] = None
    iters: Optional[int] = None
    script: Optional[ScriptOptions] = None
    script_words: List[str] = field(default_factory=list)
    """The ``--script`` options as a job's pods repeat them."""
    launcher: str = "torchrun"
    nnodes: Optional[int] = None
    node_rank: Optional[int] = None
    rdzv_endpoint: Optional[str] = None
    rdzv_id: Optional[str] = None
    join_timeout: str = "600"
    mpirun_args: List[str] = field(default_factory=list)
    max_cells: Optional[int] = None
    resume: bool = False
    retry_failed: bool = False
    force: bool = False
    tensorboard: Optional[Path] = None
    mlflow: Optional[str] = None
    integration_timeout: str = "10"
    launch_mode: Optional[str] = None
    history: Optional[str] = None
    submit: bool = False
    sbatch_args: List[str] = field(default_factory=list)
    dry_run: bool = False
    job: Optional[JobRequest] = None
    list_models: bool = False
    schema: bool = False


@dataclass
class BenchmarkResult:
    """What the command shows: exactly one of these is set."""

    models: Optional[List[ModelEntry]] = None
    schema: Optional[Dict[str, Any]] = None
    job: Optional[LaunchedJob] = None
    submitted: Optional[SubmitOutcome] = None
    preview: Optional[PlanPreview] = None
    outcome: Optional[BenchmarkOutcome] = None
    request: Optional[BenchmarkRequest] = None
    busy_cells: List[str] = field(default_factory=list)
    """Cells of the run measured on a busy host."""
    busy_line: Optional[str] = None
    """The warning on them, with the wait share."""
    layout_lines: List[str] = field(default_factory=list)
    kinds: List[KindBase] = field(default_factory=list)
    """Every cell kind: each prints its own tables of the run (the communication summary)."""


def benchmark(args: BenchmarkArgs, events: LiveEvents, notify: Notify) -> BenchmarkResult:
    """Do what ``args`` asks (see the module's docstring). Bad input is refused with one line
    before anything runs or is written."""
    if args.list_models:
        from torchscale.models.registry import list_models

        return BenchmarkResult(models=list_models())
    if args.schema:
        from torchscale.results.schema import TrainingResult

        return BenchmarkResult(schema=TrainingResult.model_json_schema())
    request = _request(args)
    if args.launcher in JOB_LAUNCHERS or (args.submit and args.config is not None):
        forwarded = [
            f"--benchmark={args.benchmark}",
            *(f"--set={item}" for item in args.overrides),
            *args.extra,
            *([f"--warmup={args.warmup}"] if args.warmup is not None else []),
            *([f"--iters={args.iters}"] if args.iters is not None else []),
        ]
        if args.launcher in JOB_LAUNCHERS and args.job is not None:
            from torchscale.app.k8s_submit import benchmark_shape, launch_job

            # the same --script options, the script in the image
            forwarded += args.script_words if args.script is not None else []
            shape = benchmark_shape(request, args.config, forwarded, args.launcher)
            return BenchmarkResult(job=launch_job(args.job, shape, notify), request=request)
        if args.config is not None:
            from torchscale.app.submit import SubmitRequest, submit_matrix

            submitted = submit_matrix(
                SubmitRequest(request, args.config, forwarded, args.sbatch_args, args.dry_run)
            )
            return BenchmarkResult(submitted=submitted, request=request)
    if args.dry_run:
        from torchscale.app.preview import preview_plan

        return BenchmarkResult(preview=preview_plan(request), request=request)
    from torchscale.analysis.busy_host import busy_cells, busy_wait, wait_words
    from torchscale.app.benchmark import run_benchmark
    from torchscale.plan.kind_protocol import cell_kinds

    outcome = run_benchmark(request, events, notify)
    busy = busy_cells(outcome.records)
    waited = busy_wait(outcome.records)
    line = None
    if busy and waited is not None:
        line = (
            f"> [WARN] {len(busy)} cell(s) measured on a busy host ({wait_words(waited)}): "
            "marked 'busy host'; compare and tune judge them only with --noise-floor. Rerun "
            "them on a quiet node."
        )
    return BenchmarkResult(
        outcome=outcome,
        request=request,
        busy_cells=sorted(busy),
        busy_line=line,
        layout_lines=layout_lines(outcome.records),
        kinds=list(cell_kinds().values()),
    )


def layout_lines(records: List[ResultBase]) -> List[str]:
    """The layout findings (a vision model on GPUs in NCHW), one console line each."""
    from torchscale.analysis.layout_findings import channels_last_findings

    return [
        f"> [WARN] {f['title']}: {f['message']} {f['recommendation']}"
        for f in channels_last_findings(records)
    ]


def _request(args: BenchmarkArgs) -> BenchmarkRequest:
    """The config read (or the script's built) and checked, as the run's request."""
    from torchscale.app.benchmark import BenchmarkRequest, LaunchRequest, check_benchmark_flags
    from torchscale.config.durations import parse_duration
    from torchscale.config.foreign_layouts import SeedFlags
    from torchscale.config.loader import load_config, parse_overrides
    from torchscale.integrations.sinks import Integrations
    from torchscale.models.registry import check_model_factories

    join_timeout_s = parse_duration(args.join_timeout, "--join-timeout", "600, 90s or 10min")
    check_benchmark_flags(force=args.force, resume=args.resume)
    overrides = parse_overrides(args.overrides, args.extra)
    flags = SeedFlags(warmup=args.warmup, iters=args.iters)
    if args.script is not None:
        from torchscale.app.own_script import script_config

        if args.submit and args.launcher not in JOB_LAUNCHERS:
            raise TorchscaleError(
                "--submit runs a config file in the job: put the script in its script: "
                "section (docs/own-job.md) and submit that config"
            )
        loaded = script_config(args.script, args.config, overrides, flags)
    else:
        if args.config is None:
            raise TorchscaleError(
                "missing --config: pass the benchmark YAML, e.g. --config "
                "benchmark_config.yaml, or your own training script with --script PATH"
            )
        loaded = load_config(args.config, overrides, flags=flags)
    if args.benchmark != "comm":
        # every module:function model imports and returns a ModelSpec, before anything runs
        check_model_factories(loaded.models, seq_len=loaded.seq_len[0])
    deadline_s = parse_duration(args.integration_timeout, "--integration-timeout", "5 or 10s")
    integrations = Integrations(args.tensorboard, args.mlflow, deadline_s)
    integrations.check()
    return BenchmarkRequest(
        loaded,
        args.output_dir,
        args.benchmark,
        LaunchRequest(
            launcher=args.launcher,
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            rdzv_endpoint=args.rdzv_endpoint,
            rdzv_id=args.rdzv_id,
            join_timeout=join_timeout_s,
            mpirun_args=args.mpirun_args,
        ),
        max_cells=args.max_cells,
        resume=args.resume,
        retry_failed=args.retry_failed,
        force=args.force,
        integrations=integrations,
        launch_mode=args.launch_mode,
        history=args.history,
    )
