"""A lock-step sweep on two "hosts" of this machine: what one multi-node cell costs, and the
intra- vs inter-node split over a veth link.

Two network namespaces joined by a veth pair (the test harness ``tests/support/two_hosts.py``;
needs root) each run ``torchscale benchmark`` with ``--nnodes 2``; the matrix runs every GPU count
on one node and on two. Run from the repository root:

    PYTHONPATH=. python benchmarks/multinode_lockstep.py [--model gpt2-tiny] [--steps 30]

Prints one row per cell (nodes x ranks, wall time from launch to exit, throughput) and the
node-scaling table (scaling efficiency = intra-node x inter-node efficiency).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from tests.support.two_hosts import two_hosts
from torchscale.analysis.node_scaling import node_scaling
from torchscale.analysis.training_tables import training_table
from torchscale.results.store import ExperimentStore

ENDPOINT = "10.213.77.2:29571"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2-tiny")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        tmp = Path(workdir)
        config = tmp / "lockstep.yaml"
        config.write_text(
            f"experiment_name: lockstep\nmodels: [{args.model}]\nbatch_sizes: [{args.batch_size}]\n"
            f"gpu_counts: [1, 2, 4]\nnodes: [1, 2]\nwarmup_steps: 5\n"
            f"measure_steps: {args.steps}\nsync_probe_steps: 5\ncell_timeout_s: 600\n"
        )
        env = {"TORCHSCALE_CPU_SLOTS": "2", "PYTHONPATH": os.getcwd(), "NO_COLOR": "1"}
        common = ["benchmark", "-c", str(config), "-o", str(tmp / "out"), "--nnodes", "2"]
        common += ["--rdzv-endpoint", ENDPOINT]
        started = time.monotonic()
        with two_hosts(tmp, "benchmark") as hosts:
            compute = hosts.torchscale(
                hosts.compute, [*common, "--node-rank", "1"], tmp / "c.log", env
            )
            head = hosts.torchscale(hosts.head, [*common, "--node-rank", "0"], tmp / "h.log", env)
            head.wait(timeout=3600)
            compute.wait(timeout=600)
        total = time.monotonic() - started
        records = ExperimentStore(tmp / "out" / "lockstep").records()
    print(f"sweep: {len(records)} cells in {total:.1f} s (load average {os.getloadavg()[0]:.1f})")
    print(f"{'cell':>8} {'status':>8} {'wall s':>7} {'samples/s':>10}")
    for r in records:
        shape = f"{r.nnodes}x{r.nproc_per_node}"
        rate = f"{r.samples_per_s:.1f}" if r.samples_per_s else "-"
        wall = f"{r.wall_s:.1f}" if r.wall_s else "-"
        print(f"{shape:>8} {r.status:>8} {wall:>7} {rate:>10}")
    table = node_scaling(training_table(records))
    columns = ["nnodes", "nproc_per_node", "world_size", "samples_per_s", "scaling_efficiency"]
    columns += ["intra_node_efficiency", "inter_node_efficiency", "hosts"]
    print(table[columns].to_string(index=False, float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    main()
