"""``torchscale tune``: search DDP's settings for one model on this node, and prove the gain."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import typer
from typing_extensions import Annotated

from torchscale.cli.console import err_console, markup_text, print_json, show_result, user_errors
from torchscale.cli.script_args import (
    SCRIPT_PANEL,
    SamplesPerStepOption,
    StepAtOption,
    ThreadsOption,
    script_options,
)
from torchscale.errors import ConfigError

if TYPE_CHECKING:
    from pandas import DataFrame
    from rich.table import Table

    from torchscale.app.own_script import ScriptOptions
    from torchscale.plan.planned_cell import Cell
    from torchscale.results.schema import ResultBase
    from torchscale.tune.tune_runner import TuneRequest

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


def _request(
    config: Optional[Path],
    set_: List[str],
    model: Optional[str],
    batch_size: Optional[int],
    gpus: Optional[int],
    allow: List[str],
    output_dir: Path,
    budget: str,
    trials: Optional[int],
    finalists: Optional[int],
    repeats: Optional[int],
    script: Optional[ScriptOptions] = None,
    noise_floor: Optional[float] = None,
) -> TuneRequest:
    """Everything checked before anything runs (bad input: one line, exit 2)."""
    from torchscale.config.durations import parse_duration
    from torchscale.config.loader import apply_overrides, load_config, parse_overrides, read_yaml
    from torchscale.config.tune_section import TuneSection

    budget_s = parse_duration(budget, "--budget", "90s, 20m, 2min or 1h30m")
    if noise_floor is not None and not (math.isfinite(noise_floor) and 0 <= noise_floor < 1000):
        raise ConfigError(
            f"--noise-floor {noise_floor:g} must be a % between 0 and 1000 (leave it out: a "
            "verdict taken on a busy host is then refused)"
        )
    overrides = parse_overrides(set_)
    if script is not None:
        import copy

        from torchscale.app.own_script import script_raw

        if model or batch_size:
            raise ConfigError("--model and --batch-size go without --script: a script has its own")
        base = script_raw(replace(script, gpus=[gpus] if gpus else []), config)
        raw = apply_overrides(copy.deepcopy(base), overrides)
        loaded = load_config(None, overrides, base=base)
    elif config is None:
        raise ConfigError(
            "missing --config: pass the benchmark YAML (the baseline), or your own training "
            "script with --script PATH"
        )
    else:
        pins = [
            (["models"], [model] if model else None),
            (["batch_sizes"], [batch_size] if batch_size else None),
            (["gpu_counts"], [gpus] if gpus else None),
        ]
        overrides += [(path, value) for path, value in pins if value is not None]
        raw = apply_overrides(read_yaml(config), overrides)
        raw.setdefault("experiment_name", config.stem)
        loaded = load_config(config, overrides)
    section = loaded.tune or TuneSection.model_validate({})
    updates = {"finalists": finalists, "repeats": repeats}
    section = section.model_copy(update={k: v for k, v in updates.items() if v is not None})
    from torchscale.models.registry import check_model_factories
    from torchscale.tune.space import check_section

    check_section(section, allow)
    check_model_factories(loaded.models, seq_len=loaded.seq_len[0])
    baseline = _baseline(loaded, "script" if script is not None else "training")
    from torchscale.tune.tune_runner import TuneRequest, check_node_fits

    check_node_fits(baseline)
    from torchscale.tune.space import build_space

    space = build_space(baseline, section, allow, _where(baseline))
    if not space.knobs:
        raise ConfigError(
            "nothing to search: every knob is left out here ("
            + "; ".join(f"{k}: {why}" for k, why in space.left_out.items())
            + "); name knobs under tune: space:"
        )
    pinned: Dict[str, Any] = {"gpu_counts": [baseline.gpus]}
    if script is None:
        pinned = {"models": [baseline.model], "batch_sizes": [baseline.batch_size], **pinned}
    return TuneRequest(
        loaded, raw, pinned, baseline, space, section, output_dir, budget_s, trials, noise_floor
    )


def _baseline(config: Any, selection: str) -> Any:
    from torchscale.plan.matrix import iter_cells, swept_knobs

    if selection == "training" and not config.models:
        raise ConfigError(
            "tune needs a model: add models: [...] to the config or pass --model, or tune your "
            "own training script with --script PATH"
        )
    swept = swept_knobs(config, selection)
    if swept:
        raise ConfigError(
            f"tune starts from one configuration, and the config sweeps {', '.join(swept)}: pick "
            "one with --model, --batch-size and --gpus (or --set key=value), and list the "
            "candidates under tune: space:"
        )
    cells = list(iter_cells(config, selection, max_cells=None if selection == "script" else 1))
    if len(cells) > 1:
        counts = sorted({cell.settings.gpus for cell in cells})
        raise ConfigError(
            f"tune starts from one configuration, and the script runs on {counts} ranks: pick "
            "one with --gpus N"
        )
    (cell,) = cells
    if cell.settings.nnodes > 1:
        raise ConfigError("tune runs on one node: drop nodes/gpus_per_node from the config")
    settings: Any = cell.settings  # a model's or a script's settings (a pydantic model)
    return settings.model_copy(update={"repeat": 0})


def _where(baseline: Any) -> Any:
    from torchscale.hardware.environment import node_devices
    from torchscale.tune.space import Where

    if not hasattr(baseline, "model"):  # a script: what it trains on is its own business
        return Where(node_devices().kind, True, None)
    from torchscale.models.registry import load_model

    try:
        conv: Optional[bool] = bool(load_model(baseline.model).supports_channels_last)
    except Exception:  # a model that only builds in the workers: searched, not guessed
        conv = None
    return Where(node_devices().kind, baseline.data.source == "synthetic", conv)


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
    own = script_options(ctx, script, samples_per_step, step_at, threads)
    request = _request(
        config, set_ or [], model, batch_size, gpus, allow or [], output_dir, budget,
        trials, finalists, repeats, own, noise_floor,
    )  # fmt: skip
    from torchscale.hardware.environment import node_devices
    from torchscale.launch.process import Terminated
    from torchscale.plan.cpu_size import gpu_sized_warnings
    from torchscale.results.store import check_writable
    from torchscale.tune.tune_runner import run_tune, tune_folder

    for line in gpu_sized_warnings(request.config, node_devices().kind):
        err_console.print(f"> [WARN] {line}", soft_wrap=True, markup=False)
    check_writable(output_dir)
    folder = tune_folder(output_dir, request.config.experiment_name)
    err_console.print(f"> Tuning goes to {folder}", soft_wrap=True, markup=False)
    try:
        with TuneConsole(trials) as console:
            summary = run_tune(request, console)
    except KeyboardInterrupt as exc:
        how = "Terminated" if isinstance(exc, Terminated) else "Interrupted"
        show_result(
            f"{how}. Finished trials are safe in {folder}; run the same command again to resume."
        )
        code = EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
        raise typer.Exit(code) from None
    from torchscale.results.layout import TUNE_BEST_CONFIG, TUNE_DDP_SNIPPET, TUNE_SUMMARY
    from torchscale.tune.tune_outputs import BUSY_HOST, NO_OUTPUTS

    measured = summary["result"] not in NO_OUTPUTS
    written = f"{TUNE_BEST_CONFIG}, {TUNE_DDP_SNIPPET} and " if measured else ""
    show_result(f"> {written}{TUNE_SUMMARY} {'are' if measured else 'is'} in {folder}")
    table = finalists_table(summary)
    if table is not None:
        show_result(table)
    if summary.get("warning"):
        show_result(f"> [WARN] {summary['warning']}")
    if request.script is not None and measured:  # the lines to paste into the script
        snippet = (folder / TUNE_DDP_SNIPPET).read_text(encoding="utf-8")
        show_result(snippet.rstrip())
    show_result(summary["line"])
    if json_output:
        print_json(summary)
    if summary["result"] == BUSY_HOST:  # measured, but nothing a verdict may rest on
        raise typer.Exit(EXIT_BUSY_HOST)
    if not measured:  # a gate that measured nothing does not pass
        raise typer.Exit(EXIT_NOTHING_MEASURED)
