"""A row's identity across a sweep: which settings a set of cells differ in, and the label that
names them (``batch 64 · bf16 · ddp.bucket_cap_mb=25``, ``backend=gloo``).

Every table, chart, console summary and JSON document that shows cells of one experiment side by
side keys its rows by the cells' *configuration*: all their settings apart from the scaling axis
(GPU count, node count, repeat) and the settings that do not change what is measured (time-outs).
Two cells that differ in any swept setting (backend, dtype, precision, any DDP knob) are two rows,
and the label says how they differ. The training tables (``analysis.scaling.label_variants``) and
the communication tables (``comm.result_tables``) both call this module.

No torch, no pandas: config errors and ``--help`` never import them.
"""

from __future__ import annotations

import json
from typing import Collection, Dict, List, Mapping, Sequence

from torchscale.config.base import flatten_settings

SCALING_AXES = frozenset({"gpus", "nnodes", "repeat"})
"""The x axis of every scaling chart: never part of a configuration."""
UNMEASURED = frozenset({"cell_timeout_s", "stall_timeout_s"})
"""Settings that do not change what a cell measures."""
NOT_CONFIGURATION = SCALING_AXES | UNMEASURED
SEPARATOR = " · "


def configuration(settings: Mapping[str, object]) -> Dict[str, object]:
    """A cell's settings without the scaling axis and the unmeasured settings."""
    return {k: v for k, v in settings.items() if k not in NOT_CONFIGURATION}


def configuration_key(settings: Mapping[str, object]) -> str:
    """One string per configuration (what cells of one configuration share)."""
    return json.dumps(configuration(settings), sort_keys=True, separators=(",", ":"))


def flat_configuration(settings: Mapping[str, object]) -> Dict[str, object]:
    """The configuration as dotted names (``ddp.bucket_cap_mb``)."""
    return dict(flatten_settings(configuration(settings)))


def differing(
    configs: Sequence[Mapping[str, object]], shown_apart: Collection[str] = ()
) -> List[str]:
    """The dotted settings whose values differ among ``configs`` (flat configurations), sorted;
    ``shown_apart``: settings a table shows in columns of their own."""
    names = sorted({name for config in configs for name in config} - set(shown_apart))
    return [n for n in names if len({json.dumps(c.get(n), sort_keys=True) for c in configs}) > 1]


def _value_text(name: str, value: object) -> str:
    if name in ("precision", "strategy"):
        return str(value)  # ``bf16``, ``fsdp2`` say what they are
    if isinstance(value, float):
        text = f"{value:g}"  # 25, as the config said it, not 25.0
    else:
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return f"{name}={text}"


def label(flat: Mapping[str, object], keys: Sequence[str], lead: Sequence[str] = ()) -> str:
    """``lead`` parts, then ``name=value`` for each of ``keys`` (precision by its value)."""
    return SEPARATOR.join([*lead, *(_value_text(key, flat.get(key)) for key in keys)])


def configuration_labels(
    settings: Mapping[str, Mapping[str, object]], shown_apart: Collection[str] = ()
) -> Dict[str, str]:
    """Per id (a cell id, a configuration key): the label of the settings that differ among all
    of ``settings`` ("" when they all share one configuration)."""
    flat = {key: flat_configuration(value) for key, value in settings.items()}
    keys = differing(list(flat.values()), shown_apart)
    return {key: label(values, keys) for key, values in flat.items()}
