"""``torchscale tune``: real searches on 2 gloo ranks, their verdicts, resume and faults.

Two real tunes, each shared by several tests: an MLP of 32 1 MB layers where DDP's buckets matter
(``examples.custom_model:many_bucket_mlp``; the winner is then confirmed by a separate
``torchscale benchmark`` of best.yaml against the baseline),
and a model where no knob matters, with an OOM in channels_last, interrupted by SIGINT after its
first finished trial and run again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
import yaml
from typer.testing import CliRunner

from tests.support.pdf_pages import needs_poppler, pages_text
from torchscale.cli.app import app
from torchscale.results.schema import TrainingResult
from torchscale.results.store import ExperimentStore

pytestmark = pytest.mark.timed  # tune's verdicts (throughput ratios) and its time budget


@pytest.fixture(autouse=True, scope="module")
def fresh_ranks() -> Iterator[None]:
    """Tune's verdicts compare throughput across separate launches: measured here with every rank
    a fresh interpreter, as on a GPU node, until the launch-to-launch spread of forked ranks is
    measured (best.yaml's confirm gave +6.3% and +9.1%, intervals across zero, in two of five full
    runs with forked ranks, and +46% and +71% alone)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHSCALE_FORK_RANKS", "0")
        yield


ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

MLP_CONFIG = """\
experiment_name: mlp
models: ["examples.custom_model:many_bucket_mlp"]
batch_sizes: [8]
gpu_counts: [2]
warmup_steps: 3
measure_steps: 20
sync_probe_steps: 0
cell_timeout_s: 240
ddp:
  bucket_cap_mb: 1
  gradient_as_bucket_view: false
tune:
  search: [ddp.bucket_cap_mb, ddp.gradient_as_bucket_view]
  space:
    ddp.bucket_cap_mb: [100]
  finalists: 1
  repeats: 3  # rounds: on two shared cores the throughput drifts between rounds
  screen_steps: 6
"""

SLEEPY_CONFIG = """\
experiment_name: sleepy
models: ["tests.support.tune_models:sleepy_conv"]
batch_sizes: [2]
gpu_counts: [2]
warmup_steps: 2
measure_steps: 10
sync_probe_steps: 0
cell_timeout_s: 240
tune:
  search: [channels_last, ddp.gradient_as_bucket_view]
  pruning: false
  finalists: 1
  repeats: 1
  min_gain_pct: 5
"""


def trials_of(folder: Path) -> List[Any]:
    import optuna

    return optuna.load_study(study_name="tune", storage=f"sqlite:///{folder / 'study.db'}").trials


def training(folder: Path) -> List[TrainingResult]:
    return [r for r in ExperimentStore(folder).records() if isinstance(r, TrainingResult)]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    tmp = tmp_path_factory.mktemp("tune-mlp")
    config = tmp / "mlp.yaml"
    config.write_text(MLP_CONFIG)
    result = runner.invoke(
        # A stated floor of 0: the verdict's own interval decides even where other processes
        # hold the cores (the xfail below); the busy-host refusal has its own test.
        app,
        ["tune", "-c", str(config), "-o", str(tmp / "out"), "--trials", "3", "--json",
         "--noise-floor", "0"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    folder = tmp / "out" / "mlp" / "tune"
    # The separate confirmation: best.yaml and the baseline, each a plain benchmark.
    confirm = {}
    for name in ("best", "baseline"):
        run = runner.invoke(
            app, ["benchmark", "-c", str(folder / f"{name}.yaml"), "-o", str(tmp / "confirm")]
        )
        assert run.exit_code == 0, run.output
        (confirm[name],) = training(tmp / "confirm" / f"mlp-{name}")
    summary = json.loads(result.stdout)
    return {"result": result, "summary": summary, "folder": folder, "confirm": confirm}


@pytest.mark.slow
def test_tune_finds_a_gain_that_a_separate_benchmark_confirms(mlp: Dict[str, Any]) -> None:
    from torchscale.analysis.bootstrap import throughput_interval
    from torchscale.analysis.comparison import CompareOptions
    from torchscale.tune.verdict import host_waits

    summary = mlp["summary"]
    print(summary["line"], summary.get("warning"))
    others = summary["verdict"].get("oversubscribed_wait_share")
    if summary["result"] != "gain" and others is not None:
        # Other processes held the cores (measured: run-queue wait and their CPU time): what the
        # verdict measured is them, not DDP's settings. The ranks' own gloo threads do not count.
        pytest.xfail(summary["warning"])
    assert summary["result"] == "gain", summary["line"]
    winner = summary["winner"]
    assert winner["ci_low_pct"] > 0 and winner["gain_pct"] >= 1.0
    assert winner["changed"]  # it differs from bucket_cap_mb 1, views off
    line = summary["line"]
    assert re.match(
        r"> \[TUNE\] \+\d+\.\d% samples/s \(95% CI \+\d+\.\d\.\.\+\d+\.\d%\) with ", line
    )
    assert line in mlp["result"].stderr
    # best.yaml reproduces the winner; a benchmark of it beats the baseline beyond noise.
    best = mlp["confirm"]["best"]
    base = mlp["confirm"]["baseline"]
    for knob, value in winner["params"].items():
        section, name = knob.split(".")
        assert best.settings[section][name] == value
    assert base.settings["ddp"]["bucket_cap_mb"] == 1
    assert base.settings["ddp"]["gradient_as_bucket_view"] is False
    gain, low, high = throughput_interval(
        base.step_times_ms, best.step_times_ms, CompareOptions(resamples=2000)
    )
    told = f"best.yaml {gain:+.1f}% ({low:+.1f}..{high:+.1f}%) vs the baseline"
    waits = host_waits([base, best])
    print(told, waits)
    others = waits["oversubscribed_wait_share"]
    if low <= 0 and others is not None:
        pytest.xfail(f"{told}, while other processes held the cores ({others:.0%} wait)")
    assert low > 0, told


@pytest.mark.slow
def test_every_trial_is_recorded_and_the_screen_prunes(mlp: Dict[str, Any]) -> None:
    folder = mlp["folder"]
    trials = mlp["summary"]["trials"]
    assert trials[0]["role"] == "baseline"
    assert trials[0]["params"] == {
        "ddp.bucket_cap_mb": 1.0,
        "ddp.gradient_as_bucket_view": False,
    }
    screened = {r.cell_id: r for r in training(folder / "screen")}
    full = {r.cell_id: r for r in training(folder)}
    assert all(r.measure_steps == 6 for r in screened.values())
    assert all(r.measure_steps == 20 for r in full.values())
    for trial in trials:
        if trial.get("repeats_trial") is not None:
            continue
        assert trial["screen_cell"] in screened
        if trial["state"] == "complete":  # promoted: measured on the full window
            assert full[trial["full_cell"]].samples_per_s == pytest.approx(trial["samples_per_s"])
        else:
            assert trial["state"] == "pruned" and trial["full_cell"] not in full
    assert {t.number for t in trials_of(folder)} == {t["number"] for t in trials}
    # The verdict re-measured the baseline and the finalist in their own folder.
    verdict = training(folder / mlp["summary"]["verdict"]["folder"])
    assert len(verdict) == 6 and all(r.status == "ok" for r in verdict)  # 3 rounds of 2


@pytest.mark.slow
def test_outputs_paste_into_a_training_script(mlp: Dict[str, Any]) -> None:
    folder = mlp["folder"]
    winner = mlp["summary"]["winner"]
    # No significant gain (a busy host can hide it): the outputs keep the baseline's settings.
    params = winner["params"] if winner else mlp["summary"]["baseline"]
    snippet = (folder / "ddp.py").read_text()
    compile(snippet, "ddp.py", "exec")
    assert f"bucket_cap_mb={params['ddp.bucket_cap_mb']!r}" in snippet
    view = params["ddp.gradient_as_bucket_view"]
    assert f"gradient_as_bucket_view={view!r}" in snippet
    best = yaml.safe_load((folder / "best.yaml").read_text())
    assert best["experiment_name"] == "mlp-best" and "tune" not in best
    assert best["models"] == ["examples.custom_model:many_bucket_mlp"] and best["gpu_counts"] == [2]


@pytest.mark.slow
def test_report_has_a_tuning_section(mlp: Dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    result = runner.invoke(
        app, ["report", "--source", str(mlp["folder"]), "--format", "html", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert 'id="tuning"' in html
    winner = mlp["summary"]["winner"]
    if winner is None:  # the baseline kept: the section says so, with the best candidate's figure
        assert "no significant gain" in html and "keeping the baseline" in html
    else:
        assert f"{winner['gain_pct']:+.1f}%" in html


@pytest.mark.slow
@needs_poppler
def test_the_pdf_report_has_the_tuning_section(mlp: Dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "report.pdf"
    result = runner.invoke(
        app, ["report", "--source", str(mlp["folder"]), "--format", "pdf", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    text = " ".join(" ".join(page.split()) for page in pages_text(out))
    assert "Tuning" in text and "Baseline and finalists, measured again" in text
    assert "Screen samples/s" in text and "95% CI" in text  # the trials' and the verdict's tables
    # The verdict's line opens the section: the gain and its interval, or the baseline kept.
    line = mlp["summary"]["line"].removeprefix("> [TUNE] ")
    assert " ".join(line.split()[:4]) in text


def _complete_trials(study: Path) -> int:
    import sqlite3

    try:
        with sqlite3.connect(f"file:{study}?mode=ro", uri=True, timeout=5) as db:
            return int(
                db.execute("SELECT count(*) FROM trials WHERE state='COMPLETE'").fetchone()[0]
            )
    except sqlite3.Error:
        return 0  # not created yet


def _interrupt_after_first_trial(config: Path, out: Path) -> subprocess.CompletedProcess:
    """The real command in its own process, sent SIGINT once its first trial is recorded."""
    study = out / "sleepy" / "tune" / "study.db"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "torchscale", "tune", "-c", str(config), "-o", str(out)]
    process = subprocess.Popen(
        [*command, "--trials", "4"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Python raises KeyboardInterrupt only where SIGINT was not ignored when it started
        # (as it is for jobs a non-interactive shell puts in the background).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            if study.exists() and _complete_trials(study) >= 1:
                break
            time.sleep(0.2)
        assert process.poll() is None, process.communicate()[1]
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def sleepy(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    tmp = tmp_path_factory.mktemp("tune-sleepy")
    config = tmp / "sleepy.yaml"
    config.write_text(SLEEPY_CONFIG)
    out = tmp / "out"
    folder = out / "sleepy" / "tune"
    interrupted = _interrupt_after_first_trial(config, out)
    before = {t.number: (t.state.name, t.params) for t in trials_of(folder)}
    first = [r.cell_id for r in training(folder)]
    result = runner.invoke(
        app,
        ["tune", "-c", str(config), "-o", str(out), "--trials", "4", "--json",
         "--noise-floor", "0"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return {
        "interrupted": interrupted,
        "before": before,
        "first": first,
        "result": result,
        "summary": json.loads(result.stdout),
        "folder": folder,
    }


@pytest.mark.slow
def test_ctrl_c_then_rerun_resumes_without_repeating_finished_trials(sleepy: Dict) -> None:
    interrupted = sleepy["interrupted"]
    assert interrupted.returncode == 130, interrupted.stderr
    assert "run the same command again to resume" in interrupted.stderr
    before = sleepy["before"]
    assert before[0] == ("COMPLETE", {"channels_last": False, "ddp.gradient_as_bucket_view": False})
    assert len(sleepy["first"]) >= 1
    folder = sleepy["folder"]
    after = trials_of(folder)
    # The same trials carried on (numbers and parameters kept), none asked twice.
    assert [t.number for t in after] == [0, 1, 2, 3]
    for trial in after:
        # (a trial asked but interrupted before its parameters were suggested has none to keep)
        if trial.number in before and before[trial.number][1]:
            assert trial.params == before[trial.number][1]
    assert len({tuple(sorted(t.params.items())) for t in after}) == 4
    ids = [r.cell_id for r in training(folder)]
    assert len(ids) == len(set(ids)) == 4  # trial 0's cell was not run again
    assert ids[: len(sleepy["first"])] == sleepy["first"]


@pytest.mark.slow
def test_an_oom_trial_is_recorded_and_the_search_goes_on(sleepy: Dict) -> None:
    trials = {t["number"]: t for t in sleepy["summary"]["trials"]}
    oom = [t for t in trials.values() if t["params"]["channels_last"]]
    assert len(oom) == 2
    for trial in oom:
        assert trial["state"] == "fail" and trial["status"] == "oom"
        assert "out of memory" in trial["error"].lower()
    records = {r.cell_id: r for r in training(sleepy["folder"])}
    assert {records[t["full_cell"]].status for t in oom} == {"oom"}
    ran = [t for t in trials.values() if not t["params"]["channels_last"]]
    assert all(t["state"] == "complete" for t in ran)


@pytest.mark.slow
def test_no_knob_that_matters_means_no_significant_gain(sleepy: Dict) -> None:
    summary = sleepy["summary"]
    assert summary["result"] == "no significant gain" and summary["winner"] is None
    (finalist,) = summary["verdict"]["finalists"]
    assert finalist["params"] == {"channels_last": False, "ddp.gradient_as_bucket_view": True}
    assert finalist["significant"] is False and finalist["gain_pct"] is not None
    assert "keeping the baseline" in summary["line"]
    assert summary["line"] in sleepy["result"].stderr
    best = yaml.safe_load((sleepy["folder"] / "best.yaml").read_text())
    assert best.get("channels_last", False) is False  # the baseline kept
    assert "gradient_as_bucket_view" not in best.get("ddp", {})


BUSY_CONFIG = """\
experiment_name: busy
models: ["tests.support.fault_models:oversubscribed_model"]
batch_sizes: [8]
gpu_counts: [2]
warmup_steps: 2
measure_steps: 8
sync_probe_steps: 0
cell_timeout_s: 240
tune:
  search: [ddp.bucket_cap_mb]
  space:
    ddp.bucket_cap_mb: [100]
  pruning: false
  finalists: 1
  repeats: 1
"""


@pytest.mark.slow
def test_a_verdict_on_a_busy_host_is_no_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 shares its core with two busy processes the model starts beside it (tests'
    ``oversubscribed_model``): the verdict's figures are the other processes' as much as DDP's,
    so tune says "no verdict: the host was busy", exits 2 and writes no best.yaml."""
    from tests.support.environ import repo_pythonpath
    from torchscale.analysis.cpu_load import oversubscribed_wait

    config = tmp_path / "busy.yaml"
    config.write_text(BUSY_CONFIG)
    monkeypatch.setenv("PYTHONPATH", repo_pythonpath())
    monkeypatch.setenv("TORCHSCALE_TEST_FAULT_RANK", "1")
    out = tmp_path / "out"
    args = ["tune", "-c", str(config), "-o", str(out), "--trials", "2", "--json"]
    result = runner.invoke(app, args)
    folder = out / "busy" / "tune"
    summary = json.loads(result.stdout)
    verdict = training(folder / summary["verdict"]["folder"])
    waited = oversubscribed_wait(verdict)
    assert waited is not None, [r.per_rank for r in verdict]  # the test made the host busy
    assert result.exit_code == 2, result.output
    assert summary["result"] == "busy host" and summary["winner"] is None
    assert summary["verdict"]["oversubscribed_wait_share"] == pytest.approx(waited)
    line = summary["line"]
    assert line.startswith("> [TUNE] no verdict: the host was busy (a rank waited for a CPU ")
    assert f"{waited:.0%} of its window" in line and "--noise-floor" in line
    assert line in " ".join(result.stderr.split()) or line in result.stderr
    (finalist,) = summary["verdict"]["finalists"]
    assert finalist["note"] == "not judged" and finalist["significant"] is False
    assert (folder / "tune.json").exists() and not (folder / "best.yaml").exists()
    assert not (folder / "ddp.py").exists() and summary["files"] == {"study": "study.db"}
    # The report's tuning section says it too: the finalist "not judged", the line as printed.
    html = tmp_path / "tune.html"
    shown = runner.invoke(app, ["report", "-s", str(folder), "-f", "html", "-o", str(html)])
    assert shown.exit_code == 0, shown.output
    text = html.read_text(encoding="utf-8")
    assert "not judged" in text and "no verdict: the host was busy" in text


def test_the_budget_learns_a_launch_and_a_cell_and_shrinks_the_verdict_to_fit() -> None:
    """From a run's own wall times (the first cell holds the launch's start-up), what k cells
    would cost; the verdict keeps the most cells that fit in the time left, else none."""
    from types import SimpleNamespace

    from torchscale.tune.trials import ESTIMATE_MARGIN, CellRunner
    from torchscale.tune.tune_runner import _verdict_shape

    runner = CellRunner(None, None, None)  # type: ignore[arg-type]  # only its arithmetic
    assert runner.estimate(3) is None  # nothing learnt: the first batch teaches it
    walls = [SimpleNamespace(wall_s=w) for w in (12.0, 3.0, 4.0, 3.0)]
    runner._learn(walls, spent=24.0)  # type: ignore[arg-type]
    # slowest cell after the first: 4 s; launch: the first cell's excess over the median cell
    # (12 - 3) and what the sweep spent beyond the cells (24 - 22)
    assert (runner.cell_s, runner.launch_s) == (4.0, 11.0)
    assert runner.estimate(5) == pytest.approx(ESTIMATE_MARGIN * (11.0 + 5 * 4.0))

    def search(left: float) -> Any:  # what _verdict_shape reads of a Search
        return SimpleNamespace(
            verdict_s=lambda k, r: runner.estimate((k + 1) * r), left=lambda: left
        )

    needs = {shape: runner.estimate((shape[0] + 1) * shape[1]) for shape in [(2, 3), (1, 1)]}
    assert _verdict_shape(search(1000), 2, 3) == (2, 3)  # room for what was asked
    # 6 cells fit, not 9: of (1 finalist x 3 rounds) and (2 x 2), the more rounds
    assert _verdict_shape(search(runner.estimate(6) or 0.0), 2, 3) == (1, 3)
    assert _verdict_shape(search((needs[(1, 1)] or 0.0) - 1), 2, 3) is None


def test_the_budget_counts_from_the_command_not_from_an_older_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tune asked for in a process that has run longer than the budget (a test session, a
    notebook, the API) still has its whole budget; the ``torchscale`` command's own process
    counts its start-up (Python, torch, the study) too, as the user's clock does."""
    import psutil

    from torchscale.app.tune import TuneArgs, _request
    from torchscale.cli import console
    from torchscale.tune.tune_runner import Search

    monkeypatch.setattr(psutil.Process, "create_time", lambda self: time.time() - 3600.0)
    config = tmp_path / "mlp.yaml"
    config.write_text(MLP_CONFIG)
    request = _request(TuneArgs(config=config, output_dir=tmp_path / "out", budget="90s", trials=3))
    folder = tmp_path / "out" / "mlp" / "tune"
    folder.mkdir(parents=True)
    assert console.command_started() is None  # this process was not started for the command
    assert 85.0 < Search(request, folder, None).left() <= 90.0  # type: ignore[arg-type]
    monkeypatch.setattr(console, "_process_is_the_command", True)
    started = console.command_started()
    assert started is not None and time.monotonic() - started == pytest.approx(3600.0, abs=5.0)
    assert Search(replace(request, started=started), folder, None).left() < 0  # type: ignore[arg-type]
