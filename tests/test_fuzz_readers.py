"""Property-based tests of the readers of what anyone may have written: the config (YAML), the
results (``results.jsonl``, a cell's ``result.json``, ``manifest.json``) and the traces (Kineto
JSON). Whatever the input, a reader gives a result or one line of the project's error type (exit
2 at the command line), never another exception. Each property is bounded to a few seconds:
few examples, derandomised (the same inputs in CI every time), no example database written."""

from __future__ import annotations

import json
import os
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.profile_helpers import DATA
from torchscale.errors import TorchscaleError

pytestmark = pytest.mark.timed(alone=False)  # hypothesis's deadline of 5 s an example

SCALE = int(os.environ.get("TORCHSCALE_FUZZ_SCALE", "1"))
"""Examples per property, times this: 1 in CI; a longer hunt by hand, e.g. 40 (random, not
derandomised, when above 1)."""
BOUNDED = settings(
    max_examples=25 * SCALE,
    deadline=timedelta(seconds=5),  # a loaded CI machine is slow, never this slow
    derandomize=SCALE == 1,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
RECORDS = DATA / "compare_unchanged" / "before" / "cpu_smoke" / "results.jsonl"

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1e-12, 1e300, "", "=cmd", "x\ny", "\x1b[2J", "8x", "1e999"]),
    st.text(max_size=12),
)
hostile = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def one_line(exc: TorchscaleError) -> None:
    """What the CLI prints for it: one line (a name with a line break is shown escaped)."""
    from torchscale.escaping import for_terminal

    text = for_terminal(str(exc))
    assert text.strip() and "\n" not in text and "Traceback" not in text


def outcome(call: Callable[[], Any]) -> Any:
    """``call()``'s result, or None after one line of the project's error type."""
    try:
        return call()
    except TorchscaleError as exc:
        one_line(exc)
        return None


# The config reader ------------------------------------------------------------------------------

CONFIG_KEYS = [
    "experiment_name", "models", "batch_sizes", "gpu_counts", "precision", "measure_steps",
    "measure_seconds", "warmup_steps", "cell_timeout_s", "repeats", "nodes", "ddp", "data",
    "launch", "profiling", "tune", "validation", "communication", "script", "unknown_key",
]  # fmt: skip
VALIDATION_KEYS = ["window_s", "sustained_s", "sample_interval_s", "link_s", "repeats", "expected"]
sensible = {
    "models": st.just(["resnet-tiny"]),
    "batch_sizes": st.lists(st.integers(-2, 64), max_size=3),
    "gpu_counts": st.lists(st.integers(-1, 4), max_size=3),
    "validation": st.dictionaries(st.sampled_from(VALIDATION_KEYS), hostile, max_size=3),
}
configs = st.dictionaries(st.sampled_from(CONFIG_KEYS), hostile, max_size=6).flatmap(
    lambda raw: st.fixed_dictionaries({k: v for k, v in sensible.items() if k not in raw}).map(
        lambda extra: {**extra, **raw}
    )
)


def _yaml(document: Any) -> str:
    try:
        return yaml.safe_dump(document, allow_unicode=True)
    except yaml.YAMLError:  # a key PyYAML cannot write: the text itself then
        return json.dumps(document, default=str)


@BOUNDED
@given(st.one_of(configs.map(_yaml), st.text(max_size=200)))
def test_the_config_reader_gives_a_config_or_one_line(text: str) -> None:
    from torchscale.config.loader import load_config, load_validation

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        config = outcome(lambda: load_config(path))
        if config is not None:
            assert config.models and all(b > 0 for b in config.batch_sizes)
        validation = outcome(lambda: load_validation(path))
        if validation is not None:
            assert 0.01 <= validation.window_s <= 60 and 0.1 <= validation.sustained_s <= 86400


# The results readers ----------------------------------------------------------------------------

FIELDS = [
    "kind", "status", "world_size", "nnodes", "batch_size", "throughput", "samples_per_s",
    "step_times_ms", "step_time_ms", "step_time_ms.cv", "step_time_ms.p95", "step_time_ms.mean",
    "per_rank", "per_rank.0.step_times_ms", "per_rank.0.host", "per_rank.0.cpu_wait_s",
    "settings", "settings.batch_size", "schema_version", "cell_id", "model", "device_name",
    "backend", "repeat", "sync", "memory", "runtime", "launch",
]  # fmt: skip


def _base_documents() -> List[Dict[str, Any]]:
    return [json.loads(line) for line in RECORDS.read_text().splitlines() if line.strip()]


def _set(document: Dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node: Any = document
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.get(part)
        if not isinstance(node, (dict, list)):
            return
    if isinstance(node, list):
        if node:
            node[int(leaf)] = value
    else:
        node[leaf] = value


edits = st.lists(
    st.tuples(st.integers(0, 7), st.sampled_from(FIELDS), hostile), min_size=1, max_size=6
)
junk = st.lists(st.one_of(st.text(max_size=40), hostile.map(json.dumps)), max_size=3)


def _edited(changes: List[Tuple[int, str, Any]]) -> List[Dict[str, Any]]:
    documents = _base_documents()
    for index, field, value in changes:
        _set(documents[index % len(documents)], field, value)
    return documents


@settings(BOUNDED, max_examples=10 * SCALE)  # each example compares two runs: ~0.3 s
@given(edits, junk)
def test_the_results_reader_and_compare_give_records_or_one_line(
    changes: List[Tuple[int, str, Any]], lines: List[str]
) -> None:
    from torchscale.analysis.comparison import CompareOptions, compare_runs
    from torchscale.analysis.training_tables import training_table
    from torchscale.results.store import ExperimentStore

    with tempfile.TemporaryDirectory() as folder:
        store = ExperimentStore(Path(folder))
        text = [json.dumps(d, allow_nan=True) for d in _edited(changes)] + lines
        store.results_path.write_text("\n".join(text) + "\n", errors="surrogatepass")
        records = outcome(store.records)
        clean_store = ExperimentStore(Path(folder) / "clean")
        clean_store.root.mkdir()
        clean_store.results_path.write_text(RECORDS.read_text())
        clean = clean_store.records()
    if records is None:
        return
    training_table(records)
    result = outcome(lambda: compare_runs(clean, records, CompareOptions(resamples=100)))
    if result is not None:
        assert isinstance(result.passed, bool)  # a verdict, whatever the figures


@BOUNDED
@given(hostile, edits)
def test_the_manifest_and_result_json_readers_give_a_document_or_one_line(
    manifest: Any, changes: List[Tuple[int, str, Any]]
) -> None:
    from torchscale.results.rank_files import read_json
    from torchscale.results.store import ExperimentStore
    from torchscale.results.validity import check_and_parse

    with tempfile.TemporaryDirectory() as folder:
        store = ExperimentStore(Path(folder))
        store.manifest_path.write_text(json.dumps(manifest, allow_nan=True))
        read = outcome(store.manifest)
        assert read is None or isinstance(read, dict)
        result = Path(folder) / "result.json"  # rank 0's hand-off, with hostile fields
        result.write_text(json.dumps(_edited(changes)[0], allow_nan=True))
        document = read_json(result)
        assert document is None or isinstance(document, dict)
        if document is not None:
            documents, records = check_and_parse([document], result)
            assert len(records) <= 1 and len(documents) == 1  # kept, or left out by name


# The trace reader -------------------------------------------------------------------------------

NAMES = ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3", "[memory]", "aten::mm",
         "nccl:all_reduce", "gloo:all_reduce", "ncclKernel_AllReduce", "sgemm", "cudaLaunchKernel",
         "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"]  # fmt: skip
CATS = ["kernel", "cpu_op", "user_annotation", "gpu_memcpy", "gpu_memset", "cuda_runtime",
        "cpu_instant_event", "Trace", "python_function"]  # fmt: skip
times = st.one_of(
    st.floats(min_value=0, max_value=2e4),
    st.floats(min_value=-1e3, max_value=1e3),
    st.sampled_from([1e300, -1e300, 0.5, 4.4e12]),
    hostile,
)
events = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "X", "X", "i", "s", "f", "M"]),
        "name": st.one_of(st.sampled_from(NAMES), hostile),
        "ts": times,
    },
    optional={
        "cat": st.one_of(st.sampled_from(CATS), hostile),
        "dur": times,
        "pid": st.one_of(st.integers(-1, 3), hostile),
        "tid": st.one_of(st.integers(0, 9), hostile),
        "s": st.sampled_from(["t", "g", "p"]),
        "args": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "stream": st.one_of(st.integers(-1, 9), hostile),
                    "correlation": st.one_of(st.integers(-1, 50), hostile),
                    "Total Allocated": hostile,
                    "Total Reserved": hostile,
                    "Bytes": hostile,
                    "Device Id": st.one_of(st.integers(-1, 2), hostile),
                    "Device Type": st.one_of(st.integers(0, 2), hostile),
                    "External id": hostile,
                },
            ),
            hostile,
        ),
    },
)
numbers = st.one_of(
    st.floats(min_value=0, max_value=2e4),
    st.floats(min_value=0, max_value=2e4),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e300, -5.0, 0.0, 0.4]),
)
sane_events = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "X", "X", "i"]),
        "name": st.sampled_from(NAMES),
        "cat": st.sampled_from(CATS),
        "ts": numbers,
        "dur": numbers,
        "pid": st.integers(0, 1),
        "tid": st.integers(0, 3),
        "args": st.fixed_dictionaries(
            {"stream": st.integers(-1, 3), "correlation": st.integers(-1, 20)},
            optional={
                "Total Allocated": numbers,
                "Total Reserved": numbers,
                "Bytes": numbers,
                "Device Id": st.integers(-1, 1),
                "Device Type": st.integers(0, 1),
            },
        ),
    },
    optional={"s": st.just("t")},
)
"""Events of the right shape with figures of any value: these reach every analysis (an event
of the wrong shape, such as a name that is not a string, refuses the whole trace in one line)."""
traces = st.fixed_dictionaries(
    {
        "traceEvents": st.one_of(
            st.lists(sane_events, min_size=1, max_size=40),
            st.lists(sane_events, min_size=1, max_size=40),
            st.lists(events, max_size=30),
        )
    },
    optional={
        "distributedInfo": st.one_of(
            st.fixed_dictionaries(
                {"rank": st.one_of(st.integers(-1, 3), hostile)},
                optional={"world_size": hostile, "backend": hostile},
            ),
            hostile,
        ),
        "deviceProperties": hostile,
    },
)


@BOUNDED
@given(traces)
def test_the_trace_reader_gives_an_analysis_or_one_line(trace: Dict[str, Any]) -> None:
    from torchscale.profiling.analysis import analyze, to_document
    from torchscale.results.files import dumps

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "rank0.json"
        path.write_text(json.dumps(trace, allow_nan=True))
        result = outcome(lambda: analyze([path], "all", workers=1))
        if result is not None:
            document: Any = to_document(result)
            dumps(document)  # strict JSON, whatever the trace held
            (read,) = document["traces"]
            assert read["events"] > 0  # an analysis never passes on nothing
