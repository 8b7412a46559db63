"""The suite's two workers share the machine (tests/support/machine_share.py): a background test
runs at the idle scheduling class and never while the foreground has the machine to itself, and
the scheduler sends each group to a worker of its own. Each side runs in a process of its own
here, as the two workers do (the functions keep their state per process)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List

from tests.support.environ import repo_pythonpath

SIDE = """
import os, sys, time
from pathlib import Path
from tests.support import machine_share

root, role, hold_s = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # not the launching worker's class
machine_share.configure(root / "gw0")
share = machine_share.alone() if role == "alone" else machine_share.in_background()
with share:
    print("in", time.monotonic(), os.sched_getscheduler(0), flush=True)
    time.sleep(hold_s)
    print("out", time.monotonic(), flush=True)
"""


def _side(root: Path, role: str, hold_s: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": repo_pythonpath()}
    command = [sys.executable, "-c", textwrap.dedent(SIDE), str(root), role, str(hold_s)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)


def _times(process: subprocess.Popen) -> List[List[str]]:
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0
    return [line.split() for line in out.splitlines()]


def _entered(process: subprocess.Popen) -> List[str]:
    """The side's first line: it is inside its block now."""
    assert process.stdout is not None
    return process.stdout.readline().split()


def test_the_foreground_alone_waits_for_the_background_test_in_flight(tmp_path: Path) -> None:
    background = _side(tmp_path, "background", 1.0)
    _, bg_entered, idle_class = _entered(background)
    alone = _side(tmp_path, "alone", 0.0)
    (_, fg_entered, _), _ = _times(alone)
    ((_, bg_left),) = _times(background)
    assert int(idle_class) == os.SCHED_IDLE  # a background test runs at the idle class
    assert float(bg_entered) < float(bg_left) <= float(fg_entered)  # one monotonic clock


def test_no_background_test_starts_while_the_foreground_is_alone(tmp_path: Path) -> None:
    alone = _side(tmp_path, "alone", 1.0)
    _, fg_entered, fg_class = _entered(alone)
    background = _side(tmp_path, "background", 0.0)
    (_, bg_entered, _), _ = _times(background)
    ((_, fg_left),) = _times(alone)
    assert int(fg_class) != os.SCHED_IDLE
    assert float(fg_entered) < float(fg_left) <= float(bg_entered)


def test_each_group_goes_to_a_worker_of_its_own(tmp_path: Path) -> None:
    from tests.support.machine_share import scope_of, write_groups

    scope = scope_of(tmp_path)  # made before the workers have collected, as the scheduler is
    write_groups(tmp_path, {"tests/test_a.py::fast": True, "tests/test_b.py::launches": False})
    assert scope("tests/test_a.py::fast") == "background"
    assert scope("tests/test_b.py::launches") == "foreground"
    assert scope("tests/test_c.py::not_listed") == "foreground"
