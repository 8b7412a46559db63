"""torchscale's all_reduce figures against a plain torch.distributed.all_reduce timing loop.

Both run in the same torchrun job, on the same process group, same sizes, interleaved (the order
rotates every round), so drift and neighbours hit both alike; the plain loop runs twice per round,
and the ratio of its two runs shows how closely this machine can compare two timings at all.
torchscale's side goes through the communication worker's own code (``measure`` -> ``merge`` ->
the cell kind's records); the plain side is an independent loop written here. Goal: the two agree
within 5% at every size.
Run from the repository root:

    PYTHONPATH=. python benchmarks/comm_vs_plain.py [--nproc 2] [--min-bytes 64K]
        [--max-bytes 16M] [--factor 4] [--rounds 7] [--warmup 5] [--iterations 20]

Prints one row per size: each side's median time per op (µs, average over ranks) and busbw over
the rounds, the median over rounds of torchscale's time / the plain loop's time (the criterion),
and the same for the plain loop's second run / its first (the noise floor).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

TOLERANCE = 0.05


def plain_all_reduce_us(nbytes: int, warmup: int, iterations: int) -> float:
    """An ordinary timing loop: float32 all_reduce, barrier, wall clock, average over ranks."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(tensor)
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(tensor)
    if cuda:
        torch.cuda.synchronize()
    per_op = (time.perf_counter() - start) / iterations * 1e6
    total = torch.tensor([per_op], dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return float(total.item()) / dist.get_world_size()


def torchscale_all_reduce(
    ctx: Any, nbytes: int, warmup: int, iterations: int, cell_dir: Path
) -> dict:
    """One size through the communication worker's code path; rank 0 gets the record."""
    import torch.distributed as dist

    from torchscale.comm.config import CommCellSettings
    from torchscale.comm.kind import KIND
    from torchscale.comm.worker import measure, merge
    from torchscale.plan.kind_protocol import common_identity
    from torchscale.plan.planned_cell import Cell
    from torchscale.results.rank_files import RankReporter

    settings = CommCellSettings(
        collectives=["all_reduce"], p2p=False, sizes=[nbytes], dtypes=["float32"],
        warmup=warmup, iterations=iterations, check=False, gpus=ctx.world_size,
    )  # fmt: skip
    mine = measure(settings, ctx, RankReporter(cell_dir, ctx.rank))
    gathered = [None] * ctx.world_size if ctx.rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if ctx.rank != 0:
        return {}
    cell = Cell(0, "comm-vs-plain", settings, "communication")
    (record,) = KIND.records(cell, common_identity(cell, "bench"), merge(gathered, ctx, settings))
    return {"time_us": record.time_us, "busbw_gbps": record.busbw_gbps}


def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    from torchscale.comm.busbw import size_sweep
    from torchscale.runtime.process_group import init_distributed

    ctx = init_distributed(600)
    rank, n = ctx.rank, ctx.world_size
    sizes = size_sweep(args.min_bytes, args.max_bytes, args.factor)
    rows: Dict[int, Dict[str, List[float]]] = {
        size: {"ts": [], "plain": [], "plain_again": [], "ts_bw": []} for size in sizes
    }
    sides = ["ts", "plain", "plain_again"]
    with tempfile.TemporaryDirectory() as cell_dir:
        for round_ in range(args.rounds):
            order = sides[round_ % 3 :] + sides[: round_ % 3]  # each side leads in turn
            for size in sizes:
                for side in order:
                    if side != "ts":
                        rows[size][side].append(
                            plain_all_reduce_us(size, args.warmup, args.iterations)
                        )
                        continue
                    figures = torchscale_all_reduce(
                        ctx, size, args.warmup, args.iterations, Path(cell_dir)
                    )
                    if rank == 0:
                        rows[size]["ts"].append(figures["time_us"])
                        rows[size]["ts_bw"].append(figures["busbw_gbps"])
    if rank == 0:
        Path(args.out).write_text(json.dumps({"world_size": n, "rows": rows}))
    dist.destroy_process_group()


def _paired(numerator: List[float], denominator: List[float]) -> float:
    return statistics.median(a / b for a, b in zip(numerator, denominator))


def report(data: dict, args: argparse.Namespace) -> bool:
    """Per size: medians of each side, and the median of the per-round ratios (each round's
    figures were taken back to back, so their ratio cancels most of the machine's drift). The
    plain loop also runs twice per round: plain_again / plain is the noise floor of the ratio."""
    n = data["world_size"]
    print(f"# all_reduce float32 on {n} ranks, {args.rounds} rounds x {args.iterations} iterations")
    print(f"{'size (B)':>10} {'torchscale us':>14} {'plain us':>10} {'ts/plain':>9} "
          f"{'plain/plain':>12} {'ts busbw':>9} {'plain busbw':>11}")  # fmt: skip
    ok = True
    for size, row in sorted(data["rows"].items(), key=lambda item: int(item[0])):
        ts, plain = statistics.median(row["ts"]), statistics.median(row["plain"])
        ratio = _paired(row["ts"], row["plain"])
        floor = _paired(row["plain_again"], row["plain"])
        # The plain loop's busbw, by its own arithmetic: 2(n-1)/n x bytes / time.
        plain_bw = int(size) / (plain * 1e-6) / 1e9 * 2 * (n - 1) / n
        ok &= abs(ratio - 1) <= TOLERANCE
        print(f"{int(size):>10} {ts:>14.1f} {plain:>10.1f} {ratio:>9.3f} {floor:>12.3f} "
              f"{statistics.median(row['ts_bw']):>9.3f} {plain_bw:>11.3f}")  # fmt: skip
    print(f"torchscale within {TOLERANCE:.0%} of the plain loop at every size: "
          f"{'yes' if ok else 'NO'}")  # fmt: skip
    return ok


def main() -> None:
    from torchscale.config.sizes import parse_size

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2, help="ranks (CPU processes or GPUs)")
    parser.add_argument("--min-bytes", type=parse_size, default=parse_size("64K"))
    parser.add_argument("--max-bytes", type=parse_size, default=parse_size("16M"))
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved repetitions")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    import torch

    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, cuda={torch.cuda.is_available()}, "
          f"load average {os.getloadavg()[0]:.1f} at start")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = [
            sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.nproc}",
            "--standalone", __file__, "--worker", "--out", str(out), *sys.argv[1:],
        ]  # fmt: skip
        subprocess.run(command, check=True)
        ok = report(json.loads(out.read_text()), args)
    print(f"load average {os.getloadavg()[0]:.1f} at end")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
