"""Six real CPU runs recorded in a history as they end (the config's ``history:``, --history and
TORCHSCALE_HISTORY), the last three slowed by a planted sleep (30%): ``history changes`` names
the fourth run as the change, and ``--fail-on-regression`` fails while it is open."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.shared_runs import ProfileRun
from tests.support.sleepy_model import BASE_MS, EXTRA_ENV
from torchscale.cli.app import app
from torchscale.history.database import HistoryStore

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timed,  # six nights' throughput and the change point among them
]

CONFIG = """\
experiment_name: nightly
models: ["tests.support.sleepy_model:sleepy"]
batch_sizes: [2]
gpu_counts: [1]
warmup_steps: 2
measure_steps: 10
sync_probe_steps: 2
cell_timeout_s: 120
"""


def test_six_real_runs_name_the_fourth_as_the_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = tmp_path / "history.db"
    plain = tmp_path / "bench.yaml"
    plain.write_text(CONFIG)
    configured = tmp_path / "configured.yaml"
    configured.write_text(CONFIG + f"history: {json.dumps(str(history))}\n")
    runner = CliRunner()
    for night in range(1, 7):
        if night >= 4:
            monkeypatch.setenv(EXTRA_ENV, str(0.3 * BASE_MS))
        args = ["benchmark", "-o", str(tmp_path / f"night{night}")]
        if night <= 2:
            args += ["-c", str(configured)]
        elif night <= 4:
            args += ["-c", str(plain), "--history", str(history)]
        else:
            args += ["-c", str(plain)]
            monkeypatch.setenv("TORCHSCALE_HISTORY", str(history))
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "Recorded in the history" in result.output
    # three runs each side, with the default: a six-run series' one possible split is tested
    # at 1% (the 0.05% of 60-run series would need a step of about nine times the run-to-run
    # spread, and this machine's runs move by several percent under other jobs' load)
    args = ["history", "changes", "--history", str(history)]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    store = HistoryStore(str(history))
    measured = [round(p.value, 1) for p in store.points("throughput")]
    store.close()
    assert len(document["changes"]) == 1, measured
    (change,) = document["changes"]
    assert change["position"] == 4 and change["experiment"] == "nightly"
    assert change["regression"] and change["open"]
    assert -0.3 < change["magnitude"] < -0.15  # 30% more step time: about 23% less throughput
    gate = runner.invoke(app, ["history", "changes", "--fail-on-regression"])
    assert gate.exit_code == 1
    assert "regression, open at run 4" in gate.output
    # the same folder again: still six runs
    again = runner.invoke(app, ["history", "ingest", str(tmp_path / "night6"), "--json"])
    assert json.loads(again.stdout)["already"] == [str(tmp_path / "night6" / "nightly")]
    assert len(json.loads(runner.invoke(app, ["history", "show", "--json"]).stdout)["runs"]) == 6


def test_profile_records_its_run_with_the_sync_stall_time(use_case_profile: ProfileRun) -> None:
    """The shared profile run (``profile --history``): its run is in the history, kind
    ``profile``, with the traced cell's sync stall time as findings.json gives it."""
    from torchscale.results.layout import FINDINGS_FILE

    assert "Recorded in the history" in use_case_profile.result.stderr
    (profiled,) = [p for p in use_case_profile.folder.iterdir() if p.name.startswith("profile-")]
    (findings,) = profiled.rglob(FINDINGS_FILE)
    stall = json.loads(findings.read_text(encoding="utf-8"))["sync_stall_pct"]
    store = HistoryStore(str(use_case_profile.history))
    (run,) = store.runs()
    assert run["kind"] == "profile" and run["experiment"].startswith("profile-gpt2-tiny-g2-")
    (point,) = store.points("sync_stall")
    assert point.value == pytest.approx(stall)
    assert [p.metric for p in store.points("throughput")] == ["throughput"]
    store.close()
