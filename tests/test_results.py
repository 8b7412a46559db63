"""Cross-rank aggregation, scaling efficiency and the results store (pure Python, no launches)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List

import pytest

from torchscale.analysis.training_tables import training_table
from torchscale.errors import TorchscaleError
from torchscale.measures.stats import time_stats
from torchscale.results.schema import CellStatus, TrainingResult
from torchscale.results.store import ExperimentStore, check_writable, read_jsonl
from torchscale.worker.aggregate import aggregate


def rank(index: int, steps: List[float], nosync: float, window_s: float) -> Dict[str, Any]:
    waits = [max(0.0, s - nosync) for s in steps]
    return {
        "rank": index,
        "local_rank": index,
        "host": "node0",
        "device": "cpu",
        "measure_steps": len(steps),
        "window_s": window_s,
        "step_time_ms": time_stats(steps),
        "step_times_ms": steps,
        "forward_ms": 1.0,
        "backward_ms": 2.0,
        "optimizer_ms": 0.5,
        "nosync_step_ms": nosync,
        "sync_wait_ms": max(0.0, sum(steps) / len(steps) - nosync),
        "sync_wait_samples_ms": waits,
        "memory": {
            "params_bytes": 100,
            "grads_bytes": 100,
            "optimizer_bytes": 200,
            "peak_bytes": 1000 + index,
            "peak_kind": "rss",
        },
    }


def measured(ranks: List[Dict[str, Any]], **kwargs: Any) -> Dict[str, Any]:
    defaults: Dict[str, Any] = dict(
        batch_size=16,
        grad_accum_steps=2,
        precision="bf16",
        unit="tokens",
        units_per_sample=128.0,
        flops_per_sample=1e9,
        device_name="NVIDIA H100 80GB HBM3",
    )
    defaults.update(kwargs)
    return aggregate(ranks, **defaults)


def test_throughput_steps_and_mfu_are_computed_from_the_ranks() -> None:
    ranks = [
        rank(1, [10.0, 12.0, 11.0, 30.0], 6.0, 0.064),
        rank(0, [9.0, 13.0, 11.0, 20.0], 9.0, 0.063),
    ]
    result = measured(ranks)
    # Per step, the slowest rank's time; ranks sorted by rank.
    assert result["step_times_ms"] == [10.0, 13.0, 11.0, 30.0]
    assert [r["rank"] for r in result["per_rank"]] == [0, 1]
    # 2 ranks x 16 x 2 micro-batches x 4 steps over the slowest window (0.064 s).
    assert result["global_batch_size"] == 64
    assert result["samples_per_s"] == pytest.approx(64 * 4 / 0.064)
    assert result["throughput"] == pytest.approx(result["samples_per_s"] * 128)
    assert result["step_time_ms"]["p50"] == pytest.approx(12.0)
    per_gpu = result["samples_per_s"] / 2
    assert result["tflops_per_gpu"] == pytest.approx(1e9 * per_gpu / 1e12)
    assert result["peak_tflops"] == 989.0
    assert result["mfu"] == pytest.approx(result["tflops_per_gpu"] / 989.0)
    assert result["memory"]["peak_bytes"] == 1001  # the rank with the highest peak


def test_straggler_is_the_rank_that_waits_least() -> None:
    steps = [20.0] * 8
    # Rank 2 computes for 19 ms, the others for 8 ms: they wait ~12 ms/step for it.
    ranks = [rank(i, steps, 19.0 if i == 2 else 8.0, 0.16) for i in range(4)]
    sync = measured(ranks, device_name="cpu")["sync"]
    assert sync["slowest_rank"] == 2
    assert sync["per_rank_wait_ms"] == pytest.approx([12.0, 12.0, 1.0, 12.0])
    assert sync["wait_spread_ms"] == pytest.approx(11.0)
    assert sync["high_variance"] is True
    assert "rank 2 is the straggler" in sync["warning"]
    assert sync["exposed_fraction"] == pytest.approx(((1 - 8 / 20) * 3 + (1 - 19 / 20)) / 4)


def test_balanced_ranks_name_no_straggler_and_one_rank_never_warns() -> None:
    balanced = [rank(i, [10.0, 10.2, 9.9, 10.1], 7.0, 0.04) for i in range(2)]
    sync = measured(balanced, device_name="cpu")["sync"]
    assert sync["slowest_rank"] is None and sync["warning"] is None
    noisy_single = [rank(0, [10.0, 30.0, 5.0, 40.0], 4.0, 0.085)]
    single = measured(noisy_single, device_name="cpu")["sync"]
    assert single["high_variance"] is False and single["slowest_rank"] is None


def test_unknown_device_has_no_mfu() -> None:
    result = measured([rank(0, [10.0, 10.0], 9.0, 0.02)], device_name="cpu")
    assert result["mfu"] is None and result["peak_tflops"] is None
    assert result["tflops_per_gpu"] is not None


def record(gpus: int, rate: float, status: CellStatus = "ok", **settings: Any) -> TrainingResult:
    base_settings: Dict[str, Any] = {
        "model": "m",
        "batch_size": 8,
        "gpus": gpus,
        "repeat": 0,
        "precision": "fp32",
    }
    base_settings.update(settings)
    return TrainingResult(
        cell_id=f"m-g{gpus}-{status}-{settings}",
        experiment="e",
        status=status,
        world_size=gpus,
        nproc_per_node=gpus,
        model="m",
        batch_size=8,
        global_batch_size=8 * gpus,
        precision=base_settings["precision"],
        samples_per_s=rate if status == "ok" else None,
        settings=base_settings,
    )


def test_scaling_efficiency_against_the_one_gpu_cell() -> None:
    records = [
        record(1, 100.0),
        record(2, 180.0),
        record(4, 340.0),
        record(8, 0.0, status="oom"),
        record(2, 50.0, precision="bf16"),  # another configuration: its own baseline
        record(4, 90.0, precision="bf16"),
    ]
    table = training_table(records).set_index("cell_id")
    eff = {(r.world_size, r.precision): r.scaling_efficiency for r in table.itertuples()}
    assert eff[(1, "fp32")] == pytest.approx(1.0)
    assert eff[(2, "fp32")] == pytest.approx(0.9)
    assert eff[(4, "fp32")] == pytest.approx(0.85)
    assert math.isnan(eff[(8, "fp32")])  # type: ignore[arg-type]  # a float column; failed cells have no efficiency
    # No 1-GPU cell for bf16: the smallest count measured is the baseline.
    assert eff[(4, "bf16")] == pytest.approx(90.0 / (2 * 50.0))
    assert set(table["baseline_world_size"].dropna()) == {1.0, 2.0}


def test_store_appends_and_survives_a_torn_last_line(tmp_path: Path) -> None:
    store = ExperimentStore(tmp_path / "exp")
    store.root.mkdir()
    store.append(record(1, 100.0))
    # A crash mid-append leaves half a line; the next append must start on a fresh one.
    with open(store.results_path, "a") as handle:
        handle.write('{"schema_version": 1, "kind": "training", "cell_')
    store.append(record(2, 190.0))
    lines = store.results_path.read_text().splitlines()
    assert len(lines) == 3 and lines[1].startswith('{"schema_version": 1, "kind"')
    records = store.records()
    assert [r.world_size for r in records] == [1, 2]
    assert json.loads(lines[2])["samples_per_s"] == 190.0
    assert len(read_jsonl(store.results_path)) == 2


def test_store_lock_refuses_a_second_writer(tmp_path: Path) -> None:
    store = ExperimentStore(tmp_path / "exp")
    second = ExperimentStore(tmp_path / "exp")
    with (
        store.lock(),
        pytest.raises(TorchscaleError, match="is in use by torchscale"),
        second.lock(),
    ):
        pass


def test_check_writable(tmp_path: Path) -> None:
    check_writable(tmp_path / "new" / "dir")
    assert (tmp_path / "new" / "dir").is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(TorchscaleError, match="is not writable"):
        check_writable(blocker / "sub")
