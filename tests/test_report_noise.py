"""The report of a CPU run with a noisy, busy 2-rank cell, in HTML and PDF: a part of the lost
efficiency below zero is noise (no bar under the axis, the noise band drawn), one rank has no
communication figure, findings speak one severity vocabulary, and a loss the busy host explains
gets no tuning advice.

The records are the shared real run's (gpt2-tiny on 1 and 2 gloo processes), copied and made
noisy and busy the way such a host makes them: the 2-rank cell's steps spread (CV 0.3), its input
wait below the 1-rank cell's (a part that seems to give efficiency back), its efficiency low, and
its ranks waiting for a CPU 40% of the window while other processes held the cores.
"""

from __future__ import annotations

import json
import re
import shutil
from typing import Any, Dict, List, Tuple

import pytest

from tests.support.html_tables import html_tables
from tests.support.pdf_pages import needs_poppler, pages_text
from tests.support.shared_runs import Run
from torchscale.analysis.finding import SHOWN_SEVERITIES
from torchscale.analysis.findings import SYNC_BOUND_ADVICE
from torchscale.analysis.noise import BAND, DEFAULT_FACTOR
from torchscale.report import formatting as fmt
from torchscale.results.layout import RESULTS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timed,  # real runs' noise and the verdicts on it
]

NOISY_CV = 0.3
WAIT_SHARE = 0.4
SEVERITY_WORDS = re.compile(r"\b(CRITICAL|ERROR|HIGH|WARNING|WARN|MEDIUM|LOW|INFO)\b")


def _noisy_busy(line: Dict[str, Any], base_data_ms: float) -> Dict[str, Any]:
    """The 2-rank record, noisy and busy (module docstring)."""
    steps = line["step_time_ms"]
    steps["std"] = NOISY_CV * steps["mean"]
    steps["cv"] = NOISY_CV
    for figure in ("throughput", "samples_per_s"):  # efficiency well below the good band
        line[figure] = 0.6 * line[figure]
    for rank in line["per_rank"]:
        rank["data_ms"] = 0.0  # below the 1-rank cell's: the input "gave efficiency back"
        window = rank["window_s"]
        rank["cpu_wait_s"] = WAIT_SHARE * window
        rank["process_cpu_s"] = 0.5 * window
        rank["host_busy_cpu_s"] = 2.0 * window  # others kept 1.5 cores busy meanwhile
        rank["host_cpus"] = 2
    assert base_data_ms > 0
    return line


@pytest.fixture(scope="module")
def noisy(healthy_run: Run, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    run = healthy_run
    root = tmp_path_factory.mktemp("noisy-report")
    folder = root / "results" / run.experiment_dir.name
    shutil.copytree(run.experiment_dir, folder)
    lines = [json.loads(x) for x in (folder / RESULTS).read_text().splitlines() if x.strip()]
    (one,) = [x for x in lines if x["world_size"] == 1]
    for rank in one["per_rank"]:
        rank["data_ms"] = 0.2 * rank["step_time_ms"]["mean"]
    base_data = one["per_rank"][0]["data_ms"]
    lines = [_noisy_busy(x, base_data) if x["world_size"] == 2 else x for x in lines]
    (folder / RESULTS).write_text("".join(json.dumps(x) + "\n" for x in lines))
    from torchscale.app.report import ReportRequest, generate_report

    out = {}
    for kind in ("html", "pdf"):
        out[kind] = generate_report(ReportRequest(folder, kind, root / f"report.{kind}"))
    return {"folder": folder, "lines": lines, **out}


def _figures(html: str) -> Dict[str, Any]:
    match = re.search(r'<script type="application/json" id="report-figures">(.*?)</script>', html)
    assert match
    figures: Dict[str, Any] = json.loads(match[1])
    return figures


def test_a_part_below_zero_is_noise_with_the_band_drawn(noisy: Dict[str, Any]) -> None:
    html = noisy["html"].read_text(encoding="utf-8")
    (row,) = html_tables(html)["lost-efficiency-table"]
    # The input wait fell below the 1-rank cell's: a negative part, marked as noise.
    assert row["Input pipeline (pts)"].endswith("(noise)")
    assert row["Input pipeline (pts)"].startswith("-")
    one = min(noisy["lines"], key=lambda x: x["world_size"])
    band = 100 * BAND * DEFAULT_FACTOR * (one["step_time_ms"]["cv"] ** 2 + NOISY_CV**2) ** 0.5
    assert row["Noise band (± pts)"] == fmt.significant(band)
    (figure,) = [f for key, f in _figures(html).items() if key.startswith("lost-efficiency")]
    bars = [t for t in figure["data"] if t.get("type") == "bar"]
    assert bars and all(y >= 0 for t in bars for y in t["y"])  # no bar below the axis
    (shape,) = [s for s in figure["layout"]["shapes"] if s["type"] == "rect"]
    assert shape["y0"] == 0 and shape["y1"] == pytest.approx(band)
    label = f"noise band (±{fmt.significant(band)} pts)"
    assert label in [t.get("name") for t in figure["data"]]
    if shutil.which("pdftotext"):
        text = " ".join(" ".join(pages_text(noisy["pdf"])).split())
        assert label in text and "(noise)" in text


def test_one_rank_has_no_communication_figure(noisy: Dict[str, Any]) -> None:
    html = noisy["html"].read_text(encoding="utf-8")
    ones = [r for r in html_tables(html)["comm-compute-table"] if r["Ranks"] == "1"]
    assert ones and all(r["Comm ms"] == fmt.MISSING for r in ones)
    assert all(r["Exposed communication % of step"] == fmt.MISSING for r in ones)
    titles = re.findall(r"Communication vs computation per iteration — [^<\"]*", html)
    assert titles and not any(t.endswith("1 CPU process") for t in titles)
    if shutil.which("pdftotext"):
        text = " ".join(" ".join(pages_text(noisy["pdf"])).split())
        assert "2 CPU processes" in text
        assert "Communication vs computation per iteration — gpt2-tiny, batch 4, 1 CPU" not in text


@needs_poppler
def test_one_severity_vocabulary_in_html_and_pdf(noisy: Dict[str, Any]) -> None:
    html = noisy["html"].read_text(encoding="utf-8")
    badges: List[Tuple[str, str]] = re.findall(
        r'<span class="badge severity-(\w+)">(\w+)</span>', html
    )
    assert badges
    assert {cls for cls, _ in badges} <= set(SHOWN_SEVERITIES)
    assert all(cls == word for cls, word in badges)
    # The PDF shows the badges upper-cased: only the same three words.
    text = " ".join(pages_text(noisy["pdf"]))
    shown = set(SEVERITY_WORDS.findall(text))
    assert shown and shown <= {s.upper() for s in SHOWN_SEVERITIES}, shown


def test_no_tuning_advice_for_a_loss_the_busy_host_explains(noisy: Dict[str, Any]) -> None:
    from torchscale.analysis.report_data import load_report_data
    from torchscale.app.report import report_content

    content = report_content(load_report_data(noisy["folder"]))
    (scaling,) = [f for f in content.findings if f["category"] == "scaling"]
    advice = scaling["recommendation"]
    assert f"a rank waited for a CPU {WAIT_SHARE:.0%} of its measured window" in advice
    assert "bucket" not in advice and advice != SYNC_BOUND_ADVICE
    html = noisy["html"].read_text(encoding="utf-8")
    assert "Rerun on a quiet node" in html
