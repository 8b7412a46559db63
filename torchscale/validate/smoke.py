"""The functional smoke test: a real torchrun launch doing one all-reduce, checked and timed.

One process per GPU with NCCL, or two gloo processes on a node without GPUs. The launch runs under
:func:`~torchscale.launch.process.run_process`, so a hang (a dead peer, a firewall, a broken
NVLink) ends in a FAIL after ``timeout_s`` with every worker killed, never in a stuck command.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Dict, Optional

from torchscale.launch.process import python_env, run_process
from torchscale.launch.torchrun import format_command, torchrun_command
from torchscale.results.layout import RESULT_FILE, SMOKE_LOG
from torchscale.validate.result import CheckResult, fail, passed
from torchscale.validate.smoke_worker import SAMPLE, expected_sum

NAME = "All-reduce smoke test"
WORKER = "torchscale.validate.smoke_worker"
GPU_BYTES = 64 << 20  # modest: NVLink reaches a representative busbw, any GPU has the memory
CPU_BYTES = 4 << 20
CPU_PROCESSES = 2
HANG_FIX = (
    "Rerun with NCCL_DEBUG=INFO (and TORCH_DISTRIBUTED_DEBUG=DETAIL) to see where it stops. "
    "Common causes: a GPU or NVLink fault (see the NVLink and ECC rows), the fabric manager "
    "down on NVSwitch systems, NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME on the wrong interface, a "
    "firewall blocking local ports, or a too-small /dev/shm; try NCCL_P2P_DISABLE=1 once to "
    "isolate P2P."
)


def _last_error(log: Path) -> str:
    """The most telling line of a failed launch's log."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    for line in reversed(lines):
        if "Error" in line or "error" in line:
            return line[:300]
    return lines[-1][:300] if lines else "no output"


def _describe(result: Dict[str, Any]) -> str:
    size = result["size_bytes"]
    shown = f"{size / 2**20:.0f} MiB" if size >= 1 << 20 else f"{size} B"
    return (
        f"{result['world_size']} {result['backend']} ranks, sum correct over "
        f"{result['elements']:,} elements; {result['time_us'] / 1000:.2f} ms per {shown} "
        f"all-reduce, algbw {result['algbw_gbps']:.2f} GB/s, busbw {result['busbw_gbps']:.2f} GB/s"
    )


def evaluate(
    result: Dict[str, Any], log: Optional[Path] = None, launch_s: Optional[float] = None
) -> CheckResult:
    """Judge rank 0's result: exact sum (the worker's count and our own look at the sample)."""
    if launch_s is not None:
        result = {**result, "launch_s": round(launch_s, 3)}
    world = int(result["world_size"])
    sample = result.get("sample") or []
    expected = expected_sum(min(len(sample), SAMPLE), world)
    sample_ok = [float(v) for v in sample] == expected
    if result["wrong_elements"] or not sample_ok:
        return fail(
            NAME,
            f"all-reduce returned wrong values: {result['wrong_elements']:,} of "
            f"{result['elements']:,} elements wrong (first values {sample}, expected {expected})",
            "Data corruption in the collective: drain the node; check the ECC and NVLink rows, "
            "rerun with NCCL_DEBUG=INFO, and try NCCL_P2P_DISABLE=1 / NCCL_SHM_DISABLE=1 to find "
            "the faulty transport." + (f" Log: {log}" if log else ""),
            **result,
        )
    return passed(NAME, _describe(result), **result)


class SmokeCancelled(Exception):
    """The caller gave up (Ctrl-C in the main thread): the launch was killed."""


def run_smoke_test(
    gpus: int,
    timeout_s: float,
    cancel: Optional[threading.Event] = None,
    all_gather: bool = False,
) -> CheckResult:
    """Launch the worker on ``gpus`` ranks (NCCL), or 2 gloo ranks when ``gpus`` is 0; with
    ``all_gather`` (level 2) it times an all-gather too (``details["all_gather"]``).

    Setting ``cancel`` (from another thread) kills the launch and raises :class:`SmokeCancelled`.
    """

    def poll(_elapsed: float) -> None:
        if cancel is not None and cancel.is_set():
            raise SmokeCancelled()

    nproc = gpus if gpus > 0 else CPU_PROCESSES
    size = GPU_BYTES if gpus > 0 else CPU_BYTES
    workdir = Path(tempfile.mkdtemp(prefix="torchscale-validate-"))
    result_path, log = workdir / RESULT_FILE, workdir / SMOKE_LOG
    args = ["--result", str(result_path), "--size-bytes", str(size), "--timeout", str(timeout_s)]
    cmd = torchrun_command(
        WORKER, args + (["--all-gather"] if all_gather else []), nproc_per_node=nproc
    )
    try:
        outcome = run_process(
            cmd, timeout_s=timeout_s, log_path=log, env=python_env(), on_poll=poll
        )
    except BaseException:  # cancelled or interrupted: the tree is already killed
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    if outcome.timed_out:
        return fail(
            NAME,
            f"hung: no result after {timeout_s:g} s; all {nproc} worker processes were killed",
            f"{HANG_FIX} Log: {log}",
            command=format_command(cmd),
            launch_s=round(outcome.wall_s, 3),
        )
    if outcome.returncode != 0 or not result_path.exists():
        return fail(
            NAME,
            f"torchrun exited with code {outcome.returncode}: {_last_error(log)}",
            f"Read the log ({log}); rerun with NCCL_DEBUG=INFO to see the failing rank. "
            f"Command: {format_command(cmd)}",
        )
    check = evaluate(json.loads(result_path.read_text()), log, outcome.wall_s)
    if check.status.value == "PASS":
        shutil.rmtree(workdir, ignore_errors=True)
    return check
