"""``torchscale history``: the performance history (ingest, changes, show); docs/history.md."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer
from typing_extensions import Annotated

from torchscale.cli.console import (
    err_console,
    print_json,
    result_console,
    say,
    show_result,
    user_errors,
)

if TYPE_CHECKING:
    from torchscale.history.series_changes import ChangePoint

HistoryOption = Annotated[
    Optional[str],
    typer.Option(
        "--history",
        help="The history: a file path or sqlite:///PATH (SQLite), or postgresql://... (a "
        "server). Default: the TORCHSCALE_HISTORY environment variable.",
        show_default=False,
    ),
]
RecordHistoryOption = Annotated[
    Optional[str],
    typer.Option(
        "--history",
        help="Record the run in this history at its end: a file path or sqlite:///PATH, or "
        "postgresql://... Default: the TORCHSCALE_HISTORY environment variable.",
        show_default=False,
    ),
]
SinceOption = Annotated[
    Optional[str],
    typer.Option(
        "--since",
        help="Only runs from then on: a duration back from now (30d, 12h, 2w) or a date.",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]


@user_errors
def ingest_command(
    folders: Annotated[
        List[Path],
        typer.Argument(help="Experiment folders (or folders of them) written by torchscale."),
    ],
    history: HistoryOption = None,
    json_output: JsonOption = False,
) -> None:
    """Add existing results folders to the history (the same folder twice is one run)."""
    from torchscale.app.history import ingest

    outcome = ingest(history, folders)
    if json_output:
        print_json(
            {
                "history": outcome.location,
                "added": [str(p) for p in outcome.added],
                "already": [str(p) for p in outcome.already],
            }
        )
        return
    show_result(
        f"{len(outcome.added)} run(s) added, {len(outcome.already)} already in the history at "
        f"{outcome.location}"
    )


def _number(value: float) -> str:
    if not math.isfinite(value):
        return "?"
    return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3e}"


def _change_line(change: ChangePoint) -> str:
    s = change.series
    where = f"{s.name} b{s.batch} x{s.gpus}" if s.batch is not None else f"{s.name} x{s.gpus}"
    verdict = "regression" if change.regression else "improvement"
    state = ", open" if change.open else ""
    cause = "; ".join(change.cause) if change.cause else "nothing in the fingerprint changed"
    return (
        f"{where} [{s.hardware}] {change.metric}: {verdict}{state} at run {change.position} "
        f"({change.experiment}, {change.started_at[:19]}): "
        f"{_number(change.before)} ±{_number(change.before_half_width)} → "
        f"{_number(change.after)} ±{_number(change.after_half_width)} "
        f"({100 * change.magnitude:+.1f}%, p={change.pvalue:.1e}); changed: {cause}"
    )


@user_errors
def changes_command(
    history: HistoryOption = None,
    since: SinceOption = None,
    metric: Annotated[
        str,
        typer.Option(
            "--metric",
            help="The figure whose series are searched: throughput, p95, busbw, efficiency, "
            "sync_stall (profile) or a validate probe (gemm_bf16, memory_copy, ...).",
        ),
    ] = "throughput",
    max_pvalue: Annotated[
        Optional[float],
        typer.Option(
            "--max-pvalue",
            help="A split is a change only if the t-test's p-value is below this. Default: "
            "0.0005, which keeps false alarms under 1% of 60-run series, and for a series "
            "shorter than 26 runs 1% shared among its possible splits (0.01 at six runs).",
            show_default=False,
        ),
    ] = None,
    fail_on_regression: Annotated[
        bool,
        typer.Option(
            "--fail-on-regression",
            help="Exit 1 while a regression is open (a change for the worse, confirmed by the "
            "runs after it, with no change after it): a nightly gate.",
        ),
    ] = False,
    json_output: JsonOption = False,
) -> None:
    """Change points in every series (E-divisive means with a t-test), each with what changed
    in the runs' fingerprint then."""
    from torchscale.app.history import changes

    outcome = changes(history, metric, since, max_pvalue)
    if json_output:
        print_json(
            {
                "history": outcome.location,
                "metric": metric,
                "series": outcome.series,
                "changes": [c.as_json() for c in outcome.changes],
                "open_regressions": len(outcome.open_regressions),
            }
        )
    else:
        say(f"> {outcome.series} series in the history at {outcome.location}")
        for change in outcome.changes:
            result_console.print(_change_line(change), soft_wrap=True, markup=False)
        show_result(
            f"{len(outcome.changes)} change point(s) in {metric}, "
            f"{len(outcome.open_regressions)} open regression(s)"
        )
    if fail_on_regression and outcome.open_regressions:
        raise typer.Exit(1)


@user_errors
def show_command(
    history: HistoryOption = None,
    since: SinceOption = None,
    experiment: Annotated[
        Optional[str], typer.Option("--experiment", help="Only the runs of this experiment.")
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """The runs in the history (oldest first) with their fingerprint."""
    from torchscale.app.history import show
    from torchscale.console_tables import Col, fitted_table

    outcome = show(history, since, experiment)
    if json_output:
        print_json({"history": outcome.location, "runs": outcome.runs})
        return
    rows, software = outcome.runs, outcome.software
    cols = [
        Col("run", [str(r["id"]) for r in rows]),
        Col("date", [str(r["started_at"])[:16].replace("T", " ") for r in rows], numeric=False),
        Col("experiment", [str(r["experiment"]) for r in rows], numeric=False, wrap=True),
        Col("hardware", [str(r["hardware"]) for r in rows], numeric=False, wrap=True, drop=2),
        Col("software", software, numeric=False, fill=True, drop=1),
        Col(
            "hosts",
            [", ".join(r["attributes"].get("hosts") or []) for r in rows],
            numeric=False,
            wrap=True,
            drop=3,
        ),
    ]
    table = fitted_table(
        err_console, f"{len(rows)} run(s) in the history at {outcome.location}", cols, "--json"
    )
    show_result(table)


@user_errors
def export_command(
    output: Annotated[Path, typer.Option("--output", "-o", help="The file to write.")],
    layout: Annotated[
        str,
        typer.Option(
            "--format",
            help="bmf: one run as Bencher's metric format (JSON); otava-csv: every run as "
            "Apache Otava's CSV layout (time, attributes, one column per series and metric).",
        ),
    ] = "otava-csv",
    run: Annotated[
        Optional[int], typer.Option("--run", help="The run --format bmf writes (default: latest).")
    ] = None,
    history: HistoryOption = None,
) -> None:
    """Write the history for other tools: Bencher (BMF JSON) or Apache Otava (CSV)."""
    from torchscale.app.history import export

    count = export(history, layout, output, run)
    what = "benchmark(s)" if layout == "bmf" else "run(s)"
    show_result(f"{count} {what} written to {output}")


@user_errors
def report_command(
    output: Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write.")] = Path(
        "history.html"
    ),
    history: HistoryOption = None,
) -> None:
    """A static page of the history: a chart per series with its change points and the runs
    where the fingerprint changed, filtered by model, GPU count and metric inside the page."""
    from torchscale.app.history import history_report

    charts = history_report(history, output)
    show_result(f"{charts} chart(s) written to {output}")


@user_errors
def predictions_command(history: HistoryOption = None, json_output: JsonOption = False) -> None:
    """project's predictions against what runs of that scale measured, with the error and a
    rolling error per experiment."""
    from torchscale.app.history import predictions

    found = predictions(history)
    if json_output:
        print_json({"predictions": found})
        return
    for row in found:
        if row["measured"] is None:
            line = "not measured yet"
        else:
            line = (
                f"measured {_number(row['measured'])}: error {100 * row['error']:+.1f}% "
                f"(rolling mean |error| {100 * row['rolling_error']:.1f}%)"
            )
        result_console.print(
            f"{row['experiment']} {row['model']} x{row['gpus']} ({row['made_at'][:16]}): "
            f"predicted {_number(row['predicted'])} [{_number(row['low'] or math.nan)}-"
            f"{_number(row['high'] or math.nan)}], {line}",
            soft_wrap=True,
            markup=False,
        )
    show_result(f"{len(found)} prediction(s)")
