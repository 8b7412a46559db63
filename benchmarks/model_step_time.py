"""Time one training step (forward, backward, optimizer step) of each tiny model on one CPU core.

The tiny models exist so the engine's tests can run real DDP training on CPUs; the goal is a
step well under 100 ms at the batch sizes the tests use. Run from the repository root:

    PYTHONPATH=. python benchmarks/model_step_time.py [--steps 30] [--batch-sizes 8 16 32]

Prints one row per model and batch size: median and 90th-percentile step time over ``--steps``
timed steps (after 3 warm-up steps) and the achieved GFLOP/s from the model's flops_per_sample.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from typing import List

import torch

from torchscale.models.registry import load_model

TINY_MODELS = ["resnet-tiny", "gpt2-tiny", "bert-tiny"]
WARMUP_STEPS = 3


def step_times_ms(name: str, batch_size: int, steps: int) -> List[float]:
    torch.manual_seed(0)
    spec = load_model(name)
    model = spec.build()
    if spec.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs, targets = spec.batch(batch_size, torch.device("cpu"))
    times = []
    for step in range(WARMUP_STEPS + steps):
        start = time.perf_counter()
        outputs = model(**inputs) if isinstance(inputs, dict) else model(inputs)
        spec.loss(outputs, targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= WARMUP_STEPS:
            times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per row")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--models", nargs="+", default=TINY_MODELS)
    args = parser.parse_args()
    torch.set_num_threads(1)

    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, 1 thread")
    print(f"{'model':<12} {'batch':>5} {'p50 ms':>8} {'p90 ms':>8} {'GFLOP/s':>8}")
    for name in args.models:
        flops = load_model(name).flops_per_sample
        for batch_size in args.batch_sizes:
            times = sorted(step_times_ms(name, batch_size, args.steps))
            p50 = statistics.median(times)
            p90 = times[int(0.9 * (len(times) - 1))]
            gflops = flops * batch_size / (p50 / 1000) / 1e9
            print(f"{name:<12} {batch_size:>5} {p50:>8.1f} {p90:>8.1f} {gflops:>8.1f}")


if __name__ == "__main__":
    main()
