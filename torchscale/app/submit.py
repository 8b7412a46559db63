"""``benchmark --launcher slurm --submit``: the whole matrix as one sbatch job."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from torchscale.app.benchmark import BenchmarkRequest
from torchscale.errors import TorchscaleError
from torchscale.results.layout import SBATCH_FILE, SLURM_LOG_PATTERN, experiment_dir, slurm_log

if TYPE_CHECKING:
    from torchscale.plan.matrix import Plan


@dataclass(frozen=True)
class SubmitRequest:
    benchmark: BenchmarkRequest
    config_path: Path
    forwarded: Sequence[str]  # benchmark options the job's torchscale repeats (--set, ...)
    sbatch_args: Sequence[str] = ()
    dry_run: bool = False


@dataclass(frozen=True)
class SubmitOutcome:
    script: str
    cells: int
    store_root: Path
    script_path: Optional[Path] = None  # None: a dry run wrote and submitted nothing
    job_id: Optional[str] = None

    @property
    def job_log(self) -> Optional[Path]:
        return self.store_root / slurm_log(self.job_id) if self.job_id else None


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
    from torchscale.launch.slurm import log_pattern, sbatch_script

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
        log_path=log_pattern(str(store_root.resolve()), SLURM_LOG_PATTERN),
        cpu_slots=_cpu_slots(),
        extra=sbatch_args,
        workdir=os.getcwd(),
    )


def submit_matrix(request: SubmitRequest) -> SubmitOutcome:
    """Write the matrix's sbatch script and submit it (a dry run: only build the script)."""
    from torchscale.launch.slurm import submit
    from torchscale.launch.sweep import check_resumable
    from torchscale.plan.matrix import DEFAULT_MAX_CELLS, expand
    from torchscale.results.files import atomic_write_text
    from torchscale.results.store import ExperimentStore, check_writable

    bench = request.benchmark
    config = bench.config
    if bench.launch.launcher != "slurm":
        raise TorchscaleError("--submit goes with --launcher slurm")
    if config.gpus_per_node is None and config.nodes is None:
        raise TorchscaleError(
            "--submit sizes the allocation from the config: set gpus_per_node (the GPUs of one "
            "node, e.g. --set gpus_per_node=8) or nodes"
        )
    cap = DEFAULT_MAX_CELLS if bench.max_cells is None else bench.max_cells
    plan = expand(config, bench.benchmark, max_cells=cap)
    store = ExperimentStore(experiment_dir(bench.output_dir, config.experiment_name))
    check_resumable(store, bench.resume)
    script = sbatch_for(
        plan,
        request.config_path,
        store.root,
        request.forwarded,
        request.sbatch_args,
        bench.launch.join_timeout,
    )
    if request.dry_run:
        return SubmitOutcome(script, len(plan), store.root)
    check_writable(bench.output_dir)
    path = store.root / SBATCH_FILE
    atomic_write_text(path, script)
    return SubmitOutcome(script, len(plan), store.root, path, submit(str(path)))
