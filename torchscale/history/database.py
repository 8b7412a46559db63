"""The history database: one schema, one code path for SQLite (a file) and PostgreSQL (a server).

SQLAlchemy Core builds every statement, so values always travel as bound parameters and the two
dialects differ only where they must (``INSERT ... ON CONFLICT``, SQLite's WAL set-up).

Tables (see docs/history.md):

- ``runs``: one row per run, keyed by its identity (from the manifest, so a folder ingested twice
  is one run); its software versions and hosts as attributes (JSON text), its hardware.
- ``series``: one row per series key (a cell's identity on one hardware fingerprint).
- ``points``: one figure of one series in one run (``metric``, ``value``, ``spread``: the cell's
  step-time CV, the noise the change detection is confirmed against, and how many repeats).
- ``predictions``: what ``project`` predicted for a scale, with its interval.
- ``schema_version``: the migrations applied (:data:`MIGRATIONS`, in order).

A run lands in one transaction or not at all: two ingests at once both land (SQLite: WAL, a busy
timeout and ``BEGIN IMMEDIATE``; PostgreSQL: unique keys and ``ON CONFLICT DO NOTHING``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from torchscale.errors import TorchscaleError

SQLITE_BUSY_TIMEOUT_S = 60.0
"""How long an SQLite writer waits for another's transaction (nightly jobs ingest together)."""

metadata = sa.MetaData()

schema_version = sa.Table(
    "schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("applied_at", sa.String(40), nullable=False),
)
runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("identity", sa.String(64), nullable=False, unique=True),
    sa.Column("experiment", sa.Text, nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("started_at", sa.String(40), nullable=False),
    sa.Column("hardware", sa.Text, nullable=False),
    sa.Column("attributes", sa.Text, nullable=False),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("ingested_at", sa.String(40), nullable=False),
)
series = sa.Table(
    "series",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("key", sa.String(64), nullable=False, unique=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("batch", sa.Integer),
    sa.Column("gpus", sa.Integer, nullable=False),
    sa.Column("nnodes", sa.Integer, nullable=False),
    sa.Column("precision", sa.String(32), nullable=False),
    sa.Column("digest", sa.String(16), nullable=False),
    sa.Column("hardware", sa.Text, nullable=False),
)
# As schema 1 created it; schema 2 (``_points_without_foreign_keys``) drops its foreign keys.
points = sa.Table(
    "points",
    metadata,
    sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id"), primary_key=True),
    sa.Column("series_id", sa.Integer, sa.ForeignKey("series.id"), primary_key=True),
    sa.Column("metric", sa.String(32), primary_key=True),
    sa.Column("value", sa.Float, nullable=False),
    sa.Column("spread", sa.Float),
    sa.Column("repeats", sa.Integer, nullable=False),
    sa.Index("points_series", "series_id", "metric"),
)
predictions = sa.Table(
    "predictions",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id"), nullable=False),
    sa.Column("series_key", sa.String(64), nullable=False),
    sa.Column("metric", sa.String(32), nullable=False),
    sa.Column("predicted", sa.Float, nullable=False),
    sa.Column("low", sa.Float),
    sa.Column("high", sa.Float),
    sa.UniqueConstraint("run_id", "series_key", "metric"),
)


def _create_v1(connection: Connection) -> None:
    metadata.create_all(connection, tables=[runs, series, points, predictions])


def _points_without_foreign_keys(connection: Connection) -> None:
    """Schema 2: ``points`` without its foreign keys. Every point is written by
    ``HistoryStore.add_runs`` in its run's transaction, with the run id the insert returned and
    series ids read in that transaction, and nothing is ever deleted, so the keys held by
    construction; checking them cost a trigger per point, over half of PostgreSQL's bulk ingest.
    SQLite cannot drop a constraint: its table is rebuilt, keyed in insert order (run, series,
    metric) WITHOUT ROWID, so the key is the table and no second copy of it is kept."""
    if connection.dialect.name == "postgresql":
        names = connection.execute(
            sa.text(
                "SELECT conname FROM pg_constraint "
                "WHERE conrelid = 'points'::regclass AND contype = 'f'"
            )
        ).scalars()
        for name in list(names):
            quoted = connection.dialect.identifier_preparer.quote(str(name))
            connection.execute(sa.text(f"ALTER TABLE points DROP CONSTRAINT {quoted}"))
        return
    connection.execute(sa.text("DROP INDEX IF EXISTS points_series"))
    connection.execute(sa.text("ALTER TABLE points RENAME TO points_v1"))
    connection.execute(
        sa.text(
            "CREATE TABLE points (run_id INTEGER NOT NULL, series_id INTEGER NOT NULL, "
            "metric VARCHAR(32) NOT NULL, value FLOAT NOT NULL, spread FLOAT, "
            "repeats INTEGER NOT NULL, PRIMARY KEY (run_id, series_id, metric)) WITHOUT ROWID"
        )
    )
    connection.execute(sa.text("INSERT INTO points SELECT * FROM points_v1"))
    connection.execute(sa.text("DROP TABLE points_v1"))
    connection.execute(sa.text("CREATE INDEX points_series ON points (series_id, metric)"))


MIGRATIONS: List[Tuple[int, Callable[[Connection], None]]] = [
    (1, _create_v1),
    (2, _points_without_foreign_keys),
]
"""Ordered schema steps: a later schema change is one more ``(version, step)`` here, applied once
to every existing store (never edit a step that has shipped)."""
SCHEMA_VERSION = MIGRATIONS[-1][0]
MIGRATION_LOCK = 0x7473_6869_7374  # PostgreSQL advisory lock key held while migrating


class HistoryError(TorchscaleError):
    """The history location cannot be used (one line, exit 2)."""


@dataclass(frozen=True)
class SeriesEntry:
    key: str
    kind: str
    name: str
    batch: Optional[int]
    gpus: int
    nnodes: int
    precision: str
    digest: str
    hardware: str


@dataclass(frozen=True)
class PointEntry:
    series: SeriesEntry
    metric: str
    value: float
    spread: Optional[float]
    repeats: int


@dataclass(frozen=True)
class PredictionEntry:
    series_key: str
    metric: str
    predicted: float
    low: Optional[float]
    high: Optional[float]


@dataclass(frozen=True)
class RunEntry:
    """One run as it goes into the store."""

    identity: str
    experiment: str
    kind: str
    started_at: str
    hardware: str
    attributes: Dict[str, Any]
    source: str
    points: List[PointEntry] = field(default_factory=list)
    predictions: List[PredictionEntry] = field(default_factory=list)


@dataclass(frozen=True)
class StoredPoint:
    """A point as read back, with its run's date and attributes."""

    run_id: int
    started_at: str
    series_id: int
    metric: str
    value: float
    spread: Optional[float]
    repeats: int


def database_url(location: str) -> str:
    """A history location (a file path, ``sqlite:///...`` or ``postgresql://...``) as an
    SQLAlchemy URL; PostgreSQL is reached through psycopg 3."""
    if location.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + location.split("://", 1)[1]
    if location.startswith("postgresql+psycopg://") or location.startswith("sqlite:///"):
        return location
    if "://" in location:
        raise HistoryError(
            f"history location {location!r} is neither a file path, sqlite:///PATH nor "
            "postgresql://...: give one of those"
        )
    return "sqlite:///" + str(Path(location).expanduser().absolute())


def _sqlite_file(url: str) -> Optional[Path]:
    rest = url[len("sqlite:///") :]
    return Path(rest) if url.startswith("sqlite:///") and rest not in ("", ":memory:") else None


def _wal(cursor: Any) -> None:
    """Switch to WAL. The switch takes the file's lock without SQLite's busy handler on some
    builds, so several first opens at once can see "database is locked": wait as the busy
    timeout would."""
    import sqlite3
    import time

    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    delay = 0.01
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


def _engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = _sqlite_file(url)
        if path is not None:
            if path.is_symlink():
                raise HistoryError(f"history file {path} is a symbolic link: give the file itself")
            if not path.parent.is_dir():
                raise HistoryError(
                    f"history file {path}: folder {path.parent} does not exist; create it first"
                )
        engine = sa.create_engine(
            url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "isolation_level": None}
        )

        @sa.event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            _wal(cursor)
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        @sa.event.listens_for(engine, "begin")
        def _on_begin(connection: Connection) -> None:
            # Take the write lock up front: two writers never deadlock upgrading a read lock.
            connection.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise HistoryError(
            "a PostgreSQL history needs psycopg 3: pip install 'torchscale[history]'"
        ) from None
    return sa.create_engine(url, pool_pre_ping=True)


COPY_CHUNK = 50_000
"""Rows formatted and sent to PostgreSQL's COPY at a time."""
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_field(value: Any) -> str:
    """One field in COPY's text format: NULL as \\N, text with its backslash, tab and line
    breaks escaped, a number as Python writes it back exactly."""
    if value is None:
        return "\\N"
    if isinstance(value, str):
        return value.translate(_COPY_ESCAPES)
    if isinstance(value, float):
        return repr(float(value))
    return str(int(value))


def _copy_text(rows: Sequence[Tuple[Any, ...]]) -> str:
    """``rows`` in COPY's text format, a column at a time: a column of plain ints, floats or
    strings is formatted by a builtin over the whole column, not a call per field (what
    psycopg's ``write_row`` costs, a third of a bulk ingest)."""
    formatted: List[Any] = []
    for column in zip(*rows):
        kinds = set(map(type, column))
        if kinds == {int}:
            formatted.append(map(str, column))
        elif kinds == {float}:
            formatted.append(map(float.__repr__, column))
        elif kinds == {str}:
            # a column of text repeats a few values (the metric): each is escaped once
            escaped = {value: value.translate(_COPY_ESCAPES) for value in set(column)}
            formatted.append(map(escaped.__getitem__, column))
        else:
            formatted.append(map(_copy_field, column))
    return "\n".join(map("\t".join, zip(*formatted))) + "\n"


def _now() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class HistoryStore:
    """The store at one location, its schema brought up to :data:`SCHEMA_VERSION` on open."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.url = database_url(location)
        self.dialect = "sqlite" if self.url.startswith("sqlite") else "postgresql"
        try:
            self.engine = _engine(self.url)
            self._migrate()
        except sa.exc.OperationalError as exc:
            first = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            raise HistoryError(
                f"cannot open the history at {self.shown}: {first}; check the path or URL"
            ) from None
        except sa.exc.DatabaseError as exc:
            raise HistoryError(
                f"{self.shown} is not a torchscale history ({type(exc.orig).__name__}); give "
                "a new file or the history's own"
            ) from None

    @property
    def shown(self) -> str:
        """The location without a password."""
        return sa.engine.make_url(self.url).render_as_string(hide_password=True)

    def close(self) -> None:
        self.engine.dispose()

    def _migrate(self) -> None:
        with self.engine.begin() as connection:
            if self.dialect == "postgresql":
                # Two first opens at once: one migrates, the other waits and finds it done.
                lock = sa.text("SELECT pg_advisory_xact_lock(:key)")
                connection.execute(lock, {"key": MIGRATION_LOCK})
            schema_version.create(connection, checkfirst=True)
            done = {row[0] for row in connection.execute(sa.select(schema_version.c.version))}
            if done and max(done) > SCHEMA_VERSION:
                raise HistoryError(
                    f"the history at {self.shown} has schema {max(done)}, newer than this "
                    f"torchscale's {SCHEMA_VERSION}: upgrade torchscale"
                )
            for version, step in MIGRATIONS:
                if version in done:
                    continue
                step(connection)
                insert = self._insert(schema_version).on_conflict_do_nothing()
                connection.execute(insert.values(version=version, applied_at=_now()))

    def _insert(self, table: sa.Table) -> Any:
        if self.dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            return sqlite_insert(table)
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table)

    def add_run(self, run: RunEntry) -> bool:
        """Store ``run`` in one transaction; False when it was already there (idempotent)."""
        return self.add_runs([run]) == 1

    def add_runs(self, many: Sequence[RunEntry]) -> int:
        """Store ``many`` in one transaction (a night's folders, a bulk import); how many were
        new. A few statements whatever the count: the runs (their ids returned), the series
        they name, then every point."""
        if not many:
            return 0
        with self.engine.begin() as connection:
            return self._add_runs(connection, many)

    def _add_runs(self, connection: Connection, many: Sequence[RunEntry]) -> int:
        now = _now()
        # the same run twice in one batch (a folder named twice) is one run, as across batches
        first: Dict[str, RunEntry] = {}
        for run in many:
            first.setdefault(run.identity, run)
        many = list(first.values())
        rows = [
            {
                "identity": run.identity,
                "experiment": run.experiment,
                "kind": run.kind,
                "started_at": run.started_at,
                "hardware": run.hardware,
                "attributes": json.dumps(run.attributes, sort_keys=True),
                "source": run.source,
                "ingested_at": now,
            }
            for run in many
        ]
        new = (
            self._copy_runs(connection, rows)
            if self.dialect == "postgresql"
            else self._insert_runs(connection, rows)
        )
        fresh = [run for run in many if run.identity in new]
        ids = self._series_ids(
            connection, {p.series.key: p.series for run in fresh for p in run.points}
        )
        columns = ("run_id", "series_id", "metric", "value", "spread", "repeats")
        point_rows = [
            (new[run.identity], ids[p.series.key], p.metric, p.value, p.spread, p.repeats)
            for run in fresh
            for p in run.points
        ]
        self._bulk_insert(connection, points, columns, point_rows)
        columns = ("run_id", "series_key", "metric", "predicted", "low", "high")
        prediction_rows = [
            (new[run.identity], p.series_key, p.metric, p.predicted, p.low, p.high)
            for run in fresh
            for p in run.predictions
        ]
        self._bulk_insert(connection, predictions, columns, prediction_rows)
        return len(fresh)

    def _insert_runs(self, connection: Connection, rows: List[Dict[str, Any]]) -> Dict[str, int]:
        """The runs not stored yet, inserted: their identity -> id."""
        statement = (
            self._insert(runs)
            .on_conflict_do_nothing(index_elements=["identity"])
            .returning(runs.c.identity, runs.c.id)
        )
        new: Dict[str, int] = {}
        for start in range(0, len(rows), 1000):
            result = connection.execute(statement, rows[start : start + 1000])
            new.update({str(identity): int(run_id) for identity, run_id in result})
        return new

    def _copy_runs(self, connection: Connection, rows: List[Dict[str, Any]]) -> Dict[str, int]:
        """:meth:`_insert_runs` on PostgreSQL: the rows COPY into a table of this transaction,
        then one INSERT ... SELECT keeps the new ones, in their order (a statement of a thousand
        rows' parameters costs more to build and parse than the rows to send)."""
        names = [column.name for column in runs.c if column.name != "id"]
        columns = ", ".join(f"{name} text" for name in names)
        connection.execute(
            sa.text(f"CREATE TEMPORARY TABLE runs_incoming ({columns}, ord integer) ON COMMIT DROP")
        )
        incoming = sa.table("runs_incoming", *(sa.column(n) for n in [*names, "ord"]))
        values = [(*(row[name] for name in names), index) for index, row in enumerate(rows)]
        self._bulk_insert(connection, incoming, [*names, "ord"], values)
        listed = ", ".join(names)
        result = connection.execute(
            sa.text(
                f"INSERT INTO runs ({listed}) SELECT {listed} FROM runs_incoming ORDER BY ord "
                "ON CONFLICT (identity) DO NOTHING RETURNING identity, id"
            )
        )
        found = {str(identity): int(run_id) for identity, run_id in result}
        connection.execute(sa.text("DROP TABLE runs_incoming"))
        return found

    def _bulk_insert(
        self,
        connection: Connection,
        table: sa.TableClause,
        columns: Sequence[str],
        rows: Sequence[Tuple[Any, ...]],
    ) -> None:
        """Many rows at the driver's speed, in ``connection``'s transaction: SQLite's
        ``executemany`` of one prepared statement over plain tuples, PostgreSQL's ``COPY``. The
        table and column names are this module's own; every value is a bound parameter (or a
        COPY field) as with SQLAlchemy's statements, only without its per-row work."""
        if not rows:
            return
        names = ", ".join(table.c[column].name for column in columns)
        raw: Any = connection.connection.dbapi_connection
        cursor = raw.cursor()
        try:
            if self.dialect == "postgresql":
                with cursor.copy(f"COPY {table.name} ({names}) FROM STDIN") as copy:
                    for start in range(0, len(rows), COPY_CHUNK):
                        copy.write(_copy_text(rows[start : start + COPY_CHUNK]))
            else:
                marks = ", ".join("?" for _ in columns)
                cursor.executemany(f"INSERT INTO {table.name} ({names}) VALUES ({marks})", rows)
        finally:
            cursor.close()

    def _series_ids(self, connection: Connection, wanted: Dict[str, SeriesEntry]) -> Dict[str, int]:
        if not wanted:
            return {}
        keys = sorted(wanted)
        rows = [
            {
                "key": s.key,
                "kind": s.kind,
                "name": s.name,
                "batch": s.batch,
                "gpus": s.gpus,
                "nnodes": s.nnodes,
                "precision": s.precision,
                "digest": s.digest,
                "hardware": s.hardware,
            }
            for s in (wanted[key] for key in keys)
        ]
        connection.execute(
            self._insert(series).on_conflict_do_nothing(index_elements=["key"]), rows
        )
        found: Dict[str, int] = {}
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            query = sa.select(series.c.key, series.c.id).where(series.c.key.in_(chunk))
            found.update({str(k): int(i) for k, i in connection.execute(query)})
        return found

    # --- reading -------------------------------------------------------------------------------
    def run_count(self) -> int:
        with self.engine.connect() as connection:
            count = sa.select(sa.func.count()).select_from(runs)
            return int(connection.execute(count).scalar_one())

    def runs(self, since: Optional[str] = None) -> List[Dict[str, Any]]:
        """Every run (oldest first), its attributes parsed."""
        query = sa.select(runs).order_by(runs.c.started_at, runs.c.id)
        if since is not None:
            query = query.where(runs.c.started_at >= since)
        with self.engine.connect() as connection:
            found = [dict(row._mapping) for row in connection.execute(query)]
        for row in found:
            row["attributes"] = json.loads(row["attributes"])
        return found

    def all_series(self) -> List[SeriesEntry]:
        query = sa.select(series).order_by(series.c.id)
        with self.engine.connect() as connection:
            return [
                SeriesEntry(
                    key=r.key,
                    kind=r.kind,
                    name=r.name,
                    batch=r.batch,
                    gpus=r.gpus,
                    nnodes=r.nnodes,
                    precision=r.precision,
                    digest=r.digest,
                    hardware=r.hardware,
                )
                for r in connection.execute(query)
            ]

    def series_ids(self) -> Dict[int, str]:
        with self.engine.connect() as connection:
            query = sa.select(series.c.id, series.c.key)
            return {int(i): str(k) for i, k in connection.execute(query)}

    def metrics(self, kind: str) -> List[str]:
        """The metrics that series of ``kind`` hold points of (validate: its probes)."""
        query = (
            sa.select(points.c.metric)
            .distinct()
            .join(series, series.c.id == points.c.series_id)
            .where(series.c.kind == kind)
            .order_by(points.c.metric)
        )
        with self.engine.connect() as connection:
            return [str(row[0]) for row in connection.execute(query)]

    def point_columns(self, metric: str) -> Tuple[Any, Any, Any]:
        """Every point of ``metric`` as three numpy columns (series id, run id, value), in no
        order: one plain query, no join or sort in the database (change detection orders them
        by run date with numpy, from :meth:`runs`)."""
        import numpy as np

        query = sa.select(points.c.series_id, points.c.run_id, points.c.value).where(
            points.c.metric == metric
        )
        with self.engine.connect() as connection:
            rows = connection.execute(query).cursor.fetchall()
        if not rows:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, np.zeros(0)
        table = np.array(rows, dtype=np.float64)
        return table[:, 0].astype(np.int64), table[:, 1].astype(np.int64), table[:, 2]

    def points(self, metric: str, since: Optional[str] = None) -> Iterator[StoredPoint]:
        """Every point of ``metric``, by series then by run date (oldest first)."""
        query = (
            sa.select(
                points.c.run_id,
                runs.c.started_at,
                points.c.series_id,
                points.c.metric,
                points.c.value,
                points.c.spread,
                points.c.repeats,
            )
            .join(runs, runs.c.id == points.c.run_id)
            .where(points.c.metric == metric)
            .order_by(points.c.series_id, runs.c.started_at, runs.c.id)
        )
        if since is not None:
            query = query.where(runs.c.started_at >= since)
        with self.engine.connect() as connection:
            # the driver's own fetchall: SQLAlchemy's row objects cost more than the query
            rows = connection.execute(query).cursor.fetchall()
        for row in rows:
            yield StoredPoint(*row)

    def predictions(self) -> List[Dict[str, Any]]:
        query = (
            sa.select(predictions, runs.c.started_at, runs.c.experiment)
            .join(runs, runs.c.id == predictions.c.run_id)
            .order_by(runs.c.started_at, predictions.c.id)
        )
        with self.engine.connect() as connection:
            return [dict(row._mapping) for row in connection.execute(query)]
