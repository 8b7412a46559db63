"""Config loading, overrides, validation errors and plan expansion (no torch, no launches)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.typed import training_settings
from torchscale.config.loader import load_config, parse_overrides
from torchscale.errors import ConfigError
from torchscale.plan.matrix import expand
from torchscale.plan.training_cells import cell_id
from torchscale.results.layout import experiment_dirname

SEED_CONFIG = """\
experiment_name: "resnet50_scaling_test"
models:
  - "resnet50"
  - "bert-large"
batch_sizes:
  - 64
  - 128
  - 256
gpu_counts:
  - 1
  - 2
  - 4
  - 8
profiling:
  enabled: true
  tool: "nsys"
  trigger: "sync_stall_detection"
"""


def write(tmp_path: Path, text: str, name: str = "bench.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_seed_config_loads_as_written(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, SEED_CONFIG))
    assert config.experiment_name == "resnet50_scaling_test"
    assert config.models == ["resnet50", "bert-large"]
    assert config.batch_sizes == [64, 128, 256]
    assert config.gpu_counts == [1, 2, 4, 8]
    assert config.profiling.enabled and config.profiling.tool == "nsys"
    assert config.profiling.trigger == "sync_stall_detection"
    plan = expand(config)
    assert len(plan) == 2 * 3 * 4
    # GPU count innermost: each model/batch's 1-GPU baseline runs first.
    assert [c.settings.gpus for c in plan.cells[:4]] == [1, 2, 4, 8]
    assert {training_settings(c).model for c in plan.cells} == {"resnet50", "bert-large"}


def test_any_knob_given_as_list_expands_into_the_product(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "models: [gpt2]\nbatch_sizes: 8\ngpu_counts: [1, 2]\n"
        "precision: [fp32, bf16]\nddp:\n  bucket_cap_mb: [25, 50, 100]\n",
    )
    plan = expand(load_config(path))
    assert len(plan) == 2 * 2 * 3
    combos = {
        (
            training_settings(c).precision,
            training_settings(c).ddp.bucket_cap_mb,
            training_settings(c).gpus,
        )
        for c in plan
    }
    assert len(combos) == 12
    assert set(plan.swept) == {"precision", "ddp.bucket_cap_mb", "gpu_counts"}
    assert experiment_dirname(plan.config.experiment_name) == "bench"  # defaults to file stem


def test_seq_len_sweep_does_not_duplicate_image_model_cells(tmp_path: Path) -> None:
    path = write(tmp_path, "models: [resnet50, gpt2]\nbatch_sizes: 8\nseq_len: [128, 512]\n")
    plan = expand(load_config(path))
    assert sorted(training_settings(c).model for c in plan.cells) == ["gpt2", "gpt2", "resnet50"]
    assert [
        training_settings(c).seq_len for c in plan.cells if training_settings(c).model == "resnet50"
    ] == [None]


def test_repeats_interleave_and_cell_ids_are_stable(tmp_path: Path) -> None:
    path = write(tmp_path, "models: [gpt2]\nbatch_sizes: 8\ngpu_counts: [1, 2]\nrepeats: 2\n")
    plan = expand(load_config(path))
    assert [(c.settings.repeat, c.settings.gpus) for c in plan] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    again = expand(load_config(path))
    assert [c.cell_id for c in plan] == [c.cell_id for c in again]
    assert len({c.cell_id for c in plan}) == 4
    assert plan.cells[0].cell_id.startswith("gpt2-b8-g1-fp32-r0-")
    # The timeout does not change what a cell measures, so it does not change its id (resume).
    longer = training_settings(plan.cells[0]).model_copy(update={"cell_timeout_s": 99.0})
    assert cell_id(longer) == plan.cells[0].cell_id


def test_overrides_set_and_seed_style(tmp_path: Path) -> None:
    path = write(tmp_path, "models: [gpt2]\nbatch_sizes: 8\n")
    overrides = parse_overrides(
        ["ddp.bucket_cap_mb=50", "precision=[fp32, fp16]"],
        ["--ddp.static_graph=true", "--warmup-steps", "3", "--data.num_workers=4"],
    )
    plan = expand(load_config(path, overrides))
    settings = training_settings(plan.cells[0])
    assert settings.ddp.bucket_cap_mb == 50.0
    assert settings.ddp.static_graph is True
    assert settings.warmup_steps == 3
    assert settings.data.num_workers == 4
    assert [training_settings(c).precision for c in plan] == ["fp32", "amp"]  # fp16 is amp


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models: [resnet5]\n", "unknown model 'resnet5': did you mean 'resnet50'?"),
        (
            "models: [gpt2]\nbatch_sizes: [8, -1]\n",
            "batch_sizes[1]: Input should be greater than 0",
        ),
        ("models: [gpt2]\nbatch_sizes: -4\n", "batch_sizes: Input should be greater than 0"),
        ("models: [gpt2]\nprecison: bf16\n", "unknown key 'precison' (did you mean 'precision'?)"),
        ("models: [gpt2]\nddp: {bucket_cap: 3}\n", "unknown key 'ddp.bucket_cap' (did you mean"),
        ("models: [gpt2]\nprecision: fp8\n", "precision: Input should be 'fp32', 'amp' or 'bf16'"),
        ("models: [gpt2]\nmeasure_steps: 5\nmeasure_seconds: 2\n", "not both"),
        ("models: [gpt2]\ndata: {source: image_folder}\n", "needs data.path"),
        (
            "models: [gpt2]\ncompile: true\nddp: {bucket_cap_mb: 0.5}\n",
            "compile: true needs ddp.bucket_cap_mb >= 1",
        ),
        ("models: []\n", "'models' is empty"),
        ("models: [gpt2\n", "is not valid YAML at line 2"),
        ("- a\n- b\n", "must be a YAML mapping"),
        ("", "is empty"),
    ],
)
def test_bad_config_gives_one_line_error(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        expand(load_config(path))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_bad_overrides(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not key=value"):
        parse_overrides(["ddp.bucket_cap_mb"])
    with pytest.raises(ConfigError, match="has no value"):
        parse_overrides([], ["--ddp.static_graph"])
    with pytest.raises(ConfigError, match="unexpected argument 'stray'"):
        parse_overrides([], ["stray"])
    path = write(tmp_path, "models: [gpt2]\n")
    with pytest.raises(ConfigError, match=r"unknown key 'ddp\.bucket'"):
        load_config(path, parse_overrides(["ddp.bucket=1"]))


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_custom_model_names_are_accepted_without_import(tmp_path: Path) -> None:
    path = write(tmp_path, "models: ['mypkg.models:build_net']\n")
    plan = expand(load_config(path))
    assert plan.cells[0].cell_id.startswith("mypkg-models-build-net-b32-g1-")


def test_docs_config_reference_is_current() -> None:
    from torchscale.config.reference import reference_markdown

    docs = Path(__file__).parents[1] / "docs" / "config.md"
    assert docs.read_text() == reference_markdown(), (
        "docs/config.md is stale: run python -m torchscale.config.reference > docs/config.md"
    )
    for key in ("`ddp.bucket_cap_mb`", "`measure_seconds`", "`profiling.trigger`", "`data.source`"):
        assert key in docs.read_text()


@pytest.mark.parametrize(
    "example", sorted((Path(__file__).parents[1] / "examples").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_example_config_loads(example: Path) -> None:
    config = load_config(example)
    assert config.experiment_name == example.stem
