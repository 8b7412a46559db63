"""The history page in real headless Chromium with no network: every chart drawn, the change
points visible with their cause, the filter working inside the page."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.chromium_cdp import CHROMIUM, Chromium
from tests.test_history import NODE_B_SLOWS_AT, nightly_series, validate_nights
from torchscale.cli.app import app
from torchscale.history.database import HistoryStore
from torchscale.history.ingest import read_validate
from torchscale.results.layout import VALIDATE_DIR

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)"
)

READY = (
    "document.querySelectorAll('[data-figure]').length > 0 && "
    "document.querySelectorAll('[data-figure]').length === "
    "document.querySelectorAll('[data-drawn=true]').length"
)


def test_the_history_page_draws_every_chart_with_its_change_points(
    tmp_path: Path, chromium: Chromium
) -> None:
    location = str(tmp_path / "history.db")
    store = HistoryStore(location)
    store.add_runs(nightly_series(seed=1))
    nights = validate_nights(tmp_path / "out")
    store.add_runs([run for night in nights for run in read_validate(night / VALIDATE_DIR)])
    store.close()
    page_file = tmp_path / "history.html"
    result = CliRunner().invoke(
        app, ["history", "report", "--history", location, "-o", str(page_file)]
    )
    assert result.exit_code == 0, result.output
    assert "7 chart(s)" in result.output  # 4 series, and a fleet heatmap per validate probe
    page = chromium.open(page_file, READY)
    assert page.console_errors == []
    # the page itself, nothing fetched (a heatmap draws itself as a data: image)
    assert [r for r in page.requests if not r.startswith("data:")] == [page.url]
    drawn = page.evaluate(
        "Array.from(document.querySelectorAll('.series [data-figure]')).map(el => ({"
        "points: el.querySelectorAll('.scatterlayer .point').length,"
        "red: Array.from(el.querySelectorAll('.shapelayer path'))"
        "  .filter(p => (p.style.stroke || '').includes('204, 0, 0')).length,"
        "text: el.textContent}))"
    )
    assert len(drawn) == 4
    for chart in drawn:
        assert chart["points"] == 60
        assert chart["red"] == 1  # the change at run 40
        assert "NCCL 2.27.3 → 2.28.9" in chart["text"]
    listed = page.evaluate("document.querySelector('.changes').textContent")
    assert "regression (open) at run 40" in listed and "NCCL 2.27.3 → 2.28.9" in listed
    shown = page.evaluate(
        "(() => { const s = document.querySelector('select[data-filter=model]');"
        "s.value = 'gpt2-tiny'; s.dispatchEvent(new Event('change'));"
        "return Array.from(document.querySelectorAll('.series'))"
        ".filter(b => b.style.display !== 'none').map(b => b.getAttribute('data-model')); })()"
    )
    assert shown == ["gpt2-tiny", "gpt2-tiny"]
    # the fleet view: per probe, each node's figure per night as a heatmap, drawn
    fleet = page.evaluate(
        "Array.from(document.querySelectorAll('.fleet [data-figure]')).map(el => ({"
        "probe: el.parentElement.getAttribute('data-metric'),"
        "images: el.querySelectorAll('.heatmaplayer image').length,"
        "type: el.data[0].type, y: el.data[0].y, x: el.data[0].x, z: el.data[0].z}))"
    )
    assert [f["probe"] for f in fleet] == ["gemm_fp32", "launch_latency", "memory_copy"]
    for heatmap in fleet:
        assert heatmap["type"] == "heatmap" and heatmap["images"] == 1
        assert heatmap["y"] == ["node-a CPU 0", "node-b CPU 0"] and len(heatmap["x"]) == 12
    copy = fleet[2]["z"]  # node-b's row is 20% lower from night 8, node-a's unchanged
    before, after = slice(0, NODE_B_SLOWS_AT - 1), slice(NODE_B_SLOWS_AT - 1, None)
    ratio = (sum(copy[1][after]) / 5) / (sum(copy[1][before]) / 7)
    assert ratio == pytest.approx(0.8, abs=0.03)
    assert (sum(copy[0][after]) / 5) / (sum(copy[0][before]) / 7) == pytest.approx(1, abs=0.03)
