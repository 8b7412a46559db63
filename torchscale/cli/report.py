"""``torchscale report``: not built yet (see its issue)."""

from __future__ import annotations

import typer

from torchscale.cli.console import fail


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report() -> None:
        """Generate visual HTML/PDF performance reports."""
        raise fail("'torchscale report' is not built yet.", code=1)
