"""The communication kind's part of the JSON document in distributed_benchmarks' format
(``report.document``): ``results.communication`` keyed as distributed_benchmarks keys it,
``results.tp_gemm``, and what its cells ran (``config.iterations``). Reached only through the kind
(``ReportedKind``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional

from torchscale.measures.table_scalars import frame_records
from torchscale.report.document import CollectiveEntry, TpGemmEntry, document_entries
from torchscale.report.reported_kinds import RanIterations
from torchscale.results.schema import CommResultBase, ResultBase

if TYPE_CHECKING:
    import pandas as pd

OP_KEYS = {
    "all_reduce": "allreduce",
    "all_gather": "allgather",
    "reduce_scatter": "reducescatter",
    "broadcast": "broadcast",
    "all_to_all": "alltoall",
    "send_recv": "p2p",
}
"""torchscale's collective names -> the seed's keys (``allreduce``, ``allgather``...)."""


def communication_entries(table: pd.DataFrame) -> Dict[str, List[CollectiveEntry]]:
    """``results.communication`` from the collectives table (``comm.result_tables``)."""
    found: Dict[str, List[CollectiveEntry]] = {}
    for row, entry in zip(frame_records(table), document_entries(table, CollectiveEntry)):
        found.setdefault(OP_KEYS.get(row["op"], row["op"]), []).append(entry)
    return found


def tp_gemm_entries(table: pd.DataFrame) -> List[TpGemmEntry]:
    """``results.tp_gemm`` from the TP GEMM table: every figure of the case and order, the
    compute-only sharded time and rate included (``tp_gemm.compute_only: [.., sharded]``)."""
    entries: List[TpGemmEntry] = document_entries(table, TpGemmEntry)
    return entries


def comm_iterations(records: List[ResultBase]) -> Optional[RanIterations]:
    """The untimed (``warmup``) and timed (``iterations``) ops per size the measured
    communication cells ran."""
    ran = [r for r in records if isinstance(r, CommResultBase) and r.status == "ok"]
    if not ran:
        return None
    return RanIterations.of((r.warmup for r in ran), (r.iterations for r in ran))
