"""``torchscale benchmark``: under construction."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("benchmark")
    def benchmark() -> None:
        """Run throughput/latency tests across GPU configs."""
