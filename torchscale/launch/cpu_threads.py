"""How many intra-op threads each CPU rank runs, and the line that says so.

Built-in kinds (a model, the collectives) give every CPU rank its slot's share of the cores
(``hardware.environment.threads_per_cpu_slot``), the same at every rank count, so that a 1-rank
and an N-rank cell compare like with like. A kind that runs the user's own process
(``CellKind.own_threads``: ``--script``) keeps what plain ``torchrun`` gives it instead:
``OMP_NUM_THREADS=1`` with more than one process per node (torchrun sets it then, unless the
environment already does), else the environment's ``OMP_NUM_THREADS`` or torch's own default;
``script.threads`` (``--threads N``) sets it in every rank.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Callable, Dict, List, Optional

from torchscale.hardware.environment import CPU_SLOTS_ENV, cpu_slots, threads_per_cpu_slot
from torchscale.plan.kind_protocol import get_kind

if TYPE_CHECKING:
    from torchscale.plan.planned_cell import Cell

OMP_ENV = "OMP_NUM_THREADS"


def default_threads() -> int:
    """Torch's intra-op threads in this process: what a rank started with this environment and
    no ``OMP_NUM_THREADS`` of torchrun's gets. Imports torch: asked only where a line needs it."""
    import torch

    return int(torch.get_num_threads())


def slot_threads_env(device_kind: str) -> Dict[str, str]:
    """What a built-in kind's CPU ranks get: their slot's threads (unless the caller's
    environment for the launch already names a count)."""
    return {OMP_ENV: str(threads_per_cpu_slot())} if device_kind == "cpu" else {}


def cell_env(cell: Cell, env: Dict[str, str], device_kind: str) -> Dict[str, str]:
    """The launch environment of ``cell``: ``env``, plus the slot's threads for a built-in
    kind's CPU ranks; a kind that keeps its own threads gets ``env`` as it is (so torchrun, the
    user's environment or ``--threads`` decide, as without torchscale)."""
    if get_kind(cell.kind).own_threads:
        return dict(env)
    return {**slot_threads_env(device_kind), **env}


def torchrun_threads(nproc_per_node: int, torch_default: Callable[[], int]) -> int:
    """The intra-op threads plain ``torchrun --nproc_per_node N`` gives each process here
    (``torch_default()`` where torchrun sets none)."""
    given = os.environ.get(OMP_ENV, "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    return 1 if nproc_per_node > 1 else torch_default()


def own_threads_why(nproc_per_node: int) -> str:
    """Why a script's ranks run the thread count plain ``torchrun`` gives them."""
    given = os.environ.get(OMP_ENV, "")
    if given.isdigit() and int(given) > 0:
        return f"your environment's {OMP_ENV}={given}"
    if nproc_per_node > 1:
        return f"torchrun sets {OMP_ENV}=1 with {nproc_per_node} processes per node"
    return "torch's default on this node, with one process per node"


def script_threads_line(
    threads: Optional[int], nproc_per_node: int, torch_default: Callable[[], int]
) -> str:
    """What a script cell's ranks run with, and why (the console's start line)."""
    if threads is not None:
        return f"{threads} intra-op thread(s) per rank, as --threads (script.threads) sets"
    count = torchrun_threads(nproc_per_node, torch_default)
    why = own_threads_why(nproc_per_node)
    return (
        f"{count} intra-op thread(s) per rank, what plain torchrun gives your script ({why}); "
        "--threads N sets it"
    )


def threads_lines(
    cells: List[Cell], device_kind: str, torch_default: Callable[[], int] = default_threads
) -> List[str]:
    """The console's lines on threads, once per launch: what each CPU rank runs, and why. On
    GPUs nothing is set (the device does the work). ``torch_default`` is asked at most once, and
    only for a script cell whose count is torch's own."""
    torch_default = functools.cache(torch_default)
    if device_kind != "cpu" or not cells:
        return []
    lines: List[str] = []
    builtin = [c for c in cells if not get_kind(c.kind).own_threads]
    if builtin:
        cores, slots = os.cpu_count() or 1, cpu_slots()
        lines.append(
            f"Threads: each CPU process of a built-in model runs {threads_per_cpu_slot()} "
            f"intra-op thread(s) ({cores} core(s) over {slots} slot(s)), the same at every rank "
            f"count so that cells compare like with like ({CPU_SLOTS_ENV} changes the slots)"
        )
    seen: Dict[str, None] = {}
    for cell in cells:
        if not get_kind(cell.kind).own_threads:
            continue
        # Only a kind that runs the user's process has a thread setting of its own.
        threads: Optional[int] = getattr(cell.settings, "threads", None)
        nproc = cell.settings.nproc_per_node
        seen.setdefault(
            f"Threads, {nproc} process(es) per node: "
            + script_threads_line(threads, nproc, torch_default)
        )
    return [*lines, *seen]
