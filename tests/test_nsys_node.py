"""nsys exports holding a whole node (``nsys profile torchrun ...``): one rank per GPU and
process, figures checked against an independent interval computation straight from the SQLite
file, in the column sets of two export versions (tests/data/make_nsys_fixture.py)."""

from __future__ import annotations

import json
import sqlite3
import warnings
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

from tests.data.make_nsys_fixture import Timeline, write_node, write_ranks
from torchscale.profiling.analysis import analyze, to_document

Interval = Tuple[int, int]
SHARED = Timeline(late_rank=1, late_us=300.0, shared_stream=True)


def _union(spans: List[Interval]) -> List[Interval]:
    merged: List[Interval] = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def _length(spans: List[Interval]) -> int:
    return sum(e - s for s, e in spans)


def _overlap(a: List[Interval], b: List[Interval]) -> int:
    """Length of the intersection of two merged interval lists (two-pointer walk)."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def expected_per_device(path: Path) -> Dict[int, Dict[str, float]]:
    """HTA's breakdown of each CUDA device, in us, computed here from the raw rows."""
    con = sqlite3.connect(path)
    kernels = con.execute(
        "SELECT k.deviceId, k.start, k.end, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.demangledName"
    ).fetchall()
    other = con.execute(
        "SELECT deviceId, start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL "
        "SELECT deviceId, start, end FROM CUPTI_ACTIVITY_KIND_MEMSET"
    ).fetchall()
    con.close()
    out = {}
    for device in sorted({k[0] for k in kernels}):
        comp = _union(
            [(s, e) for d, s, e, n in kernels if d == device and not n.startswith("nccl")]
        )
        comm = _union([(s, e) for d, s, e, n in kernels if d == device and n.startswith("nccl")])
        busy = _union([(s, e) for d, s, e, _ in kernels if d == device] + [
            (s, e) for d, s, e in other if d == device
        ])  # fmt: skip
        span = busy[-1][1] - busy[0][0]
        out[device] = {
            "kernel_time_us": span / 1000,
            "idle_time_us": (span - _length(busy)) / 1000,
            "compute_time_us": _length(comp) / 1000,
            "comm_time_us": _length(comm) / 1000,
            "overlap_time_us": _overlap(comm, comp) / 1000,
            # float64 us since 2020 holds each end point to ~0.03 us: sums of n gaps drift n x
            "tolerance_us": 0.035 * (len(busy) + len(comp) + len(comm)),
        }
    return out


@pytest.mark.parametrize("variant", ["2026.4", "older", "2022.4.2"])
def test_two_gpu_export_gives_each_gpu_its_own_figures(tmp_path, variant):
    path = write_node(tmp_path / "node.sqlite", gpus=2, timeline=SHARED, variant=variant)
    result = analyze([path], "all")
    ranks = result.tables["ranks"].set_index("rank")
    assert list(ranks.index) == [0, 1]
    assert set(ranks["rank_source"]) == {"device"}
    expected = expected_per_device(path)
    for device, figures in expected.items():
        tolerance = figures.pop("tolerance_us")
        for key, value in figures.items():
            assert ranks.loc[device, key] == pytest.approx(value, abs=tolerance), (device, key)
        # NCCL shares the compute stream: nothing overlaps on one GPU
        assert ranks.loc[device, "overlap_pct"] == pytest.approx(0.0)
        assert ranks.loc[device, "steps"] == SHARED.steps
    # merged into one rank, GPU 1's compute would hide GPU 0's NCCL kernels: the old bug
    merged_overlap = _overlap(
        *[
            _union([(int(a * 1000), int(b * 1000)) for a, b in spans])
            for spans in _comm_and_compute_of_both(result)
        ]
    )
    assert merged_overlap > 0
    calls = result.tables["collectives"]
    con = sqlite3.connect(path)
    for device in (0, 1):
        (nccl,) = con.execute(
            "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON "
            "s.id = k.demangledName WHERE s.value LIKE 'nccl%' AND k.deviceId = ?",
            (device,),
        ).fetchone()
        assert (calls["rank"] == device).sum() == nccl
    con.close()
    stragglers = [f for f in result.findings if f.category == "straggler"]
    assert [f.ranks for f in stragglers] == [[1]]


def test_older_variant_has_the_documented_2020_runtime_and_string_tables(tmp_path):
    """StringIds and CUPTI_ACTIVITY_KIND_RUNTIME of the "older" variant are exactly the
    documented 2020 columns (no eventClass, no callchainId); the reader needs nothing more from
    them: every GPU row still finds the CUDA call that launched it (per process)."""
    from tests.data.make_nsys_fixture import OLDER_DOCUMENTED_TABLES
    from torchscale.profiling.traces.nsys_sqlite import read_nsys

    path = write_node(tmp_path / "node.sqlite", gpus=2, timeline=SHARED, variant="older")
    con = sqlite3.connect(path)
    for table, columns in OLDER_DOCUMENTED_TABLES.items():
        info = con.execute(f"PRAGMA table_info({table})").fetchall()
        declared = ", ".join(
            " ".join(filter(None, [name, kind, "NOT NULL" if notnull else "", "PRIMARY KEY" if pk
                                   else ""]))
            for _, name, kind, notnull, _, pk in info
        )  # fmt: skip
        assert declared == columns, table
    con.close()
    traces = read_nsys(path)
    assert sorted(t.rank for t in traces) == [0, 1]
    for trace in traces:
        gpu = trace.gpu_events()
        assert len(gpu) and not np.isnan(gpu["launch_ts"].astype(float)).any()
        assert (gpu["launch_ts"] <= gpu["ts"]).all()


def _comm_and_compute_of_both(result) -> List[List[Tuple[float, float]]]:
    comm: List[Tuple[float, float]] = []
    comp: List[Tuple[float, float]] = []
    for trace in result.traces:
        gpu = trace.gpu_events()
        for ts, dur, name in zip(gpu["ts"], gpu["dur"], gpu["name"].astype(str)):
            (comm if name.startswith("nccl") else comp).append((ts, ts + dur))
    return [comm, comp]


def test_one_node_file_analyses_like_one_file_per_rank(tmp_path):
    timeline = Timeline(late_rank=1, late_us=300.0)
    write_ranks(tmp_path / "per_rank", ranks=2, late_rank=1, late_us=300.0)
    node = write_node(tmp_path / "node" / "node.sqlite", gpus=2, timeline=timeline)
    apart = analyze([tmp_path / "per_rank"], "all")
    together = analyze([node], "all")
    keys = ["overlap_pct", "idle_pct", "wait_us", "sync_stall_pct", "times_last", "steps"]
    a = apart.tables["ranks"].set_index("rank")[keys]
    b: Any = together.tables["ranks"].set_index("rank")[keys]  # read cell by cell
    assert b.to_numpy() == pytest.approx(a.to_numpy(), abs=0.01)
    assert b.loc[0, "wait_us"] > 0
    # launch times joined per process (CUPTI correlation ids restart in every process)
    for rank in (0, 1):
        la = apart.traces[rank].gpu_events()["launch_ts"].to_numpy()
        lb = together.traces[rank].gpu_events()["launch_ts"].to_numpy()
        assert lb == pytest.approx(la, abs=0.01)
    assert [f.ranks for f in together.findings if f.category == "straggler"] == [[1]]


def test_nvtx_rank_marks_win_over_device_ids(tmp_path):
    path = write_node(tmp_path / "node.sqlite", gpus=2, rank_marks=[1, 0])
    document: Any = to_document(analyze([path], "all"))
    by_device = {t["device"]: t for t in document["traces"]}
    assert by_device[0]["rank"] == 1 and by_device[1]["rank"] == 0
    assert {t["rank_source"] for t in document["traces"]} == {"nvtx"}
    assert {r["rank_source"] for r in document["ranks"]} == {"nvtx"}


def test_export_without_device_ids_or_gpu_table_degrades_to_one_rank_per_process(tmp_path):
    full = write_node(tmp_path / "full.sqlite", gpus=2, timeline=SHARED)
    lean = write_node(tmp_path / "lean" / "lean.sqlite", gpus=2, timeline=SHARED)
    con = sqlite3.connect(lean)
    for table in ("KERNEL", "MEMCPY", "MEMSET"):
        con.execute(f"ALTER TABLE CUPTI_ACTIVITY_KIND_{table} DROP COLUMN deviceId")
    con.execute("DROP TABLE TARGET_INFO_GPU")
    con.execute("ALTER TABLE NVTX_EVENTS DROP COLUMN textId")  # phases then have no names
    con.commit()
    con.close()
    result = analyze([lean], "all")
    ranks = result.tables["ranks"].set_index("rank")
    assert set(ranks["rank_source"]) == {"order"}
    reference = analyze([full], "all").tables["ranks"].set_index("rank")
    for key in ("compute_time_us", "comm_time_us", "overlap_time_us", "steps"):
        assert ranks[key].to_numpy() == pytest.approx(reference[key].to_numpy(), abs=0.01)


def test_traces_of_another_job_are_named_and_left_out(tmp_path):
    write_node(tmp_path / "job_a.sqlite", gpus=4, rank_marks=[0, 1, 2, 3])
    write_node(tmp_path / "job_b.sqlite", gpus=2, rank_marks=[0, 1])
    result = analyze([tmp_path], "all")
    assert list(result.tables["ranks"]["rank"]) == [0, 1, 2, 3]
    assert {t.path.name for t in result.traces} == {"job_a.sqlite"}
    (warning,) = result.warnings
    assert "job_b.sqlite" in warning and "world size 2" in warning
    assert to_document(result)["warnings"] == [warning]


def test_two_node_exports_numbered_by_device_say_how_to_fix(tmp_path):
    from torchscale.errors import TorchscaleError

    write_node(tmp_path / "node0.sqlite", gpus=2)
    write_node(tmp_path / "node1.sqlite", gpus=2)
    with pytest.raises(TorchscaleError, match=r"repeat across files .* NVTX rank marks"):
        analyze([tmp_path], "all")


def test_single_rank_analysis_prints_no_numpy_warnings(tmp_path):
    with_nccl = write_node(tmp_path / "a" / "one.sqlite", gpus=1)
    compute_only = write_node(tmp_path / "b" / "one.sqlite", gpus=1)
    con = sqlite3.connect(compute_only)  # a single-GPU run without DDP: no collectives at all
    con.execute(
        "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE demangledName IN "
        "(SELECT id FROM StringIds WHERE value LIKE 'nccl%')"
    )
    con.commit()
    con.close()
    for path in (with_nccl, compute_only):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            document: Any = to_document(analyze([path], "all"))
        assert len(document["ranks"]) == 1 and document["sync_stall_pct"] is None


def test_profiling_doc_states_the_straggler_rule_the_code_applies():
    from torchscale.measures import straggler as findings

    doc = (Path(__file__).parents[1] / "docs" / "profiling.md").read_text()
    rule = doc[doc.index("**Straggler rule**") :]
    shares = {n: findings.straggler_share_threshold(n) for n in (2, 3, 4, 5, 8)}
    assert shares[5] == pytest.approx(shares[8]) == findings.STRAGGLER_MIN_CAUSED_SHARE
    for ranks, share in shares.items():
        if ranks <= 5:
            shown = f"{100 * share:.1f}".rstrip("0").rstrip(".")
            assert f"{shown}% for {ranks}" in rule or f"{shown}% from {ranks} ranks on" in rule
    assert f">= {findings.STRAGGLER_MIN_INSTANCES} *significant*" in rule
    assert f">= {findings.STRAGGLER_MIN_STALL_PCT:g}% of their step time" in rule
    from torchscale.profiling.analyzers import trace_collectives as collectives

    assert f">= {collectives.MIN_WAIT_US:g} us without step markers" in rule
    assert f"{100 * collectives.MIN_WAIT_SHARE_OF_STEP:g}% of the" in rule


def test_cli_says_where_rank_numbers_came_from_and_names_other_jobs(tmp_path):
    from typer.testing import CliRunner

    from torchscale.cli.app import app

    write_node(tmp_path / "node.sqlite", gpus=2, timeline=SHARED)
    result = CliRunner().invoke(app, ["profile", "analyze", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.stderr
    assert "[ANALYSIS] Rank numbers from: CUDA device ids (one process per GPU)" in result.stderr
    document = json.loads(result.stdout)
    assert [(t["rank"], t["device"], t["rank_source"]) for t in document["traces"]] == [
        (0, 0, "device"),
        (1, 1, "device"),
    ]
    other = tmp_path / "other"
    write_node(other / "a.sqlite", gpus=2, rank_marks=[0, 1])
    write_node(other / "b.sqlite", gpus=1, rank_marks=[0])
    result = CliRunner().invoke(app, ["profile", "analyze", str(other)])
    assert result.exit_code == 0, result.stderr
    assert "[WARN] b.sqlite: from another job (world size 1" in result.stderr
    assert "NVTX rank marks" in result.stderr


def test_sqlite_with_nsys_table_names_but_no_timeline_is_one_clear_line(tmp_path):
    from typer.testing import CliRunner

    from torchscale.cli.app import app

    path = tmp_path / "odd.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (name TEXT)")
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES ('k')")
    con.commit()
    con.close()
    result = CliRunner().invoke(app, ["profile", "analyze", str(path)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a readable nsys SQLite export" in lines[0]
    assert "Traceback" not in result.output


RECORDED_2022 = Path(__file__).parent / "data" / "nsys_2022.4.2"


def test_2022_variant_is_built_in_the_schema_nsys_2022_4_wrote(tmp_path):
    """Every table of the 2022.4.2 variant has exactly the columns (names, order, types,
    NOT NULL) that the real nsys 2022.4.2 export created (tests/data/nsys_2022.4.2)."""
    path = write_node(tmp_path / "node.sqlite", gpus=2, timeline=SHARED, variant="2022.4.2")
    recorded = sqlite3.connect(":memory:")
    recorded.executescript((RECORDED_2022 / "schema.sql").read_text())
    built = sqlite3.connect(path)
    tables = [r[0] for r in recorded.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    assert {"CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS", "EXPORT_META_DATA"} <= set(tables)
    for table in tables:
        want = recorded.execute(f"PRAGMA table_info({table})").fetchall()
        assert built.execute(f"PRAGMA table_info({table})").fetchall() == want, table
    assert not built.execute(
        "SELECT name FROM sqlite_master WHERE name='META_DATA_EXPORT'"
    ).fetchall()


def test_a_real_2022_export_without_gpu_activity_is_one_clear_line():
    from typer.testing import CliRunner

    from torchscale.cli.app import app

    export = RECORDED_2022 / "cpu_only_sleep.sqlite"
    meta = dict(sqlite3.connect(export).execute("SELECT name, value FROM EXPORT_META_DATA"))
    assert meta["EXPORT_PRODUCT_VERSION"] == "2022.4.2.1"  # a real export of that nsys
    result = CliRunner().invoke(app, ["profile", "analyze", str(export)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "an nsys export with no CUDA kernels" in lines[0]
    assert "--trace=cuda,nvtx" in lines[0] and "Traceback" not in result.output
