"""How numbers read in the report: thousands separators, three significant digits, units."""

from __future__ import annotations

import math
from typing import Any

MISSING = "–"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def integer(value: Any) -> str:
    return MISSING if _missing(value) else f"{int(value):,}"


def significant(value: Any) -> str:
    """Three significant digits, thousands separated above 100 (1,450; 220; 12.3; 2.87)."""
    if _missing(value):
        return MISSING
    magnitude = abs(float(value))
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 0.01 or magnitude == 0:
        return f"{value:.2f}"
    return f"{value:.2e}"


def percent(value: Any) -> str:
    """A value already in percent."""
    return MISSING if _missing(value) else f"{value:.1f}%"


def fraction(value: Any) -> str:
    """A 0..1 fraction shown in percent."""
    return MISSING if _missing(value) else f"{100 * value:.1f}%"


def signed_percent(value: Any) -> str:
    return MISSING if _missing(value) else f"{value:+.1f}%"


def human_bytes(value: Any) -> str:
    if _missing(value):
        return MISSING
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= scale:
            return f"{significant(value / scale)} {unit}"
    return f"{int(value)} B"


def text(value: Any) -> str:
    return MISSING if _missing(value) or value == "" else str(value)
