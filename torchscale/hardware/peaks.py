"""Peak dense FLOP/s per device and precision: the one table MFU is computed against.

Figures are the vendors' dense (no sparsity) tensor-core peaks for the SXM/high-power parts unless
the name says otherwise. fp32 means plain FP32 (PyTorch does not use TF32 for matmuls by default).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

# (substring of torch.cuda.get_device_name(), lower case) -> TFLOP/s by precision.
# More specific names first: the first match wins.
PEAK_TFLOPS: Tuple[Tuple[str, Dict[str, float]], ...] = (
    ("h100 pcie", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    ("h100 nvl", {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0}),
    ("h100", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0}),
    ("h200", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0}),
    ("gh200", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0}),
    ("b200", {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 80.0}),
    ("a100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("a800", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("l40s", {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6}),
    ("l4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("a10g", {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2}),
    ("a10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    ("v100", {"fp16": 125.0, "fp32": 15.7}),
)

# Which peak a training precision runs against: amp is fp16 autocast.
PRECISION_PEAK_KEY = {"bf16": "bf16", "amp": "fp16", "fp16": "fp16", "fp32": "fp32", "tf32": "tf32"}


def peak_tflops(device_name: Optional[str], precision: str) -> Optional[float]:
    """Peak dense TFLOP/s of ``device_name`` at ``precision``; None when the device is unknown."""
    if not device_name:
        return None
    name = device_name.lower()
    key = PRECISION_PEAK_KEY.get(precision, precision)
    for pattern, peaks in PEAK_TFLOPS:
        if pattern in name:
            return peaks.get(key)
    return None


def mfu(
    flops_per_sample: float, samples_per_s_per_device: float, peak: Optional[float]
) -> Optional[float]:
    """Model FLOPs utilisation: achieved model FLOP/s over the device peak (0..1)."""
    if not peak or flops_per_sample <= 0:
        return None
    return flops_per_sample * samples_per_s_per_device / (peak * 1e12)
