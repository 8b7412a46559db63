"""Expand the ``communication:`` section into cells: one torchrun launch per GPU count
(x node count x repeat).

Each launch sweeps every scope x collective x dtype x size, the P2P pairs and the TP GEMM cases,
so the process group and NCCL communicators are set up once per GPU count, as one nccl-tests
run would.
A single rank has no one to talk to: GPU counts of 1 are left out, unless the section asks for the
TP GEMM, whose reference GEMM and 1-rank all-gather path are worth measuring on one GPU.
"""

from __future__ import annotations

import itertools
from typing import List, Optional, Tuple

from pydantic import ValidationError

from torchscale.comm.config import CommCellSettings, comm_section
from torchscale.config.loader import explain
from torchscale.config.settings import BenchmarkConfig
from torchscale.errors import ConfigError
from torchscale.plan.planned_cell import node_counts, settings_digest, slug


def comm_cell_id(settings: CommCellSettings) -> str:
    """Readable and stable, like training cell ids (what --resume matches)."""
    nodes = f"-n{settings.nnodes}" if settings.nnodes > 1 else ""
    backend = f"-{slug(settings.backend)}" if settings.backend != "auto" else ""  # ucc/tl/nccl
    return f"comm-g{settings.gpus}{nodes}{backend}-r{settings.repeat}-{settings_digest(settings)}"


def comm_gpu_counts(config: BenchmarkConfig) -> List[int]:
    section = comm_section(config)
    least = 1 if section is not None and section.tp_gemm else 2
    counts = [gpus for gpus in config.gpu_counts if gpus >= least]
    if not counts:
        raise ConfigError(
            f"communication needs at least 2 ranks but gpu_counts is {config.gpu_counts}: "
            "add a count of 2 or more, e.g. gpu_counts: [2, 4, 8]"
        )
    return counts


def _check_tp_shards(settings: CommCellSettings) -> None:
    for case in settings.tp_gemm:
        if case.m % settings.gpus:
            raise ConfigError(
                f"communication.tp_gemm.m = {case.m} cannot be split evenly across "
                f"{settings.gpus} ranks: choose m a multiple of every GPU count"
            )


def count_comm(config: BenchmarkConfig, gpus_per_node: Optional[int]) -> Tuple[int, List[str]]:
    """How many communication cells, and the factor that names them."""
    if comm_section(config) is None:
        return 0, []
    per_gpu = sum(len(node_counts(g, config, gpus_per_node)) for g in comm_gpu_counts(config))
    total = config.repeats * per_gpu * len(config.communication.backend)  # one cell per backend
    return total, [f"communication {total}"]


def comm_settings(
    config: BenchmarkConfig, gpus_per_node: Optional[int] = None
) -> List[CommCellSettings]:
    """The settings of every communication cell, repeats outermost, in GPU-count order; a count
    spreads over nodes as training cells do (``nodes:``, ``gpus_per_node``, the launch's node)."""
    section = comm_section(config)
    if section is None:
        return []
    cells = []
    for repeat in range(config.repeats):
        for gpus in comm_gpu_counts(config):
            for nnodes, backend in itertools.product(
                node_counts(gpus, config, gpus_per_node), section.backend
            ):
                try:
                    settings = CommCellSettings.from_section(section, gpus, nnodes, repeat, backend)
                except ValidationError as exc:
                    raise ConfigError(
                        f"invalid communication section: {explain(exc, {})}"
                    ) from None
                _check_tp_shards(settings)
                cells.append(settings)
    return cells
