"""The ``backend:`` knob: backends this torch (or node, or launcher) cannot run are recorded as
skipped with the reason, before any launch; ``auto`` keeps the cell ids of older results."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict

import pytest
import torch
import torch.distributed as dist
from typer.testing import CliRunner

from torchscale.cli.app import app
from torchscale.config.settings import CellSettings
from torchscale.launch.backends import backend_skip_reason, resolve_backend
from torchscale.plan.training_cells import cell_id
from torchscale.results.store import ExperimentStore
from torchscale.runtime.process_group import init_distributed

runner = CliRunner()

CONFIG = """\
experiment_name: backends
models: [gpt2-tiny]
batch_sizes: [2]
gpu_counts: [1]
backend: [ucc, mpi, nccl]
warmup_steps: 1
measure_steps: 2
"""


@pytest.mark.skipif(dist.is_ucc_available(), reason="this torch has UCC")
def test_unavailable_backends_are_skipped_with_the_reason(tmp_path: Path) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    result = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output  # skipped cells are results, not errors
    records = {r.settings["backend"]: r for r in ExperimentStore(tmp_path / "backends").records()}
    assert sorted(records) == ["mpi", "nccl", "ucc"]
    assert all(r.status == "skipped" for r in records.values())
    errors = {backend: r.error or "" for backend, r in records.items()}
    assert all(r.error is not None for r in records.values())
    assert errors["ucc"].startswith("backend ucc is not available in this torch;")
    if not dist.is_mpi_available():
        assert errors["mpi"].startswith("backend mpi is not available in this torch;")
    if not (dist.is_nccl_available() and _has_gpus()):
        assert "nccl" in errors["nccl"]
    # nothing was launched: no cell folder holds a launch log
    assert not list((tmp_path / "backends").glob("cells/*/launch.log"))
    printed = json.loads(result.stdout)
    assert {r["status"] for r in printed["records"]} == {"skipped"}


def _has_gpus() -> bool:
    import torch

    return torch.cuda.is_available()


def test_reasons_and_resolution() -> None:
    assert backend_skip_reason("auto", "cpu", "torchrun") is None
    assert backend_skip_reason("gloo", "cpu", "torchrun") is None
    assert backend_skip_reason("nccl", "cpu", "torchrun") in (
        "backend nccl needs CUDA GPUs; this node has none (use gloo or auto)",
        "backend nccl is not available in this torch; it needs CUDA GPUs and a torch built with "
        "NCCL (the CUDA wheels)",
    )
    if dist.is_mpi_available():
        reason = backend_skip_reason("mpi", "cpu", "torchrun")
        assert reason is not None and "--launcher mpirun" in reason
    assert resolve_backend("auto", cuda=True) == "nccl"
    assert resolve_backend("auto", cuda=False) == "gloo"
    assert resolve_backend("gloo", cuda=True) == "gloo"


def test_auto_keeps_cell_ids_and_other_backends_change_them() -> None:
    base: Dict[str, Any] = {"model": "gpt2-tiny", "batch_size": 4, "gpus": 2}
    auto = cell_id(CellSettings(**base))
    assert auto == cell_id(CellSettings(**base, backend="auto"))
    # the id these settings had before the knob existed: --resume still finds old results
    assert auto == "gpt2-tiny-b4-g2-fp32-r0-8826b216"
    assert cell_id(CellSettings(**base, backend="gloo")) != auto


def test_unknown_backend_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text(CONFIG.replace("[ucc, mpi, nccl]", "hccl"), encoding="utf-8")
    result = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(tmp_path)])
    assert result.exit_code == 2
    assert "backend" in result.output
    assert "'auto', 'nccl', 'gloo', 'ucc', 'ucc/tl/nccl', 'ucc/tl/cuda', 'ucc/tl/ucp' or 'mpi'" in (
        result.output.replace("\n", "")
    )


@pytest.mark.skipif(dist.is_ucc_available(), reason="this torch has UCC")
def test_communication_backends_one_cell_each(tmp_path: Path) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text(
        "experiment_name: comm-backends\ngpu_counts: [2]\n"
        "communication: {collectives: [all_reduce], p2p: false, max_bytes: 4K, backend: [ucc]}\n",
        encoding="utf-8",
    )
    result = runner.invoke(
        app, ["benchmark", "-c", str(config), "-o", str(tmp_path), "--benchmark", "comm"]
    )
    assert result.exit_code == 0, result.output
    records = ExperimentStore(tmp_path / "comm-backends").records()
    assert records and {r.status for r in records} == {"skipped"}
    assert {r.cell_id.split("-r0-")[0] for r in records} == {"comm-g2-ucc"}
    assert all(
        (r.error or "").startswith("backend ucc is not available in this torch;") for r in records
    )
    assert not list((tmp_path / "comm-backends").glob("cells/*/launch.log"))


UCC_VARIABLES = ("UCC_CL_BASIC_TLS", "UCC_TLS")


@pytest.mark.parametrize(
    ("backend", "joined", "selection"),
    [
        ("ucc/tl/nccl", "ucc", {"UCC_CL_BASIC_TLS": "nccl", "UCC_TLS": "nccl,ucp"}),
        ("ucc/tl/cuda", "ucc", {"UCC_CL_BASIC_TLS": "cuda", "UCC_TLS": "cuda,ucp"}),
        ("ucc/tl/ucp", "ucc", {"UCC_CL_BASIC_TLS": "ucp", "UCC_TLS": "ucp"}),
        ("ucc", "ucc", {"UCC_CL_BASIC_TLS": "user's", "UCC_TLS": "user's"}),
        ("gloo", "gloo", {"UCC_CL_BASIC_TLS": "user's", "UCC_TLS": "user's"}),
    ],
)
def test_a_rank_selects_uccs_transport_layer_before_it_joins(
    monkeypatch: pytest.MonkeyPatch, backend: str, joined: str, selection: Dict[str, str]
) -> None:
    """``ucc/tl/<tl>``: the rank joins a UCC group with UCC's transport selection already in its
    environment (UCC reads it at init); any other backend leaves the user's variables alone."""
    seen: Dict[str, Any] = {}

    def init_process_group(backend: str, **kwargs: Any) -> None:
        seen.update(backend=backend, **{name: os.environ.get(name) for name in UCC_VARIABLES})

    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    for name in UCC_VARIABLES:
        monkeypatch.setenv(name, "user's")  # and restored after the test, whatever the rank set
    threads = torch.get_num_threads()
    try:
        ctx = init_distributed(60.0, backend)
    finally:
        torch.set_num_threads(threads)  # a CPU rank takes its slot's threads: not this process's
    assert seen == {"backend": joined, **selection}
    assert ctx.backend == backend  # the records name the layer
