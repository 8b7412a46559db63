"""The smoke-test worker, launched by torchrun: one all-reduce checked for correctness, then timed.

Run as ``python -m torch.distributed.run ... -m torchscale.validate.smoke_worker --result FILE``.
Rank ``r`` contributes ``x[i] = i % 251 + r``, so every element of the sum is known exactly
(``n * (i % 251) + n (n - 1) / 2``, small integers that float32 holds exactly) and a misplaced or
dropped chunk shows up as wrong elements. Rank 0 writes the outcome to ``--result`` as JSON.

``TORCHSCALE_SMOKE_HANG=<dir>`` is a test hook for a peer that never joins: every rank writes its
pid to ``<dir>`` as it starts, then every rank but 0 sleeps forever while rank 0 waits for them in
the process-group rendezvous, a real hang as far as the launcher can tell.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Dict, List, Optional

HANG_ENV = "TORCHSCALE_SMOKE_HANG"
PATTERN_PERIOD = 251
SAMPLE = 8  # leading elements of the sum sent back, for the launcher to check independently


def expected_sum(numel: int, world_size: int) -> List[float]:
    """What every rank must hold after the all-reduce (pure Python, for tests and the worker)."""
    offset = world_size * (world_size - 1) // 2
    return [float(world_size * (i % PATTERN_PERIOD) + offset) for i in range(numel)]


def _hang_if_asked() -> None:
    hang_dir = os.environ.get(HANG_ENV)
    if not hang_dir:
        return
    rank = int(os.environ.get("RANK", "0"))
    Path(hang_dir, f"rank{rank}.pid").write_text(str(os.getpid()))
    if rank != 0:
        while True:
            time.sleep(60)


def time_all_gather(size_bytes: int, device: object, warmup: int, iters: int) -> Dict[str, object]:
    """All-gather timed as nccl-tests' all_gather_perf lays it out (comm/busbw.py): each rank
    sends ``size / n`` bytes and receives ``size``; the slowest rank defines the time."""
    import torch
    import torch.distributed as dist

    from torchscale.comm.busbw import algbw_gbps, busbw_gbps, layout
    from torchscale.comm.op_timing import time_op
    from torchscale.runtime.clock import Clock

    assert isinstance(device, torch.device)
    world = dist.get_world_size()
    shape = layout("all_gather", size_bytes, 4, world)
    send = torch.ones(shape.input_elements, dtype=torch.float32, device=device)
    if device.type == "cuda":
        out = torch.empty(shape.output_elements, dtype=torch.float32, device=device)

        def step() -> None:
            dist.all_gather_into_tensor(out, send)

    else:  # gloo: the list form
        parts = [torch.empty_like(send) for _ in range(world)]

        def step() -> None:
            dist.all_gather(parts, send)

    time_us = time_op(Clock(device), step, warmup, iters)
    slowest = torch.tensor([time_us], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    per_op = float(slowest.item()) * 1e-6
    return {
        "size_bytes": shape.size_bytes,
        "time_us": per_op * 1e6,
        "algbw_gbps": algbw_gbps(shape.size_bytes, per_op),
        "busbw_gbps": busbw_gbps("all_gather", shape.size_bytes, per_op, world),
    }


def run(
    size_bytes: int, warmup: int, iters: int, timeout_s: float, all_gather: bool = False
) -> Optional[Dict[str, object]]:
    import torch
    import torch.distributed as dist

    from torchscale.comm.busbw import algbw_gbps, busbw_gbps
    from torchscale.comm.op_timing import time_op
    from torchscale.runtime.clock import Clock

    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    # A backstop only: the launcher's own timeout (shorter) ends a hang first.
    dist.init_process_group(backend, timeout=timedelta(seconds=2 * timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    numel = size_bytes // 4

    # Correctness: one all-reduce of a known pattern, compared element by element.
    index = torch.arange(numel, dtype=torch.int64, device=device)
    data = (index % PATTERN_PERIOD + rank).to(torch.float32)
    dist.all_reduce(data)
    expected = (index % PATTERN_PERIOD * world + world * (world - 1) // 2).to(torch.float32)
    wrong = torch.tensor([int((data != expected).sum().item())], device=device)
    dist.all_reduce(wrong)

    # Timing: as the communication benchmark times it (nccl-tests style: a warm-up, a barrier,
    # then the mean over back-to-back iterations); the slowest rank defines the time.
    buf = torch.zeros(numel, dtype=torch.float32, device=device)
    time_us = time_op(Clock(device), partial(dist.all_reduce, buf), warmup, iters)
    slowest = torch.tensor([time_us], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    per_op = float(slowest.item()) * 1e-6
    result = {
        "backend": backend,
        "world_size": world,
        "size_bytes": numel * 4,
        "elements": numel,
        "iterations": iters,
        "wrong_elements": int(wrong.item()),
        "sample": [float(v) for v in data[:SAMPLE].tolist()],
        "time_us": per_op * 1e6,
        "algbw_gbps": algbw_gbps(numel * 4, per_op),
        "busbw_gbps": busbw_gbps("all_reduce", numel * 4, per_op, world),
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
    }
    if all_gather:
        result["all_gather"] = time_all_gather(numel * 4, device, warmup, iters)
    dist.destroy_process_group()
    return result if rank == 0 else None


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--result", type=Path, required=True, help="JSON file rank 0 writes")
    parser.add_argument("--size-bytes", type=int, default=4 << 20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=60.0, help="the launch timeout (s)")
    parser.add_argument("--all-gather", action="store_true", help="also time an all-gather")
    args = parser.parse_args(argv)
    from torchscale.launch.liveness import watch_parent
    from torchscale.results.files import atomic_write_json

    watch_parent()  # dies with its torchrun or with torchscale, even one killed by SIGKILL
    _hang_if_asked()
    result = run(args.size_bytes, args.warmup, args.iters, args.timeout, args.all_gather)
    if result is not None:
        atomic_write_json(args.result, result)


if __name__ == "__main__":
    main()
