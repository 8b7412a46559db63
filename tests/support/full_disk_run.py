"""A disk that fills in the middle of a sweep (test_faults.py), made in the session's lanes
(tests/support/session_runs.py), and the tmpfs and filling it needs.

Sharing the cores cannot change what the test reads of it: the disk is filled once the second
cell's rank 0 says it is measuring (polled every 0.1 s, against a window of 4 s), and what is read
is the exit code, the one error line, the two "> Running" lines, the first cell's bytes kept, the
records' statuses and batch sizes, and no process left; its waits are minutes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import pytest

from tests.support.environ import repo_pythonpath
from torchscale.results.store import ExperimentStore

FULL_CONFIG = """\
experiment_name: full
models: [gpt2-tiny]
batch_sizes: [2, 4, 8]
gpu_counts: [1]
warmup_steps: 2
measure_seconds: 4
sync_probe_steps: 2
cell_timeout_s: 300
"""


def mount_tmpfs(where: Path, options: str) -> Optional[str]:
    """Mount a tmpfs at ``where``: None, or why it cannot be mounted here (root and mount(8))."""
    if shutil.which("mount") is None or os.geteuid() != 0:
        return "mounting a tmpfs needs root and mount(8); CI runs as root"
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode})"
    return None


def unmount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], check=False)


def fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` to the last block."""
    filler = folder / "filler"
    chunk = b"\0" * (64 << 10)
    with open(filler, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(chunk)
        except OSError:
            pass
        try:
            while True:
                handle.write(b"\0" * 512)
        except OSError:
            pass
    return filler


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(what)
        time.sleep(0.1)


def run_full_disk(root: Path) -> Dict[str, Any]:
    """Three 1-rank cells into a 16 MB tmpfs, filled in the second cell's measured window. What
    the test reads is taken before the tmpfs is unmounted (the test's own folder is the tmp
    folder's, not the tmpfs)."""
    out = root / "out"
    reason = mount_tmpfs(out, "size=16m")
    if reason is not None:
        pytest.skip(reason)
    try:
        config = root / "c.yaml"
        config.write_text(FULL_CONFIG)
        store = ExperimentStore(out / "full")
        proc = subprocess.Popen(
            [sys.executable, "-m", "torchscale", "benchmark", "-c", str(config), "-o", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": repo_pythonpath()},
        )  # fmt: skip
        try:
            # In a warm group the next cell runs while the launcher still writes the first one's
            # summary: the disk fills once that is written, in the second cell's measured window.
            done = lambda: len(store.records()) == 1 and store.summary_path.exists()  # noqa: E731
            _wait_for(done, 180, "first cell never finished")
            first = store.results_path.read_bytes()
            measuring = lambda: any(  # noqa: E731
                '"measure"' in p.read_text()
                for p in store.root.glob("cells/*-b4-*/ranks/rank0.progress.json")
            )
            _wait_for(measuring, 120, "second cell never started measuring")
            fill(out)
            _, stderr = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return {
            "returncode": proc.returncode,
            "stderr": stderr,
            "out": out,
            "root": store.root,
            "first": first,
            "results": store.results_path.read_bytes(),
            "records": store.records(),
        }
    finally:
        unmount(out)
