"""``torchscale profile diff OLD NEW``: which kernels and ops moved between two captures.

Parses and prints; the diff is ``app/profile_traces.py``'s ``diff_captures``. Heavy modules are
imported in the command body (``--help`` never imports pandas or torch).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional

import typer
from typing_extensions import Annotated

from torchscale.cli.console import err_console, print_json, user_errors

if TYPE_CHECKING:
    from torchscale.profiling.trace_diff import TraceDiff

NAME_WIDTH = 60  # kernel names run to hundreds of characters: the CSV has them whole
NEW_OR_VANISHED_SHOWN = 5


def _ms(value: float) -> str:
    return "-" if value != value else f"{value / 1000:.3f}"


def _delta_ms(value: float) -> str:
    return "-" if value != value else f"{value / 1000:+.3f}"


def _short(name: str) -> str:
    from torchscale.escaping import for_terminal

    shown = for_terminal(name)
    return shown if len(shown) <= NAME_WIDTH else shown[: NAME_WIDTH - 3] + "..."


def to_document(diff: TraceDiff, top: int) -> Dict[str, Any]:
    ops = diff.tables["ops"]
    moved = ops[ops["status"] != "same"]
    return {
        "ranks": sorted(diff.new_steps),
        "steps": {"old": diff.old_steps, "new": diff.new_steps},
        "step_phases": diff.tables["steps"].to_dict("records"),
        "top_changes": moved.head(top).to_dict("records"),
        "new": ops[ops["status"] == "new"]["name"].unique().tolist(),
        "vanished": ops[ops["status"] == "vanished"]["name"].unique().tolist(),
        "warnings": list(diff.warnings),
        "same_job": not diff.job_differences,
        "job_differences": list(diff.job_differences),
    }


def print_diff(diff: TraceDiff, top: int, ops_file: str) -> None:
    from rich.markup import escape

    from torchscale.console_tables import Col, fitted_table

    steps = diff.tables["steps"]
    wide = steps.pivot(index="rank", columns="phase", values="delta_us")
    base = steps[steps["phase"] == "step"].set_index("rank")
    ranks = list(wide.index)
    phases = [("step", "Δ step", "Δ step"), ("compute", "Δ compute", "Δ comp."),
              ("exposed_comm", "Δ exposed comm", "Δ comm"), ("host_launch", "Δ host/launch",
              "Δ host"), ("data_loading", "Δ data loading", "Δ load"), ("idle", "Δ idle",
              "Δ idle")]  # fmt: skip
    cols = [
        Col("rank", [str(r) for r in ranks]),
        Col("old step ms", [_ms(base.loc[r, "old_us"]) for r in ranks], compact="old\nstep ms"),
        Col("new step ms", [_ms(base.loc[r, "new_us"]) for r in ranks], compact="new\nstep ms"),
    ]
    for phase, title, short in phases:
        compact = short.replace(" ", "\n", 1) + "\nms"
        cols.append(
            Col(f"{title} ms", [_delta_ms(wide.loc[r, phase]) for r in ranks], compact=compact)
        )
    err_console.print(
        fitted_table(err_console, "Step time per rank, NEW - OLD (ms per step)", cols)
    )
    ops = diff.tables["ops"]
    moved = ops[ops["status"] != "same"]
    summed = (
        moved.groupby(["device", "name", "status"], sort=False)[
            ["old_us_per_step", "new_us_per_step", "delta_us_per_step"]
        ]
        .sum()
        .reset_index()
    )
    summed = summed.reindex(summed["delta_us_per_step"].abs().sort_values(ascending=False).index)
    shown = summed.head(top)
    err_console.print(
        fitted_table(
            err_console,
            f"Largest changes, all ranks (ms per step; top {len(shown)} of {len(summed)})",
            [
                Col("kernel / op", [_short(n) for n in shown["name"]], numeric=False, wrap=True),
                Col("on", list(shown["device"]), numeric=False),
                Col("old ms", [_ms(v) for v in shown["old_us_per_step"]]),
                Col("new ms", [_ms(v) for v in shown["new_us_per_step"]]),
                Col("Δ ms", [_delta_ms(v) for v in shown["delta_us_per_step"]]),
                Col("status", list(shown["status"]), numeric=False),
            ],
            left_out=f"see {ops_file} (--output-dir) or --json",
        )
    )
    kernels = ops[ops["device"] == "gpu"]
    for status, label in (("new", "New kernels (only in NEW)"), ("vanished", "Vanished kernels")):
        names = kernels[kernels["status"] == status]["name"].unique().tolist()
        if names:
            listed = "; ".join(_short(n) for n in names[:NEW_OR_VANISHED_SHOWN])
            more = (
                f" and {len(names) - NEW_OR_VANISHED_SHOWN} more"
                if len(names) > NEW_OR_VANISHED_SHOWN
                else ""
            )
            err_console.print(
                f"[DIFF] {label}: {len(names)}: {escape(listed)}{more}", soft_wrap=True
            )
    for warning in diff.warnings:
        err_console.print(f"[WARN] {escape(warning)}", soft_wrap=True)


@user_errors
def diff(
    old: Annotated[
        Path,
        typer.Argument(
            help="The earlier capture: a trace or a folder of per-rank traces.",
            show_default=False,
        ),
    ],
    new: Annotated[
        Path, typer.Argument(help="The later capture, of the same job.", show_default=False)
    ],
    top: Annotated[int, typer.Option("--top", min=1, help="How many changes to list.")] = 10,
    output_dir: Annotated[
        Optional[Path],
        typer.Option(
            "--output-dir",
            "-o",
            help="Folder for the diff's CSV tables (ops and steps).",
        ),
    ] = None,
    max_memory: Annotated[
        Optional[str],
        typer.Option("--max-memory", help="Memory budget for reading both captures, e.g. 4G."),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print one JSON document on stdout.")
    ] = False,
) -> None:
    """Compare two captures of one job, rank by rank: the step's breakdown, the kernels and
    ops that moved most, new and vanished kernels."""
    from torchscale.app.profile_traces import diff_captures

    outcome = diff_captures(old, new, output_dir, max_memory)
    result, written = outcome.diff, outcome.written
    if json_output:
        print_json(to_document(result, top))
    print_diff(result, top, outcome.ops_file)
    if written:
        err_console.print(f"[DIFF] Wrote {', '.join(written)} to {output_dir}", soft_wrap=True)
