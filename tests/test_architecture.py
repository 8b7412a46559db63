"""The package's shape: no import cycle between modules or packages, packages only down the
pipeline, cell kinds compared only in their registry, one file name per module, and one
declaration per trace table and per validate probe. Read from the source with ``ast``: nothing
is imported but the registry and the two declarations (each check shown to refuse a planted
violation)."""

from __future__ import annotations

import ast
import functools
import re
from collections import Counter
from pathlib import Path
from typing import Any, Collection, Dict, Iterator, List, Set, Tuple

import torchscale

PACKAGE = Path(torchscale.__file__).parent
REGISTRY = PACKAGE / "kinds" / "kind_registry.py"


def _modules() -> Dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _imported(module: str, path: Path) -> Iterator[Tuple[str, int]]:
    """(torchscale module, line) for every import in ``path``, at any depth: module level,
    inside functions, under ``TYPE_CHECKING``. ``from pkg import name`` is the submodule
    ``pkg.name`` when there is one, else ``pkg`` itself."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            subs = [f"{base}.{alias.name}" for alias in node.names]
            names = [sub for sub in subs if sub in MODULES] or [base]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name.startswith("torchscale") and name != module:
                yield name, node.lineno


@functools.cache
def _graph() -> Dict[str, Set[str]]:
    return {
        module: {name for name, _ in _imported(module, path)} for module, path in MODULES.items()
    }


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_back_through_others() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_sees_a_function_level_loop() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    # and the graph holds function-level imports: the CLI imports its commands lazily
    assert "torchscale.cli.benchmark_command" in _graph()["torchscale.cli.app"]


def _kind_vocabulary() -> Set[str]:
    from torchscale.plan.kind_protocol import cell_kinds, record_kinds

    return {name for cell_kind in cell_kinds() for name in [cell_kind, *record_kinds(cell_kind)]}


def _names_a_kind(node: ast.expr) -> bool:
    """``kind``, ``cell.kind``, ``record.kind``, ``doc.get("kind")``, ``doc["kind"]``."""
    if isinstance(node, ast.Name):
        return node.id.endswith("kind")
    if isinstance(node, ast.Attribute):
        return node.attr.endswith("kind")
    if isinstance(node, ast.Call) and node.args:
        first = node.args[0]
        return isinstance(first, ast.Constant) and first.value == "kind"
    if isinstance(node, ast.Subscript):
        key = node.slice
        return isinstance(key, ast.Constant) and key.value == "kind"
    return False


def _literals(node: ast.expr) -> List[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [name for element in node.elts for name in _literals(element)]
    return []


def kind_literal_comparisons(tree: ast.Module, vocabulary: Set[str]) -> List[Tuple[int, str]]:
    """(line, kind name) for every comparison of a kind with a cell or record kind's name."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        if any(_names_a_kind(operand) for operand in operands):
            for operand in operands:
                found += [(node.lineno, name) for name in _literals(operand) if name in vocabulary]
    return found


def test_no_kind_is_compared_with_a_literal_outside_the_registry() -> None:
    vocabulary = _kind_vocabulary()
    assert {"training", "communication", "collective", "tp_gemm"} <= vocabulary
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: kind == {name!r}"
        for path in MODULES.values()
        if path != REGISTRY
        for line, name in kind_literal_comparisons(_tree(path), vocabulary)
    ]
    assert found == [], "compare kinds through torchscale.kinds.kind_registry:\n" + "\n".join(found)


def test_the_literal_finder_sees_every_spelling() -> None:
    source = (
        'a = cell.kind == "communication"\n'
        'b = "training" != kind\n'
        'c = doc.get("kind") in ("collective", "other")\n'
        'd = series.kind == "bar"\n'
        'e = r["kind"] == "tp_gemm"\n'
    )
    found = kind_literal_comparisons(ast.parse(source), _kind_vocabulary())
    assert found == [(1, "communication"), (2, "training"), (3, "collective"), (5, "tp_gemm")]


def _docstrings(tree: ast.Module) -> Set[int]:
    """The ``id`` of every docstring's node: prose may name a kind."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def kind_names(tree: ast.Module, vocabulary: Set[str]) -> List[Tuple[int, str]]:
    """(line, kind name) for every string literal, but a docstring, that is a cell or record
    kind's name: compared, in a tuple or list, a dict key, an argument, anywhere."""
    prose = _docstrings(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in vocabulary
        and id(node) not in prose
    ]


def test_the_kind_name_finder_sees_tuples_keys_and_arguments() -> None:
    source = (
        '"""The training and communication kinds: prose."""\n'
        'for kind in ("training", "communication"):\n'
        '    found = {"collective": kind, "tp_gemm": [get("script")]}\n'
        'label = "training cells"\n'
    )
    found = kind_names(ast.parse(source), _kind_vocabulary())
    assert found == [(2, "training"), (2, "communication"), (3, "collective"), (3, "tp_gemm"),
                     (3, "script")]  # fmt: skip


REPORT = PACKAGE / "report"


def test_the_report_reaches_kinds_only_through_its_protocol() -> None:
    """No module of ``report/`` imports a kind's package or the registry's names of kinds, or
    names a kind in a literal: a kind's sections, cards, document entries and iterations come
    through ``report/reported_kinds.py``'s ``ReportedKind``."""
    vocabulary = _kind_vocabulary()
    named = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name!r}"
        for path in sorted(REPORT.rglob("*.py"))
        for line, name in kind_names(_tree(path), vocabulary)
    ]
    assert named == [], "ask the kinds (report.reported_kinds):\n" + "\n".join(named)
    imported = [
        f"{module}:{line} imports {target}"
        for module, path in MODULES.items()
        if _package(module) == "report"
        for target, line in _imported(module, path)
        if _package(target) in KIND_PACKAGES
    ]
    assert imported == []
    constants = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {alias.name}"
        for path in sorted(REPORT.rglob("*.py"))
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("kind_registry")
        for alias in node.names
        if alias.name.endswith("_KIND")
    ]
    assert constants == []


def test_every_record_model_belongs_to_one_cell_kind() -> None:
    from torchscale.plan.kind_protocol import cell_kinds
    from torchscale.results.schema import RECORD_KINDS

    written = [model for kind in cell_kinds().values() for model in kind.record_models]
    assert sorted(written, key=str) == sorted(RECORD_KINDS.values(), key=str)
    assert len(set(written)) == len(written)


def test_no_two_modules_share_a_file_name() -> None:
    """A file name says what the module is: ``report/nodes.py`` and ``analysis/nodes.py`` did not.
    ``__init__.py`` and ``__main__.py`` are Python's own names."""
    names = Counter(
        path.name for path in MODULES.values() if path.name not in ("__init__.py", "__main__.py")
    )
    shared = {
        name: sorted(str(p.relative_to(PACKAGE)) for p in MODULES.values() if p.name == name)
        for name, count in names.items()
        if count > 1
    }
    assert shared == {}


def _kind_packages() -> List[str]:
    """The packages of the registry's kinds (``torchscale.comm.kind`` -> ``comm``), in its order."""
    from torchscale.kinds.kind_registry import KIND_MODULES

    packages = [m.split(".")[1] for m in KIND_MODULES if m.count(".") >= 2]
    return [p for i, p in enumerate(packages) if p not in packages[:i]]


KIND_PACKAGES = _kind_packages()
"""The kinds' own packages (``training``, ``comm``), found from the registry: a new kind's
package takes its place here without an edit."""

PIPELINE = [
    "errors", "version", "escaping", "console_tables", "kinds", "results", "measures", "hardware", "models", "config", "plan",
    "launch", "runtime", "worker", "analysis", "profiling", "report", *KIND_PACKAGES,
    "integrations", "history", "validate", "tune", "app", "api", "cli", "__main__",
]  # fmt: skip
"""Sub-packages from the bottom up: each imports only those before it (config -> plan -> launch ->
worker -> results -> analysis -> report, read as data flow; the record schema and the device
facts are leaves every stage reads, cli/app sit on top). The kind registry (``kinds``) is a leaf
that names kinds by module; a kind's own package sits above every stage it plugs into, and no
stage imports it."""

KNOWN_BACKWARD: Dict[Tuple[str, str], str] = {}
"""Imports against the pipeline, each with why. Empty, and kept so: a stage that needs something
of a later one gets it through a protocol (``plan.kind_protocol``) or a leaf module."""

STAGES = ("config", "plan", "launch", "report")
"""The stages that reach a kind only through the registry and its protocols."""


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _package_graph() -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {}
    for module, targets in _graph().items():
        source = _package(module)
        graph.setdefault(source, set()).update(
            _package(t) for t in targets if _package(t) not in (source, "__init__")
        )
    graph.pop("__init__", None)
    return graph


def test_packages_import_only_down_the_pipeline() -> None:
    backward: Dict[Tuple[str, str], List[str]] = {}
    for module, path in MODULES.items():
        source = _package(module)
        for target, line in _imported(module, path):
            pair = (source, _package(target))
            if "__init__" in pair or pair[0] == pair[1]:
                continue
            assert pair[0] in PIPELINE and pair[1] in PIPELINE, f"place {pair} in PIPELINE"
            if PIPELINE.index(pair[1]) > PIPELINE.index(pair[0]):
                backward.setdefault(pair, []).append(f"{module}:{line} imports {target}")
    new = {pair: where for pair, where in backward.items() if pair not in KNOWN_BACKWARD}
    assert new == {}, "imports against the pipeline (see PIPELINE)"
    gone = sorted(set(KNOWN_BACKWARD) - set(backward))
    assert gone == [], f"no longer imported: remove {gone} from KNOWN_BACKWARD"
    assert KNOWN_BACKWARD == {}, "no import may go against the pipeline: never add one"


def test_no_package_imports_itself_back_through_others() -> None:
    assert _cycles(_package_graph()) == []
    # the package graph is read from the same imports: the report reads the analysis tables
    assert "analysis" in _package_graph()["report"]


def test_the_stages_never_import_a_kinds_package() -> None:
    assert {"training", "comm"} <= set(KIND_PACKAGES)
    graph = _package_graph()
    found = {stage: sorted(graph[stage] & set(KIND_PACKAGES)) for stage in STAGES}
    assert found == {stage: [] for stage in STAGES}


# --- one declaration per concept: a trace table, a validate probe -------------------------------
# (Report sections are already one list: report/content.py's ``_content`` builds every section
# in one call, and the HTML, the PDF and the page's contents iterate ``ReportContent.sections``.)


def test_every_trace_table_is_declared_once_with_its_function_and_its_file() -> None:
    from torchscale.profiling import trace_tables
    from torchscale.results.layout import profile_table_file

    assert trace_tables.declaration_problems(trace_tables.TRACE_TABLES) == []
    names = [t.name for t in trace_tables.TRACE_TABLES]
    assert trace_tables.table_files() == {name: profile_table_file(name) for name in names}
    # the CSV names come from the declaration only: no other list of tables in the package
    for module, path in MODULES.items():
        if module != "torchscale.profiling.trace_tables":
            assert "profile_table_file(" not in path.read_text() or path.name == "layout.py"


def test_the_trace_table_check_reports_each_missing_or_doubled_piece() -> None:
    from torchscale.profiling.trace_tables import (
        TRACE_TABLES,
        TraceTable,
        check_declarations,
        declaration_problems,
    )

    first = TRACE_TABLES[0]
    no_file = TraceTable("", first.compute)  # no name, so no CSV
    no_function = TraceTable("orphan", None)  # type: ignore[arg-type]
    planted = {
        "no CSV file": (*TRACE_TABLES, no_file),
        "no function computes it": (*TRACE_TABLES, no_function),
        f"trace table {first.name!r} declared 2 times": (*TRACE_TABLES, first),
        f"CSV file {first.file!r} declared 2 times": (*TRACE_TABLES, first),
    }
    for problem, declared in planted.items():
        assert any(problem in p for p in declaration_problems(declared)), problem
        try:
            check_declarations(declared)
        except TypeError as exc:
            assert problem in str(exc)
        else:
            raise AssertionError(f"not refused: {problem}")


VALIDATE = PACKAGE / "validate"
MEASURING_CALLS = {"Figure": 0, "figure": 0, "of": 0, "gemm": 1}
"""Calls whose argument at that position is the probe a figure (or a failure) is measured for."""


def measured_probes(tree: ast.Module) -> Set[str]:
    """Every probe a module measures: the literal names passed to a figure, a probe failure or a
    GEMM, and the first of each pair of ``GEMM_DTYPES``."""
    found: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            at = MEASURING_CALLS.get(name)
            if at is not None and len(node.args) > at:
                arg = node.args[at]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.add(arg.value)
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "GEMM_DTYPES" for t in node.targets
        ):
            for pair in getattr(node.value, "elts", []):
                first = pair.elts[0] if isinstance(pair, ast.Tuple) else None
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    found.add(first.value)
    return found


def probe_declaration_gaps(trees: List[ast.Module], declared: Set[str]) -> List[str]:
    measured = set().union(*(measured_probes(tree) for tree in trees))
    return [f"probe {p!r} is measured but not declared" for p in sorted(measured - declared)] + [
        f"probe {p!r} is declared but never measured" for p in sorted(declared - measured)
    ]


def _validate_trees() -> List[ast.Module]:
    return [ast.parse(path.read_text()) for path in sorted(VALIDATE.glob("*.py"))]


def test_every_validate_probe_is_declared_once_and_measured() -> None:
    from torchscale.hardware.expected_figures import EXPECTED, PROBES, probe_problems
    from torchscale.validate.levels import LEVELS

    assert probe_problems(PROBES, EXPECTED) == []
    assert {probe.level for probe in PROBES.values()} <= set(LEVELS)
    assert probe_declaration_gaps(_validate_trees(), set(PROBES)) == []
    # nothing but the declaration says a probe's fix: no table of fixes left in validate/
    for path in VALIDATE.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                assert not keys & set(PROBES), (path.name, keys & set(PROBES))


def test_the_probe_checks_report_each_missing_piece() -> None:
    from dataclasses import replace

    from torchscale.hardware.expected_figures import (
        EXPECTED,
        PROBES,
        Expected,
        check_probes,
        probe_problems,
    )

    gemm = PROBES["gemm_bf16"]
    unknown_sku = ((("h100",), {"gemm_bf61": Expected(1.0, "a typo")}),)
    planted = {
        "probe 'toy' has no fix": ({**PROBES, "toy": replace(gemm, label="Toy", fix=" ")}, ()),
        "level 7 is not one of": ({**PROBES, "toy": replace(gemm, label="Toy", level=7)}, ()),
        "share the label 'GEMM bf16'": ({**PROBES, "toy": gemm}, ()),
        "figure of undeclared probe 'gemm_bf61'": (PROBES, (*EXPECTED, *unknown_sku)),
    }
    for problem, (probes, expected) in planted.items():
        assert any(problem in p for p in probe_problems(probes, expected)), problem
        try:
            check_probes(probes, expected)
        except TypeError as exc:
            assert problem in str(exc)
        else:
            raise AssertionError(f"not refused: {problem}")
    # a measurement of an undeclared probe, and a declared probe nothing measures
    planted_source = ast.parse('m.figure("toy_probe", prepare, 1.0, 1e-9)\n')
    assert probe_declaration_gaps([*_validate_trees(), planted_source], set(PROBES)) == [
        "probe 'toy_probe' is measured but not declared"
    ]
    assert probe_declaration_gaps(_validate_trees(), {*PROBES, "toy"}) == [
        "probe 'toy' is declared but never measured"
    ]


# --- storage apart from measures: results/ holds records, the store, the layout and safe I/O ----

STATISTICS_LIBRARIES = ("numpy", "pandas", "scipy", "statistics")
"""What a statistic is computed with; storage needs none of them."""


def _package_modules(package: str) -> Dict[str, Path]:
    prefix = f"torchscale.{package}"
    return {m: p for m, p in MODULES.items() if m == prefix or m.startswith(prefix + ".")}


def _defined_names(tree: ast.Module) -> Set[str]:
    """The public names a module defines at its top level (functions, classes, assignments)."""
    names: Set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if not name.startswith("_")}


def measures_in_storage(storage: Dict[str, Path], measures: Dict[str, Path]) -> List[str]:
    """Where a storage module holds a measure: it defines a name a measures module defines (a
    statistic, the straggler rule, a figure), imports the measures package, or imports a
    statistics library."""
    owners = {
        name: module for module, path in measures.items() for name in _defined_names(_tree(path))
    }
    found = []
    for module, path in sorted(storage.items()):
        for name in sorted(_defined_names(_tree(path)) & set(owners)):
            found.append(f"{module} defines {name}, which {owners[name]} owns")
        for target, line in _imported(module, path):
            if _package(target) == "measures":
                found.append(f"{module}:{line} imports {target}")
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            found.extend(
                f"{module}:{node.lineno} imports {name}, a statistics library"
                for name in names
                if name.split(".")[0] in STATISTICS_LIBRARIES
            )
    return found


def test_results_holds_storage_not_measures() -> None:
    storage, measures = _package_modules("results"), _package_modules("measures")
    assert {"torchscale.results.store", "torchscale.results.files"} <= set(storage)
    assert {"torchscale.measures.stats", "torchscale.measures.figures"} <= set(measures)
    assert measures_in_storage(storage, measures) == []


def test_the_storage_check_refuses_a_measure_planted_in_results(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import numpy as np\n"
        "from torchscale.measures.figures import Figure\n"
        "from ..measures import straggler\n"
        "STRAGGLER_SPREAD = 0.2\n"
        "def t_quantile(probability, df):\n"
        "    return 2.0\n",
        encoding="utf-8",
    )
    storage = {**_package_modules("results"), "torchscale.results.planted": planted}
    assert measures_in_storage(storage, _package_modules("measures")) == [
        "torchscale.results.planted defines STRAGGLER_SPREAD, which torchscale.measures.straggler "
        "owns",
        "torchscale.results.planted defines t_quantile, which torchscale.measures.stats owns",
        "torchscale.results.planted:2 imports torchscale.measures.figures",
        "torchscale.results.planted:3 imports torchscale.measures.straggler",
        "torchscale.results.planted:1 imports numpy, a statistics library",
    ]


ATOMIC_WRITE_OWNER = "torchscale.results.files"
"""The one module that replaces a file (temporary file, fsync, rename, the folder's fsync, no
link followed): everything else calls its ``atomic_write_bytes``."""


def own_atomic_writes(modules: Dict[str, Path]) -> List[str]:
    """Where a module other than :data:`ATOMIC_WRITE_OWNER` renames a file over another itself."""
    found = []
    for module, path in sorted(modules.items()):
        if module == ATOMIC_WRITE_OWNER:
            continue
        for node in ast.walk(_tree(path)):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "replace"
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
            ) or (
                isinstance(node, ast.ImportFrom)
                and node.module == "os"
                and any(alias.name == "replace" for alias in node.names)
            ):
                found.append(f"{module}:{node.lineno} replaces a file itself (os.replace)")
    return found


def test_one_module_owns_the_atomic_write() -> None:
    assert own_atomic_writes(MODULES) == []
    assert own_atomic_writes({ATOMIC_WRITE_OWNER: MODULES[ATOMIC_WRITE_OWNER]}) == []


def test_the_atomic_write_check_refuses_a_module_renaming_by_itself(tmp_path: Path) -> None:
    planted = tmp_path / "own_write.py"
    planted.write_text(
        "import os\nfrom os import replace\n\ndef save(tmp, path):\n    os.replace(tmp, path)\n",
        encoding="utf-8",
    )
    assert own_atomic_writes({**MODULES, "torchscale.report.own_write": planted}) == [
        "torchscale.report.own_write:2 replaces a file itself (os.replace)",
        "torchscale.report.own_write:5 replaces a file itself (os.replace)",
    ]
    # the owner's own rename is the one allowed
    owner_source = _tree(MODULES[ATOMIC_WRITE_OWNER])
    assert any(
        isinstance(node, ast.Attribute) and node.attr == "replace"
        for node in ast.walk(owner_source)
    )


# --- a record's kind: asked of the kinds, never read from its shape ------------------------------


def _settings_keys() -> Set[str]:
    """The settings keys that tell one kind's cells from another's: a field of some kind's
    settings model that another kind's lacks (``script``, ``model``, ``collectives``)."""
    from torchscale.plan.kind_protocol import cell_kinds

    fields = [set(kind.settings_model.model_fields) for kind in cell_kinds().values()]
    return set().union(*fields) - fields[0].intersection(*fields[1:])


def _names_settings(node: ast.expr) -> bool:
    """``settings``, ``record.settings``, ``doc["settings"]``, ``doc.get("settings")``."""
    if isinstance(node, ast.Name):
        return node.id.endswith("settings")
    if isinstance(node, ast.Attribute):
        return node.attr.endswith("settings")
    if isinstance(node, ast.Subscript):
        key = node.slice
        return isinstance(key, ast.Constant) and key.value == "settings"
    if isinstance(node, ast.Call) and node.args:
        first = node.args[0]
        return isinstance(first, ast.Constant) and first.value == "settings"
    return False


def record_shape_checks(tree: ast.Module, keys: Set[str]) -> List[Tuple[int, str]]:
    """(line, what) for every test of which kind a record is by its shape: an ``is_<x>_record``
    function, or one of ``keys`` tested for in a record's settings (``"script" in r.settings``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and re.fullmatch(r"is_\w+_record", node.name):
            found.append((node.lineno, f"def {node.name}"))
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            left, right = node.left, node.comparators[0]
            if isinstance(left, ast.Constant) and left.value in keys and _names_settings(right):
                found.append((node.lineno, f"{left.value!r} in settings"))
    return found


def test_no_record_is_told_apart_by_its_shape_outside_its_kind() -> None:
    """Which kind wrote a record is the kinds' to say (``KindBase.owns``, asked through
    ``plan.kind_protocol.kind_of``/``records_of``); only a kind's own package may read its
    records' shape."""
    keys = _settings_keys()
    assert {"script", "model", "collectives"} <= keys
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
        for module, path in MODULES.items()
        if _package(module) not in KIND_PACKAGES
        for line, what in record_shape_checks(_tree(path), keys)
    ]
    assert found == [], "ask the kinds (plan.kind_protocol.kind_of):\n" + "\n".join(found)


def test_the_record_shape_finder_sees_a_planted_check() -> None:
    planted = ast.parse(
        "def is_script_record(record):\n"
        '    return "script" in record.settings and "model" not in record.settings\n'
        'scripts = [d for d in docs if "script" in d["settings"]]\n'
        'named = "model" in doc.get("settings", {})\n'
        'fine = "gpus" in record.settings or "script" in argv\n'
    )
    assert sorted(record_shape_checks(planted, _settings_keys())) == [
        (1, "def is_script_record"),
        (2, "'model' in settings"),
        (2, "'script' in settings"),
        (3, "'script' in settings"),
        (4, "'model' in settings"),
    ]


def analysis_calls(tree: ast.Module) -> List[str]:
    """What a module imports from ``torchscale.analysis`` that computes: a module or a function
    (classes, the tables' types, and constants are what a drawing may take from it)."""
    import importlib
    import inspect

    found: List[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                f"{node.lineno}: import {alias.name}"
                for alias in node.names
                if alias.name.startswith("torchscale.analysis")
            ]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            if not module.startswith("torchscale"):
                continue
            for alias in node.names:
                target = f"{module}.{alias.name}"
                if not target.startswith("torchscale.analysis"):
                    continue
                if f"{module}.{alias.name}" in MODULES:
                    found.append(f"{node.lineno}: {target} (a module)")
                    continue
                value = getattr(importlib.import_module(module), alias.name)
                if inspect.isroutine(value) or isinstance(value, functools.partial):
                    found.append(f"{node.lineno}: {target} (a function)")
    return found


def test_the_report_draws_and_never_computes() -> None:
    """``report/`` takes its tables from ``analysis.report_tables`` (computed once, before any
    drawing) and imports from ``analysis`` only types and constants, never a function."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(REPORT.rglob("*.py"))
        for line in analysis_calls(_tree(path))
    ]
    assert found == [], "compute it in analysis/report_tables.py:\n" + "\n".join(found)


def test_the_compute_finder_sees_modules_functions_and_plain_imports() -> None:
    planted = ast.parse(
        "from torchscale.analysis.training_tables import training_table\n"
        "from torchscale.analysis import cells\n"
        "import torchscale.analysis.scaling\n"
        "def f():\n"
        "    from torchscale.analysis.findings import findings_table\n"
        "from torchscale.analysis.scaling import EFFICIENCY_GOOD\n"
        "from torchscale.analysis.report_tables import ReportTables\n"
    )
    assert [line.split(":")[0] for line in analysis_calls(planted)] == ["1", "2", "3", "5"]


def built_section_names(trees: List[ast.Module]) -> Set[str]:
    """Every section name a module builds: the literal first argument of each ``Section(...)``."""
    found: Set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Section":
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    found.add(first.value)
    return found


def section_declaration_gaps(trees: List[ast.Module], declared: Dict[str, bool]) -> List[str]:
    """``declared``: each section's name, and whether it is several sections (named apart)."""
    built = built_section_names(trees)
    single = {name for name, several in declared.items() if not several}
    return [f"section {n!r} is built but not declared" for n in sorted(built - set(declared))] + [
        f"section {n!r} is declared but never built" for n in sorted(single - built)
    ]


def test_every_report_section_is_declared_once_and_built() -> None:
    """The one list of sections (``report/section_list.py``): each has a renderer and its tables,
    every section the report builds is declared there, and every one declared is built."""
    from torchscale.report.section_list import SECTIONS, section_problems

    assert section_problems(SECTIONS) == []
    trees = [_tree(path) for path in sorted(REPORT.rglob("*.py"))]
    declared = {s.name: s.several for s in SECTIONS}
    assert section_declaration_gaps(trees, declared) == []


def test_the_section_checks_report_each_missing_piece() -> None:
    from torchscale.report.section_list import SECTIONS, ReportSection, section_problems

    scaling = next(s for s in SECTIONS if s.name == "scaling")
    planted_lists = {
        "report section 'scaling' declared 2 times": (*SECTIONS, scaling),
        "report section 'toy': no table 'toys'": (
            *SECTIONS,
            ReportSection("toy", ("toys",), scaling.draw),
        ),
        "report section 'toy': no renderer draws it": (
            *SECTIONS,
            ReportSection("toy", ("curves",), None),  # type: ignore[arg-type]
        ),
        "report section 'toy': its renderer does not take its tables": (
            *SECTIONS,
            ReportSection("toy", ("curves", "nodes"), scaling.draw),
        ),
    }
    for problem, declared_list in planted_lists.items():
        assert any(problem in p for p in section_problems(declared_list)), problem
    trees = [_tree(path) for path in sorted(REPORT.rglob("*.py"))]
    declared = {s.name: s.several for s in SECTIONS}
    built_toy = ast.parse("Section('toy', 'Toy', 'A section no list declares.')")
    assert section_declaration_gaps([*trees, built_toy], declared) == [
        "section 'toy' is built but not declared"
    ]
    assert section_declaration_gaps(trees, {**declared, "toy": False}) == [
        "section 'toy' is declared but never built"
    ]


CLI = PACKAGE / "cli"
CLI_APP = CLI / "app.py"
CLI_LEAVES = {
    # parsing what a user types
    "torchscale.errors",  # the one error a command raises for bad input
    "torchscale.config.durations",  # --timeout 90s, --budget 20m
    "torchscale.integrations.deadline",  # --integration-timeout's default
    # printing
    "torchscale.version",  # --version
    "torchscale.escaping",  # names escaped for the terminal
    "torchscale.console_tables",  # tables at any width
    "torchscale.results.files",  # the one JSON encoder (--json)
    "torchscale.measures.figures",  # a figure's name and the glossary's address
    "torchscale.results.layout",  # the file names a line or a --help text names
    "torchscale.hardware.device_noun",  # "GPU" or "CPU process"
    "torchscale.report.formatting",  # numbers as the report writes them
    "torchscale.analysis.finding",  # the one severity vocabulary shown
    "torchscale.profiling.traces.discover",  # where a trace's rank number came from, in words
    "torchscale.tune.tune_outputs",  # a trial's settings in words
    "torchscale.validate.display",  # validate's table pieces
    "torchscale.validate.fleet_view",  # the fleet's table
}
"""What a module of ``cli/`` may import besides ``cli/`` and ``app/``: leaves for parsing and
printing. Imports under ``TYPE_CHECKING`` name types for annotations and are not counted."""
CLI_VIEWS = {
    "benchmark_view": "the live per-cell lines of a run (app.benchmark.LiveEvents)",
    "running_cell": "where a running cell is, for the live lines",
    "plan_view": "--dry-run's plan tables",
}
"""The live views of a run: they implement ``app/``'s events protocol and draw the cells and
records it hands them with the analysis' console lines. They may import the engines; no
command module may (the list only shrinks)."""
REGISTERING = {"command", "callback", "add_typer"}


def _registers(node: ast.AST) -> bool:
    """``X.command(...)``, ``X.callback(...)``, ``X.add_typer(...)``."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in REGISTERING
    )


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(tree):
        if _is_type_checking(child):
            continue
        yield child
        yield from _runtime_nodes(child)


def registered_commands(app_tree: ast.Module) -> List[Tuple[str, str]]:
    """(module, function) of every ``X.command(...)(module.function)`` and
    ``X.callback(...)(module.function)`` of ``cli/app.py``."""
    found = []
    for node in ast.walk(app_tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Call)
            and isinstance(node.func.func, ast.Attribute)
            and node.func.func.attr in ("command", "callback")
            and node.args
            and isinstance(node.args[0], ast.Attribute)
            and isinstance(node.args[0].value, ast.Name)
        ):
            found.append((node.args[0].value.id, node.args[0].attr))
    return found


def _app_names(tree: ast.Module) -> Set[str]:
    """Names a module imports from ``torchscale.app`` (at any depth) that are functions: the
    use cases (CamelCase names are their request and outcome types)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torchscale.app"):
            names |= {a.asname or a.name for a in node.names if not a.name[:1].isupper()}
    return names


def command_shape_problems(
    app_tree: ast.Module,
    modules: Dict[str, ast.Module],
    leaves: Set[str],
    views: Collection[str] = (),
) -> List[str]:
    """What breaks the one command shape: a command registered anywhere but at the module level
    of ``cli/app.py``; a command that is not a module-level function of its module; a command
    that calls no use case of ``app/``, or more than one; a module of ``cli/`` that imports an
    engine package (anything but ``cli/``, ``app/`` and ``leaves``; ``views`` are let be)."""
    problems = []
    for name, tree in {"app": app_tree, **modules}.items():
        for outer in ast.walk(tree):
            if not isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(outer):
                if not isinstance(inner, ast.FunctionDef) or inner is outer:
                    continue
                if any(_registers(d) for d in inner.decorator_list):
                    problems.append(
                        f"cli/{name}.py: command {inner.name!r} is defined inside "
                        f"{outer.name!r}: a command is a module-level function"
                    )
        for statement in tree.body:
            # cli/app.py registers at its module level (its root callback's decorator too)
            inside = getattr(statement, "body", []) if name == "app" else [statement]
            if isinstance(statement, (ast.If, ast.Try, ast.With)):
                inside = [statement] if name != "app" else []
            if any(_registers(n) for part in inside for n in ast.walk(part)):
                problems.append(
                    f"cli/{name}.py line {statement.lineno}: a command registered outside "
                    "cli/app.py's module level"
                )
    commands = registered_commands(app_tree)
    if not commands:
        problems.append("cli/app.py registers no command")
    for module, function in commands:
        command_tree = modules.get(module)
        defined = {
            n.name: n
            for n in (command_tree.body if command_tree else [])
            if isinstance(n, ast.FunctionDef)
        }
        if command_tree is None or function not in defined:
            problems.append(f"cli/{module}.py: command {function!r} is not a module-level function")
            continue
        uses = _app_names(command_tree)
        called = sorted(
            {
                n.func.id
                for n in ast.walk(defined[function])
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in uses
            }
        )
        if len(called) != 1:
            problems.append(
                f"cli/{module}.py: command {function!r} calls {len(called)} use cases of app/ "
                f"({', '.join(called) or 'none'}): a command calls exactly one"
            )
    for name, tree in modules.items():
        if name in views:
            continue
        for node in _runtime_nodes(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                subs = [f"{base}.{alias.name}" for alias in node.names]
                imported = [sub for sub in subs if sub in MODULES] or [base]
            elif isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            else:
                continue
            for target in imported:
                if not target.startswith("torchscale.") or target in leaves:
                    continue
                if target.split(".")[1] in ("cli", "app"):
                    continue
                problems.append(
                    f"cli/{name}.py line {node.lineno} imports {target}: cli/ reaches the "
                    "engines only through app/"
                )
    return problems


def _cli_trees() -> Dict[str, ast.Module]:
    return {path.stem: _tree(path) for path in sorted(CLI.glob("*.py")) if path != CLI_APP}


def test_every_command_is_one_module_level_function_over_one_use_case() -> None:
    assert command_shape_problems(_tree(CLI_APP), _cli_trees(), CLI_LEAVES, CLI_VIEWS) == []
    assert set(CLI_VIEWS) <= set(_cli_trees())  # a view gone is a line gone from the list
    # every command the root app serves is one that the check read
    from torchscale.cli.app import app

    registered = {f for _, f in registered_commands(_tree(CLI_APP))}
    assert {c.callback.__name__ for c in app.registered_commands if c.callback} <= registered
    # and every option and argument of every command says what it is in --help
    import typer

    def undocumented(command: Any, path: str) -> Iterator[str]:  # typer's own click's Command
        for param in command.params:
            if not getattr(param, "help", None):
                yield f"{path} {param.name}"
        for name, sub in getattr(command, "commands", {}).items():
            yield from undocumented(sub, f"{path} {name}")

    assert list(undocumented(typer.main.get_command(app), "torchscale")) == []


def test_the_command_shape_check_refuses_each_planted_violation(tmp_path: Path) -> None:
    good_app = (
        "from torchscale.cli import good\napp = typer.Typer()\napp.command('good')(good.good)\n"
    )
    good = (
        "from torchscale.errors import TorchscaleError\n"
        "def good(x: int) -> None:\n"
        "    from torchscale.app.thing import ThingRequest, do_thing\n"
        "    print(do_thing(ThingRequest(x)))\n"
    )
    nested = (
        "def register(app):\n"
        "    @app.command('inner')\n"
        "    def inner() -> None:\n"
        "        from torchscale.app.thing import do_thing\n"
        "        do_thing()\n"
    )
    two = (
        "from torchscale.app.thing import do_thing, other_thing\n"
        "def good() -> None:\n"
        "    do_thing()\n"
        "    other_thing()\n"
    )
    engine = good + "def helper() -> None:\n    from torchscale.analysis.scaling import x\n"
    planted = {
        "is defined inside 'register'": (good_app, {"good": good, "bad": nested}),
        "a command registered outside cli/app.py": (good_app, {"good": good, "bad": nested}),
        "calls 2 use cases of app/ (do_thing, other_thing)": (good_app, {"good": two}),
        "calls 0 use cases of app/ (none)": (
            good_app,
            {"good": "def good() -> None:\n    print(1)\n"},
        ),
        "imports torchscale.analysis.scaling: cli/ reaches the engines only through app/": (
            good_app,
            {"good": engine},
        ),
        "command 'good' is not a module-level function": (
            good_app,
            {"good": "def register():\n    def good() -> None:\n        pass\n"},
        ),
    }
    parse = ast.parse
    assert command_shape_problems(parse(good_app), {"good": parse(good)}, CLI_LEAVES) == []
    for problem, (app_source, sources) in planted.items():
        for name, source in sources.items():  # the planted module is written and read back
            (tmp_path / f"{name}.py").write_text(source)
        trees = {name: parse((tmp_path / f"{name}.py").read_text()) for name in sources}
        found = command_shape_problems(parse(app_source), trees, CLI_LEAVES)
        assert any(problem in p for p in found), (problem, found)


def test_the_architecture_page_lists_the_pipeline_as_the_test_holds_it() -> None:
    """docs/architecture.md names the layer order the imports keep, so a move that changes it
    redraws the page too."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    start = page.index("(`PIPELINE`: ")
    named = re.findall(r"`([^`]*)`", page[start + len("(`PIPELINE`") : page.index("),", start)])
    listed = [name.strip() for part in named for name in part.split(",") if name.strip()]
    assert listed == [p for p in PIPELINE if p != "__main__"]
