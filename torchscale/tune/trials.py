"""Trials as benchmark cells: a trial's parameters become the baseline cell with those knobs set,
and a batch of cells runs through the sweep (``launch.sweep.run_sweep``) in one call, like any
benchmark: its records go to results.jsonl, a failed or OOM cell is a record, and a cell that
already has a record (a resumed run, a trial that repeats an earlier one) is not run again.

With pruning, each trial first runs on a short *screening* window; Optuna's successive-halving
pruner promotes the promising ones, which then run on the config's full window.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Callable,
    Dict,
    Iterator,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
)

from torchscale.config.settings import BenchmarkConfig
from torchscale.errors import ConfigError
from torchscale.launch.sweep import SweepEvents, SweepOptions, run_sweep
from torchscale.plan.kind_protocol import cell_kinds
from torchscale.plan.matrix import Plan
from torchscale.plan.planned_cell import Cell
from torchscale.results.schema import ResultBase, TrainingResult
from torchscale.results.store import ExperimentStore
from torchscale.tune.space import SearchSpace, TunedSettings, apply_params

if TYPE_CHECKING:
    from types import FrameType

    import optuna
    from optuna.trial import Trial
    from pandas import DataFrame


log = logging.getLogger("torchscale")
SCREEN_STEP = 1  # the intermediate step the screening value is reported at
ERROR_CHARS = 500


def screen_window(baseline: TunedSettings, steps: Optional[int]) -> Dict[str, object]:
    """The screening window: a quarter of the full one (at least 3 steps), no sync probe."""
    if baseline.measure_seconds is not None:
        return {"measure_seconds": baseline.measure_seconds / 4, "sync_probe_steps": 0}
    full = baseline.measure_steps or 50
    return {"measure_steps": steps or max(3, full // 4), "sync_probe_steps": 0}


def tuned_cell(settings: TunedSettings) -> Cell:
    """The cell of a trial's settings, of the kind those settings are (a model's training
    cell, or a script's)."""
    for kind in cell_kinds().values():
        if type(settings) is kind.settings_model:
            return Cell(0, kind.cell_id(settings), settings, kind.name)
    raise TypeError(f"no cell kind has {type(settings).__name__} settings")


def make_cell(
    baseline: TunedSettings, params: Dict[str, object], extra: Dict[str, object], number: int
) -> Cell:
    """Trial ``number``'s cell. The trial number is the cell's repeat index: cells of different
    trials never share an id but for their settings, which the sweep would take for one cell
    whose settings changed since its stored result (and refuse)."""
    return tuned_cell(apply_params(baseline, {**params, **extra, "repeat": number}))


def objective(record: Optional[ResultBase]) -> Optional[float]:
    """Samples/s of a measured record; None for anything else (failed, OOM, skipped...)."""
    if isinstance(record, TrainingResult) and record.status == "ok" and record.samples_per_s:
        return float(record.samples_per_s)
    return None


ESTIMATE_MARGIN = 1.2
"""What the budget adds to a run's estimated time: on the shared 2-core VM a cell ran up to 1.6x
slower than the one before it (docs/PERFORMANCE.md, tune --budget)."""


class CellRunner:
    """Runs lists of cells in one experiment store, each list with one sweep call."""

    def __init__(
        self,
        config: BenchmarkConfig,
        store: ExperimentStore,
        events: SweepEvents,
        deadline: Optional[float] = None,
    ):
        self.config = config
        self.store = store
        self.events = events
        self.deadline = deadline  # monotonic: a cell still running then is ended (BudgetSpent)
        self.seconds_per_cell: Optional[float] = None  # measured, for the budget
        # What a run of k cells costs here, launch_s + k x cell_s (cells of one launch layout
        # share one warm launch): from the records' own wall times, for the budget.
        self.launch_s: Optional[float] = None
        self.cell_s: Optional[float] = None

    def estimate(self, cells: int) -> Optional[float]:
        """Seconds a run of ``cells`` cells would take here; None before anything ran."""
        if cells <= 0:
            return 0.0
        if self.launch_s is not None and self.cell_s is not None:
            return ESTIMATE_MARGIN * (self.launch_s + cells * self.cell_s)
        if self.seconds_per_cell is not None:  # one cell per run so far: launch included
            return ESTIMATE_MARGIN * cells * self.seconds_per_cell
        return None

    def _learn(self, ran: List[ResultBase], spent: float) -> None:
        """Split a run's time into its launch and its cells: the first cell's wall time holds
        the launch's start-up, the others are cells alone; what the sweep spent beyond the
        cells' wall times (planning, the records) goes with the launch."""
        walls = [r.wall_s for r in ran if r.wall_s is not None and r.wall_s > 0]
        if not walls:
            return
        # The slowest seen, not the mean: on a shared host the next run is as likely slower.
        if len(walls) > 1:
            self.cell_s = max(self.cell_s or 0.0, *walls[1:])
        if self.cell_s is None:
            return
        if len(walls) > 1:
            first = max(0.0, walls[0] - statistics.median(walls[1:]))
            launch = max(0.0, spent - sum(walls)) + first
        else:
            launch = max(0.0, spent - self.cell_s)
        self.launch_s = max(self.launch_s or 0.0, launch)

    def run(
        self,
        cells: Sequence[Cell],
        swept: List[str],
        on_record: Optional[Callable[[str, Optional[ResultBase]], None]] = None,
    ) -> Dict[str, ResultBase]:
        """Every cell's record (run now, or stored before), by cell id. ``on_record`` hears of
        each cell's record as soon as it exists (so a trial is told before the batch ends, and
        Ctrl-C loses nothing finished), then of every cell the sweep did not run (stored)."""
        known = self.store.records() if self.store.results_path.exists() else []
        done = {r.cell_id for r in known}
        wanted: Dict[str, Cell] = {}
        for cell in cells:
            wanted.setdefault(cell.cell_id, cell)
        todo = [c for c in wanted.values() if c.cell_id not in done]
        plan_cells = [Cell(i, c.cell_id, c.settings, c.kind) for i, c in enumerate(wanted.values())]
        heard: Set[str] = set()

        def finished(cell: Cell, records: List[ResultBase]) -> None:
            heard.add(cell.cell_id)
            if on_record is not None:
                on_record(cell.cell_id, records[0] if records else None)

        started = time.monotonic()
        records = run_sweep(
            Plan(self.config, plan_cells, swept),
            self.store,
            SweepOptions(resume=True),
            _Heard(self.events, finished, self.deadline),
        )
        if todo:
            elapsed = time.monotonic() - started
            spent = elapsed / len(todo)
            previous = self.seconds_per_cell
            self.seconds_per_cell = spent if previous is None else (previous + spent) / 2
            ids = {c.cell_id for c in todo}
            self._learn([r for r in records if r.cell_id in ids], elapsed)
        Interrupts.check()
        by_id = {r.cell_id: r for r in records}
        for cid in wanted:
            if cid not in heard and on_record is not None:
                on_record(cid, by_id.get(cid))
        return {cid: by_id[cid] for cid in wanted if cid in by_id}


class Interrupts:
    """Ctrl-C that is not lost. Python raises KeyboardInterrupt wherever the main thread is, and
    one raised inside a finalizer (a database connection collected mid-tell, say) is printed and
    dropped; the flag set here makes the next cell boundary raise it again."""

    hit = False

    @classmethod
    @contextlib.contextmanager
    def watched(cls) -> Iterator[None]:
        cls.hit = False
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.getsignal(signal.SIGINT)

        def handler(signum: int, frame: Optional[FrameType]) -> None:
            cls.hit = True
            raise KeyboardInterrupt

        if previous is signal.default_int_handler:
            signal.signal(signal.SIGINT, handler)
        try:
            yield
        finally:
            if previous is signal.default_int_handler:
                signal.signal(signal.SIGINT, previous)

    @classmethod
    def check(cls) -> None:
        if cls.hit:
            raise KeyboardInterrupt


class BudgetSpent(KeyboardInterrupt):
    """The budget's time ran out while a cell ran: the sweep ends its processes (as on Ctrl-C),
    keeps what finished, and tune says what the budget could not hold."""


class _Heard:
    """The sweep's events, passed on, with each finished cell also handed to ``finished``; past
    ``deadline`` (monotonic) a running cell is ended."""

    def __init__(
        self,
        events: SweepEvents,
        finished: Callable[[Cell, List[ResultBase]], None],
        deadline: Optional[float] = None,
    ):
        self.events, self.finished, self.deadline = events, finished, deadline

    def cell_started(self, cell: Cell, position: int, total: int, cell_dir: Path) -> None:
        Interrupts.check()
        self.events.cell_started(cell, position, total, cell_dir)

    def cell_polled(self, elapsed_s: float) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise BudgetSpent
        self.events.cell_polled(elapsed_s)

    def cell_finished(
        self, cell: Cell, records: List[ResultBase], table: Optional[DataFrame]
    ) -> None:
        self.events.cell_finished(cell, records, table)
        self.finished(cell, records)
        Interrupts.check()


def by_screen_cells(entries: Sequence[Entry]) -> List[Cell]:
    return [e.screen for e in entries if e.screen is not None]


@dataclass
class Entry:
    trial: Trial
    params: Dict[str, object]
    screen: Optional[Cell]
    full: Cell


class TrialBatch:
    """Suggest, run and tell one batch of Optuna trials."""

    def __init__(
        self,
        study: optuna.Study,
        space: SearchSpace,
        baseline: TunedSettings,
        runner: CellRunner,
        screen: Optional[Tuple[CellRunner, Dict[str, object]]],
        on_told: Callable[[int], None],
    ) -> None:
        from torchscale.tune.study import states

        self.study, self.space, self.baseline = study, space, baseline
        self.runner, self.screen, self.on_told = runner, screen, on_told
        self.states = states()
        self.swept = [knob.name for knob in space.knobs]

    def _fail(self, entry_trial: Trial, status: str, error: Optional[str]) -> None:
        entry_trial.set_user_attr("status", status)
        entry_trial.set_user_attr("error", (error or "")[:ERROR_CHARS])
        self.study.tell(entry_trial, state=self.states.FAIL)
        self.on_told(entry_trial.number)

    def _entries(self, trials: Sequence[Trial]) -> List[Entry]:
        entries = []
        for trial in trials:
            params = self.space.suggest(trial)
            if self._repeats_earlier(trial, params):
                continue
            number = trial.number
            try:
                full = make_cell(self.baseline, params, {}, number)
                screen = (
                    make_cell(self.baseline, params, self.screen[1], number)
                    if (self.screen)
                    else None
                )
            except ConfigError as exc:  # a combination the config forbids
                self._fail(trial, "invalid", f"not a valid combination: {exc}")
                continue
            trial.set_user_attr("full_cell", full.cell_id)
            if screen is not None:
                trial.set_user_attr("screen_cell", screen.cell_id)
            entries.append(Entry(trial, params, screen, full))
        return entries

    def _repeats_earlier(self, trial: Trial, params: Dict[str, object]) -> bool:
        """A trial with the parameters of a finished one is told that one's outcome, not run."""
        done = (self.states.COMPLETE, self.states.PRUNED, self.states.FAIL)
        for earlier in self.study.get_trials(deepcopy=False, states=done):
            if earlier.params != params:
                continue
            trial.set_user_attr("repeats_trial", earlier.number)
            for key in ("status", "error", "screen_samples_per_s", "full_cell", "screen_cell"):
                if key in earlier.user_attrs:
                    trial.set_user_attr(key, earlier.user_attrs[key])
            if earlier.state == self.states.COMPLETE:
                self.study.tell(trial, earlier.value)
            else:
                if earlier.state == self.states.PRUNED:
                    trial.report(earlier.intermediate_values[SCREEN_STEP], SCREEN_STEP)
                self.study.tell(trial, state=earlier.state)
            self.on_told(trial.number)
            return True
        return False

    def run(self, trials: Sequence[Trial]) -> None:
        entries = self._entries(trials)
        promoted: List[Entry] = []
        if self.screen is not None and entries:
            runner, window = self.screen
            by_screen = {e.screen.cell_id: e for e in entries if e.screen}

            def screened(cid: str, record: Optional[ResultBase]) -> None:
                entry = by_screen[cid]
                value = objective(record)
                if value is None:
                    self._fail_record(entry.trial, record)
                    return
                entry.trial.set_user_attr("screen_samples_per_s", value)
                entry.trial.report(value, SCREEN_STEP)
                if entry.trial.should_prune():
                    self.study.tell(entry.trial, state=self.states.PRUNED)
                    self.on_told(entry.trial.number)
                else:
                    promoted.append(entry)

            runner.run(list(by_screen_cells(entries)), [*self.swept, *window], screened)
        else:
            promoted = entries
        if not promoted:
            return
        by_full = {e.full.cell_id: e for e in promoted}

        def measured(cid: str, record: Optional[ResultBase]) -> None:
            entry = by_full[cid]
            value = objective(record)
            if value is None:
                self._fail_record(entry.trial, record)
                return
            entry.trial.set_user_attr("status", "ok")
            self.study.tell(entry.trial, value)
            self.on_told(entry.trial.number)

        self.runner.run([e.full for e in promoted], self.swept, measured)

    def _fail_record(self, trial: Trial, record: Optional[ResultBase]) -> None:
        if record is None:
            self._fail(trial, "missing", "the sweep returned no record for its cell")
        else:
            self._fail(trial, record.status, record.error or f"status {record.status}")
