"""Build the NVML fixtures of tests/data/nvml/ from published outputs of real nodes.

No GPU node was at hand to record with ``python tests/support/fakes/fake_pynvml.py record``, so each
fixture is written here from public ``nvidia-smi`` / ``nvidia-smi topo -m`` / NCCL topology dumps of
the same hardware (sources in each fixture's ``sources``), translated into what NVML returns for
those fields: names, memory, bus ids, driver and CUDA versions, power limits and idle draw,
temperature thresholds, clocks, PCIe generation and width, NVLink ports and where they lead.
Faults are injected into otherwise-healthy recordings exactly as NVML reports them.

Run ``python tests/data/nvml/build_fixtures.py`` to rewrite the JSON files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).parent
MIB = 1 << 20
NOT_SUPPORTED = {"error": "NVML_ERROR_NOT_SUPPORTED"}
FUNCTION_NOT_FOUND = {"error": "NVML_ERROR_FUNCTION_NOT_FOUND"}
INVALID_ARGUMENT = {"error": "NVML_ERROR_INVALID_ARGUMENT"}
SWITCH, GPU = 2, 0  # nvmlNvLinkDeviceType_t
NODE, SYSTEM, MULTIPLE, HOSTBRIDGE, SINGLE = 40, 50, 20, 30, 10  # nvmlGpuTopologyLevel_t
IDLE = 0x1  # nvmlClocksEventReasonGpuIdle

H100_SOURCES = [
    "https://github.com/NVIDIA/nccl/issues/1264 (HGX H100 SXM: nvidia-smi, topo -m NV18)",
    "https://github.com/aliyun/SimAI/issues/128 (H100 NCCL topology: 4+5+5+4 links, 4 NVSwitches)",
    "https://github.com/NVIDIA/DCGM/issues/120 (H100 nvidia-smi -q: clocks, ECC, remapped rows)",
]
H100_BUS = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
H100_SWITCH_LINKS = [("05", 4), ("06", 5), ("07", 5), ("08", 4)]
A100_SOURCES = [
    "https://github.com/NVIDIA/nccl/issues/1505 (DGX A100 40GB: topo -m NV12, 2 links to each of "
    "6 NVSwitches c4-c9)",
    "https://github.com/NVIDIA/nvidia-docker/issues/1648 (A100-SXM4-40GB nvidia-smi -q)",
    "https://github.com/ggml-org/llama.cpp/issues/4747 (driver 535.129.03, CUDA 12.2)",
]
A100_BUS = ["07", "0F", "47", "4E", "87", "90", "B7", "BD"]
V100_SOURCES = [
    "https://github.com/NVIDIA/nccl/issues/671 (DGX-1V NCCL topology: hybrid cube-mesh NVLinks)",
    "https://github.com/NVIDIA/nccl/issues/326 (V100-SXM2 nvidia-smi: 300 W, persistence on)",
]
V100_BUS = ["06", "07", "0A", "0B", "85", "86", "89", "8A"]
# DGX-1V hybrid cube-mesh: NVLinks between each pair (nvidia-smi topo -m NV1/NV2, else SYS).
V100_LINKS = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2,
    (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2,
}  # fmt: skip


def bus(short: str) -> str:
    return f"00000000:{short}:00.0"


def keyed(values: Dict[Any, Any], default: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    out = {str(k): v for k, v in values.items()}
    if default is not None:
        out["*"] = default
    return out


def nvlinks(ports: Sequence[Tuple[int, str, int]], max_links: int) -> Dict[str, Any]:
    """Ports as (state, remote bus id, remote type); links past the GPU's last answer as NVML
    does: NotSupported up to the driver's NVML_NVLINK_MAX_LINKS (18), InvalidArgument beyond."""
    beyond = {str(n): NOT_SUPPORTED for n in range(len(ports), max_links)}
    return {
        "nvmlDeviceGetNvLinkState": {
            **{str(n): p[0] for n, p in enumerate(ports)},
            **beyond,
            "*": INVALID_ARGUMENT,
        },
        "nvmlDeviceGetNvLinkRemotePciInfo": {
            **{str(n): {"busId": p[1]} for n, p in enumerate(ports)},
            "*": INVALID_ARGUMENT,
        },
        "nvmlDeviceGetNvLinkRemoteDeviceType": {
            **{str(n): p[2] for n, p in enumerate(ports)},
            "*": INVALID_ARGUMENT,
        },
    }


def device(
    *,
    name: str,
    bus_id: str,
    memory_mib: int,
    used_mib: int,
    thresholds: Tuple[int, int, int],
    temperature: int,
    power_w: float,
    limit_w: int,
    clocks: Tuple[int, int],
    max_clocks: Tuple[int, int],
    pcie: Tuple[int, int, int, int],
    util: int,
    reasons: int,
    ports: List[Tuple[int, str, int]],
    topology: Dict[int, int],
    remapped_rows: Any,
    retired: Tuple[Any, Any, Any],
    ecc_uncorrected: int = 0,
    persistence: int = 1,
    reasons_function: str = "nvmlDeviceGetCurrentClocksEventReasons",
    mig: Any = (0, 0),
) -> Dict[str, Any]:
    shutdown, slowdown, gpu_max = thresholds
    gen, max_gen, width, max_width = pcie
    single, double, pending = retired
    record: Dict[str, Any] = {
        "nvmlDeviceGetName": name,
        "nvmlDeviceGetPciInfo": {"busId": bus_id, "busIdLegacy": bus_id[4:]},
        "nvmlDeviceGetMemoryInfo": {
            "total": memory_mib * MIB,
            "free": (memory_mib - used_mib) * MIB,
            "used": used_mib * MIB,
        },
        "nvmlDeviceGetPersistenceMode": persistence,
        "nvmlDeviceGetEccMode": [1, 1],
        # [current, pending]: MIG disabled (Volta and older answer NotSupported)
        "nvmlDeviceGetMigMode": list(mig) if isinstance(mig, tuple) else mig,
        # (error type, counter type): uncorrected volatile, corrected volatile
        "nvmlDeviceGetTotalEccErrors": {"1,0": ecc_uncorrected, "0,0": 0},
        "nvmlDeviceGetRemappedRows": remapped_rows,
        "nvmlDeviceGetRetiredPages": {"0": single, "1": double},
        "nvmlDeviceGetRetiredPagesPendingStatus": pending,
        "nvmlDeviceGetTemperature": {"0": temperature},
        "nvmlDeviceGetTemperatureThreshold": {"0": shutdown, "1": slowdown, "3": gpu_max},
        "nvmlDeviceGetPowerUsage": int(power_w * 1000),
        "nvmlDeviceGetEnforcedPowerLimit": limit_w * 1000,
        "nvmlDeviceGetPowerManagementDefaultLimit": limit_w * 1000,
        "nvmlDeviceGetClockInfo": {"1": clocks[0], "2": clocks[1]},
        "nvmlDeviceGetMaxClockInfo": {"1": max_clocks[0], "2": max_clocks[1]},
        "nvmlDeviceGetCurrPcieLinkGeneration": gen,
        "nvmlDeviceGetMaxPcieLinkGeneration": max_gen,
        "nvmlDeviceGetCurrPcieLinkWidth": width,
        "nvmlDeviceGetMaxPcieLinkWidth": max_width,
        "nvmlDeviceGetUtilizationRates": {"gpu": util, "memory": util // 2},
        "nvmlDeviceGetTopologyCommonAncestor": keyed(topology),
        "nvmlDeviceGetCurrentClocksEventReasons": FUNCTION_NOT_FOUND,
        "nvmlDeviceGetCurrentClocksThrottleReasons": FUNCTION_NOT_FOUND,
    }
    record[reasons_function] = reasons
    if reasons_function == "nvmlDeviceGetCurrentClocksEventReasons":
        record["nvmlDeviceGetCurrentClocksThrottleReasons"] = reasons  # deprecated alias
    record.update(nvlinks(ports, max_links=18))
    return record


def node(
    common: Dict[str, Any],
    per_gpu: Callable[[int], Dict[str, Any]],
    overrides: Dict[int, Dict[str, Any]],
) -> List[Dict[str, Any]]:
    """8 idle GPUs of one model (``common``), each with its own bus id, readings and links."""
    idle = {"used_mib": 0, "util": 0, "reasons": IDLE}
    return [device(**{**idle, **common, **per_gpu(i), **overrides.get(i, {})}) for i in range(8)]


# 8x H100 SXM5 80GB (HGX/DGX H100), idle, driver 550.54.15: NV18 through 4 NVSwitches.
H100 = dict(
    name="NVIDIA H100 80GB HBM3",
    memory_mib=81559,
    thresholds=(92, 89, 87),
    limit_w=700,
    clocks=(345, 2619),
    max_clocks=(1980, 2619),
    pcie=(5, 5, 16, 16),
    remapped_rows=[0, 0, 0, 0],
    retired=(NOT_SUPPORTED, NOT_SUPPORTED, NOT_SUPPORTED),  # Hopper remaps rows instead
)


def h100_gpu(i: int) -> Dict[str, Any]:
    return dict(
        bus_id=bus(H100_BUS[i]),
        temperature=[28, 31, 30, 29, 27, 32, 30, 29][i],
        power_w=[88.4, 83.1, 86.0, 84.7, 85.2, 87.9, 82.6, 86.3][i],
        ports=[(1, bus(sw), SWITCH) for sw, count in H100_SWITCH_LINKS for _ in range(count)],
        topology={j: NODE if (i < 4) == (j < 4) else SYSTEM for j in range(8) if j != i},
    )


# DGX A100 40GB, idle, driver 535.129.03: NV12, 2 links to each of 6 NVSwitches.
A100 = dict(
    name="NVIDIA A100-SXM4-40GB",
    memory_mib=40960,
    thresholds=(92, 89, 85),
    limit_w=400,
    clocks=(210, 1215),
    max_clocks=(1410, 1215),
    pcie=(4, 4, 16, 16),
    remapped_rows=[0, 0, 0, 0],
    retired=(NOT_SUPPORTED, NOT_SUPPORTED, NOT_SUPPORTED),  # Ampere remaps rows instead
)
A100_SWITCHES = [sw for sw in ("C4", "C5", "C6", "C7", "C8", "C9") for _ in "ab"]


def a100_gpu(i: int) -> Dict[str, Any]:
    return dict(
        bus_id=bus(A100_BUS[i]),
        temperature=[31, 30, 33, 32, 29, 31, 34, 30][i],
        power_w=[56.2, 54.9, 58.3, 55.0, 53.8, 57.1, 59.4, 55.6][i],
        ports=[(1, bus(sw), SWITCH) for sw in A100_SWITCHES],
        topology={j: MULTIPLE if i // 2 == j // 2 else SYSTEM for j in range(8) if j != i},
    )


# DGX-1V, 8x V100-SXM2-32GB, driver 470.182.03 (before the ClocksEvent names): cube-mesh.
V100 = dict(
    name="Tesla V100-SXM2-32GB",
    memory_mib=32510,
    thresholds=(90, 87, 83),
    limit_w=300,
    clocks=(1290, 877),
    max_clocks=(1530, 877),
    pcie=(3, 3, 16, 16),
    remapped_rows=NOT_SUPPORTED,  # Volta retires pages; row remapping came with Ampere
    retired=([], [], 0),
    reasons_function="nvmlDeviceGetCurrentClocksThrottleReasons",
    mig=NOT_SUPPORTED,  # MIG came with Ampere
)


def v100_gpu(i: int) -> Dict[str, Any]:
    ports = []
    for (a, b), count in V100_LINKS.items():
        if i in (a, b):
            ports += [(1, bus(V100_BUS[b if i == a else a]), GPU)] * count
    pcie_level = {j: SINGLE if i // 2 == j // 2 else HOSTBRIDGE for j in range(8)}
    return dict(
        bus_id=bus(V100_BUS[i]),
        temperature=[36, 36, 37, 35, 38, 36, 37, 39][i],
        power_w=[40.1, 40.6, 42.3, 40.0, 43.2, 41.5, 42.0, 44.1][i],
        ports=ports,
        topology={j: pcie_level[j] if (i < 4) == (j < 4) else SYSTEM for j in range(8) if j != i},
    )


FIXTURES: Dict[str, Dict[str, Any]] = {
    "h100_healthy": {
        "description": "HGX H100 8-GPU, healthy and idle: NV18 all-to-all.",
        "sources": H100_SOURCES,
        "system": {
            "nvmlSystemGetDriverVersion": "550.54.15",
            "nvmlSystemGetCudaDriverVersion": 12040,
        },
        "devices": node(H100, h100_gpu, {}),
    },
    "h100_thermal": {
        "description": "HGX H100 under training load; GPU 5 at 90 C in HW thermal slowdown.",
        "sources": H100_SOURCES,
        "system": {
            "nvmlSystemGetDriverVersion": "550.54.15",
            "nvmlSystemGetCudaDriverVersion": 12040,
        },
        "devices": node(
            H100,
            h100_gpu,
            {
                i: dict(
                    util=100,
                    used_mib=71234,
                    temperature=[61, 64, 63, 60, 62, 90, 65, 59][i],
                    power_w=[652.3, 661.8, 648.0, 655.4, 659.9, 431.7, 650.2, 646.6][i],
                    clocks=(1215, 2619) if i == 5 else (1980, 2619),
                    # HW slowdown (0x8) + SW thermal (0x20) + HW thermal (0x40) on GPU 5
                    reasons=0x68 if i == 5 else 0x0,
                )
                for i in range(8)
            },
        ),
    },
    "v100_ecc": {
        "description": "DGX-1V; GPU 2 has volatile uncorrectable ECC errors and a page "
        "retirement pending (double-bit error).",
        "sources": V100_SOURCES,
        "system": {
            "nvmlSystemGetDriverVersion": "470.182.03",
            "nvmlSystemGetCudaDriverVersion": 11040,
        },
        "devices": node(V100, v100_gpu, {2: dict(ecc_uncorrected=2, retired=([], [0x7E35C0], 1))}),
    },
    "a100_nvlink_down": {
        "description": "DGX A100 40GB; NVLink 7 of GPU 3 is down (11 of 12 links up).",
        "sources": A100_SOURCES,
        "system": {
            "nvmlSystemGetDriverVersion": "535.129.03",
            "nvmlSystemGetCudaDriverVersion": 12020,
        },
        "devices": node(
            A100,
            a100_gpu,
            {
                3: dict(
                    ports=[
                        (0 if n == 7 else 1, bus(sw), SWITCH) for n, sw in enumerate(A100_SWITCHES)
                    ]
                )
            },
        ),
    },
    "not_supported": {
        "description": "2 GPUs whose NVML answers NotSupported to every query (as some vGPU "
        "guests do): every GPU check must SKIP, none may crash.",
        "sources": ["NVML API: NVML_ERROR_NOT_SUPPORTED is a valid answer to every device query"],
        "system": {
            "nvmlSystemGetDriverVersion": NOT_SUPPORTED,
            "nvmlSystemGetCudaDriverVersion": NOT_SUPPORTED,
        },
        "devices": [{"*": NOT_SUPPORTED}, {"*": NOT_SUPPORTED}],
    },
}


def main() -> None:
    for name, fixture in FIXTURES.items():
        path = HERE / f"{name}.json"
        path.write_text(json.dumps({"init": None, **fixture}, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
