"""``compare``'s gate knows run-to-run noise, in bounded memory.

The unchanged pair is recorded: two back-to-back runs of examples/cpu_smoke.yaml with
``repeats: 2`` on the 2-core VM (tests/data/compare_unchanged, 2026-11-25). Before the noise
model, ``compare`` failed their first repeats (gpt2-tiny on 1 rank -6.1% and resnet-tiny on 2
ranks -12.0%, both "regression") and, on both repeats, called gpt2-tiny on 1 rank "improved"
(+7.3%). The planted slowdown is real: a model whose forward sleeps longer in the new run.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.support.report_fixtures import MODELS, FixtureSpec, training_record, write_experiment
from tests.support.step_records import busy_host_ranks
from torchscale.analysis import noise
from torchscale.analysis.bootstrap import CHUNK_ELEMENTS, MAX_BLOCKS
from torchscale.analysis.comparison import REGRESSION, CompareOptions, compare_runs
from torchscale.analysis.report_data import load_report_data
from torchscale.cli.app import app
from torchscale.measures.stats import t_quantile, time_stats
from torchscale.results.schema import TimeStats, TrainingResult
from torchscale.results.store import ExperimentStore

DATA = Path(__file__).parent / "data" / "compare_unchanged"
runner = CliRunner()
JUDGED = {"regression", "improvement"}


def _first_repeats(source: Path, target: Path) -> Path:
    """A copy of a recorded run with its first repeat only: one run per side."""
    folder = target / "cpu_smoke"
    folder.mkdir(parents=True)
    shutil.copy(source / "cpu_smoke" / "manifest.json", folder)
    lines = (source / "cpu_smoke" / "results.jsonl").read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["repeat"] == 0]
    (folder / "results.jsonl").write_text("\n".join(kept) + "\n")
    return target


def _compare(*args: str) -> Any:
    result = runner.invoke(app, ["compare", *args, "--json"])
    return result, json.loads(result.stdout) if result.stdout else None


def _records(folder: Path) -> List[TrainingResult]:
    return [r for r in load_report_data(folder).records if isinstance(r, TrainingResult)]


def test_two_unchanged_single_runs_pass_under_the_default_floor(tmp_path: Path) -> None:
    old = _first_repeats(DATA / "before", tmp_path / "old")
    new = _first_repeats(DATA / "after", tmp_path / "new")
    result, document = _compare(str(old), str(new))
    assert result.exit_code == 0, result.stderr
    cells = document["cells"]
    assert len(cells) == 4 and not {c["verdict"] for c in cells} & JUDGED
    assert {c["noise_model"] for c in cells} == {noise.DEFAULT_FLOOR}
    assert document["noise"]["models"] == {noise.DEFAULT_FLOOR: 4}
    assert "Noise model: default floor for 4 cell(s)" in result.stderr
    assert "1.2 x each cell's step-time CV" in result.stderr
    # Each interval: the change +- the quantile (simultaneous over 8 figures) x the floor's
    # sigma x sqrt(2), sigma = 1.2 x the RMS of the two records' step-time CVs.
    quantile = t_quantile(1 - 0.05 / 2 / 8, None)
    records = _records(old) + _records(new)
    for cell in cells:
        assert cell["repeats_old"] == cell["repeats_new"] == 1
        cvs = [
            r.step_time_ms.cv  # type: ignore[union-attr]
            for r in records
            if (r.model, r.world_size) == (cell["model"], cell["world_size"])
        ]
        assert len(cvs) == 2
        cv = math.sqrt(sum(c * c for c in cvs) / 2)
        assert cell["step_cv"] == pytest.approx(cv)
        width = quantile * noise.DEFAULT_FACTOR * cv * math.sqrt(2)
        centre = math.log1p(cell["throughput_change_pct"] / 100)
        low, high = (math.log1p(cell[f"throughput_ci_{s}_pct"] / 100) for s in ("low", "high"))
        assert centre - low >= width - 1e-9 and high - centre >= width - 1e-9
        assert low <= 0 <= high or abs(cell["throughput_change_pct"]) <= 5


def test_repeats_decide_when_both_runs_have_them() -> None:
    result, document = _compare(str(DATA / "before"), str(DATA / "after"))
    assert result.exit_code == 0, result.stderr
    cells = document["cells"]
    assert {c["noise_model"] for c in cells} == {noise.REPEATS}
    assert all(c["cpu_wait_share"] is None for c in cells)  # no repeat left out of the factor
    assert not {c["verdict"] for c in cells} & JUDGED  # the old gate called one "improvement"
    assert all(c["repeats_old"] == c["repeats_new"] == 2 for c in cells)
    # The factor is pooled over every cell's repeats in both runs, with their degrees of freedom.
    squares, df = 0.0, 0
    for folder in (DATA / "before", DATA / "after"):
        groups: Dict[Any, List[TrainingResult]] = {}
        for record in _records(folder):
            groups.setdefault((record.model, record.world_size), []).append(record)
        for group in groups.values():
            logs = [math.log(r.throughput or 0) for r in group]
            cvs = [r.step_time_ms.cv for r in group]  # type: ignore[union-attr]
            cv_rms = math.sqrt(sum(c * c for c in cvs) / len(cvs))
            squares += float(sum((x - np.mean(logs)) ** 2 for x in logs) / cv_rms**2)
            df += len(logs) - 1
    assert df == 8
    described = document["noise"]["throughput"]
    assert f"{math.sqrt(squares / df):.2f} x each cell's step-time CV" in described
    assert "(8 degrees of freedom)" in described


def _spec(**kwargs: Any) -> FixtureSpec:
    small = {"batch_sizes": (32,), "gpu_counts": (1, 2), "failures": False,
             "collectives": False, "findings": False}  # fmt: skip
    return FixtureSpec(**{**small, **kwargs})


def test_a_slowdown_beyond_the_repeats_noise_regresses(tmp_path: Path) -> None:
    slow = MODELS[0].name
    base = load_report_data(write_experiment(tmp_path / "a", _spec(name="n", repeats=3))).records
    new = load_report_data(
        write_experiment(tmp_path / "b", _spec(name="n", repeats=3, seed=1, slowdown={slow: 1.3}))
    ).records
    comparison = compare_runs(base, new)
    cells = comparison.cells.set_index(["model", "world_size"])
    assert set(cells["noise_model"]) == {noise.REPEATS}
    assert set(cells.loc[slow, "verdict"]) == {REGRESSION}  # type: ignore[arg-type]  # a model's rows: a Series
    assert not set(cells.drop(index=slow, level=0)["verdict"]) & JUDGED
    spread = comparison.spreads["throughput"]
    assert spread.kind == noise.MEASURED_FLOOR
    assert spread.df == 2 * 4 * (3 - 1)  # 2 runs x 4 cells x (3 repeats - 1)
    # The interval: Student's t for the pooled factor's df, both sides' 3 repeats averaged.
    row: Any = cells.loc[(slow, 2)]  # one cell's row (a Series)
    quantile = t_quantile(1 - 0.05 / 2 / comparison.figures, spread.df)
    width = quantile * (spread.factor or 0) * row["step_cv"] * math.sqrt(2 / 3)
    centre = math.log1p(row["throughput_change_pct"] / 100)
    assert math.log1p(row["throughput_ci_high_pct"] / 100) == pytest.approx(centre + width)
    # A baseline with repeats and a single new run: the baseline's repeats measure the floor.
    single = [r for r in new if r.repeat == 0]
    mixed = compare_runs(base, single)
    assert set(mixed.cells["noise_model"]) == {noise.MEASURED_FLOOR}
    assert "from the repeats of 4 cell run(s)" in mixed.noise_line()
    # A stated floor overrides the repeats: +-40% between single runs covers a 30% slowdown.
    stated = compare_runs(base, new, CompareOptions(noise_floor_pct=40.0))
    assert set(stated.cells["noise_model"]) == {noise.STATED_FLOOR}
    assert REGRESSION not in set(stated.cells["verdict"])


SLEEPY_CONFIG = """\
experiment_name: planted
models: ["tests.support.fault_models:slow_rank_model"]
batch_sizes: [2]
gpu_counts: [1]
warmup_steps: 1
measure_steps: 6
sync_probe_steps: 0
cell_timeout_s: 120
"""
PLANTED_MS = (600, 800)
"""The forward's sleep before and after: steps a third longer. The sleep is most of the step
(resnet-tiny on 2 samples computes for 10-40 ms here), so the steps' CV, which sets the floor,
stays small: 0.1-0.2% at 600/800 ms, 1.5-2.5% at 300/400 ms on the loaded 2-core VM, against a
floor half-width of about 3.8 x CV (z for 2 figures x 1.2 x sqrt 2) and a planted log change of
0.28. Its noise is the compute's, so the longer sleep halves it relative to the step."""
WORSE = {"throughput": ("throughput_ci_high_pct", -1), "p95": ("p95_ci_low_pct", 1)}
"""Each figure's interval end nearest zero, and the sign of a worse change."""


@pytest.mark.slow
@pytest.mark.timed  # a planted slowdown judged against the runs' noise
def test_a_planted_30_percent_slowdown_fails_the_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same cell, its forward sleeping 600 ms, then 800 ms: the gate exits 1 and calls it a
    regression on a figure whose own interval excludes zero."""
    config = tmp_path / "planted.yaml"
    config.write_text(SLEEPY_CONFIG)
    monkeypatch.setenv("TORCHSCALE_TEST_FAULT_RANK", "0")
    runs = {}
    for name, delay_ms in zip(("before", "after"), PLANTED_MS):
        monkeypatch.setenv("TORCHSCALE_TEST_DELAY_MS", str(delay_ms))
        run = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(tmp_path / name)])
        assert run.exit_code == 0, run.output
        runs[name] = tmp_path / name
    old, new = (_records(runs[n])[0] for n in ("before", "after"))
    slower = np.mean(new.step_times_ms) / np.mean(old.step_times_ms)
    assert slower > 1.1, slower  # the sleep planted it (the compute only dilutes the third)
    result, document = _compare(str(runs["before"]), str(runs["after"]))
    (cell,) = document["cells"]
    if cell["noise_model"] == noise.OVERSUBSCRIBED:
        # Measured while other processes held the cores: not judged, and the gate says so.
        assert result.exit_code == 2 and "could be judged" in result.stderr
        pytest.skip(f"host busy: the planted cell waited for a CPU ({cell['cpu_wait_share']:.0%})")
    # What the default floor allows one run per side (the interval's half-width, in log).
    quantile = t_quantile(1 - 0.05 / 2 / document["noise"]["figures"], None)
    floor = quantile * noise.DEFAULT_FACTOR * cell["step_cv"] * math.sqrt(2)
    planted = -math.log1p(cell["throughput_change_pct"] / 100)
    print(f"planted: steps {slower:.3f}x, log change {planted:.3f}, floor {floor:.3f}")
    if result.exit_code != 1 and planted <= floor:
        # The steps varied so much (the host's load) that a third is within their noise: the
        # gate is right not to call it. Seen from the records, not from the gate's answer.
        assert cell["verdict"] != REGRESSION
        pytest.skip(f"host too noisy: step CV {cell['step_cv']:.1%} hides the planted change")
    assert result.exit_code == 1, (slower, result.stderr)
    assert cell["verdict"] == REGRESSION and cell["noise_model"] == noise.DEFAULT_FLOOR
    change = 100 * ((new.throughput or 0) / (old.throughput or 1) - 1)
    assert cell["throughput_change_pct"] == pytest.approx(change)
    # Beyond the floor, not only past the threshold: each figure that calls it a regression does
    # so on its own interval, wholly on the worse side of zero.
    deciding = [f for f in WORSE if cell[f"{f}_verdict"] == REGRESSION]
    assert deciding, cell
    for figure in deciding:
        end, worse = WORSE[figure]
        assert worse * cell[end] > 0 and cell[f"{figure}_beyond_noise"], (figure, cell)
        assert worse * cell[f"{figure}_change_pct"] > 5  # past the threshold too
    assert "1 cell(s) regressed beyond 5%" in result.stderr


def _long(record: TrainingResult, steps: int, scale: float) -> TrainingResult:
    times = np.random.default_rng(steps).lognormal(np.log(10 * scale), 0.05, steps)
    stats = TimeStats(**(time_stats(times) or {}))
    rank = record.per_rank[0].model_copy(update={"step_times_ms": times.tolist(),
                                                 "step_time_ms": stats})  # fmt: skip
    update = {"step_times_ms": times.tolist(), "step_time_ms": stats, "per_rank": [rank],
              "throughput": 32_000 / stats.mean}  # fmt: skip
    return record.model_copy(update=update)


def test_a_million_step_compare_draws_in_bounded_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """1M-step records: the bootstrap never draws more than CHUNK_ELEMENTS numbers at once (the
    plain one asked for 2,000 x 1M, 14.9 GiB), and resamples blocks, not steps."""
    import tracemalloc

    spec = _spec(name="long", gpu_counts=(1,))
    template = training_record(MODELS[0], 32, 1, 0, spec, np.random.default_rng(0))
    old, new = _long(template, 1_000_000, 1.0), _long(template, 1_000_000, 1.3)
    drawn: List[int] = []
    real = np.random.default_rng

    class Spy:
        def __init__(self, seed: Any) -> None:
            self.rng = real(seed)

        def integers(self, low: int, high: int, size: Any = None) -> Any:
            drawn.append(int(np.prod(size)))
            assert high <= MAX_BLOCKS, "steps drawn one by one, not in blocks"
            return self.rng.integers(low, high, size)

    monkeypatch.setattr(np.random, "default_rng", Spy)
    tracemalloc.start()
    try:
        comparison = compare_runs([old], [new])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert drawn and max(drawn) <= CHUNK_ELEMENTS
    assert sum(drawn) == 2 * 2 * 2000 * MAX_BLOCKS  # 2 sides x 2 figures x resamples x blocks
    assert peak < 400 * 2**20, f"{peak / 2**20:.0f} MiB"
    (verdict,) = comparison.cells["verdict"]
    assert verdict == REGRESSION


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 30), ("2.5", 2.5), ("90s", 90), ("2min", 120), ("20m", 1200), ("1h30m", 5400),
     ("1.5h", 5400), ("5 minutes", 300), ("1 hour 2 mins", 3720), (" 45 sec ", 45)],
)  # fmt: skip
def test_one_duration_parser(text: str, seconds: float) -> None:
    from torchscale.config.durations import parse_duration

    assert parse_duration(text, "--x") == seconds


@pytest.mark.parametrize("text", ["", "abc", "0", "0m", "-5", "2x", "1h 2", "m5", "inf", "9999h"])
def test_one_duration_parser_refuses_with_the_option_named(text: str) -> None:
    from torchscale.config.durations import parse_duration
    from torchscale.errors import ConfigError

    with pytest.raises(ConfigError, match=f"^--budget '{text}' (is not a duration|must be)"):
        parse_duration(text, "--budget")


def test_tune_refuses_a_cell_the_node_cannot_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 ranks on 2 CPU slots: exit 2 before any launch, one line with the fix, nothing written
    (and ``--budget 2min`` is a duration, as ``profile --duration 2min`` is)."""
    monkeypatch.setenv("TORCHSCALE_CPU_SLOTS", "2")
    out = tmp_path / "out"
    config = Path(__file__).parents[1] / "examples" / "tune_cpu.yaml"
    result = runner.invoke(
        app, ["tune", "-c", str(config), "--budget", "2min", "--gpus", "4", "-o", str(out)]
    )
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert "needs 4 CPU processes per node; this node has 2 CPU processes" in line
    assert "pass --gpus 2" in line and "TORCHSCALE_CPU_SLOTS=4" in line
    assert not out.exists()


CRASH_CONFIG = """\
experiment_name: crashing
models: ["tests.support.fault_models:crash_model"]
batch_sizes: [2]
gpu_counts: [1]
warmup_steps: 1
measure_steps: 4
sync_probe_steps: 0
cell_timeout_s: 120
tune:
  search: [ddp.gradient_as_bucket_view]
  pruning: false
"""


@pytest.mark.slow
def test_tune_whose_every_trial_failed_exits_1_and_claims_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHSCALE_TEST_FAULT_RANK", "0")
    monkeypatch.setenv("TORCHSCALE_TEST_FAULT_AFTER", "0")
    config = tmp_path / "crash.yaml"
    config.write_text(CRASH_CONFIG)
    out = tmp_path / "out"
    result = runner.invoke(app, ["tune", "-c", str(config), "-o", str(out), "--trials", "1",
                                 "--json"])  # fmt: skip
    assert result.exit_code == 1, result.output
    summary = json.loads(result.stdout)
    assert summary["result"] == "nothing measured" and summary["winner"] is None
    (trial,) = summary["trials"]
    assert trial["state"] == "fail" and "injected crash on rank 0" in trial["error"]
    assert summary["line"].startswith("> [TUNE] nothing measured: all 1 trial(s) failed (1 ")
    assert "injected crash on rank 0" in summary["line"]
    assert "no significant gain" not in result.stderr and summary["line"] in result.stderr
    folder = out / "crashing" / "tune"
    assert (folder / "tune.json").exists() and not (folder / "best.yaml").exists()
    assert not (folder / "ddp.py").exists()
    store = ExperimentStore(folder)
    assert [r.status for r in store.records()] == ["failed"]


def test_report_baseline_takes_the_same_verdicts_and_noise_option(tmp_path: Path) -> None:
    """``report --baseline`` judges with compare's function and options: a stated floor wide
    enough for the slowdown turns its regression into "within noise" in the report too."""
    slow = MODELS[0].name
    base = write_experiment(tmp_path / "base", _spec(name="n"))
    new = write_experiment(tmp_path / "new", _spec(name="n", seed=1, slowdown={slow: 1.3}))
    for floor, verdict in ((None, "regression"), ("60", "within noise")):
        output = tmp_path / f"report-{floor}.html"
        args = ["report", "-s", str(new), "--baseline", str(base), "-o", str(output)]
        result = runner.invoke(app, [*args, *(["--noise-floor", floor] if floor else [])])
        assert result.exit_code == 0, result.stderr
        html = output.read_text(encoding="utf-8")
        expected = compare_runs(
            load_report_data(base).records,
            load_report_data(new).records,
            CompareOptions(noise_floor_pct=float(floor) if floor else None),
        )
        assert verdict in set(expected.cells["verdict"])
        assert f"verdict-{verdict.replace(' ', '-')}" in html
        assert expected.noise_line().split(".")[0] in html


@pytest.mark.parametrize(
    ("option", "message"),
    [(["--noise-floor", "-1"], "--noise-floor -1 must be a % between 0 and 1000"),
     (["--noise-floor", "nan"], "--noise-floor nan must be a % between 0 and 1000"),
     (["--threshold", "-2"], "--threshold -2 must be a number >= 0")],
)  # fmt: skip
def test_bad_compare_options_are_one_line(tmp_path: Path, option: List[str], message: str) -> None:
    folder = _first_repeats(DATA / "before", tmp_path / "old")
    result = runner.invoke(app, ["compare", str(folder), str(folder), *option])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"Error: {message}") and "Traceback" not in result.output


def test_a_compare_that_could_judge_no_cell_never_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every cell measured while other processes held the cores: nothing is judged, so the gate
    says so and exits 2 instead of passing; a floor the user states judges them."""
    import torchscale.analysis.comparison as comparison

    old = _first_repeats(DATA / "before", tmp_path / "old")
    new = _first_repeats(DATA / "after", tmp_path / "new")
    monkeypatch.setattr(comparison, "busy_wait", lambda records: 0.4)
    result, document = _compare(str(old), str(new))
    assert result.exit_code == 2, result.output
    assert {c["noise_model"] for c in document["cells"]} == {noise.OVERSUBSCRIBED}
    assert document["passed"] is False  # a CI script reading the document fails too
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("Error: no cell of") and "--noise-floor" in line
    assert "Not judged: 4 cell(s) measured on a busy host" in " ".join(result.stderr.split())
    stated, document = _compare(str(old), str(new), "--noise-floor", "15")
    assert stated.exit_code == 0, stated.output
    assert {c["noise_model"] for c in document["cells"]} == {noise.STATED_FLOOR}
    assert document["passed"] is True


def _busy(line: str, slower: float) -> str:
    """One recorded cell as if measured on a busy host, ``slower`` x slower: each rank waited for
    a CPU 40% of its window while other processes kept one more core of the host busy (what
    schedstat and /proc/stat record beside ranks that share their cores with a spinner)."""
    record = TrainingResult.model_validate_json(line)
    ranks = busy_host_ranks(record)
    steps = [s * slower for s in record.step_times_ms]
    stats = time_stats(steps)
    assert stats is not None
    slowed = record.model_copy(
        update={
            "per_rank": ranks,
            "step_times_ms": steps,
            "step_time_ms": TimeStats(**stats),
            "throughput": (record.throughput or 0.0) / slower,
        }
    )
    return slowed.model_dump_json()


def _with_busy_cell(source: Path, target: Path, cell: str, slower: float) -> Path:
    """A copy of a one-repeat run whose ``cell`` was measured on a busy host, ``slower`` x."""
    folder = target / "cpu_smoke"
    lines = (folder / "results.jsonl").read_text().splitlines()
    edited = [
        _busy(line, slower) if json.loads(line)["cell_id"].startswith(cell) else line
        for line in lines
    ]
    assert edited != lines
    (folder / "results.jsonl").write_text("\n".join(edited) + "\n")
    return target


def test_a_busy_cell_is_not_judged_and_the_gate_does_not_pass_on_the_quiet_ones(
    tmp_path: Path,
) -> None:
    """A run against a copy in which one cell ran on a busy host 2.3x slower (a -56% drop) and
    the others quietly: the busy cell's verdict is "not judged" (never "within noise"), the gate
    says how many cells it judged and exits 2; --allow-unjudged passes on the judged cells and
    names the one it did not judge."""
    old = _first_repeats(DATA / "before", tmp_path / "old")
    busy = "gpt2-tiny-b8-g2-fp32"
    new = _with_busy_cell(old, _first_repeats(DATA / "before", tmp_path / "new"), busy, 2.3)
    result, document = _compare(str(old), str(new))
    assert result.exit_code == 2, result.output
    verdicts = {c["cell_id_new"].rsplit("-r0-", 1)[0]: c for c in document["cells"]}
    cell = verdicts.pop(busy)
    assert cell["verdict"] == cell["throughput_verdict"] == cell["p95_verdict"] == "not judged"
    assert cell["throughput_change_pct"] == pytest.approx(100 * (1 / 2.3 - 1))
    assert cell["throughput_ci_low_pct"] is None  # no interval: no verdict rests on it
    assert cell["cpu_wait_share"] == pytest.approx(0.4)
    assert {c["verdict"] for c in verdicts.values()} == {"unchanged"}  # the same records
    assert document["passed"] is False
    assert (document["judged"], document["not_judged"]) == (3, 1)
    text = " ".join(result.stderr.split())
    assert "Judged 3 of 4 cell(s); 1 not judged (busy host): the gate cannot pass" in text
    assert "--allow-unjudged" in text and "within noise" not in text
    assert "No regression" not in text
    # The table's verdict column says it too.
    rows = [line for line in result.stderr.splitlines() if "│" in line and "gpt2" in line]
    assert ["not judged" in row for row in rows] == [False, True], rows
    allowed, document = _compare(str(old), str(new), "--allow-unjudged")
    assert allowed.exit_code == 0, allowed.output
    assert document["passed"] is True and document["allow_unjudged"] is True
    text = " ".join(allowed.stderr.split())
    assert "passed over as --allow-unjudged asks" in text
    assert f"Not judged: {cell['cell_id_new']}" in text
    assert "No regression beyond 5% and the run-to-run noise in the 3 cell(s) judged" in text
    # The glossary's words for the rule carry the rule's own thresholds.
    from torchscale.analysis.cpu_load import CPU_WAIT_SHARE, OTHER_PROCESSES_CORES
    from torchscale.measures.figures import BUSY_HOST_RULE

    assert f"at least {CPU_WAIT_SHARE:.0%} of its window" in BUSY_HOST_RULE
    assert OTHER_PROCESSES_CORES == 0.25 and "at least a quarter of a core" in BUSY_HOST_RULE
    # A stated noise floor judges the busy cell: a 56% drop is then a regression.
    stated, document = _compare(str(old), str(new), "--noise-floor", "10")
    assert stated.exit_code == 1, stated.output
    (regressed,) = [c for c in document["cells"] if c["verdict"] == "regression"]
    assert regressed["cell_id_new"] == cell["cell_id_new"]


def test_report_baseline_shows_a_busy_cell_as_not_judged_in_html_and_pdf(tmp_path: Path) -> None:
    """The report's comparison names the busy cell's verdict "not judged" (its own row class and
    colour, never "within noise") and how many cells it judged, in the HTML and the PDF."""
    from tests.support.pdf_pages import pages_text

    old = _first_repeats(DATA / "before", tmp_path / "old")
    new = _with_busy_cell(
        old, _first_repeats(DATA / "before", tmp_path / "new"), "resnet-tiny-b8-g2-fp32", 2.0
    )
    for fmt in ("html", "pdf"):
        output = tmp_path / f"report.{fmt}"
        args = ["report", "-s", str(new), "--baseline", str(old), "-o", str(output), "-f", fmt]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.stderr
        if fmt == "html":
            text = output.read_text(encoding="utf-8")
            rows = re.findall(r"<tr[^>]*verdict-([\w-]+)", text)
            assert sorted(rows) == ["not-judged", "unchanged", "unchanged", "unchanged"], rows
        else:
            text = " ".join(" ".join(pages_text(output)).split())
        assert "Judged 3 of 4 cell(s); 1 not judged (busy host)" in text
        assert "within noise" not in text
