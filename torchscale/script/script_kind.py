"""The script cell kind: a user's own training script, one torchrun launch per GPU count.

Planned from the ``script:`` section (``script_config``): one cell per GPU count (the section's
or the config's), node count, repeat and ``strategy`` (which the script's DDP call applies), with
the config's measured window. Every rank runs
``python -m torchscale.script.wrap``, which runs the script unmodified with the bootstrap
installed. A cell writes one ``training`` record (``TrainingResult``), its ``model`` the script's
file name and its ``batch_size`` the samples one rank trained on per step, so summary.csv,
scaling efficiency, report, compare, project and tune read it as they read a model's.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple, Type

from pydantic import ValidationError

from torchscale.config.loader import explain
from torchscale.config.settings import BenchmarkConfig
from torchscale.errors import ConfigError
from torchscale.hardware.device_noun import CPU, CUDA, count_text, record_device_kind
from torchscale.kinds.kind_registry import SCRIPT_KIND
from torchscale.plan.kind_base import KindBase
from torchscale.plan.planned_cell import Cell, KindSettings, node_counts, settings_digest, slug
from torchscale.results.schema import CellStatus, ResultBase, TrainingResult
from torchscale.script.script_checks import check_script
from torchscale.script.script_config import SECTION, ScriptCellSettings, ScriptSection

if TYPE_CHECKING:
    from pandas import DataFrame

PRECISION = "script"
"""A script's records say ``precision: script``: the script chose its own math."""
UNIT = "samples"
WINDOW_KNOBS = (
    "warmup_steps", "measure_steps", "measure_seconds", "sync_probe_steps", "cell_timeout_s",
    "stall_timeout_s",
)  # fmt: skip
"""The config's top-level knobs a script cell takes (the other training knobs are the script's
own business)."""


def script_section(config: BenchmarkConfig) -> Optional[ScriptSection]:
    section = config.kind_section(SECTION.key)
    assert section is None or isinstance(section, ScriptSection), type(section)
    return section


def script_label(path: str) -> str:
    """What a script's records call it (their ``model``): its file name."""
    return Path(path).name or path


def _settings(cell: Cell) -> ScriptCellSettings:
    assert isinstance(cell.settings, ScriptCellSettings), cell.kind
    return cell.settings


def _gpu_counts(config: BenchmarkConfig, section: ScriptSection) -> List[int]:
    return list(section.gpu_counts or config.gpu_counts)


def _windows(config: BenchmarkConfig) -> Iterator[Dict[str, Any]]:
    lists = [getattr(config, name) for name in WINDOW_KNOBS]
    for values in itertools.product(*lists):
        yield dict(zip(WINDOW_KNOBS, values))


def _strategies(config: BenchmarkConfig) -> List[Dict[str, Any]]:
    """The config's ``strategy`` list, one cell each (fsdp2's once per ``reshard_after_forward``
    value), as training cells take it: the script's DDP call applies it."""
    cells = []
    for strategy in config.strategy:
        reshards = config.reshard_after_forward if str(strategy).startswith("fsdp2") else [True]
        cells += [{"strategy": strategy, "reshard_after_forward": r} for r in reshards]
    return cells


def strategy_label(settings: ScriptCellSettings) -> str:
    """The strategy as a cell's line says it (nothing for ddp, the script's own)."""
    if settings.strategy == "ddp":
        return ""
    if settings.strategy.startswith("fsdp2") and not settings.reshard_after_forward:
        return f" under {settings.strategy}, no reshard after forward"
    return f" under {settings.strategy}"


def threads_ran_line(record: ResultBase) -> Optional[str]:
    """The intra-op threads a script cell's ranks ran with (its record's
    ``runtime.intra_op_threads``), on CPU processes, where they set its speed."""
    runtime = getattr(record, "runtime", None) or {}
    threads = runtime.get("intra_op_threads")
    if record.status != "ok" or threads is None or record_device_kind(record) != CPU:
        return None
    return f"> [INFO] Your script ran {threads} intra-op thread(s) per rank"


class ScriptKind(KindBase):
    name = SCRIPT_KIND
    config_section = SECTION
    settings_model = ScriptCellSettings
    worker_module = "torchscale.script.wrap"
    record_models: Tuple[Type[ResultBase], ...] = ()
    """Its records are the training kind's (``TrainingResult``), parsed as those; ``owns``
    tells its own apart."""
    profiled = True
    joins_warm_groups = False  # the script is the process: one launch each
    own_threads = True  # the script's threads are its own, as under plain torchrun

    def owns(self, record: ResultBase) -> bool:
        """A training record whose settings name a script, not a model."""
        named = record.settings
        return isinstance(record, TrainingResult) and "script" in named and "model" not in named

    def missing(self, config: BenchmarkConfig) -> Optional[str]:
        if script_section(config) is not None:
            return None
        return "a script: section (or --script PATH; see docs/own-job.md)"

    def count(
        self, config: BenchmarkConfig, benchmark: str, gpus_per_node: Optional[int]
    ) -> Tuple[int, List[str]]:
        section = script_section(config)
        if section is None:
            return 0, []
        windows = math.prod(len(getattr(config, name)) for name in WINDOW_KNOBS)
        per_gpu = sum(
            len(node_counts(g, config, gpus_per_node)) for g in _gpu_counts(config, section)
        )
        total = config.repeats * windows * len(_strategies(config)) * per_gpu
        return total, [f"script {total}"]

    def plan(
        self, config: BenchmarkConfig, benchmark: str, gpus_per_node: Optional[int]
    ) -> Iterator[KindSettings]:
        section = script_section(config)
        assert section is not None
        check_script(section.path)  # before any cell: a missing script is bad input
        process = section.model_dump(exclude={"path", "args", "gpu_counts"})
        for repeat in range(config.repeats):
            for window, strategy in itertools.product(_windows(config), _strategies(config)):
                for gpus in _gpu_counts(config, section):
                    for nnodes in node_counts(gpus, config, gpus_per_node):
                        raw = {**process, **window, **strategy, "script": section.path,
                               "args": section.args, "gpus": gpus, "nnodes": nnodes,
                               "repeat": repeat}  # fmt: skip
                        try:
                            yield ScriptCellSettings.model_validate(raw)
                        except ValidationError as exc:
                            raise ConfigError(f"invalid config: {explain(exc, raw)}") from None

    def cell_id(self, settings: KindSettings) -> str:
        assert isinstance(settings, ScriptCellSettings)
        nodes = f"-n{settings.nnodes}" if settings.nnodes > 1 else ""
        name = slug(Path(settings.script).stem)
        digest = settings_digest(settings)
        strategy = f"-{slug(settings.strategy)}" if settings.strategy != "ddp" else ""
        return f"script-{name}{strategy}-g{settings.gpus}{nodes}-r{settings.repeat}-{digest}"

    def swept(self, config: BenchmarkConfig, benchmark: str) -> List[str]:
        swept = [name for name in WINDOW_KNOBS if len(getattr(config, name)) > 1]
        strategies = _strategies(config)
        for knob in ("strategy", "reshard_after_forward"):
            if len({cell[knob] for cell in strategies}) > 1:
                swept.append(knob)
        return swept

    @staticmethod
    def _fields(cell: Cell) -> Dict[str, Any]:
        s = _settings(cell)
        return {"model": script_label(s.script), "precision": PRECISION, "unit": UNIT}

    def records(
        self, cell: Cell, identity: Dict[str, Any], result: Dict[str, Any]
    ) -> List[ResultBase]:
        hosts = sorted({r["host"] for r in result.get("per_rank", [])})
        fields = {**identity, **self._fields(cell), **result, "status": "ok", "hosts": hosts}
        return [TrainingResult(**fields)]

    def failed(
        self, cell: Cell, identity: Dict[str, Any], status: CellStatus, error: str
    ) -> List[ResultBase]:
        per_rank = _settings(cell).samples_per_step or 0
        fields: Dict[str, Any] = {
            **identity, **self._fields(cell), "batch_size": per_rank,
            "global_batch_size": per_rank * cell.settings.gpus,
        }  # fmt: skip
        return [TrainingResult(**fields, status=status, error=error)]

    def analyze_traces(self, profile_dir: Path, target: str) -> Dict[str, object]:
        from torchscale.training.cell_traces import analyze_traces

        return analyze_traces(profile_dir, target)

    def describe(self, cell: Cell, device_kind: str = CUDA) -> str:
        s = _settings(cell)
        nodes = f" x {s.nnodes} nodes" if s.nnodes > 1 else ""
        where = f"{count_text(s.gpus, device_kind)}{nodes}"
        return f"{script_label(s.script)} on {where} (your script{strategy_label(s)})"

    def plan_row(self, cell: Cell, knobs: List[str]) -> List[str]:
        s = _settings(cell)
        values = [str(getattr(s, knob, "-")) for knob in knobs]
        gpus = str(s.gpus) if s.nnodes <= 1 else f"{s.gpus} ({s.nnodes}x{s.nproc_per_node})"
        return [script_label(s.script), "-", gpus, PRECISION, *values]

    def console_lines(self, records: List[ResultBase]) -> List[str]:
        # The training record prints its figures (cli.benchmark_view); on CPU, the threads the
        # script ran with are said here, as its record holds them.
        return [line for r in records for line in [threads_ran_line(r)] if line]

    def summary_tables(self, records: List[ResultBase]) -> Dict[str, DataFrame]:
        return {}  # summary.csv (the training kind's) holds the script's rows


KIND = ScriptKind()
