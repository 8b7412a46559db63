"""One owner per concept: the results layout names every file, one straggler rule, one Finding
type, a use-case layer between the CLI and the engine, and profiling that does not launch.

Static checks walk the package's source with ``ast`` (no imports, no launches); the straggler
check feeds one set of per-rank figures to the worker, the profiler and the report.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pandas as pd
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "torchscale"
LAYOUT = PACKAGE / "results" / "layout.py"
FILE_NAME = re.compile(
    r"(?<![\w*{}%.-])[\w%*{}-]+(?:\.[\w{}]+)*\.(?:jsonl|json|csv|log|out|sh|steps|nsys-rep|sqlite)"
    r"(?![\w.-])"
)


@functools.cache
def _parsed() -> Tuple[Tuple[Path, ast.Module], ...]:
    """The package's modules, parsed once for all the checks here."""
    return tuple(
        (path, ast.parse(path.read_text(encoding="utf-8"), str(path)))
        for path in sorted(PACKAGE.rglob("*.py"))
    )


def _modules(folder: Path = PACKAGE) -> Iterator[Tuple[Path, ast.Module]]:
    return ((path, tree) for path, tree in _parsed() if folder in path.parents)


def _docstrings(tree: ast.Module) -> Set[int]:
    """ids of the docstring nodes (module, class, function): prose, not names in use."""
    found: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _literals(tree: ast.Module) -> Iterator[str]:
    """Every string literal, f-string pieces included, outside docstrings."""
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.value


def test_every_file_name_is_defined_in_the_results_layout_only() -> None:
    names: Dict[str, List[str]] = {}
    for path, tree in _modules():
        for text in _literals(tree):
            for name in FILE_NAME.findall(text):
                names.setdefault(name, []).append(str(path.relative_to(PACKAGE)))
    layout = str(LAYOUT.relative_to(PACKAGE))
    elsewhere = {name: where for name, where in names.items() if set(where) != {layout}}
    assert elsewhere == {}, "file names belong in torchscale/results/layout.py"
    # The names the issue lists, each exactly once (in the layout module).
    for name in ("findings.json", "results.jsonl", "summary.csv", "summary_comm.csv",
                 "manifest.json", "cell.json", "result.json", "sbatch.sh"):  # fmt: skip
        assert names[name] == [layout], name
    folders = _definitions(r'\w+\s*=\s*"(cells|profile|ranks|torchrun|flight_recorder)"')
    assert folders == ["results/layout.py"] * 5


def test_the_experiment_folder_rule_lives_in_the_layout() -> None:
    """``output_dir / experiment_dirname(name)`` is built by one function, nowhere else."""
    from torchscale.results.layout import experiment_dir, experiment_dirname

    assert experiment_dir(Path("out"), "my exp") == Path("out") / experiment_dirname("my exp")
    for path, tree in _modules():
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        if path != LAYOUT:
            assert not defined & {"experiment_dirname", "is_safe_name", "experiment_dir"}, path
        source = path.read_text(encoding="utf-8")
        if path != LAYOUT:
            assert "/ experiment_dirname(" not in source, path


def _imports(tree: ast.Module) -> Set[str]:
    found: Set[str] = set()
    for node in ast.walk(tree):  # inside functions too: a lazy import is still a dependency
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_profiling_does_not_import_launch_and_launch_not_the_capture_use_case() -> None:
    for path, tree in _modules(PACKAGE / "profiling"):
        launch = {m for m in _imports(tree) if m.startswith("torchscale.launch")}
        assert not launch, (path, launch)
    for path, tree in _modules(PACKAGE / "launch"):
        app = {m for m in _imports(tree) if m.startswith(("torchscale.app", "torchscale.cli"))}
        assert not app, (path, app)


def test_the_cli_calls_use_cases_and_the_use_cases_print_nothing() -> None:
    engine = ("run_sweep", "check_resumable", "write_summary", "ExperimentStore", "expand")
    for name in ("benchmark_command.py", "profile_command.py", "report_command.py"):
        tree = ast.parse((PACKAGE / "cli" / name).read_text(encoding="utf-8"))
        called = {
            n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
        }
        assert not called & set(engine), (name, called & set(engine))
        assert any(m.startswith("torchscale.app") for m in _imports(tree)), name
    for path, tree in _modules(PACKAGE / "app"):
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not {"print", "err_console", "print_json"} & used, path
        assert "stdout" not in attrs, path


def _definitions(pattern: str) -> List[str]:
    where = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if re.match(pattern, line):
                where.append(str(path.relative_to(PACKAGE)))
    return where


def test_one_straggler_rule_one_finding_type_one_severity_scale() -> None:
    rule = "measures/straggler.py"
    for constant in ("STRAGGLER_SPREAD", "STRAGGLER_MIN_CAUSED_SHARE", "STRAGGLER_MIN_INSTANCES",
                     "STRAGGLER_MIN_STALL_PCT"):  # fmt: skip
        assert _definitions(rf"{constant}\s*(:[^=]*)?=") == [rule], constant
    for function in ("find_straggler", "straggler_share_threshold", "straggler_advice",
                     "sync_variance_advice"):  # fmt: skip
        assert _definitions(rf"def {function}\(") == [rule], function
    assert _definitions(r"class Finding\b") == ["analysis/finding.py"]
    assert _definitions(r"class Severity\b") == ["analysis/finding.py"]
    assert _definitions(r"SEVERITY_ORDER\s*(:[^=]*)?=") == ["analysis/finding.py"]


def _worker_ranks(waits: List[float], step: float) -> List[Dict[str, object]]:
    return [
        {"rank": rank, "sync_wait_ms": wait, "step_time_ms": {"mean": step}} for rank, wait in
        enumerate(waits)
    ]  # fmt: skip


def _profiler_frames(waits: List[float], step: float, late: int) -> Tuple[pd.DataFrame, ...]:
    """The profiler's per-rank table for the same figures: each rank's wait as a share of its
    step, and the rank that waits least arriving last at every collective (it caused all the
    waiting), over 10 steps of one all-reduce."""
    n = len(waits)
    ranks = pd.DataFrame(
        {
            "rank": range(n),
            "significant_instances": 10,
            "times_last": [10 if r == late else 0 for r in range(n)],
            "last_share": [1.0 if r == late else 0.0 for r in range(n)],
            "caused_wait_share": [1.0 if r == late else 0.0 for r in range(n)],
            "sync_stall_pct": [100.0 * w / step for w in waits],
            "wait_us": [1000.0 * w * 10 for w in waits],
        }
    )
    instances = pd.DataFrame(
        [
            {"rank": r, "device": "cpu", "op": "all_reduce", "step": s, "is_last": r == late}
            for s in range(10)
            for r in range(n)
        ]
    )
    return ranks, instances


@pytest.mark.parametrize(
    ("waits", "step", "expected"),
    [
        ([30.0, 0.5, 31.0, 29.0], 100.0, 1),  # rank 1 arrives last: the others wait ~30%
        ([12.0, 11.0], 40.0, None),  # waits differ by 2.5% of the step: nobody to blame
        ([0.0, 45.0], 90.0, 0),
    ],
)
def test_worker_profiler_and_report_name_the_same_straggler(
    waits: List[float], step: float, expected: object
) -> None:
    from torchscale.analysis.telemetry import _straggler
    from torchscale.measures.straggler import RankWait, find_straggler, record_straggler
    from torchscale.profiling.finding_rules import straggler_findings
    from torchscale.worker.aggregate import sync_stats

    rule = find_straggler([RankWait(r, w) for r, w in enumerate(waits)], step)
    assert (rule.rank if rule else None) == expected

    sync = sync_stats(_worker_ranks(waits, step), step)
    assert sync is not None and sync["slowest_rank"] == expected
    assert (expected is not None) == ("is the straggler" in (sync["warning"] or ""))

    late = min(range(len(waits)), key=waits.__getitem__)
    ranks, instances = _profiler_frames(waits, step, late if expected is not None else -1)
    if expected is None:  # no rank arrives last more than the others: waiting shared evenly
        ranks["caused_wait_share"] = 1.0 / len(waits)
    found = straggler_findings(ranks, instances)
    assert [f.ranks for f in found] == ([[expected]] if expected is not None else [])

    # The report reads the worker's verdict from the record.
    from torchscale.results.schema import SyncStats

    class Record:
        def __init__(self) -> None:
            self.sync = SyncStats.model_validate(sync)
            self.per_rank: List[object] = []
            self.step_time_ms = None

    assert record_straggler(Record()) == expected  # type: ignore[arg-type]
    for rank in range(len(waits)):  # the telemetry findings' "is the straggler"
        assert _straggler(Record(), rank) == (rank == expected)  # type: ignore[arg-type]
    # A record without the worker's verdict gets the same rule from its per-rank waits.
    bare = Record()
    bare.sync = None  # type: ignore[assignment]
    bare.per_rank = [RankResultLike(r, w) for r, w in enumerate(waits)]
    bare.step_time_ms = StepLike(step)  # type: ignore[assignment]
    assert record_straggler(bare) == expected  # type: ignore[arg-type]


class RankResultLike:
    def __init__(self, rank: int, wait: float) -> None:
        self.rank, self.sync_wait_ms = rank, wait


class StepLike:
    def __init__(self, mean: float) -> None:
        self.mean = mean
