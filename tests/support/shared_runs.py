"""Real benchmark runs shared by several test modules, each run once per test session.

A launch costs seconds (every torchrun agent and worker imports torch), so the engine's tests
and the report's tests read the same real results instead of producing their own. The functions
here launch; ``tests/conftest.py`` holds each as a session-scoped fixture of the same name
(``healthy_run``, ``projection_run``, ``own_script_run``): a test asks for the fixture.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

SCRIPT_NAME = "<script>alert(1)</script>"
"""An experiment name that must stay text everywhere (folder names, HTML, PDF)."""

HEALTHY_CONFIG = f"""\
experiment_name: "{SCRIPT_NAME}"
models: [gpt2-tiny]
batch_sizes: [4]
gpu_counts: [1, 2]
warmup_steps: 2
measure_steps: 8
sync_probe_steps: 3
cell_timeout_s: 240
"""


@dataclass(frozen=True)
class Run:
    result: Any  # the CliRunner result: exit code, stdout, stderr
    config: Path
    output_dir: Path  # holds the experiment folder
    experiment_dir: Path


@dataclass(frozen=True)
class ProfileRun:
    """``profile`` with no model into a copy of the healthy run's folder (``use_case_profile``)."""

    result: Any  # the CliRunner result of ``profile ... -v --json``
    folder: Path  # the benchmark's experiment copied in, and the profile run beside it
    history: Path  # the SQLite history it recorded itself in (--history)


def healthy_tensorboard(run: Run) -> Path:
    """Where the healthy run's live TensorBoard sink wrote (``--tensorboard``)."""
    return run.output_dir.parent / "tb"


def healthy_mlflow_uri(run: Run) -> str:
    """The healthy run's MLflow tracking URI (``--mlflow``): a SQLite file beside its results."""
    return f"sqlite:///{run.output_dir.parent / 'mlflow.db'}"


def launch_healthy_run(root: Path) -> Run:
    """``torchscale benchmark --json`` on gpt2-tiny with 1 and 2 gloo processes, with the live
    TensorBoard and MLflow sinks on (test_integrations reads them back: no launch of its own, and
    the hostile experiment name reaches both sinks)."""
    from torchscale.cli.app import app
    from torchscale.results.layout import experiment_dirname

    root.mkdir(parents=True, exist_ok=True)
    config = root / "bench.yaml"
    config.write_text(HEALTHY_CONFIG, encoding="utf-8")
    output = root / "results"
    args = ["benchmark", "-c", str(config), "-o", str(output), "--json"]
    args += ["--tensorboard", str(root / "tb"), "--mlflow", f"sqlite:///{root / 'mlflow.db'}"]
    result = CliRunner().invoke(app, args)
    if result.exit_code != 0:
        raise RuntimeError(f"healthy benchmark failed ({result.exit_code}):\n{result.output}")
    return Run(result, config, output, output / experiment_dirname(SCRIPT_NAME))


PROJECTION_CONFIG = """\
experiment_name: projection
models: [gpt2-tiny]
batch_sizes: [16]
gpu_counts: [1, 2]
warmup_steps: 5
measure_steps: 20
sync_probe_steps: 10
cell_timeout_s: 240
communication:
  collectives: [all_reduce]
  p2p: true
  min_bytes: 16K
  max_bytes: 4M
  factor: 4
  dtype: float32
  warmup: 2
  iterations: 20
  after_compute: true
  through_ddp: true
  tp_gemm:
    m: [256, 512]
    n: 128
    k: 128
    dtype: float32
    orders: [AG_before, AG_after]
"""
"""Training cells on 1 and 2 gloo ranks plus all_reduce cells on 2: what ``torchscale project``
needs. Batch 16 keeps compute the larger part of the step, as on a real training job (at batch 64
two ranks on this VM's two cores compute 16-23% slower than one: memory bandwidth). The same
launch measures P2P pairs and two TP GEMM cases for the report's tests."""


def launch_projection_run(root: Path) -> Run:
    """``torchscale benchmark`` of :data:`PROJECTION_CONFIG` (training and communication cells)."""
    from torchscale.cli.app import app

    root.mkdir(parents=True, exist_ok=True)
    config = root / "bench.yaml"
    config.write_text(PROJECTION_CONFIG, encoding="utf-8")
    output = root / "results"
    result = CliRunner().invoke(app, ["benchmark", "-c", str(config), "-o", str(output)])
    if result.exit_code != 0:
        raise RuntimeError(f"projection benchmark failed ({result.exit_code}):\n{result.output}")
    return Run(result, config, output, output / "projection")


REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "examples" / "scripts"
SUPPORT_SCRIPTS = Path(__file__).resolve().parent / "scripts"
OWN_SCRIPT_WINDOW = 20
"""Warm-up and measured steps of the shared script run, and the script's own --log-every: its
window (steps 21-40) is the one the script prints its samples/s over."""
OWN_SCRIPT_BATCH = 8
OWN_SCRIPT_CONFIG = f"""\
experiment_name: own-script
warmup_steps: {OWN_SCRIPT_WINDOW}
measure_steps: {OWN_SCRIPT_WINDOW}
sync_probe_steps: 3
cell_timeout_s: 240
communication:
  collectives: [all_reduce]
  p2p: false
  min_bytes: 16K
  max_bytes: 1M
  factor: 4
  warmup: 2
  iterations: 10
  through_ddp: true
"""
"""``benchmark --script``'s config: the window, and all_reduce cells for ``project``."""


def launch_own_script_run(root: Path) -> Run:
    """``torchscale benchmark --script examples/scripts/train_transformer.py --gpus 1 --gpus 2
    -c ...``: the user's own script, unmodified, on 1 and 2 gloo processes, with all_reduce
    cells."""
    from torchscale.cli.app import app

    root.mkdir(parents=True, exist_ok=True)
    config = root / "comm.yaml"
    config.write_text(OWN_SCRIPT_CONFIG, encoding="utf-8")
    output = root / "results"
    script = SCRIPTS / "train_transformer.py"
    args = ["benchmark", "--script", str(script), "--gpus", "1", "--gpus"]
    args += ["2", "-c", str(config), "-o", str(output), "--json", "--"]
    args += ["--steps", "60", "--log-every", str(OWN_SCRIPT_WINDOW)]
    args += ["--batch-size", str(OWN_SCRIPT_BATCH)]
    result = CliRunner().invoke(app, args)
    if result.exit_code != 0:
        raise RuntimeError(f"script benchmark failed ({result.exit_code}):\n{result.output}")
    return Run(result, config, output, output / "own-script")
