"""Expand a ``BenchmarkConfig`` into the ordered list of cells to run.

Order: repeats outermost (so repeated runs interleave and share drift), then model, batch size, the
other swept knobs, and GPU count innermost (then node count), so each model's 1-GPU baseline runs
right before the counts that are compared with it. Communication cells (``torchscale.comm.plan``)
follow.

The size of the matrix is computed from the lengths of its lists before a single cell is built
(:func:`count_cells`), and a matrix above ``--max-cells`` (10,000 by default) is refused: a short
config must not expand into millions of cells by accident. :func:`iter_cells` builds the cells
one at a time, so ``--dry-run`` can print a plan it never holds whole.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import unicodedata
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
LATER_DEFAULTS = {
    "backend": "auto",
    "cudnn_benchmark": True,
    "tf32": None,
    "optimizer_impl": "auto",
}
"""Knobs added after results existed: at their default they are left out of a cell's identity."""

DEFAULT_MAX_CELLS = 10_000
"""The largest matrix expanded without ``--max-cells``."""


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


SAFE_NAME_BYTES = 200
"""Longest experiment name (UTF-8 bytes) used as a folder name as it is; file systems allow 255."""


def _safe_char(char: str) -> bool:
    """Letters (with their combining marks) and digits of any script, ``-``, ``_`` and ``.``."""
    return char in "-_." or unicodedata.category(char)[0] in "LMN"


def is_safe_name(name: str) -> bool:
    """Whether ``name`` can be a folder name as it is, on any file system and in any shell."""
    return (
        bool(name)
        and name not in (".", "..")
        and not name.startswith(("-", "."))
        and len(name.encode("utf-8")) <= SAFE_NAME_BYTES
        and unicodedata.is_normalized("NFC", name)
        and all(_safe_char(c) for c in name)
    )


def experiment_dirname(name: str) -> str:
    """The folder of an experiment: its name when that is a safe file name (:func:`is_safe_name`,
    any script), else the name made safe plus ``+`` and a short hash of the original. A safe name
    never contains ``+``, so two different names never share a folder (the name itself is kept in
    the manifest and every record)."""
    if is_safe_name(name):
        return name
    safe = "".join(c if _safe_char(c) else "-" for c in unicodedata.normalize("NFC", name))
    safe = re.sub(r"-{2,}", "-", safe).strip("-.")[:48] or "experiment"
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:10]
    return f"{safe}+{digest}"


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


def _training_knobs(config: BenchmarkConfig, window: Dict[str, Any]) -> List[Tuple[str, List]]:
    return [
        (name, values)
        for name, values in _knob_axes(config)
        if name.split(".")[0] in TrainingSettings.model_fields and name not in window
    ]


def _training_swept(config: BenchmarkConfig, knobs: List[Tuple[str, List]]) -> List[str]:
    swept = [name for name, values in knobs if len(values) > 1]
    swept += [
        key for key in ("models", "batch_sizes", "gpu_counts") if len(getattr(config, key)) > 1
    ]
    if config.nodes is not None and len(config.nodes) > 1:
        swept.append("nodes")
    return swept


def _iter_training_settings(
    config: BenchmarkConfig, window: Dict[str, Any], gpus_per_node: Optional[int]
) -> Iterator[CellSettings]:
    """Every combination of the training axes and knobs (``window`` overrides), one at a time."""
    for model in config.models:
        check_model_name(model)
    knobs = _training_knobs(config, window)
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
                    yield CellSettings.model_validate(raw)
                except ValidationError as exc:
                    raise ConfigError(f"invalid config: {explain(exc, raw)}") from None


def count_cells(
    config: BenchmarkConfig, benchmark: str = "all", gpus_per_node: Optional[int] = None
) -> Tuple[int, str]:
    """How many cells the matrix has at most, from the lengths of its lists alone (nothing is
    expanded), and which lists make it: ``(2000000, "models 2 x batch_sizes 1000 x ...")``."""
    from torchscale.comm.plan import comm_gpu_counts

    total, factors = 0, []
    if benchmark in ("all", "training", "memory") and config.models:
        window = MEMORY_WINDOW if benchmark == "memory" else {}
        knobs = [(n, len(v)) for n, v in _training_knobs(config, window) if len(v) > 1]
        other = math.prod(n for name, n in knobs if name != "seq_len")
        seq_lens = dict(knobs).get("seq_len", 1)
        per_gpu = sum(len(node_counts(g, config, gpus_per_node)) for g in config.gpu_counts)
        per_model = sum(seq_lens if uses_seq_len(m) else 1 for m in config.models)
        total += config.repeats * per_model * len(config.batch_sizes) * other * per_gpu
        factors += [
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
    if benchmark in ("all", "comm") and config.communication is not None:
        per_gpu = sum(len(node_counts(g, config, gpus_per_node)) for g in comm_gpu_counts(config))
        total += config.repeats * per_gpu
        factors.append(f"communication {config.repeats * per_gpu}")
    return total, " x ".join(factors) or "1"


def check_size(
    config: BenchmarkConfig,
    benchmark: str = "all",
    gpus_per_node: Optional[int] = None,
    max_cells: Optional[int] = DEFAULT_MAX_CELLS,
) -> int:
    """The matrix's size; a :class:`ConfigError` when it is above ``max_cells``."""
    total, factors = count_cells(config, benchmark, gpus_per_node)
    if max_cells is not None and total > max_cells:
        raise ConfigError(
            f"the matrix has {total:,} cells ({factors}), more than --max-cells {max_cells:,}: "
            "shorten the lists, or pass --max-cells N to run that many"
        )
    return total


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


def _check_dataset(source: str, path: str) -> None:
    """A dataset with a known layout (cifar100, imagenet) that is not on disk: one line saying
    where to put it, before any launch (torchscale never downloads)."""
    problem = dataset_problem(source, path)
    if problem:
        raise ConfigError(problem)


def iter_cells(
    config: BenchmarkConfig,
    benchmark: str = "all",
    gpus_per_node: Optional[int] = None,
    max_cells: Optional[int] = DEFAULT_MAX_CELLS,
) -> Iterator[Cell]:
    """The cells of :func:`expand`, in the same order, built one at a time (the size is checked
    against ``max_cells`` before the first)."""
    from torchscale.comm.plan import KIND as COMM_KIND
    from torchscale.comm.plan import comm_cell_id, comm_settings

    _check_selection(config, benchmark)
    check_size(config, benchmark, gpus_per_node, max_cells)
    seen = set()
    index = 0
    if benchmark in ("all", "training", "memory") and config.models:
        window = MEMORY_WINDOW if benchmark == "memory" else {}
        checked = set()
        for settings in _iter_training_settings(config, window, gpus_per_node):
            data = (settings.data.source, settings.data.path or "")
            if data not in checked:
                checked.add(data)
                _check_dataset(*data)
            cid = cell_id(settings)
            if cid not in seen:
                seen.add(cid)
                yield Cell(index, cid, settings, "training")
                index += 1
    if benchmark in ("all", "comm"):
        for comm in comm_settings(config, gpus_per_node):
            cid = comm_cell_id(comm)
            if cid not in seen:
                seen.add(cid)
                yield Cell(index, cid, comm, COMM_KIND)
                index += 1


def swept_knobs(config: BenchmarkConfig, benchmark: str = "all") -> List[str]:
    """Dotted names of the training knobs with more than one value."""
    if benchmark not in ("all", "training", "memory") or not config.models:
        return []
    window = MEMORY_WINDOW if benchmark == "memory" else {}
    return _training_swept(config, _training_knobs(config, window))


def expand(
    config: BenchmarkConfig,
    benchmark: str = "all",
    gpus_per_node: Optional[int] = None,
    max_cells: Optional[int] = DEFAULT_MAX_CELLS,
) -> Plan:
    """Every combination of the config's values, validated as cells, duplicates removed.

    Training cells come first (in the order above), then one communication cell per GPU count.
    ``gpus_per_node`` is the launch's node size, used when the config gives neither ``nodes`` nor
    ``gpus_per_node`` (see :func:`node_counts`). A matrix of more than ``max_cells`` cells is a
    :class:`ConfigError`, raised before any cell is built.
    """
    cells = list(iter_cells(config, benchmark, gpus_per_node, max_cells))
    return Plan(config, cells, swept_knobs(config, benchmark))
