"""What a launch costs with its ranks forked from the torchrun agent, against ranks that each start
a fresh interpreter (``TORCHSCALE_FORK_RANKS=0``), on a node without GPUs.

    PYTHONPATH=. python benchmarks/forked_ranks.py [--rounds 4] [--gpus 2]

Each round runs ``torchscale benchmark`` of one gpt2-tiny cell (batch 4, 1 warm-up and 3 measured
steps) both ways, alternating which goes first. The CPU is every process of the command together
(the ``torchscale`` process, the agent and its ranks: ``getrusage(RUSAGE_CHILDREN)`` around it);
the wall time is the command's. Prints one line per run and the medians.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

CONFIG = """\
experiment_name: forked-ranks
models: [gpt2-tiny]
batch_sizes: [4]
gpu_counts: [{gpus}]
warmup_steps: 1
measure_steps: 3
sync_probe_steps: 0
"""


def one_run(work: Path, forked: bool, index: int) -> Dict[str, float]:
    label = "forked" if forked else "fresh"
    env = {**os.environ, "TORCHSCALE_FORK_RANKS": "1" if forked else "0"}
    command = [sys.executable, "-m", "torchscale", "benchmark", "-c", str(work / "cell.yaml")]
    command += ["-o", str(work / f"out-{label}-{index}")]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run(command, env=env, capture_output=True, check=True)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=2, help="ranks of the one cell")
    args = parser.parse_args()
    runs: Dict[bool, List[Dict[str, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="torchscale-forked-") as tmp:
        work = Path(tmp)
        (work / "cell.yaml").write_text(CONFIG.format(gpus=args.gpus))
        for index in range(args.rounds):
            order = (True, False) if index % 2 == 0 else (False, True)
            for forked in order:
                run = one_run(work, forked, index)
                runs[forked].append(run)
                label = "forked" if forked else "fresh "
                cpu, wall = run["cpu_s"], run["wall_s"]
                print(f"round {index} {label}: CPU {cpu:.2f} s, wall {wall:.2f} s")
    for forked in (False, True):
        label = "ranks forked from the agent" if forked else "each rank a fresh interpreter"
        cpu = statistics.median(r["cpu_s"] for r in runs[forked])
        wall = statistics.median(r["wall_s"] for r in runs[forked])
        print(f"{label}: median CPU {cpu:.2f} s, median wall {wall:.2f} s")


if __name__ == "__main__":
    main()
