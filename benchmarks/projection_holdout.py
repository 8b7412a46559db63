"""``torchscale project --holdout`` on fresh results folders: how close the 2-rank prediction is.

Each repeat runs ``torchscale benchmark`` of ``tests/support/shared_runs.PROJECTION_CONFIG``
(gpt2-tiny on 1 and 2 gloo ranks, all_reduce cells on 2 timed back to back, after compute and
through DDP's reducer) into a new folder, then projects the 2-rank throughput from the 1-rank cell
three times: fitted to the all-reduces timed through DDP (what ``torchscale project`` uses) and,
for comparison, to those timed after compute and back to back (the records with the other fields
removed). Run from the repository root:

    PYTHONPATH=. python benchmarks/projection_holdout.py [--repeats 6] [--keep DIR]

Prints one Markdown row per repeat: the 1-minute load average before and after, predicted and
measured tokens/s, the three errors, the largest share of a measured window a rank waited for a
CPU (over 10%: the host was busy, and the test skips), the compute-only drift between the cells,
and the 662 KB bucket's all-reduce: each fit's time, and DDP's own measurement in training.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Sequence

from typer.testing import CliRunner

from tests.support.shared_runs import PROJECTION_CONFIG
from torchscale.analysis.projection import project
from torchscale.analysis.report_data import load_report_data
from torchscale.cli.app import app
from torchscale.results.schema import CollectiveResult, ResultBase


def _load() -> str:
    with open("/proc/loadavg", encoding="utf-8") as handle:
        return handle.read().split()[0]


def _holdout_row(records: Sequence[ResultBase]) -> Dict[str, Any]:
    table = project(records, [], holdout=True).table
    return dict(table[table["measured_throughput"].notna()].iloc[0])


def repeat(folder: Path) -> str:
    config = folder / "bench.yaml"
    config.write_text(PROJECTION_CONFIG, encoding="utf-8")
    before = _load()
    result = CliRunner().invoke(app, ["benchmark", "-c", str(config), "-o", str(folder / "r")])
    after_load = _load()
    if result.exit_code != 0:
        return f"| benchmark failed ({result.exit_code}): {result.output.strip()[-200:]} |"
    data = load_report_data(folder / "r" / "projection")
    new = _holdout_row(data.records)
    # The same records as if timed only after compute, and only back to back: the fits earlier
    # versions used.
    after = _holdout_row(_without(data.records, "ddp_time_us"))
    old = _holdout_row(_without(data.records, "ddp_time_us", "after_compute_time_us"))
    wait = max(new["cpu_wait_share"] or 0.0, new["reference_cpu_wait_share"] or 0.0)
    return (
        f"| {before} -> {after_load} | {new['throughput']:,.0f} | "
        f"{new['measured_throughput']:,.0f} | {100 * new['error']:+.1f}% | "
        f"{100 * after['error']:+.1f}% | {100 * old['error']:+.1f}% | {wait:.0%} | "
        f"{100 * new['compute_drift']:+.0f}% | {old['comm_ms']:.2f} | {after['comm_ms']:.2f} | "
        f"{new['comm_ms']:.2f} | {new['measured_comm_ms']:.2f} |"
    )


def _without(records: Sequence[ResultBase], *fields: str) -> List[ResultBase]:
    return [
        r.model_copy(update={field: None for field in fields})
        if isinstance(r, CollectiveResult)
        else r
        for r in records
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--keep", type=Path, help="Keep the results folders under this folder.")
    args = parser.parse_args()
    print(
        "| load | predicted | measured | error | error, after-compute fit | error, back-to-back "
        "fit | CPU wait | compute drift | all-reduce ms: back-to-back fit | after-compute fit | "
        "through-DDP fit | DDP in training |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for index in range(args.repeats):
        if args.keep:
            folder = args.keep / f"repeat-{index}"
            folder.mkdir(parents=True, exist_ok=True)
            print(repeat(folder), flush=True)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                print(repeat(Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
