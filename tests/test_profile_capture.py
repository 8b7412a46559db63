"""Profiling capture against ground truth: a rank slowed by a known delay in real gloo runs.

The slowed rank must be named, exactly; the other ranks' sync-stall share must be within 5
percentage points of the injected delay's share of the step; the same run without the delay must
yield no straggler finding. Traces come from real torch.profiler captures of each rank.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Dict, Iterator

import pytest
from typer.testing import CliRunner

from tests.support.environ import repo_pythonpath, restored_environ
from torchscale.cli.app import app
from torchscale.measures.figures import SYNC_STALL
from torchscale.results.files import atomic_write_json
from torchscale.results.layout import validate_record_path
from torchscale.results.store import ExperimentStore

pytestmark = [
    pytest.mark.slow,  # every test here captures real profiled cells (torchrun launches)
    pytest.mark.timed(alone=False),  # the slowed rank named from its ranks' step times
]

WINDOW = "4s"  # see profile()
DELAY_MS = 300  # large against scheduling jitter (ms), which is what limits the precision
runner = CliRunner()

TRIGGERED = """\
experiment_name: triggered
models: [tests.support.fault_models:slow_rank_model]
batch_sizes: [4]
gpu_counts: [1, 2]
warmup_steps: 2
measure_steps: 4
sync_probe_steps: 2
ddp:
  broadcast_buffers: false
profiling:
  enabled: true
  tool: auto
  trigger: sync_stall_detection
  steps: 4
"""


@pytest.fixture(scope="module")
def env() -> Iterator[None]:
    keys = ("PYTHONPATH", "TORCHSCALE_TEST_DELAY_MS", "TORCHSCALE_TEST_FAULT_RANK")
    with restored_environ(*keys, "TORCHSCALE_CPU_SLOTS"):
        os.environ["PYTHONPATH"] = repo_pythonpath()
        yield


def profile(tmp: Path, gpus: int, delay_ms: int, slow_rank: int) -> Dict:
    """``torchscale profile --json`` on the slow-rank model; returns the findings document.

    The window (``WINDOW``) is seconds long because the launcher, the agent and this process share the two
    cores with the ranks: a burst of their work lands on one rank for a fraction of a second, and
    over a 1.5 s window (4 steps of the delayed model) that alone once made a clean rank look
    late in most collectives."""
    os.environ["TORCHSCALE_TEST_DELAY_MS"] = str(delay_ms)
    os.environ["TORCHSCALE_TEST_FAULT_RANK"] = str(slow_rank)
    os.environ["TORCHSCALE_CPU_SLOTS"] = str(max(gpus, os.cpu_count() or 1))
    args = ["profile", "--gpus", str(gpus), "--duration", WINDOW, "--batch-size", "4"]
    args += ["--model", "tests.support.fault_models:slow_rank_model", "-o", str(tmp), "--json"]
    # Without DDP's per-forward buffer broadcast, the only collective is the gradient all-reduce,
    # so what the others wait for is the injected delay (plus the all-reduce itself).
    args += ["--set", "ddp.broadcast_buffers=false"]
    # Short measured and probe windows: the trace is what these tests are about.
    args += ["--set", "warmup_steps=1", "--set", "measure_steps=4", "--set", "sync_probe_steps=2"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "[ANALYSIS] Profiling complete" in result.stderr
    assert f"[ANALYSIS] {SYNC_STALL.title}:" in result.stderr
    return json.loads(result.stdout)


def stragglers(document: Dict) -> list:
    return [f for f in document["findings"] if f["category"] == "straggler"]


def assert_stall_matches_delay(document: Dict, slow_rank: int) -> None:
    for rank in document["ranks"]:
        if rank["rank"] == slow_rank:
            continue
        delay_share = 100.0 * DELAY_MS * 1e3 / rank["step_mean_us"]
        assert abs(rank["sync_stall_pct"] - delay_share) <= 5.0, (rank, delay_share)


@pytest.fixture(scope="module")
def triggered(tmp_path_factory: pytest.TempPathFactory, env: None) -> Dict:
    tmp = tmp_path_factory.mktemp("triggered")
    os.environ["TORCHSCALE_TEST_DELAY_MS"] = str(DELAY_MS)
    os.environ["TORCHSCALE_TEST_FAULT_RANK"] = "1"
    config = tmp / "c.yaml"
    config.write_text(TRIGGERED)
    result = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(tmp)])
    assert result.exit_code == 0, result.output
    store = ExperimentStore(tmp / "triggered")
    return {"store": store, "records": {r.world_size: r for r in store.records()}}


def test_trigger_profiles_only_the_cell_that_stalls(triggered: Dict) -> None:
    one, two = triggered["records"][1], triggered["records"][2]
    assert one.profile is not None and one.profile.profiled is False
    assert "one rank" in one.profile.reason
    assert two.profile is not None and two.profile.profiled is True
    assert two.profile.reason == "straggler detected (rank 1)"
    assert two.profile.tool == "torch" and two.profile.findings >= 1
    profile_dir = triggered["store"].cell_dir(two.cell_id) / two.profile.dir
    assert sorted(p.name for p in profile_dir.glob("rank*.json.gz")) == [
        "rank0.json.gz",
        "rank1.json.gz",
    ]
    assert not (triggered["store"].cell_dir(one.cell_id) / "profile").exists()


def test_two_ranks_name_the_slowed_rank_and_the_stall_it_causes(triggered: Dict) -> None:
    two = triggered["records"][2]
    folder = triggered["store"].cell_dir(two.cell_id) / two.profile.dir
    document = json.loads((folder / "findings.json").read_text())
    found = stragglers(document)
    assert len(found) == 1 and found[0]["ranks"] == [1]
    assert_stall_matches_delay(document, slow_rank=1)
    for table in document["tables"].values():
        assert (folder / table).exists()
    # The benchmark's own measurement (no_sync probe) names the same rank.
    assert two.sync.slowest_rank == 1


def test_four_ranks_name_the_slowed_rank(tmp_path: Path, env: None) -> None:
    # a validate record of this host in the output folder, whose CPU 2 was slow at level 2
    host = socket.gethostname()
    slow = {"probe": "gemm_fp32", "label": "GEMM fp32", "unit": "TFLOP/s", "device": "CPU 2",
            "value": 0.02, "status": "WARN", "vs_peers": 0.7}  # fmt: skip
    atomic_write_json(validate_record_path(tmp_path, host), {"host": host, "level": 2,
                                                             "probes": [slow]})  # fmt: skip
    document = profile(tmp_path, gpus=4, delay_ms=DELAY_MS, slow_rank=2)
    assert len(document["ranks"]) == 4
    found = stragglers(document)
    assert len(found) == 1 and found[0]["ranks"] == [2]
    assert_stall_matches_delay(document, slow_rank=2)
    # the finding names where rank 2 ran and quotes the record (analysis/host_attribution.py)
    assert found[0]["where"].startswith(
        f"rank 2 is on {host} CPU process 2, whose GEMM fp32 on CPU 2 ran at 0.70 of its peers"
    )
    assert found[0]["title"].endswith(found[0]["where"])


def test_no_delay_no_straggler(tmp_path: Path, env: None) -> None:
    document = profile(tmp_path, gpus=2, delay_ms=0, slow_rank=1)
    assert len(document["ranks"]) == 2
    assert stragglers(document) == []
