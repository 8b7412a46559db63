"""The cell kinds, in plan order, and the one vocabulary of cell kinds -> record kinds.

A cell kind is what one launch runs (``Cell.kind``); a record kind is what one line of
``results.jsonl`` holds (``ResultBase.kind``, parsed by ``torchscale.results.schema``). Training
cells write ``training`` records; communication cells write ``collective`` records (send/recv
pairs as op ``send_recv``) and ``tp_gemm`` records. To add a kind, see docs/architecture.md.
"""

from __future__ import annotations

from typing import Dict, List

from torchscale.comm.kind import KIND as COMMUNICATION
from torchscale.errors import TorchscaleError
from torchscale.kinds.protocol import CellKind
from torchscale.kinds.training_kind import KIND as TRAINING

CELL_KINDS: Dict[str, CellKind] = {kind.name: kind for kind in (TRAINING, COMMUNICATION)}
"""Every cell kind by name, in the order their cells run."""

TRAINING_KIND = TRAINING.name
"""The default of ``Cell.kind``: cells written before kinds existed are training cells."""


def get_kind(name: str) -> CellKind:
    """The kind of a cell (``Cell.kind``)."""
    try:
        return CELL_KINDS[name]
    except KeyError:
        raise TorchscaleError(
            f"unknown cell kind '{name}': known kinds are {', '.join(CELL_KINDS)}"
        ) from None


def record_kinds(cell_kind: str) -> List[str]:
    """The record kinds a cell of ``cell_kind`` writes."""
    return [model.model_fields["kind"].default for model in get_kind(cell_kind).record_models]


def selected_kinds(benchmark: str) -> List[CellKind]:
    """The kinds a ``--benchmark`` choice runs, in plan order."""
    return [kind for kind in CELL_KINDS.values() if benchmark in kind.selections]


def benchmark_choices() -> List[str]:
    """Every ``--benchmark`` choice, ``all`` first."""
    choices: List[str] = []
    for kind in CELL_KINDS.values():
        choices += [choice for choice in kind.selections if choice not in choices]
    return choices
