"""One cell of the matrix, and what every kind's planner shares: the settings digest of a
cell's identity and the node counts a GPU count spreads over.

Kind-specific planning lives with each kind (``torchscale.plan.training_cells``,
``torchscale.comm.plan``); ``torchscale.plan.matrix`` expands a whole config over the kinds of
``torchscale.kinds.kind_registry``.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Protocol

from pydantic import BaseModel

from torchscale.config.settings import BenchmarkConfig
from torchscale.errors import ConfigError
from torchscale.kinds.kind_registry import TRAINING_KIND


class KindSettings(Protocol):
    """The settings of one cell, whatever its kind: a pydantic model of the kind's own
    (``CellKind.settings_model``) with at least these."""

    @property
    def gpus(self) -> int: ...

    @property
    def nnodes(self) -> int: ...

    @property
    def nproc_per_node(self) -> int: ...

    @property
    def repeat(self) -> int: ...

    @property
    def cell_timeout_s(self) -> float: ...

    @property
    def backend(self) -> str:
        """The process-group backend (``auto``: nccl on GPUs, gloo on CPU)."""
        ...

    def model_dump(self, *, mode: str = "python") -> Dict[str, Any]: ...


# Settings that do not change what a cell measures, left out of its identity, so that --resume
# after raising a timeout still recognises finished cells.
NON_IDENTITY_FIELDS = {"repeat", "cell_timeout_s", "stall_timeout_s"}
LATER_DEFAULTS: Dict[str, Any] = {
    "backend": "auto",
    "cudnn_benchmark": True,
    "tf32": None,
    "optimizer_impl": "auto",
    "epochs": None,
    "sync_cuda": False,
    "compute_only": ["unsharded"],
    "strategy": "ddp",
    "reshard_after_forward": True,
}
"""Knobs added after results existed: at their default they are left out of a cell's identity."""


@dataclass(frozen=True)
class Cell:
    """One torchrun launch of the matrix; ``kind`` names its entry in the kinds registry."""

    index: int
    cell_id: str
    settings: KindSettings
    kind: str = TRAINING_KIND


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "x"


def settings_digest(settings: BaseModel) -> str:
    identity = settings.model_dump(mode="json", exclude=NON_IDENTITY_FIELDS)
    for name, default in LATER_DEFAULTS.items():  # so ids from before the knob stay the same
        if name in identity and identity[name] == default:
            del identity[name]
    if identity.get("compile") == "ddp_optimizer":
        identity["compile"] = True  # what compile: true was before it had modes
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(blob.encode()).hexdigest()[:8]


def node_counts(gpus: int, config: BenchmarkConfig, gpus_per_node: Optional[int]) -> List[int]:
    """The node counts a cell of ``gpus`` total ranks runs on.

    ``nodes:`` lists them (those that divide ``gpus``); else ``gpus_per_node`` (the config's, or
    the launch's node size) splits a count larger than one node evenly; else one node.
    """
    if config.nodes is not None:
        counts = [n for n in config.nodes if gpus % n == 0]
        if not counts:
            raise ConfigError(
                f"invalid config: gpu_counts {gpus} cannot be spread evenly over any of "
                f"nodes {config.nodes}: remove it or add a node count that divides it"
            )
        return counts
    per_node = config.gpus_per_node or gpus_per_node
    if per_node is None or gpus <= per_node:
        return [1]
    if gpus % per_node:
        raise ConfigError(
            f"invalid config: gpu_counts {gpus} is not a multiple of {per_node} GPUs per node: "
            "use multiples of gpus_per_node above one node"
        )
    return [gpus // per_node]
