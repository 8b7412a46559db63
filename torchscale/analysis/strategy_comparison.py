"""Strategies side by side: for each model, batch, precision and rank count measured under more
than one ``strategy``, each strategy's throughput, model state per rank and exposed
communication against ddp's, and the recommendation that follows from the measured trade-off.

A cell whose gradient check failed (``invalid``) is never a figure: it is named as failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional

import pandas as pd

from torchscale.analysis.training_tables import training_table
from torchscale.results.schema import IssuedCollective, ResultBase, TrainingResult

BASELINE = "ddp"
SAME_SPEED = 0.95
"""A strategy within 5% of the fastest's throughput counts as as fast (run-to-run noise)."""
GROUP_KEYS = ["model", "batch_size", "precision", "world_size", "nnodes"]


@dataclass(frozen=True)
class StrategyRow:
    model: str
    world_size: int
    strategy: str
    status: str
    throughput: Optional[float]
    unit: str
    model_state_bytes: Optional[int]
    sync_overhead_pct: Optional[float]
    throughput_ratio: Optional[float]  # against the baseline's (ddp's, else the first measured)
    memory_ratio: Optional[float]
    collectives: str = ""  # what one step issued, with each op's busbw (collectives_text)


@dataclass(frozen=True)
class StrategyGroup:
    model: str
    world_size: int
    baseline: str
    rows: List[StrategyRow]
    recommendation: str


def _float(value: object) -> Optional[float]:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if number == number else None


def _ratio(value: Optional[float], base: Optional[float]) -> Optional[float]:
    return value / base if value is not None and base else None


def _rank_words(world: int) -> str:
    return f"{world} rank" + ("s" if world != 1 else "")


def recommend(model: str, world: int, rows: List[StrategyRow], baseline: str) -> str:
    """One sentence: the strategy to use and the measured trade-off behind it."""
    where = f"{model} at {_rank_words(world)}"
    failed = [r.strategy for r in rows if r.status != "ok"]
    measured = [r for r in rows if r.status == "ok" and r.throughput]
    note = f" ({', '.join(failed)} not ok: no figure)" if failed else ""
    if not measured:
        return f"{where}: no strategy measured{note}."
    fastest = max(measured, key=lambda r: r.throughput or 0.0)
    top = fastest.throughput or 0.0
    as_fast = [r for r in measured if (r.throughput or 0.0) >= SAME_SPEED * top]
    pick = min(as_fast, key=lambda r: r.model_state_bytes or 0)
    base = next((r for r in measured if r.strategy == baseline), None)
    tradeoffs = [
        f"{r.strategy} uses {r.model_state_bytes / base.model_state_bytes:.2f}x the memory per "
        f"rank at {r.throughput / base.throughput:.2f}x the throughput of {baseline}"
        for r in measured
        if base is not None
        and r is not base
        and r.model_state_bytes
        and base.model_state_bytes
        and r.throughput
        and base.throughput
    ]
    why = "; ".join(tradeoffs) if tradeoffs else "the only strategy measured"
    saver = min(measured, key=lambda r: r.model_state_bytes or 0)
    tail = (
        f"; when the model does not fit, {saver.strategy} holds the least per rank"
        if saver is not pick
        else ""
    )
    return f"{where}: use {pick.strategy} ({why}){tail}{note}."


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.3g} MB"


def collectives_text(issued: List[IssuedCollective]) -> str:
    """One step's collectives, per op: ``all_reduce 2 x 44.9 MB, busbw 1.2 GB/s``."""
    parts = []
    for c in issued:
        busbw = f", busbw {c.busbw_gbps:.3g} GB/s" if c.busbw_gbps is not None else ""
        parts.append(f"{c.op} {c.calls} x {_megabytes(c.bytes)}{busbw}")
    return "; ".join(parts)


def strategy_groups(records: Iterable[ResultBase]) -> List[StrategyGroup]:
    """Every (model, batch, precision, rank count) measured under more than one strategy."""
    records = list(records)
    issued: Dict[str, str] = {}
    for record in records:
        if isinstance(record, TrainingResult) and record.collectives:
            issued.setdefault(record.cell_id, collectives_text(record.collectives))
    table = training_table(records)
    if table.empty or "strategy" not in table:
        return []
    groups = []
    for _, group in table.groupby(GROUP_KEYS, sort=False, dropna=False):
        if group["strategy"].nunique() < 2:
            continue
        ok = group[group["status"] == "ok"]
        baseline = (
            BASELINE if (ok["strategy"] == BASELINE).any() else str(group["strategy"].iloc[0])
        )
        base = ok[ok["strategy"] == baseline]
        base_rate = _float(base["throughput"].mean()) if not base.empty else None
        base_state = _float(base["model_state_bytes"].mean()) if not base.empty else None
        rows = []
        for strategy, cells in group.groupby("strategy", sort=False):
            measured = cells[cells["status"] == "ok"]
            status = "ok" if not measured.empty else str(cells["status"].iloc[0])
            rate = _float(measured["throughput"].mean()) if not measured.empty else None
            state = _float(measured["model_state_bytes"].mean()) if not measured.empty else None
            overhead = _float(measured["sync_overhead_pct"].mean()) if not measured.empty else None
            texts = [issued[c] for c in measured["cell_id"] if c in issued]
            rows.append(
                StrategyRow(
                    str(cells["model"].iloc[0]), int(cells["world_size"].iloc[0]), str(strategy),
                    status, rate, str(cells["unit"].iloc[0] or ""),
                    int(state) if state is not None else None, overhead,
                    _ratio(rate, base_rate), _ratio(state, base_state),
                    texts[0] if texts else "",
                )
            )  # fmt: skip
        model, world = rows[0].model, rows[0].world_size
        groups.append(
            StrategyGroup(model, world, baseline, rows, recommend(model, world, rows, baseline))
        )
    return groups


def strategy_frame(groups: List[StrategyGroup]) -> pd.DataFrame:
    """The groups' rows as one table (the report's and the CSV's)."""
    return pd.DataFrame(
        [
            {
                "model": r.model,
                "world_size": r.world_size,
                "strategy": r.strategy,
                "status": r.status,
                "throughput": r.throughput,
                "unit": r.unit,
                "model_state_bytes": r.model_state_bytes,
                "sync_overhead_pct": r.sync_overhead_pct,
                "throughput_vs_baseline": r.throughput_ratio,
                "memory_vs_baseline": r.memory_ratio,
                "collectives": r.collectives,
            }
            for g in groups
            for r in g.rows
        ]
    )
