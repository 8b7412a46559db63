"""test_process_faults.py's launches, made in the session's lanes (tests/support/session_runs.py).

Each is ``python -m torchscale benchmark`` as a subprocess (a standalone torchrun: ports the OS
picks), so two can run at once. What the tests read of them is statuses, error text, exit codes,
files and processes left behind, none of which sharing the cores can change; see each run.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

from tests.test_faults import env_with_repo, torchscale_cmd, wait_for
from torchscale.results.store import ExperimentStore

WARMUP, FAULT_AFTER, STALL_S = 1, 2, 3
FAULTS = f"""\
experiment_name: process-faults
models:
  - tests.support.fault_models:nan_model
  - tests.support.fault_models:killed_model
  - tests.support.fault_models:exit_model
  - tests.support.fault_models:memory_model
batch_sizes: [4]
gpu_counts: [2]
warmup_steps: {WARMUP}
measure_steps: 4
sync_probe_steps: 0
cell_timeout_s: 120
stall_timeout_s: {STALL_S}
"""
FAULT_STEP = FAULT_AFTER + 1 - WARMUP  # the measured step in whose forward each fault strikes

DELETED = """\
experiment_name: deleted
models: [gpt2-tiny]
batch_sizes: [2, 4]
gpu_counts: [1]
warmup_steps: 1
measure_steps: 100000  # still measuring when its folder goes: the sweep stops at once
sync_probe_steps: 0
"""


def silent_server() -> Tuple[str, Callable[[], None]]:
    """An HTTP server on 127.0.0.1 that accepts every connection and never answers: its URL, and
    what closes it and its connections (its accepting thread is a daemon's)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: List[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    def close() -> None:
        server.close()
        for connection in held:
            connection.close()

    threading.Thread(target=accept, daemon=True).start()
    return f"http://127.0.0.1:{server.getsockname()[1]}", close


def run_sweep(root: Path) -> Dict[str, Any]:
    """One warm group of four 2-rank faulty cells with ``--mlflow`` at a silent server.

    Sharing the cores cannot change what is asserted: each fault strikes at a counted forward
    call, not at a time; the records' statuses and error text name ranks, phases and steps; the
    MLflow warning is once per run whatever the deadline's timing. The 3 s stall watch only ends
    the MemoryError cell (its peer waits in the all-reduce for ever); a healthy step of these
    tiny models moves in milliseconds, so it cannot fire on the others under a second run."""
    config = root / "faults.yaml"
    config.write_text(FAULTS)
    server, _ = silent_server()  # open for the session: the test reads its URL in the output
    tag = f"torchscale-test-child-{root.name}"
    env = {
        **env_with_repo(),
        "TORCHSCALE_TEST_FAULT_AFTER": str(FAULT_AFTER),
        "TORCHSCALE_TEST_CHILD_TAG": tag,
    }
    args = ["benchmark", "-c", str(config), "-o", str(root / "out"), "--mlflow", server]
    done = subprocess.run(
        torchscale_cmd(*args, "--integration-timeout", "2"),
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    store = ExperimentStore(root / "out" / "process-faults")
    records = {r.model.split(":")[-1]: r for r in store.records()}
    return {"run": done, "store": store, "records": records, "tag": tag, "server": server}


def run_deleted(root: Path) -> Dict[str, Any]:
    """A 1-rank sweep whose results folder is deleted while its first cell measures.

    Sharing the cores cannot change what is asserted: the folder goes once rank 0 says it is
    measuring (100,000 steps: it still is, however slow), and what is read is the exit code, the
    one error line, the folder not re-created, the second cell never started and no process
    left; the waits are minutes."""
    config = root / "c.yaml"
    config.write_text(DELETED)
    out = root / "out"
    folder = out / "deleted"
    proc = subprocess.Popen(
        torchscale_cmd("benchmark", "-c", str(config), "-o", str(out)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_with_repo(),
    )  # fmt: skip
    try:

        def measuring() -> bool:
            ranks = folder.glob("cells/*/ranks/rank0.progress.json")
            return any('"measure"' in path.read_text() for path in ranks)

        started = wait_for(measuring, 180, 0.1)
        while started and folder.exists():  # its ranks may write while it goes
            shutil.rmtree(folder, ignore_errors=True)
        if not started:
            proc.kill()
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {"started": started, "returncode": proc.returncode, "stderr": stderr, "out": out}
