"""torch.profiler's own ``.json.gz`` export against torchscale's (plain JSON, then gzip level 1).

    PYTHONPATH=. python benchmarks/trace_export_speed.py [--steps 1500]

Traces ``--steps`` steps of a small MLP on one CPU thread (about the event count of a 4 s
``torchscale profile`` window of the test models), then exports the same trace both ways and
prints the seconds each took and the file sizes. torch's ``.gz`` path writes the JSON to a
temporary file and gzips it line by line at level 9.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from torchscale.worker.profiler import TRACE_GZIP_LEVEL, export_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(8)])
    x = torch.randn(4, 128)
    folder = Path(tempfile.mkdtemp(prefix="trace-export-"))
    timings: Dict[str, Any] = {}
    # A Kineto trace can be saved once: each way exports its own profile of the same steps.
    for name, export in (
        ("torch .json.gz (level 9, by line)", lambda prof, p: prof.export_chrome_trace(str(p))),
        (f"torchscale (json, then level {TRACE_GZIP_LEVEL})", export_trace),
    ):
        path = folder / f"{len(timings)}.json.gz"

        def ready(prof: Any, name: str = name, export: Any = export, path: Path = path) -> None:
            start = time.perf_counter()
            export(prof, path)
            timings[name] = (time.perf_counter() - start, path.stat().st_size)

        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=1, active=args.steps, repeat=1),
            on_trace_ready=ready,
        ) as prof:
            for _ in range(args.steps + 1):
                model(x).sum().backward()
                prof.step()
    print("| export | seconds | MB |")
    print("|---|---|---|")
    for name, (seconds, size) in timings.items():
        print(f"| {name} | {seconds:.2f} | {size / 1e6:.1f} |")
    for path in folder.iterdir():
        os.unlink(path)
    folder.rmdir()


if __name__ == "__main__":
    main()
