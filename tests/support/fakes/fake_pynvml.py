"""A stand-in for ``pynvml`` that replays recorded NVML answers from a JSON fixture.

NVML answers of a GPU cannot exist on a machine without one, so tests put this module in
``sys.modules["pynvml"]``. Its constants and exception classes ARE the real pynvml's: a recorded
error is raised as ``pynvml.NVMLError(<code>)``, which pynvml itself maps to the subclass real NVML
raises (``NVMLError_NotSupported``, ``NVMLError_FunctionNotFound``...), so the code under test takes
the same path it takes on a GPU node.

Fixture format (``tests/data/nvml/*.json``)::

    {"init": null | {"error": "NVML_ERROR_DRIVER_NOT_LOADED"},
     "system": {"nvmlSystemGetDriverVersion": "550.54.15", ...},
     "devices": [{"nvmlDeviceGetName": "NVIDIA H100 80GB HBM3",
                  "nvmlDeviceGetMemoryInfo": {"total": ..., "free": ..., "used": ...},
                  "nvmlDeviceGetTemperatureThreshold": {"1": 89, "3": 87},
                  "nvmlDeviceGetTopologyCommonAncestor": {"1": 40, ...},
                  "*": {"error": "NVML_ERROR_NOT_SUPPORTED"}}, ...]}

``nvmlDeviceGetHandleByIndex`` may be recorded on a device too: ``{"error": ...}`` there makes that
one GPU's handle fail (NO_PERMISSION under a Slurm cgroup, GPU_IS_LOST), as NVML does per index.
A GPU in MIG mode records ``nvmlDeviceGetMigDeviceHandleByIndex`` as a map from slot to
``{"mig": {...}}``, the MIG device's own answers (its ``nvmlDeviceGetName``...).
A time series (what a sampler sees over a window) is ``{"series": [answer, answer, ...]}`` in
place of an answer: successive calls get successive answers, the last one repeating.

A device function's answer is stored under its name; when it takes arguments after the handle, the
answer is a map from the arguments (comma-joined; another GPU's handle as its index; ``*`` for any
other) to the answer. ``{"error": NAME}`` raises that NVML error; other maps become structs
(attribute access, as pynvml's ctypes structures). A call the fixture does not record fails the
test: fixtures must answer every query torchscale makes (``*`` on a device answers the rest).

On a GPU node, ``python tests/support/fakes/fake_pynvml.py record OUT.json`` runs torchscale's NVML queries
(validate's checks and the telemetry sampler) against the real library and writes every answer in
this format, ready to become a fixture.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pynvml as real

SHARED_PREFIXES = ("NVML_", "NVMLError", "nvmlClocks")


class FakeHandle:
    """What nvmlDeviceGetHandleByIndex returns: only its index matters to the replay."""

    def __init__(self, index: int, record: Optional[Dict[str, Any]] = None) -> None:
        self.index = index
        self.record = record  # a MIG device's own answers; None for a whole GPU

    def __repr__(self) -> str:
        return f"FakeHandle({self.index})"


def _raise(answer: Dict[str, str]) -> None:
    raise real.NVMLError(getattr(real, answer["error"]))


def _decode(answer: Any) -> Any:
    if isinstance(answer, dict) and "error" in answer:
        _raise(answer)
    if isinstance(answer, dict):
        return types.SimpleNamespace(**answer)
    return answer


def _key(args: tuple) -> str:
    return ",".join(str(a.index if isinstance(a, FakeHandle) else a) for a in args)


class Replay:
    """The fake library's state: the fixture, and whether NVML is initialised."""

    def __init__(self, fixture: Dict[str, Any]) -> None:
        self.fixture = fixture
        self.devices: List[Dict[str, Any]] = fixture.get("devices", [])
        self.initialized = 0
        self.calls: List[str] = []
        self.positions: Dict[str, int] = {}

    def init(self) -> None:
        if self.fixture.get("init"):
            _raise(self.fixture["init"])
        self.initialized += 1

    def shutdown(self) -> None:
        if not self.initialized:
            raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)
        self.initialized -= 1

    def _require_init(self) -> None:
        if not self.initialized:
            raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)

    def system(self, name: str) -> Any:
        self._require_init()
        self.calls.append(name)
        system = self.fixture.get("system", {})
        if name not in system:
            raise AssertionError(f"fixture records no answer for {name}()")
        return _decode(system[name])

    def count(self) -> int:
        self._require_init()
        return len(self.devices)

    def handle(self, index: int) -> FakeHandle:
        self._require_init()
        if not 0 <= index < len(self.devices):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        answer = self.devices[index].get("nvmlDeviceGetHandleByIndex")
        if isinstance(answer, dict) and "error" in answer:
            _raise(answer)
        return FakeHandle(index)

    def device(self, name: str, handle: FakeHandle, *args: Any) -> Any:
        self._require_init()
        self.calls.append(name)
        record = handle.record if handle.record is not None else self.devices[handle.index]
        if name not in record:
            if "*" not in record:
                raise AssertionError(f"fixture records no answer for {name} on GPU {handle.index}")
            return _decode(record["*"])
        answer = record[name]
        if args and not (isinstance(answer, dict) and "error" in answer):
            key = _key(args)
            if key not in answer and "*" not in answer:
                raise AssertionError(f"fixture records no answer for {name}{(handle.index, *args)}")
            answer = answer.get(key, answer.get("*"))
        if isinstance(answer, dict) and "series" in answer:
            where = f"{handle.index}/{name}/{_key(args)}"
            position = self.positions.get(where, 0)
            self.positions[where] = position + 1
            answer = answer["series"][min(position, len(answer["series"]) - 1)]
        if isinstance(answer, dict) and "mig" in answer:
            return FakeHandle(handle.index, answer["mig"])
        return _decode(answer)


def load(fixture: Dict[str, Any]) -> types.ModuleType:
    """A module that answers like pynvml from ``fixture``; its ``replay`` attribute is the state."""
    replay = Replay(fixture)
    module: Any = types.ModuleType("pynvml")  # attributes set below, as pynvml has them
    for name in dir(real):
        if name.startswith(SHARED_PREFIXES):
            setattr(module, name, getattr(real, name))
    module.replay = replay
    module.nvmlInit = replay.init
    module.nvmlShutdown = replay.shutdown
    module.nvmlDeviceGetCount = replay.count
    module.nvmlDeviceGetHandleByIndex = replay.handle

    def lookup(name: str) -> Callable[..., Any]:
        if name.startswith("nvmlSystem"):
            return lambda: replay.system(name)
        if name.startswith("nvmlDevice"):
            return lambda handle, *args: replay.device(name, handle, *args)
        raise AttributeError(name)

    module.__getattr__ = lookup
    return module


def load_file(path: Path) -> types.ModuleType:
    return load(json.loads(Path(path).read_text()))


# --- recording real answers on a GPU node ------------------------------------------------------


def _encode(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if hasattr(value, "_fields_"):  # a ctypes structure: its plain fields
        fields = {}
        for field in value._fields_:
            item = getattr(value, field[0])
            if isinstance(item, (int, float, str, bytes)):
                fields[field[0]] = _encode(item)
        return fields
    if isinstance(value, tuple):
        return list(value)
    return value


def _error_name(exc: Any) -> str:
    codes = {v: k for k, v in vars(real).items() if k.startswith("NVML_ERROR_")}
    return codes.get(exc.value, "NVML_ERROR_UNKNOWN")


def recorder() -> types.ModuleType:
    """A pynvml proxy that calls the real library and records every answer in fixture format."""
    fixture: Dict[str, Any] = {"init": None, "system": {}, "devices": []}
    index_of: Dict[int, int] = {}
    module: Any = types.ModuleType("pynvml")  # attributes set below, as pynvml has them
    for name in dir(real):
        if name.startswith(SHARED_PREFIXES):
            setattr(module, name, getattr(real, name))
    module.fixture = fixture

    mig_records: Dict[int, Dict[str, Any]] = {}  # MIG device handle -> its own answers

    def pointer(handle: Any) -> int:
        import ctypes

        return ctypes.cast(handle, ctypes.c_void_p).value or 0

    def handle_index(handle: Any) -> int:
        return index_of[pointer(handle)]

    def by_index(index: int) -> Any:
        while len(fixture["devices"]) <= index:
            fixture["devices"].append({})
        try:
            handle = real.nvmlDeviceGetHandleByIndex(index)
        except real.NVMLError as exc:  # this GPU only: NO_PERMISSION, GPU_IS_LOST
            fixture["devices"][index]["nvmlDeviceGetHandleByIndex"] = {"error": _error_name(exc)}
            raise
        index_of[pointer(handle)] = index
        return handle

    def call(name: str, store: Callable[[Any], None], *args: Any) -> Any:
        try:
            result = getattr(real, name)(*args)
        except real.NVMLError as exc:
            store({"error": _error_name(exc)})
            raise
        store(_encode(result))
        return result

    def lookup(name: str) -> Callable[..., Any]:
        if name.startswith("nvmlSystem"):
            return lambda: call(name, lambda a: fixture["system"].__setitem__(name, a))
        if not name.startswith("nvmlDevice"):
            raise AttributeError(name)

        def device_call(handle: Any, *args: Any) -> Any:
            mig = mig_records.get(pointer(handle))
            record = mig if mig is not None else fixture["devices"][handle_index(handle)]
            if name == "nvmlDeviceGetMigDeviceHandleByIndex":
                answer: Dict[str, Any] = {}
                try:
                    child = real.nvmlDeviceGetMigDeviceHandleByIndex(handle, *args)
                except real.NVMLError as exc:
                    record.setdefault(name, {})[str(args[0])] = {"error": _error_name(exc)}
                    raise
                record.setdefault(name, {})[str(args[0])] = {"mig": answer}
                mig_records[pointer(child)] = answer
                return child
            key = ",".join(
                str(handle_index(a)) if type(a) is type(handle) else str(a) for a in args
            )

            def store(answer: Any) -> None:
                if args:
                    record.setdefault(name, {})[key] = answer
                else:
                    record[name] = answer

            return call(name, store, handle, *args)

        return device_call

    def init() -> None:
        try:
            real.nvmlInit()
        except real.NVMLError as exc:
            fixture["init"] = {"error": _error_name(exc)}
            raise

    module.nvmlInit = init
    module.nvmlShutdown = real.nvmlShutdown
    module.nvmlDeviceGetCount = real.nvmlDeviceGetCount
    module.nvmlDeviceGetHandleByIndex = by_index
    module.__getattr__ = lookup
    return module


def record(out: Path) -> None:
    """Run torchscale's NVML queries on this node and write what NVML answered."""
    proxy = recorder()
    sys.modules["pynvml"] = proxy
    from torchscale.hardware.nvml import open_nvml, read_telemetry, supported
    from torchscale.validate.runner import gpu_health

    gpu_health(torch_count=0)
    with open_nvml() as nvml:
        if supported(nvml):
            nvml.driver_version()
            nvml.cuda_driver_version()
            handles = nvml.handles()
            for handle in handles if supported(handles) else []:
                read_telemetry(nvml, handle)
    Path(out).write_text(json.dumps(proxy.fixture, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "record":
        sys.exit("usage: python tests/support/fakes/fake_pynvml.py record OUT.json")
    record(Path(sys.argv[2]))
