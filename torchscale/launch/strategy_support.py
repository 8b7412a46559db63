"""The ``strategy:`` knob: whether this torch, and this cell's layout, can run a data-parallel
strategy at all. One that cannot makes the cell ``skipped`` with the reason, decided here before
any launch (as ``launch/backends.py`` does for backends). The wrapping itself is the worker's
(``worker/strategies.py``)."""

from __future__ import annotations

import importlib
from typing import Dict, Optional

STRATEGY_MODULES: Dict[str, str] = {
    "replicate": "torch.distributed._composable.replicate_with_fsdp",
    "fsdp2": "torch.distributed.fsdp",
    "fsdp2_hybrid": "torch.distributed.fsdp",
}
"""Where each strategy's wrapper lives in torch (ddp is always there)."""
STRATEGY_FUNCTIONS = {
    "replicate": "replicate",
    "fsdp2": "fully_shard",
    "fsdp2_hybrid": "fully_shard",
}


def strategy_available(strategy: str) -> Optional[str]:
    """Why this torch lacks ``strategy``, or None."""
    module_name = STRATEGY_MODULES.get(strategy)
    if module_name is None:
        return None
    function = STRATEGY_FUNCTIONS[strategy]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        return f"strategy {strategy} needs {module_name}, which this torch lacks ({exc})"
    if not callable(getattr(module, function, None)):
        return f"strategy {strategy} needs {module_name}.{function}, which this torch lacks"
    return None


def strategy_skip_reason(strategy: str, nnodes: int) -> Optional[str]:
    """Why a cell of ``strategy`` on ``nnodes`` nodes cannot run here, or None."""
    if strategy == "fsdp2_hybrid" and nnodes < 2:
        return (
            "strategy fsdp2_hybrid shards within a node and replicates across nodes; this cell "
            "runs on one node (use fsdp2, or nodes: [2])"
        )
    return strategy_available(strategy)


def compile_skip_reason(mode: object) -> Optional[str]:
    """Why this torch cannot run ``compile: <mode>``, or None."""
    if mode != "compiled_autograd":
        return None
    try:
        dynamo = importlib.import_module("torch._dynamo.config")
    except ImportError as exc:
        return f"compile: compiled_autograd needs torch._dynamo, which this torch lacks ({exc})"
    if not hasattr(dynamo, "compiled_autograd"):
        return "compile: compiled_autograd needs a torch with compiled autograd (2.4 or later)"
    return None
