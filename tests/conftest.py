"""Shared test setup: a wide, plain console so CLI output is stable to assert on."""

from __future__ import annotations

import os

# Rich reads COLUMNS when it is not writing to a terminal; pin it before torchscale is imported.
os.environ["COLUMNS"] = "200"
os.environ.setdefault("NO_COLOR", "1")

import pytest
from typer import rich_utils


@pytest.fixture(autouse=True, scope="session")
def setup_terminal() -> None:
    rich_utils.MAX_WIDTH = 200
    rich_utils.FORCE_TERMINAL = False
