"""The Python API (torchscale.load / load_steps / run / compare) on real results, and the
example that rebuilds the report's scaling table from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import torchscale
from tests.support.python_probe import python_prints
from tests.support.shared_runs import Run
from torchscale.analysis.scaling import label_variants, scaling_curves
from torchscale.analysis.training_tables import training_table
from torchscale.errors import TorchscaleError
from torchscale.launch.forked_ranks import FORK_ENV, FORKED_LINE
from torchscale.results.layout import experiment_dirname
from torchscale.results.schema import TrainingResult
from torchscale.results.store import ExperimentStore

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "analysis.py"
pytestmark = pytest.mark.slow  # the shared healthy run launches torchrun


@pytest.fixture(scope="module")
def healthy(healthy_run: Run) -> Path:
    return healthy_run.experiment_dir


def test_load_is_summary_csv(healthy: Path) -> None:
    table = torchscale.load(healthy)
    summary = (healthy / "summary.csv").read_text(encoding="utf-8")
    assert table.to_csv(index=False) == summary  # the same columns, rows and figures
    assert sorted(table["world_size"]) == [1, 2]
    assert (table["status"] == "ok").all() and (table["throughput"] > 0).all()
    # A folder of experiments gives the same rows.
    assert torchscale.load(healthy.parent).to_csv(index=False) == summary


def test_load_steps_gives_every_rank_and_step(healthy: Path) -> None:
    steps = torchscale.load_steps(healthy)
    records = [r for r in ExperimentStore(healthy).records() if isinstance(r, TrainingResult)]
    assert len(steps) == sum(len(rank.step_times_ms) for r in records for rank in r.per_rank)
    two = next(r for r in records if r.world_size == 2)
    for rank in two.per_rank:
        mine = steps[(steps["cell_id"] == two.cell_id) & (steps["rank"] == rank.rank)]
        assert mine["step_ms"].tolist() == rank.step_times_ms
        assert mine["sync_wait_ms"].tolist() == rank.sync_wait_samples_ms[: len(mine)]
    assert set(steps["cell_id"]) <= set(torchscale.load(healthy)["cell_id"])


def test_compare_same_run_is_unchanged(healthy: Path) -> None:
    comparison = torchscale.compare(healthy, healthy)
    assert isinstance(comparison, torchscale.Comparison)
    assert sorted(comparison.cells["world_size"]) == [1, 2]
    assert (comparison.cells["throughput_change_pct"] == 0).all()
    # A cell measured on a busy host is "not judged", even against itself (one rule for it).
    busy = comparison.cells["noise_model"] == "busy host"
    assert set(comparison.cells.loc[~busy, "verdict"]) <= {"unchanged"}
    assert set(comparison.cells.loc[busy, "verdict"]) <= {"not judged"}
    assert len(comparison.cells) == 2
    assert comparison.regressions.empty


def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TorchscaleError, match="does not exist; point it at a results folder"):
        torchscale.load(tmp_path / "nowhere")


def test_example_reproduces_the_report_scaling_table(healthy: Path, tmp_path: Path) -> None:
    out = tmp_path / "scaling.csv"
    printed = subprocess.run(
        [sys.executable, str(EXAMPLE), str(healthy), "--csv", str(out)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    mine = pd.read_csv(out).set_index("world_size")
    records = ExperimentStore(healthy).records()
    report = scaling_curves(label_variants(training_table(records))).set_index("world_size")
    assert sorted(mine.index) == sorted(report.index) == [1, 2]
    for column in ("throughput", "ideal_throughput", "scaling_efficiency"):
        for size in (1, 2):
            assert mine.loc[size, column] == pytest.approx(report.loc[size, column], rel=1e-9)
    assert f"{report.loc[2, 'scaling_efficiency']:.1%}" in printed  # type: ignore[str-bytes-safe]  # a float column


def test_run_returns_results_like_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also the start a GPU node's ranks get: each in a fresh interpreter, not forked."""
    monkeypatch.setenv(FORK_ENV, "0")
    config = {
        "experiment_name": "api run",
        "models": ["gpt2-tiny"],
        "batch_sizes": [2],
        "gpu_counts": [1],
        "warmup_steps": 1,
        "measure_steps": 4,
        "sync_probe_steps": 0,
        "cell_timeout_s": 240,
    }
    results = torchscale.run(config, tmp_path, overrides={"ddp.bucket_cap_mb": 10})
    assert isinstance(results, torchscale.Results) and results.ok
    (record,) = results.records
    assert record.status == "ok" and record.settings["ddp"]["bucket_cap_mb"] == 10
    assert results.path == tmp_path / experiment_dirname("api run")  # made safe, hashed
    summary = (results.path / "summary.csv").read_text(encoding="utf-8")
    assert results.table.to_csv(index=False) == summary
    assert torchscale.load(results.path).to_csv(index=False) == summary
    assert len(results.steps()) == 4  # one rank, four measured steps
    (exits,) = results.path.rglob("exits.*.jsonl")
    assert '"exitcode": 0' in exits.read_text()
    assert FORKED_LINE not in (exits.parent / "launch.log").read_text(errors="replace")
    with pytest.raises(TorchscaleError, match="already holds results"):
        torchscale.run(config, tmp_path)


def test_bad_config_raises_without_launching(tmp_path: Path) -> None:
    with pytest.raises(TorchscaleError, match="batch_sizes"):
        torchscale.run(
            {"experiment_name": "x", "models": ["gpt2-tiny"], "batch_sizes": [-1]}, tmp_path
        )
    assert not any(tmp_path.iterdir())


def test_import_is_light_and_the_api_lazy() -> None:
    printed = python_prints(
        "import sys, torchscale\n"
        "heavy = sorted(m for m in ('torch', 'pandas') if m in sys.modules)\n"
        "print(heavy, callable(torchscale.load), callable(torchscale.run))"
    )
    assert printed == "[] True True"
