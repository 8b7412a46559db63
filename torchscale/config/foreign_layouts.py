"""Other tools' config files, read as torchscale configs: their keys are aliases of ours.

A user coming from another benchmark keeps their file and their habits: the GPU Training Benchmark
Suite's nested ``training:`` / ``data:`` / ``model:`` / ``benchmark:`` layout and its
``--training.precision=bf16`` overrides, DDLB's ``config.json`` (``torchscale.comm.ddlb_layout``,
the communication kind's own layout), distributed_benchmarks.py's ``--warmup 20 --iters 200``
(docs/seeds.md names each tool). A :class:`ForeignLayout` names each of their keys by its
torchscale name (:class:`Alias`); the loader moves every alias found to its torchscale key
before validation and says each move in one line, so the user learns the torchscale names.

A key given both ways in one file is an error; an override (``--set`` or ``--key=value``) in
either spelling replaces the file's value in the other (:func:`drop_counterparts`).

No torch here: config errors must be reported without importing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from torchscale.config.base import clip
from torchscale.errors import ConfigError

Raw = Dict[str, Any]


@dataclass(frozen=True)
class Alias:
    """One key of another tool's config and the torchscale key it is."""

    theirs: str
    """Dotted: ``training.precision``."""
    ours: Optional[str]
    """Dotted torchscale key; None: accepted and ignored (``why`` says why)."""
    why: str = ""


@dataclass(frozen=True)
class ForeignLayout:
    """Another tool's layout of a config file."""

    name: str
    """Who writes it, for the notes: ``GPU Training Benchmark Suite``, ``DDLB``."""
    aliases: Tuple[Alias, ...]
    """Keys moved one to one (and the override spellings that work)."""
    roots: Tuple[str, ...] = ()
    """Top-level keys only this layout has: anything left under one after the aliases moved is
    an unknown key of the layout."""
    claims: Callable[[Raw], bool] = lambda raw: True
    """Whether a file is written in this layout (DDLB: a ``benchmark`` block with a
    ``primitive``); its aliases and ``adopt`` apply only then."""
    adopt: Optional[Callable[[Raw], List[str]]] = None
    """Moves what no one-to-one alias can (DDLB's implementation lists) after the aliases;
    returns one note per key it mapped."""
    documented: Tuple[Alias, ...] = ()
    """What ``adopt`` maps, for the reference (docs/config.md)."""


def _parts(dotted: str) -> List[str]:
    return dotted.split(".")


def has_path(raw: Raw, dotted: str) -> bool:
    """Whether ``dotted`` names a value, every section on the way a mapping."""
    node: Any = raw
    for part in _parts(dotted):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def pop_path(raw: Raw, dotted: str) -> Any:
    """Remove and return the value at ``dotted``; sections it leaves empty go too."""
    parts = _parts(dotted)
    trail: List[Raw] = [raw]
    for part in parts[:-1]:
        trail.append(trail[-1][part])
    value = trail[-1].pop(parts[-1])
    for depth in range(len(parts) - 1, 0, -1):
        if trail[depth]:
            break
        del trail[depth - 1][parts[depth - 1]]
    return value


def set_path(raw: Raw, dotted: str, value: Any) -> None:
    """Set ``dotted``, creating (or keeping) the sections above it."""
    node = raw
    for part in _parts(dotted)[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[_parts(dotted)[-1]] = value


def move_aliases(raw: Raw, layout: ForeignLayout) -> List[str]:
    """Move every alias of ``layout`` found in ``raw`` to its torchscale key; one note each."""
    notes = []
    for alias in layout.aliases:
        if not has_path(raw, alias.theirs):
            continue
        value = pop_path(raw, alias.theirs)
        if alias.ours is None:
            notes.append(f"{layout.name}'s {alias.theirs} is not used: {alias.why}")
            continue
        if has_path(raw, alias.ours):
            raise ConfigError(
                f"{alias.theirs} ({layout.name}'s name for {alias.ours}) and {alias.ours} are "
                "both given: keep one"
            )
        set_path(raw, alias.ours, value)
        notes.append(f"{layout.name}'s {alias.theirs} is torchscale's {alias.ours}")
    if notes:  # a file in this layout: its keys that torchscale spells alike are said too
        notes += [
            f"{layout.name}'s {alias.theirs} is torchscale's {alias.ours} (the same key)"
            for alias in layout.documented
            if alias.theirs == alias.ours and has_path(raw, alias.ours)
        ]
    for root in layout.roots:
        left = raw.get(root)
        if not isinstance(left, dict) or not left:
            continue  # ``model: resnet50`` is no section: validation says "did you mean models"
        known = [a.theirs for a in layout.aliases if a.theirs.startswith(f"{root}.")]
        extra = f"{root}.{clip(next(iter(left)), 80)}"
        raise ConfigError(
            f"unknown key '{extra}' ({layout.name}'s layout: torchscale reads "
            f"{', '.join(known)}; see docs/config.md#other-tools-layouts)"
        )
    return notes


def drop_counterparts(raw: Raw, path: Sequence[str], layouts: Sequence[ForeignLayout]) -> None:
    """Before an override at ``path`` is applied: remove the file's value of the same key in the
    other spelling, so the override replaces it instead of clashing with it."""
    dotted = ".".join(path)
    for layout in layouts:
        for alias in layout.aliases:
            if alias.ours is None:
                continue
            if dotted == alias.theirs and has_path(raw, alias.ours):
                pop_path(raw, alias.ours)
            elif dotted == alias.ours and has_path(raw, alias.theirs):
                pop_path(raw, alias.theirs)


def adopt_layouts(raw: Raw, layouts: Sequence[ForeignLayout]) -> List[str]:
    """Rewrite ``raw`` in torchscale's names, layout by layout; the notes say every move."""
    notes: List[str] = []
    for layout in layouts:
        if not layout.claims(raw):
            continue
        notes += move_aliases(raw, layout)
        if layout.adopt is not None:
            notes += layout.adopt(raw)
    return notes


GPU_SUITE_LAYOUT = ForeignLayout(
    "GPU Training Benchmark Suite",
    (
        Alias("training.precision", "precision"),
        Alias("training.epochs", "epochs"),
        Alias("training.seed", "seed"),
        Alias("training.cudnn_benchmark", "cudnn_benchmark"),
        Alias("data.batch_size", "batch_sizes"),
        Alias("model.name", "models"),
        Alias("model.channels_last", "channels_last"),
        Alias("benchmark.warmup_steps", "warmup_steps"),
        Alias("benchmark.measure_steps", "measure_steps"),
        Alias("benchmark.measure_seconds", "measure_seconds"),
        Alias(
            "benchmark.log_step_times",
            None,
            "torchscale always records every measured step's time (step_times_ms; mean, p50, "
            "p95, p99 in step_time_ms)",
        ),
        Alias("benchmark.sync_cuda", "sync_cuda"),
    ),
    roots=("training", "model", "benchmark"),
    documented=(
        Alias("data.source", "data.source", "the same key: synthetic or cifar100 (or any other)"),
        Alias("data.path", "data.path", "the same key; cifar100 defaults to data/"),
    ),
)
"""The GPU Training Benchmark Suite's YAML (``configs/cifar100_resnet50.yaml``): its
``data.source`` and ``data.path`` are torchscale's own."""


@dataclass(frozen=True)
class SeedFlags:
    """distributed_benchmarks.py's ``--warmup N --iters N``: one number for every
    kind of cell."""

    warmup: Optional[int] = None
    iters: Optional[int] = None

    def apply(self, raw: Raw) -> List[str]:
        """Set the knobs the flags stand for; one note per flag."""
        notes = []
        comm = raw.get("communication")
        comm = comm if isinstance(comm, dict) else None
        if self.warmup is not None:
            raw["warmup_steps"] = self.warmup
            keys = "warmup_steps"
            if comm is not None:
                comm["warmup"] = self.warmup
                keys += " and communication.warmup"
            notes.append(f"--warmup {self.warmup} is {keys} (distributed_benchmarks' flag)")
        if self.iters is not None:
            raw["measure_steps"] = self.iters
            keys = "measure_steps"
            if raw.pop("measure_seconds", None) is not None:
                keys += " (replacing measure_seconds)"
            if comm is not None:
                comm["iterations"] = self.iters
                keys += " and communication.iterations"
            notes.append(f"--iters {self.iters} is {keys} (distributed_benchmarks' flag)")
        return notes
