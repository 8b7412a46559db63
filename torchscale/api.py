"""The Python API for notebooks and scripts: ``torchscale.load``, ``torchscale.run``,
``torchscale.compare`` (and ``torchscale.load_steps``).

Nothing is imported at ``import torchscale``: each function imports what it needs when called, so
the CLI's ``--help`` and config errors stay free of torch. See docs/api.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Union

if TYPE_CHECKING:
    import pandas as pd

    from torchscale.analysis.comparison import Comparison
    from torchscale.config.settings import BenchmarkConfig
    from torchscale.results.schema import ResultBase

PathLike = Union[str, "os.PathLike[str]"]
ConfigLike = Union[PathLike, Mapping[str, Any], "BenchmarkConfig"]
STEP_COLUMNS = ["experiment", "cell_id", "world_size", "rank", "step", "step_ms", "sync_wait_ms"]


def _experiments(results_dir: PathLike, what: str = "results_dir") -> List[Any]:
    from torchscale.analysis.report_data import load_report_data

    return load_report_data(Path(results_dir), what).experiments


def _summary(records: Sequence[ResultBase]) -> pd.DataFrame:
    """summary.csv's table: the same function the benchmark writes it with."""
    from torchscale.analysis.training_tables import training_table

    return training_table(records).drop(columns=["config_key"])


def load(results_dir: PathLike) -> pd.DataFrame:
    """One row per training cell, with the columns of ``summary.csv``.

    ``results_dir`` is one experiment folder (``<output-dir>/<experiment>``) or a folder of
    several (their rows are concatenated; scaling efficiency is computed within each experiment).
    Read from ``results.jsonl``, the source of truth; per-step times are in :func:`load_steps`.
    """
    import pandas as pd

    tables = [_summary(e.records) for e in _experiments(results_dir)]
    return pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0]


def _step_rows(records: Sequence[ResultBase]) -> List[Dict[str, object]]:
    from torchscale.results.schema import TrainingResult

    rows = []
    for record in records:
        if not isinstance(record, TrainingResult):
            continue
        for rank in record.per_rank:
            waits = rank.sync_wait_samples_ms
            for step, step_ms in enumerate(rank.step_times_ms):
                rows.append(
                    {
                        "experiment": record.experiment,
                        "cell_id": record.cell_id,
                        "world_size": record.world_size,
                        "rank": rank.rank,
                        "step": step,
                        "step_ms": step_ms,
                        "sync_wait_ms": waits[step] if step < len(waits) else None,
                    }
                )
    return rows


def load_steps(results_dir: PathLike) -> pd.DataFrame:
    """Every measured step of every rank: one row per (cell, rank, step), long format.

    Columns: experiment, cell_id, world_size, rank, step, step_ms (the step's time on that rank)
    and sync_wait_ms (its exposed gradient-sync wait, where measured). Join with :func:`load` on
    ``cell_id``.
    """
    import pandas as pd

    rows = [row for e in _experiments(results_dir) for row in _step_rows(e.records)]
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


@dataclass
class Results:
    """What :func:`run` returns: the experiment folder and its records."""

    path: Path  # the experiment folder, <output_dir>/<experiment>
    records: List[ResultBase]

    @property
    def table(self) -> pd.DataFrame:
        """The summary table (as :func:`load`)."""
        return _summary(self.records)

    def steps(self) -> pd.DataFrame:
        """Per rank and step times (as :func:`load_steps`)."""
        import pandas as pd

        return pd.DataFrame(_step_rows(self.records), columns=STEP_COLUMNS)

    @property
    def ok(self) -> bool:
        """True when no cell failed or timed out (OOM and skipped cells are results)."""
        return not any(r.status in ("failed", "timeout") for r in self.records)


def _config(config: ConfigLike, overrides: Optional[Mapping[str, Any]]) -> BenchmarkConfig:
    from torchscale.config.loader import load_config
    from torchscale.config.settings import BenchmarkConfig

    pairs = [(key.split("."), value) for key, value in (overrides or {}).items()]
    if isinstance(config, BenchmarkConfig):
        base = config.model_dump(mode="json", exclude_unset=True)
        return load_config(None, pairs, base={**base, "experiment_name": config.experiment_name})
    if isinstance(config, Mapping):
        return load_config(None, pairs, base=dict(config))
    return load_config(Path(config), pairs)


def run(
    config: ConfigLike,
    output_dir: PathLike = "results",
    *,
    overrides: Optional[Mapping[str, Any]] = None,
    benchmark: str = "all",
    resume: bool = False,
    retry_failed: bool = False,
) -> Results:
    """Run a benchmark on this node, as ``torchscale benchmark`` does, quietly.

    ``config`` is a YAML path, a dict of the YAML's keys, or a ``BenchmarkConfig``; ``overrides``
    maps dotted keys to values (``{"ddp.bucket_cap_mb": 50}``). Results go to
    ``output_dir/<experiment>/`` exactly as from the CLI (results.jsonl, summary.csv, ...).
    Bad input raises ``torchscale.errors.TorchscaleError``; a failing cell is a record, not an
    exception (see ``Results.ok``).
    """
    import logging

    from torchscale.app.benchmark import (
        BenchmarkRequest,
        LaunchRequest,
        quiet_events,
        run_benchmark,
    )

    request = BenchmarkRequest(
        _config(config, overrides),
        Path(output_dir),
        benchmark,
        LaunchRequest(nnodes=1, node_rank=0),  # this node, whatever the environment says
        resume=resume,
        retry_failed=retry_failed,
    )
    outcome = run_benchmark(request, quiet_events(), logging.getLogger("torchscale").info)
    if outcome.stopped_by:  # what finished is safe in the folder; the caller sees the signal
        raise KeyboardInterrupt(f"{outcome.stopped_by}: {outcome.records_safe} results kept")
    return Results(outcome.store_root, outcome.records)


def _records(source: Union[PathLike, Results], what: str) -> List[ResultBase]:
    if isinstance(source, Results):
        return list(source.records)
    return [r for e in _experiments(source, what) for r in e.records]


def compare(
    old: Union[PathLike, Results],
    new: Union[PathLike, Results],
    *,
    threshold_pct: float = 5.0,
    resamples: int = 2000,
    seed: int = 0,
    noise_floor_pct: Optional[float] = None,
    allow_unjudged: bool = False,
) -> Comparison:
    """Cell-by-cell changes of ``new`` against ``old``, as ``torchscale compare`` computes them.

    ``Comparison.cells`` has one row per matched cell (``verdict``: regression, improvement,
    within noise, unchanged, or not judged when measured on a busy host; intervals over
    run-to-run noise in ``*_ci_low_pct``/``*_ci_high_pct``; ``noise_model``: which noise model
    decided the cell); ``Comparison.regressions`` the regressed ones; ``only_old``/``only_new``
    the unmatched cells; ``Comparison.noise()`` what decided (docs/report.md).
    ``noise_floor_pct`` states the run-to-run noise (as ``--noise-floor``); by default it comes
    from the runs' repeats, else from each cell's step-time CV. ``Comparison.passed`` is the
    gate (``allow_unjudged``: pass on the judged cells alone, as ``--allow-unjudged``). Bad
    options raise ``torchscale.errors.TorchscaleError``.
    """
    from torchscale.analysis.comparison import CompareOptions, compare_runs

    options = CompareOptions(
        threshold_pct=threshold_pct,
        resamples=resamples,
        seed=seed,
        noise_floor_pct=noise_floor_pct,
        allow_unjudged=allow_unjudged,
    ).checked()
    return compare_runs(_records(old, "old"), _records(new, "new"), options)
