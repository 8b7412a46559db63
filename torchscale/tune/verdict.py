"""The verdict: the baseline and the best few trials measured again, in interleaved repeats of one
run, and each finalist's gain with an interval over the rounds (``paired_rounds_interval``).

Interleaving (baseline, finalist 1, finalist 2, then again with the order rotated) spreads the
node's drift over every candidate, and pairs each finalist's cell with the baseline's of the same
round. The interval is a two-stage bootstrap, rounds then steps: on a node whose throughput drifts
between runs by more than the steps vary within one (a 2-core VM: +-20% for a gloo-heavy model), a
bootstrap of pooled steps alone once gave +16.7% (+9.6..+23.9%) for a setting that a separate
benchmark a minute later put at -21% (docs/tune.md). With one repeat there is nothing to draw
rounds from, and the interval covers the steps' noise only.

The intervals are simultaneous: with k finalists each is a (1 - 0.05/k) interval (Bonferroni),
so "95%" holds for the set and picking the best of k cannot pass noise off as a gain. A winner
must have its whole interval above zero and gain at least ``min_gain_pct``; otherwise the verdict
is "no significant gain" and the baseline is kept.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

from torchscale.analysis.bootstrap import paired_rounds_interval
from torchscale.analysis.comparison import CompareOptions
from torchscale.errors import TorchscaleError
from torchscale.plan.planned_cell import Cell
from torchscale.results.schema import ResultBase, TrainingResult
from torchscale.tune.space import TunedSettings, apply_params
from torchscale.tune.trials import tuned_cell

CONFIDENCE = 0.95
RESAMPLES = 2000


@dataclass
class Candidate:
    """One finalist against the baseline."""

    trial: int
    params: Dict[str, object]
    changes: Dict[str, str]
    search_samples_per_s: float
    samples_per_s: Optional[float] = None  # from the verdict's pooled per-step times
    baseline_samples_per_s: Optional[float] = None
    gain_pct: Optional[float] = None
    ci_low_pct: Optional[float] = None
    ci_high_pct: Optional[float] = None
    significant: bool = False
    note: str = ""
    cell_ids: List[str] = field(default_factory=list)

    @property
    def changed(self) -> Dict[str, object]:
        """The knobs set differently from the baseline, and their values."""
        return {k: v for k, v in self.params.items() if k in self.changes}

    def as_dict(self) -> Dict[str, object]:
        return {**asdict(self), "changed": self.changed}


def verdict_cells(
    baseline: TunedSettings, finalists: Sequence[Dict[str, object]], repeats: int
) -> List[List[Cell]]:
    """Per candidate (the baseline first), its cells, one per repeat."""
    count = len(finalists) + 1
    per_candidate: List[List[Cell]] = []
    for index, params in enumerate([{}, *finalists]):
        cells = []
        for repeat in range(repeats):
            # Each cell's repeat index is its place in the run: no two cells share an id but
            # for their settings (which the sweep would take for changed settings).
            place = repeat * count + index
            cells.append(tuned_cell(apply_params(baseline, {**params, "repeat": place})))
        per_candidate.append(cells)
    return per_candidate


def interleaved(per_candidate: List[List[Cell]]) -> List[Cell]:
    """Repeat by repeat, each candidate once, the order rotated every repeat."""
    order: List[Cell] = []
    count = len(per_candidate)
    for repeat in range(len(per_candidate[0])):
        for k in range(count):
            order.append(per_candidate[(k + repeat) % count][repeat])
    return [Cell(i, c.cell_id, c.settings, c.kind) for i, c in enumerate(order)]


def round_name(per_candidate: List[List[Cell]]) -> str:
    """A verdict round's folder name: the same finalists and repeats reuse their measurements,
    others get a fresh round (measured together, never mixed with an older one)."""
    ids = "|".join(c.cell_id for cells in per_candidate for c in cells)
    return "round-" + hashlib.sha1(ids.encode()).hexdigest()[:8]


def host_waits(records: Sequence[ResultBase]) -> Dict[str, Optional[float]]:
    """The verdict's CPU evidence: the largest share of its window any rank's training thread
    waited for a CPU, and the largest such share of a rank that waited while other processes held
    the cores (an oversubscribed host, whose figures say more about them than about the knobs)."""
    from torchscale.analysis.cpu_load import cpu_wait_share, oversubscribed_wait

    shares = [
        share
        for record in records
        if isinstance(record, TrainingResult)
        for share in [cpu_wait_share(record)]
        if share is not None
    ]
    return {
        "cpu_wait_share": max(shares) if shares else None,
        "oversubscribed_wait_share": oversubscribed_wait(records),
    }


def _steps(records: Sequence[ResultBase]) -> List[float]:
    return [s for r in records if isinstance(r, TrainingResult) for s in r.step_times_ms]


def _measured(records: Sequence[Optional[ResultBase]]) -> Optional[List[TrainingResult]]:
    ok = [r for r in records if isinstance(r, TrainingResult) and r.status == "ok"]
    return ok if len(ok) == len(records) and all(r.step_times_ms for r in ok) else None


def _throughput(records: Sequence[TrainingResult]) -> float:
    """Samples/s from the pooled per-step times (the figure the interval is about): the global
    batch over the mean step."""
    steps = _steps(records)
    return records[0].global_batch_size * 1000.0 * len(steps) / sum(steps)


def judge(
    candidates: List[Candidate],
    per_candidate: List[List[Cell]],
    results: Dict[str, ResultBase],
    min_gain_pct: float,
    seed: int,
    noise_floor_pct: Optional[float] = None,
) -> Optional[Candidate]:
    """Fill in each candidate's gain and interval; return the winner, or None. A stated noise
    floor (``--noise-floor PCT``: one run may differ from another by PCT) widens each interval
    by it on both sides, so a gain counts only beyond the noise the user stated."""
    base_records = _measured([results.get(c.cell_id) for c in per_candidate[0]])
    if base_records is None:
        failed = [results.get(c.cell_id) for c in per_candidate[0]]
        why = next((r.error for r in failed if r is not None and r.status != "ok"), "no record")
        raise TorchscaleError(
            f"the baseline failed when measured again for the verdict ({why}); nothing can be "
            "judged: fix it and rerun the same command (finished trials are kept)"
        )
    options = CompareOptions(
        resamples=RESAMPLES,
        confidence=1 - (1 - CONFIDENCE) / max(1, len(candidates)),
        seed=seed,
    )
    work = base_records[0].global_batch_size
    for candidate, cells in zip(candidates, per_candidate[1:]):
        candidate.cell_ids = [c.cell_id for c in cells]
        candidate.baseline_samples_per_s = _throughput(base_records)
        records = _measured([results.get(c.cell_id) for c in cells])
        if records is None:
            candidate.note = "failed when measured again"
            continue
        candidate.samples_per_s = _throughput(records)
        ratio = records[0].global_batch_size / work
        # Round by round (the baseline and this candidate ran next to each other in each), so
        # the interval covers the drift between runs, not only the steps' noise.
        gain, low, high = paired_rounds_interval(
            [r.step_times_ms for r in base_records],
            [r.step_times_ms for r in records],
            options,
            ratio,
        )
        if noise_floor_pct is not None:
            floor = 1 + noise_floor_pct / 100
            low = 100 * ((1 + low / 100) / floor - 1)
            high = 100 * ((1 + high / 100) * floor - 1)
        candidate.gain_pct, candidate.ci_low_pct, candidate.ci_high_pct = gain, low, high
        candidate.significant = low > 0 and gain >= min_gain_pct
        if not candidate.significant:
            candidate.note = f"gain below {min_gain_pct:g}%" if low > 0 else "not beyond noise"
    winners = [c for c in candidates if c.significant]
    return max(winners, key=lambda c: c.gain_pct or 0.0) if winners else None
