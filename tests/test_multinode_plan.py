"""Cells across nodes without launching: the plan, the launch's place, commands, node scaling."""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path
from typing import List, Optional

import pytest
from typer.testing import CliRunner

from torchscale.analysis.node_scaling import node_scaling
from torchscale.analysis.training_tables import training_table
from torchscale.cli.app import app
from torchscale.config.loader import load_config
from torchscale.errors import ConfigError, TorchscaleError
from torchscale.launch.cell import cell_command
from torchscale.launch.multinode import (
    Launch,
    NodeStore,
    merge_node_environments,
    resolve_launch,
)
from torchscale.plan.matrix import Plan, expand
from torchscale.results.schema import TrainingResult

runner = CliRunner()


def plan_of(tmp_path: Path, text: str, gpus_per_node: Optional[int] = None) -> Plan:
    config = tmp_path / "c.yaml"
    config.write_text("experiment_name: nodes\nmodels: [gpt2-tiny]\nbatch_sizes: [2]\n" + text)
    return expand(load_config(config, []), gpus_per_node=gpus_per_node)


def shapes(plan: Plan) -> List[tuple]:
    return [(c.settings.gpus, c.settings.nnodes, c.settings.nproc_per_node) for c in plan.cells]


def test_gpus_per_node_splits_counts_above_one_node(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "gpu_counts: [1, 8, 16, 32]\ngpus_per_node: 8\n")
    assert shapes(plan) == [(1, 1, 1), (8, 1, 8), (16, 2, 8), (32, 4, 8)]
    ids = [c.cell_id for c in plan.cells]
    assert "-g16-n2-" in ids[2] and "-n" not in ids[1].split("-g8-")[1].split("-")[0]
    # The launch's node size applies when the config gives none; the config's wins.
    assert shapes(plan_of(tmp_path, "gpu_counts: [2, 4]\n", 2)) == [(2, 1, 2), (4, 2, 2)]
    assert shapes(plan_of(tmp_path, "gpu_counts: [4]\ngpus_per_node: 4\n", 2)) == [(4, 1, 4)]
    assert shapes(plan_of(tmp_path, "gpu_counts: [4]\n")) == [(4, 1, 4)]


def test_nodes_list_spreads_each_count_and_leaves_out_uneven_ones(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "gpu_counts: [1, 2, 4]\nnodes: [1, 2]\n")
    assert shapes(plan) == [(1, 1, 1), (2, 1, 2), (2, 2, 1), (4, 1, 4), (4, 2, 2)]
    assert "nodes" in plan.swept
    # Order follows the list: nodes [2, 1] runs each 2-node cell first.
    assert shapes(plan_of(tmp_path, "gpu_counts: [4]\nnodes: [2, 1]\n")) == [(4, 2, 2), (4, 1, 4)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu_counts: [8, 12]\ngpus_per_node: 8\n",
         "gpu_counts 12 is not a multiple of 8 GPUs per node"),
        ("gpu_counts: [1, 2]\nnodes: [2]\n",
         "gpu_counts 1 cannot be spread evenly over any of nodes [2]"),
    ],
)  # fmt: skip
def test_uneven_node_splits_are_config_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        plan_of(tmp_path, text)


def test_nodes_and_gpus_per_node_together_is_a_one_line_cli_error(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("experiment_name: x\nmodels: [gpt2-tiny]\nnodes: [1, 2]\ngpus_per_node: 4\n")
    result = runner.invoke(app, ["benchmark", "-c", str(config), "--dry-run"])
    assert result.exit_code == 2
    assert "give 'nodes' or 'gpus_per_node', not both" in result.stderr
    assert "Traceback" not in result.output


def test_launch_from_flags_or_from_torchrun_variables() -> None:
    env = {"PET_NNODES": "4", "PET_NODE_RANK": "3", "PET_RDZV_ENDPOINT": "n0:29500"}
    launch = resolve_launch(
        nnodes=None, node_rank=None, endpoint=None, run_id=None, join_timeout_s=300,
        experiment="exp", environ={**env, "PET_RDZV_ID": "job7"},
    )  # fmt: skip
    assert (launch.nnodes, launch.node_rank, launch.endpoint, launch.run_id) == (
        4, 3, "n0:29500", "job7",
    )  # fmt: skip
    flags = resolve_launch(
        nnodes=2, node_rank=0, endpoint=None, run_id=None, join_timeout_s=300,
        experiment="exp", environ={"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "1234"},
    )  # fmt: skip
    assert (flags.endpoint, flags.run_id, flags.records_results) == (
        "10.0.0.5:1234", "torchscale-exp", True,
    )  # fmt: skip
    default_port = resolve_launch(
        nnodes=2, node_rank=1, endpoint="[fe80::1]", run_id="r", join_timeout_s=9,
        experiment="e", environ={},
    )  # fmt: skip
    assert default_port.endpoint == "[fe80::1]:29400" and not default_port.records_results


@pytest.mark.parametrize(
    ("kwargs", "environ", "message"),
    [
        ({"nnodes": 2}, {}, "--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
        ({"nnodes": 2, "node_rank": 2, "endpoint": "h:1"}, {}, "--node-rank 2 is out of range"),
        ({}, {"PET_NNODES": "1:2"}, "PET_NNODES='1:2' is not a whole number"),
        ({"nnodes": 2, "endpoint": "h:port"}, {}, "rendezvous endpoint 'h:port' is not HOST:PORT"),
    ],
)
def test_bad_launches_are_one_line_errors(kwargs: dict, environ: dict, message: str) -> None:
    args = {"nnodes": None, "node_rank": None, "endpoint": None, "run_id": None, **kwargs}
    with pytest.raises(TorchscaleError, match=message.replace("[", r"\[")):
        resolve_launch(**args, join_timeout_s=60, experiment="e", environ=environ)


def test_each_node_joins_each_cell_under_its_own_rendezvous_id(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "gpu_counts: [2, 4]\nnodes: [1, 2]\ncell_timeout_s: 100\n")
    cells = {(c.settings.gpus, c.settings.nnodes): c for c in plan.cells}
    node1 = Launch(nnodes=2, node_rank=1, endpoint="n0:29400", run_id="run", join_timeout_s=60)
    assert [node1.visits(c) for c in plan.cells] == [False, True, False, True]
    assert all(Launch(nnodes=2, endpoint="n0:1").visits(c) for c in plan.cells)
    # Node 1 may wait for node 0's one-node cells in between: their timeouts plus kill grace.
    waits = node1.join_waits(plan.cells)
    grace = 2 * 5.0
    assert waits == {
        cells[(2, 2)].cell_id: 60 + 100 + grace,
        cells[(4, 2)].cell_id: 60 + 100 + grace,
    }
    assert Launch(nnodes=2, endpoint="n0:1", join_timeout_s=60).join_waits(plan.cells) == {
        cells[(2, 2)].cell_id: 60, cells[(4, 2)].cell_id: 60,
    }  # fmt: skip
    cell = cells[(4, 2)]
    store = NodeStore(tmp_path / "exp", 1)
    cmd = cell_command(cell, store.cell_dir(cell.cell_id), node1.rendezvous(cell, 170.0))
    assert cmd[3:11] == [
        "--nproc-per-node=2",
        "--nnodes=2",
        "--node-rank=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=n0:29400",
        f"--rdzv-id=run-{cell.cell_id}",
        "--rdzv-conf=is_host=false,join_timeout=170,read_timeout=170",
        "--max-restarts=0",
    ]
    assert f"--log-dir={tmp_path}/exp/cells/{cell.cell_id}/node1/torchrun" in cmd
    single = cell_command(cells[(2, 1)], tmp_path, node1.rendezvous(cells[(2, 1)]))
    assert single[3:6] == ["--nproc-per-node=2", "--standalone", "--nnodes=1"]


def test_other_nodes_write_only_their_own_subfolder(tmp_path: Path) -> None:
    store = NodeStore(tmp_path / "exp", 2)
    assert store.cell_dir("c1") == tmp_path / "exp" / "cells" / "c1" / "node2"
    assert store.lock_path == tmp_path / "exp" / ".lock-node2"
    with pytest.raises(RuntimeError, match="must not write the manifest"):
        store.write_manifest({})
    with pytest.raises(RuntimeError, match="must not record results"):
        store.append(None)


def test_dry_run_on_node_one_lists_only_its_cells(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHSCALE_CPU_SLOTS", "4")  # each node fits 4 ranks: no cell skipped
    config = tmp_path / "c.yaml"
    config.write_text(
        "experiment_name: two\nmodels: [gpt2-tiny]\ngpu_counts: [2, 4, 8]\nnodes: [1, 2]\n"
    )
    result = runner.invoke(
        app,
        ["benchmark", "-c", str(config), "-o", str(tmp_path), "--dry-run", "--json",
         "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "head:29555"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    entries = json.loads(result.stdout)
    assert [(e["settings"]["gpus"], e["settings"]["nnodes"]) for e in entries] == [
        (2, 2), (4, 2), (8, 2),
    ]  # fmt: skip
    assert all("--node-rank=1 --rdzv-backend=c10d --rdzv-endpoint=head:29555" in e["command"]
               for e in entries)  # fmt: skip
    assert all("/node1/cell.json" in e["command"] for e in entries)


def test_node_zero_refuses_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        launch = Launch(nnodes=2, endpoint=f"127.0.0.1:{port}")
        with (
            pytest.raises(
                TorchscaleError, match=f"cannot host the rendezvous store on port {port}"
            ),
            launch.serve(),
        ):
            pass


def test_manifest_keeps_one_entry_per_host() -> None:
    manifest: dict = {"nodes": [{"host": "b", "gpus": 8}]}
    assert merge_node_environments(manifest, [{"host": "a", "gpus": 8}, {"host": "b", "gpus": 8}])
    assert [n["host"] for n in manifest["nodes"]] == ["a", "b"]
    assert not merge_node_environments(manifest, [{"host": "a", "gpus": 8}])
    assert not merge_node_environments(manifest, None)


def record(gpus: int, nnodes: int, rate: float, repeat: int = 0) -> TrainingResult:
    settings = {"model": "m", "batch_size": 8, "gpus": gpus, "nnodes": nnodes, "repeat": repeat}
    return TrainingResult(
        cell_id=f"m-g{gpus}-n{nnodes}-r{repeat}", experiment="e", status="ok", world_size=gpus,
        nnodes=nnodes, nproc_per_node=gpus // nnodes, model="m", batch_size=8,
        global_batch_size=8 * gpus, precision="fp32", samples_per_s=rate, repeat=repeat,
        hosts=[f"h{i}" for i in range(nnodes)], settings=settings,
    )  # fmt: skip


def test_node_scaling_splits_efficiency_into_intra_and_inter_node() -> None:
    rates = {(1, 1): 100.0, (4, 1): 360.0, (8, 2): 600.0, (4, 2): 330.0, (16, 4): 1000.0}
    records = [record(g, n, r) for (g, n), r in rates.items()]
    records.append(record(8, 2, 640.0, repeat=1))
    table = node_scaling(training_table(records))
    row = table[(table["world_size"] == 8)].iloc[0]
    two_node_rate = (600.0 + 640.0) / 2  # repeats averaged
    assert row["samples_per_s"] == pytest.approx(two_node_rate)
    assert row["intra_node_efficiency"] == pytest.approx(360.0 / (4 * 100.0))
    assert row["inter_node_efficiency"] == pytest.approx(two_node_rate / (2 * 360.0))
    assert row["scaling_efficiency"] == pytest.approx(
        row["intra_node_efficiency"] * row["inter_node_efficiency"]
    )
    assert row["hosts"] == "h0 h1"
    # 4 ranks as 2 x 2 compare with the 1 x 2 cell, which was not measured.
    two_by_two = table[(table["world_size"] == 4) & (table["nnodes"] == 2)].iloc[0]
    assert math.isnan(two_by_two["inter_node_efficiency"])
    one_node = table[(table["world_size"] == 4) & (table["nnodes"] == 1)].iloc[0]
    assert one_node["inter_node_efficiency"] == pytest.approx(1.0)


def test_same_gpu_count_on_more_nodes_is_not_the_baseline() -> None:
    table = training_table([record(2, 2, 150.0), record(2, 1, 190.0), record(4, 2, 300.0)])
    by_shape = {(r.world_size, r.nnodes): r for r in table.itertuples()}
    assert by_shape[(2, 1)].scaling_efficiency == pytest.approx(1.0)
    assert by_shape[(2, 2)].scaling_efficiency == pytest.approx(150.0 / 190.0)
    assert by_shape[(4, 2)].scaling_efficiency == pytest.approx(300.0 / (2 * 190.0))
