"""Time ops the way nccl-tests does: warm up, line the ranks up, time a loop, average.

On GPU the marks are CUDA events on the current stream (a synchronous torch.distributed call makes
that stream wait for the communication kernel); on CPU they are ``perf_counter`` readings, and gloo
calls return when the op is complete. Either way every rank leaves the barrier together, so the
per-rank averages are comparable and their spread shows a slow rank.
"""

from __future__ import annotations

from typing import Callable, List, Sequence

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
