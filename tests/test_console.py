"""What a user reads on the console, escaped for the terminal: every
table at 80 columns through the one renderer with every number whole, "CPU process" where the
ranks are CPU processes, defaults that fit the node, the small ones, and no control character
from a name ever reaching the terminal."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from tests.support.report_fixtures import MODELS, FixtureSpec, write_experiment
from tests.support.shared_runs import Run
from tests.test_escaping import HOSTILE
from torchscale.cli import console as console_module
from torchscale.cli.app import app
from torchscale.escaping import for_terminal
from torchscale.measures.figures import GLOSSARY_DOC

pytestmark = pytest.mark.timed  # the projection's error; a piped log's lines within a window

runner = CliRunner()
WIDTH = 80


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The console as a CI log has it: 80 columns, not a terminal."""
    for console in (console_module.err_console, console_module.result_console):
        monkeypatch.setattr(console, "width", WIDTH)
    yield


def lines_of(text: str) -> List[str]:
    return text.splitlines()


def assert_fits(text: str) -> None:
    """No line over 80 columns and no number or name cut short."""
    assert "…" not in text, text
    too_wide = [line for line in lines_of(text) if len(line) > WIDTH]
    assert too_wide == [], too_wide


def _console() -> Console:
    return Console(file=io.StringIO(), width=WIDTH, force_terminal=False, color_system=None)


def _printed(console: Console) -> str:
    return console.file.getvalue()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    """A baseline and a run whose resnet is 30% slower, as ``benchmark`` writes them."""
    root = tmp_path_factory.mktemp("console-runs")
    spec = FixtureSpec(findings=False)
    old = write_experiment(root / "old", spec)
    new = write_experiment(root / "new", replace(spec, seed=1, slowdown={"resnet-synthetic": 1.3}))
    return {"old": old, "new": new}


# --- every table at 80 columns -------------------------------------------------------------


def test_compare_at_80_columns_keeps_every_change_and_interval_whole(
    two_runs: Dict[str, Path], narrow: None
) -> None:
    args = ["compare", str(two_runs["old"]), str(two_runs["new"])]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 1, result.output  # the planted slowdown regressed
    table = result.stderr.split("cell(s) regressed")[0]
    assert_fits(table)
    cells = json.loads(result.stdout)["cells"]
    for cell in cells:
        for key in ("throughput", "p95"):
            assert f"{cell[f'{key}_change_pct']:+.1f}%" in table
            low, high = cell[f"{key}_ci_low_pct"], cell[f"{key}_ci_high_pct"]
            assert f"{low:+.1f}..{high:+.1f}%" in table
        assert cell["verdict"] in table
    # What was left out, and where the figures are defined: as benchmark's table says them.
    caption = " ".join(table.split())
    assert "not shown:" in caption and f"(see --json; figures: {GLOSSARY_DOC})" in caption
    assert f"figures compared. Figures: {GLOSSARY_DOC}." in " ".join(result.stderr.split())


def test_project_at_80_columns_keeps_every_prediction_whole(
    two_runs: Dict[str, Path], narrow: None
) -> None:
    from torchscale.report import formatting as fmt

    result = runner.invoke(app, ["project", "-s", str(two_runs["old"]), "--holdout", "--json"])
    assert result.exit_code == 0, result.output
    table = result.stderr.split("Projected scaling")[1].split("> [INFO] Holdout")[0]
    assert_fits(table)
    for row in json.loads(result.stdout)["predictions"]:
        for key in ("step_ms", "throughput", "measured_throughput"):
            assert fmt.significant(row[key]) in table
        assert f"{100 * row['error']:+.1f}%" in table
    assert "from" not in table  # GPU measurements: no CPU column


@pytest.mark.slow  # the shared projection run (training and all_reduce cells on CPU processes)
def test_project_from_cpu_processes_says_so_on_every_row(projection_run: Run, narrow: None) -> None:
    source = projection_run.experiment_dir
    result = runner.invoke(
        app, ["project", "-s", str(source), "--gpus", "64", "256", "--inter-node-gbps", "25"]
    )
    assert result.exit_code == 0, result.output
    table = result.stderr.split("Projected scaling")[1].split("> [WARN] Rows from CPU")[0]
    assert_fits(table)
    rows = [line for line in lines_of(table) if line.startswith("gpt2-tiny")]
    assert len(rows) == 2 and all(row.rstrip().endswith("CPU") for row in rows)
    assert "ranks" in table and "GPUs" not in table
    assert "not what GPUs would do" in result.stderr
    assert "from 2 CPU processes" in result.stderr  # the basis names what it starts from
    # without an assumed network the error names the flag that supplies one
    refused = runner.invoke(app, ["project", "-s", str(source), "--gpus", "64", "256"])
    assert refused.exit_code == 2
    (error,) = [line for line in refused.stderr.splitlines() if line.startswith("Error:")]
    assert "64 CPU processes span 8 nodes" in error and "--inter-node-gbps" in error


def test_comm_summary_at_80_columns_keeps_every_figure_whole(
    two_runs: Dict[str, Path],
) -> None:
    from torchscale.comm.result_tables import collective_table, peak_busbw
    from torchscale.plan.kind_protocol import cell_kinds
    from torchscale.results.store import ExperimentStore

    console = _console()
    records = ExperimentStore(two_runs["old"]).records()
    collectives = collective_table(records)
    title = f"fixture-scaling ({two_runs['old']})"
    for kind in cell_kinds().values():  # the communication kind's summary, as benchmark prints it
        for table in kind.console_tables(records, title, console):
            console.print(table)
    text = _printed(console)
    assert_fits(text)
    for row in peak_busbw(collectives).itertuples():
        assert f"{row.busbw_gbps:,.2f} GB/s busbw" in text
    assert "failed" in text and "float32" in text  # said once, under the table


def test_tune_finalists_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchscale.cli.tune_command as tune

    console = _console()
    monkeypatch.setattr(tune, "err_console", console)
    finalists = [
        {"trial": 7, "changed": {"ddp.bucket_cap_mb": 100.0, "ddp.gradient_as_bucket_view": True},
         "samples_per_s": 12345.678, "baseline_samples_per_s": 11000.0, "gain_pct": 12.23,
         "ci_low_pct": 8.04, "ci_high_pct": 16.51, "significant": True, "note": ""},
        {"trial": 12, "changed": {"data.num_workers": 4}, "samples_per_s": 11100.5,
         "baseline_samples_per_s": 11000.0, "gain_pct": 0.91, "ci_low_pct": -1.52,
         "ci_high_pct": 3.37, "significant": False, "note": "not beyond noise"},
    ]  # fmt: skip
    summary = {"verdict": {"finalists": finalists}, "tune_dir": "results/x/tune"}
    table = tune.finalists_table(summary)
    assert table is not None
    console.print(table)
    text = _printed(console)
    assert_fits(text)
    for finalist in finalists:
        assert f"{finalist['samples_per_s']:,.1f}" in text
        assert f"{finalist['gain_pct']:+.1f}%" in text
        assert f"{finalist['ci_low_pct']:+.1f}..{finalist['ci_high_pct']:+.1f}%" in text
    assert "11,000.0 samples/s" in text and "not beyond noise" in text


def test_validate_says_a_shared_fix_once(narrow: None) -> None:
    from torchscale.cli.validate_command import render

    same = "Needs an NVIDIA GPU: nothing to fix on a CPU-only node."
    names = ["CUDA", "MIG mode", "ECC", "Power", "Temperature", "NVLink"]
    checks = [{"name": n, "status": "SKIP", "value": "no GPU", "fix": same} for n in names]
    checks.append({"name": "Hostname resolution", "status": "WARN", "value": "loopback only",
                   "fix": "Map the hostname to the node's routable address."})  # fmt: skip
    report = {"host": "cpu-node", "backend": "gloo", "duration_s": 1.0, "checks": checks,
              "summary": {"pass": 0, "warn": 1, "fail": 0, "skip": 6, "ok": True}}  # fmt: skip
    console = _console()
    render(report, console)
    text = _printed(console)
    assert_fits(text)
    assert text.count(same) == 1 and text.count("see note 1") == len(names)
    assert f"note 1 ({len(names)} checks): {same}" in text
    assert "Map the hostname" in text  # a fix of its own stays on its row


def test_wrapped_names_break_where_a_reader_expects() -> None:
    from torchscale.console_tables import wrap_text

    assert wrap_text("mylab.fault_models:slow_rank_model", 20) == (
        "mylab.fault_models:\nslow_rank_model"
    )
    assert wrap_text("bucket_cap_mb=5, static_graph=true", 18) == (
        "bucket_cap_mb=5,\nstatic_graph=true"
    )
    assert wrap_text("resnet-tiny", 18) == "resnet-tiny"
    long = "x" * 30
    assert wrap_text(long, 18).replace("\n", "") == long  # split, never lost


# --- "CPU process" where the ranks are CPU processes --------------------------------------------


def test_cpu_results_say_ranks_and_cpu_processes_not_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchscale.cli.benchmark_view as view

    console = _console()
    monkeypatch.setattr(view, "err_console", console)
    table = pd.DataFrame(
        [{"model": m, "batch_size": 8, "world_size": 1, "nnodes": 1, "precision": "fp32",
          "status": "ok", "throughput": 1234.5 * (i + 1), "unit": "images", "step_ms_p50": 6.7,
          "step_ms_p95": 7.9, "sync_overhead_pct": float("nan"), "scaling_efficiency": 1.0,
          "mfu": float("nan")} for i, m in enumerate(["resnet-tiny", "a-much-longer-model-name",
                                                      "third-model-with-a-long-name"])]
    )  # fmt: skip
    console.print(view.results_table(table, "cpu run (results/cpu-run)", "cpu"))
    text = _printed(console)
    assert_fits(text)
    assert "1 CPU process" in text and "GPU" not in text


def test_device_words_come_from_one_place() -> None:
    from torchscale.hardware.device_noun import count_text, records_device_kind
    from torchscale.hardware.environment import NodeDevices
    from torchscale.results.schema import TrainingResult

    assert [count_text(n, "cpu") for n in (1, 2)] == ["1 CPU process", "2 CPU processes"]
    assert [count_text(n, "cuda") for n in (1, 4)] == ["1 GPU", "4 GPUs"]
    assert NodeDevices("cpu", 2, ["x86_64"] * 2).describe(1) == "1 CPU process"
    base: Dict[str, Any] = {"cell_id": "c", "experiment": "e", "model": "m", "batch_size": 1,
            "global_batch_size": 1, "precision": "fp32", "world_size": 1, "nnodes": 1,
            "nproc_per_node": 1, "status": "ok"}  # fmt: skip
    cpu = TrainingResult(**base, device_name="cpu")
    gpu = TrainingResult(**base, device_name="NVIDIA H100 80GB HBM3")
    never_ran = TrainingResult(**{**base, "status": "skipped"})
    assert records_device_kind([cpu, never_ran]) == "cpu"
    assert records_device_kind([cpu, gpu]) == "cuda"


# --- defaults that work where they run -----------------------------------------------------------


def test_profile_gpus_fit_the_node_or_fail_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchscale.app.profile import CaptureRequest, fitted_gpus
    from torchscale.errors import TorchscaleError
    from torchscale.hardware.environment import NodeDevices

    node = NodeDevices("cpu", 2, ["x86_64"] * 2)
    default = CaptureRequest(None, 10.0, "all", "auto", model="resnet-tiny", batch_size=8)
    gpus, said = fitted_gpus(default, node)
    assert gpus == 2 and said is not None
    assert "Profiling on 2 CPU processes" in said and "default is 4 CPU processes" in said
    assert fitted_gpus(replace(default, gpus=2), node) == (2, None)
    with pytest.raises(TorchscaleError, match="pass --gpus 2, or set TORCHSCALE_CPU_SLOTS=4"):
        fitted_gpus(replace(default, gpus=4), node)

    monkeypatch.setenv("TORCHSCALE_CPU_SLOTS", "2")
    out = tmp_path / "out"
    cases = [
        (["--model", "resnet-tiny", "-b", "8", "--gpus", "4"], "--gpus 4 needs 4 CPU processes"),
        (["--model", "resnet-tiny"], "--model resnet-tiny needs --batch-size"),
        (["--model", "resnt-tiny", "-b", "8"], "unknown model 'resnt-tiny'"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["profile", *args, "-o", str(out)])
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith("Error:") and message in result.stderr
        assert "Results go to" not in result.stderr and "Traceback" not in result.stderr
        assert not out.exists()


def test_gpu_sized_models_on_cpu_are_warned_with_the_time_a_cell_takes(tmp_path: Path) -> None:
    from torchscale.config.loader import load_config
    from torchscale.hardware.peaks import CPU_PROCESS_TFLOPS
    from torchscale.models.flops import rough_training_flops
    from torchscale.models.registry import describe
    from torchscale.plan.cpu_size import LAUNCH_S, gpu_sized_warnings

    config = load_config(None, base={"experiment_name": "x", "models": ["resnet50", "gpt2-tiny"],
                                     "batch_sizes": [32], "warmup_steps": 2, "measure_steps": 10,
                                     "sync_probe_steps": 0})  # fmt: skip
    (line,) = gpu_sized_warnings(config, "cpu")  # gpt2-tiny is small
    entry = describe("resnet50")
    assert entry is not None
    step_s = 32 * rough_training_flops("vision", entry.params) / (CPU_PROCESS_TFLOPS * 1e12)
    minutes = (LAUNCH_S + 12 * step_s) / 60
    assert line.startswith("resnet50 is a GPU-sized model (26M parameters)")
    assert f"about {minutes:.0f} min here" in line and "use resnet-tiny" in line
    assert gpu_sized_warnings(config, "cuda") == []


# --- the small ones --------------------------------------------------------------------------------


PLAN = """\
experiment_name: small-ones
models: [gpt2-tiny]
batch_sizes: [2, 4]
gpu_counts: [1, 2]
precision: [fp32, fp16]
"""


def test_dry_run_shows_precision_once_in_run_order_and_fp16_is_said_to_be_amp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHSCALE_CPU_SLOTS", "2")
    config = tmp_path / "c.yaml"
    config.write_text(PLAN)
    args = ["benchmark", "-c", str(config), "-o", str(tmp_path / "out"), "--dry-run"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    header = next(line for line in result.stderr.splitlines() if " cell " in line)
    assert header.split().count("precision") == 1
    assert f"precision fp16 in {config} runs as 'amp'" in " ".join(result.stderr.split())
    plan = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    # the run's order: every 1-rank cell in one warm launch, then the 2-rank ones
    assert [entry["settings"]["gpus"] for entry in plan] == [1, 1, 1, 1, 2, 2, 2, 2]


def test_run_order_is_the_order_the_sweep_launches() -> None:
    from torchscale.config.loader import load_config
    from torchscale.launch.warm_groups import PER_CELL, PER_GROUP, launch_units, run_order
    from torchscale.plan.matrix import expand

    raw: Dict[str, object] = {"experiment_name": "x", "models": ["gpt2-tiny", "resnet-tiny"], "batch_sizes": [2, 4],
           "gpu_counts": [1, 2, 4], "compile": [False, True]}  # fmt: skip
    cells = expand(load_config(None, base=raw)).cells

    def alone(cell: Any) -> bool:  # as a compiled cell or one this node skips is
        return bool(cell.settings.compile) or cell.settings.gpus == 4

    for mode in (PER_GROUP, PER_CELL):
        ran = [c.cell_id for unit in launch_units(cells, mode, alone) for c in unit]
        assert [c.cell_id for c in run_order(lambda: iter(cells), mode, alone)] == ran
    assert ran != [c.cell_id for c in cells] or mode == PER_CELL


def test_resume_dry_run_lists_only_what_would_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchscale.config.settings import CellSettings
    from torchscale.results.layout import experiment_dir
    from torchscale.results.schema import CellStatus as Status
    from torchscale.results.schema import TrainingResult
    from torchscale.results.store import ExperimentStore

    monkeypatch.setenv("TORCHSCALE_CPU_SLOTS", "2")
    config = tmp_path / "c.yaml"
    config.write_text(PLAN)
    out = tmp_path / "out"
    args = ["benchmark", "-c", str(config), "-o", str(out), "--dry-run", "--json"]
    plan = json.loads(runner.invoke(app, args).stdout)
    store = ExperimentStore(experiment_dir(out, "small-ones"))
    store.root.mkdir(parents=True)
    finished = plan[:3]
    # records --resume keeps (an ok one would need every figure: skipped ones keep it short)
    statuses: Tuple[Status, ...] = ("skipped", "oom", "failed")
    for entry, status in zip(finished, statuses):
        settings = CellSettings.model_validate(entry["settings"])
        store.append(
            TrainingResult(
                cell_id=entry["cell_id"], experiment="small-ones", model=settings.model,
                batch_size=settings.batch_size, global_batch_size=settings.batch_size,
                precision=settings.precision, world_size=settings.gpus, nnodes=1,
                nproc_per_node=settings.gpus, settings=entry["settings"], status=status,
            )
        )  # fmt: skip
    before = store.results_path.read_bytes()
    resumed = json.loads(runner.invoke(app, [*args, "--resume"]).stdout)
    assert sorted(e["cell_id"] for e in resumed) == sorted(e["cell_id"] for e in plan[3:])
    gpus = [e["settings"]["gpus"] for e in resumed]  # still one warm launch per rank count
    assert gpus == sorted(gpus, key=gpus.index)
    retried = json.loads(runner.invoke(app, [*args, "--resume", "--retry-failed"]).stdout)
    assert sorted(e["cell_id"] for e in retried) == sorted(e["cell_id"] for e in plan[2:])
    table = runner.invoke(app, [a for a in args if a != "--json"] + ["--resume"])
    assert "3 cell(s) already have results" in table.stderr
    assert all(e["cell_id"] not in table.stderr for e in finished)
    # A narrower config over the same folder: only its own cells with results are counted.
    config.write_text(PLAN.replace("batch_sizes: [2, 4]", "batch_sizes: [2]"))
    narrow = [e for e in plan if e["settings"]["batch_size"] == 2]
    have = [e for e in finished if e["settings"]["batch_size"] == 2]
    assert 0 < len(have) < len(finished)
    resumed = json.loads(runner.invoke(app, [*args, "--resume"]).stdout)
    assert sorted(e["cell_id"] for e in resumed) == sorted(
        e["cell_id"] for e in narrow if e not in have
    )
    table = runner.invoke(app, [a for a in args if a != "--json"] + ["--resume"])
    assert table.exit_code == 0, table.output
    note = " ".join(table.stderr.split())
    assert f"; {len(have)} cell(s) already have results in" in note, note
    assert all(e["cell_id"] in note for e in resumed)
    assert store.results_path.read_bytes() == before  # a dry run writes nothing


# --- no control character from a name reaches the terminal -------------------------------------------


def _no_escape(result: Any) -> None:
    for stream in (result.stdout, result.stderr):
        assert "\x1b" not in stream and "\x9b" not in stream and "\u202e" not in stream


@pytest.mark.parametrize("name", [*HOSTILE, "a[/bold]b[red]"])  # the last: Rich markup
def test_hostile_names_never_reach_the_terminal(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, narrow: None
) -> None:
    monkeypatch.setenv("TORCHSCALE_CPU_SLOTS", "2")
    shown = for_terminal(name)
    # an unknown model, echoed by the error line
    result = runner.invoke(app, ["profile", "--model", name, "-b", "2", "-o", str(tmp_path)])
    assert result.exit_code == 2 and shown in result.stderr
    _no_escape(result)
    config = tmp_path / "c.yaml"
    config.write_text(f"experiment_name: x\nmodels: [{json.dumps(name)}]\n")
    result = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(tmp_path / "o")])
    assert result.exit_code == 2 and shown in result.stderr
    _no_escape(result)
    # the experiment name in the plan's title
    config.write_text(f"experiment_name: {json.dumps(name)}\nmodels: [gpt2-tiny]\n")
    dry_run = ["benchmark", "-c", str(config), "-o", str(tmp_path / "o"), "--dry-run"]
    result = runner.invoke(app, dry_run)
    assert result.exit_code == 0 and shown in result.stderr
    _no_escape(result)
    # results whose experiment and model carry the name: every table and line that shows them
    spec = FixtureSpec(
        name=name,
        models=(replace(MODELS[0], name=name), MODELS[1]),
        batch_sizes=(32,),
        gpu_counts=(1, 2, 4),
        findings=False,
    )
    old = write_experiment(tmp_path / "old", spec)
    new = write_experiment(tmp_path / "new", replace(spec, seed=2))
    for command in (["compare", str(old), str(new)], ["project", "-s", str(old), "--holdout"]):
        result = runner.invoke(app, command)
        assert result.exit_code in (0, 1), result.output
        assert shown in result.stderr or shown[:10] in result.stderr
        _no_escape(result)


def test_the_console_escapes_what_any_string_holds() -> None:
    console = console_module.TerminalConsole(
        file=io.StringIO(), width=WIDTH, force_terminal=False, color_system=None
    )
    for name in HOSTILE:
        console.print(f"markup [bold]{name}[/bold]")
        console.print(name, markup=False)
    text = _printed(console)
    assert "\x1b" not in text and "\\x1b]0;owned\\x07" in text and "\\u202e" in text


# --- progress in a log, and the line a traced cell ends with ---------------------------------------


def test_where_a_cell_is_comes_from_rank_zeros_files(tmp_path: Path) -> None:
    from torchscale.config.settings import CellSettings
    from torchscale.launch.cell_progress import cell_progress
    from torchscale.results.rank_files import RankReporter

    settings = CellSettings(
        model="gpt2-tiny", batch_size=2, gpus=1, warmup_steps=3, measure_steps=10
    )
    reporter = RankReporter(tmp_path, 0)
    assert cell_progress(tmp_path, settings) is None  # rank 0 has said nothing yet
    seen = []
    for window, steps, detail in (
        ("build", 0, {}),
        ("warmup", 2, {}),
        ("measure", 4, {"steps": 10}),
    ):
        reporter.phase(window, **detail)
        for _ in range(steps):
            reporter.steps.start_step()
        found = cell_progress(tmp_path, settings)
        assert found is not None
        seen.append(found.describe())
    assert seen == ["building the model", "warm-up, step 2/3", "measuring, step 4/10"]


PROGRESS_CONFIG = """\
experiment_name: "progress\\e]0;owned\\a"
models: [gpt2-tiny]
batch_sizes: [4]
gpu_counts: [2]
warmup_steps: 2
measure_seconds: 8
sync_probe_steps: 3
profiling:
  enabled: true
  trigger: sync_stall_detection
  sync_stall_threshold: 0.0
  duration_s: 1
"""


@pytest.mark.slow
def test_a_piped_log_hears_from_a_running_cell_and_of_what_its_trace_found(
    tmp_path: Path,
) -> None:
    """One real 2-rank cell, stderr a file (a CI log): a line at least every 10 s saying where
    the cell is, a final line naming why it was traced, where and the top finding, and the
    experiment's escape sequence shown escaped in the final table's title."""
    import os
    import subprocess
    import sys

    from tests.support.environ import repo_pythonpath
    from torchscale.analysis.finding import severity_order
    from torchscale.launch.cell_progress import WINDOW_NAMES
    from torchscale.results.schema import TrainingResult
    from torchscale.results.store import ExperimentStore, find_experiments

    config = tmp_path / "progress.yaml"
    config.write_text(PROGRESS_CONFIG)
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": repo_pythonpath()}
    log = tmp_path / "stderr.log"
    with open(log, "wb") as err:
        done = subprocess.run(
            [sys.executable, "-m", "torchscale", "benchmark", "-c", str(config), "-o",
             str(tmp_path / "out")],
            stdout=subprocess.PIPE, stderr=err, env=env, timeout=300, check=False,
        )  # fmt: skip
    text = log.read_text(encoding="utf-8")
    assert done.returncode == 0, text
    assert b"\x1b" not in log.read_bytes() and b"\x1b" not in done.stdout
    assert "progress\\x1b]0;owned\\x07" in text  # the title, shown escaped
    (folder,) = find_experiments(tmp_path / "out")
    (record,) = ExperimentStore(folder).records()
    assert isinstance(record, TrainingResult)
    assert record.wall_s is not None and record.profile is not None and record.profile.profiled

    said = [line for line in text.splitlines() if line.startswith("> [PROGRESS] ")]
    # measure_seconds 8 keeps the cell past the first line's 10 s on a quiet node too (launch,
    # warm-up, window, probe and trace): a 9 s cell rightly prints none
    assert record.wall_s > 10, record.wall_s
    assert len(said) >= int(record.wall_s // 10), text
    windows = tuple(WINDOW_NAMES.values())
    for line in said:
        assert line.startswith("> [PROGRESS] gpt2-tiny on 2 CPU processes (batch 4, fp32): ")
        assert line.endswith(" s elapsed")
    assert any(window in line for line in said for window in windows), said
    for line in said:
        if "measuring, step " in line:
            step, steps = line.split("measuring, step ")[1].split(",")[0].split("/")
            assert int(step) <= int(steps) == record.measure_steps

    (traced,) = [line for line in text.splitlines() if line.startswith("> [PROFILE] ")]
    trace_dir = ExperimentStore(folder).cell_dir(record.cell_id) / (record.profile.dir or "")
    findings = json.loads((trace_dir / "findings.json").read_text())["findings"]
    top = min(findings, key=lambda f: severity_order(f["severity"]))
    assert f": traced: {record.profile.reason}; traces in " in traced
    assert str(trace_dir) in "".join(text.split("> [PROFILE] ")[1].splitlines()[:3])
    assert f"top finding ({top['severity']}): " in traced
    assert any(trace_dir.glob("rank0*"))
