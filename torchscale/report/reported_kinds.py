"""What a kind adds to the report, beside the training sections every report has: its sections
and its part of the JSON document. The report reaches a kind only through this protocol.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Protocol, runtime_checkable

from torchscale.plan.kind_protocol import cell_kinds
from torchscale.report.elements import Card, Section
from torchscale.results.schema import ResultBase


@runtime_checkable
class ReportedKind(Protocol):
    """The report pieces of a kind (``CellKind``) whose records the training sections do not
    show; a kind without them adds nothing."""

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


def reported_kinds() -> List[ReportedKind]:
    """The registered kinds that add to the report, in plan order."""
    return [kind for kind in cell_kinds().values() if isinstance(kind, ReportedKind)]


def kind_sections(records: List[ResultBase]) -> List[Optional[Section]]:
    """Every kind's report sections, in plan order."""
    return [section for kind in reported_kinds() for section in kind.report_sections(records)]


def kind_document_results(records: List[ResultBase]) -> Dict[str, object]:
    """Every kind's entries of the document's ``results``."""
    results: Dict[str, object] = {}
    for kind in reported_kinds():
        results.update(kind.document_results(records))
    return results


def kind_cards(records: List[ResultBase]) -> List[Card]:
    """Every kind's headline cards, in plan order."""
    return [card for kind in reported_kinds() for card in kind.report_cards(records)]
