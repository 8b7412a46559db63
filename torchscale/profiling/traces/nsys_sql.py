"""SQL helpers for reading nsys SQLite exports: optional tables and columns, and whole
columns fetched as ``group_concat`` strings parsed by numpy (never row by row)."""

from __future__ import annotations

import sqlite3
from typing import Dict, List, Sequence, Set

import numpy as np

CHUNK_ROWS = 1_000_000
MISSING = -(1 << 62)  # a NULL in an integer column as fetched (group_concat drops NULLs)
GLOBAL_ID_PART = 0x1000000  # serialized GlobalId: ... | pid (24 bits) | tid (24 bits)


def tables_of(con: sqlite3.Connection) -> Set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def column_chunks(
    con: sqlite3.Connection, table: str, exprs: Sequence[str], joins: str = "", where: str = "1"
) -> List[np.ndarray]:
    """Integer columns of ``table`` (``t``) as arrays, fetched as ``group_concat`` strings."""
    lo, hi = con.execute(f"SELECT MIN(rowid), MAX(rowid) FROM {table}").fetchone()
    chunks: List[List[np.ndarray]] = [[] for _ in exprs]
    if lo is None:
        return [np.zeros(0, dtype=np.int64) for _ in exprs]
    # group_concat skips NULLs, which would shift a column against the others: NULL -> MISSING
    select = ", ".join(
        f"group_concat(COALESCE(CAST({e} AS INTEGER), {MISSING}), ',')" for e in exprs
    )
    for start in range(lo, hi + 1, CHUNK_ROWS):
        row = con.execute(
            f"SELECT {select} FROM {table} AS t {joins} "
            f"WHERE t.rowid >= ? AND t.rowid < ? AND ({where})",
            (start, start + CHUNK_ROWS),
        ).fetchone()
        for out, text in zip(chunks, row):
            if text:
                out.append(np.fromstring(text, dtype=np.int64, sep=","))
    return [np.concatenate(c) if c else np.zeros(0, dtype=np.int64) for c in chunks]


def strings(con: sqlite3.Connection, ids: np.ndarray) -> Dict[int, str]:
    wanted = np.unique(ids)
    if not len(wanted):
        return {}
    con.execute("CREATE TEMP TABLE IF NOT EXISTS wanted_ids (id INTEGER PRIMARY KEY)")
    con.execute("DELETE FROM wanted_ids")
    con.executemany("INSERT INTO wanted_ids VALUES (?)", ((int(i),) for i in wanted))
    return dict(
        con.execute("SELECT s.id, s.value FROM StringIds s JOIN wanted_ids w ON w.id = s.id")
    )


def columns_of(con: sqlite3.Connection, table: str) -> Set[str]:
    return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}


def col(columns: Set[str], name: str, fallback: str) -> str:
    """``t.<name>`` when this export has the column, else ``fallback`` (a SQL constant)."""
    return f"t.{name}" if name in columns else fallback


def pid_of(column: str) -> str:
    return f"COALESCE({column}, 0) / {GLOBAL_ID_PART} % {GLOBAL_ID_PART}"
