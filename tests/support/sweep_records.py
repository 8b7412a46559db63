"""A sweep of two values of every axis, for the row-identity tests: one small real communication
run (gloo, two dtypes, TP GEMM in two dtypes) plus records built from it and from the report
fixture's performance model.

- backend: the real cell ran ``backend: gloo``; its twin is the same cell under ``backend: auto``
  (its records copied with the settings, cell id and times of a second launch: every time x1.7);
- dtype: float32 and float64, measured by the real cell itself;
- precision and a DDP knob: training cells at fp32 / bf16 x ddp.bucket_cap_mb 1 / 25 on 1 and 2
  GPUs, from the report fixture's model (``report_fixtures.training_record``), with DDP's logging
  figures and GPU telemetry sampled by the real sampler from recorded H100 NVML answers.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

import numpy as np

from tests.support.report_fixtures import MODELS, FixtureSpec, training_record
from torchscale.comm.config import CommCellSettings
from torchscale.comm.plan import comm_cell_id
from torchscale.results.layout import experiment_dirname
from torchscale.results.schema import CommResultBase, GpuTelemetry, ResultBase, TrainingResult
from torchscale.results.store import ExperimentStore

NVML_FIXTURE = Path(__file__).resolve().parents[1] / "data" / "nvml" / "h100_healthy.json"
SWEEP_NAME = "sweep-axes"
COMM_CONFIG = f"""\
experiment_name: {SWEEP_NAME}
gpu_counts: [2]
communication:
  collectives: [all_reduce]
  p2p: false
  min_bytes: 1K
  max_bytes: 4K
  factor: 4
  dtype: [float32, float64]
  warmup: 2
  iterations: 5
  backend: gloo
  cell_timeout_s: 240
  tp_gemm:
    m: 64
    n: 32
    k: 32
    dtype: [float32, float64]
    orders: [AG_before, AG_after]
"""
TWIN_SLOWDOWN = 1.7
PRECISIONS = ("fp32", "bf16")
BUCKETS = (1.0, 25.0)
WORLDS = (1, 2)


@dataclass(frozen=True)
class SweepRun:
    result: Any  # the CliRunner result of the real --quiet run
    output_dir: Path
    experiment_dir: Path


def launch_comm_sweep(root: Path) -> SweepRun:
    """``torchscale --quiet benchmark`` of :data:`COMM_CONFIG`: one real 2-rank gloo launch
    (the session fixture ``comm_sweep_run`` in ``tests/conftest.py``)."""
    from typer.testing import CliRunner

    from torchscale.cli.app import app

    root.mkdir(parents=True, exist_ok=True)
    config = root / "comm.yaml"
    config.write_text(COMM_CONFIG, encoding="utf-8")
    output = root / "results"
    result = CliRunner().invoke(app, ["--quiet", "benchmark", "-c", str(config), "-o", str(output)])
    if result.exit_code != 0:
        raise RuntimeError(f"sweep benchmark failed ({result.exit_code}):\n{result.output}")
    return SweepRun(result, output, output / experiment_dirname(SWEEP_NAME))


def backend_twin(records: List[ResultBase]) -> List[ResultBase]:
    """The communication records of the same cell run under ``backend: auto``."""
    twins: List[ResultBase] = []
    for record in records:
        if not isinstance(record, CommResultBase):
            continue
        settings = {**record.settings, "backend": "auto"}
        cell_id = comm_cell_id(CommCellSettings.model_validate(settings))
        slower = {
            key: value * TWIN_SLOWDOWN
            for key in ("time_us", "time_us_min", "time_us_max", "comm_time_us", "gemm_time_us")
            if isinstance(value := getattr(record, key, None), float)
        }
        twins.append(record.model_copy(update={"settings": settings, "cell_id": cell_id, **slower}))
    return twins


def sampled_gpu(index: int) -> GpuTelemetry:
    """What the worker's NVML sampler records for GPU ``index`` of the recorded H100 node."""
    from tests.support.fakes.fake_pynvml import load

    previous = sys.modules.get("pynvml")
    sys.modules["pynvml"] = load(json.loads(NVML_FIXTURE.read_text(encoding="utf-8")))
    try:
        from torchscale.worker.gpu_sampler import GpuSampler

        with GpuSampler(index, interval_s=0.01) as sampler:
            time.sleep(0.05)
        summary = sampler.summary()
    finally:
        if previous is None:
            sys.modules.pop("pynvml", None)
        else:
            sys.modules["pynvml"] = previous
    assert summary is not None
    return GpuTelemetry.model_validate(summary)


def training_sweep(experiment: str) -> List[TrainingResult]:
    """fp32/bf16 x bucket 1/25 MiB on 1 and 2 GPUs of one model, with DDP's logging figures
    (compute from the rank's own times, communication a fifth of it) and sampled GPU telemetry."""
    spec = FixtureSpec(name=experiment, steps=12)
    rng = np.random.default_rng(7)
    gpus = [sampled_gpu(i) for i in range(max(WORLDS))]
    records = []
    for precision in PRECISIONS:
        for bucket in BUCKETS:
            for world in WORLDS:
                base = training_record(MODELS[0], 32, world, 0, spec, rng)
                settings: Dict[str, Any] = {
                    **base.settings,
                    "precision": precision,
                    "ddp": {**base.settings["ddp"], "bucket_cap_mb": bucket},
                }
                ranks = [
                    rank.model_copy(
                        update={
                            "ddp_forward_compute_ms": rank.forward_ms,
                            "ddp_backward_compute_ms": 2 * rank.forward_ms,
                            "ddp_backward_comm_ms": 0.2 * rank.forward_ms * bucket / 25,
                            "ddp_backward_overlap_ms": 0.1 * rank.forward_ms * bucket / 25,
                            "gpu": gpus[rank.rank],
                        }
                    )
                    for rank in base.per_rank
                ]
                records.append(
                    base.model_copy(
                        update={
                            "settings": settings,
                            "precision": precision,
                            "per_rank": ranks,
                            "cell_id": f"{base.cell_id}-{precision}-b{bucket:g}",
                        }
                    )
                )
    return records


def write_swept_experiment(run: SweepRun, root: Path) -> Path:
    """The real run's experiment, plus its backend twin and the training sweep, in ``root``."""
    real = ExperimentStore(run.experiment_dir)
    store = ExperimentStore(root / experiment_dirname(SWEEP_NAME))
    store.write_manifest(real.manifest())
    records = real.records()
    for record in [*records, *backend_twin(records), *training_sweep(SWEEP_NAME)]:
        store.append(record)
    return store.root
