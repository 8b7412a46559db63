"""The performance history: the store on SQLite and on a real PostgreSQL server, ingest
(idempotent, concurrent, damaged folders refused), change points with their cause, the views."""

from __future__ import annotations

import json
import math
import shutil
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Dict, Iterator, List

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.support.environ import REPO
from tests.support.postgres_server import Server, postgres_server
from torchscale.cli.app import app
from torchscale.history.changes import change_points
from torchscale.history.database import HistoryStore, PointEntry, RunEntry
from torchscale.history.ingest import read_run
from torchscale.history.series_changes import find_changes

DATA = Path(__file__).parent / "data" / "compare_unchanged"
BEFORE, AFTER = DATA / "before" / "cpu_smoke", DATA / "after" / "cpu_smoke"


@pytest.fixture(scope="session")
def postgres() -> Iterator[Server]:
    yield from postgres_server()


_DATABASES = iter(range(1, 10_000))


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty history: an SQLite file, or a new database on the test server."""
    if request.param == "sqlite":
        return str(tmp_path / "history.db")
    import psycopg
    from psycopg import sql

    server: Server = request.getfixturevalue("postgres")
    name = f"h{next(_DATABASES)}"
    with psycopg.connect(server.url, autocommit=True) as connection:
        connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return server.url.rsplit("/", 1)[0] + "/" + name


def _copy_run(source: Path, target: Path, created_at: str, **environment: object) -> Path:
    """A copy of a real run folder as another run: another creation date (its identity), and
    ``environment`` changed (an NCCL upgrade)."""
    shutil.copytree(source, target)
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["created_at"] = created_at
    manifest["environment"].update(environment)
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


def test_the_same_folder_twice_is_one_run(location: str) -> None:
    runner = CliRunner()
    args = ["history", "ingest", str(BEFORE), str(AFTER), "--history", location, "--json"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert len(json.loads(first.stdout)["added"]) == 2
    again = runner.invoke(app, args)
    assert json.loads(again.stdout) | {"history": ""} == {
        "history": "",
        "added": [],
        "already": [str(BEFORE), str(AFTER)],
    }
    store = HistoryStore(location)
    assert store.run_count() == 2
    # four cells (two models x 1 and 2 ranks), each with throughput and p95, repeats averaged
    points = list(store.points("throughput"))
    assert len(points) == 8 and {p.repeats for p in points} == {2}
    recorded = [json.loads(line) for line in (BEFORE / "results.jsonl").read_text().splitlines()]
    gpt2 = [r["throughput"] for r in recorded if r["cell_id"].startswith("gpt2-tiny-b8-g1")]
    assert any(math.isclose(p.value, sum(gpt2) / 2) for p in points)

    # scaling efficiency, the report's figure: the 2-rank cell against its 1-rank baseline
    def mean(model: str, ranks: int) -> float:
        rates = [
            r["throughput"] for r in recorded if r["cell_id"].startswith(f"{model}-b8-g{ranks}")
        ]
        return sum(rates) / len(rates)

    (before,) = [r["id"] for r in store.runs() if r["source"] == str(BEFORE)]
    entries = {e.key: e for e in store.all_series()}
    named = {
        s_id: (entries[key].name, entries[key].gpus) for s_id, key in store.series_ids().items()
    }
    efficiency = {
        named[p.series_id]: p.value for p in store.points("efficiency") if p.run_id == before
    }
    assert efficiency == {
        ("gpt2-tiny", 1): pytest.approx(1.0),
        ("gpt2-tiny", 2): pytest.approx(mean("gpt2-tiny", 2) / (2 * mean("gpt2-tiny", 1))),
        ("resnet-tiny", 1): pytest.approx(1.0),
        ("resnet-tiny", 2): pytest.approx(mean("resnet-tiny", 2) / (2 * mean("resnet-tiny", 1))),
    }
    searched = runner.invoke(
        app, ["history", "changes", "--metric", "efficiency", "--history", location, "--json"]
    )
    assert searched.exit_code == 0, searched.output
    assert json.loads(searched.stdout)["metric"] == "efficiency"
    runs = store.runs()
    assert runs[0]["attributes"]["torch"] == "2.14.1+cu130"
    assert runs[0]["hardware"] == "CPU process (x86_64) x1 x1 nodes"
    store.close()


def test_two_ingests_at_once_both_land(location: str, tmp_path: Path) -> None:
    folders = [
        _copy_run(BEFORE, tmp_path / f"run{i}", f"2026-11-2{i}T00:00:00+00:00") for i in range(6)
    ]
    barrier = threading.Barrier(len(folders))
    errors: List[BaseException] = []

    def ingest(folder: Path) -> None:
        try:
            entry = read_run(folder)
            barrier.wait(timeout=60)
            store = HistoryStore(location)  # first opens at once too: the schema is made once
            store.add_run(entry)
            store.close()
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=ingest, args=(f,)) for f in folders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    store = HistoryStore(location)
    assert store.run_count() == 6
    # every run has its four cells' throughput: nothing half-written, one series per cell
    assert len(list(store.points("throughput"))) == 24
    assert len(store.series_ids()) == 4
    store.close()


def test_two_runs_created_in_one_second_are_two_runs(tmp_path: Path) -> None:
    from torchscale.config.loader import load_config
    from torchscale.launch.sweep import build_manifest
    from torchscale.plan.matrix import expand

    plan = expand(load_config(REPO / "examples" / "cpu_smoke.yaml"))
    created = [build_manifest(plan, {}, ["torchscale"])["created_at"] for _ in range(2)]
    # two runs of one experiment on one host inside one second: the creation times still differ
    assert created[0] != created[1]
    assert all(c.count(".") == 1 for c in created)  # to the microsecond
    folders = [
        _copy_run(BEFORE, tmp_path / f"run{i}", f"2026-11-27T10:00:00.00000{i}+00:00")
        for i in range(2)
    ]
    store = HistoryStore(str(tmp_path / "history.db"))
    for folder in folders:
        store.add_run(read_run(folder))
    assert store.run_count() == 2
    store.close()


def test_a_damaged_or_foreign_folder_is_refused_and_nothing_written(
    location: str, tmp_path: Path
) -> None:
    damaged = _copy_run(BEFORE, tmp_path / "damaged", "2026-11-01T00:00:00+00:00")
    with (damaged / "results.jsonl").open("a") as handle:
        handle.write('{"kind": "training", "cell_id": \n')
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not results")
    runner = CliRunner()
    for folder, why in ((damaged, "damaged"), (foreign, "no manifest.json")):
        # the good folder first: it must not land either
        result = runner.invoke(
            app, ["history", "ingest", str(AFTER), str(folder), "--history", location]
        )
        assert result.exit_code == 2
        assert why in result.output and "not a torchscale experiment folder" in result.output
        assert "Traceback" not in result.output
    store = HistoryStore(location)
    assert store.run_count() == 0
    store.close()


def test_a_location_that_is_not_a_history_is_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 100)
    result = CliRunner().invoke(app, ["history", "changes", "--history", str(junk)])
    assert result.exit_code == 2
    assert "is not a torchscale history" in result.output
    result = CliRunner().invoke(app, ["history", "show"], env={"TORCHSCALE_HISTORY": ""})
    assert result.exit_code == 2 and "no history given" in result.output


# --- simulated nightly series, built from a real run's records -----------------------------------


def _measured_spread() -> float:
    """The run-to-run standard deviation of log throughput on this machine: two unchanged runs
    of four cells with two repeats each (the recorded fixture), pooled over the cells."""
    groups: Dict[str, List[float]] = {}
    for folder in (BEFORE, AFTER):
        for line in (folder / "results.jsonl").read_text().splitlines():
            record = json.loads(line)
            cell = record["cell_id"].rsplit("-", 1)[1]  # the settings digest: repeats share it
            groups.setdefault(cell, []).append(math.log(record["throughput"]))
    squares = sum(((np.array(v) - np.mean(v)) ** 2).sum() for v in groups.values())
    return math.sqrt(squares / sum(len(v) - 1 for v in groups.values()))


NIGHT_ONE = datetime(2026, 9, 1, 2, tzinfo=timezone.utc)
NIGHTLY_REPEATS = 4
"""Repeats per nightly run (``repeats: 4``): a point is their mean, so its noise is the measured
spread / 2."""


def nightly_series(
    seed: int, runs: int = 60, step_at: int = 40, step: float = 0.08
) -> List[RunEntry]:
    """``runs`` nightly runs of the real run's cells, the noise drawn at the measured spread,
    throughput ``step`` lower from run ``step_at`` (1-based) on, where NCCL is upgraded too."""
    base = read_run(BEFORE)
    sigma = _measured_spread() / math.sqrt(NIGHTLY_REPEATS)
    rng = np.random.default_rng(seed)
    entries = []
    for night in range(1, runs + 1):
        slower = night >= step_at
        points = [
            PointEntry(
                p.series,
                p.metric,
                p.value * math.exp(sigma * rng.standard_normal()) * ((1 - step) if slower else 1),
                p.spread,
                NIGHTLY_REPEATS,
            )
            for p in base.points
            if p.metric == "throughput"
        ]
        attributes = {**base.attributes, "nccl": "2.28.9" if slower else "2.27.3"}
        entries.append(
            RunEntry(
                identity=f"night-{seed}-{night}",
                experiment="nightly",
                kind="benchmark",
                started_at=(NIGHT_ONE + timedelta(days=night)).isoformat(),
                hardware=base.hardware,
                attributes=attributes,
                source="simulated",
                points=points,
            )
        )
    return entries


def test_a_planted_slowdown_is_one_change_naming_the_nccl_upgrade(location: str) -> None:
    store = HistoryStore(location)
    assert store.add_runs(nightly_series(seed=1)) == 60
    changes = find_changes(store, "throughput")
    # each of the four cells' series: exactly one change, at run 40, naming the upgrade
    assert len({c.series.key for c in changes}) == len(changes) == 4
    for change in changes:
        assert change.position == 40 and change.runs_after == 21
        assert change.cause == ["NCCL 2.27.3 → 2.28.9"]
        assert change.regression and change.open and change.pvalue < 0.0005
        assert change.before_half_width > 0 and change.after_half_width > 0
        assert -0.12 < change.magnitude < -0.04
    store.close()
    # the gate: exit 1 while the regression is open, and the JSON says which
    result = CliRunner().invoke(
        app, ["history", "changes", "--history", location, "--fail-on-regression", "--json"]
    )
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert document["open_regressions"] == 4
    assert all(
        c["position"] == 40 and c["cause"] == ["NCCL 2.27.3 → 2.28.9"] for c in document["changes"]
    )
    # --since: from a date, the series start there (night 30), so the change is their 11th run
    runner = CliRunner()
    since = ["history", "changes", "--history", location, "--json", "--since"]
    dated = json.loads(runner.invoke(app, [*since, "2026-10-01"]).stdout)["changes"]
    assert len(dated) == 4 and {c["position"] for c in dated} == {11}
    # a duration back from now: only the nights of the last 30 days are searched and shown
    recent = sum(
        NIGHT_ONE + timedelta(days=night) >= datetime.now(timezone.utc) - timedelta(days=30)
        for night in range(1, 61)
    )
    shown = runner.invoke(
        app, ["history", "show", "--history", location, "--json", "--since", "30d"]
    )
    assert len(json.loads(shown.stdout)["runs"]) == recent
    assert json.loads(runner.invoke(app, [*since, "30d"]).stdout)["changes"] == []
    refused = runner.invoke(app, [*since, "a month"])
    assert (
        refused.exit_code == 2 and "neither a duration (30d, 12h, 2w) nor a date" in refused.output
    )


def test_unchanged_series_rarely_raise_a_false_alarm() -> None:
    """200 series of 60 unchanged runs at the measured noise: the false-alarm rate (goal: at most
    1% of series; docs/history.md states the figure measured on 2,000)."""
    sigma = _measured_spread()
    rng = np.random.default_rng(11)
    alarms = sum(
        bool(change_points(np.exp(sigma * rng.standard_normal(60)).tolist())) for _ in range(200)
    )
    assert alarms <= 2


def test_a_short_history_finds_a_large_step_by_default_and_rarely_a_false_one() -> None:
    """Six runs, three each side: the default tests the one possible split at 1% (not the
    0.05% long series need), so unchanged six-run series alarm at most about 1% of the time and
    a 23% drop (a 30% slower step) at 5% run-to-run noise is found at the fourth run."""
    from torchscale.history.changes import MAX_PVALUE, default_pvalue

    assert default_pvalue(6) == 0.01 and default_pvalue(60) == MAX_PVALUE
    assert default_pvalue(40) == MAX_PVALUE and MAX_PVALUE < default_pvalue(12) < 0.01
    rng = np.random.default_rng(5)
    alarms = sum(
        bool(change_points(np.exp(0.05 * rng.standard_normal(6)).tolist())) for _ in range(2000)
    )
    assert alarms <= 30  # 1% of 2000 is 20, with room for the draw (sd about 4.5)
    found = 0
    for _ in range(200):
        x = np.exp(0.05 * rng.standard_normal(6))
        x[3:] *= 1 / 1.3
        found += [split.at + 1 for split in change_points(x.tolist())] == [4]
    assert found >= 150
    # a p-value the caller gives is used as it is
    x = np.exp(0.05 * rng.standard_normal(6))
    x[3:] *= 1 / 1.3
    assert change_points(x.tolist(), max_pvalue=1e-9) == []


def test_the_show_table_reads_at_80_columns(location: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchscale.cli import console

    for shown in (console.err_console, console.result_console):
        monkeypatch.setattr(shown, "width", 80)
    store = HistoryStore(location)
    store.add_runs(nightly_series(seed=3, runs=6, step_at=6))
    store.close()
    result = CliRunner().invoke(app, ["history", "show", "--history", location])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "6 run(s)" in result.output and "nightly" in result.output
    assert "…" not in result.output and "NCCL 2.28.9" in result.output
    document = json.loads(
        CliRunner().invoke(app, ["history", "show", "--history", location, "--json"]).stdout
    )
    assert [r["attributes"]["nccl"] for r in document["runs"]] == ["2.27.3"] * 5 + ["2.28.9"]


def test_the_planted_slowdown_is_placed_within_a_run_of_the_change() -> None:
    """At the measured noise the change is placed exactly at run 40 in most series and within a
    run of it in almost all (docs/history.md states the rates measured on 2,000 series)."""
    sigma = _measured_spread() / math.sqrt(NIGHTLY_REPEATS)
    rng = np.random.default_rng(5)
    exact = near = 0
    for _ in range(100):
        x = np.exp(sigma * rng.standard_normal(60))
        x[39:] *= 0.92
        found = [split.at + 1 for split in change_points(x.tolist())]
        exact += found == [40]
        near += len(found) == 1 and abs(found[0] - 40) <= 1
    assert exact >= 60 and near >= 85


def test_exports_for_bencher_and_otava(tmp_path: Path) -> None:
    import csv

    location = str(tmp_path / "history.db")
    store = HistoryStore(location)
    store.add_runs(nightly_series(seed=1))
    last = list(store.points("throughput"))[-1]
    store.close()
    runner = CliRunner()
    bmf_file, csv_file = tmp_path / "bmf.json", tmp_path / "otava.csv"
    args = ["history", "export", "--history", location, "-o"]
    assert runner.invoke(app, [*args, str(bmf_file), "--format", "bmf"]).exit_code == 0
    document = json.loads(bmf_file.read_text())
    assert len(document) == 4  # the four cells' series of the latest run
    assert {"value": last.value} in [m["throughput"] for m in document.values()]
    assert runner.invoke(app, [*args, str(csv_file)]).exit_code == 0
    rows = list(csv.DictReader(csv_file.open()))
    assert len(rows) == 60
    assert [r["nccl"] for r in rows[38:40]] == ["2.27.3", "2.28.9"]
    column = next(
        c for c in rows[0] if c.startswith("gpt2-tiny b8 x1 fp32") and c.endswith("throughput")
    )
    before = np.mean([float(r[column]) for r in rows[:39]])
    after = np.mean([float(r[column]) for r in rows[39:]])
    assert 0.86 < after / before < 0.98


def test_the_change_points_agree_with_apache_otava() -> None:
    """Otava 0.8's change points for the same series (4 with the planted step, 40 unchanged),
    recorded once in a throwaway virtualenv (tests/data/otava_reference/record.py), at Otava's
    own window and p-value: the same in 42 of 44 series; where they differ, Otava placed the
    planted change one run earlier and raised one false alarm that this search does not."""
    reference = json.loads(
        (Path(__file__).parent / "data" / "otava_reference" / "reference.json").read_text()
    )
    assert reference["otava"].startswith("0.8")
    ours = {
        name: [
            split.at
            for split in change_points(
                values, max_pvalue=reference["max_pvalue"], window=reference["window_len"]
            )
        ]
        for name, values in reference["series"].items()
    }
    theirs = reference["change_points"]
    differ = {name: (ours[name], theirs[name]) for name in ours if ours[name] != theirs[name]}
    assert differ == {"resnet-tiny x1": ([39], [38]), "unchanged 32": ([], [37])}
    planted = [name for name in ours if not name.startswith("unchanged")]
    assert all(
        len(ours[n]) == len(theirs[n]) == 1 and abs(ours[n][0] - theirs[n][0]) <= 1 for n in planted
    )


# --- validate's figures: a series per node and device, a probe a metric ----------------------

NODE_B_SLOWS_AT = 8


def validate_nights(root: Path, nights: int = 12, seed: int = 3) -> List[Path]:
    """``nights`` output folders, each with what ``validate --level 2`` keeps on two nodes
    (``validate/host-<host>.json``, written by validate's own ``save_record`` from its own
    figures); the last night's fleet check also wrote ``fleet.json`` holding both reports.
    From night 8 node-b copies memory 20% slower and launches kernels 30% slower."""
    from torchscale.results.files import atomic_write_json
    from torchscale.results.layout import FLEET_REPORT, VALIDATE_DIR
    from torchscale.validate.levels import save_record
    from torchscale.validate.probe_timing import Figure

    rng = np.random.default_rng(seed)
    base = {"gemm_fp32": 60.0, "memory_copy": 9.0, "launch_latency": 4.0}
    folders = []
    for night in range(1, nights + 1):
        folder = root / f"night-{night:02d}"
        reports = []
        for offset, host in enumerate(("node-a", "node-b")):
            slow = host == "node-b" and night >= NODE_B_SLOWS_AT
            scale = {"memory_copy": 0.8, "launch_latency": 1.3} if slow else {}
            figures = []
            for probe, value in base.items():
                samples = tuple(
                    value * scale.get(probe, 1.0) * math.exp(0.01 * rng.standard_normal())
                    for _ in range(3)
                )
                figures.append(Figure(probe, "CPU 0", float(np.mean(samples)), "cpu", samples))
            when = NIGHT_ONE + timedelta(days=night, minutes=5 * offset)
            report = {"host": host, "time": when.isoformat(timespec="seconds"), "level": 2,
                      "torchscale": "0.1.0", "probes": [f.to_dict() for f in figures]}  # fmt: skip
            save_record(report, folder)
            reports.append(report)
        if night == nights:
            atomic_write_json(folder / VALIDATE_DIR / FLEET_REPORT, {"reports": reports})
        folders.append(folder)
    return folders


def test_validate_figures_are_series_per_node_and_a_probe_is_a_metric(
    location: str, tmp_path: Path
) -> None:
    folders = validate_nights(tmp_path / "out")
    runner = CliRunner()
    args = ["history", "ingest", *map(str, folders), "--history", location, "--json"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    # 12 nights x 2 nodes; the fleet report's copies of the last night's records are no more
    assert len(json.loads(first.stdout)["added"]) == 24
    again = json.loads(runner.invoke(app, args).stdout)
    assert (len(again["added"]), len(again["already"])) == (0, 24)
    store = HistoryStore(location)
    validate = [s for s in store.all_series() if s.kind == "validate"]
    assert sorted(s.name for s in validate) == ["node-a CPU 0", "node-b CPU 0"]
    assert store.metrics("validate") == ["gemm_fp32", "launch_latency", "memory_copy"]
    store.close()

    def changes(metric: str) -> List[Dict[str, object]]:
        result = runner.invoke(
            app, ["history", "changes", "--history", location, "--metric", metric, "--json",
                  "--max-pvalue", "0.001"]
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        found: List[Dict[str, object]] = json.loads(result.stdout)["changes"]
        return found

    # node-b's memory copy slowed (higher is better) and its launch latency grew (lower is
    # better): each one regression at night 8, on node-b only; its GEMM did not change
    for metric, magnitude in (("memory_copy", -0.2), ("launch_latency", 0.3)):
        (change,) = changes(metric)
        assert change["name"] == "node-b CPU 0" and change["position"] == NODE_B_SLOWS_AT
        assert change["regression"] is True and change["open"] is True
        assert change["magnitude"] == pytest.approx(magnitude, abs=0.03)
    assert changes("gemm_fp32") == []
    wrong = runner.invoke(app, ["history", "changes", "--history", location, "--metric", "gemm"])
    assert wrong.exit_code == 2
    assert "'gemm' is not one of" in wrong.output and "memory_copy" in wrong.output


def test_a_damaged_validate_record_is_refused_and_nothing_written(tmp_path: Path) -> None:
    from torchscale.results.layout import VALIDATE_DIR

    location = str(tmp_path / "history.db")
    (folder,) = validate_nights(tmp_path / "out", nights=1)
    (folder / VALIDATE_DIR / "host-node-c.json").write_text('{"host": "node-c", "probes": [')
    result = CliRunner().invoke(app, ["history", "ingest", str(folder), "--history", location])
    assert result.exit_code == 2
    assert "host-node-c.json" in result.output and "is not a torchscale" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not Path(location).exists()  # everything read and checked before the store opens


def test_a_schema_1_store_is_migrated_with_its_points_kept(location: str) -> None:
    """Schema 2 drops the points' foreign keys (a trigger per point on bulk ingest): a store
    made by schema 1, with a run in it, opens at schema 2 with every point kept."""
    import sqlalchemy as sa

    from torchscale.history import database

    engine = sa.create_engine(database.database_url(location))
    with engine.begin() as connection:
        database.schema_version.create(connection)
        database._create_v1(connection)
        connection.execute(database.schema_version.insert().values(version=1, applied_at="x"))
        run_id = connection.execute(  # type: ignore[index]  # an insert has its key
            database.runs.insert().values(
                identity="r1", experiment="nightly", kind="benchmark",
                started_at="2026-11-01T00:00:00+00:00", hardware="h", attributes="{}",
                source="s", ingested_at="2026-11-01T00:00:00+00:00",
            )
        ).inserted_primary_key[0]  # fmt: skip
        series_id = connection.execute(  # type: ignore[index]  # an insert has its key
            database.series.insert().values(
                key="k", kind="training", name="m", batch=8, gpus=2, nnodes=1,
                precision="fp32", digest="d", hardware="h",
            )
        ).inserted_primary_key[0]  # fmt: skip
        connection.execute(
            database.points.insert().values(
                run_id=run_id,
                series_id=series_id,
                metric="throughput",
                value=123.5,
                spread=0.02,
                repeats=2,
            )
        )
    assert sa.inspect(engine).get_foreign_keys("points")  # schema 1 had them
    engine.dispose()
    store = HistoryStore(location)
    with store.engine.connect() as connection:
        versions = connection.execute(sa.select(database.schema_version.c.version)).scalars()
        assert sorted(versions) == [1, 2]
    assert sa.inspect(store.engine).get_foreign_keys("points") == []
    (point,) = store.points("throughput")
    assert (point.run_id, point.series_id, point.value, point.spread, point.repeats) == (
        run_id, series_id, 123.5, 0.02, 2,
    )  # fmt: skip
    # the migrated store takes new runs as a fresh one does
    assert store.add_run(read_run(BEFORE))
    assert len(list(store.points("throughput"))) == 1 + 4
    store.close()


def test_names_with_tabs_newlines_and_backslashes_round_trip(location: str) -> None:
    """PostgreSQL's bulk path writes COPY's text format itself: a name with its special
    characters, a missing spread and a numpy figure come back as they went in."""
    from torchscale.history.database import SeriesEntry

    odd = "exp\tone\\two\nthree\r\\N"
    series = SeriesEntry("k" * 32, "training", odd, None, 2, 1, "fp32", "d", "h")
    run = RunEntry(
        identity="odd", experiment=odd, kind="benchmark", started_at="2026-11-01T00:00:00+00:00",
        hardware="h", attributes={"torch": odd}, source=odd,
        points=[PointEntry(series, "throughput", float(np.float64(0.1) * 3), None, 1)],
    )  # fmt: skip
    store = HistoryStore(location)
    assert store.add_runs([run, run]) == 1
    (stored,) = store.runs()
    assert (stored["experiment"], stored["source"], stored["attributes"]["torch"]) == (odd,) * 3
    (point,) = store.points("throughput")
    assert point.value == 0.1 * 3 and point.spread is None
    (entry,) = store.all_series()
    assert entry.name == odd and entry.batch is None
    store.close()
