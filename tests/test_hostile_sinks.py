"""Every sink a name reaches besides the terminal, fed the same hostile names
(tests/support/hostile_names.py): the sbatch script and its ``#SBATCH`` lines, srun and torchrun
commands shown, tune's ``ddp.py``, summary.csv, the report's CSV downloads and its HTML, and the
CSVs of ``profile analyze`` and ``profile diff``."""

from __future__ import annotations

import ast
import base64
import csv
import io
import json
import re
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Dict, List

import pytest
import yaml
from typer.testing import CliRunner

from tests.support.hostile_names import FORMULAS, HTML, LINE_BREAKS, ONE_LINE, SHELL
from torchscale.cli.app import app
from torchscale.config.settings import CellSettings
from torchscale.escaping import shown_command
from torchscale.tune.tune_outputs import ddp_snippet

pytestmark = pytest.mark.timed(alone=False)  # the sinks answer within their 5 s deadline

runner = CliRunner()


def sbatch_words(line: str) -> List[str]:
    """The option words sbatch reads from one ``#SBATCH`` line, by the rules of Slurm's own
    reader (``_get_argument`` in src/sbatch/opt.c): words split on blanks; ``"`` or ``'`` quote;
    a backslash escapes the next character, inside quotes too; an unquoted ``#`` ends the line."""
    words: List[str] = []
    rest, i = line[len("#SBATCH") :], 0
    while True:
        while i < len(rest) and rest[i].isspace():
            i += 1
        if i == len(rest):
            return words
        word: List[str] = []
        quote, escaped = "", False
        while i < len(rest) and (quote or not rest[i].isspace()):
            char = rest[i]
            i += 1
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
                continue
            elif quote:
                if char == quote:
                    quote = ""
                    continue
            elif char in "\"'":
                quote = char
                continue
            elif char == "#":
                return [*words, "".join(word)] if word else words
            word.append(char)
        words.append("".join(word))


def slurm_filename(pattern: str, job_id: str) -> str:
    """sbatch's ``--output`` pattern expanded: ``%%`` is ``%``, ``%j`` the job id."""
    return re.sub(r"%(%|j)", lambda m: "%" if m.group(1) == "%" else job_id, pattern)


def _config(tmp_path: Path, name: str) -> Path:
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "experiment_name": name,
                "models": ["gpt2-tiny"],
                "batch_sizes": [2],
                "gpu_counts": [2],
                "gpus_per_node": 1,
            }
        )
    )
    return config


def _submit(tmp_path: Path, name: str, *extra: str, dry_run: bool = True):
    out = tmp_path / "out dir %j"
    args = ["benchmark", "-c", str(_config(tmp_path, name)), "-o", str(out)]
    args += ["--launcher", "slurm", "--submit", *(["--dry-run"] if dry_run else []), *extra]
    return runner.invoke(app, args), out


@pytest.mark.parametrize("name", ONE_LINE)
def test_the_sbatch_script_keeps_every_name_one_value(tmp_path: Path, name: str) -> None:
    result, out = _submit(
        tmp_path, name, f"--sbatch-arg=--comment={name}", "--set", f"data.path={name}"
    )
    assert result.exit_code == 0, result.output
    script = result.stdout
    lines = script.splitlines()
    sbatch = [line for line in lines if line.startswith("#SBATCH")]
    # The whole #SBATCH block is at the top, every line whole: nothing after it is an option.
    assert lines[1 : 1 + len(sbatch)] == sbatch and len(sbatch) == 8
    read = {words[0].split("=")[0]: words for words in map(sbatch_words, sbatch)}
    assert all(len(words) == 1 for words in read.values()), read
    assert read["--job-name"] == [f"--job-name=torchscale-{name}"[:120]]
    assert read["--comment"] == [f"--comment={name}"]
    output = read["--output"][0].removeprefix("--output=")
    folder = next(out.iterdir()) if out.exists() else None
    assert folder is None  # a dry run writes nothing
    log = Path(slurm_filename(output, "4242"))
    assert log.name == "slurm-4242.out" and log.parent.parent == out.resolve()
    # The shell part: run it with the last line printing its words instead of running them.
    body = "\n".join([*lines[:-1], "printf '%s\\0' " + lines[-1]])
    done = subprocess.run(["bash", "-c", body], capture_output=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    argv = done.stdout.decode().split("\0")[:-1]
    assert argv[argv.index("--output-dir") + 1] == str(out.resolve())
    assert f"--set=data.path={name}" in argv
    assert not (tmp_path / "owned").exists()


@pytest.mark.parametrize("name", LINE_BREAKS)
def test_a_line_break_in_a_name_never_reaches_the_script(tmp_path: Path, name: str) -> None:
    result, out = _submit(tmp_path, name, dry_run=False)
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert (
        "experiment_name contains a line break or NUL" in line and "Traceback" not in result.output
    )
    assert not list(out.rglob("sbatch.sh")) if out.exists() else True


@pytest.mark.parametrize("option", ["--sbatch-arg", "--set"])
def test_a_line_break_in_an_option_never_reaches_the_script(tmp_path: Path, option: str) -> None:
    value = "--comment=x\n#SBATCH --nodes=999" if option == "--sbatch-arg" else "data.path=a\nb"
    result, out = _submit(tmp_path, "plain", option, value, dry_run=False)
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert "contains a line break or NUL" in line and "\\n" in line
    assert not out.exists() or not list(out.rglob("sbatch.sh"))


def test_an_output_folder_with_a_backslash_is_refused_for_sbatch(tmp_path: Path) -> None:
    args = ["benchmark", "-c", str(_config(tmp_path, "plain")), "-o", str(tmp_path / "a\\b")]
    result = runner.invoke(app, [*args, "--launcher", "slurm", "--submit", "--dry-run"])
    assert result.exit_code == 2
    assert "has a backslash, which makes sbatch write its log" in result.stderr


def test_an_sbatch_arg_that_is_no_option_is_refused(tmp_path: Path) -> None:
    result, _ = _submit(tmp_path, "plain", "--sbatch-arg=partition gpu")
    assert result.exit_code == 2 and "is not an sbatch option" in result.stderr
    split, _ = _submit(tmp_path, "plain", "--sbatch-arg=--partition gpu")
    assert split.exit_code == 0 and "#SBATCH --partition gpu\n" in split.stdout


@pytest.mark.parametrize("name", [*SHELL, *LINE_BREAKS])
def test_a_command_shown_is_one_line_and_runs_as_its_words(name: str) -> None:
    words = ["printf", "%s|", name, "srun", f"--job-name={name}"]
    shown = shown_command(words)
    assert "\n" not in shown and "\r" not in shown and "\x00" not in shown
    if "\x00" in name:
        return  # a NUL cannot be an argument of a real process
    done = subprocess.run(["bash", "-c", shown], capture_output=True)
    assert done.stdout.decode() == f"{name}|srun|--job-name={name}|"


@pytest.mark.parametrize("name", [*ONE_LINE, *LINE_BREAKS])
def test_ddp_lines_to_paste_keep_a_name_a_comment(name: str) -> None:
    settings = CellSettings.model_validate(
        {"model": "resnet-tiny", "batch_size": 8, "gpus": 2, "compile": True,
         "compile_mode": "max-autotune", "ddp": {"comm_hook": "powersgd"}}
    ).model_dump(mode="json")  # fmt: skip
    plain = ast.dump(ast.parse(ddp_snippet(settings, "torchscale tune, plain: +1%")))
    hostile = ddp_snippet(settings, f"torchscale tune, {name}: +1%")
    assert ast.dump(ast.parse(hostile)) == plain  # the same code: the name is in a comment
    assert len(hostile.splitlines()) == len(ddp_snippet(settings, "x").splitlines())


def _cells(rows: List[List[str]]) -> List[str]:
    return [cell for row in rows for cell in row]


def _hostile_experiment(tmp_path: Path, name: str) -> Path:
    from tests.support.report_fixtures import MODELS, FixtureSpec, write_experiment

    spec = FixtureSpec(
        name=name,
        models=[replace(MODELS[0], name=name)],
        batch_sizes=(32,),
        gpu_counts=(1, 2),
        straggler=None,
        findings=False,
        failures=True,
    )
    return write_experiment(tmp_path, spec)


def _assert_no_formula(text: str, name: str) -> List[List[str]]:
    rows = list(csv.reader(io.StringIO(text)))
    cells = _cells(rows)
    assert "'" + name in cells  # the name is kept, made text
    for cell in cells:
        if cell.startswith(("=", "+", "-", "@", "\t", "\r")):
            float(cell)  # only a number may start so (-3.5 stays a number)
    return rows


def test_summary_csv_and_report_downloads_never_hold_a_formula(tmp_path: Path) -> None:
    from torchscale.app.report import ReportRequest, generate_report
    from torchscale.launch.sweep import write_summary
    from torchscale.results.store import ExperimentStore

    for index, name in enumerate(FORMULAS):
        folder = _hostile_experiment(tmp_path / str(index), name)
        store = ExperimentStore(folder)
        records = store.records()
        table = write_summary(store, records)
        rows = _assert_no_formula(store.summary_path.read_text(), name)
        header = rows[0]
        throughput = [
            float(row[header.index("throughput")])
            for row in rows[1:]
            if row[header.index("throughput")]
        ]
        assert table is not None
        assert throughput == pytest.approx(table["throughput"].dropna().tolist(), rel=1e-12)
        _assert_no_formula((folder / "summary_comm.csv").read_text(), name)
    # The HTML report's CSV downloads of the last one: every table.
    html = generate_report(ReportRequest(folder, "html", tmp_path / "r.html")).read_text()
    downloads = re.findall(r"data:text/csv;base64,([A-Za-z0-9+/=]+)", html)
    assert len(downloads) >= 3
    texts = [base64.b64decode(d).decode() for d in downloads]
    assert any("'" + FORMULAS[-1] in _cells(list(csv.reader(io.StringIO(t)))) for t in texts)
    for text in texts:
        for cell in _cells(list(csv.reader(io.StringIO(text)))):
            if cell.startswith(("=", "+", "-", "@", "\t", "\r")):
                float(cell)


def _no_formula_cells(text: str) -> List[str]:
    """Every cell of a CSV text; a cell that starts as a formula must be a number."""
    cells = _cells(list(csv.reader(io.StringIO(text))))
    for cell in cells:
        if cell.startswith(("=", "+", "-", "@", "\t", "\r")):
            float(cell)  # only a number may start so (-3.5 stays a number)
    return cells


def _hostile_trace(old: Path, new: Path) -> List[str]:
    """A real trace (``old``) and a copy whose kernels and CPU ops are renamed to the shared
    hostile names (``new``); returns the kernels' new names."""
    import gzip
    import shutil

    from tests.support.profile_helpers import real_traces_dir

    source = real_traces_dir() / "rocm-mi250-rank0.json.gz"
    old.mkdir()
    new.mkdir()
    shutil.copy(source, old / "rank0.json.gz")
    with gzip.open(source, "rt") as handle:
        doc = json.load(handle)
    names = [*FORMULAS, *[n for n in ONE_LINE if n not in FORMULAS]]
    renamed: Dict[str, str] = {}
    events = doc["traceEvents"]
    for category in ("kernel", "cpu_op"):  # kernels first: every formula names a kernel
        for event in (e for e in events if e.get("cat") == category):
            if event["name"] not in renamed:
                renamed[event["name"]] = names[len(renamed) % len(names)]
    kernels = {renamed[e["name"]] for e in events if e.get("cat") == "kernel"}
    for event in (e for e in events if e.get("cat") in ("kernel", "cpu_op")):
        event["name"] = renamed[event["name"]]
    (new / "rank0.json").write_text(json.dumps(doc))
    assert set(FORMULAS) <= kernels
    return sorted(kernels)


def test_profile_diff_and_analyze_csvs_never_hold_a_formula(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    kernels = _hostile_trace(old, new)
    out = tmp_path / "diff"
    result = runner.invoke(app, ["profile", "diff", str(old), str(new), "-o", str(out)])
    assert result.exit_code == 0, result.output
    ops = list(csv.DictReader(io.StringIO((out / "profile_diff_ops.csv").read_text())))
    new_kernels = {r["name"] for r in ops if r["device"] == "gpu" and r["status"] == "new"}
    # each name kept, a formula made text: the kernels that only NEW has are the hostile ones
    assert new_kernels == {"'" + n if n in FORMULAS else n for n in kernels}
    for table in out.iterdir():
        _no_formula_cells(table.read_text())
    analyzed = tmp_path / "analyze"
    result = runner.invoke(app, ["profile", "analyze", str(new), "-o", str(analyzed)])
    assert result.exit_code == 0, result.output
    tables = sorted(analyzed.glob("*.csv"))
    assert len(tables) >= 10
    cells = [cell for table in tables for cell in _no_formula_cells(table.read_text())]
    assert {"'" + name for name in FORMULAS} <= set(cells)


def test_the_html_report_shows_every_name_as_text(tmp_path: Path) -> None:
    """Every shared name as a model of one experiment: each is a cell of the tables as it is,
    none adds an element or an attribute to the page, and the figures' JSON stays one script."""
    from html.parser import HTMLParser

    from tests.support.html_tables import html_tables
    from tests.support.report_fixtures import MODELS, FixtureSpec, write_experiment
    from torchscale.app.report import ReportRequest, generate_report

    names = ONE_LINE
    spec = FixtureSpec(
        name=HTML[0],
        models=[replace(MODELS[0], name=name) for name in names],
        batch_sizes=(32,),
        gpu_counts=(1, 2),
        straggler=None,
        failures=False,
        collectives=False,
        findings=False,
    )
    folder = write_experiment(tmp_path, spec)
    html = generate_report(ReportRequest(folder, "html", tmp_path / "r.html")).read_text()
    shown = [row["Model"] for row in html_tables(html)["scaling-table"]]
    assert sorted(shown) == sorted(name for name in names for _ in (1, 2))

    class Elements(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: List[str] = []
            self.handlers: List[str] = []

        def handle_starttag(self, tag: str, attrs: List) -> None:
            self.tags.append(tag)
            self.handlers += [key for key, _ in attrs if key.startswith("on")]

    page = Elements()
    page.feed(html)
    assert page.tags.count("script") == 3  # plotly.js, the figures, the loader
    assert "img" not in page.tags and "svg" not in page.tags and page.handlers == []
    assert "<title>torchscale report: &lt;script&gt;alert(1)&lt;/script&gt;</title>" in html
    figures = re.search(r'id="report-figures">(.*?)</script>', html, re.S)
    assert figures is not None and json.loads(figures.group(1))
