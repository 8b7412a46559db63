"""How fast is ``torchscale profile analyze`` on a 1,000,000-kernel trace, in each format?

    PYTHONPATH=. python benchmarks/trace_analysis_speed.py [--workdir DIR] [--hta] [--keep]
    PYTHONPATH=. python benchmarks/trace_analysis_speed.py --memory [--workdir DIR]

1. Writes a synthetic Kineto trace (``synthetic_kineto.py``: >= 1,000,000 kernels on two
   streams, NCCL all-reduce and compute kernels, a launch and a flow pair per kernel, cpu_ops,
   ProfilerStep ranges; ~1.3 GB of JSON) and an nsys SQLite export with >= 1,000,000 kernel rows
   (``tests/data/make_nsys_fixture.py``, published export schema).
2. Analyses each in a fresh process (read + every analysis + findings), reporting wall time, CPU
   time and peak RSS of the main process and of its largest parse worker; then runs the per-rank
   analyses beyond the breakdown (those of ``trace_tables``: idle time, kernels, launches, queue,
   memory, critical path, pace) once more alone, for their own time and their own peak memory (the
   process's peak RSS during them, reset just before, less its RSS then: what the analyses add over
   the traces held, Linux; memory the process had freed is reused first, so also the peak of what
   they allocate, traced by ``tracemalloc`` in a third run). Then ``profile diff`` of each trace
   against itself in a fresh process (both captures read whole, every table built): wall, CPU and
   peak RSS.
3. With ``--hta``: times HolisticTraceAnalysis 0.5.0 (load + temporal breakdown + overlap) on the
   same Kineto trace, for the speed ratio. HTA loads the whole JSON: expect many GB of memory.

Goal: under 10 s and under 1 GB for each format on the 2-core dev machine.

``--memory`` instead writes dense ``.json.gz`` traces of 1M and 10M events
(``synthetic_kineto.write_dense_trace``: per kernel a cpu_op, its launch and the kernel; short
repetitive lines, 10M events in ~60 MB) and one of 10M kernel events alone (every event kept:
the worst case per event), and reports each analysis's peak RSS, wall and CPU seconds (one
process, one parse worker) and the peak's growth per event over the 1M-event trace.
Goal: at most 60 bytes an event, 10M events under 1 GB.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from synthetic_kineto import write_dense_trace, write_kernel_trace, write_kineto_trace  # noqa: E402

TARGET_KERNELS = 1_000_000

# Linux: the process's resident memory now and its peak since the last reset; writing 5 to
# clear_refs resets the peak (Linux >= 4.0), so a step's own peak can be read after it.
RSS = """
import re
def _status(key):
    with open("/proc/self/status") as fh:
        return int(re.search(key + r":\\s+(\\d+)", fh.read()).group(1)) / 1024
def rss_now_mb():
    return _status("VmRSS")
def rss_peak_since_reset_mb():
    return _status("VmHWM")
def reset_peak():
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
"""

ANALYZE = (
    RSS
    + """
import json, resource, sys, time
from pathlib import Path
t0, c0 = time.perf_counter(), time.process_time()
from torchscale.profiling.analysis import analyze
workers = int(sys.argv[2]) if len(sys.argv) > 2 else None
result = analyze([Path(sys.argv[1])], "all", workers=workers)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
rss_main = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
from torchscale.profiling.trace_tables import TRACE_TABLES, compute_tables
BREAKDOWN = ("ranks", "steps", "kernel_classes", "collectives")
DETAIL = [t.name for t in TRACE_TABLES if t.name not in BREAKDOWN]
def detail_tables(traces):
    return compute_tables(traces, DETAIL)[0]
held = rss_now_mb()  # the traces and analyze's tables
reset_peak()
t1, c1 = time.perf_counter(), time.process_time()
detail_tables(result.traces)  # again, alone: the per-rank analyses' own share of the time
detail_wall, detail_cpu = time.perf_counter() - t1, time.process_time() - c1
detail_peak = rss_peak_since_reset_mb()
import tracemalloc  # a third run, traced: the analyses' own allocations (numpy's included)
tracemalloc.start()
detail_tables(result.traces)
traced_peak = tracemalloc.get_traced_memory()[1] / (1 << 20)
tracemalloc.stop()
kernels = int(sum((t.gpu["cat"] == "kernel").sum() for t in result.traces))
print(json.dumps({"wall_s": wall, "cpu_s": cpu,
                  "detail_tables_wall_s": detail_wall, "detail_tables_cpu_s": detail_cpu,
                  "detail_tables_rss_before_mb": held, "detail_tables_peak_rss_mb": detail_peak,
                  "detail_tables_own_peak_mb": detail_peak - held,
                  "detail_tables_traced_peak_mb": traced_peak,
                  "kernels_analysed": kernels, "findings": len(result.findings),
                  "events_kept": sum(t.event_count for t in result.traces),
                  "rss_main_mb": rss_main,
                  "rss_worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                  "cpu_workers_s": resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
                  + resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime}))
"""
)

# ``profile diff`` of a capture against itself: both read whole, every rank diffed.
DIFF = """
import json, resource, sys, time
from pathlib import Path
t0, c0 = time.perf_counter(), time.process_time()
from torchscale.profiling.trace_diff import diff_traces
diff = diff_traces([Path(sys.argv[1])], [Path(sys.argv[1])])
ops = diff.tables["ops"]
children = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": time.perf_counter() - t0,
                  "cpu_s": time.process_time() - c0,
                  "cpu_workers_s": children.ru_utime + children.ru_stime,
                  "ops": len(ops), "changed_ops": int((ops["status"] != "same").sum()),
                  "steps": diff.new_steps,
                  "rss_main_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rss_worker_mb": children.ru_maxrss / 1024}))
"""

HTA = """
import json, resource, sys, time
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
tb = a.get_temporal_breakdown(visualize=False)
ov = a.get_comm_comp_overlap(visualize=False)
print(json.dumps({"wall_s": time.perf_counter() - t0,
                  "idle_pct": float(tb["idle_time_pctg"][0]),
                  "overlap_pct": float(ov["comp_comm_overlap_pctg"][0]),
                  "rss_main_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _run(code: str, arg: Path, timeout: float, *more: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, str(arg), *more],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=True,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    except subprocess.CalledProcessError as exc:
        return {"error": exc.stderr.strip().splitlines()[-1] if exc.stderr else str(exc)}
    return json.loads(out.stdout.strip().splitlines()[-1])


def memory(work: Path) -> dict:
    """Peak RSS against event count."""
    report: dict = {"machine": f"{os.cpu_count()} cores", "load_avg": os.getloadavg()}
    cases = (
        ("dense-1M", 1_000_000, write_dense_trace),
        ("dense-10M", 10_000_000, write_dense_trace),
        ("kernels-10M", 10_000_000, write_kernel_trace),
    )
    for name, events, write in cases:
        trace = work / name / "rank0.json.gz"
        if not trace.exists():
            trace.parent.mkdir(parents=True, exist_ok=True)
            write(trace, events)
        row = _run(ANALYZE, trace.parent, 900, "1")
        row["gz_bytes"] = trace.stat().st_size
        row["events"] = events
        report[name] = row
    small = report["dense-1M"]
    for name in ("dense-10M", "kernels-10M"):
        big = report[name]
        if "rss_main_mb" in big and "rss_main_mb" in small:
            growth = (big["rss_main_mb"] - small["rss_main_mb"]) * (1 << 20)
            big["bytes_per_event_over_1M"] = round(growth / (big["events"] - small["events"]), 1)
            big["peak_bytes_per_event"] = round(big["rss_main_mb"] * (1 << 20) / big["events"], 1)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, default=None, help="where to write the traces")
    parser.add_argument("--hta", action="store_true", help="also time HTA on the Kineto trace")
    parser.add_argument("--keep", action="store_true", help="keep the generated traces")
    parser.add_argument("--memory", action="store_true", help="peak memory at 1M and 10M events")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="ts-trace-bench-"))
    if args.memory:
        print(json.dumps(memory(work), indent=2))
        if not args.keep and args.workdir is None:
            shutil.rmtree(work)
        return
    kineto_dir, nsys_dir = work / "kineto", work / "nsys"
    kineto_dir.mkdir(parents=True, exist_ok=True)
    report = {"machine": f"{os.cpu_count()} cores", "load_avg": os.getloadavg()}

    trace = kineto_dir / "rank0.json"
    if not trace.exists():
        t = time.perf_counter()
        # 4935 kernels per step + all-reduce buckets -> just over 1,000,000 kernels in 202 steps
        n = write_kineto_trace(trace, steps=202, kernels_per_step=4935)
        report["kineto_generated"] = {"kernels": n, "seconds": round(time.perf_counter() - t, 1)}
    report["kineto_bytes"] = trace.stat().st_size
    report["kineto"] = _run(ANALYZE, kineto_dir, timeout=900)
    report["kineto_diff"] = _run(DIFF, kineto_dir, timeout=900)

    if not (nsys_dir / "rank0.sqlite").exists():
        spec = importlib.util.spec_from_file_location(
            "fixture", ROOT / "tests/data/make_nsys_fixture.py"
        )
        fixture = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules["fixture"] = fixture  # its dataclasses look their module up
        spec.loader.exec_module(fixture)  # type: ignore[union-attr]
        t = time.perf_counter()
        fixture.write_ranks(
            nsys_dir, ranks=1, steps=1000, kernels_per_step=1000, allreduce_every=50
        )
        report["nsys_generated_s"] = round(time.perf_counter() - t, 1)
    report["nsys_bytes"] = (nsys_dir / "rank0.sqlite").stat().st_size
    report["nsys"] = _run(ANALYZE, nsys_dir, timeout=900)
    report["nsys_diff"] = _run(DIFF, nsys_dir, timeout=900)

    if args.hta:
        report["hta"] = _run(HTA, kineto_dir, timeout=1800)
        if "wall_s" in report["hta"] and "wall_s" in report["kineto"]:
            report["hta_over_torchscale"] = round(
                report["hta"]["wall_s"] / report["kineto"]["wall_s"], 1
            )
    print(json.dumps(report, indent=2))
    if not args.keep and args.workdir is None:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
