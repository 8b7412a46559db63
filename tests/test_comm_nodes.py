"""Communication split by node, on two real hosts (network namespaces joined by a veth pair).

One 2 x 2 communication cell measures every collective over the world, within each node and
across the nodes (one rank per node), with the test-only corruption hook on rank 2 at one size:
the checks must catch it in every scope rank 2 takes part in, counted on that rank alone.

c10d orders the nodes of a rendezvous by name, so ``compute`` holds ranks 0-1 and ``head`` 2-3:
the inter-node groups are ranks 0 and 2, one on each side of the veth.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import pytest

from tests.support.multinode_run import CORRUPT_SIZE
from torchscale.comm.busbw import busbw_factor, layout
from torchscale.comm.config import ELEMENT_BYTES
from torchscale.results.schema import CollectiveResult

pytestmark = pytest.mark.slow

GROUPS = {"world": [0, 1, 2, 3], "intra_node": [0, 1, 2, 3], "inter_node": [0, 2]}
GROUP_SIZE = {"world": 4, "intra_node": 2, "inter_node": 2}


@pytest.fixture(scope="module")
def split(comm_nodes_run: Dict) -> Dict:
    return comm_nodes_run  # run once per session, beside the other two-host runs (conftest)


def by_key(records: List[CollectiveResult]) -> Dict[tuple, CollectiveResult]:
    return {(r.scope, r.op, r.size_bytes): r for r in records}


def test_every_scope_op_and_size_is_recorded_across_both_hosts(split: Dict) -> None:
    records = split["records"]
    expected = [
        (scope, op, layout(op, size, ELEMENT_BYTES["float32"], GROUP_SIZE[scope]).size_bytes)
        for scope in ("world", "intra_node", "inter_node")
        for op in ("all_reduce", "all_gather", "broadcast")
        for size in (256, 1024)
    ]
    assert [(r.scope, r.op, r.size_bytes) for r in records] == expected
    for record in records:
        assert record.world_size == 4 and record.nnodes == 2
        assert record.hosts == ["compute", "head"]
        assert record.group_size == GROUP_SIZE[record.scope]


def test_bandwidth_uses_the_group_size_and_only_ranks_that_took_part(split: Dict) -> None:
    for record in split["records"]:
        took_part = [rank for rank, t in enumerate(record.per_rank_time_us) if t is not None]
        assert took_part == GROUPS[record.scope], (record.scope, record.per_rank_time_us)
        times = [record.per_rank_time_us[rank] for rank in took_part]
        assert record.time_us == pytest.approx(sum(times) / len(times))
        assert record.time_us_min == min(times) and record.time_us_max == max(times)
        assert record.busbw_factor == busbw_factor(record.op, GROUP_SIZE[record.scope])
        assert record.busbw_gbps == pytest.approx(record.algbw_gbps * record.busbw_factor)
    # all_reduce over 4 ranks moves 2(n-1)/n = 1.5x the bytes per rank, over 2 ranks 1x.
    world = by_key(split["records"])[("world", "all_reduce", 256)]
    inter = by_key(split["records"])[("inter_node", "all_reduce", 256)]
    assert (world.busbw_factor, inter.busbw_factor) == (1.5, 1.0)


def test_checks_run_inside_each_group_and_catch_rank_2_in_every_scope(split: Dict) -> None:
    records = by_key(split["records"])
    for scope in ("world", "intra_node", "inter_node"):
        corrupted = records[(scope, "all_reduce", CORRUPT_SIZE)]
        assert corrupted.wrong == 1, scope
        assert corrupted.wrong_per_rank == [0, 0, 1, 0]
        clean = [r for r in split["records"] if r.scope == scope and r is not corrupted]
        assert all(r.wrong == 0 for r in clean), [(r.op, r.size_bytes, r.wrong) for r in clean]
    error = records[("world", "all_gather", 256)].error
    assert error is not None
    assert records[("world", "all_gather", 256)].status == "failed"
    assert f"all_reduce float32 at {CORRUPT_SIZE} B: 1 wrong element(s) on rank 2" in error
    assert f"at {CORRUPT_SIZE} B (intra_node): 1 wrong element(s) on rank 2" in error
    assert f"at {CORRUPT_SIZE} B (inter_node): 1 wrong element(s) on rank 2" in error
    assert split["codes"][0] == 1  # a failed cell: head exits 1, as for any failed cell


def test_console_and_summary_name_the_scopes(split: Dict) -> None:
    log = split["log"]
    assert "communication on 4 CPU processes x 2 nodes" in log
    assert "# all_reduce float32 on 2 ranks, one per node (the network alone)" in log
    assert "# all_gather float32 on 2 ranks within each node (all nodes at once)" in log
    summary = (Path(split["root"]) / "summary_comm.csv").read_text().splitlines()
    header = summary[0].split(",")
    assert header[header.index("op") :][:2] == ["op", "scope"]
    assert sum(",inter_node,2," in line for line in summary) == 6
