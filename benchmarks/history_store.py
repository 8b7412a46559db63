"""The history at scale: ingest 10,000 runs x 50 cells, then ``history changes`` over every
series, on SQLite and on PostgreSQL. Goal: under 5 s and under 500 MB for each.

    PYTHONPATH=. python benchmarks/history_store.py [--runs 10000] [--cells 50] \
        [--postgresql postgresql://user@host:port/db]

Each backend runs in a fresh subprocess, so its peak memory (ru_maxrss) is its own. The runs are
ingested 500 to a transaction (``HistoryStore.add_runs``: what ``history ingest`` of a night's
folders does), throughput with 5% noise and a planted 10% step in one cell in five at run 7,000.
Without --postgresql a throwaway server is started from /usr/lib/postgresql/*/bin when present.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """\
import json, resource, sys, time
import numpy as np
from torchscale.history.database import HistoryStore, PointEntry, RunEntry, SeriesEntry
from torchscale.history.series_changes import find_changes
location, runs, cells = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
hardware = "H100 x8 x1 nodes"
series = [SeriesEntry(f"s{c:04d}", "training", f"model-{c}", 8, 8, 1, "bf16", "d", hardware)
          for c in range(cells)]
values = 1000 * np.exp(0.05 * rng.standard_normal((runs, cells)))
values[7000:, ::5] *= 0.9
attrs = {"torch": "2.9.0", "nccl": "2.27.3", "hosts": ["gpu-01"]}
store = HistoryStore(location)
start = time.perf_counter()
batch = []
for r in range(runs):
    points = [PointEntry(s, "throughput", float(values[r, c]), 0.02, 1)
              for c, s in enumerate(series)]
    nccl = "2.28.9" if r >= 7000 else "2.27.3"
    batch.append(RunEntry(f"run-{r}", "nightly", "benchmark", f"2026-01-01T00:00:00.{r:06d}+00:00",
                          hardware, {**attrs, "nccl": nccl}, "bench", points))
    if len(batch) == 500:
        store.add_runs(batch); batch = []
if batch:
    store.add_runs(batch)
ingested = time.perf_counter()
changes = find_changes(store, "throughput")
done = time.perf_counter()
at_step = sum(1 for c in changes if c.position == 7001)
print(json.dumps({"ingest_s": ingested - start, "changes_s": done - ingested,
                  "changes": len(changes), "at_the_step": at_step,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(location: str, runs: int, cells: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, location, str(runs), str(cells)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--cells", type=int, default=50)
    parser.add_argument("--postgresql", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        result = run(str(Path(folder) / "history.db"), args.runs, args.cells)
        print(f"SQLite: {json.dumps(result)}")
    if args.postgresql:
        print(f"PostgreSQL: {json.dumps(run(args.postgresql, args.runs, args.cells))}")
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.support.postgres_server import postgres_server

    try:
        server = postgres_server()
        url = next(server).url
    except BaseException as exc:  # pytest's skip when the binaries are absent
        print(f"PostgreSQL: not measured ({exc})")
        return
    try:
        print(f"PostgreSQL: {json.dumps(run(url, args.runs, args.cells))}")
    finally:
        server.close()
    print(f"(this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB)")
    _ = time


if __name__ == "__main__":
    main()
