"""The suite's two workers share the machine (tests/support/machine_share.py): a background test
runs at the idle scheduling class and never while the foreground has the machine to itself, and
the scheduler sends each group to a worker of its own. Each side runs in a process of its own
here, as the two workers do (the functions keep their state per process)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Dict, List, Optional, cast

import pytest

from tests.support.environ import repo_pythonpath

SIDE = """
import os, sys, time
from pathlib import Path
from tests.support import machine_share

root, role, hold_s = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # not the launching worker's class
machine_share.configure(root / "gw0")
if role == "kept":  # two timed tests in a row, hold_s apart
    with machine_share.alone_until(keep=True):
        print("in", time.monotonic(), os.sched_getscheduler(0), flush=True)
    time.sleep(hold_s)
    with machine_share.alone_until(keep=False):
        print("out", time.monotonic(), flush=True)
    sys.exit(0)
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


def test_no_background_test_starts_between_two_timed_tests(tmp_path: Path) -> None:
    kept = _side(tmp_path, "kept", 1.0)
    _entered(kept)  # the first timed test has ended; the second starts in a second
    background = _side(tmp_path, "background", 0.0)
    (_, bg_entered, _), _ = _times(background)
    ((_, fg_second),) = _times(kept)
    assert float(fg_second) <= float(bg_entered)


class _Marked:
    """A collected test with these marks: the sharing rule reads only its closest marks."""

    def __init__(self, *marks: pytest.MarkDecorator) -> None:
        self._marks: Dict[str, pytest.Mark] = {m.mark.name: m.mark for m in marks}

    def get_closest_marker(self, name: str) -> Optional[pytest.Mark]:
        return self._marks.get(name)


def test_a_timed_test_has_the_machine_alone_unless_it_reads_only_bounds() -> None:
    """Where each test runs: a fast one in the background; a launch beside it; a timed one alone;
    ``timed(alone=False)`` (a time bound, two clocks over the same steps) beside it too."""
    from tests.conftest import _alone, _in_background

    cases = {
        "fast": ((), (True, False)),
        "launch": ((pytest.mark.slow,), (False, False)),
        "timed": ((pytest.mark.timed,), (False, True)),
        "timed launch": ((pytest.mark.slow, pytest.mark.timed), (False, True)),
        "a bound": ((pytest.mark.timed(alone=False),), (False, False)),
        "a launch's bound": ((pytest.mark.slow, pytest.mark.timed(alone=False)), (False, False)),
    }
    for name, (marks, expected) in cases.items():
        item = cast(pytest.Item, _Marked(*marks))
        assert (_in_background(item), _alone(item)) == expected, name


def test_each_group_goes_to_a_worker_of_its_own(tmp_path: Path) -> None:
    from tests.support.machine_share import scope_of, write_groups

    scope = scope_of(tmp_path)  # made before the workers have collected, as the scheduler is
    write_groups(tmp_path, {"tests/test_a.py::fast": True, "tests/test_b.py::launches": False})
    assert scope("tests/test_a.py::fast") == "background"
    assert scope("tests/test_b.py::launches") == "foreground"
    assert scope("tests/test_c.py::not_listed") == "foreground"


def test_the_launch_count_names_a_tests_folder_below_a_workers_folder() -> None:
    """xdist gives each worker a tmp folder (``popen-gw1``): launches are counted by the test's or
    fixture's folder below it, and a copied run's exits file counts once."""
    with tempfile.TemporaryDirectory() as outside:  # not in the session's own count
        _count_in(Path(outside))


def _count_in(tmp_path: Path) -> None:
    from tests.conftest import _launch_folders

    exits = {
        "popen-gw1/test_resume0/out/cells/a": "start 1",
        "popen-gw1/test_resume0/out/cells/b": "start 2",
        "popen-gw0/healthy-run0/out/group": "start 3",
        "gw2/tune-mlp0/out/trial": "start 4",
        "own-folder/cells/c": "start 5",
    }
    for folder, content in exits.items():
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "exits.head.jsonl").write_text(content)
    time.sleep(0.05)  # file times tick every few ms: the copy's must be later
    copy = tmp_path / "popen-gw1" / "test_copy0" / "a"
    copy.mkdir(parents=True)
    (copy / "exits.head.jsonl").write_text("start 1")  # a copy made later: not another launch
    assert _launch_folders(tmp_path) == {
        "test_resume0": 2,
        "healthy-run0": 1,
        "tune-mlp0": 1,
        "own-folder": 1,
    }
