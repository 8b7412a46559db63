"""Bootstrap intervals of per-step figures, in memory that does not grow with the step count.

A record of n steps is resampled as ``min(n, MAX_BLOCKS)`` contiguous blocks drawn with
replacement. Up to MAX_BLOCKS steps every block is one step: the plain bootstrap of steps, exact
(the resampled steps themselves, CHUNK_ELEMENTS at a time). Beyond, the blocks hold about
n / MAX_BLOCKS neighbouring steps each: a block bootstrap, which also keeps what neighbouring
steps share (drift within a run) and which a bootstrap of single steps would hide. A resample's
mean then comes from its blocks' sums, and its p95 from its blocks' histograms (HISTOGRAM_BINS
log-spaced bins from the sample's median to its slowest step, one more for the steps below: a
bin is 0.45% wide when the slowest step is 10 times the median). So a million steps cost
MAX_BLOCKS x HISTOGRAM_BINS counts, not resamples x steps draws (a draw per
resample and step asked for 14.9 GiB at a million steps, and crashed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Protocol, Sequence, Tuple, Union

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
MAX_BLOCKS = 1000
CHUNK_ELEMENTS = 1 << 21  # draws held at once: 16 MiB of indices, 16 MiB of values
HISTOGRAM_BINS = 512
Samples = Union[Sequence[float], FloatArray]


class Draws(Protocol):
    """How to draw: ``compare``'s options (``CompareOptions``) or tune's."""

    @property
    def resamples(self) -> int: ...

    @property
    def confidence(self) -> float: ...

    @property
    def seed(self) -> int: ...


@dataclass(frozen=True)
class Statistic:
    """A figure of a run's steps: ``of`` maps (..., steps) to (...)."""

    name: str
    quantile: float  # 0.95 for p95; NaN for the mean
    of: Callable[[FloatArray], FloatArray]


MEAN = Statistic("mean", float("nan"), lambda a: np.asarray(a.mean(axis=-1), dtype=np.float64))
P95 = Statistic("p95", 0.95, lambda a: np.asarray(np.percentile(a, 95, axis=-1), dtype=np.float64))


def _rows_per_chunk(width: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(1, width))


def _plain(values: FloatArray, statistic: Statistic, resamples: int, rng: np.random.Generator
           ) -> FloatArray:  # fmt: skip
    out = np.empty(resamples)
    rows = _rows_per_chunk(len(values))
    for start in range(0, resamples, rows):
        count = min(rows, resamples - start)
        out[start : start + count] = statistic.of(
            values[rng.integers(0, len(values), (count, len(values)))]
        )
    return out


def _block_ids(size: int) -> NDArray[np.int64]:
    """Each step's block: MAX_BLOCKS contiguous blocks whose sizes differ by one at most."""
    return (np.arange(size, dtype=np.int64) * MAX_BLOCKS) // size


def _histograms(
    values: FloatArray, blocks: NDArray[np.int64], quantile: float
) -> Tuple[NDArray[np.float32], FloatArray]:
    """Per block, its steps' counts in bins; and the bins' edges. One bin holds every step below
    the sample's ``quantile - 0.45`` quantile (a resample's ``quantile`` is never down there);
    HISTOGRAM_BINS log-spaced bins cover the rest up to the slowest step."""
    low = float(np.quantile(values, max(0.0, quantile - 0.45)))
    high = float(values.max())
    logged = low > 0
    first, last = (np.log(low), np.log(high)) if logged else (low, high)
    width = (last - first) / HISTOGRAM_BINS or 1.0
    scaled = (np.log(np.maximum(values, low)) if logged else values) - first
    bins = np.where(values < low, 0, 1 + np.minimum(scaled / width, HISTOGRAM_BINS - 1))
    counts = np.bincount(
        blocks * (HISTOGRAM_BINS + 1) + bins.astype(np.int64),
        minlength=MAX_BLOCKS * (HISTOGRAM_BINS + 1),
    )
    edges = first + width * np.arange(HISTOGRAM_BINS + 1, dtype=np.float64)
    edges = np.exp(edges) if logged else edges
    shaped = counts.reshape(MAX_BLOCKS, HISTOGRAM_BINS + 1).astype(np.float32)
    return shaped, np.concatenate([[float(values.min())], edges]).astype(np.float64)


def _quantiles(counts: FloatArray, edges: FloatArray, quantile: float) -> FloatArray:
    """Per row of bin counts, the ``quantile`` (linear in rank, as ``np.percentile``), placed
    within its bin by its rank among the bin's steps."""
    cumulative = np.cumsum(counts, axis=1)
    rank = quantile * (cumulative[:, -1] - 1)
    index = np.minimum((cumulative <= rank[:, None]).sum(axis=1), counts.shape[1] - 1)
    rows = np.arange(len(counts))
    before = np.where(index > 0, cumulative[rows, np.maximum(index - 1, 0)], 0.0)
    inside = np.clip((rank - before + 0.5) / np.maximum(counts[rows, index], 1.0), 0.0, 1.0)
    low, high = edges[index], edges[index + 1]
    return np.asarray(low + (high - low) * inside, dtype=np.float64)


def _blocked(values: FloatArray, statistic: Statistic, resamples: int, rng: np.random.Generator
             ) -> FloatArray:  # fmt: skip
    blocks = _block_ids(len(values))
    sizes = np.bincount(blocks, minlength=MAX_BLOCKS).astype(np.float64)
    if statistic is MEAN:
        per_block = np.bincount(blocks, weights=values, minlength=MAX_BLOCKS)
    else:
        histograms, edges = _histograms(values, blocks, statistic.quantile)
    out = np.empty(resamples)
    rows = _rows_per_chunk(MAX_BLOCKS * (1 if statistic is MEAN else 4))
    for start in range(0, resamples, rows):
        count = min(rows, resamples - start)
        picks = rng.integers(0, MAX_BLOCKS, (count, MAX_BLOCKS))
        offsets = (np.arange(count, dtype=np.int64) * MAX_BLOCKS)[:, None]
        chosen = np.bincount((picks + offsets).ravel(), minlength=count * MAX_BLOCKS)
        times = chosen.reshape(count, MAX_BLOCKS)  # how often each block was drawn
        if statistic is MEAN:
            out[start : start + count] = (times @ per_block) / (times @ sizes)
        else:  # counts below 2**24 per bin: exact in float32, and half the work
            mixed = (times.astype(np.float32) @ histograms).astype(np.float64)
            out[start : start + count] = _quantiles(mixed, edges, statistic.quantile)
    return out


def resampled(
    values: Samples, statistic: Statistic, resamples: int, rng: np.random.Generator
) -> FloatArray:
    """``resamples`` bootstrap draws of ``statistic`` over ``values`` (see the module's text)."""
    array = np.asarray(values, dtype=np.float64)
    if len(array) <= MAX_BLOCKS or statistic.name not in (MEAN.name, P95.name):
        return _plain(array, statistic, resamples, rng)
    if array.min() == array.max():
        return np.full(resamples, float(array[0]))
    return _blocked(array, statistic, resamples, rng)


def ratio_interval(
    old: Samples,
    new: Samples,
    statistic: Statistic,
    resamples: int,
    confidence: float,
    seed: int,
) -> Tuple[float, float, float]:
    """``statistic(new) / statistic(old)`` and its bootstrap percentile interval."""
    old_a, new_a = np.asarray(old, dtype=np.float64), np.asarray(new, dtype=np.float64)
    ratio = float(statistic.of(new_a) / statistic.of(old_a))
    rng = np.random.default_rng(seed)
    old_draws = resampled(old_a, statistic, resamples, rng)
    new_draws = resampled(new_a, statistic, resamples, rng)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(new_draws / old_draws, [tail, 100 - tail])
    return ratio, float(low), float(high)


def bootstrap_ratio(
    old: Sequence[float],
    new: Sequence[float],
    statistic: Statistic,
    options: Draws,
) -> Tuple[float, float, float]:
    """``statistic(new) / statistic(old)`` and its bootstrap percentile interval."""
    return ratio_interval(old, new, statistic, options.resamples, options.confidence, options.seed)


def throughput_interval(
    old_steps: Sequence[float],
    new_steps: Sequence[float],
    options: Draws,
    work_ratio: float = 1.0,
) -> Tuple[float, float, float]:
    """The change in throughput (%) from ``old`` to ``new`` per-step times, and its bootstrap
    interval. Throughput is work per step over the mean step time; ``work_ratio`` is new's work
    per step over old's (1 for the same cell; 2 when new accumulates two micro-batches)."""
    ratio, low, high = bootstrap_ratio(old_steps, new_steps, MEAN, options)
    return _pct(work_ratio / ratio), _pct(work_ratio / high), _pct(work_ratio / low)


def paired_rounds_interval(
    old_rounds: Sequence[Sequence[float]],
    new_rounds: Sequence[Sequence[float]],
    options: Draws,
    work_ratio: float = 1.0,
) -> Tuple[float, float, float]:
    """The change in throughput (%) of ``new`` over ``old`` measured in paired rounds (round
    ``r``: one cell of each, run next to each other, per-step times), and its interval.

    The estimate is the geometric mean of the rounds' throughput ratios. The interval is a
    two-stage bootstrap: rounds drawn with replacement, then each drawn round's steps. So it covers
    the drift between runs as well as step-to-step noise, which a bootstrap of pooled steps does
    not see. With one round it reduces to the steps' bootstrap."""
    count = len(old_rounds)
    if count == 0 or count != len(new_rounds):
        raise ValueError("paired rounds need the same number of old and new rounds, at least one")
    rng = np.random.default_rng(options.seed)
    point: List[float] = []
    draws = np.empty((count, options.resamples))
    for index, (old, new) in enumerate(zip(old_rounds, new_rounds)):
        old_a, new_a = np.asarray(old, dtype=float), np.asarray(new, dtype=float)
        point.append(float(np.log(work_ratio * old_a.mean() / new_a.mean())))
        old_means = resampled(old_a, MEAN, options.resamples, rng)
        new_means = resampled(new_a, MEAN, options.resamples, rng)
        draws[index] = np.log(work_ratio * old_means / new_means)
    picks = rng.integers(0, count, (options.resamples, count))
    statistic = draws[picks, np.arange(options.resamples)[:, None]].mean(axis=1)
    tail = (1 - options.confidence) / 2 * 100
    low, high = np.percentile(statistic, [tail, 100 - tail])
    estimate = float(np.exp(np.mean(point)))
    return _pct(estimate), _pct(float(np.exp(low))), _pct(float(np.exp(high)))


def _pct(ratio: float) -> float:
    return 100 * (ratio - 1)
