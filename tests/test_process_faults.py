"""Faults that are processes: made for real, and what torchscale records of them.

One warm-group sweep of four 2-rank cells makes most of them at once: a model whose loss is NaN,
a rank killed with SIGKILL (after starting a child process of its own), a rank that calls
``os._exit(0)`` in the measured window, and a rank that raises a real MemoryError under an
address-space limit while its peer waits in the all-reduce (with a 3 s ``stall_timeout_s``), all
with ``--mlflow`` pointing at a server that accepts connections and never answers. Other runs: a
results folder deleted mid-sweep, and ``ulimit -f``. docs/faults.md lists each fault with what is
recorded, the exit code and what is kept.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from tests.support.environ import repo_pythonpath
from tests.support.process_fault_runs import DELETED
from tests.support.shared_runs import Run
from tests.support.typed import training_records
from tests.test_faults import env_with_repo, one_error_line, pids_of, torchscale_cmd
from torchscale.integrations.deadline import call_with_deadline, unreachable
from torchscale.integrations.sinks import Integrations, SinkEvents
from torchscale.launch.rank_exits import launcher_log_exits
from torchscale.results.store import ExperimentStore, FolderLostError

pytestmark = pytest.mark.timed  # which rank sees its peer lost first; the sinks' deadlines

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


@pytest.fixture(scope="module")
def silent_server() -> Iterator[str]:
    """An HTTP server on 127.0.0.1 that accepts every connection and never answers."""
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

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for connection in held:
        connection.close()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, silent_server: str) -> Dict[str, Any]:
    root = tmp_path_factory.mktemp("process-faults")
    config = root / "faults.yaml"
    config.write_text(FAULTS)
    tag = f"torchscale-test-child-{root.name}"
    env = {
        **env_with_repo(),
        "TORCHSCALE_TEST_FAULT_AFTER": str(FAULT_AFTER),
        "TORCHSCALE_TEST_CHILD_TAG": tag,
    }
    args = ["benchmark", "-c", str(config), "-o", str(root / "out"), "--mlflow", silent_server]
    done = subprocess.run(
        torchscale_cmd(*args, "--integration-timeout", "2"),
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    store = ExperimentStore(root / "out" / "process-faults")
    records = {r.model.split(":")[-1]: r for r in training_records(store.records())}
    return {"run": done, "store": store, "records": records, "tag": tag}


def _exit_log(sweep: Dict[str, Any], record: Any, event: str) -> List[Dict[str, Any]]:
    """The ``event`` lines of the exit log of the warm group that ran ``record``'s cell."""
    group = sweep["store"].root / "groups" / record.launch["group"]
    lines = [line for path in group.glob("exits.*.jsonl") for line in path.read_text().splitlines()]
    return [doc for doc in map(json.loads, lines) if doc["event"] == event]


def _after_the_cause(sweep: Dict[str, Any], record: Any, cause: str) -> None:
    """The survivor's part of a record whose cause is rank 1's departure, as the evidence says.

    Rank 0 sees the broken connection within a few milliseconds (0.5-3.6 ms after rank 1's end
    in five runs here), but torchrun's agent polls its workers every 0.1 s and stops the rest at
    once: once in six runs that poll came 2.2 ms after rank 1's end, before rank 0 had written
    its error file (ranks forked or fresh alike). Where rank 0 wrote one, the record names it as
    the consequence; where torchrun stopped it first (its exit log's ``stop``), the record is the
    cause alone, with nothing blamed on rank 0."""
    ranks = sweep["store"].cell_dir(record.cell_id) / "ranks"
    if (ranks / "rank0.error.json").exists():
        assert record.error.startswith(f"{cause}; rank 0 then lost its peer ("), record.error
        return
    stops = _exit_log(sweep, record, "stop")
    assert [(stop["rank"], stop["signal"]) for stop in stops] == [(0, 15)], stops
    assert record.error.startswith(cause) and "rank 0" not in record.error, record.error


@pytest.mark.slow
def test_a_rank_killed_by_sigkill_is_named_and_its_child_is_gone(sweep: Dict[str, Any]) -> None:
    record = sweep["records"]["killed_model"]
    assert record.status == "failed"
    cause = (
        "rank 1 was killed by signal 9 (SIGKILL: the kernel's OOM killer?) "
        f"in measure at step {FAULT_STEP} (forward)"
    )
    _after_the_cause(sweep, record, cause)
    assert "rank 0 on" not in record.error  # the survivor is not blamed
    # The rank's own child (its session's, outside torchrun's tree) ended with the launch.
    assert pids_of(sweep["tag"]) == []
    # torchrun's agent said how each worker ended: rank 1 by signal 9, first.
    ends = _exit_log(sweep, record, "end")
    first = min(ends, key=lambda end: end["time"])
    assert (first["rank"], first.get("signal")) == (1, 9), ends


@pytest.mark.slow
def test_a_rank_that_exits_0_mid_measure_is_named(sweep: Dict[str, Any]) -> None:
    record = sweep["records"]["exit_model"]
    assert record.status == "failed"
    cause = (
        f"rank 1 exited with code 0 in measure at step {FAULT_STEP} (forward) without reporting "
        "an error (os._exit or sys.exit in the model's code?)"
    )
    _after_the_cause(sweep, record, cause)


@pytest.mark.slow
def test_an_error_file_wins_over_the_stall_verdict(sweep: Dict[str, Any]) -> None:
    """Rank 1 raised MemoryError; rank 0 waited in the all-reduce until the 3 s stall watch
    ended the launch: the record is the MemoryError, not a hang."""
    record = sweep["records"]["memory_model"]
    assert record.status == "oom", record.error
    assert record.error.startswith(
        f"rank 1 on {socket.gethostname()} failed in measure at step {FAULT_STEP} (forward): "
        "MemoryError"
    ), record.error
    assert "hung" not in record.error and "stuck" not in record.error
    assert record.error.endswith(f"; the launch was then ended (no rank moved for {STALL_S} s)")


@pytest.mark.slow
def test_a_diverged_loss_makes_the_cell_invalid(sweep: Dict[str, Any]) -> None:
    record = sweep["records"]["nan_model"]
    assert record.status == "invalid"
    assert "the loss diverged (last loss: rank 0 NaN, rank 1 NaN)" in record.error
    assert record.throughput and record.throughput > 0  # it ran at full speed: only the loss
    stderr = sweep["run"].stderr
    assert "> [FAIL] invalid: " in stderr and "the loss diverged" in stderr
    summary = (sweep["store"].root / "summary.csv").read_text().splitlines()
    (row,) = [line for line in summary if "nan-model" in line]
    assert ",invalid," in row
    assert sweep["run"].returncode == 1


@pytest.mark.slow
def test_an_unanswering_mlflow_server_is_one_warning_and_the_sweep_goes_on(
    sweep: Dict[str, Any], silent_server: str
) -> None:
    stderr = sweep["run"].stderr
    assert stderr.count("MLflow logging is off for this run") == 1, stderr
    assert "no answer within 2 s" in stderr and silent_server in stderr
    assert "Traceback" not in stderr
    assert len(sweep["records"]) == 4  # every cell ran and was recorded


@pytest.mark.slow
def test_no_process_of_the_sweep_is_left(sweep: Dict[str, Any]) -> None:
    assert pids_of(str(sweep["store"].root)) == []


@pytest.mark.slow
def test_a_healthy_run_records_each_rank_s_last_loss(healthy_run: Run) -> None:
    """The shared healthy run (gpt2-tiny, 1 and 2 ranks): a finite loss per rank."""
    store = ExperimentStore(healthy_run.experiment_dir)
    for record in training_records(store.records()):
        losses = [rank.last_loss for rank in record.per_rank]
        assert all(loss is not None and 0 < loss < 100 for loss in losses), losses
        assert record.last_loss == pytest.approx(sum(loss or 0.0 for loss in losses) / len(losses))


# --- deadlines ---------------------------------------------------------------------------------


def test_an_unreachable_server_is_found_before_the_first_cell(
    silent_server: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="torchscale"):
        sinks = Integrations(mlflow=silent_server, timeout_s=1.0).open("x", tmp_path, [])
    assert sinks == []
    assert time.monotonic() - started < 5  # the deadline, not MLflow's minutes of retries
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith(f"MLflow logging is off for this run ({silent_server}/health")
    assert "no answer within 1 s" in warning
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: refused at once
    refused = unreachable(f"http://127.0.0.1:{port}/health", 1.0)
    assert refused is not None and "refused" in refused.lower()


def test_the_sockets_own_timeout_says_the_same_as_the_deadline(
    silent_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """urlopen's socket timeout is the deadline's limit too: whichever fires first on a loaded
    host, the warning reads the same."""
    from torchscale.integrations import deadline

    monkeypatch.setattr(deadline, "call_with_deadline", lambda _t, function, *a: function(*a))
    assert unreachable(f"{silent_server}/health", 0.5) == "no answer within 0.5 s"


def test_a_sink_that_stops_answering_costs_the_deadline_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    calls: List[str] = []

    class Console:
        def cell_finished(self, cell: Any, records: Any, table: Any) -> None:
            calls.append("console")

    class Dead:
        name = "MLflow"
        remote = True

        def cell_finished(self, records: Any, table: Any) -> None:
            calls.append("sink")
            release.wait(60)  # a server that died mid-sweep

        def close(self, records: Any, table: Any) -> None:
            calls.append("closed")

    events = SinkEvents(Console(), [Dead()], timeout_s=0.5)  # type: ignore[arg-type]  # a stub console
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="torchscale"):
        for _ in range(4):
            events.cell_finished(None, [], object())  # type: ignore[arg-type]
        events.close([], object())  # type: ignore[arg-type]  # read by none
    spent = time.monotonic() - started
    release.set()
    assert calls == ["console", "sink", "console", "console", "console"]
    assert 0.5 <= spent < 2.0, spent
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("MLflow logging stopped (no answer within 0.5 s;")


def test_a_call_with_a_deadline_returns_or_raises_what_the_call_did() -> None:
    assert call_with_deadline(1.0, sum, [1, 2]) == 3
    with pytest.raises(ZeroDivisionError):
        call_with_deadline(1.0, lambda: 1 / 0)


def test_mlflow_file_uri_works_like_a_folder(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from torchscale.integrations.mlflow_runs import MlflowSink

    folder = tmp_path / "mlruns"
    sink = MlflowSink(folder.as_uri(), "file-uri", tmp_path, ["batch_sizes"])
    sink.abort()
    client = MlflowClient(tracking_uri=str(folder))
    experiment = client.get_experiment_by_name("file-uri")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == sink.parent_id and run.info.status == "KILLED"
    assert (folder / run.info.experiment_id).is_dir()


# --- the results folder, owned to the end ------------------------------------------------------


@pytest.mark.slow
def test_a_folder_deleted_mid_sweep_stops_it_with_one_line(
    deleted_folder_run: Dict[str, Any],
) -> None:
    """Made in the session's lanes (tests/support/process_fault_runs.py says why sharing the
    cores cannot change what is read here)."""
    assert deleted_folder_run["started"], "the first cell never started measuring"
    stderr, out = deleted_folder_run["stderr"], deleted_folder_run["out"]
    folder = out / "deleted"
    assert deleted_folder_run["returncode"] == 2, stderr
    line = one_error_line(stderr)
    # caught either after the deletion or in the middle of it (the lock file already gone)
    assert any(
        f"the results folder {folder} {what} while this torchscale was writing" in line
        for what in ("was deleted", "lost its lock (.lock was removed or replaced)")
    ), line
    assert "the sweep stopped" in line
    assert not folder.exists()  # never re-created with part of the results
    assert "> Running gpt2-tiny on 1 CPU process (batch 4" not in stderr  # the sweep stopped there
    assert pids_of(str(out)) == []


def test_a_folder_deleted_before_the_groups_first_cell_is_seen_starting_stops_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm group's first cell can be measuring before the launcher has read its start event
    (or its folder be gone with that event): the launch's very first poll already checks the
    folder. Here the launch is a stand-in that deletes the experiment's folder and then polls
    once, as ``run_process`` does while a launch runs; no cell was ever seen running."""
    from typer.testing import CliRunner

    import torchscale.launch.warm_groups as warm_groups
    from torchscale.cli.app import app

    def deleted_then_polled(argv: List[str], **kwargs: Any) -> None:
        shutil.rmtree(Path(kwargs["log_path"]).parents[2])  # groups/<group>/launch.log
        kwargs["on_poll"](0.2)
        raise AssertionError("the launch went on polling with its folder gone")

    monkeypatch.setattr(warm_groups, "run_process", deleted_then_polled)
    config = tmp_path / "c.yaml"
    config.write_text(DELETED)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["benchmark", "-c", str(config), "-o", str(out)])
    assert result.exit_code == 2, result.output
    line = one_error_line(result.stderr)
    assert f"the results folder {out / 'deleted'} was deleted while this torchscale" in line
    assert "the sweep stopped" in line
    assert not (out / "deleted").exists()


def test_every_write_checks_the_folder_is_still_the_locked_one(tmp_path: Path) -> None:
    from torchscale.results.schema import ResultBase

    record = ResultBase(kind="x", cell_id="c", experiment="e", status="ok", world_size=1,
                        nproc_per_node=1)  # fmt: skip
    store = ExperimentStore(tmp_path / "exp")
    with store.lock():
        store.append(record)
        store.lock_path.unlink()  # someone removed the lock: another sweep could take the folder
        with pytest.raises(FolderLostError, match="lost its lock"):
            store.append(record)
    with store.lock():
        shutil.rmtree(store.root)
        for write in (lambda: store.append(record), lambda: store.make_cell_dir("c")):
            with pytest.raises(FolderLostError, match="was deleted"):
                write()
        assert not store.root.exists()


@pytest.mark.slow
def test_a_file_size_limit_is_the_one_storage_line(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(DELETED.replace("deleted", "limited"))
    out = tmp_path / "out"
    command = " ".join(torchscale_cmd("benchmark", "-c", str(config), "-o", str(out)))
    done = subprocess.run(
        ["bash", "-c", f"ulimit -f 50 && exec {command}"],
        capture_output=True, text=True, env={**env_with_repo(), "PYTHONPATH": repo_pythonpath()},
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    line = one_error_line(done.stderr)
    assert line == (
        f"Error: cannot write to {out / 'limited'}: file too large for the file-size limit "
        "(ulimit -f?) (EFBIG)"
    )
    assert "> Running" not in done.stderr


# --- launchers' own words, where no exits file was written -------------------------------------

DATA = Path(__file__).parent / "data" / "launcher_logs"


def test_torchrun_and_mpirun_log_lines_name_how_each_rank_ended() -> None:
    torchrun = launcher_log_exits((DATA / "torchrun_sigkill.log").read_text())
    assert torchrun == {1: {"signal": 9}}
    mpirun = launcher_log_exits((DATA / "mpirun_signal.log").read_text())
    assert mpirun == {1: {"signal": 9}}
    assert launcher_log_exits((DATA / "mpirun_exit.log").read_text()) == {1: {"exitcode": 3}}


def test_srun_lines_name_how_each_task_ended() -> None:
    """srun's own lines, recorded from a real two-node Slurm step (task 1 killed, exiting 3;
    task 0 segfaulting; srun then ending the other task), and Slurm's other forms of the same
    line (``_task_finish`` in src/srun/launch.c): task ranges, a core dump, its memory limit."""
    from torchscale.launch.rank_exits import srun_task_ends

    killed = srun_task_ends((DATA / "srun_sigkill.log").read_text())
    assert killed == {
        1: {"signal": 9, "host": "gpu02", "said": "Killed", "order": 0},
        0: {"signal": 15, "host": "gpu01", "said": "Terminated", "order": 1},
    }
    exited = srun_task_ends((DATA / "srun_exit.log").read_text())
    assert exited[1] == {"exitcode": 3, "host": "gpu02", "said": "Exited with exit code 3",
                         "order": 0}  # fmt: skip
    crashed = srun_task_ends((DATA / "srun_segv.log").read_text())
    assert (crashed[0]["signal"], crashed[1]["signal"]) == (11, 15)
    other = srun_task_ends(
        "srun: error: gpu[01-02]: tasks 0-1,3: Out Of Memory\n"
        "srun: error: gpu05: task 4: Aborted (core dumped)\n"
        "srun: error: gpu06: task 5: Completed\n"  # not an end srun reports as an error
    )
    assert sorted(other) == [0, 1, 3, 4]
    assert other[3] == {"signal": 9, "oom": True, "host": "gpu[01-02]", "said": "Out Of Memory",
                        "order": 0}  # fmt: skip
    assert (other[4]["signal"], other[4]["said"]) == (6, "Aborted (core dumped)")


def test_torchruns_lines_under_srun_name_ranks_through_the_agents_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under srun's ``--label`` a torchrun line names its task and a local rank: the rank is
    the one the agent of that task started (c10d numbers the nodes, not srun)."""
    from torchscale.launch.rank_exits import srun_tasks
    from torchscale.launch.torchrun_agent import ExitLog

    monkeypatch.setenv("SLURM_PROCID", "1")
    log = ExitLog(str(tmp_path / "exits.compute.jsonl"))
    worker = subprocess.Popen(["true"])
    log.started(worker, {"RANK": "3", "LOCAL_RANK": "1"})
    worker.wait()
    placed = srun_tasks(tmp_path)
    assert placed == {(1, 1): 3}
    line = (DATA / "torchrun_sigkill.log").read_text()
    assert launcher_log_exits("1: " + line, placed) == {3: {"signal": 9}}
    assert launcher_log_exits("0: " + line, placed) == {}  # a task whose ranks nobody recorded
    assert launcher_log_exits(line) == {1: {"signal": 9}}  # one node: local rank = rank


def _srun_cell(tmp_path: Path, log: str) -> Path:
    """A 2-node srun launch where c10d gave srun task 0 (gpu01, host head) ranks 2 and 3 and
    task 1 (gpu02, host compute) ranks 0 and 1; task 1's torchrun went with its workers
    (its agent recorded their starts, no end); rank 2 lost its peer, rank 3 was stopped."""
    ranks = tmp_path / "ranks"
    ranks.mkdir(parents=True)
    (ranks / "rank2.error.json").write_text(json.dumps({
        "rank": 2, "host": "head", "kind": "error", "phase": "measure", "time": 100.0, **RESET,
    }))  # fmt: skip
    starts = {"head": [(2, 0, 0), (3, 1, 0)], "compute": [(0, 0, 1), (1, 1, 1)]}
    for host, workers in starts.items():
        lines = [{"event": "start", "rank": rank, "local_rank": local, "srun_task": task,
                  "pid": 10 + rank, "time": 90.0} for rank, local, task in workers]  # fmt: skip
        if host == "head":
            lines += [{"event": "end", "rank": 2, "pid": 12, "time": 100.02, "exitcode": 1},
                      {"event": "stop", "rank": 3, "pid": 13, "time": 100.1, "signal": 15},
                      {"event": "end", "rank": 3, "pid": 13, "time": 100.1, "signal": 15}]  # fmt: skip
        (tmp_path / f"exits.{host}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))
    (tmp_path / "launch.log").write_text(log)
    return tmp_path


def test_a_node_whose_torchrun_srun_saw_killed_is_the_cause(tmp_path: Path) -> None:
    from torchscale.launch.failure_cause import departures, failure_cause

    cell = _srun_cell(tmp_path / "killed", (DATA / "srun_sigkill.log").read_text())
    assert failure_cause(departures(cell, cell)) == ("failed", (
        "ranks 0, 1 on gpu02 ended with their node's torchrun, which srun reports as task 1: "
        "Killed, signal 9 (SIGKILL: the kernel's OOM killer?), before they reported a phase; "
        "rank 2 then lost its peer (RuntimeError: Connection reset by peer)"
    ))  # fmt: skip
    # Slurm's memory limit is an OOM for sure: the cell's status says so
    oom = _srun_cell(tmp_path / "oom", "srun: error: gpu02: task 1: Out Of Memory\n")
    status, reason = failure_cause(departures(oom, oom))
    assert status == "oom"
    assert reason.startswith(
        "ranks 0, 1 on gpu02 ended with their node's torchrun, which srun reports as task 1: "
        "Out Of Memory (Slurm's memory limit), before they reported a phase; rank 2 then"
    )


def test_a_rank_killed_without_a_time_is_the_cause_when_its_peer_only_lost_it(
    tmp_path: Path,
) -> None:
    """mpirun names the killed rank but not when: the peer's connection error is its sequel."""
    from torchscale.launch.failure_cause import departures, failure_cause

    ranks = tmp_path / "ranks"
    ranks.mkdir()
    (ranks / "rank0.error.json").write_text(json.dumps({
        "rank": 0, "host": "vm", "kind": "error", "type": "RuntimeError", "phase": "measure",
        "message": "[pair.cc:545] Read error: Connection reset by peer", "time": time.time(),
    }))  # fmt: skip
    shutil.copy(DATA / "mpirun_signal.log", tmp_path / "launch.log")
    status, reason = failure_cause(departures(tmp_path, None))
    assert status == "failed"
    assert reason == (
        "rank 1 was killed by signal 9 (SIGKILL: the kernel's OOM killer?) before it reported a "
        "phase; rank 0 then lost its peer (RuntimeError: Connection reset by peer)"
    )


def _cell(tmp_path: Path, errors: List[Dict[str, Any]], ends: List[Dict[str, Any]]) -> Path:
    """A cell folder with rank error files, progress files ('measure', step 3 of 4 run) and the
    agent's exits file, as a real launch leaves them."""
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for rank in (0, 1):
        (ranks / f"rank{rank}.progress.json").write_text(
            json.dumps({"rank": rank, "phase": "measure", "steps_before": 1, "time": 1.0})
        )
        (ranks / f"rank{rank}.steps").write_bytes(struct.pack("qq", 3, 1))  # step 3, forward
    for error in errors:
        doc = {"host": "vm", "kind": "error", "phase": "measure", **error}
        (ranks / f"rank{error['rank']}.error.json").write_text(json.dumps(doc))
    (tmp_path / "exits.vm.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ends))
    return tmp_path


RESET = {"type": "RuntimeError", "message": "[pair.cc:545] Read error: Connection reset by peer"}


def test_a_silent_exit_seen_just_after_its_peer_lost_it_is_the_cause(tmp_path: Path) -> None:
    """Recorded: rank 0's error file 4 ms before the agent saw rank 1's os._exit(0): an exit
    closes its sockets before its parent hears of it."""
    from torchscale.launch.failure_cause import departures, failure_cause

    cell = _cell(
        tmp_path,
        [{"rank": 0, "time": 100.000, **RESET}],
        [{"event": "end", "rank": 1, "pid": 7, "time": 100.004, "exitcode": 0},
         {"event": "end", "rank": 0, "pid": 6, "time": 103.2, "signal": 15}],
    )  # fmt: skip
    status, reason = failure_cause(departures(cell, cell, stopped_at=103.0))
    assert (status, reason) == ("failed", (
        "rank 1 exited with code 0 in measure at step 2 (forward) without reporting an error "
        "(os._exit or sys.exit in the model's code?); rank 0 then lost its peer (RuntimeError: "
        "Connection reset by peer)"
    ))  # fmt: skip


def test_ranks_torchrun_stopped_after_a_failure_are_not_causes(tmp_path: Path) -> None:
    from torchscale.launch.failure_cause import departures, failure_cause

    cell = _cell(
        tmp_path,
        [{"rank": 1, "time": 100.0, "type": "ValueError", "message": "bad batch"}],
        [{"event": "end", "rank": 1, "pid": 7, "time": 100.01, "exitcode": 1},
         {"event": "stop", "rank": 0, "pid": 6, "time": 100.1, "signal": 15},
         {"event": "end", "rank": 0, "pid": 6, "time": 100.1, "signal": 15}],
    )  # fmt: skip
    assert failure_cause(departures(cell, cell)) == (
        "failed",
        "rank 1 on vm failed in measure at step 2 (forward): ValueError: bad batch",
    )


def test_every_reader_drops_a_diverged_cell(tmp_path: Path) -> None:
    """A results file whose record has a NaN loss (as a hand edit or an older writer may hold
    it): invalid when read, so compare never compares it and tune never prefers it."""
    from typer.testing import CliRunner

    from tests.support.report_fixtures import FixtureSpec, write_experiment
    from torchscale.cli.app import app
    from torchscale.results.validity import checked_record
    from torchscale.tune.trials import objective

    spec = FixtureSpec(name="diverged", batch_sizes=(32,), gpu_counts=(1, 2), failures=False,
                       collectives=False, findings=False)  # fmt: skip
    folder = write_experiment(tmp_path / "d", spec)
    lines = (folder / "results.jsonl").read_text().splitlines()
    documents = [json.loads(line) for line in lines]
    documents[0]["per_rank"][0]["last_loss"] = float("nan")  # json.dumps writes NaN
    (folder / "results.jsonl").write_text("".join(json.dumps(d) + "\n" for d in documents))
    records = ExperimentStore(folder).records()
    assert records[0].status == "invalid"
    assert "the loss diverged (last loss: rank 0 NaN)" in (records[0].error or "")
    assert objective(records[0]) is None and objective(checked_record(records[0])) is None
    result = CliRunner().invoke(app, ["compare", str(folder), str(folder), "--json"])
    assert result.exit_code == 0, result.output
    compared = {cell["cell_id_new"] for cell in json.loads(result.stdout)["cells"]}
    assert records[0].cell_id not in compared and len(compared) == len(documents) - 1
