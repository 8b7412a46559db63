"""The report's "Tuning" section, from the ``tune.json`` that ``torchscale tune`` leaves beside
its trials: the trial history, each knob's effect, and the baseline against the finalists with
their intervals. Charts are the neutral specs every section uses (Plotly in HTML, SVG in PDF).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import pandas as pd

from torchscale.measures.figures import NOT_JUDGED
from torchscale.report import formatting as fmt
from torchscale.report.charts import chart_id
from torchscale.report.elements import Chart, Column, Section, Series, make_table

GAIN_COLORS = {
    "baseline": "#9CA3AF",
    "significant": "#009E73",
    "not significant": "#E69F00",
    NOT_JUDGED: "#CC79A7",  # measured on a busy host: no verdict (the compare charts' colour)
}


def _params_text(params: Dict[str, Any]) -> str:
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in params.items()) or "baseline"


def _value(row: Dict[str, Any]) -> Optional[float]:
    """A trial's figure: its full-window value, else (pruned) its screening value."""
    for key in ("samples_per_s", "screen_samples_per_s"):
        if isinstance(row.get(key), (int, float)):
            return float(row[key])
    return None


def _history(trials: pd.DataFrame, baseline: Optional[float], key: str) -> Chart:
    complete = trials[trials["state"] == "complete"]
    pruned = trials[trials["state"] == "pruned"]
    best = complete["samples_per_s"].cummax()
    series = [
        Series("measured (full window)", complete["number"].tolist(),
               complete["samples_per_s"].tolist(), kind="marker"),
        Series("pruned (screening window)", pruned["number"].tolist(),
               pruned["screen_samples_per_s"].tolist(), kind="marker"),
        Series("best so far", complete["number"].tolist(), best.tolist()),
    ]  # fmt: skip
    hlines = [(baseline, "baseline")] if baseline is not None else []
    return Chart(
        chart_id("tuning-history", key), "Trial history", "trial", "samples/s", series,
        trials[["number", "state", "params_text", "samples_per_s", "screen_samples_per_s"]],
        hlines=hlines,
    )  # fmt: skip


def _effects(trials: pd.DataFrame, key: str) -> Optional[Chart]:
    """Mean samples/s of the measured trials with each value of each knob."""
    complete = trials[trials["state"] == "complete"]
    rows = []
    for params, value in zip(complete["params"], complete["samples_per_s"]):
        for knob, setting in params.items():
            rows.append({"knob": knob, "value": str(setting), "samples_per_s": value})
    if not rows:
        return None
    frame = pd.DataFrame(rows)
    effect = frame.groupby(["knob", "value"], as_index=False).agg(
        samples_per_s=("samples_per_s", "mean"), trials=("samples_per_s", "size")
    )
    effect["label"] = effect["knob"].str.split(".").str[-1] + "=" + effect["value"]
    series = [
        Series(str(knob), group["label"].tolist(), group["samples_per_s"].tolist(), kind="bar")
        for knob, group in effect.groupby("knob", sort=True)
    ]
    return Chart(
        chart_id("tuning-effects", key), "Each knob's effect (mean of the measured trials)", "",
        "samples/s", series, effect[["knob", "value", "trials", "samples_per_s"]],
        x_type="category", barmode="overlay",
    )  # fmt: skip


def _verdict_rows(summary: Dict[str, Any]) -> pd.DataFrame:
    finalists = summary.get("verdict", {}).get("finalists") or []
    rows = []
    if finalists:
        rows.append({"candidate": "baseline", "changes": "-",
                     "samples_per_s": finalists[0].get("baseline_samples_per_s"),
                     "gain_pct": 0.0, "ci": "-", "verdict": "baseline"})  # fmt: skip
    for item in finalists:
        low, high = item.get("ci_low_pct"), item.get("ci_high_pct")
        significant = bool(item.get("significant"))
        base = item.get("baseline_samples_per_s")
        ends = (
            [base * (1 + pct / 100) for pct in (low, high)]
            if isinstance(base, (int, float)) and low is not None and high is not None
            else [None, None]
        )
        rows.append(
            {
                "candidate": f"trial {item.get('trial')}",
                "changes": _params_text(item.get("changed") or {}),
                "samples_per_s": item.get("samples_per_s"),
                "gain_pct": item.get("gain_pct"),
                "ci": "-" if low is None else f"{low:+.1f}…{high:+.1f}%",
                # The gain's interval in samples/s: the baseline's rate times (1 + gain).
                "ci_low_samples_per_s": ends[0],
                "ci_high_samples_per_s": ends[1],
                "verdict": "significant" if significant else item.get("note") or "not significant",
            }
        )
    return pd.DataFrame(rows)


def _verdict_chart(rows: pd.DataFrame, key: str) -> Chart:
    labels = rows["candidate"].tolist()
    values = rows["samples_per_s"].tolist()
    kinds = ["baseline" if v == "baseline" else "significant" if v == "significant"
             else NOT_JUDGED if v == NOT_JUDGED else "not significant"
             for v in rows["verdict"]]  # fmt: skip
    lows = rows.get("ci_low_samples_per_s", pd.Series([None] * len(rows))).tolist()
    highs = rows.get("ci_high_samples_per_s", pd.Series([None] * len(rows))).tolist()

    def only(kind: str, values: List[Any]) -> List[Any]:
        return [v if k == kind else None for v, k in zip(values, kinds)]

    series = [
        Series(kind, labels, only(kind, values), kind="bar", color_key=kind,
               low=only(kind, lows), high=only(kind, highs))
        for kind in dict.fromkeys(kinds)
    ]  # fmt: skip
    return Chart(
        chart_id("tuning-verdict", key),
        "Baseline and finalists, measured again (interleaved), with the gain's 95% interval",
        "", "samples/s", series, rows, x_type="category", barmode="overlay",
        colors_by_key=GAIN_COLORS,
    )  # fmt: skip


def _tuning(key: str, summary: Dict[str, Any], several: bool) -> Section:
    trials = pd.DataFrame(summary.get("trials") or [])
    if trials.empty:
        trials = pd.DataFrame(columns=["number", "state", "params", "samples_per_s",
                                       "screen_samples_per_s", "status", "error"])  # fmt: skip
    trials["params_text"] = trials["params"].map(_params_text)
    for column in ("samples_per_s", "screen_samples_per_s"):
        trials[column] = pd.to_numeric(trials[column], errors="coerce")
    baseline_rows = trials[(trials["number"] == 0) & (trials["state"] == "complete")]
    baseline = float(baseline_rows["samples_per_s"].iloc[0]) if len(baseline_rows) else None
    verdict = _verdict_rows(summary)
    charts = [_history(trials, baseline, key)]
    effects = _effects(trials, key)
    charts += [effects] if effects is not None else []
    charts += [_verdict_chart(verdict, key)] if not verdict.empty else []
    tables = [
        make_table(chart_id("tuning-trials", key), trials.assign(
            note=trials.apply(lambda r: r.get("error") or r.get("status") or "", axis=1)), [
            Column("number", "Trial", fmt.integer),
            Column("state", "State", fmt.text, numeric=False),
            Column("params_text", "Settings", fmt.text, numeric=False),
            Column("screen_samples_per_s", "Screen samples/s", fmt.significant),
            Column("samples_per_s", "Samples/s", fmt.significant),
            Column("note", "Status", fmt.text, numeric=False),
        ]),
    ]  # fmt: skip
    if not verdict.empty:
        tables.append(make_table(chart_id("tuning-verdict-table", key), verdict, [
            Column("candidate", "Candidate", fmt.text, numeric=False),
            Column("changes", "Changes", fmt.text, numeric=False),
            Column("samples_per_s", "Samples/s", fmt.significant),
            Column("gain_pct", "Gain", fmt.signed_percent),
            Column("ci", "95% CI", fmt.text, numeric=False),
            Column("verdict", "Verdict", fmt.text, numeric=False),
        ]))  # fmt: skip
    notes = [f"{knob}: {text}" for knob, text in (summary.get("knob_changes") or {}).items()]
    if summary.get("warning"):
        notes.insert(0, f"Warning: {summary['warning']}.")
    intro = (
        f"{summary.get('line', '').removeprefix('> [TUNE] ')}. Trials ran on the config's window "
        "(pruned ones only on a short screening window); the verdict measured the baseline and the "
        "best trials again in interleaved repeats, each finalist paired with the baseline round by "
        "round, with a simultaneous 95% bootstrap interval over the rounds and their steps "
        "(docs/tune.md)."
    )
    title = f"Tuning — {key}" if several else "Tuning"
    section_id = chart_id("tuning", key) if several else "tuning"
    return Section(section_id, title, intro, charts=charts, tables=tables, notes=notes)


def tuning_sections(summaries: List[Tuple[str, Dict[str, Any]]]) -> List[Section]:
    """A Tuning section per tune folder among the experiments (``summaries``: each one's name
    and its ``tune.json``)."""
    return [_tuning(name, summary, len(summaries) > 1) for name, summary in summaries]
