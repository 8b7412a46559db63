"""Software and node checks as functions of what they read (no launch), the smoke test's judge,
and the bus-bandwidth factors."""

from __future__ import annotations

import os
import shutil
import socket
import stat
from concurrent.futures import Future
from pathlib import Path

import psutil
import pytest

from torchscale.comm.busbw import algbw_gbps, busbw_factor, busbw_gbps
from torchscale.validate import software, system
from torchscale.validate.result import CheckResult, Status, summarize
from torchscale.validate.runner import smoke_check
from torchscale.validate.smoke import evaluate
from torchscale.validate.smoke_worker import PATTERN_PERIOD, expected_sum

FACTS = software.TorchFacts("2.14.1+cu130", "13.0", False, 0, "2.30.7")


def test_a_check_that_is_not_pass_must_carry_a_fix():
    with pytest.raises(ValueError, match="without a fix"):
        CheckResult("x", Status.WARN, "value")
    assert (
        summarize([CheckResult("a", Status.PASS, "v"), CheckResult("b", Status.FAIL, "v", "f")])[
            "ok"
        ]
        is False
    )


def test_python_and_torch_minimum_versions():
    assert software.check_python((3, 8, 10)).status is Status.FAIL
    assert software.check_python((3, 9, 0)).status is Status.PASS
    old = software.check_torch(software.TorchFacts("1.13.1", "11.7", True, 8, "2.14.3"))
    assert old.fix is not None
    assert old.status is Status.FAIL and 'pip install -U "torch>=2.0"' in old.fix
    assert software.check_torch(FACTS).value == "2.14.1+cu130 (CUDA 13.0 build)"
    broken = software.TorchFacts(None, None, False, 0, None, "ImportError: libcudart.so.13")
    assert "libcudart" in software.check_torch(broken).value


def test_cuda_row_on_gpu_nodes_where_torch_cannot_use_them():
    cpu_build = software.TorchFacts("2.5.1+cpu", None, False, 0, None)
    check = software.check_cuda(cpu_build, nvml_gpus=8)
    assert check.status is Status.FAIL and "CPU-only build" in check.value
    assert check.fix is not None
    assert "--index-url https://download.pytorch.org/whl/cu" in check.fix
    hidden = software.check_cuda(FACTS, nvml_gpus=8)
    assert hidden.fix is not None
    assert hidden.status is Status.FAIL and "CUDA_VISIBLE_DEVICES" in hidden.fix
    assert software.check_nccl(cpu_build, gpus=8).status is Status.FAIL


def test_nsys_is_optional(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    missing = software.check_nsys()
    assert missing.fix is not None
    assert missing.status is Status.WARN and "Nsight Systems" in missing.fix
    nsys = tmp_path / "nsys"
    nsys.write_text("#!/bin/sh\n")
    nsys.chmod(nsys.stat().st_mode | stat.S_IEXEC)
    assert software.check_nsys().value == str(nsys)


def test_shm_of_this_machine_and_a_docker_default(monkeypatch):
    st = os.statvfs("/dev/shm")
    here = system.check_shm()
    assert here.details["total_bytes"] == st.f_blocks * st.f_frsize
    assert system.check_shm("/no/such/shm").status is Status.FAIL
    docker = os.statvfs_result((4096, 4096, 16384, 16384, 16384, 0, 0, 0, 0, 255))
    monkeypatch.setattr("torchscale.validate.system.os.statvfs", lambda _path: docker)
    small = system.check_shm()
    assert (small.status, small.value) == (Status.WARN, "64 MiB (64 MiB free)")
    assert small.fix is not None
    assert "--shm-size=16g" in small.fix and "--ipc=host" in small.fix


def test_open_files_limit():
    low = system.check_open_files((1024, 1048576))
    assert low.status is Status.WARN and low.fix == "Raise it in the job script: `ulimit -n 65536`."
    capped = system.check_open_files((1024, 1024))
    assert capped.fix is not None
    assert "/etc/security/limits.conf" in capped.fix
    assert system.check_open_files((65536, 65536)).status is Status.PASS


def test_hostname_that_does_not_resolve(monkeypatch):
    monkeypatch.setattr(
        "torchscale.validate.system.socket.gethostname", lambda: "no-such-host.invalid"
    )
    check = system.check_hostname()
    assert check.fix is not None
    assert check.status is Status.FAIL and "/etc/hosts" in check.fix


def test_master_addr_and_port():
    assert system.check_master_env({}).status is Status.PASS
    bad_port = system.check_master_env({"MASTER_ADDR": "localhost", "MASTER_PORT": "http"})
    assert bad_port.fix is not None
    assert bad_port.status is Status.FAIL and "1-65535" in bad_port.fix
    unresolvable = system.check_master_env({"MASTER_ADDR": "no-such-host.invalid"})
    assert unresolvable.status is Status.FAIL
    half = system.check_master_env({"MASTER_PORT": "29500"})
    assert half.fix is not None
    assert half.status is Status.WARN and "both" in half.fix
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        taken = system.check_master_env({"MASTER_ADDR": "localhost", "MASTER_PORT": port})
    assert taken.status is Status.WARN and "already in use" in taken.value


def test_nccl_environment_worth_knowing_about():
    clean = system.check_nccl_env({"NCCL_DEBUG": "INFO"}, interfaces=["lo", "eth0"])
    assert (clean.status, clean.value) == (Status.PASS, "NCCL_DEBUG=INFO")
    env = {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_DEBUG": "INFO"}
    slow = system.check_nccl_env(env, interfaces=["lo", "eth0"])
    assert slow.status is Status.WARN
    assert "NCCL_P2P_DISABLE=1 (no NVLink/PCIe peer-to-peer" in slow.value
    assert slow.fix is not None
    assert "Unset NCCL_P2P_DISABLE" in slow.fix and "Unset NCCL_IB_DISABLE" in slow.fix
    interfaces = list(psutil.net_if_addrs())
    wrong = system.check_nccl_env({"NCCL_SOCKET_IFNAME": "ib9"}, interfaces=interfaces)
    assert wrong.fix is not None
    assert wrong.status is Status.FAIL and "`ip -br addr`" in wrong.fix
    prefix = interfaces[0][:2]
    assert system.check_nccl_env({"NCCL_SOCKET_IFNAME": prefix}).status is Status.PASS
    assert system.check_nccl_env({"GLOO_SOCKET_IFNAME": "^docker"}).status is Status.PASS


def test_disk_space_of_a_directory_still_to_be_created(tmp_path):
    check = system.check_disk(tmp_path / "results" / "run1")
    usage = shutil.disk_usage(tmp_path)
    assert check.value.endswith(f"at {tmp_path}")
    assert isinstance(check.details["free_bytes"], int)
    assert abs(check.details["free_bytes"] - usage.free) < 64 << 20


def test_disk_space_thresholds(monkeypatch, tmp_path):
    usage = type(shutil.disk_usage(tmp_path))
    monkeypatch.setattr(
        "torchscale.validate.system.shutil.disk_usage",
        lambda _p: usage(100 << 30, 98 << 30, 2 << 30),
    )
    low = system.check_disk(tmp_path)
    assert (low.status, low.value) == (Status.WARN, f"2.0 GiB free of 100.0 GiB at {tmp_path}")
    monkeypatch.setattr(
        "torchscale.validate.system.shutil.disk_usage", lambda _p: usage(100 << 30, 100 << 30, 0)
    )
    assert system.check_disk(tmp_path).status is Status.FAIL


# --- the smoke test's judge and the bandwidth factors -------------------------------------------


def test_expected_sum_is_what_the_ranks_add_up_to():
    for world in (1, 2, 8):
        numel = 600
        contributions = [[i % PATTERN_PERIOD + r for i in range(numel)] for r in range(world)]
        assert expected_sum(numel, world) == [float(sum(col)) for col in zip(*contributions)]


def smoke_result(**over):
    result = {
        "backend": "gloo",
        "world_size": 2,
        "size_bytes": 4 << 20,
        "elements": 1 << 20,
        "iterations": 20,
        "wrong_elements": 0,
        "sample": expected_sum(8, 2),
        "time_us": 5000.0,
        "algbw_gbps": algbw_gbps(4 << 20, 5e-3),
        "busbw_gbps": busbw_gbps("all_reduce", 4 << 20, 5e-3, 2),
        "device": "cpu",
    }
    return {**result, **over}


def test_smoke_verdicts():
    ok = evaluate(smoke_result())
    assert ok.status is Status.PASS
    assert ok.value == (
        "2 gloo ranks, sum correct over 1,048,576 elements; 5.00 ms per 4 MiB all-reduce, "
        "algbw 0.84 GB/s, busbw 0.84 GB/s"
    )
    counted = evaluate(smoke_result(wrong_elements=17))
    assert counted.status is Status.FAIL and "17 of 1,048,576 elements wrong" in counted.value
    assert counted.fix is not None
    assert "NCCL_P2P_DISABLE=1" in counted.fix
    sample = evaluate(smoke_result(sample=[1.0] * 8), Path("/tmp/x.log"))
    assert sample.fix is not None
    assert sample.status is Status.FAIL and sample.fix.endswith("Log: /tmp/x.log")


def test_busbw_factors_are_nccl_tests_definitions():
    assert busbw_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert busbw_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert busbw_factor("broadcast", 8) == 1.0
    assert busbw_gbps("all_reduce", 10**9, 1.0, 2) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        busbw_factor("all_reduce", 0)


def test_a_smoke_test_that_cannot_launch_is_a_fail_row_not_a_traceback():
    future: Future = Future()
    future.set_exception(OSError(28, "No space left on device"))
    check = smoke_check(future)
    assert check.status is Status.FAIL
    assert check.value == "could not launch: OSError: [Errno 28] No space left on device"
    assert check.fix is not None
    assert "$TMPDIR" in check.fix
    assert smoke_check(None).status is Status.SKIP
