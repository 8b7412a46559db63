"""The PDF report (WeasyPrint): pages rendered with poppler, charts drawn, names kept as text."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import pytest

from tests.support.pdf_pages import ink, needs_poppler, pages_png, pages_text
from tests.support.report_fixtures import SCRIPT_NAME, SessionReport
from torchscale.analysis.report_data import load_report_data

pytestmark = needs_poppler


@pytest.fixture(scope="module")
def fixture_pdf(fixture_results: Path, session_report: SessionReport):
    pdf = session_report(fixture_results, "pdf")
    html = session_report(fixture_results, "html").read_text(encoding="utf-8")
    found = re.search(r'id="report-figures">(.*?)</script>', html, re.S)
    assert found is not None
    figures = json.loads(found.group(1))
    titles = [unescape(f["layout"]["title"]["text"]) for f in figures.values()]
    return pdf, pages_text(pdf), pages_png(pdf), titles


def test_every_page_rendered(fixture_pdf) -> None:
    pdf, texts, pngs, _ = fixture_pdf
    assert pdf.read_bytes().startswith(b"%PDF")
    assert len(pngs) == len(texts) >= 8
    assert f"of {len(texts)}" in texts[-1]  # the running "page N of M" footer


def test_every_chart_is_on_one_page_and_drawn(fixture_pdf) -> None:
    _, texts, pngs, titles = fixture_pdf
    assert len(titles) >= 14
    chart_pages = set()
    for title in titles:
        pages = [i for i, text in enumerate(texts) if title in text]
        assert len(pages) == 1, (title, pages)  # the SVG's text is real PDF text
        chart_pages.add(pages[0])
    for index in chart_pages:
        spread, coloured = ink(pngs[index])
        assert spread > 12, index  # not blank
        assert coloured > 0.001, (index, coloured)


def test_table_rows_are_never_split(fixture_pdf, fixture_results: Path) -> None:
    _, texts, _, _ = fixture_pdf
    data = load_report_data(fixture_results)
    words_per_page = [set(text.split()) for text in texts]
    for record in data.records:
        if record.status == "ok":
            continue
        needed = set((record.error or "").split()) | {record.status}
        assert any(needed <= words for words in words_per_page), record.error


def test_names_stay_text_in_the_pdf(fixture_pdf) -> None:
    _, texts, _, _ = fixture_pdf
    assert sum(text.count(SCRIPT_NAME) for text in texts) >= 10
