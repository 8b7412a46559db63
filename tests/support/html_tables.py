"""Read the report's HTML tables back (html.parser, no extra dependency) and compare numbers."""

from __future__ import annotations

from typing import Dict, List, Optional


class _TableParser:
    """Collects ``<table id=...>`` contents as rows of cell texts (html.parser, no deps)."""

    def __init__(self) -> None:
        from html.parser import HTMLParser

        outer = self
        self.tables: Dict[str, List[List[str]]] = {}
        self._current: Optional[str] = None
        self._cell: Optional[List[str]] = None

        class Parser(HTMLParser):
            def handle_starttag(self, tag, attrs):
                attributes = dict(attrs)
                if tag == "table" and attributes.get("id"):
                    outer._current = attributes["id"]
                    outer.tables[outer._current] = []
                elif tag == "tr" and outer._current:
                    outer.tables[outer._current].append([])
                elif tag in ("td", "th") and outer._current:
                    outer._cell = []

            def handle_endtag(self, tag):
                if tag in ("td", "th") and outer._cell is not None and outer._current:
                    outer.tables[outer._current][-1].append("".join(outer._cell).strip())
                    outer._cell = None
                elif tag == "table":
                    outer._current = None

            def handle_data(self, data):
                if outer._cell is not None:
                    outer._cell.append(data)

        self.parser = Parser(convert_charrefs=True)


def html_tables(html: str) -> Dict[str, List[Dict[str, str]]]:
    """Every table with an id, as a list of {header: cell text} rows (headers de-duplicated)."""
    collector = _TableParser()
    collector.parser.feed(html)
    tables = {}
    for table_id, rows in collector.tables.items():
        if not rows:
            continue
        headers: List[str] = []
        seen: Dict[str, int] = {}
        for header in rows[0]:
            seen[header] = seen.get(header, 0) + 1
            headers.append(header if seen[header] == 1 else f"{header} {seen[header]}")
        tables[table_id] = [dict(zip(headers, row)) for row in rows[1:]]
    return tables


def number(text: str) -> float:
    """A displayed number back to a float ('1,450' -> 1450.0, '62.0%' -> 62.0)."""
    return float(text.replace(",", "").rstrip("%"))


def displayed_close(text: str, value: float) -> bool:
    """Whether ``text`` shows ``value`` at three significant digits (the report's precision)."""
    shown = number(text)
    return abs(shown - value) <= max(0.006 * abs(value), 0.0051)
