"""Every ``validate`` probe, declared once (``PROBES``), and what a healthy device measures in
each: one table per SKU (``EXPECTED``), each figure with its source.

A probe's declaration is all that is said of it anywhere: its console label and unit, whether
more is better, the validate level that measures it, what it is measured on (each GPU, each CPU
slot, each GPU pair, the node) and the fix its row suggests when it falls short; its figures per
SKU are the entries under its name in ``EXPECTED``. ``validate`` derives the rest from it (which
probes a GPU that cannot be used fails, the rows' labels, units and fixes). A list with a piece
missing (a probe without a fix, a SKU figure of an undeclared probe) fails at import
(``check_probes``), and so in every test, never at judging time on a user's node.

A figure is either measured and published (a source to check it against) or derived from a
vendor peak and a stated efficiency (the derivation is the source). ``validate`` judges a
measured figure by its ratio to the expected one, with the thresholds of the config's
``validate:`` section; a device or probe without an entry here is judged against its peers only
(on CPU: against the node's own median, since CPUs are too varied for a table).

Devices are recognised by the whole words of their name, as :mod:`~torchscale.hardware.peaks`
does it (``device_matches``): the first matching row wins, the most specific first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from torchscale.hardware.links import link_peak_gbps, parse_link, pcie_lane_gbps
from torchscale.hardware.peaks import device_matches

EACH_GPU = "each GPU"
EACH_CPU_SLOT = "each CPU slot"
EACH_DEVICE = "each GPU and each CPU slot"
EACH_GPU_PAIR = "each GPU pair"
NODE = "the node"
MEASURED_ON = (EACH_GPU, EACH_CPU_SLOT, EACH_DEVICE, EACH_GPU_PAIR, NODE)
VALIDATE_LEVELS = (1, 2, 3)


@dataclass(frozen=True)
class Probe:
    """One measured quantity: its label on the console, its unit, the ``validate --level`` that
    measures it, what it is measured on (``MEASURED_ON``), the fix its row gives when it falls
    short (on a GPU node; on CPU the row gives the CPU's), and whether more is better."""

    label: str
    unit: str
    level: int
    measured_on: str
    fix: str
    higher_is_better: bool = True


GEMM_FIX = (
    "GEMM below its expected rate: look for throttling (`nvidia-smi -q -d "
    "PERFORMANCE,CLOCK,TEMPERATURE,POWER`: clocks-event reasons, SM clock below its peers, a "
    "lowered power limit), then `dcgmi diag -r 2`; RMA a GPU that stays slow."
)
MEMORY_COPY_FIX = (
    "Memory bandwidth below expected: check ECC and remapped rows (`nvidia-smi -q -d "
    "ECC,ROW_REMAPPER`) and the memory clock (`nvidia-smi -q -d CLOCK`)."
)
HOST_COPY_FIX = (
    "Host copies below expected: check the PCIe link (`nvidia-smi -q -d PCIE`, `sudo lspci -vv "
    "| grep LnkSta`), the NUMA placement (`nvidia-smi topo -m`: run on the GPU's CPU affinity) "
    "and IOMMU settings."
)
P2P_FIX = (
    "P2P below expected: check NVLink (`nvidia-smi nvlink -s`), the fabric manager on NVSwitch "
    "systems, and peer access (`nvidia-smi topo -p2p r`); ACS on PCIe switches routes P2P "
    "through the CPU."
)
LAUNCH_FIX = (
    "Launches slower than expected: the host CPU is slow or busy (`top`, the CPU governor row, "
    "`cpupower frequency-info`)."
)
COLLECTIVE_FIX = (
    "Node collectives below expected: rerun with NCCL_DEBUG=INFO to see the transport "
    "(NVLink/NVLS vs SHM/sockets), and compare with nccl-tests all_reduce_perf."
)

PROBES: Dict[str, Probe] = {
    "gemm_bf16": Probe("GEMM bf16", "TFLOP/s", 2, EACH_GPU, GEMM_FIX),
    "gemm_fp16": Probe("GEMM fp16", "TFLOP/s", 2, EACH_GPU, GEMM_FIX),
    "gemm_tf32": Probe("GEMM tf32", "TFLOP/s", 2, EACH_GPU, GEMM_FIX),
    "gemm_fp32": Probe("GEMM fp32", "TFLOP/s", 2, EACH_CPU_SLOT, GEMM_FIX),
    "memory_copy": Probe("Memory copy", "GB/s", 2, EACH_DEVICE, MEMORY_COPY_FIX),
    "host_to_device": Probe("Host to device (pinned)", "GB/s", 2, EACH_GPU, HOST_COPY_FIX),
    "device_to_host": Probe("Device to host (pinned)", "GB/s", 2, EACH_GPU, HOST_COPY_FIX),
    "p2p": Probe("P2P copy", "GB/s", 2, EACH_GPU_PAIR, P2P_FIX),
    "launch_latency": Probe(
        "Kernel launch", "us", 2, EACH_DEVICE, LAUNCH_FIX, higher_is_better=False
    ),
    "all_reduce": Probe("All-reduce busbw", "GB/s", 2, NODE, COLLECTIVE_FIX),
    "all_gather": Probe("All-gather busbw", "GB/s", 2, NODE, COLLECTIVE_FIX),
}
"""Every probe, by name (the ``probe`` of its figures), in the order a GPU measures them."""


@dataclass(frozen=True)
class Expected:
    value: float
    source: str
    ranks: Optional[int] = None  # node collectives: the rank count the figure holds for


MAMF = (
    "ml-engineering's Maximum Achievable Matmul FLOPS table (github.com/stas00/ml-engineering, "
    "compute/accelerator), best shape"
)
COPY_SHARE = 0.9  # a device-to-device copy kernel reaches ~90% of the HBM peak
LINK_SHARE = 0.85  # a copy-engine copy reaches ~85% of a link's per-direction peak
NVBANDWIDTH_H2D = Expected(
    55.6, "NVIDIA's NVbandwidth blog post: host_to_device_memcpy_ce on a PCIe Gen5 x16 GPU"
)


def _copy(spec_gbps: float, datasheet: str) -> Expected:
    return Expected(
        round(spec_gbps * COPY_SHARE),
        f"{datasheet}: HBM {spec_gbps:g} GB/s x {COPY_SHARE} (copy reads and writes each byte)",
    )


def _nvlink(link: str) -> Expected:
    peak = link_peak_gbps(parse_link(link))
    return Expected(
        round(peak * LINK_SHARE),
        f"{link}: {peak:g} GB/s per direction (hardware/links.py) x {LINK_SHARE}",
    )


def _pcie(generation: int) -> Expected:
    peak = pcie_lane_gbps(generation) * 16
    return Expected(
        round(peak * LINK_SHARE, 1),
        f"PCIe Gen{generation} x16: {peak:.1f} GB/s per direction x {LINK_SHARE}",
    )


def _derived_gemm(peak: float, efficiency: float, basis: str) -> Expected:
    return Expected(
        round(peak * efficiency),
        f"vendor peak {peak:g} TFLOP/s x {efficiency:.3f}, the MAMF efficiency of {basis}",
    )


_H100_SXM: Dict[str, Expected] = {
    "gemm_bf16": Expected(792.1, f"{MAMF}: H100 SXM, CUDA 12.1"),
    "gemm_fp16": Expected(792.1, "as bf16: the same tensor-core peak (NVIDIA H100 datasheet)"),
    "gemm_tf32": _derived_gemm(494.7, 792.1 / 989.4, "bf16 on H100 SXM"),
    "memory_copy": _copy(3350, "NVIDIA H100 SXM datasheet"),
    "host_to_device": NVBANDWIDTH_H2D,
    "device_to_host": NVBANDWIDTH_H2D,
    "p2p": _nvlink("nvlink4x18"),
    "all_reduce": Expected(
        370.0, "nccl-tests all_reduce_perf, 8 x H100 SXM over NVLink, ring (NVLS reaches ~480)", 8
    ),
}
_A100_SXM: Dict[str, Expected] = {
    "gemm_bf16": Expected(267.9, f"{MAMF}: A100 SXM, CUDA 12.1"),
    "gemm_fp16": Expected(267.9, "as bf16: the same tensor-core peak (NVIDIA A100 datasheet)"),
    "gemm_tf32": _derived_gemm(156.0, 267.9 / 312.0, "bf16 on A100 SXM"),
    "host_to_device": _pcie(4),
    "device_to_host": _pcie(4),
    "p2p": _nvlink("nvlink3x12"),
}

# (words of the device name) -> expected figures; most specific first, the first match wins.
EXPECTED: Tuple[Tuple[Tuple[str, ...], Dict[str, Expected]], ...] = (
    (
        ("gh200",),
        {
            "gemm_bf16": Expected(821.0, f"{MAMF}: GH200, CUDA 12.5"),
            "gemm_fp16": Expected(821.0, "as bf16: the same tensor-core peak"),
        },
    ),
    (
        ("h200",),
        {
            "gemm_bf16": Expected(794.5, f"{MAMF}: H100/H200 SXM"),
            "gemm_fp16": Expected(794.5, "as bf16: the same tensor-core peak"),
            "memory_copy": _copy(4800, "NVIDIA H200 datasheet"),
            "host_to_device": NVBANDWIDTH_H2D,
            "device_to_host": NVBANDWIDTH_H2D,
            "p2p": _nvlink("nvlink4x18"),
        },
    ),
    (
        ("h100", "pcie"),
        {
            "gemm_bf16": _derived_gemm(756.0, 792.1 / 989.4, "bf16 on H100 SXM"),
            "gemm_fp16": _derived_gemm(756.0, 792.1 / 989.4, "bf16 on H100 SXM"),
            "memory_copy": _copy(2000, "NVIDIA H100 PCIe datasheet"),
            "host_to_device": NVBANDWIDTH_H2D,
            "device_to_host": NVBANDWIDTH_H2D,
        },
    ),
    (("h100", "nvl"), {"memory_copy": _copy(3900, "NVIDIA H100 NVL datasheet")}),
    (("h100",), _H100_SXM),
    (
        ("a100", "pcie"),
        {
            "gemm_bf16": Expected(256.4, f"{MAMF}: A100 PCIe, CUDA 12.1"),
            "gemm_fp16": Expected(256.4, "as bf16: the same tensor-core peak"),
            "host_to_device": _pcie(4),
            "device_to_host": _pcie(4),
        },
    ),
    (("a100", "80gb"), {**_A100_SXM, "memory_copy": _copy(2039, "NVIDIA A100 80GB datasheet")}),
    (("a100",), {**_A100_SXM, "memory_copy": _copy(1555, "NVIDIA A100 40GB datasheet")}),
    (
        ("mi300x",),
        {
            "gemm_bf16": Expected(781.9, f"{MAMF}: MI300X, ROCm 6.2"),
            "gemm_fp16": Expected(781.9, "as bf16: the same matrix-core peak"),
            "memory_copy": _copy(5300, "AMD Instinct MI300X datasheet"),
        },
    ),
)


def expected_figure(
    device_name: Optional[str], probe: str, ranks: Optional[int] = None
) -> Optional[Expected]:
    """What ``probe`` should measure on ``device_name`` (None: no published figure here).

    A node collective's figure holds for its rank count only (``ranks``).
    """
    if not device_name:
        return None
    for wanted, figures in EXPECTED:
        if device_matches(device_name, wanted):
            figure = figures.get(probe)
            if figure is not None and figure.ranks is not None and figure.ranks != ranks:
                return None
            return figure
    return None


def probe_problems(
    probes: Mapping[str, Probe],
    expected: Iterable[Tuple[Tuple[str, ...], Mapping[str, Expected]]],
) -> List[str]:
    """What is wrong with a list of probes and the SKU tables (nothing: ``[]``)."""
    problems: List[str] = []
    for name, probe in probes.items():
        if not name.isidentifier():
            problems.append(f"probe {name!r}: its name is not a plain identifier")
        for piece in ("label", "unit", "fix"):
            if not str(getattr(probe, piece)).strip():
                problems.append(f"probe {name!r} has no {piece}")
        if probe.level not in VALIDATE_LEVELS:
            problems.append(f"probe {name!r}: level {probe.level} is not one of {VALIDATE_LEVELS}")
        if probe.measured_on not in MEASURED_ON:
            problems.append(f"probe {name!r}: measured on {probe.measured_on!r}, not one of ours")
    labels: Dict[str, List[str]] = {}
    for name, probe in probes.items():
        labels.setdefault(probe.label, []).append(name)
    problems += [f"probes {names} share the label {label!r}" for label, names in labels.items()
                 if len(names) > 1]  # fmt: skip
    for words, figures in expected:
        for name in figures:
            if name not in probes:
                problems.append(
                    f"SKU table {' '.join(words)!r}: figure of undeclared probe {name!r}"
                )
    return problems


def check_probes(
    probes: Mapping[str, Probe],
    expected: Iterable[Tuple[Tuple[str, ...], Mapping[str, Expected]]],
) -> None:
    problems = probe_problems(probes, expected)
    if problems:
        raise TypeError("; ".join(problems))


check_probes(PROBES, EXPECTED)  # at import: in every test, never first on a user's node


def probes_measured_on(*places: str) -> Tuple[str, ...]:
    """The probes measured on any of ``places``, in declaration order."""
    return tuple(name for name, probe in PROBES.items() if probe.measured_on in places)
