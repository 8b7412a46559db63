"""Where a straggler runs, and what validate measured there: "rank 5 is on node-3 GPU 5, whose
GEMM bf16 ran at 0.81 of its peers at level 2".

Who the straggler is stays measures/straggler.py's rule; this module only places a named rank
on its host and device (the records' per-rank ``host`` and ``local_rank``) and quotes the
host's validate record (results/host_records.py) when one exists: the figure of that device,
or of the whole node, furthest below its yardstick (its peers on the node, the fleet median,
the SKU's expected figure), as long as validate judged it WARN or FAIL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from torchscale.measures.straggler import record_straggler
from torchscale.results.host_records import HostRecord, ProbeFigure
from torchscale.results.schema import ResultBase, TrainingResult

YARDSTICKS = (
    ("vs_peers", "of its peers"),
    ("vs_fleet", "of the fleet median"),
    ("vs_expected", "of the figure expected for it"),
)
NODE_WIDE = ("node",)
STRAGGLER_CATEGORIES = ("straggler", "sync")
"""A finding of these categories that names one rank names the straggler."""
RANK_CATEGORIES = ("telemetry",)
"""Findings about one rank's device (a throttled GPU, a preempted CPU process): attributed when
that rank is its cell's straggler (measures/straggler.py's rule), as the straggler findings are."""


@dataclass(frozen=True)
class RankPlace:
    rank: int
    host: str
    local_rank: int
    gpu: bool

    @property
    def device(self) -> str:
        """The device as validate names it: ``GPU 5`` (CPU ranks share the host's CPUs)."""
        return f"GPU {self.local_rank}" if self.gpu else f"CPU {self.local_rank}"

    def describe(self) -> str:
        where = f"GPU {self.local_rank}" if self.gpu else f"CPU process {self.local_rank}"
        return f"rank {self.rank} is on {self.host} {where}"


def rank_place(record: ResultBase, rank: int) -> Optional[RankPlace]:
    """Where ``rank`` of a training record ran, when the record says."""
    if not isinstance(record, TrainingResult):
        return None
    gpu = not (record.backend == "gloo" or (record.device_name or "").lower() == "cpu")
    for row in record.per_rank:
        if row.rank == rank and row.host:
            return RankPlace(rank, row.host, row.local_rank, gpu)
    return None


def _concerns(figure: ProbeFigure, place: RankPlace) -> bool:
    """A figure of the rank's own device, of a P2P copy from it, or of the whole node; on CPU
    every figure of the host (CPU ranks share its cores)."""
    if figure.device in NODE_WIDE or not place.gpu:
        return True
    return figure.device == place.device or figure.device.startswith(f"{place.device}->")


def explaining_probe(
    place: RankPlace, record: HostRecord
) -> Optional[Tuple[ProbeFigure, str, float]]:
    """The host's figure, among those that concern the rank, furthest below its peers or the
    fleet (what makes one rank later than the others), else below its expected figure; with
    that yardstick's words and the ratio. None when validate judged none WARN or FAIL."""
    concerned = [f for f in record.probes if f.status != "PASS" and _concerns(f, place)]
    for yardsticks in (YARDSTICKS[:2], YARDSTICKS[2:]):
        best: Optional[Tuple[ProbeFigure, str, float]] = None
        for figure in concerned:
            for field, words in yardsticks:
                ratio = getattr(figure, field)
                if ratio is not None and ratio < 1 and (best is None or ratio < best[2]):
                    best = (figure, words, ratio)
        if best is not None:
            return best
    return None


def health_quote(place: RankPlace, record: HostRecord) -> str:
    found = explaining_probe(place, record)
    if found is None:
        return f"validate at level {record.level} found nothing slow there ({record.source})"
    figure, words, ratio = found
    device = "" if figure.device in NODE_WIDE else f" on {figure.device}"
    return (
        f"whose {figure.label}{device} ran at {ratio:.2f} {words} at level {record.level} "
        f"({figure.status} in {record.source})"
    )


def attribution(
    rank: int, records: Iterable[ResultBase], hosts: Mapping[str, HostRecord]
) -> Optional[str]:
    """``rank 5 is on node-3 GPU 5, whose ...`` for the first record that places the rank."""
    for record in records:
        place = rank_place(record, rank)
        if place is None:
            continue
        known = hosts.get(place.host)
        return place.describe() + (f", {health_quote(place, known)}" if known else "")
    return None


def sentence(where: str) -> str:
    """``rank 5 is on ...`` as a sentence of its own: ``Rank 5 is on ... .``"""
    return f"{where[0].upper()}{where[1:]}."


def straggler_quote(record: ResultBase, hosts: Mapping[str, HostRecord]) -> Optional[str]:
    """The sentence the worker's straggler warning ends with on the console, where a validate
    record of the straggler's host exists: ``Rank 5 is on node-b GPU 1, whose GEMM bf16 ...``.
    None otherwise (the warning names the host and GPU already)."""
    if not isinstance(record, TrainingResult):
        return None
    rank = record_straggler(record)
    place = rank_place(record, rank) if rank is not None else None
    if place is None or place.host not in hosts:
        return None
    return sentence(f"{place.describe()}, {health_quote(place, hosts[place.host])}")


def _about_straggler(row: Dict[str, Any], cell: Optional[ResultBase]) -> bool:
    """The finding names one rank, and that rank is the straggler: by its category, or, for a
    finding about a rank's device, because its cell's straggler is that rank."""
    ranks = row.get("ranks") or []
    if len(ranks) != 1:
        return False
    category = row.get("category")
    if category in STRAGGLER_CATEGORIES:
        return True
    straggler = record_straggler(cell) if isinstance(cell, TrainingResult) else None
    return category in RANK_CATEGORIES and straggler == int(ranks[0])


def attribute_findings(
    rows: List[Dict[str, Any]],
    records: Iterable[ResultBase],
    hosts: Mapping[str, HostRecord],
    field: str = "message",
) -> List[Dict[str, Any]]:
    """Findings (report rows, or ``findings.json`` entries with ``field="title"``) that name one
    straggler rank gain where that rank ran and what validate measured there. The cell the
    finding names (``source``) is looked in first."""
    records = list(records)
    out = []
    for row in rows:
        source = str(row.get("source") or "")
        cell = next((r for r in records if r.cell_id and r.cell_id in source), None)
        if not _about_straggler(row, cell):
            out.append(row)
            continue
        ordered = sorted(records, key=lambda r: not (r.cell_id and r.cell_id in source))
        where = attribution(int(row["ranks"][0]), ordered, hosts)
        if where is None:
            out.append(row)
            continue
        text = str(row.get(field) or "")
        joined = f"{text}; {where}" if field == "title" else f"{text} {sentence(where)}"
        out.append({**row, field: joined.strip(), "where": where})
    return out
