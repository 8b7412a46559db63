"""What one kind of cell must say itself (:class:`CellKind`), the registry's kinds checked
against it, and which kind wrote a record (:func:`kind_of`).

Training is the core kind: the config's top level, ``TrainingResult``, ``plan/training_cells.py``
and ``worker/`` are the stages' own, and its ``KIND`` binds them. Every other kind plugs in with
the five pieces of :class:`CellKind`; the rest of what the stages ask (config section, console,
CSVs, traces, record ownership) has a default in ``plan.kind_base.KindBase``.

The registry (``torchscale.kinds.kind_registry``) names the kinds; :func:`cell_kinds` loads them
and checks each, so a kind that lacks a piece is one line naming it, not an ``AttributeError`` in
the middle of a sweep. The report's pieces are ``torchscale.report.reported_kinds.ReportedKind``.
"""

from __future__ import annotations

import functools
from typing import (
    Any,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Protocol,
    Tuple,
    Type,
)

from pydantic import BaseModel
from typing_extensions import get_protocol_members

from torchscale.config.settings import BenchmarkConfig
from torchscale.errors import TorchscaleError
from torchscale.kinds.kind_registry import kind_modules, load_kinds
from torchscale.plan.kind_base import KindBase
from torchscale.plan.planned_cell import Cell, KindSettings
from torchscale.results.schema import ResultBase


class CellKind(Protocol):
    """What only a kind can say; everything else has a default in ``plan.kind_base.KindBase``,
    which every kind subclasses (training, the core kind, overrides nearly all of it)."""

    name: str
    """The cell kind (``Cell.kind``)."""
    settings_model: Type[BaseModel]
    """The model of its cells' settings (what its worker reads back from the cell file), usually
    a ``plan.kind_base.LaunchSettings``."""
    worker_module: str
    """What every rank runs: ``python -m <worker_module>``."""
    record_models: Tuple[Type[ResultBase], ...]
    """The record models its cells write (their ``kind`` fields are the record kinds)."""

    def plan(
        self, config: BenchmarkConfig, benchmark: str, gpus_per_node: Optional[int]
    ) -> Iterator[KindSettings]:
        """The settings of its cells, in run order, one at a time."""
        ...


def common_identity(cell: Cell, experiment: str) -> Dict[str, Any]:
    """Fields every record of a cell carries, whatever its kind."""
    s = cell.settings
    return {
        "cell_id": cell.cell_id,
        "experiment": experiment,
        "world_size": s.gpus,
        "nnodes": s.nnodes,
        "nproc_per_node": s.nproc_per_node,
        "repeat": s.repeat,
        "settings": s.model_dump(mode="json"),
    }


def cell_kinds() -> Dict[str, KindBase]:
    """Every registered kind by name, in the order their cells run."""
    return _checked(kind_modules())


def kind_pieces() -> List[str]:
    """Every piece the stages ask of a kind: ``CellKind``'s and ``KindBase``'s defaults."""
    defaults = [m for m in vars(KindBase) if not m.startswith("_")]
    return sorted({*get_protocol_members(CellKind), *defaults})


@functools.cache
def _checked(modules: Tuple[str, ...]) -> Dict[str, KindBase]:
    kinds: Dict[str, KindBase] = {}
    for module, kind in zip(modules, load_kinds(modules)):
        pieces = get_protocol_members(CellKind) if isinstance(kind, KindBase) else kind_pieces()
        lacks = sorted(m for m in pieces if not hasattr(kind, m))
        if lacks or not isinstance(kind, KindBase):
            what = f"it lacks {', '.join(lacks)}" if lacks else "it is no KindBase"
            raise TorchscaleError(
                f"{module}.KIND is not a cell kind: {what} (a kind subclasses "
                "torchscale.plan.kind_base.KindBase and defines name, settings_model, "
                "worker_module, record_models and plan)"
            )
        kinds[kind.name] = kind
    return kinds


def get_kind(name: str) -> KindBase:
    """The kind of a cell (``Cell.kind``)."""
    kinds = cell_kinds()
    try:
        return kinds[name]
    except KeyError:
        raise TorchscaleError(
            f"unknown cell kind '{name}': known kinds are {', '.join(kinds)}"
        ) from None


def record_kinds(cell_kind: str) -> List[str]:
    """The record kinds a cell of ``cell_kind`` writes."""
    return [model.model_fields["kind"].default for model in get_kind(cell_kind).record_models]


def selected_kinds(benchmark: str) -> List[KindBase]:
    """The kinds a ``--benchmark`` choice runs, in plan order."""
    return [kind for kind in cell_kinds().values() if benchmark in kind.selections]


def benchmark_choices() -> List[str]:
    """Every ``--benchmark`` choice, ``all`` first."""
    choices: List[str] = []
    for kind in cell_kinds().values():
        choices += [choice for choice in kind.selections if choice not in choices]
    return choices


def kind_of(record: ResultBase) -> Optional[KindBase]:
    """The kind whose cells wrote ``record``, asked of every kind (``KindBase.owns``); None for a
    record no registered kind owns. A kind that claims records of a model it does not declare
    (the script kind's training records) takes them before the model's own kind."""
    owners = [kind for kind in cell_kinds().values() if kind.owns(record)]
    borrowed = [kind for kind in owners if not isinstance(record, kind.record_models)]
    found = borrowed or owners
    return found[0] if found else None


def records_of(name: str, records: Iterable[ResultBase]) -> List[ResultBase]:
    """The records that cells of kind ``name`` wrote (``kind_of``), in order."""
    get_kind(name)  # an unknown name is an error, not an empty list
    found = []
    for record in records:
        owner = kind_of(record)
        if owner is not None and owner.name == name:
            found.append(record)
    return found
