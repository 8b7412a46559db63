"""Intra- vs inter-node scaling: how much efficiency one node's GPUs lose, how much the network.

For a configuration measured on K nodes of G ranks (N = K x G), against its baseline B::

    scaling_efficiency(N)  = intra_node_efficiency x inter_node_efficiency
    intra_node_efficiency  = scaling efficiency of the one-node cell with G ranks (against B)
    inter_node_efficiency  = throughput_N / (K x throughput of that one-node G-rank cell)

so a 16-GPU cell at 70% splits into, say, 95% inside the node and 74% across nodes. Every figure
uses :func:`torchscale.analysis.training_tables.efficiency`, the one definition. The
inter-node factor needs the one-node cell with the same ranks per node (``nodes: [1, 2]``, or
``gpu_counts`` that include one full node); without it the factors are NaN.
"""

from __future__ import annotations

import pandas as pd

from torchscale.analysis.training_tables import efficiency

NODE_SCALING_COLUMNS = [
    "model", "batch_size", "precision", "nnodes", "nproc_per_node", "world_size",
    "samples_per_s", "throughput", "unit", "scaling_efficiency", "baseline_world_size",
    "intra_node_efficiency", "inter_node_efficiency", "hosts", "config_key",
]  # fmt: skip


def node_scaling(table: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration x node count x ranks per node (repeats averaged), from
    :func:`~torchscale.analysis.training_tables.training_table`; only measured (ok) cells."""
    ok = table[(table["status"] == "ok") & table["samples_per_s"].notna()]
    if ok.empty:
        return pd.DataFrame(columns=NODE_SCALING_COLUMNS)
    rows = (
        ok.groupby(["config_key", "nnodes", "nproc_per_node"], as_index=False)
        .agg(
            model=("model", "first"),
            batch_size=("batch_size", "first"),
            precision=("precision", "first"),
            world_size=("world_size", "first"),
            samples_per_s=("samples_per_s", "mean"),
            throughput=("throughput", "mean"),
            unit=("unit", "first"),
            scaling_efficiency=("scaling_efficiency", "mean"),
            baseline_world_size=("baseline_world_size", "first"),
            hosts=("hosts", lambda hosts: " ".join(sorted({h for s in hosts for h in s.split()}))),
        )
        .sort_values(["config_key", "world_size", "nnodes"], kind="stable")
    )
    one_node = rows[rows["nnodes"] == 1].set_index(["config_key", "nproc_per_node"])
    keys = list(zip(rows["config_key"], rows["nproc_per_node"]))
    found = [key in one_node.index for key in keys]
    base = one_node.reindex(keys)
    rows["intra_node_efficiency"] = base["scaling_efficiency"].to_numpy()
    rows["inter_node_efficiency"] = efficiency(
        rows["samples_per_s"].to_numpy(),
        rows["world_size"].to_numpy(),
        base["samples_per_s"].to_numpy(),
        base["world_size"].to_numpy(),
    )
    rows.loc[[not f for f in found], ["intra_node_efficiency", "inter_node_efficiency"]] = float(
        "nan"
    )
    return rows[NODE_SCALING_COLUMNS].reset_index(drop=True)
