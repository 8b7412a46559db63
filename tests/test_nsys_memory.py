"""nsys memory events (``CUDA_GPU_MEMORY_USAGE_EVENTS``) into the memory timeline: a two-GPU node
export with the table as NVIDIA's schema reference lists it (tests/data/make_nsys_fixture.py,
``MEMORY_SCHEMA``; no recorded export has one), figures checked against SQL on the file."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from tests.data.make_nsys_fixture import MemoryEvent, add_memory_events, write_node
from torchscale.profiling.analysis import analyze
from torchscale.profiling.traces.nsys_sqlite import read_nsys

MIB = 1 << 20
MS = 1_000_000  # ns
EVENTS = [
    MemoryEvent(45 * MS, 0, 1024 * MIB, 0, 0xA000),  # weights, held throughout
    MemoryEvent(55 * MS, 0, 64 * MIB, 0, 0xB000, kind=1),  # pinned host buffer
    MemoryEvent(60 * MS, 0, 256 * MIB, 0, 0xC000),  # activations ...
    MemoryEvent(70 * MS, 0, 256 * MIB, 1, 0xC000),  # ... freed
    MemoryEvent(45 * MS, 1, 512 * MIB, 0, 0xA000),
    MemoryEvent(60 * MS, 1, 128 * MIB, 0, 0xD000),  # never freed: the rank grows
    MemoryEvent(80 * MS, 1, 8 * MIB, 3, 0xE000),  # an operation type nsys does not define
]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    path = write_node(tmp_path_factory.mktemp("memory") / "node.sqlite", gpus=2)
    add_memory_events(path, EVENTS)
    return path


def _sql_peaks(path):
    """Per (device, host?): the largest running total, by SQL on the export itself."""
    con = sqlite3.connect(path)
    rows = con.execute(
        "SELECT deviceId, memKind IN (0, 1), MAX(total) FROM (SELECT deviceId, memKind, SUM("
        "CASE memoryOperationType WHEN 0 THEN bytes ELSE -bytes END) OVER (PARTITION BY "
        "globalPid, deviceId, memKind IN (0, 1) ORDER BY start) AS total "
        "FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memoryOperationType IN (0, 1)) "
        "GROUP BY deviceId, memKind IN (0, 1)"
    ).fetchall()
    con.close()
    return {("cpu" if host else f"cuda:{device}"): peak for device, host, peak in rows}


def test_each_rank_gets_its_process_and_devices_memory(node):
    peaks = _sql_peaks(node)
    # read cell by cell (pandas-stubs type a cell as any scalar, an index entry as Hashable)
    summary: Any = analyze([node]).tables["memory"].set_index(["rank", "device"])
    assert sorted(summary.index) == [(0, "cpu"), (0, "cuda:0"), (1, "cuda:1")]
    for (_, device), row in summary.iterrows():
        assert row["peak_allocated_bytes"] == peaks[device]
        assert row["peak_reserved_bytes"] != row["peak_reserved_bytes"]  # nsys has no reserve
    gpu0, gpu1 = summary.loc[(0, "cuda:0")], summary.loc[(1, "cuda:1")]
    assert gpu0["peak_allocated_bytes"] == 1280 * MIB and gpu0["peak_at_us"] == 15_000
    assert (gpu0["events"], gpu0["allocated_growth_bytes"]) == (3, 0)
    assert gpu1["allocated_end_bytes"] == 640 * MIB  # the undefined operation is left out
    assert gpu1["allocated_growth_bytes"] == 128 * MIB
    assert summary.loc[(0, "cpu"), "peak_allocated_bytes"] == 64 * MIB


def test_memory_timeline_of_nsys_events(node):
    timeline = analyze([node]).tables["memory_timeline"]
    mine = timeline[(timeline["rank"] == 0) & (timeline["device"] == "cuda:0")]
    assert mine["allocated_bytes"].tolist() == [1024 * MIB, 1280 * MIB, 1024 * MIB]
    assert mine["start_us"].iloc[0] == pytest.approx(read_nsys(node)[0].memory["ts"].iloc[0])


def _without(node, folder, columns):
    path = folder / "bare.sqlite"
    path.write_bytes(node.read_bytes())
    con = sqlite3.connect(path)
    for column in columns:
        con.execute(f"ALTER TABLE CUDA_GPU_MEMORY_USAGE_EVENTS DROP COLUMN {column}")
    con.commit()
    con.close()
    return read_nsys(path)


def test_memory_table_without_optional_columns(node, tmp_path):
    """Only ``start``, ``bytes`` and ``memoryOperationType`` are needed: without ``memKind``
    everything is device memory (the pinned buffer too); without ``globalPid`` events go to the
    rank of their device, without ``deviceId`` to the rank of their process (on its device);
    with neither, to none."""
    zero, one = _without(node, tmp_path, ("memKind", "globalPid"))
    assert set(zero.memory["device"]) == {0} and set(one.memory["device"]) == {1}
    assert zero.memory["allocated"].max() == (1024 + 64 + 256) * MIB
    assert one.memory["allocated"].iloc[-1] == 640 * MIB
    zero, one = _without(node, tmp_path, ("deviceId",))
    assert (len(zero.memory), len(one.memory)) == (4, 2)
    assert set(one.memory["device"]) == {1} and one.memory["allocated"].iloc[-1] == 640 * MIB
    assert [len(t.memory) for t in _without(node, tmp_path, ("deviceId", "globalPid"))] == [0, 0]


def test_the_memory_events_count_against_the_memory_budget(node, monkeypatch):
    """A capture with memory usage on holds millions of these rows: the budget is checked once
    they are read too, with their bytes and their count."""
    from torchscale.profiling.traces import nsys_memory
    from torchscale.profiling.traces.memory_budget import MemoryBudget
    from torchscale.profiling.traces.nsys_sqlite import _GPU_TABLES

    held = []
    monkeypatch.setattr(MemoryBudget, "check", lambda self, h, path, events: held.append(events))
    read_nsys(node, MemoryBudget(limit=1 << 40, base=0))
    con = sqlite3.connect(node)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    memory = nsys_memory.memory_events(con, tables)
    con.close()
    assert memory is not None and len(memory.start) == 6
    # one check per GPU table, then one more once the memory events are read, counting them
    assert len(held) == len(_GPU_TABLES) + 1 and held[-1] >= held[-2] + len(memory.start)
