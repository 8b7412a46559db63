"""Each pod of a manifest as its controller makes it: host name and environment.

Derived from the controllers' sources (read at the tags below), not from torchscale's code:

- Kubeflow Trainer v2.3.0, ``pkg/runtime/framework/plugins/torch/torch.go`` (``petEnvs``,
  ``masterEnvVars``): ``PET_NNODES`` = ``spec.trainer.numNodes``, ``PET_NPROC_PER_NODE`` =
  ``numProcPerNode``, ``PET_NODE_RANK`` from the field path
  ``metadata.annotations['batch.kubernetes.io/job-completion-index']``
  (``pkg/constants/constants.go`` ``JobCompletionIndexFieldPath``), ``PET_MASTER_ADDR`` =
  ``<trainjob>-node-0-0.<trainjob>``, ``PET_MASTER_PORT`` = ``ContainerTrainerPort`` (29500);
  the pods are a JobSet's, named as below.
- JobSet v0.12.0, ``pkg/util/placement/placement.go`` ``GenPodName``:
  ``<jobset>-<replicated job>-<job index>-<pod index>``, subdomain the JobSet's name
  (``pkg/controllers/jobset_controller.go`` ``GetSubdomain``); JobSet sets no torchrun variable.
  The Job controller (Kubernetes, Indexed completion) adds ``JOB_COMPLETION_INDEX`` and the
  ``batch.kubernetes.io/job-completion-index`` annotation.
- Training operator v1.9.4 (kubeflow/trainer tag), ``pkg/controller.v1/pytorch/envvar.go``
  ``setPodEnv`` and ``master.go``: ``PYTHONUNBUFFERED=1``, ``MASTER_PORT``/``PET_MASTER_PORT``
  (the container port named ``pytorchjob-port``, default 23456), ``MASTER_ADDR``/
  ``PET_MASTER_ADDR`` = ``<job>-master-0``, ``WORLD_SIZE`` = replicas x nprocPerNode, ``RANK`` =
  ``PET_NODE_RANK`` = 0 for the Master, worker index + 1 for a Worker, ``PET_NPROC_PER_NODE``,
  ``PET_NNODES`` = total replicas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List

COMPLETION_INDEX_PATH = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


@dataclass(frozen=True)
class Pod:
    hostname: str  # the name node 0's address resolves to, for node 0
    command: List[str]
    env: Dict[str, str]


def _container_env(container: Dict[str, Any], index: int) -> Dict[str, str]:
    env: Dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            assert item["valueFrom"]["fieldRef"]["fieldPath"] == COMPLETION_INDEX_PATH
            env[item["name"]] = str(index)
    return env


def trainjob_pods(manifest: Dict[str, Any]) -> List[Pod]:
    name, trainer = manifest["metadata"]["name"], manifest["spec"]["trainer"]
    pods = []
    for index in range(trainer["numNodes"]):
        env = {item["name"]: item["value"] for item in trainer.get("env", [])}
        env.update(
            PET_NNODES=str(trainer["numNodes"]),
            PET_NPROC_PER_NODE=str(trainer.get("numProcPerNode", "auto")),
            PET_NODE_RANK=str(index),
            PET_MASTER_ADDR=f"{name}-node-0-0.{name}",
            PET_MASTER_PORT="29500",
            JOB_COMPLETION_INDEX=str(index),
        )
        pods.append(Pod(f"{name}-node-0-{index}.{name}", list(trainer["command"]), env))
    return pods


def jobset_pods(manifest: Dict[str, Any]) -> List[Pod]:
    name = manifest["metadata"]["name"]
    pods = []
    for rjob in manifest["spec"]["replicatedJobs"]:
        job = rjob["template"]["spec"]
        container = job["template"]["spec"]["containers"][0]
        for job_index in range(rjob.get("replicas", 1)):
            for index in range(job["completions"]):
                env = {"JOB_COMPLETION_INDEX": str(index), **_container_env(container, index)}
                host = f"{name}-{rjob['name']}-{job_index}-{index}.{name}"
                pods.append(Pod(host, list(container["command"]), env))
    return pods


def pytorchjob_pods(manifest: Dict[str, Any]) -> List[Pod]:
    name, spec = manifest["metadata"]["name"], manifest["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    total = sum(item["replicas"] for item in replicas.values())
    nproc = int(spec["nprocPerNode"]) if str(spec.get("nprocPerNode", "")).isdigit() else 1
    pods = []
    for rtype in ("Master", "Worker"):
        if rtype not in replicas:
            continue
        container = replicas[rtype]["template"]["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        port = str(ports.get("pytorchjob-port", 23456))
        for index in range(replicas[rtype]["replicas"]):
            rank = index + 1 if rtype == "Worker" else index
            env = _container_env(container, index)
            env.update(
                PYTHONUNBUFFERED="1",
                MASTER_PORT=port,
                PET_MASTER_PORT=port,
                MASTER_ADDR=f"{name}-master-0",
                PET_MASTER_ADDR=f"{name}-master-0",
                WORLD_SIZE=str(total * nproc),
                RANK=str(rank),
                PET_NODE_RANK=str(rank),
                PET_NPROC_PER_NODE=str(spec["nprocPerNode"]),
                PET_NNODES=str(total),
            )
            pods.append(Pod(f"{name}-{rtype.lower()}-{index}", list(container["command"]), env))
    return pods


CONTROLLERS = {"trainjob": trainjob_pods, "jobset": jobset_pods, "pytorchjob": pytorchjob_pods}
