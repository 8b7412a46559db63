"""Timestamps inside a training step: CUDA events on GPU, perf_counter on CPU.

CUDA events are recorded in stream order, so on GPU the gaps where the device waits for the host
count too (a launch-bound model shows up as a long step). Nothing synchronises until the window
ends, so timing does not perturb what it measures.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Tuple

import torch


class Clock:
    """Marks points in time on the device's timeline."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two marks (call after synchronize on GPU)."""
        if self.cuda:
            return float(start.elapsed_time(end))
        elapsed: float = (end - start) * 1e3
        return elapsed


class StepMarks:
    """The marks of one optimizer step: per micro-batch data/forward/backward, then optimizer."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.start = clock.mark()
        self.micro: List[Tuple[Any, Any, Any]] = []  # (data_ready, forward_end, backward_end)
        self.end: Any = None

    def durations(self) -> Dict[str, float]:
        """Phase totals in ms for this step: step, data, forward, backward, optimizer."""
        ms = self.clock.ms
        data = forward = backward = 0.0
        previous = self.start
        for data_ready, forward_end, backward_end in self.micro:
            data += ms(previous, data_ready)
            forward += ms(data_ready, forward_end)
            backward += ms(forward_end, backward_end)
            previous = backward_end
        return {
            "step": ms(self.start, self.end),
            "data": data,
            "forward": forward,
            "backward": backward,
            "optimizer": ms(previous, self.end),
        }
