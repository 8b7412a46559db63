"""Models that fail on purpose, for the benchmark engine's fault tests.

Use them as ``tests.support.fault_models:<factory>`` with the repository root on PYTHONPATH. Each wraps
``resnet-tiny`` and injects its fault in ``forward``. Every setting can be given as a keyword
argument or, since the engine passes a factory only the options it knows, through an environment
variable the test sets for one launch (the keyword argument wins):

===========================  ======================  ==========================================
variable                     default                 used by
===========================  ======================  ==========================================
TORCHSCALE_TEST_OOM_AT       32                      oom_model: per-rank batch size that fails
TORCHSCALE_TEST_FAULT_RANK   1                       hang, crash and slow-rank models
TORCHSCALE_TEST_FAULT_AFTER  2                       hang and crash: forward calls done first
TORCHSCALE_TEST_DELAY_MS     50                      slow_rank_model: sleep per forward
TORCHSCALE_TEST_CHILD_TAG    (none)                  killed_model: the child's last argument
===========================  ======================  ==========================================

``oversubscribed_model`` uses ``TORCHSCALE_TEST_FAULT_RANK`` too: that rank's training thread is
pinned to one core, and ``TORCHSCALE_TEST_SPINNERS`` (default 2) busy processes pinned to the same
core compete with it.

Ranks come from torchrun's ``RANK`` variable (0 when unset). Faults count forward calls, which
are steps unless gradient accumulation runs several forwards per step.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import resource
import signal
import subprocess
import sys
import time
from typing import Callable, Optional

import torch
from torch import nn

from torchscale.models import ModelSpec
from torchscale.models.resnet import resnet_tiny

# torch.OutOfMemoryError is the device-generic name from torch 2.5; CUDA's is older.
OutOfMemoryError = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)

Fault = Callable[[int, torch.Tensor], None]
"""Called before each forward with the number of forward calls so far and the input batch."""


class FaultInjector(nn.Module):
    """Runs ``fault`` before each forward of ``inner``."""

    def __init__(self, inner: nn.Module, fault: Fault) -> None:
        super().__init__()
        self.inner = inner
        self.fault = fault
        self.forward_calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fault(self.forward_calls, x)
        self.forward_calls += 1
        return self.inner(x)


def setting(value: Optional[int], variable: str, default: int) -> int:
    """The keyword argument if given, else the environment variable, else the default."""
    if value is not None:
        return int(value)
    return int(os.environ.get(variable, default))


def current_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def with_fault(name: str, fault: Fault) -> ModelSpec:
    base = resnet_tiny()
    return dataclasses.replace(
        base,
        name=name,
        build=lambda: FaultInjector(base.build(), fault),
        description=f"resnet-tiny with an injected fault ({name})",
    )


def oom_model(oom_at_batch: Optional[int] = None) -> ModelSpec:
    """Raises an out-of-memory error in forward when the per-rank batch is >= ``oom_at_batch``."""
    threshold = setting(oom_at_batch, "TORCHSCALE_TEST_OOM_AT", 32)

    def fault(calls: int, x: torch.Tensor) -> None:
        if x.shape[0] >= threshold:
            raise OutOfMemoryError(
                f"CUDA out of memory (injected by tests.support.fault_models.oom_model: batch size "
                f"{x.shape[0]} >= {threshold})"
            )

    return with_fault("oom-model", fault)


def hang_model(rank: Optional[int] = None, after_steps: Optional[int] = None) -> ModelSpec:
    """On ``rank``, forward sleeps forever once ``after_steps`` forwards have run."""
    hang_rank = setting(rank, "TORCHSCALE_TEST_FAULT_RANK", 1)
    after = setting(after_steps, "TORCHSCALE_TEST_FAULT_AFTER", 2)

    def fault(calls: int, x: torch.Tensor) -> None:
        if current_rank() == hang_rank and calls >= after:
            while True:  # short sleeps, so signals (the engine's kill) are handled promptly
                time.sleep(0.1)

    return with_fault("hang-model", fault)


def crash_model(rank: Optional[int] = None, after_steps: Optional[int] = None) -> ModelSpec:
    """On ``rank``, forward raises ``RuntimeError("injected crash on rank N")`` once
    ``after_steps`` forwards have run."""
    crash_rank = setting(rank, "TORCHSCALE_TEST_FAULT_RANK", 1)
    after = setting(after_steps, "TORCHSCALE_TEST_FAULT_AFTER", 2)

    def fault(calls: int, x: torch.Tensor) -> None:
        if current_rank() == crash_rank and calls >= after:
            raise RuntimeError(f"injected crash on rank {crash_rank}")

    return with_fault("crash-model", fault)


def slow_rank_model(rank: Optional[int] = None, delay_ms: Optional[int] = None) -> ModelSpec:
    """On ``rank``, every forward first sleeps ``delay_ms``: a straggler the others wait for."""
    slow_rank = setting(rank, "TORCHSCALE_TEST_FAULT_RANK", 1)
    delay_s = setting(delay_ms, "TORCHSCALE_TEST_DELAY_MS", 50) / 1000

    def fault(calls: int, x: torch.Tensor) -> None:
        # Not even sleep(0) without a delay: it yields the core, and on a busy two-core host the
        # yielding rank alone would arrive late at most collectives (a straggler the test made).
        if delay_s > 0 and current_rank() == slow_rank:
            time.sleep(delay_s)

    return with_fault("slow-rank-model", fault)


# A busy loop that ends soon after its parent (the rank) is gone, whatever killed it.
_SPINNER = """
import os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
parent, count = os.getppid(), 0
while True:
    count += 1
    if count % 200000 == 0 and os.getppid() != parent:
        break
"""


def oversubscribed_model(rank: Optional[int] = None, spinners: Optional[int] = None) -> ModelSpec:
    """On ``rank``, the training thread shares its core with ``spinners`` busy processes from the
    first forward on: an oversubscribed host, as when other jobs' processes land on its core."""
    busy_rank = setting(rank, "TORCHSCALE_TEST_FAULT_RANK", 1)
    count = setting(spinners, "TORCHSCALE_TEST_SPINNERS", 2)

    def fault(calls: int, x: torch.Tensor) -> None:
        if current_rank() != busy_rank or calls:
            return
        core = busy_rank % (os.cpu_count() or 1)
        os.sched_setaffinity(0, {core})  # this (the training) thread only
        for _ in range(count):
            spinner = subprocess.Popen([sys.executable, "-c", _SPINNER, str(core)])
            atexit.register(spinner.kill)

    return with_fault("oversubscribed-model", fault)


def killed_model(rank: Optional[int] = None, after_steps: Optional[int] = None) -> ModelSpec:
    """On ``rank``, the first forward starts a child process (a ``sleep`` in the rank's session,
    as a data loader or a helper would); once ``after_steps`` forwards have run the rank is killed
    with SIGKILL, as the kernel's OOM killer does: no exception, no error file, and a child left
    behind. The child's command line ends with ``TORCHSCALE_TEST_CHILD_TAG`` so a test finds it."""
    killed_rank = setting(rank, "TORCHSCALE_TEST_FAULT_RANK", 1)
    after = setting(after_steps, "TORCHSCALE_TEST_FAULT_AFTER", 2)

    def fault(calls: int, x: torch.Tensor) -> None:
        if current_rank() != killed_rank:
            return
        if calls == 0:
            tag = os.environ.get("TORCHSCALE_TEST_CHILD_TAG", "torchscale-test-child")
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", tag])
        if calls >= after:
            os.kill(os.getpid(), signal.SIGKILL)

    return with_fault("killed-model", fault)


def exit_model(rank: Optional[int] = None, after_steps: Optional[int] = None) -> ModelSpec:
    """On ``rank``, ``os._exit(0)`` once ``after_steps`` forwards have run: a rank that leaves
    with success in the middle of the measured window (a library that calls exit)."""
    exit_rank = setting(rank, "TORCHSCALE_TEST_FAULT_RANK", 1)
    after = setting(after_steps, "TORCHSCALE_TEST_FAULT_AFTER", 2)

    def fault(calls: int, x: torch.Tensor) -> None:
        if current_rank() == exit_rank and calls >= after:
            os._exit(0)

    return with_fault("exit-model", fault)


def memory_model(rank: Optional[int] = None, after_steps: Optional[int] = None) -> ModelSpec:
    """On ``rank``, once ``after_steps`` forwards have run, the process's address space is
    limited (``RLIMIT_AS``: its current size plus 256 MiB) and forward asks for 1 GiB: Python
    raises a real ``MemoryError``. The peers block in the backward's all-reduce."""
    failing_rank = setting(rank, "TORCHSCALE_TEST_FAULT_RANK", 1)
    after = setting(after_steps, "TORCHSCALE_TEST_FAULT_AFTER", 2)

    def fault(calls: int, x: torch.Tensor) -> None:
        if current_rank() != failing_rank or calls < after:
            return
        with open("/proc/self/statm", encoding="ascii") as statm:
            size = int(statm.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (size + (256 << 20), resource.RLIM_INFINITY))
        bytearray(1 << 30)

    return with_fault("memory-model", fault)


class _Diverged(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * float("nan")


def nan_model() -> ModelSpec:
    """resnet-tiny whose outputs, and so its loss, are NaN from the first step on every rank: a
    model that diverged. Nothing fails; the steps run at full speed."""
    base = resnet_tiny()
    return dataclasses.replace(
        base,
        name="nan-model",
        build=lambda: _Diverged(base.build()),
        description="resnet-tiny whose loss is NaN (diverged)",
    )
