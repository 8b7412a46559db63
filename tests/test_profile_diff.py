"""``torchscale profile diff``: a run against itself with a planted slow kernel, HTA's TraceDiff
totals, new and vanished kernels, nsys exports, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from typer.testing import CliRunner

from tests.support.planted_traces import plant_slow_kernel, read
from tests.support.profile_helpers import DATA, load_trace_json, real_traces_dir
from torchscale.cli.app import app
from torchscale.profiling.trace_diff import diff_traces
from torchscale.results.layout import PROFILE_DIFF_FILES

runner = CliRunner()
TRACE = "nccl-2rank-rank0.json.gz"


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("diff")
    (root / "old").mkdir()
    shutil.copy(real_traces_dir() / TRACE, root / "old" / TRACE)
    name, runs = plant_slow_kernel(real_traces_dir() / TRACE, root / "new" / "rank0.json")
    return root, name, runs


def test_a_planted_slow_kernel_is_named_first(planted, tmp_path):
    root, name, runs = planted
    out = tmp_path / "out"
    out.mkdir()
    result = runner.invoke(
        app, ["profile", "diff", str(root / "old"), str(root / "new"), "--json", "-o", str(out)]
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    first = doc["top_changes"][0]
    assert first["name"] == name and first["status"] == "changed" and first["device"] == "gpu"
    assert first["new_count"] == first["old_count"] == runs
    assert first["new_us"] == pytest.approx(3 * first["old_us"], rel=0.01)  # SLOW_FACTOR
    # every other op is unchanged: the planted kernel is the only change of time
    assert all(abs(c["delta_us"]) < 1e-6 for c in doc["top_changes"][1:])
    assert not doc["new"] and not doc["vanished"]
    phases = {p["phase"]: p for p in doc["step_phases"]}
    assert phases["compute"]["delta_us"] > 0  # the slower kernel is compute
    assert "Largest changes" in result.stderr and name[:15] in result.stderr
    for table in PROFILE_DIFF_FILES.values():
        assert (out / table).read_text().count("\n") >= 2


def test_totals_equal_htas_trace_diff(planted):
    root, name, _ = planted
    hta = json.loads((DATA / "hta_reference" / "hta_0.5.0.json").read_text())["trace_diff"]
    assert hta["planted_kernel"] == name
    ops = diff_traces([root / "old"], [root / "new"]).tables["ops"]
    totals = hta["totals"]
    assert ops["old_count"].sum() == pytest.approx(totals["control_counts"], rel=0.01)
    assert ops["new_count"].sum() == pytest.approx(totals["test_counts"], rel=0.01)
    assert ops["old_us"].sum() == pytest.approx(totals["control_total_duration"], rel=0.01)
    assert ops["new_us"].sum() == pytest.approx(totals["test_total_duration"], rel=0.01)
    assert ops["delta_us"].sum() == pytest.approx(totals["diff_duration"], rel=0.01)


def test_new_and_vanished_kernels_are_listed(tmp_path):
    doc = read(real_traces_dir() / TRACE)
    renamed = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    old_name = next(
        e["name"]
        for e in doc["traceEvents"]
        if str(e.get("name")).startswith("ncclKernel_AllReduce")
    )
    for event in doc["traceEvents"]:
        if event.get("name") == old_name:
            event["name"] = renamed
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "rank0.json").write_text(json.dumps(doc))
    result = runner.invoke(
        app, ["profile", "diff", str(real_traces_dir() / TRACE), str(tmp_path / "new"), "--json"]
    )
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert renamed in out["new"] and old_name in out["vanished"]
    assert "[DIFF] New kernels (only in NEW): 1" in result.stderr
    assert "[DIFF] Vanished kernels: 1" in result.stderr


def test_nsys_captures_diff_rank_by_rank():
    diff = diff_traces([DATA / "nsys_2rank"], [DATA / "nsys_2rank"])
    assert sorted(diff.new_steps) == [0, 1]
    assert (diff.tables["ops"]["status"] == "same").all()
    assert (diff.tables["steps"]["delta_us"] == 0).all()


def test_step_table_leaves_out_the_last_profiler_step_and_shows_gloo_on_cpu():
    """The per-step means are over the steps ``analyze`` analyses: ProfilerStep#3, the last of
    the gloo capture, is left out. On CPU ranks gloo's collectives are the exposed
    communication: rank 0 waits in them most of each step for rank 1."""
    folder = DATA / "gloo_2rank_cpu"
    result = runner.invoke(app, ["profile", "diff", str(folder), str(folder), "--json"])
    assert result.exit_code == 0, result.stderr
    phases = {(p["rank"], p["phase"]): p for p in json.loads(result.stdout)["step_phases"]}
    for rank in (0, 1):
        events = load_trace_json(folder / f"rank{rank}.json")["traceEvents"]
        steps = sorted((e["ts"], e["dur"]) for e in events if e["name"].startswith("ProfilerStep"))
        assert len(steps) == 3
        analysed = [dur for _, dur in steps[:-1]]
        step = phases[(rank, "step")]
        assert step["old_us"] == step["new_us"] == pytest.approx(sum(analysed) / 2, abs=2)
    assert phases[(0, "exposed_comm")]["old_us"] >= 0.9 * phases[(0, "step")]["old_us"]
    assert "Δ exposed comm" in result.stderr or "Δ comm" in result.stderr


def test_captures_without_a_common_rank_are_one_line_exit_2(tmp_path):
    doc = read(real_traces_dir() / TRACE)
    doc["distributedInfo"] = dict(doc["distributedInfo"], rank=1)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.json").write_text(json.dumps(doc))
    result = runner.invoke(
        app, ["profile", "diff", str(real_traces_dir() / TRACE), str(tmp_path / "other")]
    )
    assert result.exit_code == 2 and "share no rank" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_regressed_cell_traced_in_both_runs_gets_its_diff_command(tmp_path, planted):
    import shlex

    from tests.support.step_records import parts_record as _record
    from torchscale.profiling.diff_links import diff_commands
    from torchscale.results.layout import cell_dir
    from torchscale.results.schema import ProfileInfo, ResultBase

    root, name, _ = planted
    runs: List[List[Tuple[Path, List[ResultBase]]]] = []
    for side, source in (
        ("old run", root / "old" / TRACE),
        ("new run", root / "new" / "rank0.json"),
    ):
        record = _record([(10.0, 100.0, 0.0)])
        record.profile = ProfileInfo(tool="torch", profiled=True, reason="asked", dir="profile")
        folder = cell_dir(tmp_path / side, record.cell_id) / "profile"
        folder.mkdir(parents=True)
        shutil.copy(source, folder / source.name)
        runs.append([(tmp_path / side, [record])])
    cell = runs[0][0][1][0].cell_id
    (line,) = diff_commands(runs[0], runs[1], [(cell, cell)])
    untraced: List[Tuple[Path, List[ResultBase]]] = [
        (tmp_path / "new run", [_record([(10.0, 100.0, 0.0)])])
    ]
    assert diff_commands(runs[0], untraced, [(cell, cell)]) == []
    words = shlex.split(line)  # quoted for a shell: the folder names hold a space
    assert words[:3] == ["torchscale", "profile", "diff"]
    result = runner.invoke(app, [*words[1:], "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["top_changes"][0]["name"] == name


def test_compare_names_the_diff_of_a_regressed_cell_traced_in_both_runs(tmp_path, planted):
    """The link from the gate to the traces: ``compare`` (console and --json) gives the
    ``profile diff`` command of a regressed cell both runs traced, and it runs."""
    import shlex

    from tests.support.report_fixtures import MODELS, FixtureSpec, write_experiment
    from torchscale.results.layout import cell_dir

    root, name, _ = planted
    spec: Dict[str, Any] = dict(findings=False, failures=False, collectives=False)
    model = MODELS[0].name
    old = write_experiment(tmp_path / "old run", FixtureSpec(**spec))
    new = write_experiment(tmp_path / "new run", FixtureSpec(slowdown={model: 1.4}, **spec))
    for folder, trace in ((old, root / "old" / TRACE), (new, root / "new" / "rank0.json")):
        lines = (folder / "results.jsonl").read_text().splitlines()
        docs = [json.loads(line) for line in lines]
        traced = next(d for d in docs if d["model"] == model and d["world_size"] == 8)
        traced["profile"] = {"tool": "torch", "profiled": True, "reason": "asked", "dir": "profile"}
        (folder / "results.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
        traces = cell_dir(folder, traced["cell_id"]) / "profile"
        traces.mkdir(parents=True, exist_ok=True)
        shutil.copy(trace, traces / trace.name)
    result = runner.invoke(app, ["compare", str(old), str(new), "--noise-floor", "2", "--json"])
    assert result.exit_code == 1, result.output
    (command,) = json.loads(result.stdout)["profile_diff_commands"]
    assert f"Both runs traced it: {command}" in result.stderr
    words = shlex.split(command)  # the folders' names hold a space
    diff = runner.invoke(app, [*words[1:], "--json"])
    assert diff.exit_code == 0 and json.loads(diff.stdout)["top_changes"][0]["name"] == name
