"""The registry of cell kinds: which kinds exist, each named by the module that defines it.

A cell kind is what one launch runs (``Cell.kind``); a record kind is what one line of
``results.jsonl`` holds (``ResultBase.kind``). A kind is a plugin: its own module (usually in its
own package, as ``torchscale.comm``) defines ``KIND``, an instance of a
``torchscale.plan.kind_base.KindBase`` subclass that says the five pieces of
``torchscale.plan.kind_protocol.CellKind`` (name, cell settings, worker, record models, plan) and
overrides the defaults it knows better, and, when it adds to the report,
``torchscale.report.reported_kinds.ReportedKind``. Training, the core kind, writes ``training``
records; a script's cells write them too (the script kind tells its own apart); communication
cells write ``collective`` records (send/recv pairs as op ``send_recv``) and ``tp_gemm`` records.

The stages (config, results, plan, launch, report) ask this registry for the kinds and never
import a kind's package: the registry names kinds by module and imports them on first use, as
plugins are found, so it sits below every stage and imports none of them. Adding a kind is one
line in ``KIND_MODULES``; see docs/architecture.md, "Adding a cell kind". Nothing outside this
module compares a kind's name with a literal (a test checks).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from typing import Iterator, List, Tuple

from torchscale.errors import TorchscaleError

KIND_MODULES: Tuple[str, ...] = (
    "torchscale.training.training_kind",
    "torchscale.comm.kind",
    "torchscale.script.script_kind",
)
"""Every cell kind, by the module whose ``KIND`` it is, in the order their cells run."""

TRAINING_KIND = "training"
"""The core kind: the default of ``Cell.kind`` (cells written before kinds existed)."""

SCRIPT_KIND = "script"
"""The kind of a user's own script, which writes the core kind's records (analysis tells a
script's apart through ``plan.kind_protocol.records_of``)."""

_ADDED: List[str] = []


def kind_modules() -> Tuple[str, ...]:
    """The modules of every registered kind: ``KIND_MODULES``, then those added at run time."""
    return (*KIND_MODULES, *_ADDED)


@contextlib.contextmanager
def added_kind(module: str) -> Iterator[None]:
    """Register the kind defined in ``module`` for the duration of the block (a test's own kind:
    it runs exactly as a line in ``KIND_MODULES`` would)."""
    _ADDED.append(module)
    try:
        yield
    finally:
        _ADDED.remove(module)


def load_kinds(modules: Tuple[str, ...]) -> Tuple[object, ...]:
    """The ``KIND`` of each of ``modules``, in order (each module imported once)."""
    return _load(modules)


@functools.cache
def _load(modules: Tuple[str, ...]) -> Tuple[object, ...]:
    kinds = []
    for path in modules:
        kind = getattr(importlib.import_module(path), "KIND", None)
        if kind is None:
            raise TorchscaleError(f"cell kind module {path} defines no KIND: define one there")
        kinds.append(kind)
    names = [getattr(kind, "name", None) for kind in kinds]
    twice = sorted({str(name) for name in names if names.count(name) > 1})
    if twice:
        raise TorchscaleError(f"two registered cell kinds are named {', '.join(twice)}")
    return tuple(kinds)


def registered_kinds() -> Tuple[object, ...]:
    """Every registered kind's ``KIND``, in plan order. Typed views check them against the
    protocol of the stage that asks: ``plan.kind_protocol.cell_kinds()``."""
    return load_kinds(kind_modules())
