"""A busy host: one rule, in one place, for every command that measures or judges.

A figure is *measured on a busy host* when a rank of its cell waited for a CPU while other
processes held the cores (``analysis.cpu_load.oversubscribed``, from the CPU wait per rank and the
other processes' share the records already carry). Such a figure says as much about the other
processes as about the job, so:

* it is marked (``benchmark``'s table: :data:`BUSY_HOST`; ``validate`` warns);
* no verdict rests on it unless the user states the noise (``--noise-floor``): its verdict is
  :data:`NOT_JUDGED`, a word of its own, never "within noise";
* a gate with cells it did not judge says how many it judged, and does not pass unless every
  cell was judged or the user allows it (:data:`ALLOW_UNJUDGED`);
* ``tune`` gives :data:`NO_VERDICT` and writes no best settings;
* ``project`` widens its band or refuses (``analysis.projection``).
"""

from __future__ import annotations

from typing import Iterable, Optional, Set

from torchscale.analysis.cpu_load import oversubscribed_wait
from torchscale.measures.figures import BUSY_HOST, NOT_JUDGED
from torchscale.results.schema import ResultBase, TrainingResult

__all__ = [
    "ALLOW_UNJUDGED",
    "BUSY_HOST",
    "NOISE_FLOOR",
    "NOT_JUDGED",
    "NO_VERDICT",
    "busy_cells",
    "busy_wait",
    "gate_line",
    "verdict_allowed",
    "wait_words",
]

NOISE_FLOOR = "--noise-floor"
ALLOW_UNJUDGED = "--allow-unjudged"
NO_VERDICT = "no verdict: the host was busy"


def busy_wait(records: Iterable[ResultBase]) -> Optional[float]:
    """The largest share of its window a rank of ``records`` waited for a CPU while other
    processes held the cores; None when the host was not busy for any of them."""
    return oversubscribed_wait(records)


def busy_cells(records: Iterable[ResultBase]) -> Set[str]:
    """The ids of the measured cells whose figures the busy host marks."""
    return {
        r.cell_id
        for r in records
        if isinstance(r, TrainingResult) and r.status == "ok" and busy_wait([r]) is not None
    }


def verdict_allowed(busy: bool, noise_stated: bool) -> bool:
    """Whether a verdict may rest on a figure: measured on a quiet host, or the user stated the
    noise (then a busy host's drift is the user's to have covered)."""
    return noise_stated or not busy


def wait_words(share: float) -> str:
    """The evidence, in words, for every surface alike."""
    return f"a rank waited for a CPU {share:.0%} of its window while other processes held the cores"


def gate_line(judged_cells: int, total: int, allowed: bool) -> str:
    """What a gate with unjudged cells says: how many it judged, and what the user may do."""
    unjudged = total - judged_cells
    if allowed:
        return (
            f"Judged {judged_cells} of {total} cell(s); {unjudged} {NOT_JUDGED} (busy host), "
            f"passed over as {ALLOW_UNJUDGED} asks: a regression in them would not be seen."
        )
    return (
        f"Judged {judged_cells} of {total} cell(s); {unjudged} {NOT_JUDGED} (busy host): the gate "
        f"cannot pass on them. Rerun them on a quiet node, state the noise with {NOISE_FLOOR} PCT, "
        f"or pass {ALLOW_UNJUDGED} to gate on the judged cells only."
    )
