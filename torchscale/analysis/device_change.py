"""Cells that ``compare`` would match across a change of device or backend.

A cell id names a configuration, not the hardware: the same matrix run on CPU processes with gloo
and on H100s with NCCL gives cells of one id, and a change between them measures the hardware,
never the code. ``compare`` refuses such a match unless asked (``--allow-device-change``).
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from torchscale.analysis.training_tables import training_table
from torchscale.measures.table_scalars import as_int
from torchscale.results.schema import ResultBase, TrainingResult

Where = Tuple[str, str, str, int]  # device, backend, model, world size


def _devices(records: Sequence[ResultBase]) -> Dict[Tuple[str, int, int], Where]:
    """Each measured cell (``comparison.KEY``) -> where its first record ran."""
    table = training_table(records)
    if table.empty:
        return {}
    table = table[table["status"] == "ok"]
    by_id = {r.cell_id: r for r in records if isinstance(r, TrainingResult)}
    out: Dict[Tuple[str, int, int], Where] = {}
    for row in table.itertuples():
        record = by_id.get(str(row.cell_id))
        if record is None:
            continue
        key = (str(row.config_key), as_int(row.world_size), as_int(row.nnodes))
        out.setdefault(
            key,
            (str(record.device_name), str(record.backend), str(record.model), record.world_size),
        )
    return out


def device_changes(old: Sequence[ResultBase], new: Sequence[ResultBase]) -> List[str]:
    """One line per cell both runs measured on different devices or backends, e.g.
    ``resnet-tiny at 1 rank: cpu (gloo) in OLD, NVIDIA H100 (nccl) in NEW``."""
    before, after = _devices(old), _devices(new)
    lines = []
    for key in sorted(set(before) & set(after)):
        (old_device, old_backend, model, ranks), (new_device, new_backend, _, _) = (
            before[key],
            after[key],
        )
        if (old_device, old_backend) != (new_device, new_backend):
            lines.append(
                f"{model} at {ranks} rank{'s' if ranks != 1 else ''}: {old_device} "
                f"({old_backend}) in OLD, {new_device} ({new_backend}) in NEW"
            )
    return lines
