"""``torchscale compare``: not built yet (see its issue)."""

from __future__ import annotations

import typer

from torchscale.cli.console import fail


def register(app: typer.Typer) -> None:
    @app.command("compare")
    def compare() -> None:
        """Compare two result folders and fail on regressions."""
        raise fail("'torchscale compare' is not built yet.", code=1)
