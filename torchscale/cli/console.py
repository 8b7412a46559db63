"""Console and logging shared by all commands.

Progress, logs and tables go to stderr; only machine-readable output (``--json``) goes to stdout,
so ``torchscale ... --json | jq`` always works.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any, Callable, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from torchscale.errors import TorchscaleError

err_console = Console(stderr=True, highlight=False)
log = logging.getLogger("torchscale")

F = TypeVar("F", bound=Callable[..., Any])


def setup_logging(level: int) -> None:
    """Route torchscale's log records to stderr through Rich."""
    from rich.logging import RichHandler

    handler = RichHandler(console=err_console, show_time=False, show_path=False, markup=False)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


def print_json(document: object) -> None:
    """Write one JSON document to stdout (the only thing a ``--json`` command prints there).

    Strict JSON, whatever the document holds: a NaN or infinite number is written as null
    (``torchscale.results.files.dumps``, the one encoder for everything torchscale writes).
    """
    from torchscale.results.files import dumps

    sys.stdout.write(dumps(document, indent=2) + "\n")
    sys.stdout.flush()


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a one-line error on stderr and return the Exit to raise."""
    # escape: a message naming 'torchscale[mlflow]' or a path with brackets is text, not markup
    err_console.print(f"[bold red]Error:[/bold red] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def user_errors(func: F) -> F:
    """Turn a TorchscaleError raised by a command into one stderr line and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TorchscaleError as exc:
            raise fail(str(exc), exc.exit_code) from None

    return wrapper  # type: ignore[return-value]
