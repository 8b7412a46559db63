"""Environment for the processes tests launch: this checkout importable, variables put back."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]


def repo_pythonpath() -> str:
    """PYTHONPATH with this checkout first, so launched workers import it (and ``tests.*``)."""
    return os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


@contextlib.contextmanager
def restored_environ(*keys: str) -> Iterator[None]:
    """Put ``keys`` of ``os.environ`` back as they were (unset if they were), whatever the block
    sets them to."""
    saved = {key: os.environ.get(key) for key in keys}
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
