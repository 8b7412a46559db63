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
    compare_command,
    history_command,
    profile_command,
    profile_diff_command,
    project_command,
    report_command,
    tune_command,
    validate_command,
)
from torchscale.cli.console import set_quiet, setup_logging, started_as_the_command
from torchscale.cli.script_args import ScriptArgsCommand, ScriptArgsGroup
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


# Every command, in one place: a module-level function of its own module under cli/, which
# parses its options, calls one use case of app/ and prints.
app.command(
    "benchmark",
    cls=ScriptArgsCommand,
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)(benchmark_command.benchmark)

profile_app = typer.Typer(
    name="profile",
    cls=ScriptArgsGroup,
    help="Wrap execution in Nsight Systems to find bottlenecks.",
    invoke_without_command=True,
    no_args_is_help=False,
    rich_markup_mode="rich",
)
profile_app.callback(invoke_without_command=True)(profile_command.capture)
profile_app.command("analyze")(profile_command.analyze)
profile_app.command("diff")(profile_diff_command.diff)
app.add_typer(profile_app, name="profile")

# 'torchscale report ...' and the seed's 'torchscale report generate ...' run one function.
report_app = typer.Typer(
    help="Generate visual HTML/PDF performance reports.",
    epilog=f"The report's figures are defined in its Glossary section and in {GLOSSARY_DOC}.",
)
report_app.callback(invoke_without_command=True)(report_command.report)
report_app.command("generate", help="Generate a report (the same as 'torchscale report').")(
    report_command.report
)
app.add_typer(report_app, name="report")

app.command("validate")(validate_command.validate)
app.command("compare")(compare_command.compare)
app.command("project", context_settings={"allow_extra_args": True})(project_command.project)
app.command("tune", cls=ScriptArgsCommand)(tune_command.tune)

history_app = typer.Typer(
    name="history",
    help="Every run in a database; change points with their cause (docs/history.md).",
    no_args_is_help=True,
)
history_app.command("ingest")(history_command.ingest_command)
history_app.command("predictions")(history_command.predictions_command)
history_app.command("report")(history_command.report_command)
history_app.command("export")(history_command.export_command)
history_app.command("changes")(history_command.changes_command)
history_app.command("show")(history_command.show_command)
app.add_typer(history_app, name="history")


def main() -> None:
    started_as_the_command()
    app()
