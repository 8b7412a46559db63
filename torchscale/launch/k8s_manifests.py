"""Kubernetes manifests that run a matrix in lock step (docs/kubernetes.md).

One writer per training API, each owning its own fields: Kubeflow Trainer's ``TrainJob``
(v2.3, the default), ``JobSet`` (v0.12) and the training operator's ``PyTorchJob`` (v1.9). Every
pod runs the same command (:mod:`torchscale.launch.pod_entry`) and reads the node count, its node
rank and node 0's address from the variables its controller injects; what each controller
injects is in docs/kubernetes.md and checked by tests/test_k8s.py against the controllers'
sources.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from torchscale.errors import TorchscaleError
from torchscale.escaping import k8s_label_value, k8s_name

Manifest = Dict[str, Any]

CONTAINER = "node"  # TrainJob's torch-distributed runtime names its container "node"
PYTORCHJOB_CONTAINER = "pytorch"  # the training operator finds its container by this name
RESULTS_MOUNT = "/results"
SHM_VOLUME = "dshm"
RESULTS_VOLUME = "results"
CONFIG_ENV = "TORCHSCALE_CONFIG"
EXPERIMENT_LABEL = "torchscale.dev/experiment"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PATCH_MANAGER = "torchscale.dev/launcher"
JOBSET_PORT = 29400  # torchscale's default rendezvous port, where no controller picks one
PYTORCHJOB_PORT = 23456  # training operator v1.9's PyTorchJobDefaultPort
PASSED_ENV_PREFIXES = ("NCCL_", "GLOO_", "UCC_")
NAME_LENGTH = 40
"""Resource names are cut to this: JobSet's pods are ``<name>-node-<job>-<pod>`` and must stay a
63-character DNS label (its webhook checks the longest)."""

# The pod-spec fields TrainJob's runtimePatches accept (trainer v2.3.0 CRD); anything else in
# an overlay is refused rather than silently pruned by the API server.
TRAINJOB_POD_FIELDS = frozenset(
    {
        "affinity", "containers", "imagePullSecrets", "initContainers", "nodeSelector",
        "schedulingGates", "securityContext", "serviceAccountName",
        "terminationGracePeriodSeconds", "tolerations", "volumes",
    }
)  # fmt: skip
TRAINJOB_CONTAINER_FIELDS = frozenset({"env", "name", "securityContext", "volumeMounts"})


@dataclass(frozen=True)
class PodSettings:
    """What every pod of the job gets, whatever the API."""

    name: str  # the resource name (k8s_name of the experiment)
    experiment: str
    image: str
    argv: Sequence[str]  # the pod's command: pod_entry and its torchscale arguments
    nodes: int
    gpus_per_node: int
    config_text: str = ""
    namespace: Optional[str] = None
    queue: Optional[str] = None
    service_account: Optional[str] = None
    results_pvc: Optional[str] = None
    env: Mapping[str, str] = field(default_factory=dict)
    overlay: Optional[Mapping[str, Any]] = None
    cpu_slots: Optional[int] = None  # CPU processes stand in for GPUs (TORCHSCALE_CPU_SLOTS)


def resource_name(experiment: str) -> str:
    return k8s_name(f"ts-{experiment}", NAME_LENGTH)


def passed_env(environ: Mapping[str, str]) -> Dict[str, str]:
    """The communication libraries' variables of this shell, passed to every pod."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith(PASSED_ENV_PREFIXES)}


def _metadata(pod: PodSettings) -> Dict[str, Any]:
    labels = {
        "app.kubernetes.io/name": "torchscale",
        EXPERIMENT_LABEL: k8s_label_value(pod.experiment),
    }
    if pod.queue:
        labels[QUEUE_LABEL] = k8s_label_value(pod.queue)
    meta: Dict[str, Any] = {"name": pod.name, "labels": labels}
    if pod.namespace:
        meta["namespace"] = pod.namespace
    return meta


def _env(pod: PodSettings) -> List[Dict[str, str]]:
    env = {CONFIG_ENV: pod.config_text} if pod.config_text else {}
    env.update(pod.env)
    if pod.cpu_slots:
        env["TORCHSCALE_CPU_SLOTS"] = str(pod.cpu_slots)
    return [{"name": key, "value": value} for key, value in env.items()]


def resources(pod: PodSettings) -> Dict[str, Dict[str, Any]]:
    """GPUs requested = limited (the device plugin's rule); CPU slots where GPUs stand in."""
    if pod.cpu_slots:
        return {"requests": {"cpu": str(pod.cpu_slots)}}
    gpus = {"nvidia.com/gpu": pod.gpus_per_node}
    return {"requests": dict(gpus), "limits": dict(gpus)}


def _volumes(pod: PodSettings) -> List[Dict[str, Any]]:
    results: Dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": pod.results_pvc}}
        if pod.results_pvc
        else {"emptyDir": {}}
    )
    # /dev/shm is 64 MiB in a container: DataLoader workers and NCCL's shared memory need RAM.
    return [
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
        {"name": RESULTS_VOLUME, **results},
    ]


def _mounts() -> List[Dict[str, str]]:
    return [
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
        {"name": RESULTS_VOLUME, "mountPath": RESULTS_MOUNT},
    ]


def merge(base: Any, patch: Any) -> Any:
    """A strategic-merge-like patch: maps merge key by key; lists of maps with a ``name`` merge
    by name (containers, volumes, env), other lists are appended to; anything else replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list):
        named = all(isinstance(item, dict) and "name" in item for item in base + patch)
        if not named:
            return base + copy.deepcopy(patch)
        out_list = list(base)
        for item in patch:
            at = next((i for i, old in enumerate(out_list) if old["name"] == item["name"]), None)
            if at is None:
                out_list.append(copy.deepcopy(item))
            else:
                out_list[at] = merge(out_list[at], item)
        return out_list
    return copy.deepcopy(patch)


def _overlaid(spec: Dict[str, Any], pod: PodSettings, container: str) -> Dict[str, Any]:
    """The overlay's pod spec merged in; its ``containers[]`` entry without a name means the
    training container."""
    if not pod.overlay:
        return spec
    overlay = dict(pod.overlay.get("spec", pod.overlay))
    if "containers" in overlay:
        overlay["containers"] = [
            {"name": container, **item} if "name" not in item else item
            for item in overlay["containers"]
        ]
    merged: Dict[str, Any] = merge(spec, overlay)
    return merged


def pod_spec(pod: PodSettings, container: str) -> Dict[str, Any]:
    """The whole pod spec (JobSet, PyTorchJob): one container running the pod's command."""
    spec: Dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": container,
                "image": pod.image,
                "command": list(pod.argv),
                "env": _env(pod),
                "resources": resources(pod),
                "volumeMounts": _mounts(),
            }
        ],
        "volumes": _volumes(pod),
    }
    if pod.service_account:
        spec["serviceAccountName"] = pod.service_account
    return _overlaid(spec, pod, container)


def trainjob(pod: PodSettings) -> Manifest:
    """A TrainJob on the ``torch-distributed`` ClusterTrainingRuntime; the volumes and the overlay
    go in as a runtime patch (the only pod fields a TrainJob can set)."""
    patch: Dict[str, Any] = {
        "volumes": _volumes(pod),
        "containers": [{"name": CONTAINER, "volumeMounts": _mounts()}],
    }
    if pod.service_account:
        patch["serviceAccountName"] = pod.service_account
    patch = _overlaid(patch, pod, CONTAINER)
    refused = sorted(set(patch) - TRAINJOB_POD_FIELDS)
    refused += sorted(
        f"containers[].{key}"
        for item in patch.get("containers", [])
        for key in set(item) - TRAINJOB_CONTAINER_FIELDS
    )
    if refused:
        raise TorchscaleError(
            f"--k8s-overlay sets {', '.join(refused)}, which a TrainJob cannot patch into its "
            "pods (v2.3 runtimePatches take affinity, nodeSelector, tolerations, volumes, env, "
            "...): use --k8s-api jobset, or set it in your ClusterTrainingRuntime"
        )
    spec: Dict[str, Any] = {
        "runtimeRef": {
            "apiGroup": "trainer.kubeflow.org",
            "kind": "ClusterTrainingRuntime",
            "name": "torch-distributed",
        },
        "trainer": {
            "image": pod.image,
            "command": list(pod.argv),
            "numNodes": pod.nodes,
            "numProcPerNode": pod.gpus_per_node,
            "resourcesPerNode": resources(pod),
            "env": _env(pod),
        },
        "runtimePatches": [
            {
                "manager": PATCH_MANAGER,
                "trainingRuntimeSpec": {
                    "template": {
                        "spec": {
                            "replicatedJobs": [
                                {
                                    "name": CONTAINER,
                                    "template": {"spec": {"template": {"spec": patch}}},
                                }
                            ]
                        }
                    }
                },
            }
        ],
    }
    if pod.queue:
        spec["suspend"] = True  # Kueue admits it (un-suspends it) when the queue has room
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": _metadata(pod),
        "spec": spec,
    }


def jobset_master(name: str) -> str:
    """Node 0's host name: pod ``<jobset>-<replicated job>-0-0`` under the JobSet's subdomain."""
    return f"{name}-{CONTAINER}-0-0.{name}"


def jobset(pod: PodSettings) -> Manifest:
    """A JobSet of one indexed Job with a pod per node; JobSet injects no torchrun variables, so
    they are set here, the node rank from the Job's completion index."""
    spec = pod_spec(pod, CONTAINER)
    lockstep_env = [
        {"name": "PET_NNODES", "value": str(pod.nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(pod.gpus_per_node)},
        {
            "name": "PET_NODE_RANK",
            "valueFrom": {
                "fieldRef": {
                    "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                }
            },
        },
        {"name": "MASTER_ADDR", "value": jobset_master(pod.name)},
        {"name": "MASTER_PORT", "value": str(JOBSET_PORT)},
    ]
    spec["containers"][0]["env"] = lockstep_env + spec["containers"][0]["env"]
    job_spec: Dict[str, Any] = {
        "parallelism": pod.nodes,
        "completions": pod.nodes,
        # A failed pod is never restarted (lock step does not rerun a node), and it fails only
        # its own index: with one Job-wide backoffLimit the Job controller would terminate node
        # 0's pod too, and with it the cells node 0 still runs and the results it holds.
        "backoffLimitPerIndex": 0,
        "completionMode": "Indexed",
        "template": {"spec": spec},
    }
    if pod.nodes > 1:
        job_spec["maxFailedIndexes"] = pod.nodes - 1
    meta = _metadata(pod)
    jobset_spec: Dict[str, Any] = {
        "network": {"enableDNSHostnames": True},
        "replicatedJobs": [{"name": CONTAINER, "replicas": 1, "template": {"spec": job_spec}}],
        "successPolicy": {"operator": "All"},
        "failurePolicy": {"maxRestarts": 0},
    }
    if pod.queue:
        jobset_spec["suspend"] = True
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": meta,
        "spec": jobset_spec,
    }


def pytorchjob_master(name: str) -> str:
    return f"{name}-master-0"  # the Master replica's Service (training operator's replicaName)


def pytorchjob(pod: PodSettings) -> Manifest:
    """A PyTorchJob: one Master, nodes - 1 Workers; the operator sets MASTER_ADDR,
    PET_NNODES and PET_NODE_RANK itself."""

    def replica(count: int) -> Dict[str, Any]:
        return {
            "replicas": count,
            "restartPolicy": "Never",
            "template": {"spec": pod_spec(pod, PYTORCHJOB_CONTAINER)},
        }

    replicas = {"Master": replica(1)}
    if pod.nodes > 1:
        replicas["Worker"] = replica(pod.nodes - 1)
    spec: Dict[str, Any] = {
        "nprocPerNode": str(pod.gpus_per_node),
        "pytorchReplicaSpecs": replicas,
        "runPolicy": {"backoffLimit": 0},
    }
    if pod.queue:
        spec["runPolicy"]["suspend"] = True
    for item in replicas.values():
        item["template"]["spec"].pop("restartPolicy", None)  # the replica's restartPolicy rules
        container = item["template"]["spec"]["containers"][0]
        # The operator reads MASTER_PORT from this named port (its default, made explicit).
        container["ports"] = [{"name": "pytorchjob-port", "containerPort": PYTORCHJOB_PORT}]
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _metadata(pod),
        "spec": spec,
    }


@dataclass(frozen=True)
class Api:
    """A training API: its writer and how to find node 0's pod."""

    write: Callable[[PodSettings], Manifest]
    container: str
    node0_selector: Callable[[str], str]


APIS: Dict[str, Api] = {
    "trainjob": Api(
        trainjob,
        CONTAINER,
        lambda name: (
            f"jobset.sigs.k8s.io/jobset-name={name},batch.kubernetes.io/job-completion-index=0"
        ),
    ),
    "jobset": Api(
        jobset,
        CONTAINER,
        lambda name: (
            f"jobset.sigs.k8s.io/jobset-name={name},batch.kubernetes.io/job-completion-index=0"
        ),
    ),
    "pytorchjob": Api(
        pytorchjob,
        PYTORCHJOB_CONTAINER,
        lambda name: (
            f"training.kubeflow.org/job-name={name},training.kubeflow.org/replica-type=master"
        ),
    ),
}


def size(cells: Sequence[Tuple[int, int]]) -> Tuple[int, int]:
    """Nodes x GPUs per node of the largest cell, from (nnodes, nproc_per_node) pairs."""
    return max(n for n, _ in cells), max(g for _, g in cells)
