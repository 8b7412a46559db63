"""Sizes a user types (message sizes, memory budgets): ``8``, ``1K``, ``64M``, ``1G``, binary units
(1K = 1024) as nccl-tests' ``-b``/``-e`` read them, and their shortest exact form back."""

from __future__ import annotations

import re
from typing import Union

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(value: Union[int, float, str]) -> int:
    """``8``, ``"1K"``, ``"64M"``, ``"1G"`` -> bytes. K/M/G are binary (1K = 1024), as nccl-tests'
    ``-b``/``-e`` read them; a trailing ``B`` or ``iB`` is allowed."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a size: write bytes like 8, 1K, 64M or 1G")
    number, unit = float(match.group(1)), match.group(2).upper()
    return int(number * _UNITS[unit])


def format_size(size_bytes: int) -> str:
    """The shortest exact binary form: 1024 -> ``1K``, 1536 -> ``1536``."""
    for unit in ("G", "M", "K"):
        if size_bytes and size_bytes % _UNITS[unit] == 0:
            return f"{size_bytes // _UNITS[unit]}{unit}"
    return str(size_bytes)
