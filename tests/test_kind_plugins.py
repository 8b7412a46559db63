"""A new cell kind is its own module plus one line in the registry.

The toy kind (``tests/support/toy_kind.py``, in no torchscale module) is registered at test time
and goes through config, plan, dry run, sweep, summary CSV, console and report; nothing else
knows it. Its cells are skipped by the sweep before any launch (``backend: mpi`` under
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

from tests.support.toy_kind import SUMMARY_TOY, ToyResult
from torchscale.cli.app import app
from torchscale.config.loader import load_config
from torchscale.errors import ConfigError, TorchscaleError
from torchscale.kinds.kind_registry import KIND_MODULES, added_kind
from torchscale.plan.kind_protocol import cell_kinds
from torchscale.plan.matrix import expand
from torchscale.results.layout import experiment_dir
from torchscale.results.schema import CellStatus, ResultBase
from torchscale.results.store import ExperimentStore

runner = CliRunner()
TOY = "tests.support.toy_kind"
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
    path = _config(tmp_path)
    out = tmp_path / "out"
    with added_kind(TOY):
        plan = expand(load_config(path))
        assert [(c.kind, c.settings.gpus) for c in plan] == [("toy", 1), ("toy", 2)] * 2
        assert [c.cell_id.split("-")[1] for c in plan] == ["hello", "hello", "world", "world"]
        assert plan.swept == ["toy.words"]

        dry = runner.invoke(app, ["benchmark", "-c", str(path), "-o", str(out), "--dry-run"])
        assert dry.exit_code == 0, dry.output
        assert "toy:hello" in dry.stderr and "toy:world" in dry.stderr  # the kind's plan rows
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
        summary = pd.read_csv(folder / SUMMARY_TOY)
        assert summary["cell_id"].tolist() == [c.cell_id for c in plan]
        assert summary["error"].str.contains("backend mpi").all()
        assert run.stderr.count("> [TOY] hello: skipped") == 2  # each cell's console lines
        assert run.exit_code == 0, run.output  # a skipped cell is no failure
        # the kind's table in the summary at the end
        # the title wraps at the table's width wherever the folder's name puts the break
        assert "toy echoes" in " ".join(run.stderr.split())
        assert run.stderr.count("│ world │ skipped │") == 2

        html = tmp_path / "report.html"
        report = runner.invoke(app, ["report", "-s", str(folder), "-o", str(html)])
        assert report.exit_code == 0, report.output
        page = html.read_text(encoding="utf-8")
        assert "Toy echoes" in page and "Words echoed" in page and 'id="toy-table"' in page
        assert page.count(">world<") == 2  # its table's rows, one per cell
    with pytest.raises(ConfigError, match="unknown key 'toy'"):
        load_config(path)  # unregistered, its section is no key of the config


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


def test_a_kind_tells_the_json_document_what_its_cells_ran(tmp_path: Path) -> None:
    from torchscale.report.document import build_document
    from torchscale.report.report_data import Experiment

    identity: Dict[str, Any] = {"experiment": "toys", "world_size": 1, "nproc_per_node": 1}
    words: List[Tuple[str, CellStatus]] = [("hello", "ok"), ("hi", "ok"), ("unheard", "failed")]
    records: List[ResultBase] = [
        ToyResult(**identity, cell_id=f"toy-{word}", word=word, status=status, echo_ms=1.0)
        for word, status in words
    ]
    with added_kind(TOY):
        experiment = Experiment("toys", tmp_path / "toys", {}, records)
        config = build_document(experiment, tmp_path).model_dump(mode="json")["config"]
    # the kind's own entry, under its name; the seed's one number from the first kind that ran
    assert config["iterations"] == {"toy": {"warmup": [0], "measured": [2, 5]}}
    assert (config["warmup_iters"], config["benchmark_iters"]) == (0, 2)


def test_a_kind_with_some_report_pieces_but_not_all_is_one_line_naming_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typing_extensions import get_protocol_members

    from tests.support.toy_kind import KIND
    from torchscale.plan.kind_protocol import CellKind
    from torchscale.report.reported_kinds import reported_kinds

    module = types.ModuleType("half_reported")
    pieces = {member: getattr(KIND, member) for member in get_protocol_members(CellKind)}
    module.KIND = types.SimpleNamespace(  # type: ignore[attr-defined]
        **{**pieces, "name": "half"}, report_sections=KIND.report_sections
    )
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
