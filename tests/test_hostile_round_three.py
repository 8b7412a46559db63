"""The minor cases of the third hostile round: stdout that cannot be written, a process bound to
fewer CPUs than the host has, validate's durations, a fleet node left alone, traces whose events
are damaged or overlap, a diff of two unrelated jobs, and compare on extreme or foreign records.
All in process or one short subprocess each; no torchrun launch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
from typer.testing import CliRunner

from tests.support.profile_helpers import DATA, real_traces_dir
from torchscale.cli.app import app
from torchscale.config.validate_section import SECONDS_RANGE, ValidateSection
from torchscale.errors import TorchscaleError
from torchscale.profiling.analysis import analyze, to_document
from torchscale.results.layout import FINDINGS_FILE

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
COMPARE = DATA / "compare_unchanged"


def _torchscale(args: List[str], stdout: Any, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "torchscale", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


FULL_STDOUT = (
    "Error: cannot write to stdout: No space left on device (ENOSPC); the output is "
    "incomplete: send it to a file or pipe that can take it"
)
no_dev_full = pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")


@no_dev_full
@pytest.mark.parametrize(
    "args",
    [
        ["compare", str(COMPARE / "before/cpu_smoke"), str(COMPARE / "after/cpu_smoke"), "--json"],
        ["benchmark", "-c", "cfg.yaml", "--dry-run", "--json"],
    ],
    ids=["compare", "benchmark-dry-run"],
)
def test_json_to_a_full_stdout_is_one_line_exit_2(tmp_path: Path, args: List[str]) -> None:
    """A real process with ``> /dev/full``: one line, exit 2, and nothing more from Python's
    own flush of stdout at exit."""
    (tmp_path / "cfg.yaml").write_text(
        "experiment_name: full\nmodels: [resnet-tiny]\nbatch_sizes: [8]\ngpu_counts: [1]\n"
    )
    with open("/dev/full", "w") as full:
        done = _torchscale(args, full, tmp_path)
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert done.returncode == 2, done.stderr[-2000:]
    assert errors == [FULL_STDOUT]
    assert "a bug in torchscale" not in done.stderr and "Traceback" not in done.stderr
    assert "Exception ignored" not in done.stderr  # Python's own flush at exit is quiet


@no_dev_full
def test_validate_json_to_a_full_stdout_is_one_line_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """validate's --json into /dev/full, in process (its checks run as they do for a user)."""
    with open("/dev/full", "w") as full:
        monkeypatch.setattr(sys, "stdout", full)
        code = app(["validate", "--skip-smoke", "--json"], standalone_mode=False)
        monkeypatch.undo()
    err = capsys.readouterr().err
    assert code == 2
    assert [line for line in err.splitlines() if line.startswith("Error:")] == [FULL_STDOUT]
    assert (
        "a bug in torchscale" not in err and "PASS" in err
    )  # the checks ran; the table is on stderr


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_validate_counts_the_cpus_this_process_may_run_on() -> None:
    """Under ``taskset -c N`` there is one CPU device, measured on that core: not a "CPU 1"
    sharing core N with "CPU 0" and failed against it."""
    from torchscale.hardware.environment import cpu_slots, threads_per_cpu_slot
    from torchscale.validate.device_probes import cpu_probes

    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("this process may run on one CPU only: nothing to restrict")
    core = max(allowed)
    seen: List[set] = []
    os.environ.pop("TORCHSCALE_CPU_SLOTS", None)
    os.sched_setaffinity(0, {core})
    try:
        assert cpu_slots() == 1 and threads_per_cpu_slot() == 1
        run = cpu_probes(
            ValidateSection(window_s=0.02, repeats=1, cpu_copy_mib=4, cpu_gemm_size=64),
            lambda _step: seen.append(os.sched_getaffinity(0)),
        )
    finally:
        os.sched_setaffinity(0, allowed)
    assert {f.device for f in run.figures} == {"CPU 0"} and not run.errors
    assert {f.probe for f in run.figures} >= {"gemm_fp32", "memory_copy"}
    assert seen == [{core}]  # one slot, measured on the one core it may use
    assert cpu_slots() == len(allowed)  # the whole set again once the binding is gone


@pytest.mark.parametrize("key", sorted(SECONDS_RANGE))
@pytest.mark.parametrize("value", ["1e-12", "1e300"])
def test_validate_durations_out_of_range_are_one_config_error(
    tmp_path: Path, key: str, value: str
) -> None:
    low, high = SECONDS_RANGE[key]
    with pytest.raises(ValueError, match=f"must be between {low:g} and {high:g} seconds"):
        ValidateSection.model_validate(
            {key: float(value)}
        )  # before any command: 1e300 would run forever
    config = tmp_path / "v.yaml"
    config.write_text(f"validation:\n  {key}: {value}\n")
    result = runner.invoke(app, ["validate", "--config", str(config), "--level", "2"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        f"Error: invalid config in {config}: validation.{key}: must be between {low:g} and "
        f"{high:g} seconds (got '{value}')"
    )
    ValidateSection.model_validate({key: low})  # both ends are allowed
    ValidateSection.model_validate({key: high})


def test_a_lone_fleet_node_0_names_the_nodes_that_never_joined() -> None:
    from torchscale.validate.fleet import Fleet, FleetMember

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"127.0.0.1:{port}"
    member = FleetMember(nnodes=3, node_rank=0, endpoint=endpoint, join_timeout_s=1.0)
    with pytest.raises(TorchscaleError) as caught:
        Fleet(member, ValidateSection())
    assert str(caught.value) == (
        f"node 0 waited 1 s at {endpoint} and nodes 1, 2 of the fleet of 3 never joined: run "
        f"`torchscale validate --fleet --nnodes 3 --node-rank R --rdzv-endpoint {endpoint}` on "
        "each of them (or give them longer: --join-timeout)"
    )
    assert "could not join" not in str(caught.value)  # node 0 is not the one to blame


# Traces -------------------------------------------------------------------------------------


def _events(path: Path) -> Dict[str, Any]:
    return json.loads(path.read_text())


def _steps(doc: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]


def _write(folder: Path, docs: Dict[str, Dict[str, Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, doc in docs.items():
        (folder / name).write_text(json.dumps(doc))
    return folder


def test_a_memory_event_without_args_is_left_out_and_counted(tmp_path: Path) -> None:
    doc = _events(DATA / "memory_cpu" / "rank0.json")
    memory = [e for e in doc["traceEvents"] if e.get("name") == "[memory]"]
    del memory[0]["args"]
    folder = _write(tmp_path / "t", {"rank0.json": doc})
    result = runner.invoke(app, ["profile", "analyze", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    assert (
        "[WARN] rank 0 (rank0.json): 1 invalid event(s) (1 memory event without its device or "
        "sizes) left out of every figure" in result.stderr
    )
    document = json.loads(result.stdout)
    assert document["traces"][0]["invalid_events"] == {
        "memory event without its device or sizes": 1
    }
    whole = analyze([DATA / "memory_cpu"], "all").tables["memory"]
    left = analyze([folder], "all").tables["memory"]
    assert int(left["events"].sum()) == int(whole["events"].sum()) - 1  # the others all kept


@pytest.mark.parametrize(
    ("dur", "reason"), [(-5.0, "negative duration"), (1e300, "duration over a week")]
)
@pytest.mark.parametrize("damaged", [slice(1, None), slice(None)], ids=["last-two", "all"])
def test_damaged_profiler_steps_are_left_out_naming_the_file(
    tmp_path: Path, dur: float, reason: str, damaged: slice
) -> None:
    """Rank 0's last two steps, or all three, damaged: those events are left out and named
    with their file; the rest of the trace, and the other rank, are still analysed (the last
    valid step, not a damaged one, ends the analysed window)."""
    docs = {f"rank{r}.json": _events(DATA / "gloo_2rank_cpu" / f"rank{r}.json") for r in (0, 1)}
    steps = _steps(docs["rank0.json"])[damaged]
    for step in steps:
        step["dur"] = dur
    folder = _write(tmp_path / "t", docs)
    result = runner.invoke(app, ["profile", "analyze", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    count = len(steps)
    assert f"[WARN] rank 0 (rank0.json): {count} invalid event(s) ({count} {reason})" in (
        result.stderr
    )
    document = json.loads(result.stdout)
    by_rank = {t["rank"]: t for t in document["traces"]}
    assert by_rank[0]["invalid_events"] == {reason: count} and by_rank[1]["invalid_events"] == {}
    assert by_rank[0]["events"] > 400  # the trace's other events all analysed
    ranks = {r["rank"]: r for r in document["ranks"]}
    assert ranks[1]["steps"] == 2 and ranks[1]["step_mean_us"] < 1e6  # rank 1 untouched
    assert ranks[0]["steps"] == 3 - count  # the one valid step is the only one, and analysed
    assert "overflow" not in result.stderr and (folder / FINDINGS_FILE).exists()


def test_overlapping_profiler_steps_are_warned_about_and_flagged(tmp_path: Path) -> None:
    docs = {f"rank{r}.json": _events(DATA / "gloo_2rank_cpu" / f"rank{r}.json") for r in (0, 1)}
    first, second, _ = _steps(docs["rank0.json"])
    first["dur"] = second["ts"] - first["ts"] + second["dur"] / 2  # ends inside step 2
    folder = _write(tmp_path / "t", docs)
    result = analyze([folder], "all")
    document: Any = to_document(result)
    flags = {t["rank"]: t["overlapping_steps"] for t in document["traces"]}
    assert flags == {0: 1, 1: 0}
    assert any(
        w.startswith("rank 0 (rank0.json): 1 profiler step(s) start before the step before")
        for w in document["warnings"]
    )
    clean: Any = to_document(analyze([DATA / "gloo_2rank_cpu"], "all"))
    assert [t["overlapping_steps"] for t in clean["traces"]] == [0, 0]
    assert not any("profiler step" in w for w in clean["warnings"])


def test_profile_diff_of_two_different_jobs_warns_and_flags() -> None:
    two, sixteen = (real_traces_dir() / f"nccl-{n}rank-rank0.json.gz" for n in (2, 16))
    result = runner.invoke(app, ["profile", "diff", str(two), str(sixteen), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["same_job"] is False
    assert document["job_differences"][0] == "world size 2 in OLD, 16 in NEW"
    assert document["job_differences"][1].endswith("% of the time is in kernels both ran")
    assert "[WARN] OLD and NEW look like two different jobs (world size 2 in OLD, 16 in NEW" in (
        result.stderr
    )
    cpu = DATA / "gloo_2rank_cpu" / "rank0.json"
    other = runner.invoke(app, ["profile", "diff", str(cpu), str(two), "--json"])
    differences = json.loads(other.stdout)["job_differences"]
    assert differences[:2] == ["backend gloo in OLD, nccl in NEW", "CPU work in OLD, GPU in NEW"]
    same = runner.invoke(app, ["profile", "diff", str(two), str(two), "--json"])
    assert json.loads(same.stdout)["same_job"] is True
    assert "different jobs" not in same.stderr


# compare ------------------------------------------------------------------------------------


def _copy_runs(tmp_path: Path, edit: Any, single: bool = False) -> List[str]:
    """The recorded unchanged pair, with ``edit`` applied to every record of the new run;
    ``single``: each cell's first repeat only (no repeats to measure the noise from)."""
    folders = []
    for side in ("before", "after"):
        folder = tmp_path / side
        folder.mkdir()
        for file in (COMPARE / side / "cpu_smoke").iterdir():
            text = file.read_text()
            if file.name == "results.jsonl":
                records = [json.loads(line) for line in text.splitlines() if line.strip()]
                records = [r for r in records if not single or r["repeat"] == 0]
                for index, record in enumerate(records):
                    if side == "after":
                        edit(index, record)
                text = "".join(json.dumps(r) + "\n" for r in records)
            (folder / file.name).write_text(text)
        folders.append(str(folder))
    return folders


@pytest.mark.parametrize("cv", [300.0, 1e6, 1e300])
def test_compare_never_crashes_on_an_extreme_step_time_cv(tmp_path: Path, cv: float) -> None:
    def extreme(index: int, record: Dict[str, Any]) -> None:
        if index == 0:
            record["step_time_ms"]["cv"] = cv

    old, new = _copy_runs(tmp_path, extreme, single=True)  # judged by the default floor
    result = runner.invoke(app, ["compare", old, new, "--json"])
    assert result.exit_code in (0, 1), result.output  # a verdict, never a crash (3)
    document = json.loads(result.stdout, parse_constant=lambda c: pytest.fail(c))
    (cell,) = [c for c in document["cells"] if (c["model"], c["world_size"]) == ("resnet-tiny", 1)]
    if cv > 1e15:  # past any step list's reach: an impossible figure (results/validity.py)
        assert cell["verdict"] == "invalid" and result.exit_code == 1
        return
    assert cell["verdict"] != "regression"  # nothing can be told beyond that noise
    assert cell["throughput_change_pct"] == pytest.approx(
        100 * (cell["throughput_new"] / cell["throughput_old"] - 1)
    )  # the figure itself is still compared
    high = cell["throughput_ci_high_pct"]  # past a float's range: null (strict JSON), not NaN
    assert high is None or high > 1e6


def test_compare_refuses_records_of_another_device_unless_asked(tmp_path: Path) -> None:
    def on_h100(_index: int, record: Dict[str, Any]) -> None:
        record.update(device_name="NVIDIA H100 80GB HBM3", backend="nccl")

    old, new = _copy_runs(tmp_path, on_h100)
    refused = runner.invoke(app, ["compare", old, new, "--json"])
    assert refused.exit_code == 2 and refused.stdout == ""
    assert refused.stderr.strip() == (
        f"Error: {old} and {new} ran on different devices or backends (gpt2-tiny at 1 rank: cpu "
        "(gloo) in OLD, NVIDIA H100 80GB HBM3 (nccl) in NEW; and 3 more cell(s)): the change "
        "would be the hardware's; compare runs of one device, or pass --allow-device-change"
    )
    allowed = runner.invoke(app, ["compare", old, new, "--json", "--allow-device-change"])
    assert allowed.exit_code in (0, 1), allowed.output
    document = json.loads(allowed.stdout)
    assert len(document["device_changes"]) == 4 and len(document["cells"]) == 4
    assert "> [WARN] compared across devices: resnet-tiny at 2 ranks: cpu (gloo) in OLD" in (
        allowed.stderr
    )
    same = runner.invoke(app, ["compare", old, old, "--json"])
    assert same.exit_code == 0 and json.loads(same.stdout)["device_changes"] == []
