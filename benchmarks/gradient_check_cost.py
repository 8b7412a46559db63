"""What the gradient check costs against a cell's wall time, per strategy.

    PYTHONPATH=. python benchmarks/gradient_check_cost.py [--model gpt2-tiny] [--gpus 2]

Runs ``torchscale benchmark`` on one model with the default window (10 warm-up steps, 50
measured, 10 sync-probe steps) under ddp, replicate and fsdp2 at ``--gpus`` gloo ranks (one warm
group), then reads each record: the check's seconds (``gradient_check.check_s``, the slowest
rank's) over the cell's wall time (``wall_s``). The goal: under 5% of a cell's wall time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIG = """\
experiment_name: check-cost
models: ["{model}"]
batch_sizes: [{batch}]
gpu_counts: [{gpus}]
strategy: [ddp, replicate, fsdp2]
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2-tiny")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--gpus", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = root / "c.yaml"
        config.write_text(CONFIG.format(model=args.model, batch=args.batch, gpus=args.gpus))
        command = [sys.executable, "-m", "torchscale", "benchmark", "-c", str(config)]
        subprocess.run([*command, "-o", str(root / "out")], check=True, capture_output=True)
        lines = (root / "out" / "check-cost" / "results.jsonl").read_text().splitlines()
    print(f"{'strategy':<10} {'check s':>8} {'cell wall s':>12} {'share':>7}  passed")
    worst = 0.0
    for line in lines:
        record = json.loads(line)
        check = record["gradient_check"]
        share = check["check_s"] / record["wall_s"]
        worst = max(worst, share)
        strategy = record["settings"]["strategy"]
        print(
            f"{strategy:<10} {check['check_s']:>8.3f} {record['wall_s']:>12.2f} "
            f"{share:>7.1%}  {check['passed']}"
        )
    print(f"worst share {worst:.1%} (goal < 5%): {'met' if worst < 0.05 else 'NOT met'}")


if __name__ == "__main__":
    main()
