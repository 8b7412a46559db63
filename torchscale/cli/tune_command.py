"""``torchscale tune``: search DDP's settings for one model on this node, and prove the gain."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import typer
from typing_extensions import Annotated

from torchscale.cli.console import (
    command_started,
    err_console,
    markup_text,
    print_json,
    show_result,
    user_errors,
)
from torchscale.cli.script_args import (
    SCRIPT_PANEL,
    SamplesPerStepOption,
    StepAtOption,
    ThreadsOption,
    script_options,
)

if TYPE_CHECKING:
    from pandas import DataFrame
    from rich.table import Table

    from torchscale.plan.planned_cell import Cell
    from torchscale.results.schema import ResultBase

EXIT_NOTHING_MEASURED = 1
EXIT_BUSY_HOST = 2  # as compare's gate with cells it could not judge
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class TuneConsole:
    """A progress bar over the trials with the best so far, and a line per finished trial; in a
    log, a line at least every 10 s of a running cell (``cli/running_cell.py``)."""

    def __init__(self, total: Optional[int]) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        from torchscale.cli.running_cell import RunningCell

        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed} trial(s)"),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
        )
        self.task = self.progress.add_task("tuning", total=total)
        self.best = "best: -"
        self.current = ""
        self.running = RunningCell()

    def __enter__(self) -> TuneConsole:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def _show(self, extra: str = "") -> None:
        description = f"{self.current} · {self.best}{extra}"
        self.progress.update(self.task, description=markup_text(description))

    def phase(self, text: str) -> None:
        self.current = text
        err_console.print(f"> [TUNE] {text}", markup=False, soft_wrap=True)
        self._show()

    def trial_told(self, number: int, summary: Dict[str, Any]) -> None:
        from torchscale.tune.tune_outputs import describe_params

        best = summary.get("best")
        if best:
            self.best = (
                f"best: {best['samples_per_s']:,.1f} samples/s (trial {best['number']}: "
                f"{describe_params(best['params'])})"
            )
        self.progress.advance(self.task)
        err_console.print(
            f"> [TRIAL {number}] {summary['state']} · {self.best}", markup=False, soft_wrap=True
        )
        self._show()

    def cell_started(self, cell: Cell, position: int, total: int, cell_dir: Path) -> None:
        self.running.start(cell, cell_dir)
        self._show(f" · cell {position}/{total}")

    def cell_polled(self, elapsed_s: float) -> None:
        from torchscale.cli.running_cell import say_progress

        if err_console.is_terminal:
            self._show(f" · {self.running.where(elapsed_s)}")
        else:
            say_progress(self.running, elapsed_s)

    def cell_finished(
        self, cell: Cell, records: List[ResultBase], table: Optional[DataFrame]
    ) -> None:
        for record in records:
            if record.status != "ok":
                err_console.print(
                    f"> [FAIL] {cell.cell_id}: {record.status}: {record.error}",
                    markup=False,
                    soft_wrap=True,
                )


def finalists_table(summary: Dict[str, Any]) -> Optional[Table]:
    """The verdict's finalists against the baseline, fitted to the console: what each changed,
    its throughput, the gain with its interval and whether it counts."""
    from torchscale.console_tables import Col, fitted_table
    from torchscale.tune.tune_outputs import describe_params

    finalists = (summary.get("verdict") or {}).get("finalists") or []
    if not finalists:
        return None

    def number(value: Any, spec: str, suffix: str = "") -> str:
        return "-" if value is None else format(value, spec) + suffix

    def interval(finalist: Dict[str, Any]) -> str:
        low, high = finalist.get("ci_low_pct"), finalist.get("ci_high_pct")
        return "-" if low is None or high is None else f"{low:+.1f}..{high:+.1f}%"

    def verdict(finalist: Dict[str, Any]) -> str:
        return "gain" if finalist.get("significant") else finalist.get("note") or "no gain"

    cols = [
        Col("trial", [str(f["trial"]) for f in finalists]),
        Col(
            "changes",
            [describe_params(f.get("changed") or {}) for f in finalists],
            numeric=False,
            wrap=True,
        ),
        Col(
            "samples/s",
            [number(f.get("samples_per_s"), ",.1f") for f in finalists],
            compact="samples\n/s",
        ),
        Col("gain", [number(f.get("gain_pct"), "+.1f", "%") for f in finalists]),
        Col("95% CI", [interval(f) for f in finalists]),
        Col("verdict", [verdict(f) for f in finalists], numeric=False, wrap=True),
    ]
    baseline = next((f.get("baseline_samples_per_s") for f in finalists), None)
    title = "Finalists against the baseline" + (
        f" ({baseline:,.1f} samples/s)" if baseline is not None else ""
    )
    return fitted_table(err_console, title, cols, left_out=f"see {summary.get('tune_dir')}")


@user_errors
def tune(
    ctx: typer.Context,
    config: Annotated[
        Optional[Path],
        typer.Option(
            "--config",
            "-c",
            help="Benchmark YAML: the baseline (with --script: its window and tune: keys).",
            dir_okay=False,
        ),
    ] = None,
    output_dir: Annotated[
        Path,
        typer.Option("--output-dir", "-o", help="Trials go to OUTPUT_DIR/<experiment>/tune/."),
    ] = Path("results"),
    model: Annotated[
        Optional[str], typer.Option("--model", help="The model to tune (when several).")
    ] = None,
    batch_size: Annotated[
        Optional[int], typer.Option("--batch-size", help="Per-GPU batch size.", min=1)
    ] = None,
    gpus: Annotated[
        Optional[int], typer.Option("--gpus", help="Ranks (GPUs, or CPU processes).", min=1)
    ] = None,
    budget: Annotated[
        str,
        typer.Option(
            "--budget", help="Time the search and verdict may take: 90s, 20m, 2min, 1h30m."
        ),
    ] = "20m",
    trials: Annotated[
        Optional[int], typer.Option("--trials", help="At most this many trials.", min=1)
    ] = None,
    allow: Annotated[
        Optional[List[str]],
        typer.Option(
            "--allow",
            help="Also search a knob that changes numerics or the global batch: comm_hook, "
            "precision or grad_accum_steps (repeatable).",
        ),
    ] = None,
    finalists: Annotated[
        Optional[int],
        typer.Option("--finalists", help="Best trials re-measured for the verdict.", min=0),
    ] = None,
    repeats: Annotated[
        Optional[int],
        typer.Option("--repeats", help="Interleaved repeats in the verdict.", min=1),
    ] = None,
    set_: Annotated[
        Optional[List[str]],
        typer.Option("--set", help="Override a config key, e.g. --set measure_steps=40."),
    ] = None,
    noise_floor: Annotated[
        Optional[float],
        typer.Option(
            "--noise-floor",
            help="Run-to-run noise in % (as compare --noise-floor): a gain must exceed it. "
            "Needed for a verdict on a busy host (other processes holding the cores).",
        ),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the tuning summary as JSON on stdout.")
    ] = False,
    script: Annotated[
        Optional[str],
        typer.Option(
            "--script",
            help="Tune your own DDP training script, run unmodified (its arguments after "
            "--): its DDP arguments and process settings (docs/own-job.md).",
            rich_help_panel=SCRIPT_PANEL,
        ),
    ] = None,
    samples_per_step: SamplesPerStepOption = None,
    step_at: StepAtOption = None,
    threads: ThreadsOption = None,
) -> None:
    """Find the fastest DDP settings for one model, or your own script, and prove the gain
    (docs/tune.md)."""
    from torchscale.app.tune import TuneArgs
    from torchscale.app.tune import tune as run_tune

    own = script_options(ctx, script, samples_per_step, step_at, threads)
    args = TuneArgs(
        config, set_ or [], model, batch_size, gpus, allow or [], output_dir, budget,
        trials, finalists, repeats, own, noise_floor, command_started(),
    )  # fmt: skip
    outcome = run_tune(args, TuneConsole(trials), _note)
    folder, summary = outcome.folder, outcome.summary
    if outcome.stopped_by is not None:
        show_result(
            f"{outcome.stopped_by}. Finished trials are safe in {folder}; run the same command "
            "again to resume."
        )
        terminated = outcome.stopped_by == "Terminated"
        raise typer.Exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)
    measured = outcome.measured
    *written, last = outcome.files
    listed = f"{', '.join(written)} and " if written else ""
    show_result(f"> {listed}{last} {'are' if measured else 'is'} in {folder}")
    table = finalists_table(summary)
    if table is not None:
        show_result(table)
    if summary.get("warning"):
        show_result(f"> [WARN] {summary['warning']}")
    if outcome.snippet is not None:  # the lines to paste into the script
        show_result(outcome.snippet.rstrip())
    show_result(summary["line"])
    if json_output:
        print_json(summary)
    if outcome.busy_host:  # measured, but nothing a verdict may rest on
        raise typer.Exit(EXIT_BUSY_HOST)
    if not measured:  # a gate that measured nothing does not pass
        raise typer.Exit(EXIT_NOTHING_MEASURED)


def _note(line: str) -> None:
    err_console.print(line, soft_wrap=True, markup=False)
