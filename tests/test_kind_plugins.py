"""A new cell kind is its own module plus one line in the registry.

The toy kind (``tests/support/toy_kind.py``, in no torchscale module: the five pieces no default
gives) is registered at test time and goes through config, plan, dry run, sweep, summary CSV,
console and report; nothing else knows it. ``fuller_toy_kind.py`` overrides the optional
pieces. Its cells are skipped by the sweep before any launch (``backend: mpi`` under
torchrun), so no process starts.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pandas as pd
import pytest
from typer.testing import CliRunner

from tests.support.toy_kind import KIND as TOY_KIND
from tests.support.toy_kind import ToyCellSettings, ToyResult
from torchscale.cli.app import app
from torchscale.config.loader import load_config
from torchscale.errors import ConfigError, TorchscaleError
from torchscale.kinds.kind_registry import KIND_MODULES, SCRIPT_KIND, TRAINING_KIND, added_kind
from torchscale.plan.kind_base import KindBase, kind_summary_file
from torchscale.plan.kind_protocol import cell_kinds, kind_of, records_of
from torchscale.plan.matrix import expand
from torchscale.plan.planned_cell import Cell
from torchscale.results.layout import experiment_dir
from torchscale.results.schema import CellStatus, ResultBase, TrainingResult
from torchscale.results.store import ExperimentStore

runner = CliRunner()
TOY = "tests.support.toy_kind"
FULLER_TOY = "tests.support.fuller_toy_kind"
CONFIG = """\
experiment_name: toys
gpu_counts: [1, 2]
toy:
  words: [hello, world]
"""


def _config(tmp_path: Path, text: str = CONFIG) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(text)
    return path


def test_a_kind_of_its_own_module_is_planned_previewed_run_and_summarised(tmp_path: Path) -> None:
    """The least a kind defines (tests/support/toy_kind.py: five pieces); every stage takes
    the rest from ``KindBase``'s defaults."""
    path = _config(tmp_path)
    out = tmp_path / "out"
    with added_kind(TOY):
        plan = expand(load_config(path))
        assert [(c.kind, c.settings.gpus) for c in plan] == [("toy", 1), ("toy", 2)] * 2
        words = [c.settings.word for c in plan if isinstance(c.settings, ToyCellSettings)]
        assert words == ["hello", "hello", "world", "world"]
        # the default id: readable, one per cell, the same for the same settings
        assert [c.cell_id.rsplit("-", 1)[0] for c in plan] == ["toy-g1-r0", "toy-g2-r0"] * 2
        assert len({c.cell_id for c in plan}) == 4
        assert [c.cell_id for c in expand(load_config(path))] == [c.cell_id for c in plan]
        assert plan.swept == ["toy.words"]  # the section's list of more than one value

        dry = runner.invoke(app, ["benchmark", "-c", str(path), "-o", str(out), "--dry-run"])
        assert dry.exit_code == 0, dry.output
        assert all(c.cell_id in dry.stderr for c in plan)  # the kind's plan rows
        assert "4 of 4 cells would be skipped on this node" in dry.stderr
        assert not out.exists()

        run = runner.invoke(app, ["benchmark", "-c", str(path), "-o", str(out)])
        folder = experiment_dir(out, "toys")
        records = ExperimentStore(folder).records()  # parsed back into the kind's own model
        assert [type(r) for r in records] == [ToyResult] * 4, run.output
        assert [r.word for r in records if isinstance(r, ToyResult)] == [
            "hello",
            "hello",
            "world",
            "world",
        ]
        assert {r.status for r in records} == {"skipped"}
        assert {kind_of(r) for r in records} == {TOY_KIND}
        summary = pd.read_csv(folder / kind_summary_file("toy"))  # summary_toy.csv
        assert summary["cell_id"].tolist() == [c.cell_id for c in plan]
        assert summary["word"].tolist() == ["hello", "hello", "world", "world"]
        assert summary["error"].str.contains("backend mpi").all()
        # each cell's console line says why it measured nothing
        assert run.stderr.count("> [SKIP] skipped: ") == 4
        assert run.exit_code == 0, run.output  # a skipped cell is no failure

        html = tmp_path / "report.html"
        report = runner.invoke(app, ["report", "-s", str(folder), "-o", str(html)])
        assert report.exit_code == 0, report.output
        page = html.read_text(encoding="utf-8")
        assert "Toy cells measured" in page  # the card every kind with records gets
        assert "Toy echoes" not in page  # a kind without report pieces adds no section

    with added_kind(FULLER_TOY):  # the same records, read by the kind's own optional pieces
        html = tmp_path / "fuller.html"
        report = runner.invoke(app, ["report", "-s", str(folder), "-o", str(html)])
        assert report.exit_code == 0, report.output
        page = html.read_text(encoding="utf-8")
        assert "Toy echoes" in page and "Words echoed" in page and 'id="toy-table"' in page
        assert page.count(">world<") == 2  # its table's rows, one per cell
    with pytest.raises(ConfigError, match="unknown key 'toy'"):
        load_config(path)  # unregistered, its section is no key of the config


def test_the_toy_defines_only_what_no_default_gives() -> None:
    """The recipe's minimum (docs/architecture.md, "Adding a cell kind"): the five pieces of
    ``CellKind`` and, as the toy has one, its config section; the rest are ``KindBase``'s."""
    from typing_extensions import get_protocol_members

    from tests.support.toy_kind import ToyKind
    from torchscale.plan.kind_protocol import CellKind, kind_pieces

    required = get_protocol_members(CellKind)
    assert required == {"name", "settings_model", "worker_module", "record_models", "plan"}
    assert {k for k in vars(ToyKind) if not k.startswith("__")} == {*required, "config_section"}
    assert len(kind_pieces()) == 23  # what the stages ask of every kind, defaults included
    defaults = {k for k in vars(KindBase) if not k.startswith("_")}
    assert set(kind_pieces()) - defaults == required


def test_a_kinds_own_pieces_replace_the_defaults(tmp_path: Path) -> None:
    from tests.support.fuller_toy_kind import SUMMARY_TOY

    path = _config(tmp_path)
    out = tmp_path / "out"
    with added_kind(FULLER_TOY):
        plan = expand(load_config(path))
        assert [c.cell_id.split("-")[1] for c in plan] == ["hello", "hello", "world", "world"]
        dry = runner.invoke(app, ["benchmark", "-c", str(path), "-o", str(out), "--dry-run"])
        assert "toy:hello" in dry.stderr and "toy:world" in dry.stderr  # the kind's plan rows

        run = runner.invoke(app, ["benchmark", "-c", str(path), "-o", str(out)])
        assert run.exit_code == 0, run.output
        folder = experiment_dir(out, "toys")
        summary = pd.read_csv(folder / SUMMARY_TOY)
        assert summary["cell_id"].tolist() == [c.cell_id for c in plan]
        assert not (folder / kind_summary_file("toy")).exists()  # its own CSV, not the default
        assert run.stderr.count("> [TOY] hello: skipped") == 2  # each cell's console lines
        assert "> [SKIP]" not in run.stderr
        # the kind's table in the summary at the end
        # the title wraps at the table's width wherever the folder's name puts the break
        assert "toy echoes" in " ".join(run.stderr.split())
        assert run.stderr.count("│ world │ skipped │") == 2


def test_a_kinds_default_records_are_built_from_its_settings_and_result() -> None:
    settings = ToyCellSettings(word="hello", gpus=2)
    cell = Cell(0, TOY_KIND.cell_id(settings), settings, "toy")
    identity: Dict[str, Any] = {"cell_id": cell.cell_id, "experiment": "toys", "world_size": 2,
                "nproc_per_node": 2, "settings": settings.model_dump(mode="json")}  # fmt: skip
    [measured] = TOY_KIND.records(cell, identity, {"echo_ms": 1.5})
    assert isinstance(measured, ToyResult)
    assert (measured.word, measured.echo_ms, measured.status) == ("hello", 1.5, "ok")
    assert measured.settings["word"] == "hello" and measured.world_size == 2
    [lost] = TOY_KIND.failed(cell, identity, "timeout", "killed after 60 s")
    assert isinstance(lost, ToyResult)
    assert (lost.word, lost.echo_ms, lost.status, lost.error) == (
        "hello", None, "timeout", "killed after 60 s"
    )  # fmt: skip
    assert TOY_KIND.console_lines([lost]) == ["> [FAIL] timeout: killed after 60 s"]
    assert TOY_KIND.describe(cell, "cpu") == "toy cell on 2 CPU processes"


def test_each_kind_says_which_records_are_its_own() -> None:
    """The script kind writes the core kind's records: the registry gives it its own (the
    kind's ``owns``), and no shape check outside the kind does."""
    identity: Dict[str, Any] = {"experiment": "e", "world_size": 1, "nproc_per_node": 1}
    identity["status"] = "ok"
    run: Dict[str, Any] = {"batch_size": 8, "global_batch_size": 8, "precision": "fp32"}
    model = TrainingResult(**identity, **run, cell_id="m", model="resnet-tiny",
                           settings={"model": "resnet-tiny", "gpus": 1})  # fmt: skip
    script = TrainingResult(**identity, **run, cell_id="s", model="train.py",
                            settings={"script": "/x/train.py", "gpus": 1})  # fmt: skip
    assert kind_of(model) is cell_kinds()[TRAINING_KIND]
    assert kind_of(script) is cell_kinds()[SCRIPT_KIND]
    assert records_of(SCRIPT_KIND, [model, script]) == [script]
    assert records_of(TRAINING_KIND, [model, script]) == [model]
    toy = ToyResult(**identity, cell_id="t", word="w")
    assert kind_of(toy) is None  # no registered kind wrote it
    with added_kind(TOY):
        assert kind_of(toy) is cell_kinds()["toy"]
    with pytest.raises(TorchscaleError, match="unknown cell kind 'tyo'"):
        records_of("tyo", [model])


def test_a_kinds_section_is_checked_as_strictly_as_the_rest(tmp_path: Path) -> None:
    path = _config(tmp_path, "gpu_counts: [1]\ntoy: {wrds: [a]}\n")
    with added_kind(TOY), pytest.raises(ConfigError) as raised:
        load_config(path)
    assert "unknown key 'toy.wrds' (did you mean 'toy.words'?)" in str(raised.value)
    with (
        added_kind(TOY),
        pytest.raises(ConfigError, match="no 'communication:' or 'script:' or 'toy:'"),
    ):
        load_config(_config(tmp_path, "gpu_counts: [1]\n"))


def test_a_kind_that_lacks_a_piece_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = types.ModuleType("half_a_kind")
    module.KIND = types.SimpleNamespace(name="half", selections=("all",))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "half_a_kind", module)
    with added_kind("half_a_kind"), pytest.raises(TorchscaleError) as raised:
        cell_kinds()
    message = str(raised.value)
    assert message.startswith("half_a_kind.KIND is not a cell kind: it lacks ")
    assert "config_section" in message and "summary_tables" in message
    assert "selections" not in message


def test_a_kind_lacking_a_piece_without_a_default_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class NoPlan(KindBase):
        name = "noplan"
        worker_module = "noplan"

    module = types.ModuleType("no_plan_kind")
    module.KIND = NoPlan()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "no_plan_kind", module)
    with added_kind("no_plan_kind"), pytest.raises(TorchscaleError) as raised:
        cell_kinds()
    assert str(raised.value).startswith(
        "no_plan_kind.KIND is not a cell kind: it lacks plan, record_models, settings_model "
    )


def test_a_kind_tells_the_json_document_what_its_cells_ran(tmp_path: Path) -> None:
    from torchscale.analysis.report_data import Experiment
    from torchscale.analysis.report_tables import document_tables
    from torchscale.report.document import build_document

    identity: Dict[str, Any] = {"experiment": "toys", "world_size": 1, "nproc_per_node": 1}
    words: List[Tuple[str, CellStatus]] = [("hello", "ok"), ("hi", "ok"), ("unheard", "failed")]
    records: List[ResultBase] = [
        ToyResult(**identity, cell_id=f"toy-{word}", word=word, status=status, echo_ms=1.0)
        for word, status in words
    ]
    with added_kind(FULLER_TOY):
        experiment = Experiment("toys", tmp_path / "toys", {}, records)
        config = build_document(document_tables(experiment, tmp_path)).model_dump(mode="json")[
            "config"
        ]
    # the kind's own entry, under its name; the seed's one number from the first kind that ran
    assert config["iterations"] == {"toy": {"warmup": [0], "measured": [2, 5]}}
    assert (config["warmup_iters"], config["benchmark_iters"]) == (0, 2)


def test_a_kind_with_some_report_pieces_but_not_all_is_one_line_naming_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.support.fuller_toy_kind import KIND
    from tests.support.toy_kind import ToyKind
    from torchscale.report.reported_kinds import reported_kinds

    class HalfReported(ToyKind):
        name = "half"
        report_sections = KIND.report_sections

    module = types.ModuleType("half_reported")
    module.KIND = HalfReported()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "half_reported", module)
    with added_kind("half_reported"), pytest.raises(TorchscaleError) as raised:
        reported_kinds()
    assert str(raised.value) == (
        "cell kind half has report pieces but lacks document_iterations, document_results, "
        "report_cards (see torchscale.report.reported_kinds.ReportedKind)"
    )


def test_the_registry_lists_every_built_in_kind_once() -> None:
    assert list(cell_kinds()) == ["training", "communication", "script"]
    assert len(set(KIND_MODULES)) == len(KIND_MODULES)
