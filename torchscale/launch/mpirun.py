"""``--launcher mpirun``: every cell's ranks started by MPI (Open MPI or MPICH), one process per
rank running the worker module directly, instead of torchrun.

The worker reads its rank, world size and local rank from the MPI launcher's variables
(``runtime/mpi_env.py``) and meets the others through torch's ``env://`` rendezvous at
MASTER_ADDR:MASTER_PORT: ``--rdzv-endpoint`` when given, else the first host of the mpirun
arguments (``--host``/``-H``, ``--hostfile``), else this host with a free port. The process group
backend is the cell's ``backend:`` (``mpi`` only runs here). Cells needing more nodes than
``--nnodes`` are skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from torchscale.errors import TorchscaleError
from torchscale.launch.multinode import Launch, split_endpoint
from torchscale.plan.kind_protocol import get_kind
from torchscale.plan.planned_cell import Cell

EXPORTED = ("OMP_NUM_THREADS", "PYTHONPATH", "PYTHONUNBUFFERED", "TORCHSCALE_CPU_SLOTS")
"""Variables a rank on another host needs from ours (Open MPI ``-x``; MPICH passes them all)."""


def find_mpirun(name: str = "mpirun") -> Tuple[str, str]:
    """(path, flavour ``openmpi`` or ``mpich``) of the MPI launcher; a clear error without one."""
    path = shutil.which(name)
    if path is None:
        raise TorchscaleError(
            f"--launcher mpirun needs {name} on PATH: install Open MPI or MPICH "
            "(apt-get install openmpi-bin) or load your cluster's MPI module"
        )
    try:
        version = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise TorchscaleError(f"{path} --version failed ({exc}); check the MPI install") from None
    return path, "openmpi" if "Open MPI" in version or "OpenRTE" in version else "mpich"


def _option_value(args: Sequence[str], names: Sequence[str]) -> Optional[str]:
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(f"{name}="):
                return arg.split("=", 1)[1]
    return None


def first_host(mpirun_args: Sequence[str]) -> Optional[str]:
    """The first host the mpirun arguments name (``--host a,b``, ``-H a:4``, ``--hostfile f``)."""
    hosts = _option_value(mpirun_args, ("--host", "-host", "-H", "-hosts"))
    if hosts:
        return hosts.split(",")[0].split(":")[0].strip() or None
    hostfile = _option_value(
        mpirun_args, ("--hostfile", "-hostfile", "--machinefile", "-machinefile", "-f")
    )
    if hostfile:
        try:
            lines = Path(hostfile).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise TorchscaleError(f"cannot read the MPI hostfile {hostfile} ({exc})") from None
        for line in lines:
            line = line.split("#", 1)[0].strip()
            if line:
                return line.split()[0].split(":")[0]
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class MpirunLaunch(Launch):
    """Cells started by ``mpirun``; this torchscale records the results."""

    mpirun: str = "mpirun"
    flavour: str = "openmpi"
    mpirun_args: Tuple[str, ...] = ()
    master: Optional[str] = None  # rendezvous host (port from endpoint or a free one)
    master_port: Optional[int] = None

    launcher = "mpirun"

    @property
    def records_results(self) -> bool:
        return True

    def visits(self, cell: Cell) -> bool:
        return True

    def more_nodes_hint(self, nnodes: int) -> str:
        return f"give mpirun {nnodes} hosts (--mpirun-arg=--hostfile=FILE) and --nnodes {nnodes}"

    def _env_flags(self, values: Dict[str, str]) -> List[str]:
        flags: List[str] = []
        if self.flavour == "openmpi":
            for name, value in values.items():
                flags += ["-x", f"{name}={value}"]
            flags += [f for name in EXPORTED if name in os.environ for f in ("-x", name)]
        else:
            for name, value in values.items():
                flags += ["-genv", name, value]
        return flags

    def worker_command(self, cell: Cell, cell_dir: Path) -> Optional[List[str]]:
        """``mpirun -np N ... python -m <worker> --cell ... --out ...``."""
        from torchscale.results.layout import CELL_FILE, RESULT_FILE

        settings = cell.settings
        cmd = [self.mpirun, "-np", str(settings.gpus)]
        if self.flavour == "openmpi":
            if os.geteuid() == 0:
                cmd.append("--allow-run-as-root")
            # torchscale already checked the node has room; Open MPI counts physical cores.
            cmd += ["--bind-to", "none", "--oversubscribe"]
            if settings.nnodes > 1:
                cmd += ["--map-by", f"ppr:{settings.nproc_per_node}:node"]
        elif settings.nnodes > 1:
            cmd += ["-ppn", str(settings.nproc_per_node)]
        port = self.master_port or free_port()
        rendezvous = {"MASTER_ADDR": self.master or "127.0.0.1", "MASTER_PORT": str(port)}
        cmd += self._env_flags(rendezvous)
        cmd += list(self.mpirun_args)
        module = get_kind(cell.kind).worker_module
        return [
            *cmd, sys.executable, "-m", module,
            "--cell", str(cell_dir / CELL_FILE), "--out", str(cell_dir / RESULT_FILE),
        ]  # fmt: skip

    def describe(self) -> Dict[str, object]:
        return {
            **super().describe(),
            "mpirun": self.mpirun,
            "flavour": self.flavour,
            "mpirun_args": list(self.mpirun_args),
            "master": self.master,
        }


def resolve_mpirun_launch(
    *,
    nnodes: Optional[int],
    endpoint: Optional[str],
    mpirun_args: Sequence[str],
    join_timeout_s: float,
) -> MpirunLaunch:
    """The mpirun launch from the command line; fails before any launch without mpirun."""
    path, flavour = find_mpirun()
    nnodes = nnodes or 1
    if nnodes < 1:
        raise TorchscaleError(f"--nnodes {nnodes}: give the number of nodes, 1 or more")
    master, port = split_endpoint(endpoint) if endpoint else (first_host(mpirun_args), None)
    if master is None and nnodes > 1:
        raise TorchscaleError(
            f"--launcher mpirun with --nnodes {nnodes} needs the rendezvous host: give "
            "--rdzv-endpoint HOST:PORT or the hosts to mpirun (--mpirun-arg=--hostfile=FILE)"
        )
    return MpirunLaunch(
        nnodes=nnodes,
        join_timeout_s=join_timeout_s,
        mpirun=path,
        flavour=flavour,
        mpirun_args=tuple(mpirun_args),
        master=master,
        master_port=port if endpoint else None,
    )
