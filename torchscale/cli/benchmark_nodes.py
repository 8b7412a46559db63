"""``torchscale benchmark`` across nodes: which launch this is, and ``--submit`` for Slurm.

Kept apart from ``benchmark.py`` so the command stays thin; imports torch only when the launch's
node size must be asked of the hardware.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from torchscale.cli.console import err_console
from torchscale.errors import TorchscaleError

if TYPE_CHECKING:
    from torchscale.config.settings import BenchmarkConfig
    from torchscale.launch.multinode import Launch
    from torchscale.plan.matrix import Plan
    from torchscale.results.schema import ResultBase
    from torchscale.results.store import ExperimentStore


def _node_size(config: BenchmarkConfig, known: Optional[int] = None) -> Optional[int]:
    """GPUs (or CPU slots) of one node, needed only when the config does not say how cells
    spread over nodes."""
    if config.nodes is not None or config.gpus_per_node is not None:
        return None
    if known:
        return known
    from torchscale.hardware.environment import node_devices

    return node_devices().count


def plan_and_launch(
    config: BenchmarkConfig,
    launcher: str,
    nnodes: Optional[int],
    node_rank: Optional[int],
    endpoint: Optional[str],
    rdzv_id: Optional[str],
    join_timeout: float,
    benchmark: str = "all",
    mpirun_args: Sequence[str] = (),
    max_cells: Optional[int] = None,
) -> Tuple[Plan, Launch]:
    from torchscale.plan.matrix import DEFAULT_MAX_CELLS, expand

    launch, per_node = launch_for(
        config, launcher, nnodes, node_rank, endpoint, rdzv_id, join_timeout, mpirun_args
    )
    cap = DEFAULT_MAX_CELLS if max_cells is None else max_cells
    return expand(config, benchmark, gpus_per_node=per_node, max_cells=cap), launch


def launch_for(
    config: BenchmarkConfig,
    launcher: str,
    nnodes: Optional[int],
    node_rank: Optional[int],
    endpoint: Optional[str],
    rdzv_id: Optional[str],
    join_timeout: float,
    mpirun_args: Sequence[str] = (),
) -> Tuple[Launch, Optional[int]]:
    """This launch, and the node size cells spread by (None: the config says)."""
    from torchscale.launch.multinode import resolve_launch, split_endpoint
    from torchscale.launch.slurm import SlurmLaunch
    from torchscale.plan.matrix import experiment_dirname

    launch: Launch
    if launcher == "slurm":
        if nnodes is not None or node_rank is not None:
            raise TorchscaleError(
                "--nnodes and --node-rank go with --launcher torchrun; under Slurm the "
                "allocation gives the nodes"
            )
        port = split_endpoint(endpoint)[1] if endpoint else None
        slurm = SlurmLaunch.from_env(os.environ, port, join_timeout)
        per_node = _node_size(config, slurm.allocation.gpus_per_node if slurm.allocation else None)
        launch = slurm
    elif launcher == "mpirun":
        from torchscale.launch.mpirun import resolve_mpirun_launch

        if node_rank is not None:
            raise TorchscaleError("--node-rank goes with --launcher torchrun; mpirun places ranks")
        launch = resolve_mpirun_launch(
            nnodes=nnodes, endpoint=endpoint, mpirun_args=mpirun_args, join_timeout_s=join_timeout
        )
        per_node = _node_size(config) if launch.nnodes > 1 else None
    else:
        launch = resolve_launch(
            nnodes=nnodes,
            node_rank=node_rank,
            endpoint=endpoint,
            run_id=rdzv_id,
            join_timeout_s=join_timeout,
            experiment=experiment_dirname(config.experiment_name),
        )
        per_node = _node_size(config) if launch.nnodes > 1 else None
    return launch, per_node


def follower_summary(launch: Launch, store: ExperimentStore, failed: List[ResultBase]) -> int:
    """What a node other than node 0 says at the end (it records nothing)."""
    err_console.print(
        f"node {launch.node_rank} of {launch.nnodes}: done; node 0 records the results in "
        f"{store.root}",
        markup=False,
    )
    if failed:
        err_console.print(f"{len(failed)} cell(s) failed on this node; see their errors above.")
        return 1
    return 0


def _cpu_slots() -> Optional[int]:
    from torchscale.hardware.environment import CPU_SLOTS_ENV

    slots = os.environ.get(CPU_SLOTS_ENV, "")
    return int(slots) if slots.isdigit() and int(slots) > 0 else None


def sbatch_for(
    plan: Plan,
    config_path: Path,
    store_root: Path,
    forwarded: Sequence[str],
    sbatch_args: Sequence[str],
    join_timeout: float,
) -> str:
    """The sbatch script that runs this matrix as one job (``--launcher slurm --resume``)."""
    from torchscale.launch.slurm import sbatch_script

    command = [
        sys.executable, "-m", "torchscale", "benchmark",
        "--config", str(config_path.resolve()),
        "--output-dir", str(store_root.parent.resolve()),
        "--launcher", "slurm", "--resume", f"--join-timeout={join_timeout:g}",
        *forwarded,
    ]  # fmt: skip
    return sbatch_script(
        plan,
        command,
        log_path=str(store_root.resolve() / "slurm-%j.out"),
        cpu_slots=_cpu_slots(),
        extra=sbatch_args,
        workdir=os.getcwd(),
    )


def submit_matrix(
    config: BenchmarkConfig,
    config_path: Path,
    output_dir: Path,
    launcher: str,
    forwarded: Sequence[str],
    sbatch_args: Sequence[str],
    *,
    resume: bool,
    dry_run: bool,
    join_timeout: float,
    benchmark: str = "all",
    max_cells: Optional[int] = None,
) -> None:
    """Write the matrix's sbatch script and submit it (``--dry-run``: print it on stdout)."""
    from torchscale.launch.slurm import SBATCH_FILE, submit
    from torchscale.launch.sweep import check_resumable
    from torchscale.plan.matrix import DEFAULT_MAX_CELLS, expand, experiment_dirname
    from torchscale.results.store import ExperimentStore, atomic_write_text, check_writable

    if launcher != "slurm":
        raise TorchscaleError("--submit goes with --launcher slurm")
    if config.gpus_per_node is None and config.nodes is None:
        raise TorchscaleError(
            "--submit sizes the allocation from the config: set gpus_per_node (the GPUs of one "
            "node, e.g. --set gpus_per_node=8) or nodes"
        )
    cap = DEFAULT_MAX_CELLS if max_cells is None else max_cells
    plan = expand(config, benchmark, max_cells=cap)
    store = ExperimentStore(output_dir / experiment_dirname(config.experiment_name))
    check_resumable(store, resume)
    script = sbatch_for(plan, config_path, store.root, forwarded, sbatch_args, join_timeout)
    if dry_run:
        sys.stdout.write(script)
        err_console.print("dry run: nothing was written or submitted")
        return
    check_writable(output_dir)
    path = store.root / SBATCH_FILE
    atomic_write_text(path, script)
    job_id = submit(str(path))
    err_console.print(
        f"submitted Slurm job {job_id} ({len(plan)} cells, script {path}); results go to "
        f"{store.root}, the job's log to {store.root / f'slurm-{job_id}.out'}",
        markup=False,
    )
