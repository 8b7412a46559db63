"""The closed prediction loop: a prediction made from 1 rank (project --holdout on the shared
projection run) and measured at 2 ranks shows its error in the history."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.shared_runs import Run
from torchscale.cli.app import app

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timed,  # a prediction checked against a later run's throughput
]


def test_a_prediction_from_one_rank_shows_its_error_at_two(
    projection_run: Run, tmp_path: Path
) -> None:
    source = projection_run.experiment_dir
    history = str(tmp_path / "history.db")
    runner = CliRunner()
    ingested = runner.invoke(app, ["history", "ingest", str(source), "--history", history])
    assert ingested.exit_code == 0, ingested.output
    # the run's communication cells are series with their busbw, its training cells on 2 ranks
    # have a scaling efficiency
    from torchscale.history.database import HistoryStore

    store = HistoryStore(history)
    kinds = {s_id: key for s_id, key in store.series_ids().items()}
    entries = {e.key: e for e in store.all_series()}
    busbw = [p for p in store.points("busbw") if entries[kinds[p.series_id]].kind == "collective"]
    recorded = [
        json.loads(line)
        for line in (source / "results.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    comm = [r for r in recorded if r.get("busbw_gbps") and r["status"] == "ok"]
    names = {
        f"{r['op']} {r.get('scope') or 'world'} {r.get('size_bytes') or r.get('requested_bytes')} B"
        for r in comm
    }
    assert {entries[kinds[p.series_id]].name for p in busbw} == names
    low, high = min(r["busbw_gbps"] for r in comm), max(r["busbw_gbps"] for r in comm)
    assert all(low <= p.value <= high for p in busbw)
    (two,) = [p for p in store.points("efficiency") if entries[kinds[p.series_id]].gpus == 2]
    assert 0.0 < two.value < 2.0
    store.close()
    projected = runner.invoke(
        app, ["project", "-s", str(source), "--holdout", "--json", "--history", history]
    )
    assert projected.exit_code == 0, projected.output
    assert "prediction(s) recorded in the history" in projected.output
    rows = json.loads(projected.stdout)["predictions"]
    (row,) = [r for r in rows if r["world_size"] == 2]
    checked = json.loads(
        runner.invoke(app, ["history", "predictions", "--history", history, "--json"]).stdout
    )["predictions"]
    (mine,) = [c for c in checked if c["gpus"] == 2]
    assert mine["model"] == "gpt2-tiny" and mine["predicted"] == pytest.approx(row["throughput"])
    # measured: the 2-rank cell's throughput in the ingested run, which project's table quotes
    assert mine["measured"] == pytest.approx(row["measured_throughput"], rel=1e-9)
    assert mine["error"] == pytest.approx(row["throughput"] / row["measured_throughput"] - 1)
    assert mine["rolling_error"] == pytest.approx(abs(mine["error"]))
    shown = runner.invoke(app, ["history", "predictions", "--history", history])
    assert f"error {100 * mine['error']:+.1f}%" in shown.output
    # the report's projection section quotes how far past predictions were off: the history
    # given by --history, as by TORCHSCALE_HISTORY
    errors = [abs(c["error"]) for c in checked if c["error"] is not None]
    quoted = f"were off by {100 * sum(errors) / len(errors):.1f}% on average"
    page = tmp_path / "report.html"
    plain = runner.invoke(app, ["report", "-s", str(source), "-o", str(page)])
    assert plain.exit_code == 0, plain.output
    assert quoted not in page.read_text(encoding="utf-8")
    for extra, env in (
        (["--history", history], {}),
        ([], {"TORCHSCALE_HISTORY": history}),
    ):
        reported = runner.invoke(
            app, ["report", "-s", str(source), "-o", str(page), *extra], env=env
        )
        assert reported.exit_code == 0, reported.output
        assert quoted in page.read_text(encoding="utf-8")
