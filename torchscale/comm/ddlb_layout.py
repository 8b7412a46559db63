"""DDLB's ``config.json``, read as a ``communication:`` section with a ``tp_gemm:``.

DDLB benchmarks one primitive per file, ``tp_columnwise`` (torchscale's TP GEMM, see
``torchscale.comm.tp_gemm``), over the implementations it lists, every option a value or a list
whose cartesian product is run::

    {"benchmark": {"primitive": "tp_columnwise", "m": 65536, "n": 1024, "k": 1024,
                   "dtype": "float32", "validate": true, "num_iterations": 50, "num_warmups": 5,
                   "implementations": {
                       "compute_only": [{"size": "unsharded"}],
                       "pytorch": [{"backend": ["nccl", "ucc/tl/nccl", "ucc/tl/cuda"],
                                    "order": ["AG_before", "AG_after"]}]}}}

The scalars are aliases (``m`` is ``communication.tp_gemm.m``, ``num_iterations`` is
``communication.iterations``...); the implementation lists become ``communication.backend`` (one
cell per backend), ``communication.tp_gemm.orders`` and ``communication.tp_gemm.compute_only``.
The file's primitive is measured alone: no collectives, no P2P. A torchscale key given beside the
block (or by an override) wins over what the lists say.

No torch here: config errors must be reported without importing it.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Dict, List, Sequence, Tuple

from torchscale.config.base import clip
from torchscale.config.foreign_layouts import Alias, ForeignLayout, Raw, has_path, set_path
from torchscale.errors import ConfigError

NAME = "DDLB"
PRIMITIVE = "tp_columnwise"
DEFAULT_RANKS = 2
"""DDLB's README runs ``mpirun -np 2``; its file names no process count."""
PYTORCH_DEFAULTS = {"backend": "nccl", "order": "AG_before"}
"""DDLB's PyTorch implementation's DEFAULT_OPTIONS: what an entry that omits an option runs."""
MEASURED = ("compute_only", "pytorch")

ALIASES = (
    Alias("benchmark.m", "communication.tp_gemm.m"),
    Alias("benchmark.n", "communication.tp_gemm.n"),
    Alias("benchmark.k", "communication.tp_gemm.k"),
    Alias("benchmark.dtype", "communication.tp_gemm.dtype"),
    Alias("benchmark.validate", "communication.check"),
    Alias("benchmark.num_iterations", "communication.iterations"),
    Alias("benchmark.num_warmups", "communication.warmup"),
)
MAPPED = (
    Alias("benchmark.primitive: tp_columnwise", "communication.tp_gemm", "measured alone"),
    Alias(
        "benchmark.implementations.pytorch[].backend",
        "communication.backend",
        "every backend listed, one cell each",
    ),
    Alias("benchmark.implementations.pytorch[].order", "communication.tp_gemm.orders"),
    Alias("benchmark.implementations.compute_only[].size", "communication.tp_gemm.compute_only"),
)

log = logging.getLogger("torchscale")


def _is_ddlb(raw: Raw) -> bool:
    block = raw.get("benchmark")
    return isinstance(block, dict) and ("primitive" in block or "implementations" in block)


def _values(value: Any) -> List[Any]:
    return value if isinstance(value, list) else [value]


def _union(lists: Sequence[List[Any]]) -> List[Any]:
    """Every value of ``lists``, first seen first, each once."""
    found: List[Any] = []
    for values in lists:
        for value in values:
            if value not in found:
                found.append(value)
    return found


def _shown(values: List[Any]) -> str:
    return clip(f"[{', '.join(map(str, values))}]")


def _entries(implementations: Dict[str, Any], name: str) -> List[Dict[str, Any]]:
    entries = _values(implementations.get(name, []))
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ConfigError(
                f"DDLB's benchmark.implementations.{name}[{index}] must be an object of "
                f'options, like {{"size": "unsharded"}}'
            )
    return entries


def _check_options(name: str, entries: List[Dict[str, Any]], allowed: Tuple[str, ...]) -> None:
    for index, entry in enumerate(entries):
        for option in entry:
            if option not in allowed:
                raise ConfigError(
                    f"unknown key 'benchmark.implementations.{name}[{index}].{clip(option, 80)}' "
                    f"(DDLB's {name} implementation: torchscale reads {', '.join(allowed)})"
                )


def _pytorch(entries: List[Dict[str, Any]], comm: Raw) -> List[str]:
    """Backends and orders: their unions, each combination of the two measured."""
    combos = [
        list(
            itertools.product(
                _values(entry.get("backend", PYTORCH_DEFAULTS["backend"])),
                _values(entry.get("order", PYTORCH_DEFAULTS["order"])),
            )
        )
        for entry in entries
    ]
    backends = _union([[b for b, _ in listed] for listed in combos])
    orders = _union([[o for _, o in listed] for listed in combos])
    notes = []
    for key, ours, values in (
        ("backend", "backend", backends),
        ("order", "tp_gemm.orders", orders),
    ):
        where = f"DDLB's benchmark.implementations.pytorch[].{key} {_shown(values)}"
        if has_path(comm, ours):
            notes.append(f"{where}: communication.{ours} given beside it is used instead")
            continue
        set_path(comm, ours, values)
        notes.append(f"{where} is torchscale's communication.{ours}")
    listed = {combo for entry in combos for combo in entry}
    extra = len(backends) * len(orders) - len(listed)
    if extra:
        notes.append(
            f"DDLB's pytorch entries list {len(listed)} backend x order combinations; torchscale "
            f"runs every backend with every order ({extra} more)"
        )
    return notes


def _compute_only(entries: List[Dict[str, Any]], comm: Raw) -> List[str]:
    sizes = _union([_values(entry.get("size", "unsharded")) for entry in entries])
    where = f"DDLB's benchmark.implementations.compute_only[].size {_shown(sizes)}"
    if has_path(comm, "tp_gemm.compute_only"):
        return [f"{where}: communication.tp_gemm.compute_only given beside it is used instead"]
    set_path(comm, "tp_gemm.compute_only", sizes)
    return [f"{where} is torchscale's communication.tp_gemm.compute_only"]


def adopt(raw: Raw) -> List[str]:
    """The rest of DDLB's block (its scalars moved already): primitive and implementations."""
    block = raw.pop("benchmark")
    primitive = block.pop("primitive", PRIMITIVE)
    if primitive != PRIMITIVE:
        raise ConfigError(
            f"DDLB's benchmark.primitive '{clip(primitive, 80)}' is not measured by torchscale: it "
            f"measures {PRIMITIVE} (communication.tp_gemm); use primitive: {PRIMITIVE}"
        )
    comm = raw.setdefault("communication", {})
    if not isinstance(comm, dict):
        raise ConfigError("'communication' must be a section (a mapping of keys to values)")
    comm.setdefault("collectives", [])
    comm.setdefault("p2p", False)
    comm.setdefault("tp_gemm", {})
    notes = [
        f"DDLB's benchmark.primitive {PRIMITIVE} is torchscale's communication.tp_gemm, "
        "measured alone (no collectives, no P2P)"
    ]
    implementations = block.pop("implementations", {})
    if block:
        raise ConfigError(
            f"unknown key 'benchmark.{clip(next(iter(block)), 80)}' (DDLB's benchmark block: "
            "torchscale reads primitive, m, n, k, dtype, validate, num_iterations, num_warmups, "
            "implementations)"
        )
    if not isinstance(implementations, dict):
        raise ConfigError("DDLB's benchmark.implementations must be an object of lists")
    for name in implementations:
        if name not in MEASURED:
            log.warning(
                "DDLB's benchmark.implementations.%s is left out: torchscale measures the "
                "pytorch and compute_only implementations only",
                clip(name, 80),
            )
    pytorch = _entries(implementations, "pytorch")
    if not pytorch:
        raise ConfigError(
            "DDLB's benchmark.implementations lists no pytorch entry: torchscale measures "
            "tp_columnwise through torch.distributed; add one, e.g. "
            '"pytorch": [{"backend": "nccl", "order": ["AG_before", "AG_after"]}]'
        )
    compute_only = _entries(implementations, "compute_only")
    _check_options("pytorch", pytorch, ("backend", "order"))
    _check_options("compute_only", compute_only, ("size",))
    notes += _pytorch(pytorch, comm)
    notes += _compute_only(compute_only, comm)
    if "gpu_counts" not in raw:
        raw["gpu_counts"] = [DEFAULT_RANKS]
        notes.append(
            f"DDLB's file names no process count (mpirun -np gives it): gpu_counts is "
            f"[{DEFAULT_RANKS}], as DDLB's README runs it; add gpu_counts (or --set "
            "gpu_counts=[8]) for more"
        )
    return notes


DDLB_LAYOUT = ForeignLayout(NAME, ALIASES, claims=_is_ddlb, adopt=adopt, documented=MAPPED)
"""DDLB's JSON config, registered with the ``communication:`` section (``comm.config``)."""
