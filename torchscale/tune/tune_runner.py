"""One ``torchscale tune`` run: search in batches within the budget, then the verdict, then the
outputs. Everything lands in ``DIR/<experiment>/tune/``: the trials' results.jsonl (a benchmark
experiment like any other), study.db, verdict/round-*/ (the re-measure), best.yaml, baseline.yaml,
ddp.py and tune.json.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Protocol, Tuple

from torchscale.analysis.busy_host import NOT_JUDGED, verdict_allowed
from torchscale.config.settings import BenchmarkConfig
from torchscale.config.tune_section import TuneSection
from torchscale.launch.sweep import SweepEvents
from torchscale.plan.planned_cell import NON_IDENTITY_FIELDS
from torchscale.results.layout import (
    TUNE_DIR,
    TUNE_SCREEN_DIR,
    TUNE_STUDY,
    TUNE_VERDICT_DIR,
    experiment_dir,
)
from torchscale.results.store import ExperimentStore
from torchscale.script.script_config import SECTION, ScriptCellSettings
from torchscale.script.script_kind import script_label
from torchscale.tune import tune_outputs as outputs
from torchscale.tune.space import SearchSpace, TunedSettings
from torchscale.tune.study import (
    distinct_tried,
    finished_count,
    open_study,
    stale_trials,
    states,
    tune_lock,
)
from torchscale.tune.trials import (
    SCREEN_STEP,
    BudgetSpent,
    CellRunner,
    Interrupts,
    TrialBatch,
    screen_window,
)
from torchscale.tune.verdict import (
    Candidate,
    host_waits,
    interleaved,
    judge,
    round_name,
    verdict_cells,
)

if TYPE_CHECKING:
    import optuna


VERDICT_DIR = TUNE_VERDICT_DIR
SCREEN_DIR = TUNE_SCREEN_DIR
STALE_BATCHES = 3
SEARCH_END = 0.95  # of the budget: a search cell still running then is ended
VERDICT_TOLERANCE = 1.05  # of the budget: a verdict still running then is ended (stopping
# the launch and writing the outputs take a few seconds more)
FIRST_BATCH = 2  # the baseline and one trial, before the budget knows what a cell costs ...
SHORT_BUDGET_S = 300.0  # ... under a budget shorter than this
FAILED_BATCHES = 2  # batches with no trial measured at all before the search gives up


class TuneEvents(SweepEvents, Protocol):
    """The sweep's events plus what the search reports."""

    def phase(self, text: str) -> None: ...

    def trial_told(self, number: int, summary: Dict[str, Any]) -> None: ...


@dataclass
class TuneRequest:
    config: BenchmarkConfig
    raw: Dict[str, Any]  # the YAML mapping, overrides applied: the base of best.yaml
    pinned: Dict[str, Any]  # models, batch_sizes, gpu_counts of the tuned cell
    baseline: TunedSettings
    space: SearchSpace
    section: TuneSection
    output_dir: Path
    budget_s: float
    trial_cap: Optional[int]
    noise_floor_pct: Optional[float] = None  # stated: a verdict may rest on a busy host's cells
    started: float = field(default_factory=time.monotonic)
    """The budget's clock (monotonic): the ``torchscale`` command's process start where that
    process was started for the command (``cli.console.command_started``), else when the tune
    was asked for (an API call or a test in a long-lived process)."""

    @property
    def script(self) -> Optional[ScriptCellSettings]:
        """The tuned script's baseline settings; None when a model is tuned."""
        return self.baseline if isinstance(self.baseline, ScriptCellSettings) else None

    @property
    def label(self) -> str:
        """What is tuned: the model, or the script's file name."""
        baseline = self.baseline
        if isinstance(baseline, ScriptCellSettings):
            return script_label(baseline.script)
        return baseline.model

    @property
    def knob_root(self) -> str:
        """Where the knobs sit in best.yaml: the top level, or the script's section."""
        return f"{SECTION.key}." if self.script is not None else ""


def tune_folder(output_dir: Path, experiment: str) -> Path:
    return experiment_dir(Path(output_dir), experiment) / TUNE_DIR


def check_node_fits(baseline: TunedSettings) -> None:
    """Refuse (one line, exit 2) before anything is launched or written when this node cannot
    run the tuned cell: every trial would be skipped, and a tune of nothing is no verdict."""
    from torchscale.errors import ConfigError
    from torchscale.hardware.environment import CPU_SLOTS_ENV, node_devices
    from torchscale.launch.multinode import Launch
    from torchscale.launch.sweep import skip_reason
    from torchscale.tune.trials import tuned_cell

    devices = node_devices()
    reason = skip_reason(tuned_cell(baseline), devices, Launch())
    if reason is None:
        return
    fix = ""
    wanted = baseline.nproc_per_node
    if wanted > devices.count:
        fix = f": pass --gpus {devices.count}"
        if devices.kind == "cpu":
            fix += (
                f", or set {CPU_SLOTS_ENV}={wanted} to run {wanted} CPU processes on this "
                "node's cores"
            )
    raise ConfigError(f"tune cannot run here: its cell {reason}{fix}")


def trial_rows(study: optuna.Study) -> List[Dict[str, Any]]:
    rows = []
    for trial in study.get_trials(deepcopy=False):
        attrs = trial.user_attrs
        rows.append(
            {
                "number": trial.number,
                "state": trial.state.name.lower(),
                "role": attrs.get("role", "search"),
                "repeats_trial": attrs.get("repeats_trial"),
                "params": trial.params,
                "samples_per_s": trial.value,
                "screen_samples_per_s": attrs.get("screen_samples_per_s"),
                "status": attrs.get("status"),
                "error": attrs.get("error"),
                "screen_cell": attrs.get("screen_cell"),
                "full_cell": attrs.get("full_cell"),
            }
        )
    return rows


class Search:
    """The search loop over one study."""

    def __init__(self, request: TuneRequest, folder: Path, events: TuneEvents) -> None:
        self.request, self.folder, self.events = request, folder, events
        section = request.section
        identity = request.baseline.model_dump(mode="json", exclude=NON_IDENTITY_FIELDS)
        self.study = open_study(
            folder, request.space, identity, seed=section.seed, trial_cap=request.trial_cap
        )
        self.grid = request.space.grid()
        self.started = request.started
        end = self.started + request.budget_s * SEARCH_END  # no search cell runs past it
        self.runner = CellRunner(request.config, ExperimentStore(folder), events, end)
        screen = None
        if section.pruning:
            window = screen_window(request.baseline, section.screen_steps)
            screen = (
                CellRunner(request.config, ExperimentStore(folder / SCREEN_DIR), events, end),
                window,
            )
        self.batch = TrialBatch(
            self.study, request.space, request.baseline, self.runner, screen, self._told
        )
        self.batches = 0  # run by this process

    def left(self) -> float:
        """Seconds of the budget left."""
        return self.request.budget_s - (time.monotonic() - self.started)

    def batch_s(self, size: int) -> Optional[float]:
        """What a batch of ``size`` trials would cost: its screening run (every trial) and its
        full-window run (at most all of them promoted: the budget does not bet on pruning)."""
        full = self.runner.estimate(size)
        if self.batch.screen is None:
            return full
        screen = self.batch.screen[0].estimate(size)
        if screen is None or full is None:
            return None
        return screen + full

    def verdict_s(self, candidates: int, repeats: int) -> Optional[float]:
        """What a verdict of the baseline and ``candidates`` finalists, ``repeats`` rounds,
        would cost: one run of full-window cells."""
        return self.runner.estimate((candidates + 1) * repeats)

    def _told(self, number: int) -> None:
        trial = self.study.get_trials(deepcopy=False)[number]
        self.events.trial_told(number, {"state": trial.state.name.lower(), "best": self.best()})

    def best(self) -> Optional[Dict[str, Any]]:
        done = [r for r in trial_rows(self.study) if r["state"] == "complete"]
        if not done:
            return None
        top = max(done, key=lambda r: r["samples_per_s"])
        return {"number": top["number"], "samples_per_s": top["samples_per_s"],
                "params": top["params"]}  # fmt: skip

    def _pruned(self) -> bool:
        """Whether a trial was measured on the screening window (and pruned)."""
        return bool(self.study.get_trials(deepcopy=False, states=(states().PRUNED,)))

    def _room(self) -> int:
        """How many trials the next batch may hold (0: stop): as many as fit in the time left
        beside the smallest verdict (the baseline and one finalist, one round). Before anything
        was measured, the baseline and one trial: what a launch and a cell cost here is learnt
        from them."""
        request = self.request
        size = request.section.batch
        if request.trial_cap is not None:
            size = min(size, request.trial_cap - finished_count(self.study))
        if self.grid is not None:
            size = min(size, len(self.grid) - distinct_tried(self.study))
        verdict = self.verdict_s(1, 1)
        if verdict is None or self.batch_s(1) is None:
            # Nothing measured in this run yet: under a short budget a small first batch
            # teaches the costs; a long one has room for a whole batch first.
            first = FIRST_BATCH if request.budget_s < SHORT_BUDGET_S else size
            return max(min(size, first if not self.batches else size), 0)
        fits = 0
        for trials in range(1, size + 1):
            cost = self.batch_s(trials)
            if cost is None or cost + verdict > self.left():
                break
            fits = trials
        return fits

    def run(self) -> None:
        stale = stale_trials(self.study)
        if stale:
            self.events.phase(f"resuming {len(stale)} unfinished trial(s)")
            self.batch.run(stale)
        stale_batches = failed_batches = 0
        while stale_batches < STALE_BATCHES:
            Interrupts.check()
            size = self._room()
            if size <= 0:
                return
            if failed_batches >= FAILED_BATCHES and self.best() is None and not self._pruned():
                self.events.phase(
                    f"stopping: none of the first {finished_count(self.study)} trials could be "
                    f"measured ({outputs.SUMMARY_FILE} has their errors)"
                )
                return
            failed_batches += 1
            self.events.phase(f"trials {finished_count(self.study) + 1}..")
            tried = distinct_tried(self.study)
            self.batch.run([self.study.ask() for _ in range(size)])
            self.batches += 1
            # A sampler that only proposes settings already tried has nothing new to offer.
            stale_batches = stale_batches + 1 if distinct_tried(self.study) == tried else 0


def _finalists(study: optuna.Study, space: SearchSpace, count: int) -> List[Candidate]:
    """The best full-window trials other than the baseline; where fewer than ``count`` finished
    the full window, the best pruned ones (by their screening value) fill in: the verdict, not
    the short screen, is the judge."""
    baseline = space.baseline_params()
    done = study.get_trials(deepcopy=False, states=(states().COMPLETE,))
    pruned = study.get_trials(deepcopy=False, states=(states().PRUNED,))
    # A COMPLETE trial always has its value.
    ranked = sorted(done, key=lambda t: t.value or 0.0, reverse=True) + sorted(
        pruned, key=lambda t: t.intermediate_values.get(SCREEN_STEP, 0.0), reverse=True
    )
    seen, chosen = set(), []
    for trial in ranked:
        key = tuple(sorted(trial.params.items()))
        if trial.params == baseline or key in seen:
            continue
        seen.add(key)
        value = trial.value if trial.value is not None else trial.intermediate_values[SCREEN_STEP]
        chosen.append(
            Candidate(trial.number, dict(trial.params), space.changes(trial.params), value)
        )
    return chosen[:count]


def run_tune(request: TuneRequest, events: TuneEvents) -> Dict[str, Any]:
    """Search, judge, write the outputs; the summary (tune.json's content)."""
    folder = tune_folder(request.output_dir, request.config.experiment_name)
    with tune_lock(folder), Interrupts.watched():
        search = Search(request, folder, events)
        spent = None
        try:
            search.run()
        except BudgetSpent:
            spent = search.left()
        section = request.section
        candidates = _finalists(search.study, request.space, section.finalists)
        winner = None
        verdict: Dict[str, Any] = {"repeats": section.repeats, "min_gain_pct": section.min_gain_pct}
        shape = _verdict_shape(search, len(candidates), section.repeats) if candidates else None
        if spent is not None:
            verdict["over_budget"] = (
                f"the budget ({request.budget_s:g} s) ran out during the first trials, before "
                "one verdict could run; rerun with a larger --budget"
            )
            events.phase(f"no verdict: {verdict['over_budget']}")
            candidates = []
        elif candidates and shape is None:
            needs, left = search.verdict_s(1, 1) or 0.0, search.left()
            verdict["over_budget"] = (
                f"the budget ({request.budget_s:g} s) cannot hold one verdict here: the baseline "
                f"and one finalist, one round, take about {needs:.0f} s and {max(left, 0):.0f} s "
                "are left after the first trials; rerun with --budget "
                f"{math.ceil(request.budget_s - left + needs) + 1}s or more"
            )
            events.phase(f"no verdict: {verdict['over_budget']}")
            candidates = []
        elif shape is not None and shape != (len(candidates), section.repeats):
            events.phase(
                f"the verdict shrunk to fit the budget: {shape[0]} finalist(s), {shape[1]} "
                f"round(s) (asked: {len(candidates)}, {section.repeats})"
            )
            candidates = candidates[: shape[0]]
            verdict["repeats"] = shape[1]
            verdict["shrunk_to_fit_budget"] = True
        if candidates:
            per_candidate = verdict_cells(
                request.baseline, [c.params for c in candidates], verdict["repeats"]
            )
            store = ExperimentStore(folder / VERDICT_DIR / round_name(per_candidate))
            events.phase(f"verdict: baseline and {len(candidates)} finalist(s) interleaved")
            # Past the budget's tolerance the verdict is ended rather than finished late.
            end = request.started + request.budget_s * VERDICT_TOLERANCE
            try:
                results = CellRunner(request.config, store, events, end).run(
                    interleaved(per_candidate), [k.name for k in request.space.knobs]
                )
            except BudgetSpent:
                verdict["over_budget"] = (
                    f"the verdict ran past the budget ({request.budget_s:g} s) and was ended: "
                    "its cells ran slower than the trials before it; rerun with a larger --budget"
                )
                events.phase(f"no verdict: {verdict['over_budget']}")
                verdict["finalists"] = []
                summary = _summary(request, search, folder, [], None, verdict)
                _write(request, folder, summary, None)
                return summary
            winner = judge(
                candidates,
                per_candidate,
                results,
                section.min_gain_pct,
                section.seed,
                request.noise_floor_pct,
            )
            verdict["folder"] = str(store.root.relative_to(folder))
            verdict["noise_floor_pct"] = request.noise_floor_pct
            verdict.update(host_waits(list(results.values())))
            if _unjudged(verdict, request):
                # Measured while other processes held the cores: no verdict rests on it.
                winner = None
                for candidate in candidates:
                    candidate.significant = False
                    candidate.note = NOT_JUDGED
        verdict["finalists"] = [c.as_dict() for c in candidates]
        summary = _summary(request, search, folder, candidates, winner, verdict)
        _write(request, folder, summary, winner)
        return summary


def _verdict_shape(search: Search, finalists: int, repeats: int) -> Optional[Tuple[int, int]]:
    """The largest verdict (finalists, rounds) that fits in the budget's time left, the most
    cells first, then the most rounds; the one asked for when its cost is not known; None when
    not even the baseline and one finalist, one round, fit."""
    if search.verdict_s(finalists, repeats) is None:
        return finalists, repeats
    shapes = [(k, r) for k in range(finalists, 0, -1) for r in range(repeats, 0, -1)]
    fitting = [s for s in shapes if (search.verdict_s(*s) or 0.0) <= search.left()]
    if not fitting:
        return None
    return max(fitting, key=lambda s: ((s[0] + 1) * s[1], s[1]))


def _unjudged(verdict: Dict[str, Any], request: TuneRequest) -> bool:
    """Whether the verdict was measured on a busy host with no noise stated (no verdict)."""
    busy = verdict.get("oversubscribed_wait_share") is not None
    return not verdict_allowed(busy, request.noise_floor_pct is not None)


def _contended(verdict: Dict[str, Any]) -> Optional[str]:
    """The verdict's warning when its ranks waited for CPUs: behind other processes (an
    oversubscribed host), or behind their own threads (gloo's and DDP's on the same cores)."""
    from torchscale.analysis.cpu_load import CPU_WAIT_SHARE

    others = verdict.get("oversubscribed_wait_share")
    if others is not None:
        return (
            f"the host was oversubscribed during the verdict: a rank waited for a CPU {others:.0%} "
            "of its window while other processes held the cores, so the figures reflect them as "
            "much as DDP's settings; rerun on a quiet node"
        )
    share = verdict.get("cpu_wait_share")
    if share is None or share < CPU_WAIT_SHARE:
        return None
    return (
        f"the cores were contended during the verdict: a rank waited for a CPU {share:.0%} of its "
        "window behind its own threads (gloo's and DDP's run on the same cores); on such a host "
        "the throughput drifts between runs, which the interval covers only with repeats of 2 "
        "or more; more cores per rank make the figures steadier"
    )


def _summary(
    request: TuneRequest,
    search: Search,
    folder: Path,
    candidates: List[Candidate],
    winner: Optional[Candidate],
    verdict: Dict[str, Any],
) -> Dict[str, Any]:
    space = request.space
    trials = trial_rows(search.study)
    busy = verdict.get("oversubscribed_wait_share") if _unjudged(verdict, request) else None
    result = outputs.outcome(winner, candidates, busy)
    files = {
        "best": outputs.BEST_FILE,
        "baseline": outputs.BASELINE_FILE,
        "snippet": outputs.SNIPPET_FILE,
        "study": TUNE_STUDY,
    }
    if result in outputs.NO_OUTPUTS:  # no verdict: nothing to reproduce or paste
        files = {"study": TUNE_STUDY}
    return {
        "experiment": request.config.experiment_name,
        "tune_dir": str(folder),
        "model": request.label,
        "batch_size": getattr(request.baseline, "batch_size", None),
        "gpus": request.baseline.gpus,
        "result": result,
        "line": (
            f"> [TUNE] nothing measured: {verdict['over_budget']}; no {outputs.BEST_FILE} written"
            if verdict.get("over_budget")
            else outputs.tune_line(winner, candidates, trials, busy)
        ),
        "baseline": space.baseline_params(),
        "winner": winner.as_dict() if winner else None,
        "space": {
            name: list(c) if isinstance(c, tuple) else c.model_dump()
            for name, c in space.candidates.items()
        },
        "knob_changes": {k.name: k.changes for k in space.knobs},
        "left_out": space.left_out,
        "pruning": request.section.pruning,
        "trials": trials,
        "verdict": verdict,
        "warning": _contended(verdict),
        "files": files,
    }


def _write(
    request: TuneRequest, folder: Path, summary: Dict[str, Any], winner: Optional[Candidate]
) -> None:
    from torchscale.tune.space import apply_params

    name = request.config.experiment_name
    params = winner.changed if winner else {}
    placed = {f"{request.knob_root}{knob}": value for knob, value in params.items()}
    best = outputs.reproducing_config(request.raw, request.pinned, placed, f"{name}-best")
    baseline = outputs.reproducing_config(request.raw, request.pinned, {}, f"{name}-baseline")
    header = f"torchscale tune, {name}: {summary['line'].removeprefix('> [TUNE] ')}"
    if request.script is not None:
        snippet = outputs.script_snippet(params, header)
    else:
        settings = apply_params(request.baseline, params).model_dump(mode="json")
        snippet = outputs.ddp_snippet(settings, header)
    outputs.write_outputs(folder, summary, best, baseline, snippet)
