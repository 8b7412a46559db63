"""Benchmark (run by hand, not a test): how long `torchscale validate` takes end to end.

Goal: under 15 s on a CPU-only node, real 2-process gloo smoke test included. Each repeat is a
fresh `python -m torchscale validate --json` process, timed from launch to exit, so interpreter
start-up, the torch import and the torchrun launch all count. `--skip-smoke` runs show what the
smoke test's launch costs on top.

    PYTHONPATH=$PWD python benchmarks/validate_time.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List

GOAL_S = 15.0


def run_once(extra: List[str]) -> Dict[str, float]:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "torchscale", "validate", "--json", *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        sys.exit(f"validate exited with {proc.returncode}:\n{proc.stderr}")
    report = json.loads(proc.stdout)
    smoke = next(c for c in report["checks"] if c["name"] == "All-reduce smoke test")
    return {
        "wall_s": wall,
        "in_process_s": report["duration_s"],
        "launch_s": smoke.get("details", {}).get("launch_s", 0.0),
    }


def describe(runs: List[Dict[str, float]], key: str) -> str:
    values = [r[key] for r in runs]
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    full = [run_once([]) for _ in range(args.repeats)]
    skip = [run_once(["--skip-smoke"]) for _ in range(args.repeats)]
    print(
        f"machine: {os.cpu_count()} cores, load average {load_before:.2f} -> "
        f"{os.getloadavg()[0]:.2f}; {args.repeats} repeats; min / median / max seconds"
    )
    print("| command | wall | in-process | smoke launch |")
    print("|---|---|---|---|")
    print(
        f"| validate | {describe(full, 'wall_s')} | {describe(full, 'in_process_s')} | "
        f"{describe(full, 'launch_s')} |"
    )
    print(
        f"| validate --skip-smoke | {describe(skip, 'wall_s')} | "
        f"{describe(skip, 'in_process_s')} | - |"
    )
    median = statistics.median(r["wall_s"] for r in full)
    verdict = "meets" if median < GOAL_S else "MISSES"
    print(f"median wall {median:.2f} s {verdict} the {GOAL_S:.0f} s goal")


if __name__ == "__main__":
    main()
