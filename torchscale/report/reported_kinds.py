"""What a kind adds to the report, beside the training sections every report has: its sections,
its headline cards, its part of the JSON document and what its cells ran. The report reaches a
kind only through this protocol: no module of ``torchscale.report`` imports a kind's package or
names a kind (tests/test_architecture.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Protocol, runtime_checkable

from typing_extensions import get_protocol_members

from torchscale.errors import TorchscaleError
from torchscale.plan.kind_protocol import cell_kinds
from torchscale.report.elements import Card, Section
from torchscale.results.schema import ResultBase


@dataclass(frozen=True)
class RanIterations:
    """What the cells of one kind ran, read from their records (never the config's defaults):
    every distinct warm-up and measured count, smallest first. The JSON document's
    ``config.iterations`` entry of the kind."""

    warmup: List[int]
    measured: List[int]

    @classmethod
    def of(
        cls, warmup: Iterable[Optional[int]], measured: Iterable[Optional[int]]
    ) -> RanIterations:
        return cls(_distinct(warmup), _distinct(measured))


def _distinct(values: Iterable[Optional[int]]) -> List[int]:
    return sorted({int(v) for v in values if v is not None})


@runtime_checkable
class ReportedKind(Protocol):
    """The report pieces of a kind (``CellKind``). A kind with none of them adds nothing; one
    with some but not all is refused, naming what it lacks."""

    def report_sections(self, records: List[ResultBase]) -> List[Optional[Section]]:
        """Its sections, in order (None, or an empty section, where it has nothing to show),
        built with the report's own section builders."""
        ...

    def document_results(self, records: List[ResultBase]) -> Dict[str, object]:
        """Its entries of the JSON document's ``results`` (``report.document.Results``)."""
        ...

    def report_cards(self, records: List[ResultBase]) -> List[Card]:
        """Its headline cards on the report's first screen (the peak bus bandwidth)."""
        ...

    def document_iterations(self, records: List[ResultBase]) -> Optional[RanIterations]:
        """What its cells ran (the document's ``config.iterations`` under the kind's name, and
        ``warmup_iters``/``benchmark_iters`` from the first kind, in plan order, that ran);
        None when none of its cells measured."""
        ...


def reported_kinds() -> Dict[str, ReportedKind]:
    """The registered kinds that add to the report, by name, in plan order."""
    members = sorted(get_protocol_members(ReportedKind))
    found: Dict[str, ReportedKind] = {}
    for name, kind in cell_kinds().items():
        lacks = [member for member in members if not hasattr(kind, member)]
        if len(lacks) == len(members):
            continue
        if not isinstance(kind, ReportedKind):
            raise TorchscaleError(
                f"cell kind {name} has report pieces but lacks {', '.join(lacks)} "
                "(see torchscale.report.reported_kinds.ReportedKind)"
            )
        found[name] = kind
    return found


def kind_sections(records: List[ResultBase]) -> List[Optional[Section]]:
    """Every kind's report sections, in plan order."""
    return [s for kind in reported_kinds().values() for s in kind.report_sections(records)]


def kind_document_results(records: List[ResultBase]) -> Dict[str, object]:
    """Every kind's entries of the document's ``results``."""
    results: Dict[str, object] = {}
    for kind in reported_kinds().values():
        results.update(kind.document_results(records))
    return results


def kind_cards(records: List[ResultBase]) -> List[Card]:
    """Every kind's headline cards, in plan order."""
    return [card for kind in reported_kinds().values() for card in kind.report_cards(records)]


def kind_iterations(records: List[ResultBase]) -> Dict[str, RanIterations]:
    """What each kind's cells ran, by kind name, in plan order (kinds none of whose cells
    measured are left out)."""
    found = {name: kind.document_iterations(records) for name, kind in reported_kinds().items()}
    return {name: ran for name, ran in found.items() if ran is not None}
