"""The strategy comparison on the console and in the report: per model and rank count measured
under several strategies, throughput, model state per rank and sync overhead against ddp's, and
the recommendation (``analysis/strategy_comparison.py``)."""

from __future__ import annotations

from typing import List, Optional

from torchscale.analysis.strategy_comparison import strategy_frame, strategy_groups
from torchscale.measures.figures import BUSBW, MODEL_STATE, SYNC_OVERHEAD
from torchscale.report import formatting as fmt
from torchscale.report.elements import Column, Section, make_table
from torchscale.results.schema import ResultBase


def strategy_lines(records: List[ResultBase]) -> List[str]:
    """The console's lines per model and rank count: the recommendation, then each strategy's
    collectives per step with their busbw."""
    lines = []
    for group in strategy_groups(records):
        lines.append(f"Strategy: {group.recommendation}")
        lines.extend(
            f"  {row.strategy}'s collectives per step: {row.collectives}"
            for row in group.rows
            if row.collectives
        )
    return lines


def strategy_section(records: List[ResultBase]) -> Optional[Section]:
    groups = strategy_groups(records)
    if not groups:
        return None
    frame = strategy_frame(groups)
    return Section(
        "strategies",
        "Data-parallel strategies",
        "Each strategy ran the same model, batch, precision and window (docs/strategies.md). "
        f"{MODEL_STATE.explained()} {SYNC_OVERHEAD.explained()} Collectives: what one step "
        "after the window issued, per op its calls and bytes, each call timed alone, and its "
        f"{BUSBW.name}. {BUSBW.explained()} A cell whose gradient check failed is invalid and "
        "shows no figure.",
        tables=[
            make_table(
                "strategy-table",
                frame,
                [
                    Column("model", "Model", fmt.text, numeric=False),
                    Column("world_size", "Ranks", fmt.integer),
                    Column("strategy", "Strategy", fmt.text, numeric=False),
                    Column("status", "Status", fmt.text, numeric=False),
                    Column("throughput", "Throughput", fmt.significant),
                    Column("throughput_vs_baseline", "x ddp", fmt.significant),
                    Column("model_state_bytes", "Model state per rank", fmt.human_bytes),
                    Column("memory_vs_baseline", "x ddp", fmt.significant),
                    Column("sync_overhead_pct", "Sync overhead %", fmt.significant),
                    Column("collectives", "Collectives per step", fmt.text, numeric=False),
                ],
            )
        ],
        notes=[group.recommendation for group in groups],
    )
