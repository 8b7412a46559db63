"""What ``history changes`` finds at this machine's run-to-run noise: the false-alarm rate on
unchanged series, how often a planted 8% step at run 40 of 60 is found, and the smallest step
found in 90% of series; and for six-run series (three a side, the default p-value of a short
series) the false-alarm rate and how often a 30% slower step at run 4 is found there.

    PYTHONPATH=. python benchmarks/history_detection.py [--series 2000]

The noise is the run-to-run spread of log throughput measured from the recorded real runs in
tests/data/compare_unchanged (two unchanged runs, four cells, two repeats each), for one run
and for the mean of a run's 4 repeats; the same construction as tests/test_history.py.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from tests.test_history import NIGHTLY_REPEATS, _measured_spread
from torchscale.history.changes import MAX_PVALUE, change_points, default_pvalue


def rates(sigma: float, step: float, series: int, seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    exact = near = 0
    for _ in range(series):
        x = np.exp(sigma * rng.standard_normal(60))
        x[39:] *= 1 - step
        found = [split.at + 1 for split in change_points(x)]
        exact += found == [40]
        near += len(found) == 1 and abs(found[0] - 40) <= 1
    return exact / series, near / series


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=2000)
    args = parser.parse_args()
    spread = _measured_spread()
    rng = np.random.default_rng(1)
    alarms = sum(bool(change_points(rng.standard_normal(60))) for _ in range(args.series))
    print(f"max p-value {MAX_PVALUE}; measured run-to-run spread {100 * spread:.1f}%")
    print(f"false alarms: {alarms} of {args.series} unchanged 60-run series "
          f"({100 * alarms / args.series:.2f}%)")  # fmt: skip
    short = sum(bool(change_points(np.exp(spread * rng.standard_normal(6))))
                for _ in range(args.series))  # fmt: skip
    found = 0
    for _ in range(args.series):
        x = np.exp(spread * rng.standard_normal(6))
        x[3:] /= 1.3
        found += [split.at + 1 for split in change_points(x)] == [4]
    print(f"six-run series (default p {default_pvalue(6)}): false alarms {short} of "
          f"{args.series} ({100 * short / args.series:.2f}%); a 30% slower step at run 4 found "
          f"there in {100 * found / args.series:.0f}%")  # fmt: skip
    for label, sigma in (("one run", spread), (f"mean of {NIGHTLY_REPEATS} repeats",
                                                spread / math.sqrt(NIGHTLY_REPEATS))):  # fmt: skip
        exact, near = rates(sigma, 0.08, args.series // 4, 2)
        smallest = next(
            (step for step in np.arange(0.02, 0.41, 0.01) if rates(sigma, step, 200, 3)[1] >= 0.9),
            None,
        )
        shown = f"{100 * smallest:.0f}%" if smallest else "none up to 40%"
        print(f"{label} (noise {100 * sigma:.1f}%): 8% step at run 40 found exactly there in "
              f"{100 * exact:.0f}%, within a run in {100 * near:.0f}%; smallest step found "
              f"within a run in 90% of series: {shown}")  # fmt: skip


if __name__ == "__main__":
    main()
