"""Slurm: node lists, the srun command of a cell, the sbatch script, and a real two-node job.

The recorded environment (``tests/data/slurm``) is what a real two-node allocation's batch script
saw; the real-job test submits the matrix with ``--launcher slurm --submit`` to a two-node Slurm
cluster running in two network namespaces (skipped where Slurm or namespaces are unavailable).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, Iterator

import pytest
from typer.testing import CliRunner

from tests.support.environ import REPO
from torchscale.cli.app import app
from torchscale.config.loader import load_config
from torchscale.errors import TorchscaleError
from torchscale.launch.cell import cell_command
from torchscale.launch.slurm import SlurmAllocation, SlurmLaunch, expand_hostlist
from torchscale.plan.matrix import expand
from torchscale.results.layout import experiment_dir
from torchscale.results.store import ExperimentStore

RECORDED = json.loads((REPO / "tests/data/slurm/sbatch_2nodes_env.json").read_text())["env"]
runner = CliRunner()

MATRIX = """\
experiment_name: slurm-scaling
models: [gpt2-tiny]
batch_sizes: [2]
gpu_counts: [1, 2, 4]
gpus_per_node: 2
cell_timeout_s: 300
"""


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("gpu[01-02]", ["gpu01", "gpu02"]),
        ("gpu[01-03,07],login1", ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]),
        ("node7", ["node7"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("a[1,3],b[2-3]", ["a1", "a3", "b2", "b3"]),
        ("dgx-h100-[001-002]", ["dgx-h100-001", "dgx-h100-002"]),
    ],
)
def test_hostlist_expands_like_scontrol_show_hostnames(hostlist: str, hosts: list) -> None:
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("bad", ["gpu[01-02", "gpu[a-b]", "gpu[1-]"])
def test_unreadable_hostlists_are_one_line_errors(bad: str) -> None:
    with pytest.raises(TorchscaleError, match="cannot read the Slurm node list"):
        expand_hostlist(bad)


@pytest.mark.parametrize(
    ("variable", "value", "gpus"),
    [("SLURM_GPUS_PER_NODE", "8", 8), ("SLURM_GPUS_PER_NODE", "h100:4", 4),
     ("SLURM_GPUS_ON_NODE", "2", 2), ("SLURM_GPUS_PER_NODE", "", None)],
)  # fmt: skip
def test_gpus_per_node_forms(variable: str, value: str, gpus: object) -> None:
    assert SlurmAllocation.from_env({**RECORDED, variable: value}).gpus_per_node == gpus


def test_recorded_allocation_and_srun_command_of_a_two_node_cell(tmp_path: Path) -> None:
    config = tmp_path / "m.yaml"
    config.write_text(MATRIX)
    plan = expand(load_config(config, []))
    launch = SlurmLaunch.from_env(RECORDED, None, 600.0, host="gpu01")
    assert launch.hosts == ("gpu01", "gpu02") and launch.nnodes == 2 and launch.run_id == "1"
    cell = plan.cells[-1]
    assert (cell.settings.gpus, cell.settings.nnodes, cell.settings.nproc_per_node) == (4, 2, 2)
    cmd = launch.prefix(cell) + cell_command(cell, tmp_path / "cell", launch.rendezvous(cell, None))
    srun = cmd[: cmd.index("-m")]
    assert srun[:8] == [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--nodelist=gpu01,gpu02",
        f"--job-name=torchscale-{cell.cell_id}",
        "--kill-on-bad-exit=1",
        "--label",
    ]
    torchrun = cmd[8:]
    assert "--nnodes=2" in torchrun and "--nproc-per-node=2" in torchrun
    assert not any(arg.startswith("--node-rank") for arg in torchrun)
    assert "--rdzv-backend=c10d" in torchrun and "--rdzv-endpoint=gpu01:29400" in torchrun
    assert f"--rdzv-id=1-{cell.cell_id}" in torchrun
    assert "--rdzv-conf=is_host=false,join_timeout=600,read_timeout=600" in torchrun
    # One-node cells: srun on the first node, torchrun standalone.
    single = plan.cells[1]
    assert launch.prefix(single)[1:5] == [
        "--nodes=1",
        "--ntasks=1",
        "--ntasks-per-node=1",
        "--nodelist=gpu01",
    ]
    assert launch.rendezvous(single).standalone


def test_slurm_dry_run_prints_srun_commands_and_skips_what_the_allocation_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in {**RECORDED, "SLURM_JOB_NODELIST": "gpu01", "SLURM_NNODES": "1"}.items():
        monkeypatch.setenv(key, value)
    config = tmp_path / "m.yaml"
    config.write_text(MATRIX)
    result = runner.invoke(
        app, ["benchmark", "-c", str(config), "--launcher", "slurm", "--dry-run", "--json"]
    )
    assert result.exit_code == 0, result.output
    commands = [entry["command"] for entry in json.loads(result.stdout)]
    assert commands[0].startswith("srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --nodelist=gpu01")
    assert commands[2] == (
        "skipped: needs 2 nodes; the allocation has 1 (submit with --nodes=2 or more)"
    )


def test_slurm_launcher_outside_an_allocation_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(key, raising=False)
    config = tmp_path / "m.yaml"
    config.write_text(MATRIX)
    result = runner.invoke(app, ["benchmark", "-c", str(config), "--launcher", "slurm"])
    assert result.exit_code == 2
    assert "--launcher slurm runs inside a Slurm allocation" in result.stderr
    assert "Traceback" not in result.output


def test_sbatch_script_dry_run_sizes_the_job_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHSCALE_CPU_SLOTS", raising=False)
    config = tmp_path / "m.yaml"
    config.write_text(MATRIX)
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "benchmark", "-c", str(config), "-o", str(out), "--launcher", "slurm", "--submit",
            "--dry-run", "--sbatch-arg=--partition=gpu", "--set", "warmup_steps=3",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    script = result.stdout
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "#SBATCH --nodes=2" in lines and "#SBATCH --gpus-per-node=2" in lines
    assert "#SBATCH --ntasks-per-node=1" in lines and "#SBATCH --partition=gpu" in lines
    # Three cells of 300 s, each with 120 s for srun and start-up: 21 minutes.
    assert "#SBATCH --time=0-00:21:00" in lines
    assert f"#SBATCH --output={out.resolve()}/slurm-scaling/slurm-%j.out" in lines
    command = lines[-1]
    assert f"--config {config.resolve()}" in command
    assert f"--output-dir {out.resolve()}" in command
    assert (
        "--launcher slurm --resume --join-timeout=600 --benchmark=all --set=warmup_steps=3"
        in command
    )
    assert not out.exists()


def test_submit_needs_the_node_size(tmp_path: Path) -> None:
    config = tmp_path / "m.yaml"
    config.write_text(MATRIX.replace("gpus_per_node: 2\n", ""))
    result = runner.invoke(
        app, ["benchmark", "-c", str(config), "--launcher", "slurm", "--submit", "--dry-run"]
    )
    assert result.exit_code == 2
    assert "--submit sizes the allocation from the config: set gpus_per_node" in result.stderr


# --- a real job ---------------------------------------------------------------------------------

REAL_NAME = "slurm two-nodes 'q' #1"
"""A name with a blank, quotes and a '#', in an output folder with a blank and a '%x' (sbatch's
job-name pattern): the sbatch script must keep each a value (tests/test_hostile_sinks.py)."""
REAL = f"""\
experiment_name: "{REAL_NAME}"
models: [gpt2-tiny]
batch_sizes: [2]
gpu_counts: [2]
gpus_per_node: 1
warmup_steps: 1
measure_steps: 4
sync_probe_steps: 1
cell_timeout_s: 120
"""


@pytest.fixture(scope="module")
def slurm_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict]:
    from tests.support.slurm_cluster import SlurmCluster, SlurmUnavailable
    from tests.support.two_hosts import torchscale_env, two_hosts

    tmp = tmp_path_factory.mktemp("slurm")
    with two_hosts(tmp, "real Slurm job") as hosts:
        cluster = SlurmCluster(hosts, tmp)
        try:
            cluster.up()
        except SlurmUnavailable as exc:
            pytest.skip(f"real Slurm job: {exc}")
        config = tmp / "real.yaml"
        config.write_text(REAL)
        out = tmp / "out %x dir"
        env = {**cluster.env, **torchscale_env(cpu_slots=1)}
        argv = ["benchmark", "-c", str(config), "-o", str(out), "--launcher", "slurm", "--submit"]
        argv.append("--sbatch-arg=--comment=a 'b' #c")
        submitted = hosts.torchscale(hosts.head, argv, tmp / "submit.log", env)
        assert submitted.wait(timeout=120) == 0, (tmp / "submit.log").read_text()
        submit_log = (tmp / "submit.log").read_text()
        submitted_id = re.search(r"submitted Slurm job (\d+)", submit_log)
        assert submitted_id is not None
        job_id = submitted_id.group(1)
        cluster.wait_idle(timeout=240)
        job = cluster.run(["scontrol", "show", "job", job_id])
        store = ExperimentStore(experiment_dir(out, REAL_NAME))
        yield {"store": store, "records": store.records(), "job_id": job_id, "job": job}


@pytest.mark.slow
def test_a_submitted_matrix_runs_its_cells_through_srun_on_both_nodes(slurm_job: Dict) -> None:
    store: ExperimentStore = slurm_job["store"]
    job_id = slurm_job["job_id"]
    job_log = (store.root / f"slurm-{job_id}.out").read_text()
    # sbatch read every quoted #SBATCH value whole: the name, the '%x' folder, the comment.
    assert store.root.parent.name == "out %x dir"
    assert len(list(store.root.parent.parent.glob("out*"))) == 1
    assert f"JobName=torchscale-{REAL_NAME}\n" in slurm_job["job"]
    assert re.search(r"^\s*Comment=a 'b' #c\s*$", slurm_job["job"], re.M), slurm_job["job"]
    assert f"Command={store.root / 'sbatch.sh'}\n" in slurm_job["job"]
    assert "> Running gpt2-tiny on 2 CPU processes x 2 nodes (batch 2, fp32)..." in job_log
    [record] = slurm_job["records"]
    assert record.status == "ok", f"{record.error}\n{job_log[-2000:]}"
    assert record.nnodes == 2 and record.nproc_per_node == 1
    assert record.hosts == ["compute", "head"]
    assert sorted(rank.host for rank in record.per_rank) == ["compute", "head"]
    assert record.samples_per_s == pytest.approx(
        record.global_batch_size * len(record.step_times_ms) / record.measured_s
    )
    manifest = store.manifest()
    assert manifest["launch"]["launcher"] == "slurm"
    assert manifest["launch"]["slurm_job_id"] == job_id
    assert manifest["launch"]["hosts"] == ["gpu01", "gpu02"]
    assert manifest["launch"]["endpoint"] == "head:29400"
    assert [node["host"] for node in manifest["nodes"]] == ["compute", "head"]
    assert all(node["env"]["SLURM_JOB_ID"] == job_id for node in manifest["nodes"])
    script = (store.root / "sbatch.sh").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --cpus-per-task=1" in script
    # srun --label prefixes each node's torchrun output with its task id.
    launch_log = (store.cell_dir(record.cell_id) / "launch.log").read_text()
    assert re.search(r"^0: ", launch_log, re.M) and re.search(r"^1: ", launch_log, re.M)
