"""Data stays data: nothing a results folder, a trace or a dataset
holds is imported, called or unpickled; an output never replaces an input or a non-regular file;
every JSON reader survives any line; impossible records are invalid and out of every figure; a
cell recorded twice counts once; a crash is never exit 1."""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import socket
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.support.report_fixtures import MODELS, FixtureSpec, write_experiment
from torchscale.cli.app import app
from torchscale.results.store import ExperimentStore

pytestmark = pytest.mark.timed(alone=False)  # the sinks answer within their 5 s deadline

runner = CliRunner()
SMALL = FixtureSpec(
    name="small",
    models=MODELS[:1],
    batch_sizes=(32,),
    gpu_counts=(1, 2, 4),
    straggler=None,
    failures=False,
    collectives=False,
    findings=True,
)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One experiment of three training cells (1, 2, 4 GPUs) and a profile's findings."""
    return write_experiment(tmp_path_factory.mktemp("small"), SMALL)


def copied(small: Path, tmp_path: Path) -> Path:
    target = tmp_path / "results" / small.name
    shutil.copytree(small, target)
    return target


def error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.fixture
def said() -> Iterator[List[logging.LogRecord]]:
    """What torchscale logs (its logger does not propagate to pytest's caplog)."""
    records: List[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign,assignment]  # keeps each record
    logger = logging.getLogger("torchscale")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    with pytest.MonkeyPatch.context() as patch:
        from torchscale.cli import app as cli_app

        setup = cli_app.setup_logging  # type: ignore[attr-defined]  # the name app.py calls

        def keep_handler(level: int) -> None:  # a command's setup replaces the handlers
            setup(level)
            logger.addHandler(handler)

        patch.setattr(cli_app, "setup_logging", keep_handler)
        yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


def text_of(records: List[logging.LogRecord]) -> str:
    return "\n".join(record.getMessage() for record in records)


def lines_of(path: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_lines(path: Path, documents: List[Any]) -> None:
    path.write_text("".join(json.dumps(doc) + "\n" for doc in documents))


# --- data is never run as code -------------------------------------------------------------------


@pytest.mark.parametrize("model", ["pdb:set_trace", "evil_module:build"])
def test_profile_never_imports_a_model_a_results_folder_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    planted = tmp_path / "planted"
    planted.mkdir()
    marker = tmp_path / "ran"
    (planted / "evil_module.py").write_text(f"open({str(marker)!r}, 'w').close()\nbuild = None\n")
    monkeypatch.syspath_prepend(str(planted))
    monkeypatch.setenv("PYTHONPATH", f"{planted}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("TORCHSCALE_CPU_SLOTS", "2")
    spec = replace(
        SMALL, models=[replace(MODELS[0], name=model)], gpu_counts=(1, 2), findings=False
    )
    write_experiment(tmp_path / "results", spec)
    result = runner.invoke(app, ["profile", "--gpus", "2", "-o", str(tmp_path / "results")])
    assert result.exit_code == 2, result.output
    line = error_line(result.stderr)
    assert f"the custom model '{model}' (batch 32), named by a results file" in line
    assert f"profile it with: torchscale profile --model {model} --batch-size 32 --gpus 2" in line
    assert not marker.exists() and "evil_module" not in __import__("sys").modules
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["small"]  # nothing ran


def _cifar_entry() -> Dict[bytes, Any]:
    rng = np.random.default_rng(0)
    return {
        b"batch_label": b"training batch 1 of 1",
        b"fine_labels": [3, 1, 4, 1],
        b"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8),
    }


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_cifar_pickle_of_arrays_loads_in_every_protocol(tmp_path: Path, protocol: int) -> None:
    from torchscale.worker.dataset_readers import Cifar100

    entry = _cifar_entry()
    (tmp_path / "cifar-100-python").mkdir()
    (tmp_path / "cifar-100-python" / "train").write_bytes(pickle.dumps(entry, protocol=protocol))
    dataset = Cifar100(tmp_path, (32, 32), num_classes=100)
    assert dataset.images.reshape(4, -1).numpy().tolist() == entry[b"data"].tolist()
    assert dataset.labels.tolist() == entry[b"fine_labels"]


class _Planted:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


def test_a_cifar_pickle_that_names_code_is_refused_and_never_runs(tmp_path: Path) -> None:
    from torchscale.worker.dataset_readers import Cifar100

    marker = tmp_path / "ran"
    entry = {**_cifar_entry(), b"coarse_labels": _Planted(str(marker))}
    (tmp_path / "cifar-100-python").mkdir()
    (tmp_path / "cifar-100-python" / "train").write_bytes(pickle.dumps(entry, protocol=2))
    with pytest.raises(ValueError, match=r"names posix\.system, which a dataset pickle never"):
        Cifar100(tmp_path, (32, 32), num_classes=100)
    assert not marker.exists()


# --- outputs never touch inputs ------------------------------------------------------------------


def _special(kind: str, folder: Path) -> Path:
    path = folder / kind
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()
    elif kind == "device":
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's twin
    elif kind == "link":
        path.symlink_to(folder / "elsewhere.html")
    return path


@pytest.mark.parametrize(
    "target", ["results.jsonl", "manifest.json", "findings", "fifo", "socket", "device", "link"]
)
def test_report_never_replaces_an_input_or_a_non_regular_file(
    small: Path, tmp_path: Path, target: str
) -> None:
    folder = copied(small, tmp_path)
    if target == "findings":
        path = next(folder.rglob("findings.json"))
    elif "." in target:
        path = folder / target
    else:
        path = _special(target, tmp_path)
    before = os.lstat(path)
    content = path.read_bytes() if stat.S_ISREG(before.st_mode) else None
    for fmt in ("html", "json"):
        result = runner.invoke(app, ["report", "-s", str(folder), "-f", fmt, "-o", str(path)])
        assert result.exit_code == 2, result.output
        line = error_line(result.stderr)
        expected = "one of this run's inputs" if content is not None else "not a regular file"
        assert expected in line and str(path) in line
    after = os.lstat(path)
    assert (after.st_ino, stat.S_IFMT(after.st_mode)) == (
        before.st_ino,
        stat.S_IFMT(before.st_mode),
    )
    if content is not None:
        assert path.read_bytes() == content
    assert not [p for p in tmp_path.rglob(".*.tmp")]  # no temporary file left behind


def test_an_output_under_a_file_says_which_file(small: Path, tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep")
    for fmt, name in (("html", "x.html"), ("tensorboard", "tb")):
        result = runner.invoke(
            app, ["report", "-s", str(small), "-f", fmt, "-o", str(afile / name)]
        )
        assert result.exit_code == 2, result.output
        line = error_line(result.stderr)
        assert "does not exist" not in line and str(afile) in line
        assert ("is a file, not a folder" in line) or ("Not a directory" in line)
    assert afile.read_text() == "keep"


def test_an_unwritable_tensorboard_folder_is_one_line(small: Path, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    result = runner.invoke(app, ["report", "-s", str(small), "-f", "tensorboard", "-o", "/proc/tb"])
    assert result.exit_code == 2, result.output
    assert "--output /proc/tb is not writable" in error_line(result.stderr)


def test_an_nsys_export_path_with_uri_characters_opens_that_file_only(tmp_path: Path) -> None:
    from tests.support.profile_helpers import DATA
    from torchscale.profiling.traces.nsys_sqlite import read_nsys

    source = DATA / "nsys_2rank" / "rank0.sqlite"
    expected = read_nsys(source)
    for name in ("run#1.sqlite", "run?mode=rwc.sqlite", "a%20b.sqlite", "sp ace.sqlite"):
        folder = tmp_path / name.replace("?", "q").replace("#", "h")
        folder.mkdir()
        shutil.copy(source, folder / name)
        traces = read_nsys(folder / name)
        assert [len(t.events) for t in traces] == [len(t.events) for t in expected]
        assert [p.name for p in folder.iterdir()] == [name]  # no file created beside it


# --- every JSON reader survives any line ---------------------------------------------------------


def test_damaged_results_lines_are_skipped_by_name_never_a_traceback(
    small: Path, tmp_path: Path, said: List[logging.LogRecord], monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchscale.results import json_input

    folder = copied(small, tmp_path)
    results = folder / "results.jsonl"
    good = results.read_text()
    nested = "[" * 5000 + "]" * 5000  # deeper than Python's parser goes
    shallow: Any = 1
    for _ in range(70):  # deep enough to be refused, shallow enough for Python's parser
        shallow = [shallow]
    shallow = json.dumps({"a": shallow})
    limit = max(len(nested), *(len(line) for line in good.splitlines())) + 100
    long_line = json.dumps({"padding": "x" * limit})
    results.write_text(
        good + f'{nested}\n[1, 2]\n{shallow}\n"text"\n{long_line}\n{{"kind": [1]}}\n'
    )
    monkeypatch.setattr(json_input, "MAX_LINE_BYTES", limit)
    from torchscale.analysis.report_data import load_report_data

    data = load_report_data(folder)
    warned = text_of(said)
    assert "line 4 is damaged (nested deeper than 64 levels); skipped" in warned
    assert "line 5 is damaged (a list, not an object); skipped" in warned
    assert "line 6 is damaged (nested deeper than 64 levels)" in warned
    assert "line 7 is damaged (a string, not an object)" in warned
    assert f"line 8 is damaged (longer than {limit} bytes); skipped" in warned
    assert [r.cell_id for r in data.records if r.status == "ok"] == [
        d["cell_id"] for d in map(json.loads, good.splitlines())
    ]
    for args in (
        ["report", "-s", str(folder), "-o", str(tmp_path / "r.html")],
        ["compare", str(small), str(folder)],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output  # never 1 (a regression) nor a crash


def test_a_manifest_of_the_wrong_shape_is_left_out_or_one_line(
    small: Path, tmp_path: Path, said: List[logging.LogRecord]
) -> None:
    from torchscale.analysis.report_data import load_report_data

    folder = copied(small, tmp_path)
    manifest = folder / "manifest.json"
    manifest.write_text("[1, 2]")
    assert load_report_data(folder).experiments[0].manifest == {}
    assert "manifest.json is damaged (a list, not an object)" in text_of(said)
    result = runner.invoke(app, ["report", "-s", str(folder), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    said.clear()
    manifest.write_text(
        json.dumps({"experiment": 5, "environment": [1], "runs": "x", "config": {}})
    )
    assert ExperimentStore(folder).manifest() == {"config": {}}
    assert "experiment is a number; environment is a list; runs is a string" in text_of(said)
    # --resume cannot go on without knowing what ran: one line, the manifest left as it was.
    manifest.write_text('{"runs": ' * 5000 + "}" * 5000)
    config = tmp_path / "c.yaml"
    config.write_text("experiment_name: small\nmodels: [resnet-tiny]\nbatch_sizes: [2]\n")
    before = manifest.read_bytes()
    result = runner.invoke(
        app, ["benchmark", "-c", str(config), "-o", str(folder.parent), "--resume"]
    )
    assert result.exit_code == 2, result.output
    assert "manifest.json is damaged (nested deeper than 64 levels)" in error_line(result.stderr)
    assert manifest.read_bytes() == before


def test_rank_tune_and_findings_readers_survive_any_document(small: Path, tmp_path: Path) -> None:
    from torchscale.analysis.report_data import load_report_data, read_findings, read_summary
    from torchscale.results.rank_files import read_json

    deep = "[" * 50_000 + "]" * 50_000
    for text in (deep, "[1, 2]", "{", "\x00\xff", "1e999999"):
        (tmp_path / "r.json").write_text(text)
        assert read_json(tmp_path / "r.json") is None
    folder = copied(small, tmp_path)
    findings = next(folder.rglob("findings.json"))
    for text in (deep, '{"findings": 5}', '{"findings": [1, "x", {"title": "kept"}]}'):
        findings.write_text(text)
        found, _ = read_findings(folder)
        kept = {"title": "kept", "_source": "cells/profile-8gpu/profile", "_cell": "profile-8gpu"}
        assert found == ([kept] if "kept" in text else [])
    (folder / "tune.json").write_text(deep)
    assert read_summary(load_report_data(folder).experiments[0]) is None


HOSTILE_VALUES: List[Any] = [None, [], {}, "x", -1, 0, 1e308, True, [[[]]], "=cmd", 2**70]
FIELDS = ["kind", "status", "world_size", "batch_size", "per_rank", "step_times_ms", "step_time_ms",
          "settings", "throughput", "schema_version", "cell_id", "model", "nnodes",
          "settings.batch_size", "step_time_ms.p50", "per_rank.0.step_times_ms",
          "per_rank.0.rank", "per_rank.0.host"]  # fmt: skip


def _replaced(document: Dict[str, Any], field: str, value: Any) -> Dict[str, Any]:
    """``document`` (deep-copied) with the dotted ``field`` set to ``value``."""
    copy = json.loads(json.dumps(document))
    *parents, leaf = field.split(".")
    node: Any = copy
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[int(leaf) if isinstance(node, list) else leaf] = value
    return copy


def test_hostile_field_values_never_crash_the_tables_or_compare(small: Path) -> None:
    from torchscale.analysis.comparison import CompareOptions, compare_runs
    from torchscale.analysis.training_tables import training_table
    from torchscale.results.validity import check_and_parse

    documents = lines_of(small / "results.jsonl")
    clean = check_and_parse(documents, "clean")[1]
    variants = [
        _replaced({**documents[1], "cell_id": f"hostile-{field}-{index}"}, field, value)
        for field in FIELDS
        for index, value in enumerate(HOSTILE_VALUES)
    ]  # each a copy of one real record with one field replaced, all in one results file
    records = check_and_parse([*documents, *variants], "hostile")[1]
    assert sum(r.status == "ok" for r in records) < len(records)
    table = training_table(records).set_index("cell_id")
    assert (table.loc[[d["cell_id"] for d in documents], "status"] == "ok").all()
    compare_runs(clean, records, CompareOptions(resamples=100))
    compare_runs(records, clean, CompareOptions(resamples=100))


def _with_cell(documents: List[Dict[str, Any]], **changes: Any) -> List[Dict[str, Any]]:
    extra = {**documents[0], "cell_id": "planted", **changes}
    return [*documents, extra]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"world_size": -2}, "world_size is -2 (must be a whole number from 1"),
        ({"world_size": 0}, "world_size is 0"),
        ({"batch_size": 0}, "batch_size is 0"),
        ({"nproc_per_node": 0}, "nproc_per_node is 0"),
        ({"throughput": 1e308}, "throughput is 1e+308 (absurd: above 1e+15)"),
        ({"step_times_ms": [1e300, 5.0]}, "step_times_ms[0] is 1e+300"),
    ],
)
def test_an_impossible_record_is_invalid_and_out_of_every_figure(
    small: Path, change: Dict[str, Any], reason: str
) -> None:
    from torchscale.analysis.comparison import CompareOptions, compare_runs
    from torchscale.analysis.training_tables import training_table
    from torchscale.results.validity import check_and_parse

    documents = lines_of(small / "results.jsonl")
    clean = check_and_parse(documents, "clean")[1]
    records = check_and_parse(_with_cell(documents, **change), "planted")[1]
    planted = next(r for r in records if r.cell_id == "planted")
    assert planted.status == "invalid" and reason in (planted.error or "")
    table = training_table(records).set_index("cell_id")
    expected = training_table(clean).set_index("cell_id")
    assert table.loc[expected.index, "scaling_efficiency"].tolist() == pytest.approx(
        expected["scaling_efficiency"].tolist()
    )
    assert 0 < expected["scaling_efficiency"].min() <= 1
    # In a configuration of its own, compare leaves it out too (never a verdict, never lost).
    other = _with_cell(documents, settings={**documents[0]["settings"], "seed": 99}, **change)
    compared = compare_runs(
        clean, check_and_parse(other, "other")[1], CompareOptions(resamples=200)
    )
    assert len(compared.cells) == len(clean) and not compared.failed
    assert set(compared.cells["verdict"]) == {"unchanged"}


def test_a_crash_is_exit_3_never_1(small: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchscale.analysis import comparison

    def crash(*args: Any, **kwargs: Any) -> None:
        raise KeyError("variant")

    monkeypatch.setattr(comparison, "compare_runs", crash)
    result = runner.invoke(app, ["compare", str(small), str(small)])
    assert result.exit_code == 3
    line = error_line(result.stderr)
    assert (
        "internal error, a bug in torchscale (KeyError: 'variant')" in line and "--verbose" in line
    )

    def unreadable(*args: Any, **kwargs: Any) -> None:
        raise PermissionError(13, "Permission denied", str(small / "results.jsonl"))

    monkeypatch.setattr(comparison, "compare_runs", unreadable)
    result = runner.invoke(app, ["compare", str(small), str(small)])
    assert result.exit_code == 2
    assert f"{small / 'results.jsonl'}: Permission denied" in error_line(result.stderr)


# --- gates on nothing, and double counting -------------------------------------------------------


def test_a_cell_recorded_twice_counts_once(
    small: Path, tmp_path: Path, said: List[logging.LogRecord]
) -> None:
    from torchscale.analysis.report_data import load_report_data
    from torchscale.app.report import report_content

    folder = copied(small, tmp_path)
    results = folder / "results.jsonl"
    original = results.read_text()
    results.write_text(original + original)  # a concatenation
    data = load_report_data(folder)
    cells = [d["cell_id"] for d in lines_of(small / "results.jsonl")]
    assert [r.cell_id for r in data.records] == cells
    assert "3 cell(s) recorded more than once" in text_of(said)
    assert "its last run used" in text_of(said)
    assert any(r.levelno == logging.WARNING for r in said)
    (card,) = [c for c in report_content(data).cards if c.label == "Training cells measured"]
    assert card.value == "3 / 3"
    # A failed cell re-run with --retry-failed: the retry counts, said at info level only.
    documents = lines_of(small / "results.jsonl")
    failed = {**documents[0], "status": "failed", "error": "rank 1 died", "started_at": "t0"}
    write_lines(results, [failed, *documents[1:], {**documents[0], "started_at": "t1"}])
    said.clear()
    data = load_report_data(folder)
    assert [r.status for r in data.records] == ["ok"] * 3 and data.records[-1].started_at == "t1"
    assert "1 cell(s) recorded more than once" in text_of(said)
    assert not [r for r in said if r.levelno >= logging.WARNING]


def test_records_of_one_run_of_a_cell_are_all_kept(tmp_path: Path) -> None:
    from tests.support.report_fixtures import collective_documents
    from torchscale.results.validity import check_and_parse, latest_runs

    # A communication cell sweeps every op and size itself: one run, many records.
    one_cell = {"cell_id": "comm-g2-r0", "started_at": "t0", "finished_at": "t1"}
    documents = [{**doc, **one_cell} for doc in collective_documents(FixtureSpec())]
    records = check_and_parse(documents, "x")[1]
    assert len(records) > 10
    assert latest_runs(records, "x") == records
    assert latest_runs(records + records, "x") == records


@pytest.mark.parametrize("content", ["", "\n\n", "not json\n[1]\n"])
def test_a_folder_with_no_records_is_refused_with_the_reason(
    small: Path, tmp_path: Path, content: str
) -> None:
    folder = tmp_path / "results" / "empty"
    folder.mkdir(parents=True)
    (folder / "results.jsonl").write_text(content)
    for args in (
        ["report", "-s", str(folder.parent), "-o", str(tmp_path / "r.html")],
        ["compare", str(small), str(folder.parent)],
        ["compare", str(folder.parent), str(small)],
        ["project", "-s", str(folder.parent), "--gpus", "16"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        line = error_line(result.stderr)
        assert f"{folder / 'results.jsonl'} hold(s) no readable record" in line
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize(
    "setting", ["measure_seconds: .inf", "cell_timeout_s: .inf", "stall_timeout_s: .nan"]
)
def test_a_non_finite_setting_is_refused(tmp_path: Path, setting: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"experiment_name: x\nmodels: [resnet-tiny]\nbatch_sizes: [2]\n{setting}\n")
    result = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(tmp_path), "--dry-run"])
    assert result.exit_code == 2
    name = setting.split(":")[0]
    assert f"{name}: Input should be a finite number" in error_line(result.stderr)
