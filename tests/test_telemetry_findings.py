"""Telemetry that explains: NVML time series (recorded answers) joined with each rank's timing.

The GPU side replays the recorded HGX H100 fixture through the fake pynvml, turned into a time
series: GPU 5 starts healthy and falls into thermal slowdown (the fixture's own throttled answers:
1,215 MHz, 90 °C, reasons 0x68) part-way through the window. The CPU side is a real 2-rank run
whose rank 1 shares its core with a busy process (``tests.support.fault_models:oversubscribed_model``).
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from typer.testing import CliRunner

from tests.support.environ import repo_pythonpath
from tests.support.fakes.fake_pynvml import load
from tests.support.html_tables import html_tables
from torchscale.analysis.cpu_load import OTHER_PROCESSES_CORES, oversubscribed_wait
from torchscale.analysis.telemetry import console_lines, cpu_table, telemetry_findings
from torchscale.cli.app import app
from torchscale.results.schema import TrainingResult
from torchscale.worker.aggregate import sync_stats
from torchscale.worker.gpu_sampler import GpuSampler

pytestmark = pytest.mark.timed  # a rank oversubscribed on purpose, found by its CPU wait

FIXTURES = Path(__file__).parent / "data" / "nvml"
HEALTHY_SAMPLES = 4  # GPU 5's samples before it throttles


def throttling_fixture() -> Dict[str, Any]:
    """h100_thermal.json with GPU 5's recorded throttled answers preceded by healthy ones (GPU 0's)
    and a PCIe link trained at Gen3 on GPU 7, as NVML reports a degraded link."""
    fixture = json.loads((FIXTURES / "h100_thermal.json").read_text())
    healthy, hot = fixture["devices"][0], copy.deepcopy(fixture["devices"][5])
    device = fixture["devices"][5]

    def series(before: Any, after: Any) -> Dict[str, Any]:
        return {"series": [before] * HEALTHY_SAMPLES + [after]}

    device["nvmlDeviceGetCurrentClocksEventReasons"] = series(
        healthy["nvmlDeviceGetCurrentClocksEventReasons"],
        hot["nvmlDeviceGetCurrentClocksEventReasons"],
    )
    device["nvmlDeviceGetPowerUsage"] = series(
        healthy["nvmlDeviceGetPowerUsage"], hot["nvmlDeviceGetPowerUsage"]
    )
    device["nvmlDeviceGetClockInfo"] = {
        "1": series(healthy["nvmlDeviceGetClockInfo"]["1"], hot["nvmlDeviceGetClockInfo"]["1"]),
        "2": hot["nvmlDeviceGetClockInfo"]["2"],
    }
    device["nvmlDeviceGetTemperature"] = {
        "0": series(healthy["nvmlDeviceGetTemperature"]["0"], hot["nvmlDeviceGetTemperature"]["0"])
    }
    fixture["devices"][7]["nvmlDeviceGetCurrPcieLinkGeneration"] = 3
    return fixture


def sample(monkeypatch: pytest.MonkeyPatch, indices: List[int]) -> List[Optional[Dict[str, Any]]]:
    monkeypatch.setitem(sys.modules, "pynvml", load(throttling_fixture()))
    samplers = [GpuSampler(i, interval_s=0.01) for i in indices]
    for sampler in samplers:
        sampler.__enter__()
    time.sleep(0.25)
    for sampler in samplers:
        sampler.__exit__(None, None, None)
    return [s.summary() for s in samplers]


def rank(index: int, gpu: Optional[Dict[str, Any]], nosync: float, step: float) -> Dict[str, Any]:
    steps = [step] * 8
    return {
        "rank": index, "local_rank": index, "host": "node-a", "device": f"cuda:{index}",
        "step_time_ms": {"mean": step, "p50": step, "p95": step, "p99": step, "min": step,
                         "max": step, "std": 0.0, "cv": 0.0},
        "step_times_ms": steps, "measure_steps": 8, "window_s": 8 * step / 1e3,
        "forward_ms": 10.0, "backward_ms": 30.0, "optimizer_ms": 2.0, "data_ms": 0.1,
        "nosync_step_ms": nosync, "sync_wait_ms": step - nosync,
        "sync_wait_samples_ms": [step - nosync] * 8, "gpu": gpu,
    }  # fmt: skip


def record(ranks: List[Dict[str, Any]], cell_id: str = "gpt2-b8-g2") -> TrainingResult:
    step = max(r["step_time_ms"]["mean"] for r in ranks)
    return TrainingResult.model_validate(
        {
            "cell_id": cell_id, "experiment": "telemetry", "status": "ok",
            "world_size": len(ranks), "nproc_per_node": len(ranks), "model": "gpt2",
            "batch_size": 8, "global_batch_size": 8 * len(ranks), "precision": "bf16",
            "throughput": 1000.0, "unit": "tokens", "per_rank": ranks,
            "step_time_ms": ranks[0]["step_time_ms"], "step_times_ms": ranks[0]["step_times_ms"],
            "sync": sync_stats(ranks, step),
        }
    )  # fmt: skip


def throttled_cell(monkeypatch: pytest.MonkeyPatch) -> TrainingResult:
    healthy, hot = sample(monkeypatch, [0, 5])
    # GPU 5 computes slower: rank 0 waits for it at every sync, rank 1 hardly waits.
    return record([rank(0, healthy, nosync=40.0, step=52.0), rank(1, hot, nosync=51.5, step=52.0)])


def test_throttled_straggler_is_named_with_its_gpu_reason_and_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cell = throttled_cell(monkeypatch)
    hot = cell.per_rank[1].gpu
    assert hot is not None and hot.nvml_index == 5 and hot.sm_clock_mhz_limit == 1980
    share = hot.throttle_share["hw_thermal_slowdown"]
    expected = (hot.samples - HEALTHY_SAMPLES) / hot.samples
    assert share == pytest.approx(expected) and 0.3 < share < 1.0
    assert hot.sm_clock_mhz_min == 1215 and hot.temperature_c_max == 90
    assert len(hot.timeline) == hot.samples and hot.timeline[-1][2] == 1215
    assert cell.sync is not None and cell.sync.slowest_rank == 1

    findings = telemetry_findings([cell])
    (straggler,) = [f for f in findings if "straggler" in f["title"]]
    assert straggler["title"].startswith("GPU 5 is the straggler: HW thermal slowdown")
    assert straggler["ranks"] == [1] and straggler["severity"] == "high"
    assert f"HW thermal slowdown for {share:.0%} of the measured window" in straggler["message"]
    assert "(also SW thermal slowdown, HW slowdown)" in straggler["message"]
    assert "against 1,980 MHz on its peers" in straggler["message"]
    assert not any("GPU 0" in f["title"] for f in findings)
    (line,) = [x for x in console_lines(cell) if "straggler" in x]
    assert line.startswith("> [WARN] GPU 5 is the straggler: HW thermal slowdown.")


def test_pcie_link_below_its_maximum(monkeypatch: pytest.MonkeyPatch) -> None:
    healthy, degraded = sample(monkeypatch, [0, 7])
    cell = record([rank(0, healthy, 40.0, 41.0), rank(1, degraded, 40.0, 41.0)])
    (finding,) = [f for f in telemetry_findings([cell]) if "PCIe" in f["title"]]
    assert finding["title"].startswith("GPU 7 PCIe link below its maximum")
    assert "Gen3 x16 (max Gen5 x16)" in finding["message"]


@pytest.mark.parametrize(
    ("nosync", "step", "data_ms", "verdict"),
    [(20.0, 40.0, 0.1, "communication-bound"), (39.0, 40.0, 0.1, "launch-bound"),
     (39.0, 40.0, 8.0, "input-bound")],
)  # fmt: skip
def test_low_utilisation_is_split_by_sync_share(
    monkeypatch: pytest.MonkeyPatch, nosync: float, step: float, data_ms: float, verdict: str
) -> None:
    healthy, other = sample(monkeypatch, [0, 1])
    ranks = [rank(0, healthy, nosync, step), rank(1, other, nosync, step)]
    for r in ranks:
        r["gpu"]["util_pct_mean"] = 45.0
        r["data_ms"] = data_ms
    cell = record(ranks)
    cell.sync.exposed_fraction = 1 - nosync / step  # type: ignore[union-attr]
    (finding,) = [f for f in telemetry_findings([cell]) if "utilised" in f["title"]]
    assert f"GPUs 45% utilised, {verdict}" in finding["title"]


def test_report_shows_gpu_telemetry_table_and_timeline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tests.support.pdf_pages import pages_text

    cell = throttled_cell(monkeypatch)
    folder = tmp_path / "telemetry"
    folder.mkdir()
    (folder / "results.jsonl").write_text(cell.model_dump_json() + "\n")
    (folder / "manifest.json").write_text(json.dumps({"experiment": "telemetry"}))
    for fmt in ("html", "pdf"):
        out = tmp_path / f"r.{fmt}"
        result = CliRunner().invoke(app, ["report", "-s", str(folder), "-f", fmt, "-o", str(out)])
        assert result.exit_code == 0, result.stderr
    html = (tmp_path / "r.html").read_text()
    rows = html_tables(html)["gpu-telemetry-table"]
    hot = next(r for r in rows if r["GPU"] == "GPU 5")
    assert hot["Clocks-event reasons (share of window)"].startswith("HW slowdown")
    assert "HW thermal slowdown" in hot["Clocks-event reasons (share of window)"]
    assert "min 1,215" in hot["SM clock MHz"] and hot["Temp max °C"] == "90.0"
    assert "SM clock over the measured window" in html
    assert "GPU 5 is the straggler: HW thermal slowdown" in html
    pdf = " ".join(" ".join(pages_text(tmp_path / "r.pdf")).split())
    assert "Telemetry" in pdf and "GPU 5 is the straggler" in pdf
    assert "SM clock over the measured window" in pdf


@pytest.mark.slow
def test_real_oversubscribed_rank_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "busy.yaml"
    config.write_text(
        "experiment_name: busy\nmodels: [tests.support.fault_models:oversubscribed_model]\n"
        "batch_sizes: [8]\ngpu_counts: [2]\nwarmup_steps: 2\nmeasure_steps: 12\n"
        "sync_probe_steps: 2\ncell_timeout_s: 240\n"
    )
    monkeypatch.setenv("PYTHONPATH", repo_pythonpath())
    monkeypatch.setenv("TORCHSCALE_TEST_FAULT_RANK", "1")
    result = CliRunner().invoke(app, ["benchmark", "-c", str(config), "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "> [WARN] Rank 1 was preempted (host oversubscribed)" in result.stderr
    records = [
        TrainingResult.model_validate_json(line)
        for line in (tmp_path / "busy" / "results.jsonl").read_text().splitlines()
    ]
    table: Any = cpu_table(records).set_index("rank")  # read cell by cell
    print(table[["cpu_share", "cpu_wait_share", "other_processes_cores", "nosync_step_ms"]])
    # Two busy processes take about two thirds of rank 1's core; rank 0 only meets whatever else
    # runs on the machine.
    assert table.loc[1, "cpu_wait_share"] > 0.4
    assert table.loc[1, "cpu_wait_share"] > table.loc[0, "cpu_wait_share"]
    found = {f["ranks"][0]: f for f in telemetry_findings(records) if "preempted" in f["title"]}
    # On a shared machine rank 0 may wait too (it is then named as well, with its own share).
    finding = found[1]
    share = table.loc[1, "cpu_wait_share"]
    assert f"waited for a CPU for {share:.0%} of the measured window" in finding["message"]
    assert "the straggler" in finding["title"] and finding["severity"] == "high"
    assert "its compute-only step is +" in finding["message"]
    # The spinners are other processes: the host's busy time minus the ranks' own CPU time
    # shows them (about two thirds of a core), and the finding says so.
    others = table.loc[1, "other_processes_cores"]
    assert others >= OTHER_PROCESSES_CORES, table
    assert f"Other processes kept {others:.2f} of the host's" in finding["message"]
    # The same waits with nothing else running (the host's busy time = the ranks' own): the wait
    # was behind the rank's own threads, and the finding says that instead.
    record = records[0]
    own = sum(r.process_cpu_s or 0.0 for r in record.per_rank)
    quiet = record.model_copy(
        update={
            "per_rank": [r.model_copy(update={"host_busy_cpu_s": own}) for r in record.per_rank]
        }
    )
    (own_threads,) = [f for f in telemetry_findings([quiet]) if f["ranks"] == [1]]
    assert "waited for a CPU behind its own threads" in own_threads["title"]
    assert "Other processes kept 0.00 of the host's" in own_threads["message"]
    assert "gloo and DDP threads" in own_threads["recommendation"]
    assert oversubscribed_wait([quiet]) is None  # what tune's verdict warns on
    assert oversubscribed_wait(records) == pytest.approx(share, rel=1e-9)
    # One rule for a busy host: benchmark's table marks the cell (its footer never "all ok"),
    # and compare of it against the quiet copy, slowed, calls it "not judged".
    table_rows = [line for line in result.stderr.splitlines() if "oversubscribed" in line]
    assert any("busy host" in line for line in table_rows), result.stderr
    assert "all ok" not in result.stderr
    assert "1 cell(s) measured on a busy host (a rank waited for a CPU" in " ".join(
        result.stderr.split()
    )
    from torchscale.analysis.comparison import CompareOptions, compare_runs

    faster = quiet.model_copy(
        update={
            "step_times_ms": [s / 2 for s in quiet.step_times_ms],
            "throughput": 2 * (quiet.throughput or 0.0),
        }
    )
    gate = compare_runs([faster], records, CompareOptions())
    (cell,) = gate.cells.to_dict("records")
    assert cell["verdict"] == "not judged" and cell["cpu_wait_share"] == pytest.approx(share)
    assert cell["throughput_change_pct"] == pytest.approx(-50)  # a drop, and still not judged
    assert gate.judged_nothing and not gate.passed
