"""What a check returns, and the small helpers every check module shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, Iterable, List, Optional, Sequence


class Status(str, Enum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


# How bad a status is, for "the worst of several GPUs".
SEVERITY = {Status.SKIP: 0, Status.PASS: 1, Status.WARN: 2, Status.FAIL: 3}


@dataclass(frozen=True)
class CheckResult:
    """One row of ``torchscale validate``: what was measured and, when not PASS, how to fix it."""

    name: str
    status: Status
    value: str
    fix: Optional[str] = None
    details: Dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status is not Status.PASS and not self.fix:
            raise ValueError(f"check {self.name!r} is {self.status.value} without a fix text")

    def to_dict(self) -> Dict[str, object]:
        record: Dict[str, object] = {
            "name": self.name,
            "status": self.status.value,
            "value": self.value,
            "fix": self.fix,
        }
        if self.details:
            record["details"] = self.details
        return record


def passed(name: str, value: str, **details: Any) -> CheckResult:
    return CheckResult(name, Status.PASS, value, None, details)


def warn(name: str, value: str, fix: str, **details: Any) -> CheckResult:
    return CheckResult(name, Status.WARN, value, fix, details)


def fail(name: str, value: str, fix: str, **details: Any) -> CheckResult:
    return CheckResult(name, Status.FAIL, value, fix, details)


def skip(name: str, value: str, fix: str, **details: Any) -> CheckResult:
    return CheckResult(name, Status.SKIP, value, fix, details)


def worst(statuses: Iterable[Status]) -> Status:
    """The most severe status; SKIP when there is nothing else."""
    return max(statuses, key=SEVERITY.__getitem__, default=Status.SKIP)


def summarize(checks: Sequence[CheckResult]) -> Dict[str, object]:
    counts = {status.value.lower(): 0 for status in Status}
    for check in checks:
        counts[check.status.value.lower()] += 1
    return {**counts, "total": len(checks), "ok": counts["fail"] == 0}


def gpu_list(indices: Sequence[int], total: int) -> str:
    """``all 8 GPUs`` or ``GPU 3`` or ``GPUs 1, 5``."""
    if total > 1 and len(indices) == total:
        return f"all {total} GPUs"
    if len(indices) == 1:
        return f"GPU {indices[0]}"
    return "GPUs " + ", ".join(str(i) for i in indices)


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.1f} GiB"


def join(parts: Iterable[str], sep: str = "; ") -> str:
    return sep.join(p for p in parts if p)


def unique(values: Iterable[Any]) -> List[Any]:
    """Distinct values in first-seen order."""
    seen: List[Any] = []
    for value in values:
        if value not in seen:
            seen.append(value)
    return seen
