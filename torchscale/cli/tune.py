"""``torchscale tune``: search DDP's settings for one model on this node, and prove the gain."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import typer
from typing_extensions import Annotated

from torchscale.cli.console import err_console, print_json, show_result, user_errors
from torchscale.errors import ConfigError

if TYPE_CHECKING:
    from pandas import DataFrame

    from torchscale.plan.planned_cell import Cell
    from torchscale.results.schema import ResultBase
    from torchscale.tune.tune_runner import TuneRequest

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class TuneConsole:
    """A progress bar over the trials with the best so far, and a line per finished trial."""

    def __init__(self, total: Optional[int]) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

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

    def __enter__(self) -> TuneConsole:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def _show(self, extra: str = "") -> None:
        self.progress.update(self.task, description=f"{self.current} · {self.best}{extra}")

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

    def cell_started(self, cell: Cell, position: int, total: int) -> None:
        self._show(f" · cell {position}/{total}")

    def cell_polled(self, elapsed_s: float) -> None:
        self._show(f" · {elapsed_s:.0f}s")

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


def _request(
    config: Path,
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
) -> TuneRequest:
    """Everything checked before anything runs (bad input: one line, exit 2)."""
    from torchscale.config.loader import apply_overrides, load_config, parse_overrides, read_yaml
    from torchscale.config.tune_section import TuneSection, parse_budget

    budget_s = parse_budget(budget)
    overrides = parse_overrides(set_)
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
    baseline = _baseline(loaded)
    from torchscale.tune.space import build_space
    from torchscale.tune.tune_runner import TuneRequest

    space = build_space(baseline, section, allow, _where(baseline))
    if not space.knobs:
        raise ConfigError(
            "nothing to search: every knob is left out here ("
            + "; ".join(f"{k}: {why}" for k, why in space.left_out.items())
            + "); name knobs under tune: space:"
        )
    pinned = {
        "models": [baseline.model],
        "batch_sizes": [baseline.batch_size],
        "gpu_counts": [baseline.gpus],
    }
    return TuneRequest(loaded, raw, pinned, baseline, space, section, output_dir, budget_s, trials)


def _baseline(config: Any) -> Any:
    from torchscale.plan.matrix import iter_cells, swept_knobs

    if not config.models:
        raise ConfigError("tune needs a model: add models: [...] to the config or pass --model")
    swept = swept_knobs(config, "training")
    if swept:
        raise ConfigError(
            f"tune starts from one configuration, and the config sweeps {', '.join(swept)}: pick "
            "one with --model, --batch-size and --gpus (or --set key=value), and list the "
            "candidates under tune: space:"
        )
    (cell,) = list(iter_cells(config, "training", max_cells=1))
    if cell.settings.nnodes > 1:
        raise ConfigError("tune runs on one node: drop nodes/gpus_per_node from the config")
    return cell.settings.model_copy(update={"repeat": 0})


def _where(baseline: Any) -> Any:
    from torchscale.hardware.environment import node_devices
    from torchscale.models.registry import load_model
    from torchscale.tune.space import Where

    try:
        conv: Optional[bool] = bool(load_model(baseline.model).supports_channels_last)
    except Exception:  # a model that only builds in the workers: searched, not guessed
        conv = None
    return Where(node_devices().kind, baseline.data.source == "synthetic", conv)


def register(app: typer.Typer) -> None:
    @app.command("tune")
    @user_errors
    def tune(
        config: Annotated[
            Path,
            typer.Option("--config", "-c", help="Benchmark YAML: the baseline.", dir_okay=False),
        ],
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
            typer.Option("--budget", help="Time the search and verdict may take: 90s, 20m, 1h."),
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
        json_output: Annotated[
            bool, typer.Option("--json", help="Print the tuning summary as JSON on stdout.")
        ] = False,
    ) -> None:
        """Find the fastest DDP settings for one model and prove the gain (docs/tune.md)."""
        request = _request(
            config, set_ or [], model, batch_size, gpus, allow or [], output_dir, budget,
            trials, finalists, repeats,
        )  # fmt: skip
        from torchscale.launch.process import Terminated
        from torchscale.results.store import check_writable
        from torchscale.tune.tune_runner import run_tune, tune_folder

        check_writable(output_dir)
        folder = tune_folder(output_dir, request.config.experiment_name)
        err_console.print(f"> Tuning goes to {folder}", soft_wrap=True, markup=False)
        try:
            with TuneConsole(trials) as console:
                summary = run_tune(request, console)
        except KeyboardInterrupt as exc:
            how = "Terminated" if isinstance(exc, Terminated) else "Interrupted"
            show_result(
                f"{how}. Finished trials are safe in {folder}; run the same command again to "
                "resume."
            )
            code = EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
            raise typer.Exit(code) from None
        from torchscale.results.layout import TUNE_BEST_CONFIG, TUNE_DDP_SNIPPET, TUNE_SUMMARY

        show_result(f"> {TUNE_BEST_CONFIG}, {TUNE_DDP_SNIPPET} and {TUNE_SUMMARY} are in {folder}")
        if summary.get("warning"):
            show_result(f"> [WARN] {summary['warning']}")
        show_result(summary["line"])
        if json_output:
            print_json(summary)
