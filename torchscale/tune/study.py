"""The Optuna study behind ``tune``: SQLite storage in the tune folder, so a run resumes.

``DIR/<experiment>/tune/study.db`` holds every trial: its parameters, its screening value
(an intermediate value) and its final value or state. A rerun of the same command loads it;
trials a killed run left RUNNING are carried on (their finished cells are not run again). A
study of another baseline or space is refused rather than mixed in.

Sampling: when the whole space is discrete and no larger than the trial cap (``EXHAUSTIVE_MAX``
without one), every combination is enqueued (nothing left to chance, none tried twice);
otherwise TPE (``constant_liar`` so a batch asked at once spreads out). Trial 0 is always the
baseline. Pruning: Optuna's ``SuccessiveHalvingPruner`` over the screening values (docs/tune.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional

from torchscale.errors import TorchscaleError
from torchscale.results.files import dumps, ensure_dir, open_for_write, refuse_link
from torchscale.results.layout import TUNE_LOCK, TUNE_STUDY
from torchscale.results.store import storage_error
from torchscale.tune.space import SearchSpace

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import Trial


STUDY_FILE = TUNE_STUDY
STUDY_NAME = "tune"
LOCK_FILE = TUNE_LOCK
IDENTITY_ATTR = "torchscale_identity"
EXHAUSTIVE_MAX = 32
"""Without --trials, a discrete space of at most this many combinations is tried whole."""


def _optuna() -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our console says what happened
    logging.getLogger("alembic").setLevel(logging.WARNING)
    return optuna


@contextlib.contextmanager
def tune_lock(folder: Path) -> Iterator[None]:
    """Hold the tune folder for this run (the sweep locks the trial store only per batch)."""
    try:
        ensure_dir(folder)
        fd = open_for_write(folder / LOCK_FILE, read=True)
    except OSError as exc:
        raise storage_error(folder, exc) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise TorchscaleError(
                f"{folder} is being tuned by another torchscale; wait for it to finish or "
                "choose another --output-dir"
            ) from None
        yield
    finally:
        os.close(fd)


def identity(space: SearchSpace, baseline: Dict[str, object]) -> str:
    """What a stored study must match to be resumed: the baseline cell and the space."""
    candidates = {
        name: list(c) if isinstance(c, tuple) else c.model_dump()
        for name, c in space.candidates.items()
    }
    return dumps({"baseline": baseline, "space": candidates}, sort_keys=True)


def open_study(
    folder: Path,
    space: SearchSpace,
    baseline: Dict[str, object],
    *,
    seed: int,
    trial_cap: Optional[int],
    reduction_factor: int = 2,
) -> Study:
    """Create or load the study; a new one gets the baseline (and, for a small discrete space,
    every other combination) enqueued."""
    optuna = _optuna()
    path = folder / STUDY_FILE
    refuse_link(path)
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
    grid = space.grid()
    exhaustive = grid is not None and len(grid) <= (trial_cap or EXHAUSTIVE_MAX)
    sampler = optuna.samplers.TPESampler(
        seed=seed, constant_liar=True, n_startup_trials=min(10, trial_cap or 10)
    )
    pruner = optuna.pruners.SuccessiveHalvingPruner(
        min_resource=1, reduction_factor=reduction_factor
    )
    study: Study = optuna.create_study(
        study_name=STUDY_NAME,
        storage=storage,
        direction="maximize",
        sampler=sampler,
        pruner=pruner,
        load_if_exists=True,
    )
    wanted = identity(space, baseline)
    stored = study.user_attrs.get(IDENTITY_ATTR)
    if stored is None and not study.trials:
        study.set_user_attr(IDENTITY_ATTR, wanted)
        study.enqueue_trial(space.baseline_params(), user_attrs={"role": "baseline"})
        if exhaustive and grid is not None:
            for params in grid:
                study.enqueue_trial(params, skip_if_exists=True)
    elif stored != wanted:
        raise TorchscaleError(
            f"{folder} holds a tuning of another baseline or search space; rerun with the same "
            "config and options to resume it, or choose another --output-dir"
        )
    return study


def stale_trials(study: Study) -> List[Trial]:
    """Trials a killed run left RUNNING: carried on by this run (Trial objects)."""
    optuna = _optuna()
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    return [optuna.trial.Trial(study, frozen._trial_id) for frozen in running]


def finished_count(study: Study) -> int:
    optuna = _optuna()
    done = (
        optuna.trial.TrialState.COMPLETE,
        optuna.trial.TrialState.PRUNED,
        optuna.trial.TrialState.FAIL,
    )
    return len(study.get_trials(deepcopy=False, states=done))


def distinct_tried(study: Study) -> int:
    """Distinct parameter sets finished or under way (a discrete space is exhausted at its
    grid size)."""
    optuna = _optuna()
    states = (
        optuna.trial.TrialState.COMPLETE,
        optuna.trial.TrialState.PRUNED,
        optuna.trial.TrialState.FAIL,
        optuna.trial.TrialState.RUNNING,
    )
    trials = study.get_trials(deepcopy=False, states=states)
    return len({tuple(sorted(t.params.items())) for t in trials})


def states() -> Any:
    return _optuna().trial.TrialState
