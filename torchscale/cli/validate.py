"""``torchscale validate``: not built yet (see its issue)."""

from __future__ import annotations

import typer

from torchscale.cli.console import fail


def register(app: typer.Typer) -> None:
    @app.command("validate")
    def validate() -> None:
        """Check if current node meets DDP requirements (NCCL, Drivers)."""
        raise fail("'torchscale validate' is not built yet.", code=1)
