"""Peak memory and time of ``torchscale compare`` on records of many steps.

    PYTHONPATH=. python benchmarks/compare_memory.py [--steps 10000 100000 1000000]
        [--checkout DIR] [--workdir DIR]

For each step count, writes two experiments of one model on 1 and 2 ranks (the second 30%
slower: a regression), every rank's steps included as a benchmark writes them, drawn around the
report tests' performance model (``tests/support/report_fixtures.py``), then runs
``python -m torchscale compare OLD NEW --json`` in a child process and reports its wall time and
peak RSS (``ru_maxrss`` of the child) and the results file's size. ``--checkout`` runs the
compare of another checkout (``PYTHONPATH=DIR``), e.g. the code before the bounded bootstrap.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import List, Tuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.report_fixtures import MODELS, FixtureSpec, training_record  # noqa: E402
from torchscale.measures.stats import time_stats  # noqa: E402
from torchscale.results.layout import experiment_dirname  # noqa: E402
from torchscale.results.schema import TimeStats, TrainingResult  # noqa: E402
from torchscale.results.store import ExperimentStore  # noqa: E402


def long_record(record: TrainingResult, steps: int, slowdown: float, seed: int) -> TrainingResult:
    """``record`` with ``steps`` measured steps per rank, drawn around its own step times."""
    rng = np.random.default_rng(seed)
    base = float(np.mean(record.step_times_ms)) * slowdown
    ranks = []
    for rank in record.per_rank:
        times = base * rng.lognormal(0.0, 0.05, steps)
        stats = time_stats(times)
        assert stats is not None
        ranks.append(
            rank.model_copy(
                update={
                    "step_times_ms": times.tolist(),
                    "step_time_ms": TimeStats(**stats),
                    "measure_steps": steps,
                    "sync_wait_samples_ms": [],
                }
            )
        )
    slowest = np.max([r.step_times_ms for r in ranks], axis=0)
    stats = time_stats(slowest)
    assert stats is not None
    throughput = record.global_batch_size * 1000.0 / stats["mean"]
    return record.model_copy(
        update={
            "per_rank": ranks,
            "step_times_ms": slowest.tolist(),
            "step_time_ms": TimeStats(**stats),
            "measure_steps": steps,
            "throughput": throughput,
            "samples_per_s": throughput,
            "measured_s": float(slowest.sum()) / 1000,
        }
    )


def write(root: Path, name: str, steps: int, slowdown: float) -> Path:
    spec = FixtureSpec(name=name, models=MODELS[:1], batch_sizes=(32,), gpu_counts=(1, 2),
                       steps=20, failures=False, collectives=False, findings=False)  # fmt: skip
    folder = root / experiment_dirname(name)
    if folder.exists():  # this script's own folder from an earlier run: start afresh
        shutil.rmtree(folder)
    store = ExperimentStore(folder)
    store.write_manifest({"schema_version": 1, "experiment": name, "config": {}})
    rng = np.random.default_rng(0)
    for world in spec.gpu_counts:
        record = training_record(spec.models[0], 32, world, 0, replace(spec), rng)
        store.append(long_record(record, steps, slowdown, world))
    return store.root


def run_compare(old: Path, new: Path, checkout: Path) -> Tuple[float, float, int, str]:
    """Wall seconds, peak RSS (MiB) and exit code of the compare, and its verdicts."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [sys.executable, "-m", "torchscale", "compare", str(old), str(new), "--json"]
    with tempfile.TemporaryFile() as out:
        started = time.monotonic()
        child = subprocess.Popen(
            command, env=env, cwd=checkout, stdout=out, stderr=subprocess.DEVNULL
        )
        _, status, usage = os.wait4(child.pid, 0)  # the child's own peak, not the max of all
        wall = time.monotonic() - started
        code = os.waitstatus_to_exitcode(status)
        child.returncode = code
        out.seek(0)
        document = out.read()
    verdicts = ""
    if code in (0, 1):
        verdicts = ", ".join(c["verdict"] for c in json.loads(document)["cells"])
    return wall, usage.ru_maxrss / 1024, code, verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--checkout", type=Path, default=ROOT)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="compare-memory-"))
    rows: List[str] = []
    for steps in sorted(args.steps):
        folder = work / f"steps-{steps}"
        old = write(folder / "old", "old", steps, 1.0)
        new = write(folder / "new", "new", steps, 1.3)
        size = (old / "results.jsonl").stat().st_size / 2**20
        wall, peak, code, verdicts = run_compare(old, new, args.checkout)
        rows.append(
            f"| {steps:,} | {size:.1f} MiB | {wall:.2f} s | {peak:,.0f} MiB | {code} | {verdicts} |"
        )
        print(rows[-1], file=sys.stderr)
    print(f"compare of {args.checkout}, 2 cells per side (1 and 2 ranks), new 30% slower")
    print("| steps per rank | results.jsonl | wall | peak RSS | exit | verdicts |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
