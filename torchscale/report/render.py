"""Fill the templates and write the report: HTML (Plotly, one offline file) or PDF (WeasyPrint).

Templates autoescape everything and fail on an undefined variable, so a name from a config is
always text and a template typo is an error, not a blank.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict

from torchscale.errors import TorchscaleError
from torchscale.report.content import ReportContent
from torchscale.report.elements import chart_data_table
from torchscale.version import __version__

if TYPE_CHECKING:
    from jinja2 import Environment

TEMPLATES = Path(__file__).parent / "templates"
FORMATS = ("html", "pdf")


def _environment() -> Environment:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    return Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _render(content: ReportContent, mode: str, extra: Dict[str, object]) -> str:
    template = _environment().get_template("report.html.j2")
    return template.render(
        report=content,
        mode=mode,
        version=__version__,
        css=(TEMPLATES / "report.css").read_text(encoding="utf-8"),
        **extra,
    )


def render_html(content: ReportContent) -> str:
    from torchscale.report.plotly_charts import figures_json, plotly_js

    return _render(
        content,
        "html",
        {
            "plotly_js": plotly_js(),
            "figures_json": figures_json(content.charts),
            "chart_tables": {c.chart_id: chart_data_table(c) for c in content.charts},
            "chart_images": {},
        },
    )


def _svg_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def _data_only_fetcher() -> Any:
    """Everything the PDF shows is inline: refuse any URL that is not ``data:``, never fetch."""
    try:
        from weasyprint.urls import URLFetcher  # WeasyPrint >= 68
    except ImportError:
        from weasyprint import default_url_fetcher

        def fetch(url: str, *args: Any, **kwargs: Any) -> Any:
            if not url.startswith("data:"):
                raise ValueError(f"the report does not load external resources ({url[:60]})")
            return default_url_fetcher(url, *args, **kwargs)

        return fetch
    return URLFetcher(allowed_protocols={"data"})


def render_pdf(content: ReportContent) -> bytes:
    import logging

    from weasyprint import HTML

    from torchscale.report.svg_charts import svg

    images = {c.chart_id: _svg_uri(svg(c)) for c in content.charts}
    page = _render(
        content,
        "pdf",
        {"plotly_js": "", "figures_json": "{}", "chart_tables": {}, "chart_images": images},
    )
    # WeasyPrint logs every CSS property it ignores at WARNING; they are not the user's problem.
    logging.getLogger("weasyprint").setLevel(logging.ERROR)
    pdf: bytes = HTML(string=page, url_fetcher=_data_only_fetcher()).write_pdf()  # untyped
    return pdf


def render(content: ReportContent, fmt: str) -> bytes:
    if fmt == "html":
        return render_html(content).encode("utf-8")
    if fmt == "pdf":
        return render_pdf(content)
    raise TorchscaleError(f"unknown report format '{fmt}': use one of {', '.join(FORMATS)}")
