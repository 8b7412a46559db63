"""``torchscale project``: predicted step time, throughput and efficiency at larger GPU counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import typer
from typing_extensions import Annotated

from torchscale.cli.console import (
    err_console,
    print_json,
    say,
    show_result,
    user_errors,
)
from torchscale.errors import TorchscaleError
from torchscale.measures.figures import GLOSSARY_DOC

DEFAULT_TARGETS = [16, 64, 256, 1024]


def _band(row: Dict[str, Any], key: str) -> str:
    half = (row[f"{key}_high"] - row[f"{key}_low"]) / 2
    return f"{100 * half / row[key]:.0f}%" if row[key] else "?"


def _ranks(row: Dict[str, Any]) -> str:
    """``64``, or ``64 (8n)`` across nodes."""
    nodes = row["nodes"]
    return f"{row['world_size']}" + (f" ({nodes}n)" if nodes > 1 else "")


def _percent(fraction: Optional[float]) -> Optional[float]:
    return None if fraction is None else 100 * fraction


def _table(rows: List[Dict[str, Any]], holdout: bool) -> Any:
    """The predictions, fitted to the console (``console_tables.py``); a row extrapolated
    from CPU processes says so in its own column, which is never left out."""
    from torchscale.console_tables import Col, fitted_table
    from torchscale.hardware.device_noun import CPU, count_header, is_cpu
    from torchscale.report import formatting as fmt

    unit = rows[0]["unit"] if rows else "samples"
    on_cpu = [is_cpu(row.get("measured_on")) for row in rows]
    ranks = count_header(CPU if all(on_cpu) and rows else None)

    def banded(key: str) -> Tuple[List[str], List[str]]:
        values = [fmt.significant(row[key]) for row in rows]
        bands = [f"±{_band(row, key)}" for row in rows]
        pairs = list(zip(values, bands))
        return [f"{v} {b}" for v, b in pairs], [f"{v}\n{b}" for v, b in pairs]

    step, step_stacked = banded("step_ms")
    throughput, throughput_stacked = banded("throughput")
    cols = [
        Col("model", [str(row["model"]) for row in rows], numeric=False, wrap=True),
        Col("config", [str(row["variant"]) for row in rows], numeric=False, wrap=True, same="{}"),
        Col(ranks, [_ranks(row) for row in rows]),
        Col("step ms", step, compact="step\nms", compact_values=step_stacked),
        Col(f"{unit}/s", throughput, compact=f"{unit}\n/s", compact_values=throughput_stacked),
        Col("eff.", [fmt.fraction(row["efficiency"]) for row in rows]),
        Col(
            "comm ms",
            [fmt.significant(row["exposed_comm_ms"]) for row in rows],
            compact="comm\nms",
            drop=1,
            name="exposed comm ms",
        ),
        Col(
            "algo",
            [str(row["algorithm"]) for row in rows],
            numeric=False,
            same="{} collectives",
            drop=2,
            name="collective algorithm",
        ),
    ]
    strategies = [str(row.get("strategy") or "ddp") for row in rows]
    if any(strategy != "ddp" for strategy in strategies):  # each its own collectives
        cols.insert(2, Col("strategy", strategies, numeric=False, compact="strat-\negy"))
    if holdout:
        cols += [
            Col(
                "measured",
                [fmt.significant(row["measured_throughput"]) for row in rows],
                compact="meas-\nured",
            ),
            Col("error", [fmt.signed_percent(_percent(row["error"])) for row in rows]),
        ]
    if any(on_cpu):
        cols.append(
            Col(
                "measured on",
                ["CPU processes" if cpu else "GPUs" for cpu in on_cpu],
                compact="from",
                compact_values=["CPU" if cpu else "GPU" for cpu in on_cpu],
                numeric=False,
            )
        )
    title = f"Projected scaling ({unit}/s; band ±2 standard errors and the fit's own error)"
    left_out = f"see --json; figures: {GLOSSARY_DOC}"  # as benchmark's table says it
    return fitted_table(err_console, title, cols, left_out=left_out)


def _extra_counts(args: List[str]) -> List[int]:
    """``--gpus 16 64 256``: Click gives the counts after the first as extra arguments."""
    counts = []
    for arg in args:
        if not arg.isdigit():
            raise TorchscaleError(
                f"unexpected argument {arg!r}: --gpus takes GPU counts, e.g. --gpus 16 64"
            )
        counts.append(int(arg))
    return counts


@user_errors
def project(
    ctx: typer.Context,
    source: Annotated[
        Path,
        typer.Option("--source", "-s", help="Results folder with training and all_reduce cells."),
    ] = Path("results"),
    gpus: Annotated[
        Optional[List[int]],
        typer.Option("--gpus", "-g", help="GPU counts to predict (repeat or list: --gpus 16 64)."),
    ] = None,
    gpus_per_node: Annotated[
        int, typer.Option("--gpus-per-node", help="GPUs per node at the target scale.")
    ] = 8,
    holdout: Annotated[
        bool,
        typer.Option(
            "--holdout",
            help="Fit without the largest measured GPU count; compare the prediction with it.",
        ),
    ] = False,
    inter_node_gbps: Annotated[
        Optional[float],
        typer.Option(
            "--inter-node-gbps",
            help="Assumed all-reduce bandwidth (GB/s) between nodes, where none was measured.",
        ),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the projection as JSON on stdout.")
    ] = False,
    history: Annotated[
        Optional[str],
        typer.Option(
            "--history",
            help="Record the predictions in this history (file path or postgresql://...), "
            "to check them against later runs. Default: TORCHSCALE_HISTORY.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Predict step time, throughput and scaling efficiency at larger GPU counts."""
    from torchscale.app.project import ProjectRequest, project_scaling

    targets = [*(gpus or []), *_extra_counts(ctx.args)] or ([] if holdout else DEFAULT_TARGETS)
    if any(n < 1 for n in targets) or gpus_per_node < 1:
        raise TorchscaleError(
            "--gpus and --gpus-per-node take positive integers, e.g. --gpus 16 64"
        )
    if inter_node_gbps is not None and inter_node_gbps <= 0:
        raise TorchscaleError("--inter-node-gbps must be a positive bandwidth in GB/s, e.g. 25")
    request = ProjectRequest(
        source=source,
        targets=targets,
        gpus_per_node=gpus_per_node,
        holdout=holdout,
        inter_node_gbps=inter_node_gbps,
        history=history,
    )
    outcome = project_scaling(request, say)
    rows = outcome.rows
    if json_output:
        print_json(
            {
                "source": str(source),
                "gpus_per_node": gpus_per_node,
                "holdout": holdout,
                "basis": outcome.basis,
                "predictions": rows,
            }
        )
    for line in outcome.basis:
        say(f"> {line}")
    show_result(_table(rows, holdout))
    if outcome.from_cpu:
        say(
            "> [WARN] Rows from CPU are extrapolated from gloo on CPU processes (loopback on "
            "one host): they say how this CPU setup would scale, not what GPUs would do."
        )
    for line in outcome.holdout_lines:
        show_result(line)
