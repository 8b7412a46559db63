"""The session's long runs whose assertions cannot see shared cores, made two at a time ("lanes").

A run's start-up and its processes' waits for each other (imports, rendezvous, polls, a pod held
until its results are copied, a stall watch's seconds) leave a core idle that a second run fills.
So the runs below go in ``LANES`` threads at once, all before the first test that reads one:
nothing else of the session runs beside them (the other tests' timings and busy-host verdicts
stay their own), and the fleet test, whose throttled host is measured against its peers, makes
its hosts after them.

Two sorts share the lanes. Multi-host runs have hosts of their own (network namespaces: their
addresses and ports are theirs alone). Single-host runs are subprocesses (``python -m torchscale``
with this checkout on PYTHONPATH: CliRunner and ``os.environ`` are the process's, so nothing here
invokes the CLI in-process), standalone torchrun launches on ports the OS picks. A run joins only
when no assertion on it reads a verdict, a time or a figure that sharing the cores could change:
statuses, records' fields, error text, exit codes, files, processes left behind, formulas over
the same records, and timeouts of minutes (or seconds of no movement at all, where a step takes
milliseconds). Each run's docstring says why.

Only the runs that the session's selected tests read are made (``wanted``): one module run alone
pays only for its own. ``tests/conftest.py`` holds one session fixture per run, of the same name.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from tests.support.environ import repo_pythonpath
from tests.support.two_hosts import tear_down_all

Jobs = List[Tuple[str, Callable[[], Any]]]

LANES = 2
"""Runs at once. Two, not more: every node of a run holds ~1.5 GB (torchscale, its torchrun
agent, a rank) and the suite's machine has 2 cores."""


@dataclass(frozen=True)
class LaneRun:
    """A session fixture's run: ``jobs(folder)`` readies it in the test's thread (CliRunner and
    ``os.environ`` are the process's) and returns the jobs the lanes run; ``combine`` makes the
    fixture's value of their results."""

    folder: str  # its tmp folder (the launch count's name for it)
    jobs: Callable[[Path], Jobs]
    combine: Callable[[Dict[str, Any]], Any]


class Kept:
    """A job's value, or what it raised, raised again where a test asks for it: a run of several
    jobs whose value is a dict of these fails, job by job, only the tests that read a broken one."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: Optional[BaseException] = None
        try:
            self._value = call()
        except Exception as exc:  # an assertion or a timeout: that job's tests fail, no others
            self._error = exc

    def value(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


def _kept(run: Callable[[Path], Any], where: Path) -> Kept:
    return Kept(lambda: run(where))


def kept_jobs(runs: Dict[str, Callable[[Path], Any]]) -> Callable[[Path], Jobs]:
    """Jobs of ``runs`` (by name), each in a folder of its own, each value :class:`Kept`."""

    def jobs(folder: Path) -> Jobs:
        made: Jobs = []
        for name, run in runs.items():
            (folder / name).mkdir()
            made.append((name, functools.partial(_kept, run, folder / name)))
        return made

    return jobs


def torchscale(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m torchscale ARGS`` as a subprocess, this checkout importable (by its workers
    too), with ``env`` added, its output captured: a single-host run in a lane (CliRunner swaps
    the process's sys.stdout, so two cannot run in threads at once)."""
    command = [sys.executable, "-m", "torchscale", *args]
    environ = {**os.environ, "PYTHONPATH": repo_pythonpath(), **env}
    return subprocess.run(command, capture_output=True, text=True, env=environ, timeout=600)


def _single(run: Callable[[Path], Any]) -> Callable[[Path], Jobs]:
    return lambda folder: [("run", lambda: run(folder))]


def _only(results: Dict[str, Any]) -> Any:
    return results["run"]


def _as_is(results: Dict[str, Any]) -> Any:
    return results


def _runs() -> Dict[str, LaneRun]:
    """Longest first, so that the last to start is a short one."""
    from tests.support import (
        full_disk_run,
        k8s_pod_runs,
        multinode_run,
        own_script_runs,
        process_fault_runs,
        slurm_cluster,
        strategy_runs,
    )

    return {
        "two_host_lockstep": LaneRun("two_hosts", _single(multinode_run.run_lockstep), _only),
        "k8s_pods_run": LaneRun("k8s_pods", k8s_pod_runs.jobs, k8s_pod_runs.combine),
        "hybrid_run": LaneRun("hybrid", _single(multinode_run.run_hybrid), _only),
        "slurm_job_run": LaneRun("slurm", _single(slurm_cluster.run_slurm_job), _only),
        "comm_nodes_run": LaneRun("comm_nodes", _single(multinode_run.run_comm_nodes), _only),
        # single-host runs
        "strategy_runs": LaneRun("strategies", kept_jobs(strategy_runs.RUNS), _as_is),
        "own_script_faults": LaneRun("own-script-faults", kept_jobs(own_script_runs.RUNS), _as_is),
        "full_disk_run": LaneRun("full-disk", _single(full_disk_run.run_full_disk), _only),
        "deleted_folder_run": LaneRun(
            "deleted-folder", _single(process_fault_runs.run_deleted), _only
        ),
    }


FIXTURES = (
    "two_host_lockstep",
    "k8s_pods_run",
    "hybrid_run",
    "slurm_job_run",
    "comm_nodes_run",
    "strategy_runs",
    "own_script_faults",
    "full_disk_run",
    "deleted_folder_run",
)
"""The session fixtures these runs are (tests/conftest.py): a test that takes one launches."""


class Outcome:
    """A run's value, or what it raised (a failed assertion, a skip), raised again where a test
    asks for it, so one broken run fails its own tests only."""

    def __init__(self, get: Callable[[], Any]) -> None:
        self._get = get

    def value(self) -> Any:
        return self._get()


def run_in_lanes(make_folder: Callable[[str], Path], wanted: Iterable[str]) -> Dict[str, Outcome]:
    """The ``wanted`` runs, ``LANES`` at a time; every one ended before this returns."""
    runs = _runs()
    chosen = [name for name in runs if name in set(wanted)]
    outcomes: Dict[str, Outcome] = {}
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=LANES, thread_name_prefix="session-run") as lanes:
        futures: Dict[str, List[Tuple[str, Future[Any]]]] = {}
        try:
            for name in chosen:
                try:
                    jobs = runs[name].jobs(make_folder(runs[name].folder))
                except (KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as exc:  # a skip or a failed emit: that fixture's tests see it
                    outcomes[name] = Outcome(_raiser(exc))
                    continue
                futures[name] = [
                    (job, lanes.submit(_timed, f"{name}/{job}", call)) for job, call in jobs
                ]
            for name, submitted in futures.items():
                outcomes[name] = _outcome(runs[name], submitted)
        except BaseException:  # Ctrl-C: the lanes' runs end now, their hosts torn down
            lanes.shutdown(wait=False, cancel_futures=True)
            tear_down_all()
            raise
    took = time.monotonic() - started
    names = ", ".join(chosen)
    print(f"\nsession runs ({names}), {LANES} at a time: {took:.1f} s", file=sys.stderr)
    return outcomes


def _timed(name: str, call: Callable[[], Any]) -> Any:
    """``call()``, its wall time said on stderr (``-s`` shows it): where a lane's time goes."""
    started = time.monotonic()
    try:
        return call()
    finally:
        print(f"session run {name}: {time.monotonic() - started:.1f} s", file=sys.stderr)


def _raiser(exc: BaseException) -> Callable[[], Any]:
    def get() -> Any:
        raise exc

    return get


def _outcome(run: LaneRun, submitted: List[Tuple[str, Future[Any]]]) -> Outcome:
    results: Dict[str, Any] = {}
    for job, future in submitted:
        exc = future.exception()
        if exc is not None:
            return Outcome(_raiser(exc))
        results[job] = future.result()
    combined = run.combine(results)
    return Outcome(lambda: combined)
