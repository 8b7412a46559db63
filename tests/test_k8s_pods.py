"""The controller's contract, run for real: a TrainJob's two pods on two hosts.

The manifest ``--launcher k8s`` writes (the default API, TrainJob) is turned into its pods as
Kubeflow Trainer v2.3's torch plugin makes them (tests/support/k8s_controllers.py quotes the
source), and each pod's command runs with that environment in its own network namespace (the
two-host set-up of test_multinode.py), node 0's address (``PET_MASTER_ADDR``, a JobSet pod name)
resolving to head. Only what a pod's volumes change is changed: ``/results`` (an emptyDir per pod)
and the config path are folders of their own per pod, and ``python`` is this interpreter.

Node 1's pod starts late: node 0 waits for it at the cell, as lock-step mode waits for a late
node. A pod that dies mid-cell is lock-step mode's dead node (the pods run lock-step torchscale
unchanged): test_multinode.py kills a node mid-cell and checks that the cell fails and the sweep
goes on; it is not repeated here to keep the suite's time. The JobSet and PyTorchJob pods give
the same lock-step inputs (test_k8s.py checks them in-process), and so do SkyPilot's and dstack's
variables through the same entry, so one real run covers the command all of them run.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Dict, Iterator

import pytest
import yaml
from typer.testing import CliRunner

from tests.support.k8s_controllers import trainjob_pods
from tests.support.two_hosts import torchscale_env, two_hosts
from torchscale.cli.app import app
from torchscale.results.store import ExperimentStore

pytestmark = pytest.mark.slow

CONFIG = """\
experiment_name: k8s-pods
models: [gpt2-tiny]
batch_sizes: [2]
gpu_counts: [2]
gpus_per_node: 1
warmup_steps: 2
measure_steps: 4
sync_probe_steps: 2
cell_timeout_s: 120
"""
LATE_S = 2.0


def _wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


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
        compute_code = compute.wait(timeout=300)
        log = tmp / "pod0.log"
        _wait_for(lambda: "torchscale-pod: results ready in " in log.read_text(), 120, "node 0")
        time.sleep(1.0)
        held = head.poll() is None  # node 0's pod waits for the copy
        (store.root / ".torchscale-copied").touch()  # what --submit's kubectl exec does
        head_code = head.wait(timeout=30)
        yield {
            "manifest": manifest,
            "master": master,
            "store": store,
            "node1": tmp / "pod1" / "results" / "k8s-pods",
            "codes": (head_code, compute_code),
            "held": held,
            "logs": [log.read_text(), (tmp / "pod1.log").read_text()],
        }


def test_the_pods_run_the_matrix_in_lock_step(pods_run: Dict) -> None:
    assert pods_run["codes"] == (0, 0), pods_run["logs"]
    records = {(r.world_size, r.nnodes): r for r in pods_run["store"].records()}
    assert sorted(records) == [(2, 2)]
    two = records[(2, 2)]
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
    two = next(r for r in pods_run["store"].records() if r.nnodes == 2)
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
