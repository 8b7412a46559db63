"""Plan the training cells of a config: every model x batch size x knob x GPU count.

Order: repeats outermost (so repeated runs interleave and share drift), then model, batch size,
the other swept knobs, and GPU count innermost (then node count), so each model's 1-GPU baseline
runs right before the counts that are compared with it.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Dict, Iterator, List, Optional, Tuple

from pydantic import BaseModel, ValidationError

from torchscale.config.dataset_paths import DOWNLOADED, dataset_problem
from torchscale.config.loader import explain
from torchscale.config.settings import BenchmarkConfig, CellSettings, TrainingSettings
from torchscale.errors import ConfigError
from torchscale.models.registry import check_model_name, uses_seq_len
from torchscale.plan.planned_cell import node_counts, settings_digest, slug

MEMORY_WINDOW: Dict[str, Any] = {
    "warmup_steps": 1,
    "measure_steps": 3,
    "measure_seconds": None,
    "epochs": None,
    "sync_probe_steps": 0,
}
"""``--benchmark memory``: the training cells with a short window that records each rank's memory
and skips the sync probe."""


def training_window(benchmark: str) -> Dict[str, Any]:
    return MEMORY_WINDOW if benchmark == "memory" else {}


def cell_id(settings: CellSettings) -> str:
    """Readable and stable: the same settings always give the same id (what --resume matches)."""
    parts = [slug(settings.model), f"b{settings.batch_size}", f"g{settings.gpus}"]
    if settings.nnodes > 1:
        parts.append(f"n{settings.nnodes}")
    parts.append(settings.precision)
    if settings.strategy != "ddp":  # ddp ids stay as they were before strategies
        parts.append(slug(settings.strategy))
    parts += [f"r{settings.repeat}", settings_digest(settings)]
    return "-".join(parts)


def _knob_axes(section: BaseModel, prefix: str = "") -> Iterator[Tuple[str, List[Any]]]:
    """(dotted name, values) for every knob of a sweep section, nested sections flattened."""
    for name in type(section).model_fields:
        value = getattr(section, name)
        if isinstance(value, BaseModel):
            yield from _knob_axes(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def _nest(flat: Dict[str, Any]) -> Dict[str, Any]:
    nested: Dict[str, Any] = {}
    for dotted, value in flat.items():
        node = nested
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def _training_knobs(config: BenchmarkConfig, window: Dict[str, Any]) -> List[Tuple[str, List[Any]]]:
    return [
        (name, values)
        for name, values in _knob_axes(config)
        if name.split(".")[0] in TrainingSettings.model_fields and name not in window
    ]


def training_swept(config: BenchmarkConfig, benchmark: str) -> List[str]:
    """Dotted names of the training knobs (and matrix lists) with more than one value."""
    knobs = _training_knobs(config, training_window(benchmark))
    swept = [name for name, values in knobs if len(values) > 1]
    swept += [
        key for key in ("models", "batch_sizes", "gpu_counts") if len(getattr(config, key)) > 1
    ]
    if config.nodes is not None and len(config.nodes) > 1:
        swept.append("nodes")
    return swept


def count_training(
    config: BenchmarkConfig, benchmark: str, gpus_per_node: Optional[int]
) -> Tuple[int, List[str]]:
    """How many training cells at most, and the lists that make that number."""
    knobs = [
        (n, len(v)) for n, v in _training_knobs(config, training_window(benchmark)) if len(v) > 1
    ]
    other = math.prod(n for name, n in knobs if name != "seq_len")
    seq_lens = dict(knobs).get("seq_len", 1)
    per_gpu = sum(len(node_counts(g, config, gpus_per_node)) for g in config.gpu_counts)
    per_model = sum(seq_lens if uses_seq_len(m) else 1 for m in config.models)
    total = config.repeats * per_model * len(config.batch_sizes) * other * per_gpu
    factors = [
        f"{name} {n}"
        for name, n in (
            ("repeats", config.repeats),
            ("models", len(config.models)),
            ("batch_sizes", len(config.batch_sizes)),
            *knobs,
            ("gpu_counts", len(config.gpu_counts)),
        )
        if n > 1
    ]
    return total, factors


def _check_dataset(source: str, path: str) -> None:
    """A dataset with a known layout that is not on disk and is never downloaded (imagenet):
    one line saying where to put it, before any launch. A missing CIFAR-100 is downloaded
    before the first launch (``launch.dataset_fetch``)."""
    if source in DOWNLOADED:
        return
    problem = dataset_problem(source, path)
    if problem:
        raise ConfigError(problem)


def training_settings(
    config: BenchmarkConfig, benchmark: str, gpus_per_node: Optional[int]
) -> Iterator[CellSettings]:
    """Every combination of the training axes and knobs, one at a time (``--benchmark memory``
    overrides the window); each dataset is checked on disk before its first cell."""
    window = training_window(benchmark)
    for model in config.models:
        check_model_name(model)
    knobs = _training_knobs(config, window)
    knob_names = [name for name, _ in knobs]
    checked = set()
    for repeat in range(config.repeats):
        for model, batch_size, *knob_values, gpus in itertools.product(
            config.models, config.batch_sizes, *(values for _, values in knobs), config.gpu_counts
        ):
            flat = {**dict(zip(knob_names, knob_values)), **window}
            if not uses_seq_len(model):
                flat["seq_len"] = None  # a seq_len sweep must not duplicate image-model cells
            if not str(flat.get("strategy", "ddp")).startswith("fsdp2"):
                flat["reshard_after_forward"] = True  # only FSDP2 reshards: no duplicate cells
            for nnodes in node_counts(gpus, config, gpus_per_node):
                raw = _nest(flat)
                raw.update(
                    model=model, batch_size=batch_size, gpus=gpus, nnodes=nnodes, repeat=repeat
                )
                try:
                    settings = CellSettings.model_validate(raw)
                except ValidationError as exc:
                    raise ConfigError(f"invalid config: {explain(exc, raw)}") from None
                data = (settings.data.source, settings.data.path or "")
                if data not in checked:
                    checked.add(data)
                    _check_dataset(*data)
                yield settings
