"""Shared test setup: a wide, plain console so CLI output is stable to assert on."""

from __future__ import annotations

import os

# Rich reads COLUMNS when it is not writing to a terminal; pin it before torchscale is imported.
os.environ["COLUMNS"] = "200"
os.environ.setdefault("NO_COLOR", "1")
# The suite tests the CPU (gloo) path, the same on any machine; the GPU path is checked on a GPU
# node by benchmarks/gpu_truth.py (docs/perf-gpu.md) and here through NVML recorded on a real H100.
# So torch in this process and in every process it launches sees no GPU, even on a GPU node.
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import pytest
from typer import rich_utils


@pytest.fixture(autouse=True, scope="session")
def setup_terminal() -> None:
    rich_utils.MAX_WIDTH = 200
    rich_utils.FORCE_TERMINAL = False


def _nvml_gpu_count() -> int:
    """GPUs the real NVML sees (0 without a driver): hiding CUDA from torch does not hide them."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library: a CPU-only machine
        return 0


NVML_GPUS = _nvml_gpu_count()


def pytest_collection_modifyitems(items: list) -> None:
    skip = pytest.mark.skip(
        reason=f"asserts a CPU-only node's answers; NVML sees {NVML_GPUS} GPU(s) here"
    )
    for item in items:
        if NVML_GPUS and item.get_closest_marker("cpu_only_node"):
            item.add_marker(skip)
