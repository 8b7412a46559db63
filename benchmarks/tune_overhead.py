"""Benchmark (run by hand, not a test): what `torchscale tune`'s own bookkeeping costs per trial.

Goal: under 0.5 s per trial (a 2-rank cell costs ~10 s here), so the search is the cells' time.
It opens the tune study exactly as `tune` does (SQLite storage, TPE, successive-halving pruner, the
baseline enqueued) over the default search space of resnet-tiny on a CPU node, then runs N trials
in batches of 4 with no launches: ask, suggest every knob, report a screening value, ask the
pruner, tell. Values are synthetic; the timing is Optuna's and SQLite's.

    PYTHONPATH=$PWD python benchmarks/tune_overhead.py --trials 60
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from torchscale.config.settings import CellSettings
from torchscale.config.tune_section import TuneSection
from torchscale.tune.space import Where, build_space
from torchscale.tune.study import open_study, states

GOAL_S = 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=60)
    args = parser.parse_args()
    baseline = CellSettings.model_validate({"model": "resnet-tiny", "batch_size": 8, "gpus": 2})
    space = build_space(
        baseline, TuneSection.model_validate({}), [], Where("cpu", True, conv_model=True)
    )
    rng = random.Random(0)
    per_trial = []
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        study = open_study(Path(tmp), space, baseline.model_dump(), seed=0, trial_cap=args.trials)
        opened = time.perf_counter() - started
        done = 0
        while done < args.trials:
            batch_start = time.perf_counter()
            trials = [study.ask() for _ in range(min(4, args.trials - done))]
            for trial in trials:
                params = space.suggest(trial)
                value = 100 + params["ddp.bucket_cap_mb"] / 4 + rng.gauss(0, 5)
                trial.report(value, 1)
                if trial.should_prune():
                    study.tell(trial, state=states().PRUNED)
                else:
                    study.tell(trial, value)
            per_trial.append((time.perf_counter() - batch_start) / len(trials))
            done += len(trials)
    median = statistics.median(per_trial)
    print(f"knobs searched: {', '.join(k.name for k in space.knobs)}")
    print(f"study opened in {opened:.2f} s; {args.trials} trials")
    print(
        f"per trial: median {median * 1000:.0f} ms, last batch {per_trial[-1] * 1000:.0f} ms "
        f"(goal < {GOAL_S * 1000:.0f} ms): {'met' if median < GOAL_S else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
