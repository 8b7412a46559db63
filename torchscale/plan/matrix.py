"""Expand a ``BenchmarkConfig`` into the ordered list of cells to run.

Each kind of cell (``torchscale.kinds.kind_registry``) plans its own cells
(``CellKind.plan``): training cells (``torchscale.plan.training_cells``) first, then
communication cells (``torchscale.comm.plan``).

The size of the matrix is computed from the lengths of its lists before a single cell is built
(:func:`count_cells`), and a matrix above ``--max-cells`` (10,000 by default) is refused: a short
config must not expand into millions of cells by accident. :func:`iter_cells` builds the cells
one at a time, so ``--dry-run`` can print a plan it never holds whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

from torchscale.config.settings import BenchmarkConfig
from torchscale.errors import ConfigError
from torchscale.plan.kind_protocol import benchmark_choices, selected_kinds
from torchscale.plan.planned_cell import Cell

DEFAULT_MAX_CELLS = 10_000
"""The largest matrix expanded without ``--max-cells``."""


@dataclass(frozen=True)
class Plan:
    config: BenchmarkConfig
    cells: List[Cell]
    swept: List[str]  # dotted names of the knobs with more than one value

    def __len__(self) -> int:
        return len(self.cells)

    def __iter__(self) -> Iterator[Cell]:
        return iter(self.cells)


def count_cells(
    config: BenchmarkConfig, benchmark: str = "all", gpus_per_node: Optional[int] = None
) -> Tuple[int, str]:
    """How many cells the matrix has at most, from the lengths of its lists alone (nothing is
    expanded), and which lists make it: ``(2000000, "models 2 x batch_sizes 1000 x ...")``."""
    total, factors = 0, []
    for kind in selected_kinds(benchmark):
        if kind.missing(config) is None:
            count, named = kind.count(config, benchmark, gpus_per_node)
            total += count
            factors += named
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
    # ``all`` is everything the config defines; ``training`` the model cells; ``memory`` the model
    # cells with a short window (``plan.training_cells.MEMORY_WINDOW``) that records each rank's
    # memory and skips the sync probe; ``comm`` the ``communication:`` cells.
    choices = benchmark_choices()
    if benchmark not in choices:
        raise ConfigError(f"unknown --benchmark '{benchmark}': choose one of {', '.join(choices)}")
    if benchmark == "all":
        return
    for kind in selected_kinds(benchmark):
        missing = kind.missing(config)
        if missing:
            raise ConfigError(f"--benchmark {benchmark} needs {missing}")


def iter_cells(
    config: BenchmarkConfig,
    benchmark: str = "all",
    gpus_per_node: Optional[int] = None,
    max_cells: Optional[int] = DEFAULT_MAX_CELLS,
) -> Iterator[Cell]:
    """The cells of :func:`expand`, in the same order, built one at a time (the size is checked
    against ``max_cells`` before the first)."""
    _check_selection(config, benchmark)
    check_size(config, benchmark, gpus_per_node, max_cells)
    seen = set()
    index = 0
    for kind in selected_kinds(benchmark):
        if kind.missing(config) is not None:
            continue
        for settings in kind.plan(config, benchmark, gpus_per_node):
            if not isinstance(settings, kind.settings_model):
                raise TypeError(f"the {kind.name} kind planned {type(settings).__name__} cells")
            cid = kind.cell_id(settings)
            if cid not in seen:
                seen.add(cid)
                yield Cell(index, cid, settings, kind.name)
                index += 1


def swept_knobs(config: BenchmarkConfig, benchmark: str = "all") -> List[str]:
    """Dotted names of the knobs with more than one value."""
    return [
        name
        for kind in selected_kinds(benchmark)
        if kind.missing(config) is None
        for name in kind.swept(config, benchmark)
    ]


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
