"""``torchscale compare OLD NEW``: per-cell changes, noise-aware, and an exit code for CI."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict

import typer
from typing_extensions import Annotated

from torchscale.cli.console import err_console, print_json, user_errors

EXIT_REGRESSION = 1


def _clean(row: Dict[str, Any]) -> Dict[str, Any]:
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}


def _table(comparison: Any, threshold: float) -> Any:
    from rich.table import Table

    from torchscale.report import formatting as fmt

    styles = {"regression": "bold red", "improvement": "green", "within noise": "yellow"}
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
            row["model"],
            row["variant"],
            f"{row['world_size']} ({row['nnodes']} nodes)"
            if row.get("nnodes", 1) > 1
            else str(row["world_size"]),
            f"{fmt.significant(row['throughput_old'])} → {fmt.significant(row['throughput_new'])}",
            fmt.signed_percent(row["throughput_change_pct"]),
            ci(row["throughput_ci_low_pct"], row["throughput_ci_high_pct"]),
            f"{fmt.significant(row['p95_old_ms'])} → {fmt.significant(row['p95_new_ms'])}",
            fmt.signed_percent(row["p95_change_pct"]),
            ci(row["p95_ci_low_pct"], row["p95_ci_high_pct"]),
            f"[{styles.get(row['verdict'], '')}]{row['verdict']}",
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
        """Compare two result folders and fail (exit 1) on regressions."""
        from torchscale.analysis.compare import CompareOptions, compare_runs
        from torchscale.errors import TorchscaleError
        from torchscale.report.data import load_report_data

        if threshold < 0 or resamples < 100:
            raise TorchscaleError("--threshold must be >= 0 and --resamples >= 100")
        options = CompareOptions(threshold_pct=threshold, resamples=resamples, seed=seed)
        result = compare_runs(
            load_report_data(old, "OLD").records, load_report_data(new, "NEW").records, options
        )
        if result.cells.empty:
            raise TorchscaleError(
                f"no cell of {new} matches a cell of {old} (same model, settings and GPU count); "
                "compare runs of the same configuration"
            )
        regressions = len(result.regressions)
        if json_output:
            print_json(
                {
                    "baseline": str(old),
                    "new": str(new),
                    "threshold_pct": threshold,
                    "resamples": resamples,
                    "regressions": regressions,
                    "cells": [_clean(r) for r in result.cells.to_dict("records")],
                    "only_in_baseline": result.only_old.to_dict("records"),
                    "only_in_new": result.only_new.to_dict("records"),
                }
            )
        err_console.print(_table(result, threshold))
        for side, frame in (("baseline", result.only_old), ("new run", result.only_new)):
            if not frame.empty:
                err_console.print(
                    f"{len(frame)} cell(s) only in the {side}: " + ", ".join(frame["cell_id"]),
                    markup=False,
                )
        if regressions:
            err_console.print(
                f"[bold red]{regressions} cell(s) regressed beyond {threshold:g}%[/bold red]"
            )
            raise typer.Exit(EXIT_REGRESSION)
        err_console.print(f"No regression beyond {threshold:g}% and the run-to-run noise.")
