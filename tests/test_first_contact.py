"""The seed's workflow as a new user runs it: the CLI reference's options, the Use
Case's ``profile`` with no model, the seed YAML on a node without nsys or eight GPUs, the names
the user chose, plugin models checked before anything launches, and tables at 80 columns."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from tests.support.chromium_cdp import Chromium
from tests.support.environ import REPO, repo_pythonpath
from tests.support.report_fixtures import SessionReport
from tests.support.shared_runs import ProfileRun, Run
from tests.support.typed import training_records
from torchscale.cli.app import app
from torchscale.errors import ConfigError
from torchscale.models.registry import check_model_factory
from torchscale.results.layout import experiment_dirname, is_safe_name
from torchscale.results.schema import TrainingResult
from torchscale.results.store import ExperimentStore

runner = CliRunner()
SEED = REPO / "benchmark_config.yaml"


@pytest.fixture
def no_nsys(monkeypatch: pytest.MonkeyPatch) -> None:
    """PATH without any folder that holds nsys; a CPU node with two rank slots."""
    folders = os.environ.get("PATH", "").split(os.pathsep)
    monkeypatch.setenv("PATH", os.pathsep.join(f for f in folders if not Path(f, "nsys").exists()))
    monkeypatch.setenv("TORCHSCALE_CPU_SLOTS", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the dry run's probe sees no GPU either
    assert shutil.which("nsys") is None


# --- the CLI reference: -v everywhere ------------------------------------------------------


def test_validate_verbose_logs_each_checks_details(tmp_path: Path) -> None:
    for flag in ("-v", "--verbose"):
        result = runner.invoke(
            app, ["validate", flag, "--skip-smoke", "--json", "--output-dir", str(tmp_path)]
        )
        assert result.exit_code in (0, 1), result.output  # 1 only for a FAIL row
        assert "DEBUG" in result.stderr and "Disk space (output dir): {" in result.stderr
        assert json.loads(result.stdout)["checks"]
    quiet = runner.invoke(app, ["validate", "--skip-smoke", "--output-dir", str(tmp_path)])
    assert "DEBUG" not in quiet.stderr


def test_report_verbose(fixture_results: Path, tmp_path: Path) -> None:
    source = fixture_results
    for args in (["report", "-v"], ["report", "generate", "--verbose"]):
        result = runner.invoke(app, [*args, "-s", str(source), "-o", str(tmp_path / "r.html")])
        assert result.exit_code == 0, result.output
        assert "DEBUG" in result.stderr and "experiment 'fixture-scaling'" in result.stderr


def test_profile_verbose(tmp_path: Path) -> None:
    trace = REPO / "tests" / "data" / "nsys_2rank"
    for args in (["profile", "analyze", "-v"], ["profile", "analyze", "--verbose"]):
        result = runner.invoke(app, [*args, str(trace), "-o", str(tmp_path)])
        assert result.exit_code == 0, result.output
        assert "DEBUG" in result.stderr and "rank 1: nsys trace" in result.stderr
    help_text = runner.invoke(app, ["profile", "--help"]).stdout
    assert "--verbose" in help_text and "-v" in help_text
    for command in (["validate"], ["report"], ["report", "generate"], ["benchmark"]):
        assert "--verbose" in runner.invoke(app, [*command, "--help"]).stdout


# --- the seed YAML on a CPU node without nsys ---------------------------------------------


def test_seed_dry_run_marks_cells_this_node_skips_and_warns_about_nsys(
    tmp_path: Path, no_nsys: None
) -> None:
    out = tmp_path / "results"
    result = runner.invoke(app, ["benchmark", "-c", str(SEED), "-o", str(out), "--dry-run"])
    assert result.exit_code == 0, result.output
    err = result.stderr
    warns = [line for line in err.splitlines() if "[WARN]" in line]
    assert len(warns) == 3 and "nsys is not on PATH" in warns[0] and "torch.profiler" in warns[0]
    # the seed's models are sized for GPUs: each is named with the time a cell takes here
    for warn, model in zip(warns[1:], ("resnet50", "bert-large")):
        assert warn.startswith(f"> [WARN] {model} is a GPU-sized model") and " h here " in warn
    lines = {int(m[1]): m[2] for m in re.finditer(r"^\[(\d+)\] (.*)$", err, re.MULTILINE)}
    assert len(lines) == 24  # 2 models x 3 batch sizes x 4 GPU counts
    plan = json.loads(
        runner.invoke(
            app, ["benchmark", "-c", str(SEED), "-o", str(out), "--dry-run", "--json"]
        ).stdout
    )
    for index, entry in enumerate(plan, 1):
        gpus = entry["settings"]["gpus"]
        if gpus in (4, 8):
            reason = f"needs {gpus} CPU processes per node; this node has 2 CPU processes"
            assert entry["skip_reason"] == reason and lines[index] == f"skipped: {reason}"
            assert "torchrun_agent" not in entry["command"]
        else:
            assert (
                entry["skip_reason"] is None
                and "-m torchscale.launch.torchrun_agent" in lines[index]
            )
    assert "12 of 24 cells would be skipped on this node" in err
    assert f"results would go to {out / 'resnet50_scaling_test'}" in err
    assert not out.exists()


@pytest.mark.slow
def test_seed_yaml_with_nsys_runs_and_profiles_with_torch_profiler(
    tmp_path: Path, no_nsys: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", repo_pythonpath())
    # The seed file as written, shrunk to one small cell: profiling (tool nsys) stays as it is.
    shrink = ["models=[resnet-tiny]", "batch_sizes=[4]", "gpu_counts=[1]", "precision=fp32",
              "warmup_steps=1", "measure_steps=3", "sync_probe_steps=0",
              "profiling.trigger=always", "profiling.steps=2"]  # fmt: skip
    args = ["benchmark", "-c", str(SEED), "-o", str(tmp_path)]
    result = runner.invoke(app, [*args, *(f"--set={item}" for item in shrink)])
    assert result.exit_code == 0, result.output
    warns = [line for line in result.stderr.splitlines() if "[WARN]" in line and "nsys" in line]
    assert len(warns) == 1, result.stderr
    (record,) = ExperimentStore(tmp_path / "resnet50_scaling_test").records()
    assert isinstance(record, TrainingResult)
    assert record.status == "ok" and record.profile is not None
    assert record.profile.tool == "torch" and record.profile.profiled, record.profile


# --- the names the user chose --------------------------------------------------------------


def test_safe_names_are_the_folder_and_unsafe_ones_never_share_one() -> None:
    for name in ("resnet50_scaling_test", "実験", "эксперимент", "प्रयोग", "exp.v2", "A-1_b"):
        assert is_safe_name(name) and experiment_dirname(name) == name
    unsafe = ["my exp", "my/exp", "my?exp", "..", ".", "../up", "-rf", "a\\b", "x" * 300,
              "<script>alert(1)</script>", "実験 1", "実験/1", "", "e\u0301"]  # fmt: skip
    folders = [experiment_dirname(name) for name in unsafe]
    assert len(set(folders)) == len(unsafe)  # one folder per name
    for name, folder in zip(unsafe, folders):
        assert not is_safe_name(name) and "+" in folder and "/" not in folder
        assert folder not in (".", "..") and len(folder.encode()) <= 200
        assert experiment_dirname(name) == folder  # stable
    assert experiment_dirname("my exp").startswith("my-exp+")


def test_results_land_in_the_folder_of_the_name(tmp_path: Path, monkeypatch) -> None:
    """Real runs (cells this node skips: nothing launches, everything else is written)."""
    monkeypatch.setenv("TORCHSCALE_CPU_SLOTS", "1")
    out = tmp_path / "results"
    for name in ("resnet50_scaling_test", "実験", "эксперимент", "実験 1", "実験?1"):
        config = tmp_path / "c.yaml"
        config.write_text(
            f"experiment_name: '{name}'\nmodels: [gpt2-tiny]\ngpu_counts: [2]\n", encoding="utf-8"
        )
        result = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(out)])
        assert result.exit_code == 0, result.output
        folder = out / experiment_dirname(name)
        assert f"> Results go to {folder}" in result.stderr
        (record,) = ExperimentStore(folder).records()
        assert record.experiment == name and record.status == "skipped"
    names = sorted(p.name for p in out.iterdir())
    assert {"resnet50_scaling_test", "実験", "эксперимент"} <= set(names) and len(names) == 5


# --- a plugin that is not a ModelSpec ------------------------------------------------------


def test_os_system_exits_2_before_anything_launches(tmp_path: Path, monkeypatch) -> None:
    import torchscale.launch.cell as cell

    def no_launch(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a cell was launched")

    monkeypatch.setattr(cell, "run_process", no_launch)
    config = tmp_path / "c.yaml"
    config.write_text("models: ['os:system']\ngpu_counts: [1]\n")
    out = tmp_path / "out"
    for extra in ([], ["--dry-run"]):
        result = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(out), *extra])
        assert result.exit_code == 2, result.output
        assert len(result.stderr.strip().splitlines()) == 1 and "'os:system'" in result.stderr
        assert "built-in function" in result.stderr and not out.exists()
    result = runner.invoke(app, ["profile", "-m", "os:system", "-b", "4", "-o", str(out)])
    assert result.exit_code == 2 and "'os:system'" in result.stderr and not out.exists()


def _declared_wrong() -> int:
    return 1


def _undeclared_wrong():
    return "not a spec"


def _undeclared_spec():
    from torchscale.models.registry import load_model

    return load_model("resnet-tiny")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("os:system", "built-in function"),
        ("collections:OrderedDict", "is a class"),
        ("json:dumps", "calling dumps() raised TypeError"),
        ("tests.test_first_contact:_declared_wrong", "declared to return int"),
        ("tests.test_first_contact:_undeclared_wrong", "returned str"),
        ("os:no_such_function", "has no function"),
        ("no_such_pkg.models:build", "cannot import model module"),
    ],
)
def test_a_factory_that_is_not_a_model_spec_is_bad_input(name: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as raised:
        check_model_factory(name)
    assert f"model '{name}'" in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "name",
    [
        "examples.custom_model:my_mlp",  # annotated: not called
        "tests.support.fault_models:oom_model",
        "torchscale.models.resnet:resnet50",  # nothing built: a spec only describes the model
        "tests.test_first_contact:_undeclared_spec",  # unannotated: called, returns a spec
    ],
)
def test_real_model_factories_pass(name: str) -> None:
    check_model_factory(name, seq_len=64)


# --- profile with no model: the Use Case's Phase 3 -----------------------------------------


def _copy(record: TrainingResult, **changes: Any) -> TrainingResult:
    settings = {**record.settings, **changes.pop("settings", {})}
    return record.model_copy(update={**changes, "settings": settings})


def _slow_sweep(root: Path, healthy: List[TrainingResult]) -> None:
    """A second experiment whose batch-2 configuration barely scales (1% on 2 GPUs), and a
    4-GPU cell worse still that this node (2 slots) could not run."""
    one, two = sorted(healthy, key=lambda r: r.world_size)
    (root / "sweep").mkdir(parents=True)
    store = ExperimentStore(root / "sweep")
    rate = one.samples_per_s
    assert rate is not None
    for world, efficiency in ((1, 1.0), (2, 0.01), (4, 0.001)):
        base = one if world == 1 else two
        store.append(
            _copy(
                base,
                cell_id=f"gpt2-tiny-b2-g{world}-sweep",
                experiment="sweep",
                batch_size=2,
                world_size=world,
                samples_per_s=rate * world * efficiency,
                throughput=rate * world * efficiency * base.units_per_sample,
                settings={"batch_size": 2, "gpus": world},
            )
        )


def test_worst_target_is_the_lowest_efficiency_at_the_largest_count_that_fits(
    tmp_path: Path,
) -> None:
    from tests.support.report_fixtures import FixtureSpec, write_experiment
    from torchscale.analysis.training_tables import training_table
    from torchscale.app.profile import DEFAULT_MODEL, worst_target

    empty = worst_target(tmp_path / "nothing", "cpu", 2)
    assert (empty.model, empty.batch_size) == DEFAULT_MODEL["cpu"] == ("resnet-tiny", 8)
    assert "no benchmark results" in empty.reason and "default model resnet-tiny" in empty.reason
    assert worst_target(tmp_path / "nothing", "cuda", 8).model == "resnet50"

    folder = write_experiment(tmp_path / "r", FixtureSpec(failures=False, collectives=False))
    table = training_table(ExperimentStore(folder).records())
    for fits in (8, 4, 2):
        at = table[(table["world_size"] == fits) & table["scaling_efficiency"].notna()]
        worst = at.loc[at["scaling_efficiency"].idxmin()]  # type: ignore[call-overload]  # idxmin's label: pandas-stubs type it Hashable
        target = worst_target(tmp_path / "r", "cuda", fits)
        assert (target.model, target.batch_size) == (worst["model"], worst["batch_size"])
        assert f"{worst['scaling_efficiency']:.0%} scaling efficiency on {fits} GPUs" in (
            target.reason
        )
        assert target.knobs["precision"] == "bf16" and "gpus" not in target.knobs
    none_fit = worst_target(tmp_path / "r", "cuda", 1)
    assert none_fit.model == "resnet50" and "no scaling result" in none_fit.reason


@pytest.mark.slow
def test_profile_without_a_model_profiles_what_scaled_worst(
    use_case_profile: ProfileRun, healthy_run: Run, tmp_path: Path
) -> None:
    """``benchmark`` then ``profile`` into the same folder, as the seed's Use Case does (the
    shared profile run); which configuration it picks among experiments, on the same records."""
    from torchscale.app.profile import worst_target
    from torchscale.escaping import for_terminal

    # The pick among two experiments: a second one whose batch-2 configuration barely scales.
    both = tmp_path / "scaling_results"
    shutil.copytree(healthy_run.experiment_dir, both / healthy_run.experiment_dir.name)
    picked = worst_target(both, "cpu", 2)  # the benchmark alone, as the shared run saw it
    _slow_sweep(both, training_records(ExperimentStore(healthy_run.experiment_dir).records()))
    worst = worst_target(both, "cpu", 2)
    assert (worst.model, worst.batch_size) == ("gpt2-tiny", 2)
    assert "gpt2-tiny (batch 2" in worst.reason and "from sweep" in worst.reason
    assert "1% scaling efficiency on 2 CPU processes against 1" in worst.reason
    assert "the lowest of 2" in worst.reason
    # The command says what it picked, and profiles that.
    result, folder = use_case_profile.result, use_case_profile.folder
    said = next(line for line in result.stderr.splitlines() if "No --model or --config" in line)
    assert for_terminal(picked.reason) in said and "gpt2-tiny (batch 4" in said
    profiled = [p for p in folder.iterdir() if p.name.startswith("profile-gpt2-tiny-g2-")]
    (record,) = ExperimentStore(profiled[0]).records()
    assert isinstance(record, TrainingResult)
    assert (record.model, record.batch_size, record.world_size) == ("gpt2-tiny", 4, 2)
    assert (record.model, record.batch_size) == (picked.model, picked.batch_size)
    assert record.profile and record.profile.profiled
    assert json.loads(result.stdout)["findings"] is not None


# --- 80 columns ----------------------------------------------------------------------------


def _console() -> Console:
    return Console(file=io.StringIO(), width=80, force_terminal=False, color_system=None)


def _lines(console: Console) -> List[str]:
    return _lines_text(console).splitlines()


def _lines_text(console: Console) -> str:
    """What a console made on an io.StringIO printed."""
    assert isinstance(console.file, io.StringIO)
    return console.file.getvalue()


def _matrix() -> pd.DataFrame:
    rows: List[Dict[str, Any]] = []
    models = [("resnet50", "images"), ("bert-large", "sequences"),
              ("mylab.fault_models:slow_rank_model", "samples")]  # fmt: skip
    for index, (model, unit) in enumerate(models):
        for batch in (64, 128, 256):
            for gpus, nodes in ((1, 1), (2, 1), (4, 1), (8, 1), (16, 2)):
                ok = gpus < 16
                rows.append(
                    {"model": model, "batch_size": batch, "world_size": gpus, "nnodes": nodes,
                     "precision": "bf16" if gpus % 2 else "fp32",
                     "status": "ok" if ok else "skipped",
                     "throughput": 1_234_567.891 * gpus + index + batch if ok else float("nan"),
                     "unit": unit, "step_ms_p50": 1234.5, "step_ms_p95": 12345.6,
                     "sync_overhead_pct": 12.3, "scaling_efficiency": 0.9, "mfu": 0.41}
                )  # fmt: skip
    return pd.DataFrame(rows)


def test_benchmark_table_at_80_columns_shows_every_figure_in_full(monkeypatch) -> None:
    import torchscale.cli.benchmark_view as view

    console = _console()
    monkeypatch.setattr(view, "err_console", console)
    table = _matrix()
    console.print(view.results_table(table, "resnet50_scaling_test (results/x)"))
    lines = _lines(console)
    text = "\n".join(lines)
    assert all(len(line) <= 80 for line in lines) and "…" not in text
    for value in table["throughput"].dropna():
        assert f"{value:,.1f}" in text
    for model in ("resnet50", "bert-large"):
        assert re.search(rf"^{model}\s", text, re.MULTILINE)
    # a long plugin name wraps whole onto two lines, it is never cut
    assert "mylab.fault_models:" in text and "slow_rank_model" in text
    flowing = " ".join(text.split())  # the caption wraps at words
    assert "not shown:" in flowing and "summary.csv or --json" in flowing
    # a wide console still gets every column, as before
    wide = Console(file=io.StringIO(), width=200, color_system=None)
    monkeypatch.setattr(view, "err_console", wide)
    wide.print(view.results_table(table, "t"))
    assert "step time p50/p95 ms" in _lines_text(wide) and "MFU" in _lines_text(wide)


@pytest.mark.slow  # a real CPU benchmark (torchrun launches)
def test_real_results_table_at_80_columns(healthy_run: Run, monkeypatch) -> None:
    import torchscale.cli.benchmark_view as view
    from torchscale.analysis.training_tables import training_table

    records = ExperimentStore(healthy_run.experiment_dir).records()
    console = _console()
    monkeypatch.setattr(view, "err_console", console)
    console.print(view.results_table(training_table(records), "healthy"))
    text = "\n".join(_lines(console))
    assert "…" not in text and all(len(line) <= 80 for line in _lines(console))
    for record in records:
        assert isinstance(record, TrainingResult)
        assert f"{record.throughput:,.1f}" in text


def test_profile_table_piped_at_80_columns(tmp_path: Path) -> None:
    """In a real process whose stderr is a file, as in a CI log."""
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": repo_pythonpath()}
    env.pop("FORCE_COLOR", None)
    out = tmp_path / "o"
    trace = REPO / "tests" / "data" / "nsys_2rank"
    with open(tmp_path / "stderr.txt", "w") as log:
        code = subprocess.run(
            [sys.executable, "-m", "torchscale", "profile", "analyze", str(trace), "-o", str(out),
             "--json"], stdout=subprocess.PIPE, stderr=log, env=env, check=False,
        ).returncode  # fmt: skip
    assert code == 0
    text = (tmp_path / "stderr.txt").read_text()
    table = text.split("[ANALYSIS]")[0]
    assert "…" not in table and all(len(line) <= 80 for line in table.splitlines())
    document = json.loads((out / "findings.json").read_text())
    for rank in document["ranks"]:
        assert f"{rank['step_mean_us'] / 1000:.2f}" in table
        assert f"{rank['sync_stall_pct']:.1f}" in table and f"{rank['idle_pct']:.1f}" in table


def test_dry_run_plan_piped_at_80_columns(tmp_path: Path, no_nsys: None) -> None:
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": repo_pythonpath()}
    args = ["benchmark", "-c", str(SEED), "-o", str(tmp_path / "r"), "--dry-run"]
    with open(tmp_path / "stderr.txt", "w") as log:
        code = subprocess.run(
            [sys.executable, "-m", "torchscale", *args], stderr=log, env=env, check=False
        ).returncode
    text = (tmp_path / "stderr.txt").read_text()
    assert code == 0, text
    table = text.split("resnet50_scaling_test: 24 cells")[1].split("\n[1] ")[0]
    assert "…" not in table and all(len(line) <= 80 for line in table.splitlines())
    plan = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    for entry in plan:
        assert entry["cell_id"] in table


def test_validate_table_at_80_columns() -> None:
    from torchscale.cli.validate_command import render

    checks = [
        {"name": "All-reduce smoke test", "status": "PASS", "fix": None,
         "value": "8 nccl ranks, sum correct over 268,435,456 elements; 1,234.56 ms per "
                  "1 GiB all-reduce, algbw 812.34 GB/s, busbw 1,421.59 GB/s"},
        {"name": "Retired pages / remapped rows", "status": "FAIL", "value": "GPU 3: 12,345 rows",
         "fix": "Drain the node and ask the vendor to replace GPU 3 (nvidia-smi -q -d ROW)."},
        {"name": "NCCL environment", "status": "WARN", "value": "NCCL_P2P_DISABLE=1",
         "fix": "Unset NCCL_P2P_DISABLE and NCCL_SHM_DISABLE unless you know why they are set."},
    ]  # fmt: skip
    report = {"host": "gpu-node-17", "backend": "nccl", "duration_s": 12.3, "checks": checks,
              "summary": {"pass": 1, "warn": 1, "fail": 1, "skip": 0, "ok": False}}  # fmt: skip
    console = _console()
    render(report, console)
    lines = _lines(console)
    text = "\n".join(lines)
    assert all(len(line) <= 80 for line in lines) and "…" not in text
    for number in ("268,435,456", "1,234.56", "812.34", "1,421.59", "12,345"):
        assert number in text
    assert "fix: Drain the node" in text


# --- findings fit the run ------------------------------------------------------------------

GPU_ADVICE = re.compile(r"nvlink|infiniband|\bIB\b|nccl-tests|nvidia-smi|NCCL_DEBUG", re.I)


@pytest.mark.slow  # a real CPU benchmark (torchrun launches)
def test_a_gloo_cpu_run_gets_no_gpu_interconnect_advice(healthy_run: Run) -> None:
    from torchscale.analysis.findings import record_findings
    from torchscale.profiling.analysis import analyze, to_document

    document: Any = to_document(analyze([REPO / "tests" / "data" / "gloo_2rank_cpu"], "all"))
    assert document["findings"]
    for finding in document["findings"]:
        assert not GPU_ADVICE.search(finding["recommendation"]), finding
    gpu: Any = to_document(analyze([REPO / "tests" / "data" / "nsys_2rank"], "all"))
    assert any("nccl-tests" in f["recommendation"] for f in gpu["findings"])

    folder = healthy_run.experiment_dir
    record = next(
        r
        for r in ExperimentStore(folder).records()
        if isinstance(r, TrainingResult) and r.sync is not None
    )
    assert record.sync is not None and record.backend == "gloo"
    for slowest in (1, None):
        sync = record.sync.model_copy(update={"warning": "High variance", "slowest_rank": slowest})
        cpu = record.model_copy(update={"sync": sync})
        (finding,) = record_findings([cpu])
        assert not GPU_ADVICE.search(finding["recommendation"]), finding
        on_gpu = cpu.model_copy(update={"backend": "nccl", "device_name": "NVIDIA H100"})
        (finding,) = record_findings([on_gpu])
        if slowest is not None:
            assert "nvidia-smi" in finding["recommendation"]


# --- report polish -------------------------------------------------------------------------


def _fixture_content(fixture_results: Path) -> Any:
    from torchscale.analysis.report_data import load_report_data
    from torchscale.app.report import report_content

    return report_content(load_report_data(fixture_results))


def test_band_labels_and_the_ideal_line_are_legend_entries(fixture_results: Path) -> None:
    import xml.etree.ElementTree as ET

    from torchscale.report.charts import ideal_throughput_label
    from torchscale.report.plotly_charts import figure
    from torchscale.report.svg_charts import WIDTH, _Frame, svg

    content = _fixture_content(fixture_results)
    banded = [c for c in content.charts if c.bands]
    assert banded
    for chart in banded:
        layout: Any = figure(chart)["layout"]
        assert not any("%" in a["text"] for a in layout.get("annotations", []))  # none on the plot
        data: Any = figure(chart)["data"]
        legend = [t["name"] for t in data if t["showlegend"]]
        names = [band.label for band in chart.bands]  # the efficiency bands, a noise band
        assert [n.replace(">", "&gt;") for n in names if n.replace(">", "&gt;") in legend] == [
            n.replace(">", "&gt;") for n in names
        ]
        if chart.chart_id.startswith("efficiency"):
            assert names == ["excellent > 90%", "good > 80%"]
        right = _Frame(chart, []).right
        texts = ET.fromstring(svg(chart)).iter("{http://www.w3.org/2000/svg}text")
        labels = [t for t in texts if t.text in names]
        assert len(labels) == len(names) and all(
            right < float(t.get("x", "nan")) < WIDTH for t in labels
        )
    assert any(c.chart_id.startswith("efficiency") for c in banded)
    for chart in [c for c in content.charts if c.chart_id.startswith("throughput-")]:
        data = figure(chart)["data"]
        ideal = [t for t in data if t["name"] == ideal_throughput_label()]
        assert len(ideal) == 1 and ideal[0]["showlegend"] and ideal[0]["line"]["dash"] == "dash"
        assert "ideal (dashed)" in svg(chart)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed")
def test_in_chromium_no_band_label_is_inside_a_plot(
    fixture_results: Path, session_report: SessionReport, chromium: Chromium
) -> None:
    path = session_report(fixture_results, "html")
    ready = (
        "document.querySelectorAll('[data-figure]').length === "
        "document.querySelectorAll('[data-drawn=\"true\"]').length"
    )
    probe = """(() => Array.from(document.querySelectorAll('[data-figure^="efficiency-"]')).map(el => {
      const plot = el.querySelector('.nsewdrag').getBoundingClientRect();
      const inside = r => r.left < plot.right && r.right > plot.left &&
                          r.top < plot.bottom && r.bottom > plot.top;
      const texts = Array.from(el.querySelectorAll('text')).filter(
        t => /excellent > 90%|good > 80%|^ideal/.test(t.textContent));
      return {n: texts.length, inside: texts.filter(t => inside(t.getBoundingClientRect()))
              .map(t => t.textContent)};
    }))()"""
    charts = chromium.open(path, ready).evaluate(probe)
    assert charts
    for chart in charts:
        assert chart["n"] == 3 and chart["inside"] == [], chart


def test_two_experiments_are_both_named_and_label_their_findings(tmp_path: Path) -> None:
    from tests.support.pdf_pages import needs_poppler, pages_text
    from tests.support.report_fixtures import FixtureSpec, write_experiment
    from torchscale.analysis.report_data import load_report_data
    from torchscale.app.report import ReportRequest, generate_report, report_content

    small: Any = {"batch_sizes": (32,), "failures": False, "collectives": False}
    write_experiment(tmp_path, FixtureSpec(name="exp-a", gpu_counts=(1, 2, 8), **small))
    b = write_experiment(tmp_path, FixtureSpec(name="exp-b", gpu_counts=(1, 8), seed=3, **small))
    # the same profile analysed twice in one experiment: its findings are listed once
    twice = b / "cells" / "profile-again" / "profile"
    twice.mkdir(parents=True)
    shutil.copy(b / "cells" / "profile-8gpu" / "profile" / "findings.json", twice)
    content = report_content(load_report_data(tmp_path))
    assert content.title == "exp-a and exp-b"
    findings = content.findings
    assert {f["experiment"] for f in findings} == {"exp-a", "exp-b"}
    keys = [(f["experiment"], f["title"], f["message"]) for f in findings]
    assert len(keys) == len(set(keys))
    assert sum(f["title"] == "GPU 3 finishes backward late" for f in findings) == 2  # a and b
    html = generate_report(ReportRequest(tmp_path, "html", tmp_path / "r.html")).read_text()
    assert "experiment exp-a" in html and "experiment exp-b" in html
    assert "<title>torchscale report: exp-a and exp-b</title>" in html
    if needs_poppler.args[0]:  # skipif condition: poppler missing
        return
    pdf = generate_report(ReportRequest(tmp_path, "pdf", tmp_path / "r.pdf"))
    text = " ".join(pages_text(pdf))
    assert "CSV" not in text and "csv" not in text.lower().replace("summary.csv", "")
    assert "exp-a and exp-b" in text and "experiment exp-a" in text


@pytest.mark.slow  # the real run's PDF, where poppler is (a torchrun launch)
def test_environment_versions_read_as_versions(
    request: pytest.FixtureRequest, session_report: SessionReport
) -> None:
    from tests.support.pdf_pages import needs_poppler, pages_text
    from torchscale.analysis.report_data import Experiment
    from torchscale.report.environment_block import cudnn_version, environment_block

    assert [cudnn_version(v) for v in (91002, 92600, 90100, 8902, 7605)] == [
        "9.10.2", "9.26.0", "9.1.0", "8.9.2", "7.6.5"
    ]  # fmt: skip
    cpu = {"cuda": "13.2", "cudnn": 92600, "device_kind": "cpu", "gpus": [], "torch": "2.15"}
    facts = dict(environment_block(Experiment("x", Path("."), {"environment": cpu})).facts)
    assert facts["CUDA"] == "not available" and facts["cuDNN"] == "9.26.0"
    gpu = {**cpu, "device_kind": "cuda", "cuda": "12.4", "cudnn": 91002}
    facts = dict(environment_block(Experiment("x", Path("."), {"environment": gpu})).facts)
    assert facts["CUDA"] == "12.4" and facts["cuDNN"] == "9.10.2"
    if needs_poppler.args[0]:
        return
    real = request.getfixturevalue("healthy_run").output_dir  # launches only where poppler is
    text = " ".join(pages_text(session_report(real, "pdf")))
    assert re.search(r"CUDA\s+not available", text) and not re.search(r"cuDNN\s+\d{4,}", text)
    assert "CSV" not in text


# --- README's first lines: a user's install and the example; the contributors' apart ----------


def _bash_blocks(text: str) -> List[List[str]]:
    """Each bash block of ``text`` as its command lines, comments dropped."""
    return [
        [" ".join(re.sub(r"\s+#.*$", "", line).split()) for line in block.splitlines()]
        for block in re.findall(r"```bash\n(.*?)```", text, re.S)
    ]


def test_readme_starts_with_a_users_install_and_the_example() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    first, contributors = _bash_blocks(readme)[:2]
    assert first[0] == "pip install -e ." and ".[dev]" not in " ".join(first)
    assert first[1] == "torchscale benchmark --config examples/cpu_smoke.yaml --output-dir results"
    assert not any("pytest" in line for line in first)
    # The contributors' install and the test command stay, in a block said to be theirs.
    assert contributors == ['pip install -e ".[dev]"', "python -m pytest"]
    before = readme[: readme.index('pip install -e ".[dev]"')]
    assert "For contributors" in before[before.rindex("```bash", 0, len(before) - 1) - 300 :]
    # CI runs what README says: its install and exactly its test command.
    ci = [" ".join(line.split()) for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert 'pip install -q -e ".[dev]"' in ci
    test_line = next(i for i, line in enumerate(ci) if line.startswith("# README: test"))
    assert contributors[1] in ci[test_line : test_line + 4]


# The coverage floor when CI first measured it: the floor CI holds is never below it.
FIRST_COVERAGE_FLOOR = 83


def test_ci_type_checks_the_tests_and_holds_a_coverage_floor() -> None:
    """CI runs mypy over tests/ too, and measures coverage in README's test command with the
    floor docs/PERFORMANCE.md records (never lowered); pre-commit runs the same mypy."""
    ci = (REPO / ".ci" / "run").read_text().replace("\\\n", " ")
    lines = [" ".join(line.split()) for line in ci.splitlines()]
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^files = \["torchscale", "tests"\]$', pyproject, re.M)
    assert "check_untyped_defs = true" in pyproject  # every test body, annotated or not
    mypy = lines.index("python -m mypy")
    readme_test = lines.index("python -m pytest")
    assert mypy < readme_test
    (coverage,) = [line for line in lines if "--cov=torchscale" in line]
    # README's command as it is, the options through pytest's environment, for that run only
    assert coverage.startswith('export PYTEST_ADDOPTS="--cov=torchscale ')
    assert lines.index(coverage) < readme_test < lines.index("unset PYTEST_ADDOPTS")
    floor = re.search(r'--cov-fail-under=(\d+)(\s|"|$)', coverage)
    assert floor, coverage
    performance = (REPO / "docs" / "PERFORMANCE.md").read_text(encoding="utf-8")
    section = performance[performance.index("### Coverage") :]
    recorded = re.search(r"floor \*\*(\d+)%\*\*", section)
    assert recorded and int(recorded.group(1)) == int(floor.group(1)) >= FIRST_COVERAGE_FLOOR
    assert "never lowered" in section
    hooks = (REPO / ".pre-commit-config.yaml").read_text()
    assert "entry: python -m mypy" in hooks and "(torchscale|tests)/" in hooks


def test_highest_throughput_per_unit_and_efficiency_never_averaged_across_models() -> None:
    """A run of two models with different units (resnet-tiny in images, gpt2-tiny in tokens),
    two repeats each, on 1 and 2 CPU processes: one "Highest throughput" card per unit, each the
    best of that unit's cells only; the efficiency card is the lowest configuration's (each the
    mean of its own repeats), never a mean over the two models."""
    import statistics

    from torchscale.analysis.report_data import load_report_data
    from torchscale.app.report import report_content

    folder = REPO / "tests" / "data" / "compare_unchanged" / "before" / "cpu_smoke"
    records = [r for r in ExperimentStore(folder).records() if isinstance(r, TrainingResult)]
    cards = {c.label: c for c in report_content(load_report_data(folder)).cards}
    highest = {label: card for label, card in cards.items() if label.startswith("Highest")}
    units = {r.unit for r in records}
    assert units == {"images", "tokens"}
    assert set(highest) == {f"Highest throughput ({unit}/s)" for unit in units}
    for unit in units:
        best = max(r.throughput or 0.0 for r in records if r.unit == unit)
        shown = float(highest[f"Highest throughput ({unit}/s)"].value.replace(",", ""))
        assert shown == pytest.approx(best, rel=0.01), unit

    def efficiency(model: str) -> float:  # mean of its repeats' 2-rank rate over twice 1-rank's
        rates = {n: [r.throughput or 0.0 for r in records if (r.model, r.world_size) == (model, n)]
                 for n in (1, 2)}  # fmt: skip
        return statistics.mean(rates[2]) / (2 * statistics.mean(rates[1]))

    each = {m: efficiency(m) for m in ("resnet-tiny", "gpt2-tiny")}
    assert abs(each["resnet-tiny"] - each["gpt2-tiny"]) > 0.1  # their mean is neither
    (card,) = [c for label, c in cards.items() if label.startswith("Scaling efficiency at")]
    value = float(card.value.rstrip("%")) / (100 if card.value.endswith("%") else 1)
    assert value == pytest.approx(min(each.values()), rel=0.03), (card.value, each)
    assert "the lowest of 2 configurations" in card.detail


SEED_NUMBER = re.compile(r"\bseed \d{3}\b", re.I)


def test_no_seed_numbers_in_help_or_readme() -> None:
    """A new user never met the seeds: README's prose and every --help link docs/seeds.md
    instead of saying which seed."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert SEED_NUMBER.findall(readme) == []
    assert "docs/seeds.md" in readme
    commands = [[], ["benchmark"], ["profile"], ["profile", "analyze"], ["profile", "diff"],
                ["report"], ["report", "generate"], ["compare"], ["project"], ["tune"],
                ["validate"]]  # fmt: skip
    for command in commands:
        shown = runner.invoke(app, [*command, "--help"], terminal_width=200)
        assert shown.exit_code == 0, (command, shown.output)
        assert SEED_NUMBER.findall(shown.output) == [], command
    benchmark = runner.invoke(app, ["benchmark", "--help"], terminal_width=200).output
    assert "docs/seeds.md" in " ".join(benchmark.replace("│", " ").split())


def test_no_run_output_is_tracked_at_the_root() -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    top = {line.split("/")[0] for line in tracked}
    outputs = sorted(n for n in top if re.fullmatch(r"slurm-\d+\.out|results|.*\.jsonl", n))
    assert outputs == []
    ignored = (REPO / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert "/slurm-*.out" in ignored and "/results/" in ignored


@pytest.mark.slow
def test_built_in_models_on_cpu_say_the_threads_each_rank_runs(healthy_run: Run) -> None:
    """On CPU every rank of a built-in model runs its slot's share of the cores (the same at every
    rank count); the console says what was set and why, and each record holds it."""
    from torchscale.hardware.environment import cpu_slots, threads_per_cpu_slot

    run = healthy_run
    said = " ".join(run.result.stderr.split())
    threads = threads_per_cpu_slot()
    assert (
        f"Threads: each CPU process of a built-in model runs {threads} intra-op thread(s) "
        f"({os.cpu_count()} core(s) over {cpu_slots()} slot(s)), the same at every rank count"
    ) in said
    found = ExperimentStore(run.experiment_dir).records()
    assert {r.world_size for r in found} == {1, 2}
    assert {r.runtime["intra_op_threads"] for r in found} == {threads}  # type: ignore[attr-defined]
