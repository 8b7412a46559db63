"""Where ``validate --fleet`` finds its nodes: a Slurm allocation (one ``srun`` task per node)
or a lock-step launch (the same command on every node with ``--nnodes``, ``--node-rank`` and
node 0's ``--rdzv-endpoint``, or torchrun's ``PET_*`` variables, as ``benchmark`` reads them).

Started by the user's own ``srun --ntasks-per-node=1`` (``SLURM_STEP_ID`` set), node 0 is the
step's first node, reached by its Slurm node name.

Under Slurm, the command run in the batch script (or ``salloc``) starts itself on every node of
the allocation with ``srun --ntasks-per-node=1`` and passes node 0's address in
``TORCHSCALE_FLEET_ENDPOINT``: node 0 is the batch host (Slurm runs the batch script on the
allocation's first node), reached by its host name, since Slurm node names need not be host
names. Each task's node rank is its ``SLURM_NODEID``.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Union

from torchscale.errors import TorchscaleError
from torchscale.launch.multinode import DEFAULT_PORT, resolve_launch, split_endpoint
from torchscale.launch.slurm import SlurmAllocation, expand_hostlist
from torchscale.validate.fleet import FleetMember

FLEET_ENDPOINT_ENV = "TORCHSCALE_FLEET_ENDPOINT"


@dataclass(frozen=True)
class SlurmFleet:
    """Run from the batch script: start one validate per node with srun."""

    allocation: SlurmAllocation
    endpoint: str

    def command(self, validate_args: Sequence[str]) -> List[str]:
        nodes = len(self.allocation.hosts)
        return [
            "srun",
            f"--nodes={nodes}",
            f"--ntasks={nodes}",
            "--ntasks-per-node=1",
            "--job-name=torchscale-validate",
            sys.executable,
            "-m",
            "torchscale",
            "validate",
            *validate_args,
        ]


def _int(environ: Mapping[str, str], *names: str) -> Optional[int]:
    for name in names:
        value = environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def _srun_task(
    environ: Mapping[str, str], endpoint: Optional[str], join_timeout_s: float
) -> FleetMember:
    """A task of the user's own ``srun``: node 0 is the step's first node, by its Slurm name."""
    count = _int(environ, "SLURM_STEP_NUM_NODES", "SLURM_NNODES")
    tasks = _int(environ, "SLURM_STEP_NUM_TASKS")
    rank = _int(environ, "SLURM_NODEID")
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or ""
    if count is None or rank is None or not nodelist:
        raise TorchscaleError(
            "inside srun, --fleet reads SLURM_STEP_NUM_NODES, SLURM_NODEID and "
            "SLURM_STEP_NODELIST, which are not all set: run it from the batch script instead"
        )
    if tasks is not None and tasks != count:
        raise TorchscaleError(
            f"--fleet runs one task per node: this srun step has {tasks} tasks on {count} "
            "nodes; use srun --ntasks-per-node=1"
        )
    port = split_endpoint(endpoint)[1] if endpoint else DEFAULT_PORT
    return FleetMember(count, rank, f"{expand_hostlist(nodelist)[0]}:{port}", join_timeout_s)


def resolve_fleet(
    *,
    nnodes: Optional[int],
    node_rank: Optional[int],
    endpoint: Optional[str],
    join_timeout_s: float,
    environ: Mapping[str, str],
) -> Union[FleetMember, SlurmFleet]:
    """This process's role in the fleet (see the module docstring), or a one-line error."""
    inside = environ.get(FLEET_ENDPOINT_ENV)
    if inside:
        count = _int(environ, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
        rank = _int(environ, "SLURM_NODEID")
        if count is None or rank is None:
            raise TorchscaleError(
                f"{FLEET_ENDPOINT_ENV} is set but SLURM_NNODES / SLURM_NODEID are not: it is "
                "set by `validate --fleet` for its srun tasks only; unset it"
            )
        split_endpoint(inside)
        return FleetMember(count, rank, inside, join_timeout_s)
    if environ.get("SLURM_STEP_ID") and nnodes is None:
        return _srun_task(environ, endpoint, join_timeout_s)
    if nnodes is not None or environ.get("PET_NNODES"):
        launch = resolve_launch(
            nnodes=nnodes,
            node_rank=node_rank,
            endpoint=endpoint,
            run_id=None,
            join_timeout_s=join_timeout_s,
            experiment="validate",
            environ=environ,
        )
        if launch.nnodes < 2 or launch.endpoint is None:
            raise TorchscaleError(
                "--fleet compares nodes: give --nnodes 2 or more (with --node-rank and "
                "--rdzv-endpoint), or run it inside a Slurm allocation"
            )
        return FleetMember(launch.nnodes, launch.node_rank, launch.endpoint, join_timeout_s)
    if environ.get("SLURM_JOB_ID") and environ.get("SLURM_JOB_NODELIST"):
        allocation = SlurmAllocation.from_env(environ)
        if len(allocation.hosts) < 2:
            raise TorchscaleError(
                "--fleet compares nodes: this Slurm allocation has one node; allocate 2 or "
                "more (--nodes)"
            )
        port = split_endpoint(endpoint)[1] if endpoint else DEFAULT_PORT
        return SlurmFleet(allocation, f"{socket.gethostname()}:{port}")
    raise TorchscaleError(
        "--fleet needs its nodes: run it inside a Slurm allocation (sbatch or salloc), or on "
        "every node with --nnodes N --node-rank R --rdzv-endpoint NODE0:PORT"
    )


def run_srun(fleet: SlurmFleet, validate_args: Sequence[str]) -> int:
    """Run the fleet under srun, its output passed through; srun's exit code (the worst
    task's). Ctrl-C reaches srun, which cancels the tasks on every node."""
    import os
    import subprocess

    env = {**os.environ, FLEET_ENDPOINT_ENV: fleet.endpoint}
    try:
        return subprocess.run(fleet.command(validate_args), env=env, check=False).returncode
    except FileNotFoundError:
        raise TorchscaleError(
            "srun is not on PATH: run --fleet inside the Slurm allocation's batch script"
        ) from None
