"""Report analysis tables, comparison statistics and chart specs, on fixture results."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

from tests.support.report_fixtures import (
    MODELS,
    SCRIPT_NAME,
    FixtureSpec,
    training_record,
    write_experiment,
)
from torchscale.analysis import cells as cell_tables
from torchscale.analysis.bootstrap import MEAN, bootstrap_ratio, paired_rounds_interval
from torchscale.analysis.comparison import (
    IMPROVEMENT,
    REGRESSION,
    UNCHANGED,
    WITHIN_NOISE,
    CompareOptions,
    compare_runs,
)
from torchscale.analysis.findings import findings_table, normalize, record_findings
from torchscale.analysis.report_data import load_report_data
from torchscale.analysis.scaling import label_variants, scaling_curves
from torchscale.analysis.training_tables import training_table
from torchscale.app.report import report_content
from torchscale.comm.report_sections import (
    REPORT_COLLECTIVE_COLUMNS,
    bandwidth_charts,
    report_collectives,
)
from torchscale.comm.result_tables import collective_table
from torchscale.report.charts import cell_labels, comparison_charts
from torchscale.report.plotly_charts import figure, figures_json
from torchscale.report.svg_charts import nice_ticks, svg
from torchscale.results.schema import TrainingResult, parse_record


@pytest.fixture(scope="module")
def fixture_data(fixture_results: Path):
    return load_report_data(fixture_results)


def _ok(records):
    return [r for r in records if isinstance(r, TrainingResult) and r.status == "ok"]


def test_scaling_curves_follow_the_records(fixture_data) -> None:
    records = _ok(fixture_data.records)
    curves = scaling_curves(label_variants(training_table(fixture_data.records)))
    assert len(curves) == len(records)
    single = {(r.model, r.batch_size): r.throughput for r in records if r.world_size == 1}
    for record in records:
        row = curves[
            (curves["model"] == record.model)
            & (curves["variant"] == f"batch {record.batch_size}")
            & (curves["world_size"] == record.world_size)
        ].iloc[0]
        base = single[(record.model, record.batch_size)]
        assert row["throughput"] == pytest.approx(record.throughput)
        assert row["ideal_throughput"] == pytest.approx(record.world_size * base)
        assert row["scaling_efficiency"] == pytest.approx(
            record.throughput / (record.world_size * base)
        )


def test_variant_labels_name_the_knob_that_differs(fixture_data) -> None:
    base = _ok(fixture_data.records)[0]
    variants = []
    for index, bucket in enumerate((25.0, 50.0)):
        settings = json.loads(json.dumps(base.settings))
        settings["ddp"]["bucket_cap_mb"] = bucket
        variants.append(base.model_copy(update={"settings": settings, "cell_id": f"c{index}"}))
    labels = label_variants(training_table(variants))["variant"].tolist()
    batch = base.batch_size
    assert labels == [
        f"batch {batch} · ddp.bucket_cap_mb=25",  # as the config says it, not 25.0
        f"batch {batch} · ddp.bucket_cap_mb=50",
    ]


def test_pooled_latency_pools_every_run(tmp_path: Path) -> None:
    data = load_report_data(
        write_experiment(
            tmp_path,
            FixtureSpec(
                batch_sizes=(32,),
                gpu_counts=(1, 2),
                repeats=2,
                failures=False,
                collectives=False,
                findings=False,
            ),
        )
    )
    table = label_variants(training_table(data.records))
    pooled = cell_tables.pooled_latency_table(table, cell_tables.step_samples(data.records))
    assert len(pooled) == 4 and set(pooled["runs"]) == {2}
    for row in pooled.to_dict("records"):
        samples = np.concatenate(
            [
                r.step_times_ms
                for r in _ok(data.records)
                if r.model == row["model"] and r.world_size == row["world_size"]
            ]
        )
        assert row["steps"] == len(samples)
        assert row["p95"] == pytest.approx(np.percentile(samples, 95))
        assert row["mean"] == pytest.approx(samples.mean())


def test_rank_table_names_the_injected_straggler(fixture_data) -> None:
    ranks = cell_tables.rank_table(fixture_data.records)
    table = label_variants(training_table(fixture_data.records))
    pooled = cell_tables.pooled_rank_table(table, ranks)
    eight = pooled[(pooled["model"] == SCRIPT_NAME) & (pooled["world_size"] == 8)]
    straggler = FixtureSpec().straggler
    assert straggler is not None
    for _, group in eight.groupby("variant"):
        slowest = group.loc[group["sync_wait_ms"].idxmin(), "rank"]  # type: ignore[index]  # idxmin's label: pandas-stubs type it Hashable
        assert slowest == straggler[2]
        assert group[group["is_slowest"]]["rank"].tolist() == [slowest]


def test_memory_by_variant_takes_the_smallest_gpu_count(fixture_data) -> None:
    table = label_variants(training_table(fixture_data.records))
    memory = cell_tables.memory_by_variant(table, cell_tables.memory_table(fixture_data.records))
    assert set(memory["world_size"]) == {1}
    assert len(memory) == len(FixtureSpec().models) * len(FixtureSpec().batch_sizes)
    for row in memory.to_dict("records"):
        assert row["optimizer_bytes"] == 2 * row["params_bytes"]


def test_report_collectives_show_the_stored_peak_fraction() -> None:
    base = {"kind": "collective", "experiment": "e", "op": "all_reduce", "dtype": "float32",
            "world_size": 4, "nproc_per_node": 4}  # fmt: skip
    records = [
        parse_record(
            {
                **base,
                "cell_id": "comm-g4",
                "size_bytes": 1024,
                "time_us": 10.0,
                "algbw_gbps": 0.1024,
                "busbw_gbps": 0.1536,
                "link_peak_gbps": 300.0,
                "busbw_peak_fraction": 0.1536 / 300.0,
                "status": "ok",
                "future_field": [1, 2],
            }
        ),
        parse_record(
            {**base, "cell_id": "comm-g4", "status": "failed", "error": "3 wrong elements"}
        ),
        parse_record(_training_record("x")),
    ]
    table = report_collectives(collective_table(records))
    assert len(table) == 2
    ok = table[table["status"] == "ok"].iloc[0]
    assert ok["busbw_peak_fraction"] == pytest.approx(0.1536 / 300.0)
    assert ok["link_peak_gbps"] == 300.0
    assert table[table["status"] == "failed"]["error"].tolist() == ["3 wrong elements"]
    assert list(table.columns) == REPORT_COLLECTIVE_COLUMNS


def _training_record(model: str) -> dict:
    return {"kind": "training", "cell_id": "t", "experiment": "e", "status": "failed",
            "world_size": 1, "nproc_per_node": 1, "model": model, "batch_size": 1,
            "global_batch_size": 1, "precision": "fp32"}  # fmt: skip


def test_bandwidth_charts_keep_each_scope_a_series_of_its_own() -> None:
    def doc(scope: str, group: int, size: int, busbw: float) -> dict:
        return {
            "kind": "collective", "op": "all_reduce", "world_size": 16, "nnodes": 2,
            "cell_id": "comm-g16-n2", "experiment": "e", "nproc_per_node": 8, "dtype": "float32",
            "scope": scope, "group_size": group, "size_bytes": size, "time_us": 1.0,
            "algbw_gbps": busbw / 2, "busbw_gbps": busbw, "status": "ok",
        }  # fmt: skip

    docs = [doc("world", 16, s, 40.0) for s in (1024, 2048)]
    docs += [doc("intra_node", 8, s, 300.0) for s in (1024, 2048)]
    docs += [doc("inter_node", 2, s, 25.0) for s in (1024, 2048)]
    docs.append({k: v for k, v in doc("world", 16, 4096, 41.0).items() if k != "scope"})
    collectives = collective_table([parse_record(d) for d in docs])
    (chart,) = bandwidth_charts(report_collectives(collectives))
    busbw = {s.name: s.y for s in chart.series if s.name.startswith("busbw")}
    assert busbw == {
        "busbw, 16 GPUs": [40.0, 40.0, 41.0],  # a record from before scopes is the world
        "busbw, 16 GPUs, within nodes": [300.0, 300.0],
        "busbw, 16 GPUs, across 2 nodes": [25.0, 25.0],
    }


def test_failure_table_lists_every_kind_with_reasons(fixture_data) -> None:
    failures = cell_tables.failure_table(fixture_data.records)
    expected = {(r.kind, r.status, r.error) for r in fixture_data.records if r.status != "ok"}
    assert {"training", "collective"} <= {kind for kind, _, _ in expected}
    assert set(zip(failures["kind"], failures["status"], failures["reason"])) == expected
    assert {"oom", "failed", "skipped"} <= set(failures["status"])


def test_findings_read_defensively_and_sorted_by_severity(fixture_data) -> None:
    odd: List[Dict[str, Any]] = [
        {"message": "only a message", "rank": 2},
        {"severity": "CRITICAL", "title": "t", "message": "m", "ranks": [0, "x", 5.0]},
        {},
    ]
    found = [normalize(doc, "profile") for doc in odd]
    assert found[0]["title"] == "only a message" and found[0]["ranks"] == [2]
    # One vocabulary whoever wrote it: another tool's CRITICAL is high, its info low.
    assert found[1]["severity"] == "high" and found[1]["ranks"] == [0, 5]
    assert found[2]["severity"] == "low"
    from_records = record_findings(fixture_data.records)
    warned = [r for r in _ok(fixture_data.records) if r.sync and r.sync.warning]
    groups = {(r.model, r.sync.slowest_rank) for r in warned}
    assert len(from_records) == len(groups) > 0  # one finding per model and straggler
    for finding in from_records:
        cells = [r for r in warned if finding["title"].endswith(f": {r.model}")]
        for record in cells:
            assert f"batch {record.batch_size} on {record.world_size} GPUs" in finding["message"]
    straggler = FixtureSpec().straggler
    assert straggler is not None
    assert {tuple(f["ranks"]) for f in from_records} >= {(straggler[2],)}
    assert findings_table(found)["severity"].tolist()[0] == "high"
    # The findings card counts them by severity, in the one vocabulary: "2 high · 3 medium".
    content = report_content(fixture_data)
    (card,) = [c for c in content.cards if c.label == "Findings"]
    counts = Counter(str(f["severity"]) for f in content.findings)
    assert set(counts) <= {"high", "medium", "low"}
    assert counts["medium"] > 1 and counts["high"] > 1 and card.value == str(sum(counts.values()))
    shown = card.detail.split(" · ")
    assert f"{counts['medium']} medium" in shown and f"{counts['high']} high" in shown


def test_bootstrap_interval_tells_shift_from_noise() -> None:
    rng = np.random.default_rng(7)
    old: Any = rng.normal(100, 3, 40)  # an array, read as the Sequence[float] it is
    options = CompareOptions()
    ratio, low, high = bootstrap_ratio(old, old.copy(), MEAN, options)
    assert ratio == 1.0 and low < 1.0 < high
    ratio, low, high = bootstrap_ratio(old, old * 1.2, MEAN, options)
    assert ratio == pytest.approx(1.2) and 1.0 < low < 1.2 < high
    assert bootstrap_ratio(old, old * 1.2, MEAN, options) == (ratio, low, high)  # seeded


def test_paired_rounds_interval_sees_drift_between_rounds_that_pooled_steps_hide() -> None:
    rng = np.random.default_rng(1)
    steps = [rng.normal(10.0, 0.2, 20) for _ in range(6)]  # ms per step, 2% step noise
    # Three rounds; the host runs 20% slower in the second. The new setting is 10% faster within
    # each round (its step times 1/1.1 of the old ones of the same round).
    # arrays, read as the sequences of floats they are
    old: Any = [steps[0], steps[1] * 1.2, steps[2]]
    new: Any = [steps[3] / 1.1, steps[4] * 1.2 / 1.1, steps[5] / 1.1]
    gain, low, high = paired_rounds_interval(old, new, CompareOptions())
    assert gain == pytest.approx(10.0, abs=1.5) and 0.0 < low < gain < high
    # Rounds that disagree (+20%, -13%, +5%: drift between runs larger than any setting's
    # effect): the interval over rounds spans zero, though each round's own steps are tight.
    drifting: Any = [steps[3] / 1.2, steps[4] * 1.2 * 1.15, steps[5] / 1.05]
    gain, low, high = paired_rounds_interval(old, drifting, CompareOptions())
    assert low < 0.0 < high, (gain, low, high)
    assert all(
        bootstrap_ratio(o, n, MEAN, CompareOptions())[1] > 1.0
        or bootstrap_ratio(o, n, MEAN, CompareOptions())[2] < 1.0
        for o, n in zip(old, drifting)
    )  # each round alone is beyond its steps' noise, one way or the other
    # One round: the steps' bootstrap alone.
    one = paired_rounds_interval(old[:1], new[:1], CompareOptions())
    assert one[0] == pytest.approx(100 * (steps[0].mean() * 1.1 / steps[3].mean() - 1))
    with pytest.raises(ValueError):
        paired_rounds_interval(old, new[:2], CompareOptions())


def test_compare_verdicts(tmp_path: Path) -> None:
    def run(name: str, **kwargs):
        spec = FixtureSpec(
            name=name,
            batch_sizes=(32,),
            failures=False,
            collectives=False,
            findings=False,
            **kwargs,
        )
        return load_report_data(write_experiment(tmp_path / name, spec)).records

    slow_model, noisy_model = FixtureSpec().models[0].name, FixtureSpec().models[1].name
    base = run("base", cv_override={noisy_model: 0.5})
    same = compare_runs(base, base)
    assert set(same.cells["verdict"]) == {UNCHANGED}
    changed = compare_runs(
        base, run("new", seed=1, slowdown={slow_model: 1.25}, cv_override={noisy_model: 0.5})
    )
    slow = changed.cells[changed.cells["model"] == slow_model]
    assert set(slow["verdict"]) == {REGRESSION}
    assert (slow["throughput_ci_high_pct"] < 0).all()
    noisy = changed.cells[changed.cells["model"] == noisy_model]
    assert WITHIN_NOISE in set(noisy["verdict"]) and REGRESSION not in set(noisy["verdict"])
    faster = compare_runs(run("slow", slowdown={slow_model: 1.25}), base)
    assert IMPROVEMENT in set(faster.cells["verdict"])

    import plotly.graph_objects as go

    for chart in comparison_charts(changed.cells, 5.0):
        go.Figure(figure(chart))
        assert ET.fromstring(svg(chart)) is not None
    chart = comparison_charts(changed.cells, 5.0)[0]
    bars = {s.name: [y for y in s.y if y == y] for s in chart.series}  # NaN != NaN
    assert sorted(bars[REGRESSION]) == sorted(slow["throughput_change_pct"])


def test_one_gpu_count_on_two_node_layouts_stays_two_cells() -> None:
    """1 x 4 and 2 x 2 GPUs are different cells: never averaged, never matched to each other."""

    def records(inter_node_ms: float) -> list:
        one_node = FixtureSpec(models=MODELS[:1], batch_sizes=(32,), inter_node_ms=inter_node_ms)
        two_nodes = replace(one_node, gpus_per_node=2)
        rng = np.random.default_rng(0)
        made = [training_record(MODELS[0], 32, w, 0, one_node, rng) for w in (1, 2, 4)]
        return [*made, training_record(MODELS[0], 32, 4, 0, two_nodes, rng)]

    old = records(4.0)
    curves = scaling_curves(label_variants(training_table(old)))
    by_layout = {(str(r.variant), r.world_size): r for r in curves.itertuples()}
    assert sorted(by_layout) == [
        ("batch 32 · 1 node", 1), ("batch 32 · 1 node", 2), ("batch 32 · 1 node", 4),
        ("batch 32 · 2 nodes", 4),
    ]  # fmt: skip
    one, two = by_layout[("batch 32 · 1 node", 4)], by_layout[("batch 32 · 2 nodes", 4)]
    assert (one.nnodes, two.nnodes) == (1, 2)
    assert one.throughput == pytest.approx(old[2].throughput)
    assert two.throughput == pytest.approx(old[3].throughput)
    assert two.ideal_throughput == pytest.approx(4 * old[0].throughput)  # one baseline

    # A slower network slows only the 2-node cell, and only that cell is flagged.
    changed = compare_runs(old, records(40.0)).cells.set_index("nnodes")
    assert list(changed.loc[changed["world_size"] == 4].index) == [1, 2]
    at_four = changed[changed["world_size"] == 4]
    assert at_four.loc[2, "verdict"] == REGRESSION and at_four.loc[1, "verdict"] == UNCHANGED
    assert cell_labels(changed.reset_index()).tolist()[-1].endswith("4 GPUs × 2 nodes")


def test_every_chart_is_valid_plotly_and_svg(fixture_data) -> None:
    import plotly.graph_objects as go

    content = report_content(fixture_data)
    assert len(content.charts) >= 14
    for chart in content.charts:
        assert chart.has_data(), chart.chart_id
        go.Figure(figure(chart))  # validates every property against Plotly's schema
        root = ET.fromstring(svg(chart))
        paths = [
            p for p in root.iter("{http://www.w3.org/2000/svg}path") if len(p.get("d", "")) > 8
        ]
        assert len(paths) >= 2, chart.chart_id
    document = figures_json(content.charts)
    assert "<" not in document and ">" not in document
    names = {t["name"] for f in json.loads(document).values() for t in f["data"]}
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in " ".join(names) or any(
        "&lt;script&gt;" in json.dumps(f["layout"]) for f in json.loads(document).values()
    )


@pytest.mark.parametrize(("low", "high"), [(0, 1), (0, 97.3), (13.2, 13.9), (-40, 12), (0, 3e7)])
def test_nice_ticks_cover_the_range(low: float, high: float) -> None:
    ticks = nice_ticks(low, high)
    assert ticks[0] <= low and ticks[-1] >= high and 3 <= len(ticks) <= 12
    steps = np.diff(ticks)
    assert np.allclose(steps, steps[0])


def test_several_experiments_scale_against_their_own_baselines(tmp_path: Path) -> None:
    small: Any = {"batch_sizes": (32,), "failures": False, "collectives": False, "findings": False}
    write_experiment(tmp_path, FixtureSpec(name="exp-a", gpu_counts=(1, 2), **small))
    write_experiment(tmp_path, FixtureSpec(name="exp-b", gpu_counts=(1, 4), seed=3, **small))
    data = load_report_data(tmp_path)
    content = report_content(data)
    assert content.title == "exp-a and exp-b"  # both named
    scaling = next(s for s in content.sections if s.section_id == "scaling").tables[0]
    assert scaling.headers[0] == ("Experiment", False)
    rows = [[text for text, _ in row] for row in scaling.rows]
    records = _ok(data.records)
    for record in records:
        base = next(r for r in records if r.experiment == record.experiment
                    and r.model == record.model and r.world_size == 1)  # fmt: skip
        efficiency = record.throughput / (record.world_size * base.throughput)
        row = next(r for r in rows if r[:2] == [record.experiment, record.model]
                   and r[3] == str(record.world_size))  # fmt: skip
        assert f"{100 * efficiency:.1f}%" in row
    assert content.charts and all(c.title.endswith(("(exp-a)", "(exp-b)")) for c in content.charts)


def test_communication_only_and_all_failed_results(tmp_path: Path) -> None:
    from torchscale.report.render import render_html

    comm = load_report_data(
        write_experiment(
            tmp_path, FixtureSpec(name="comm", models=(), failures=False, findings=False)
        )
    )
    content = report_content(comm)
    assert [s.section_id for s in content.sections] == ["communication"]
    assert {c.chart_id for c in content.charts} == {"bandwidth-all-gather", "bandwidth-all-reduce"}
    assert "busbw GB/s" in render_html(content)
    failed = load_report_data(write_experiment(tmp_path, FixtureSpec(
        name="failed", batch_sizes=(), collectives=False, findings=False)))  # fmt: skip
    content = report_content(failed)
    assert content.sections == [] and content.charts == []
    assert content.failures is not None
    assert len(content.failures.rows) == 3
    assert content.cards[0].value == "0 / 3"
    assert "rank 0 on node-a failed in forward" in render_html(content)
