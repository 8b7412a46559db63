"""Console tables that read well at any width, 80 columns (a CI log, a file) included.

A table whose every column fits is printed as it is. A narrower console gets the compact form:
stacked headers with their units, columns whose value is the same on every row said once under
the title instead, text columns (model names) wrapped whole, and only then, least important first,
columns left out (and named, with where to find them). A number is never cut: no ``…``.
Long text (a validate check's value and fix) goes in a ``fill`` column: it takes the width left
and wraps at words there.

Every string (title, headers, values, caption) is shown with its control characters escaped
(``torchscale.escaping.for_terminal``): a model or experiment name from a config or a results
file never sends an escape sequence to the terminal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Union

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from torchscale.escaping import for_terminal

WRAP_WIDTH = 18
"""How wide a wrapped text column (model names) may grow in the compact form."""
FILL_MIN = 24
"""The width a ``fill`` column needs at least, when deciding what else fits beside it."""


@dataclass
class Col:
    """One column: its header (``compact`` is the narrow form, ``\\n`` stacks it) and values."""

    header: str
    values: List[str]
    compact: Optional[str] = None
    numeric: bool = True
    wrap: bool = False  # text that may wrap onto several lines (never cut)
    # Said once under the title, as same.format(value) or same(value), when every row has one
    # value (compact form only).
    same: Union[str, Callable[[str], str], None] = None
    drop: int = 0  # 0: always shown; otherwise left out when too narrow, highest first
    name: str = ""  # what a left-out column is called in the note (default: the header)
    compact_values: Optional[List[str]] = None  # the values in the compact form, if different
    fill: bool = False  # long text: takes the width the other columns leave, wrapped at words
    styles: Optional[List[str]] = None  # a Rich style per value (a verdict's colour)

    @property
    def label(self) -> str:
        return self.name or " ".join(self.header.split())


BREAKS = (r"\s", r":,", r"./", r"_=-")
"""Where wrapped text breaks, best first: spaces, then after ``:`` or ``,``, then ``.`` or ``/``,
then ``_``, ``=`` or ``-``; a run with none of them is split where the line ends."""


def _pieces(text: str, width: int, level: int) -> List[str]:
    if len(text) <= width:
        return [text]
    if level == len(BREAKS):
        return [text[i : i + width] for i in range(0, len(text), width)]
    marks = BREAKS[level]
    tokens = [t for t in re.findall(rf"[^{marks}]*(?:[{marks}]+|$)", text) if t]
    lines: List[str] = []
    line = ""
    for token in tokens:
        if len((line + token).rstrip()) <= width:
            line += token
            continue
        if line.strip():
            lines.append(line.rstrip())
        line = token
        if len(token.rstrip()) > width:
            *whole, line = _pieces(token.rstrip(), width, level + 1)
            lines += whole
    if line.strip() or not lines:
        lines.append(line.rstrip())
    return lines


def wrap_text(text: str, width: int) -> str:
    """``text`` on lines of at most ``width``, broken where a reader expects it (:data:`BREAKS`):
    ``pkg.module:function`` wraps as ``pkg.module:`` / ``function``, never inside a word that
    fits on a line."""
    return "\n".join(piece for line in text.split("\n") for piece in _pieces(line, width, 0))


def _safe(text: str, style: str = "") -> Text:
    """Plain text (a name holding ``[/x]`` is not markup) with control characters escaped."""
    return Text(for_terminal(text, keep_newlines=True), style=style)


def _build(
    title: str,
    cols: Sequence[Col],
    compact: bool,
    caption: str = "",
    cap: bool = False,
    measuring: bool = False,
    wrap_width: int = WRAP_WIDTH,
) -> Table:
    """The table; ``measuring``: with each fill column at its least width, to see what fits."""
    shown_title, shown_caption = _safe(title), _safe(caption) if caption else None
    if compact:
        table = Table(
            title=shown_title,
            title_justify="left",
            caption=shown_caption,
            caption_justify="left",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            collapse_padding=True,
        )
    else:
        table = Table(title=shown_title, title_justify="left", caption=shown_caption)
    for col in cols:
        header = col.compact if compact and col.compact is not None else col.header
        table.add_column(
            _safe(header),
            justify="right" if col.numeric else "left",
            no_wrap=not col.fill,
            overflow="fold",
            max_width=FILL_MIN if measuring and col.fill else None,
        )
    columns = [
        [for_terminal(v, keep_newlines=True) for v in values]  # escaped first: then it is wrapped
        for values in (c.compact_values if compact and c.compact_values else c.values for c in cols)
    ]
    if cap:  # wrapped text is broken where a reader expects it, never inside a word if it fits
        columns = [
            [wrap_text(v, wrap_width) for v in values] if col.wrap else values
            for col, values in zip(cols, columns)
        ]
    for index, row in enumerate(zip(*columns)):
        styles = [col.styles[index] if col.styles else "" for col in cols]
        table.add_row(*(_safe(value, style) for value, style in zip(row, styles)))
    return table


def _width(console: Console, table: Table) -> int:
    return Measurement.get(console, console.options.update_width(10_000), table).maximum


def fitted_table(
    console: Console,
    title: str,
    cols: Sequence[Col],
    left_out: str = "",
    compact: Optional[Sequence[Col]] = None,
) -> Table:
    """``cols`` as one table no wider than ``console``; ``left_out`` says where the values of
    columns that had to be left out can be found; ``compact``: the columns of the compact form,
    when it stacks two of ``cols`` into one (a change over its interval)."""
    cols = [c for c in cols if c.values is not None]
    wide = _build(title, cols, compact=False)
    if _width(console, wide) <= console.width:
        return wide
    if compact is not None:
        cols = [c for c in compact if c.values is not None]
    fills = any(c.fill for c in cols)
    notes: List[str] = []
    shown: List[Col] = []
    for col in cols:
        distinct = set(col.values)
        if col.same is not None and len(distinct) == 1 and col.values:
            value = col.values[0]
            notes.append(col.same(value) if callable(col.same) else col.same.format(value))
        else:
            shown.append(col)
    dropped: List[str] = []
    while True:
        caption = " · ".join(notes)
        if dropped:
            where = f" ({left_out})" if left_out else ""
            caption += ("; " if caption else "") + f"not shown: {', '.join(dropped)}{where}"
        table = _build(title, shown, compact=True, caption=caption)
        if not fills and _width(console, table) <= console.width:
            return table
        # Text columns (model names, cell ids) wrap onto more lines before anything is left out.
        table = _build(title, shown, compact=True, caption=caption, cap=True)
        least = _build(title, shown, compact=True, caption=caption, cap=True, measuring=fills)
        droppable = [c for c in shown if c.drop]
        spare = console.width - _width(console, least)
        if spare >= 0 or not droppable:
            wrapped = [c for c in shown if c.wrap]
            if spare > 0 and wrapped:  # the width left over goes to the wrapped text
                width = WRAP_WIDTH + spare // len(wrapped)
                return _build(title, shown, True, caption, cap=True, wrap_width=width)
            return table
        victim = max(droppable, key=lambda c: c.drop)
        shown.remove(victim)
        dropped.append(victim.label)
