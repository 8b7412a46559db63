"""One finding type for every producer: the profiler's trace analysis (``findings.json``), the
sync warnings the worker records, scaling below the "good" band, and the report that shows them
side by side.

Standard library only: the profiler, the analysis and the report import it without pandas.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List


class Severity(str, Enum):
    """How bad a finding is; the string values are what ``findings.json`` and the report hold."""

    CRITICAL = "critical"
    ERROR = "error"
    HIGH = "high"
    WARNING = "warning"
    MEDIUM = "medium"
    LOW = "low"
    INFO = "info"

    @property
    def rank(self) -> int:
        """Sort key, most severe first."""
        return SEVERITY_ORDER[self.value]


SEVERITY_ORDER: Dict[str, int] = {
    "critical": 0,
    "error": 0,
    "high": 1,
    "warning": 2,
    "warn": 2,  # as other tools write it in a findings.json
    "medium": 2,
    "low": 3,
    "info": 4,
}
UNKNOWN_SEVERITY_ORDER = 5


def severity_order(severity: str) -> int:
    """Sort key of any severity text (unknown ones last)."""
    return SEVERITY_ORDER.get(str(severity), UNKNOWN_SEVERITY_ORDER)


SHOWN_SEVERITIES = ("high", "medium", "low")
"""The one severity vocabulary every surface shows (console, HTML, PDF, JSON document): what
other tools call critical or error is high, a warning is medium, info is low."""


def shown_severity(severity: str) -> str:
    """The word shown for a severity, whoever wrote it (one of ``SHOWN_SEVERITIES``)."""
    order = severity_order(str(severity).lower())
    return SHOWN_SEVERITIES[0] if order <= 1 else SHOWN_SEVERITIES[1] if order == 2 else "low"


@dataclass
class Finding:
    """What is wrong, on which ranks and steps, the numbers behind it, and what to do about it.

    ``source`` and ``experiment`` say where it was found (a cell, a profile folder); ``message``
    is the longer explanation the report prints under the title.
    """

    severity: Severity
    category: str
    title: str
    recommendation: str
    ranks: List[int] = field(default_factory=list)
    steps: List[int] = field(default_factory=list)
    evidence: Dict[str, Any] = field(default_factory=dict)
    message: str = ""
    source: str = ""
    experiment: str = ""

    def to_dict(self) -> Dict[str, Any]:
        """The finding as ``findings.json`` holds it."""
        return {
            "severity": self.severity.value,
            "category": self.category,
            "title": self.title,
            "recommendation": self.recommendation,
            "ranks": list(self.ranks),
            "steps": list(self.steps),
            "evidence": dict(self.evidence),
        }

    def to_row(self) -> Dict[str, Any]:
        """The finding as a row of the report's findings table."""
        return {
            "severity": self.severity.value,
            "category": self.category,
            "title": self.title,
            "message": self.message,
            "ranks": list(self.ranks),
            "recommendation": self.recommendation,
            "source": self.source,
            "experiment": self.experiment,
        }
