"""Reading JSON that anyone may have written: a results folder someone sent, a damaged file.

Every JSON file torchscale reads (``results.jsonl`` lines, ``manifest.json``, ``result.json``,
``findings.json``, ``tune.json``, owner and progress files) goes through :func:`parse_json`:
the size is bounded before parsing, a document nested deeper than :data:`MAX_DEPTH` levels (no
file of ours nests more than a handful; Python's parser and every recursive reader after it fail
on thousands) is damaged, and so is anything Python's parser refuses. Damage is
:class:`DamagedJson`, a ``ValueError`` and a one-line error (exit 2) at once: a reader that can
skip a document catches it and says so; one that cannot goes on without it or stops in one line,
never with a traceback. :func:`read_object` also checks the shape: a document that must be an
object and is a list is damaged too.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple, Union

from torchscale.errors import TorchscaleError
from torchscale.results.files import PathLike, open_for_read, read_limited

log = logging.getLogger("torchscale")

MAX_DEPTH = 64
"""Deepest nesting accepted (torchscale's own files nest 4 levels)."""
MAX_DOCUMENT_BYTES = 64 << 20
"""Largest JSON file read whole (manifest, findings, tune summary, owner file)."""
MAX_LINE_BYTES = 1 << 30
"""Longest line of a results file, or rank result, read (a record of 1M steps and 8 ranks is
~80 MB)."""


class DamagedJson(TorchscaleError, ValueError):
    """A JSON document that cannot be read as what it should be (one line, exit 2)."""


def json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words: ``a list``, ``an object``, ``a number``."""
    if isinstance(value, bool):
        return "a boolean"
    kinds = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


_ESCAPED = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKET = bytes(c for c in range(256) if c not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def nesting_depth(data: bytes) -> int:
    """How deep the JSON text ``data`` nests, found without parsing it: escapes, then strings,
    then everything but brackets are cut out at C speed, and only the brackets are counted (a
    record of a million step times holds a handful)."""
    brackets = _STRING.sub(b"", _ESCAPED.sub(b"", data)).translate(None, _NOT_BRACKET)
    return max(itertools.accumulate(_STEP[c] for c in brackets), default=0)


def _damaged(exc: ValueError) -> DamagedJson:
    return DamagedJson(str(exc).splitlines()[0][:200] if str(exc) else "not JSON")


def parse_json(text: Union[str, bytes], max_depth: int = MAX_DEPTH) -> Any:
    """The document in ``text``; :class:`DamagedJson` (naming why) when it is not readable JSON
    or nests deeper than ``max_depth`` (checked before parsing: Python's parser, and every
    recursive reader after it, fails on thousands of levels). Bytes that are not UTF-8 inside a
    string are read as U+FFFD."""
    data = text.encode("utf-8", errors="surrogatepass") if isinstance(text, str) else text
    if nesting_depth(data) > max_depth:
        raise DamagedJson(f"nested deeper than {max_depth} levels")
    try:
        return json.loads(data)
    except UnicodeDecodeError:
        pass  # a damaged byte: read the rest
    except RecursionError:
        raise DamagedJson(f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError, a 5000-digit integer
        raise _damaged(exc) from None
    try:
        return json.loads(data.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError) as exc:
        raise _damaged(ValueError(str(exc))) from None


def read_json(path: PathLike, what: str, limit: int = MAX_DOCUMENT_BYTES) -> Any:
    """The document in file ``path`` (a regular file of at most ``limit`` bytes); ``what`` names
    it in errors."""
    data = read_limited(path, limit, what)
    try:
        return parse_json(data)
    except DamagedJson as exc:
        raise DamagedJson(f"{path} is damaged ({exc})") from None


def read_object(path: PathLike, what: str, limit: int = MAX_DOCUMENT_BYTES) -> Dict[str, Any]:
    """:func:`read_json` of a document that must be a JSON object."""
    document = read_json(path, what, limit)
    if not isinstance(document, dict):
        raise DamagedJson(
            f"{path} is damaged ({json_kind(document)}, not an object): it is not a {what}"
        )
    return document


def _skip_rest_of_line(handle: Any) -> None:
    while True:
        chunk = handle.readline(1 << 20)
        if not chunk or chunk.endswith(b"\n"):
            return


def jsonl_documents(
    path: Path, limit: Optional[int] = None, offset: int = 0
) -> Iterator[Tuple[int, Any]]:
    """(line number, document) for every readable line of ``path`` from byte ``offset`` on (line
    numbers then count from there); a damaged line (not JSON, too deep, longer than ``limit``
    bytes, :data:`MAX_LINE_BYTES` by default) is skipped with a warning naming it."""
    limit = limit or MAX_LINE_BYTES
    with open(open_for_read(path), "rb") as handle:
        handle.seek(offset)
        number = 0
        while True:
            line = handle.readline(limit + 1)
            if not line:
                return
            number += 1
            if len(line) > limit and not line.endswith(b"\n"):
                _skip_rest_of_line(handle)
                log.warning(
                    "%s line %d is damaged (longer than %d bytes); skipped", path, number, limit
                )
                continue
            if not line.strip():
                continue
            try:
                yield number, parse_json(line)
            except DamagedJson as exc:
                log.warning("%s line %d is damaged (%s); skipped", path, number, exc)
