"""What a communication cell shows on stderr: nccl-tests-style tables, the P2P matrix, a summary.

Text and tables are built here and printed by the CLI; nothing is computed here.
"""

from __future__ import annotations

import math
from itertools import groupby
from typing import Any, Dict, List, Optional

from rich.console import Console
from rich.table import Table

from torchscale.comm.config import CommCellSettings
from torchscale.config.sizes import format_size
from torchscale.hardware.device_noun import CUDA, count_header, count_text
from torchscale.measures.table_scalars import as_int
from torchscale.results.layout import SUMMARY_COMM
from torchscale.results.schema import CollectiveResult, ResultBase, TpGemmResult

REDOP = {"all_reduce": "sum", "reduce_scatter": "sum"}
SCOPE_TITLES = {
    "world": "{n} ranks",
    "intra_node": "{n} ranks within each node (all nodes at once)",
    "inter_node": "{n} ranks, one per node (the network alone)",
}
HEADER = (
    f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  "
    f"{'time':>8}  {'algbw':>7}  {'busbw':>7}  {'#wrong':>6}  {'min':>8}  {'max':>8}"
)
UNITS = (
    f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  "
    f"{'(us)':>8}  {'(GB/s)':>7}  {'(GB/s)':>7}  {'':>6}  {'(us)':>8}  {'(us)':>8}"
)


def _num(value: Optional[float], spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def describe_comm_cell(settings: CommCellSettings, device_kind: str = CUDA) -> str:
    """``communication on 4 GPUs (all_reduce, send_recv, tp_gemm x2; 8 B .. 64M, float32)``;
    ``on 4 GPUs x 2 nodes (...; world, inter_node)`` across nodes; ``on 2 CPU processes`` on a
    node without GPUs."""
    parts = list(settings.collectives) + (["send_recv"] if settings.p2p else [])
    if settings.tp_gemm:
        parts.append(f"tp_gemm x{len(settings.tp_gemm)}")
    sizes = f"{format_size(settings.sizes[0])} .. {format_size(settings.sizes[-1])}"
    ranks = count_text(settings.gpus, device_kind)
    nodes = f" x {settings.nnodes} nodes" if settings.nnodes > 1 else ""
    scopes = f"; {', '.join(settings.scopes)}" if settings.scopes != ["world"] else ""
    backend = f"; backend {settings.backend}" if settings.backend != "auto" else ""
    return (
        f"communication on {ranks}{nodes} ({', '.join(parts)}; {sizes} B, "
        f"{', '.join(settings.dtypes)}{scopes}{backend})"
    )


def _what(name: str, row: Any) -> str:
    """The summary's first column: the op or case, then the configuration when a sweep made
    several (``all_reduce · backend=gloo``: ``analysis.scaling.configuration_variants``)."""
    variant = getattr(row, "variant", "")
    return f"{name} · {variant}" if isinstance(variant, str) and variant else name


def collective_row(record: CollectiveResult) -> str:
    wrong = "N/A" if record.wrong is None else str(record.wrong)
    root = "0" if record.op == "broadcast" else "-1"
    return (
        f"  {record.size_bytes:>10}  {record.count:>12}  {record.dtype:>8}  "
        f"{REDOP.get(record.op, 'none'):>6}  {root:>6}  {_num(record.time_us, '8.1f')}  "
        f"{_num(record.algbw_gbps, '7.2f')}  {_num(record.busbw_gbps, '7.2f')}  {wrong:>6}  "
        f"{_num(record.time_us_min, '8.1f')}  {_num(record.time_us_max, '8.1f')}"
    )


def pair_matrix_lines(record: CollectiveResult) -> List[str]:
    """The [src][dst] send/recv bandwidth of one size, slowest pair named."""
    matrix = record.pair_busbw_gbps or []
    lines = [f"# send_recv GB/s at {record.size_bytes} B, row = sender, column = receiver"]
    lines.append("# " + " " * 6 + "".join(f"{dst:>9}" for dst in range(len(matrix))))
    for src, row in enumerate(matrix):
        cells = "".join(f"{'-':>9}" if value is None else f"{value:9.2f}" for value in row)
        lines.append(f"# {src:>6}{cells}")
    if record.slowest_pair:
        src, dst = record.slowest_pair
        lines.append(f"# slowest pair: {src} -> {dst}")
    return lines


def comm_console_lines(records: List[ResultBase]) -> List[str]:
    """nccl-tests-like tables of one cell's records, one block per scope x op x dtype."""
    collectives = [
        r for r in records if isinstance(r, CollectiveResult) and r.size_bytes is not None
    ]
    lines: List[str] = []
    for (scope, op, dtype), group in groupby(collectives, key=lambda r: (r.scope, r.op, r.dtype)):
        rows = list(group)
        first = rows[0]
        peak = f", link {first.link} peak {first.link_peak_gbps:g} GB/s" if first.link else ""
        ranks = SCOPE_TITLES[scope].format(n=first.group_size or first.world_size)
        lines += [
            f"# {op} {dtype} on {ranks} ({first.backend}{peak}); time is the "
            "average over ranks, min/max the fastest and slowest rank",
            HEADER,
            UNITS,
        ]
        lines += [collective_row(record) for record in rows]
        if op == "send_recv":
            lines += pair_matrix_lines(rows[-1])
    for record in records:
        if isinstance(record, TpGemmResult) and record.time_us is not None:
            lines.append(
                f"# tp_gemm {record.order:<9} m={record.m} n={record.n} k={record.k} "
                f"{record.dtype}: {record.time_us:,.1f} us, {_num(record.tflops, '.3f')} TFLOP/s, "
                f"comm {_num(record.comm_share, '.0%')}, reference "
                f"{_num(record.reference_time_us, ',.1f')} us{_sharded(record)}, "
                f"valid {record.valid}"
            )
    return lines


def _sharded(record: TpGemmResult) -> str:
    """``, sharded 812.0 us`` when the compute-only sharded GEMM was timed."""
    if record.sharded_time_us is None:
        return ""
    return f", sharded {record.sharded_time_us:,.1f} us"


SUMMARY_COLUMNS = ("what", "ranks", "scope", "dtype", "status", "figure", "at")


def comm_summary_rows(collectives: Any, tp_gemm: Any) -> List[Dict[str, str]]:
    """The end-of-run summary, one row per line: best busbw per op, the ops that failed, and
    every TP GEMM case (laid out by :func:`comm_summary_table`)."""
    from torchscale.comm.result_tables import peak_busbw

    rows: List[Dict[str, str]] = []

    def add(*values: str) -> None:
        rows.append(dict(zip(SUMMARY_COLUMNS, values)))

    for row in peak_busbw(collectives).itertuples():
        add(
            _what(str(row.op), row),
            str(row.world_size),
            str(row.scope),
            str(row.dtype),
            "ok",
            f"{row.busbw_gbps:,.2f} GB/s busbw",
            f"{format_size(as_int(row.size_bytes))} B",
        )
    failed = collectives[collectives["status"] != "ok"].drop_duplicates(
        ["op", "scope", "dtype", "cell_id"]
    )
    for row in failed.itertuples():
        what = _what(str(row.op), row)
        add(what, str(row.world_size), str(row.scope), str(row.dtype), str(row.status))
    for row in tp_gemm.itertuples():
        ok = row.status == "ok"
        add(
            _what(f"tp_gemm {row.order} {row.m}x{row.n}x{row.k}", row),
            str(row.world_size),
            "world",
            str(row.dtype),
            str(row.status),
            f"{_num(row.tflops, ',.3f')} TFLOP/s" if ok else "-",
            f"comm {_num(row.comm_share, '.0%')}" if ok else "-",
        )
    return [{key: row.get(key, "-") for key in SUMMARY_COLUMNS} for row in rows]


def comm_summary_table(
    collectives: Any, tp_gemm: Any, title: str, console: Console, device_kind: str = CUDA
) -> Table:
    """The communication summary (:func:`comm_summary_rows`), fitted to the console."""
    from torchscale.console_tables import Col, fitted_table

    rows = comm_summary_rows(collectives, tp_gemm)
    ranks = count_header(device_kind)

    def values(key: str) -> List[str]:
        return [row[key] for row in rows]

    cols = [
        Col("what", values("what"), numeric=False, wrap=True),
        Col(ranks, values("ranks"), same=lambda v: count_text(int(v), device_kind)),
        Col("scope", values("scope"), numeric=False, same="scope {}"),
        Col("dtype", values("dtype"), numeric=False, same="{}"),
        Col("status", values("status"), numeric=False, same="all {}"),
        Col("figure", values("figure")),
        Col("at", values("at")),
    ]
    return fitted_table(console, title, cols, left_out=f"see {SUMMARY_COMM} or --json")
