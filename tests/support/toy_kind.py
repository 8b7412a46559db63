"""A cell kind defined in this one module and nowhere else: the least a new kind has to provide.

Its section, its cells' settings, its record, and a ``KIND`` with the five pieces of
``plan.kind_protocol.CellKind``; every other piece is ``plan.kind_base.KindBase``'s default.
``tests/test_kind_plugins.py`` registers it at test time (``kind_registry.added_kind``), exactly
as a line in ``KIND_MODULES`` would, and runs it through config, plan, dry run, sweep, summary
CSV, console and report. Its cells ask for the ``mpi`` backend under torchrun, which the sweep
skips before any launch on every machine, so the sweep records them without a process.
"""

from __future__ import annotations

import itertools
from typing import Iterator, List, Literal, Optional

from pydantic import Field

from torchscale.config.base import StrictModel
from torchscale.config.kind_sections import ConfigSection
from torchscale.config.settings import BenchmarkConfig
from torchscale.plan.kind_base import KindBase, LaunchSettings
from torchscale.plan.planned_cell import node_counts
from torchscale.results.schema import ResultBase


class ToySection(StrictModel):
    """``toy:`` in the benchmark YAML."""

    words: List[str] = Field(min_length=1, description="One cell per word and GPU count.")
    backend: Literal["auto", "gloo", "mpi"] = Field("mpi", description="Process-group backend.")


class ToyCellSettings(LaunchSettings):
    word: str


class ToyResult(ResultBase):
    kind: Literal["toy_echo"] = "toy_echo"
    word: str
    echo_ms: Optional[float] = None


class ToyKind(KindBase):
    name = "toy"
    config_section = ConfigSection("toy", ToySection, "Words to echo (a test's own kind).")
    settings_model = ToyCellSettings
    worker_module = "tests.support.toy_kind"
    record_models = (ToyResult,)

    def plan(
        self, config: BenchmarkConfig, benchmark: str, gpus_per_node: Optional[int]
    ) -> Iterator[ToyCellSettings]:
        section = config.kind_section("toy")
        assert isinstance(section, ToySection)
        for word, gpus in itertools.product(section.words, config.gpu_counts):
            for nnodes in node_counts(gpus, config, gpus_per_node):
                yield ToyCellSettings(word=word, gpus=gpus, nnodes=nnodes, backend=section.backend)


KIND = ToyKind()
