"""The stall watch on the ranks' real progress and step files (the end-to-end hang is in
test_benchmark_run's fault sweep)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchscale.config.settings import CellSettings
from torchscale.launch.stall import Stalled, StallWatch, stall_reason, stall_watch
from torchscale.plan.planned_cell import Cell
from torchscale.results.rank_files import RankReporter


def reporters(cell_dir: Path, world: int = 2) -> list:
    return [RankReporter(cell_dir, rank) for rank in range(world)]


def test_fires_only_after_no_rank_moved_for_the_limit(tmp_path: Path) -> None:
    ranks = reporters(tmp_path)
    watch = StallWatch(tmp_path, 2, limit_s=5.0)
    for reporter in ranks:
        reporter.phase("measure")
        reporter.steps.start_step()
    watch.check(100.0)
    watch.check(104.0)
    ranks[0].steps.phase(2)  # rank 0 moved on to its backward: the clock starts again
    watch.check(104.5)
    watch.check(109.0)
    with pytest.raises(Stalled):
        watch.check(109.6)


def test_start_up_and_the_windows_after_the_steps_are_not_watched(tmp_path: Path) -> None:
    ranks = reporters(tmp_path)
    watch = StallWatch(tmp_path, 2, limit_s=1.0)
    watch.check(0.0)
    watch.check(50.0)  # no progress files yet: imports, joining the group
    ranks[0].phase("measure")
    ranks[1].phase("build")
    watch.check(60.0)
    watch.check(70.0)  # one rank still building its model
    ranks[1].phase("measure")
    ranks[0].phase("gather")
    watch.check(80.0)
    watch.check(90.0)  # gathering the results
    ranks[0].phase("sync_probe")
    ranks[1].phase("sync_probe")
    watch.check(100.0)
    with pytest.raises(Stalled):
        watch.check(101.5)


def test_no_limit_never_fires(tmp_path: Path) -> None:
    for reporter in reporters(tmp_path):
        reporter.phase("warmup")
    watch = StallWatch(tmp_path, 2, limit_s=None)
    watch.check(0.0)
    watch.check(1e9)


def test_a_cell_s_watch_and_its_reason(tmp_path: Path) -> None:
    settings = CellSettings(model="gpt2-tiny", batch_size=2, gpus=2, stall_timeout_s=7)
    cell = Cell(0, "c", settings, "training")
    for reporter in reporters(tmp_path):
        reporter.phase("warmup")
    watch = stall_watch(cell, tmp_path)
    assert watch.limit_s == 7 and watch.world_size == 2
    assert stall_reason(cell, "rank 1 stuck in 'warmup'") == (
        "hung: no rank moved for 7 s (stall_timeout_s): rank 1 stuck in 'warmup'"
    )
    assert CellSettings(model="gpt2-tiny", batch_size=2, gpus=2).stall_timeout_s == 600.0


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_a_bad_stall_timeout_is_one_line_and_exit_2(tmp_path: Path, value: str) -> None:
    from typer.testing import CliRunner

    from torchscale.cli.app import app

    config = tmp_path / "c.yaml"
    config.write_text(f"models: [gpt2-tiny]\nstall_timeout_s: {value}\n")
    out = tmp_path / "results"
    result = CliRunner().invoke(app, ["benchmark", "-c", str(config), "-o", str(out)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "stall_timeout_s" in lines[0], result.stderr
    assert "Traceback" not in result.output and not out.exists()
