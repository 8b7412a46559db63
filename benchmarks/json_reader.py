"""What the bounded JSON reader costs: ``results.jsonl`` read through
``torchscale.results.store.read_jsonl`` (depth counted before parsing, size-limited lines)
against plain ``json.loads`` per line, on records of many steps.

    PYTHONPATH=. python benchmarks/json_reader.py [--steps 100000] [--records 8] [--rounds 3]

Each record carries ``steps`` step times, and as many per rank (2 ranks) for the step times and
the sync waits, as a long measured window writes. The two readers alternate round by round; the
figure is the median of each and their ratio.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List


def record(steps: int, index: int) -> Dict[str, Any]:
    times = [round(random.uniform(5.0, 10.0), 6) for _ in range(steps)]
    rank = {"rank": 0, "host": "node", "step_times_ms": times, "sync_wait_samples_ms": times}
    return {
        "schema_version": 1,
        "kind": "training",
        "cell_id": f"cell-{index}",
        "experiment": "bench",
        "status": "ok",
        "world_size": 2,
        "nproc_per_node": 2,
        "model": "m",
        "batch_size": 8,
        "global_batch_size": 16,
        "precision": "fp32",
        "throughput": 100.0,
        "step_times_ms": times,
        "per_rank": [rank, {**rank, "rank": 1}],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--records", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from torchscale.results.store import read_jsonl

    random.seed(0)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "results.jsonl"
        with open(path, "w") as handle:
            for index in range(args.records):
                handle.write(json.dumps(record(args.steps, index)) + "\n")
        size = path.stat().st_size / 1e6
        times: Dict[str, List[float]] = {"json.loads": [], "read_jsonl": []}
        for _ in range(args.rounds):
            start = time.perf_counter()
            with open(path, encoding="utf-8") as handle:
                plain = [json.loads(line) for line in handle]
            times["json.loads"].append(time.perf_counter() - start)
            start = time.perf_counter()
            bounded = read_jsonl(path)
            times["read_jsonl"].append(time.perf_counter() - start)
            assert bounded == plain
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"{args.records} records of {args.steps:,} steps, {size:.1f} MB, {args.rounds} rounds")
    for name, value in medians.items():
        print(f"  {name:<11} {value:6.2f} s  ({size / value:5.1f} MB/s)")
    print(f"  ratio read_jsonl / json.loads: {medians['read_jsonl'] / medians['json.loads']:.2f}")


if __name__ == "__main__":
    main()
