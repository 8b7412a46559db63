"""Why an all-reduce inside a DDP step costs more than a back-to-back one: time the same gloo
all-reduce three ways in one job, on the same process group, rounds interleaved.

* back to back: ``iterations`` ops in a loop, time / iterations (the communication cells' way);
* after compute: each op alone, right after 10 ms of matrix products that rewrite its buffer
  (``communication.after_compute``, a DDP bucket's way);
* after sleep: each op alone, right after 10 ms asleep and the same rewrite: idle backend threads
  without the compute.

Run from the repository root (it launches itself under torchrun):

    PYTHONPATH=. python benchmarks/allreduce_after_compute.py [--nproc 2] [--bytes 662528]
        [--rounds 3] [--iterations 20]

Prints, per way, each round's time per op (ms; medians of the per-op times for the two "after"
ways) on every rank, and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List


def _measure(nbytes: int, rounds: int, iterations: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    buffer = torch.zeros(nbytes // 4)
    matrix = torch.rand(256, 256)
    product = torch.empty_like(matrix)

    def compute() -> None:
        end = time.perf_counter() + 0.01
        while time.perf_counter() < end:
            torch.mm(matrix, matrix, out=product)
        buffer.fill_(1)

    def sleep() -> None:
        time.sleep(0.01)
        buffer.fill_(1)

    def alone(before: Callable[[], None]) -> float:
        times = []
        for index in range(iterations + 3):
            before()
            start = time.perf_counter()
            dist.all_reduce(buffer)
            if index >= 3:  # the first ops warm up
                times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    results: Dict[str, List[float]] = {"back to back": [], "after compute": [], "after sleep": []}
    for _ in range(rounds):
        for _ in range(3):
            dist.all_reduce(buffer)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(buffer)
        results["back to back"].append((time.perf_counter() - start) * 1e3 / iterations)
        results["after compute"].append(alone(compute))
        results["after sleep"].append(alone(sleep))
    gathered: List[Dict[str, List[float]]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, results)
    if dist.get_rank() == 0:
        print(f"{nbytes:,} B all_reduce, gloo, {dist.get_world_size()} ranks (ms per op)")
        for way in results:
            ranks = " | ".join(" ".join(f"{v:5.2f}" for v in rank[way]) for rank in gathered)
            print(f"  {way:14s} {ranks}")
        with open("/proc/loadavg", encoding="utf-8") as handle:
            print(f"  load average {handle.read().split()[0]}")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--bytes", type=int, default=662528)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:
        _measure(args.bytes, args.rounds, args.iterations)
        return
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={args.nproc}", __file__, *sys.argv[1:]]
    subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
