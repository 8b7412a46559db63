"""Each seed's own outputs (docs/seeds.md): the Distributed Training Profiler's PNG charts,
TensorBoard tags and GPU memory utilisation; distributed_benchmarks' ``benchmark_<N>gpu.json``
written by the benchmark; the TorchScale README's ``--quiet``, ``> [ANALYSIS]`` lines and ``requirements.txt``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from typer.testing import CliRunner

from tests.support.report_fixtures import MODELS, FixtureSpec, write_experiment
from tests.support.sweep_records import (
    COMM_CONFIG,
    NVML_FIXTURE,
    SweepRun,
    training_sweep,
)
from torchscale.cli.app import app
from torchscale.measures.figures import SYNC_STALL
from torchscale.results.layout import PNG_CHARTS, gpu_document_file
from torchscale.results.schema import CommResultBase, TpGemmResult
from torchscale.results.store import ExperimentStore

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
runner = CliRunner()


def _lines(text: str) -> List[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_a_backend_sweep_counts_every_cell(tmp_path: Path) -> None:
    """DDLB's ``backend: [auto, gloo]``: the plan counts (and --max-cells checks) both cells."""
    from torchscale.comm.plan import comm_settings, count_comm
    from torchscale.config.loader import load_config

    config = tmp_path / "c.yaml"
    config.write_text(COMM_CONFIG.replace("backend: gloo", "backend: [auto, gloo]"), "utf-8")
    loaded = load_config(config)
    cells = comm_settings(loaded, 8)
    assert sorted(c.backend for c in cells) == ["auto", "gloo"]
    assert count_comm(loaded, 8) == (len(cells), [f"communication {len(cells)}"])


# --- Distributed Training Profiler ---------------------------------------------------------------------------------


def test_report_format_png_writes_the_key_charts(tmp_path: Path) -> None:
    """One PNG per kind of chart, one panel per chart: the histogram has one per configuration."""
    pytest.importorskip("matplotlib")
    from PIL import Image

    from torchscale.report.png_charts import DPI, PANEL_INCHES

    spec = FixtureSpec(name="png", models=MODELS[:1], batch_sizes=(16, 32, 64),
                       gpu_counts=(1, 2), steps=12, straggler=None, failures=False,
                       findings=False)  # fmt: skip
    write_experiment(tmp_path, spec)
    out = tmp_path / "charts"
    result = runner.invoke(app, ["report", "-s", str(tmp_path), "-f", "png", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert f"> PNG charts written to {out}" in result.stderr
    files = {p.name for p in out.iterdir()}
    assert {"latency_histogram.png", "scaling_efficiency.png", "throughput.png",
            "step_time.png", "bandwidth.png"} <= files <= set(PNG_CHARTS.values())  # fmt: skip
    with Image.open(out / "latency_histogram.png") as image:
        assert image.format == "PNG"
        panels = len(spec.batch_sizes)  # one histogram per configuration (batch size)
        assert image.size == (round(PANEL_INCHES[0] * DPI), round(panels * PANEL_INCHES[1] * DPI))
        colours = image.convert("RGB").getcolors(1 << 20) or []
        assert len(colours) > 10  # drawn: bars, text and axes, not a blank canvas


def test_png_charts_keep_every_configurations_panel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten configurations: ten histogram panels, eight in ``latency_histogram.png`` and the rest in
    ``latency_histogram_2.png``; the console names every file written."""
    pytest.importorskip("matplotlib")
    from PIL import Image

    from torchscale.report import png_charts

    batches = tuple(range(8, 18))
    spec = FixtureSpec(name="png-many", models=MODELS[:1], batch_sizes=batches, gpu_counts=(1, 2),
                       steps=12, straggler=None, failures=False, findings=False,
                       collectives=False)  # fmt: skip
    write_experiment(tmp_path, spec)
    titles: List[str] = []  # every panel drawn, read back from the figures' axes

    def spy(charts: list) -> object:
        figure = draw(charts)
        titles.extend(ax.get_title(loc="left") for ax in figure.axes)
        return figure

    draw = png_charts.draw_figure
    monkeypatch.setattr(png_charts, "draw_figure", spy)
    out = tmp_path / "charts"
    result = runner.invoke(app, ["report", "-s", str(tmp_path), "-f", "png", "-o", str(out)])
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in out.iterdir())
    assert {"latency_histogram.png", "latency_histogram_2.png"} <= set(files)
    assert "latency_histogram_3.png" not in files
    line = next(x for x in result.stderr.splitlines() if x.startswith("> PNG charts written"))
    assert f"({len(files)} files)" in line
    assert sorted(line.split(": ", 1)[1].split(", ")) == files
    histograms = [t for t in titles if t.startswith("Step-time histogram")]
    assert sorted(histograms) == sorted(
        f"Step-time histogram — {MODELS[0].name}, batch {b}" for b in batches
    )
    width, panel = round(png_charts.PANEL_INCHES[0] * png_charts.DPI), png_charts.PANEL_INCHES[1]
    for name, panels in (("latency_histogram.png", 8), ("latency_histogram_2.png", 2)):
        with Image.open(out / name) as image:
            assert image.size == (width, round(panels * panel * png_charts.DPI)), name


def test_gpu_memory_utilisation_and_tensorboard_tags(tmp_path: Path) -> None:
    """GPU memory utilisation from NVML (recorded H100 answers through the real sampler), "–" on
    CPU; TensorBoard's own reader finds the Distributed Training Profiler's tags with the records' values."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from torchscale.analysis.training_tables import training_table
    from torchscale.integrations.run_names import row_for
    from torchscale.integrations.tensorboard_events import write_cell
    from torchscale.report import formatting as fmt

    nvml = json.loads(NVML_FIXTURE.read_text(encoding="utf-8"))["devices"]
    records = [r for r in training_sweep("tb") if r.world_size == 2]
    record = records[0]
    memory = [nvml[r.rank]["nvmlDeviceGetMemoryInfo"] for r in record.per_rank]
    expected_memory = max(100 * m["used"] / m["total"] for m in memory)
    utilisation = [nvml[r.rank]["nvmlDeviceGetUtilizationRates"]["gpu"] for r in record.per_rank]
    comm = [r.ddp_backward_comm_ms or 0.0 for r in record.per_rank]
    compute = [
        (r.ddp_forward_compute_ms or 0.0) + (r.ddp_backward_compute_ms or 0.0)
        for r in record.per_rank
    ]
    assert all(
        None not in (r.ddp_backward_comm_ms, r.ddp_forward_compute_ms, r.ddp_backward_compute_ms)
        for r in record.per_rank
    )
    table = training_table(records)
    row = row_for(table, record.cell_id)
    assert row is not None and row["gpu_memory_util_pct"] == pytest.approx(expected_memory)
    path = write_cell(tmp_path, record, ["precision", "ddp.bucket_cap_mb"], row)
    accumulator = EventAccumulator(str(path), size_guidance={"scalars": 0})
    accumulator.Reload()

    def tag(name: str) -> float:
        return float(accumulator.Scalars(name)[0].value)

    assert tag("gpu/memory_util_pct") == pytest.approx(expected_memory, rel=1e-6)
    assert tag("gpu/util_pct") == pytest.approx(sum(utilisation) / len(utilisation), rel=1e-6)
    assert tag("comm/time_per_step_ms") == pytest.approx(sum(comm) / len(comm), rel=1e-6)
    assert tag("comm/compute_ratio") == pytest.approx(sum(comm) / sum(compute), rel=1e-6)
    # A CPU rank has no NVML: no GPU tags, and the tables say "–".
    cpu = record.model_copy(update={
        "cell_id": "cpu", "per_rank": [r.model_copy(update={"gpu": None}) for r in record.per_rank]
    })  # fmt: skip
    cpu_row = row_for(training_table([cpu]), "cpu")
    assert cpu_row is not None and fmt.significant(cpu_row["gpu_memory_util_pct"]) == "–"
    cpu_path = write_cell(tmp_path / "cpu", cpu, [], cpu_row)
    cpu_events = EventAccumulator(str(cpu_path), size_guidance={"scalars": 0})
    cpu_events.Reload()
    tags = set(cpu_events.Tags()["scalars"])
    assert "comm/time_per_step_ms" in tags and not {t for t in tags if t.startswith("gpu/")}


# --- distributed_benchmarks ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_benchmark_writes_the_json_document_of_what_ran(comm_sweep_run: SweepRun) -> None:
    sweep = comm_sweep_run
    path = sweep.experiment_dir / gpu_document_file(2)
    document = json.loads(path.read_text(encoding="utf-8"))
    records = ExperimentStore(sweep.experiment_dir).records()
    assert document["name"] == "benchmark_2gpu" and document["world_size"] == 2
    assert isinstance(records[0], CommResultBase)
    assert document["backend"] == records[0].backend == "gloo"
    config = document["config"]
    assert (config["warmup_iters"], config["benchmark_iters"]) == (2, 5)  # the YAML's warmup, n
    assert config["iterations"] == {"communication": {"warmup": [2], "measured": [5]}}
    gemm = {(e["dtype"], e["order"]): e["time_us"] for e in document["results"]["tp_gemm"]}
    assert gemm == {(r.dtype, r.order): r.time_us for r in records if isinstance(r, TpGemmResult)}
    assert document["results"]["training"] == []


# --- TorchScale README ---------------------------------------------------------------------------------


def test_quiet_report_and_validate_print_only_results(tmp_path: Path) -> None:
    write_experiment(tmp_path, FixtureSpec(name="quiet", models=MODELS[:1], batch_sizes=(8,),
                                           gpu_counts=(1, 2), steps=8, findings=False))  # fmt: skip
    out = tmp_path / "r.json"
    quiet = runner.invoke(
        app, ["--quiet", "report", "-s", str(tmp_path), "-f", "json", "-o", str(out)]
    )
    assert quiet.exit_code == 0 and _lines(quiet.stderr) == [f"> Report written to {out}"]
    checks = runner.invoke(app, ["--quiet", "validate", "--skip-smoke", "--json"])
    report = json.loads(checks.stdout)
    flagged = [c for c in report["checks"] if c["status"] in ("WARN", "FAIL")]
    shown = checks.stderr
    *rows, verdict = _lines(shown)
    s = report["summary"]
    assert verdict.startswith(f"{s['pass']} PASS, {s['warn']} WARN, {s['fail']} FAIL")
    statuses = re.findall(r"\b(PASS|WARN|FAIL|SKIP)\b", "\n".join(rows))
    assert sorted(statuses) == sorted(c["status"] for c in flagged)  # one row per warning
    assert all(c["name"] in shown for c in flagged)
    loud = runner.invoke(app, ["validate", "--skip-smoke"])
    assert all(c["name"] in loud.stderr for c in report["checks"])
    assert len(_lines(shown)) < len(_lines(loud.stderr))


def test_quiet_profile_prints_the_seeds_analysis_lines(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    shutil.copytree(DATA / "nsys_2rank", folder)
    result = runner.invoke(app, ["profile", "analyze", str(folder), "--target", "sync_stalls"])
    quiet = runner.invoke(
        app, ["--quiet", "profile", "analyze", str(folder), "--target", "sync_stalls"]
    )
    assert result.exit_code == quiet.exit_code == 0, quiet.output
    findings = json.loads((folder / "findings.json").read_text(encoding="utf-8"))["findings"]
    lines = _lines(quiet.stderr)
    # "> [ANALYSIS] Sync stall time: ..." (the seed's words, the glossary's name), "> [ANALYSIS]
    # Found N bottleneck(s):", then each finding and its recommendation, as the seed's README
    # shows them; nothing else.
    assert len(lines) == 2 + 2 * len(findings)
    assert lines[0].startswith(f"> [ANALYSIS] {SYNC_STALL.title}: ")
    assert lines[0].startswith("> [ANALYSIS] Sync stall time: ")
    assert lines[1] == f"> [ANALYSIS] Found {len(findings)} bottleneck(s):"
    assert lines[2] == f">   1. {findings[0]['title']} ({findings[0]['severity']})"
    assert all(line.startswith("> ") for line in lines)
    loud = _lines(result.stderr)
    assert all(line in loud for line in lines) and len(loud) > len(lines)
    assert all(line.startswith(">") for line in loud if "[ANALYSIS]" in line)


def test_requirements_txt_installs_the_project_without_a_second_version_list() -> None:
    """The seed's ``pip install -r requirements.txt``: pip reads it (offline dry run) as this
    project with the png extra, whose dependencies are pyproject.toml's own."""
    tomllib = pytest.importorskip("tomllib")
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index",
               "--no-build-isolation", "--quiet", "--report", "-", "-r", "requirements.txt"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (install,) = json.loads(done.stdout)["install"]
    assert install["metadata"]["name"] == "torchscale" and install["requested_extras"] == ["png"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    required = set(install["metadata"]["requires_dist"])
    assert set(project["dependencies"]) <= required
    assert all(
        f'{dep}; extra == "png"' in required for dep in project["optional-dependencies"]["png"]
    )
    listed = [line for line in (ROOT / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]  # fmt: skip
    assert listed == ["-e .[png]"]  # no version of its own to keep in step
