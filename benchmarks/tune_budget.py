"""Benchmark (run by hand, not a test): does `torchscale tune --budget B` end within 10% of B?

Runs the real command, `torchscale tune --config examples/tune_cpu.yaml --budget 60s`, as a user
would (its own process, a fresh output folder each round), and times it from the start of the
process to its exit: the search, the verdict's rounds and the outputs included. Goal: every round
ends within 1.1 x the budget (66 s for 60 s), or says before its verdict that the budget cannot
hold one (the command's last line then starts "> [TUNE] nothing measured: the budget").

    PYTHONPATH=$PWD python benchmarks/tune_budget.py --budget 60 --rounds 3

Each round prints its wall time, the ratio to the budget, the trials run, the verdict's shape
(finalists x rounds, and whether it was shrunk to fit) and the command's last line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "tune_cpu.yaml"
GOAL = 1.10  # of the budget


def one_round(budget_s: float, tmp: Path) -> Dict[str, object]:
    command = [sys.executable, "-m", "torchscale", "tune", "--config", str(CONFIG)]
    command += ["--budget", f"{budget_s:g}s", "--output-dir", str(tmp / "out"), "--json"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    summary = json.loads(done.stdout) if done.stdout.strip() else {}
    verdict = summary.get("verdict") or {}
    return {
        "wall_s": wall,
        "ratio": wall / budget_s,
        "exit": done.returncode,
        "trials": len(summary.get("trials") or []),
        "finalists": len(verdict.get("finalists") or []),
        "rounds": verdict.get("repeats"),
        "shrunk": bool(verdict.get("shrunk_to_fit_budget")),
        "result": summary.get("result"),
        "line": last,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=60.0, help="seconds")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows: List[Dict[str, object]] = []
    for index in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            row = one_round(args.budget, Path(tmp))
        rows.append(row)
        print(
            f"round {index + 1}: {row['wall_s']:.1f} s ({row['ratio']:.2f} x the budget), exit "
            f"{row['exit']}, {row['trials']} trial(s), verdict {row['finalists']} finalist(s) x "
            f"{row['rounds']} round(s){' (shrunk to fit)' if row['shrunk'] else ''}, "
            f"{row['result']}\n  {row['line']}",
            flush=True,
        )
    worst = max(float(str(r["ratio"])) for r in rows)
    load = os.getloadavg()[0]
    print(
        f"budget {args.budget:g} s: longest round {worst:.2f} x the budget (goal <= {GOAL:.2f}); "
        f"load average at the end {load:.2f} on {os.cpu_count()} CPUs"
    )
    if worst > GOAL:
        sys.exit(1)


if __name__ == "__main__":
    main()
