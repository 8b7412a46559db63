"""Cross-rank analysis of collectives: who arrives late, how long the others wait for it.

A blocking collective (all-reduce, all-gather, ...) ends at about the same moment on every rank,
once the last rank has arrived. So the last rank to arrive has the *shortest* collective, the
earliest the longest, and each rank's wait is the time between its own arrival and the last one.
With comparable clocks (one host, or synchronised hosts: then every rank's interval overlaps the
last arrival) the wait is ``latest start - own start``; otherwise ``own duration - shortest``.

Instances are matched across ranks by (step, operation, n-th call of that operation in the step):
NCCL and gloo require every rank to issue a process group's collectives in the same order.
GPU collectives are NCCL kernels (``ncclKernel_*``, ``ncclDevKernel_*``, any ``nccl*``); on a rank
without them, gloo's CPU ranges (``gloo:all_reduce``, ...) are used.
"""

from __future__ import annotations

import re
from typing import Dict, List

import numpy as np
import pandas as pd

from torchscale.profiling.analyzers.kernels import COMMUNICATION, class_mask, cpu_collectives
from torchscale.profiling.analyzers.steps import assign_steps, step_ranges
from torchscale.profiling.traces.model import RankTrace

_NCCL_OP = re.compile(r"^nccl(?:Dev)?(?:Kernel|Func)_([A-Za-z]+)")
# A rank counts as "last" at an instance only if the others waited at least 0.1% of a
# median step for it: below that, who comes last is scheduling noise, not a straggler.
MIN_WAIT_SHARE_OF_STEP = 0.001
MIN_WAIT_US = 20.0  # same, in absolute terms, for traces without step markers
# Clocks are taken as comparable when this share of instances has every rank inside the
# collective at the moment the last rank arrived (true for any blocking collective).
CLOCK_AGREEMENT_SHARE = 0.9
CLOCK_TOLERANCE_US = 5.0

CALL_COLUMNS = ["rank", "device", "op", "step", "seq", "start_us", "dur_us", "name"]


def _op_name(name: str) -> str:
    match = _NCCL_OP.match(name)
    if match:
        return match.group(1)
    if name.startswith("gloo:"):
        return name[5:]
    return name.split("(")[0]


def collective_calls(trace: RankTrace) -> pd.DataFrame:
    """This rank's collective calls in time order, each with its step and ordinal."""
    gpu = trace.gpu_events()
    comm = gpu[class_mask(gpu["name"], COMMUNICATION)]
    device = "gpu"
    anchor = comm["launch_ts"].to_numpy()
    if comm.empty:
        comm, device = cpu_collectives(trace), "cpu"
        anchor = comm["ts"].to_numpy()
    anchor = np.where(np.isnan(anchor), comm["ts"].to_numpy(), anchor)
    steps = assign_steps(anchor, step_ranges(trace))
    frame = pd.DataFrame(
        {
            "rank": trace.rank,
            "device": device,
            "op": [_op_name(str(n)) for n in comm["name"]],
            "step": steps,
            "start_us": comm["ts"].to_numpy(),
            "dur_us": comm["dur"].to_numpy(),
            "name": comm["name"].astype(str).to_numpy(),
        }
    )
    frame = frame.sort_values("start_us", kind="stable", ignore_index=True)
    frame["seq"] = frame.groupby(["step", "op"]).cumcount()
    return frame[CALL_COLUMNS]


def match_instances(calls: pd.DataFrame) -> pd.DataFrame:
    """Calls present on every rank, with an ``instance`` id, each rank's wait and who was last."""
    ranks = calls["rank"].nunique()
    key = ["step", "op", "seq"]
    counts = calls.groupby(key)["rank"].transform("nunique")
    inst = calls[(counts == ranks) & (ranks >= 2)].copy()
    if inst.empty:
        return pd.DataFrame(
            columns=[*CALL_COLUMNS, "instance", "wait_us", "is_last", "clocks_comparable"]
        )
    inst["instance"] = inst.groupby(key, sort=True).ngroup()
    inst["end_us"] = inst["start_us"] + inst["dur_us"]
    grouped = inst.groupby("instance")
    latest_start = grouped["start_us"].transform("max")
    earliest_end = grouped["end_us"].transform("min")
    inside = (latest_start <= earliest_end + CLOCK_TOLERANCE_US).groupby(inst["instance"]).all()
    comparable = bool(inside.mean() >= CLOCK_AGREEMENT_SHARE)
    if comparable:
        inst["wait_us"] = latest_start - inst["start_us"]
    else:
        inst["wait_us"] = inst["dur_us"] - grouped["dur_us"].transform("min")
    inst["wait_us"] = inst["wait_us"].clip(lower=0.0)
    last_idx = grouped["wait_us"].idxmin()
    inst["is_last"] = False
    inst.loc[last_idx.to_numpy(), "is_last"] = True
    inst["clocks_comparable"] = comparable
    return inst.drop(columns="end_us").sort_values(["instance", "rank"], ignore_index=True)


def straggler_table(
    traces: List[RankTrace], instances: pd.DataFrame, calls: pd.DataFrame
) -> pd.DataFrame:
    """Per rank: how often it was last, how long it made the others wait, its own sync stall."""
    step_time: Dict[int, float] = {}
    median_step = []
    for trace in traces:
        steps = step_ranges(trace)
        durations = (steps["end_us"] - steps["start_us"]).to_numpy()
        if len(durations):
            step_time[trace.rank] = float(durations.sum())
            median_step.append(float(np.median(durations)))
        else:
            step_time[trace.rank] = trace.span_us()
    threshold = (
        MIN_WAIT_SHARE_OF_STEP * float(np.median(median_step)) if median_step else MIN_WAIT_US
    )
    significant = pd.Series(dtype=bool)
    caused = pd.Series(dtype=float)
    total_wait = 0.0
    if not instances.empty:
        spread = instances.groupby("instance")["wait_us"].max()
        significant = spread >= threshold
        # The wait a rank causes: everyone's wait in the collectives it arrived last at. Small
        # frequent collectives (DDP's buffer broadcasts) then cannot outvote the one that stalls.
        instance_wait = instances.groupby("instance")["wait_us"].sum()
        last = instances[instances["is_last"]]
        caused = last["instance"].map(instance_wait).groupby(last["rank"]).sum()
        total_wait = float(instance_wait.sum())
    rows = []
    for trace in traces:
        mine = instances[instances["rank"] == trace.rank]
        sig = mine[mine["instance"].map(significant).fillna(False).astype(bool)]
        per_step = (
            calls[(calls["rank"] == trace.rank) & (calls["step"] >= 0)]
            .groupby("step")["dur_us"]
            .sum()
        )
        wait = float(mine["wait_us"].sum()) if len(mine) else float("nan")
        total = step_time.get(trace.rank, float("nan"))
        mean = float(per_step.mean()) if len(per_step) else float("nan")
        std = float(per_step.std(ddof=0)) if len(per_step) else float("nan")
        rows.append(
            {
                "rank": trace.rank,
                "instances": len(mine),
                "significant_instances": len(sig),
                "times_last": int(sig["is_last"].sum()) if len(sig) else 0,
                "last_share": float(sig["is_last"].mean()) if len(sig) else float("nan"),
                "caused_wait_us": float(caused.get(trace.rank, 0.0)),
                "caused_wait_share": (
                    float(caused.get(trace.rank, 0.0)) / total_wait if total_wait else float("nan")
                ),
                "wait_us": wait,
                "step_time_us": total,
                "sync_stall_pct": round(100.0 * wait / total, 2)
                if len(mine) and total
                else float("nan"),
                "sync_time_mean_us": mean,
                "sync_time_std_us": std,
                "sync_time_cv": std / mean if mean else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def collective_tables(traces: List[RankTrace]) -> Dict[str, pd.DataFrame]:
    """``calls`` (per rank), ``instances`` (matched across ranks) and ``stragglers`` (per rank)."""
    calls = (
        pd.concat([collective_calls(t) for t in traces], ignore_index=True)
        if traces
        else pd.DataFrame(columns=CALL_COLUMNS)
    )
    instances = match_instances(calls)
    return {
        "calls": calls,
        "instances": instances,
        "stragglers": straggler_table(traces, instances, calls),
    }
