"""Ranks forked from the torchrun agent (torchscale/launch/forked_ranks.py): which commands fork,
and that a forked rank is the process the ``exec`` of ``python -u -m <worker>`` would have been.

Each case starts the same probe (tests/support/forked_probe.py) twice through ``ForkingPopen``
with torchrun's arguments (an environment of its own, stdout and stderr to files, a new session):
once as a forked worker, once as a command it does not fork, which ``Popen`` execs. What the
probe reports from inside must be the same but for its pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from tests.support.environ import repo_pythonpath
from torchscale.launch import forked_ranks
from torchscale.launch.forked_ranks import FORKED_WORKERS, ForkingPopen, forked_worker

PROBE = "tests.support.forked_probe"


@pytest.fixture()
def agent_signals() -> Iterator[None]:
    """Dispositions an agent has when it starts its workers: torchrun's Python handlers (SIGTERM,
    here SIGUSR1 too) and a signal the agent was started with ignored (SIGHUP)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)}
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGUSR1, lambda *_: None)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _start(
    tmp_path: Path, label: str, how: List[str], fork: bool
) -> Tuple[int, Dict[str, Any], str, str]:
    """The probe started as torchrun's SubprocessHandler starts a worker; its exit status, its
    report, its stdout and its stderr."""
    folder = tmp_path / label
    folder.mkdir()
    report = folder / "report.json"
    env = {**os.environ, "RANK": "1", "FORKED_PROBE": "yes", "PYTHONPATH": repo_pythonpath()}
    env.pop("FORKED_PROBE_AGENT_ONLY", None)
    with open(folder / "stdout.log", "w") as out, open(folder / "stderr.log", "w") as err:
        command = [sys.executable, "-u", "-m", PROBE, str(report), *how]
        with pytest.MonkeyPatch.context() as patch:
            if fork:
                patch.setitem(FORKED_WORKERS, PROBE, (PROBE, False))
            proc = ForkingPopen(
                command, env=env, stdout=out, stderr=err, start_new_session=True, cwd=str(folder)
            )
        code = proc.wait(timeout=60)
    doc = json.loads(report.read_text())
    return code, doc, (folder / "stdout.log").read_text(), (folder / "stderr.log").read_text()


def _comparable(doc: Dict[str, Any], folder: Path) -> Dict[str, Any]:
    doc = dict(doc)
    doc.pop("pid")
    assert doc.pop("cwd") == str(folder)
    assert doc.pop("stdout") == str(folder / "stdout.log")
    assert doc.pop("stderr") == str(folder / "stderr.log")
    report, *how = doc.pop("argv")
    assert report == str(folder / "report.json")
    doc["how"] = how
    return doc


def test_a_forked_rank_is_the_process_exec_would_have_started(
    tmp_path: Path, agent_signals: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORKED_PROBE_AGENT_ONLY", "the agent's own")
    with open(tmp_path / "held-by-the-agent", "w"):  # a descriptor neither child may keep
        forked = _start(tmp_path, "forked", ["exit", "0"], fork=True)
        execed = _start(tmp_path, "execed", ["exit", "0"], fork=False)
    (f_code, f_doc, f_out, f_err), (e_code, e_doc, e_out, e_err) = forked, execed
    assert f_code == e_code == 0
    assert f_doc["pid"] != os.getpid() and f_doc["parent"] == e_doc["parent"] == os.getpid()
    mine = _comparable(f_doc, tmp_path / "forked")
    theirs = _comparable(e_doc, tmp_path / "execed")
    assert mine == theirs
    assert mine["session_leader"] is True and mine["fds"] == []  # a new session, nothing kept
    assert mine["rank"] == "1" and mine["probe_env"] == "yes" and mine["agent_only"] is None
    assert mine["how"] == ["exit", "0"] and mine["argv0"] == "forked_probe.py"
    assert mine["main"] == "__main__" and mine["stdout_write_through"] is True  # python -u
    assert mine["signals"] == {
        "SIGINT": "KeyboardInterrupt",
        "SIGTERM": "default",
        "SIGHUP": "ignored",
        "SIGPIPE": "ignored",
        "SIGUSR1": "default",
    }
    assert f_out == e_out == "probe says hello on stdout\n"
    assert f_err == e_err == "probe says hello on stderr\n"


@pytest.mark.parametrize(
    ("how", "code", "said"),
    [
        (["exit", "3"], 3, None),
        (["raise"], 1, "ValueError: the probe failed as asked"),
        (["interrupt"], -signal.SIGINT, "KeyboardInterrupt"),
    ],
)
def test_a_forked_rank_ends_as_the_execed_one_does(
    tmp_path: Path, how: List[str], code: int, said: str
) -> None:
    f_code, _, _, f_err = _start(tmp_path, "forked", how, fork=True)
    e_code, _, _, e_err = _start(tmp_path, "execed", how, fork=False)
    assert f_code == e_code == code
    if said is not None:
        assert said in f_err and said in e_err
        assert "Traceback (most recent call last)" in f_err


@pytest.mark.parametrize(
    ("argv", "forks"),
    [
        (
            [
                "--nproc-per-node=2",
                "--standalone",
                "-m",
                "torchscale.worker.warm_group_loop",
                "--group",
                "g.json",
            ],
            True,
        ),
        (["--nproc-per-node=1", "-m", "torchscale.worker", "--cell", "c.json"], True),
        (["--nproc-per-node=2", "-m", "torchscale.comm.worker", "--cell", "c.json"], True),
        (["--nproc-per-node=2", "-m", "torchscale.script.wrap", "--cell", "c.json"], False),
        (["--nproc-per-node=2", "-m", "torchscale.validate.smoke_worker"], False),
        (
            [
                "--nproc-per-node=2",
                "--no-python",
                "nsys",
                "profile",
                sys.executable,
                "-m",
                "torchscale.worker",
            ],
            False,
        ),
    ],
)
def test_only_torchscales_own_workers_fork_and_never_under_a_wrapper(
    argv: List[str], forks: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("torchscale.hardware.environment.gpu_device_files", lambda: [])
    monkeypatch.delenv(forked_ranks.FORK_ENV, raising=False)
    module = argv[argv.index("-m") + 1]
    assert forked_worker(argv) == (module if forks else None)


def test_no_rank_forks_on_a_gpu_node_or_when_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--nproc-per-node=2", "-m", "torchscale.worker", "--cell", "c.json"]
    monkeypatch.delenv(forked_ranks.FORK_ENV, raising=False)
    monkeypatch.setattr(
        "torchscale.hardware.environment.gpu_device_files", lambda: ["/dev/nvidia0"]
    )
    assert forked_worker(argv) is None
    monkeypatch.setattr("torchscale.hardware.environment.gpu_device_files", lambda: [])
    assert forked_worker(argv) == "torchscale.worker"
    monkeypatch.setenv(forked_ranks.FORK_ENV, "0")
    assert forked_worker(argv) is None


def test_any_other_command_starts_as_popen_starts_it(tmp_path: Path) -> None:
    """Not ``python -u -m <forked worker>``: exec'd (its own command line, not this process's)."""
    out = tmp_path / "cmdline"
    proc = ForkingPopen(
        [
            sys.executable,
            "-c",
            f"open({str(out)!r}, 'wb').write(open('/proc/self/cmdline', 'rb').read())",
        ],
        env=dict(os.environ),
    )
    assert proc.wait(timeout=60) == 0
    assert out.read_bytes().split(b"\0")[1] == b"-c"
    assert subprocess.Popen is not ForkingPopen  # nothing here replaced it for the session


@pytest.mark.slow
def test_the_healthy_runs_ranks_were_forked_and_each_ended_as_torchrun_saw_it(
    healthy_run: Any,
) -> None:
    """The shared real run: every launch's log says its ranks were forks, and the agent's exit
    log saw each rank start and end with code 0, as for an exec'd rank."""
    exits = sorted(healthy_run.experiment_dir.rglob("exits.*.jsonl"))
    assert len(exits) == 2, exits  # the 1-rank and the 2-rank launch
    for path in exits:
        log = (path.parent / "launch.log").read_text(errors="replace")
        assert forked_ranks.FORKED_LINE in log, path.parent
        events = [json.loads(line) for line in path.read_text().splitlines()]
        starts = {e["pid"] for e in events if e["event"] == "start"}
        ends = {e["pid"]: e.get("exitcode") for e in events if e["event"] == "end"}
        assert starts and set(ends) == starts and set(ends.values()) == {0}, events


def test_preload_imports_the_workers_modules_and_freezes_them_for_the_forks() -> None:
    """What the agent loads before its first fork: the worker's code, frozen out of the
    collector (a rank's collections would copy every page of it from the agent's)."""
    import gc

    gc.unfreeze()
    try:
        forked_ranks.preload("torchscale.comm.worker")
        assert "torchscale.comm.worker" in sys.modules
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
