"""The validate records of an output folder, read back: what each host measured at level 2+.

``torchscale validate --level 2`` keeps ``<output-dir>/validate/host-<host>.json`` (its whole
report) and ``validate --fleet`` keeps ``validate/fleet.json`` (every node's report plus each
figure against the fleet). Straggler findings quote them (analysis/host_attribution.py); only
the fields they need are typed here, and a file that does not parse is skipped with a log line,
never an error: evidence is a bonus, not an input the command needs.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Dict, List, Optional

from pydantic import BaseModel, ConfigDict, ValidationError

from torchscale.results.files import read_limited
from torchscale.results.layout import FLEET_REPORT, VALIDATE_DIR, VALIDATE_RECORD_GLOB

log = logging.getLogger("torchscale")
MAX_RECORD_BYTES = 64 << 20


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ProbeFigure(_Loose):
    """One measured figure of a host's device, and how it compared."""

    probe: str
    label: str
    unit: str
    device: str
    value: float
    status: str = "PASS"
    vs_expected: Optional[float] = None
    vs_peers: Optional[float] = None
    vs_fleet: Optional[float] = None  # from a fleet report only
    expected: Optional[float] = None


class HostRecord(_Loose):
    """A host's validate report, as far as findings need it."""

    host: str
    time: str = ""
    level: int = 1
    probes: List[ProbeFigure] = []
    source: str = ""  # the file it came from


def _read(path: Path) -> Optional[object]:
    try:
        document: object = json.loads(read_limited(path, MAX_RECORD_BYTES, "validate record"))
        return document
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        log.info("%s is not a readable validate record (%s): left out", path, exc)
        return None
    except Exception as exc:  # a FIFO or a link refused by read_limited: one log line too
        log.info("%s is left out (%s)", path, exc)
        return None


SEVERITY = {"PASS": 0, "SKIP": 0, "WARN": 1, "FAIL": 2}


def _number(value: object) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _record(document: object, source: Path) -> Optional[HostRecord]:
    try:
        return HostRecord.model_validate({**document, "source": str(source)})  # type: ignore[dict-item]
    except (ValidationError, TypeError):
        return None


def load_host_records(output_dir: Path) -> Dict[str, HostRecord]:
    """Host name -> its newest level-2+ record in ``output_dir/validate`` (per-host files and a
    fleet report; for the same host the newer ``time`` wins, and a fleet report's figures carry
    ``vs_fleet``)."""
    folder = Path(output_dir) / VALIDATE_DIR
    if not folder.is_dir():
        return {}
    found: List[HostRecord] = []
    for path in sorted(folder.glob(VALIDATE_RECORD_GLOB)):
        record = _record(_read(path), path)
        if record is not None and record.probes:
            found.append(record)
    fleet = _read(folder / FLEET_REPORT) if (folder / FLEET_REPORT).is_file() else None
    if isinstance(fleet, dict):
        cells = {
            (c.get("host"), c.get("device"), c.get("probe")): c
            for c in fleet.get("cells", [])
            if isinstance(c, dict)
        }
        for report in fleet.get("reports", []):
            record = _record(report, folder / FLEET_REPORT) if isinstance(report, dict) else None
            if record is None or not record.probes:
                continue
            for figure in record.probes:
                cell = cells.get((record.host, figure.device, figure.probe)) or {}
                figure.vs_fleet = _number(cell.get("vs_fleet"))
                if SEVERITY.get(str(cell.get("status")), 0) > SEVERITY.get(figure.status, 0):
                    figure.status = str(cell["status"])  # an outlier of the fleet, fine alone
            found.append(record)
    newest: Dict[str, HostRecord] = {}
    for record in found:
        known = newest.get(record.host)
        if known is None or record.time >= known.time:
            newest[record.host] = record
    return newest
