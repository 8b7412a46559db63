"""How long ``torchscale report`` takes on 1,000 cells of results (goal: HTML < 5 s, PDF < 20 s).

Writes a synthetic experiment (5 models x 5 batch sizes x GPU counts 1-8 x 10 repeats, 50 steps
per cell, every rank's samples) with the test fixture generator, then times each stage of both
formats in this process. Run by hand:

    PYTHONPATH=. python benchmarks/report_speed.py [--cells-dir DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.report_fixtures import MODELS, FixtureSpec, ModelShape, write_experiment


def thousand_cells() -> FixtureSpec:
    base = MODELS[0]
    models = [
        ModelShape(
            f"model-{i}",
            base.params * (i + 1),
            base.ms_per_sample * (i + 1),
            base.flops_per_sample * (i + 1),
            base.sync_ms_per_gpu_doubling * (i + 1),
        )
        for i in range(5)
    ]
    return FixtureSpec(
        name="speed-1000",
        models=models,
        batch_sizes=(16, 32, 64, 128, 256),
        gpu_counts=(1, 2, 4, 8),
        repeats=10,
        steps=50,
        straggler=None,
    )


def timed(label: str, func, *args):
    """Wall and CPU time: on a shared machine the CPU time is the steadier figure."""
    start, cpu = time.perf_counter(), time.process_time()
    value = func(*args)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"  {label:<28} wall {wall:6.2f} s   cpu {cpu:6.2f} s", flush=True)
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells-dir", type=Path, help="Keep the generated results here.")
    args = parser.parse_args()
    root = args.cells_dir or Path(tempfile.mkdtemp(prefix="report-speed-"))
    spec = thousand_cells()
    folder = root / "speed-1000"
    if not (folder / "results.jsonl").exists():
        start = time.perf_counter()
        write_experiment(root, spec)
        print(f"wrote {folder} in {time.perf_counter() - start:.1f} s")

    from torchscale.app.report import ReportRequest, generate_report

    for fmt in ("html", "pdf"):
        output = root / f"report.{fmt}"
        print(f"{fmt}:")
        timed(f"results -> {output.name}", generate_report, ReportRequest(folder, fmt, output))
        print(f"  {output.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
