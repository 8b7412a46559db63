"""The runs of tests/test_k8s_pods.py (see its docstring): a TrainJob's two pods on two hosts,
node 1's late and then killed in the second cell, and both nodes of a JobSet, a PyTorchJob, a
SkyPilot and a dstack task, each a whole run of one 2 x 1 cell on two hosts of its own. Each is a
job of :mod:`tests.support.session_runs`: the jobs are emitted here, in the test's thread, and
run in its lanes."""

from __future__ import annotations

import functools
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import yaml
from typer.testing import CliRunner

from tests.support.k8s_controllers import CONTROLLERS, trainjob_pods
from tests.support.two_hosts import check_stop, kill_tree, torchscale_env, two_hosts
from torchscale.cli.app import app
from torchscale.launch.pod_entry import COPIED_MARK, READY_LINE
from torchscale.results.store import ExperimentStore

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


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check_stop()
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


def _emit(config: Path, out: Path, launcher: List[str]) -> Dict[str, Any]:
    """The job ``--emit`` writes for ``launcher`` (in the test's thread: CliRunner swaps the
    process's standard streams, so every job is emitted before the pods start)."""
    out.mkdir(parents=True, exist_ok=True)
    argv = ["benchmark", "-c", str(config), "-o", str(out / "OUTPUT"), "--image", "img:1"]
    argv += ["--emit", str(out / "job.yaml"), *launcher]
    emitted = CliRunner().invoke(app, argv, env={"TORCHSCALE_CPU_SLOTS": "1"})
    assert emitted.exit_code == 0, emitted.output
    job: Dict[str, Any] = yaml.safe_load((out / "job.yaml").read_text())
    return job


def _other_run(what: str, job: Dict[str, Any], out: Path) -> Dict[str, Any]:
    """Both nodes of one JobSet, PyTorchJob, SkyPilot or dstack task, a whole lock-step run of one
    2 x 1 cell on two hosts of its own: node 0 on head, node 1 on compute, each with the
    environment its platform or controller gives it, node 0's address head's."""
    with two_hosts(out, f"the {what} nodes on two hosts") as hosts:
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
        return {
            "codes": codes,
            "logs": [(out / f"pod{rank}.log").read_text() for rank in range(2)],
            "pod0": store,
            "node1": out / "pod1" / "results" / "k8s-pods",
            "master": nodes[0][1].get("MASTER_ADDR", hosts.head.address),
        }


def _trainjob_run(tmp: Path, manifest: Dict[str, Any]) -> Dict[str, Any]:
    """The TrainJob's two pods: node 1's late, then killed in the second cell (module doc)."""
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
        return {
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
        }


def jobs(tmp: Path) -> List[Tuple[str, Callable[[], Dict[str, Any]]]]:
    """The five runs, their jobs emitted (``--emit``) before any starts."""
    config = tmp / "config.yaml"
    config.write_text(CONFIG)
    manifest = _emit(config, tmp, ["--launcher", "k8s"])
    other_config = tmp / "other-config.yaml"
    other_config.write_text(OTHER_CONFIG)
    runs: List[Tuple[str, Callable[[], Dict[str, Any]]]] = [
        ("trainjob", functools.partial(_trainjob_run, tmp, manifest))
    ]
    for what in OTHER_PORTS:
        out = tmp / f"other-{what}"
        launcher = ["--launcher", what] if what in TASK_ENV else ["--launcher", "k8s"]
        launcher += [] if what in TASK_ENV else ["--k8s-api", what]
        job = _emit(other_config, out, [*launcher, "--join-timeout", "120"])
        runs.append((what, functools.partial(_other_run, what, job, out)))
    return runs


def combine(results: Dict[str, Any]) -> Dict[str, Any]:
    """What the tests read: the TrainJob's run, the others' under ``other_runs``."""
    return {**results["trainjob"], "other_runs": {w: results[w] for w in OTHER_PORTS}}
