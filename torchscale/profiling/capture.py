"""``torchscale profile``: run one benchmark cell per model and batch size, traced.

Capture is the benchmark engine with profiling switched on, so a profiled run is launched,
measured and recorded exactly like a benchmark cell: torchrun of the DDP worker, a measured
window (the cell's throughput and gradient-sync figures), then the traced window of the
requested duration (torch.profiler, or nsys wrapped around every rank), then the analysis, which
writes ``findings.json`` beside the traces.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from torchscale.config.loader import Override, load_config, read_yaml
from torchscale.config.schema import BenchmarkConfig
from torchscale.errors import TorchscaleError
from torchscale.plan.matrix import experiment_dirname

TOOLS = ("auto", "nsys", "torch")

# A short measured window first: the cell's own throughput and sync figures come with the trace.
MODEL_DEFAULTS = {"warmup_steps": 5, "measure_steps": 20, "sync_probe_steps": 5}


@dataclass(frozen=True)
class CaptureRequest:
    gpus: int
    duration_s: float
    target: str
    tool: str
    config: Optional[Path] = None
    model: Optional[str] = None
    batch_size: Optional[int] = None
    overrides: Sequence[Override] = ()


def capture_config(request: CaptureRequest, now: Optional[datetime] = None) -> BenchmarkConfig:
    """The benchmark config a capture runs: one GPU count, profiling always on, a fresh name."""
    if request.config is not None:
        raw: Dict[str, Any] = read_yaml(request.config)
        name = str(raw.get("experiment_name") or request.config.stem)
    elif request.model and request.batch_size:
        raw = {"models": [request.model], "batch_sizes": [request.batch_size], **MODEL_DEFAULTS}
        name = request.model
    else:
        raise TorchscaleError("say what to profile: --model M --batch-size B, or --config FILE")
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    raw["experiment_name"] = f"profile-{name}-g{request.gpus}-{stamp}"
    raw["gpu_counts"] = [request.gpus]
    raw["profiling"] = {
        **(raw.get("profiling") or {}),
        "enabled": True,
        "tool": request.tool,
        "target": request.target,
        "trigger": "always",
        "duration_s": request.duration_s,
    }
    return load_config(None, request.overrides, base=raw)


def run_capture(request: CaptureRequest, output_dir: Path, events: Any) -> List[Any]:
    """Run the traced cells; returns their records (profile folder in ``record.profile``)."""
    from torchscale.launch.sweep import SweepOptions, run_sweep
    from torchscale.plan.matrix import expand
    from torchscale.results.store import ExperimentStore, check_writable

    plan = expand(capture_config(request))
    check_writable(output_dir)
    store = ExperimentStore(output_dir / experiment_dirname(plan.config.experiment_name))
    return [(record, store) for record in run_sweep(plan, store, SweepOptions(), events)]
