"""``--script``: a user's own DDP training script, run unmodified (docs/own-job.md).

The scripts are the examples users would write (``examples/scripts/``: argparse, their own model
and loop, ``init_process_group`` from torchrun's environment, their own samples/s printed) and,
for faults and the bootstrap's other paths (steps at forwards, a given samples-per-step,
``sys.exit``), small scripts in ``tests/support/scripts/``. One shared experiment (the transformer
script on 1 and 2 gloo processes, plus all_reduce cells) serves the benchmark, project and report
checks; the CNN script's slow-rank option is profiled; the many-bucket script is tuned.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
from typer.testing import CliRunner

from tests.support.html_tables import html_tables
from tests.support.own_script_runs import CNN, TUNE_CONFIG
from tests.support.shared_runs import (
    OWN_SCRIPT_BATCH,
    OWN_SCRIPT_WINDOW,
    SCRIPTS,
    SUPPORT_SCRIPTS,
    Run,
)
from torchscale.cli.app import app
from torchscale.results.schema import TrainingResult
from torchscale.results.store import ExperimentStore

pytestmark = pytest.mark.timed  # samples/s against the script's own clock; the slow rank; tune

runner = CliRunner()
PRINTED = re.compile(
    r"\[default0\]:step \d+: loss \S+, ([\d.]+) samples/s .*over steps (\d+)-(\d+)"
)


@pytest.fixture(scope="session")
def own(own_script_run: Run) -> Run:
    return own_script_run


def records(folder: Path) -> List[TrainingResult]:
    found = [r for r in ExperimentStore(folder).records() if isinstance(r, TrainingResult)]
    return sorted(found, key=lambda r: r.world_size)


def printed_rate(folder: Path, record: TrainingResult, first: int, last: int) -> float:
    """The samples/s the script printed itself (rank 0) over steps ``first``..``last``."""
    log = (folder / "cells" / record.cell_id / "launch.log").read_text(encoding="utf-8")
    rates = [float(m[1]) for m in PRINTED.finditer(log) if (int(m[2]), int(m[3])) == (first, last)]
    assert len(rates) == 1, log
    return rates[0]


# --- the shared run: benchmark, scaling, project, report -------------------------------------


@pytest.mark.slow
def test_throughput_matches_what_the_script_prints_over_the_same_steps(own: Run) -> None:
    one, two = records(own.experiment_dir)
    first, last = OWN_SCRIPT_WINDOW + 1, 2 * OWN_SCRIPT_WINDOW  # warm-up, then the window
    for record in (one, two):
        assert record.status == "ok", record.error
        assert record.model == "train_transformer.py" and record.precision == "script"
        assert record.measure_steps == OWN_SCRIPT_WINDOW
        # samples counted from the DDP forward's input, every rank, every measured step
        assert record.batch_size == OWN_SCRIPT_BATCH
        assert record.global_batch_size == OWN_SCRIPT_BATCH * record.world_size
        cell = own.experiment_dir / "cells" / record.cell_id
        ranks = json.loads((cell / "result.json").read_text(encoding="utf-8"))["per_rank"]
        counted = sum(rank["samples"] for rank in ranks)
        assert counted == OWN_SCRIPT_BATCH * record.world_size * OWN_SCRIPT_WINDOW
        own_clock = printed_rate(own.experiment_dir, record, first, last)
        assert record.samples_per_s is not None
        assert abs(record.samples_per_s / own_clock - 1) <= 0.05, (record.samples_per_s, own_clock)
        # the sync probe ran on the script's own DDP, after the window
        assert record.runtime["sync_probe"] == "ran after the measured window"
        assert all(rank.nosync_step_ms for rank in record.per_rank)
        assert record.runtime["ddp"]["bucket_sizes"]
        assert record.runtime["ddp_applied"] == {}  # nothing of the script's DDP call changed


@pytest.mark.slow
def test_the_script_gets_a_scaling_efficiency(own: Run) -> None:
    from torchscale.analysis.training_tables import training_table

    one, two = records(own.experiment_dir)
    assert one.samples_per_s and two.samples_per_s
    table = training_table([one, two]).set_index("world_size")
    expected = two.samples_per_s / (2 * one.samples_per_s)
    assert table.loc[2, "scaling_efficiency"] == pytest.approx(expected)
    assert table.loc[2, "sync_overhead_pct"] is not None
    stderr = own.result.stderr
    assert f"scaling efficiency {expected:.0%} vs 1 CPU process" in stderr
    assert "Running train_transformer.py on 2 CPU processes (your script)" in stderr
    summary = (own.experiment_dir / "summary.csv").read_text(encoding="utf-8")
    assert summary.count("train_transformer.py") == 2
    # the script's own output is in the cell's log, its ranks' files beside it
    log = (own.experiment_dir / "cells" / two.cell_id / "launch.log").read_text(encoding="utf-8")
    assert "[default0]:step 20:" in log


@pytest.mark.slow
def test_project_works_on_a_script_experiment(own: Run) -> None:
    result = runner.invoke(
        app, ["project", "--source", str(own.experiment_dir), "--gpus", "4", "--json"]
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    (row,) = document["predictions"]
    assert row["model"] == "train_transformer.py" and row["world_size"] == 4
    assert row["variant"] == "as scripted"
    assert row["throughput_low"] <= row["throughput"] <= row["throughput_high"]
    assert any("no_sync probe" in line for line in document["basis"])
    assert any("timed through DDP's reducer" in line for line in document["basis"])


@pytest.mark.slow
def test_the_report_shows_the_script(own: Run, tmp_path: Path) -> None:
    report = tmp_path / "r.html"
    built = runner.invoke(app, ["report", "-s", str(own.experiment_dir), "-o", str(report)])
    assert built.exit_code == 0, built.output
    tables = html_tables(report.read_text(encoding="utf-8"))
    rows = [r for rows in tables.values() for r in rows if "train_transformer.py" in r.values()]
    assert rows, sorted(tables)


def plain_torchrun_threads(nproc: int) -> int:
    """The intra-op threads plain ``torchrun --nproc-per-node nproc`` gives a script here,
    observed by running it (torchrun sets OMP_NUM_THREADS=1 only with several processes)."""
    script = SUPPORT_SCRIPTS / "print_threads.py"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={nproc}", str(script)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ran = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert ran.returncode == 0, ran.stderr
    counts = {int(m) for m in re.findall(r"rank \d+ threads (\d+)", ran.stdout)}
    assert len(counts) == 1, ran.stdout
    return counts.pop()


@pytest.mark.slow
def test_the_script_keeps_the_threads_plain_torchrun_gives_it(own: Run) -> None:
    """On CPU, --script runs each rank with what plain torchrun gives the script, and the record
    and the console say it."""
    said = " ".join(own.result.stderr.split())
    for record in records(own.experiment_dir):
        plain = plain_torchrun_threads(record.world_size)
        assert record.runtime["intra_op_threads"] == plain, record.world_size
        assert f"Your script ran {plain} intra-op thread(s) per rank" in said
    # Said before the cells run, with the reason: torchrun's own rule for 2 processes.
    assert (
        "Threads, 2 process(es) per node: 1 intra-op thread(s) per rank, what plain torchrun "
        "gives your script (torchrun sets OMP_NUM_THREADS=1 with 2 processes per node)"
    ) in said
    assert "Threads, 1 process(es) per node:" in said and "--threads N sets it" in said


def test_threads_given_are_the_scripts_and_said(tmp_path: Path) -> None:
    """``--threads N`` reaches every rank (script.threads, torch.set_num_threads before the
    script starts) and the console's line; the launch leaves the script's OMP_NUM_THREADS alone,
    where a built-in model's CPU ranks get their slot's share."""
    import torch

    from torchscale.app.own_script import ScriptOptions, script_config
    from torchscale.launch.cpu_threads import cell_env, threads_lines
    from torchscale.plan.matrix import expand
    from torchscale.script.wrap import apply_process_settings

    options = ScriptOptions(str(CNN), gpus=[2], threads=3)
    plan = expand(script_config(options, None))
    (cell,) = plan.cells
    assert cell.settings.threads == 3  # type: ignore[attr-defined]
    assert "OMP_NUM_THREADS" not in cell_env(cell, {}, "cpu")
    (line,) = threads_lines(plan.cells, "cpu", lambda: 2)
    assert line == (
        "Threads, 2 process(es) per node: 3 intra-op thread(s) per rank, as --threads "
        "(script.threads) sets"
    )
    before = torch.get_num_threads()
    try:
        assert apply_process_settings(cell.settings)["threads"] == 3  # type: ignore[arg-type]
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
    assert threads_lines(plan.cells, "cuda", lambda: 2) == []
    shown = runner.invoke(app, ["benchmark", "--threads", "2", "-c", str(tmp_path / "x.yaml")])
    assert shown.exit_code == 2 and "--threads goes with --script" in shown.output


# --- profile: the slow rank is named ----------------------------------------------------------


@pytest.mark.slow
def test_profile_names_the_slow_rank_of_the_script(tmp_path: Path) -> None:
    args = ["profile", "--script", str(CNN), "--gpus", "2", "--duration", "2s", "-o", str(tmp_path)]
    args += ["--json", "--set", "warmup_steps=1", "--set", "measure_steps=4"]
    # Without the per-forward buffer broadcast, the only collective is the gradient all-reduce,
    # as in tests/test_profile_capture.py: what rank 0 waits for is rank 1's sleep.
    args += ["--set", "sync_probe_steps=2", "--set", "script.ddp.broadcast_buffers=false"]
    # DataLoader worker processes (started again each epoch) end cleanly after the trace
    args += ["--", "--steps", "200", "--slow-rank", "1", "--slow-ms", "300", "--workers", "2"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    stragglers = [f for f in document["findings"] if f["category"] == "straggler"]
    assert len(stragglers) == 1 and stragglers[0]["ranks"] == [1]
    (folder,) = tmp_path.glob("profile-train_cnn-g2-*")
    (record,) = records(folder)
    assert record.sync is not None and record.sync.slowest_rank == 1
    assert record.profile is not None and record.profile.profiled
    assert record.runtime["ddp_applied"] == {"forward_sync_buffers": False} or record.runtime[
        "ddp_applied"
    ] == {"broadcast_buffers": False}


def test_profile_script_names_its_run_for_the_benchmarks_experiment() -> None:
    """``profile --script`` names its run for the experiment ``benchmark --script`` writes (the
    config's experiment_name, else its file name, else the script's), so a report of it finds
    the profile beside it."""
    from torchscale.app.own_script import ScriptOptions, script_raw
    from torchscale.app.profile import CaptureRequest, capture_config
    from torchscale.results.layout import is_profile_run_of

    options = ScriptOptions(str(CNN))
    traced = capture_config(CaptureRequest(2, 5.0, "sync_stalls", "torch", script=options))
    benchmark = str(script_raw(options, None)["experiment_name"])
    assert benchmark == "train_cnn"
    assert is_profile_run_of(traced.experiment_name, benchmark)
    assert not is_profile_run_of(traced.experiment_name, "train")


PROFILED_CONFIG = """\
experiment_name: own-script
warmup_steps: 2
measure_steps: 4
sync_probe_steps: 2
cell_timeout_s: 240
"""


@pytest.mark.slow
def test_profile_script_into_the_benchmarks_folder_is_in_its_report_cut_short(
    own: Run, tmp_path: Path
) -> None:
    """``profile --script -o DIR`` beside ``DIR/<experiment>`` of ``benchmark --script``: the
    report of that one folder shows the profile. The script ends inside its traced window (a
    30 s window, a script of 24 steps): the steps it traced are analysed, with a note."""
    import shutil

    from torchscale.measures.figures import SYNC_STALL
    from torchscale.report import formatting as fmt

    results = tmp_path / "results"
    shutil.copytree(own.experiment_dir, results / own.experiment_dir.name)
    config = tmp_path / "own-script.yaml"
    config.write_text(PROFILED_CONFIG, encoding="utf-8")
    script = SCRIPTS / "train_transformer.py"
    args = ["profile", "--script", str(script), "-c", str(config), "--gpus", "2"]
    args += ["--duration", "30s", "-o", str(results), "--json", "--"]
    args += ["--steps", "24", "--log-every", "100", "--batch-size", str(OWN_SCRIPT_BATCH)]
    profiled = runner.invoke(app, args)
    assert profiled.exit_code == 0, profiled.output
    (run,) = results.glob("profile-own-script-g2-*")
    (record,) = records(run)
    assert record.profile is not None and record.profile.profiled
    note = record.profile.note or ""
    match = re.fullmatch(
        r"the script ended (\d+) step\(s\) into its traced window of (\d+) \(after 1 warm-up "
        r"step\): analysed on the (\d+) step\(s\) captured",
        note,
    )
    assert match, note
    seen, window, captured = (int(g) for g in match.groups())
    assert seen < window and captured == seen - 1 == record.profile.steps and captured >= 2
    said = " ".join(profiled.stderr.split())
    assert f"> [ANALYSIS] Note: {note}." in said and "not profiled" not in said
    document = json.loads(profiled.stdout)
    assert document["sync_stall_pct"] is not None
    assert all(rank["steps"] == captured for rank in document["ranks"])
    out = tmp_path / "report.html"
    built = runner.invoke(
        app, ["report", "--source", str(results / own.experiment_dir.name), "-o", str(out)]
    )
    assert built.exit_code == 0, built.output
    tables = html_tables(out.read_text(encoding="utf-8"))
    (row,) = [r for r in tables["profile-table"] if r["Traced by"].startswith("torchscale profile")]
    assert row[f"{SYNC_STALL.title} %"] == fmt.percent(document["sync_stall_pct"])


# --- faults: recorded failures, not hangs -----------------------------------------------------


@pytest.fixture(scope="module")
def faulty(own_script_faults: Dict[str, Any]) -> Dict[str, Any]:
    """The module's failure runs, made in the session's lanes (tests/support/own_script_runs.py
    says why sharing the cores cannot change what is read of them); by name, each one's value."""
    return own_script_faults


@pytest.mark.slow
def test_a_script_that_ends_before_the_window_is_a_recorded_failure(
    faulty: Dict[str, Any],
) -> None:
    result, folder = faulty["ends_early"].value()
    assert result.returncode == 1, result.stderr
    (record,) = records(folder)
    assert record.status == "failed"
    assert record.error is not None
    assert "rank 0 on" in record.error and "the script ended after 3 step(s)" in record.error
    assert "warm-up 10 + measured 50" in record.error  # what it would have needed
    assert record.wall_s is not None and record.wall_s < 120  # ended, not timed out


@pytest.mark.slow
def test_a_script_that_raises_on_one_rank_is_a_recorded_failure(faulty: Dict[str, Any]) -> None:
    result, folder = faulty["raises"].value()
    assert result.returncode == 1, result.stderr
    (record,) = records(folder)
    assert record.status == "failed" and record.error is not None
    assert record.error.startswith("rank 1 on ")
    assert "RuntimeError: injected failure on rank 1 at step 2" in record.error
    assert record.wall_s is not None and record.wall_s < 120


@pytest.fixture(scope="module")
def wrapped(faulty: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Five single ranks of script cells that each end in a bootstrap error (run at once, in a
    lane): by name, each one's error file."""
    return faulty["wrapped"].value()


@pytest.mark.slow
def test_a_script_without_ddp_or_with_two_is_told_why(wrapped: Dict[str, Dict[str, Any]]) -> None:
    no_ddp = wrapped["no_ddp"]
    assert no_ddp["type"] == "NotMeasurable" and no_ddp["phase"] == "warmup"
    assert "built no DistributedDataParallel model" in no_ddp["message"]
    assert "--samples-per-step" in no_ddp["message"]
    two = wrapped["two_ddp"]
    assert two["type"] == "NotMeasurable"
    assert "built a second DistributedDataParallel model" in two["message"]


@pytest.mark.slow
def test_steps_at_forwards_with_the_samples_per_step_given(faulty: Dict[str, Any]) -> None:
    """``--step-at forward`` marks a step at each DDP forward of a script without torch.optim,
    and ``--samples-per-step`` stands for a batch torchscale cannot count: each rank's samples
    are exactly the given count times the measured steps."""
    result, folder = faulty["steps_at"].value()
    assert result.returncode == 0, result.stderr
    (record,) = records(folder)
    assert record.status == "ok", record.error
    assert record.runtime["step_at"] == "forward"
    assert record.runtime["samples_per_step"] == "given: samples_per_step"
    assert (record.batch_size, record.global_batch_size) == (12, 24)  # not the script's 5
    cell = folder / "cells" / record.cell_id
    ranks = json.loads((cell / "result.json").read_text(encoding="utf-8"))["per_rank"]
    assert [rank["samples"] for rank in ranks] == [12 * 4, 12 * 4]
    assert [len(rank.step_times_ms) for rank in record.per_rank] == [4, 4]
    # the probe switched sync off on forward-marked steps too
    assert record.runtime["sync_probe"] == "ran after the measured window"
    assert all(rank.nosync_step_ms for rank in record.per_rank)


@pytest.mark.slow
def test_sys_exit_mid_window_and_a_script_without_torch_optim_are_told_why(
    wrapped: Dict[str, Dict[str, Any]],
) -> None:
    """A non-zero ``sys.exit`` in the measured window is the rank's recorded error, not a hang;
    a script without torch.optim, stepped at optimizer steps, is told to pass --step-at."""
    exited = wrapped["exited"]  # forward 4: the second measured step
    assert exited["type"] == "ScriptExited" and exited["phase"] == "measure"
    assert exited["message"] == "the script exited with code 3"
    unmarked = wrapped["unmarked"]  # steps at optimizer steps: none
    assert unmarked["type"] == "NotMeasurable"
    assert "never stepped a torch.optim optimizer" in unmarked["message"]
    assert "pass --step-at forward" in unmarked["message"]
    # sys.exit(0) before any step (DDP built, no forward yet): named as such, no --step-at
    quit_early = wrapped["quit_early"]
    assert quit_early["type"] == "NotMeasurable"
    assert quit_early["message"].startswith("the script ended after 0 step(s), in the warmup")
    assert "--step-at" not in quit_early["message"]


def test_warmup_and_iters_count_the_scripts_steps() -> None:
    """``--warmup``/``--iters`` with ``--script`` are the script's warm-up and measured steps
    (the planned cell's), and ``--iters`` with ``--steps`` is refused with one line."""
    args = ["benchmark", "--script", str(CNN), "--gpus", "1", "--dry-run", "--json"]
    planned = runner.invoke(app, [*args, "--warmup", "3", "--iters", "7"])
    assert planned.exit_code == 0, planned.output
    (cell,) = json.loads(planned.stdout)
    assert (cell["settings"]["warmup_steps"], cell["settings"]["measure_steps"]) == (3, 7)
    both = runner.invoke(app, [*args, "--steps", "4", "--iters", "7"])
    assert both.exit_code == 2
    assert both.output.strip().splitlines() == [
        "Error: --steps 4 and --iters 7 both set the measured steps of the script: give one of them"
    ]


# --- tune: the script's own DDP, searched ------------------------------------------------------


@pytest.mark.slow
def test_tune_searches_the_scripts_own_ddp_and_writes_a_runnable_best_yaml(
    tmp_path: Path,
) -> None:
    config = tmp_path / "buckets.yaml"
    config.write_text(TUNE_CONFIG)
    script = SCRIPTS / "train_many_buckets.py"
    args = ["tune", "--script", str(script), "--gpus", "2", "-c", str(config)]
    args += ["-o", str(tmp_path / "out"), "--json", "--noise-floor", "0"]  # judged even if busy
    args += ["--", "--bucket-cap-mb", "1", "--steps", "200"]
    args += ["--workers", "1"]  # its batches through a DataLoader worker process
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    folder = tmp_path / "out" / "buckets" / "tune"
    # every candidate ran the script with its DDP argument in place of the script's own 1 MB
    trials = records(folder)
    applied = sorted(
        (r.runtime["ddp_applied"] for r in trials), key=lambda a: a.get("bucket_cap_mb", 0)
    )
    assert applied == [{}, {"bucket_cap_mb": 100}]
    for trial in trials:
        expected = trial.runtime["ddp_applied"].get("bucket_cap_mb", 1)
        assert trial.runtime["ddp"]["bucket_cap_bytes"] == expected * 1024 * 1024
    # the verdict paired the finalist with the script's own setting, and said what it found
    assert summary["model"] == "train_many_buckets.py"
    assert summary["result"] in ("gain", "no significant gain"), summary["line"]
    (finalist,) = summary["verdict"]["finalists"]
    assert finalist["params"] == {"ddp.bucket_cap_mb": 100} and finalist["gain_pct"] is not None
    if summary["result"] == "gain":  # the lines to paste, printed and in ddp.py
        assert "    bucket_cap_mb=100," in result.stderr.splitlines()
        assert "    bucket_cap_mb=100,\n" in (folder / "ddp.py").read_text()
    # best.yaml and baseline.yaml are benchmark configs of the script: each plans its one cell,
    # with the winner's DDP argument or the script's own
    for name, mb in (("best", 100 if summary["result"] == "gain" else None), ("baseline", None)):
        dry = runner.invoke(app, ["benchmark", "-c", str(folder / f"{name}.yaml"), "--dry-run"])
        assert dry.exit_code == 0, dry.output
        assert "train_many_buckets.py" in dry.stderr
        text = (folder / f"{name}.yaml").read_text()
        assert ("bucket_cap_mb: 100" in text) == (mb == 100), text


@pytest.mark.slow
def test_tune_of_a_script_whose_trials_all_fail_prints_its_summary(
    faulty: Dict[str, Any],
) -> None:
    """A script torchscale cannot measure (no DDP model, no --samples-per-step): every trial
    fails, and tune still prints its line and its --json document, with the trials' causes,
    and exits 1 (nothing measured), writing no ddp.py."""
    result, out = faulty["tune_fails"].value()
    assert result.returncode == 1, result.stderr
    summary = json.loads(result.stdout)
    assert summary["result"] == "nothing measured"
    assert summary["line"] in result.stderr and "nothing measured" in summary["line"]
    assert "built no DistributedDataParallel model" in summary["line"]
    errors = [t.get("error") or "" for t in summary["trials"]]
    assert errors and all("built no DistributedDataParallel model" in e for e in errors)
    folder = out / "nothing" / "tune"
    assert not (folder / "ddp.py").exists() and (folder / "tune.json").exists()
