"""Peak dense FLOP/s per device and precision: the one table MFU is computed against.

Figures are the vendors' dense (no sparsity) tensor-core peaks. ``fp32`` is plain FP32 (CUDA
cores); ``tf32`` is what fp32 matmuls and convolutions run at when TF32 math is on, which cuDNN
convolutions are by default (see :func:`peak_precision`).

Devices are recognised by whole words of the name ``torch.cuda.get_device_name()`` reports
("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "AMD Instinct MI300X"), never
by substring: "L40" must not read as "L4", nor "H200 NVL" as the H200 SXM.
"""

from __future__ import annotations

import re
from typing import Dict, Optional, Sequence, Tuple

# (words that must all appear in the name, in order) -> TFLOP/s by precision. The most specific
# entries first: the first match wins. PCIe/NVL variants run at lower clocks and power.
PEAK_TFLOPS: Tuple[Tuple[Tuple[str, ...], Dict[str, float]], ...] = (
    (("gh200",), {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0}),
    (("h200", "nvl"), {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0}),
    (("h200",), {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0}),
    (("h100", "pcie"), {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    (("h100", "nvl"), {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0}),
    (("h100",), {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0}),  # SXM
    (("h800",), {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0}),
    (("b200",), {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 80.0}),
    (("a100",), {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),  # PCIe = SXM
    (("a800",), {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (("l40s",), {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6}),
    (("l40",), {"bf16": 181.0, "fp16": 181.0, "tf32": 90.5, "fp32": 90.5}),
    (("l4",), {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (("a10g",), {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2}),
    (("a10",), {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    (("v100",), {"fp16": 125.0, "fp32": 15.7}),
    # ROCm reports the marketing name ("AMD Instinct MI300X"); "tf32" is AMD's xf32 peak.
    (("mi300x",), {"bf16": 1307.4, "fp16": 1307.4, "tf32": 653.7, "fp32": 163.4}),
)

CPU_PROCESS_TFLOPS = 0.05
"""A rough fp32 training rate of one CPU rank (one core): about 50 GFLOP/s (gpt2-tiny on one
gloo process of a 2-vCPU VM ran 55 GFLOP/s counted as 6 N per token). For estimates of how long
a cell takes on CPU processes only, never for MFU."""

# Which peak a training precision runs against: amp is fp16 autocast.
PRECISION_PEAK_KEY = {"bf16": "bf16", "amp": "fp16", "fp16": "fp16", "fp32": "fp32", "tf32": "tf32"}
_WORD = re.compile(r"[a-z0-9]+")


def _words(name: str) -> Sequence[str]:
    """``"NVIDIA A100-SXM4-80GB"`` -> ``["nvidia", "a100", "sxm4", "80gb"]``."""
    return _WORD.findall(name.lower())


def _matches(words: Sequence[str], wanted: Sequence[str]) -> bool:
    return all(word in words for word in wanted)


def device_matches(device_name: str, wanted: Sequence[str]) -> bool:
    """Whether every word of ``wanted`` is a whole word of ``device_name``."""
    return _matches(_words(device_name), wanted)


def device_peaks(device_name: Optional[str]) -> Optional[Dict[str, float]]:
    """The peak table of a device, None when the device is not known."""
    if not device_name:
        return None
    words = _words(device_name)
    for wanted, peaks in PEAK_TFLOPS:
        if _matches(words, wanted):
            return peaks
    return None


def peak_tflops(device_name: Optional[str], precision: str) -> Optional[float]:
    """Peak dense TFLOP/s of ``device_name`` at ``precision``; None when the device is unknown."""
    peaks = device_peaks(device_name)
    return peaks.get(PRECISION_PEAK_KEY.get(precision, precision)) if peaks else None


def peak_precision(precision: str, tf32_matmul: bool, tf32_conv: bool, has_conv: bool) -> str:
    """The peak an fp32 cell is scored against: TF32 when its dominant math runs in TF32.

    Convnets spend their FLOPs in cuDNN convolutions (TF32 by default in PyTorch); other models
    in matmuls (FP32 unless ``tf32`` or ``torch.set_float32_matmul_precision`` says otherwise).
    """
    if precision != "fp32":
        return precision
    tf32 = tf32_conv if has_conv else tf32_matmul
    return "tf32" if tf32 else "fp32"


def mfu(
    flops_per_sample: float, samples_per_s_per_device: float, peak: Optional[float]
) -> Optional[float]:
    """Model FLOPs utilisation: achieved model FLOP/s over the device peak (0..1)."""
    if not peak or flops_per_sample <= 0:
        return None
    return flops_per_sample * samples_per_s_per_device / (peak * 1e12)
