"""Between-run noise: how far two runs of an unchanged cell disagree, what says so, and the
interval of a change that follows.

Steps within one run are not independent draws: the node drifts (other processes, frequency,
caches), so two runs of the same cell differ by far more than a bootstrap of one run's steps
says. Measured on the 2-core VM (``benchmarks/compare_noise.py``, docs/PERFORMANCE.md): across
40 unchanged runs the change of a cell's log throughput and log p95 between runs followed the
cell's own step-time CV (cells whose steps varied by under 10% moved by up to 11%, cells whose
steps varied by 25-47% by up to 92%), with a factor of 0.94 and 1.13 at the 95th percentile of
cell pairs and 1.37 and 1.50 at the 99th. So the between-run standard deviation of one run's log
figure is modelled as ``factor x CV`` (CV: the root mean square of the compared records'
step-time CVs), with the factor

- measured from the runs' own repeats (``repeats: N``) where either run has some: pooled over
  every cell with two or more repeats, with Student's t for its degrees of freedom; a cell with
  repeats on both sides is then decided by its *repeats* (its figures averaged over them), any
  other by that *measured floor*;
- else DEFAULT_FACTOR, between the 95th and the 99th percentile above (a *default floor*);

unless a floor is *stated* (``compare --noise-floor PCT``): then one run's figure is taken to
stay within PCT of another's, 95% of the time, for every cell alike. A cell measured while
other processes held the cores (``analysis.cpu_load``) is not judged at all (OVERSUBSCRIBED:
under load whole runs ran 2-3x slower, with steps about as noisy) unless a floor is stated; when
no cell could be judged, ``compare`` says so and exits 2 rather than pass on nothing.

The change's interval is centred on the measured change, with a half-width of the quantile times
``sigma * sqrt(1/k_old + 1/k_new)`` (k: repeats on each side), never narrower than the steps' own
bootstrap interval. Intervals are simultaneous: with m figures compared each is a 1 - alpha/m
interval (Bonferroni), so two unchanged runs of a matrix pass with the stated confidence, not
each figure alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Iterable, Optional, Sequence, Tuple

from torchscale.measures.figures import BUSY_HOST
from torchscale.measures.stats import t_quantile

REPEATS = "repeats"
MEASURED_FLOOR = "measured floor"
STATED_FLOOR = "stated floor"
DEFAULT_FLOOR = "default floor"
NO_MODEL = "threshold only"  # no step times: nothing to scale a floor by
OVERSUBSCRIBED = BUSY_HOST  # other processes held the cores: not judged (analysis.busy_host)
DEFAULT_FACTOR = 1.2
"""Between-run sigma of one run's log figure over the cell's step-time CV (see above)."""
BAND = NormalDist().inv_cdf(0.975)  # a stated floor is a 95% band
RepeatGroup = Tuple[Sequence[float], Optional[float]]  # one cell's figure per repeat, its CV


@dataclass(frozen=True)
class Spread:
    """How the between-run sigma of one figure is known: ``factor`` x CV, or a stated
    ``sigma``; ``df`` the degrees of freedom of a measured factor (None: taken as known)."""

    kind: str
    factor: Optional[float] = None
    sigma: Optional[float] = None
    df: Optional[int] = None
    groups: int = 0  # repeat groups a measured factor was pooled over

    def sigma_for(self, cv: Optional[float]) -> Optional[float]:
        if self.sigma is not None:
            return self.sigma
        if cv is None or not math.isfinite(cv) or self.factor is None:
            return None
        return self.factor * cv

    def describe(self) -> str:
        if self.kind == STATED_FLOOR:
            return f"stated floor: ±{floor_pct(self.sigma or 0.0):.3g}% between single runs"
        if self.kind == DEFAULT_FLOOR:
            return (
                f"default floor: between-run spread {self.factor:g} x each cell's step-time CV "
                "(measured on a 2-core VM, docs/report.md)"
            )
        return (
            f"between-run spread {self.factor:.2f} x each cell's step-time CV, measured from "
            f"the repeats of {self.groups} cell run(s) ({self.df} degrees of freedom)"
        )


def floor_pct(sigma: float) -> float:
    """The change (%) two unchanged single runs stay within 95% of the time, for a sigma."""
    return 100 * (_exp(BAND * math.sqrt(2) * sigma) - 1)


def stated(pct: float) -> Spread:
    return Spread(STATED_FLOOR, sigma=math.log1p(pct / 100) / (BAND * math.sqrt(2)))


def rms(values: Iterable[Optional[float]]) -> Optional[float]:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return math.sqrt(sum(v * v for v in kept) / len(kept)) if kept else None


def measured(groups: Iterable[RepeatGroup]) -> Optional[Spread]:
    """The factor pooled over repeat groups: (one cell's figure in each of its repeats in one run,
    that cell's step-time CV in that run). Groups of one repeat, or without a CV, say nothing."""
    squares, df, count = 0.0, 0, 0
    for values, cv in groups:
        logs = [math.log(v) for v in values if v > 0 and math.isfinite(v)]
        if len(logs) < 2 or cv is None or not cv > 0:
            continue
        mean = sum(logs) / len(logs)
        squares += sum((x - mean) ** 2 for x in logs) / (cv * cv)
        df += len(logs) - 1
        count += 1
    if not df:
        return None
    return Spread(MEASURED_FLOOR, factor=math.sqrt(squares / df), df=df, groups=count)


def choose(stated_pct: Optional[float], repeat_groups: Sequence[RepeatGroup]) -> Spread:
    """The spread that decides: stated, else measured from repeats, else the default."""
    if stated_pct is not None:
        return stated(stated_pct)
    return measured(repeat_groups) or Spread(DEFAULT_FLOOR, factor=DEFAULT_FACTOR)


def cell_model(spread: Spread, old_repeats: int, new_repeats: int, cv: Optional[float]) -> str:
    """Which noise model decides one cell."""
    if spread.sigma_for(cv) is None:
        return NO_MODEL
    if spread.kind == MEASURED_FLOOR and min(old_repeats, new_repeats) >= 2:
        return REPEATS
    return spread.kind


def change_interval(
    ratio: float,
    spread: Spread,
    cv: Optional[float],
    repeats: Tuple[int, int],
    confidence: float,
    steps: Optional[Tuple[float, float, float]] = None,
) -> Tuple[float, float]:
    """The interval of ``ratio`` (new / old figure) under the between-run noise, as ratios;
    ``steps`` is the steps' own bootstrap (estimate, low, high) of the ratio: its widths are a
    lower bound on the interval's."""
    log_ratio = math.log(ratio)
    below = above = 0.0
    sigma = spread.sigma_for(cv)
    if sigma is not None:
        quantile = t_quantile(1 - (1 - confidence) / 2, spread.df)
        below = above = quantile * sigma * math.sqrt(1 / repeats[0] + 1 / repeats[1])
    if steps is not None and all(s > 0 and math.isfinite(s) for s in steps):
        point, low, high = (math.log(s) for s in steps)
        below, above = max(below, point - low), max(above, high - point)
    return _exp(log_ratio - below), _exp(log_ratio + above)


def _exp(value: float) -> float:
    """``exp`` that saturates (0 or infinity) instead of raising: a record with an extreme
    step-time CV (hundreds) has an interval wider than a float holds, which says only that the
    change cannot be judged."""
    try:
        return math.exp(value)
    except OverflowError:
        return math.inf
