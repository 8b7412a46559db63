"""``torchscale report`` / ``report generate`` / ``compare``: outputs, exit codes, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.support.python_probe import python_prints
from tests.support.report_fixtures import FixtureSpec, write_experiment
from torchscale.cli.app import app
from torchscale.results.layout import experiment_dirname

SMALL: Any = {
    "batch_sizes": (32,),
    "gpu_counts": (1, 2),
    "failures": False,
    "collectives": False,
    "findings": False,
}
runner = CliRunner()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory):
    """Baseline, the same code rerun (new noise), and a run where one model is 25% slower."""
    root = tmp_path_factory.mktemp("cli")
    slow_model = FixtureSpec().models[0].name
    return {
        "base": write_experiment(root / "base", FixtureSpec(name="nightly", **SMALL)),
        "rerun": write_experiment(root / "rerun", FixtureSpec(name="nightly", seed=1, **SMALL)),
        "slow": write_experiment(
            root / "slow", FixtureSpec(name="nightly", seed=2, slowdown={slow_model: 1.25}, **SMALL)
        ),
        "other": write_experiment(
            root / "other",
            FixtureSpec(name="other", batch_sizes=(8,), gpu_counts=(1,), failures=False),
        ),
    }


@pytest.mark.parametrize("spelling", [["report"], ["report", "generate"]])
def test_report_writes_the_default_file(runs, spelling) -> None:
    source = runs["base"]
    expected = source / f"{experiment_dirname('nightly')}-report.html"
    expected.unlink(missing_ok=True)
    result = runner.invoke(app, [*spelling, "--source", str(source), "--format", "html"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert str(expected) in result.stderr
    html = expected.read_text(encoding="utf-8")
    assert '<h1 class="report-title">nightly</h1>' in html and 'data-figure="' in html


def test_report_with_a_baseline_shows_the_comparison(runs, tmp_path: Path) -> None:
    output = tmp_path / "compared.html"
    result = runner.invoke(
        app, ["report", "-s", str(runs["slow"]), "-o", str(output), "--baseline", str(runs["base"])]
    )
    assert result.exit_code == 0, result.stderr
    html = output.read_text(encoding="utf-8")
    assert 'id="comparison-table"' in html and "regression" in html
    assert 'data-figure="comparison-throughput"' in html


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--source", "{missing}"], "does not exist"),
        (["--source", "{empty}"], "no results under"),
        (["--source", "{base}", "--format", "docx"], "unknown report format 'docx'"),
        (["--source", "{base}", "--output", "{missing}/r.html"], "does not exist"),
        (["--source", "{base}", "--output", "/proc/torchscale-report.html"], "cannot write"),
        (["--source", "{base}", "--output", "{empty}"], "is a folder"),
    ],
)
def test_report_bad_input_is_one_line_exit_2(runs, tmp_path: Path, args, message) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    paths = {"missing": tmp_path / "nope", "empty": empty, "base": runs["base"]}
    args = [a.format(**paths) for a in args]
    before = sorted(p.name for p in runs["base"].iterdir())
    result = runner.invoke(app, ["report", *args])
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in runs["base"].iterdir()) == before  # nothing written
    assert list(empty.iterdir()) == []


def test_a_failed_render_leaves_the_old_report(runs, tmp_path: Path, monkeypatch) -> None:
    from torchscale.app import report as build
    from torchscale.errors import TorchscaleError

    output = tmp_path / "report.html"
    output.write_text("previous report", encoding="utf-8")

    def broken(content, fmt):
        raise TorchscaleError("renderer broke")

    monkeypatch.setattr(build, "render", broken)
    result = runner.invoke(app, ["report", "-s", str(runs["base"]), "-o", str(output)])
    assert result.exit_code == 2 and "renderer broke" in result.stderr
    assert output.read_text(encoding="utf-8") == "previous report"
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_compare_identical_runs_passes(runs) -> None:
    result = runner.invoke(app, ["compare", str(runs["base"]), str(runs["base"])])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "" and "No regression" in result.stderr


def test_compare_rerun_is_within_noise(runs) -> None:
    result = runner.invoke(
        app, ["compare", str(runs["base"]), str(runs["rerun"]), "--json", "--threshold", "1"]
    )
    document = json.loads(result.stdout)
    assert result.exit_code == 0, result.stderr
    verdicts = {c["verdict"] for c in document["cells"]}
    assert "regression" not in verdicts and verdicts & {"within noise", "unchanged"}
    for cell in document["cells"]:
        if cell["verdict"] == "within noise":
            assert cell["throughput_ci_low_pct"] <= 0 <= cell["throughput_ci_high_pct"] or (
                cell["p95_ci_low_pct"] <= 0 <= cell["p95_ci_high_pct"]
            )


def test_compare_regression_exits_1(runs) -> None:
    result = runner.invoke(app, ["compare", str(runs["base"]), str(runs["slow"]), "--json"])
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    slow = FixtureSpec().models[0].name
    regressed = {
        (c["model"], c["world_size"]) for c in document["cells"] if c["verdict"] == "regression"
    }
    assert regressed == {(slow, 1), (slow, 2)}
    assert document["regressions"] == 2
    for cell in document["cells"]:
        if cell["model"] == slow:
            assert cell["throughput_change_pct"] < -5
    assert "regressed beyond 5%" in result.stderr
    loose = runner.invoke(
        app, ["compare", str(runs["base"]), str(runs["slow"]), "--threshold", "30"]
    )
    assert loose.exit_code == 0


def test_compare_without_common_cells_is_an_error(runs) -> None:
    result = runner.invoke(app, ["compare", str(runs["base"]), str(runs["other"])])
    assert result.exit_code == 2 and "no cell of" in result.stderr


def test_cli_help_imports_nothing_heavy() -> None:
    code = (
        "import sys; from torchscale.cli.app import app; "
        "heavy = {'torch', 'pandas', 'plotly', 'matplotlib', 'weasyprint', 'jinja2', 'numpy'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    assert python_prints(code) == "[]"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["compare", "{missing}", "{base}"], "OLD {missing} does not exist"),
        (["compare", "{base}", "{missing}"], "NEW {missing} does not exist"),
        (["report", "-s", "{base}", "--baseline", "{missing}"], "--baseline {missing} does not"),
    ],
)
def test_missing_runs_are_named(runs, tmp_path: Path, args, message) -> None:
    paths = {"missing": tmp_path / "nope", "base": runs["base"]}
    result = runner.invoke(app, [a.format(**paths) for a in args])
    assert result.exit_code == 2
    assert message.format(**paths) in result.stderr
