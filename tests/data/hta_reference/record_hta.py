"""Record what Holistic Trace Analysis 0.5.0 computes on the real traces in tests/data/hta_traces.

Not run by the test suite (HTA is not a dependency): run by hand in a throwaway virtualenv, and
commit the JSON it writes beside this script (``hta_0.5.0.json``), which the tests compare with:

    python3 -m venv /tmp/traces/htavenv
    /tmp/traces/htavenv/bin/pip install HolisticTraceAnalysis==0.5.0
    /tmp/traces/htavenv/bin/python tests/data/hta_reference/record_hta.py

Each trace is analysed alone (HTA reads every trace of a folder: one copy per folder). Recorded
per trace, where HTA computes it: the temporal breakdown and overlap, the idle-time breakdown
(``consecutive_kernel_delay=30``), the GPU kernel breakdown (``num_kernels=10``,
``duration_ratio=0.8``, memory kernels included), CUDA launch statistics (summarised: HTA returns
one row per launch), and the queue-length summary. ``trace_diff``: ``TraceDiff.compare_traces``
of the 2-rank trace against a copy with one kernel planted slow
(``tests/support/planted_traces.py``), over every iteration, CPU ops and GPU kernels. Failures are
recorded as ``{"error": ...}``: a trace HTA cannot analyse is a finding too.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable, Dict

HERE = Path(__file__).resolve().parent
TRACES = HERE.parent / "hta_traces"
OUT = HERE / "hta_0.5.0.json"
TRACE_FILES = (
    "nccl-2rank-rank0.json.gz",
    "nccl-16rank-rank0.json.gz",
    "rocm-mi250-rank0.json.gz",
    "mtia-inference-rank0.json.gz",
    "no-distributed-info.json.gz",
)
QUANTILES = (0.5, 0.9, 0.99)


def _planted() -> Any:
    spec = importlib.util.spec_from_file_location(
        "planted_traces", HERE.parents[1] / "support" / "planted_traces.py"
    )
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _records(frame: Any) -> Any:
    return json.loads(frame.to_json(orient="records"))


def _summary(series: Any) -> Dict[str, float]:
    out = {"count": int(series.count()), "sum": float(series.sum()), "mean": float(series.mean())}
    out.update({f"p{int(q * 100)}": float(series.quantile(q)) for q in QUANTILES})
    out["max"] = float(series.max()) if len(series) else float("nan")
    return out


def _try(what: Callable[[], Any]) -> Any:
    try:
        return what()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "where": traceback.format_exc(limit=-2)}


def analyse(folder: Path) -> Dict[str, Any]:
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_dir=str(folder))
    ranks = sorted(analysis.t.traces.keys())
    result: Dict[str, Any] = {"ranks": ranks}
    result["temporal_breakdown"] = _try(
        lambda: _records(analysis.get_temporal_breakdown(visualize=False))
    )
    result["comm_comp_overlap"] = _try(
        lambda: _records(analysis.get_comm_comp_overlap(visualize=False))
    )
    result["idle_time"] = _try(
        lambda: _records(analysis.get_idle_time_breakdown(ranks=ranks, visualize=False)[0])
    )

    def kernels() -> Dict[str, Any]:
        types, metrics = analysis.get_gpu_kernel_breakdown(
            visualize=False, duration_ratio=0.8, num_kernels=10, include_memory_kernels=True
        )
        return {"kernel_type": _records(types), "kernel_metrics": _records(metrics)}

    result["kernel_breakdown"] = _try(kernels)

    def launches() -> Dict[str, Any]:
        stats = analysis.get_cuda_kernel_launch_stats(
            ranks=ranks,
            runtime_cutoff=50,
            launch_delay_cutoff=100,
            include_memory_events=True,
            visualize=False,
        )
        out = {}
        for rank, frame in stats.items():
            out[str(rank)] = {
                column: _summary(frame[column])
                for column in ("cpu_duration", "gpu_duration", "launch_delay")
            }
            out[str(rank)]["short_kernels"] = int(
                (frame["gpu_duration"] < frame["cpu_duration"]).sum()
            )
            out[str(rank)]["runtime_over_50us"] = int((frame["cpu_duration"] > 50).sum())
            out[str(rank)]["launch_delay_over_100us"] = int((frame["launch_delay"] > 100).sum())
        return out

    result["launch_stats"] = _try(launches)

    def queue() -> Any:
        summary = analysis.get_queue_length_summary(ranks=ranks)
        if summary is None:
            return None
        summary.columns = [col[-1] for col in summary.columns]
        return _records(summary.reset_index())

    result["queue_length"] = _try(queue)
    return result


def trace_diff(work: Path) -> Dict[str, Any]:
    from hta.trace_diff import DeviceType, LabeledTrace, TraceDiff

    planted = _planted()
    control_dir, test_dir = work / "control", work / "test"
    control_dir.mkdir()
    shutil.copy(TRACES / "nccl-2rank-rank0.json.gz", control_dir)
    name, slowed = planted.plant_slow_kernel(
        TRACES / "nccl-2rank-rank0.json.gz", test_dir / "nccl-2rank-rank0.json"
    )
    control = LabeledTrace(label="control", trace_dir=str(control_dir))
    test = LabeledTrace(label="test", trace_dir=str(test_dir))
    frame = TraceDiff.compare_traces(
        control,
        test,
        control_iteration=control.iterations(),
        test_iteration=test.iterations(),
        device_type=DeviceType.ALL,
    )
    frame = frame.reset_index().rename(columns={"index": "name"})
    top = frame.reindex(frame["diff_duration"].abs().sort_values(ascending=False).index)
    return {
        "planted_kernel": name,
        "planted_runs": slowed,
        "iterations": control.iterations(),
        "totals": {
            column: float(frame[column].sum())
            for column in frame.columns
            if column.endswith(("_counts", "_duration"))
        },
        "names": len(frame),
        "top_by_diff_duration": _records(top.head(10)),
    }


def main() -> None:
    logging.disable(logging.WARNING)
    import hta

    report: Dict[str, Any] = {
        "hta_version": getattr(hta, "__version__", "0.5.0"),
        "command": "/tmp/traces/htavenv/bin/python tests/data/hta_reference/record_hta.py",
        "python": sys.version.split()[0],
        "traces": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in TRACE_FILES:
            folder = Path(tmp) / name.split(".")[0]
            folder.mkdir()
            shutil.copy(TRACES / name, folder)
            report["traces"][name] = _try(lambda folder=folder: analyse(folder))
        diff_work = Path(tmp) / "diff"
        diff_work.mkdir()
        report["trace_diff"] = _try(lambda: trace_diff(diff_work))
    OUT.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
