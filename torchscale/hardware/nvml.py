"""The one thin, safe wrapper over NVML (``import pynvml``, from the ``nvidia-ml-py`` package).

Every NVML query goes through :meth:`Nvml.call`, which never raises: a GPU or driver that does not
support a query (``NVMLError_NotSupported``), a driver too old to have the function
(``NVMLError_FunctionNotFound``), a pynvml too old to know it, or any other NVML error becomes an
:class:`Unsupported` marker. ``validate`` turns a marker into SKIP for that check; the benchmark
worker's telemetry sampler (:func:`read_telemetry`) turns it into ``None`` for that field.

Handles and constants come from whatever module ``sys.modules["pynvml"]`` is at :func:`open_nvml`
time, which is how tests substitute recorded answers of real GPUs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, TypeVar, Union

if TYPE_CHECKING:
    from typing_extensions import TypeIs

T = TypeVar("T")

# NVML's clocks-event (formerly "throttle") reason bits: part of the NVML ABI, identical under both
# the new nvmlClocksEventReason* and old nvmlClocksThrottleReason* names.
CLOCKS_EVENT_REASONS: Dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    # Only under the old "throttle" names in nvidia-ml-py 13 (nvmlClocksThrottleReasonBoardLimit,
    # ...Reliability), absent from its nvmlClocksEventReasonAll, yet drivers report them.
    0x200: "board_limit",
    0x400: "reliability",
}
# Bits newer than these are never dropped: they decode as ``reason_bit_0x800``, so a reader sees
# that the driver said something.
UNNAMED_REASON = "reason_bit_"
NO_PERMISSION = "NVMLError_NoPermission"  # e.g. another job's GPU under a Slurm cgroup
GPU_IS_LOST = "NVMLError_GpuIsLost"


@dataclass(frozen=True)
class Unsupported:
    """What a query answered instead of a value, and why (e.g. ``"Not Supported"``)."""

    reason: str
    error: Optional[str] = None  # the pynvml exception class name, e.g. "NVMLError_GpuIsLost"

    def __str__(self) -> str:
        return self.reason


def supported(value: Union[T, Unsupported]) -> TypeIs[T]:
    """True when ``value`` is a real answer, not an :class:`Unsupported` marker."""
    return not isinstance(value, Unsupported)


def text(value: Any) -> str:
    """NVML strings: bytes in old pynvml releases, str in new ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


class Nvml:
    """An initialised NVML library. Obtain one with :func:`open_nvml`."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib

    def const(self, name: str, default: int) -> int:
        """An NVML constant (``NVML_TEMPERATURE_GPU``...), with its ABI value if pynvml lacks it."""
        return int(getattr(self.lib, name, default))

    def call(self, function: str, *args: Any) -> Any:
        """``pynvml.<function>(*args)``, or :class:`Unsupported` instead of any NVML error.

        A GPU whose handle NVML refused (an :class:`Unsupported` in place of the handle) answers
        every query with that refusal, so each check sees it as not reported, on that GPU only.
        """
        refused = next((a for a in args if isinstance(a, Unsupported)), None)
        if refused is not None:
            return refused
        fn = getattr(self.lib, function, None)
        if fn is None:
            return Unsupported(f"{function} is not in this nvidia-ml-py", "AttributeError")
        try:
            return fn(*args)
        except self.lib.NVMLError as exc:
            return Unsupported(_describe(exc), type(exc).__name__)

    def driver_version(self) -> Union[str, Unsupported]:
        version = self.call("nvmlSystemGetDriverVersion")
        return text(version) if supported(version) else version

    def cuda_driver_version(self) -> Union[int, Unsupported]:
        """The newest CUDA version the driver supports, as NVML encodes it (12040 = 12.4)."""
        version: Union[int, Unsupported] = self.call("nvmlSystemGetCudaDriverVersion")
        return version

    def handles(self) -> Union[List[Any], Unsupported]:
        """A handle per GPU NVML sees, in NVML index order.

        Each GPU on its own: one that NVML refuses (``NO_PERMISSION`` for another job's GPU in a
        Slurm cgroup, ``GPU_IS_LOST`` for one off the bus) is an :class:`Unsupported` at its
        index, and the others are still checked.
        """
        count: Union[int, Unsupported] = self.call("nvmlDeviceGetCount")
        if not supported(count):
            return count
        return [self.call("nvmlDeviceGetHandleByIndex", index) for index in range(int(count))]

    def mig_devices(self, handle: Any) -> Union[List[str], Unsupported, None]:
        """Names of the MIG devices of a GPU in MIG mode; None when MIG is off."""
        mode: Union[Sequence[int], Unsupported] = self.call("nvmlDeviceGetMigMode", handle)
        if not supported(mode):
            return mode
        if int(mode[0]) != self.const("NVML_DEVICE_MIG_ENABLE", 1):
            return None
        slots = self.call("nvmlDeviceGetMaxMigDeviceCount", handle)
        names = []
        for index in range(int(slots) if supported(slots) else 0):
            mig = self.call("nvmlDeviceGetMigDeviceHandleByIndex", handle, index)
            if supported(mig):  # empty slots answer NotFound
                name = self.call("nvmlDeviceGetName", mig)
                names.append(text(name) if supported(name) else "MIG device")
        return names

    def clocks_event_reasons(self, handle: Any) -> Union[int, Unsupported]:
        """Current clocks-event reason bits; falls back to the pre-535 "throttle" name."""
        reasons: Union[int, Unsupported] = self.call(
            "nvmlDeviceGetCurrentClocksEventReasons", handle
        )
        if not supported(reasons) and reasons.error in (
            "AttributeError",
            "NVMLError_FunctionNotFound",
        ):
            reasons = self.call("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return reasons


def _describe(exc: Exception) -> str:
    try:
        return str(exc)
    except Exception:  # str() may call back into a half-loaded library
        return type(exc).__name__


def decode_clocks_event_reasons(mask: int) -> List[str]:
    """Names of the reason bits set in ``mask``, in bit order; bits nvidia-ml-py does not name
    come out as ``reason_bit_0x200``."""
    names = []
    for position in range(max(int(mask), 0).bit_length()):
        bit = 1 << position
        if mask & bit:
            names.append(CLOCKS_EVENT_REASONS.get(bit, f"{UNNAMED_REASON}{bit:#x}"))
    return names


def reason_label(name: str) -> str:
    """``hw_thermal_slowdown`` -> ``HW thermal slowdown``, as ``nvidia-smi -q`` words it."""
    if name.startswith(UNNAMED_REASON):
        return f"reason bit {name[len(UNNAMED_REASON) :]} (not named by this nvidia-ml-py)"
    words = [w.upper() if w in ("hw", "sw", "gpu") else w for w in name.split("_")]
    text_ = " ".join(words)
    return text_[0].upper() + text_[1:]


@contextlib.contextmanager
def open_nvml() -> Iterator[Union[Nvml, Unsupported]]:
    """Initialise NVML for the ``with`` block and shut it down after.

    Yields :class:`Unsupported` (never raises) when pynvml is missing or NVML cannot start: no
    driver, no library, a container without the NVIDIA runtime.
    """
    try:
        import pynvml
    except ImportError:
        yield Unsupported("nvidia-ml-py is not installed", "ImportError")
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        yield Unsupported(_describe(exc), type(exc).__name__)
        return
    except OSError as exc:  # a broken libnvidia-ml.so that ctypes cannot load
        yield Unsupported(str(exc), "OSError")
        return
    try:
        yield Nvml(pynvml)
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def read_telemetry(nvml: Nvml, handle: Any) -> Dict[str, Optional[float]]:
    """One sample of a GPU's utilisation, power, memory, clocks and temperature.

    Cheap enough to call every few hundred milliseconds from a sampler thread. A field the GPU does
    not report is ``None``. Units: percent, watts, bytes, MHz, degrees Celsius.
    """
    util = nvml.call("nvmlDeviceGetUtilizationRates", handle)
    memory = nvml.call("nvmlDeviceGetMemoryInfo", handle)
    power_mw = nvml.call("nvmlDeviceGetPowerUsage", handle)
    limit_mw = nvml.call("nvmlDeviceGetEnforcedPowerLimit", handle)
    sm_clock = nvml.call("nvmlDeviceGetClockInfo", handle, nvml.const("NVML_CLOCK_SM", 1))
    mem_clock = nvml.call("nvmlDeviceGetClockInfo", handle, nvml.const("NVML_CLOCK_MEM", 2))
    temperature = nvml.call(
        "nvmlDeviceGetTemperature", handle, nvml.const("NVML_TEMPERATURE_GPU", 0)
    )
    reasons = nvml.clocks_event_reasons(handle)

    def value(answer: Any, scale: float = 1.0) -> Optional[float]:
        return float(answer) * scale if supported(answer) else None

    return {
        "gpu_util_pct": value(util.gpu) if supported(util) else None,
        "mem_util_pct": value(util.memory) if supported(util) else None,
        "power_w": value(power_mw, 1e-3),
        "power_limit_w": value(limit_mw, 1e-3),
        "mem_used_bytes": value(memory.used) if supported(memory) else None,
        "mem_total_bytes": value(memory.total) if supported(memory) else None,
        "sm_clock_mhz": value(sm_clock),
        "mem_clock_mhz": value(mem_clock),
        "temperature_c": value(temperature),
        "clocks_event_reasons": value(reasons),
    }
