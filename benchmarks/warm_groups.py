"""Warm process groups against a launch per cell: end-to-end wall time and fidelity, in one run.

    PYTHONPATH=. python benchmarks/warm_groups.py [--output-dir /tmp/warm] [--seed 0]

Runs the 12-cell CPU matrix (gpt2-tiny, resnet-tiny, bert-tiny x batch 4, 8 x 1, 2 processes;
3 warm-up and 20 measured steps) twice, as ``--launch per-group`` and ``--launch per-cell``, in an
order drawn from ``--seed``, timing each ``torchscale benchmark`` end to end. Goal:
per_group / per_cell wall time 0.4 or less.

Fidelity: for every cell, per_group's throughput, median step time and peak RSS over
per_cell's, and the two runs' parameter, gradient and optimizer bytes and step counts, which must
be equal. Then the same comparison extrapolated to the seed's 24-cell matrix (2 models x 3 batch
sizes x 1, 2, 4, 8 GPUs: 4 launch layouts): per_cell pays the start-up ``S`` 24 times, per_group
4 times, with ``S`` measured here (a per-cell launch's wall minus an in-group cell's) and the
cells' own time ``c`` as measured here (real models' cells are longer, so their ratio is nearer 1).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

from torchscale.results.store import ExperimentStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launch_overhead import CONFIG as OVERHEAD_CONFIG

# The 12-cell matrix of launch_overhead.py, so both speak of the same cells.
CONFIG = OVERHEAD_CONFIG.replace("experiment_name: overhead", "experiment_name: warm")
SEED_CELLS, SEED_LAYOUTS = 24, 4


def run(mode: str, out: Path, config: Path) -> Dict[str, Any]:
    cmd = [sys.executable, "-m", "torchscale", "benchmark", "-c", str(config), "-o", str(out)]
    start = time.perf_counter()
    subprocess.run([*cmd, "--launch", mode], check=True, capture_output=True)
    wall = time.perf_counter() - start
    records = {r.cell_id: r for r in ExperimentStore(out / "warm").records()}
    return {"wall_s": wall, "records": records}


def ks_distance(a: List[float], b: List[float]) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the two step-time
    distributions' empirical CDFs (0: the same, 1: disjoint)."""
    points = sorted(set(a) | set(b))
    return round(
        max(abs(sum(x <= p for x in a) / len(a) - sum(x <= p for x in b) / len(b)) for p in points),
        3,
    )


def per_cpu_second(record: Any) -> float:
    """Samples per second of CPU the training threads actually got (``cpu_time_s`` over the
    measured window): on a shared host, the runs of the two modes get different shares of the
    cores, and this takes that out."""
    share = statistics.mean(r.cpu_time_s / r.window_s for r in record.per_rank)
    return float(record.samples_per_s / share) if share else float("nan")


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--output-dir", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=None, help="order of the two runs")
    args = parser.parse_args()
    out = args.output_dir or Path(tempfile.mkdtemp(prefix="warm-"))
    out.mkdir(parents=True, exist_ok=True)
    config = out / "warm.yaml"
    config.write_text(CONFIG)
    seed = args.seed if args.seed is not None else random.randrange(1 << 16)
    order = ["per-group", "per-cell"]
    random.Random(seed).shuffle(order)
    runs = {mode: run(mode, out / mode, config) for mode in order}
    group, alone = runs["per-group"], runs["per-cell"]
    rows: List[Dict[str, Any]] = []
    for cell_id, a in alone["records"].items():
        g = group["records"][cell_id]
        same = all(
            (rg.memory.params_bytes, rg.memory.grads_bytes, rg.memory.optimizer_bytes)
            == (ra.memory.params_bytes, ra.memory.grads_bytes, ra.memory.optimizer_bytes)
            for rg, ra in zip(g.per_rank, a.per_rank)
        )
        rows.append(
            {
                "cell": cell_id.rsplit("-", 1)[0],
                "position": g.launch["position"],
                "throughput": ratio(g.samples_per_s, a.samples_per_s),
                "per_cpu_s": ratio(per_cpu_second(g), per_cpu_second(a)),
                "step_p50": ratio(g.step_time_ms.p50, a.step_time_ms.p50),
                "peak_rss": ratio(g.memory.peak_bytes, a.memory.peak_bytes),
                "step_ks": ks_distance(g.step_times_ms, a.step_times_ms),
                "same_bytes_and_steps": same and g.measure_steps == a.measure_steps,
                "wall_group_s": g.wall_s,
                "wall_alone_s": a.wall_s,
            }
        )
    startup = statistics.median(r["wall_alone_s"] for r in rows) - statistics.median(
        r["wall_group_s"] for r in rows if r["position"] > 0
    )
    cell = statistics.median(r["wall_group_s"] for r in rows if r["position"] > 0)
    seed_alone = SEED_CELLS * (startup + cell)
    seed_group = SEED_LAYOUTS * startup + SEED_CELLS * cell
    summary = {
        "order": order,
        "seed": seed,
        "wall_per_group_s": round(group["wall_s"], 1),
        "wall_per_cell_s": round(alone["wall_s"], 1),
        "ratio": ratio(group["wall_s"], alone["wall_s"]),
        "startup_s": round(startup, 2),
        "cell_in_group_s": round(cell, 2),
        "seed_24_cells_ratio": ratio(seed_group, seed_alone),
        "throughput_ratio_median": statistics.median(r["throughput"] for r in rows),
        "per_cpu_second_ratio_median": statistics.median(r["per_cpu_s"] for r in rows),
        "step_p50_ratio_median": statistics.median(r["step_p50"] for r in rows),
        "peak_rss_ratio_max": max(r["peak_rss"] for r in rows),
        "step_ks_median": statistics.median(r["step_ks"] for r in rows),
        "all_bytes_and_steps_equal": all(r["same_bytes_and_steps"] for r in rows),
    }
    print("| cell | position | throughput | per CPU-s | step p50 | step KS | peak RSS | bytes |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: r["cell"]):
        same = "equal" if r["same_bytes_and_steps"] else "DIFFER"
        print(
            f"| {r['cell']} | {r['position']} | {r['throughput']} | {r['per_cpu_s']} | "
            f"{r['step_p50']} | {r['step_ks']} | {r['peak_rss']} | {same} |"
        )
    print("(ratios: per_group / per_cell; step KS: two-sample Kolmogorov-Smirnov distance)")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
