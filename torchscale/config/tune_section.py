"""The ``tune:`` section of a benchmark YAML: what ``torchscale tune`` searches and how it judges.

Torch-free, like the rest of the config: ``torchscale benchmark`` accepts (and ignores) the
section, so one file serves both commands.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from torchscale.config.base import StrictModel


class ValueRange(StrictModel):
    """A numeric knob's candidates as a range: ``{low: 1, high: 200, log: true}``."""

    low: float = Field(description="Smallest value tried.")
    high: float = Field(description="Largest value tried.")
    log: bool = Field(False, description="Sample on a log scale (sizes, rates).")
    step: Optional[PositiveFloat] = Field(None, description="Only multiples of step from low.")

    @model_validator(mode="after")
    def _ordered(self) -> ValueRange:
        if self.low >= self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        if self.log and self.low <= 0:
            raise ValueError("a log range needs low > 0")
        return self


class TuneSection(StrictModel):
    """How ``torchscale tune`` searches (docs/tune.md)."""

    search: Optional[List[str]] = Field(
        None,
        description="Knobs to search (dotted names, e.g. ddp.bucket_cap_mb); default: every knob "
        "that keeps the math and applies on this node, plus those allowed.",
    )
    space: Dict[str, Union[List[Any], ValueRange]] = Field(
        default_factory=dict,
        description="Candidate values per knob, a list or a range; replaces the knob's defaults "
        "(the baseline's value is always a candidate).",
    )
    allow: List[str] = Field(
        default_factory=list,
        description="Knobs that change numerics or the global batch, searched only when named "
        "(comm_hook, precision, grad_accum_steps); adds to --allow.",
    )
    finalists: NonNegativeInt = Field(
        2, description="Best trials re-measured against the baseline for the verdict."
    )
    repeats: PositiveInt = Field(
        3, description="Interleaved repeats of the baseline and each finalist in the verdict."
    )
    min_gain_pct: float = Field(
        1.0,
        ge=0,
        description="A winner must gain at least this much (and beyond noise) to replace the "
        "baseline.",
    )
    pruning: bool = Field(
        True,
        description="Successive halving: screen each trial on a short window, measure only the "
        "promising ones on the full window.",
    )
    screen_steps: Optional[PositiveInt] = Field(
        None, description="Steps of the screening window (default: a quarter of measure_steps)."
    )
    batch: PositiveInt = Field(4, description="Trials asked of Optuna and run together.")
    seed: int = Field(0, description="Seed of the sampler and of the bootstrap.")
