"""A real two-host lock-step run: two network namespaces, one torchscale in each, gloo over veth.

One sweep, shared by the tests (launches cost seconds): every GPU count runs on 2 nodes and on 1
(``nodes: [2, 1]``, so each 2-node cell comes first). ``compute`` is killed in the middle of the
second 2 x 1 cell: ``head`` (node 0) must record it as failed, go on with the next cell, and
record the 2-node cell after it as failed once ``compute`` has not joined within head's join
timeout.

c10d orders the nodes of a rendezvous by name, so ``compute`` holds worker rank 0: the result must
still be written on ``head``, the node that records results.

``fsdp2_hybrid`` needs two nodes: one 2 x 2 cell of it runs on the two hosts in a launch of its
own (the sweep's cell order and killed cells are what the tests above assert).
"""

from __future__ import annotations

import csv
import socket
import time
from pathlib import Path
from typing import Dict, List

import pytest

from tests.support.multinode_run import (
    CELL_TIMEOUT_S,
    CONFIG,
    ENDPOINT,
    HEAD_JOIN_TIMEOUT_S,
)
from tests.support.two_hosts import IFNAME
from torchscale.models.registry import load_model
from torchscale.results.schema import TrainingResult

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timed(alone=False),  # a node that gives up within its join timeout
]

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lockstep(two_host_lockstep: Dict) -> Dict:
    return two_host_lockstep  # one sweep per session (tests/support/multinode_run.py)


def cells(records: List[TrainingResult]) -> Dict[tuple, TrainingResult]:
    return {(r.batch_size, r.world_size, r.nnodes): r for r in records}


def test_two_node_cells_ran_on_both_hosts(lockstep: Dict) -> None:
    by_cell = cells(lockstep["records"])
    for batch, world in ((2, 2), (2, 4)):
        record = by_cell[(batch, world, 2)]
        assert record.status == "ok", record.error
        assert record.nnodes == 2 and record.nproc_per_node == world // 2
        assert record.hosts == ["compute", "head"]
        ranks_by_host: Dict[str, List[int]] = {}
        for rank in record.per_rank:
            ranks_by_host.setdefault(rank.host, []).append(rank.rank)
        # c10d numbers nodes by name: compute's ranks come first.
        assert ranks_by_host == {
            "compute": list(range(world // 2)),
            "head": list(range(world // 2, world)),
        }
        assert record.samples_per_s is not None and record.measured_s is not None
        assert record.backend == "gloo" and record.samples_per_s > 0
        assert record.samples_per_s == pytest.approx(
            record.global_batch_size * len(record.step_times_ms) / record.measured_s
        )
        cell_dir = lockstep["store"].cell_dir(record.cell_id)
        # Written by head's rank although compute held rank 0; compute kept only its logs.
        assert (cell_dir / "result.json").exists()
        assert not (cell_dir / "node1" / "result.json").exists()
        assert (cell_dir / "node1" / "launch.log").exists()
        compute_logs = list((cell_dir / "node1" / "torchrun").rglob("stdout.log"))
        head_logs = list((cell_dir / "torchrun").rglob("stdout.log"))
        assert len(compute_logs) == len(head_logs) == world // 2


def test_single_node_cells_run_on_node_zero_only(lockstep: Dict) -> None:
    by_cell = cells(lockstep["records"])
    for batch in (2, 4):
        one = by_cell[(batch, 2, 1)]
        assert one.status == "ok", one.error
        assert one.hosts == ["head"] and one.nnodes == 1
        assert not (lockstep["store"].cell_dir(one.cell_id) / "node1").exists()
        skipped = by_cell[(batch, 4, 1)]
        assert skipped.status == "skipped"
        assert skipped.error == "needs 4 CPU processes per node; this node has 2 CPU processes"


def test_a_killed_node_fails_its_cell_and_the_sweep_goes_on(lockstep: Dict) -> None:
    records = lockstep["records"]
    order = [(r.batch_size, r.world_size, r.nnodes, r.status) for r in records]
    assert order == [
        (2, 2, 2, "ok"),
        (2, 2, 1, "ok"),
        (2, 4, 2, "ok"),
        (2, 4, 1, "skipped"),
        (4, 2, 2, "failed"),
        (4, 2, 1, "ok"),
        (4, 4, 2, "failed"),
        (4, 4, 1, "skipped"),
    ]
    killed = records[4]
    # head's rank lost its peer in a collective (gloo reports the closed connection).
    assert killed.error.startswith("rank 1 on head failed in "), killed.error
    assert lockstep["recorded_after_s"] < CELL_TIMEOUT_S
    assert killed.wall_s is not None and killed.wall_s < CELL_TIMEOUT_S
    # Nothing recorded before the kill changed.
    final = lockstep["store"].results_path.read_bytes()
    assert lockstep["before_kill"] and final.startswith(lockstep["before_kill"])
    assert len(lockstep["before_kill"].splitlines()) == 4
    assert lockstep["head_code"] == 1  # failed cells


def test_a_node_that_never_comes_fails_the_cell_after_the_join_timeout(lockstep: Dict) -> None:
    missing = lockstep["records"][6]
    assert missing.error.startswith(
        f"rendezvous 'torchscale-two-hosts-{missing.cell_id}' failed: the other node(s) did not "
        f"join within {HEAD_JOIN_TIMEOUT_S} s (RendezvousTimeoutError)"
    ), missing.error
    assert HEAD_JOIN_TIMEOUT_S <= missing.wall_s < HEAD_JOIN_TIMEOUT_S + CELL_TIMEOUT_S
    assert missing.per_rank == [] and missing.hosts == []


def test_manifest_records_the_launch_and_every_node(lockstep: Dict) -> None:
    manifest = lockstep["store"].manifest()
    assert manifest["launch"]["nnodes"] == 2 and manifest["launch"]["endpoint"] == ENDPOINT
    assert manifest["launch"]["run_id"] == "torchscale-two-hosts"
    nodes = {node["host"]: node for node in manifest["nodes"]}
    assert sorted(nodes) == ["compute", "head"]
    for node in nodes.values():
        assert node["device_kind"] == "cpu" and node["device_count"] == 2
        assert node["env"]["GLOO_SOCKET_IFNAME"] == IFNAME
        assert node["env"]["WORLD_SIZE"] in ("2", "4")


def test_summary_and_node_scaling_split_intra_and_inter_node(lockstep: Dict) -> None:
    from torchscale.analysis.node_scaling import node_scaling
    from torchscale.analysis.training_tables import training_table

    with open(lockstep["store"].summary_path) as handle:
        rows = list(csv.DictReader(handle))
    two_by_two = [r for r in rows if r["world_size"] == "4" and r["nnodes"] == "2"]
    assert [(r["status"], r["hosts"]) for r in two_by_two] == [
        ("ok", "compute head"),
        ("failed", ""),
    ]

    by_cell = cells(lockstep["records"])
    table = node_scaling(training_table(lockstep["records"]))
    row = table[(table["batch_size"] == 2) & (table["world_size"] == 4)].iloc[0]
    one_node, two_nodes = by_cell[(2, 2, 1)], by_cell[(2, 4, 2)]
    assert one_node.samples_per_s is not None and two_nodes.samples_per_s is not None
    # 2 x 2 against 2 x (1 x 2): the network between the hosts alone.
    assert row["inter_node_efficiency"] == pytest.approx(
        two_nodes.samples_per_s / (2 * one_node.samples_per_s)
    )
    # The baseline is the smallest count on the fewest nodes: 1 x 2, not 2 x 1.
    assert row["scaling_efficiency"] == pytest.approx(
        two_nodes.samples_per_s / (4 / 2 * one_node.samples_per_s)
    )
    assert row["intra_node_efficiency"] == pytest.approx(1.0)
    assert row["hosts"] == "compute head"
    head_log = lockstep["logs"]["head"]
    assert "> Running gpt2-tiny on 4 CPU processes x 2 nodes (batch 2, fp32)..." in head_log
    assert "> [FAIL] failed: rank 1 on head failed in " in head_log
    # compute ran its 2-node cells and then waited at the next one, recording nothing.
    assert (
        "> Running gpt2-tiny on 4 CPU processes x 2 nodes (batch 2, fp32)..."
        in lockstep["logs"]["compute"]
    )
    assert "> Running gpt2-tiny on 2 CPU processes (batch" not in lockstep["logs"]["compute"]


def test_a_node_stops_when_node_zero_is_not_there(tmp_path: Path) -> None:
    """No namespaces needed: node 1 alone on loopback, node 0's port closed."""
    from typer.testing import CliRunner

    from torchscale.cli.app import app

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.replace("batch_sizes: [2, 4]", "batch_sizes: [2]"))
    args = ["benchmark", "-c", str(config), "-o", str(tmp_path / "out"), "--nnodes", "2"]
    # Nobody listens on the port: any join timeout proves the stop; 1 s waits least.
    args += ["--node-rank", "1", "--rdzv-endpoint", f"127.0.0.1:{port}", "--join-timeout", "1"]
    started = time.monotonic()
    result = CliRunner().invoke(app, args, env={"TORCHSCALE_CPU_SLOTS": "2"})
    assert result.exit_code == 2, result.output
    assert f"node 0's rendezvous store at 127.0.0.1:{port} did not answer" in result.stderr
    assert "node 1 stops" in result.stderr and "(RendezvousConnectionError)" in result.stderr
    assert time.monotonic() - started < CELL_TIMEOUT_S
    # It wrote only in its own sub-folder: no results, no manifest.
    written = sorted(p.relative_to(tmp_path / "out") for p in (tmp_path / "out").rglob("*.*"))
    assert written and all(
        p.parts[:2] == ("two-hosts", ".lock-node1") or "node1" in p.parts for p in written
    ), written


def test_fsdp2_hybrid_shards_within_a_node_and_replicates_across_nodes(hybrid_run: Dict) -> None:
    """One 2 x 2 fsdp2_hybrid cell on the two hosts: mesh (nodes, ranks per node) = (2, 2)."""
    (record,) = hybrid_run["records"]
    head_code, logs = hybrid_run["head_code"], hybrid_run["logs"]
    assert head_code == 0 and record.status == "ok", (record.error, logs[-3000:])
    assert isinstance(record, TrainingResult)
    assert record.nnodes == 2 and record.world_size == 4 and record.hosts == ["compute", "head"]
    applied = record.runtime["strategy"]
    assert applied["strategy"] == "fsdp2_hybrid" and applied["mesh"] == [2, 2], applied
    assert record.gradient_check is not None and record.gradient_check.passed, record.gradient_check
    # Model state per rank: the whole fp32 model (what ddp keeps) halved by the 2 ranks of a node,
    # not quartered (the 2 nodes hold a replica each).
    whole = 4 * sum(p.numel() for p in load_model("gpt2-tiny").build().parameters())
    assert record.memory is not None
    for field in ("params_bytes", "grads_bytes"):
        assert getattr(record.memory, field) / whole == pytest.approx(0.5, rel=0.10), field
    # gpt2's optimizer is AdamW: two moments per parameter, sharded as the parameters are.
    assert load_model("gpt2-tiny").optimizer == "adamw"
    assert record.memory.optimizer_bytes / (2 * whole) == pytest.approx(0.5, rel=0.10)
    issued = {c.op: c for c in record.collectives}
    # Within a node: each block's whole parameters gathered (forward, again for backward), its
    # gradients reduce-scattered; across nodes: the shard's gradients all-reduced.
    assert issued["all_gather"].bytes > 1.5 * whole, issued
    assert issued["reduce_scatter"].bytes == pytest.approx(whole, rel=0.05), issued
    assert issued["all_reduce"].bytes == pytest.approx(whole / 2, rel=0.05), issued
    # Each op ran in a group of 2, not 4 (busbw / algbw is the op's bus factor at its group's
    # size): all_gather and reduce_scatter (n-1)/n = 0.5, all_reduce 2(n-1)/n = 1.0.
    factors = {op: (c.busbw_gbps or 0.0) / c.algbw_gbps for op, c in issued.items() if c.algbw_gbps}
    assert factors == pytest.approx(
        {"all_gather": 0.5, "reduce_scatter": 0.5, "all_reduce": 1.0}, rel=1e-6
    ), issued
