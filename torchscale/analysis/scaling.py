"""Scaling curves and the per-model summary, from the training table (see ``tables.py``).

A *variant* is one configuration of a model apart from its GPU count: its batch size plus whatever
other knob differs between the model's configurations (``batch 64 · bf16``). Curves are drawn per
model, one line per variant; repeats of a cell are averaged.
"""

from __future__ import annotations

import json
from typing import Dict, Iterable, Tuple

import pandas as pd

from torchscale.config.row_identity import (
    configuration_labels,
    differing,
    flat_configuration,
    label,
)
from torchscale.results.schema import CollectiveResult, ResultBase, TpGemmResult

EFFICIENCY_GOOD = 0.80
EFFICIENCY_EXCELLENT = 0.90
"""The bands the seed gives: good scaling > 80% efficiency, excellent > 90%."""

# Shown by their own columns.
_SHOWN_APART = ("model", "batch_size")


def efficiency_band(efficiency: float) -> str:
    if pd.isna(efficiency):
        return "unknown"
    if efficiency > EFFICIENCY_EXCELLENT:
        return "excellent"
    if efficiency > EFFICIENCY_GOOD:
        return "good"
    return "poor"


SCRIPT_VARIANT = "as scripted"
"""The label of a training script's configuration (``--script``) when nothing tells it apart."""


def label_variants(table: pd.DataFrame) -> pd.DataFrame:
    """Add ``variant``: batch size plus the settings that differ among a model's configurations
    (``config.row_identity``), and ``knobs``: those settings alone, precision among them (what a
    table with batch and precision columns of its own still has to show)."""
    table = table.copy()
    table["variant"] = ""
    table["knobs"] = ""
    if table.empty:
        return table
    flat = {key: flat_configuration(json.loads(key)) for key in table["config_key"].unique()}
    order: Dict[str, Tuple[int, str]] = {}
    for _, group in table.groupby(["experiment", "model"], sort=False):
        configs = [flat[key] for key in group["config_key"].unique()]
        varying = differing(configs, _SHOWN_APART)
        for key in group["config_key"].unique():
            rows = group.index[group["config_key"] == key]
            batch = flat[key].get("batch_size")
            lead = [f"batch {batch}"] if "batch_size" in flat[key] else []  # a script has none
            variant = label(flat[key], varying, lead) or SCRIPT_VARIANT
            table.loc[rows, "variant"] = variant
            table.loc[rows, "knobs"] = label(flat[key], [k for k in varying if k != "precision"])
            order.setdefault(variant, (batch if isinstance(batch, int) else 0, variant))
    # An ordered categorical sorts "batch 16" before "batch 128" in every table and chart.
    table["variant"] = pd.Categorical(
        table["variant"], categories=sorted(order, key=order.__getitem__), ordered=True
    )
    return table


COMM_DERIVED_SETTINGS = ("scopes",)
"""Follows from the node count (``comm.scopes``): never what tells two communication
configurations apart."""


def configuration_variants(records: Iterable[ResultBase]) -> Dict[str, str]:
    """Per communication cell id: the settings it differs in from the experiment's other
    communication cells (``backend=gloo``; "" when they share one configuration), the one row
    identity of ``config.row_identity``."""
    by_experiment: Dict[str, Dict[str, Dict[str, object]]] = {}
    for record in records:
        if isinstance(record, (CollectiveResult, TpGemmResult)):
            cells = by_experiment.setdefault(record.experiment, {})
            cells.setdefault(record.cell_id, record.settings)
    labels: Dict[str, str] = {}
    for cells in by_experiment.values():
        labels.update(configuration_labels(cells, COMM_DERIVED_SETTINGS))
    return labels


def scaling_curves(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (experiment, model, variant, world size) of measured cells.

    ``ideal_throughput`` is linear scaling from the variant's smallest measured GPU count.
    """
    columns = [
        "experiment",
        "model",
        "variant",
        "batch_size",
        "world_size",
        "nnodes",
        "unit",
        "throughput",
        "samples_per_s",
        "scaling_efficiency",
        "ideal_throughput",
        "sync_overhead_pct",
        "tflops_per_gpu",
        "mfu",
        "repeats",
    ]
    ok = table[(table["status"] == "ok") & table["throughput"].notna()]
    if ok.empty:
        return pd.DataFrame(columns=columns)
    keys = ["experiment", "model", "variant", "config_key", "batch_size", "world_size", "nnodes"]
    curves = (
        ok.groupby(keys, sort=True, dropna=False, observed=True)
        .agg(
            unit=("unit", "first"),
            throughput=("throughput", "mean"),
            samples_per_s=("samples_per_s", "mean"),
            scaling_efficiency=("scaling_efficiency", "mean"),
            sync_overhead_pct=("sync_overhead_pct", "mean"),
            tflops_per_gpu=("tflops_per_gpu", "mean"),
            mfu=("mfu", "mean"),
            repeats=("cell_id", "count"),
        )
        .reset_index()
    )
    config = [curves["experiment"], curves["config_key"]]
    first = curves.groupby(config)["world_size"].transform("min")
    at_first = curves["world_size"] == first
    fewest = curves["nnodes"].where(at_first).groupby(config).transform("min")
    # The baseline is the smallest count on the fewest nodes, as for scaling_efficiency.
    baseline = curves["throughput"].where(at_first & (curves["nnodes"] == fewest))
    base = baseline.groupby(config).transform("max")
    curves["ideal_throughput"] = base * curves["world_size"] / first
    curves = _split_node_layouts(curves)
    return curves[columns].sort_values(["experiment", "model", "variant", "world_size"])


def _split_node_layouts(curves: pd.DataFrame) -> pd.DataFrame:
    """A configuration measured at one GPU count on several node counts (``nodes: [1, 2]``)
    becomes one line per node count (``batch 32 · 2 nodes``), so 1 x 8 and 2 x 4 are never
    averaged or joined into one line."""
    config = [curves["experiment"], curves["config_key"]]
    layouts = curves.groupby([*config, curves["world_size"]])["nnodes"].transform("nunique")
    split = layouts.groupby(config).transform("max") > 1
    if not split.any():
        return curves
    curves = curves.copy()
    variant = curves["variant"].astype(str)
    nodes = curves["nnodes"].astype(int)
    suffix = " · " + nodes.astype(str) + nodes.map(lambda n: " node" if n == 1 else " nodes")
    labels = variant.where(~split, variant + suffix)
    kept = curves["variant"]
    old = list(kept.cat.categories) if isinstance(kept.dtype, pd.CategoricalDtype) else []
    order = {
        label: (old.index(v) if v in old else len(old), n)
        for label, v, n in zip(labels, variant, nodes)
    }
    curves["variant"] = pd.Categorical(
        labels, categories=sorted(order, key=order.__getitem__), ordered=True
    )
    return curves


def model_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per model: the fastest cell, and scaling efficiency at the largest GPU count measured."""
    columns = [
        "experiment",
        "model",
        "unit",
        "best_variant",
        "best_world_size",
        "best_throughput",
        "best_step_ms_p50",
        "largest_world_size",
        "efficiency_best",
        "efficiency_worst",
        "band",
    ]
    ok = table[(table["status"] == "ok") & table["throughput"].notna()]
    rows = []
    for (experiment, model), group in ok.groupby(["experiment", "model"], sort=True):
        best = group.sort_values("throughput", ascending=False, kind="stable").iloc[0]
        largest = int(group["world_size"].max())
        at_largest = group[group["world_size"] == largest]["scaling_efficiency"].dropna()
        has_baseline = largest > group["world_size"].min()
        best_eff = float(at_largest.max()) if has_baseline and len(at_largest) else float("nan")
        worst_eff = float(at_largest.min()) if has_baseline and len(at_largest) else float("nan")
        rows.append(
            {
                "experiment": experiment,
                "model": model,
                "unit": best["unit"],
                "best_variant": best["variant"],
                "best_world_size": int(best["world_size"]),
                "best_throughput": float(best["throughput"]),
                "best_step_ms_p50": best["step_ms_p50"],
                "largest_world_size": largest,
                "efficiency_best": best_eff,
                "efficiency_worst": worst_eff,
                "band": efficiency_band(best_eff),
            }
        )
    return pd.DataFrame(rows, columns=columns)
