"""The report's lost-efficiency decomposition on records whose step parts are
known: each cause is recomputed here from the ranks' own figures, and the causes add up to the
measured efficiency gap."""

from __future__ import annotations

import pytest

from tests.support.step_records import parts_record as _record
from torchscale.analysis.lost_efficiency import CAUSES, lost_efficiency_table
from torchscale.report.lost_efficiency_section import lost_efficiency_section

BASE = [(10.0, 100.0, 0.0)]  # (data, no_sync step, sync wait) per rank, ms
# 4 GPUs: batches come slower, compute is slower (contention), rank 3 is late (its compute is
# longer), so ranks 0-2 wait for it: it waits least, for the all-reduce itself
SCALED = [(12.0, 105.0, 20.0), (12.0, 105.0, 20.0), (12.0, 105.0, 20.0), (12.0, 120.0, 5.0)]


def test_causes_are_the_changes_of_the_step_parts_and_add_up_to_the_gap():
    table = lost_efficiency_table([_record(BASE), _record(SCALED)])
    assert len(table) == 1
    row = table.iloc[0]
    step = sum(n + w for _, n, w in SCALED) / len(SCALED)
    waits = [w for _, _, w in SCALED]
    expected_ms = {
        "exposed_comm": min(waits) - 0.0,
        "straggler_wait": sum(waits) / len(waits) - min(waits),
        "input_pipeline": sum(d for d, _, _ in SCALED) / len(SCALED) - BASE[0][0],
        "interference": sum(n - d for d, n, _ in SCALED) / len(SCALED) - (BASE[0][1] - BASE[0][0]),
    }
    for cause in CAUSES:
        assert row[f"{cause}_ms"] == pytest.approx(expected_ms[cause])
        assert row[f"{cause}_pts"] == pytest.approx(100 * expected_ms[cause] / step)
    assert row["gap_pts"] == pytest.approx(100 * (1 - row["scaling_efficiency"]))
    total = sum(row[f"{c}_pts"] for c in CAUSES) + row["other_pts"]
    assert total == pytest.approx(row["gap_pts"])
    # the step parts explain the whole gap: what is left is rounding
    assert abs(row["other_pts"]) < 0.5
    assert row["world_size"] == 4 and row["baseline_world_size"] == 1


def test_section_renders_the_table_and_a_stacked_chart():
    section = lost_efficiency_section(lost_efficiency_table([_record(BASE), _record(SCALED)]))
    assert section is not None and section.section_id == "lost-efficiency"
    (table,) = section.tables
    headers = [h for h, _ in table.headers]
    assert "Straggler wait (pts)" in headers and "Other (pts)" in headers
    (chart,) = section.charts
    bars = [s for s in chart.series if s.kind == "bar"]
    assert chart.barmode == "stack" and bars[-1].name == "other"
    (gap,) = [s for s in chart.series if s.kind == "marker"]
    table_rows = lost_efficiency_table([_record(BASE), _record(SCALED)])
    assert gap.name == "measured gap" and gap.y == table_rows["gap_pts"].tolist()
    assert (
        lost_efficiency_section(lost_efficiency_table([_record(BASE)])) is None
    )  # one GPU count: nothing to split
