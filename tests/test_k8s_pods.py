"""The controller's contract, run for real: a TrainJob's two pods on two hosts.

The manifest ``--launcher k8s`` writes (the default API, TrainJob) is turned into its pods as
Kubeflow Trainer v2.3's torch plugin makes them (tests/support/k8s_controllers.py quotes the
source), and each pod's command runs with that environment in its own network namespace (the
two-host set-up of test_multinode.py), node 0's address (``PET_MASTER_ADDR``, a JobSet pod name)
resolving to head. Only what a pod's volumes change is changed: ``/results`` (an emptyDir per pod)
and the config path are folders of their own per pod, and ``python`` is this interpreter.

Node 1's pod starts late: node 0 waits for it at the first cell, as lock-step mode waits for a
late node. Node 1's pod dies (every process of it SIGKILLed, as when its node is lost) in the
middle of the second cell: node 0 records that cell failed as lock-step mode records a dead node
(test_multinode.py), then ends, holds its results until they are copied and exits with the run's
code, and nothing of either pod is left running. The two pods' folders together equal what the
two-host lock-step run of test_multinode.py writes (its sweep, shared in the session). Then both
pods of a JobSet and a PyTorchJob, and both nodes of a SkyPilot and a dstack task, each with only
its controller's or platform's variables, run one 2 x 1 cell whole, each on two hosts of its own:
each finds node 0 where its variables say, and its folders equal the two-host run's for that
cell. The five runs go two at a time (``LANES``).
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any, Dict, List, Set

import pytest

from tests.support.k8s_pod_runs import CELL_TIMEOUT_S, OTHER_PORTS, TASK_ENV
from torchscale.launch.failure_cause import PEER_LOST
from torchscale.launch.pod_entry import READY_LINE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pods_run(k8s_pods_run: Dict[str, Any]) -> Dict[str, Any]:
    return k8s_pods_run  # run once per session, beside the other two-host runs (conftest)


def test_the_pods_run_the_matrix_in_lock_step(pods_run: Dict) -> None:
    records = {(r.batch_size, r.world_size, r.nnodes): r for r in pods_run["store"].records()}
    assert sorted(records) == [(2, 2, 2), (4, 2, 2)]
    two = records[(2, 2, 2)]
    assert two.status == "ok", two.error
    assert two.hosts == ["compute", "head"] and two.nproc_per_node == 1
    assert sorted(rank.host for rank in two.per_rank) == ["compute", "head"]
    assert two.samples_per_s == pytest.approx(
        two.global_batch_size * len(two.step_times_ms) / two.measured_s
    )
    # The folder is a lock-step run's: node 0 records; node 1's pod keeps only its own logs.
    cell = pods_run["store"].cell_dir(two.cell_id)
    assert (cell / "result.json").exists() and not (cell / "node1").exists()
    node1_cell = pods_run["node1"] / "cells" / two.cell_id / "node1"
    assert (node1_cell / "launch.log").exists()
    assert not (pods_run["node1"] / "results.jsonl").exists()
    manifest = pods_run["store"].manifest()
    assert manifest["launch"]["nnodes"] == 2
    assert manifest["launch"]["endpoint"] == f"{pods_run['master']}:29500"
    assert manifest["launch"]["run_id"] == "torchscale-k8s-pods"


def test_node_zero_waits_for_the_late_pod_and_keeps_its_results_until_copied(
    pods_run: Dict,
) -> None:
    two = pods_run["store"].records()[0]
    # The late pod joined within the join timeout; the cell waited, it did not fail.
    assert two.status == "ok"
    assert pods_run["held"] is True
    head_log = pods_run["logs"][0]
    assert "> Running gpt2-tiny on 2 CPU processes x 2 nodes (batch 2, fp32)..." in head_log
    ready = [line for line in head_log.splitlines() if line.startswith("torchscale-pod:")]
    assert ready == [f"torchscale-pod: results ready in {pods_run['store'].root}"]
    assert "torchscale-pod:" not in pods_run["logs"][1]  # node 1 holds nothing
    summary = json.loads(json.dumps(pods_run["manifest"]["spec"]["trainer"]["resourcesPerNode"]))
    assert summary == {"requests": {"cpu": "1"}}  # CPU processes stand in for GPUs here


def test_a_pod_that_dies_fails_its_cell_as_a_dead_node_and_node_zero_ends(
    pods_run: Dict,
) -> None:
    records = pods_run["store"].records()
    assert [(r.batch_size, r.status) for r in records] == [(2, "ok"), (4, "failed")]
    killed = records[1]
    # As in lock step: node 0's rank lost its peer in a collective (compute holds rank 0).
    assert killed.error.startswith("rank 1 on head failed in "), killed.error
    # ... to the dead node, which gloo names by its address.
    assert PEER_LOST.search(killed.error) and pods_run["node1_address"] in killed.error
    assert killed.wall_s is not None and killed.wall_s < CELL_TIMEOUT_S
    head_log, node1_log = pods_run["logs"]
    running = "> Running gpt2-tiny on 2 CPU processes x 2 nodes (batch 4, fp32)..."
    assert running in head_log and running in node1_log  # node 1 died inside that cell
    assert f"> [FAIL] failed: {killed.error.splitlines()[0][:60]}" in head_log
    # What was recorded before the pod died stays as it was.
    final = pods_run["store"].results_path.read_bytes()
    assert len(pods_run["before_kill"].splitlines()) == 1
    assert final.startswith(pods_run["before_kill"])
    # Node 0's pod still holds its results until they are copied, then ends with the run's code
    # (a failed cell), and nothing of either pod is left running.
    assert pods_run["held"] is True and pods_run["head_code"] == 1, head_log
    assert sorted(pods_run["running"]) == sorted(pods_run["namespaces"])  # the probe sees pods
    assert pods_run["left"] == {}


COMPARED_CELLS = re.compile(r"^gpt2-tiny-(b2-g2-n2|b4-g2-n2)-fp32-r0-[0-9a-f]+$")
"""The 2 x 1 cells both runs make: batch 2 (ok) and batch 4 (its node 1 killed mid-cell)."""


def _layout(root: Path, cells: re.Pattern[str] = COMPARED_CELLS) -> Set[str]:
    """The files of a results folder, the compared cells' names without their settings hash,
    torchrun's run folder (a random suffix) as ``*``; other cells, the hold mark left out."""
    files = set()
    for path in root.rglob("*"):
        parts = list(path.relative_to(root).parts)
        if not path.is_file() or parts == [".torchscale-copied"]:
            continue
        if parts[0] == "cells":
            match = cells.match(parts[1])
            if match is None:
                continue
            parts[1] = match.group(1)
            if "torchrun" in parts:
                parts[parts.index("torchrun") + 1] = "*"
        if re.fullmatch(r"benchmark_\d+gpu\.json", parts[0]):
            parts[0] = "benchmark_<n>gpu.json"
        files.add("/".join(parts))
    return files


def _compared_records(
    root: Path, cells: re.Pattern[str] = COMPARED_CELLS
) -> Dict[str, Dict[str, Any]]:
    records = {}
    for line in (root / "results.jsonl").read_text().splitlines():
        record = json.loads(line)
        match = cells.match(record["cell_id"])
        if match:
            records[match.group(1)] = record
    return records


def _assert_equal_to_lockstep(
    pod0: Path, node1: Path, shared: Path, cells: re.Pattern[str], names: List[str]
) -> Dict[str, Dict[str, Any]]:
    """Node 0's folder and node 1's together hold what the two hosts write on their shared
    folder for ``cells``: the same files, records with the same fields and outcomes, the same
    summary columns and manifest sections. Returns the pods' compared records."""
    node1_parts = {f for f in _layout(shared, cells) if "/node1/" in f or f == ".lock-node1"}
    assert _layout(pod0, cells) == _layout(shared, cells) - node1_parts  # nothing of node 1
    assert _layout(node1, cells) == node1_parts  # node 1's pod: its own sub-folders only
    assert {"results.jsonl", "summary.csv", "manifest.json", "b2-g2-n2"} <= {
        f.split("/")[0] if not f.startswith("cells/") else f.split("/")[1]
        for f in _layout(pod0, cells)
    }
    ours, theirs = _compared_records(pod0, cells), _compared_records(shared, cells)
    assert sorted(ours) == sorted(theirs) == names
    for cell in ours:
        assert sorted(ours[cell]) == sorted(theirs[cell]), cell  # the same record fields
        for key in ("status", "hosts", "nnodes", "nproc_per_node", "world_size", "batch_size"):
            assert ours[cell][key] == theirs[cell][key], (cell, key)
    with open(pod0 / "summary.csv") as mine, open(shared / "summary.csv") as other:
        assert next(csv.reader(mine)) == next(csv.reader(other))
    ours_manifest, theirs_manifest = (
        json.loads((root / "manifest.json").read_text()) for root in (pod0, shared)
    )
    assert sorted(ours_manifest) == sorted(theirs_manifest)
    assert sorted(ours_manifest["launch"]) == sorted(theirs_manifest["launch"])
    assert [sorted(n) for n in ours_manifest["nodes"]] == [
        sorted(n) for n in theirs_manifest["nodes"]
    ]
    return ours


def test_the_pods_folders_together_equal_a_two_node_lock_step_runs(
    pods_run: Dict, two_host_lockstep: Dict
) -> None:
    """Node 0's emptyDir and node 1's together hold what test_multinode's two hosts write on
    their shared folder (no new launch: its sweep is the session's)."""
    shared = two_host_lockstep["store"].root
    ours = _assert_equal_to_lockstep(
        pods_run["store"].root, pods_run["node1"], shared, COMPARED_CELLS, ["b2-g2-n2", "b4-g2-n2"]
    )
    theirs = _compared_records(shared)
    for record in (ours["b4-g2-n2"], theirs["b4-g2-n2"]):
        assert record["error"].startswith("rank 1 on head failed in "), record["error"]


OTHER_CELL = re.compile(r"^gpt2-tiny-(b2-g2-n2)-fp32-r0-[0-9a-f]+$")


@pytest.mark.parametrize("what", sorted(OTHER_PORTS))
def test_both_pods_of_every_other_api_and_task_equal_a_two_node_lock_step_run(
    pods_run: Dict, two_host_lockstep: Dict, what: str
) -> None:
    """Both nodes of a JobSet, a PyTorchJob, a SkyPilot and a dstack task, each with only its
    controller's or platform's variables, find node 0 where those say and run the cell in lock
    step; their two folders together equal the two-host run's for that cell."""
    run = pods_run["other_runs"][what]
    assert run["codes"] == [0, 0], run["logs"]
    shared = two_host_lockstep["store"].root
    ours = _assert_equal_to_lockstep(run["pod0"], run["node1"], shared, OTHER_CELL, ["b2-g2-n2"])
    record = ours["b2-g2-n2"]
    assert record["status"] == "ok", record.get("error")
    assert record["hosts"] == ["compute", "head"] and record["nnodes"] == 2
    assert sorted(rank["host"] for rank in record["per_rank"]) == ["compute", "head"]
    endpoint = json.loads((run["pod0"] / "manifest.json").read_text())["launch"]["endpoint"]
    assert endpoint == f"{run['master']}:{OTHER_PORTS[what]}"  # node 0 where its variables say
    if what == "pytorchjob":
        assert run["master"] == "ts-k8s-pods-master-0"  # the Master's Service
    if what == "jobset":
        assert run["master"].endswith(".ts-k8s-pods")  # node 0's JobSet DNS host name
    ready = [line for line in run["logs"][0].splitlines() if line.startswith(READY_LINE)]
    assert ready == ([] if what in TASK_ENV else [f"{READY_LINE}{run['pod0']}"])
    assert "Traceback" not in run["logs"][0] + run["logs"][1]
