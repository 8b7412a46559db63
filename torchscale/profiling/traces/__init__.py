"""Trace readers. Each returns a :class:`~torchscale.profiling.traces.model.RankTrace` per rank."""

from torchscale.profiling.traces.discover import find_trace_files, load_traces
from torchscale.profiling.traces.model import RankTrace

__all__ = ["RankTrace", "find_trace_files", "load_traces"]
