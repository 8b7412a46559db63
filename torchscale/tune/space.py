"""The search space: which knobs ``tune`` tries, with which values, and what each changes.

The default space is every knob that keeps the math the same and can have an effect here (a
CUDA-only knob is left out on a CPU node, data-loader knobs with synthetic data). Knobs that
change numerics or the global batch join only when named with ``--allow``. The ``tune:`` section
narrows (``search:``) or widens (``space:``) it. The baseline's own value is always a candidate,
so trial 0 (the baseline) lies inside the space.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from pydantic import ValidationError

from torchscale.config.base import flatten_settings
from torchscale.config.loader import explain
from torchscale.config.settings import CellSettings
from torchscale.config.tune_section import TuneSection, ValueRange
from torchscale.errors import ConfigError
from torchscale.script.script_config import ScriptCellSettings

if TYPE_CHECKING:
    from optuna.trial import Trial


Candidates = Union[Tuple[Any, ...], ValueRange]
TunedSettings = Union[CellSettings, ScriptCellSettings]
"""What a trial sets knobs on: a model's training cell, or a script's cell (its DDP arguments
and process settings; a knob it lacks is the script's own business)."""
NOT_A_SETTING = "set by the script itself (a script cell has only ddp.* and cudnn_benchmark)"


@dataclass(frozen=True)
class Knob:
    name: str  # dotted, as in the config: ddp.bucket_cap_mb
    values: Tuple[Any, ...]  # default candidates
    changes: str  # what it changes, for the user
    allow: Optional[str] = None  # the --allow name when it changes numerics or the global batch
    needs: Optional[Tuple[str, Any]] = None  # searched only when another knob has this value
    cuda_only: bool = False
    loader_only: bool = False  # acts only with a real data loader (non-synthetic data)
    conv_only: bool = False


SAME_MATH = "same math"
KNOBS: Tuple[Knob, ...] = (
    Knob(
        "ddp.bucket_cap_mb",
        (1, 5, 10, 25, 50, 100, 200),
        f"{SAME_MATH}: how many MiB of gradients DDP all-reduces at once (fewer, larger "
        "collectives vs less overlap with backward)",
    ),
    Knob(
        "ddp.gradient_as_bucket_view",
        (False, True),
        f"{SAME_MATH}: gradients live in DDP's bucket memory (no copy into buckets, less memory)",
    ),
    Knob(
        "ddp.static_graph",
        (False, True),
        f"{SAME_MATH}: DDP may cache the bucket order after the first step; fails on models whose "
        "graph changes between steps",
    ),
    Knob(
        "ddp.broadcast_buffers",
        (True, False),
        f"{SAME_MATH} for gradients: buffers (BatchNorm running statistics) are no longer copied "
        "from rank 0 every forward, so each rank keeps its own",
    ),
    Knob(
        "channels_last",
        (False, True),
        f"{SAME_MATH}: NHWC memory layout for convolutions",
        conv_only=True,
    ),
    Knob(
        "cudnn_benchmark",
        (True, False),
        f"{SAME_MATH} up to rounding: cuDNN picks the fastest convolution algorithm per shape",
        cuda_only=True,
    ),
    Knob(
        "strategy",
        ("ddp", "replicate", "fsdp2"),
        f"{SAME_MATH} up to rounding: the data-parallel wrapper (fsdp2 shards parameters, "
        "gradients and optimizer state: less memory per rank, more collectives)",
    ),
    Knob(
        "reshard_after_forward",
        (True, False),
        f"{SAME_MATH}: fsdp2 frees each block's gathered parameters after its forward (less "
        "memory) or keeps them for backward (fewer all-gathers)",
        needs=("strategy", "fsdp2"),
    ),
    Knob("compile", (False, True), f"{SAME_MATH} up to rounding: torch.compile fuses kernels"),
    Knob(
        "compile_mode",
        (None, "reduce-overhead", "max-autotune"),  # None: torch.compile's default mode
        f"{SAME_MATH} up to rounding: CUDA graphs (reduce-overhead), kernel autotuning",
        needs=("compile", True),
        cuda_only=True,
    ),
    Knob(
        "optimizer_impl",
        ("auto", "foreach", "fused", "forloop"),
        f"{SAME_MATH} up to rounding: the optimizer step tensor by tensor (forloop), one kernel "
        "per op over all tensors (foreach) or one fused kernel",
    ),
    Knob(
        "data.num_workers",
        (0, 1, 2, 4, 8),
        f"{SAME_MATH}: data-loader worker processes per rank",
        loader_only=True,
    ),
    Knob(
        "data.pin_memory",
        (True, False),
        f"{SAME_MATH}: page-locked host buffers for host-to-GPU copies",
        loader_only=True,
        cuda_only=True,
    ),
    Knob(
        "ddp.comm_hook",
        ("none", "fp16", "bf16", "powersgd"),
        "NUMERICS: gradients are all-reduced compressed (fp16/bf16 rounding, or PowerSGD's "
        "low-rank approximation with error feedback)",
        allow="comm_hook",
    ),
    Knob(
        "precision",
        ("fp32", "amp", "bf16"),
        "NUMERICS: forward and backward in reduced precision (amp: fp16 with loss scaling)",
        allow="precision",
    ),
    Knob(
        "grad_accum_steps",
        (1, 2, 4),
        "GLOBAL BATCH: k micro-batches per optimizer step multiply the global batch by k (the "
        "learning rate and schedule may need retuning)",
        allow="grad_accum_steps",
    ),
)
KNOBS_BY_NAME = {knob.name: knob for knob in KNOBS}
ALLOWABLE = {knob.allow: knob.name for knob in KNOBS if knob.allow}
MAX_GRID = 10_000


@dataclass(frozen=True)
class Where:
    """What decides which knobs can act: the device kind, the data source, the model."""

    device_kind: str  # cuda or cpu
    synthetic_data: bool
    conv_model: Optional[bool]  # None: unknown (a user model): searched


@dataclass
class SearchSpace:
    knobs: List[Knob]
    candidates: Dict[str, Candidates]
    baseline: Dict[str, object]  # every knob's baseline value
    left_out: Dict[str, str] = field(default_factory=dict)  # knob -> why it is not searched

    def suggest(self, trial: Trial) -> Dict[str, object]:
        """Ask an Optuna trial for a value of every knob (define-by-run: a conditional knob only
        when its parent has the value it needs)."""
        params: Dict[str, object] = {}
        for knob in self.knobs:
            if (
                knob.needs
                and params.get(knob.needs[0], self.baseline.get(knob.needs[0])) != (knob.needs[1])
            ):
                continue
            options = self.candidates[knob.name]
            if isinstance(options, ValueRange):
                params[knob.name] = _suggest_range(trial, knob.name, options, self.baseline)
            else:
                params[knob.name] = trial.suggest_categorical(knob.name, list(options))
        return params

    def baseline_params(self) -> Dict[str, object]:
        return {
            knob.name: self.baseline[knob.name]
            for knob in self.knobs
            if not knob.needs or self.baseline.get(knob.needs[0]) == knob.needs[1]
        }

    def grid(self) -> Optional[List[Dict[str, object]]]:
        """Every combination, when the space is discrete and at most ``MAX_GRID``; else None."""
        lists = [self.candidates[k.name] for k in self.knobs]
        discrete = [c for c in lists if isinstance(c, tuple)]
        if len(discrete) < len(lists) or math.prod(len(c) for c in discrete) > MAX_GRID:
            return None
        combos: List[Dict[str, object]] = []
        seen = set()
        names = [k.name for k in self.knobs]
        for values in itertools.product(*discrete):
            params = dict(zip(names, values))
            for knob in self.knobs:  # a conditional knob without its parent value is not set
                if knob.needs and params.get(knob.needs[0]) != knob.needs[1]:
                    params.pop(knob.name)
            key = tuple(sorted(params.items()))
            if key not in seen:
                seen.add(key)
                combos.append(params)
        return combos

    def changes(self, params: Dict[str, object]) -> Dict[str, str]:
        """What each knob that differs from the baseline changes."""
        return {
            name: KNOBS_BY_NAME[name].changes
            for name, value in params.items()
            if value != self.baseline.get(name)
        }


def _suggest_range(trial: Trial, name: str, spec: ValueRange, baseline: Dict[str, object]) -> Any:
    if isinstance(baseline.get(name), int) and not isinstance(baseline.get(name), bool):
        step = int(spec.step) if spec.step and not spec.log else 1
        return trial.suggest_int(name, int(spec.low), int(spec.high), step=step, log=spec.log)
    return trial.suggest_float(name, spec.low, spec.high, step=spec.step, log=spec.log)


def apply_params(baseline: TunedSettings, params: Dict[str, object]) -> TunedSettings:
    """The baseline cell's settings with ``params`` set (validated: a combination the config
    forbids is a ConfigError naming it)."""
    raw = baseline.model_dump(mode="json")
    for dotted, value in params.items():
        node = raw
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    try:
        return type(baseline).model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(explain(exc, raw)) from None


def _check_names(names: Sequence[str], where: str) -> None:
    for name in names:
        if name not in KNOBS_BY_NAME:
            from difflib import get_close_matches

            close = get_close_matches(name, list(KNOBS_BY_NAME), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(
                f"{where} names '{name}', which tune cannot search{hint}; searchable knobs: "
                + ", ".join(KNOBS_BY_NAME)
            )


def _allowed(allow: Sequence[str]) -> List[str]:
    names = []
    for item in allow:
        name = ALLOWABLE.get(item) or (item if item in ALLOWABLE.values() else None)
        if name is None:
            raise ConfigError(
                f"--allow '{item}' is not a knob that needs allowing: choose from "
                + ", ".join(ALLOWABLE)
            )
        names.append(name)
    return names


def _not_here(knob: Knob, where: Where) -> Optional[str]:
    if knob.cuda_only and where.device_kind != "cuda":
        return "acts on CUDA only, and this node has no GPU"
    if knob.loader_only and where.synthetic_data:
        return "acts on a data loader, and the data is synthetic"
    if knob.conv_only and where.conv_model is False:
        return "acts on convolutions, and the model has none"
    return None


def _candidates(knob: Knob, section: TuneSection, base: Any) -> Candidates:
    given = section.space.get(knob.name)
    if isinstance(given, ValueRange):
        if base is None:
            raise ConfigError(
                f"tune.space.{knob.name}: a range needs the baseline's value: set "
                f"script.{knob.name} to the value your script passes, or list values"
            )
        if not isinstance(base, (int, float)) or isinstance(base, bool):
            raise ConfigError(f"tune.space.{knob.name}: a range needs a numeric knob; list values")
        if not given.low <= base <= given.high:
            raise ConfigError(
                f"tune.space.{knob.name}: the range {given.low:g}..{given.high:g} does not hold "
                f"the baseline's {base:g}: widen it"
            )
        return given
    values = list(given) if given is not None else list(knob.values)
    if knob.name == "data.num_workers" and given is None:
        import os

        values = [v for v in values if v <= (os.cpu_count() or 1)]
    if not values:
        raise ConfigError(f"tune.space.{knob.name} is empty: list at least one value")
    return tuple(dict.fromkeys([base, *values]))  # the baseline first, no repeats


def check_section(section: TuneSection, allow: Sequence[str]) -> None:
    """The knob names of the section and ``--allow``, checked before anything heavy loads."""
    _allowed([*allow, *section.allow])
    _check_names(section.search or [], "tune.search")
    _check_names(list(section.space), "tune.space")


def build_space(
    baseline: TunedSettings, section: TuneSection, allow: Sequence[str], where: Where
) -> SearchSpace:
    """The space for ``baseline`` on this node (every candidate checked against the config)."""
    check_section(section, allow)
    allowed = set(_allowed([*allow, *section.allow]))
    settings = dict(flatten_settings(baseline.model_dump(mode="json")))
    for name in getattr(baseline, "UNTUNED", ()):  # settings tune leaves to the config
        settings.pop(name, None)
    wanted = section.search
    knobs: List[Knob] = []
    left_out: Dict[str, str] = {}
    for knob in KNOBS:
        # A knob named by --allow is searched, whatever search: lists.
        named = (wanted is not None and knob.name in wanted) or knob.name in allowed
        if knob.name not in settings:
            if named or knob.name in section.space:
                raise ConfigError(
                    f"tune names {knob.name}, which is {NOT_A_SETTING}: leave it out of tune: "
                    "and --allow"
                )
            left_out[knob.name] = NOT_A_SETTING
            continue
        if knob.allow and knob.name not in allowed:
            what = knob.changes.split(":")[0].lower()
            if named or knob.name in section.space:
                raise ConfigError(
                    f"tune names {knob.name}, which changes the {what}: add --allow {knob.allow} "
                    "to search it"
                )
            left_out[knob.name] = f"changes the {what}: searched with --allow {knob.allow}"
            continue
        if wanted is not None and not named and knob.name not in section.space:
            left_out[knob.name] = "not in tune.search"
            continue
        reason = _not_here(knob, where)
        if reason and not named and knob.name not in section.space:
            left_out[knob.name] = reason
            continue
        knobs.append(knob)
    candidates = {k.name: _candidates(k, section, settings[k.name]) for k in knobs}
    base = {k.name: settings[k.name] for k in KNOBS if k.name in settings}
    space = SearchSpace(knobs, candidates, base, left_out)
    _check_values(baseline, space)
    return space


def _check_values(baseline: TunedSettings, space: SearchSpace) -> None:
    """Each listed value is valid for its knob (one line naming the first that is not)."""
    for name, options in space.candidates.items():
        values: Iterator[Any] = iter(()) if isinstance(options, ValueRange) else iter(options)
        for value in values:
            try:
                apply_params(baseline, {name: value})
            except ConfigError as exc:
                if "compile: true needs" in str(exc):
                    continue  # a combination, rejected per trial
                raise ConfigError(f"tune.space.{name}: {exc}") from None
