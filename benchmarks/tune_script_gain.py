"""Benchmark (run by hand, not a test): does `tune --script` find a gain in a user's own DDP
script that a separate `benchmark` of its winner confirms?

The script is examples/scripts/train_many_buckets.py, run with its own `--bucket-cap-mb 1` (32
all-reduces a step); tune searches bucket_cap_mb over 25 and 100 MB (2 and 1 buckets), re-measures
the best against the script's own setting in paired rounds, and writes best.yaml and
baseline.yaml. Each round here then runs both as plain benchmarks, back to back, and gives the
separate benchmark's gain with its 95% interval over the steps. A round whose verdict ran while
other processes held the cores says so (the verdict measured them too).

    PYTHONPATH=$PWD python benchmarks/tune_script_gain.py --rounds 5

The test suite keeps what does not depend on the machine's timing (tests/test_own_script.py: every
trial ran the script with its DDP argument, the verdict, best.yaml); this is the statistical
claim, with its figures in docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Dict, List

from typer.testing import CliRunner

from torchscale.analysis.bootstrap import throughput_interval
from torchscale.analysis.comparison import CompareOptions
from torchscale.cli.app import app
from torchscale.results.schema import TrainingResult
from torchscale.results.store import ExperimentStore
from torchscale.tune.verdict import host_waits

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "scripts" / "train_many_buckets.py"
CONFIG = """\
warmup_steps: 3
measure_steps: 20
sync_probe_steps: 0
cell_timeout_s: 240
tune:
  search: [ddp.bucket_cap_mb]
  space:
    ddp.bucket_cap_mb: [25, 100]
  pruning: false
  finalists: 1
  repeats: 2
"""


def training(folder: Path) -> List[TrainingResult]:
    return [r for r in ExperimentStore(folder).records() if isinstance(r, TrainingResult)]


def one_round(tmp: Path) -> Dict[str, object]:
    runner = CliRunner()
    config = tmp / "buckets.yaml"
    config.write_text(CONFIG)
    args = ["tune", "--script", str(SCRIPT), "--gpus", "2", "-c", str(config)]
    args += ["-o", str(tmp / "out"), "--json", "--", "--bucket-cap-mb", "1", "--steps", "200"]
    result = runner.invoke(app, args)
    if result.exit_code != 0:
        raise SystemExit(f"tune failed ({result.exit_code}):\n{result.output}")
    summary = json.loads(result.stdout)
    row: Dict[str, object] = {"tune": summary["line"], "confirmed": None}
    row["others"] = summary["verdict"].get("oversubscribed_wait_share")
    if summary["result"] != "gain":
        return row
    folder = tmp / "out" / "buckets" / "tune"
    confirm = {}
    for name in ("best", "baseline"):
        run = runner.invoke(
            app, ["benchmark", "-c", str(folder / f"{name}.yaml"), "-o", str(tmp / "confirm")]
        )
        if run.exit_code != 0:
            raise SystemExit(f"benchmark of {name}.yaml failed:\n{run.output}")
        (confirm[name],) = training(tmp / "confirm" / f"buckets-{name}")
    best, base = confirm["best"], confirm["baseline"]
    gain, low, high = throughput_interval(
        base.step_times_ms, best.step_times_ms, CompareOptions(resamples=2000)
    )
    row["separate"] = f"{gain:+.1f}% ({low:+.1f}..{high:+.1f}%)"
    row["confirmed"] = low > 0
    row["separate_others"] = host_waits([base, best])["oversubscribed_wait_share"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for index in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            row = one_round(Path(tmp))
        rows.append(row)
        print(f"round {index + 1}: {row}", flush=True)
    found = [r for r in rows if r["confirmed"] is not None]
    confirmed = [r for r in found if r["confirmed"]]
    print(
        f"tune found a gain in {len(found)} of {len(rows)} rounds; the separate benchmark "
        f"confirmed {len(confirmed)} of them"
    )


if __name__ == "__main__":
    main()
