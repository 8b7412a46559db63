"""Time ops the way nccl-tests does: warm up, line the ranks up, time a loop, average.

On GPU the marks are CUDA events on the current stream (a synchronous torch.distributed call makes
that stream wait for the communication kernel); on CPU they are ``perf_counter`` readings, and gloo
calls return when the op is complete. Either way every rank leaves the barrier together, so the
per-rank averages are comparable and their spread shows a slow rank.

``time_after_compute`` times an op the way DDP issues a gradient bucket instead: alone, right after
compute that rewrote its buffer. On gloo over a CPU that costs several times a back-to-back op
(docs/projection.md).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, List, Sequence

import torch
import torch.distributed as dist

from torchscale.runtime.clock import Clock

Step = Callable[[], object]


def idle() -> None:
    """The step of a rank that only takes part in the barriers (e.g. outside a P2P pair)."""


def time_steps(clock: Clock, steps: Sequence[Step], warmup: int, iterations: int) -> List[float]:
    """Average microseconds of each step over ``iterations`` runs of ``steps`` in order.

    Marks are contiguous (each step's end is the next one's start), so the steps add up to the
    whole loop's time per iteration.
    """
    for _ in range(warmup):
        for step in steps:
            step()
    clock.synchronize()
    dist.barrier()
    clock.synchronize()
    marks = [clock.mark()]
    if len(steps) == 1:  # one op: time the loop alone, nothing between the calls
        for _ in range(iterations):
            steps[0]()
        marks.append(clock.mark())
        clock.synchronize()
        return [clock.ms(marks[0], marks[1]) * 1e3 / iterations]
    for _ in range(iterations):
        for step in steps:
            step()
            marks.append(clock.mark())
    clock.synchronize()
    totals = [0.0] * len(steps)
    for index in range(len(marks) - 1):
        totals[index % len(steps)] += clock.ms(marks[index], marks[index + 1])
    return [total * 1e3 / iterations for total in totals]


def time_op(clock: Clock, step: Step, warmup: int, iterations: int) -> float:
    """Average microseconds of one op over ``iterations`` back-to-back calls."""
    return time_steps(clock, [step], warmup, iterations)[0]


COMPUTE_STRETCH_MS = 10.0
"""Host time of the compute before each op in ``time_after_compute``: long enough that the
backend's threads go idle and the compute takes the caches and cores, as a backward pass does."""


def compute_stretch(buffer: torch.Tensor, ms: float = COMPUTE_STRETCH_MS) -> Step:
    """``ms`` of matrix products on ``buffer``'s device, then ``buffer`` rewritten (DDP copies
    gradients into its bucket before the all-reduce); on GPU the products are queued for that
    long, and the op runs after them in stream order."""
    matrix = torch.rand(256, 256, device=buffer.device)
    product = torch.empty_like(matrix)

    def run() -> None:
        end = time.perf_counter() + ms / 1e3
        while time.perf_counter() < end:
            torch.mm(matrix, matrix, out=product)
        buffer.fill_(1)

    return run


def time_after_compute(
    clock: Clock, before: Step, step: Step, warmup: int, iterations: int
) -> float:
    """Median microseconds of ``step`` when each call follows ``before`` (untimed). The ranks
    line up once, as in ``time_steps``; after that the op itself lines them up, so its time
    includes the ranks' differing compute, as a DDP bucket's does. The median, because each
    iteration is timed alone: one that another process's burst hit does not move it."""
    for _ in range(warmup):
        before()
        step()
    clock.synchronize()
    dist.barrier()
    clock.synchronize()
    marks = []
    for _ in range(iterations):
        before()
        start = clock.mark()
        step()
        marks.append((start, clock.mark()))
    clock.synchronize()
    return statistics.median(clock.ms(start, end) for start, end in marks) * 1e3
