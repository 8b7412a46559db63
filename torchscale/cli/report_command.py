"""``torchscale report``: HTML or PDF report of a results folder (``report generate`` too)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from typing_extensions import Annotated

from torchscale.cli.console import err_console, markup_text, show_result, user_errors

SourceOption = Annotated[
    Path,
    typer.Option("--source", "-s", help="Results folder: one experiment, or a folder of several."),
]
FormatOption = Annotated[
    str,
    typer.Option(
        "--format",
        "-f",
        help="Report format: html, pdf, json (one document per experiment), tensorboard "
        "(event files) or png (the key charts, latency_histogram.png among them); for the last "
        "two --output is a folder.",
    ),
]
OutputOption = Annotated[
    Optional[Path],
    typer.Option(
        "--output", "-o", help="Report file (default: <source>/<experiment>-report.<format>)."
    ),
]
BaselineOption = Annotated[
    Optional[Path],
    typer.Option("--baseline", "-b", help="Older results folder to compare this run against."),
]
ThresholdOption = Annotated[
    float,
    typer.Option("--threshold", help="With --baseline: % change that counts as a regression."),
]
NoiseFloorOption = Annotated[
    Optional[float],
    typer.Option(
        "--noise-floor",
        help="With --baseline: run-to-run noise in % (as compare --noise-floor; default: the "
        "runs' repeats, else 1.2 x each cell's step-time CV).",
    ),
]
VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="Enable verbose logging.")]


@user_errors
def report(
    ctx: typer.Context,
    source: SourceOption = Path("results"),
    fmt: FormatOption = "html",
    output: OutputOption = None,
    baseline: BaselineOption = None,
    threshold: ThresholdOption = 5.0,
    noise_floor: NoiseFloorOption = None,
    history: Annotated[
        Optional[str],
        typer.Option(
            "--history",
            help="The history whose checked past predictions the projection section quotes: a "
            "file path or sqlite:///PATH, or postgresql://... Default: TORCHSCALE_HISTORY.",
            show_default=False,
        ),
    ] = None,
    verbose: VerboseOption = False,
) -> None:
    """Generate visual HTML/PDF performance reports."""
    if ctx.invoked_subcommand is not None:  # 'report generate': the subcommand does the work
        return
    if verbose:
        import logging

        logging.getLogger("torchscale").setLevel(logging.DEBUG)
    from torchscale.app.report import ReportRequest, write_report

    request = ReportRequest(source, fmt, output, baseline, threshold, noise_floor, history)
    with err_console.status(f"Building the {markup_text(fmt)} report of {markup_text(source)}..."):
        written = write_report(request)
    path = written.path
    if fmt.lower() == "tensorboard":
        message = f"> TensorBoard runs written to {path} (view: tensorboard --logdir {path})"
    elif fmt.lower() == "png":
        # Every file by name: a kind with many charts continues in <name>_2.png, ...
        names = ", ".join(p.name for p in written.files) or "none, no chart has data"
        count = len(written.files)
        message = f"> PNG charts written to {path} ({count} file{'s' * (count != 1)}): {names}"
    else:
        message = f"> Report written to {path}"
    show_result(message)
