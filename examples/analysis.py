"""The report's scaling table, from the Python API alone (a script you can paste into a notebook).

    python examples/analysis.py results/<experiment>            # prints the table
    python examples/analysis.py results/<experiment> --csv out.csv

Scaling efficiency is the seed's formula, throughput_N / (N / B * throughput_B), with B the
smallest GPU count measured for the same configuration (B = 1 when there is a 1-GPU cell);
repeats are averaged first; a configuration measured at one GPU count has none (NaN), as in the
report (docs/glossary.md). Bands: excellent above 90%, good above 80%.
"""

from __future__ import annotations

import argparse
from typing import List, Optional

import pandas as pd

import torchscale

CONFIG = ["experiment", "model", "batch_size", "precision", "grad_accum_steps"]


def band(efficiency: float) -> str:
    if pd.isna(efficiency):
        return "unknown"
    return "excellent" if efficiency > 0.9 else "good" if efficiency > 0.8 else "poor"


def scaling_table(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration and GPU count: throughput, ideal, efficiency, band."""
    ok = cells[(cells["status"] == "ok") & cells["throughput"].notna()]
    table = (
        ok.groupby([*CONFIG, "world_size"], as_index=False)
        .agg(unit=("unit", "first"), throughput=("throughput", "mean"), runs=("cell_id", "count"))
        .sort_values([*CONFIG, "world_size"])
    )
    base = table.groupby(CONFIG)["world_size"].transform("min")
    base_throughput = table.groupby(CONFIG)["throughput"].transform("first")
    table["ideal_throughput"] = base_throughput * table["world_size"] / base
    table["scaling_efficiency"] = table["throughput"] / table["ideal_throughput"]
    counts = table.groupby(CONFIG)["world_size"].transform("nunique")
    table["scaling_efficiency"] = table["scaling_efficiency"].where(counts > 1)
    table["band"] = table["scaling_efficiency"].map(band)
    return table.reset_index(drop=True)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="An experiment folder, or a folder of several.")
    parser.add_argument("--csv", help="Write the table to this CSV file too.")
    args = parser.parse_args(argv)
    table = scaling_table(torchscale.load(args.results))
    if args.csv:
        table.to_csv(args.csv, index=False)
    shown = table.assign(scaling_efficiency=table["scaling_efficiency"].map("{:.1%}".format))
    print(shown.to_string(index=False))


if __name__ == "__main__":
    main()
