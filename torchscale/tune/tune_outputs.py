"""What ``tune`` leaves behind: ``best.yaml`` (a benchmark config that reproduces the winner, or
the baseline when nothing won), ``ddp.py`` (the DDP arguments and code lines to paste into a
training script), ``tune.json`` (every trial and the verdict: what the report's Tuning section
reads) and the final console line. All written atomically, never through a link.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import yaml

from torchscale.escaping import for_terminal, python_comment, python_string
from torchscale.results.files import atomic_write_json, atomic_write_text
from torchscale.results.layout import (
    TUNE_BASELINE_CONFIG,
    TUNE_BEST_CONFIG,
    TUNE_DDP_SNIPPET,
    TUNE_SUMMARY,
)
from torchscale.tune.verdict import CONFIDENCE, Candidate

if TYPE_CHECKING:
    from pathlib import Path


GAIN, NO_GAIN, NOTHING_MEASURED = "gain", "no significant gain", "nothing measured"
BUSY_HOST = "busy host"  # measured, but no verdict may rest on it (analysis.busy_host)
NO_OUTPUTS = (NOTHING_MEASURED, BUSY_HOST)  # no verdict: nothing to reproduce or paste
ERROR_SHOWN = 160  # characters of a trial's error in the console line
SUMMARY_FILE = TUNE_SUMMARY
BEST_FILE = TUNE_BEST_CONFIG
BASELINE_FILE = TUNE_BASELINE_CONFIG
SNIPPET_FILE = TUNE_DDP_SNIPPET
PINNED = ("models", "batch_sizes", "gpu_counts")


def short_name(knob: str) -> str:
    return knob.split(".")[-1]


def describe_params(params: Dict[str, Any]) -> str:
    """``bucket_cap_mb=100, gradient_as_bucket_view=true`` (YAML spelling of values)."""

    def text(value: Any) -> str:
        return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()

    return ", ".join(f"{short_name(k)}={text(v)}" for k, v in params.items()) or "the baseline"


def reproducing_config(
    raw: Dict[str, Any], pinned: Dict[str, Any], params: Dict[str, Any], name: str
) -> Dict[str, Any]:
    """The user's YAML with the cell pinned (one model, batch, GPU count) and ``params`` set."""
    config = copy.deepcopy(raw)
    config.pop("tune", None)
    config.pop("communication", None)
    config.pop("repeats", None)
    config["experiment_name"] = name
    config.update(pinned)
    for dotted, value in params.items():
        node = config
        *parents, leaf = dotted.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = value
    return config


def ddp_snippet(settings: Dict[str, Any], header: str) -> str:
    """Python lines with the winner's settings, for a training script that uses DDP. Every value
    from the config is a literal (``repr``) and the header a comment of one line: a name never
    becomes a line of code."""
    ddp = settings["ddp"]
    lines = [
        f"# {python_comment(header)}",
        "import torch",
        "from torch.nn.parallel import DistributedDataParallel as DDP",
        "",
    ]
    if settings.get("cudnn_benchmark"):
        lines.append("torch.backends.cudnn.benchmark = True  # CUDA only")
    if settings.get("channels_last"):
        lines.append("model = model.to(memory_format=torch.channels_last)")
    lines += [
        "model = DDP(",
        "    model,",
        "    device_ids=[local_rank],  # GPU runs; leave out on CPU",
        f"    bucket_cap_mb={ddp['bucket_cap_mb']!r},",
        f"    gradient_as_bucket_view={ddp['gradient_as_bucket_view']!r},",
        f"    static_graph={ddp['static_graph']!r},",
        f"    broadcast_buffers={ddp['broadcast_buffers']!r},",
        ")",
    ]
    hook = ddp.get("comm_hook", "none")
    if hook in ("fp16", "bf16"):
        lines += [
            "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks",
            f"model.register_comm_hook(None, default_hooks.{hook}_compress_hook)",
        ]
    elif hook == "powersgd":
        lines += [
            "from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd",
            "state = powersgd.PowerSGDState(process_group=None, "
            f"matrix_approximation_rank={int(ddp.get('powersgd_rank', 1))})",
            "model.register_comm_hook(state, powersgd.powerSGD_hook)",
        ]
    if settings.get("compile"):
        mode = settings.get("compile_mode")
        option = f", mode={python_string(mode)}" if mode else ""
        lines.append(f"model = torch.compile(model{option})")
    impl = settings.get("optimizer_impl", "auto")
    if impl != "auto":
        flags = {"fused": "fused=True", "foreach": "foreach=True", "forloop": "foreach=False"}
        lines.append(f"# optimizer = torch.optim.<YourOptimizer>(params, ..., {flags[impl]})")
    if settings.get("precision") in ("amp", "bf16"):
        dtype = "float16" if settings["precision"] == "amp" else "bfloat16"
        lines.append(f"# forward under torch.autocast(device_type, dtype=torch.{dtype})")
    if settings.get("grad_accum_steps", 1) > 1:
        lines.append(
            f"# accumulate {int(settings['grad_accum_steps'])} micro-batches per optimizer step "
            "(all but the last under model.no_sync())"
        )
    data = settings.get("data", {})
    if data.get("source", "synthetic") != "synthetic":
        lines.append(
            f"# DataLoader(..., num_workers={int(data['num_workers'])}, "
            f"pin_memory={data['pin_memory']!r})"
        )
    return "\n".join(lines) + "\n"


def outcome(
    winner: Optional[Candidate], candidates: List[Candidate], busy_wait: Optional[float] = None
) -> str:
    """GAIN, NO_GAIN (a finalist measured against the baseline, none beyond noise),
    NOTHING_MEASURED (no finalist has an interval: the gate measured nothing, exit 1) or
    BUSY_HOST (measured while other processes held the cores, no noise stated: exit 2)."""
    if busy_wait is not None:
        return BUSY_HOST
    if winner is not None:
        return GAIN
    return NO_GAIN if any(c.gain_pct is not None for c in candidates) else NOTHING_MEASURED


def failures(trials: List[Dict[str, Any]]) -> str:
    """``3 oom, 1 failed; first: <error>`` over the trials that failed."""
    failed = [t for t in trials if t.get("state") == "fail"]
    counts: Dict[str, int] = {}
    for trial in failed:
        status = str(trial.get("status") or "failed")
        counts[status] = counts.get(status, 0) + 1
    shown = ", ".join(f"{count} {status}" for status, count in counts.items())
    first = next((str(t["error"]) for t in failed if t.get("error")), "")
    if first:
        shown += f"; first: {for_terminal(first[:ERROR_SHOWN])}"
    return shown or "none ran"


def script_snippet(changed: Dict[str, Any], header: str) -> str:
    """The lines to paste into a tuned script: the DDP arguments and settings the winner
    changes (torchscale applied them to the script's own DDP call and process)."""
    lines = [f"# {header}"]
    ddp = {short_name(k): v for k, v in changed.items() if k.startswith("ddp.")}
    if not changed:
        lines.append("# nothing to change: keep your script's DDP arguments as they are")
    if "cudnn_benchmark" in changed:
        lines.append(f"torch.backends.cudnn.benchmark = {changed['cudnn_benchmark']!r}")
    if ddp:
        lines += ["# in your script's DDP call (its other arguments unchanged):", "model = DDP("]
        lines += ["    model,", "    ...,"]
        lines += [f"    {name}={value!r}," for name, value in ddp.items()]
        lines.append(")")
    return "\n".join(lines) + "\n"


def tune_line(
    winner: Optional[Candidate],
    candidates: List[Candidate],
    trials: List[Dict[str, Any]],
    busy_wait: Optional[float] = None,
) -> str:
    """The console's last line: the gain with its interval, why the baseline is kept, that
    nothing was measured (never "no significant gain" then), or that the host was busy."""
    from torchscale.analysis.busy_host import NO_VERDICT, NOISE_FLOOR, wait_words

    if busy_wait is not None:
        return (
            f"> [TUNE] {NO_VERDICT} ({wait_words(busy_wait)} during the verdict); no {BEST_FILE} "
            f"written: rerun on a quiet node, or state the noise with {NOISE_FLOOR} PCT"
        )
    level = f"{CONFIDENCE:.0%}"
    if winner is not None:
        return (
            f"> [TUNE] {winner.gain_pct:+.1f}% samples/s ({level} CI {winner.ci_low_pct:+.1f}.."
            f"{winner.ci_high_pct:+.1f}%) with {describe_params(winner.changed)}"
        )
    measured = [c for c in candidates if c.gain_pct is not None]
    if not measured:
        ran = [t for t in trials if t.get("state") in ("complete", "pruned")]
        if candidates:
            why = f"every finalist ({len(candidates)}) failed when measured again"
        elif ran:
            why = f"no trial but the baseline was measured ({failures(trials)})"
        else:
            why = f"all {len(trials)} trial(s) failed ({failures(trials)})"
        return f"> [TUNE] nothing measured: {why}; no verdict, and no {BEST_FILE} written"
    best = max(measured, key=lambda c: c.gain_pct or 0.0)
    return (
        f"> [TUNE] no significant gain: best candidate {best.gain_pct:+.1f}% samples/s "
        f"({level} CI {best.ci_low_pct:+.1f}..{best.ci_high_pct:+.1f}%, {best.note}) with "
        f"{describe_params(best.changed)}; keeping the baseline"
    )


def write_outputs(
    folder: Path,
    summary: Dict[str, Any],
    best: Dict[str, Any],
    baseline: Dict[str, Any],
    snippet: str,
) -> None:
    """tune.json, and (when a verdict was reached) best.yaml, baseline.yaml and ddp.py."""
    if summary["result"] in NO_OUTPUTS:
        atomic_write_json(folder / SUMMARY_FILE, summary)
        return
    atomic_write_text(folder / BEST_FILE, yaml.safe_dump(best, sort_keys=False))
    atomic_write_text(folder / BASELINE_FILE, yaml.safe_dump(baseline, sort_keys=False))
    atomic_write_text(folder / SNIPPET_FILE, snippet)
    atomic_write_json(folder / SUMMARY_FILE, summary)
