"""Where an iteration goes, and the communication cells as matrices: data -> DataFrames.

* communication vs computation per iteration, per rank and cell, from DDP's own logging data
  (forward and backward compute, backward communication and its overlap with compute);
* the step-time histogram of each configuration (the Distributed Training Profiler's
  ``latency_histogram``);
* the tensor-parallel GEMM cases side by side: AG_before, AG_after and the compute-only reference
  (as DDLB shows them);
* point-to-point bandwidth as a source x destination matrix.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np
import pandas as pd

from torchscale.analysis.scaling import configuration_variants
from torchscale.measures.table_scalars import as_int
from torchscale.results.schema import CollectiveResult, ResultBase, TpGemmResult, TrainingResult

BREAKDOWN_COLUMNS = [
    "cell_id", "experiment", "model", "variant", "batch_size", "world_size", "rank", "step_ms",
    "compute_ms", "forward_compute_ms", "backward_compute_ms", "comm_ms", "overlap_ms",
    "exposed_comm_ms", "comm_compute_ratio", "exposed_share",
]  # fmt: skip
HISTOGRAM_BINS = 20


def comm_compute_table(
    records: Iterable[ResultBase], variants: Optional[Mapping[str, str]] = None
) -> pd.DataFrame:
    """Per rank of every measured cell: DDP's compute, communication and overlap per iteration;
    ``variants``: each cell's configuration label by cell id (the training table's ``variant``).

    ``exposed_comm_ms = comm - overlap`` is the communication compute did not hide;
    ``comm_compute_ratio = comm / compute``; ``exposed_share`` is the exposed part of the rank's
    step time. One rank has no communication (the glossary's none): what DDP's logging times
    there is its own bookkeeping, so a 1-rank cell's communication figures are left empty."""
    rows = []
    for record in records:
        if not isinstance(record, TrainingResult) or record.status != "ok":
            continue
        for rank in record.per_rank:
            forward, backward = rank.ddp_forward_compute_ms, rank.ddp_backward_compute_ms
            comm = rank.ddp_backward_comm_ms
            if forward is None or backward is None or comm is None:
                continue
            overlap = min(rank.ddp_backward_overlap_ms or 0.0, comm)
            compute = forward + backward
            step = rank.step_time_ms.mean
            if record.world_size == 1:
                rows.append(
                    {
                        "cell_id": record.cell_id, "experiment": record.experiment,
                        "model": record.model, "variant": (variants or {}).get(record.cell_id, ""),
                        "batch_size": record.batch_size, "world_size": 1, "rank": rank.rank,
                        "step_ms": step, "compute_ms": compute, "forward_compute_ms": forward,
                        "backward_compute_ms": backward,
                    }
                )  # fmt: skip
                continue
            rows.append(
                {
                    "cell_id": record.cell_id, "experiment": record.experiment,
                    "model": record.model, "variant": (variants or {}).get(record.cell_id, ""),
                    "batch_size": record.batch_size,
                    "world_size": record.world_size, "rank": rank.rank, "step_ms": step,
                    "compute_ms": compute, "forward_compute_ms": forward,
                    "backward_compute_ms": backward, "comm_ms": comm, "overlap_ms": overlap,
                    "exposed_comm_ms": comm - overlap,
                    "comm_compute_ratio": comm / compute if compute > 0 else None,
                    "exposed_share": (comm - overlap) / step if step > 0 else None,
                }
            )  # fmt: skip
    return pd.DataFrame(rows, columns=BREAKDOWN_COLUMNS)


def cell_comm_compute(record: TrainingResult) -> Tuple[Optional[float], Optional[float]]:
    """A cell's communication time per step (DDP's gradient communication, mean over ranks, ms)
    and its comm/compute ratio (all ranks' communication over their compute): the Distributed
    Training Profiler's ``communication_time_per_step`` and communication vs computation ratio."""
    table = comm_compute_table([record])
    if table.empty:
        return None, None
    compute = float(table["compute_ms"].sum())
    ratio = float(table["comm_ms"].sum()) / compute if compute > 0 else None
    return float(table["comm_ms"].mean()), ratio


def comm_compute_line(record: TrainingResult) -> Optional[str]:
    """One console line: each rank's compute / communication (overlapped) per iteration."""
    table = comm_compute_table([record])
    if table.empty:
        return None
    parts = [
        f"rank {as_int(r.rank)} {r.compute_ms:.1f} / {r.comm_ms:.1f} ({r.overlap_ms:.1f})"
        for r in table.itertuples()
    ]
    ratio = table["comm_ms"].sum() / table["compute_ms"].sum()
    return (
        f"> [INFO] Comm vs compute per iteration (DDP, ms: compute / comm (overlapped)): "
        f"{', '.join(parts)}; comm = {ratio:.0%} of compute"
    )


def step_histogram(table: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """Per configuration (model, variant) and GPU count: counts of steps in shared bins (ms).

    ``table`` is the labelled training table, ``samples`` ``cells.step_samples``."""
    keys = ["experiment", "model", "variant"]
    joined = samples.merge(table[["cell_id", *keys, "world_size"]], on="cell_id")
    rows = []
    for key, group in joined.groupby(keys, sort=True, observed=True):
        values = group["step_ms"].to_numpy(dtype=float)
        if len(values) == 0:
            continue
        low, high = float(values.min()), float(values.max())
        edges = np.linspace(low, high if high > low else low + 1e-3, HISTOGRAM_BINS + 1)
        for world, rows_at in group.groupby("world_size", sort=True):
            counts, _ = np.histogram(rows_at["step_ms"].to_numpy(dtype=float), bins=edges)
            for index, count in enumerate(counts):
                rows.append(
                    {**dict(zip(keys, key)), "world_size": as_int(world),
                     "bin_low_ms": edges[index], "bin_high_ms": edges[index + 1],
                     "bin_mid_ms": (edges[index] + edges[index + 1]) / 2, "steps": int(count)}
                )  # fmt: skip
    columns = [*keys, "world_size", "bin_low_ms", "bin_high_ms", "bin_mid_ms", "steps"]
    return pd.DataFrame(rows, columns=columns)


def tp_gemm_cases(records: Iterable[ResultBase]) -> pd.DataFrame:
    """One row per TP GEMM case, world size and configuration (``variant``: a backend sweep's
    cells are rows of their own): AG_before, AG_after and compute-only times (the unsharded GEMM
    on one device, and each rank's shard of it alone where measured, ``sharded_us`` and
    ``sharded_tflops``: each order's record times them, their mean)."""
    records = list(records)
    variants = configuration_variants(records)
    rows: Dict[Tuple[object, ...], Dict[str, object]] = {}
    references: Dict[Tuple[object, ...], List[float]] = {}
    for record in records:
        if not isinstance(record, TpGemmResult) or record.status != "ok":
            continue
        variant = variants.get(record.cell_id, "")
        key = (record.experiment, record.world_size, variant, record.m, record.n, record.k,
               record.dtype)  # fmt: skip
        row = rows.setdefault(
            key,
            {"experiment": record.experiment, "world_size": record.world_size,
             "variant": variant, "backend": record.backend, "m": record.m, "n": record.n,
             "k": record.k, "dtype": record.dtype, "case": f"{record.m}×{record.n}×{record.k}",
             "AG_before_us": None, "AG_after_us": None, "compute_only_us": None,
             "sharded_us": None, "sharded_tflops": None,
             "AG_before_tflops": None, "AG_after_tflops": None},
        )  # fmt: skip
        row[f"{record.order}_us"] = record.time_us
        row[f"{record.order}_tflops"] = record.tflops
        for column, value in (("compute_only_us", record.reference_time_us),
                              ("sharded_us", record.sharded_time_us),
                              ("sharded_tflops", record.sharded_tflops)):  # fmt: skip
            if value is not None:
                references.setdefault((*key, column), []).append(value)
    for case, row in rows.items():  # each order times the compute-only GEMMs too: their mean
        for column in ("compute_only_us", "sharded_us", "sharded_tflops"):
            found = references.get((*case, column), [])
            row[column] = sum(found) / len(found) if found else None
    table = pd.DataFrame(list(rows.values()))
    if table.empty:
        return table
    return table.sort_values(["experiment", "world_size", "variant", "m", "n", "k", "dtype"])


def p2p_matrices(records: Iterable[ResultBase]) -> List[pd.DataFrame]:
    """Per send/recv record at its largest message size (per world size, dtype and
    configuration): the src x dst busbw matrix (GB/s), with ``attrs`` naming the world size,
    size, configuration and slowest pair."""
    records = list(records)
    variants = configuration_variants(records)
    largest: Dict[Tuple[int, str, str], CollectiveResult] = {}
    for record in records:
        if (
            isinstance(record, CollectiveResult)
            and record.op == "send_recv"
            and record.status == "ok"
            and record.pair_busbw_gbps
        ):
            key = (record.world_size, record.dtype, variants.get(record.cell_id, ""))
            if key not in largest or (record.size_bytes or 0) > (largest[key].size_bytes or 0):
                largest[key] = record
    matrices = []
    for (world, dtype, variant), record in sorted(largest.items()):
        pairs = record.pair_busbw_gbps or []  # set: only such records are kept above
        matrix = pd.DataFrame(
            pairs,
            index=[f"rank {i}" for i in range(len(pairs))],
            columns=[f"rank {j}" for j in range(len(pairs))],
        )
        matrix.attrs = {"world_size": world, "dtype": dtype, "size_bytes": record.size_bytes,
                        "slowest_pair": record.slowest_pair, "cell_id": record.cell_id,
                        "variant": variant}  # fmt: skip
        matrices.append(matrix)
    return matrices
