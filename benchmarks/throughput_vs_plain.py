"""Does torchscale report the throughput a plain DDP loop gets? (The training path's acceptance
benchmark.)

For each model and world size, runs a torchscale cell and ``plain_ddp_loop.py`` (same model,
batch, warm-up and steps, same torchrun, same threads per rank) for several rounds, the order
alternating each round, and reports the median ratio torchscale / plain. Goals: >= 0.98
(instrumentation costs nothing) and |ratio - 1| <= 0.02 (the figures agree). Each round also times
the plain loop a second time: the median of plain / plain is the noise floor, how closely this
machine can compare two runs of the very same code.

    python benchmarks/throughput_vs_plain.py --models gpt2-tiny resnet-tiny --gpus 1 2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

from torchscale.config.loader import load_config
from torchscale.hardware.environment import threads_per_cpu_slot
from torchscale.launch.cell import run_cell
from torchscale.launch.process import python_env
from torchscale.plan.matrix import expand
from torchscale.results.store import ExperimentStore

HERE = Path(__file__).resolve().parent


def torchscale_rate(model: str, gpus: int, batch: int, warmup: int, steps: int, tmp: Path) -> float:
    config = load_config(
        None,
        base={
            "experiment_name": "vs-plain",
            "models": [model],
            "batch_sizes": [batch],
            "gpu_counts": [gpus],
            "warmup_steps": warmup,
            "measure_steps": steps,
            "sync_probe_steps": 2,
        },
    )
    cell = expand(config).cells[0]
    env = {"OMP_NUM_THREADS": str(threads_per_cpu_slot())}
    (record,) = run_cell(cell, ExperimentStore(tmp), "vs-plain", env=env)
    if record.status != "ok":
        raise SystemExit(f"torchscale cell failed: {record.error}")
    return float(record.samples_per_s)


def plain_rate(model: str, gpus: int, batch: int, warmup: int, steps: int) -> float:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
        str(HERE / "plain_ddp_loop.py"), "--model", model, "--batch-size", str(batch),
        "--warmup", str(warmup), "--steps", str(steps),
    ]  # fmt: skip
    env = python_env({"OMP_NUM_THREADS": str(threads_per_cpu_slot())})
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    line = next(line for line in out.splitlines() if line.startswith("{"))
    return float(json.loads(line)["samples_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["gpt2-tiny", "resnet-tiny"])
    parser.add_argument("--gpus", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    rows: List[Dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            for gpus in args.gpus:
                shape = (model, gpus, args.batch_size, args.warmup, args.steps)
                ours, plain, again = [], [], []
                for round_ in range(args.rounds):
                    if round_ % 2:  # alternate who goes first: drift must not favour one side
                        plain.append(plain_rate(*shape))
                        ours.append(torchscale_rate(*shape, Path(tmp)))
                    else:
                        ours.append(torchscale_rate(*shape, Path(tmp)))
                        plain.append(plain_rate(*shape))
                    again.append(plain_rate(*shape))
                ratios = [a / b for a, b in zip(ours, plain)]
                floor = [c / b for c, b in zip(again, plain)]
                ratio = statistics.median(ratios)
                rows.append(
                    {
                        "model": model,
                        "gpus": gpus,
                        "torchscale_samples_per_s": round(statistics.median(ours), 1),
                        "plain_samples_per_s": round(statistics.median(plain), 1),
                        "median_ratio": round(ratio, 4),
                        "noise_floor_plain_vs_plain": round(statistics.median(floor), 4),
                        "ratios": [round(r, 4) for r in ratios],
                        "plain_vs_plain": [round(r, 4) for r in floor],
                        "meets_0.98": ratio >= 0.98,
                        "within_2pct": abs(ratio - 1) <= 0.02,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
