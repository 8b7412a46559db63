"""Other tools' config files as written (no launches): DDLB's config.json (copied verbatim into
tests/data/ddlb), the GPU Training Benchmark Suite's YAML layout and ``--key.subkey=value``
overrides, distributed_benchmarks.py's ``--warmup/--iters``, UCC transport-layer backends; every
alias said in one line (docs/seeds.md names each tool)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch.distributed as dist
from typer.testing import CliRunner

from tests.support.typed import training_settings
from torchscale.cli.app import app
from torchscale.comm.config import comm_section
from torchscale.comm.plan import comm_cell_id, comm_settings
from torchscale.config.foreign_layouts import SeedFlags
from torchscale.config.loader import load_config, parse_overrides
from torchscale.errors import ConfigError
from torchscale.launch.backends import (
    backend_env,
    backend_skip_reason,
    process_group_backend,
    resolve_backend,
)
from torchscale.plan.matrix import expand

runner = CliRunner()
DDLB_CONFIG = Path(__file__).parent / "data" / "ddlb" / "config.json"

GPU_SUITE_YAML = """\
model:
  name: resnet-tiny
  channels_last: true
data:
  source: cifar100
  path: {data}
  batch_size: 128
  num_workers: 0
training:
  epochs: 1
  precision: amp
  seed: 42
  cudnn_benchmark: true
benchmark:
  warmup_steps: 20
  measure_steps: 200
  log_step_times: true
  sync_cuda: false
"""


def _notes(caplog: pytest.LogCaptureFixture) -> List[str]:
    return [r.getMessage() for r in caplog.records if r.name == "torchscale"]


def test_ddlb_config_json_as_written_maps_onto_tp_gemm_cells(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["benchmark", "-c", str(DDLB_CONFIG), "-o", str(tmp_path), "--dry-run", "--json"]
    )
    assert result.exit_code == 0, result.output
    planned = json.loads(result.stdout)
    assert [cell["settings"]["backend"] for cell in planned] == [
        "nccl", "ucc/tl/nccl", "ucc/tl/cuda",
    ]  # fmt: skip
    assert [cell["cell_id"].split("-r0-")[0] for cell in planned] == [
        "comm-g2-nccl", "comm-g2-ucc-tl-nccl", "comm-g2-ucc-tl-cuda",
    ]  # fmt: skip
    for cell in planned:
        settings = cell["settings"]
        assert settings["gpus"] == 2 and settings["collectives"] == [] and not settings["p2p"]
        assert (settings["warmup"], settings["iterations"], settings["check"]) == (5, 50, True)
        assert settings["compute_only"] == ["unsharded"]
        cases = {(c["m"], c["n"], c["k"], c["dtype"], c["order"]) for c in settings["tp_gemm"]}
        assert cases == {(65536, 1024, 1024, "float32", o) for o in ("AG_before", "AG_after")}
        if not dist.is_ucc_available() and settings["backend"].startswith("ucc"):
            assert cell["skip_reason"].startswith(
                f"backend {settings['backend']} is not available in this torch; install a torch "
                "built with UCC"
            )
    shown = result.stderr.replace("\n", " ")
    for theirs, ours in [
        ("benchmark.m", "communication.tp_gemm.m"),
        ("benchmark.dtype", "communication.tp_gemm.dtype"),
        ("benchmark.validate", "communication.check"),
        ("benchmark.num_iterations", "communication.iterations"),
        ("benchmark.num_warmups", "communication.warmup"),
        ("benchmark.primitive tp_columnwise", "communication.tp_gemm"),
        ("benchmark.implementations.pytorch[].backend [nccl, ucc/tl/nccl, ucc/tl/cuda]",
         "communication.backend"),
        ("benchmark.implementations.pytorch[].order [AG_before, AG_after]",
         "communication.tp_gemm.orders"),
        ("benchmark.implementations.compute_only[].size [unsharded]",
         "communication.tp_gemm.compute_only"),
    ]:  # fmt: skip
        assert f"DDLB's {theirs} is torchscale's {ours}" in " ".join(shown.split())
    assert "gpu_counts is [2], as DDLB's README runs it" in " ".join(shown.split())


def test_ddlb_overrides_in_either_spelling(caplog: pytest.LogCaptureFixture) -> None:
    overrides = parse_overrides(
        ["benchmark.num_iterations=7", "communication.tp_gemm.m=128", "communication.backend=gloo"]
    )
    with caplog.at_level(logging.INFO, logger="torchscale"):
        config = load_config(DDLB_CONFIG, overrides)
    section = comm_section(config)
    assert section is not None and section.tp_gemm is not None
    assert section.iterations == 7 and section.tp_gemm.m == [128] and section.backend == ["gloo"]
    assert section.tp_gemm.n == [1024]  # the file's, untouched
    notes = _notes(caplog)
    assert (
        "DDLB's benchmark.implementations.pytorch[].backend [nccl, ucc/tl/nccl, ucc/tl/cuda]: "
        "communication.backend given beside it is used instead" in notes
    )
    assert "DDLB's benchmark.m is torchscale's communication.tp_gemm.m" not in notes
    sharded = load_config(
        DDLB_CONFIG,
        parse_overrides(["benchmark.implementations.compute_only=[{size: [unsharded, sharded]}]"]),
    )
    gemm = comm_section(sharded).tp_gemm  # type: ignore[union-attr]
    assert gemm is not None and gemm.compute_only == ["unsharded", "sharded"]


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ('"primitive": "tp_rowwise"', "DDLB's benchmark.primitive 'tp_rowwise' is not measured by torchscale: it measures tp_columnwise"),
        ('"primitive": "tp_columnwise", "implementations": {"pytorch": [{"backend": "nccl", "algo": "x"}]}', "unknown key 'benchmark.implementations.pytorch[0].algo' (DDLB's pytorch implementation: torchscale reads backend, order)"),
        ('"primitive": "tp_columnwise", "implementations": {"compute_only": [{"size": "unsharded"}]}', "lists no pytorch entry"),
        ('"primitive": "tp_columnwise", "m": 64, "repeats": 3', "unknown key 'benchmark.repeats' (DDLB's benchmark block"),
        ('"primitive": "tp_columnwise", "implementations": {"pytorch": [{"backend": "hccl"}]}', "communication.backend[0]: Input should be 'auto'"),
    ],
)  # fmt: skip
def test_bad_ddlb_files_are_one_line_exit_2(tmp_path: Path, block: str, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(f'{{"benchmark": {{{block}}}}}')
    result = runner.invoke(app, ["benchmark", "-c", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    assert message in result.output.replace("\n", "")
    assert not (tmp_path / "out").exists()


def test_ddlb_leaves_out_implementations_it_cannot_run_and_says_extra_combinations(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "benchmark": {
                    "primitive": "tp_columnwise", "m": 64, "n": 8, "k": 8,
                    "implementations": {
                        "pytorch": [{"backend": "gloo", "order": "AG_before"},
                                    {"backend": "ucc", "order": "AG_after"}],
                        "fuser": [{"algorithm": ["default"], "backend": ["nccl"]}],
                    },
                }
            }
        )
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="torchscale"):
        config = load_config(path)
    section = comm_section(config)
    assert section is not None and section.backend == ["gloo", "ucc"]
    assert section.tp_gemm is not None and section.tp_gemm.orders == ["AG_before", "AG_after"]
    assert section.tp_gemm.compute_only == []  # DDLB's file asks for no compute-only run
    notes = _notes(caplog)
    assert any("list 2 backend x order combinations" in n and "(2 more)" in n for n in notes)
    assert any(n.startswith("DDLB's benchmark.implementations.fuser is left out") for n in notes)


def test_json_configs_parse_as_json(tmp_path: Path) -> None:
    tabbed = tmp_path / "tabs.json"  # tab-indented JSON is not YAML
    tabbed.write_text('{\n\t"models": ["gpt2"],\n\t"batch_sizes": [1e1]\n}\n')
    assert load_config(tabbed).batch_sizes == [10]
    twice = tmp_path / "twice.json"
    twice.write_text('{"models": ["gpt2"], "models": ["bert"]}')
    with pytest.raises(ConfigError, match="duplicate key 'models'"):
        load_config(twice)
    broken = tmp_path / "broken.json"
    broken.write_text('{"models": ["gpt2"],\n "batch_sizes": [8,]}')
    with pytest.raises(ConfigError, match=r"broken.json is not valid JSON at line 2, column \d+"):
        load_config(broken)


def test_gpu_suite_layout_and_overrides(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "cifar100_resnet50.yaml"
    path.write_text(GPU_SUITE_YAML.format(data=tmp_path / "data"))
    overrides = parse_overrides(
        [], ["--training.precision=bf16", "--data.batch_size=512", "--training.epochs=5"]
    )
    with caplog.at_level(logging.INFO, logger="torchscale"):
        config = load_config(path, overrides)
    assert config.models == ["resnet-tiny"] and config.channels_last == [True]
    assert config.precision == ["bf16"] and config.batch_sizes == [512]
    assert config.epochs == [5] and config.seed == [42] and config.cudnn_benchmark == [True]
    assert config.warmup_steps == [20] and config.measure_steps == [200]
    assert config.sync_cuda == [False]
    assert config.data.source == ["cifar100"] and config.experiment_name == "cifar100_resnet50"
    notes = _notes(caplog)
    for theirs, ours in [
        ("training.precision", "precision"), ("training.epochs", "epochs"),
        ("training.seed", "seed"), ("training.cudnn_benchmark", "cudnn_benchmark"),
        ("data.batch_size", "batch_sizes"), ("model.name", "models"),
        ("model.channels_last", "channels_last"), ("benchmark.warmup_steps", "warmup_steps"),
        ("benchmark.measure_steps", "measure_steps"), ("benchmark.sync_cuda", "sync_cuda"),
    ]:  # fmt: skip
        assert notes.count(f"GPU Training Benchmark Suite's {theirs} is torchscale's {ours}") == 1
    for same in ("data.source", "data.path"):
        assert (
            notes.count(
                f"GPU Training Benchmark Suite's {same} is torchscale's {same} (the same key)"
            )
            == 1
        )
    assert any(
        n.startswith("GPU Training Benchmark Suite's benchmark.log_step_times is not used")
        for n in notes
    )
    (cell,) = expand(config).cells
    assert (training_settings(cell).epochs, training_settings(cell).measure_steps) == (5, 200)
    # the time window, under its GPU Training Benchmark Suite name
    caplog.clear()
    timed_path = tmp_path / "timed.yaml"
    timed_path.write_text(
        GPU_SUITE_YAML.format(data=tmp_path).replace("measure_steps: 200", "measure_seconds: 30")
    )
    with caplog.at_level(logging.INFO, logger="torchscale"):
        timed = load_config(timed_path)
    assert timed.measure_seconds == [30.0] and timed.measure_steps == [None]
    notes = _notes(caplog)
    assert (
        notes.count(
            "GPU Training Benchmark Suite's benchmark.measure_seconds is torchscale's measure_seconds"
        )
        == 1
    )
    # a file in torchscale's own layout has a data section too: nothing said about it
    caplog.clear()
    own = tmp_path / "own.yaml"
    own.write_text(f"models: [resnet-tiny]\ndata: {{source: cifar100, path: {tmp_path}}}\n")
    with caplog.at_level(logging.INFO, logger="torchscale"):
        load_config(own)
    assert not [n for n in _notes(caplog) if n.startswith("GPU Training Benchmark Suite's")]
    # torchscale's own spelling as an override replaces the file's GPU Training Benchmark Suite value
    plain = load_config(path, parse_overrides(["precision=fp32", "measure_seconds=3"]))
    assert plain.precision == ["fp32"]
    with pytest.raises(ConfigError, match="not both"):  # measure_steps stays: both given
        expand(plain)


def test_gpu_suite_yaml_dry_run(tmp_path: Path) -> None:
    data = tmp_path / "data"  # no CIFAR-100 yet: the run would download it, the dry run says so
    path = tmp_path / "cifar100_resnet50.yaml"
    path.write_text(GPU_SUITE_YAML.format(data=data))
    args = ["benchmark", "-c", str(path), "-o", str(tmp_path / "out"), "--dry-run", "--json"]
    result = runner.invoke(
        app, [*args, "--benchmark.warmup_steps=3", "--training.precision", "bf16"]
    )
    assert result.exit_code == 0, result.output
    (cell,) = json.loads(result.stdout)
    settings = cell["settings"]
    assert (settings["model"], settings["batch_size"], settings["precision"]) == (
        "resnet-tiny", 128, "bf16",
    )  # fmt: skip
    assert (settings["epochs"], settings["warmup_steps"], settings["measure_steps"]) == (1, 3, 200)
    assert settings["data"] == {
        "source": "cifar100", "path": str(data), "num_workers": 0, "pin_memory": True,
    }  # fmt: skip
    assert f"CIFAR-100 is not at {data}: the run downloads it there first" in " ".join(
        result.stderr.split()
    )
    assert not data.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("training: {precision: bf16, lr: 0.1}\nmodel: {name: gpt2}\n", "unknown key 'training.lr' (GPU Training Benchmark Suite's layout: torchscale reads training.precision, training.epochs, training.seed, training.cudnn_benchmark"),
        ("model: {name: gpt2}\nprecision: fp32\ntraining: {precision: bf16}\n", "training.precision (GPU Training Benchmark Suite's name for precision) and precision are both given: keep one"),
    ],
)  # fmt: skip
def test_gpu_suite_mistakes_are_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bench.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        expand(load_config(path))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_epochs_on_synthetic_data_are_measured_windows(tmp_path: Path) -> None:
    path = tmp_path / "synthetic_resnet50.yaml"
    path.write_text("model: {name: resnet-tiny}\ntraining: {epochs: 3}\n")
    (cell,) = expand(load_config(path)).cells
    assert (training_settings(cell).epochs, training_settings(cell).measure_steps) == (3, 50)
    path.write_text("model: {name: resnet-tiny}\ndata: {source: cifar100}\ntraining: {epochs: 3}\n")
    (cell,) = expand(load_config(path)).cells  # a dataset's pass has its own length
    assert (training_settings(cell).epochs, training_settings(cell).measure_steps) == (3, None)
    assert (
        training_settings(cell).data.path == "data"
    )  # GPU Training Benchmark Suite's default folder


def test_distributed_benchmarks_warmup_and_iters_flags(tmp_path: Path) -> None:
    path = tmp_path / "bench.yaml"
    path.write_text(
        "models: [gpt2-tiny]\nbatch_sizes: [2]\ngpu_counts: [2]\nmeasure_seconds: 5\n"
        "communication: {collectives: [all_reduce], p2p: false, max_bytes: 4K}\n"
    )
    args = ["-c", str(path), "-o", str(tmp_path / "out"), "--warmup", "20", "--iters", "200"]
    result = runner.invoke(app, ["benchmark", *args, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    by_kind = {("comm" if c["cell_id"].startswith("comm") else "train"): c["settings"]
               for c in json.loads(result.stdout)}  # fmt: skip
    assert (by_kind["train"]["warmup_steps"], by_kind["train"]["measure_steps"]) == (20, 200)
    assert by_kind["train"]["measure_seconds"] is None
    assert (by_kind["comm"]["warmup"], by_kind["comm"]["iterations"]) == (20, 200)
    said = " ".join(result.stderr.split())
    assert (
        said.count(
            "--warmup 20 is warmup_steps and communication.warmup (distributed_benchmarks' flag)"
        )
        == 1
    )
    assert (
        said.count(
            "--iters 200 is measure_steps (replacing measure_seconds) and communication.iterations "
            "(distributed_benchmarks' flag)"
        )
        == 1
    )
    refused = runner.invoke(app, ["benchmark", *args[:4], "--iters", "0", "--dry-run"])
    assert refused.exit_code == 2 and "--iters" in refused.output


def test_ucc_transport_layers() -> None:
    assert backend_env("ucc/tl/nccl") == {"UCC_CL_BASIC_TLS": "nccl", "UCC_TLS": "nccl,ucp"}
    assert backend_env("ucc/tl/ucp") == {"UCC_CL_BASIC_TLS": "ucp", "UCC_TLS": "ucp"}
    assert backend_env("ucc") == {} and backend_env("gloo") == {}
    assert process_group_backend("ucc/tl/cuda") == "ucc"
    assert resolve_backend("ucc/tl/cuda", cuda=True) == "ucc/tl/cuda"  # records name the layer
    reason = backend_skip_reason("ucc/tl/cuda", "cpu", "torchrun")
    if dist.is_ucc_available():
        assert reason is not None and "moves GPU memory only" in reason
        assert backend_skip_reason("ucc/tl/ucp", "cpu", "torchrun") is None
    else:
        assert reason is not None and reason.startswith(
            "backend ucc/tl/cuda is not available in this torch; install a torch built with UCC"
        )
    config = load_config(
        None,
        base={
            "experiment_name": "tl",
            "gpu_counts": [2],
            "communication": {"collectives": ["all_reduce"], "backend": ["ucc/tl/nccl"]},
        },
    )
    (settings,) = comm_settings(config)
    assert comm_cell_id(settings).startswith("comm-g2-ucc-tl-nccl-r0-")


def test_seed_flags_without_a_communication_section_add_none() -> None:
    raw: Dict[str, Any] = {"models": ["gpt2"]}
    notes = SeedFlags(warmup=3, iters=4).apply(raw)
    assert raw == {"models": ["gpt2"], "warmup_steps": 3, "measure_steps": 4}
    assert notes == [
        "--warmup 3 is warmup_steps (distributed_benchmarks' flag)",
        "--iters 4 is measure_steps (distributed_benchmarks' flag)",
    ]
