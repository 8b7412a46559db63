"""A hostile world: each fault is made for real and torchscale must keep its word.

Planted links, a real SIGKILL of a real sweep, runs whose cells failed, a billion-laughs YAML, a
tmpfs that fills in the middle of a sweep, impossible figures in results, duplicate keys, a FIFO
where a trace should be. docs/faults.md lists them with the test that makes each one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Literal

import psutil
import pytest
from typer.testing import CliRunner

from tests.support.environ import REPO, repo_pythonpath
from tests.support.full_disk_run import fill, mount_tmpfs, unmount
from tests.support.report_fixtures import FixtureSpec, write_experiment
from tests.support.typed import training_records
from torchscale.cli.app import app
from torchscale.errors import TorchscaleError
from torchscale.launch.liveness import ProcessIdentity, live_owner, write_owner
from torchscale.results.files import (
    UnsafePathError,
    append_jsonl,
    atomic_write_json,
    dumps,
    open_for_write,
)
from torchscale.results.layout import OWNER_FILE, experiment_dirname
from torchscale.results.schema import TrainingResult
from torchscale.results.store import ExperimentStore

runner = CliRunner()

# Cells that ask for more GPUs than any test machine has are recorded as skipped without a
# launch: a run of them exercises the whole sweep (lock, manifest, records) in a second.
SKIPPED_CONFIG = """\
experiment_name: {name}
models: [gpt2-tiny]
batch_sizes: [4]
gpu_counts: [64]
warmup_steps: 2
measure_steps: 8
"""


def env_with_repo() -> Dict[str, str]:
    return {**os.environ, "PYTHONPATH": repo_pythonpath()}


def torchscale_cmd(*args: str) -> List[str]:
    return [sys.executable, "-m", "torchscale", *args]


MEASURE = """\
import json, resource, subprocess, sys, time
start = time.monotonic()
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
elapsed = time.monotonic() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": proc.returncode, "elapsed_s": elapsed,
                  "max_rss_mb": usage.ru_maxrss / 1024, "stderr": proc.stderr[-4000:]}))
"""


def measured(*args: str, timeout: float = 120) -> dict:
    """Run ``torchscale args`` under a fresh parent that reports its exit code, wall time and peak
    RSS (``getrusage(RUSAGE_CHILDREN).ru_maxrss``: the parent has no other child, so the figure
    is this command's alone)."""
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, *torchscale_cmd(*args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env_with_repo(),
    )
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def dry_run_clock() -> float:
    """The wall time of a valid one-file ``--dry-run`` here and now: the outside clock that a
    refusal's time is held against (an absolute limit would measure the host, not the code)."""
    run = measured("benchmark", "-c", str(REPO / "examples" / "cpu_smoke.yaml"), "--dry-run")
    assert run["rc"] == 0, run
    return float(run["elapsed_s"])


def wait_for(predicate: Callable[[], bool], timeout: float, poll: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return predicate()


def one_error_line(stderr: str) -> str:
    """The error line; there must be exactly one and no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, stderr
    return lines[0]


def pids_of(needle: str) -> List[int]:
    """Live (not zombie) processes whose command line mentions ``needle``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(needle in part for part in proc.info["cmdline"] or []):
            found.append(proc.pid)
    return found


# --- 1. links: never written through ------------------------------------------------------------


@pytest.mark.parametrize("name", [".lock", "results.jsonl", "summary.csv", "manifest.json"])
def test_a_planted_link_is_refused_and_its_target_unchanged(tmp_path: Path, name: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(SKIPPED_CONFIG.format(name="planted"))
    folder = tmp_path / "out" / "planted"
    folder.mkdir(parents=True)
    target = tmp_path / "precious.txt"
    target.write_text("precious\n")
    (folder / name).symlink_to(target)
    result = runner.invoke(
        app, ["benchmark", "-c", str(config), "-o", str(tmp_path / "out"), "--resume"]
    )
    assert result.exit_code == 2, result.output
    line = one_error_line(result.stderr)
    assert "symbolic link" in line and name in line
    assert target.read_text() == "precious\n"
    assert (folder / name).is_symlink()


def test_a_planted_cell_folder_link_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(SKIPPED_CONFIG.format(name="cellink").replace("[64]", "[1]"))
    out = tmp_path / "out"
    plan = json.loads(
        runner.invoke(
            app, ["benchmark", "-c", str(config), "-o", str(out), "--dry-run", "--json"]
        ).stdout
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "cell.json").write_text("precious\n")
    cells = out / "cellink" / "cells"
    cells.mkdir(parents=True)
    (cells / plan[0]["cell_id"]).symlink_to(elsewhere, target_is_directory=True)
    result = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert "symbolic link" in one_error_line(result.stderr)
    assert [p.name for p in elsewhere.iterdir()] == ["cell.json"]
    assert (elsewhere / "cell.json").read_text() == "precious\n"


def test_every_writer_refuses_links_and_fifos(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("precious\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        append_jsonl(link, {"a": 1})
    with pytest.raises(UnsafePathError, match="symbolic link"):
        atomic_write_json(link, {"a": 1})
    with pytest.raises(UnsafePathError, match="symbolic link"):
        open_for_write(link, append=True)
    assert target.read_text() == "precious\n" and link.is_symlink()

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    outcome: Dict[str, BaseException] = {}

    def write() -> None:  # a FIFO without a reader would block a plain open() forever
        try:
            append_jsonl(fifo, {"a": 1})
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "writing to a FIFO blocked"
    assert isinstance(outcome.get("error"), UnsafePathError) and "FIFO" in str(outcome["error"])


def test_the_experiment_folder_itself_may_be_a_link(tmp_path: Path) -> None:
    """Pointing results at scratch space with a link is the user's choice: only what torchscale
    creates inside the experiment folder must not be a link."""
    (tmp_path / "scratch").mkdir()
    (tmp_path / "exp").symlink_to(tmp_path / "scratch", target_is_directory=True)
    store = ExperimentStore(tmp_path / "exp")
    with store.lock():
        cell = store.make_cell_dir("cell-1")
        atomic_write_json(cell / "cell.json", {"a": 1})
    assert (tmp_path / "scratch" / "cells" / "cell-1" / "cell.json").exists()


def test_the_lock_is_flock_on_a_regular_file(tmp_path: Path) -> None:
    store = ExperimentStore(tmp_path / "exp")
    with store.lock():
        assert store.lock_path.is_file() and not store.lock_path.is_symlink()
        other = subprocess.run(
            [sys.executable, "-c", LOCK_AGAIN, str(store.root)],
            capture_output=True,
            text=True,
            env=env_with_repo(),
            timeout=60,
        )
        assert other.returncode == 3 and "is in use by torchscale" in other.stdout
    store.lock_path.unlink()
    os.mkfifo(store.lock_path)
    with pytest.raises(UnsafePathError, match="FIFO"), store.lock():
        pass


LOCK_AGAIN = """\
import sys
from pathlib import Path
from torchscale.errors import TorchscaleError
from torchscale.results.store import ExperimentStore
try:
    with ExperimentStore(Path(sys.argv[1])).lock():
        sys.exit(0)
except TorchscaleError as exc:
    print(exc)
    sys.exit(3)
"""


# --- 2. nothing left running ---------------------------------------------------------------------

HANG_CONFIG = """\
experiment_name: killed
models: ["tests.support.fault_models:hang_model"]
batch_sizes: [4]
gpu_counts: [2]
warmup_steps: 1
measure_steps: 6
sync_probe_steps: 2
cell_timeout_s: 600
"""


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.slow
@pytest.mark.timed(alone=False)  # the cell's processes gone within 5 s of the SIGKILL
def test_sigkill_of_a_sweep_leaves_no_process_and_resume_refuses_a_live_owner(
    tmp_path: Path, sleeper: subprocess.Popen
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(HANG_CONFIG)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        torchscale_cmd("benchmark", "-c", str(config), "-o", str(out)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env_with_repo(),
    )
    cells = out / "killed" / "cells"
    try:
        # The hang model stops rank 1 after two forward calls: wait until both ranks are in.
        def hung() -> bool:
            return any(cells.glob(f"*/{OWNER_FILE}")) and any(cells.glob("*/ranks/rank1.steps"))

        assert wait_for(hung, 120), "the cell never started"
        (cell_dir,) = cells.iterdir()
        assert wait_for(lambda: len(pids_of(str(cell_dir))) >= 3, 60)  # torchrun + 2 ranks
        before = pids_of(str(cell_dir))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    started = time.monotonic()
    gone = wait_for(lambda: not pids_of(str(cell_dir)), 5.0)
    left = pids_of(str(cell_dir))
    for pid in left:  # never leave them to the next test
        psutil.Process(pid).kill()
    assert gone, f"processes of the cell outlived torchscale by 5 s: {left} (were {before})"
    print(f"cell processes gone {time.monotonic() - started:.2f} s after the SIGKILL")

    # The owner file of the killed run names a dead torchrun: it blocks nothing.
    assert (cell_dir / OWNER_FILE).exists() and live_owner(cell_dir) is None
    # A live process owning the cell (as an orphan of an older torchscale would) blocks resume.
    write_owner(cell_dir, sleeper.pid, "torchrun")
    args = ["benchmark", "-c", str(config), "-o", str(out), "--resume"]
    refused = subprocess.run(
        torchscale_cmd(*args), capture_output=True, text=True, env=env_with_repo(), timeout=120
    )
    assert refused.returncode == 2, refused.stderr
    line = one_error_line(refused.stderr)
    assert f"torchrun pid {sleeper.pid}" in line and cell_dir.name in line
    assert "> Running" not in refused.stderr
    sleeper.kill()
    sleeper.wait()
    resumed = subprocess.run(
        torchscale_cmd(*args, "--set", "cell_timeout_s=3"),
        capture_output=True,
        text=True,
        env=env_with_repo(),
        timeout=300,
    )
    assert resumed.returncode == 1, resumed.stderr  # it ran: the hang is recorded as a timeout
    (record,) = ExperimentStore(out / "killed").records()
    assert record.status == "timeout" and not (cell_dir / OWNER_FILE).exists()
    assert record.error is not None
    assert record.error.startswith("no result after 3 s: "), record.error  # cell_timeout_s


def test_an_owner_whose_pid_was_reused_is_not_alive(tmp_path: Path, sleeper: subprocess.Popen):
    write_owner(tmp_path, sleeper.pid, "torchrun")
    init = ProcessIdentity.of(1)
    assert init is not None
    assert live_owner(tmp_path) == f"torchrun pid {sleeper.pid} on {init.host}"
    doc = json.loads((tmp_path / OWNER_FILE).read_text())
    doc["start"] -= 1  # same pid, another process
    (tmp_path / OWNER_FILE).write_text(json.dumps(doc))
    assert live_owner(tmp_path) is None


ORPHAN = """\
import os, subprocess, sys, time
code = "from torchscale.launch.liveness import watch_parent; watch_parent(); import time; time.sleep(600)"
child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""

LAUNCHER = """\
import sys
from torchscale.launch.process import run_process
run_process(["sleep", "600"], timeout_s=None, on_start=lambda pid: print(pid, flush=True))
"""


@pytest.mark.parametrize(
    "script", [ORPHAN, LAUNCHER], ids=["worker-watchdog", "launcher-pdeathsig"]
)
def test_a_child_dies_within_5_s_of_its_sigkilled_parent(script: str) -> None:
    """Each mechanism alone: a worker (own session) watching its parent, and a launcher that the
    kernel kills with torchscale (``PR_SET_PDEATHSIG``)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env_with_repo()
    )
    assert parent.stdout is not None
    try:
        child = int(parent.stdout.readline())
        time.sleep(0.5)  # the watchdog is up
        assert psutil.pid_exists(child)
        parent.kill()
        parent.wait()

        def alive() -> bool:
            return (
                psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE
            )

        gone = wait_for(lambda: not alive(), 5.0)
        if not gone:
            psutil.Process(child).kill()
        assert gone, "the child outlived its parent by 5 s"
    finally:
        if parent.poll() is None:
            parent.kill()


# --- 3. compare: a cell that stopped running is a failure -----------------------------------------

SMALL: Any = {
    "batch_sizes": (32,),
    "gpu_counts": (1, 2, 4),
    "failures": False,
    "collectives": False,
    "findings": False,
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    root = tmp_path_factory.mktemp("faults-compare")
    base = write_experiment(root / "base", FixtureSpec(name="nightly", **SMALL))
    # The new run: the same measurements, but one cell failed, one timed out and one is gone.
    new_root = root / "new" / experiment_dirname("nightly")
    new_root.mkdir(parents=True)
    shutil.copy(base / "manifest.json", new_root / "manifest.json")
    records = training_records(ExperimentStore(base).records())
    lost: Dict[str, str] = {}
    store = ExperimentStore(new_root)
    for record in records:
        key = (record.model, record.world_size)
        if record.world_size == 2 and record.model not in lost:
            status: Literal["failed", "timeout"] = "failed" if not lost else "timeout"
            lost[record.model] = status
            record = TrainingResult(
                **{
                    k: v
                    for k, v in record.model_dump().items()
                    if k in TrainingResult.model_fields and k in FAILED_FIELDS
                },
                status=status,
                error=f"rank 1 {status}",
            )
        elif key == (records[-1].model, 4):
            continue  # missing
        store.append(record)
    return {"base": base, "new": new_root, "lost": lost}


FAILED_FIELDS = {
    "cell_id", "experiment", "world_size", "nnodes", "nproc_per_node", "hosts", "repeat",
    "settings", "model", "batch_size", "grad_accum_steps", "global_batch_size", "precision",
}  # fmt: skip


def test_compare_fails_when_a_cell_failed_timed_out_or_went_missing(runs: Dict) -> None:
    result = runner.invoke(app, ["compare", str(runs["base"]), str(runs["new"]), "--json"])
    assert result.exit_code == 1, result.stderr
    document = json.loads(result.stdout, parse_constant=_no_constant)
    assert document["passed"] is False and document["lost"] == 3
    verdicts = {(c["model"], c["world_size"]): c["verdict"] for c in document["cells"]}
    first, second = FixtureSpec().models[0].name, FixtureSpec().models[1].name
    assert verdicts[(first, 2)] == "failed" and verdicts[(second, 2)] == "timeout"
    assert verdicts[(second, 4)] == "missing"
    assert verdicts[(first, 1)] == "unchanged"
    assert document["only_in_baseline"] == []  # lost cells are not "only in the baseline"
    assert "No regression" not in result.stderr
    assert "3 cell(s) measured in the baseline were not measured in the new run" in result.stderr
    table = result.stderr
    for verdict in ("failed", "timeout", "missing", "unchanged"):
        assert f"│ {verdict}" in table or f" {verdict} │" in table, table
    assert "[]" not in table


def test_compare_verdict_column_has_no_stray_markup(runs: Dict) -> None:
    result = runner.invoke(app, ["compare", str(runs["base"]), str(runs["base"])])
    assert result.exit_code == 0
    assert "unchanged" in result.stderr and "[]unchanged" not in result.stderr


def _no_constant(name: str) -> None:
    raise AssertionError(f"not strict JSON: {name}")


# --- 4 and 7. bounded config loading ---------------------------------------------------------------

LAUGHS = (
    "experiment_name: laughs\n"
    + "".join(
        f"{name}: &{name} [{', '.join([f'*{prev}'] * 9 if prev else ['lol'] * 9)}]\n"
        for prev, name in zip([None, *"abcdefgh"], "abcdefghi")
    )
    + "models: *i\n"
)


@pytest.mark.timed(alone=False)  # its time against a dry run's, both here and now
def test_billion_laughs_is_refused_fast_in_little_memory(
    tmp_path: Path, dry_run_clock: float
) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text(LAUGHS)
    assert len(LAUGHS) < 1200  # a 1 KB file that expands to 9^9 = 387,420,489 strings
    run = measured("benchmark", "-c", str(path), "--dry-run")
    assert run["rc"] == 2, run
    line = one_error_line(run["stderr"])
    assert "aliases" in line and len(line) < 400
    # expanded, the aliases would take minutes and gigabytes: refused, no slower than a valid
    # config's dry run, within this host's noise
    assert run["elapsed_s"] < 2 * dry_run_clock + 0.5, (run, dry_run_clock)
    assert run["max_rss_mb"] < 300, run


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        ("models: [gpt2-tiny]\nbatch_sizes: [4]\nmodels: [bert-tiny]\n", "models", 3),
        (
            "models: [gpt2-tiny]\nddp:\n  bucket_cap_mb: 25\n  bucket_cap_mb: 50\n",
            "bucket_cap_mb",
            4,
        ),
    ],
)
def test_duplicate_keys_are_an_error_naming_key_and_line(tmp_path: Path, text, key, line) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["benchmark", "-c", str(path), "--dry-run"])
    assert result.exit_code == 2
    error = one_error_line(result.stderr)
    assert f"duplicate key '{key}'" in error and f"line {line}" in error


def test_a_merge_key_override_is_not_a_duplicate(tmp_path: Path) -> None:
    path = tmp_path / "merge.yaml"
    path.write_text(
        "base: &base {bucket_cap_mb: 25, gradient_as_bucket_view: true}\n"
        "models: [gpt2-tiny]\nddp:\n  <<: *base\n  bucket_cap_mb: 50\n"
    )
    from torchscale.config.loader import read_yaml

    assert read_yaml(path)["ddp"] == {"bucket_cap_mb": 50, "gradient_as_bucket_view": True}


def test_errors_echo_at_most_200_characters_of_input(tmp_path: Path) -> None:
    path = tmp_path / "long.yaml"
    path.write_text(f"models: [gpt2-tiny]\nbatch_sizes: {'x' * 500_000}\n{'y' * 1000}: 1\n")
    result = runner.invoke(app, ["benchmark", "-c", str(path), "--dry-run"])
    assert result.exit_code == 2
    line = one_error_line(result.stderr)
    assert "xxxx" in line and "yyyy" in line  # both errors are named...
    assert "x" * 201 not in line and "y" * 201 not in line  # ...quoting 200 characters at most
    assert len(line) < 1000
    big = tmp_path / "big.yaml"
    big.write_text("models: [gpt2-tiny]\n" + "# padding\n" * 200_000)
    result = runner.invoke(app, ["benchmark", "-c", str(big), "--dry-run"])
    assert result.exit_code == 2 and "larger than" in one_error_line(result.stderr)


MILLIONS = """\
experiment_name: millions
models: [gpt2-tiny, gpt2]
batch_sizes: [{batches}]
gpu_counts: [1]
ddp:
  bucket_cap_mb: [{buckets}]
"""


def millions(tmp_path: Path) -> Path:
    path = tmp_path / "millions.yaml"
    path.write_text(
        MILLIONS.format(
            batches=", ".join(map(str, range(1, 1001))),
            buckets=", ".join(map(str, range(1, 1001))),
        )
    )
    return path


@pytest.mark.timed(alone=False)  # its time against a dry run's, both here and now
def test_the_matrix_cap_is_checked_before_anything_is_expanded(
    tmp_path: Path, dry_run_clock: float
) -> None:
    path = millions(tmp_path)  # 2 x 1000 x 1000 = 2,000,000 cells
    run = measured("benchmark", "-c", str(path), "--dry-run")
    assert run["rc"] == 2, run
    line = one_error_line(run["stderr"])
    assert "2,000,000 cells" in line and "--max-cells" in line
    # expanding two million cells takes minutes: refused as fast as a valid config's dry run
    assert run["elapsed_s"] < 2 * dry_run_clock + 0.5, (run, dry_run_clock)
    assert run["max_rss_mb"] < 300, run
    as_json = runner.invoke(app, ["benchmark", "-c", str(path), "--dry-run", "--json"])
    assert as_json.exit_code == 2 and as_json.stdout == ""  # nothing half-written on stdout


@pytest.mark.timed(alone=False)  # the first cells within 30 s
def test_dry_run_streams_a_plan_it_never_holds(tmp_path: Path) -> None:
    path = millions(tmp_path)
    proc = subprocess.Popen(
        torchscale_cmd(
            "benchmark", "-c", str(path), "--dry-run", "--json", "--max-cells", "2000000"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env_with_repo(),
    )
    try:
        assert proc.stdout is not None
        started = time.monotonic()
        lines = [proc.stdout.readline() for _ in range(2000)]
        first_cells_s = time.monotonic() - started
        rss_mb = psutil.Process(proc.pid).memory_info().rss / 2**20
        assert proc.poll() is None  # still printing: the plan streams
    finally:
        proc.kill()
        proc.wait()
    assert lines[0] == b"[\n" and b'"cell_id": "gpt2-tiny-b1-g1-fp32-r0-' in b"".join(lines)
    assert first_cells_s < 30 and rss_mb < 300, (first_cells_s, rss_mb)


# --- 5. a full or read-only disk --------------------------------------------------------------------


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[Path, str], Path]]:
    """Mount a small tmpfs where a test asks (root only; skipped where mounting is not allowed)."""
    mounted: List[Path] = []

    def mount(where: Path, options: str) -> Path:
        reason = mount_tmpfs(where, options)
        if reason is not None:
            pytest.skip(reason)
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        unmount(where)


@pytest.mark.slow
def test_a_disk_that_fills_mid_sweep(full_disk_run: Dict[str, Any]) -> None:
    """Made in the session's lanes (tests/support/full_disk_run.py, which says why sharing the
    cores cannot change what is read here)."""
    run = full_disk_run
    stderr, root = run["stderr"], run["root"]
    assert run["returncode"] == 1, stderr
    line = one_error_line(stderr)
    assert f"cannot write to {root}: no space left on device (ENOSPC)" in line
    assert "died of it and is recorded as failed" in line and "--resume" in line
    assert stderr.count("> Running") == 2  # the sweep stopped: the third cell never started
    assert run["results"].startswith(run["first"])
    ok, died = run["records"]
    assert ok.status == "ok" and ok.batch_size == 2
    assert died.status == "failed" and died.batch_size == 4
    assert died.error is not None
    assert "no space left on device" in died.error and "OOM" not in died.error
    assert not pids_of(str(run["out"]))


def test_a_full_disk_before_the_sweep_is_one_line_exit_2(tmp_path: Path, tmpfs) -> None:
    out = tmpfs(tmp_path / "out", "size=1m")
    (out / "full").mkdir()
    fill(out)
    config = tmp_path / "c.yaml"
    config.write_text(SKIPPED_CONFIG.format(name="full"))
    result = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert "no space left on device (ENOSPC)" in one_error_line(result.stderr)


def test_a_read_only_results_folder_is_one_line_exit_2(tmp_path: Path, tmpfs) -> None:
    out = tmp_path / "out"
    tmpfs(out / "ro", "size=1m,ro")
    config = tmp_path / "c.yaml"
    config.write_text(SKIPPED_CONFIG.format(name="ro"))
    result = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(out), "--resume"])
    assert result.exit_code == 2, result.output
    line = one_error_line(result.stderr)
    assert f"cannot write to {out / 'ro'}: read-only file system (EROFS)" in line


# --- 6. impossible figures ---------------------------------------------------------------------------


def poisoned(root: Path, *, keep_valid: bool) -> Path:
    """An experiment whose records claim NaN, negative and infinite figures."""
    folder = write_experiment(root, FixtureSpec(name="poisoned", **SMALL))
    documents = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    documents[0]["throughput"] = float("nan")
    documents[1]["throughput"] = -5000.0
    documents[2]["step_time_ms"]["p95"] = float("inf")
    documents[3]["step_times_ms"][4] = float("-inf")
    documents[4]["schema_version"] = 99
    if not keep_valid:
        for doc in documents:
            doc["throughput"] = 0.0
    # json.dumps writes NaN and Infinity, as a damaged or hand-edited file may hold them.
    (folder / "results.jsonl").write_text("".join(json.dumps(d) + "\n" for d in documents))
    return folder


def test_impossible_figures_make_records_invalid_never_headlined(tmp_path: Path, caplog) -> None:
    from torchscale.analysis.report_data import load_report_data
    from torchscale.app.report import report_content

    folder = poisoned(tmp_path / "p", keep_valid=True)
    data = load_report_data(folder)
    by_status: Dict[str, List] = {}
    for record in data.records:
        by_status.setdefault(record.status, []).append(record)
    assert len(by_status["invalid"]) == 4
    reasons = " | ".join(r.error for r in by_status["invalid"])
    for text in ("throughput is NaN", "throughput is -5000", "step_time_ms.p95 is Infinity"):
        assert text in reasons
    assert "step_times_ms[4] is -Infinity" in reasons
    assert "schema_version 99" in caplog.text
    cards = {card.label: card for card in report_content(data).cards}
    measured_card = cards["Training cells measured"]
    assert measured_card.value == f"{len(by_status['ok'])} / {len(data.records)}"
    assert "4 invalid" in measured_card.detail
    best = max(r.throughput for r in by_status["ok"])
    (highest,) = [c for label, c in cards.items() if label.startswith("Highest throughput")]
    assert float(highest.value.replace(",", "")) == pytest.approx(best, rel=0.01)

    result = runner.invoke(app, ["compare", str(folder), str(folder), "--json"])
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout, parse_constant=_no_constant)
    assert len(document["cells"]) == len(by_status["ok"])  # the invalid ones are not compared


def test_all_invalid_input_exits_2(tmp_path: Path) -> None:
    folder = poisoned(tmp_path / "p", keep_valid=False)
    for args in (["report", "-s", str(folder)], ["compare", str(folder), str(folder)]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert "every record under" in one_error_line(result.stderr)


def test_json_output_is_strict() -> None:
    text = dumps({"a": float("nan"), "b": [float("inf"), -float("inf"), 1.5]})
    assert json.loads(text, parse_constant=_no_constant) == {"a": None, "b": [None, None, 1.5]}


# --- 8. traces that are not files ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link"])
def test_profile_analyze_refuses_what_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "trace.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    run = measured("profile", "analyze", str(path), timeout=60)
    assert run["rc"] == 2, run
    line = one_error_line(run["stderr"])
    assert "not a regular file" in line and ("FIFO" in line or "character device" in line)


def test_one_unterminated_event_keeps_memory_bounded(tmp_path: Path) -> None:
    path = tmp_path / "rank0.json"
    with open(path, "wb") as handle:
        handle.write(b'{"traceEvents": [{"name": "')
        handle.truncate(2 << 30)  # 2 GiB, sparse: one event that never ends
    run = measured("profile", "analyze", str(path), timeout=300)
    assert run["rc"] == 2, run
    assert "no complete event" in one_error_line(run["stderr"])
    assert run["max_rss_mb"] < 400, run  # measured: ~200 MB, most of it the imports


# --- 9. resume after the settings changed ----------------------------------------------------------


def test_resume_after_settings_changed_is_refused_unless_forced(tmp_path: Path) -> None:
    from torchscale.analysis.report_data import load_report_data
    from torchscale.app.report import report_content

    config = tmp_path / "c.yaml"
    config.write_text(SKIPPED_CONFIG.format(name="changed"))
    out = tmp_path / "out"
    args = ["benchmark", "-c", str(config), "-o", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    store = ExperimentStore(out / "changed")
    before = store.results_path.read_text()

    changed = [*args, "--resume", "--set", "measure_steps=30"]
    refused = runner.invoke(app, changed)
    assert refused.exit_code == 2
    line = one_error_line(refused.stderr)
    assert "settings changed" in line and "measure_steps 8 -> 30" in line
    assert "gpt2-tiny-b4-g64-fp32-r0-" in line and "--resume --force" in line
    assert store.results_path.read_text() == before

    forced = runner.invoke(app, [*changed, "--force"])
    assert forced.exit_code == 0, forced.output
    old, new = store.records()
    assert old.settings["measure_steps"] == 8 and new.settings["measure_steps"] == 30
    (change,) = store.manifest()["runs"][-1]["changed_settings"]
    assert change["changes"] == ["measure_steps 8 -> 30"]
    headlines = report_content(load_report_data(store.root)).headlines
    assert any("--resume --force" in h and "measure_steps 8 -> 30" in h for h in headlines)
    assert runner.invoke(app, [*args, "--force"]).exit_code == 2  # --force alone means nothing


def test_storage_error_names_folder_and_cause() -> None:
    from torchscale.results.files import StorageError, storage_cause

    cause = storage_cause(OSError(28, "No space left on device"))
    error = StorageError(Path("/r/exp"), cause or "", exit_code=1)
    assert str(error) == "cannot write to /r/exp: no space left on device (ENOSPC)"
    assert isinstance(error, TorchscaleError) and error.exit_code == 1
    assert storage_cause(OSError(2, "nope")) is None


def test_every_test_the_faults_page_names_exists() -> None:
    """docs/faults.md names the test that makes each fault: each is a test of the suite."""
    import re

    tests = Path(__file__).parent
    page = (tests.parent / "docs" / "faults.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(?:tests/test_\w+\.py::)?(test_\w+)", page))
    defined = {
        name
        for path in tests.glob("test_*.py")
        for name in re.findall(r"^def (test_\w+)", path.read_text(encoding="utf-8"), re.M)
    }
    assert len(named) > 50
    assert sorted(named - defined) == []
