"""Communication records -> pandas tables, and the summary CSVs written beside ``summary.csv``.

``summary_comm.csv``: one row per collective (and send_recv) x scope x dtype x size x world size
x configuration (``variant``: what a swept setting such as the backend made different).
``summary_tp_gemm.csv``: one row per TP GEMM case x order x world size x configuration.
"""

from __future__ import annotations

from typing import Dict, Iterable, List

import pandas as pd

from torchscale.analysis.scaling import configuration_variants
from torchscale.results.layout import SUMMARY_COMM, SUMMARY_TP_GEMM
from torchscale.results.schema import CollectiveResult, ResultBase, TpGemmResult

COMMON_COLUMNS = [
    "cell_id", "experiment", "variant", "world_size", "nnodes", "repeat", "status", "error",
]  # fmt: skip
COLLECTIVE_COLUMNS = [
    *COMMON_COLUMNS,
    "op", "scope", "group_size", "dtype", "size_bytes", "count", "time_us", "time_us_min",
    "time_us_max", "algbw_gbps", "busbw_gbps", "busbw_factor", "link", "link_peak_gbps",
    "busbw_peak_fraction", "wrong", "slowest_pair", "backend", "device_name",
]  # fmt: skip
TP_GEMM_COLUMNS = [
    *COMMON_COLUMNS,
    "order", "m", "n", "k", "dtype", "time_us", "time_us_min", "time_us_max", "tflops",
    "comm_time_us", "gemm_time_us", "comm_share", "comm_busbw_gbps", "reference_time_us",
    "reference_tflops", "sharded_time_us", "sharded_tflops", "valid", "wrong", "max_abs_error",
    "backend", "device_name",
]  # fmt: skip


def _rows(records: Iterable[ResultBase], model: type, columns: List[str]) -> pd.DataFrame:
    records = list(records)
    variants = configuration_variants(records)
    rows = []
    for record in records:
        if isinstance(record, model):
            values = record.model_dump(include=set(columns))
            values["variant"] = variants.get(record.cell_id, "")
            if values.get("slowest_pair"):
                values["slowest_pair"] = "->".join(map(str, values["slowest_pair"]))
            rows.append(values)
    return pd.DataFrame(rows, columns=columns)


def collective_table(records: Iterable[ResultBase]) -> pd.DataFrame:
    """One row per collective record, in the order measured: the one table of collectives (the
    console, summary_comm.csv, the report). Bandwidths and ``busbw_peak_fraction`` are as the
    record stores them (``torchscale.comm.busbw``, ``torchscale.hardware.links``)."""
    return _rows(records, CollectiveResult, COLLECTIVE_COLUMNS)


def tp_gemm_table(records: Iterable[ResultBase]) -> pd.DataFrame:
    return _rows(records, TpGemmResult, TP_GEMM_COLUMNS)


def peak_busbw(table: pd.DataFrame) -> pd.DataFrame:
    """Per op x scope x dtype x world size x configuration: the best busbw over sizes and the
    size it came at."""
    keys = ["op", "scope", "dtype", "world_size", "variant"]
    ok = table[(table["status"] == "ok") & table["busbw_gbps"].notna()]
    if ok.empty:
        return pd.DataFrame(columns=[*keys, "busbw_gbps", "size_bytes"])
    best = ok.loc[ok.groupby(keys)["busbw_gbps"].idxmax()]
    return best[[*keys, "busbw_gbps", "size_bytes"]].reset_index(drop=True)


def comm_summary_tables(records: List[ResultBase]) -> Dict[str, pd.DataFrame]:
    """The communication CSVs that have rows, by file name (the sweep rewrites them)."""
    tables = {SUMMARY_COMM: collective_table(records), SUMMARY_TP_GEMM: tp_gemm_table(records)}
    return {name: table for name, table in tables.items() if not table.empty}
