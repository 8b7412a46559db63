"""Does a cell measure the same in a warm group as alone? Interleaved rounds, order randomised.

    PYTHONPATH=. python benchmarks/warm_fidelity.py [--rounds 4] [--seed 0] [--output-dir DIR]

Each round runs the same 4-cell matrix (gpt2-tiny and resnet-tiny, batch 8, on 1 and 2 gloo
ranks; 5 warm-up, 60 measured steps) twice: ``--launch per-group`` (two launches, one per world
size, each running two cells back to back in one process group) and ``--launch per-cell`` (four
launches). Per round the order of the two modes and the order of the models (so which cell runs
second, in a warm process) are drawn from ``--seed``: host drift over the minutes of a run falls
on both modes alike.

For every cell it prints group / alone of the median throughput over the rounds, and the noise
floor it is judged against: the same ratio between the two halves of the rounds *within* each
mode (what this host does to one mode between rounds). Step-time distributions: the two-sample
Kolmogorov-Smirnov distance between the modes' pooled step times, against the same distance
between the halves of one mode. The warm groups' fidelity goal holds for a cell when its group/alone
ratio lies within the within-mode spread, and the KS distance across modes is no larger than
within one.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

from torchscale.results.store import ExperimentStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from warm_groups import ks_distance

MODELS = ("gpt2-tiny", "resnet-tiny")
CONFIG = """\
experiment_name: fidelity
models: [{models}]
batch_sizes: [8]
gpu_counts: [1, 2]
warmup_steps: 5
measure_steps: 60
sync_probe_steps: 3
"""
MODES = ("per-group", "per-cell")
Samples = Dict[Tuple[str, str], List[Tuple[float, List[float], int]]]  # (mode, cell) -> runs


def cell_name(cell_id: str) -> str:
    """``gpt2-tiny-b8-g2-fp32-r0-<hash>`` -> ``gpt2-tiny-b8-g2``: the same cell in both modes."""
    return cell_id.rsplit("-", 3)[0]


def run_round(index: int, rng: random.Random, out: Path, samples: Samples) -> str:
    models = list(MODELS)
    rng.shuffle(models)
    modes = list(MODES)
    rng.shuffle(modes)
    config = out / f"round{index}.yaml"
    config.write_text(CONFIG.format(models=", ".join(models)))
    walls = []
    for mode in modes:
        folder = out / f"round{index}-{mode}"
        cmd = [sys.executable, "-m", "torchscale", "benchmark", "-c", str(config)]
        cmd += ["-o", str(folder)]
        start = time.perf_counter()
        subprocess.run([*cmd, "--launch", mode], check=True, capture_output=True)
        walls.append(f"{mode} {time.perf_counter() - start:.0f} s")
        for record in ExperimentStore(folder / "fidelity").records():
            position = int((record.launch or {}).get("position", 0))
            key = (mode, cell_name(record.cell_id))
            samples.setdefault(key, []).append(
                (record.samples_per_s, list(record.step_times_ms), position)
            )
    return f"round {index}: models {models}, {', '.join(walls)}"


def halves_ratio(values: List[float]) -> float:
    """Median of the even rounds over median of the odd ones: one mode against itself."""
    return statistics.median(values[0::2]) / statistics.median(values[1::2])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", type=Path, default=None)
    args = parser.parse_args()
    out = args.output_dir or Path(tempfile.mkdtemp(prefix="fidelity-"))
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    samples: Samples = {}
    for index in range(args.rounds):
        print(run_round(index, rng, out, samples), file=sys.stderr, flush=True)
    print(
        "| cell | group / alone, throughput | within-mode spread (group; alone) | verdict | "
        "step KS across modes | step KS within modes (group; alone) | per round, group / alone "
        "(1st: first cell of its launch; warm: after another cell in the same process) |"
    )
    print("|---|---|---|---|---|---|---|")
    for cell in sorted({cell for _, cell in samples}):
        group, alone = samples[("per-group", cell)], samples[("per-cell", cell)]
        thr_g = [s for s, _, _ in group]
        thr_a = [s for s, _, _ in alone]
        across = statistics.median(thr_g) / statistics.median(thr_a)
        spreads = (halves_ratio(thr_g), halves_ratio(thr_a))
        floor = max(abs(r - 1.0) for r in spreads)
        verdict = "within noise" if abs(across - 1.0) <= floor else "OUTSIDE noise"
        pooled_g = [t for _, steps, _ in group for t in steps]
        pooled_a = [t for _, steps, _ in alone for t in steps]
        ks_across = ks_distance(pooled_g, pooled_a)
        ks_within = tuple(
            ks_distance(
                [t for _, steps, _ in runs[0::2] for t in steps],
                [t for _, steps, _ in runs[1::2] for t in steps],
            )
            for runs in (group, alone)
        )
        # The same round's two runs minutes apart: host drift over the run cancels.
        paired = " ".join(
            f"{g[0] / a[0]:.3f} ({'warm' if g[2] > 0 else '1st'})" for g, a in zip(group, alone)
        )
        print(
            f"| {cell} | {across:.3f} | {spreads[0]:.3f}; {spreads[1]:.3f} | {verdict} | "
            f"{ks_across:.3f} | {ks_within[0]:.3f}; {ks_within[1]:.3f} | {paired} |"
        )
    warm = [g[0] / a[0] for key in samples if key[0] == "per-group"
            for g, a in zip(samples[key], samples[("per-cell", key[1])]) if g[2] > 0]  # fmt: skip
    first = [g[0] / a[0] for key in samples if key[0] == "per-group"
             for g, a in zip(samples[key], samples[("per-cell", key[1])]) if g[2] == 0]  # fmt: skip
    print(
        f"\nPaired group / alone over all cells: warm cells median {statistics.median(warm):.3f} "
        f"({min(warm):.3f}-{max(warm):.3f}, {len(warm)} runs); first cells median "
        f"{statistics.median(first):.3f} ({min(first):.3f}-{max(first):.3f}, {len(first)} runs)"
    )


if __name__ == "__main__":
    main()
