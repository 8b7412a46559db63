"""test_strategies.py's two sweeps, made in the session's lanes (tests/support/session_runs.py).

Sharing the cores cannot change what the tests read of them: each cell's gradient check (the
ranks' gradients against a reference, a numeric formula, not a time), the model state's bytes per
rank, each collective's calls and bytes, busbw and algbw as formulas over the same record's bytes
and time, and the console's recommendation against the ratio of the same records' figures.
``samples_per_s > 0`` and ``time_s > 0`` hold however slow a step is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Dict, List

from tests.support.session_runs import torchscale

TINY_CONFIG = """\
experiment_name: strategies
models: ["tests.support.strategy_models:gpt2_scaled_rank"]
batch_sizes: [2]
gpu_counts: [1, 2]
strategy: [ddp, replicate, fsdp2]
warmup_steps: 1
measure_steps: 2
sync_probe_steps: 1
cell_timeout_s: 240
"""
MEMORY_CONFIG = """\
experiment_name: strategy-memory
models: ["tests.support.strategy_models:gpt2_10m"]
batch_sizes: [1]
gpu_counts: [2]
strategy: [ddp, replicate, fsdp2]
optimizer: adamw
warmup_steps: 1
measure_steps: 1
sync_probe_steps: 0
cell_timeout_s: 240
"""


def _run(root: Path, text: str, name: str) -> List[Dict[str, object]]:
    """``benchmark`` of ``text``: its records as written (JSON objects)."""
    config = root / "c.yaml"
    config.write_text(text, encoding="utf-8")
    result = torchscale("benchmark", "-c", str(config), "-o", str(root / "out"))
    results = root / "out" / name / "results.jsonl"
    lines = results.read_text(encoding="utf-8").splitlines() if results.exists() else []
    records = [json.loads(line) for line in lines]
    assert records, result.stdout + result.stderr
    return records


def tiny(root: Path) -> List[Dict[str, object]]:
    """gpt2-tiny with rank 1's gradients scaled 2x, each strategy on 1 and 2 ranks."""
    return _run(root, TINY_CONFIG, "strategies")


def memory(root: Path) -> List[Dict[str, object]]:
    """The 11M GPT-2 with AdamW, each strategy on 2 ranks."""
    return _run(root, MEMORY_CONFIG, "strategy-memory")


RUNS: Dict[str, Callable[[Path], List[Dict[str, object]]]] = {"memory": memory, "tiny": tiny}
"""By name, the sweeps (the ``strategy_runs`` fixture's keys)."""
