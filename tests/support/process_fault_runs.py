"""test_process_faults.py's deleted results folder, made in the session's lanes
(tests/support/session_runs.py): ``python -m torchscale benchmark`` as a subprocess (a standalone
torchrun: ports the OS picks).

Its fault sweep is not made there: the killed and exit-0 ranks' records name rank 0 losing its
peer, which rank 0 reports only when it sees the broken connection before torchrun ends it; with
a second run on the cores it lost that race once in three runs here ("rank 1 was killed by
signal 9 ... (forward)" and nothing of rank 0).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict

from tests.test_faults import env_with_repo, torchscale_cmd, wait_for

DELETED = """\
experiment_name: deleted
models: [gpt2-tiny]
batch_sizes: [2, 4]
gpu_counts: [1]
warmup_steps: 1
measure_steps: 100000  # still measuring when its folder goes: the sweep stops at once
sync_probe_steps: 0
"""


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
