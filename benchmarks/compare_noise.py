"""How far do two unchanged runs of one config disagree on this node? The measurement behind
``compare``'s default noise floor (docs/report.md, docs/PERFORMANCE.md).

    PYTHONPATH=. python benchmarks/compare_noise.py [--runs 6] [--repeats 2] [--output-dir DIR]
    PYTHONPATH=. python benchmarks/compare_noise.py --reuse DIR [--quiet-runs N] [--old-checkout D]

Runs ``torchscale benchmark`` on ``--config`` (default examples/cpu_smoke.yaml) ``--runs`` times
back to back, each with ``repeats: --repeats``, nothing changed between them. Then, over every
pair of consecutive runs and every cell:

- the between-run change of throughput and of p95 step time (repeat 0 only: one run per side, as
  a single nightly run is), its median, 95th percentile and largest absolute value: the floor that
  a single run per side cannot see past;
- the verdicts ``compare`` gives those pairs: with the steps' bootstrap alone (``--noise-floor
  0``, still simultaneous over the figures), with the default floor, and with the repeats model
  (all repeats of each run). On unchanged runs every ``regression`` or ``improvement`` is false;
- with ``--old-checkout DIR``, the verdicts another checkout's ``compare`` gives the same
  single-run pairs (e.g. the code before the noise model, from ``git archive``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from itertools import permutations
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from torchscale.analysis.comparison import CompareOptions, compare_runs
from torchscale.results.schema import ResultBase
from torchscale.results.store import ExperimentStore, find_experiments

ROOT = Path(__file__).resolve().parents[1]


def run_all(config: Path, runs: int, repeats: int, out: Path) -> List[Path]:
    folders = []
    for index in range(runs):
        target = out / f"run-{index}"
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "torchscale", "benchmark", "-c", str(config),
             "-o", str(target), "--set", f"repeats={repeats}"],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        print(f"run {index}: {time.monotonic() - started:.0f} s", file=sys.stderr)
        folders.append(target)
    return folders


def records(folder: Path) -> List[ResultBase]:
    (experiment,) = find_experiments(folder)
    return ExperimentStore(experiment).records()


def first_repeat(found: Sequence[ResultBase]) -> List[ResultBase]:
    return [r for r in found if r.repeat == 0]


def spread(values: Sequence[float]) -> str:
    magnitudes = np.abs(np.asarray(values, dtype=float))
    return (
        f"median |change| {np.median(magnitudes):.1f}%, 95th percentile "
        f"{np.percentile(magnitudes, 95):.1f}%, largest {magnitudes.max():.1f}% "
        f"({len(magnitudes)} cell pairs)"
    )


def verdicts(pairs: Sequence[Tuple[List[ResultBase], List[ResultBase]]], floor: Optional[float]
             ) -> str:  # fmt: skip
    """How ``compare`` judges the pairs: gates failed, and cells per verdict and noise model."""
    counts: Dict[str, int] = {}
    models: Dict[str, int] = {}
    failed = 0
    for old, new in pairs:
        result = compare_runs(old, new, CompareOptions(noise_floor_pct=floor))
        failed += result.failed
        for verdict in result.cells["verdict"]:
            counts[verdict] = counts.get(verdict, 0) + 1
        for model, count in result.noise_models.items():
            models[model] = models.get(model, 0) + count
    shown = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    decided = ", ".join(f"{k} {v}" for k, v in sorted(models.items()))
    return f"gate failed {failed} of {len(pairs)}; cells: {shown} (noise model: {decided})"


def factors(pairs: Sequence[Tuple[List[ResultBase], List[ResultBase]]]) -> str:
    """The factor the default floor needs: |log change| over the two runs' RMS step-time CV,
    over the 95% band's 1.96 x sqrt(2), at the 95th and 99th percentile of cell pairs."""
    found: Dict[str, List[float]] = {"throughput": [], "p95": []}
    for old, new in pairs:
        cells = compare_runs(old, new).cells
        for row in cells.itertuples():
            if not row.step_cv or row.cpu_wait_share == row.cpu_wait_share:  # oversubscribed
                continue
            for figure, change in (("throughput", row.throughput_change_pct),
                                   ("p95", row.p95_change_pct)):  # fmt: skip
                scaled = abs(np.log1p(change / 100)) / row.step_cv / (1.96 * np.sqrt(2))
                found[figure].append(float(scaled))
    return "; ".join(
        f"{figure}: 95th percentile {np.percentile(v, 95):.2f}, 99th {np.percentile(v, 99):.2f}, "
        f"largest {max(v):.2f} ({len(v)} cell pairs)"
        for figure, v in found.items()
    )


OTHER_CHECKOUT = """
import itertools, sys
from pathlib import Path
from torchscale.analysis.comparison import compare_runs
from torchscale.results.store import ExperimentStore, find_experiments
runs = [[r for r in ExperimentStore(find_experiments(Path(f))[0]).records() if r.repeat == 0]
        for f in sys.argv[1:]]
for name, pairs in (("consecutive pairs", list(zip(range(len(runs)), range(1, len(runs))))),
                    ("every ordered pair", list(itertools.permutations(range(len(runs)), 2)))):
    results = [compare_runs(runs[i], runs[j]) for i, j in pairs]
    improved = sum(int((r.cells["verdict"] == "improvement").sum()) for r in results)
    print(f"  {name}: gate failed {sum(r.failed for r in results)} of {len(pairs)}; "
          f"cells called improved: {improved}")
"""


def other_checkout(checkout: Path, folders: Sequence[Path]) -> str:
    """The same single-run pairs judged by another checkout's ``compare_runs`` (its own process,
    ``PYTHONPATH`` and working folder: the code before the noise model, say)."""
    done = subprocess.run(
        [sys.executable, "-c", OTHER_CHECKOUT, *map(str, folders)],
        cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.rstrip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "cpu_smoke.yaml")
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output-dir", type=Path, default=None)
    parser.add_argument("--reuse", type=Path, default=None, help="Analyse the run-* folders here.")
    parser.add_argument("--quiet-runs", type=int, default=None,
                        help="Analyse only the first N runs (a quiet stretch).")  # fmt: skip
    parser.add_argument("--old-checkout", type=Path, default=None,
                        help="Also judge the single runs with this checkout.")  # fmt: skip
    args = parser.parse_args()
    if args.reuse:
        folders = sorted(args.reuse.glob("run-*[0-9]"), key=lambda p: int(p.name.split("-")[1]))
    else:
        out = args.output_dir or Path(tempfile.mkdtemp(prefix="compare-noise-"))
        folders = run_all(args.config, args.runs, args.repeats, out)
        print(f"runs in {out}", file=sys.stderr)
    folders = folders[: args.quiet_runs]
    runs = [records(f) for f in folders]
    singles = [(first_repeat(a), first_repeat(b)) for a, b in zip(runs, runs[1:])]
    every = [(first_repeat(a), first_repeat(b)) for a, b in permutations(runs, 2)]
    throughput: List[float] = []
    p95: List[float] = []
    for old, new in singles:
        cells = compare_runs(old, new).cells
        throughput += list(cells["throughput_change_pct"])
        p95 += list(cells["p95_change_pct"])
    print(f"{len(runs)} runs of {args.config.name}; consecutive pairs, repeat 0 of each run:")
    print(f"  throughput: {spread(throughput)}")
    print(f"  p95 step time: {spread(p95)}")
    print(f"default floor's factor, every ordered pair: {factors(every)}")
    print("compare's verdicts (all false: nothing changed):")
    for name, pairs in (("consecutive pairs", singles), ("every ordered pair", every)):
        print(f"  {name}, step bootstrap alone (--noise-floor 0): {verdicts(pairs, 0.0)}")
        print(f"  {name}, default floor: {verdicts(pairs, None)}")
    if any(r.repeat > 0 for run in runs for r in run):
        whole = list(zip(runs, runs[1:]))
        print(f"  consecutive pairs, all repeats: {verdicts(whole, None)}")
    if args.old_checkout:
        print(f"the same single-run pairs, judged by {args.old_checkout}:")
        print(other_checkout(args.old_checkout, folders))


if __name__ == "__main__":
    main()
