"""Launch overhead per cell: wall time minus the timed windows, for a 12-cell CPU matrix.

    python benchmarks/launch_overhead.py [--output-dir /tmp/overhead] [--no-baseline]

Runs ``torchscale benchmark`` on 3 tiny models x 2 batch sizes x {1, 2} processes, then splits
each cell's wall time (launch to exit, as the orchestrator saw it) using rank 0's timeline:
torchrun + interpreter start-up until the worker's first phase, torch import and process-group
init, model build (DDP's constructor imports torch._dynamo: about 2 s here), warm-up, measured
window, sync probes, and the rest (gather, teardown, exit).

Most of that is torch's own start-up, which any torchrun launch pays. So the same cells also run
as a plain hand-written DDP script under torchrun (``plain_ddp_loop.py``, same warm-up and
measured steps, no probes), interleaved with nothing else, and the summary gives the difference
of the medians: what torchscale adds per cell. Goal: under 2 s of overhead per cell.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from torchscale.results.store import ExperimentStore

CONFIG = """\
experiment_name: overhead
models: [gpt2-tiny, resnet-tiny, bert-tiny]
batch_sizes: [4, 8]
gpu_counts: [1, 2]
warmup_steps: 3
measure_steps: 20
sync_probe_steps: 3
"""


PLAIN = Path(__file__).with_name("plain_ddp_loop.py")


def plain_walls() -> list:
    """Wall time of each cell of CONFIG as a plain torchrun DDP launch."""
    walls = []
    for model in ("gpt2-tiny", "resnet-tiny", "bert-tiny"):
        for batch in (4, 8):
            for nproc in (1, 2):
                cmd = [sys.executable, "-m", "torch.distributed.run", "--monitor-interval=0.1"]
                cmd += [f"--nproc-per-node={nproc}", str(PLAIN), "--model", model]
                cmd += ["--batch-size", str(batch), "--warmup", "3", "--steps", "20"]
                start = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True)
                walls.append(time.perf_counter() - start)
    return walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", type=Path, default=None)
    parser.add_argument("--no-baseline", action="store_true", help="skip the plain launches")
    args = parser.parse_args()
    out = args.output_dir or Path(tempfile.mkdtemp(prefix="overhead-"))
    config = out / "overhead.yaml"
    out.mkdir(parents=True, exist_ok=True)
    config.write_text(CONFIG)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torchscale",
            "benchmark",
            "-c",
            str(config),
            "-o",
            str(out),
            "--launch",
            "per-cell",
        ],  # a launch per cell: the overhead measured here
        check=True,
        capture_output=True,
    )
    records = ExperimentStore(out / "overhead").records()
    rows = []
    for record in records:
        rank0 = record.per_rank[0]
        started = datetime.fromisoformat(record.started_at).timestamp()
        # timeline_s is relative to the worker process's start; the worker started after torchrun.
        phases = rank0.timeline_s
        timed = record.measured_s or 0.0
        rows.append(
            {
                "cell": record.cell_id,
                "wall_s": record.wall_s,
                "measured_s": round(timed, 3),
                "overhead_s": round(record.wall_s - timed, 3),
                "torchrun_until_worker_s": round(rank0.process_started_at - started, 3),
                "worker_init_s": phases.get("init"),
                "until_build_s": phases.get("build"),
                "until_warmup_s": phases.get("warmup"),
                "until_measure_s": phases.get("measure"),
                "until_sync_probe_s": phases.get("sync_probe"),
                "until_gather_s": phases.get("gather"),
            }
        )
    overheads = [r["overhead_s"] for r in rows]
    summary = {
        "cells": len(rows),
        "overhead_s_median": round(statistics.median(overheads), 2),
        "overhead_s_mean": round(statistics.mean(overheads), 2),
        "overhead_s_max": round(max(overheads), 2),
        "torchrun_until_worker_s_median": round(
            statistics.median(r["torchrun_until_worker_s"] for r in rows), 2
        ),
        "worker_until_measure_s_median": round(
            statistics.median(r["until_measure_s"] for r in rows), 2
        ),
        "wall_s_median": round(statistics.median(r["wall_s"] for r in rows), 2),
        "results": str(out / "overhead"),
    }
    if not args.no_baseline:
        plain = plain_walls()
        summary["plain_torchrun_wall_s_median"] = round(statistics.median(plain), 2)
        summary["added_by_torchscale_s"] = round(
            summary["wall_s_median"] - summary["plain_torchrun_wall_s_median"], 2
        )
    for row in rows:
        print(json.dumps(row))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
