"""Load what a report shows from a results folder: records, manifests and profiling findings.

Reading is tolerant: a record that does not validate is kept as what identifies it, marked
``invalid``, and a kind this version does not know is read as the fields every record has
(``ResultBase``); never a crash. Records are checked as they are read
(``torchscale.results.validity``): impossible figures make a record ``invalid``; input whose
every record is invalid is an error (exit 2), not an empty report. What the report gets is typed
records only, never the raw objects.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List

from torchscale.errors import TorchscaleError
from torchscale.results.json_input import read_json
from torchscale.results.layout import FINDINGS_FILE, RESULTS
from torchscale.results.schema import ResultBase
from torchscale.results.store import ExperimentStore, find_experiments, read_jsonl
from torchscale.results.validity import INVALID, check_and_parse, latest_runs

log = logging.getLogger("torchscale")
TITLE_NAMES = 4
"""A report of several experiments names up to this many in its title."""


@dataclass
class Experiment:
    name: str
    path: Path
    manifest: Dict[str, Any]
    records: List[ResultBase] = field(default_factory=list)
    findings: List[Dict[str, Any]] = field(default_factory=list)  # from findings.json files


@dataclass
class ReportData:
    source: Path
    experiments: List[Experiment]

    @property
    def title(self) -> str:
        """The experiment's name, or every name (up to ``TITLE_NAMES``) for several."""
        names = list(dict.fromkeys(e.name for e in self.experiments))
        if len(names) == 1:
            return names[0]
        if len(names) > TITLE_NAMES:
            return ", ".join(names[: TITLE_NAMES - 1]) + f" and {len(names) - TITLE_NAMES + 1} more"
        return ", ".join(names[:-1]) + " and " + names[-1]

    @property
    def records(self) -> List[ResultBase]:
        return [r for e in self.experiments for r in e.records]


def read_findings(root: Path) -> List[Dict[str, Any]]:
    """Every finding in the ``findings.json`` files under ``root``, tagged with its file."""
    found = []
    for path in sorted(root.rglob(FINDINGS_FILE)):
        try:
            document = read_json(path, "findings file")
        except (OSError, ValueError, TorchscaleError) as exc:
            log.warning("%s is unreadable (%s); its findings are left out", path, exc)
            continue
        items = document.get("findings", []) if isinstance(document, dict) else document
        if not isinstance(items, list):
            log.warning("%s is damaged (its findings are not a list); left out", path)
            continue
        source = str(path.parent.relative_to(root)) if path.parent != root else "profile"
        found += [{**item, "_source": source} for item in items or [] if isinstance(item, dict)]
    return found


def load_experiment(path: Path) -> Experiment:
    store = ExperimentStore(path)
    try:
        manifest = store.manifest()
    except (OSError, ValueError, TorchscaleError) as exc:
        log.warning("%s; the environment is left out", exc)
        manifest = {}
    _, records = check_and_parse(read_jsonl(store.results_path), store.results_path)
    records = latest_runs(records, store.results_path)
    name = manifest.get("experiment") or next(
        (r.experiment for r in records if r.experiment), path.name
    )
    return Experiment(
        name=str(name),
        path=path,
        manifest=manifest,
        records=records,
        findings=read_findings(path),
    )


def load_report_data(source: Path, what: str = "--source") -> ReportData:
    """All experiments under ``source``; a clear error when there is nothing to report.

    ``what`` names the argument in error messages (``--source``, ``--baseline``, ``OLD``...).
    """
    source = Path(source)
    if not source.exists():
        raise TorchscaleError(f"{what} {source} does not exist; point it at a results folder")
    found = [load_experiment(path) for path in find_experiments(source)]
    experiments = [e for e in found if e.records]
    for e in experiments:
        log.debug(
            "%s: experiment %r, %d records, %d profile findings",
            e.path, e.name, len(e.records), len(e.findings),
        )  # fmt: skip
    if found and not experiments:
        names = ", ".join(str(e.path / RESULTS) for e in found[:3])
        raise TorchscaleError(
            f"no records under {source}: {names} hold(s) no readable record (empty, missing, or "
            "every line damaged); run 'torchscale benchmark' into it, or point at another folder"
        )
    if not experiments:
        raise TorchscaleError(
            f"no results under {source}: expected <experiment>/{RESULTS} as written by "
            "'torchscale benchmark --output-dir'"
        )
    records = [r for e in experiments for r in e.records]
    if all(r.status == INVALID for r in records):
        first = str(records[0].error or "")[:200]
        raise TorchscaleError(
            f"every record under {source} is invalid ({len(records)} record(s); first: "
            f"{first}); nothing can be reported or compared"
        )
    return ReportData(source=source, experiments=experiments)
