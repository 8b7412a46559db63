"""``--launcher k8s|skypilot|dstack``: manifests against the vendored CRD schemas and the
Kubernetes core schema, each controller's environment read back as lock-step inputs, hostile
names, ``--submit`` against a fake kubectl. No torchrun here (the real run: test_k8s_pods.py)."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from functools import cache
from pathlib import Path
from typing import Any, Dict, List

import jsonschema
import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from tests.support.k8s_controllers import CONTROLLERS
from torchscale.cli.app import app
from torchscale.launch.multinode import resolve_launch
from torchscale.launch.pod_entry import lockstep_env

REPO = Path(__file__).resolve().parents[1]
CRDS = REPO / "tests" / "data" / "k8s" / "crds"
CRD_FILES = {
    "trainjob": "trainer.kubeflow.org_trainjobs.yaml",
    "jobset": "jobset.x-k8s.io_jobsets.yaml",
    "pytorchjob": "kubeflow.org_pytorchjobs.yaml",
}
K8S_VERSION = "1.33.0"
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
HOSTILE = 'run\n: "x" {y} $(touch /tmp/pwned) ünï 名前\u2028--- a: b'


def _strict(node: Any) -> Any:
    """The schema as the API server applies it with kubectl's strict field validation: an
    object with declared properties rejects others (unless it preserves unknown fields)."""
    if isinstance(node, dict):
        node = {k: _strict(v) for k, v in node.items()}
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        return node
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@cache
def crd_validator(api: str) -> jsonschema.Draft7Validator:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: the CRDs are 0.5-0.8 MB
    crd = yaml.load((CRDS / CRD_FILES[api]).read_text(), Loader=loader)
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    return jsonschema.Draft7Validator(schema)


def pod_templates(manifest: Dict[str, Any]) -> List[Dict[str, Any]]:
    spec = manifest["spec"]
    if manifest["kind"] == "JobSet":
        return [r["template"]["spec"]["template"] for r in spec["replicatedJobs"]]
    if manifest["kind"] == "PyTorchJob":
        return [r["template"] for r in spec["pytorchReplicaSpecs"].values()]
    return []


# Every CEL rule (x-kubernetes-validations) of the vendored CRDs, which JSON schema skips, and
# what becomes of it: "checked" (by check_manifest), "update" (compares with the old object: a
# create never fails it) or "unset" (on a field torchscale never writes; test_cel_rules_...
# checks it stays unset). A CRD update with a new rule fails that test until it is placed here.
CEL_RULES = {
    "trainjob": {
        "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')": "checked",
        "size(self.metadata.name) <= 63": "checked",
        "self == oldSelf": "update",
        "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')": "unset:initializer",
        "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']":
            "unset:managedBy",
        "has(self.lastUpdatedTime)": "unset:status",
    },
    "jobset": {
        "self == oldSelf": "update",
        "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && "
        "self.replicatedJobs.exists(x, has(x.dependsOn)))": "unset:startupPolicy",
        "self.templates.all(t, !has(t.metadata.namespace) || size(t.metadata.namespace) == 0)":
            "unset:volumeClaimPolicies",
    },
    "pytorchjob": {"self == oldSelf": "update"},
}  # fmt: skip
# torchrun's variables the Trainer's torch plugin sets itself, which its webhook refuses in
# spec.trainer.env (trainer v2.3.0 pkg/constants/constants.go TorchRunReservedEnvNames).
TRAINJOB_RESERVED_ENV = {
    "PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT",
}  # fmt: skip


def check_manifest(api: str, manifest: Dict[str, Any]) -> None:
    errors = sorted(crd_validator(api).iter_errors(manifest), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]
    # The CEL rules and webhooks that the JSON schema does not express, that matter here:
    name = manifest["metadata"]["name"]
    assert DNS1035.match(name) and len(name) <= 63, name  # TrainJob CEL, PyTorchJob webhook
    spec = manifest["spec"]
    for field in ("initializer", "managedBy", "startupPolicy", "volumeClaimPolicies"):
        assert field not in spec, field  # the "unset" CEL rules stay out of reach
    assert "status" not in manifest
    if api == "trainjob":  # the torch plugin's webhook: no reserved torchrun variable
        names = {item["name"] for item in spec["trainer"].get("env", [])}
        assert not names & TRAINJOB_RESERVED_ENV, names & TRAINJOB_RESERVED_ENV
    if api == "jobset":
        # jobset v0.12.0 pkg/webhooks/jobset_webhook.go: the longest Job name and the longest
        # pod name, GenPodName(...) + "-abcde" (the Job controller's suffix), are DNS-1035 labels
        for rjob in spec["replicatedJobs"]:
            job = rjob["template"]["spec"]
            longest_job = f"{name}-{rjob['name']}-{rjob['replicas'] - 1}"
            longest = f"{longest_job}-{job['completions'] - 1}-abcde"
            for label in (longest_job, longest, rjob.get("groupName", "default")):
                assert DNS1035.match(label) and len(label) <= 63, label
    if api == "pytorchjob":
        # training operator v1.9.4 pkg/webhooks/pytorch/pytorchjob_webhook.go: Master and
        # Worker only, one Master, Workers at least 1, a container named pytorch, every
        # container an image
        replicas = spec["pytorchReplicaSpecs"]
        assert set(replicas) <= {"Master", "Worker"} and replicas["Master"]["replicas"] == 1
        assert replicas.get("Worker", {"replicas": 1})["replicas"] >= 1
        for replica in replicas.values():
            containers = replica["template"]["spec"]["containers"]
            assert "pytorch" in [c["name"] for c in containers]
            assert all(c.get("image") for c in containers)
    for value in manifest["metadata"]["labels"].values():
        assert LABEL_VALUE.match(value) and len(value) <= 63, value
    for template in pod_templates(manifest):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, **template}
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_the_vendored_crds_are_the_files_their_readme_names() -> None:
    import hashlib

    readme = (CRDS / "README.md").read_text()
    for name in CRD_FILES.values():
        digest = hashlib.sha256((CRDS / name).read_bytes()).hexdigest()
        assert f"| `{name}` | {digest} |" in readme, name  # unchanged since copied from the tag


def test_cel_rules_json_schema_skips_are_each_checked_or_out_of_reach() -> None:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for api, known in CEL_RULES.items():
        crd = yaml.load((CRDS / CRD_FILES[api]).read_text(), Loader=loader)
        (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
        found, stack = set(), [version["schema"]["openAPIV3Schema"]]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                for rule in node.get("x-kubernetes-validations", []):
                    found.add(" ".join(rule["rule"].split()))
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
        assert found == set(known), (api, found ^ set(known))
    # docs/kubernetes.md names every one of them
    docs = (REPO / "docs" / "kubernetes.md").read_text()
    for field in (
        "initializer",
        "managedBy",
        "startupPolicy",
        "volumeClaimPolicies",
        "schedulingPolicy.queue",
    ):
        assert f"`{field}`" in docs, field


def write_config(tmp_path: Path, name: str, gpus: List[int], per_node: int) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "experiment_name": name,
                "models": ["gpt2-tiny"],
                "batch_sizes": [2],
                "gpu_counts": gpus,
                "gpus_per_node": per_node,
            }
        )
    )
    return path


def emit(tmp_path: Path, config: Path, *args: str, env: Dict[str, str] | None = None) -> Any:
    out = tmp_path / "emitted.yaml"
    argv = ["benchmark", "-c", str(config), "-o", str(tmp_path / "out"), "--image", "img:1"]
    result = CliRunner().invoke(app, [*argv, "--emit", str(out), *args], env=env or {})
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(out.read_text()))
    assert len(docs) == 1
    return docs[0], out.read_text(), result


@pytest.mark.parametrize("api", sorted(CRD_FILES))
def test_manifests_for_1_2_4_nodes_by_1_and_8_gpus_fit_the_crd_and_core_schemas(
    tmp_path: Path, api: str
) -> None:
    for nodes in (1, 2, 4):
        for per_node in (1, 8):
            config = write_config(tmp_path, "scale", [per_node * nodes], per_node)
            manifest, _, _ = emit(tmp_path, config, "--launcher", "k8s", "--k8s-api", api)
            check_manifest(api, manifest)
            pods = CONTROLLERS[api](manifest)
            assert len(pods) == nodes
            for index, pod in enumerate(pods):
                launch = resolve_launch(
                    nnodes=None, node_rank=None, endpoint=None, run_id=None,
                    join_timeout_s=600, experiment="scale", environ=lockstep_env("k8s", pod.env),
                )  # fmt: skip
                # Every controller's variables give lock-step mode the same inputs.
                assert (launch.nnodes, launch.node_rank) == (nodes, index)
                if nodes > 1:
                    assert launch.endpoint is not None
                    host, port = launch.endpoint.rsplit(":", 1)
                    assert pods[0].hostname.startswith(host) and port.isdigit()
                assert pod.command == pods[0].command  # the same command on every pod
            spec = json.dumps(manifest)
            assert f'"nvidia.com/gpu": {per_node}' in spec
            if api == "jobset":
                # a dead pod fails its own index only: node 0's pod goes on, as in lock step
                job = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]
                assert job["backoffLimitPerIndex"] == 0 and "backoffLimit" not in job
                assert job.get("maxFailedIndexes") == (nodes - 1 if nodes > 1 else None)


def test_trainjob_sizes_queues_and_patches_the_pods(tmp_path: Path) -> None:
    overlay = tmp_path / "patch.yaml"
    overlay.write_text(
        "tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]\n"
        "nodeSelector: {cloud.google.com/gke-accelerator: nvidia-h100-80gb}\n"
        "containers: [{env: [{name: EXTRA, value: '1'}]}]\n"
    )
    config = write_config(tmp_path, "q", [1, 8, 16], 8)
    manifest, _, result = emit(
        tmp_path, config, "--launcher", "k8s", "--k8s-queue", "team-a", "--namespace", "ml",
        "--k8s-service-account", "bench", "--k8s-overlay", str(overlay),
        env={"NCCL_IB_HCA": "mlx5", "GLOO_SOCKET_IFNAME": "eth0", "HOME": "/root"},
    )  # fmt: skip
    check_manifest("trainjob", manifest)
    assert "trainjob: 2 node(s) x 8 GPU(s)" in result.stderr
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert manifest["metadata"]["namespace"] == "ml" and manifest["spec"]["suspend"] is True
    trainer = manifest["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 8)
    assert trainer["resourcesPerNode"] == {
        "requests": {"nvidia.com/gpu": 8},
        "limits": {"nvidia.com/gpu": 8},
    }
    env = {item["name"]: item["value"] for item in trainer["env"]}
    assert env["NCCL_IB_HCA"] == "mlx5" and env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert "HOME" not in env and env["TORCHSCALE_CONFIG"] == config.read_text()
    patch = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    pod = patch["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["volumes"][0] == {"name": "dshm", "emptyDir": {"medium": "Memory"}}
    assert pod["serviceAccountName"] == "bench" and pod["tolerations"][0]["operator"] == "Exists"
    (container,) = pod["containers"]
    assert container["name"] == "node" and container["env"] == [{"name": "EXTRA", "value": "1"}]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    # Without a results volume node 0 holds the folder until --submit copies it out.
    assert "--hold-results" in trainer["command"]


@pytest.mark.parametrize("api", ["jobset", "pytorchjob"])
def test_every_pod_template_gets_the_queue_shm_and_communication_variables(
    tmp_path: Path, api: str
) -> None:
    overlay = tmp_path / "patch.yaml"
    overlay.write_text(
        "volumes: [{name: dshm, emptyDir: {medium: Memory, sizeLimit: 32Gi}}]\n"
        "tolerations: [{key: a, operator: Exists}]\n"
        "containers: [{env: [{name: NCCL_IB_HCA, value: mlx5_1}, {name: EXTRA, value: '1'}]}]\n"
    )
    config = write_config(tmp_path, "q", [16], 8)
    manifest, _, _ = emit(
        tmp_path, config, "--launcher", "k8s", "--k8s-api", api, "--k8s-queue", "team-a",
        "--k8s-overlay", str(overlay),
        env={"NCCL_IB_HCA": "mlx5", "GLOO_SOCKET_IFNAME": "eth0", "UCC_TLS": "ucp", "HOME": "/r"},
    )  # fmt: skip
    check_manifest(api, manifest)
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    suspended = manifest["spec"] if api == "jobset" else manifest["spec"]["runPolicy"]
    assert suspended["suspend"] is True  # Kueue admits it
    for template in pod_templates(manifest):
        spec = template["spec"]
        # The overlay merged by name: dshm keeps Memory and gains its size; the env entry of the
        # same name replaced, a new one added; tolerations appended.
        assert spec["volumes"][0] == {
            "name": "dshm",
            "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"},
        }
        assert spec["tolerations"] == [{"key": "a", "operator": "Exists"}]
        (container,) = spec["containers"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        env = {item["name"]: item.get("value") for item in container["env"]}
        assert [item["name"] for item in container["env"]].count("NCCL_IB_HCA") == 1
        assert env["NCCL_IB_HCA"] == "mlx5_1" and env["EXTRA"] == "1"
        assert env["GLOO_SOCKET_IFNAME"] == "eth0" and env["UCC_TLS"] == "ucp"
        assert "HOME" not in env
        assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}


def test_an_overlay_a_trainjob_cannot_carry_is_refused_in_one_line(tmp_path: Path) -> None:
    overlay = tmp_path / "patch.yaml"
    overlay.write_text("hostNetwork: true\n")
    config = write_config(tmp_path, "q", [16], 8)
    argv = ["benchmark", "-c", str(config), "-o", str(tmp_path / "out"), "--image", "i"]
    result = CliRunner().invoke(app, [*argv, "--launcher", "k8s", "--k8s-overlay", str(overlay)])
    assert result.exit_code == 2
    assert "--k8s-overlay sets hostNetwork, which a TrainJob cannot patch" in result.stderr
    assert "use --k8s-api jobset" in result.stderr and "Traceback" not in result.output
    manifest, _, _ = emit(
        tmp_path, config, "--launcher", "k8s", "--k8s-api", "jobset", "--k8s-overlay", str(overlay),
        "--k8s-results-pvc", "shared",
    )  # fmt: skip
    check_manifest("jobset", manifest)
    pod = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["volumes"][1] == {
        "name": "results",
        "persistentVolumeClaim": {"claimName": "shared"},
    }
    assert "--hold-results" not in pod["containers"][0]["command"]


def test_image_is_required_and_the_size_comes_from_the_config(tmp_path: Path) -> None:
    config = write_config(tmp_path, "q", [16], 8)
    argv = ["benchmark", "-c", str(config), "-o", str(tmp_path / "out"), "--launcher", "k8s"]
    shown = CliRunner().invoke(app, [*argv, "--image", "i", "--k8s-api", "jobset", "--dry-run"])
    assert shown.exit_code == 0 and "dry run: nothing was written" in shown.stderr
    assert (
        yaml.safe_load(shown.stdout)["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"]
        == 2
    )
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and "--launcher k8s needs --image" in result.stderr
    config.write_text(
        "experiment_name: q\nmodels: [gpt2-tiny]\nbatch_sizes: [2]\ngpu_counts: [2]\n"
    )
    result = CliRunner().invoke(app, [*argv, "--image", "i"])
    assert result.exit_code == 2 and "set gpus_per_node" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("api", sorted(CRD_FILES))
def test_hostile_names_give_one_valid_document_whose_command_runs_what_was_meant(
    tmp_path: Path, api: str
) -> None:
    config = write_config(tmp_path, HOSTILE, [4], 2)
    manifest, _, _ = emit(tmp_path, config, "--launcher", "k8s", "--k8s-api", api)
    check_manifest(api, manifest)
    assert "touch /tmp/pwned" not in manifest["metadata"]["name"]
    assert manifest["metadata"]["labels"]["torchscale.dev/experiment"].startswith("run-x-y-touch")
    # The name reaches the pods only as the config's text, an environment value (data).
    (pod,) = CONTROLLERS[api](manifest)[:1]
    assert yaml.safe_load(pod.env["TORCHSCALE_CONFIG"])["experiment_name"] == HOSTILE
    assert all(HOSTILE not in word for word in pod.command)
    # Two names that fold to the same letters stay two names.
    other = write_config(tmp_path, HOSTILE.replace("名前", "名"), [4], 2)
    manifest2, _, _ = emit(tmp_path, other, "--launcher", "k8s", "--k8s-api", api)
    assert manifest2["metadata"]["name"] != manifest["metadata"]["name"]


def test_escaping_k8s_sinks() -> None:
    from torchscale.escaping import k8s_label_value, k8s_name, yaml_document

    assert k8s_name("bench-1") == "bench-1"
    assert k8s_name("1-Bench") == "ts-1-bench-" + k8s_name("1-Bench")[-8:]
    for value in (HOSTILE, "x" * 300, "---", "é"):
        name, label = k8s_name(value, 40), k8s_label_value(value)
        assert DNS1035.match(name) and len(name) <= 40, name
        assert LABEL_VALUE.match(label) and len(label) <= 63, label
        doc = {"a": value, "b": [value]}
        assert list(yaml.safe_load_all(yaml_document(doc))) == [doc]


@pytest.mark.parametrize("launcher", ["skypilot", "dstack"])
def test_skypilot_and_dstack_tasks_map_their_variables_to_lock_step(
    tmp_path: Path, launcher: str
) -> None:
    config = write_config(tmp_path, HOSTILE, [16], 8)
    task, _, _ = emit(tmp_path, config, "--launcher", launcher, "--accelerator", "A100")
    if launcher == "skypilot":
        assert task["num_nodes"] == 2 and task["resources"]["accelerators"] == "A100:8"
        assert task["resources"]["image_id"] == "docker:img:1"
        command, env = task["run"], task["envs"]
        platform = {
            "SKYPILOT_NUM_NODES": "2",
            "SKYPILOT_NODE_RANK": "1",
            "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n",
        }
    else:
        assert task["type"] == "task" and task["nodes"] == 2 and task["image"] == "img:1"
        assert task["resources"] == {"gpu": "A100:8", "shm_size": "16GB"}
        (command,), env = task["commands"], task["env"]
        platform = {
            "DSTACK_NODES_NUM": "2",
            "DSTACK_NODE_RANK": "1",
            "DSTACK_MASTER_NODE_IP": "10.0.0.5",
        }
    assert re.match(r"^[a-z][a-z0-9-]{1,40}$", task["name"])  # dstack's and SkyPilot's name rule
    assert yaml.safe_load(env["TORCHSCALE_CONFIG"])["experiment_name"] == HOSTILE
    assert f"--env-from {launcher} " in command and "\n" not in command.strip()
    launch = resolve_launch(
        nnodes=None, node_rank=None, endpoint=None, run_id=None, join_timeout_s=600,
        experiment="x", environ=lockstep_env(launcher, platform),
    )  # fmt: skip
    assert (launch.nnodes, launch.node_rank, launch.endpoint) == (2, 1, "10.0.0.5:29400")


# kubectl's documented flags for each subcommand torchscale runs, global ones (--namespace,
# --request-timeout) included: kubernetes.io/docs/reference/kubectl/generated/kubectl_<command>.
KUBECTL_FLAGS = {
    "version": {"--output", "--request-timeout"},
    "apply": {"--dry-run", "--filename", "--namespace"},
    "wait": {"--for", "--selector", "--timeout", "--namespace"},
    "get": {"--selector", "--output", "--namespace"},
    "logs": {"--follow", "--container", "--namespace"},
    "cp": {"--container", "--namespace"},
    "exec": {"--container", "--namespace"},
}


def fake_kubectl(tmp_path: Path) -> Dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "kubectl"
    source = REPO / "tests" / "support" / "fake_kubectl.py"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} {source} "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_KUBECTL_LOG": str(tmp_path / "kubectl.jsonl"),
    }


def kubectl_calls(tmp_path: Path) -> List[List[str]]:
    calls = [json.loads(line) for line in (tmp_path / "kubectl.jsonl").read_text().splitlines()]
    for call in calls:
        flags = {arg.split("=")[0] for arg in call[1:] if arg.startswith("--") and arg != "--"}
        assert flags <= KUBECTL_FLAGS[call[0]], call
    return calls


def test_submit_without_a_cluster_says_so_in_one_line_and_keeps_the_manifest(
    tmp_path: Path,
) -> None:
    env = {**fake_kubectl(tmp_path), "FAKE_KUBECTL_CLUSTER": "0"}
    config = write_config(tmp_path, "q", [16], 8)
    argv = ["benchmark", "-c", str(config), "-o", str(tmp_path / "out"), "--image", "i"]
    result = CliRunner().invoke(app, [*argv, "--launcher", "k8s", "--submit"], env=env)
    assert result.exit_code == 2
    written = tmp_path / "out" / "q" / "trainjob.yaml"
    assert result.stderr.count("Error:") == 1 and "Traceback" not in result.output
    error = " ".join(result.stderr[result.stderr.index("Error:") :].split())  # unwrapped
    assert error == (
        "Error: no Kubernetes cluster reachable with this kubeconfig (The connection to the "
        "server localhost:8080 was refused - did you specify the right host or port?); the "
        f"manifest is written: {written}"
    )
    check_manifest("trainjob", yaml.safe_load(written.read_text()))
    assert kubectl_calls(tmp_path) == [["version", "--output=json", "--request-timeout=10s"]]


def test_submit_applies_follows_node_zero_and_copies_the_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("torchscale.launch.kubectl.POLL_S", 0.01)
    pod_root = tmp_path / "pod-results"
    (pod_root / "q").mkdir(parents=True)
    (pod_root / "q" / "results.jsonl").write_text('{"cell_id": "c1"}\n')
    env = {**fake_kubectl(tmp_path), "FAKE_KUBECTL_POD_ROOT": str(pod_root)}
    config = write_config(tmp_path, "q", [16], 8)
    argv = ["benchmark", "-c", str(config), "-o", str(tmp_path / "out"), "--image", "i"]
    argv += ["--launcher", "k8s", "--submit", "--namespace", "ml"]
    result = CliRunner().invoke(app, argv, env=env)
    assert result.exit_code == 0, result.output
    assert "> Running gpt2-tiny on 16 GPUs x 2 nodes" in result.stderr
    copied = tmp_path / "out" / "q" / "results.jsonl"
    assert copied.read_text() == '{"cell_id": "c1"}\n'
    manifest = str(tmp_path / "out" / "q" / "trainjob.yaml")
    selector = "jobset.sigs.k8s.io/jobset-name=ts-q,batch.kubernetes.io/job-completion-index=0"
    pod = "ts-x-node-0-0-abcde"  # the second time it is asked, the controller has made it
    assert kubectl_calls(tmp_path) == [
        ["version", "--output=json", "--request-timeout=10s"],
        ["apply", "--dry-run=server", f"--filename={manifest}", "--namespace=ml"],
        ["apply", f"--filename={manifest}", "--namespace=ml"],
        ["get", "pod", f"--selector={selector}", "--output=jsonpath={.items[*].metadata.name}", "--namespace=ml"],
        ["get", "pod", f"--selector={selector}", "--output=jsonpath={.items[*].metadata.name}", "--namespace=ml"],
        ["wait", "--for=condition=Ready", f"pod/{pod}", "--timeout=86400s", "--namespace=ml"],
        ["logs", "--follow", pod, "--container=node", "--namespace=ml"],
        ["cp", f"ml/{pod}:/results/q", str(tmp_path / "out" / "q"), "--container=node"],
        ["exec", pod, "--container=node", "--namespace=ml", "--", "touch", "/results/q/.torchscale-copied"],
    ]  # fmt: skip


@pytest.mark.parametrize("launcher", ["k8s", "skypilot", "dstack"])
def test_a_hostile_script_name_reaches_the_pods_as_one_word(tmp_path: Path, launcher: str) -> None:
    import shlex

    script = tmp_path / 'tr"ain $(touch pwned):{x}\nü.py'
    script.write_text("import torch\n")
    out = tmp_path / "job.yaml"
    argv = ["benchmark", "--script", str(script), "--gpus", "16", "--set", "gpus_per_node=8"]
    argv += [
        "-o",
        str(tmp_path / "out"),
        "--launcher",
        launcher,
        "--image",
        "i",
        "--emit",
        str(out),
    ]
    result = CliRunner().invoke(app, [*argv, "--", "--lr", "$(x) y"])
    if launcher != "k8s":  # a shell line cannot hold a line break: refused, nothing written
        assert result.exit_code == 2 and "contains a line break" in result.stderr
        assert not out.exists()
        script = script.rename(tmp_path / 'tr"ain $(touch pwned):{x} ü.py')
        argv[2] = str(script)
        result = CliRunner().invoke(app, [*argv, "--", "--lr", "$(x) y"])
    assert result.exit_code == 0, result.output
    (doc,) = yaml.safe_load_all(out.read_text())
    if launcher == "k8s":
        check_manifest("trainjob", doc)
        command = doc["spec"]["trainer"]["command"]
        assert doc["spec"]["trainer"]["numNodes"] == 2
    else:  # what bash runs: the same words
        command = shlex.split(doc["run"] if launcher == "skypilot" else doc["commands"][0])
    tail = ["--script", str(script), "--gpus=16", "--", "--lr", "$(x) y"]
    assert command[-len(tail) :] == tail
    assert "--config" not in command and "TORCHSCALE_CONFIG" not in out.read_text()


@pytest.mark.parametrize("api", sorted(CRD_FILES))
def test_validate_fleet_as_a_job_gives_every_pod_its_place_in_the_fleet(
    tmp_path: Path, api: str
) -> None:
    from torchscale.validate.fleet import FleetMember
    from torchscale.validate.fleet_launch import resolve_fleet

    out = tmp_path / "job.yaml"
    argv = ["validate", "--fleet", "--level", "2", "-o", str(tmp_path / "v"), "--image", "i"]
    argv += ["--launcher", "k8s", "--k8s-api", api, "--emit", str(out)]
    refused = CliRunner().invoke(app, [*argv, "--nnodes", "4"])
    assert (
        refused.exit_code == 2 and "--nnodes N (2 or more) and --gpus-per-node G" in refused.stderr
    )
    result = CliRunner().invoke(app, [*argv, "--nnodes", "4", "--gpus-per-node", "8"])
    assert result.exit_code == 0, result.output
    manifest = yaml.safe_load(out.read_text())
    check_manifest(api, manifest)
    pods = CONTROLLERS[api](manifest)
    assert len(pods) == 4
    for index, pod in enumerate(pods):
        command = pod.command[pod.command.index("--") + 1 :]
        assert command[:6] == ["validate", "--output-dir", "/results", "--level", "2", "--timeout"]
        assert "--fleet" in command
        member = resolve_fleet(
            nnodes=None, node_rank=None, endpoint=None, join_timeout_s=600,
            environ=lockstep_env("k8s", pod.env),
        )  # fmt: skip
        assert isinstance(member, FleetMember)
        assert (member.nnodes, member.node_rank) == (4, index)
        assert pods[0].hostname.startswith(member.endpoint.rsplit(":", 1)[0])


def test_profile_as_a_job_is_one_pod_of_its_gpus(tmp_path: Path) -> None:
    out = tmp_path / "job.yaml"
    argv = ["profile", "-o", str(tmp_path / "p"), "--image", "i", "--launcher", "k8s"]
    argv += ["--emit", str(out), "--model", "gpt2-tiny", "--batch-size", "2"]
    refused = CliRunner().invoke(app, argv)
    assert refused.exit_code == 2 and "profile as a job needs --gpus N" in refused.stderr
    result = CliRunner().invoke(app, [*argv, "--gpus", "8", "--duration", "10s"])
    assert result.exit_code == 0, result.output
    manifest = yaml.safe_load(out.read_text())
    check_manifest("trainjob", manifest)
    trainer = manifest["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (1, 8)
    command = trainer["command"][trainer["command"].index("--") + 1 :]
    assert command == [
        "profile", "--output-dir", "/results", "--gpus=8", "--duration", "10s", "--target",
        "sync_stalls", "--tool", "auto", "--model=gpt2-tiny", "--batch-size=2",
    ]  # fmt: skip


def test_submit_says_when_node_zero_ends_without_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("torchscale.launch.kubectl.POLL_S", 0.01)
    env = {**fake_kubectl(tmp_path), "FAKE_KUBECTL_POD_FAILS": "1"}
    config = write_config(tmp_path, "q", [16], 8)
    argv = ["benchmark", "-c", str(config), "-o", str(tmp_path / "out"), "--image", "i"]
    result = CliRunner().invoke(app, [*argv, "--launcher", "k8s", "--submit"], env=env)
    assert result.exit_code == 2
    assert "RuntimeError: CUDA error: no kernel image" in result.stderr  # node 0's log, followed
    error = " ".join(result.stderr[result.stderr.rindex("\nError:") :].split())
    assert error.startswith(
        "Error: node 0's pod ts-x-node-0-0-abcde ended before its results were ready"
    )
    assert [call[0] for call in kubectl_calls(tmp_path)][-1] == "logs"  # no cp of nothing
