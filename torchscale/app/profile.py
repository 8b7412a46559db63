"""The ``profile`` capture use case: run one benchmark cell per model and batch size, traced.

Capture is the benchmark engine with profiling switched on, so a profiled run is launched,
measured and recorded exactly like a benchmark cell: torchrun of the DDP worker, a measured
window (the cell's throughput and gradient-sync figures), then the traced window of the
requested duration (torch.profiler, or nsys wrapped around every rank), then the analysis, which
writes ``findings.json`` beside the traces.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from torchscale.analysis.host_attribution import attribute_findings
from torchscale.app import Notify
from torchscale.config.loader import Override, load_config, read_yaml
from torchscale.config.settings import BenchmarkConfig
from torchscale.errors import TorchscaleError
from torchscale.escaping import for_terminal, shown_command
from torchscale.hardware.device_noun import count_text
from torchscale.hardware.environment import CPU_SLOTS_ENV

if TYPE_CHECKING:
    from torchscale.app.benchmark import LiveEvents
    from torchscale.app.k8s_submit import JobRequest, LaunchedJob
    from torchscale.app.own_script import ScriptOptions
    from torchscale.hardware.environment import NodeDevices
    from torchscale.results.schema import ResultBase
    from torchscale.results.store import ExperimentStore
from torchscale.results.host_records import load_host_records
from torchscale.results.layout import (
    FINDINGS_FILE,
    experiment_dir,
    profile_run_name,
    profile_subject,
)

TOOLS = ("auto", "nsys", "torch")
log = logging.getLogger("torchscale")

# A short measured window first: the cell's own throughput and sync figures come with the trace.
MODEL_DEFAULTS = {"warmup_steps": 5, "measure_steps": 20, "sync_probe_steps": 5}

DEFAULT_MODEL = {"cuda": ("resnet50", 64), "cpu": ("resnet-tiny", 8)}
"""What ``torchscale profile`` runs when given no model and the output folder holds no benchmark
results to pick from: ResNet-50 (batch 64 per GPU) on GPUs, the tiny ResNet (batch 8) on a node
without GPUs, where each rank is a CPU process."""

# Settings of a benchmark cell that a profile of it does not copy: its identity (model, batch and
# GPU count come separately) and its measured window (a profile runs MODEL_DEFAULTS first).
_NOT_COPIED = {
    "model", "batch_size", "gpus", "nnodes", "repeat",
    "warmup_steps", "measure_steps", "measure_seconds", "sync_probe_steps",
}  # fmt: skip


DEFAULT_GPUS = 4
"""Ranks ``profile`` traces when not told: 4, or every slot of a smaller node (said so)."""


@dataclass(frozen=True)
class CaptureRequest:
    gpus: Optional[int]  # None: DEFAULT_GPUS, or fewer on a smaller node
    duration_s: float
    target: str
    tool: str
    config: Optional[Path] = None
    model: Optional[str] = None
    batch_size: Optional[int] = None
    overrides: Sequence[Override] = ()
    knobs: Mapping[str, Any] = field(default_factory=dict)  # other settings, with ``model``
    script: Optional[ScriptOptions] = None  # --script: the user's training script
    history: Optional[str] = None  # --history; else TORCHSCALE_HISTORY, else the config's
    settings: Sequence[str] = ()  # --set KEY=VALUE as typed: :func:`profile` parses them


@dataclass(frozen=True)
class Target:
    """What a ``profile`` without a model runs, and why."""

    model: str
    batch_size: int
    knobs: Dict[str, Any]
    reason: str


def default_target(device_kind: str, why: str) -> Target:
    model, batch = DEFAULT_MODEL.get(device_kind, DEFAULT_MODEL["cpu"])
    return Target(model, batch, {}, f"{why}: profiling the default model {model} (batch {batch})")


def worst_target(output_dir: Path, device_kind: str, device_count: int) -> Target:
    """The configuration the benchmark results in ``output_dir`` found worst: the lowest scaling
    efficiency at the largest GPU count measured that fits this node (one node); the default
    model when there is none."""
    import pandas as pd

    from torchscale.analysis.scaling import label_variants
    from torchscale.analysis.training_tables import training_table
    from torchscale.kinds.kind_registry import TRAINING_KIND
    from torchscale.plan.kind_protocol import records_of
    from torchscale.results.schema import TrainingResult
    from torchscale.results.store import ExperimentStore, find_experiments

    frames: List[pd.DataFrame] = []
    records: Dict[str, TrainingResult] = {}
    for path in find_experiments(output_dir) if output_dir.is_dir() else []:
        found = [  # a model's cells: a script is no model
            r for r in records_of(TRAINING_KIND, ExperimentStore(path).records())
            if isinstance(r, TrainingResult)
        ]  # fmt: skip
        records.update((r.cell_id, r) for r in found)
        frames.append(training_table(found))
    if not frames or all(f.empty for f in frames):
        return default_target(device_kind, f"no benchmark results in {output_dir}")
    table = label_variants(pd.concat(frames, ignore_index=True))
    scaled = table[
        (table["status"] == "ok")
        & table["scaling_efficiency"].notna()
        & (table["world_size"] > table["baseline_world_size"])
        & (table["nnodes"] == 1)
        & (table["world_size"] <= device_count)
    ]
    if scaled.empty:
        return default_target(
            device_kind,
            f"no scaling result in {output_dir} on at most "
            f"{count_text(device_count, device_kind)} (this node)",
        )
    largest = int(scaled["world_size"].max())
    at_largest = (
        scaled[scaled["world_size"] == largest]
        .groupby(["experiment", "config_key"], sort=False)
        .agg(
            efficiency=("scaling_efficiency", "mean"),
            baseline=("baseline_world_size", "first"),
            cell_id=("cell_id", "first"),
            variant=("variant", "first"),
        )
        .reset_index()
    )
    rows: List[Dict[str, Any]] = [
        {str(k): v for k, v in row.items()} for row in at_largest.to_dict("records")
    ]
    for row in sorted(rows, key=lambda r: float(r["efficiency"])):
        log.debug(
            "profile candidate: %s %s at %d GPUs: %.1f%% scaling efficiency (%s)",
            row["experiment"], row["variant"], largest, 100 * row["efficiency"], row["cell_id"],
        )  # fmt: skip
    worst = min(rows, key=lambda r: float(r["efficiency"]))  # the first of equals, as idxmin
    record = records[worst["cell_id"]]
    knobs = {k: v for k, v in record.settings.items() if k not in _NOT_COPIED}
    others = len(at_largest) - 1
    among = f"the lowest of {len(at_largest)} configurations" if others else "the only one"
    at = count_text(largest, device_kind)
    reason = (
        f"profiling {record.model} ({worst['variant']}, {record.precision}) from "
        f"{worst['experiment']}: {float(worst['efficiency']):.0%} scaling efficiency on "
        f"{at} against {int(worst['baseline'])}, {among} measured at {at}, "
        "the largest count in the results that fits this node"
    )
    return Target(record.model, record.batch_size, knobs, reason)


def refuse_named_code(picked: Target, gpus: int, output_dir: Path) -> None:
    """A model a results folder names is data: a built-in or hub model is run, a custom
    ``module:function`` never imported (it would run whatever module the folder's author chose,
    ``pdb:set_trace`` or a planted file); the command that runs it is shown instead."""
    from torchscale.models.registry import BUILTIN_MODELS, is_hub

    if picked.model in BUILTIN_MODELS or is_hub(picked.model):
        return
    command = shown_command(
        ["torchscale", "profile", "--model", picked.model,
         "--batch-size", str(picked.batch_size), "--gpus", str(gpus)]
    )  # fmt: skip
    raise TorchscaleError(
        f"the worst configuration in {output_dir} is the custom model "
        f"{for_terminal(repr(picked.model))} (batch {picked.batch_size}), named by a results "
        "file: torchscale never imports code that a results folder names; if you trust it, "
        f"profile it with: {command}"
    )


def capture_config(request: CaptureRequest, now: Optional[datetime] = None) -> BenchmarkConfig:
    """The benchmark config a capture runs: one GPU count, profiling always on, a fresh name."""
    if request.script is not None:
        from torchscale.app.own_script import script_raw

        options = replace(request.script, knobs={**MODEL_DEFAULTS, **request.script.knobs})
        raw: Dict[str, Any] = script_raw(options, request.config)
        # The experiment benchmark --script would write, so that a report of it finds this run.
        name = str(raw["experiment_name"])
    elif request.config is not None:
        raw = read_yaml(request.config)
        name = str(raw.get("experiment_name") or request.config.stem)
    elif request.model and not request.batch_size:
        raise TorchscaleError(
            f"--model {request.model} needs --batch-size: the per-GPU batch size to profile it "
            "with, e.g. --batch-size 8"
        )
    elif request.model and request.batch_size:
        raw = {
            **request.knobs,
            "models": [request.model],
            "batch_sizes": [request.batch_size],
            **MODEL_DEFAULTS,
        }
        name = request.model
    else:
        raise TorchscaleError("say what to profile: --model M --batch-size B, or --config FILE")
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    gpus = request.gpus or DEFAULT_GPUS
    raw["experiment_name"] = profile_run_name(profile_subject(name), gpus, stamp)
    raw["gpu_counts"] = [gpus]
    raw["profiling"] = {
        **(raw.get("profiling") or {}),
        "enabled": True,
        "tool": request.tool,
        "target": request.target,
        "trigger": "always",
        "duration_s": request.duration_s,
    }
    return load_config(None, request.overrides, base=raw)


def run_capture(
    request: CaptureRequest,
    output_dir: Path,
    events: LiveEvents,
    config: Optional[BenchmarkConfig] = None,
) -> List[Tuple[ResultBase, ExperimentStore]]:
    """Run the traced cells (``config``: ``capture_config(request)`` already built); returns
    their records (profile folder in ``record.profile``), each with its store."""
    from torchscale.launch.sweep import SweepOptions, run_sweep
    from torchscale.plan.matrix import expand
    from torchscale.results.store import ExperimentStore, check_writable

    plan = expand(config or capture_config(request))
    check_writable(output_dir)
    store = ExperimentStore(experiment_dir(output_dir, plan.config.experiment_name))
    with events:
        records = run_sweep(plan, store, SweepOptions(), events)
    return [(record, store) for record in records]


@dataclass(frozen=True)
class CapturedCell:
    """One traced cell: its analysis (``findings.json``), or why there is none."""

    cell_id: str
    tool: Optional[str] = None
    out_dir: Optional[Path] = None
    document: Optional[Dict[str, Any]] = None
    not_profiled: Optional[str] = None  # the cell failed, or its trigger did not trace it
    no_analysis: Optional[str] = None  # traced, but the analysis wrote no findings
    sync_overhead_pct: Optional[float] = None  # the traced run's own measured window
    note: Optional[str] = None  # said beside the analysis (a window cut short by the script)
    busy_wait: Optional[float] = None  # measured on a busy host: a rank's CPU-wait share
    busy_words: Optional[str] = None  # that host and wait in words
    files: Tuple[str, ...] = ()  # what its analysis wrote beside the traces


def captured_cell(record: ResultBase, store: ExperimentStore) -> CapturedCell:
    from torchscale.results.json_input import read_object

    profile = getattr(record, "profile", None)
    if record.status != "ok" or profile is None or not profile.profiled:
        why = record.error or (profile.reason if profile else "no trace was taken")
        return CapturedCell(record.cell_id, not_profiled=why)
    out_dir = store.cell_dir(record.cell_id) / (profile.dir or "")
    findings = out_dir / FINDINGS_FILE
    if not findings.exists():
        return CapturedCell(record.cell_id, profile.tool, out_dir, no_analysis=profile.reason)
    from torchscale.analysis.training_tables import sync_overhead_pct
    from torchscale.results.schema import TrainingResult

    try:
        document = read_object(findings, "findings file")
    except (OSError, TorchscaleError) as exc:
        return CapturedCell(record.cell_id, profile.tool, out_dir, no_analysis=str(exc))
    overhead = sync_overhead_pct(record) if isinstance(record, TrainingResult) else None
    hosts = load_host_records(store.root.parent)
    document["findings"] = attribute_findings(document["findings"], [record], hosts, "title")
    from torchscale.analysis.busy_host import BUSY_HOST, busy_wait, wait_words
    from torchscale.profiling.trace_tables import table_files

    wait = busy_wait([record])
    return CapturedCell(
        record.cell_id,
        profile.tool,
        out_dir,
        document,
        sync_overhead_pct=overhead,
        note=profile.note,
        busy_wait=wait,
        busy_words=None if wait is None else f"{BUSY_HOST} ({wait_words(wait)})",
        files=(FINDINGS_FILE, *table_files().values()),
    )


def fitted_gpus(request: CaptureRequest, devices: NodeDevices) -> Tuple[int, Optional[str]]:
    """The ranks to trace, and the line that says so when the default did not fit: the
    default (``DEFAULT_GPUS``) shrinks to this node; a ``--gpus`` the node cannot hold is bad
    input, refused before anything is written."""
    wanted = request.gpus or DEFAULT_GPUS
    if wanted <= devices.count:
        return wanted, None
    if request.gpus is None:
        return devices.count, (
            f"> [INFO] Profiling on {devices.describe(devices.count)}, all this node has (the "
            f"default is {devices.describe(DEFAULT_GPUS)}; --gpus N to choose)."
        )
    more = (
        f", or set {CPU_SLOTS_ENV}={wanted} to run more CPU processes than cores"
        if devices.kind == "cpu"
        else ""
    )
    raise TorchscaleError(
        f"--gpus {wanted} needs {devices.describe(wanted)}; this node has "
        f"{devices.describe(devices.count)}: pass --gpus {devices.count}{more}"
    )


def capture_profile(
    request: CaptureRequest, output_dir: Path, events: LiveEvents, notify: Notify
) -> List[CapturedCell]:
    """Pick what to trace (the worst-scaling configuration in ``output_dir`` when the request
    names no model or config), check it, run it traced and read each cell's findings. Bad
    input (a model that does not exist, more ranks than the node has) fails before anything
    is written or said about where results go."""
    from torchscale.hardware.environment import node_devices
    from torchscale.launch.cpu_threads import threads_lines
    from torchscale.launch.nsys import tool_warning
    from torchscale.models.registry import check_model_factories, check_model_name
    from torchscale.plan.cpu_size import gpu_sized_warnings
    from torchscale.plan.matrix import expand
    from torchscale.results.store import check_writable

    if request.script is not None and request.model is not None:
        raise TorchscaleError("use either --script or --model, not both")
    if request.model is not None and request.config is None:
        check_model_name(request.model)
    devices = node_devices()
    gpus, fitted = fitted_gpus(request, devices)
    request = replace(request, gpus=gpus)
    picked = None
    if request.config is None and request.model is None and request.script is None:
        picked = worst_target(output_dir, devices.kind, devices.count)
        refuse_named_code(picked, gpus, output_dir)
        notify(f"> [INFO] No --model or --config: {for_terminal(picked.reason)}.")
        batch = request.batch_size or picked.batch_size
        request = replace(request, model=picked.model, batch_size=batch, knobs=picked.knobs)
    config = capture_config(request)  # bad input fails here, before anything runs
    for name in config.models:
        check_model_name(name)
    check_model_factories(config.models, seq_len=config.seq_len[0])
    if picked is not None:
        notify(f"> [INFO] No --model or --config: {picked.reason}.")
    if fitted:
        notify(fitted)
    warning = tool_warning(request.tool, devices.kind, "--tool")
    if warning:
        notify(f"> [WARN] {warning}")
    for line in gpu_sized_warnings(config, devices.kind):
        notify(f"> [WARN] {line}")
    for line in threads_lines(expand(config).cells, devices.kind):
        notify(f"> [INFO] {line}")
    check_writable(output_dir)
    notify(f"> Results go to {experiment_dir(output_dir, config.experiment_name)}")
    cells = [captured_cell(r, s) for r, s in run_capture(request, output_dir, events, config)]
    from torchscale.app.history import history_location, record_run

    location = history_location(request.history, config.history)
    record_run(location, experiment_dir(output_dir, config.experiment_name), notify)
    return cells


@dataclass(frozen=True)
class ProfileJob:
    """``profile --launcher k8s|skypilot|dstack``: the capture as a job in one pod."""

    job: JobRequest
    gpus: Optional[int]
    config: Optional[Path]
    args: List[str]
    """What the pod's torchscale profile repeats."""


@dataclass(frozen=True)
class ProfileOutcome:
    cells: List[CapturedCell] = field(default_factory=list)
    job: Optional[LaunchedJob] = None


def profile(
    request: Union[CaptureRequest, ProfileJob],
    output_dir: Path,
    events: LiveEvents,
    notify: Notify,
) -> ProfileOutcome:
    """``torchscale profile``: capture here (:func:`capture_profile`), or write (and submit)
    the capture's job."""
    if isinstance(request, ProfileJob):
        from torchscale.app.k8s_submit import launch_job, profile_shape

        shape = profile_shape(request.gpus, request.config, request.args)
        return ProfileOutcome(job=launch_job(request.job, shape, notify))
    if request.settings:
        from torchscale.config.loader import parse_overrides

        overrides = [*request.overrides, *parse_overrides(list(request.settings))]
        request = replace(request, overrides=overrides, settings=())
    return ProfileOutcome(cells=capture_profile(request, output_dir, events, notify))
