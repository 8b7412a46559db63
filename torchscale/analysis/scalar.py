"""Table cells as Python numbers, for the type checker.

pandas-stubs type each field of ``DataFrame.itertuples()`` (and ``.loc[i, column]``) as any pandas
scalar (str, bytes, dates, ``NA``...): these helpers say which columns hold numbers. At runtime
they are exactly ``float(value)`` and ``int(value)``.
"""

from __future__ import annotations

from typing import SupportsFloat, SupportsIndex, SupportsInt, Union, cast


def as_float(value: object) -> float:
    """``float(value)`` for a numeric table cell."""
    return float(cast(Union[SupportsFloat, SupportsIndex], value))


def as_int(value: object) -> int:
    """``int(value)`` for an integer table cell."""
    return int(cast(Union[SupportsInt, SupportsIndex], value))
