"""The ``torchscale`` root command. Each subcommand lives in its own module under ``cli/``.

Nothing here imports torch: ``torchscale --help`` and config errors must stay fast.
"""

from __future__ import annotations

import logging
from typing import Optional

import typer
from typing_extensions import Annotated

from torchscale.cli import (
    benchmark_command,
    compare,
    history_command,
    profile_command,
    project,
    report_command,
    tune,
    validate,
)
from torchscale.cli.console import set_quiet, setup_logging
from torchscale.measures.figures import GLOSSARY_DOC
from torchscale.version import __version__

app = typer.Typer(
    name="torchscale",
    help="Benchmarking CLI for PyTorch DDP Clusters.",
    rich_markup_mode="rich",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=f"Every figure (throughput, step time, sync overhead, sync stall, scaling efficiency, "
    f"busbw...) is defined once, in {GLOSSARY_DOC}.",
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"torchscale {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    verbose: Annotated[
        Optional[bool],
        typer.Option(
            "--verbose/--quiet",
            "-v/-q",
            help="Verbose logging (debug detail), or quiet: only warnings, errors and the final "
            "result lines (the results table, where the report was written, validate's verdict).",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        Optional[bool],
        typer.Option(
            "--version",
            help="Show the version and exit.",
            callback=_version_callback,
            is_eager=True,
        ),
    ] = None,
) -> None:
    """Benchmarking CLI for PyTorch DDP Clusters."""
    levels = {None: logging.INFO, True: logging.DEBUG, False: logging.WARNING}
    setup_logging(levels[verbose])
    set_quiet(verbose is False)


benchmark_command.register(app)
profile_command.register(app)
report_command.register(app)
validate.register(app)
compare.register(app)
project.register(app)
tune.register(app)
history_command.register(app)


def main() -> None:
    app()
