"""The base of every config section model (kept apart so section modules can import it)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Unknown keys are errors (reported with a did-you-mean by the loader)."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


def as_list(value: Any) -> Any:
    """A scalar where a list is expected means a list of one: ``dtype: float32``."""
    return value if isinstance(value, list) else [value]
