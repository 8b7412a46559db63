"""Console and logging shared by all commands.

Progress, logs and tables go to stderr; only machine-readable output (``--json``) goes to stdout,
so ``torchscale ... --json | jq`` always works.

Everything printed here is terminal-safe: a name from a config, a results folder or a trace may
hold escape sequences (a window title, a screen clear, OSC 52 writing the clipboard), so every
string reaches the terminal through ``torchscale.escaping.for_terminal`` (the console's
``render_str``, which tables, titles and captions go through too, and the log formatter).
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any, Callable, Optional, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from torchscale.errors import TorchscaleError
from torchscale.escaping import for_terminal


class TerminalConsole(Console):
    """A Rich console that shows control characters escaped in every string it renders (plain
    text, markup, table cells, titles, captions); Rich's own styles and cursor moves are not
    strings and are kept."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(for_terminal(text, keep_newlines=True), **kwargs)


err_console = TerminalConsole(stderr=True, highlight=False)
"""Progress, per-cell lines, intermediate tables: what ``--quiet`` hushes."""
result_console = TerminalConsole(stderr=True, highlight=False)
"""Warnings, errors and a command's final result lines: shown even with ``--quiet``."""
log = logging.getLogger("torchscale")

ALWAYS_SHOWN = ("[WARN]", "[FAIL]", "[ERROR]")
"""A console line whose tag is one of these is a warning or an error: never hushed."""


_process_is_the_command = False


def started_as_the_command() -> None:
    """Called by the ``torchscale`` entry point: this process was started for one command."""
    global _process_is_the_command
    _process_is_the_command = True


def command_started() -> Optional[float]:
    """When this process started, on the monotonic clock, where it was started for this command
    (a time budget then counts Python's and torch's start-up too, as the user's clock does);
    None in a process that was already running (a test, a notebook): the budget counts from
    when the command was asked for."""
    if not _process_is_the_command:
        return None
    import time

    import psutil

    try:
        age = time.time() - psutil.Process().create_time()
    except (psutil.Error, OSError):  # no /proc: count from now
        age = 0.0
    return time.monotonic() - max(0.0, age)


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


def markup_text(text: object) -> str:
    """``text`` for a string that is printed with Rich markup: escaped for the terminal and
    for the markup (a name holding ``[/x]`` is text, not a tag)."""
    return escape(for_terminal(text, keep_newlines=True))


class _TerminalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return for_terminal(super().format(record), keep_newlines=True)


def setup_logging(level: int) -> None:
    """Route torchscale's log records to stderr through Rich."""
    from rich.logging import RichHandler

    # Warnings and errors are logged: the console --quiet does not hush (the level does).
    handler = RichHandler(console=result_console, show_time=False, show_path=False, markup=False)
    handler.setFormatter(_TerminalFormatter("%(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


def print_json(document: object) -> None:
    """Write one JSON document to stdout (the only thing a ``--json`` command prints there).

    Strict JSON, whatever the document holds: a NaN or infinite number is written as null
    (``torchscale.results.files.dumps``, the one encoder for everything torchscale writes).
    """
    from torchscale.results.files import dumps

    write_stdout(dumps(document, indent=2) + "\n")


def write_stdout(text: str) -> None:
    """Write ``text`` to stdout and flush it; a stdout that cannot take it (a full disk,
    ``> /dev/full``, a closed pipe) is bad output, one line and exit 2, not a crash."""
    import errno
    import os

    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as exc:
        # Python flushes stdout again at exit and would print a second error: what is left in
        # its buffer goes nowhere instead.
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), sys.stdout.fileno())
        code = errno.errorcode.get(exc.errno or 0, "")
        reason = f"{exc.strerror or type(exc).__name__}{f' ({code})' if code else ''}"
        raise TorchscaleError(
            f"cannot write to stdout: {reason}; the output is incomplete: send it to a file or "
            "pipe that can take it"
        ) from None


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a one-line error on stderr and return the Exit to raise."""
    # One line whatever a name in it holds (a line break is shown as \n); a message naming
    # 'torchscale[mlflow]' or a path with brackets is text, not markup.
    shown = escape(for_terminal(message))
    result_console.print(f"[bold red]Error:[/bold red] {shown}", soft_wrap=True)
    return typer.Exit(code)


EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3
"""A crash: never 1, which ``compare`` and ``tune`` gates read as a verdict."""


def crash_line(exc: BaseException) -> str:
    """The one line a crash prints (the traceback goes to the log at debug level)."""
    from torchscale.escaping import for_terminal

    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return for_terminal(
        f"internal error, a bug in torchscale ({type(exc).__name__}{': ' if text else ''}{text}); "
        "rerun with --verbose for the traceback and report it"
    )


def user_errors(func: F) -> F:
    """Turn what a command raises into one stderr line and its exit code: a TorchscaleError is
    its own (2: bad input), an OSError naming a file is 2 (that file cannot be read or written),
    any other exception is a crash, 3 (``EXIT_INTERNAL``), the traceback logged at debug level.
    Click's own exits and Ctrl-C pass through."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import click

        try:
            return func(*args, **kwargs)
        except TorchscaleError as exc:
            raise fail(str(exc), exc.exit_code) from None
        except (typer.Exit, typer.Abort, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except click.ClickException:
            raise
        except OSError as exc:
            log.debug("traceback", exc_info=True)
            if exc.filename is None:
                raise fail(crash_line(exc), EXIT_INTERNAL) from None
            from torchscale.escaping import for_terminal

            reason = exc.strerror or type(exc).__name__
            raise fail(
                for_terminal(f"{exc.filename}: {reason}; check the path and its permissions"),
                EXIT_BAD_INPUT,
            ) from None
        except Exception as exc:
            log.debug("traceback", exc_info=True)
            raise fail(crash_line(exc), EXIT_INTERNAL) from None

    return wrapper  # type: ignore[return-value]
