"""``torchscale profile``: not built yet (see its issue)."""

from __future__ import annotations

import typer

from torchscale.cli.console import fail


def register(app: typer.Typer) -> None:
    @app.command("profile")
    def profile() -> None:
        """Wrap execution in Nsight Systems to find bottlenecks."""
        raise fail("'torchscale profile' is not built yet.", code=1)
