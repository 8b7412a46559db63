"""GPU truth: torchscale's bf16 figures on one GPU against a plain loop and a clock.

Three parts, each selectable with ``--parts``:

* ``plain``: each case runs as a torchscale cell (``torchscale benchmark``) and twice as
  ``plain_ddp_loop.py`` (same model, batch, precision, warm-up and steps), the order alternating
  per round; the ratio torchscale / plain and the plain / plain noise floor come from one run.
* ``variants``: batch 128, channels_last, cudnn_benchmark off, torch.compile (torchscale cells
  only; the plain loop has none of these knobs).
* ``stamps``: the outside clock. ``benchmarks.stamped_model`` models stamp each forward after a
  ``torch.cuda.synchronize()``; the rate from the stamps around the measured window is compared
  with the throughput torchscale reports for the same run.

    python benchmarks/gpu_truth.py --parts plain stamps --out /tmp/gpu-truth

Writes ``gpu_truth.jsonl`` (one line per measurement) under ``--out`` and prints a summary table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass(frozen=True)
class Case:
    model: str
    batch: int
    seq_len: Optional[int] = None
    knobs: Dict[str, object] = field(default_factory=dict)

    @property
    def label(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in self.knobs.items())
        seq = f" seq {self.seq_len}" if self.seq_len else ""
        return f"{self.model} b{self.batch}{seq}{extra}"


PLAIN_CASES = [  # the headline figures, each against a plain loop
    Case("resnet50", 256),
    Case("bert-large", 16, 512),
    Case("gpt2", 8, 1024),
    Case("gpt2-medium", 8, 1024),
]
VARIANT_CASES = [  # the knobs, torchscale alone (the plain loop has none of them)
    Case("resnet50", 128),
    Case("resnet50", 256, knobs={"channels_last": True}),
    Case("resnet50", 256, knobs={"cudnn_benchmark": False}),
    Case("resnet50", 256, knobs={"compile": True, "channels_last": True}),
    Case("gpt2", 8, 1024, knobs={"compile": True}),
    Case("bert-large", 16, 512, knobs={"compile": True}),
]
STAMP_CASES = [
    Case("benchmarks.stamped_model:stamped_resnet50", 256),
    Case("benchmarks.stamped_model:stamped_gpt2", 8, 1024),
]


def env() -> Dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT), out.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return out


def torchscale_cell(
    case: Case, warmup: int, steps: int, work: Path, extra_env: Optional[Dict[str, str]] = None
) -> Dict[str, object]:
    """Run ``case`` through the torchscale CLI; return its record's headline figures."""
    name = f"c{abs(hash((case.label, time.time_ns()))) % 10**8}"
    config = {
        "experiment_name": name,
        "models": [case.model],
        "batch_sizes": [case.batch],
        "gpu_counts": [1],
        "precision": "bf16",
        "warmup_steps": warmup,
        "measure_steps": steps,
        "sync_probe_steps": 5,
        "cell_timeout_s": 900,
        **({"seq_len": case.seq_len} if case.seq_len else {}),
        **case.knobs,
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "torchscale", "benchmark", "--config", str(path),
         "--output-dir", str(work / "results")],
        cwd=ROOT, env={**env(), **(extra_env or {})}, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - started
    results = work / "results" / name / "results.jsonl"
    if not results.is_file():
        return {"status": "no results", "stderr": proc.stderr[-2000:]}
    record = json.loads(results.read_text().splitlines()[-1])
    step = record.get("step_time_ms") or {}
    memory = record.get("memory") or {}
    gpu = (record.get("per_rank") or [{}])[0].get("gpu") or {}
    return {
        "status": record["status"],
        "error": record.get("error"),
        "samples_per_s": record.get("samples_per_s"),
        "throughput": record.get("throughput"),
        "unit": record.get("unit"),
        "p50_ms": step.get("p50"),
        "p95_ms": step.get("p95"),
        "mfu": record.get("mfu"),
        "tflops_per_gpu": record.get("tflops_per_gpu"),
        "peak_tflops": record.get("peak_tflops"),
        "peak_mem_gib": (memory.get("peak_bytes") or 0) / 2**30,
        "activations_gib": (memory.get("activations_peak_bytes") or 0) / 2**30,
        "sm_clock_mhz_mean": gpu.get("sm_clock_mhz_mean"),
        "power_w_mean": gpu.get("power_w_mean"),
        "util_pct_mean": gpu.get("util_pct_mean"),
        "measure_steps": record.get("measure_steps"),
        "measured_s": record.get("measured_s"),
        "device_name": record.get("device_name"),
        "cell_wall_s": wall,
    }


def plain_loop(case: Case, warmup: int, steps: int) -> Optional[float]:
    """samples/s of ``plain_ddp_loop.py`` on one GPU, or None when it failed."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
        str(HERE / "plain_ddp_loop.py"), "--model", case.model, "--batch-size", str(case.batch),
        "--warmup", str(warmup), "--steps", str(steps), "--precision", "bf16",
    ]  # fmt: skip
    if case.seq_len:
        cmd += ["--seq-len", str(case.seq_len)]
    if case.knobs.get("channels_last"):
        cmd.append("--channels-last")
    if case.knobs.get("cudnn_benchmark") is not False:  # torchscale's default: on
        cmd.append("--cudnn-benchmark")
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            return float(json.loads(line)["samples_per_s"])
    # torchrun's own traceback comes last; the worker's error is the line that names it.
    lines = proc.stderr.splitlines()
    errors = [line for line in lines if "Error" in line and "elastic" not in line]
    print(f"plain loop failed: {case.label}: {errors[:3]}", file=sys.stderr)
    return None


def stamp_rate(folder: Path, warmup: int, steps: int, batch: int) -> Optional[float]:
    """samples/s between the forward stamps that open the measured window and follow it."""
    lines = (folder / "rank0.txt").read_text().split()
    stamps = [float(x) for x in lines]
    first = max(warmup, 1)  # the worker runs at least one warm-up step
    if len(stamps) <= first + steps:
        return None
    return steps * batch / (stamps[first + steps] - stamps[first])


def emit(out: Path, row: Dict[str, object]) -> None:
    with (out / "gpu_truth.jsonl").open("a") as handle:
        handle.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["stamps", "plain", "variants"])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument(
        "--only", nargs="+", default=None, help="Run only cases whose label contains one of these."
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--cpu-check", action="store_true", help="Check this script on a CPU: resnet-tiny stamps."
    )
    args = parser.parse_args()
    stamp_cases = (
        [Case("benchmarks.stamped_model:stamped_resnet_tiny", 8)] if args.cpu_check else STAMP_CASES
    )
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-truth-"))

    def chosen(cases: List[Case]) -> List[Case]:
        return [c for c in cases if args.only is None or any(o in c.label for o in args.only)]

    if "plain" in args.parts:
        for case in chosen(PLAIN_CASES):
            for round_ in range(args.rounds):
                order = ["ts", "plain", "plain2"] if round_ % 2 == 0 else ["plain", "ts", "plain2"]
                row: Dict[str, object] = {"part": "plain", "case": case.label, "round": round_}
                for who in order:
                    if who == "ts":
                        row["torchscale"] = torchscale_cell(case, args.warmup, args.steps, work)
                    else:
                        row[who] = plain_loop(case, args.warmup, args.steps)
                ts = row["torchscale"].get("samples_per_s")  # type: ignore[union-attr]
                if ts and row.get("plain") and row.get("plain2"):
                    row["ratio"] = ts / row["plain"]  # type: ignore[operator]
                    row["noise_floor"] = row["plain2"] / row["plain"]  # type: ignore[operator]
                emit(args.out, row)
    if "variants" in args.parts:
        for case in chosen(VARIANT_CASES):
            cell = torchscale_cell(case, args.warmup, args.steps, work)
            emit(args.out, {"part": "variants", "case": case.label, "torchscale": cell})
    if "stamps" in args.parts:
        for case in chosen(stamp_cases):
            folder = work / f"stamps-{abs(hash(case.label)) % 10**6}"
            cell = torchscale_cell(
                case, args.warmup, args.steps, work, {"TORCHSCALE_STAMPS": str(folder)}
            )
            outside = stamp_rate(folder, args.warmup, args.steps, case.batch)
            reported = cell.get("samples_per_s")
            emit(args.out, {
                "part": "stamps", "case": case.label, "torchscale": cell, "outside": outside,
                "ratio": (reported / outside) if reported and outside else None,  # type: ignore[operator]
            })  # fmt: skip


if __name__ == "__main__":
    main()
