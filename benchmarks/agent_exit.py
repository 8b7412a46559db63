"""How long a launch takes to end once its workers are done: plain ``torch.distributed.run``
against ``torchscale.launch.torchrun_agent`` (torchrun's own main, left with ``os._exit``).

    PYTHONPATH=. python benchmarks/agent_exit.py [--rounds 4] [--nproc 2]

Each launch runs a gloo worker that all-reduces once, stamps the time and leaves with
``os._exit`` (as torchscale's worker does); the figure is the launch's exit minus the last
worker's stamp. The two launchers alternate round by round, so drift falls on both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

WORKER = """\
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(4))
dist.destroy_process_group()
with open(sys.argv[1] + os.environ["RANK"], "w") as stamp:
    stamp.write(repr(time.time()))
os._exit(0)
"""

LAUNCHERS = {
    "torch.distributed.run": "torch.distributed.run",
    "torchrun_agent": "torchscale.launch.torchrun_agent",
}


def exit_after_workers(module: str, worker: Path, nproc: int) -> float:
    stamps = worker.parent / "stamp-rank"
    cmd = [sys.executable, "-m", module, "--standalone", "--nnodes=1",
           f"--nproc-per-node={nproc}", "--max-restarts=0", "--monitor-interval=0.1",
           str(worker), str(stamps)]  # fmt: skip
    path = os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])
    subprocess.run(cmd, capture_output=True, env={**os.environ, "PYTHONPATH": path}, check=True)
    ended = time.time()
    return ended - max(float(Path(f"{stamps}{rank}").read_text()) for rank in range(nproc))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    seconds: Dict[str, List[float]] = {name: [] for name in LAUNCHERS}
    with tempfile.TemporaryDirectory() as tmp:
        worker = Path(tmp) / "worker.py"
        worker.write_text(WORKER)
        for _ in range(args.rounds):
            for name, module in LAUNCHERS.items():
                seconds[name].append(exit_after_workers(module, worker, args.nproc))
    for name, values in seconds.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name:24s} workers done -> launch exited: median {statistics.median(values):.2f} s "
              f"({shown})")  # fmt: skip


if __name__ == "__main__":
    main()
