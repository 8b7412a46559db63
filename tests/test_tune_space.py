"""``torchscale tune`` without launches: the search space, bad input, and the pasted snippet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
from typer.testing import CliRunner

from torchscale.cli.app import app
from torchscale.config.settings import CellSettings
from torchscale.config.tune_section import TuneSection, ValueRange
from torchscale.errors import ConfigError
from torchscale.tune.space import Where, build_space
from torchscale.tune.tune_outputs import ddp_snippet, describe_params, reproducing_config

runner = CliRunner()
CPU = Where("cpu", synthetic_data=True, conv_model=True)
CUDA_FILES = Where("cuda", synthetic_data=False, conv_model=True)


def baseline(**settings: Any) -> CellSettings:
    return CellSettings.model_validate({"model": "resnet-tiny", "batch_size": 8, "gpus": 2,
                                        **settings})  # fmt: skip


def section(**fields: Any) -> TuneSection:
    return TuneSection.model_validate(fields)


def test_default_space_keeps_the_math_and_leaves_out_what_cannot_act_here() -> None:
    space = build_space(baseline(ddp={"bucket_cap_mb": 1}), section(), [], CPU)
    names = [k.name for k in space.knobs]
    assert names == ["ddp.bucket_cap_mb", "ddp.gradient_as_bucket_view", "ddp.static_graph",
                     "ddp.broadcast_buffers", "channels_last", "strategy",
                     "reshard_after_forward", "compile", "optimizer_impl"]  # fmt: skip
    assert "CUDA" in space.left_out["cudnn_benchmark"]
    assert "synthetic" in space.left_out["data.num_workers"]
    assert space.left_out["precision"] == "changes the numerics: searched with --allow precision"
    assert isinstance(space.candidates["ddp.bucket_cap_mb"], tuple)
    assert space.candidates["ddp.bucket_cap_mb"][0] == 1.0  # the baseline first
    assert space.baseline_params()["ddp.bucket_cap_mb"] == 1.0
    # On a GPU node with a real data loader, the CUDA and loader knobs join.
    gpu = build_space(baseline(data={"source": "image_folder", "path": "x"}), section(), [],
                      CUDA_FILES)  # fmt: skip
    assert {"cudnn_benchmark", "compile_mode", "data.num_workers", "data.pin_memory"} <= {
        k.name for k in gpu.knobs
    }


def test_allow_search_and_space_shape_the_space() -> None:
    space = build_space(
        baseline(),
        section(search=["ddp.bucket_cap_mb"], space={"precision": ["bf16"]},
                allow=["precision"]),
        ["grad_accum_steps"],
        CPU,
    )  # fmt: skip
    assert [k.name for k in space.knobs] == ["ddp.bucket_cap_mb", "precision", "grad_accum_steps"]
    assert space.candidates["precision"] == ("fp32", "bf16")
    assert "GLOBAL BATCH" in space.changes({"grad_accum_steps": 2})["grad_accum_steps"]
    assert space.grid() is not None and len(space.grid() or []) == 7 * 2 * 3


def test_a_range_is_sampled_by_optuna_inside_its_bounds() -> None:
    import optuna

    space = build_space(
        baseline(ddp={"bucket_cap_mb": 4}),
        section(search=["ddp.bucket_cap_mb"],
                space={"ddp.bucket_cap_mb": {"low": 1, "high": 400, "log": True}}),
        [],
        CPU,
    )  # fmt: skip
    assert isinstance(space.candidates["ddp.bucket_cap_mb"], ValueRange)
    assert space.grid() is None  # continuous: TPE, not an enumerated grid
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    values: List[Any] = [space.suggest(study.ask())["ddp.bucket_cap_mb"] for _ in range(20)]
    assert all(1 <= v <= 400 for v in values) and len(set(values)) == 20


def test_conditional_compile_mode_only_with_compile() -> None:
    space = build_space(baseline(), section(search=["compile", "compile_mode"]), [], CUDA_FILES)
    grid = space.grid() or []
    assert {"compile": False} in grid
    assert sum(1 for p in grid if p.get("compile")) == 3  # three modes, only when compiled
    assert len(grid) == 4


@pytest.mark.parametrize(
    ("tune", "allow", "message"),
    [
        ({"search": ["ddp.bucket_cap"]}, [], "did you mean 'ddp.bucket_cap_mb'"),
        ({"space": {"precision": ["bf16"]}}, [], "add --allow precision"),
        ({}, ["bucket_cap_mb"], "--allow 'bucket_cap_mb' is not a knob that needs allowing"),
        (
            {"space": {"ddp.bucket_cap_mb": {"low": 30, "high": 50}}},
            [],
            "does not hold the baseline",
        ),
        ({"space": {"ddp.bucket_cap_mb": [-1]}}, [], "tune.space.ddp.bucket_cap_mb"),
    ],
)
def test_bad_space_is_one_line(tune: Dict, allow: list, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_space(baseline(), section(**tune), allow, CPU)


NO_TORCH = """
import sys
from typer.testing import CliRunner
from torchscale.cli.app import app
result = CliRunner().invoke(app, {args!r})
heavy = sorted(m for m in ("torch", "optuna", "pandas") if m in sys.modules)
print(result.exit_code, heavy, result.output.strip().splitlines()[-1] if result.output else "")
"""


@pytest.mark.parametrize(
    ("yaml_text", "extra", "message"),
    [
        ("models: [resnet-tiny]\ntune:\n  search: [ddp.bucket_cap]\n", [],
         "did you mean 'ddp.bucket_cap_mb'"),
        ("models: [resnet-tiny]\ntune:\n  repeats: 0\n", [], "tune.repeats"),
        ("models: [resnet-tiny]\n", ["--budget", "soon"], "--budget 'soon' is not a duration"),
        ("models: [resnet-tiny]\n", ["--allow", "bogus"], "--allow 'bogus'"),
    ],
)  # fmt: skip
def test_tune_input_errors_exit_2_without_torch(
    tmp_path: Path, yaml_text: str, extra: list, message: str
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml_text)
    args = ["tune", "-c", str(config), "-o", str(tmp_path / "out"), *extra]
    code = NO_TORCH.format(args=args)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("2 [] Error: "), out.stdout
    assert message in out.stdout
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_a_swept_config_names_what_to_pin(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("models: [resnet-tiny, gpt2-tiny]\nddp:\n  bucket_cap_mb: [1, 25]\n")
    result = runner.invoke(app, ["tune", "-c", str(config), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "the config sweeps ddp.bucket_cap_mb, models: pick one with --model" in result.output
    assert "Traceback" not in result.output


def test_snippet_and_best_yaml_carry_the_winner() -> None:
    settings = baseline(
        channels_last=True, compile=True, optimizer_impl="fused",
        ddp={"bucket_cap_mb": 100, "comm_hook": "bf16"},
    ).model_dump(mode="json")  # fmt: skip
    text = ddp_snippet(settings, "header")
    compile(text, "ddp.py", "exec")
    assert "bucket_cap_mb=100.0," in text and "bf16_compress_hook" in text
    assert "torch.channels_last" in text and "torch.compile(model)" in text
    assert "fused=True" in text
    raw: Dict[str, Any] = {"experiment_name": "x", "models": ["a", "b"], "ddp": {"bucket_cap_mb": 1},
           "tune": {"finalists": 1}}  # fmt: skip
    best = reproducing_config(raw, {"models": ["a"]}, {"ddp.bucket_cap_mb": 100}, "x-best")
    assert best == {"experiment_name": "x-best", "models": ["a"], "ddp": {"bucket_cap_mb": 100}}
    assert raw["ddp"]["bucket_cap_mb"] == 1  # the user's mapping is left as it was
    assert describe_params({"ddp.bucket_cap_mb": 100, "ddp.static_graph": True}) == (
        "bucket_cap_mb=100, static_graph=true"
    )
