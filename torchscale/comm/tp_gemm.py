"""The seed DDLB primitive: column-wise tensor-parallel GEMM, ``C[m, n] = A[m, k] @ B[k, n]``.

A is sharded by rows (each rank holds ``m / world_size`` rows), B is replicated, and every rank
ends with the whole C:

* ``AG_before``: all-gather A, then the full GEMM (each rank computes all of C);
* ``AG_after``: GEMM on the local rows, then all-gather the pieces of C.

The compute-only reference is the unsharded GEMM on one device: the result is validated against
it (``torch.allclose`` with a dtype tolerance) and its time (DDLB's compute-only ``unsharded``
size) says what the communication costs. DDLB's ``sharded`` size is the GEMM each rank does alone
on its ``m / world_size`` rows, every rank at once: what the primitive would cost with free
communication. TFLOP/s is ``2 m n k / time`` for every order, as DDLB reports it.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from torchscale.comm.collective_ops import Corruption, all_gather_single, torch_dtype
from torchscale.comm.config import TpGemmCase
from torchscale.comm.op_timing import time_op, time_steps
from torchscale.runtime.clock import Clock

SEED = 1234
# dtype -> (atol per sqrt(k), rtol): the GEMM adds k products in a different order per order and
# shard, so the absolute error grows like sqrt(k) units of the dtype's precision.
TOLERANCE = {
    "float64": (1e-12, 1e-10),
    "float32": (1e-5, 1e-4),
    "float16": (1e-3, 1e-2),
    "bfloat16": (1e-2, 2e-2),
}


def tolerance(dtype: str, k: int) -> Tuple[float, float]:
    """(atol, rtol) for comparing a C of ``dtype`` with inner dimension ``k``."""
    per_sqrt_k, rtol = TOLERANCE[dtype]
    return per_sqrt_k * math.sqrt(k), rtol


def make_inputs(case: TpGemmCase, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """A and B, uniform in [-1, 1] from a fixed seed: the same on every rank."""
    generator = torch.Generator().manual_seed(SEED)
    dtype = torch_dtype(case.dtype)
    a = (2 * torch.rand(case.m, case.k, generator=generator) - 1).to(dtype)
    b = (2 * torch.rand(case.k, case.n, generator=generator) - 1).to(dtype)
    return a.to(device), b.to(device)


def sharded_steps(
    case: TpGemmCase, a_local: torch.Tensor, b: torch.Tensor, world_size: int
) -> Tuple[List[Callable[[], object]], int, torch.Tensor]:
    """(steps in order, index of the all-gather step, the tensor that ends up holding C)."""
    if case.order == "AG_before":
        gathered = a_local.new_empty(case.m, case.k)
        c = a_local.new_empty(case.m, case.n)
        steps = [
            lambda: all_gather_single(gathered, a_local),
            lambda: torch.matmul(gathered, b, out=c),
        ]
        return steps, 0, c
    local_c = a_local.new_empty(case.m // world_size, case.n)
    c = a_local.new_empty(case.m, case.n)
    steps = [
        lambda: torch.matmul(a_local, b, out=local_c),
        lambda: all_gather_single(c, local_c),
    ]
    return steps, 1, c


def run_case(
    clock: Clock,
    case: TpGemmCase,
    rank: int,
    world_size: int,
    device: torch.device,
    warmup: int,
    iterations: int,
    check: bool,
    corruption: Optional[Corruption],
    compute_only: Sequence[str] = ("unsharded",),
) -> Dict[str, object]:
    """This rank's figures for one case: step times, the compute-only times asked for
    (``unsharded``: ``reference_time_us``; ``sharded``: ``sharded_time_us``), the validation."""
    a, b = make_inputs(case, device)
    rows = case.m // world_size
    a_local = a[rank * rows : (rank + 1) * rows].contiguous()
    steps, comm_index, c = sharded_steps(case, a_local, b, world_size)
    step_us = time_steps(clock, steps, warmup, iterations)
    figures: Dict[str, object] = {
        "time_us": sum(step_us),
        "comm_time_us": step_us[comm_index],
        "gemm_time_us": step_us[1 - comm_index],
    }

    reference = a.new_empty(case.m, case.n)

    def whole() -> object:
        return torch.matmul(a, b, out=reference)

    if "unsharded" in compute_only:
        figures["reference_time_us"] = time_op(clock, whole, warmup, iterations)
    elif check:
        whole()  # the check's reference, untimed
    if "sharded" in compute_only:
        shard_c = a_local.new_empty(rows, case.n)
        figures["sharded_time_us"] = time_op(
            clock, lambda: torch.matmul(a_local, b, out=shard_c), warmup, iterations
        )
    if check:
        for step in steps:  # a fresh result, as the check of the collectives does
            step()
        clock.synchronize()
        if corruption and corruption.applies("tp_gemm", rank, None):
            corruption.perturb(c)
        atol, rtol = tolerance(case.dtype, case.k)
        close = torch.isclose(c, reference, rtol=rtol, atol=atol)
        error = (c.double() - reference.double()).abs()
        figures.update(
            wrong=int((~close).sum().item()),
            max_abs_error=float(error.max().item()) if error.numel() else 0.0,
            atol=atol,
            rtol=rtol,
        )
    return figures
