"""Table cells as Python numbers, for the type checker.

pandas-stubs type each field of ``DataFrame.itertuples()`` (and ``.loc[i, column]``) as any pandas
scalar (str, bytes, dates, ``NA``...): these helpers say which columns hold numbers. At runtime
they are exactly ``float(value)`` and ``int(value)``. No pandas import: the CLI imports this.
"""

from __future__ import annotations

from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    List,
    SupportsFloat,
    SupportsIndex,
    SupportsInt,
    Union,
    cast,
)

if TYPE_CHECKING:
    import pandas as pd


def as_float(value: object) -> float:
    """``float(value)`` for a numeric table cell."""
    return float(cast(Union[SupportsFloat, SupportsIndex], value))


def as_int(value: object) -> int:
    """``int(value)`` for an integer table cell."""
    return int(cast(Union[SupportsInt, SupportsIndex], value))


def frame_records(frame: pd.DataFrame) -> List[Dict[str, Any]]:
    """``frame.to_dict("records")`` keyed by column name as ``str`` (pandas-stubs type the keys
    as any hashable; every table here names its columns with strings)."""
    return [{str(k): v for k, v in row.items()} for row in frame.to_dict("records")]
