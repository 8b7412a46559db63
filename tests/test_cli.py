"""The CLI surface: help, version, list-models, schema, dry-run and bad input (no launches)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from torchscale.cli.app import app
from torchscale.version import __version__

runner = CliRunner()

NO_TORCH = """
import sys
from typer.testing import CliRunner
from torchscale.cli.app import app
result = CliRunner().invoke(app, {args!r})
heavy = sorted(m for m in ("torch", "pandas", "plotly", "matplotlib") if m in sys.modules)
print(result.exit_code, heavy)
"""


def run_without_torch(args: list) -> str:
    code = NO_TORCH.format(args=args)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_help_lists_commands_and_does_not_import_torch() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("benchmark", "profile", "report", "validate"):
        assert command in result.stdout
    assert "--verbose" in result.stdout and "--quiet" in result.stdout
    assert run_without_torch(["--help"]) == "0 []"
    assert run_without_torch(["benchmark", "--help"]) == "0 []"


def test_config_errors_do_not_import_torch(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [resnet50]\nprecison: bf16\n")
    assert run_without_torch(["benchmark", "--config", str(bad)]) == "2 []"


NODE_FACTS = """
import json, sys
from torchscale.hardware import environment
environment.gpu_device_files = lambda: {files!r}
devices = environment.node_devices()
facts = environment.collect_environment()
keys = ("torch", "cuda", "cudnn", "nccl", "device_kind", "device_count")
print(json.dumps({{"imported": "torch" in sys.modules, **{{k: facts[k] for k in keys}}}}))
"""


def node_facts(files: list) -> dict:
    """What a fresh ``torchscale`` process finds of this node before it launches anything, on
    a node whose GPU device files are ``files``; and whether that imported torch."""
    code = NODE_FACTS.format(files=files)
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    facts: dict = json.loads(ran.stdout)
    return facts


def test_a_node_without_gpus_is_known_and_recorded_without_importing_torch() -> None:
    """No GPU device file: CUDA can see no GPU, so the devices and the manifest's versions come
    without torch's import (2-3 s of CPU a command, on every node of a run); the versions are
    the ones torch itself reports."""
    import torch

    from torchscale.hardware.environment import cpu_slots

    facts = node_facts([])
    assert facts == {
        "imported": False,
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "cudnn": None,  # CPU processes never load cuDNN or NCCL
        "nccl": None,
        "device_kind": "cpu",
        "device_count": cpu_slots(),
    }
    # A GPU device file sends the question to torch (CUDA is hidden from the suite: CPU again).
    asked = node_facts(["/dev/nvidia0"])
    assert asked["imported"] is True
    assert {k: asked[k] for k in ("torch", "cuda", "device_kind")} == {
        k: facts[k] for k in ("torch", "cuda", "device_kind")
    }


def test_torchs_version_file_is_read_as_torch_reads_it_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The versions come from ``torch/version.py`` only while it is plain assignments; any other
    shape (or no torch found) gives None, and the caller imports torch instead."""
    import importlib.machinery
    import importlib.util

    import torch

    from torchscale.hardware import environment

    assert environment._installed_torch_versions() == {
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
    }
    found = importlib.util.find_spec

    def at(folder: Path) -> None:
        spec = importlib.machinery.ModuleSpec("torch", None, is_package=True)
        spec.submodule_search_locations = [str(folder)]
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda name, *a: spec if name == "torch" else found(name)
        )

    at(tmp_path)
    (tmp_path / "version.py").write_text("__version__ = '2.99.0'\ncuda: Optional[str] = None\n")
    assert environment._installed_torch_versions() == {"torch": "2.99.0", "cuda": None}
    for text in ("__version__ = compute()\n", "__version__ = 2\n", "def (:\n", ""):
        (tmp_path / "version.py").write_text(text)
        assert environment._installed_torch_versions() is None, text
    (tmp_path / "version.py").unlink()
    assert environment._installed_torch_versions() is None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert environment._installed_torch_versions() is None


def test_torch_default_threads_are_asked_only_for_a_single_process_script_cell(
    tmp_path: Path,
) -> None:
    from torchscale.app.own_script import ScriptOptions, script_config
    from torchscale.config.loader import load_config
    from torchscale.launch.cpu_threads import threads_lines
    from torchscale.plan.matrix import expand

    asked: list = []

    def torch_default() -> int:
        asked.append(1)
        return 5

    config = tmp_path / "c.yaml"
    config.write_text("models: [gpt2-tiny]\ngpu_counts: [1, 2]\n")
    builtin = expand(load_config(config)).cells
    assert threads_lines(builtin, "cpu", torch_default)[0].startswith("Threads: each CPU process")
    assert asked == []
    script = Path(__file__).parent.parent / "examples" / "scripts" / "train_cnn.py"
    cells = expand(script_config(ScriptOptions(str(script), gpus=[1, 2]), None)).cells
    lines = threads_lines(cells, "cpu", torch_default)
    assert "Threads, 1 process(es) per node: 5 intra-op thread(s) per rank" in lines[0]
    assert "Threads, 2 process(es) per node: 1 intra-op thread(s)" in lines[1]
    assert asked == [1]  # once, for the one-process cell


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"torchscale {__version__}"


def test_list_models_json() -> None:
    result = runner.invoke(app, ["benchmark", "--list-models", "--json"])
    assert result.exit_code == 0
    models = {m["name"]: m for m in json.loads(result.stdout)}
    assert models["resnet50"]["params"] == 25_557_032
    assert models["gpt2"]["unit"] == "tokens"
    assert {"resnet-tiny", "bert-tiny", "gpt2-tiny", "bert-large", "gpt2-xl"} <= set(models)


def test_schema_is_the_record_model() -> None:
    result = runner.invoke(app, ["benchmark", "--schema"])
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    for field in ("cell_id", "status", "throughput", "step_time_ms", "per_rank", "sync", "mfu"):
        assert field in schema["properties"]


def test_dry_run_prints_plan_and_writes_nothing(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "experiment_name: dry\nmodels: [gpt2-tiny]\nbatch_sizes: [4, 8]\ngpu_counts: [1, 2]\n"
    )
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "benchmark",
            "-c",
            str(config),
            "-o",
            str(out),
            "--dry-run",
            "--json",
            "--ddp.bucket_cap_mb=5",
        ],
    )
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert len(plan) == 4
    # in the order the run takes them: the 1-rank warm group, then the 2-rank one
    assert [(p["settings"]["batch_size"], p["settings"]["gpus"]) for p in plan] == [
        (4, 1),
        (8, 1),
        (4, 2),
        (8, 2),
    ]
    assert all(p["settings"]["ddp"]["bucket_cap_mb"] == 5.0 for p in plan)
    assert "-m torchscale.launch.torchrun_agent --nproc-per-node=2" in plan[2]["command"]
    assert "--nproc-per-node=2" in plan[2]["command"]
    assert "-m torchscale.worker" in plan[2]["command"]
    assert not out.exists()

    table = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(out), "--dry-run"])
    assert table.exit_code == 0
    assert "dry: 4 cells" in table.stderr
    assert "[4] " in table.stderr and "--nproc-per-node=2" in table.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "missing --config"),
        (["-c", "{missing}"], "does not exist"),
        (["-c", "{config}", "--set", "nokey"], "not key=value"),
        (["-c", "{config}", "--precison=bf16"], "did you mean 'precision'"),
        (["-c", "{config}", "-o", "{blocked}/sub"], "is not writable"),
        (["-c", "{bad_model}"], "unknown model 'resnet5'"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    tmp_path: Path, args: list, message: str
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("models: [gpt2-tiny]\n")
    bad_model = tmp_path / "m.yaml"
    bad_model.write_text("models: [resnet5]\n")
    blocked = tmp_path / "blocked"
    blocked.write_text("a file, not a folder")
    paths = {
        "missing": tmp_path / "missing.yaml",
        "config": config,
        "bad_model": bad_model,
        "blocked": blocked,
    }
    args = [a.format(**paths) for a in args]
    out = tmp_path / "results"
    if "-o" not in args:
        args += ["-o", str(out)]
    result = runner.invoke(app, ["benchmark", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.output
    assert not out.exists()
