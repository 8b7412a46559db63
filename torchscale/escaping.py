"""One escaping rule per sink. A name from a config, a results folder or a trace is data: before
it reaches a terminal, a spreadsheet, a shell or a Python snippet it goes through the function
for that sink, here and nowhere else (HTML and SVG use ``html.escape`` / Jinja's autoescape).

- terminal: control characters (C0, DEL, C1, and the bidirectional overrides that reorder what
  a reader sees) are shown escaped (``\\x1b``), so no escape sequence reaches the terminal.
- CSV: a text cell that a spreadsheet would run as a formula (first character ``= + - @``, tab
  or carriage return) is prefixed with ``'`` (OWASP's CSV-injection rule); numbers are
  untouched.
- shell (sbatch, srun, any script we write): one word, quoted; a line break or NUL is refused,
  since no quoting keeps it on one line of a script. A command only shown (a dry run, a log)
  shows such a word as bash's ``$'...'``, still one line.
- ``#SBATCH`` lines: sbatch reads them with a parser of its own (quotes, backslash escapes and
  ``#`` comments, no shell), so a value there is one double-quoted word with ``\\`` and ``"``
  escaped; a line break or NUL is refused.
- Python (a snippet we print to paste): a string literal via ``repr``; comments never carry a
  line break.
- Kubernetes: a resource name is an RFC 1035 label (lower-case letters, digits, ``-``, a letter
  first, at most the length the API allows), a label value at most 63 of ``[A-Za-z0-9._-]``
  between alphanumerics; what a name loses is replaced by a short hash of the original, so two
  names never meet.
- YAML (a manifest, a task file): one document written by PyYAML's safe dumper, which quotes
  every string that would read as something else (a key, a second document, a number).
"""

from __future__ import annotations

import hashlib
import re
import shlex
import unicodedata
from typing import Any, Iterable

from torchscale.errors import TorchscaleError

_TERMINAL_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_LINE_BREAKS = re.compile("[\n\r\x00\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")
_SBATCH_PLAIN = re.compile(r"[\w@%+=:,./-]+", re.ASCII)
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


class UnsafeValue(TorchscaleError, ValueError):
    """A value that no quoting makes safe for its sink (a line break in a shell line): one line,
    exit 2."""


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _escape_controls(text: str) -> str:
    return _TERMINAL_UNSAFE.sub(lambda match: _escaped(match.group()), text)


def for_terminal(text: object, keep_newlines: bool = False) -> str:
    """``text`` with every control character shown escaped; tabs kept, and newlines when
    ``keep_newlines`` (a multi-line message of our own)."""
    value = str(text)
    if keep_newlines:
        return "\n".join(_escape_controls(line) for line in value.split("\n"))
    return _escape_controls(value.replace("\n", "\\n"))


def for_csv(value: object) -> object:
    """A CSV cell: text a spreadsheet would take as a formula gets a leading ``'``; numbers
    (and text that is a plain number, like ``-3.5``) are returned unchanged."""
    if not isinstance(value, str) or not value.startswith(_FORMULA_START):
        return value
    try:
        float(value)
    except ValueError:
        return "'" + value
    return value


def csv_text(frame: Any, **options: Any) -> str:
    """A pandas frame as CSV text with every text cell and header through :func:`for_csv`
    (``options`` go to ``DataFrame.to_csv``; ``index=False`` unless given)."""
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    options.setdefault("index", False)
    safe = frame.copy()
    safe.columns = [for_csv(str(column)) for column in safe.columns]
    for column in safe.columns:
        values = safe[column]
        if not (is_numeric_dtype(values) or is_bool_dtype(values)):
            safe[column] = values.map(for_csv)
    text: str = safe.to_csv(**options)
    return text


def has_line_break(value: str) -> bool:
    return _LINE_BREAKS.search(value) is not None


def one_line(value: str, what: str) -> str:
    """``value`` when it holds no line break or NUL, else :class:`UnsafeValue` naming ``what``."""
    if has_line_break(value):
        shown = for_terminal(value)
        raise UnsafeValue(f"{what} contains a line break or NUL ({shown}); remove it")
    return value


def shell_word(value: str, what: str = "a value") -> str:
    """One shell word, quoted when needed; a line break or NUL is refused."""
    return shlex.quote(one_line(str(value), what))


def shell_line(words: Iterable[str], what: str = "a command") -> str:
    return " ".join(shell_word(word, what) for word in words)


def _ansi_c(value: str) -> str:
    """bash's ``$'...'`` form of ``value``: one line, whatever it holds."""
    out = []
    for char in value:
        code = ord(char)
        if char in "\\'":
            out.append("\\" + char)
        elif _TERMINAL_UNSAFE.match(char) or _LINE_BREAKS.match(char):
            out.append(f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}")
        else:
            out.append(char)
    return "$'" + "".join(out) + "'"


def shown_command(words: Iterable[str]) -> str:
    """A command to show (a dry run's preview, a log line): each word quoted for a shell, a word
    with a line break or a control character as bash's ``$'...'``; always one line."""
    shown = []
    for word in map(str, words):
        unsafe = _TERMINAL_UNSAFE.search(word) or has_line_break(word)
        shown.append(_ansi_c(word) if unsafe else shlex.quote(word))
    return " ".join(shown)


def sbatch_word(value: str, what: str = "an #SBATCH value") -> str:
    """One word of an ``#SBATCH`` line, as sbatch's own parser reads it: as it is when it holds
    only letters, digits and ``@%+=:,./-_``, else double-quoted with backslashes and double
    quotes escaped; a line break or NUL is refused."""
    text = one_line(str(value), what)
    if _SBATCH_PLAIN.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def python_string(value: str) -> str:
    """A Python string literal that evaluates to ``value`` (never more than one line)."""
    return repr(str(value))


def python_comment(text: str) -> str:
    """Text for after a ``#``: line breaks (``\u2028`` too: an editor shows it as one) and
    control characters shown escaped."""
    return _LINE_BREAKS.sub(lambda match: _escaped(match.group()), for_terminal(text))


def _short_hash(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def k8s_name(value: str, max_length: int = 63, prefix: str = "ts") -> str:
    """A Kubernetes resource name (RFC 1035 label: ``[a-z]([-a-z0-9]*[a-z0-9])?``) for
    ``value``: accents dropped, anything else folded to ``-``; ``prefix`` first when it does not
    start with a letter; a hash of ``value`` appended when anything was lost, so distinct names
    stay distinct."""
    ascii_text = unicodedata.normalize("NFKD", value).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")
    if not slug[:1].isalpha():
        slug = f"{prefix}-{slug}".strip("-")
    if slug == value and len(slug) <= max_length:
        return slug
    tail = "-" + _short_hash(value)
    return slug[: max_length - len(tail)].rstrip("-") + tail


def k8s_label_value(value: str) -> str:
    """A Kubernetes label value: at most 63 of ``[A-Za-z0-9._-]``, alphanumerics at both ends;
    a hash of ``value`` appended when anything was lost."""
    clean = re.sub(r"[^A-Za-z0-9._-]+", "-", value).strip("._-")
    if clean == value and len(clean) <= 63:
        return clean
    tail = _short_hash(value)
    head = clean[: 63 - len(tail) - 1].rstrip("._-")
    return f"{head}-{tail}" if head else tail


def yaml_document(data: Any) -> str:
    """``data`` (plain dicts, lists, strings, numbers) as one YAML document."""
    import yaml

    text: str = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=10_000)
    return text
