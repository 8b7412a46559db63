"""``torchscale project``: predicted step time, throughput and efficiency at larger GPU counts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, Hashable, List, Mapping, Optional, Tuple

import typer
from typing_extensions import Annotated

from torchscale.cli.console import (
    err_console,
    print_json,
    say,
    show_result,
    user_errors,
)
from torchscale.measures.figures import GLOSSARY_DOC

DEFAULT_TARGETS = [16, 64, 256, 1024]


def _clean(row: Mapping[Hashable, Any]) -> Dict[str, Any]:
    return {str(k): None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}


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
        from torchscale.analysis.projection import project as run_projection
        from torchscale.analysis.report_data import load_report_data
        from torchscale.errors import TorchscaleError
        from torchscale.hardware.device_noun import is_cpu

        targets = [*(gpus or []), *_extra_counts(ctx.args)] or ([] if holdout else DEFAULT_TARGETS)
        if any(n < 1 for n in targets) or gpus_per_node < 1:
            raise TorchscaleError(
                "--gpus and --gpus-per-node take positive integers, e.g. --gpus 16 64"
            )
        if inter_node_gbps is not None and inter_node_gbps <= 0:
            raise TorchscaleError("--inter-node-gbps must be a positive bandwidth in GB/s, e.g. 25")
        data = load_report_data(source)
        folders = {e.name: e.path for e in data.experiments}
        result = run_projection(
            data.records, targets, gpus_per_node, holdout, inter_node_gbps, folders
        )
        rows = [_clean(r) for r in result.table.to_dict("records")]
        from torchscale.app.history import history_location, record_predictions

        record_predictions(history_location(history), rows, say)
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
            say(f"> {line}")
        show_result(_table(rows, holdout))
        if any(is_cpu(row.get("measured_on")) for row in rows):
            say(
                "> [WARN] Rows from CPU are extrapolated from gloo on CPU processes (loopback on "
                "one host): they say how this CPU setup would scale, not what GPUs would do."
            )
        if holdout:
            for row in rows:
                if row.get("measured_throughput") is not None:
                    for line in _holdout_lines(row):
                        show_result(line)


def _holdout_lines(row: Dict[str, Any]) -> List[str]:
    """What the held-out cell says: predicted against measured, and why they may differ."""
    from torchscale.analysis.alphabeta import BACK_TO_BACK
    from torchscale.analysis.projection import COMPUTE_DRIFT_LIMIT, CPU_WAIT_LIMIT
    from torchscale.hardware.device_noun import count_text

    at = count_text(row["world_size"], row.get("measured_on"))
    lines = [
        f"> [INFO] Holdout {row['model']} · {row['variant']} at {at}: predicted "
        f"{row['throughput']:,.0f}, measured {row['measured_throughput']:,.0f} {row['unit']}/s "
        f"({100 * row['error']:+.1f}%)"
    ]
    waits = [w for w in (row.get("cpu_wait_share"), row.get("reference_cpu_wait_share")) if w]
    if max(waits, default=0.0) > CPU_WAIT_LIMIT:
        lines.append(
            f"> [WARN] A rank waited for a CPU for {max(waits):.0%} of a measured window "
            "(runnable, not running): the host was oversubscribed while these cells ran, so "
            "measured and predicted are not comparable."
        )
    comm = row.get("measured_comm_ms")
    if comm and row["comm_ms"] and comm > 2 * row["comm_ms"]:
        why = (
            "the back-to-back micro-benchmark understates the fabric as DDP uses it: set "
            "'communication: {through_ddp: true}' to time each all-reduce through DDP's own "
            "reducer"
            if row.get("all_reduce_timing") == BACK_TO_BACK
            else f"timed {row.get('all_reduce_timing')}, the communication cells still "
            "understate it"
        )
        lines.append(
            f"> [WARN] DDP's own all-reduce took {comm:.3g} ms per step at {at}, "
            f"{comm / row['comm_ms']:.1f}x the {row['comm_ms']:.3g} ms the communication cells' "
            f"fit gives: {why} (docs/projection.md)."
        )
    drift = row.get("compute_drift")
    if drift is not None and abs(drift) > COMPUTE_DRIFT_LIMIT:
        start = count_text(row["from_gpus"], row.get("measured_on"))
        lines.append(
            f"> [WARN] The compute-only step measured at {at} is {100 * drift:+.0f}% off the "
            f"one on {start} the projection starts from: the node itself ran differently (a "
            "busier machine, shared cores), which no projection foresees; with the held-out "
            "cell's own compute-only step the prediction is "
            f"{100 * row['error_at_measured_compute']:+.1f}% off."
        )
    return lines
