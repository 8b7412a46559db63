"""Open the HTML reports in real headless Chromium: no errors, no network, every chart drawn."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.chromium_cdp import CHROMIUM, Chromium
from tests.support.report_fixtures import NODE_SPEC, SCRIPT_NAME, FixtureSpec, SessionReport
from tests.support.shared_runs import Run

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)"
)

READY = (
    "document.querySelectorAll('[data-figure]').length > 0 && "
    "document.querySelectorAll('[data-figure]').length === "
    "document.querySelectorAll('[data-drawn=\"true\"]').length"
)
CHARTS = """(() => {
  const figures = JSON.parse(document.getElementById('report-figures').textContent);
  return Array.from(document.querySelectorAll('[data-figure]')).map(el => {
    const id = el.getAttribute('data-figure');
    const layer = el.querySelectorAll('.cartesianlayer .trace');
    const marks = el.querySelectorAll(
      '.cartesianlayer .trace path.js-line, .cartesianlayer .trace .point, ' +
      '.cartesianlayer .trace path.box');
    // A band's legend entry is a trace with no point (x: [null]): it draws no mark.
    const drawable = figures[id].data.filter(t => (t.x || []).some(v => v !== null)).length;
    return {id: id, svgs: el.querySelectorAll('.main-svg').length, traces: layer.length,
            expected: figures[id].data.length, drawable: drawable, marks: marks.length};
  });
})()"""


def _check(browser: Chromium, path: Path, title: str, shot: Path) -> list:
    page = browser.open(path, READY)
    assert page.console_errors == []
    assert page.requests == [page.url]  # the page itself, nothing else
    assert page.dialogs == []  # no alert() ran
    charts = page.evaluate(CHARTS)
    for chart in charts:
        assert chart["svgs"] >= 1, chart
        assert chart["traces"] == chart["expected"], chart
        assert chart["marks"] >= chart["drawable"], chart
    assert page.evaluate("document.querySelector('.report-title').textContent") == title
    assert page.evaluate("document.querySelectorAll('script').length") == 3
    page.screenshot(shot)
    assert shot.stat().st_size > 50_000  # a drawn page, not a blank one
    return charts


def test_fixture_report_in_chromium(
    chromium: Chromium, fixture_results: Path, session_report: SessionReport
) -> None:
    path = session_report(fixture_results, "html")
    charts = _check(chromium, path, FixtureSpec().name, path.with_suffix(".png"))
    assert len(charts) >= 14


def test_node_report_in_chromium(
    chromium: Chromium, node_results: Path, session_report: SessionReport
) -> None:
    path = session_report(node_results, "html")
    charts = _check(chromium, path, NODE_SPEC.name, path.with_suffix(".png"))
    across = [c for c in charts if c["id"].startswith("nodes-")]
    # total, intra, inter; and the two efficiency bands, named in the legend
    assert len(across) == 2 and all(c["traces"] == 3 + 2 for c in across)


def test_real_report_in_chromium(
    chromium: Chromium, healthy_run: Run, session_report: SessionReport
) -> None:
    path = session_report(healthy_run.output_dir, "html")
    charts = _check(chromium, path, SCRIPT_NAME, path.with_suffix(".png"))
    assert {c["id"].split("-")[0] for c in charts} >= {"efficiency", "throughput", "steps"}
