"""``torchscale validate``: is this node ready for DDP?

Imports nothing heavy at module level: ``torchscale validate --help`` must not import torch.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict

import typer
from typing_extensions import Annotated

from torchscale.cli.console import err_console, is_quiet, print_json, result_console, user_errors
from torchscale.errors import TorchscaleError

if TYPE_CHECKING:
    from rich.status import Status


def register(app: typer.Typer) -> None:
    @app.command("validate")
    @user_errors
    def validate(
        json_output: Annotated[
            bool,
            typer.Option(
                "--json", help="Print the report as one JSON document on stdout (table on stderr)."
            ),
        ] = False,
        skip_smoke: Annotated[
            bool,
            typer.Option(
                "--skip-smoke", help="Skip the torchrun all-reduce smoke test (seconds faster)."
            ),
        ] = False,
        timeout: Annotated[
            float,
            typer.Option(
                "--timeout",
                help="Seconds before a hanging smoke test is killed and reported as FAIL.",
            ),
        ] = 60.0,
        output_dir: Annotated[
            Path,
            typer.Option(
                "--output-dir",
                "-o",
                help="Where benchmark results will go: its free disk space is checked.",
            ),
        ] = Path("results"),
        verbose: Annotated[
            bool,
            typer.Option(
                "--verbose", "-v", help="Enable verbose logging (each check's details and timing)."
            ),
        ] = False,
    ) -> None:
        """Check if current node meets DDP requirements (NCCL, Drivers)."""
        if verbose:
            logging.getLogger("torchscale").setLevel(logging.DEBUG)
        if not timeout > 0:
            raise TorchscaleError(
                f"--timeout must be a positive number of seconds, got {timeout:g}"
            )
        if output_dir.exists() and not output_dir.is_dir():
            raise TorchscaleError(f"--output-dir {output_dir} is a file: give a directory")

        from torchscale.validate.display import render
        from torchscale.validate.runner import ValidateOptions, run_validation

        options = ValidateOptions(timeout_s=timeout, skip_smoke=skip_smoke, output_dir=output_dir)
        with err_console.status("Checking this node...") as status:
            report = run_validation(options, on_check=_progress(status))
        if is_quiet():
            _render_quiet(report)
        else:
            render(report, err_console)
        _log_details(report)
        if json_output:
            print_json(report)
        if not report["summary"]["ok"]:
            raise typer.Exit(1)


def _render_quiet(report: Dict[str, Any]) -> None:
    """``--quiet``: the WARN and FAIL rows (the warnings and errors) and the verdict line."""
    from torchscale.validate.display import checks_table, summary_line

    flagged = [c for c in report["checks"] if c["status"] in ("WARN", "FAIL")]
    if flagged:
        result_console.print(checks_table({**report, "checks": flagged}, result_console.width))
    result_console.print(summary_line(report))


def _progress(status: Status) -> Callable[[str], None]:
    """Show the step under way; with --verbose, log how long each step took."""
    log = logging.getLogger("torchscale")
    current, start = "", time.monotonic()

    def step(name: str) -> None:
        nonlocal current, start
        now = time.monotonic()
        if current:
            log.debug("validate: %s took %.2f s", current, now - start)
        current, start = name, now
        status.update(f"Checking: {name}...")

    return step


def _log_details(report: Dict[str, Any]) -> None:
    """With --verbose: what each check measured beyond its one-line value."""
    log = logging.getLogger("torchscale")
    for check in report["checks"]:
        if check.get("details"):
            details = json.dumps(check["details"], sort_keys=True, default=str)
            log.debug("%s: %s", check["name"], details)
