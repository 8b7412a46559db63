"""``torchscale profile``: capture traces around a DDP run, or analyse existing traces.

``torchscale profile --gpus N --duration 30s ...`` captures (see ``app/profile.py``);
``torchscale profile analyze PATH...`` reads per-rank traces and reports bottlenecks.
Heavy modules (pandas, numpy) are imported inside the command bodies.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

import typer
from typing_extensions import Annotated

from torchscale.cli.console import err_console, print_json, say, show_result, user_errors
from torchscale.cli.history_command import RecordHistoryOption
from torchscale.cli.job_options import (
    AcceleratorOption,
    EmitOption,
    ImageOption,
    JobLauncher,
    JobLauncherOption,
    K8sApi,
    K8sApiOption,
    NamespaceOption,
    OverlayOption,
    QueueOption,
    ResultsPvcOption,
    ServiceAccountOption,
    SubmitOption,
    job_settings,
    script_words,
    show_job,
)
from torchscale.cli.script_args import (
    SCRIPT_PANEL,
    SamplesPerStepOption,
    StepAtOption,
    ThreadsOption,
    script_options,
)
from torchscale.config.durations import parse_duration
from torchscale.errors import TorchscaleError
from torchscale.measures.figures import (
    GLOSSARY_DOC,
    NO_DEVICE_KERNELS,
    SYNC_OVERHEAD,
    SYNC_STALL,
    sync_relation,
)
from torchscale.results.layout import FINDINGS_FILE

if TYPE_CHECKING:
    from torchscale.app.profile import CapturedCell

TARGETS = ("sync_stalls", "communication", "compute", "memory", "all")
TOOLS = ("auto", "nsys", "torch")


def _check_choice(value: str, choices: Tuple[str, ...], option: str) -> str:
    if value not in choices:
        raise TorchscaleError(f"{option} {value!r} is not one of: {', '.join(choices)}")
    return value


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return f"{value / 1000:.2f}" if spec == "ms" else spec.format(value)


DEVICE_ONLY = ("idle_pct", "compute_pct", "non_compute_pct", "overlap_pct", "exposed_comm_us")
"""The per-rank columns HTA computes from a device's kernels."""


def print_document(document: Dict[str, Any], written: List[str], out_dir: Path) -> None:
    """The analysis as the seed shows it: per-rank table, sync stall, numbered bottlenecks."""

    from torchscale.analysis.finding import shown_severity
    from torchscale.console_tables import Col, fitted_table

    ranks = document["ranks"]
    columns = [
        # key, header, compact header, format, drop order when too narrow (0: always shown)
        ("rank", "rank", "rank", "{:.0f}", 0),
        ("source", "source", "source", "{}", 0),
        ("steps", "steps", "steps", "{:.0f}", 5),
        ("step_mean_us", "step ms", "step\nms", "ms", 0),
        ("idle_pct", "idle %", "idle\n%", "{:.1f}", 0),
        ("compute_pct", "compute %", "comp.\n%", "{:.1f}", 0),
        ("non_compute_pct", "non-compute %", "non-\ncomp. %", "{:.1f}", 4),
        ("overlap_pct", "overlap %", "over-\nlap %", "{:.1f}", 0),
        ("exposed_comm_us", "exposed comm ms", "exposed\ncomm ms", "ms", 0),
        ("sync_stall_pct", "sync stall time %", "sync stall\ntime %", "{:.1f}", 0),
    ]
    # HTA's breakdown is of a device's kernels: traces without any (CPU processes) have none of
    # it. Those columns are left out and said once, not shown as dashes without a word.
    absent = [c for c in columns if c[0] in DEVICE_ONLY and all(r.get(c[0]) is None for r in ranks)]
    columns = [c for c in columns if c not in absent]
    table = fitted_table(
        err_console,
        "Per-rank breakdown (HTA definitions)",
        [
            Col(
                title,
                [_fmt(row.get(key), spec) for row in ranks],
                compact=compact,
                numeric=key != "source",
                same="{} traces" if key == "source" else None,
                drop=drop,
            )
            for key, title, compact, spec, drop in columns
        ],
        left_out="see the CSV tables or --json",
    )
    err_console.print(table)
    if absent:
        names = ", ".join(title for _, title, _, _, _ in absent)
        say(f"> [ANALYSIS] Not in these traces: {names}: {NO_DEVICE_KERNELS}")
    from torchscale.profiling.traces.discover import RANK_SOURCES

    sources = dict.fromkeys(r["rank_source"] for r in ranks if r.get("rank_source"))
    if sources:
        shown = "; ".join(RANK_SOURCES.get(s, s) for s in sources)
        say(f"> [ANALYSIS] Rank numbers from: {shown}")
    for warning in document.get("warnings") or []:
        say(f"> [WARN] {warning}")
    stall = document.get("sync_stall_pct")
    stalls = [r for r in ranks if r.get("sync_stall_pct") is not None]
    if stall is not None and stalls:
        worst = max(stalls, key=lambda r: r["sync_stall_pct"])
        show_result(
            f"> [ANALYSIS] {SYNC_STALL.title}: {stall:.1f}% (mean over {len(ranks)} "
            f"ranks; worst rank {worst['rank']}: {worst['sync_stall_pct']:.1f}%)"
        )
    else:
        # The glossary's name and its "none": one rank has no collective to wait in.
        show_result(f"> [ANALYSIS] {SYNC_STALL.title}: – (needs traces from at least 2 ranks)")
    findings = document["findings"]
    # The seed's form: "> [ANALYSIS] Found 2 bottleneck(s):" then ">   1. ..." per finding.
    show_result(f"> [ANALYSIS] Found {len(findings)} bottleneck(s):")
    for i, finding in enumerate(findings, 1):
        show_result(f">   {i}. {finding['title']} ({shown_severity(finding['severity'])})")
        show_result(f">      -> {finding['recommendation']}")
    if written:
        say(f"> [ANALYSIS] Wrote {', '.join(written)} to {out_dir}")


def _report_capture(cells: List[CapturedCell], json_output: bool) -> int:
    """Print each traced cell's analysis; the exit code says whether anything was traced."""
    documents = []
    for cell in cells:
        if cell.not_profiled is not None:
            show_result(f"> [ANALYSIS] {cell.cell_id}: not profiled: {cell.not_profiled}")
            continue
        if cell.document is None or cell.out_dir is None:
            show_result(f"> [ANALYSIS] {cell.cell_id}: {cell.no_analysis}")
            continue
        show_result(f"> [ANALYSIS] Profiling complete: {cell.cell_id} ({cell.tool}).")
        if cell.note:
            show_result(f"> [ANALYSIS] Note: {cell.note}.")
        print_document(cell.document, list(cell.files), cell.out_dir)
        if cell.sync_overhead_pct is not None:
            stall = cell.document.get("sync_stall_pct")
            say(
                f"> [ANALYSIS] {SYNC_OVERHEAD.title} of this cell (its measured window): "
                f"{cell.sync_overhead_pct:.1f}%. {sync_relation(stall, cell.sync_overhead_pct)} "
                f"({GLOSSARY_DOC})."
            )
        if cell.busy_words is not None:
            say(
                f"> [WARN] Measured on a {cell.busy_words}: its stalls "
                "and waits say as much about the other processes as about the job; rerun on a "
                "quiet node before acting on them."
            )
        documents.append({"cell_id": cell.cell_id, "dir": str(cell.out_dir), **cell.document})
    if json_output and documents:
        print_json(documents[0] if len(documents) == 1 else {"cells": documents})
    return 0 if documents else 1


VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="Enable verbose logging.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


def _verbose(verbose: bool) -> None:
    if verbose:
        logging.getLogger("torchscale").setLevel(logging.DEBUG)


@user_errors
def capture(
    ctx: typer.Context,
    gpus: Annotated[
        Optional[int],
        typer.Option(
            "--gpus",
            "-g",
            min=1,
            help="Ranks to profile: GPUs, or CPU processes on a node without GPUs "
            "(default: 4, or all of a smaller node's, said so).",
            show_default=False,
        ),
    ] = None,
    duration: Annotated[
        str,
        typer.Option("--duration", "-d", help="How long to profile: 30 (seconds), 30s, 2min."),
    ] = "30s",
    target: Annotated[
        str, typer.Option("--target", "-t", help=f"What to look for: {', '.join(TARGETS)}.")
    ] = "sync_stalls",
    config: Annotated[
        Optional[Path],
        typer.Option(
            "--config", "-c", help="Benchmark config YAML whose model and batch size to run."
        ),
    ] = None,
    model: Annotated[
        Optional[str], typer.Option("--model", "-m", help="Model to run (instead of --config).")
    ] = None,
    batch_size: Annotated[
        Optional[int],
        typer.Option("--batch-size", "-b", min=1, help="Per-GPU batch size (with --model)."),
    ] = None,
    tool: Annotated[
        str,
        typer.Option(
            "--tool",
            help=f"Profiler: {', '.join(TOOLS)} (auto: nsys if on PATH, else torch.profiler).",
        ),
    ] = "auto",
    output_dir: Annotated[
        Path, typer.Option("--output-dir", "-o", help="Folder for traces and findings.")
    ] = Path("./results"),
    set_: Annotated[
        Optional[List[str]],
        typer.Option(
            "--set", help="Override a config key, e.g. --set precision=bf16 (repeatable)."
        ),
    ] = None,
    script: Annotated[
        Optional[str],
        typer.Option(
            "--script",
            help="Your own DDP training script to profile, run unmodified (its arguments "
            "after --; docs/own-job.md).",
            rich_help_panel=SCRIPT_PANEL,
        ),
    ] = None,
    samples_per_step: SamplesPerStepOption = None,
    step_at: StepAtOption = None,
    threads: ThreadsOption = None,
    json_output: JsonOption = False,
    verbose: VerboseOption = False,
    launcher: JobLauncherOption = JobLauncher.torchrun,
    submit: SubmitOption = False,
    k8s_api: K8sApiOption = K8sApi.trainjob,
    image: ImageOption = None,
    namespace: NamespaceOption = None,
    k8s_queue: QueueOption = None,
    k8s_service_account: ServiceAccountOption = None,
    k8s_results_pvc: ResultsPvcOption = None,
    k8s_overlay: OverlayOption = None,
    emit: EmitOption = None,
    accelerator: AcceleratorOption = "H100",
    history: RecordHistoryOption = None,
) -> None:
    """Profile a DDP run (capture), or use [bold]profile analyze[/bold] on existing traces.

    With no --model or --config, profiles the configuration the benchmark results in
    --output-dir scaled worst (lowest efficiency at the largest GPU count that fits this
    node); without results there, resnet50 (batch 64) on GPUs, resnet-tiny (batch 8) on CPU.
    """
    if ctx.invoked_subcommand is not None:
        return
    _verbose(verbose)
    seconds = parse_duration(duration, "--duration", "30, 30s, 2min or 1h")
    _check_choice(target, TARGETS, "--target")
    _check_choice(tool, TOOLS, "--tool")
    if config is not None and (model is not None or batch_size is not None):
        raise TorchscaleError("use either --config or --model/--batch-size, not both")

    from torchscale.app.k8s_submit import JobRequest
    from torchscale.app.profile import CaptureRequest, ProfileJob
    from torchscale.app.profile import profile as run_profile
    from torchscale.cli.benchmark_view import ConsoleEvents

    own = script_options(ctx, script, samples_per_step, step_at, threads)
    request: Union[CaptureRequest, ProfileJob]
    if launcher is not JobLauncher.torchrun:
        args = ["--duration", duration, "--target", target, "--tool", tool]
        args += [f"--model={model}"] if model else []
        args += [f"--batch-size={batch_size}"] if batch_size else []
        args += [f"--set={item}" for item in set_ or []]
        args += [f"--threads={threads}"] if threads else []
        if own is not None:
            args += script_words(own.path, None, None, samples_per_step, step_at, own.args)
        request = ProfileJob(JobRequest(submit=submit, settings=job_settings(
            launcher.value, output_dir, api=k8s_api, image=image, namespace=namespace,
            queue=k8s_queue, service_account=k8s_service_account, results_pvc=k8s_results_pvc,
            overlay=k8s_overlay, emit=emit, accelerator=accelerator,
        )), gpus, config, args)  # fmt: skip
    else:
        request = CaptureRequest(
            gpus, seconds, target, tool, config, model, batch_size, script=own,
            history=history, settings=set_ or [],
        )  # fmt: skip
    events = ConsoleEvents(profile_lines=False)  # the analysis below says it all
    outcome = run_profile(request, output_dir, events, say)
    if outcome.job is not None:
        show_job(outcome.job)
        return
    cells = outcome.cells
    code = _report_capture(cells, json_output)
    if code:
        raise typer.Exit(code)


@user_errors
def analyze(
    paths: Annotated[
        List[Path],
        typer.Argument(
            help="Per-rank traces, files or folders: .json/.json.gz or nsys .sqlite.",
            show_default=False,
        ),
    ],
    target: Annotated[
        str,
        typer.Option("--target", "-t", help=f"Which findings to report: {', '.join(TARGETS)}."),
    ] = "all",
    output_dir: Annotated[
        Optional[Path],
        typer.Option(
            "--output-dir",
            "-o",
            help=f"Folder for {FINDINGS_FILE} and the CSV tables (default: beside the traces).",
        ),
    ] = None,
    max_memory: Annotated[
        Optional[str],
        typer.Option(
            "--max-memory",
            help="Memory budget, e.g. 4G or 512M: the analysis stops with one line before it "
            "would need more (default: the memory available).",
        ),
    ] = None,
    json_output: JsonOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Analyse per-rank traces: breakdown, overlap, stragglers, findings."""
    _verbose(verbose)
    _check_choice(target, TARGETS, "--target")
    from torchscale.app.profile_traces import analyze_traces

    analysis = analyze_traces(paths, target, max_memory, output_dir)
    if json_output:
        print_json(analysis.document)
    print_document(analysis.document, analysis.written, analysis.out_dir)
