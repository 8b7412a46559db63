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
its controller's or platform's variables, run one 2 x 1 cell whole, one after another: each finds
node 0 where its variables say, and its folders equal the two-host run's for that cell.
"""

from __future__ import annotations

import csv
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Set

import pytest
import yaml
from typer.testing import CliRunner

from tests.support.k8s_controllers import CONTROLLERS, trainjob_pods
from tests.support.two_hosts import kill_tree, torchscale_env, two_hosts
from torchscale.cli.app import app
from torchscale.launch.failure_cause import PEER_LOST
from torchscale.launch.pod_entry import COPIED_MARK, READY_LINE
from torchscale.results.store import ExperimentStore

pytestmark = pytest.mark.slow

CELL_TIMEOUT_S = 120
CONFIG = f"""\
experiment_name: k8s-pods
models: [gpt2-tiny]
batch_sizes: [2, 4]
gpu_counts: [2]
gpus_per_node: 1
warmup_steps: 2
measure_steps: 4
sync_probe_steps: 2
cell_timeout_s: {CELL_TIMEOUT_S}
"""
LATE_S = 2.0
KILLED_CELL = "gpt2-tiny-b4-g2-n2-*"
JOINED_PHASES = {"build", "warmup", "measure", "gradient_check", "sync_probe"}
"""A rank in these has joined the process group: its peers lose it in a collective."""


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def _joined(node1: Path, cell_pattern: str) -> bool:
    """Whether node 1's ranks of the cell have joined the process group (past start-up)."""
    for path in node1.glob(f"cells/{cell_pattern}/node1/ranks/rank*.progress.json"):
        try:
            if json.loads(path.read_text())["phase"] in JOINED_PHASES:
                return True
        except (OSError, ValueError):
            pass
    return False


def _left_running(namespaces: List[str], wait_s: float = 10.0) -> Dict[str, List[str]]:
    """The processes still running in each host's network namespace (none, once the pods have
    ended), given a few seconds for the kernel to reap the last ones."""

    def pids() -> Dict[str, List[str]]:
        found = {}
        for ns in namespaces:
            listed = subprocess.run(
                ["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30
            ).stdout.split()
            if listed:
                found[ns] = listed
        return found

    deadline = time.monotonic() + wait_s
    while (left := pids()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


OTHER_CONFIG = CONFIG.replace("batch_sizes: [2, 4]", "batch_sizes: [2]")
"""The other APIs' and tasks' run: one 2 x 1 cell, the one both pods of each run whole."""
TASK_ENV = {  # each platform's variables on node N of a 2-node task (node 0 is head)
    "skypilot": lambda rank: {"SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": str(rank)},
    "dstack": lambda rank: {"DSTACK_NODES_NUM": "2", "DSTACK_NODE_RANK": str(rank)},
}
OTHER_PORTS = {"skypilot": 29400, "dstack": 29400, "jobset": 29400, "pytorchjob": 23456}
"""Where each looks for node 0's store: the task's port, the JobSet's MASTER_PORT (set by
torchscale), the training operator's pytorchjob-port."""


def _other_pods(what: str, job: Dict[str, Any], hosts: Any, out: Path) -> List[List[Any]]:
    """Node 0's and node 1's command and environment, as the platform or controller gives them
    (a task's command line run by bash; a pod's command as a list). Only what a node's file
    system changes is changed: the config path, the results folder and which python."""
    nodes: List[List[Any]] = []
    for rank in range(2):
        root = out / f"pod{rank}"
        if what in TASK_ENV:
            line = job["run"] if what == "skypilot" else job["commands"][0]
            line = line.replace("/tmp/torchscale", str(root / "cfg"))
            line = line.replace(str(out / "OUTPUT"), str(root / "results"))
            assert line.startswith("python ")
            command = ["bash", "-c", f"{shlex.quote(sys.executable)}{line[len('python') :]}"]
            env = {**(job["envs"] if what == "skypilot" else job["env"]), **TASK_ENV[what](rank)}
            env.update(  # node 0 first, as each platform gives it
                {"SKYPILOT_NODE_IPS": f"{hosts.head.address}\n{hosts.compute.address}\n"}
                if what == "skypilot"
                else {"DSTACK_MASTER_NODE_IP": hosts.head.address}
            )
        else:
            pod = CONTROLLERS[what](job)[rank]
            command = [
                sys.executable
                if word == "python"
                else word.replace("/tmp/torchscale", str(root / "cfg")).replace(
                    "/results", str(root / "results")
                )
                for word in pod.command
            ]
            env = dict(pod.env)
        nodes.append([command, env])
    return nodes


def _other_runs(tmp: Path, hosts: Any) -> Dict[str, Dict[str, Any]]:
    """Both nodes of the JobSet, the PyTorchJob, the SkyPilot task and the dstack task, one after
    another, each a whole lock-step run of one 2 x 1 cell: node 0 on head, node 1 on compute,
    each with the environment its platform or controller gives it, node 0's address head's."""
    runs: Dict[str, Dict[str, Any]] = {}
    config = tmp / "other-config.yaml"
    config.write_text(OTHER_CONFIG)
    for what in OTHER_PORTS:
        out = tmp / f"other-{what}"
        argv = ["benchmark", "-c", str(config), "-o", str(out / "OUTPUT"), "--image", "img:1"]
        argv += ["--emit", str(out / "job.yaml"), "--join-timeout", "120"]
        argv += (
            ["--launcher", what] if what in TASK_ENV else ["--launcher", "k8s", "--k8s-api", what]
        )
        emitted = CliRunner().invoke(app, argv, env={"TORCHSCALE_CPU_SLOTS": "1"})
        assert emitted.exit_code == 0, emitted.output
        job = yaml.safe_load((out / "job.yaml").read_text())
        nodes = _other_pods(what, job, hosts, out)
        if what not in TASK_ENV:
            hosts.alias(hosts.head, nodes[0][1]["MASTER_ADDR"])  # node 0's Service / DNS name
        procs = [
            hosts.start(host, command, out / f"pod{rank}.log", {**torchscale_env(1), **env})
            for rank, ((command, env), host) in enumerate(zip(nodes, (hosts.head, hosts.compute)))
        ]
        store = out / "pod0" / "results" / "k8s-pods"
        deadline = time.monotonic() + 300
        while procs[0].poll() is None and time.monotonic() < deadline:
            if READY_LINE in (out / "pod0.log").read_text():
                (store / COPIED_MARK).touch()  # what --submit's kubectl exec does (pods only)
            time.sleep(0.2)
        codes = [proc.wait(timeout=60) for proc in procs]
        runs[what] = {
            "codes": codes,
            "logs": [(out / f"pod{rank}.log").read_text() for rank in range(2)],
            "pod0": store,
            "node1": out / "pod1" / "results" / "k8s-pods",
            "master": nodes[0][1].get("MASTER_ADDR", hosts.head.address),
        }
    return runs


@pytest.fixture(scope="module")
def pods_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict]:
    tmp = tmp_path_factory.mktemp("k8s_pods")
    config = tmp / "config.yaml"
    config.write_text(CONFIG)
    manifest_path = tmp / "trainjob.yaml"
    argv = ["benchmark", "-c", str(config), "-o", str(tmp / "out"), "--image", "img:1"]
    argv += ["--launcher", "k8s", "--emit", str(manifest_path)]
    emitted = CliRunner().invoke(app, argv, env={"TORCHSCALE_CPU_SLOTS": "1"})
    assert emitted.exit_code == 0, emitted.output
    manifest = yaml.safe_load(manifest_path.read_text())
    pods = trainjob_pods(manifest)
    with two_hosts(tmp, "TrainJob pods on two hosts") as hosts:
        master = pods[0].env["PET_MASTER_ADDR"]
        hosts.alias(hosts.head, master)
        procs = []
        for index, (pod, host) in enumerate(zip(pods, (hosts.head, hosts.compute))):
            root = tmp / f"pod{index}"
            command = [
                sys.executable if word == "python" else word.replace("/tmp/torchscale", str(root))
                for word in pod.command
            ]
            command = [w.replace("/results", str(root / "results")) for w in command]
            env = {**torchscale_env(cpu_slots=1), **pod.env}
            if index:
                time.sleep(LATE_S)  # node 1's pod is scheduled late
            procs.append(hosts.start(host, command, tmp / f"pod{index}.log", env))
        head, compute = procs
        store = ExperimentStore(tmp / "pod0" / "results" / "k8s-pods")
        node1 = tmp / "pod1" / "results" / "k8s-pods"

        def in_second_cell() -> bool:
            return _joined(node1, KILLED_CELL) or compute.poll() is not None

        _wait_for(in_second_cell, 300, "node 1 in the second cell")
        assert compute.poll() is None, "node 1's pod ended before the second cell"
        before_kill = store.results_path.read_bytes()
        namespaces = [hosts.head.netns, hosts.compute.netns]
        running = _left_running(namespaces, wait_s=0)
        kill_tree(compute.pid)  # node 1's pod dies: every process in it at once (and reaped)
        log = tmp / "pod0.log"
        _wait_for(lambda: "torchscale-pod: results ready in " in log.read_text(), 300, "node 0")
        time.sleep(1.0)
        held = head.poll() is None  # node 0's pod waits for the copy
        (store.root / ".torchscale-copied").touch()  # what --submit's kubectl exec does
        head_code = head.wait(timeout=30)
        left = _left_running(namespaces)
        started = time.monotonic()
        other_runs = _other_runs(tmp, hosts)
        other_s = time.monotonic() - started
        print(f"\nthe other APIs' and tasks' two-pod runs: {other_s:.1f} s", file=sys.stderr)
        yield {
            "manifest": manifest,
            "master": master,
            "store": store,
            "node1": node1,
            "node1_address": hosts.compute.address,
            "before_kill": before_kill,
            "namespaces": namespaces,
            "running": running,
            "left": left,
            "head_code": head_code,
            "held": held,
            "logs": [log.read_text(), (tmp / "pod1.log").read_text()],
            "head_address": hosts.head.address,
            "other_runs": other_runs,
        }


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
