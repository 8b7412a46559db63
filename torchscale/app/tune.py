"""The use case of ``torchscale tune``: one configuration (a built-in model's, or the user's own
script's) searched over the DDP knobs within a time budget, then the best trials re-measured
against the baseline for a verdict (docs/tune.md).

Nothing is printed here: the trials' progress goes to the ``console`` the CLI gives (entered
for the search), lines before it through ``notify``; the outcome says what was written."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ContextManager, Dict, List, Optional

from torchscale.app import Notify
from torchscale.errors import ConfigError

if TYPE_CHECKING:
    from torchscale.app.own_script import ScriptOptions
    from torchscale.tune.tune_runner import TuneEvents, TuneRequest


@dataclass(frozen=True)
class TuneArgs:
    config: Optional[Path] = None
    overrides: List[str] = field(default_factory=list)
    model: Optional[str] = None
    batch_size: Optional[int] = None
    gpus: Optional[int] = None
    allow: List[str] = field(default_factory=list)
    output_dir: Path = Path("results")
    budget: str = "20m"
    trials: Optional[int] = None
    finalists: Optional[int] = None
    repeats: Optional[int] = None
    script: Optional[ScriptOptions] = None
    noise_floor: Optional[float] = None
    started: Optional[float] = None
    """The budget's start (monotonic); None: now."""


@dataclass(frozen=True)
class TuneOutcome:
    folder: Path
    """Where the trials, the summary and the best config are."""
    summary: Dict[str, Any] = field(default_factory=dict)
    stopped_by: Optional[str] = None
    """``Interrupted`` (Ctrl-C) or ``Terminated`` (SIGTERM): finished trials are kept."""
    measured: bool = False
    """A verdict could be taken (not: nothing measured, or every trial failed)."""
    busy_host: bool = False
    """Measured, but on a busy host: nothing a verdict may rest on."""
    files: List[str] = field(default_factory=list)
    """What the tuning wrote in ``folder``."""
    snippet: Optional[str] = None
    """With --script and a verdict: the lines to paste into the script."""


def tune(args: TuneArgs, console: ContextManager[TuneEvents], notify: Notify) -> TuneOutcome:
    """Check everything (bad input: one line, before anything runs), then search and judge."""
    request = _request(args)
    from torchscale.hardware.environment import node_devices
    from torchscale.launch.process import Terminated
    from torchscale.plan.cpu_size import gpu_sized_warnings
    from torchscale.results.layout import TUNE_BEST_CONFIG, TUNE_DDP_SNIPPET, TUNE_SUMMARY
    from torchscale.results.store import check_writable
    from torchscale.tune.tune_outputs import BUSY_HOST, NO_OUTPUTS
    from torchscale.tune.tune_runner import run_tune, tune_folder

    for line in gpu_sized_warnings(request.config, node_devices().kind):
        notify(f"> [WARN] {line}")
    check_writable(args.output_dir)
    folder = tune_folder(args.output_dir, request.config.experiment_name)
    notify(f"> Tuning goes to {folder}")
    try:
        with console as events:
            summary = run_tune(request, events)
    except KeyboardInterrupt as exc:
        how = "Terminated" if isinstance(exc, Terminated) else "Interrupted"
        return TuneOutcome(folder, stopped_by=how)
    measured = summary["result"] not in NO_OUTPUTS
    files = [TUNE_BEST_CONFIG, TUNE_DDP_SNIPPET, TUNE_SUMMARY] if measured else [TUNE_SUMMARY]
    snippet = None
    if request.script is not None and measured:
        snippet = (folder / TUNE_DDP_SNIPPET).read_text(encoding="utf-8")
    return TuneOutcome(
        folder,
        summary,
        measured=measured,
        busy_host=summary["result"] == BUSY_HOST,
        files=files,
        snippet=snippet,
    )


def _request(args: TuneArgs) -> TuneRequest:
    """Everything checked before anything runs (bad input: one line, exit 2)."""
    from torchscale.config.durations import parse_duration
    from torchscale.config.loader import apply_overrides, load_config, parse_overrides, read_yaml
    from torchscale.config.tune_section import TuneSection

    config, model, batch_size, gpus, script = (
        args.config, args.model, args.batch_size, args.gpus, args.script
    )  # fmt: skip
    allow, noise_floor = args.allow, args.noise_floor
    budget_s = parse_duration(args.budget, "--budget", "90s, 20m, 2min or 1h30m")
    if noise_floor is not None and not (math.isfinite(noise_floor) and 0 <= noise_floor < 1000):
        raise ConfigError(
            f"--noise-floor {noise_floor:g} must be a % between 0 and 1000 (leave it out: a "
            "verdict taken on a busy host is then refused)"
        )
    overrides = parse_overrides(args.overrides)
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
    updates = {"finalists": args.finalists, "repeats": args.repeats}
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
        loaded, raw, pinned, baseline, space, section, args.output_dir, budget_s, args.trials,
        noise_floor, time.monotonic() if args.started is None else args.started,
    )  # fmt: skip


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
