"""A level-2 probe or the level-3 load that cannot run (out of memory, a CUDA error) is a FAIL row
naming the probe, the devices and the reason, never a traceback: allocations made to fail here
(torch's own allocators patched to raise as they do on a full GPU), and the GPU path run on this
machine, whose torch sees no GPU, so that every CUDA call raises torch's real error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import pytest
import torch
from typer.testing import CliRunner

from torchscale.cli.app import app
from torchscale.config.validate_section import ValidateSection
from torchscale.validate.device_probes import measure_devices
from torchscale.validate.judging import DEVICE_FIX, MEMORY_FIX, error_checks
from torchscale.validate.probe_timing import ProbeError
from torchscale.validate.result import Status

OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of "
    "which 1.06 GiB is free.\nOf the allocated memory 77.5 GiB is allocated by PyTorch"
)
FAST = ValidateSection(window_s=0.02, repeats=2, max_cpu_devices=1)


def out_of_memory(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise torch.OutOfMemoryError(OOM)


def test_error_checks_give_one_fail_row_per_probe_grouped_by_reason() -> None:
    assert error_checks([]) == []
    oom, illegal = torch.OutOfMemoryError(OOM), RuntimeError("CUDA error: an illegal memory access")
    errors = [ProbeError.of("gemm_bf16", f"GPU {i}", oom) for i in range(6)]
    errors += [ProbeError.of("gemm_bf16", "GPU 6", illegal)]
    errors += [ProbeError.of("memory_copy", "CPU 0", MemoryError())]
    errors += [ProbeError.of("p2p", "GPU 0->1", oom)]
    gemm, copy, p2p = error_checks(errors)
    assert [r.name for r in (gemm, copy, p2p)] == [
        "GEMM bf16 (could not run)",
        "Memory copy (could not run)",
        "P2P copy (could not run)",
    ]
    assert {r.status for r in (gemm, copy, p2p)} == {Status.FAIL}
    first_line = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has"
    assert gemm.value.startswith(
        f"could not run on GPU 0, GPU 1, GPU 2, GPU 3 and 2 more: {first_line}"
    )
    assert gemm.value.endswith("; GPU 6: RuntimeError: CUDA error: an illegal memory access")
    assert "Of the allocated memory" not in gemm.value  # the reason is the first line only
    assert gemm.fix == DEVICE_FIX  # one of its reasons is not a lack of memory: a device fault
    assert copy.value == "could not run on CPU 0: MemoryError" and copy.fix == MEMORY_FIX
    assert p2p.value.startswith("could not run on GPU 0->1: OutOfMemoryError") and p2p.fix == (
        MEMORY_FIX
    )
    assert isinstance(gemm.details["errors"], list)
    assert gemm.details["errors"][6] == {
        "probe": "gemm_bf16",
        "device": "GPU 6",
        "reason": "RuntimeError: CUDA error: an illegal memory access",
    }
    many = [
        ProbeError("p2p", f"GPU 0->{i}", f"RuntimeError: reason {i}", False)
        for i in (1, 2, 3, 4, 5)
    ]
    [row] = error_checks(many)
    assert row.value.endswith("GPU 0->3: RuntimeError: reason 3; and 2 more reasons")


def test_cpu_allocations_that_fail_are_rows_and_the_other_probes_still_run(monkeypatch) -> None:
    monkeypatch.setattr(torch, "empty_like", lambda *_a, **_k: (_ for _ in ()).throw(MemoryError()))
    run = measure_devices(FAST)
    assert [(e.probe, e.device, e.reason, e.memory) for e in run.errors] == [
        ("memory_copy", "CPU 0", "MemoryError", True)
    ]
    assert {f.probe for f in run.figures} == {"gemm_fp32", "launch_latency"}


def test_the_gpu_path_turns_every_cuda_failure_into_rows(monkeypatch) -> None:
    """Two GPUs as CUDA would announce them, on a torch that cannot reach any: the GEMMs' inputs
    run out of memory, every other allocation meets torch's real CUDA error. Nothing raises."""
    name = "NVIDIA H100 80GB HBM3"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _index=None: name)
    monkeypatch.setattr(torch.cuda, "set_device", lambda _device: None)
    monkeypatch.setattr(torch, "randn", out_of_memory)
    run = measure_devices(FAST)
    assert run.figures == [] and not run.cpu
    rows = {row.name: row for row in error_checks(run.errors)}
    for label in ("GEMM bf16", "GEMM fp16", "GEMM tf32"):
        row = rows.pop(f"{label} (could not run)")
        assert row.value.startswith("could not run on GPU 0, GPU 1: OutOfMemoryError: CUDA out")
        assert row.fix == MEMORY_FIX
    p2p = rows.pop("P2P copy (could not run)")
    assert p2p.value.startswith("could not run on GPU 0->1, GPU 1->0: RuntimeError: ")
    assert set(rows) == {
        "Memory copy (could not run)",
        "Host to device (pinned) (could not run)",
        "Device to host (pinned) (could not run)",
        "Kernel launch (could not run)",
    }
    for row in [p2p, *rows.values()]:
        assert row.status is Status.FAIL and row.fix == DEVICE_FIX  # not a lack of memory


def test_a_gpu_that_refuses_to_be_made_current_fails_each_of_its_probes(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # set_device: torch's real error
    run = measure_devices(FAST)
    assert run.figures == []
    assert [e.probe for e in run.errors] == [
        "gemm_bf16", "gemm_fp16", "gemm_tf32", "memory_copy", "host_to_device",
        "device_to_host", "launch_latency",
    ]  # fmt: skip
    assert {e.device for e in run.errors} == {"GPU 0"}
    assert all(e.reason.startswith("RuntimeError: ") and not e.memory for e in run.errors)


@pytest.mark.cpu_only_node
def test_validate_level_3_out_of_memory_is_fail_rows_exit_1_and_no_traceback(
    monkeypatch, tmp_path: Path
) -> None:
    """The GEMM's and the sustained load's inputs cannot be allocated: each is one FAIL row with
    the allocator's first line, the memory copy is still measured, the record is still kept."""
    monkeypatch.setattr(torch, "randn", out_of_memory)
    out = tmp_path / "results"
    sets = ["window_s=0.05", "repeats=2", "max_cpu_devices=1", "sustained_s=0.3"]
    args = ["validate", "--level", "3", "--json", "--skip-smoke", "-o", str(out)]
    args += [word for s in sets for word in ("--set", f"validation.{s}")]
    result = CliRunner().invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.exit_code == 1  # a FAIL row; 2 is kept for bad usage
    assert "Traceback" not in result.output and "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    reason = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    gemm = checks["GEMM fp32 (could not run)"]
    assert gemm["status"] == "FAIL" and gemm["value"].startswith(
        f"could not run on CPU 0: {reason}"
    )
    assert gemm["fix"] == MEMORY_FIX
    sustained = checks["Sustained load"]
    assert sustained["status"] == "FAIL" and sustained["fix"] == MEMORY_FIX
    assert sustained["value"].startswith(f"could not run on CPU: {reason}")
    assert report["sustained"]["error"]["device"] == "CPU"
    # measured although the GEMM could not be (its verdict is the host's: a loaded one may fail it)
    copy = checks["Memory copy"]
    assert copy["status"] in ("PASS", "WARN", "FAIL") and "could not run" not in copy["value"]
    assert "Memory copy (could not run)" not in checks
    assert {p["probe"] for p in report["probes"]} == {"memory_copy", "launch_latency"}
    assert not report["summary"]["ok"] and report["summary"]["fail"] >= 2
    # the table on stderr: each failure a row with the start of its one-line reason (the cell
    # wraps further on), and the memory fix once, as a note both rows point to
    table = " ".join(result.stderr.split())
    start = "OutOfMemoryError: CUDA out of memory."
    assert table.count(f"GEMM fp32 (could not run) FAIL could not run on CPU 0: {start}") == 1
    assert table.count(f"Sustained load FAIL could not run on CPU: {start}") == 1
    assert table.count("see note 2") == 2 and " ".join(MEMORY_FIX.split()) in table
    assert "Of the allocated memory" not in table
    fails = report["summary"]["fail"]  # the two above, and any probe a loaded host failed
    assert f"{fails} FAIL" in table and "not ready: fix the FAIL rows first" in table
    assert json.loads((out / "validate" / f"host-{report['host']}.json").read_text()) == report


def test_a_gpu_load_failure_is_named_and_a_bug_stays_a_bug(monkeypatch) -> None:
    """Level 3's load threads: the device's own failure (out of memory, a CUDA error) comes back
    as LoadFailed naming the GPU, for a FAIL row; anything else is raised as it is, never taken
    for a GPU fault."""
    from torchscale.config.validate_section import ValidateSection
    from torchscale.validate import sustained_load

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    settings = ValidateSection()

    def device_oom(device, _settings, _seconds):
        out_of_memory()

    monkeypatch.setattr(sustained_load, "_device_loop", device_oom)
    with pytest.raises(sustained_load.LoadFailed) as failed:
        sustained_load.torch_load(settings, 0.1)
    assert failed.value.device in ("GPU 0", "GPU 1")
    assert isinstance(failed.value.cause, torch.cuda.OutOfMemoryError)

    def device_bug(device, _settings, _seconds):
        raise TypeError("a bug in the load loop")

    monkeypatch.setattr(sustained_load, "_device_loop", device_bug)
    with pytest.raises(TypeError, match="a bug in the load loop"):
        sustained_load.torch_load(settings, 0.1)
