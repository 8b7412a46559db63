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
"""Progress, per-cell lines, intermediate tables: what ``--quiet`` hushes."""
result_console = Console(stderr=True, highlight=False)
"""Warnings, errors and a command's final result lines: shown even with ``--quiet``."""
log = logging.getLogger("torchscale")

ALWAYS_SHOWN = ("[WARN]", "[FAIL]", "[ERROR]")
"""A console line whose tag is one of these is a warning or an error: never hushed."""


def set_quiet(quiet: bool) -> None:
    """``torchscale --quiet``: only warnings, errors and the final result lines."""
    err_console.quiet = quiet


def is_quiet() -> bool:
    return bool(err_console.quiet)


def say(line: str) -> None:
    """One line of text on stderr: no markup (brackets in names and errors are text), wrapped
    by the terminal, not cut; a ``> [WARN]`` or ``> [FAIL]`` line is shown even with --quiet."""
    tagged = line.lstrip("> ").startswith(ALWAYS_SHOWN)
    console = result_console if tagged else err_console
    console.print(line, markup=False, highlight=False, soft_wrap=True)


def show_result(renderable: object) -> None:
    """A command's final result (its results table, where a report was written): always."""
    result_console.print(renderable, soft_wrap=isinstance(renderable, str), markup=False)

F = TypeVar("F", bound=Callable[..., Any])


def setup_logging(level: int) -> None:
    """Route torchscale's log records to stderr through Rich."""
    from rich.logging import RichHandler

    # Warnings and errors are logged: the console --quiet does not hush (the level does).
    handler = RichHandler(console=result_console, show_time=False, show_path=False, markup=False)
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
    result_console.print(f"[bold red]Error:[/bold red] {escape(message)}", soft_wrap=True)
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
