"""``--script train.py -- ARGS``: the user's training script as a benchmark config.

``benchmark``, ``profile`` and ``tune`` turn their ``--script`` options into a config with a
``script:`` section (``torchscale.script.script_config``), on top of ``--config`` when one is
given (its window, ``communication:``, ``profiling:`` and ``tune:`` keys; not its ``models``),
then ``--set`` overrides. Bad input (no such script, not Python, ``--config`` with models) is one
line and nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from torchscale.config.base import clip
from torchscale.config.foreign_layouts import SeedFlags
from torchscale.config.loader import Override, load_config, read_yaml
from torchscale.config.settings import BenchmarkConfig
from torchscale.errors import ConfigError
from torchscale.script.script_checks import check_script
from torchscale.script.script_config import SECTION


@dataclass(frozen=True)
class ScriptOptions:
    """What the command line says about the script."""

    path: str
    args: Sequence[str] = ()
    gpus: Sequence[int] = ()
    steps: Optional[int] = None  # measure_steps
    samples_per_step: Optional[int] = None
    step_at: Optional[str] = None
    threads: Optional[int] = None  # script.threads: else what plain torchrun gives
    knobs: Dict[str, Any] = field(default_factory=dict)  # window defaults of the command


def script_raw(options: ScriptOptions, config: Optional[Path]) -> Dict[str, Any]:
    """The config mapping for ``options``, on ``config``'s keys when given (checked: the
    script exists and is Python; the config lists no models and no script)."""
    check_script(options.path)
    raw: Dict[str, Any] = {**options.knobs, **(read_yaml(config) if config else {})}
    if raw.get("models"):
        models: List[Any] = raw["models"] if isinstance(raw["models"], list) else [raw["models"]]
        raise ConfigError(
            f"--script runs your script instead of models, and {config} lists models "
            f"({clip(', '.join(map(str, models)), 80)}): remove models from it (its other keys "
            "still apply), or run it without --script"
        )
    if raw.get(SECTION.key):
        raise ConfigError(
            f"--script and the {SECTION.key}: section of {config} both name a script: give it "
            "one way"
        )
    section: Dict[str, Any] = {"path": options.path, "args": list(options.args)}
    if options.samples_per_step is not None:
        section["samples_per_step"] = options.samples_per_step
    if options.step_at is not None:
        section["step_at"] = options.step_at
    if options.threads is not None:
        section["threads"] = options.threads
    raw[SECTION.key] = section
    if options.gpus:
        raw["gpu_counts"] = list(options.gpus)
    if options.steps is not None:
        raw["measure_steps"] = options.steps
        raw.pop("measure_seconds", None)
    raw.setdefault("experiment_name", config.stem if config else Path(options.path).stem)
    return raw


def script_config(
    options: ScriptOptions,
    config: Optional[Path],
    overrides: Sequence[Override] = (),
    flags: Optional[SeedFlags] = None,
) -> BenchmarkConfig:
    """The benchmark config that runs the script (bad input raises before anything is
    written). ``flags`` (``--warmup``/``--iters``) count the script's own steps: its warm-up
    and measured steps, as they do a model's."""
    if flags is not None and flags.iters is not None and options.steps is not None:
        raise ConfigError(
            f"--steps {options.steps} and --iters {flags.iters} both set the measured steps of "
            "the script: give one of them"
        )
    return load_config(None, overrides, base=script_raw(options, config), flags=flags)
