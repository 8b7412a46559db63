"""Expand a ``BenchmarkConfig`` into the ordered list of cells to run.

Order: repeats outermost (so repeated runs interleave and share drift), then model, batch size, the
other swept knobs, and GPU count innermost (then node count), so each model's 1-GPU baseline runs
right before the counts that are compared with it. Communication cells (``torchscale.comm.plan``)
follow.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from pydantic import BaseModel, ValidationError

from torchscale.config.datasets import dataset_problem
from torchscale.config.loader import explain
from torchscale.config.schema import BenchmarkConfig, CellSettings, TrainingSettings
from torchscale.errors import ConfigError
from torchscale.models.registry import check_model_name, uses_seq_len

# Settings that do not change what a cell measures, left out of its identity, so that --resume
# after raising a timeout still recognises finished cells.
NON_IDENTITY_FIELDS = {"repeat", "cell_timeout_s"}
LATER_DEFAULTS = {"backend": "auto", "cudnn_benchmark": True, "tf32": None}
"""Knobs added after results existed: at their default they are left out of a cell's identity."""


@dataclass(frozen=True)
class Cell:
    """One torchrun launch of the matrix."""

    index: int
    cell_id: str
    settings: Any  # CellSettings for training; each kind has its own settings model
    kind: str = "training"


@dataclass(frozen=True)
class Plan:
    config: BenchmarkConfig
    cells: List[Cell]
    swept: List[str]  # dotted names of the knobs with more than one value

    def __len__(self) -> int:
        return len(self.cells)

    def __iter__(self) -> Iterator[Cell]:
        return iter(self.cells)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "x"


def experiment_dirname(name: str) -> str:
    """A safe folder name for an experiment (the name itself is kept in the manifest)."""
    return _slug(name)[:80]


def settings_digest(settings: BaseModel) -> str:
    identity = settings.model_dump(mode="json", exclude=NON_IDENTITY_FIELDS)
    for name, default in LATER_DEFAULTS.items():  # so ids from before the knob stay the same
        if name in identity and identity[name] == default:
            del identity[name]
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(blob.encode()).hexdigest()[:8]


def cell_id(settings: CellSettings) -> str:
    """Readable and stable: the same settings always give the same id (what --resume matches)."""
    parts = [_slug(settings.model), f"b{settings.batch_size}", f"g{settings.gpus}"]
    if settings.nnodes > 1:
        parts.append(f"n{settings.nnodes}")
    parts += [settings.precision, f"r{settings.repeat}", settings_digest(settings)]
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


def node_counts(gpus: int, config: BenchmarkConfig, gpus_per_node: Optional[int]) -> List[int]:
    """The node counts a cell of ``gpus`` total ranks runs on.

    ``nodes:`` lists them (those that divide ``gpus``); else ``gpus_per_node`` (the config's, or
    the launch's node size) splits a count larger than one node evenly; else one node.
    """
    if config.nodes is not None:
        counts = [n for n in config.nodes if gpus % n == 0]
        if not counts:
            raise ConfigError(
                f"invalid config: gpu_counts {gpus} cannot be spread evenly over any of "
                f"nodes {config.nodes}: remove it or add a node count that divides it"
            )
        return counts
    per_node = config.gpus_per_node or gpus_per_node
    if per_node is None or gpus <= per_node:
        return [1]
    if gpus % per_node:
        raise ConfigError(
            f"invalid config: gpu_counts {gpus} is not a multiple of {per_node} GPUs per node: "
            "use multiples of gpus_per_node above one node"
        )
    return [gpus // per_node]


BENCHMARKS = ("all", "training", "memory", "comm")
"""What ``--benchmark`` selects: ``all`` is everything the config defines; ``training`` the model
cells; ``memory`` the model cells with a short window (``MEMORY_WINDOW``) that records each rank's
memory and skips the sync probe; ``comm`` the ``communication:`` cells."""

MEMORY_WINDOW: Dict[str, Any] = {
    "warmup_steps": 1,
    "measure_steps": 3,
    "measure_seconds": None,
    "sync_probe_steps": 0,
}


def _training_settings(
    config: BenchmarkConfig, window: Dict[str, Any], gpus_per_node: Optional[int]
) -> Tuple[List[CellSettings], List[str]]:
    """Every combination of the training axes and knobs (``window`` overrides), and the swept."""
    for model in config.models:
        check_model_name(model)
    knobs = [
        (name, values)
        for name, values in _knob_axes(config)
        if name.split(".")[0] in TrainingSettings.model_fields and name not in window
    ]
    swept = [name for name, values in knobs if len(values) > 1]
    swept += [
        key for key in ("models", "batch_sizes", "gpu_counts") if len(getattr(config, key)) > 1
    ]
    if config.nodes is not None and len(config.nodes) > 1:
        swept.append("nodes")
    cells: List[CellSettings] = []
    knob_names = [name for name, _ in knobs]
    for repeat in range(config.repeats):
        for model, batch_size, *knob_values, gpus in itertools.product(
            config.models, config.batch_sizes, *(values for _, values in knobs), config.gpu_counts
        ):
            flat = {**dict(zip(knob_names, knob_values)), **window}
            if not uses_seq_len(model):
                flat["seq_len"] = None  # a seq_len sweep must not duplicate image-model cells
            for nnodes in node_counts(gpus, config, gpus_per_node):
                raw = _nest(flat)
                raw.update(
                    model=model, batch_size=batch_size, gpus=gpus, nnodes=nnodes, repeat=repeat
                )
                try:
                    cells.append(CellSettings.model_validate(raw))
                except ValidationError as exc:
                    raise ConfigError(f"invalid config: {explain(exc, raw)}") from None
    return cells, swept


def _check_selection(config: BenchmarkConfig, benchmark: str) -> None:
    if benchmark not in BENCHMARKS:
        raise ConfigError(
            f"unknown --benchmark '{benchmark}': choose one of {', '.join(BENCHMARKS)}"
        )
    if benchmark in ("training", "memory") and not config.models:
        raise ConfigError(
            f"--benchmark {benchmark} needs models, and the config lists none: add models: [...] "
            "or use --benchmark comm"
        )
    if benchmark == "comm" and config.communication is None:
        raise ConfigError(
            "--benchmark comm needs a communication: section in the config "
            "(see docs/communication.md)"
        )


def _check_datasets(training: List[CellSettings]) -> None:
    """A dataset with a known layout (cifar100, imagenet) that is not on disk: one line saying
    where to put it, before any launch (torchscale never downloads)."""
    for source, path in sorted({(s.data.source, s.data.path or "") for s in training}):
        problem = dataset_problem(source, path)
        if problem:
            raise ConfigError(problem)


def expand(
    config: BenchmarkConfig, benchmark: str = "all", gpus_per_node: Optional[int] = None
) -> Plan:
    """Every combination of the config's values, validated as cells, duplicates removed.

    Training cells come first (in the order above), then one communication cell per GPU count.
    ``gpus_per_node`` is the launch's node size, used when the config gives neither ``nodes`` nor
    ``gpus_per_node`` (see :func:`node_counts`).
    """
    from torchscale.comm.plan import KIND as COMM_KIND
    from torchscale.comm.plan import comm_cell_id, comm_settings

    _check_selection(config, benchmark)
    cells: List[Cell] = []
    seen = set()

    def add(cid: str, settings: Any, kind: str) -> None:
        if cid not in seen:
            seen.add(cid)
            cells.append(Cell(len(cells), cid, settings, kind))

    swept: List[str] = []
    if benchmark in ("all", "training", "memory") and config.models:
        window = MEMORY_WINDOW if benchmark == "memory" else {}
        training, swept = _training_settings(config, window, gpus_per_node)
        for settings in training:
            add(cell_id(settings), settings, "training")
        _check_datasets(training)
    if benchmark in ("all", "comm"):
        for comm in comm_settings(config, gpus_per_node):
            add(comm_cell_id(comm), comm, COMM_KIND)
    return Plan(config, cells, swept)
