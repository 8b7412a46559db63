"""Warm process groups: which cells share a launch, and whether a cell's figures in a
group are its own. The faults inside a group (OOM contained, crash and hang relaunched) and
Ctrl-C then ``--resume`` are run in tests/test_benchmark_run.py, whose sweeps are warm groups."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import pytest
from typer.testing import CliRunner

from torchscale.cli.app import app
from torchscale.config.settings import CellSettings
from torchscale.launch.warm_groups import PER_CELL, PER_GROUP, launch_units, per_cell_reason
from torchscale.plan.planned_cell import Cell
from torchscale.plan.profile_request import ProfileRequest
from torchscale.results.schema import TrainingResult
from torchscale.results.store import ExperimentStore

pytestmark = pytest.mark.timed  # a cell's throughput in a group against alone

runner = CliRunner()


def cell(name: str, gpus: int = 1, **knobs: object) -> Cell:
    settings = CellSettings(model="gpt2-tiny", batch_size=4, gpus=gpus, **knobs)  # type: ignore[arg-type]
    return Cell(index=0, cell_id=name, settings=settings)


def ids(units: List[List[Cell]]) -> List[List[str]]:
    return [[c.cell_id for c in unit] for unit in units]


def test_cells_of_one_layout_share_a_launch_in_plan_order() -> None:
    cells = [cell("a1"), cell("a2", 2), cell("b1"), cell("b2", 2), cell("c1", backend="gloo")]
    cells.append(cell("solo"))
    alone = {"solo"}
    units = launch_units(cells, PER_GROUP, lambda c: c.cell_id in alone)
    # Each group runs where its first cell was; a cell that needs a process of its own stays put.
    assert ids(units) == [["a1", "b1"], ["a2", "b2"], ["c1"], ["solo"]]
    assert ids(launch_units(cells, PER_CELL, lambda c: False)) == [[c.cell_id] for c in cells]


def test_cells_that_need_a_process_of_their_own_say_why() -> None:
    plain = cell("p")
    assert per_cell_reason(plain, "torchrun", 1, None) is None
    compiled = per_cell_reason(cell("c", compile=True), "torchrun", 1, None)
    assert compiled and "torch.compile caches compiled code per process" in compiled
    nsys = ProfileRequest.from_json(
        {"tool": "nsys", "target": "sync_stalls", "trigger": "always", "steps": 2}
    )
    assert "nsys profiles a whole process" in (per_cell_reason(plain, "torchrun", 1, nsys) or "")
    assert "--launcher slurm" in (per_cell_reason(plain, "slurm", 1, None) or "")
    assert "lock step" in (per_cell_reason(plain, "torchrun", 2, None) or "")
    comm = Cell(index=0, cell_id="comm", settings=plain.settings, kind="communication")
    assert "communication" in (per_cell_reason(comm, "torchrun", 1, None) or "")


def test_an_unknown_launch_mode_is_one_line_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("experiment_name: x\nmodels: [gpt2-tiny]\nlaunch: per_node\n")
    result = runner.invoke(app, ["benchmark", "-c", str(config), "--dry-run"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "launch" in result.stderr and "per_group" in result.stderr


AGREEMENT = """\
experiment_name: agree
models: [gpt2-tiny, resnet-tiny]
batch_sizes: [4]
gpu_counts: [2]
warmup_steps: 2
measure_steps: 6
sync_probe_steps: 2
cell_timeout_s: 240
"""


def run_mode(tmp_path: Path, mode: str) -> Dict[str, TrainingResult]:
    config = tmp_path / "agree.yaml"
    config.write_text(AGREEMENT)
    out = tmp_path / mode
    result = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(out), "--launch", mode])
    assert result.exit_code == 0, result.output
    records = ExperimentStore(out / "agree").records()
    assert all(isinstance(r, TrainingResult) and r.status == "ok" for r in records)
    return {r.cell_id: r for r in records if isinstance(r, TrainingResult)}


@pytest.mark.slow
def test_a_cell_in_a_warm_group_measures_what_it_measures_alone(tmp_path: Path) -> None:
    """Figures that do not depend on timing agree exactly; peak RSS (CPU memory is the rank
    process's RSS, its peak reset at the measured window) within 15%: in a group it also holds
    what the cells before left resident."""
    group = run_mode(tmp_path, "per-group")
    alone = run_mode(tmp_path, "per-cell")
    assert set(group) == set(alone) and len(group) == 2
    first = next(r for r in group.values() if r.model == "gpt2-tiny")
    positions = {r.model: r.launch for r in group.values()}
    assert positions == {
        "gpt2-tiny": {"mode": "per_group", "group": first.cell_id, "position": 0},
        "resnet-tiny": {"mode": "per_group", "group": first.cell_id, "position": 1},
    }
    assert all(r.launch == {"mode": "per_cell"} for r in alone.values())
    for cell_id, g in group.items():
        a = alone[cell_id]
        assert g.measure_steps == a.measure_steps == 6 and len(g.step_times_ms) == 6
        assert g.flops_per_sample == a.flops_per_sample and g.units_per_sample == a.units_per_sample
        for rg, ra in zip(g.per_rank, a.per_rank):
            assert rg.memory and ra.memory and rg.memory.peak_kind == ra.memory.peak_kind == "rss"
            assert rg.memory.params_bytes == ra.memory.params_bytes > 0
            assert rg.memory.grads_bytes == ra.memory.grads_bytes
            assert rg.memory.optimizer_bytes == ra.memory.optimizer_bytes > 0
            assert len(rg.step_times_ms) == len(ra.step_times_ms) == 6
            assert 0.85 < rg.memory.peak_bytes / ra.memory.peak_bytes < 1.15, (cell_id, rg, ra)
        # DDP's own account of what it built: the same buckets, the same parameters.
        ddp_g, ddp_a = g.runtime["ddp"], a.runtime["ddp"]
        assert ddp_g["bucket_sizes"] == ddp_a["bucket_sizes"]
        assert ddp_g["total_parameter_size_bytes"] == ddp_a["total_parameter_size_bytes"]
        # A warm cell's wall time leaves out the start-up the first cell paid.
    assert group[first.cell_id].wall_s is not None
    second = next(r for r in group.values() if r.model == "resnet-tiny")
    solo = alone[second.cell_id].wall_s
    assert second.wall_s is not None and solo is not None
    assert second.wall_s < solo
