"""README's example commands, as a new user copies them: every ``torchscale`` line of
its shell blocks parses as written, and each one a CPU node can run is run as written, in a folder
holding what the line names (``results/``, ``train.py``, ``path/to/traces/``...); those that
launch a whole matrix run with ``--dry-run`` added, and those that need more GPUs than the node
has fail with one line naming the fix. A line added to README is picked up here: one this file
does not classify fails the test, so nothing in README goes unchecked."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Any, Dict, List, Sequence

import pytest
import typer
from typer.testing import CliRunner, Result

from tests.support.environ import REPO
from tests.support.report_fixtures import MODELS, FixtureSpec, write_experiment
from torchscale.cli.app import app

runner = CliRunner()
TRACES = REPO / "tests" / "data" / "gloo_2rank_cpu"


def readme_commands() -> List[str]:
    """Every ``torchscale`` command line of README's bash blocks, continuations joined, the
    comment dropped."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = " ".join(re.sub(r"\s+#.*$", "", line).split())
            if line.startswith("torchscale "):
                commands.append(line)
    return commands


COMMANDS = readme_commands()

RUN = {
    "torchscale validate --json",
    "torchscale profile analyze path/to/traces/",
    "torchscale profile diff old_traces/ new_traces/",
    "torchscale report --source results --format html",
    "torchscale report --source results --format pdf",
    "torchscale report --source results --format json",
    "torchscale report --source results --format png",
    "torchscale report --source results/new --baseline results/old",
    "torchscale compare results/old results/new --threshold 5",
    "torchscale report --source results/bench --format tensorboard --output runs/",
    "torchscale project --source results/train --gpus 64 256 --inter-node-gbps 25",
}
"""Run as written."""
DRY_RUN = {
    "torchscale benchmark --config examples/cpu_smoke.yaml --output-dir results",
    "torchscale benchmark --config benchmark_config.yaml --output-dir ./results",
    "torchscale benchmark --script train.py -c comm.yaml --gpus 1 --gpus 2 --gpus 4 --steps 50 "
    "-- --lr 0.1",
    "torchscale benchmark --config examples/comm_cpu.yaml --benchmark comm --output-dir results",
    "torchscale benchmark -c scaling.yaml --nnodes 2 --node-rank $R --rdzv-endpoint node0:29500",
    "torchscale benchmark -c scaling.yaml --launcher slurm --submit --dry-run",
    "torchscale benchmark -c bench.yaml --launcher mpirun",
    "torchscale benchmark -c bench.yaml --launcher mpirun --nnodes 2 "
    "--mpirun-arg=--hostfile=hosts --rdzv-endpoint gpu01:29500",
}
"""Whole matrices (the example benchmark itself runs for real in test_benchmark_run): planned
with ``--dry-run``, which checks the config and prints every cell's command."""
TOO_BIG = {
    "torchscale profile --script train.py --gpus 4 --duration 30s -- --lr 0.1": "--gpus 2",
    "torchscale profile --gpus 8 --duration 30s --target sync_stalls --model gpt2 --batch-size 8": (
        "--gpus 2"
    ),
    "torchscale profile --gpus 8 --duration 60s --target sync_stalls --output-dir "
    "./scaling_results": "--gpus 2",
}
"""More ranks than a 2-slot CPU node holds: one line naming the fix, exit 2, nothing written."""
PARSED_ONLY = {
    "torchscale validate": "the same checks as --json, run above",
    "torchscale validate -v": "the same checks as --json, run above",
    "torchscale validate --level 2": "minutes of probes (tests/test_validate_probes.py)",
    "torchscale validate --level 3": "sustained load (tests/test_validate_probes.py)",
    "torchscale tune --script train.py --gpus 4 --budget 20m -- --lr 0.1": "a 20-minute search",
    "torchscale benchmark -c scaling.yaml --launcher slurm": "needs a Slurm allocation",
    "torchscale benchmark -c scaling.yaml --launcher k8s --image registry/bench:1 --submit": (
        "needs a Kubernetes cluster (tests/test_k8s.py runs it against a recording kubectl)"
    ),
    "torchscale benchmark -c bench.yaml --tensorboard runs/ --mlflow sqlite:///mlflow.db": (
        "a whole matrix (tests/test_integrations.py runs one)"
    ),
}
"""Not run here, for the reason given; parsed like every line."""


def _parse(args: Sequence[str]) -> None:
    """Click's own parsing of ``args`` down to the command, without running it: unknown options,
    missing values and bad types fail here as they would for the user."""
    command = typer.main.get_command(app)
    ctx = command.make_context("torchscale", list(args))
    # typer's own group class: typer 0.2x vendors click, whose Group is not click.Group
    while isinstance(command, typer.core.TyperGroup):
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not rest:
            return
        name, sub, rest = command.resolve_command(ctx, rest)
        assert sub is not None and name is not None
        command = sub
        ctx = command.make_context(name, rest, parent=ctx)


def test_every_readme_command_is_classified() -> None:
    known = RUN | DRY_RUN | set(TOO_BIG) | set(PARSED_ONLY)
    assert sorted(set(COMMANDS) - known) == [], "classify README's new command here"
    assert sorted(known - set(COMMANDS)) == [], "README no longer has these commands"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_readme_command_parses_as_written(command: str) -> None:
    _parse(shlex.split(command.replace("$R", "0"))[1:])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with what README's lines name: results (old, new, train, bench), traces, a
    training script, the configs."""
    root = tmp_path_factory.mktemp("readme")
    for name in ("benchmark_config.yaml", "examples"):
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, root / name)
        else:
            shutil.copy(source, root / name)
    smoke = (REPO / "examples" / "cpu_smoke.yaml").read_text(encoding="utf-8")
    (root / "bench.yaml").write_text(smoke, encoding="utf-8")
    # a Slurm submission sizes its allocation from the GPUs of one node
    (root / "scaling.yaml").write_text(smoke + "gpus_per_node: 2\n", encoding="utf-8")
    shutil.copy(REPO / "examples" / "scripts" / "train_transformer.py", root / "train.py")
    (root / "comm.yaml").write_text(  # as README describes it
        "experiment_name: train\n"
        "communication: {collectives: [all_reduce], p2p: false, through_ddp: true}\n",
        encoding="utf-8",
    )
    results = root / "results"
    # One model at one batch size on 1-8 ranks each (collectives and failed cells kept): the
    # lines only have to run here; the report's content is checked on the full fixture
    # experiment (test_report_*). Four full experiments made the PDF line a 47-page render.
    small: Dict[str, Any] = {"models": MODELS[:1], "batch_sizes": (32,), "findings": False}
    write_experiment(results, FixtureSpec(name="old", **small))
    write_experiment(results, FixtureSpec(name="new", slowdown={"resnet50": 1.3}, **small))
    write_experiment(results, FixtureSpec(name="train", **small))
    write_experiment(results, FixtureSpec(name="bench", **small))
    for name in ("path/to/traces", "old_traces", "new_traces"):
        shutil.copytree(TRACES, root / name)
    return root


def _invoke(command: str, cwd: Path, extra: Sequence[str] = ()) -> Result:
    args = [*shlex.split(command.replace("$R", "0"))[1:], *extra]
    here = Path.cwd()
    os.chdir(cwd)
    try:
        return runner.invoke(app, args)
    finally:
        os.chdir(here)


@pytest.mark.parametrize("command", sorted(RUN))
def test_readme_commands_run_as_written(
    command: str, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHSCALE_CPU_SLOTS", "2")
    result = _invoke(command, workdir)
    verdicts = {"compare": (0, 1), "validate": (0, 1)}  # a regression, a failed check: verdicts
    allowed = next((codes for word, codes in verdicts.items() if f" {word} " in command), (0,))
    if " compare " in command and "not judged (busy host)" in result.stderr:
        allowed = (2,)  # a cell measured while other processes held the cores: not judged
    assert result.exit_code in allowed, result.output
    assert "Error:" not in result.stderr and "Traceback" not in result.output
    if "--json" in command:
        assert json.loads(result.stdout)["checks"]


@pytest.mark.parametrize("command", sorted(DRY_RUN))
def test_readme_matrices_plan_as_written(
    command: str, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHSCALE_CPU_SLOTS", "2")
    extra = [] if "--dry-run" in command else ["--dry-run"]
    if " -- " in command:  # the script's own arguments come last
        head, tail = command.split(" -- ", 1)
        command, extra = f"{head} --dry-run -- {tail}", []
    result = _invoke(command, workdir, extra)
    assert result.exit_code == 0, result.output
    assert "Error:" not in result.stderr


@pytest.mark.parametrize(("command", "fix"), sorted(TOO_BIG.items()))
def test_readme_lines_too_big_for_this_node_name_the_fix(
    command: str, fix: str, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHSCALE_CPU_SLOTS", "2")
    before = sorted(p.name for p in (workdir / "results").iterdir())
    result = _invoke(command, workdir)
    assert result.exit_code == 2, result.output
    [line] = [line for line in result.stderr.splitlines() if line.strip()][-1:]
    assert line.startswith("Error:") and fix in line
    assert sorted(p.name for p in (workdir / "results").iterdir()) == before
    assert not (workdir / "scaling_results").exists()
