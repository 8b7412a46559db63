"""What one kind of cell provides to config, plan, launch and the console, and the registry's
kinds checked against it.

The registry (``torchscale.kinds.kind_registry``) names the kinds; :func:`cell_kinds` loads them
and checks each against :class:`CellKind`, so a kind that lacks a piece is one line naming it, not
an ``AttributeError`` in the middle of a sweep. The report's pieces are
``torchscale.report.reported_kinds.ReportedKind``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    Iterator,
    List,
    Optional,
    Protocol,
    Tuple,
    Type,
    runtime_checkable,
)

from pydantic import BaseModel
from typing_extensions import get_protocol_members

from torchscale.config.kind_sections import ConfigSection
from torchscale.config.settings import BenchmarkConfig
from torchscale.errors import TorchscaleError
from torchscale.kinds.kind_registry import kind_modules, load_kinds
from torchscale.plan.planned_cell import Cell, KindSettings
from torchscale.results.schema import CellStatus, ResultBase

if TYPE_CHECKING:
    from pandas import DataFrame
    from rich.console import Console, RenderableType


@runtime_checkable
class CellKind(Protocol):
    """One kind of cell, from the config section it plans to the lines a finished cell prints."""

    name: str
    """The cell kind (``Cell.kind``)."""
    config_section: Optional[ConfigSection]
    """Its section of the benchmark YAML (``communication:``), or None: the config's top level."""
    settings_model: Type[BaseModel]
    """The model of its cells' settings (what its worker reads back from the cell file)."""
    worker_module: str
    """What every rank runs: ``python -m <worker_module>``."""
    record_models: Tuple[Type[ResultBase], ...]
    """The record models its cells write (their ``kind`` fields are the record kinds)."""
    selections: Tuple[str, ...]
    """The ``--benchmark`` choices that run it."""
    profiled: bool
    """Whether ``--profile`` traces its cells."""
    joins_warm_groups: bool
    """Whether its cells can run back to back in one warm process group (``launch: per_group``);
    a kind that sets per-launch state (communicators per scope) gets a launch per cell."""
    own_threads: bool
    """Whether its CPU ranks keep the thread count plain torchrun gives them (a user's own
    script), instead of their slot's share of the cores that the built-in kinds take so that
    every rank count compares like with like (``launch.cpu_threads``)."""

    def missing(self, config: BenchmarkConfig) -> Optional[str]:
        """Why ``config`` plans none of its cells (a hint on what to add), or None."""
        ...

    def count(
        self, config: BenchmarkConfig, benchmark: str, gpus_per_node: Optional[int]
    ) -> Tuple[int, List[str]]:
        """How many cells at most, from list lengths alone, and the lists that make it."""
        ...

    def plan(
        self, config: BenchmarkConfig, benchmark: str, gpus_per_node: Optional[int]
    ) -> Iterator[KindSettings]:
        """The settings of its cells, in run order, one at a time."""
        ...

    def cell_id(self, settings: KindSettings) -> str:
        """Readable and stable: the same settings always give the same id (what --resume
        matches)."""
        ...

    def swept(self, config: BenchmarkConfig, benchmark: str) -> List[str]:
        """Dotted names of its knobs with more than one value (the plan table's columns)."""
        ...

    def records(
        self, cell: Cell, identity: Dict[str, Any], result: Dict[str, Any]
    ) -> List[ResultBase]:
        """Records of a launch whose rank 0 wrote ``result`` (the worker's result.json)."""
        ...

    def failed(
        self, cell: Cell, identity: Dict[str, Any], status: CellStatus, error: str
    ) -> List[ResultBase]:
        """Records of a launch that produced no result (oom, failed, timeout, skipped)."""
        ...

    def analyze_traces(self, profile_dir: Path, target: str) -> Dict[str, object]:
        """After a profiled cell: analyse its traces; fields for the record's ``profile`` block."""
        ...

    def describe(self, cell: Cell, device_kind: str = "cuda") -> str:
        """One line naming the cell: ``resnet50 on 4 GPUs (batch 32, fp32)``; on a node without
        GPUs (``device_kind`` cpu) ``on 4 CPU processes`` (``hardware/device_noun.py``)."""
        ...

    def plan_row(self, cell: Cell, knobs: List[str]) -> List[str]:
        """Its row of the plan table: model, batch, GPUs, precision, then ``knobs``' values."""
        ...

    def console_lines(self, records: List[ResultBase]) -> List[str]:
        """What a finished cell's records add to the console after its own per-record lines."""
        ...

    def console_tables(
        self, records: List[ResultBase], title: str, console: Console
    ) -> List[RenderableType]:
        """Its tables in the summary printed at the end of a benchmark (none: ``[]``)."""
        ...

    def summary_tables(self, records: List[ResultBase]) -> Dict[str, DataFrame]:
        """The CSV summaries of the experiment's records, by file name in the experiment folder
        (``results.layout``); rewritten after every cell."""
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


def cell_kinds() -> Dict[str, CellKind]:
    """Every registered kind by name, in the order their cells run."""
    return _checked(kind_modules())


@functools.cache
def _checked(modules: Tuple[str, ...]) -> Dict[str, CellKind]:
    kinds: Dict[str, CellKind] = {}
    for module, kind in zip(modules, load_kinds(modules)):
        if not isinstance(kind, CellKind):
            lacks = sorted(m for m in get_protocol_members(CellKind) if not hasattr(kind, m))
            raise TorchscaleError(
                f"{module}.KIND is not a cell kind: it lacks {', '.join(lacks)} "
                "(see torchscale.plan.kind_protocol.CellKind)"
            )
        kinds[kind.name] = kind
    return kinds


def get_kind(name: str) -> CellKind:
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


def selected_kinds(benchmark: str) -> List[CellKind]:
    """The kinds a ``--benchmark`` choice runs, in plan order."""
    return [kind for kind in cell_kinds().values() if benchmark in kind.selections]


def benchmark_choices() -> List[str]:
    """Every ``--benchmark`` choice, ``all`` first."""
    choices: List[str] = []
    for kind in cell_kinds().values():
        choices += [choice for choice in kind.selections if choice not in choices]
    return choices
