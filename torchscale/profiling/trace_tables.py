"""Every table a trace analysis produces, declared once (``TRACE_TABLES``): its name and the
function of the traces that computes it. Its CSV's name follows from its name by the layout's
rule (``results.layout.profile_table_file``); ``analyze`` computes every table declared here,
``write_outputs`` writes each to its CSV and lists them in findings.json, and the CLI names the
files written. No other list of tables exists: adding an analysis is its function (usually in
``analyzers/``) plus one line here. HTA's style: data here, plotting elsewhere.

A table's function gets the analysis in progress (``Tables``): the traces, and any other table by
name (computed once, on first use), so one table may be built on another (pace on the critical
path) and a function that yields several tables (``queue_tables``) runs once (``Tables.once``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import pandas as pd

from torchscale.profiling.analyzers.critical_path import critical_path
from torchscale.profiling.analyzers.idle_time import idle_time_breakdown
from torchscale.profiling.analyzers.kernel_stats import (
    kernel_distribution,
    kernel_type_breakdown,
    top_kernels,
)
from torchscale.profiling.analyzers.kernels import MEMORY, kernel_time_by_class
from torchscale.profiling.analyzers.launches import launch_stats, queue_tables
from torchscale.profiling.analyzers.memory_timeline import memory_summary, memory_timeline
from torchscale.profiling.analyzers.pace import step_pace
from torchscale.profiling.analyzers.steps import dataloader_time, step_times
from torchscale.profiling.analyzers.trace_breakdown import temporal_breakdown
from torchscale.profiling.analyzers.trace_collectives import collective_tables
from torchscale.profiling.traces.model import RankTrace
from torchscale.results.layout import profile_table_file


class Tables:
    """The analysis of one set of traces in progress: each table computed once, when first asked
    for (by ``analyze``, or by another table's function)."""

    def __init__(self, traces: List[RankTrace], declared: Sequence[TraceTable]) -> None:
        self.traces = traces
        self._declared = {table.name: table for table in declared}
        self._tables: Dict[str, pd.DataFrame] = {}
        self._shared: Dict[Callable[..., Any], Any] = {}

    def __getitem__(self, name: str) -> pd.DataFrame:
        if name not in self._tables:
            self._tables[name] = self._declared[name].compute(self)
        return self._tables[name]

    def once(self, function: Callable[[List[RankTrace]], Any]) -> Any:
        """``function(traces)``, run once for every table that needs it."""
        if function not in self._shared:
            self._shared[function] = function(self.traces)
        return self._shared[function]


@dataclass(frozen=True)
class TraceTable:
    """One table of the analysis: ``name`` (its key in ``ProfileAnalysis.tables`` and in
    findings.json's ``tables``) and the function that computes it."""

    name: str
    compute: Callable[[Tables], pd.DataFrame]

    @property
    def file(self) -> str:
        """Its CSV, beside findings.json."""
        return profile_table_file(self.name)


def trace_rank_table(
    traces: List[RankTrace], steps: pd.DataFrame, classes: pd.DataFrame, stragglers: pd.DataFrame
) -> pd.DataFrame:
    """One row per rank: breakdown, overlap, sync stall, step time, data loading, memory share."""
    table = temporal_breakdown(traces)
    step_stats = steps.groupby("rank")["duration_us"].agg(steps="count", step_mean_us="mean")
    memory_rows = classes[(classes["kernel_class"] == MEMORY) & (classes["device"] == "gpu")]
    memory = memory_rows.set_index("rank")["pct_of_busy"].rename("memory_pct")
    table = (
        table.merge(step_stats, left_on="rank", right_index=True, how="left")
        .merge(stragglers, on="rank", how="left")
        .merge(dataloader_time(traces), on="rank", how="left")
        .merge(memory, left_on="rank", right_index=True, how="left")
    )
    table["steps"] = table["steps"].fillna(0).astype(int)
    table["memory_pct"] = table["memory_pct"].fillna(0.0)
    table.insert(1, "source", [t.source for t in traces])
    table.insert(2, "rank_source", [t.metadata.get("rank_source") for t in traces])
    table.insert(3, "device", [t.metadata.get("device") for t in traces])
    return table


def collective_calls(coll: Dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Every collective call of every rank, with the instance it belongs to (matched across
    ranks) and whether this rank was the last in."""
    if not len(coll["calls"]):
        return coll["calls"]
    calls = coll["calls"].merge(
        coll["instances"][["rank", "step", "op", "seq", "instance", "wait_us", "is_last"]],
        on=["rank", "step", "op", "seq"],
        how="left",
    )
    # calls without a match on every rank have no instance: keep ints as ints
    calls["instance"] = calls["instance"].astype("Int64")
    calls["is_last"] = calls["is_last"].astype("boolean")
    return calls


def of_traces(function: Callable[[List[RankTrace]], pd.DataFrame]) -> Callable[[Tables], Any]:
    """A table that is a function of the traces alone."""
    return lambda tables: function(tables.traces)


def _ranks(tables: Tables) -> pd.DataFrame:
    stragglers = tables.once(collective_tables)["stragglers"]
    return trace_rank_table(tables.traces, tables["steps"], tables["kernel_classes"], stragglers)


TRACE_TABLES: Tuple[TraceTable, ...] = (
    # the breakdown: one row per rank, steps, kernel classes, collective calls
    TraceTable("ranks", _ranks),
    TraceTable("steps", of_traces(step_times)),
    TraceTable("kernel_classes", of_traces(kernel_time_by_class)),
    TraceTable("collectives", lambda t: collective_calls(t.once(collective_tables))),
    # the per-rank analyses beyond it (analyzers/)
    TraceTable("idle_time", of_traces(idle_time_breakdown)),
    TraceTable("kernel_types", of_traces(kernel_type_breakdown)),
    TraceTable("kernel_distribution", of_traces(kernel_distribution)),
    TraceTable("top_kernels", of_traces(top_kernels)),
    TraceTable("launch_stats", of_traces(launch_stats)),
    TraceTable("queue_length", lambda t: t.once(queue_tables)[0]),
    TraceTable("queue_timeline", lambda t: t.once(queue_tables)[1]),
    TraceTable("memory", of_traces(memory_summary)),
    TraceTable("memory_timeline", of_traces(memory_timeline)),
    TraceTable("critical_path", of_traces(critical_path)),
    TraceTable("pace", lambda t: step_pace(t.traces, t["critical_path"])),
)
"""Every table, in the order they are written and listed."""


def declaration_problems(declared: Iterable[TraceTable]) -> List[str]:
    """What is wrong with a list of tables (nothing: ``[]``): a table without a name, a function
    or a file, a name or a file declared twice."""
    problems: List[str] = []
    names: Dict[str, int] = {}
    files: Dict[str, int] = {}
    for table in declared:
        if not table.name.isidentifier():
            problems.append(f"trace table {table.name!r}: its name is not a plain identifier")
        if not callable(table.compute):
            problems.append(f"trace table {table.name!r}: no function computes it")
        file = table.file if table.name else ""
        if not file.endswith(".csv") or file == ".csv":
            problems.append(f"trace table {table.name!r}: no CSV file")
        names[table.name] = names.get(table.name, 0) + 1
        files[file] = files.get(file, 0) + 1
    problems += [f"trace table {name!r} declared {n} times" for name, n in names.items() if n > 1]
    problems += [f"CSV file {file!r} declared {n} times" for file, n in files.items() if n > 1]
    return problems


def check_declarations(declared: Iterable[TraceTable]) -> None:
    problems = declaration_problems(declared)
    if problems:
        raise TypeError("; ".join(problems))


check_declarations(TRACE_TABLES)  # a broken list fails at import, in every test, not on a user


def table_files() -> Dict[str, str]:
    """Every table's name -> its CSV, in order."""
    return {table.name: table.file for table in TRACE_TABLES}


def compute_tables(
    traces: List[RankTrace], names: Optional[Sequence[str]] = None
) -> Tuple[Dict[str, pd.DataFrame], Tables]:
    """Every declared table (or those of ``names``) of the same traces, in declaration order;
    with the ``Tables`` they came from (the findings read the collectives' instances there)."""
    declared = TRACE_TABLES
    tables = Tables(traces, declared)
    wanted = [t.name for t in declared] if names is None else list(names)
    return {name: tables[name] for name in wanted}, tables
