"""SkyPilot and dstack task files that run a matrix in lock step.

Both start the same command on every node with the node count, the node's rank and node 0's
address in variables of their own; :mod:`torchscale.launch.pod_entry` maps them to lock-step
mode's (``--env-from skypilot`` / ``dstack``), so the task's command is the same on every node.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Sequence

from torchscale.escaping import k8s_name, shell_line

SHM_SIZE = "16GB"  # dstack's default /dev/shm is small: DataLoader workers and NCCL need RAM


def skypilot_task(
    experiment: str,
    argv: Sequence[str],
    nodes: int,
    gpus_per_node: int,
    accelerator: str,
    image: str,
    env: Mapping[str, str],
) -> Dict[str, Any]:
    """A SkyPilot task (``sky launch task.yaml``)."""
    resources: Dict[str, Any] = {"accelerators": f"{accelerator}:{gpus_per_node}"}
    if image:
        resources["image_id"] = f"docker:{image}"
    return {
        "name": k8s_name(f"ts-{experiment}", 40),
        "num_nodes": nodes,
        "resources": resources,
        "envs": dict(env),
        "run": shell_line(argv, "a word of the task's command") + "\n",
    }


def dstack_task(
    experiment: str,
    argv: Sequence[str],
    nodes: int,
    gpus_per_node: int,
    accelerator: str,
    image: str,
    env: Mapping[str, str],
) -> Dict[str, Any]:
    """A dstack task (``dstack apply -f task.dstack.yml``)."""
    task: Dict[str, Any] = {
        "type": "task",
        "name": k8s_name(f"ts-{experiment}", 40),
        "nodes": nodes,
    }
    if image:
        task["image"] = image
    task["env"] = dict(env)
    task["commands"] = [shell_line(argv, "a word of the task's command")]
    task["resources"] = {"gpu": f"{accelerator}:{gpus_per_node}", "shm_size": SHM_SIZE}
    return task
