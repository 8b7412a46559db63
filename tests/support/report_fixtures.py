"""Result folders for report and compare tests, computed from a simple performance model.

Each cell's per-rank step times are drawn (seeded) around ``compute + exposed sync``, then
aggregated by the worker's own ``aggregate`` so every derived figure (throughput, percentiles,
sync stats, MFU) follows torchscale's definitions. Collective records follow the nccl-tests
formulas. Nothing is a copied number: tests recompute what they assert from these records.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tests.support.shared_runs import SCRIPT_NAME
from torchscale.config.settings import CellSettings
from torchscale.measures.stats import time_stats
from torchscale.plan.training_cells import cell_id
from torchscale.results.files import append_jsonl
from torchscale.results.layout import (
    FINDINGS_FILE,
    PROFILE_DIR,
    experiment_dirname,
    profile_run_name,
)
from torchscale.results.schema import CellStatus, ProfileInfo, TrainingResult
from torchscale.results.store import ExperimentStore
from torchscale.worker.aggregate import aggregate

DEVICE = "NVIDIA H100 80GB HBM3"
LINK_PEAK_GBPS = 450.0
BUSBW_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n}


@dataclass(frozen=True)
class ModelShape:
    """A synthetic model: compute per sample, gradient bytes, and how noisy its steps are."""

    name: str
    params: int
    ms_per_sample: float
    flops_per_sample: float
    sync_ms_per_gpu_doubling: float
    cv: float = 0.03
    activation_bytes_per_sample: int = 64 * 2**20


MODELS = (
    ModelShape("resnet-synthetic", 25_557_032, 0.25, 24.6e9, 1.2),
    ModelShape(SCRIPT_NAME, 124_000_000, 0.9, 6 * 124e6 * 1024, 9.0),
)


@dataclass
class FixtureSpec:
    name: str = "fixture-scaling"
    models: Sequence[ModelShape] = MODELS
    batch_sizes: Sequence[int] = (32, 64)
    gpu_counts: Sequence[int] = (1, 2, 4, 8)
    repeats: int = 1
    steps: int = 30
    seed: int = 0
    slowdown: Dict[str, float] = field(default_factory=dict)  # model name -> step time factor
    cv_override: Dict[str, float] = field(default_factory=dict)  # model name -> step time CV
    straggler: Optional[Tuple[str, int, int]] = (SCRIPT_NAME, 8, 3)  # model, world, slow rank
    gpus_per_node: int = 8  # a GPU count above it runs on gpus / gpus_per_node nodes
    inter_node_ms: float = 4.0  # extra sync per doubling of the node count (the network)
    failures: bool = True
    collectives: bool = True
    findings: bool = True


def _settings(model: str, batch: int, gpus: int, repeat: int, nnodes: int = 1) -> CellSettings:
    return CellSettings(
        model=model,
        batch_size=batch,
        gpus=gpus,
        nnodes=nnodes,
        repeat=repeat,
        precision="bf16",
        warmup_steps=5,
        measure_steps=30,
    )


def _identity(settings: CellSettings, experiment: str) -> dict:
    return {
        "cell_id": cell_id(settings),
        "experiment": experiment,
        "model": settings.model,
        "batch_size": settings.batch_size,
        "global_batch_size": settings.gpus * settings.batch_size,
        "precision": settings.precision,
        "world_size": settings.gpus,
        "nnodes": settings.nnodes,
        "nproc_per_node": settings.nproc_per_node,
        "repeat": settings.repeat,
        "settings": settings.model_dump(mode="json"),
    }


def host_name(node: int) -> str:
    return f"node-{chr(ord('a') + node)}"


def _ranks(
    shape: ModelShape, batch: int, world: int, spec: FixtureSpec, rng: np.random.Generator
) -> List[dict]:
    factor = spec.slowdown.get(shape.name, 1.0)
    cv = spec.cv_override.get(shape.name, shape.cv)
    compute = shape.ms_per_sample * batch * factor
    comm = shape.sync_ms_per_gpu_doubling * math.log2(world) if world > 1 else 0.0
    per_node = min(world, spec.gpus_per_node)
    comm += spec.inter_node_ms * math.log2(world // per_node)
    slow_rank = (
        spec.straggler[2] if spec.straggler and spec.straggler[:2] == (shape.name, world) else None
    )
    delays = np.zeros(world)
    if slow_rank is not None:
        delays[slow_rank] = 0.3 * compute
    noise = rng.normal(1.0, cv, size=(spec.steps, world)).clip(0.2)
    own = compute * noise + delays  # each rank's compute per step
    done = own.max(axis=1, keepdims=True)  # all-reduce completes when the last rank arrives
    steps = done + comm
    waits = steps - own
    states = shape.params * 4
    ranks = []
    for r in range(world):
        times = steps[:, 0].tolist()  # ranks leave the all-reduce together
        memory: Dict[str, Any] = {
            "params_bytes": states,
            "grads_bytes": states,
            "optimizer_bytes": 2 * states,
            "activations_peak_bytes": shape.activation_bytes_per_sample * batch,
            "peak_kind": "cuda_allocated",
        }
        memory["peak_bytes"] = 4 * states + memory["activations_peak_bytes"] + 2**28
        ranks.append(
            {
                "rank": r,
                "local_rank": r % per_node,
                "host": host_name(r // per_node),
                "device": f"cuda:{r % per_node}",
                "step_time_ms": time_stats(times),
                "step_times_ms": times,
                "measure_steps": spec.steps,
                "window_s": sum(times) / 1000,
                "forward_ms": float(own[:, r].mean()) / 3,
                "backward_ms": float(2 * own[:, r].mean() / 3 + waits[:, r].mean()),
                "optimizer_ms": 0.5,
                "nosync_step_ms": float(own[:, r].mean()),
                "sync_wait_ms": float(waits[:, r].mean()),
                "sync_wait_samples_ms": waits[:, r].tolist(),
                "memory": memory,
            }
        )
    return ranks


def training_record(
    shape: ModelShape,
    batch: int,
    world: int,
    repeat: int,
    spec: FixtureSpec,
    rng: np.random.Generator,
) -> TrainingResult:
    nnodes = max(1, world // spec.gpus_per_node)
    settings = _settings(shape.name, batch, world, repeat, nnodes)
    figures = aggregate(
        _ranks(shape, batch, world, spec, rng),
        batch_size=batch,
        grad_accum_steps=1,
        precision="bf16",
        unit="samples",
        units_per_sample=1.0,
        flops_per_sample=shape.flops_per_sample,
        device_name=DEVICE,
    )
    return TrainingResult(
        **{**_identity(settings, spec.name), **figures},
        status="ok",
        backend="nccl",
        hosts=[host_name(node) for node in range(nnodes)],
    )


def failure_records(spec: FixtureSpec) -> List[TrainingResult]:
    first, second = spec.models[0].name, spec.models[-1].name
    cases: List[Tuple[str, int, int, CellStatus, str]] = [
        (
            first,
            256,
            1,
            "oom",
            "rank 0 on node-a failed in forward: OutOfMemoryError: CUDA out "
            "of memory. Tried to allocate 2.00 GiB",
        ),
        (
            second,
            256,
            2,
            "failed",
            "rank 1 on node-a failed in backward: DistBackendError: NCCL "
            "error: unhandled system error (then ranks [0] failed too)",
        ),
        (first, 32, 16, "skipped", "needs 16 GPUs per node; this node has 8 GPUs"),
    ]
    return [
        TrainingResult(
            **_identity(_settings(model, batch, gpus, 0), spec.name), status=status, error=error
        )
        for model, batch, gpus, status, error in cases
    ]


def collective_documents(spec: FixtureSpec) -> List[dict]:
    """nccl-tests style records: time = latency + bytes / link rate, busbw = algbw x factor."""
    docs = []
    for op, factor in BUSBW_FACTOR.items():
        for world in (2, 4, 8):
            for size in (2**k for k in range(10, 29, 3)):
                # 85% of the link's peak bus bandwidth once latency is amortised
                time_us = 8.0 + size * factor(world) / (LINK_PEAK_GBPS * 0.85 * 1e3)
                algbw = size / time_us / 1e3
                docs.append(
                    {
                        "schema_version": 1,
                        "kind": "collective",
                        "experiment": spec.name,
                        "cell_id": f"comm-{op}-g{world}-{size}",
                        "status": "ok",
                        "op": op,
                        "dtype": "float32",
                        "world_size": world,
                        "nproc_per_node": world,
                        "size_bytes": size,
                        "time_us": time_us,
                        "algbw_gbps": algbw,
                        "busbw_gbps": algbw * factor(world),
                        "wrong": 0,
                        "link_peak_gbps": LINK_PEAK_GBPS,
                        "busbw_peak_fraction": algbw * factor(world) / LINK_PEAK_GBPS,
                    }
                )
    docs.append(
        {
            "schema_version": 1,
            "kind": "collective",
            "experiment": spec.name,
            "cell_id": "comm-broadcast-g8",
            "status": "failed",
            "op": "broadcast",
            "dtype": "float32",
            "world_size": 8,
            "nproc_per_node": 8,
            "size_bytes": 1024,
            "wrong": 12,
            "error": "broadcast: 12 wrong elements on rank 5",
        }
    )
    return docs


PROFILE_FINDINGS = [
    {
        "severity": "high",
        "category": "straggler",
        "title": "GPU 3 finishes backward late",
        "message": "NCCL all_reduce waits 15.0% of step time for rank 3",
        "ranks": [3],
        "recommendation": "Check rank 3's clocks: nvidia-smi -q -d PERFORMANCE",
    },
    {
        "severity": "info",
        "category": "overlap",
        "message": "Overlap is 71% in backward",
        "ranks": [],
        "recommendation": "Raise ddp.bucket_cap_mb",
    },
]


def environment() -> dict:
    return {
        "host": "node-a",
        "platform": "Linux-6.8-x86_64",
        "python": "3.11.7",
        "torch": "2.5.1+cu124",
        "cuda": "12.4",
        "cudnn": 90100,
        "nccl": "2.21.5",
        "driver": "550.90.07",
        "backend": "nccl",
        "device_kind": "cuda",
        "device_count": 8,
        "gpus": [{"index": i, "name": DEVICE, "memory_bytes": 85520809984} for i in range(8)],
        "env": {"NCCL_DEBUG": "INFO", "NCCL_IB_DISABLE": "0"},
        "topology": {"GPU0": ["X", "NV18"], "GPU1": ["NV18", "X"]},
    }


def write_experiment(root: Path, spec: FixtureSpec) -> Path:
    """Write ``root/<experiment>/`` as ``torchscale benchmark`` would; returns its folder."""
    store = ExperimentStore(root / experiment_dirname(spec.name))
    store.write_manifest(
        {"schema_version": 1, "experiment": spec.name, "environment": environment(), "config": {}}
    )
    rng = np.random.default_rng(spec.seed)
    for repeat in range(spec.repeats):
        for shape in spec.models:
            for batch in spec.batch_sizes:
                for world in spec.gpu_counts:
                    store.append(training_record(shape, batch, world, repeat, spec, rng))
    if spec.failures:
        for record in failure_records(spec):
            store.append(record)
    if spec.collectives:
        for doc in collective_documents(spec):
            append_jsonl(store.results_path, doc)
    if spec.findings:
        profile = store.cell_dir("profile-8gpu") / "profile"
        profile.mkdir(parents=True)
        (profile / "findings.json").write_text(json.dumps(PROFILE_FINDINGS), encoding="utf-8")
    return store.root


def stall_findings(stall_pct: float, cv: float) -> dict:
    """A ``findings.json`` as ``torchscale profile`` writes it: the sync stall and two findings
    whose titles carry the trace's own numbers."""
    return {
        "schema": "torchscale.profile.findings/1",
        "sync_stall_pct": stall_pct,
        "findings": [
            {
                "severity": "medium",
                "category": "sync",
                "title": f"Ranks wait {stall_pct:.1f}% of step time in collectives, with no single "
                "straggler",
                "recommendation": "Ranks take turns arriving late.",
                "ranks": [0, 1],
            },
            {
                "severity": "medium",
                "category": "sync",
                "title": f"Gradient synchronization: high variance in sync time (cv {cv:.2f})",
                "recommendation": "Look for contention.",
                "ranks": [0, 1],
            },
        ],
    }


def write_cell_findings(experiment: Path, cell_id: str, document: dict) -> Path:
    """``cells/<cell_id>/profile/findings.json``, as a profiled cell leaves it."""
    folder = ExperimentStore(experiment).cell_dir(cell_id) / PROFILE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / FINDINGS_FILE).write_text(json.dumps(document), encoding="utf-8")
    return folder


def write_profile_run(
    root: Path, benchmark: TrainingResult, document: dict, stamp: str = "20260101-120000"
) -> Path:
    """``root/profile-<model>-g<N>-<stamp>/`` as ``torchscale profile --output-dir root`` writes
    it for the configuration of ``benchmark``: one traced cell with a measured window of its own
    (5 + 20 steps instead of the benchmark's) and its ``findings.json``; returns its folder."""
    name = profile_run_name(benchmark.model, benchmark.world_size, stamp)
    settings = {**benchmark.settings, "warmup_steps": 5, "measure_steps": 20, "sync_probe_steps": 5}
    record = benchmark.model_copy(
        update={
            "experiment": name,
            "cell_id": benchmark.cell_id + "-profiled",
            "settings": settings,
            "throughput": (benchmark.throughput or 0.0) * 0.97,
            "profile": ProfileInfo(
                tool="torch", profiled=True, reason="profiling enabled for every cell",
                steps=120, dir=PROFILE_DIR,
            ),
        }
    )  # fmt: skip
    store = ExperimentStore(root / experiment_dirname(name))
    store.write_manifest({"schema_version": 1, "experiment": name, "config": {}})
    store.append(record)
    write_cell_findings(store.root, record.cell_id, document)
    return store.root


SessionReport = Callable[[Path, str], Path]
"""The session fixture ``session_report(folder, fmt)``: a results folder's report, built once."""


def write_fixture_results(root: Path) -> Path:
    """The default fixture experiment (the session fixture ``fixture_results``)."""
    return write_experiment(root, FixtureSpec())


NODE_SPEC = FixtureSpec(
    name="fixture-nodes",
    batch_sizes=(32,),
    gpu_counts=(1, 2, 4, 8, 16),  # 8 and 16 run as 2 x 4 and 4 x 4
    gpus_per_node=4,
    straggler=None,
    failures=False,
    collectives=False,
    findings=False,
)
UNSPLIT_SPEC = replace(
    NODE_SPEC, models=MODELS[:1], batch_sizes=(64,), gpu_counts=(1, 2, 8), seed=1
)
"""A second configuration of the same experiment: its 2 x 4 cell has no 1 x 4 cell to split by."""


def write_node_results(root: Path) -> Path:
    """One experiment with cells on 1, 2 and 4 nodes (the session fixture ``node_results``)."""
    write_experiment(root, NODE_SPEC)
    return write_experiment(root, UNSPLIT_SPEC)
