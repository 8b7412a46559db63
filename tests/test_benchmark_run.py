"""Real benchmark runs: torchrun launches of 1 and 2 gloo processes on tiny CPU models.

Launches cost seconds each, so each sweep runs once per module and many tests read its results.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List

import psutil
import pytest
from typer.testing import CliRunner

from tests.support.environ import repo_pythonpath, restored_environ
from tests.support.shared_runs import SCRIPT_NAME, Run
from tests.support.typed import training_records
from torchscale.cli.app import app
from torchscale.results.schema import TrainingResult
from torchscale.results.store import ExperimentStore

pytestmark = [
    pytest.mark.slow,  # every test here reads a real CPU benchmark (torchrun launches)
    pytest.mark.timed(alone=False),  # a 30 s start-up timeout and a hang's wall time under it
]

runner = CliRunner()

STALL_S = 3
"""The stall watch's limit: it only watches the stepping windows (start-up is the cell timeout's),
where a healthy step of these tiny models moves every few milliseconds, so 3 s (as in
test_process_faults' sweep) tells a hang from a slow step and ends the hang 3 s after it stops."""
FAULTS = f"""\
experiment_name: faults
models:
  - gpt2-tiny
  - tests.support.fault_models:oom_model
  - tests.support.fault_models:crash_model
  - tests.support.fault_models:hang_model
  - resnet-tiny
batch_sizes: [4]
gpu_counts: [2]
warmup_steps: 2
measure_steps: 6
sync_probe_steps: 2
cell_timeout_s: 30  # the healthy cell starts in ~9 s on a quiet 2-core machine, ~15 s on a loaded one
stall_timeout_s: {STALL_S}
"""


@pytest.fixture(scope="module")
def worker_env() -> Iterator[None]:
    """Workers import tests.support.fault_models: put the repo root on their PYTHONPATH."""
    with restored_environ("PYTHONPATH", "TORCHSCALE_TEST_OOM_AT"):
        os.environ["PYTHONPATH"] = repo_pythonpath()
        os.environ["TORCHSCALE_TEST_OOM_AT"] = "4"
        yield


def run_benchmark(tmp: Path, config_text: str, *extra: str) -> tuple:
    config = tmp / "bench.yaml"
    config.write_text(config_text)
    result = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(tmp / "out"), *extra])
    return result, tmp / "out"


@pytest.fixture(scope="module")
def healthy(healthy_run: Run) -> Dict:
    """gpt2-tiny on 1 and 2 gloo processes, shared with the report's tests."""
    run = healthy_run
    store = ExperimentStore(run.experiment_dir)
    return {"result": run.result, "store": store, "records": store.records(), "run": run}


def by_cell(records: List[TrainingResult]) -> Dict[tuple, TrainingResult]:
    return {(r.model, r.world_size): r for r in records}


def test_every_cell_ran_with_real_figures(healthy: Dict) -> None:
    records = by_cell(healthy["records"])
    assert set(records) == {("gpt2-tiny", 1), ("gpt2-tiny", 2)}
    for (_, world), record in records.items():
        assert record.status == "ok", record.error
        assert record.backend == "gloo" and record.device_name == "cpu"
        assert record.unit == "tokens" and record.units_per_sample == 64  # gpt2-tiny's seq_len
        assert len(record.per_rank) == world
        assert [r.rank for r in record.per_rank] == list(range(world))
        assert record.measure_steps == 8 and len(record.step_times_ms) == 8
        for rank in record.per_rank:
            assert len(rank.step_times_ms) == 8
            assert rank.forward_ms > 0 and rank.backward_ms > 0 and rank.optimizer_ms > 0
            assert rank.nosync_step_ms is not None and rank.nosync_step_ms > 0
            assert rank.memory is not None and rank.memory.params_bytes > 0
            assert rank.memory.optimizer_bytes > 0 and rank.memory.peak_kind == "rss"
        stats = record.step_time_ms
        assert stats is not None and stats.min <= stats.p50 <= stats.p95 <= stats.p99 <= stats.max
        # Throughput is samples over the measured window; it must agree with the step times.
        assert record.global_batch_size == 4 * world
        assert record.samples_per_s == pytest.approx(4 * world * 8 / record.measured_s)
        from_steps = record.global_batch_size / (stats.mean / 1e3)
        assert record.samples_per_s is not None and record.flops_per_sample is not None
        assert record.tflops_per_gpu is not None
        assert 0.8 < record.samples_per_s / from_steps < 1.25
        assert record.throughput == pytest.approx(record.samples_per_s * record.units_per_sample)
        assert record.flops_per_sample > 0 and record.tflops_per_gpu > 0
        assert record.mfu is None  # no known peak for a CPU


def test_two_rank_cells_measure_gradient_sync(healthy: Dict) -> None:
    record = by_cell(healthy["records"])[("gpt2-tiny", 2)]
    assert record.sync is not None and record.sync.exposed_fraction is not None
    assert 0.0 <= record.sync.exposed_fraction <= 1.0
    assert len(record.sync.per_rank_wait_ms) == 2
    for rank in record.per_rank:
        # DDP's own logging data, read in the probe window.
        assert rank.ddp_backward_comm_ms is not None and rank.ddp_backward_comm_ms > 0
        assert rank.ddp_backward_compute_ms is not None and rank.ddp_backward_compute_ms > 0
        assert len(rank.sync_wait_samples_ms) == 8
        assert set(rank.timeline_s) >= {"init", "build", "warmup", "measure", "sync_probe"}
    assert record.hosts and len(record.per_rank) == 2


def test_summary_and_scaling_efficiency_come_from_the_records(healthy: Dict) -> None:
    records = by_cell(healthy["records"])
    with open(healthy["store"].summary_path) as handle:
        rows = {(r["model"], int(r["world_size"])): r for r in csv.DictReader(handle)}
    for model in ("gpt2-tiny",):
        one, two = records[(model, 1)], records[(model, 2)]
        assert two.samples_per_s is not None and one.samples_per_s is not None
        assert two.step_time_ms is not None
        expected = two.samples_per_s / (2 * one.samples_per_s)
        assert float(rows[(model, 2)]["scaling_efficiency"]) == pytest.approx(expected)
        assert float(rows[(model, 1)]["scaling_efficiency"]) == pytest.approx(1.0)
        assert float(rows[(model, 2)]["throughput"]) == pytest.approx(two.throughput)
        assert float(rows[(model, 2)]["step_ms_p95"]) == pytest.approx(two.step_time_ms.p95)


def test_manifest_cells_and_console(healthy: Dict) -> None:
    store: ExperimentStore = healthy["store"]
    manifest = store.manifest()
    assert manifest["experiment"] == SCRIPT_NAME  # the name is kept; the folder is a safe slug
    # An unsafe name is made safe, with a hash of the original: no two names share a folder.
    assert store.root.name.startswith("script-alert-1-script+") and len(store.root.name) == 32
    assert f"> Results go to {store.root}" in healthy["result"].stderr
    for record in healthy["records"]:  # known top-level fields are filled in
        assert record.warmup_steps == record.settings["warmup_steps"] == 2
        assert record.measure_steps and record.backend == "gloo" and record.unit == "tokens"
    assert manifest["config"]["models"] == ["gpt2-tiny"]
    assert manifest["environment"]["torch"].split("+")[0] in manifest["environment"]["torch"]
    assert manifest["environment"]["backend"] == "gloo"
    assert len(manifest["cells"]) == 2 and manifest["runs"][0]["command"]
    for record in healthy["records"]:
        cell_dir = store.cell_dir(record.cell_id)
        assert (cell_dir / "cell.json").exists() and (cell_dir / "launch.log").exists()
        rank_logs = list((cell_dir / "torchrun").rglob("stdout.log"))
        assert len(rank_logs) == record.world_size
    stderr = healthy["result"].stderr
    assert "> Running gpt2-tiny on 2 CPU processes (batch 4, fp32)..." in stderr
    assert "Average Throughput:" in stderr and "Iteration Latency:" in stderr
    document = json.loads(healthy["result"].stdout)
    assert len(document["records"]) == 2 and document["experiment"] == SCRIPT_NAME


def test_existing_results_need_resume_and_resume_runs_nothing_new(healthy: Dict) -> None:
    run = healthy["run"]
    before = healthy["store"].results_path.read_text()
    args = ["benchmark", "-c", str(run.config), "-o", str(run.output_dir)]
    again = runner.invoke(app, args)
    assert again.exit_code == 2 and "already holds results" in again.stderr
    resumed = runner.invoke(app, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert "> Running" not in resumed.stderr
    assert healthy["store"].results_path.read_text() == before


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory, worker_env: None) -> Dict:
    tmp = tmp_path_factory.mktemp("faults")
    result, out = run_benchmark(tmp, FAULTS)
    store = ExperimentStore(out / "faults")
    return {"result": result, "store": store, "records": store.records()}


def test_faults_are_recorded_and_the_sweep_goes_on(faults: Dict) -> None:
    """One warm group (``launch: per_group``, the default) of five 2-rank cells: an OOM in the
    middle is contained in the launch, a crash and a hang end it and the group is relaunched from
    the next cell; every cell is recorded with its own cause."""
    records = faults["records"]
    assert [r.model.split(":")[-1] for r in records] == [
        "gpt2-tiny",
        "oom_model",
        "crash_model",
        "hang_model",
        "resnet-tiny",
    ]
    first, oom, crash, hang, healthy = records
    assert first.status == "ok" and first.samples_per_s > 0
    assert oom.status == "oom"
    assert "OutOfMemoryError" in oom.error and "rank " in oom.error
    assert crash.status == "failed"
    assert crash.error.startswith("rank 1 ") and "injected crash" in crash.error
    assert hang.status == "timeout"
    # Found by the stall watch, well before the cell's 30 s: no rank moved for STALL_S.
    assert hang.error.startswith(f"hung: no rank moved for {STALL_S} s (stall_timeout_s): "), (
        hang.error
    )
    assert hang.wall_s is not None and hang.wall_s < 30
    assert "rank 1 stuck in 'measure', step " in hang.error and "forward" in hang.error
    assert "rank 0 waiting in 'measure', step " in hang.error and "backward" in hang.error
    assert healthy.status == "ok" and healthy.samples_per_s > 0
    # The OOM and the crash ran in the first launch (the OOM did not end it); the crash did, so
    # the hang was the first cell of a relaunch, and the hang's kill made one more.
    launches = [(r.launch["group"], r.launch["position"]) for r in records]
    assert launches == [
        (first.cell_id, 0),
        (first.cell_id, 1),
        (first.cell_id, 2),
        (hang.cell_id, 0),
        (healthy.cell_id, 0),
    ]
    assert all(r.launch["mode"] == "per_group" for r in records)
    # A failed or timed-out cell makes the command exit 1 (OOM alone would not).
    assert faults["result"].exit_code == 1
    assert "> [FAIL] timeout:" in faults["result"].stderr
    # Each cell kept its own rank logs, whatever launch it ran in.
    for record in records:
        logs = list((faults["store"].cell_dir(record.cell_id) / "torchrun").rglob("stdout.log"))
        assert len(logs) == 2, record.cell_id


def test_a_hung_cell_leaves_no_processes_behind(faults: Dict) -> None:
    hang = faults["records"][3]
    cell_dir = str(faults["store"].cell_dir(hang.cell_id))
    root = str(faults["store"].root)  # a warm group's command names its group.json there
    leftovers = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(root in part for part in proc.info["cmdline"] or []):
            leftovers.append(proc.pid)
    assert leftovers == []
    error_files = list((Path(cell_dir) / "ranks").glob("rank*.error.json"))
    assert error_files == []  # killed, not failed


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_ctrl_c_keeps_finished_cells_and_resume_runs_the_rest(
    tmp_path: Path, worker_env: None
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "experiment_name: interrupted\nmodels: [gpt2-tiny]\nbatch_sizes: [2, 4]\n"
        "warmup_steps: 2\nmeasure_steps: 300\nsync_probe_steps: 2\ncell_timeout_s: 240\n"
    )
    out = tmp_path / "out"
    store = ExperimentStore(out / "interrupted")
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchscale", "benchmark", "-c", str(config), "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Python raises KeyboardInterrupt only where SIGINT was not ignored when it started (a
        # suite run in the background starts everything with SIGINT ignored)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:  # 300 steps: the second cell is still measuring (seconds) when Ctrl-C arrives
        assert wait_for(lambda: len(store.records()) == 1, 120), "first cell never finished"
        second_started = lambda: any(store.root.glob("cells/*b4*/ranks/rank0.progress.json"))  # noqa: E731
        assert wait_for(second_started, 60), "second cell never started"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    # 130 as a shell reports it: an exit status of 130, or (seen once in a clean-clone run, its
    # second SIGINT's source not found) an end by SIGINT after the summary, which a shell reports
    # as 130 too; either way with no traceback
    assert proc.returncode in (130, -signal.SIGINT), stderr
    assert "Traceback" not in stderr
    assert "Interrupted." in stderr and "--resume" in stderr
    first = store.results_path.read_text()
    assert len(store.records()) == 1 and training_records(store.records())[0].batch_size == 2
    assert store.records()[0].launch == {  # interrupted in the middle of a warm group
        "mode": "per_group", "group": store.records()[0].cell_id, "position": 0,
    }  # fmt: skip
    leftovers = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if any(str(out) in part for part in p.info["cmdline"] or [])
    ]
    assert leftovers == []

    resumed = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(out), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert resumed.stderr.count("> Running") == 1
    records = training_records(store.records())
    assert [r.batch_size for r in records] == [2, 4]
    assert records[1].status == "ok" and records[1].launch == {"mode": "per_cell"}  # alone
    assert store.results_path.read_text().startswith(first)
