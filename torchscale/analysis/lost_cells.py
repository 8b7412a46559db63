"""Cells a new run lost: measured (``ok``) in the baseline, not measured in the new run.

Such a cell fails ``compare``'s gate like a regression. Its verdict says what happened to it in
the new run, the worst of its repeats (``LOST_ORDER``), or ``missing`` when the new run has no
record of it.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Set, Tuple

import pandas as pd

from torchscale.analysis.training_tables import training_table
from torchscale.measures.table_scalars import as_int
from torchscale.results.schema import ResultBase

MISSING = "missing"
LOST_ORDER = ("failed", "timeout", "oom", "invalid", "skipped")
"""What a lost cell's verdict says, most serious first, when its repeats ended differently."""
CellKey = Tuple[str, int, int]  # config_key, world_size, nnodes: what cells are matched on


def statuses(records: Sequence[ResultBase]) -> Dict[CellKey, List[str]]:
    """Every training record's status, by the key cells are matched on."""
    table = training_table(records)
    found: Dict[CellKey, List[str]] = {}
    for row in table.itertuples():
        key = (str(row.config_key), as_int(row.world_size), as_int(row.nnodes))
        found.setdefault(key, []).append(str(row.status))
    return found


def lost_rows(
    old: pd.DataFrame, new_status: Dict[CellKey, List[str]], compared: Set[CellKey]
) -> List[Dict[str, object]]:
    """A row for each cell measured in the baseline that the new run did not measure."""
    rows: List[Dict[str, object]] = []
    for row in old.itertuples():
        key = (str(row.config_key), as_int(row.world_size), as_int(row.nnodes))
        statuses = new_status.get(key, [])
        if key in compared and not any(s in LOST_ORDER[:4] for s in statuses):
            continue  # measured in the new run (no repeat failed): compared above
        bad = [s for s in LOST_ORDER if s in statuses]
        verdict = bad[0] if bad else MISSING
        nan = float("nan")
        rows.append(
            {
                "model": row.model,
                "variant": row.variant,
                "world_size": as_int(row.world_size),
                "nnodes": as_int(row.nnodes),
                "unit": row.unit,
                "throughput_old": row.throughput,
                "throughput_new": nan,
                "throughput_change_pct": nan,
                "throughput_ci_low_pct": nan,
                "throughput_ci_high_pct": nan,
                "p95_old_ms": row.step_ms_p95,
                "p95_new_ms": nan,
                "p95_change_pct": nan,
                "p95_ci_low_pct": nan,
                "p95_ci_high_pct": nan,
                "beyond_noise": False,
                "verdict": verdict,
                "lost": True,
                "new_status": ", ".join(sorted(set(statuses))) or MISSING,
                "cell_id_old": row.cell_id,
                "cell_id_new": None,
                "config_key": row.config_key,
            }
        )
    return rows
