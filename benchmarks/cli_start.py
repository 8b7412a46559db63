"""What the ``torchscale`` process itself costs on a node without GPUs: its own CPU time, whether
it imported torch, and the command's wall time, for a one-cell CPU benchmark.

    PYTHONPATH=. python benchmarks/cli_start.py [--rounds 5] [--checkout OTHER_CHECKOUT]

Each round runs ``torchscale benchmark`` of one 1-rank gpt2-tiny cell (1 warm-up, 2 measured
steps) with this checkout first on PYTHONPATH, and, with ``--checkout``, the same with another
checkout (e.g. ``git worktree add /tmp/before HEAD~1``), alternating which goes first. The
``torchscale`` process's own CPU is ``getrusage(RUSAGE_SELF)`` read as it ends: its torchrun
agent and ranks are not in it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

CONFIG = """\
experiment_name: cli-start
models: [gpt2-tiny]
batch_sizes: [4]
gpu_counts: [1]
warmup_steps: 1
measure_steps: 2
sync_probe_steps: 0
"""

WRAPPER = """\
import json, resource, runpy, sys
report = sys.argv.pop(1)
sys.argv[0] = "torchscale"
try:
    runpy.run_module("torchscale", run_name="__main__", alter_sys=True)
finally:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(report, "w") as out:
        json.dump({"cpu_s": usage.ru_utime + usage.ru_stime, "torch": "torch" in sys.modules}, out)
"""


def one_run(checkout: Path, work: Path, label: str, index: int) -> Dict[str, float]:
    config = work / "cli.yaml"
    report = work / f"{label}-{index}.json"
    wrapper = work / "wrapper.py"
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [sys.executable, str(wrapper), str(report), "benchmark", "-c", str(config)]
    command += ["-o", str(work / f"out-{label}-{index}")]
    started = time.monotonic()
    subprocess.run(command, env=env, capture_output=True, check=True, cwd=checkout)
    wall = time.monotonic() - started
    seen = json.loads(report.read_text())
    return {"wall_s": wall, "cpu_s": seen["cpu_s"], "torch": float(seen["torch"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--checkout", type=Path, help="another checkout to compare with")
    args = parser.parse_args()
    checkouts = {"this": Path.cwd()}
    if args.checkout:
        checkouts["other"] = args.checkout.resolve()
    figures: Dict[str, List[Dict[str, float]]] = {name: [] for name in checkouts}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "cli.yaml").write_text(CONFIG)
        (work / "wrapper.py").write_text(WRAPPER)
        for index in range(args.rounds):
            order = list(checkouts.items())
            if index % 2:
                order.reverse()
            for name, checkout in order:
                figures[name].append(one_run(checkout, work, name, index))
    print("checkout  torch imported  CLI CPU s (median; each)            wall s (median)")
    for name, runs in figures.items():
        cpu = [r["cpu_s"] for r in runs]
        imported = sum(int(r["torch"]) for r in runs)
        print(
            f"{name:9} {imported}/{len(runs):<13} {statistics.median(cpu):5.2f} "
            f"({', '.join(f'{c:.2f}' for c in cpu)})  "
            f"{statistics.median(r['wall_s'] for r in runs):6.2f}"
        )


if __name__ == "__main__":
    main()
