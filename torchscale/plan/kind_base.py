"""The base of every cell kind: a default for each piece a kind may leave out.

A kind says only what no default can: its ``name``, ``settings_model``, ``worker_module``,
``record_models`` and ``plan`` (``plan.kind_protocol.CellKind``). Everything the stages ask
beyond that has a default here, which a kind overrides where it knows better: training, the
core kind, overrides nearly all of them; a new kind (``tests/support/toy_kind.py``) none.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple, Type

from pydantic import BaseModel, NonNegativeInt, PositiveFloat, PositiveInt

from torchscale.config.base import StrictModel
from torchscale.config.kind_sections import ConfigSection
from torchscale.config.settings import BenchmarkConfig
from torchscale.hardware.device_noun import CUDA, count_text
from torchscale.plan.planned_cell import Cell, KindSettings, settings_digest, slug
from torchscale.results.schema import CellStatus, ResultBase

if TYPE_CHECKING:
    from pandas import DataFrame
    from rich.console import Console, RenderableType


class LaunchSettings(StrictModel):
    """What every cell's settings carry (``plan.planned_cell.KindSettings``): a kind's settings
    model subclasses it and adds its own knobs."""

    gpus: PositiveInt
    nnodes: PositiveInt = 1
    repeat: NonNegativeInt = 0
    cell_timeout_s: PositiveFloat = 1800.0
    backend: str = "auto"

    @property
    def nproc_per_node(self) -> int:
        return self.gpus // self.nnodes


def kind_summary_file(name: str) -> str:
    """The CSV a kind's records are summarised in by default: ``summary_<name>.csv``."""
    return f"summary_{slug(name)}.csv"


_SCALARS = (str, int, float, bool, type(None))


class KindBase:
    """A cell kind's defaults. Subclass it, set the five pieces of ``CellKind`` and override
    what the defaults below get wrong for the kind."""

    # The pieces only the kind can say (``plan.kind_protocol.CellKind``): declared, not given.
    name: str
    settings_model: Type[BaseModel]
    worker_module: str
    record_models: Tuple[Type[ResultBase], ...]
    plan: Callable[[BenchmarkConfig, str, Optional[int]], Iterator[KindSettings]]
    """The settings of its cells, in run order, one at a time (``config``, the ``--benchmark``
    choice, the launch's node size)."""

    config_section: Optional[ConfigSection] = None
    """Its section of the benchmark YAML (``communication:``), or None: the config's top level."""
    profiled = False
    """Whether ``--profile`` traces its cells (then ``analyze_traces`` reads the traces)."""
    joins_warm_groups = False
    """Whether its cells can run back to back in one warm process group (``launch:
    per_group``); by default a launch per cell, which sets no state the next cell would see."""
    own_threads = False
    """Whether its CPU ranks keep the thread count plain torchrun gives them (a user's own
    script), instead of their slot's share of the cores that the built-in kinds take so that
    every rank count compares like with like (``launch.cpu_threads``)."""

    @property
    def selections(self) -> Tuple[str, ...]:
        """The ``--benchmark`` choices that run it: ``all`` and its name."""
        return ("all", self.name)

    def owns(self, record: ResultBase) -> bool:
        """Whether its cells wrote ``record``: by default, a record of one of its
        ``record_models``. A kind whose cells write another kind's model (a script's training
        records) says which are its own here; the registry then gives them to it
        (``plan.kind_protocol.kind_of``)."""
        return isinstance(record, self.record_models)

    def missing(self, config: BenchmarkConfig) -> Optional[str]:
        """Why ``config`` plans none of its cells (a hint on what to add), or None: by default,
        its section when the config has none."""
        section = self.config_section
        if section is None or config.kind_section(section.key) is not None:
            return None
        return f"a {section.key}: section"

    def count(
        self, config: BenchmarkConfig, benchmark: str, gpus_per_node: Optional[int]
    ) -> Tuple[int, List[str]]:
        """How many cells at most, and the lists that make it (checked against --max-cells
        before any cell is kept). By default its plan, counted: a kind whose lists can multiply
        into millions counts from their lengths instead."""
        total = sum(1 for _ in self.plan(config, benchmark, gpus_per_node))
        return total, [f"{self.name} {total}"]

    def cell_id(self, settings: KindSettings) -> str:
        """Readable and stable: the same settings always give the same id (what --resume
        matches). By default ``<name>-g<ranks>[-n<nodes>]-r<repeat>-<settings digest>``."""
        nodes = f"-n{settings.nnodes}" if settings.nnodes > 1 else ""
        assert isinstance(settings, BaseModel), type(settings)
        digest = settings_digest(settings)
        return f"{slug(self.name)}-g{settings.gpus}{nodes}-r{settings.repeat}-{digest}"

    def swept(self, config: BenchmarkConfig, benchmark: str) -> List[str]:
        """Dotted names of its knobs with more than one value (the plan table's columns): by
        default its section's lists of more than one value."""
        key = self.config_section.key if self.config_section else None
        section = config.kind_section(key) if key else None
        if section is None:
            return []
        values = section.model_dump()
        return [f"{key}.{n}" for n, v in values.items() if isinstance(v, list) and len(v) > 1]

    def records(
        self, cell: Cell, identity: Dict[str, Any], result: Dict[str, Any]
    ) -> List[ResultBase]:
        """Records of a launch whose rank 0 wrote ``result`` (the worker's result.json): by
        default one of its first record model, from the cell's settings and the result."""
        fields = {**cell.settings.model_dump(mode="json"), **identity, **result}
        return [self.record_models[0].model_validate({**fields, "status": "ok"})]

    def failed(
        self, cell: Cell, identity: Dict[str, Any], status: CellStatus, error: str
    ) -> List[ResultBase]:
        """Records of a launch that produced no result (oom, failed, timeout, skipped): by
        default one of its first record model, from the cell's settings."""
        fields = {**cell.settings.model_dump(mode="json"), **identity}
        return [self.record_models[0].model_validate({**fields, "status": status, "error": error})]

    def analyze_traces(self, profile_dir: Path, target: str) -> Dict[str, object]:
        """After a profiled cell: analyse its traces; fields for the record's ``profile``
        block. Only asked of a kind that sets ``profiled``."""
        return {"reason": f"{self.name} cells are not profiled"}

    def describe(self, cell: Cell, device_kind: str = CUDA) -> str:
        """One line naming the cell: ``resnet50 on 4 GPUs (batch 32, fp32)``; on a node without
        GPUs (``device_kind`` cpu) ``on 4 CPU processes`` (``hardware/device_noun.py``)."""
        s = cell.settings
        nodes = f" x {s.nnodes} nodes" if s.nnodes > 1 else ""
        return f"{self.name} cell on {count_text(s.gpus, device_kind)}{nodes}"

    def plan_row(self, cell: Cell, knobs: List[str]) -> List[str]:
        """Its row of the plan table: model, batch, GPUs, precision, then ``knobs``' values (by
        default its name, its ranks, and the value of each knob its settings hold)."""
        s = cell.settings.model_dump(mode="json")
        values = [str(s.get(knob.rpartition(".")[2], "-")) for knob in knobs]
        return [self.name, "-", str(cell.settings.gpus), "-", *values]

    def console_lines(self, records: List[ResultBase]) -> List[str]:
        """What a finished cell's records add to the console: by default, why it measured
        nothing (``> [SKIP] skipped: ...``, ``> [FAIL] failed: ...``)."""
        first = records[0] if records else None
        if first is None or first.status == "ok":
            return []
        label = "SKIP" if first.status == "skipped" else "FAIL"
        return [f"> [{label}] {first.status}: {first.error}"]

    def console_tables(
        self, records: List[ResultBase], title: str, console: Console
    ) -> List[RenderableType]:
        """Its tables in the summary printed at the end of a benchmark (none: ``[]``)."""
        return []

    def summary_tables(self, records: List[ResultBase]) -> Dict[str, DataFrame]:
        """The CSV summaries of the experiment's records, by file name in the experiment folder;
        rewritten after every cell. By default ``summary_<name>.csv``: one row per record of its
        own models, their single-valued fields as columns (none while it has no record)."""
        import pandas as pd

        own = [r for r in records if isinstance(r, self.record_models) and self.owns(r)]
        if not own:
            return {}
        columns = [
            name
            for model in self.record_models
            for name in model.model_fields
            if name not in ("settings", "schema_version")
        ]
        columns = list(dict.fromkeys(columns))
        rows = [
            {k: v for k, v in r.model_dump(mode="json").items() if isinstance(v, _SCALARS)}
            for r in own
        ]
        frame = pd.DataFrame(rows)
        shown = [c for c in columns if c in frame.columns]
        return {kind_summary_file(self.name): frame[shown]}
