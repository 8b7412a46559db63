"""test_own_script.py's failure runs, made in the session's lanes (tests/support/session_runs.py).

Each is ``python -m torchscale`` as a subprocess (standalone torchrun: ports the OS picks) or, for
the bootstrap errors, single ranks run directly, so they run beside another run. Sharing the cores
cannot change what the tests read of them: exit codes, statuses, error text (a step count, a
rank, an exception), records' fields that the options set (step_at, samples per step, the batch,
the count of measured steps) and files written or not. No test of them reads a time, a verdict
or a throughput; their waits (cell timeouts of minutes, ``wall_s < 120``) are minutes. Each job
keeps what it raised, so one broken run fails its own test only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

from tests.support.session_runs import torchscale
from tests.support.shared_runs import SCRIPTS, SUPPORT_SCRIPTS

CNN = SCRIPTS / "train_cnn.py"
HAND_SGD = SUPPORT_SCRIPTS / "hand_sgd.py"
"""Updates its weights by hand (no torch.optim); its DDP forward takes a 0-d scale first."""

TUNE_CONFIG = """\
warmup_steps: 3
measure_steps: 20
sync_probe_steps: 0
cell_timeout_s: 240
tune:
  search: [ddp.bucket_cap_mb]
  space:
    ddp.bucket_cap_mb: [100]
  pruning: false
  finalists: 1
  repeats: 1
"""
"""The script's own 1 MB buckets (32 a step) against 100 MB (one): two trials and one verdict
round. Whether the gain is found and then confirmed by a separate benchmark depends on the
machine's timing: benchmarks/tune_script_gain.py measures that (docs/PERFORMANCE.md)."""


def ends_early(folder: Path) -> Tuple[subprocess.CompletedProcess[str], Path]:
    """The CNN script on 1 rank, told to stop after 3 steps: before its window."""
    done = torchscale("benchmark", "--script", str(CNN), "--gpus", "1", "-o", str(folder),
                      "--", "--steps", "3")  # fmt: skip
    return done, folder / "train_cnn"


def raises(folder: Path) -> Tuple[subprocess.CompletedProcess[str], Path]:
    """A script that raises on rank 1 at its second step, on 2 ranks."""
    script = SUPPORT_SCRIPTS / "raise_on_rank.py"
    args = ["benchmark", "--script", str(script), "--gpus", "2", "-o", str(folder)]
    return torchscale(*args, "--", "--rank", "1", "--after", "2"), folder / "raise_on_rank"


def steps_at(folder: Path) -> Tuple[subprocess.CompletedProcess[str], Path]:
    """The hand-SGD script on 2 ranks, stepped at forwards with a given samples-per-step."""
    args = ["benchmark", "--script", str(HAND_SGD), "--gpus", "2", "--steps", "4"]
    args += ["--step-at", "forward", "--samples-per-step", "12", "-o", str(folder)]
    args += ["--set", "warmup_steps=2", "--set", "sync_probe_steps=1"]
    return torchscale(*args, "--", "--steps", "30", "--batch-size", "5"), folder / "hand_sgd"


def tune_fails(folder: Path) -> Tuple[subprocess.CompletedProcess[str], Path]:
    """``tune --script`` of a script with no DDP model: every trial fails."""
    config = folder / "nothing.yaml"
    config.write_text(TUNE_CONFIG.replace("measure_steps: 20", "measure_steps: 3"))
    script = SUPPORT_SCRIPTS / "no_ddp.py"
    args = ["tune", "--script", str(script), "--gpus", "1", "-c", str(config), "--trials", "1"]
    return torchscale(*args, "-o", str(folder / "out"), "--json"), folder / "out"


def _start_wrap(root: Path, script: Path, *args: str, **knobs: Any) -> Any:
    """One rank of a script cell, run directly (no torchrun), started: (its process, its cell
    folder). :func:`_wrap_error` reads its error file once it ended."""
    from torchscale.script.script_config import ScriptCellSettings

    window = {"warmup_steps": 2, "measure_steps": 3, "sync_probe_steps": 0, **knobs}
    settings = ScriptCellSettings(script=str(script), args=list(args), gpus=1, **window)
    cell = root / f"{script.stem}-{len(list(root.iterdir()))}"
    cell.mkdir()
    (cell / "cell.json").write_text(json.dumps({"settings": settings.model_dump(mode="json")}))
    # Port 0: the one rank's store listens where the OS says. A free port probed here and closed
    # again was once taken by another process of the lanes before the rank listened on it.
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "-m", "torchscale.script.wrap", "--cell", str(cell / "cell.json"),
         "--out", str(cell / "result.json")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return process, cell


def _wrap_error(started: Any) -> Dict[str, Any]:
    process, cell = started
    try:
        process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode != 0 and not (cell / "result.json").exists()
    error: Dict[str, Any] = json.loads((cell / "ranks" / "rank0.error.json").read_text())
    return error


def wrapped(root: Path) -> Dict[str, Dict[str, Any]]:
    """Five single ranks of script cells that each end in a bootstrap error, run at once: each
    is a process that imports torch and ends at its first steps, with no figure to measure, so
    they need not wait for each other. By name, each one's error file."""
    started = {
        "no_ddp": _start_wrap(root, SUPPORT_SCRIPTS / "no_ddp.py"),
        "two_ddp": _start_wrap(root, SUPPORT_SCRIPTS / "two_ddp.py"),
        # forward 4: the second measured step
        "exited": _start_wrap(
            root, HAND_SGD, "--exit-at", "4", step_at="forward", samples_per_step=12
        ),
        # steps at optimizer steps: none
        "unmarked": _start_wrap(root, HAND_SGD, "--steps", "8"),
        "quit_early": _start_wrap(root, HAND_SGD, "--exit-at", "1", "--exit-code", "0"),
    }
    try:
        return {name: _wrap_error(process) for name, process in started.items()}
    finally:
        for process, _ in started.values():
            if process.poll() is None:
                process.kill()
                process.wait()


RUNS: Dict[str, Callable[[Path], Any]] = {
    "raises": raises,
    "steps_at": steps_at,
    "wrapped": wrapped,
    "ends_early": ends_early,
    "tune_fails": tune_fails,
}
"""By name, the runs (the ``own_script_faults`` fixture's keys); each gets a folder of its own."""
