"""Shared test setup: a wide, plain console so CLI output is stable to assert on, and the real
runs and fixture experiments that several test modules read, each made once per session."""

from __future__ import annotations

import contextlib
import os
import re

# Rich reads COLUMNS when it is not writing to a terminal; pin it before torchscale is imported.
os.environ["COLUMNS"] = "200"
os.environ.setdefault("NO_COLOR", "1")
# The suite tests the CPU (gloo) path, the same on any machine; the GPU path is checked on a GPU
# node by benchmarks/gpu_truth.py (docs/perf-gpu.md) and here through NVML recorded on a real H100.
# So torch in this process and in every process it launches sees no GPU, even on a GPU node.
os.environ["CUDA_VISIBLE_DEVICES"] = ""

from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    ContextManager,
    Dict,
    Iterator,
    List,
    Optional,
    Tuple,
)

import pytest
from typer import rich_utils

if TYPE_CHECKING:  # the support modules import torchscale: loaded when a fixture is first used
    from tests.support.chromium_cdp import Chromium
    from tests.support.shared_runs import ProfileRun, Run
    from tests.support.sweep_records import SweepRun


@pytest.fixture(autouse=True, scope="session")
def setup_terminal() -> None:
    rich_utils.MAX_WIDTH = 200
    rich_utils.FORCE_TERMINAL = False


def _nvml_gpu_count() -> int:
    """GPUs the real NVML sees (0 without a driver): hiding CUDA from torch does not hide them."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library: a CPU-only machine
        return 0


NVML_GPUS = _nvml_gpu_count()


LAUNCHING_FIXTURES = frozenset(
    {
        "healthy_run",
        "projection_run",
        "own_script_run",
        "comm_sweep_run",
        "use_case_profile",
        "session_runs",
    }
)
"""The session fixtures below that launch torchrun: a test that takes one, even through another
fixture, is ``slow`` whether or not it says so, so ``-m "not slow"`` never launches."""


def _in_background(item: pytest.Item) -> bool:
    """A fast test that reads no time: the background worker's (tests/support/machine_share.py);
    every other test runs in the foreground, a ``timed`` one with the machine to itself where
    :func:`_alone` says so."""
    return item.get_closest_marker("slow") is None and item.get_closest_marker("timed") is None


def _alone(item: pytest.Item) -> bool:
    """A ``timed`` test takes the machine to itself unless it says ``timed(alone=False)``: it
    reads only a time bound, or two clocks over the same steps, which the background's
    idle-class tests (preempted as soon as a rank wants the core) cannot move."""
    mark = item.get_closest_marker("timed")
    return mark is not None and bool(mark.kwargs.get("alone", True))


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    for item in items:
        if LAUNCHING_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        from tests.support import machine_share

        factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
        groups = {item.nodeid: _in_background(item) for item in items}
        machine_share.write_groups(factory.getbasetemp().parent, groups)
    skip = pytest.mark.skip(
        reason=f"asserts a CPU-only node's answers; NVML sees {NVML_GPUS} GPU(s) here"
    )
    for item in items:
        if NVML_GPUS and item.get_closest_marker("cpu_only_node"):
            item.add_marker(skip)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The foreground's tests on one worker, the background's on the other."""
    from tests.support.machine_share import two_workers

    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
    return two_workers(config, log, factory.getbasetemp())


def _compile_package() -> None:
    """torchscale's bytecode, written once before any process of the session imports it.

    Where ``PYTHONDONTWRITEBYTECODE`` is set (this machine's image sets it) no interpreter writes
    ``__pycache__``, so each of the session's ~400 processes (the ``torchscale`` commands, the
    torchrun agents, the pytest workers) compiled the modules it imported again (~0.2 s each);
    ``compileall`` writes them whatever that variable says, and every process reads them. A
    tree it cannot write is left as it is."""
    import compileall

    import torchscale

    with contextlib.suppress(OSError):
        compileall.compile_dir(Path(torchscale.__file__).parent, quiet=2)


@pytest.hookimpl(trylast=True)  # after the tmp-path plugin has made its factory
def pytest_configure(config: pytest.Config) -> None:
    """Bytecode before the first process imports torchscale; in an xdist worker, the folder the
    two workers share their machine through."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _compile_package()
    else:
        from tests.support import machine_share

        factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
        machine_share.configure(factory.getbasetemp())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Iterator[None]:
    """Setup, call and teardown (module fixtures' launches too) with the machine shared as the
    test's module allows: in the background, beside the foreground, or alone."""
    from tests.support import machine_share

    share: ContextManager[None]
    if _in_background(item):
        share = machine_share.in_background()
    elif _alone(item):
        share = machine_share.alone_until(keep=nextitem is not None and _alone(nextitem))
    else:
        share = contextlib.nullcontext()
    with share:
        yield


# --- shared real runs: one torchrun launch each per session, whichever test asks first ----------
# A test that only needs "a real CPU run's records" asks for one of these instead of launching
# its own (docs/PERFORMANCE.md, "How a new test joins an existing launch"). Tests that use them
# are marked slow.


@pytest.fixture(scope="session")
def healthy_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """``benchmark --json``: gpt2-tiny on 1 and 2 gloo processes (one warm-group launch each),
    with the TensorBoard and MLflow sinks on."""
    from tests.support.shared_runs import launch_healthy_run

    return launch_healthy_run(tmp_path_factory.mktemp("healthy-run"))


@pytest.fixture(scope="session")
def use_case_profile(healthy_run: Run, tmp_path_factory: pytest.TempPathFactory) -> ProfileRun:
    """The seed's Use Case: ``profile`` with no model into a copy of :func:`healthy_run`'s folder
    (2 ranks, 1 s, sync stalls): it profiles what scaled worst there. One launch, read by the
    profile command's tests and the report's."""
    import shutil

    from typer.testing import CliRunner

    from tests.support.environ import repo_pythonpath, restored_environ
    from tests.support.shared_runs import ProfileRun
    from torchscale.cli.app import app

    folder = tmp_path_factory.mktemp("use-case") / "scaling_results"
    shutil.copytree(healthy_run.experiment_dir, folder / healthy_run.experiment_dir.name)
    history = folder.parent / "history.db"
    args = ["profile", "--gpus", "2", "--duration", "1s", "--target", "sync_stalls"]
    args += ["--history", str(history)]
    with restored_environ("TORCHSCALE_CPU_SLOTS", "PYTHONPATH"):
        os.environ["TORCHSCALE_CPU_SLOTS"] = "2"
        os.environ["PYTHONPATH"] = repo_pythonpath()
        result = CliRunner().invoke(app, [*args, "--output-dir", str(folder), "-v", "--json"])
    if result.exit_code != 0:
        raise RuntimeError(f"use-case profile failed ({result.exit_code}):\n{result.output}")
    return ProfileRun(result, folder, history)


@pytest.fixture(scope="session")
def projection_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Training cells on 1 and 2 gloo ranks plus communication cells: what ``project`` needs."""
    from tests.support.shared_runs import launch_projection_run

    return launch_projection_run(tmp_path_factory.mktemp("projection-run"))


@pytest.fixture(scope="session")
def own_script_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """``benchmark --script``: the user's own script on 1 and 2 gloo processes."""
    from tests.support.shared_runs import launch_own_script_run

    return launch_own_script_run(tmp_path_factory.mktemp("own-script-run"))


# --- lane runs: every one the session's tests read, made two at a time before the first --------
# (tests/support/session_runs.py: multi-host runs on hosts of their own, and single-host runs
# whose assertions cannot see the shared cores; only the selected tests' runs).


@pytest.fixture(scope="session")
def session_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Dict[str, Any]:
    from tests.support import machine_share
    from tests.support.session_runs import FIXTURES, run_in_lanes

    items = request.session.items
    selected = {name for item in items for name in getattr(item, "fixturenames", ())}
    with machine_share.alone():  # two runs at a time fill both cores
        return run_in_lanes(tmp_path_factory.mktemp, [f for f in FIXTURES if f in selected])


@pytest.fixture(scope="session")
def two_host_lockstep(session_runs: Dict[str, Any]) -> Dict[str, Any]:
    """The two-host lock-step sweep (two network namespaces): test_multinode's, which
    test_k8s_pods compares its pods' folder with."""
    return session_runs["two_host_lockstep"].value()


@pytest.fixture(scope="session")
def k8s_pods_run(session_runs: Dict[str, Any]) -> Dict[str, Any]:
    """test_k8s_pods' five two-pod runs (tests/support/k8s_pod_runs.py)."""
    return session_runs["k8s_pods_run"].value()


@pytest.fixture(scope="session")
def hybrid_run(session_runs: Dict[str, Any]) -> Dict[str, Any]:
    """test_multinode's fsdp2_hybrid cell on two hosts."""
    return session_runs["hybrid_run"].value()


@pytest.fixture(scope="session")
def slurm_job_run(session_runs: Dict[str, Any]) -> Dict[str, Any]:
    """test_slurm's matrix submitted to a two-node Slurm cluster."""
    return session_runs["slurm_job_run"].value()


@pytest.fixture(scope="session")
def comm_nodes_run(session_runs: Dict[str, Any]) -> Dict[str, Any]:
    """test_comm_nodes' communication cell split by node on two hosts."""
    return session_runs["comm_nodes_run"].value()


@pytest.fixture(scope="session")
def deleted_folder_run(session_runs: Dict[str, Any]) -> Dict[str, Any]:
    """test_process_faults' sweep whose results folder is deleted while it measures."""
    return session_runs["deleted_folder_run"].value()


@pytest.fixture(scope="session")
def own_script_faults(session_runs: Dict[str, Any]) -> Dict[str, Any]:
    """test_own_script's failure runs (a script ending before its window, raising on one rank,
    stepped at forwards, tuned with every trial failing; five bootstrap errors), by name: each
    one's ``.value()`` is its result or raises what it raised."""
    return session_runs["own_script_faults"].value()


@pytest.fixture(scope="session")
def strategy_runs(session_runs: Dict[str, Any]) -> Dict[str, Any]:
    """test_strategies' two sweeps (``tiny``: a scaled rank; ``memory``: the 11M GPT-2), by
    name: each one's ``.value()`` is its records or raises what it raised."""
    return session_runs["strategy_runs"].value()


@pytest.fixture(scope="session")
def full_disk_run(session_runs: Dict[str, Any]) -> Dict[str, Any]:
    """test_faults' sweep into a tmpfs that fills in its second cell's measured window."""
    return session_runs["full_disk_run"].value()


@pytest.fixture(scope="session")
def comm_sweep_run(tmp_path_factory: pytest.TempPathFactory) -> SweepRun:
    """``--quiet benchmark`` of a communication sweep: one real 2-rank gloo launch."""
    from tests.support.sweep_records import launch_comm_sweep

    return launch_comm_sweep(tmp_path_factory.mktemp("sweep-run"))


# --- fixture experiments (written in-process, no launch) -----------------------------------------


@pytest.fixture(scope="session")
def fixture_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default fixture experiment folder."""
    from tests.support.report_fixtures import write_fixture_results

    return write_fixture_results(tmp_path_factory.mktemp("fixture-results"))


@pytest.fixture(scope="session")
def node_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One fixture experiment with cells on 1, 2 and 4 nodes."""
    from tests.support.report_fixtures import write_node_results

    return write_node_results(tmp_path_factory.mktemp("node-results"))


@pytest.fixture(scope="session")
def session_report(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path, str], Path]:
    """``session_report(folder, fmt)``: the report of a results folder in ``fmt`` (html, pdf...),
    generated once per session for each pair."""
    from torchscale.app.report import ReportRequest, generate_report

    root = tmp_path_factory.mktemp("reports")
    built: Dict[Tuple[Path, str], Path] = {}
    sources: Dict[Path, int] = {}

    def report(folder: Path, fmt: str) -> Path:
        if (folder, fmt) not in built:
            index = sources.setdefault(folder, len(sources))
            output = root / f"source{index}-report.{fmt}"
            built[(folder, fmt)] = generate_report(ReportRequest(folder, fmt, output))
        return built[(folder, fmt)]

    return report


@pytest.fixture(scope="session")
def chromium() -> Iterator[Chromium]:
    """One headless Chromium for every test that opens a page in it (each page in its own tab):
    a start and stop cost ~1.5 s, paid once per session instead of once per module or test."""
    from tests.support.chromium_cdp import CHROMIUM, Chromium

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    with Chromium() as browser:
        yield browser


# --- the launch count: what the suite's time is made of ------------------------------------------
# Every torchrun launch costs ~4.5 s before its first step (docs/PERFORMANCE.md, "Test time"), so
# the suite's time budget is kept in launches. Each torchrun agent writes its workers' exits file
# (results/layout.py's EXITS_GLOB) in its cell's or warm group's folder under the session's tmp
# folder: one folder is one launch (a multi-node launch has one file per host). Counted at the
# end of the session, without touching torchscale's code; runs that delete their folder are not
# counted, nor launches that go around torchrun (mpirun, srun without torchrun, validate's
# smoke test).


WORKER_FOLDER = re.compile(r"(popen-)?gw\d+")
"""An xdist worker's tmp folder under the session's: the launch count looks one level below."""


def _launch_folders(base: Path) -> Dict[str, int]:
    """Launches under ``base``, by the top-level tmp folder (a test's or a fixture's name).

    A test that copies a run's folder copies its exits files too: a copy (the same bytes) counts
    once, where its ctime is oldest (copies get a new ctime, not a new content)."""
    from torchscale.results.layout import EXITS_GLOB

    folders: Dict[Path, bytes] = {}
    for path in base.rglob(EXITS_GLOB):
        folders[path.parent] = (
            folders.get(path.parent, b"") + path.name.encode() + path.read_bytes()
        )
    first: Dict[bytes, Tuple[float, Path]] = {}
    for folder, content in folders.items():
        key = content if content.strip() else str(folder).encode()  # an empty file: no twin known
        made = folder.stat().st_ctime
        if key not in first or made < first[key][0]:
            first[key] = (made, folder)
    counts: Dict[str, int] = {}
    for _, folder in first.values():
        parts = folder.relative_to(base).parts
        top = parts[1] if WORKER_FOLDER.fullmatch(parts[0]) and len(parts) > 1 else parts[0]
        counts[top] = counts.get(top, 0) + 1
    return counts


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    try:
        counts = _launch_folders(factory.getbasetemp())
    except OSError:  # a folder removed while walking: the count is a guide, never a failure
        return
    if not counts:
        return
    total = sum(counts.values())
    top = sorted(counts.items(), key=lambda item: -item[1])[:10]
    terminalreporter.write_sep("-", f"torchrun launches: {total} (budget: docs/PERFORMANCE.md)")
    terminalreporter.write_line("  " + ", ".join(f"{name} {n}" for name, n in top))
