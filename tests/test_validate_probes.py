"""Level 2's probes and verdicts: figures of GPUs named as NVML names them (the recorded HGX
H100) judged against the SKU table and their peers; the CPU probes against a measurement timed
directly; ``validate --level 3`` end to end on this machine (probes, sustained load, the record
kept; the level-2 smoke test with its all-gather is test_validate_cli's shared run)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List

import pytest
from typer.testing import CliRunner

from torchscale.cli.app import app
from torchscale.config.validate_section import ValidateSection
from torchscale.hardware.environment import threads_per_cpu_slot
from torchscale.hardware.expected_figures import PROBES, expected_figure
from torchscale.results.layout import validate_record_path
from torchscale.validate.judging import judge_figures, probe_checks
from torchscale.validate.levels import collective_figures
from torchscale.validate.probe_timing import Figure
from torchscale.validate.result import CheckResult, Status

pytestmark = pytest.mark.timed  # GEMM and memory figures against an independent measurement

DATA = Path(__file__).parent / "data" / "nvml"
H100 = json.loads((DATA / "h100_healthy.json").read_text())["devices"][0]["nvmlDeviceGetName"]


def gemm_figures(shares: List[float], name: str = H100) -> List[Figure]:
    expected = expected_figure(name, "gemm_bf16")
    base = expected.value if expected else 100.0
    return [Figure("gemm_bf16", f"GPU {i}", base * s, name) for i, s in enumerate(shares)]


def test_h100_gemm_against_its_sku_figure_and_its_peers() -> None:
    shares = [0.93, 0.94, 0.92, 0.93, 0.95, 0.66, 0.94, 0.93]
    figures = gemm_figures(shares)
    judged = judge_figures(figures, ValidateSection(), cpu=False)
    expected = expected_figure(H100, "gemm_bf16")
    assert expected is not None and "H100 SXM" in expected.source
    slow = judged[5]
    others = [f.value for f in figures if f is not figures[5]]
    assert slow.vs_expected == pytest.approx(0.66)
    assert slow.vs_peers == pytest.approx(figures[5].value / statistics.median(others))
    assert slow.status is Status.FAIL  # 0.66 of the H100's figure is below validation.expected.fail
    assert {j.status for j in judged if j is not slow} == {Status.PASS}
    [row] = probe_checks(judged, cpu=False)
    assert row.status is Status.FAIL and row.name == "GEMM bf16"
    assert row.value.startswith(f"GPU 5: {figures[5].value:.0f} TFLOP/s, 0.66 of expected 792, ")
    assert row.fix and "nvidia-smi -q -d PERFORMANCE" in row.fix


def test_a_gpu_slow_only_against_its_peers_warns_and_passing_rows_give_the_range() -> None:
    # every GPU above the SKU bar, GPU 2 at 0.86 of its peers: a peer WARN
    judged = judge_figures(gemm_figures([1.0] * 2 + [0.86] + [1.0] * 5), ValidateSection(), False)
    assert [j.status for j in judged].count(Status.WARN) == 1 and judged[2].status is Status.WARN
    healthy = probe_checks(judge_figures(gemm_figures([0.95] * 8), ValidateSection(), False), False)
    assert healthy[0].status is Status.PASS
    assert healthy[0].value == "8 devices: 752 TFLOP/s (>= 0.95 of expected 792)"


def test_thresholds_come_from_the_config() -> None:
    strict = ValidateSection.model_validate({"expected": {"warn": 0.97, "fail": 0.96}})
    judged = judge_figures(gemm_figures([0.95] * 8), strict, cpu=False)
    assert {j.status for j in judged} == {Status.FAIL}


def test_devices_without_a_table_entry_and_latencies_are_judged_by_their_peers() -> None:
    name = "NVIDIA RTX 6000 Ada Generation"
    judged = judge_figures(gemm_figures([1.0, 1.0, 0.7, 1.0], name), ValidateSection(), cpu=False)
    assert all(j.expected is None and j.vs_expected is None for j in judged)
    assert judged[2].vs_peers == pytest.approx(0.7) and judged[2].status is Status.FAIL
    # a latency: higher is worse, and the ratio is inverted so that below 1 is still worse
    latency = [Figure("launch_latency", f"GPU {i}", us, H100) for i, us in enumerate([4, 4, 8])]
    slow = judge_figures(latency, ValidateSection(), cpu=False)[2]
    assert not PROBES["launch_latency"].higher_is_better
    assert slow.vs_peers == pytest.approx(0.5) and slow.status is Status.FAIL


def test_node_collectives_from_the_smoke_test_and_their_rank_bound_expectation() -> None:
    details = {"device": H100, "world_size": 8, "busbw_gbps": 333.0,
               "all_gather": {"busbw_gbps": 301.0}}  # fmt: skip
    smoke = CheckResult("All-reduce smoke test", Status.PASS, "ok", None, details)
    reduce_, gather = collective_figures(smoke)
    assert (reduce_.probe, reduce_.value, reduce_.ranks) == ("all_reduce", 333.0, 8)
    assert (gather.probe, gather.value) == ("all_gather", 301.0)
    judged = judge_figures([reduce_, gather], ValidateSection(), cpu=False)
    assert judged[0].vs_expected == pytest.approx(333.0 / 370.0)  # 8 x H100 ring figure
    assert judged[1].expected is None  # no published all-gather figure: nothing to compare
    four = Figure("all_reduce", "node", 333.0, H100, (), 4)
    assert judge_figures([four], ValidateSection(), cpu=False)[0].expected is None
    failed = CheckResult("All-reduce smoke test", Status.FAIL, "hung", "fix", {})
    assert collective_figures(failed) == []


def best_window(call: Callable[[], object], work: float, window_s: float, repeats: int) -> float:
    """Work per second in the best of ``repeats`` windows of back-to-back calls, after one call
    to warm up (first touch of the pages): timed here, not by the probe's code."""
    call()
    rates = []
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while calls == 0 or time.perf_counter() - start < window_s:
            call()
            calls += 1
        rates.append(work * calls / (time.perf_counter() - start))
    return max(rates)


ROUNDS = 6
"""ABBA rounds (probe, direct, direct, probe): 12 pairs, about 15 s here."""


@pytest.mark.slow
def test_cpu_gemm_and_memory_figures_agree_with_an_independent_measurement() -> None:
    """The figures the CLI reports for CPU 0 (measure_devices: the best of ``repeats`` windows)
    against the same operations timed here with the same sizes, thread count, core (slot 0 runs
    on the first allowed core), fresh buffers, window length and count, and the same best
    window. On a shared machine a measurement that meets a busy moment runs at half speed, so
    they alternate in ABBA rounds (linear drift in the load cancels) and the median of the
    paired ratios is compared: a few pairs caught by a busy moment move it little.

    The copy timed here is torch's ``copy_``: numpy's ``copyto`` is a memcpy whose streaming
    stores skip reading the destination (~25% faster on this VM), another measurement."""
    import torch

    from torchscale.validate.device_probes import measure_devices

    settings = ValidateSection(window_s=0.05, repeats=3, max_cpu_devices=1)
    n, elements = settings.cpu_gemm_size, settings.cpu_copy_mib * 2**20 // 4
    window, repeats = settings.window_s, settings.repeats
    before, allowed = torch.get_num_threads(), os.sched_getaffinity(0)
    core = {min(allowed)} if threads_per_cpu_slot() == 1 else allowed  # where slot 0 runs

    def probe() -> Dict[str, float]:
        return {f.probe: f.value for f in measure_devices(settings).figures}

    def direct() -> Dict[str, float]:
        torch.set_num_threads(threads_per_cpu_slot())  # as the probe runs a CPU slot
        os.sched_setaffinity(0, core)
        try:
            a, b, out = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
            gemm = best_window(lambda: torch.matmul(a, b, out=out), 2.0 * n**3, window, repeats)
            src = torch.ones(elements)
            dst = torch.empty_like(src)
            copy = best_window(lambda: dst.copy_(src), 2.0 * elements * 4, window, repeats)
            return {"gemm_fp32": gemm / 1e12, "memory_copy": copy / 1e9}
        finally:
            torch.set_num_threads(before)
            os.sched_setaffinity(0, allowed)

    pairs: Dict[str, List[float]] = {"gemm_fp32": [], "memory_copy": []}
    for _ in range(ROUNDS):
        first, theirs, again, mine = probe(), direct(), direct(), probe()
        for key, ratios in pairs.items():
            ratios += [first[key] / theirs[key], mine[key] / again[key]]
    for key, ratios in pairs.items():
        shown = [round(r, 2) for r in ratios]
        assert statistics.median(ratios) == pytest.approx(1.0, rel=0.2), (key, shown)


@pytest.mark.cpu_only_node
def test_level_3_end_to_end_on_this_machine(tmp_path: Path) -> None:
    out = tmp_path / "results"
    sets = ["window_s=0.1", "repeats=2", "max_cpu_devices=1", "sustained_s=0.9",
            "sample_interval_s=0.1"]  # fmt: skip
    args = ["validate", "--level", "3", "--json", "--skip-smoke", "-o", str(out)]
    args += [word for s in sets for word in ("--set", f"validation.{s}")]
    result = CliRunner().invoke(app, args)
    report = json.loads(result.stdout)
    assert report["level"] == 3
    assert result.exit_code == (0 if report["summary"]["ok"] else 1)
    checks = {c["name"]: c for c in report["checks"]}
    probes = {(p["probe"], p["device"]): p for p in report["probes"]}
    # no smoke test (--skip-smoke): no node collective figures, the per-device ones only
    assert set(probes) == {("gemm_fp32", "CPU 0"), ("memory_copy", "CPU 0"),
                           ("launch_latency", "CPU 0")}  # fmt: skip
    gemm = probes[("gemm_fp32", "CPU 0")]
    assert gemm["value"] == max(gemm["samples"]) and len(gemm["samples"]) == 2
    # judged against the core's own unloaded rate (the probe's work per thread CPU second)
    assert gemm["expected"] == gemm["unloaded"] >= gemm["value"] * 0.99
    assert gemm["vs_expected"] == pytest.approx(gemm["value"] / gemm["unloaded"])
    assert gemm["expected_source"].startswith("the core's own unloaded rate")
    for name in ("XID errors (kernel log)", "GEMM fp32", "Memory copy", "Kernel launch",
                 "Sustained GEMM", "Sustained memory copy",
                 "Clocks under load"):  # fmt: skip
        assert name in checks, name
    slices = report["sustained"]["slices"]["CPU"]
    assert len(slices["gemm"]) == len(slices["copy"]) == 12
    drift = checks["Sustained GEMM"]["details"]["drift"]["CPU"]
    assert drift == pytest.approx(
        statistics.median(slices["gemm"][-4:]) / statistics.median(slices["gemm"][:4])
    )
    saved = json.loads(validate_record_path(out, report["host"]).read_text())
    assert saved == report


# Pinned to a core, spinning until killed (or for a minute at most, whatever happens to the test).
_DETACHED_SPINNER = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
end = time.monotonic() + 60
while time.monotonic() < end:
    pass
"""


@contextlib.contextmanager
def spinners(core: int, count: int) -> Iterator[List[int]]:
    """``count`` CPU-bound processes pinned to ``core``, started through a shell that exits at
    once, so they are not this process's children (validate leaves its own tree out of the
    other processes' load): a busy host the test makes itself."""
    pids = []
    try:
        for _ in range(count):
            shell = subprocess.run(
                ["sh", "-c", '"$0" -c "$1" "$2" >/dev/null 2>&1 & echo $!',
                 sys.executable, _DETACHED_SPINNER, str(core)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            pids.append(int(shell.stdout.strip()))
        time.sleep(0.3)  # started and spinning
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.cpu_only_node
def test_level_1_warns_with_the_load_and_names_the_process_holding_the_cores() -> None:
    """A spinner pinned beside the checks: the host-load row WARNs, says how many cores other
    processes kept busy, and names the spinner among the top consumers with its share."""
    from torchscale.validate.system import check_host_load, other_processes

    cores = len(os.sched_getaffinity(0))
    with spinners(min(os.sched_getaffinity(0)), 1) as (pid,):
        sample = other_processes(0.5)
    others, consumers = sample
    mine = {c.pid: c for c in consumers}[pid]
    # It ran (its share depends on what else runs on its core), and it is counted.
    assert mine.cores > 0.05 and others >= mine.cores, consumers
    check = check_host_load(0.9 * others / cores, sample)  # others just above the share
    assert check.status is Status.WARN, check
    assert f"other processes kept {others:.2f} cores busy" in check.value
    top = check.details["top_consumers"]
    assert isinstance(top, list)
    assert [c["pid"] for c in top] == [c.pid for c in consumers[: len(top)]]
    if mine in consumers[:3]:  # the row names the three largest
        assert f"(pid {pid}) {mine.cores:.2f}" in check.value
    assert check.value.startswith("load average ") and "Run on a quiet node" in (check.fix or "")
    if others < cores:
        calm = check_host_load(min(1.0, 1.1 * others / cores), sample)
        assert calm.status is Status.PASS, calm
    quiet = check_host_load(1.0, (0.1, []))
    assert quiet.status is Status.PASS and "kept 0.10 cores busy" in quiet.value


@pytest.mark.cpu_only_node
def test_level_2_names_the_core_other_processes_share_against_its_own_unloaded_rate() -> None:
    """Two spinners pinned to the last core: its GEMM falls short of its own unloaded rate (the
    same windows' work per second of the probe thread's CPU time), so the core is named even
    if every core were slowed alike (the node's median would move with them)."""
    if threads_per_cpu_slot() != 1:
        pytest.skip("several threads per CPU slot: no single core to pin a probe to")
    from torchscale.validate.device_probes import measure_devices

    allowed = sorted(os.sched_getaffinity(0))
    settings = ValidateSection(window_s=0.1, repeats=2, max_cpu_devices=len(allowed))
    with spinners(allowed[-1], 2):
        run = measure_devices(settings)
    gemms = [f for f in run.figures if f.probe == "gemm_fp32"]
    judged = {j.figure.device: j for j in judge_figures(gemms, settings, cpu=True)}
    slowed = judged[f"CPU {len(allowed) - 1}"]
    unloaded = slowed.figure.details["unloaded"]
    assert isinstance(unloaded, (int, float)) and slowed.vs_expected is not None
    assert slowed.expected == unloaded and slowed.vs_expected == pytest.approx(
        slowed.figure.value / unloaded
    )
    assert slowed.vs_expected < settings.expected.fail, slowed  # three runnable on one core
    assert slowed.status is Status.FAIL
    (row,) = probe_checks(list(judged.values()), cpu=True)
    assert row.status is Status.FAIL
    assert f"CPU {len(allowed) - 1}: " in row.value
    assert f"{slowed.vs_expected:.2f} of its unloaded rate" in row.value
