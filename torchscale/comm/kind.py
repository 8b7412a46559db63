"""The communication cell kind: its config section (``torchscale.comm.config``), its plan
(``torchscale.comm.plan``), the worker it launches, its result.json -> result records, its console
view (``torchscale.comm.view``), its summary CSVs (``torchscale.comm.result_tables``) and its
report sections.

One ``collective`` record per scope x op x dtype x size (send/recv included, as op ``send_recv``
with its pair matrix) and one ``tp_gemm`` record per case. Bandwidths come from
``torchscale.comm.busbw``. A cell with any wrong element or any TP GEMM outside tolerance failed:
all its records get status ``failed`` and an error naming every op and size that went wrong (the
figures stay).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple, Type, Union

from torchscale.comm.busbw import SEND_RECV, algbw_gbps, busbw_factor, busbw_gbps
from torchscale.comm.config import ELEMENT_BYTES, SECTION, CommCellSettings, comm_section
from torchscale.comm.pairs import pair_matrix, pair_wrong, slowest_pair
from torchscale.comm.plan import comm_cell_id, comm_settings, count_comm
from torchscale.comm.view import comm_console_lines, describe_comm_cell
from torchscale.config.settings import BenchmarkConfig
from torchscale.hardware.device_noun import CUDA
from torchscale.hardware.links import link_peak_gbps, parse_link, peak_fraction
from torchscale.plan.kind_base import KindBase
from torchscale.plan.planned_cell import Cell, KindSettings
from torchscale.results.schema import (
    CellStatus,
    CollectiveResult,
    CommResultBase,
    ResultBase,
    TpGemmResult,
)

if TYPE_CHECKING:
    from pandas import DataFrame
    from rich.console import Console, RenderableType

    from torchscale.report.elements import Card, Section
    from torchscale.report.reported_kinds import RanIterations


def _sized(entry: Dict[str, Any]) -> Dict[str, Any]:
    """The fields that name one measurement of the sweep."""
    return {key: entry[key] for key in ("dtype", "size_bytes", "count", "requested_bytes")}


def _spread(values: List[float]) -> Dict[str, Any]:
    return {
        "time_us": sum(values) / len(values),
        "time_us_min": min(values),
        "time_us_max": max(values),
    }


def _average(values: Optional[List[float]]) -> Optional[float]:
    """The ranks' average of a figure measured on every rank; None when it was not measured."""
    return sum(values) / len(values) if values else None


def _tflops(flop: int, time_us: Optional[float]) -> Optional[float]:
    return flop / (time_us * 1e-6) / 1e12 if time_us else None


def _settings(cell: Cell) -> CommCellSettings:
    assert isinstance(cell.settings, CommCellSettings), cell.kind
    return cell.settings


class CommunicationKind(KindBase):
    name = "communication"
    config_section = SECTION
    settings_model = CommCellSettings
    worker_module = "torchscale.comm.worker"
    record_models: Tuple[Type[ResultBase], ...] = (CollectiveResult, TpGemmResult)
    selections: Tuple[str, ...] = ("all", "comm")
    joins_warm_groups = False  # each launch builds its scope groups and communicators

    def missing(self, config: BenchmarkConfig) -> Optional[str]:
        if comm_section(config) is not None:
            return None
        return "a communication: section in the config (see docs/communication.md)"

    def count(
        self, config: BenchmarkConfig, benchmark: str, gpus_per_node: Optional[int]
    ) -> Tuple[int, List[str]]:
        return count_comm(config, gpus_per_node)

    def plan(
        self, config: BenchmarkConfig, benchmark: str, gpus_per_node: Optional[int]
    ) -> Iterator[KindSettings]:
        yield from comm_settings(config, gpus_per_node)

    def cell_id(self, settings: KindSettings) -> str:
        assert isinstance(settings, CommCellSettings)
        return comm_cell_id(settings)

    def swept(self, config: BenchmarkConfig, benchmark: str) -> List[str]:
        return []  # one cell sweeps every op, dtype and size itself

    def describe(self, cell: Cell, device_kind: str = CUDA) -> str:
        return describe_comm_cell(_settings(cell), device_kind)

    def plan_row(self, cell: Cell, knobs: List[str]) -> List[str]:
        return [self.name, "-", str(cell.settings.gpus), "-", *["-"] * len(knobs)]

    def console_lines(self, records: List[ResultBase]) -> List[str]:
        """nccl-tests-style tables, then what went wrong with the cell, if anything."""
        return comm_console_lines(records) + super().console_lines(records)

    def console_tables(
        self, records: List[ResultBase], title: str, console: Console
    ) -> List[RenderableType]:
        """The collectives and TP GEMM summary of the whole run, fitted to ``console``."""
        from torchscale.comm.result_tables import collective_table, tp_gemm_table
        from torchscale.comm.view import comm_summary_table
        from torchscale.hardware.device_noun import records_device_kind

        collectives, tp_gemm = collective_table(records), tp_gemm_table(records)
        if collectives.empty and tp_gemm.empty:
            return []
        name, device_kind = f"{title}: communication", records_device_kind(records)
        return [comm_summary_table(collectives, tp_gemm, name, console, device_kind)]

    def summary_tables(self, records: List[ResultBase]) -> Dict[str, DataFrame]:
        from torchscale.comm.result_tables import comm_summary_tables

        return comm_summary_tables(records)

    def report_sections(self, records: List[ResultBase]) -> List[Optional[Section]]:
        """Bandwidth per collective, then the TP GEMM and the P2P heatmaps."""
        from torchscale.comm.report_sections import communication_section, parallelism_section
        from torchscale.comm.result_tables import collective_table

        return [communication_section(collective_table(records)), parallelism_section(records)]

    def report_cards(self, records: List[ResultBase]) -> List[Card]:
        """The peak bus bandwidth measured, for the report's first screen."""
        from torchscale.comm.report_sections import bandwidth_card
        from torchscale.comm.result_tables import collective_table

        card = bandwidth_card(collective_table(records))
        return [card] if card is not None else []

    def document_results(self, records: List[ResultBase]) -> Dict[str, object]:
        """distributed_benchmarks' ``results.communication`` (per collective, per size) and
        ``tp_gemm``."""
        from torchscale.comm.report_document import communication_entries, tp_gemm_entries
        from torchscale.comm.result_tables import collective_table, tp_gemm_table

        return {
            "communication": communication_entries(collective_table(records)),
            "tp_gemm": tp_gemm_entries(tp_gemm_table(records)),
        }

    def document_iterations(self, records: List[ResultBase]) -> Optional[RanIterations]:
        from torchscale.comm.report_document import comm_iterations

        return comm_iterations(records)

    @staticmethod
    def _run_fields(settings: CommCellSettings, result: Dict[str, Any]) -> Dict[str, Any]:
        return {
            "backend": result.get("backend"),
            "device_name": result.get("device_name"),
            "hosts": result.get("hosts", []),
            "warmup": settings.warmup,
            "iterations": settings.iterations,
            "status": "ok",
        }

    @staticmethod
    def _bandwidth(
        op: str, size: int, time_us: float, n: int, link: Optional[str]
    ) -> Dict[str, Any]:
        busbw = busbw_gbps(op, size, time_us * 1e-6, n)
        known = parse_link(link) if link else None
        return {
            "algbw_gbps": algbw_gbps(size, time_us * 1e-6),
            "busbw_gbps": busbw,
            "busbw_factor": busbw_factor(op, n),
            "link": link,
            "link_peak_gbps": link_peak_gbps(known) if known else None,
            "busbw_peak_fraction": peak_fraction(busbw, known),
        }

    def _collective(
        self, entry: Dict[str, Any], base: Dict[str, Any], link: Optional[str]
    ) -> CollectiveResult:
        # Ranks that sat a scope out have no figures (None); busbw is for the groups' size.
        took_part = [rank for rank, t in enumerate(entry["time_us"]) if t is not None]
        wrong = [entry["wrong"][rank] for rank in took_part]
        checked = all(w is not None for w in wrong)
        spread = _spread([entry["time_us"][rank] for rank in took_part])
        n = entry.get("group_size", len(entry["time_us"]))
        after = entry.get("after_compute_time_us") or [None] * len(entry["time_us"])
        after_us = [after[rank] for rank in took_part]
        ddp = entry.get("ddp_time_us") or [None] * len(entry["time_us"])
        ddp_us = [ddp[rank] for rank in took_part]
        return CollectiveResult(
            **base,
            **_sized(entry),
            op=entry["op"],
            scope=entry.get("scope", "world"),
            group_size=n,
            per_rank_time_us=entry["time_us"],
            **spread,
            **self._bandwidth(entry["op"], entry["size_bytes"], spread["time_us"], n, link),
            wrong=sum(wrong) if checked else None,
            wrong_per_rank=[w or 0 for w in entry["wrong"]] if checked else [],
            after_compute_time_us=_spread(after_us)["time_us"] if None not in after_us else None,
            ddp_time_us=_spread(ddp_us)["time_us"] if None not in ddp_us else None,
        )

    def _send_recv(
        self, entry: Dict[str, Any], n: int, base: Dict[str, Any], link: Optional[str]
    ) -> CollectiveResult:
        matrix = pair_matrix(entry["per_rank"], n)
        times = [t for row in matrix for t in row if t is not None]
        size = entry["size_bytes"]
        bandwidth = [
            [None if t is None else algbw_gbps(size, t * 1e-6) for t in row] for row in matrix
        ]
        wrong = pair_wrong(entry["per_rank"])
        spread = _spread(times)
        return CollectiveResult(
            **base,
            **_sized(entry),
            op=SEND_RECV,
            **spread,
            **self._bandwidth(SEND_RECV, size, spread["time_us"], n, link),
            wrong=sum(wrong.values()) if wrong else None,
            wrong_per_rank=[
                sum(w for (_, dst), w in wrong.items() if dst == rank) for rank in range(n)
            ]
            if wrong
            else [],
            pair_time_us=matrix,
            pair_busbw_gbps=bandwidth,
            slowest_pair=list(slowest_pair(matrix)),
        )

    @staticmethod
    def _tp_gemm(entry: Dict[str, Any], n: int, base: Dict[str, Any]) -> TpGemmResult:
        spread = _spread(entry["time_us"])
        time_us = spread["time_us"]
        comm_us = sum(entry["comm_time_us"]) / n
        reference_us = _average(entry.get("reference_time_us"))
        sharded_us = _average(entry.get("sharded_time_us"))
        flop = 2 * entry["m"] * entry["n"] * entry["k"]
        gathered = (entry["m"], entry["k"] if entry["order"] == "AG_before" else entry["n"])
        comm_bytes = gathered[0] * gathered[1] * ELEMENT_BYTES[entry["dtype"]]
        checked = "wrong" in entry
        return TpGemmResult(
            **base,
            m=entry["m"],
            n=entry["n"],
            k=entry["k"],
            dtype=entry["dtype"],
            order=entry["order"],
            per_rank_time_us=entry["time_us"],
            **spread,
            tflops=flop / (time_us * 1e-6) / 1e12 if time_us > 0 else None,
            comm_time_us=comm_us,
            gemm_time_us=sum(entry["gemm_time_us"]) / n,
            comm_share=comm_us / time_us if time_us > 0 else None,
            comm_bytes=comm_bytes,
            comm_busbw_gbps=busbw_gbps("all_gather", comm_bytes, comm_us * 1e-6, n),
            reference_time_us=reference_us,
            reference_tflops=_tflops(flop, reference_us),
            sharded_time_us=sharded_us,
            sharded_tflops=_tflops(flop // n, sharded_us),
            valid=sum(entry["wrong"]) == 0 if checked else None,
            wrong=sum(entry["wrong"]) if checked else None,
            max_abs_error=max(entry["max_abs_error"]) if checked else None,
            atol=entry.get("atol"),
            rtol=entry.get("rtol"),
        )

    def records(
        self, cell: Cell, identity: Dict[str, Any], result: Dict[str, Any]
    ) -> List[ResultBase]:
        settings = _settings(cell)
        n = settings.gpus
        base = {**identity, **self._run_fields(settings, result)}
        records: List[Union[CollectiveResult, TpGemmResult]] = [
            self._collective(entry, base, settings.link) for entry in result["collectives"]
        ]
        records += [self._send_recv(entry, n, base, settings.link) for entry in result["p2p"]]
        records += [self._tp_gemm(entry, n, base) for entry in result["tp_gemm"]]
        problems = [describe_wrong(r) for r in records if r.wrong]
        if problems:
            error = "wrong results: " + "; ".join(problems)
            for record in records:
                record.status, record.error = "failed", error
        return list(records)

    def failed(
        self, cell: Cell, identity: Dict[str, Any], status: CellStatus, error: str
    ) -> List[ResultBase]:
        """One record per op x dtype (and TP GEMM case), without figures."""
        settings = _settings(cell)
        base = {**identity, "status": status, "error": error}
        records: List[ResultBase] = [
            CollectiveResult(**base, op=op, dtype=dtype, scope=scope)
            for scope, op in [
                *((scope, op) for scope in settings.scopes for op in settings.collectives),
                *([("world", SEND_RECV)] if settings.p2p else []),
            ]
            for dtype in settings.dtypes
        ]
        records += [TpGemmResult(**base, **case.model_dump()) for case in settings.tp_gemm]
        return records


def describe_wrong(record: CommResultBase) -> str:
    """``all_gather float32 at 4096 B: 1 wrong element(s) on rank 3``."""
    if isinstance(record, TpGemmResult):
        what = f"tp_gemm {record.order} {record.m}x{record.n}x{record.k} {record.dtype}"
        return f"{what}: {record.wrong} element(s) outside tolerance"
    assert isinstance(record, CollectiveResult)
    ranks = [rank for rank, wrong in enumerate(record.wrong_per_rank) if wrong]
    where = f" on rank {', '.join(map(str, ranks))}" if ranks else ""
    what = f"{record.op} {record.dtype} at {record.size_bytes} B"
    if record.scope != "world":
        what += f" ({record.scope})"
    return f"{what}: {record.wrong} wrong element(s){where}"


KIND = CommunicationKind()
