"""``--launcher mpirun``: a real 2-rank cell under Open MPI (ranks from MPI's variables, gloo),
and the pieces that decide ranks and the rendezvous host."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Dict

import pytest
import torch.distributed as dist
from typer.testing import CliRunner

from tests.support.typed import training_records
from torchscale.cli.app import app
from torchscale.launch.mpirun import first_host
from torchscale.results.store import ExperimentStore
from torchscale.runtime.mpi_env import adopt_mpi_environment

runner = CliRunner()
CONFIG = """\
experiment_name: mpi
models: [gpt2-tiny]
batch_sizes: [2]
gpu_counts: [2]
backend: [gloo, mpi]
warmup_steps: 1
measure_steps: 4
sync_probe_steps: 2
cell_timeout_s: 180
"""


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="needs mpirun (apt-get install openmpi-bin)"
)
def test_two_ranks_under_mpirun(tmp_path: Path) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    result = runner.invoke(
        app, ["benchmark", "-c", str(config), "-o", str(tmp_path), "--launcher", "mpirun"]
    )
    assert result.exit_code == 0, result.output
    store = ExperimentStore(tmp_path / "mpi")
    records = {r.settings["backend"]: r for r in training_records(store.records())}
    gloo = records["gloo"]
    assert gloo.status == "ok", gloo.error
    assert gloo.throughput is not None
    assert gloo.world_size == 2 and gloo.backend == "gloo" and gloo.throughput > 0
    assert [(r.rank, r.local_rank) for r in gloo.per_rank] == [(0, 0), (1, 1)]
    assert all(len(r.step_times_ms) == 4 for r in gloo.per_rank)
    assert store.manifest()["launch"]["launcher"] == "mpirun"
    log = (store.cell_dir(gloo.cell_id) / "launch.log").read_text(encoding="utf-8")
    assert "torchrun_agent" not in log and "torchelastic" not in log.lower()
    if not dist.is_mpi_available():
        assert records["mpi"].status == "skipped" and records["mpi"].error is not None
        assert records["mpi"].error.startswith("backend mpi is not available in this torch;")


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")
def test_dry_run_shows_the_mpirun_command(tmp_path: Path) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    result = runner.invoke(
        app,
        ["benchmark", "-c", str(config), "-o", str(tmp_path / "out"), "--launcher", "mpirun",
         "--rdzv-endpoint", "node0:29555", "--mpirun-arg=--mca=btl_tcp_if_include=lo",
         "--dry-run", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    command = next(c["command"] for c in plan if c["settings"]["backend"] == "gloo")
    mpirun = shutil.which("mpirun")
    assert mpirun is not None and command.startswith(mpirun + " -np 2 ")
    assert "-x MASTER_ADDR=node0 -x MASTER_PORT=29555" in command
    assert "--mca=btl_tcp_if_include=lo" in command
    assert " -m torchscale.worker --cell " in command
    assert not (tmp_path / "out").exists()


def test_missing_mpirun_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    monkeypatch.setenv("PATH", str(tmp_path))  # no mpirun anywhere
    result = runner.invoke(
        app, ["benchmark", "-c", str(config), "-o", str(tmp_path / "out"), "--launcher", "mpirun"]
    )
    assert result.exit_code == 2
    assert "--launcher mpirun needs mpirun on PATH: install Open MPI or MPICH" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (
            {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
             "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
            ("5", "8", "1", "4"),
        ),
        (
            {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
            ("3", "4", "1", "2"),
        ),
        ({"PMIX_RANK": "2", "PMI_SIZE": "3"}, ("2", "3", "0", "1")),
    ],
)  # fmt: skip
def test_ranks_from_mpi_variables(environ: Dict[str, str], expected: tuple) -> None:
    env = dict(environ)
    assert adopt_mpi_environment(env)
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    assert tuple(env[name] for name in names) == expected


def test_torchrun_variables_win() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
    assert not adopt_mpi_environment(env)
    assert env["RANK"] == "1"
    assert not adopt_mpi_environment({"PATH": os.environ.get("PATH", "")})


def test_rendezvous_host_is_the_first_mpi_host(tmp_path: Path) -> None:
    assert first_host(["--host", "gpu01:8,gpu02:8"]) == "gpu01"
    assert first_host(["-H=gpu03,gpu04"]) == "gpu03"
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# cluster\n\ngpu07 slots=8\ngpu08 slots=8\n", encoding="utf-8")
    assert first_host(["--hostfile", str(hostfile)]) == "gpu07"
    assert first_host(["--mca", "btl", "tcp"]) is None
