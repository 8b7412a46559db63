"""Trace readers and analyses on real traces (HTA's reference figures), the nsys SQLite fixture
and the real gloo capture."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.support.profile_helpers import (
    DATA,
    hta_reference,
    load_trace_json,
    real_traces_dir,
    write_ranks,
)
from torchscale.profiling.analysis import analyze
from torchscale.profiling.analyzers.kernels import COMMUNICATION, COMPUTE, kernel_class
from torchscale.profiling.analyzers.steps import step_times
from torchscale.profiling.analyzers.trace_breakdown import temporal_breakdown
from torchscale.profiling.analyzers.trace_collectives import collective_tables
from torchscale.profiling.traces import kineto, load_traces
from torchscale.profiling.traces.nsys_sqlite import read_nsys

TOLERANCE_PP = 0.5


@pytest.fixture(scope="module")
def real_traces():
    folder = real_traces_dir()
    return {name: kineto.read_kineto(folder / name) for name in hta_reference()}


def test_breakdown_and_overlap_agree_with_hta(real_traces):
    for name, ref in hta_reference().items():
        row = temporal_breakdown([real_traces[name]]).iloc[0]
        for key in ("idle_pct", "compute_pct", "non_compute_pct", "overlap_pct"):
            assert abs(row[key] - ref[key]) <= TOLERANCE_PP, (name, key, row[key], ref[key])
        assert abs(row["kernel_time_us"] - ref["kernel_time_us"]) <= 1.0
        assert row["exposed_comm_us"] == pytest.approx(row["comm_time_us"] - row["overlap_time_us"])


def test_hta_window_drops_last_profiler_step(real_traces):
    trace = real_traces["nccl-2rank-rank0.json.gz"]
    steps = step_times([trace])
    assert list(steps["step"]) == [4, 5]  # ProfilerStep#6 starts the excluded window
    assert trace.window_end == pytest.approx(steps["end_us"].max(), abs=1e3)
    gpu = trace.gpu_events()
    assert (gpu["launch_ts"] < trace.window_end).all()


def _json_columns(doc: dict) -> dict:
    """What the decoder must produce, computed here with ``json`` from the parsed file: the
    complete events kept (profiler bookkeeping and API calls apart), the API calls, and the
    ``[memory]`` instants, each field as the trace writes it (a missing id is -1, a string or
    missing number NaN)."""
    from torchscale.profiling.traces.kineto_decode import (
        API_CATEGORIES,
        MEMORY_ARGS,
        MEMORY_EVENT,
        SKIPPED_CATEGORIES,
    )

    def number(value):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return float(value) if ok else float("nan")

    def ident(value):
        return -1 if value is None or isinstance(value, str) else int(value)

    complete = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    kept = [e for e in complete if e.get("cat") not in SKIPPED_CATEGORIES | API_CATEGORIES]
    api = [e for e in complete if e.get("cat") in API_CATEGORIES]
    memory = [e for e in doc["traceEvents"] if e.get("ph") == "i" and e["name"] == MEMORY_EVENT]
    return {
        "events": len(complete),
        "kept": [_json_row(e, number, ident) for e in kept],
        "api": [
            (ident(e["args"].get("correlation")), number(e["ts"]), number(e["dur"]), e["name"])
            for e in api
        ],
        "memory": [
            (number(e.get("ts")), *(number(e["args"].get(arg)) for arg in MEMORY_ARGS.values()))
            for e in memory
        ],
    }


def _json_row(e: dict, number, ident) -> tuple:
    args = e.get("args", {})
    ids = (ident(e.get("pid")), ident(e.get("tid")), ident(args.get("stream")))
    return (number(e.get("ts")), number(e.get("dur")), *ids, ident(args.get("correlation")),
            e.get("cat", ""), e.get("name", ""))  # fmt: skip


def _decoded_columns(columns) -> dict:
    names = {code: name for name, code in columns.names.items()}
    cats = {code: cat for cat, code in columns.cats.items()}
    kept = zip(
        columns.ts.array(), columns.dur.array(), columns.pid.array(), columns.tid.array(),
        columns.stream.array(), columns.correlation.array(),
        [cats[c] for c in columns.cat_codes.array()],
        [names[c] for c in columns.name_codes.array()],
    )  # fmt: skip
    api = zip(
        columns.api_correlation.array(), columns.api_ts.array(), columns.api_dur.array(),
        [names[c] for c in columns.api_name.array()],
    )  # fmt: skip
    memory = zip(*(columns.memory[key].array() for key in columns.memory))
    return {
        "events": columns.events,
        "kept": [
            (float(a), float(b), int(c), int(d), int(e), int(f), g, h)
            for a, b, c, d, e, f, g, h in kept
        ],
        "api": [(int(a), float(b), float(c), d) for a, b, c, d in api],
        "memory": [tuple(float(v) for v in row) for row in memory],
    }


@pytest.mark.parametrize("name", ["hta_traces/nccl-2rank-rank0.json.gz", "memory_cpu/rank0.json"])
def test_the_decoder_s_columns_are_the_trace_s_fields_at_any_block_size(monkeypatch, name):
    """msgspec's typed decoding against the same fields read with ``json`` in this test, across
    many block boundaries; the blocks do not change the events read."""
    source = DATA / name
    expected = _json_columns(load_trace_json(source))
    assert expected["kept"] and expected["api" if name.endswith("gz") else "memory"]
    whole = kineto.read_kineto(source).events
    monkeypatch.setattr(kineto, "BLOCK_BYTES", 1 << 15)  # many block boundaries
    decoded = _decoded_columns(kineto.scan_range(source, 0, None, True, True))
    for key, value in expected.items():  # NaN == NaN here: compared as text
        assert repr(decoded[key]) == repr(value), key
    pd.testing.assert_frame_equal(kineto.read_kineto(source).events, whole)


def test_parallel_split_gives_same_events(tmp_path, monkeypatch, real_traces):
    source = real_traces_dir() / "nccl-2rank-rank0.json.gz"
    plain = tmp_path / "rank0.json"
    plain.write_text(json.dumps(load_trace_json(source), indent=1))
    monkeypatch.setattr(kineto, "PARALLEL_MIN_BYTES", 1 << 20)
    tasks = kineto.plan_tasks([plain], workers=3)
    assert len(tasks) == 3 and tasks[0][3] and tasks[-1][4]  # first has the head, last the tail
    parallel = kineto.read_kineto_files([plain], workers=3)[plain]
    pd.testing.assert_frame_equal(parallel.events, real_traces["nccl-2rank-rank0.json.gz"].events)


def test_kernel_classes_follow_hta_and_new_nccl_names():
    assert (
        kernel_class("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)")
        == COMMUNICATION
    )
    assert (
        kernel_class(
            "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
        )
        == COMMUNICATION
    )
    assert kernel_class("Memcpy HtoD (Pinned -> Device)") == "memory"
    assert kernel_class("cudaStreamSync") == "other"
    assert kernel_class("ampere_sgemm_128x64_tn") == COMPUTE


def _union(rows):
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(rows):
        if cur_e is None or s > cur_e:
            total += 0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (0 if cur_e is None else cur_e - cur_s)


def test_nsys_sqlite_fixture_read_with_sql():
    folder = DATA / "nsys_2rank"
    (trace,) = read_nsys(folder / "rank0.sqlite")
    con = sqlite3.connect(folder / "rank0.sqlite")
    kernels = con.execute(
        "SELECT k.start, k.end, s.value, k.correlationId FROM "
        "CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName"
    ).fetchall()
    launches = dict(
        con.execute(
            "SELECT correlationId, MIN(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME "
            "GROUP BY correlationId"
        ).fetchall()
    )
    epoch = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
    steps = con.execute(
        "SELECT start, end FROM NVTX_EVENTS WHERE text LIKE 'step %' ORDER BY start"
    ).fetchall()
    copies = con.execute(
        "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1"
    ).fetchone()[0]
    con.close()
    events = trace.events
    assert (events["cat"] == "kernel").sum() == len(kernels)
    assert (events["name"] == "Memcpy HtoD").sum() == copies
    compute_ns = _union([(s, e) for s, e, n, _ in kernels if not n.startswith("nccl")])
    comm_ns = _union([(s, e) for s, e, n, _ in kernels if n.startswith("nccl")])
    row = temporal_breakdown([trace]).iloc[0]
    assert row["compute_time_us"] == pytest.approx(compute_ns / 1000, abs=0.5)
    assert row["comm_time_us"] == pytest.approx(comm_ns / 1000, abs=0.5)
    gpu = events[events["cat"] == "kernel"].sort_values("ts")
    first = min(kernels)
    origin = 1_577_836_800_000_000_000
    assert gpu["launch_ts"].iloc[0] == pytest.approx(
        (launches[first[3]] + epoch - origin) / 1000, abs=0.1
    )
    st = step_times([trace])
    assert list(st["step"]) == list(range(len(steps)))
    # us since 2020 in float64: exact to ~0.03 us
    assert st["duration_us"].to_numpy() == pytest.approx(
        [(e - s) / 1000 for s, e in steps], abs=0.05
    )
    assert {"forward", "backward", "optimizer"} <= set(
        events["name"].astype(str)
    )  # registered strings


def test_nsys_two_ranks_name_the_late_rank():
    traces = load_traces([DATA / "nsys_2rank"])
    tables = collective_tables(traces)
    inst = tables["instances"]
    assert inst[
        "clocks_comparable"
    ].all()  # session starts differ, the epoch puts them on one clock
    late = inst[inst["op"] == "AllReduce"]
    assert set(late.loc[late["is_last"], "rank"]) == {1}
    # expected waits straight from the files: n-th all-reduce of each rank, absolute clock
    starts = {}
    for rank in (0, 1):
        con = sqlite3.connect(DATA / "nsys_2rank" / f"rank{rank}.sqlite")
        epoch = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
        starts[rank] = [
            s + epoch
            for (s,) in con.execute(
                "SELECT k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = "
                "k.demangledName WHERE s.value LIKE 'ncclDevKernel_AllReduce%' ORDER BY k.start"
            )
        ]
        con.close()
    expected = [(max(a, b) - a) / 1000 for a, b in zip(starts[0], starts[1])]
    assert max(expected) > 0
    got = late[late["rank"] == 0].sort_values("start_us")["wait_us"].to_numpy()
    assert got == pytest.approx(expected, abs=0.05)


@pytest.mark.parametrize(("ranks", "late", "rename"), [(2, 1, False), (4, 2, True)])
def test_straggler_detected_on_real_trace_ranks(tmp_path, ranks, late, rename):
    source = real_traces_dir() / "nccl-2rank-rank0.json.gz"
    delays = write_ranks(load_trace_json(source), tmp_path, late, ranks, rename_nccl=rename)
    result = analyze([tmp_path], "sync_stalls")
    if rename:
        names = set(result.traces[0].events["name"].astype(str))
        assert any(n.startswith("ncclDevKernel_AllReduce") for n in names)
        assert not any(n.startswith("ncclKernel_AllReduce") for n in names)
    stragglers = [f for f in result.findings if f.category == "straggler"]
    assert len(stragglers) == 1 and stragglers[0].ranks == [late]
    assert f"GPU-{late} arrives last" in stragglers[0].title
    table: Any = result.tables["ranks"].set_index("rank")  # read cell by cell
    # late_fraction 0.5: each analysed collective of the late rank was delayed by its own
    # (remaining) duration, so the others waited that long
    late_events = result.traces[late].events
    comm = late_events[
        (late_events["stream"] >= 0) & late_events["name"].astype(str).str.startswith("nccl")
    ]
    injected = float(comm["dur"].sum())
    assert 0 < injected <= sum(delays)
    for other in set(range(ranks)) - {late}:
        expected = 100.0 * injected / table.loc[other, "step_time_us"]
        assert table.loc[other, "sync_stall_pct"] == pytest.approx(expected, abs=1.0)
    assert table.loc[late, "sync_stall_pct"] == pytest.approx(0.0, abs=0.5)


def test_identical_ranks_give_no_straggler(tmp_path):
    write_ranks(load_trace_json(real_traces_dir() / "nccl-2rank-rank0.json.gz"), tmp_path, None, 2)
    result = analyze([tmp_path], "all")
    assert not [f for f in result.findings if f.category in ("straggler", "sync")]
    assert result.tables["ranks"]["sync_stall_pct"].to_numpy() == pytest.approx([0.0, 0.0])


def test_real_gloo_capture_names_the_sleeping_rank():
    """Recorded with torch 2.14 on CPU: rank 1 sleeps 50 ms before each step (record.py)."""
    result = analyze([DATA / "gloo_2rank_cpu"], "sync_stalls")
    [straggler] = [f for f in result.findings if f.category == "straggler"]
    assert straggler.ranks == [1] and "gloo all_reduce: rank 1" in straggler.title
    assert "cpupower" in straggler.recommendation and "nvidia-smi" not in straggler.recommendation
    ranks: Any = result.tables["ranks"].set_index("rank")  # read cell by cell
    injected_share = 100.0 * 50_000.0 / ranks["step_mean_us"].mean()
    # The sleep is a floor on rank 1's lateness; on the shared 2-core machine it also ran a few
    # ms slower after sleeping (51.4 and 54.9 ms late), which rank 0 really waited for.
    assert injected_share - 5.0 <= ranks.loc[0, "sync_stall_pct"] <= injected_share + 10.0
    assert ranks.loc[1, "sync_stall_pct"] < 1.0
    classes = result.tables["kernel_classes"]
    assert set(classes["device"]) == {"cpu"} and set(classes["kernel_class"]) == {COMMUNICATION}


def test_findings_and_recommendations_on_real_traces(real_traces):
    from torchscale.profiling.analyzers.kernels import kernel_time_by_class
    from torchscale.profiling.finding_rules import (
        COMM_SIGNIFICANT_PCT,
        LOW_OVERLAP_PCT,
        find_bottlenecks,
    )
    from torchscale.profiling.trace_tables import trace_rank_table

    for name, ref in hta_reference().items():
        traces = [real_traces[name]]
        coll = collective_tables(traces)
        ranks = trace_rank_table(
            traces, step_times(traces), kernel_time_by_class(traces), coll["stragglers"]
        )
        findings = find_bottlenecks(ranks, coll["instances"], "all")
        by_cat = {f.category: f for f in findings}
        idle = by_cat["compute"]
        assert f"{ref['idle_pct']:.1f}%" in idle.title and "CUDA graphs" in idle.recommendation
        assert "straggler" not in by_cat  # one rank: nobody to compare with
        row = ranks.iloc[0]
        low = [f for f in findings if "overlaps computation" in f.title]
        comm_share = 100 * row["comm_time_us"] / row["kernel_time_us"]
        if ref["overlap_pct"] < LOW_OVERLAP_PCT and comm_share >= COMM_SIGNIFICANT_PCT:
            assert low and f"{ref['overlap_pct']:.1f}%" in low[0].title
            assert "bucket_cap_mb" in low[0].recommendation
            assert "gradient_as_bucket_view" in low[0].recommendation
        else:
            assert not low
        assert all(f.severity in ("high", "medium", "low") for f in findings)
    only_memory = find_bottlenecks(ranks, coll["instances"], "memory")
    assert all(f.category == "memory" for f in only_memory)


def test_covered_between_matches_brute_force():
    from torchscale.profiling.analyzers import intervals

    rng = np.random.default_rng(0)
    starts = np.sort(rng.uniform(0, 1000, 300))
    merged = intervals.merge(starts, starts + rng.uniform(0, 10, 300))
    lo = rng.uniform(-10, 1000, 50)
    hi = lo + rng.uniform(0, 100, 50)
    expected = [
        sum(max(0.0, min(e, b) - max(s, a)) for s, e in zip(*merged)) for a, b in zip(lo, hi)
    ]
    assert intervals.covered_between(*merged, lo, hi) == pytest.approx(expected)
