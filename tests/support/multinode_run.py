"""The two-host lock-step sweep of test_multinode.py, run once per session: test_multinode.py
asserts on it, and test_k8s_pods.py compares its Kubernetes pods' results folder with it (the
folder a normal two-node run writes). See test_multinode.py for what the sweep does."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Dict

from tests.support.two_hosts import check_stop, kill_tree, torchscale_env, two_hosts
from tests.support.typed import training_records
from torchscale.results.store import ExperimentStore

PORT = 29561
ENDPOINT = f"10.213.77.2:{PORT}"
CELL_TIMEOUT_S = 120
HEAD_JOIN_TIMEOUT_S = 8  # covers the two torchruns of a cell starting a few seconds apart
CONFIG = f"""\
experiment_name: two-hosts
models: [gpt2-tiny]
batch_sizes: [2, 4]
gpu_counts: [2, 4]
nodes: [2, 1]
warmup_steps: 2
measure_steps: 8
sync_probe_steps: 2
cell_timeout_s: {CELL_TIMEOUT_S}
"""
COLLECTIVE_PHASES = {"warmup", "measure", "sync_probe"}


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check_stop()
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def in_collectives(cell_pattern: str, store: ExperimentStore) -> bool:
    """Whether compute's ranks of the cell are past start-up, exchanging gradients with head."""
    for path in store.root.glob(f"cells/{cell_pattern}/node1/ranks/rank*.progress.json"):
        try:
            if json.loads(path.read_text())["phase"] in COLLECTIVE_PHASES:
                return True
        except (OSError, ValueError):
            pass
    return False


def run_lockstep(tmp: Path) -> Dict[str, Any]:
    """The sweep, both hosts torn down before it returns (what it wrote stays in ``tmp``)."""
    with two_hosts(tmp, "two-host test") as hosts:
        store = ExperimentStore(tmp / "out" / "two-hosts")
        env = torchscale_env()
        # compute starts first, so a short join timeout on head only bites when compute is gone.
        head, compute = hosts.lockstep(
            CONFIG,
            tmp,
            env,
            PORT,
            head_args=["--join-timeout", str(HEAD_JOIN_TIMEOUT_S)],
        )

        kill_cell = "gpt2-tiny-b4-g2-n2-*"
        wait_for(lambda: in_collectives(kill_cell, store), 300, "the 2 x 1 cell of batch 4")
        before_kill = store.results_path.read_bytes()
        kill_tree(compute.pid)
        killed_at = time.monotonic()

        def kill_cell_recorded() -> bool:
            return any(
                r.batch_size == 4 and r.nnodes == 2 for r in training_records(store.records())
            )

        wait_for(kill_cell_recorded, CELL_TIMEOUT_S + 30, "head to record the killed cell")
        recorded_after_s = time.monotonic() - killed_at
        head_code = head.wait(timeout=300)
        return {
            "store": store,
            "records": store.records(),
            "before_kill": before_kill,
            "recorded_after_s": recorded_after_s,
            "head_code": head_code,
            "logs": {name: (tmp / f"{name}.log").read_text() for name in ("head", "compute")},
        }


COMM_PORT = 29571
CORRUPT_SIZE = 1024
COMM_CONFIG = """\
experiment_name: comm-nodes
gpu_counts: [4]
nodes: [2]
communication:
  collectives: [all_reduce, all_gather, broadcast]
  scope: [world, intra_node, inter_node]
  p2p: false
  min_bytes: 256
  max_bytes: 1K
  factor: 4
  warmup: 1
  iterations: 3
  cell_timeout_s: 120
"""
"""tests/test_comm_nodes.py's 2 x 2 communication cell (see its docstring)."""


def run_comm_nodes(tmp: Path) -> Dict[str, Any]:
    """The communication cell on both hosts, the test-only corruption on rank 2 at one size."""
    from torchscale.comm.collective_ops import CORRUPT_ENV
    from torchscale.results.schema import CollectiveResult

    with two_hosts(tmp, "two-host communication test") as hosts:
        env = {**torchscale_env(), CORRUPT_ENV: f"all_reduce:2:{CORRUPT_SIZE}"}
        head, compute = hosts.lockstep(COMM_CONFIG, tmp, env, COMM_PORT)
        codes = (head.wait(timeout=300), compute.wait(timeout=60))
    store = ExperimentStore(tmp / "out" / "comm-nodes")
    return {
        "codes": codes,
        "records": [r for r in store.records() if isinstance(r, CollectiveResult)],
        "log": (tmp / "head.log").read_text(),
        "root": store.root,
    }


HYBRID_PORT = 29563
HYBRID_CONFIG = """\
experiment_name: hybrid
models: [gpt2-tiny]
batch_sizes: [2]
gpu_counts: [4]
nodes: [2]
strategy: [fsdp2_hybrid]
warmup_steps: 2
measure_steps: 3
sync_probe_steps: 1
cell_timeout_s: 240
"""
"""tests/test_multinode.py's one 2 x 2 fsdp2_hybrid cell: a launch of its own (the sweep's cell
order and killed cells are what that module's other tests assert)."""


def run_hybrid(tmp: Path) -> Dict[str, Any]:
    """The fsdp2_hybrid cell on both hosts, to its end."""
    with two_hosts(tmp, "fsdp2_hybrid two-host test") as hosts:
        head, compute = hosts.lockstep(HYBRID_CONFIG, tmp, torchscale_env(), HYBRID_PORT)
        head_code = head.wait(timeout=300)
        compute.wait(timeout=60)
    return {
        "head_code": head_code,
        "records": ExperimentStore(tmp / "out" / "hybrid").records(),
        "logs": (tmp / "head.log").read_text() + (tmp / "compute.log").read_text(),
    }
