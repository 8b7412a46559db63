"""The history page in real headless Chromium with no network: every chart drawn, the change
points visible with their cause, the filter working inside the page."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.chromium_cdp import CHROMIUM, Chromium
from tests.test_history import nightly_series
from torchscale.cli.app import app
from torchscale.history.database import HistoryStore

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)"
)

READY = (
    "document.querySelectorAll('[data-figure]').length > 0 && "
    "document.querySelectorAll('[data-figure]').length === "
    "document.querySelectorAll('[data-drawn=true]').length"
)


def test_the_history_page_draws_every_chart_with_its_change_points(tmp_path: Path) -> None:
    location = str(tmp_path / "history.db")
    store = HistoryStore(location)
    store.add_runs(nightly_series(seed=1))
    store.close()
    page_file = tmp_path / "history.html"
    result = CliRunner().invoke(
        app, ["history", "report", "--history", location, "-o", str(page_file)]
    )
    assert result.exit_code == 0, result.output
    assert "4 chart(s)" in result.output
    with Chromium() as browser:
        page = browser.open(page_file, READY)
        assert page.console_errors == []
        assert page.requests == [page.url]  # the page itself, nothing fetched
        drawn = page.evaluate(
            "Array.from(document.querySelectorAll('[data-figure]')).map(el => ({"
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
