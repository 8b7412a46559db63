"""The base of every config section model (kept apart so section modules can import it)."""

from __future__ import annotations

from typing import Any, Dict, Iterator, Tuple

from pydantic import BaseModel, ConfigDict

ECHO_CHARS = 200
"""The most characters of the input one error message quotes."""


def clip(value: object, limit: int = ECHO_CHARS) -> str:
    """``value`` as a string of at most ``limit`` characters (the cut is marked)."""
    text = str(value)
    return text if len(text) <= limit else f"{text[: limit - 1]}… ({len(text):,} characters)"


class StrictModel(BaseModel):
    """Unknown keys are errors (reported with a did-you-mean by the loader); ``.inf`` and
    ``.nan`` are refused where a number goes."""

    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)


def as_list(value: Any) -> Any:
    """A scalar where a list is expected means a list of one: ``dtype: float32``."""
    return value if isinstance(value, list) else [value]


def flatten_settings(settings: Dict[str, object], prefix: str = "") -> Iterator[Tuple[str, Any]]:
    """Nested settings as dotted names (``ddp.bucket_cap_mb``) and their values."""
    for key, value in settings.items():
        if isinstance(value, dict):
            yield from flatten_settings(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
