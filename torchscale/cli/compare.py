"""``torchscale compare OLD NEW``: per-cell changes, noise-aware, and an exit code for CI."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Hashable, Mapping

import typer
from typing_extensions import Annotated

from torchscale.cli.console import print_json, result_console, user_errors

if TYPE_CHECKING:
    from rich.table import Table

    from torchscale.analysis.comparison import Comparison

EXIT_REGRESSION = 1


def _clean(row: Mapping[Hashable, object]) -> Dict[str, object]:
    return {
        str(k): None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()
    }


STYLES = {"regression": "bold red", "improvement": "green", "within noise": "yellow"}
LOST_STYLE = "bold red"


def _table(comparison: Comparison, threshold: float) -> Table:
    from rich.table import Table
    from rich.text import Text

    from torchscale.report import formatting as fmt

    table = Table(title=f"Per-cell change (threshold {threshold:g}%, 95% bootstrap CI)")
    for header in (
        "model",
        "configuration",
        "GPUs",
        "throughput",
        "change",
        "95% CI",
        "p95 ms",
        "change",
        "95% CI",
        "verdict",
    ):
        table.add_column(
            header, justify="left" if header in ("model", "configuration") else "right"
        )
    for row in comparison.cells.to_dict("records"):

        def ci(low: float, high: float) -> str:
            return "-" if math.isnan(low) else f"{low:+.1f}…{high:+.1f}%"

        table.add_row(
            Text(str(row["model"])),
            Text(str(row["variant"])),
            f"{row['world_size']} ({row['nnodes']} nodes)"
            if row.get("nnodes", 1) > 1
            else str(row["world_size"]),
            f"{fmt.significant(row['throughput_old'])} → {fmt.significant(row['throughput_new'])}",
            fmt.signed_percent(row["throughput_change_pct"]),
            ci(row["throughput_ci_low_pct"], row["throughput_ci_high_pct"]),
            f"{fmt.significant(row['p95_old_ms'])} → {fmt.significant(row['p95_new_ms'])}",
            fmt.signed_percent(row["p95_change_pct"]),
            ci(row["p95_ci_low_pct"], row["p95_ci_high_pct"]),
            # Text, not markup: a verdict without a style must not print as "[]unchanged".
            Text(
                str(row["verdict"]),
                style=LOST_STYLE if row.get("lost") else STYLES.get(row["verdict"], ""),
            ),
        )
    return table


def register(app: typer.Typer) -> None:
    @app.command("compare")
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
        json_output: Annotated[
            bool, typer.Option("--json", help="Print the comparison as JSON on stdout.")
        ] = False,
    ) -> None:
        """Compare two result folders; fail (exit 1) on regressions and on cells that ran in
        OLD but failed, timed out or are missing in NEW."""
        from torchscale.analysis.comparison import CompareOptions, compare_runs
        from torchscale.errors import TorchscaleError
        from torchscale.report.report_data import load_report_data

        if threshold < 0 or resamples < 100:
            raise TorchscaleError("--threshold must be >= 0 and --resamples >= 100")
        options = CompareOptions(threshold_pct=threshold, resamples=resamples, seed=seed)
        result = compare_runs(
            load_report_data(old, "OLD").records, load_report_data(new, "NEW").records, options
        )
        if result.cells.empty or not result.shared:
            raise TorchscaleError(
                f"no cell of {new} matches a cell of {old} (same model, settings and GPU count); "
                "compare runs of the same configuration"
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
                    "passed": not result.failed,
                    "regressions": regressions,
                    "lost": len(lost),
                    "cells": [_clean(r) for r in result.cells.to_dict("records")],
                    "only_in_baseline": result.only_old.to_dict("records"),
                    "only_in_new": result.only_new.to_dict("records"),
                }
            )
        result_console.print(_table(result, threshold))
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
        if len(lost):
            named = ", ".join(f"{r.cell_id_old} ({r.verdict})" for r in lost.itertuples())
            result_console.print(
                f"{len(lost)} cell(s) measured in the baseline were not measured in the new run "
                f"(failed, timed out or missing): {named}",
                style="bold red",
                markup=False,
                soft_wrap=True,
            )
        if result.failed:
            raise typer.Exit(EXIT_REGRESSION)
        result_console.print(f"No regression beyond {threshold:g}% and the run-to-run noise.")
