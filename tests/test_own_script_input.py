"""``--script`` without a launch: bad input, the plan, the ``script:`` section, the bootstrap's
pieces and tune's space for a script (docs/own-job.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from typer.testing import CliRunner

from tests.support.shared_runs import SCRIPTS
from torchscale.cli.app import app
from torchscale.errors import ConfigError

runner = CliRunner()
CNN = SCRIPTS / "train_cnn.py"
COMMANDS = [["benchmark", "--gpus", "2"], ["profile", "--gpus", "2"], ["tune", "--gpus", "2"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("case", ["missing", "not_python", "binary", "config_models"])
def test_bad_script_input_is_one_line_exit_2_and_nothing_written(
    tmp_path: Path, command: List[str], case: str
) -> None:
    out = tmp_path / "out"
    extra: List[str] = []
    script = tmp_path / "train.sh"
    if case == "missing":
        script, expected = tmp_path / "nope.py", "script {script} does not exist"
    elif case == "not_python":
        script.write_text('#!/bin/sh\nexec torchrun --nproc-per-node 2 train.py "$@"\n')
        expected = "script {script} is not Python (line 2: "
    elif case == "binary":
        script.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(64))
        expected = "script {script} is not Python"
    else:
        script = CNN
        config = tmp_path / "c.yaml"
        config.write_text("models: [resnet-tiny]\nbatch_sizes: [4]\n")
        extra = ["-c", str(config)]
        expected = "--script runs your script instead of models, and {config} lists models"
        expected = expected.replace("{config}", str(config))
    args = [*command, "--script", str(script), *extra, "-o", str(out), "--", "--steps", "5"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert expected.format(script=script) in lines[0]
    assert "Traceback" not in result.output
    assert not out.exists()


def _plan(tmp_path: Path, *args: str) -> List[Dict[str, Any]]:
    out = tmp_path / "out"
    result = runner.invoke(app, ["benchmark", "-o", str(out), "--dry-run", "--json", *args])
    assert result.exit_code == 0, result.output
    assert not out.exists()
    plan: List[Dict[str, Any]] = json.loads(result.stdout)
    return plan


def test_arguments_after_the_double_dash_are_the_scripts(tmp_path: Path) -> None:
    plan = _plan(
        tmp_path, "--script", str(CNN), "--gpus", "1", "--gpus", "2", "--steps", "7",
        "--set", "warmup_steps=3", "--", "--steps", "40", "-o", "mine", "--lr", "0.1",
    )  # fmt: skip
    assert [cell["settings"]["gpus"] for cell in plan] == [1, 2]
    for cell in plan:
        settings = cell["settings"]
        # -o after -- is the script's own option; torchscale's -o stays torchscale's
        assert settings["args"] == ["--steps", "40", "-o", "mine", "--lr", "0.1"]
        assert settings["script"] == str(CNN)
        assert (settings["measure_steps"], settings["warmup_steps"]) == (7, 3)
        assert "-m torchscale.script.wrap" in cell["command"]
        assert cell["cell_id"].startswith(f"script-train-cnn-g{settings['gpus']}-r0-")


def test_a_script_section_joins_a_matrix_like_a_model(tmp_path: Path) -> None:
    config = tmp_path / "mixed.yaml"
    config.write_text(
        "models: [resnet-tiny]\nbatch_sizes: [4]\ngpu_counts: [1, 2]\n"
        f"script:\n  path: {CNN}\n  args: [--steps, 100]\n  gpu_counts: [2]\n"
        "  ddp: {bucket_cap_mb: 5}\n  env: {NCCL_ALGO: Ring, NCCL_BUFFSIZE: 4194304}\n"
    )
    plan = _plan(tmp_path, "-c", str(config))
    kinds = [(cell["cell_id"].split("-")[0], cell["settings"]["gpus"]) for cell in plan]
    assert kinds == [("resnet", 1), ("resnet", 2), ("script", 2)]
    settings = plan[-1]["settings"]
    assert settings["args"] == ["--steps", "100"]  # YAML's 100, as the command line's text
    assert settings["ddp"] == {"bucket_cap_mb": 5.0, "gradient_as_bucket_view": None,
                               "static_graph": None, "broadcast_buffers": None}  # fmt: skip
    assert settings["env"] == {"NCCL_ALGO": "Ring", "NCCL_BUFFSIZE": "4194304"}


def test_the_script_section_is_checked_like_the_rest(tmp_path: Path) -> None:
    from torchscale.config.loader import load_config

    config = tmp_path / "c.yaml"
    config.write_text(f"script:\n  path: {CNN}\n  argz: [--steps, 5]\n")
    with pytest.raises(
        ConfigError, match=r"unknown key 'script.argz' \(did you mean 'script.args'"
    ):
        load_config(config)
    config.write_text(f"script:\n  path: {CNN}\n  env: {{LD_PRELOAD: /tmp/x.so}}\n")
    with pytest.raises(ConfigError, match="'LD_PRELOAD' is not a communication variable"):
        load_config(config)


def test_script_options_need_a_script(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("models: [gpt2-tiny]\n")
    result = runner.invoke(app, ["benchmark", "-c", str(config), "--gpus", "2", "--dry-run"])
    assert result.exit_code == 2
    assert "--gpus goes with --script" in result.stderr


def test_the_bootstrap_sets_only_the_arguments_the_cell_names() -> None:
    from torchscale.script.step_hooks import applied_arguments

    # The script passed broadcast_buffers=True and bucket_cap_mb=1; the cell sets two knobs.
    newer = {"bucket_cap_mb": None, "broadcast_buffers": None, "forward_sync_buffers": None}
    arguments = {"module": "m", "bucket_cap_mb": 1, "broadcast_buffers": True, "dim": 0}
    applied = applied_arguments(
        newer, arguments, {"broadcast_buffers": False, "static_graph": True}
    )
    assert applied == {"forward_sync_buffers": False, "static_graph": True}
    assert arguments == {"module": "m", "bucket_cap_mb": 1, "dim": 0,
                         "forward_sync_buffers": False, "static_graph": True}  # fmt: skip
    older = {"bucket_cap_mb": None, "broadcast_buffers": None}
    arguments = {"module": "m"}
    assert applied_arguments(older, arguments, {"broadcast_buffers": False}) == {
        "broadcast_buffers": False
    }


def test_samples_are_the_batch_dimension_of_the_first_tensor() -> None:
    import torch

    from torchscale.script.run_state import first_batch_size

    tokens = torch.zeros(6, 128, dtype=torch.long)
    assert first_batch_size((tokens,), {}) == 6
    assert first_batch_size((), {"input_ids": tokens, "mask": torch.ones(2, 2)}) == 6
    assert first_batch_size(([torch.zeros(3, 4), tokens],), {}) == 3
    assert first_batch_size(("text", 1.0), {}) == 0
    assert first_batch_size((torch.tensor(2.0),), {}) == 0


def test_tune_searches_the_scripts_ddp_arguments_only() -> None:
    from torchscale.config.tune_section import TuneSection
    from torchscale.script.script_config import ScriptCellSettings
    from torchscale.tune.space import NOT_A_SETTING, Where, apply_params, build_space
    from torchscale.tune.trials import tuned_cell
    from torchscale.tune.tune_outputs import script_snippet

    baseline = ScriptCellSettings(script=str(CNN), gpus=2)
    space = build_space(baseline, TuneSection(), [], Where("cpu", True, None))
    assert [k.name for k in space.knobs] == [
        "ddp.bucket_cap_mb", "ddp.gradient_as_bucket_view", "ddp.static_graph",
        "ddp.broadcast_buffers",
    ]  # fmt: skip
    assert space.left_out["channels_last"] == NOT_A_SETTING
    assert "CUDA" in space.left_out["cudnn_benchmark"]  # a knob of scripts too, on GPUs
    assert isinstance(space.candidates["ddp.bucket_cap_mb"], tuple)
    assert space.candidates["ddp.bucket_cap_mb"][0] is None  # the script's own: the baseline
    with pytest.raises(
        ConfigError, match="tune names precision, which is set by the script itself"
    ):
        build_space(baseline, TuneSection(), ["precision"], Where("cpu", True, None))
    trial = apply_params(baseline, {"ddp.bucket_cap_mb": 100, "repeat": 3})
    assert isinstance(trial, ScriptCellSettings) and trial.ddp_overrides() == {"bucket_cap_mb": 100}
    cell = tuned_cell(trial)
    assert cell.kind == "script" and cell.cell_id.startswith("script-train-cnn-g2-r3-")
    lines = script_snippet({"ddp.bucket_cap_mb": 100}, "header").splitlines()
    assert lines[0] == "# header" and "    bucket_cap_mb=100," in lines


def test_resume_refuses_a_script_cell_whose_arguments_changed(tmp_path: Path) -> None:
    """A stored result of the same script and GPU count with other arguments is a changed cell:
    ``--resume`` refuses (as for a model) before anything launches; ``--force`` is the way."""
    from torchscale.results.schema import TrainingResult
    from torchscale.results.store import ExperimentStore

    out = tmp_path / "out"
    [planned] = _plan(tmp_path, "--script", str(CNN), "--gpus", "1", "--", "--steps", "5")
    stored = {**planned["settings"], "args": ["--steps", "9"]}
    old_id = planned["cell_id"].rsplit("-", 1)[0] + "-0123abcd"
    store = ExperimentStore(out / "train_cnn")
    store.root.mkdir(parents=True)
    store.write_manifest({"schema_version": 1, "experiment": "train_cnn", "config": {}})
    store.append(
        TrainingResult(
            cell_id=old_id, experiment="train_cnn", model="train_cnn.py", batch_size=4,
            world_size=1, nproc_per_node=1, global_batch_size=4, precision="script",
            settings=stored, status="failed", error="x",
        )
    )  # fmt: skip
    before = (store.root / "results.jsonl").read_bytes()
    args = ["benchmark", "--script", str(CNN), "--gpus", "1", "-o", str(out), "--resume"]
    result = runner.invoke(app, [*args, "--", "--steps", "5"])
    assert result.exit_code == 2, result.output
    line = result.stderr.strip().splitlines()[-1]
    assert "args" in line and "--force" in line, line
    assert (store.root / "results.jsonl").read_bytes() == before
    assert not (store.root / "cells").exists()


class _GroupEnds:
    """A listener that only counts ``group_ends`` (``step_hooks.StepListener``)."""

    def __init__(self) -> None:
        self.calls = 0

    def group_ends(self) -> None:
        self.calls += 1

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


WORLD = "group.WORLD"  # resolved once the group exists


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((), {}), ((None,), {}), ((), {"group": None}), ((WORLD,), {}), ((), {"group": WORLD})],
    ids=["no-argument", "None", "group=None", "WORLD", "group=WORLD"],
)
def test_destroying_the_default_group_gathers_first_however_it_is_spelled(
    args: Tuple[Any, ...], kwargs: Dict[str, Any]
) -> None:
    """A script that ends at the window's end with ``destroy_process_group(...)``: the figures
    are gathered before the group goes, whichever way the script names the default group; a
    subgroup's destroy is not the job's end."""
    from datetime import timedelta

    import torch.distributed as dist

    from torchscale.script.step_hooks import installed

    listener = _GroupEnds()
    with installed(listener, {}):
        dist.init_process_group(
            "gloo",
            store=dist.HashStore(),  # type: ignore[attr-defined]  # torch re-exports it implicitly
            rank=0,
            world_size=1,
            timeout=timedelta(seconds=60),
        )
        try:
            dist.destroy_process_group(dist.new_group([0]))
            assert listener.calls == 0
        finally:
            world = dist.group.WORLD
            dist.destroy_process_group(
                *(world if a == WORLD else a for a in args),
                **{k: world if v == WORLD else v for k, v in kwargs.items()},
            )
    assert listener.calls == 1
    assert not dist.is_initialized()


@pytest.mark.parametrize("command", ["profile", "tune"])
def test_profile_and_tune_take_the_script_options_benchmark_takes(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--step-at`` and ``--samples-per-step`` reach the script's cells from ``profile`` and
    ``tune`` as from ``benchmark`` (no ``--set script.step_at=...``); the run itself is cut off
    where it would launch. Without ``--script`` they are refused, not ignored."""
    import typer

    from torchscale.app import profile as profile_app
    from torchscale.tune import tune_runner

    seen: Dict[str, Any] = {}

    def capture(request: Any, *args: Any) -> Any:
        seen["config"] = profile_app.capture_config(request)
        raise typer.Exit(7)

    def tune(request: Any, *args: Any) -> Any:
        seen["config"] = request.config
        raise typer.Exit(7)

    monkeypatch.setattr(profile_app, "capture_profile", capture)
    monkeypatch.setattr(tune_runner, "run_tune", tune)
    args = [command, "--gpus", "2", "-o", str(tmp_path / "out")]
    script = ["--script", str(CNN), "--step-at", "forward", "--samples-per-step", "12"]
    result = runner.invoke(app, [*args, *script, "--", "--steps", "300"])
    assert result.exit_code == 7, result.output
    section = seen["config"].kind_section("script")
    assert (section.step_at, section.samples_per_step) == ("forward", 12)
    assert section.args == ["--steps", "300"]
    for option, value in (("--step-at", "forward"), ("--samples-per-step", "12")):
        alone = runner.invoke(app, [*args, "--model", "resnet-tiny", option, value])
        assert alone.exit_code == 2, alone.output
        assert (
            alone.stderr.strip() == f"Error: {option} goes with --script (your own training script)"
        )


PATH_PROBE = """\
import importlib.util, json, sys
found = importlib.util.find_spec("beside_the_working_dir") is not None
json.dump({"path0": sys.path[0], "cwd_module": found}, open(sys.argv[1], "w"))
"""


def test_the_script_gets_the_search_path_python_gives_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wrapped script sees ``sys.path`` as under ``python train.py``: its own folder first,
    and the working directory (which ``python -m torchscale.script.wrap`` put first) not on it,
    so a module there is not importable, as it is not for python."""
    import subprocess
    import sys

    from torchscale.script.wrap import run_script

    work, scripts = tmp_path / "work", tmp_path / "scripts"
    work.mkdir()
    scripts.mkdir()
    (work / "beside_the_working_dir.py").write_text("")
    script = scripts / "train.py"
    script.write_text(PATH_PROBE)
    monkeypatch.chdir(work)
    python = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "python.json")], cwd=work, timeout=60
    )
    assert python.returncode == 0
    expected = json.loads((tmp_path / "python.json").read_text())
    assert expected["path0"] == str(scripts) and expected["cwd_module"] is False
    # as the rank process has it: python -m put the working directory first
    monkeypatch.setattr(sys, "path", [str(work), *sys.path])
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    run_script(str(script), [str(tmp_path / "wrapped.json")])
    assert json.loads((tmp_path / "wrapped.json").read_text()) == expected
