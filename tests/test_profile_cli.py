"""``torchscale profile`` and ``torchscale profile analyze`` through the real CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import List

import pytest
from typer.testing import CliRunner

from tests.support.profile_helpers import DATA, hta_reference, real_traces_dir
from tests.support.step_records import busy_host_ranks
from torchscale.cli.app import app
from torchscale.config.durations import parse_duration
from torchscale.measures.figures import SYNC_STALL
from torchscale.profiling.trace_tables import table_files
from torchscale.results.layout import FINDINGS_FILE
from torchscale.results.schema import ProfileInfo, TrainingResult

runner = CliRunner()


def test_analyze_json_document_matches_hta_and_writes_outputs(tmp_path):
    name = "nccl-2rank-rank0.json.gz"
    ref = hta_reference()[name]
    result = runner.invoke(
        app,
        [
            "profile",
            "analyze",
            str(real_traces_dir() / name),
            "--json",
            "--output-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)  # exactly one JSON document on stdout
    [rank] = doc["ranks"]
    for key in ("idle_pct", "compute_pct", "non_compute_pct", "overlap_pct"):
        assert abs(rank[key] - ref[key]) <= 0.5
    assert rank["rank"] == 0 and rank["sync_stall_pct"] is None  # one rank: no peer to wait for
    assert isinstance(doc["findings"], list) and doc["findings"]
    assert "[ANALYSIS] Found" in result.stderr and "[ANALYSIS]" not in result.stdout
    written = json.loads((tmp_path / FINDINGS_FILE).read_text())
    assert written["ranks"] == doc["ranks"] and written["findings"] == doc["findings"]
    for key, table in table_files().items():  # the trace has no memory events: header only
        assert (tmp_path / table).read_text().count("\n") >= (1 if key.startswith("memory") else 2)


def test_analyze_table_output_names_straggler(tmp_path):
    folder = tmp_path / "traces"
    shutil.copytree(DATA / "nsys_2rank", folder)
    result = runner.invoke(app, ["profile", "analyze", str(folder), "--target", "sync_stalls"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    err = result.stderr
    assert "Per-rank breakdown" in err and "sync stall time %" in err
    # The glossary's name for the figure (sync stall time, the seed's), as the report says it.
    doc = json.loads((folder / FINDINGS_FILE).read_text())
    headline = f"[ANALYSIS] {SYNC_STALL.title}: {doc['sync_stall_pct']:.1f}% (mean over 2 ranks;"
    assert headline in err and "worst rank 0" in err and "[ANALYSIS] Sync stall time: " in err
    assert "Found 2 bottleneck(s):" in err
    assert "1. NCCL AllReduce: GPU-1 arrives last" in err and "nvidia-smi -q -d PERFORMANCE" in err
    assert "high variance in sync time" in err
    assert (folder / FINDINGS_FILE).exists()  # beside the traces by default
    assert doc["findings"][0]["ranks"] == [1] and doc["findings"][0]["category"] == "straggler"
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]


def test_one_ranks_trace_has_no_sync_stall_and_says_so_as_the_glossary_does(tmp_path):
    folder = tmp_path / "one"
    folder.mkdir()
    shutil.copy(DATA / "gloo_2rank_cpu" / "rank0.json", folder)
    result = runner.invoke(app, ["profile", "analyze", str(folder)])
    assert result.exit_code == 0, result.stderr
    line = f"> [ANALYSIS] {SYNC_STALL.title}: – (needs traces from at least 2 ranks)"
    assert line in result.stderr.splitlines() and "n/a" not in result.stderr
    assert json.loads((folder / FINDINGS_FILE).read_text())["sync_stall_pct"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["profile", "analyze", "/nonexistent/traces"], "no such file or folder"),
        (["profile", "analyze", "EMPTY"], "no traces found"),
        (["profile", "analyze", "BAD"], "cannot read trace"),
        (["profile", "analyze", "README"], "not a trace"),
        (["profile", "analyze", "JUNK_SQLITE"], "not a readable nsys SQLite export"),
        (["profile", "analyze", "NSYS", "--target", "gpu"], "--target 'gpu' is not one of"),
        (["profile", "--duration", "3x"], "--duration '3x' is not a duration"),
        (["profile", "--tool", "perf"], "--tool 'perf' is not one of"),
        (["profile", "--config", "c.yaml", "--model", "resnet50"], "either --config or --model"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rank0.json").write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1,')
    (tmp_path / "README.md").write_text("hello")
    (tmp_path / "rank0.sqlite").write_bytes(b"not a database, just bytes" * 100)
    subst = {
        "EMPTY": str(tmp_path / "empty"),
        "BAD": str(bad),
        "README": str(tmp_path / "README.md"),
        "NSYS": str(DATA / "nsys_2rank"),
        "JUNK_SQLITE": str(tmp_path / "rank0.sqlite"),
    }
    result = runner.invoke(app, [subst.get(a, a) for a in args])
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr
    assert not list(bad.glob("*.csv")) and not (bad / FINDINGS_FILE).exists()


def test_unwritable_output_dir_is_one_line_exit_2(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    result = runner.invoke(
        app, ["profile", "analyze", str(DATA / "nsys_2rank"), "--output-dir", str(blocker / "out")]
    )
    assert result.exit_code == 2 and "is not writable" in result.stderr
    assert "--output-dir" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_capture_builds_the_benchmark_it_runs(tmp_path):
    """What a capture would run, for each form of the options (no launch: see
    test_profile_capture.py for real captures)."""
    from datetime import datetime

    from torchscale.app.profile import CaptureRequest, capture_config
    from torchscale.config.loader import parse_overrides

    when = datetime(2026, 11, 22, 3, 4, 5)
    for text, seconds in (("30", 30.0), ("30s", 30.0), ("2m", 120.0)):
        request = CaptureRequest(
            gpus=4, duration_s=parse_duration(text, "--duration"), target="communication", tool="torch",
            model="resnet50", batch_size=32, overrides=parse_overrides(["precision=bf16"]),
        )  # fmt: skip
        config = capture_config(request, now=when)
        assert config.experiment_name == "profile-resnet50-g4-20261122-030405"
        assert config.models == ["resnet50"] and config.batch_sizes == [32]
        assert config.gpu_counts == [4] and config.precision == ["bf16"]
        profiling = config.profiling
        assert profiling.enabled and profiling.trigger == "always" and profiling.tool == "torch"
        assert profiling.target == "communication" and profiling.duration_s == seconds

    yaml_config = tmp_path / "exp.yaml"
    yaml_config.write_text("experiment_name: mine\nmodels: [gpt2]\nbatch_sizes: [8, 16]\n")
    request = CaptureRequest(gpus=2, duration_s=10, target="all", tool="auto", config=yaml_config)
    config = capture_config(request, now=when)
    assert config.experiment_name == "profile-mine-g2-20261122-030405"
    assert config.batch_sizes == [8, 16] and config.gpu_counts == [2]

    for args, message in (
        (["--model", "gpt2"], "--model gpt2 needs --batch-size"),
        (["--config", str(yaml_config), "--model", "gpt2"], "not both"),
        (["--model", "gpt2", "--batch-size", "8", "--set", "precison=bf16"], "did you mean"),
    ):
        result = runner.invoke(app, ["profile", *args, "-o", str(tmp_path / "out")])
        assert result.exit_code == 2, result.output
        assert message in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()
    help_text = runner.invoke(app, ["profile", "--help"]).stdout
    for option in (
        "--gpus",
        "--duration",
        "--target",
        "--config",
        "--model",
        "--batch-size",
        "--tool",
        "--output-dir",
        "--json",
        "--set",
        "analyze",
    ):
        assert option in help_text


def test_folder_search_skips_other_json_files(tmp_path):
    folder = tmp_path / "cell"
    shutil.copytree(DATA / "gloo_2rank_cpu", folder)
    (folder / "cell.json").write_text('{"cell_id": "mlp-b32-g2", "gpus": 2}')
    (folder / "result.json").write_text('{"throughput": 1450.0}')
    result = runner.invoke(app, ["profile", "analyze", str(folder), "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert sorted(Path(t["path"]).name for t in doc["traces"]) == ["rank0.json", "rank1.json"]
    assert doc["findings"][0]["ranks"] == [1]


def test_cpu_traces_say_once_which_columns_they_cannot_have(tmp_path: Path) -> None:
    """gloo traces of CPU processes hold no GPU kernels: HTA's idle, compute, overlap and
    exposed-communication columns are left out and said once, not shown as dashes."""
    folder = tmp_path / "traces"
    shutil.copytree(DATA / "gloo_2rank_cpu", folder)
    result = runner.invoke(app, ["profile", "analyze", str(folder)], terminal_width=200)
    assert result.exit_code == 0, result.stderr
    err = " ".join(result.stderr.split())
    absent = "idle %, compute %, non-compute %, overlap %, exposed comm ms"
    assert err.count(f"> [ANALYSIS] Not in these traces: {absent}: ") == 1
    table = result.stderr[: result.stderr.index("[ANALYSIS]")]
    assert "idle" not in table and "overlap" not in table and "sync stall time %" in table
    assert " - " not in table  # no column of dashes
    # GPU traces keep them.
    gpu = tmp_path / "gpu"
    shutil.copytree(DATA / "nsys_2rank", gpu)  # analyze writes its findings beside the traces
    nsys = runner.invoke(app, ["profile", "analyze", str(gpu)])
    assert "Not in these traces" not in nsys.stderr and "overlap" in nsys.stderr


def test_stall_and_overhead_agree_or_say_why_they_differ() -> None:
    from torchscale.measures.figures import sync_relation

    part = sync_relation(7.6, 39.0)
    assert part.startswith("The sync stall time (7.6%) is the part of it spent waiting")
    larger = sync_relation(14.4, 0.0)
    assert larger.startswith("The sync stall time (14.4%) is larger here, so it is not a part")
    assert "different steps" in larger and "part of it spent" not in larger
    assert "part of it" in sync_relation(None, 5.0)


def _busy_profiled(record: TrainingResult, busy: bool) -> TrainingResult:
    """A recorded cell, traced, as measured on a busy host when ``busy``: each rank waited for a
    CPU 40% of its window while other processes kept one more core busy (what schedstat and
    /proc/stat record beside ranks that share their cores with a spinner)."""
    ranks = busy_host_ranks(record)
    profile = ProfileInfo(tool="torch", profiled=True, reason="traced", dir="profile")
    return record.model_copy(update={"per_rank": ranks if busy else record.per_rank,
                                     "profile": profile})  # fmt: skip


def test_profile_of_a_cell_measured_on_a_busy_host_warns_with_the_evidence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The busy host's one rule reaches profile: a traced cell whose ranks waited for a CPU
    while other processes held the cores gets a WARN with the wait share beside its analysis;
    the same cell measured quietly gets none."""
    from torchscale.analysis.busy_host import BUSY_HOST, wait_words
    from torchscale.app.profile import captured_cell
    from torchscale.cli import profile_command
    from torchscale.results.store import ExperimentStore

    source = DATA / "compare_unchanged" / "before" / "cpu_smoke" / "results.jsonl"
    lines = source.read_text(encoding="utf-8").splitlines()
    record = next(
        r
        for r in (TrainingResult.model_validate_json(x) for x in lines if '"training"' in x)
        if r.world_size == 2 and r.status == "ok"
    )
    store = ExperimentStore(tmp_path / "exp")
    traces = store.cell_dir(record.cell_id) / "profile"
    shutil.copytree(DATA / "nsys_2rank", traces)
    analysed = runner.invoke(app, ["profile", "analyze", str(traces)])
    assert analysed.exit_code == 0, analysed.output
    said: List[str] = []
    monkeypatch.setattr(profile_command, "say", lambda line: said.append(str(line)))
    monkeypatch.setattr(profile_command, "show_result", lambda line: said.append(str(line)))
    warnings = {}
    for busy in (True, False):
        cell = captured_cell(_busy_profiled(record, busy), store)
        assert cell.document is not None, cell
        said.clear()
        assert profile_command._report_capture([cell], json_output=False) == 0
        warnings[busy] = [line for line in said if line.startswith("> [WARN] Measured on a")]
        if busy:
            assert cell.busy_wait == pytest.approx(0.4)
    (line,) = warnings[True]
    assert line.startswith(f"> [WARN] Measured on a {BUSY_HOST} ({wait_words(0.4)}): ")
    assert "rerun on a quiet node before acting on them" in line
    assert warnings[False] == []
