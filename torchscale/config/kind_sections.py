"""The sections kinds add to the benchmark YAML, and the config model that holds them.

``settings.BenchmarkConfig`` is the config without them: the matrix, the training knobs,
``profiling:`` and ``tune:``. Each kind names its own section (``CellKind.config_section``,
``communication:`` for the communication kind), and :func:`config_model` is ``BenchmarkConfig``
with one optional field per registered section, so a section is validated (unknown keys and all)
where it is defined, and this package never imports a kind's package.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple, Type

from pydantic import BaseModel, Field, create_model

from torchscale.config.foreign_layouts import GPU_SUITE_LAYOUT, ForeignLayout
from torchscale.config.settings import BenchmarkConfig
from torchscale.errors import TorchscaleError
from torchscale.kinds.kind_registry import registered_kinds


@dataclass(frozen=True)
class ConfigSection:
    """A kind's section of the benchmark YAML."""

    key: str
    """Its top-level key: ``communication``."""
    model: Type[BaseModel]
    """Its model (a ``config.base.StrictModel``, so unknown keys are errors)."""
    description: str
    """One line for the reference (docs/config.md)."""
    notes: Dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    """Reference titles' notes, by dotted path below the key (``""`` for the section itself):
    ``{"": "not swept: one launch per GPU count"}``."""
    layouts: Tuple[ForeignLayout, ...] = field(default=(), compare=False, hash=False)
    """Other tools' spellings of this section (DDLB's ``benchmark:`` block for
    ``communication:``), read as it (``config.foreign_layouts``)."""


def kind_sections() -> Tuple[ConfigSection, ...]:
    """The sections of the registered kinds, in plan order."""
    sections = []
    for kind in registered_kinds():
        section = getattr(kind, "config_section", None)
        if section is None:
            continue
        if not isinstance(section, ConfigSection):
            raise TorchscaleError(
                f"cell kind {getattr(kind, 'name', kind)!r}: config_section must be a "
                "torchscale.config.kind_sections.ConfigSection or None"
            )
        sections.append(section)
    return tuple(sections)


def foreign_layouts() -> Tuple[ForeignLayout, ...]:
    """Every other tool's layout the loader reads: the kinds' own first (they claim their files
    by content), then the GPU Training Benchmark Suite's, which spells the top-level knobs."""
    return (
        *(layout for section in kind_sections() for layout in section.layouts),
        GPU_SUITE_LAYOUT,
    )


def config_model() -> Type[BenchmarkConfig]:
    """``BenchmarkConfig`` with a field for every registered kind's section."""
    return _compose(kind_sections())


@functools.cache
def _compose(sections: Tuple[ConfigSection, ...]) -> Type[BenchmarkConfig]:
    taken = [s.key for s in sections if s.key in BenchmarkConfig.model_fields]
    if taken:
        raise TorchscaleError(f"a cell kind's config section reuses the key {taken[0]!r}")
    fields: Dict[str, Any] = {
        s.key: (Optional[s.model], Field(None, description=s.description)) for s in sections
    }
    return create_model(BenchmarkConfig.__name__, __base__=BenchmarkConfig, **fields)
