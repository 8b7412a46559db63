"""``torchscale compare OLD NEW``: per-cell changes, noise-aware, and an exit code for CI."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Hashable, List, Mapping, Optional, Tuple

import typer
from typing_extensions import Annotated

from torchscale.cli.console import err_console, print_json, result_console, user_errors
from torchscale.errors import TorchscaleError
from torchscale.measures.figures import GLOSSARY_DOC

if TYPE_CHECKING:
    from rich.table import Table

    from torchscale.analysis.comparison import Comparison

EXIT_REGRESSION = 1
EXIT_UNJUDGED = 2  # as a gate that judged nothing: a CI step must not pass on it


def _clean(row: Mapping[Hashable, object]) -> Dict[str, object]:
    return {
        str(k): None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()
    }


STYLES = {
    "regression": "bold red",
    "improvement": "green",
    "within noise": "yellow",
    "not judged": "bold magenta",
}
LOST_STYLE = "bold red"


def _interval(low: float, high: float) -> str:
    return "-" if math.isnan(low) else f"{low:+.1f}..{high:+.1f}%"


def _table(comparison: Comparison, threshold: float, device_kind: Optional[str] = None) -> Table:
    """Per cell: throughput and p95 step time, old and new, the change and its interval, and
    the verdict; at 80 columns (a CI log) the compact form stacks old over new and the change
    over its interval, and every number stays whole (``console_tables.py``)."""
    from torchscale.console_tables import Col, fitted_table
    from torchscale.hardware.device_noun import count_header, count_text
    from torchscale.report import formatting as fmt

    rows = comparison.cells.to_dict("records")
    units = {str(row.get("unit") or "") for row in rows} - {""}
    unit = f"{units.pop()}/s" if len(units) == 1 else "/s"

    def figures(old_key: str, new_key: str) -> Tuple[List[str], List[str]]:
        old = [fmt.significant(row[old_key]) for row in rows]
        new = [fmt.significant(row[new_key]) for row in rows]
        return [f"{o} → {n}" for o, n in zip(old, new)], [f"{o}\n{n}" for o, n in zip(old, new)]

    def change(key: str, pct: str) -> Tuple[List[str], List[str], List[str]]:
        changes = [fmt.signed_percent(row[pct]) for row in rows]
        ranges = [_interval(row[f"{key}_ci_low_pct"], row[f"{key}_ci_high_pct"]) for row in rows]
        return changes, ranges, [f"{c}\n{r}" for c, r in zip(changes, ranges)]

    thr, thr_stacked = figures("throughput_old", "throughput_new")
    p95, p95_stacked = figures("p95_old_ms", "p95_new_ms")
    thr_change, thr_ci, thr_both = change("throughput", "throughput_change_pct")
    p95_change, p95_ci, p95_both = change("p95", "p95_change_pct")
    ranks = count_header(device_kind)
    gpus = [
        f"{row['world_size']} ({row['nnodes']} nodes)"
        if row.get("nnodes", 1) > 1
        else str(row["world_size"])
        for row in rows
    ]
    verdicts = [str(row["verdict"]) for row in rows]
    styles = [
        LOST_STYLE if row.get("lost") else STYLES.get(verdict, "")
        for row, verdict in zip(rows, verdicts)
    ]
    cols = [
        Col("model", [str(row["model"]) for row in rows], numeric=False, wrap=True),
        Col(
            "configuration",
            [str(row["variant"]) for row in rows],
            compact="config",
            numeric=False,
            wrap=True,
            same="{}",
        ),
        Col(
            ranks,
            gpus,
            same=lambda v: count_text(int(v), device_kind) if v.isdigit() else f"{v} {ranks}",
        ),
        Col(
            f"throughput {unit}",
            thr,
            compact=f"{unit}\nold\nnew",
            compact_values=thr_stacked,
            drop=1,
            name="throughput old/new",
        ),
        Col("change", thr_change, compact="thr.\nchange\n95% CI", compact_values=thr_both),
        Col("95% CI", thr_ci),
        Col(
            "p95 ms",
            p95,
            compact="p95 ms\nold\nnew",
            compact_values=p95_stacked,
            drop=2,
            name="p95 ms old/new",
        ),
        Col("change", p95_change, compact="p95\nchange\n95% CI", compact_values=p95_both),
        Col("95% CI", p95_ci),
        Col("verdict", verdicts, numeric=False, wrap=True, styles=styles),
    ]
    # The compact form shows each change over its interval: the interval columns go.
    compact_cols = [c for c in cols if c.header != "95% CI"]
    title = f"Per-cell change (threshold {threshold:g}%; 95% CI over run-to-run noise)"
    left_out = f"see --json; figures: {GLOSSARY_DOC}"  # as benchmark's table says it
    return fitted_table(err_console, title, cols, compact=compact_cols, left_out=left_out)


def _warn(line: str) -> None:
    result_console.print(line, markup=False, soft_wrap=True)


@user_errors
def compare(
    old: Annotated[Path, typer.Argument(help="Baseline results folder.")],
    new: Annotated[Path, typer.Argument(help="New results folder, compared with OLD.")],
    threshold: Annotated[
        float,
        typer.Option(
            "--threshold",
            "-t",
            help="% change in throughput or p95 step time "
            "that counts as a regression (when also beyond noise).",
        ),
    ] = 5.0,
    resamples: Annotated[
        int, typer.Option("--resamples", help="Bootstrap resamples for the noise interval.")
    ] = 2000,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap.")] = 0,
    noise_floor: Annotated[
        Optional[float],
        typer.Option(
            "--noise-floor",
            help="Run-to-run noise in %: how far one run of an unchanged cell may differ "
            "from another (95%). Overrides the runs' repeats and the default floor (1.2 x "
            "each cell's step-time CV); see docs/report.md.",
        ),
    ] = None,
    allow_device_change: Annotated[
        bool,
        typer.Option(
            "--allow-device-change",
            help="Compare cells that ran on different devices or backends (refused "
            "otherwise: the change would be the hardware's); they are listed as a warning "
            "and in --json (device_changes).",
        ),
    ] = False,
    allow_unjudged: Annotated[
        bool,
        typer.Option(
            "--allow-unjudged",
            help="Pass the gate on the judged cells alone when some were measured on a busy "
            "host (verdict 'not judged'); without it such a gate exits 2.",
        ),
    ] = False,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the comparison as JSON on stdout.")
    ] = False,
) -> None:
    """Compare two result folders; fail (exit 1) on regressions and on cells that ran in
    OLD but failed, timed out or are missing in NEW; exit 2 when a cell could not be judged
    (measured on a busy host) unless --allow-unjudged."""
    from torchscale.app.compare import CompareRequest, compare_results

    request = CompareRequest(
        old=old,
        new=new,
        threshold_pct=threshold,
        resamples=resamples,
        seed=seed,
        noise_floor_pct=noise_floor,
        allow_device_change=allow_device_change,
        allow_unjudged=allow_unjudged,
    )
    outcome = compare_results(request, warn=_warn)
    result, changes, diffs = (
        outcome.comparison,
        outcome.device_changes,
        outcome.profile_diff_commands,
    )
    regressions = len(result.regressions)
    lost = result.lost
    if json_output:
        print_json(
            {
                "baseline": str(old),
                "new": str(new),
                "threshold_pct": threshold,
                "resamples": resamples,
                "noise_floor_pct": noise_floor,
                "allow_unjudged": allow_unjudged,
                "noise": result.noise(),
                "passed": result.passed,
                "judged": result.judged_count,
                "not_judged": len(result.unjudged),
                "regressions": regressions,
                "lost": len(lost),
                "cells": [_clean(r) for r in result.cells.to_dict("records")],
                "only_in_baseline": result.only_old.to_dict("records"),
                "only_in_new": result.only_new.to_dict("records"),
                "profile_diff_commands": diffs,
                "device_changes": changes,
            }
        )
    result_console.print(_table(result, threshold, outcome.device_kind))
    # Wrapped at the console width; the figures' names and definitions, as profile links them.
    result_console.print(f"{result.noise_line()} Figures: {GLOSSARY_DOC}.", markup=False)
    for side, frame in (("baseline", result.only_old), ("new run", result.only_new)):
        if not frame.empty:
            result_console.print(
                f"{len(frame)} cell(s) only in the {side}: " + ", ".join(frame["cell_id"]),
                markup=False,
            )
    if regressions:
        result_console.print(
            f"[bold red]{regressions} cell(s) regressed beyond {threshold:g}%[/bold red]"
        )
        for line in diffs:
            result_console.print(f"Both runs traced it: {line}", markup=False, soft_wrap=True)
    if len(lost):
        named = ", ".join(f"{r.cell_id_old} ({r.verdict})" for r in lost.itertuples())
        result_console.print(
            f"{len(lost)} cell(s) measured in the baseline were not measured in the new run "
            f"(failed, timed out or missing): {named}",
            style="bold red",
            markup=False,
            soft_wrap=True,
        )
    gate = result.gate_line()
    if gate and not result.judged_nothing:
        unjudged = ", ".join(str(c) for c in result.unjudged["cell_id_new"])
        result_console.print(
            f"{gate} Not judged: {unjudged}.",
            style="bold magenta" if result.partly_unjudged else None,
            markup=False,
            soft_wrap=True,
        )
    if result.failed:
        raise typer.Exit(EXIT_REGRESSION)
    if result.judged_nothing:
        raise TorchscaleError(
            f"no cell of {new} could be judged: every one ran on a busy host (other "
            "processes held the cores; see the noise line); rerun both on a quiet node, or "
            "state the noise with --noise-floor PCT"
        )
    if result.partly_unjudged:
        raise typer.Exit(EXIT_UNJUDGED)
    judged = f" in the {result.judged_count} cell(s) judged" if gate else ""
    result_console.print(f"No regression beyond {threshold:g}% and the run-to-run noise{judged}.")
