"""``torchscale project``: predicted step time, throughput and efficiency at larger GPU counts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, Hashable, List, Mapping, Optional

import typer
from typing_extensions import Annotated

from torchscale.cli.console import print_json, result_console, user_errors

DEFAULT_TARGETS = [16, 64, 256, 1024]


def _clean(row: Mapping[Hashable, Any]) -> Dict[str, Any]:
    return {str(k): None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}


def _band(row: Dict[str, Any], key: str) -> str:
    half = (row[f"{key}_high"] - row[f"{key}_low"]) / 2
    return f"{100 * half / row[key]:.0f}%" if row[key] else "?"


def _table(rows: List[Dict[str, Any]], holdout: bool) -> Any:
    from rich.table import Table

    from torchscale.report import formatting as fmt

    unit = rows[0]["unit"] if rows else "samples"
    table = Table(title=f"Projected scaling ({unit}/s; band ±2 standard errors of the fit)")
    headers = ["model", "config", "GPUs", "step ms", "throughput /s", "eff.", "comm ms", "algo"]
    if holdout:
        headers += ["measured", "error"]
    for header in headers:
        table.add_column(header, justify="left" if header in ("model", "config") else "right")
    for row in rows:
        cells = [
            row["model"],
            row["variant"],
            f"{row['world_size']}" + (f" ({row['nodes']}n)" if row["nodes"] > 1 else ""),
            f"{fmt.significant(row['step_ms'])} ±{_band(row, 'step_ms')}",
            f"{fmt.significant(row['throughput'])} ±{_band(row, 'throughput')}",
            fmt.fraction(row["efficiency"]),
            fmt.significant(row["exposed_comm_ms"]),
            row["algorithm"],
        ]
        if holdout:
            cells += [
                fmt.significant(row["measured_throughput"]),
                fmt.signed_percent(100 * row["error"] if row["error"] is not None else None),
            ]
        table.add_row(*cells)
    return table


def _extra_counts(args: List[str]) -> List[int]:
    """``--gpus 16 64 256``: Click gives the counts after the first as extra arguments."""
    from torchscale.errors import TorchscaleError

    counts = []
    for arg in args:
        if not arg.isdigit():
            raise TorchscaleError(
                f"unexpected argument {arg!r}: --gpus takes GPU counts, e.g. --gpus 16 64"
            )
        counts.append(int(arg))
    return counts


def register(app: typer.Typer) -> None:
    @app.command("project", context_settings={"allow_extra_args": True})
    @user_errors
    def project(
        ctx: typer.Context,
        source: Annotated[
            Path,
            typer.Option(
                "--source", "-s", help="Results folder with training and all_reduce cells."
            ),
        ] = Path("results"),
        gpus: Annotated[
            Optional[List[int]],
            typer.Option(
                "--gpus", "-g", help="GPU counts to predict (repeat or list: --gpus 16 64)."
            ),
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
    ) -> None:
        """Predict step time, throughput and scaling efficiency at larger GPU counts."""
        from torchscale.analysis.alphabeta import BACK_TO_BACK
        from torchscale.analysis.projection import COMPUTE_DRIFT_LIMIT, CPU_WAIT_LIMIT
        from torchscale.analysis.projection import project as run_projection
        from torchscale.errors import TorchscaleError
        from torchscale.report.report_data import load_report_data

        targets = [*(gpus or []), *_extra_counts(ctx.args)] or ([] if holdout else DEFAULT_TARGETS)
        if any(n < 1 for n in targets) or gpus_per_node < 1:
            raise TorchscaleError(
                "--gpus and --gpus-per-node take positive integers, e.g. --gpus 16 64"
            )
        if inter_node_gbps is not None and inter_node_gbps <= 0:
            raise TorchscaleError("--inter-node-gbps must be a positive bandwidth in GB/s, e.g. 25")
        data = load_report_data(source)
        result = run_projection(data.records, targets, gpus_per_node, holdout, inter_node_gbps)
        rows = [_clean(r) for r in result.table.to_dict("records")]
        if json_output:
            print_json(
                {
                    "source": str(source),
                    "gpus_per_node": gpus_per_node,
                    "holdout": holdout,
                    "basis": result.basis,
                    "predictions": rows,
                }
            )
        for line in result.basis:
            result_console.print(f"> {line}", markup=False, soft_wrap=True)
        result_console.print(_table(rows, holdout))
        if holdout:
            for row in rows:
                if row.get("measured_throughput") is not None:
                    result_console.print(
                        f"> [INFO] Holdout {row['model']} · {row['variant']} at "
                        f"{row['world_size']} GPUs: predicted {row['throughput']:,.0f}, measured "
                        f"{row['measured_throughput']:,.0f} {row['unit']}/s "
                        f"({100 * row['error']:+.1f}%)",
                        markup=False,
                        soft_wrap=True,
                    )
                    waits = [row.get("cpu_wait_share"), row.get("reference_cpu_wait_share")]
                    if max((w for w in waits if w is not None), default=0.0) > CPU_WAIT_LIMIT:
                        shown = max(w for w in waits if w is not None)
                        result_console.print(
                            f"> [WARN] A rank waited for a CPU for {shown:.0%} of a measured "
                            "window (runnable, not running): the host was oversubscribed while "
                            "these cells ran, so measured and predicted are not comparable.",
                            markup=False,
                            soft_wrap=True,
                        )
                    comm = row.get("measured_comm_ms")
                    if comm and row["comm_ms"] and comm > 2 * row["comm_ms"]:
                        why = (
                            "the back-to-back micro-benchmark understates the fabric as DDP "
                            "uses it: set 'communication: {through_ddp: true}' to time each "
                            "all-reduce through DDP's own reducer"
                            if row.get("all_reduce_timing") == BACK_TO_BACK
                            else f"timed {row.get('all_reduce_timing')}, the communication "
                            "cells still understate it"
                        )
                        result_console.print(
                            f"> [WARN] DDP's own all-reduce took {comm:.3g} ms per step at "
                            f"{row['world_size']} GPUs, {comm / row['comm_ms']:.1f}x the "
                            f"{row['comm_ms']:.3g} ms the communication cells' fit gives: {why} "
                            "(docs/projection.md).",
                            markup=False,
                            soft_wrap=True,
                        )
                    drift = row.get("compute_drift")
                    if drift is not None and abs(drift) > COMPUTE_DRIFT_LIMIT:
                        result_console.print(
                            f"> [WARN] The compute-only step measured at {row['world_size']} GPUs "
                            f"is {100 * drift:+.0f}% off the {row['from_gpus']}-GPU one the "
                            "projection starts from: the node itself ran differently (a busier "
                            "machine, shared cores), which no projection foresees; with the "
                            "held-out cell's own compute-only step the prediction is "
                            f"{100 * row['error_at_measured_compute']:+.1f}% off.",
                            markup=False,
                            soft_wrap=True,
                        )
