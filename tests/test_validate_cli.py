"""``torchscale validate`` end to end on this CPU-only machine: real torchrun launches of the gloo
smoke test (one shared run, one hanging run), the table, the JSON, exit codes 0/1/2."""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict

import psutil
import pytest
from typer.testing import CliRunner

from tests.support.chromium_cdp import children_left
from tests.support.fakes.fake_pynvml import load
from torchscale.cli.app import app
from torchscale.comm.busbw import busbw_factor, layout
from torchscale.results.layout import validate_record_path
from torchscale.validate.smoke import SmokeCancelled, run_smoke_test
from torchscale.validate.smoke_worker import HANG_ENV, SAMPLE, expected_sum

pytestmark = pytest.mark.timed  # a hanging smoke test ended within its timeout

DATA = Path(__file__).parent / "data" / "nvml"
HANG_TIMEOUT_S = 10  # must exceed torchrun's own start-up (~4 s here) so the workers do start


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory):
    """One real `torchscale validate --level 2 --json` here, real 2-process gloo smoke test
    included (its all-gather too), probes kept short, recorded in a history beside ``out``."""
    out = tmp_path_factory.mktemp("validate") / "results"
    short = ["--set", "validation.window_s=0.05", "--set", "validation.max_cpu_devices=1"]
    args = ["validate", "--json", "--level", "2", "--output-dir", str(out), *short]
    args += ["--history", str(out.parent / "history.db")]
    result = CliRunner().invoke(app, args)
    return result, json.loads(result.stdout), out


def checks_of(report: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


@pytest.mark.slow
@pytest.mark.cpu_only_node
def test_stdout_is_one_json_document_and_the_exit_code_follows_it(real_run):
    result, report, _ = real_run
    assert set(report) >= {"checks", "host", "summary", "torchscale", "backend", "duration_s"}
    assert report["host"] == platform.node()
    statuses = [c["status"] for c in report["checks"]]
    assert report["summary"]["fail"] == statuses.count("FAIL")
    assert report["summary"]["total"] == len(statuses)
    assert result.exit_code == (1 if "FAIL" in statuses else 0)
    for check in report["checks"]:
        assert set(check) >= {"name", "status", "value", "fix"}
        assert check["status"] == "PASS" or check["fix"], check


@pytest.mark.slow
@pytest.mark.cpu_only_node
def test_the_real_gloo_smoke_test_passes_with_the_exact_sum(real_run):
    _, report, _ = real_run
    smoke = checks_of(report)["All-reduce smoke test"]
    details = smoke["details"]
    assert smoke["status"] == "PASS", smoke
    assert (details["backend"], details["world_size"], details["wrong_elements"]) == ("gloo", 2, 0)
    assert details["sample"] == expected_sum(SAMPLE, 2)
    assert details["elements"] * 4 == details["size_bytes"]
    per_op_s = details["time_us"] / 1e6
    assert details["algbw_gbps"] == pytest.approx(details["size_bytes"] / per_op_s / 1e9)
    factor = busbw_factor("all_reduce", 2)
    assert details["busbw_gbps"] == pytest.approx(details["algbw_gbps"] * factor)
    assert smoke["value"].startswith(
        f"2 gloo ranks, sum correct over {details['elements']:,} elements; "
        f"{details['time_us'] / 1000:.2f} ms per 4 MiB all-reduce"
    )
    assert report["backend"] == "gloo"
    # level 2: an all-gather too, laid out and scaled as nccl-tests' all_gather_perf does
    gather = details["all_gather"]
    shape = layout("all_gather", details["size_bytes"], 4, 2)
    assert gather["size_bytes"] == shape.size_bytes
    per_op_s = gather["time_us"] / 1e6
    assert gather["busbw_gbps"] == pytest.approx(
        shape.size_bytes / per_op_s / 1e9 * busbw_factor("all_gather", 2)
    )
    figures = {p["probe"]: p for p in report["probes"] if p["device"] == "node"}
    assert figures["all_gather"]["value"] == gather["busbw_gbps"]
    assert figures["all_reduce"]["value"] == details["busbw_gbps"]
    assert figures["all_reduce"]["ranks"] == 2


@pytest.mark.slow
@pytest.mark.cpu_only_node
def test_values_that_must_be_true_on_this_cpu_only_machine(real_run):
    import torch

    _, report, out = real_run
    checks = checks_of(report)
    assert checks["GPUs"]["status"] == "WARN"
    assert checks["GPUs"]["value"] == "none found — CPU (gloo) benchmarking only"
    assert checks["NVIDIA driver"]["status"] == "SKIP"
    assert {checks[n]["status"] for n in ("ECC", "NVLink", "GPU topology", "PCIe link")} == {"SKIP"}
    assert checks["Python"]["value"] == platform.python_version()
    assert checks["PyTorch"]["value"].startswith(f"{torch.__version__} (")
    st = os.statvfs("/dev/shm")
    assert checks["/dev/shm"]["details"]["total_bytes"] == st.f_blocks * st.f_frsize
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert checks["Open files limit"]["value"].startswith(f"{soft} (hard ")
    # level 2 keeps its record there, and nothing else
    written = [p.relative_to(out) for p in out.rglob("*") if p.is_file()]
    assert written == [validate_record_path(Path("."), report["host"])]


@pytest.mark.slow
@pytest.mark.cpu_only_node
def test_the_table_on_stderr(real_run):
    result, report, _ = real_run
    table = result.stderr
    for check in report["checks"]:
        assert check["name"] in table
    assert "none found — CPU (gloo) benchmarking only" in table
    s = report["summary"]
    assert f"{s['pass']} PASS, {s['warn']} WARN, {s['fail']} FAIL, {s['skip']} SKIP" in table
    # Ready unless a row failed (on a busy host a core short of its unloaded rate does).
    ready = "not ready: fix the FAIL rows first" if s["fail"] else "ready for CPU (gloo)"
    assert ready in table
    # The host's load, measured over a second beside the smoke test (its own ranks left out).
    load = checks_of(report)["Host load"]
    assert load["value"].startswith("load average ") and "other processes kept" in load["value"]
    others = load["details"]["other_processes_cores"]
    assert load["status"] == ("WARN" if others > 0.25 * load["details"]["cores"] else "PASS")
    assert "{" not in result.stderr.splitlines()[0]  # the JSON went to stdout only


@pytest.mark.slow
@pytest.mark.cpu_only_node
def test_level_2_records_its_figures_in_the_history(real_run):
    """``--history``: the run is in the history at its end, a point per device and probe with
    the record's own figure, in a series of this host's device."""
    from torchscale.history.database import HistoryStore

    result, report, out = real_run
    assert "Recorded in the history" in result.stderr
    store = HistoryStore(str(out.parent / "history.db"))
    (run,) = store.runs()
    assert (run["kind"], run["started_at"]) == ("validate", report["time"])
    assert run["attributes"]["hosts"] == [report["host"]]
    names = {s_id: key for s_id, key in store.series_ids().items()}
    series = {s.key: s for s in store.all_series()}
    measured = {(f["probe"], f["device"]): f["value"] for f in report["probes"]}
    assert measured
    stored = {
        (point.metric, series[names[point.series_id]].name): point.value
        for metric in {probe for probe, _ in measured}
        for point in store.points(metric)
    }
    assert stored == {(p, f"{report['host']} {d}"): v for (p, d), v in measured.items()}
    store.close()


@pytest.mark.slow
def test_a_hanging_smoke_test_fails_within_the_timeout_and_leaves_no_workers(monkeypatch, tmp_path):
    monkeypatch.setenv(HANG_ENV, str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the log it keeps goes here
    started = time.monotonic()
    result = CliRunner().invoke(
        app, ["validate", "--json", "--timeout", str(HANG_TIMEOUT_S), "-o", str(tmp_path)]
    )
    wall = time.monotonic() - started
    smoke = checks_of(json.loads(result.stdout))["All-reduce smoke test"]
    assert result.exit_code == 1
    assert smoke["status"] == "FAIL"
    assert smoke["value"] == (
        f"hung: no result after {HANG_TIMEOUT_S} s; all 2 worker processes were killed"
    )
    log = Path(smoke["fix"].split("Log: ")[1])
    assert "NCCL_DEBUG=INFO" in smoke["fix"] and log.parent.parent == tmp_path and log.exists()
    assert HANG_TIMEOUT_S <= smoke["details"]["launch_s"] < wall
    pids = [int(p.read_text()) for p in sorted(tmp_path.glob("rank*.pid"))]
    assert len(pids) == 2, "both workers must have started and hung"
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert children_left() == []  # no torchrun left either (the session's browser aside)
    assert wall < HANG_TIMEOUT_S + 15  # the timeout plus the kill grace, not a stuck command


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--timeout", "0"],
            "--timeout '0' must be more than zero and at most a year, e.g. 60, 90s or 2min",
        ),
        (
            ["--timeout", "-5"],
            "--timeout '-5' is not a duration: write it like 60, 90s or 2min (a bare number is seconds)",
        ),
    ],
)
def test_bad_usage_is_one_line_and_exit_code_2(args, message):
    result = CliRunner().invoke(app, ["validate", "--json", *args])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.strip() == f"Error: {message}"


def test_output_dir_that_is_a_file_is_bad_usage(tmp_path):
    path = tmp_path / "results"
    path.write_text("not a directory")
    result = CliRunner().invoke(app, ["validate", "--output-dir", str(path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"Error: --output-dir {path} is a file: give a directory"


def test_gpu_node_with_a_fault_fails_and_prints_the_topology(monkeypatch, tmp_path):
    """The H100 thermal recording through the whole command (no launch: --skip-smoke)."""
    data = json.loads((DATA / "h100_thermal.json").read_text())
    monkeypatch.setitem(sys.modules, "pynvml", load(data))
    out = tmp_path / "results"
    result = CliRunner().invoke(app, ["validate", "--json", "--skip-smoke", "-o", str(out)])
    checks = checks_of(json.loads(result.stdout))
    assert result.exit_code == 1
    assert not out.exists()  # level 1 checks the output dir's disk, it writes nothing there
    assert checks["Clock throttling"]["status"] == "FAIL"
    assert checks["All-reduce smoke test"]["status"] == "SKIP"
    # NVML sees 8 GPUs that this CPU-only torch cannot use: that is a failure too.
    assert checks["CUDA"]["value"] == "torch cannot use the 8 GPUs NVML sees"
    assert "GPU topology" in result.stderr and result.stderr.count("NV18") >= 56
    assert "not ready: fix the FAIL rows first" in result.stderr


def test_help_does_not_import_torch():
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from torchscale.cli.app import app\n"
        "r = CliRunner().invoke(app, ['validate', '--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print('torch' in sys.modules, 'pynvml' in sys.modules)\n"
        "print(r.stdout)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    ).stdout
    assert out.splitlines()[0] == "False False"
    for option in ("--json", "--skip-smoke", "--timeout", "--output-dir", "--level", "--fleet"):
        assert option in out


@pytest.mark.slow
def test_cancelling_the_smoke_test_kills_its_launch_at_once(monkeypatch, tmp_path):
    """What Ctrl-C in validate's main thread does to the smoke test running in its thread."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cancel = threading.Event()
    cancel.set()
    started = time.monotonic()
    with pytest.raises(SmokeCancelled):
        run_smoke_test(gpus=0, timeout_s=60, cancel=cancel)
    assert time.monotonic() - started < 10
    assert list(tmp_path.iterdir()) == []  # its work directory is gone too
    assert children_left() == []  # the session's browser aside
