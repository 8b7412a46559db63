"""A GPU-sized model planned on CPU processes: say so before it runs, with the time a cell will
take, so that nobody waits an hour for a ResNet-50 sweep on a laptop.

A model is GPU-sized when it has ``GPU_SIZED_PARAMS`` parameters or more (resnet50, bert-large,
the gpt2 family but gpt2-tiny). The time per cell is an estimate: its steps times the model's
training FLOPs per step (``models.flops.rough_training_flops``) at one CPU rank's rough rate
(``hardware.peaks.CPU_PROCESS_TFLOPS``), plus the launch.
"""

from __future__ import annotations

from typing import List, Optional

from torchscale.config.settings import BenchmarkConfig
from torchscale.hardware.device_noun import is_cpu
from torchscale.hardware.peaks import CPU_PROCESS_TFLOPS
from torchscale.models.flops import rough_training_flops
from torchscale.models.registry import describe

GPU_SIZED_PARAMS = 10_000_000
DEFAULT_MEASURE_STEPS = 50  # measure_steps when neither it nor measure_seconds is set
LAUNCH_S = 10.0
"""A cell's start-up on CPU: torchrun, the workers' torch import, the process group, the model."""
TINY_SIBLING = {"vision": "resnet-tiny", "masked-lm": "bert-tiny", "causal-lm": "gpt2-tiny"}


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def cell_seconds(config: BenchmarkConfig, flops_per_sample: float) -> float:
    """The longest cell of ``config`` for a model of ``flops_per_sample``, roughly."""
    batch = int(max(config.batch_sizes)) * int(max(config.grad_accum_steps))
    step_s = batch * flops_per_sample / (CPU_PROCESS_TFLOPS * 1e12)
    probe = int(max(config.sync_probe_steps))
    steps = max(int(max(config.warmup_steps)), 1) + (2 * probe + 2 if probe else 0)
    timed = [float(s) for s in config.measure_seconds if s is not None]
    counted = [int(n) for n in config.measure_steps if n is not None]
    if not counted and not timed:
        counted = [DEFAULT_MEASURE_STEPS]
    window = max([step_s * max(counted, default=0), max(timed, default=0.0)])
    return float(LAUNCH_S + steps * step_s + window)


def gpu_sized_warnings(config: BenchmarkConfig, device_kind: str) -> List[str]:
    """One line per GPU-sized model of ``config`` when its ranks are CPU processes."""
    if not is_cpu(device_kind):
        return []
    lines = []
    for name in dict.fromkeys(config.models):
        entry = describe(name)
        if entry is None or entry.params < GPU_SIZED_PARAMS:
            continue
        seq_len: Optional[int] = max((s for s in config.seq_len if s is not None), default=None)
        tokens = seq_len if entry.uses_seq_len else None
        flops = rough_training_flops(entry.family, entry.params, tokens)
        seconds = cell_seconds(config, flops)
        sibling = TINY_SIBLING.get(entry.family)
        instead = f"; to try torchscale on CPU use {sibling}" if sibling else ""
        lines.append(
            f"{name} is a GPU-sized model ({entry.params / 1e6:,.0f}M parameters) planned on CPU "
            f"processes: a cell of it takes about {_duration(seconds)} here (batch "
            f"{max(config.batch_sizes)}, at ~{CPU_PROCESS_TFLOPS * 1e3:g} GFLOP/s per process)"
            f"{instead}"
        )
    return lines
