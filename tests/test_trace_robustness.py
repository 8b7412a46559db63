"""Traces that attack their reader: empty traces, invalid events, any
event order, and the memory budget. Everything in-process on small files."""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
from typing import Any

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from tests.support.profile_helpers import DATA, hta_reference, load_trace_json, real_traces_dir
from torchscale.cli.app import app
from torchscale.profiling.analysis import analyze, to_document
from torchscale.profiling.analyzers.trace_breakdown import temporal_breakdown
from torchscale.profiling.traces import kineto
from torchscale.profiling.traces.memory_budget import (
    PEAK_PER_HELD_BYTE,
    READ_OVERHEAD_BYTES,
    MemoryBudget,
    TraceMemoryError,
)
from torchscale.profiling.traces.nsys_sqlite import read_nsys
from torchscale.results.layout import FINDINGS_FILE

runner = CliRunner()
TRACE = "nccl-2rank-rank0.json.gz"


def _kernel(ts, dur, stream=7, name="ampere_sgemm_128x64_tn"):
    event = {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts}
    if dur is not None:
        event["dur"] = dur
    event["args"] = {"stream": stream, "correlation": -1}
    return event


def _write(folder, events, name="rank0.json", **meta):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps({**meta, "traceEvents": events}))
    return folder / name


@pytest.fixture(scope="module")
def real_doc():
    return load_trace_json(real_traces_dir() / TRACE)


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([], "the trace holds no events to analyse"),
        ([{"ph": "i", "name": "marker", "ts": 5, "s": "g"}], "the trace holds no events"),
        (
            [_kernel(5, -3), _kernel(9, None), {**_kernel(0, 4), "ts": "soon"}],
            "no valid events, 3 invalid event(s) (1 negative duration, 1 no or non-finite "
            "duration, 1 no or non-finite start)",
        ),
    ],
)
def test_a_trace_with_nothing_valid_is_refused_with_the_reason(tmp_path, events, message):
    good = _write(tmp_path / "traces", [_kernel(0, 4), _kernel(10, 4)], name="rank1.json")
    _write(good.parent, events)
    result = runner.invoke(app, ["profile", "analyze", str(good.parent)])
    assert result.exit_code == 2, result.output
    assert "rank0.json: " + message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (good.parent / FINDINGS_FILE).exists() and not list(good.parent.glob("*.csv"))


def test_an_nsys_export_without_rows_is_refused(tmp_path):
    path = tmp_path / "rank0.sqlite"
    shutil.copy(DATA / "nsys_2rank" / "rank0.sqlite", path)
    con = sqlite3.connect(path)
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "NVTX_EVENTS"):
        con.execute(f"DELETE FROM {table}")
    con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_MEMSET")
    con.commit()
    con.close()
    result = runner.invoke(app, ["profile", "analyze", str(path)])
    assert result.exit_code == 2 and "the trace holds no events to analyse" in result.stderr


def test_invalid_events_are_counted_reported_and_left_out(tmp_path, real_doc):
    """Planted invalid events change no figure: HTA's figures on the real trace still hold."""
    planted = [_kernel(1e12, -50.0), _kernel(2e12, None), _kernel(3e12, -1.0)]
    planted.append({**_kernel(0, 40), "ts": None})
    doc = dict(real_doc, traceEvents=real_doc["traceEvents"] + planted)
    folder = tmp_path / "t"
    _write(folder, doc["traceEvents"], **{k: v for k, v in doc.items() if k != "traceEvents"})
    result = analyze([folder], "all")
    trace = result.traces[0]
    assert trace.invalid == {
        "negative duration": 2,
        "no or non-finite duration": 1,
        "no or non-finite start": 1,
    }
    ref = hta_reference()[TRACE]
    row = result.tables["ranks"].iloc[0]
    for key in ("idle_pct", "compute_pct", "non_compute_pct", "overlap_pct"):
        assert row[key] == pytest.approx(ref[key], abs=0.01), key
    assert any("4 invalid event(s) (2 negative duration" in w for w in result.warnings)
    document: Any = to_document(result)
    assert document["traces"][0]["invalid_events"]["negative duration"] == 2
    cli = runner.invoke(app, ["profile", "analyze", str(folder), "--json"])
    assert cli.exit_code == 0
    assert "[WARN] rank 0 (rank0.json): 4 invalid event(s)" in cli.stderr
    assert json.loads(cli.stdout)["traces"][0]["invalid_events"]["no or non-finite start"] == 1


def test_invalid_rows_of_an_nsys_export_are_counted(tmp_path):
    path = tmp_path / "rank0.sqlite"
    shutil.copy(DATA / "nsys_2rank" / "rank0.sqlite", path)
    (before,) = read_nsys(path)
    con = sqlite3.connect(path)
    # Without the schema's NOT NULL: what a damaged or hostile export can hold.
    con.execute("CREATE TABLE k AS SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL")
    con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    con.execute("ALTER TABLE k RENAME TO CUPTI_ACTIVITY_KIND_KERNEL")
    rows = [r[0] for r in con.execute("SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 3")]
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = NULL WHERE rowid = ?", (rows[0],))
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = end + 5 WHERE rowid = ?", (rows[1],))
    con.commit()
    con.close()
    (after,) = read_nsys(path)
    assert after.invalid == {"negative duration": 1, "no or non-finite duration": 1}
    kernels = (before.gpu["cat"] == "kernel").sum()
    assert (after.gpu["cat"] == "kernel").sum() == kernels - 2
    # the other columns were not shifted by the NULL: every kept kernel still has its launch
    assert after.gpu["launch_ts"].notna().sum() == before.gpu["launch_ts"].notna().sum() - 2


def test_event_order_in_the_file_does_not_matter(tmp_path, real_doc):
    events = list(real_doc["traceEvents"])
    random.Random(7).shuffle(events)
    meta = {k: v for k, v in real_doc.items() if k != "traceEvents"}
    shuffled = kineto.read_kineto(_write(tmp_path, events, **meta))
    original = kineto.read_kineto(real_traces_dir() / TRACE)
    for mine, theirs in ((shuffled.gpu, original.gpu), (shuffled.cpu, original.cpu)):
        key = ["ts", "dur", "correlation", "tid"]
        a = mine.sort_values(key, ignore_index=True)
        b = theirs.sort_values(key, ignore_index=True)
        pd.testing.assert_frame_equal(a, b, check_categorical=False)
        assert bool(np.all(np.diff(mine["ts"].to_numpy()) >= 0))  # tables come sorted
    pd.testing.assert_frame_equal(temporal_breakdown([shuffled]), temporal_breakdown([original]))


def test_tables_hold_compact_columns(real_doc):
    """What bounds memory: the kept columns, ~40 bytes an event at most."""
    trace = kineto.read_kineto(real_traces_dir() / TRACE)
    held = sum(t.memory_usage(deep=False, index=False).sum() for t in (trace.gpu, trace.cpu))
    assert held / trace.event_count <= 40
    stream = trace.gpu["stream"].dtype
    assert isinstance(stream, np.dtype)
    assert stream.itemsize <= 2 and trace.cpu["launch_ts"].dtype == np.float32


def test_memory_budget_refuses_before_the_file_is_read(tmp_path, monkeypatch):
    source = real_traces_dir() / TRACE
    monkeypatch.setattr(kineto, "BLOCK_BYTES", 1 << 16)  # a budget check every 64 KiB
    whole = kineto.scan_range(source, 0, None, True, True)
    # A budget that the whole file's columns pass over halfway
    limit = int(1000 + READ_OVERHEAD_BYTES + whole.nbytes * PEAK_PER_HELD_BYTE / 2)
    budget = MemoryBudget(limit=limit, base=1000)
    with pytest.raises(TraceMemoryError) as caught:
        kineto.scan_range(source, 0, None, True, True, budget=budget)
    message = str(caught.value)
    read = int(message.split(" events read")[0].split("(")[-1].replace(",", ""))
    assert 0 < read < whole.events  # stopped on the way, not at the end
    assert "over --max-memory" in message and "for the whole file" in message
    assert "\n" not in message
    generous = MemoryBudget(limit=1000 + READ_OVERHEAD_BYTES + 3 * whole.nbytes, base=1000)
    assert kineto.scan_range(source, 0, None, True, True, budget=generous).events == whole.events


def test_max_memory_option_is_one_line_exit_2_and_nothing_written(tmp_path):
    folder = tmp_path / "t"
    folder.mkdir()
    shutil.copy(real_traces_dir() / TRACE, folder / TRACE)
    small = runner.invoke(app, ["profile", "analyze", str(folder), "--max-memory", "64M"])
    assert small.exit_code == 2 and "over --max-memory 64 MiB" in small.stderr
    assert len(small.stderr.strip().splitlines()) == 1 and not (folder / FINDINGS_FILE).exists()
    bad = runner.invoke(app, ["profile", "analyze", str(folder), "--max-memory", "lots"])
    assert bad.exit_code == 2 and "--max-memory 'lots' is not a memory size" in bad.stderr
    fine = runner.invoke(app, ["profile", "analyze", str(folder), "--max-memory", "64G"])
    assert fine.exit_code == 0 and (folder / FINDINGS_FILE).exists()
