"""Slurm: run the matrix inside an allocation with ``srun``, or submit it as one ``sbatch`` job.

Inside an allocation ONE torchscale (on the batch node, the head of ``SLURM_JOB_NODELIST``)
launches every cell as ``srun --nodes=K --nodelist=<first K nodes> --ntasks-per-node=1 ...
torchrun --nnodes=K ...``: one torchrun per node, meeting through c10d rendezvous under the id
``<job id>-<cell id>``. The rendezvous store is hosted by this torchscale, reached by its host
name, as in a lock-step launch: a store hosted by a cell's torchrun needs that torchrun to
recognise the endpoint as itself, which fails where Slurm's node names are not host names. Cells
run one after another, so this one process records the results; the ranks write into the
(shared) output folder.
"""

from __future__ import annotations

import math
import re
import socket
import subprocess
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from torchscale.errors import TorchscaleError
from torchscale.escaping import for_terminal, one_line, sbatch_word, shell_line, shell_word
from torchscale.launch.multinode import DEFAULT_PORT, Launch
from torchscale.launch.torchrun import SINGLE_NODE, Rendezvous
from torchscale.plan.matrix import Plan
from torchscale.plan.planned_cell import Cell

NODELIST_VARS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
GPUS_VARS = ("SLURM_GPUS_PER_NODE", "SLURM_GPUS_ON_NODE")
LAUNCH_OVERHEAD_S = 120.0
"""Time allowed per cell on top of its timeout when sizing an sbatch time limit (srun, start-up)."""


def _split_top_level(text: str) -> List[str]:
    """Split on commas outside brackets: ``a[1-2],b`` -> ``['a[1-2]', 'b']``."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


def _expand_range(spec: str, hostlist: str) -> List[str]:
    values = []
    for item in spec.split(","):
        low, sep, high = item.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise TorchscaleError(f"cannot read the Slurm node list '{hostlist}' (range '{item}')")
        if not sep:
            values.append(low)
            continue
        width = len(low)  # zero padding of the low bound is kept: gpu[08-10]
        values += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return values


def expand_hostlist(hostlist: str) -> List[str]:
    """Slurm's compressed node list as host names, in order.

    ``gpu[01-03,07],login1`` -> gpu01 gpu02 gpu03 gpu07 login1; several bracket groups in one
    name expand as a product (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2), like ``scontrol show
    hostnames``.
    """
    hosts: List[str] = []
    for part in _split_top_level(hostlist):
        if part.count("[") != part.count("]"):
            raise TorchscaleError(f"cannot read the Slurm node list '{hostlist}' (brackets)")
        names = [""]
        for literal, ranges in re.findall(r"([^\[\]]*)(?:\[([^\]]*)\])?", part):
            values = _expand_range(ranges, hostlist) if ranges else [""]
            names = [f"{name}{literal}{value}" for name in names for value in values]
        hosts += names
    return hosts


def _gpus_per_node(environ: Mapping[str, str]) -> Optional[int]:
    """From ``SLURM_GPUS_PER_NODE`` (``8``, ``a100:8``, ``8(x2)``) or ``SLURM_GPUS_ON_NODE``."""
    for name in GPUS_VARS:
        match = re.match(r"^(?:[^:]+:)?(\d+)", environ.get(name, "").strip())
        if match:
            return int(match.group(1))
    return None


@dataclass(frozen=True)
class SlurmAllocation:
    job_id: str
    hosts: Tuple[str, ...]
    gpus_per_node: Optional[int] = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> SlurmAllocation:
        job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
        nodelist = next((environ[name] for name in NODELIST_VARS if environ.get(name)), None)
        if not job_id or not nodelist:
            raise TorchscaleError(
                "--launcher slurm runs inside a Slurm allocation (SLURM_JOB_ID and "
                "SLURM_JOB_NODELIST are not set): run it from an sbatch script or salloc, or "
                "submit the matrix with --launcher slurm --submit"
            )
        one_line(f"{job_id} {nodelist}", "SLURM_JOB_ID or SLURM_JOB_NODELIST")
        return cls(job_id, tuple(expand_hostlist(nodelist)), _gpus_per_node(environ))


@dataclass(frozen=True)
class SlurmLaunch(Launch):
    """One torchscale for the whole allocation: every cell goes through ``srun``."""

    allocation: Optional[SlurmAllocation] = None

    launcher = "slurm"

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str],
        port: Optional[int],
        join_timeout_s: float,
        host: Optional[str] = None,
    ) -> SlurmLaunch:
        allocation = SlurmAllocation.from_env(environ)
        return cls(
            nnodes=len(allocation.hosts),
            endpoint=f"{host or socket.gethostname()}:{port or DEFAULT_PORT}",
            run_id=allocation.job_id,
            join_timeout_s=join_timeout_s,
            allocation=allocation,
        )

    @property
    def hosts(self) -> Tuple[str, ...]:
        return self.allocation.hosts if self.allocation else ()

    def visits(self, cell: Cell) -> bool:
        return True

    def has_nodes(self) -> str:
        return f"the allocation has {self.nnodes}"

    def more_nodes_hint(self, nnodes: int) -> str:
        return f"submit with --nodes={nnodes} or more"

    def join_waits(self, cells: Sequence[Cell]) -> Dict[str, float]:
        return {}  # srun starts every node of a cell at once

    def rendezvous(self, cell: Cell, wait_s: Optional[float] = None) -> Rendezvous:
        nnodes = cell.settings.nnodes
        if nnodes == 1:
            return SINGLE_NODE
        return Rendezvous(
            nnodes=nnodes,
            node_rank=None,  # the same command runs on every node; c10d numbers the nodes
            endpoint=self.endpoint,
            run_id=f"{self.run_id}-{cell.cell_id}",
            join_timeout_s=wait_s if wait_s is not None else self.join_timeout_s,
            is_host=False,
        )

    def prefix(self, cell: Cell) -> List[str]:
        nnodes = cell.settings.nnodes
        return [
            "srun",
            f"--nodes={nnodes}",
            f"--ntasks={nnodes}",
            "--ntasks-per-node=1",
            f"--nodelist={','.join(self.hosts[:nnodes])}",
            f"--job-name=torchscale-{cell.cell_id}"[:120],
            "--kill-on-bad-exit=1",
            "--label",
        ]

    def describe(self) -> Dict[str, object]:
        return {
            **super().describe(),
            "node_rank": None,
            "slurm_job_id": self.run_id,
            "hosts": list(self.hosts),
            "gpus_per_node": self.allocation.gpus_per_node if self.allocation else None,
        }


def _time_limit(seconds: float) -> str:
    """Slurm's D-HH:MM:SS, rounded up to the minute."""
    minutes = max(1, math.ceil(seconds / 60))
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:00"


def sbatch_script(
    plan: Plan,
    benchmark_args: Sequence[str],
    *,
    log_path: str,
    cpu_slots: Optional[int] = None,
    extra: Sequence[str] = (),
    workdir: str = ".",
) -> str:
    """The batch script of the whole matrix: as many nodes as its largest cell, one task per
    node, a time limit from the cell timeouts; it runs ``benchmark_args`` (a torchscale command
    with ``--launcher slurm``) on the batch node. ``cpu_slots``: CPU processes stand in for GPUs.
    """
    nnodes = max(cell.settings.nnodes for cell in plan.cells)
    per_node = max(cell.settings.nproc_per_node for cell in plan.cells)
    seconds = sum(cell.settings.cell_timeout_s + LAUNCH_OVERHEAD_S for cell in plan.cells)
    resources = f"--cpus-per-task={cpu_slots}" if cpu_slots else f"--gpus-per-node={per_node}"
    job_name = one_line(f"torchscale-{plan.config.experiment_name}", "experiment_name")[:120]
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={sbatch_word(job_name, 'experiment_name')}",
        f"#SBATCH --nodes={nnodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH {resources}",
        "#SBATCH --exclusive",
        f"#SBATCH --time={_time_limit(seconds)}",
        f"#SBATCH --output={sbatch_word(log_path, 'the output folder')}",
        *(f"#SBATCH {sbatch_option(arg)}" for arg in extra),
        "",
        f"# {len(plan.cells)} cells; the largest runs on {nnodes} node(s) x {per_node} rank(s).",
        "# torchscale runs on the batch node; each cell is an srun of one torchrun per node.",
        "set -euo pipefail",
        f"cd {shell_word(workdir, 'the working folder')}",
        "export PYTHONUNBUFFERED=1",
    ]
    if cpu_slots:
        lines.append(f"export TORCHSCALE_CPU_SLOTS={int(cpu_slots)}")
    lines.append(shell_line(benchmark_args, "the benchmark command (a path or --set value)"))
    return "\n".join(lines) + "\n"


def sbatch_option(arg: str) -> str:
    """One ``--sbatch-arg`` as the words of an ``#SBATCH`` line, each quoted for sbatch: the
    option with its value (``--comment=a b``: one word, spaces kept), or an option and its value
    after a blank (``--partition gpu``, ``-p gpu``: two words)."""
    one_line(arg, "--sbatch-arg")
    separate = re.fullmatch(r"(-{1,2}[A-Za-z][\w-]*)\s+(\S.*)", arg.strip())
    words = list(separate.groups()) if separate else [arg.strip()]
    if not words[0].startswith("-"):
        raise TorchscaleError(
            f"--sbatch-arg {for_terminal(repr(arg))} is not an sbatch option: give one such as "
            "--sbatch-arg=--partition=gpu"
        )
    return " ".join(sbatch_word(word, "--sbatch-arg") for word in words)


def log_pattern(folder: str, pattern: str) -> str:
    """``folder/pattern`` for ``#SBATCH --output``: a ``%`` of the folder is doubled, so that
    sbatch expands only the pattern's own (``%j``). A backslash would stop sbatch expanding any
    (the job's log would not be where torchscale looks): refused."""
    if "\\" in folder:
        raise TorchscaleError(
            f"the output folder {for_terminal(folder)} has a backslash, which makes sbatch write "
            "its log under a literal '%j': choose another --output-dir"
        )
    return f"{folder.replace('%', '%%')}/{pattern}"


def submit(script_path: str) -> str:
    """``sbatch --parsable`` the script; returns the job id."""
    try:
        done = subprocess.run(
            ["sbatch", "--parsable", script_path], capture_output=True, text=True, timeout=120
        )
    except FileNotFoundError:
        raise TorchscaleError(
            "sbatch is not on PATH: run --submit on a Slurm login node, or add --dry-run to "
            "print the script"
        ) from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"exit code {done.returncode}"
        raise TorchscaleError(f"sbatch refused the job: {reason}")
    return done.stdout.strip().split(";")[0]
