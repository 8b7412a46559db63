"""``--script`` on training scripts as people write them (``tests/data/scripts/``): DataLoader
worker processes (persistent, pinned memory, started again each epoch), ``torch.compile`` of the
model and of the DDP module, autocast with a GradScaler, gradient accumulation under
``no_sync``, two optimizers and parameter groups, learning-rate schedules, checkpoint saving,
activation checkpointing, ``DistributedSampler.set_epoch`` across epochs, and a detached
checkpoint uploader (a daemon that forks twice and calls ``setsid``).

Each script runs at 1 and 2 gloo processes in one ``benchmark --script`` (two launches each):
every record is ``ok`` and within 5% of the samples/s the script printed itself over the same
steps, and nothing the script started is left running once the cell is over. The scripts
compile with Dynamo's ``aot_eager`` backend (their own ``--compile-backend`` option): inductor's
C++ compile takes ~30 s a rank on this machine; what torchscale does differs in nothing. The
compiled AMP script is also profiled at 2 ranks (one launch): its traced window is analysed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import List

import psutil
import pytest
from typer.testing import CliRunner

from torchscale.cli.app import app
from torchscale.results.schema import TrainingResult
from torchscale.results.store import ExperimentStore

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timed,  # samples/s within 5% of the script's own clock (its DataLoader workers too)
]

CORPUS = Path(__file__).resolve().parent / "data" / "scripts"
WINDOW = 10
"""Warm-up and measured steps, and the scripts' own --log-every: the measured steps 11-20 are
the ones each script prints its samples/s over."""
PRINTED = re.compile(r"\[default0\]:step \d+: loss \S+, ([\d.]+) samples/s over steps (\d+)-(\d+)")
CONFIG = f"""\
warmup_steps: {WINDOW}
measure_steps: {WINDOW}
sync_probe_steps: 2
cell_timeout_s: 240
"""


def _benchmark(root: Path, script: str, args: List[str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    config = root / f"{Path(script).stem}.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    out = root / "results"
    command = ["benchmark", "--script", str(CORPUS / script), "--gpus", "1", "--gpus", "2"]
    command += ["-c", str(config), "-o", str(out), "--", "--steps", "200"]
    command += ["--log-every", str(WINDOW), "--compile-backend", "aot_eager", *args]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, result.output
    return out / config.stem


@pytest.fixture(scope="module")
def amp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus-amp")
    args = ["--compile", "--workers", "2", "--batch-size", "32", "--accumulate", "2"]
    args += ["--checkpoint-dir", str(root / "checkpoints"), "--save-every", "7", "--uploader"]
    return _benchmark(root, "train_amp_accumulate.py", args)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus-compiled")
    args = ["--workers", "1", "--batch-size", "32", "--batches-per-epoch", "4"]
    return _benchmark(root, "train_compiled_ddp.py", args)


def _records(folder: Path) -> List[TrainingResult]:
    found = [r for r in ExperimentStore(folder).records() if isinstance(r, TrainingResult)]
    return sorted(found, key=lambda r: r.world_size)


def _printed(folder: Path, record: TrainingResult) -> float:
    log = (folder / "cells" / record.cell_id / "launch.log").read_text(encoding="utf-8")
    window = (WINDOW + 1, 2 * WINDOW)
    rates = [float(m[1]) for m in PRINTED.finditer(log) if (int(m[2]), int(m[3])) == window]
    assert len(rates) == 1, log
    return rates[0]


def _check_measured(folder: Path, samples_per_step: int) -> List[TrainingResult]:
    records = _records(folder)
    assert [r.world_size for r in records] == [1, 2]
    for record in records:
        assert record.status == "ok", record.error
        assert record.measure_steps == WINDOW
        assert record.batch_size == samples_per_step  # every micro-batch's forward counted
        cell = folder / "cells" / record.cell_id
        ranks = json.loads((cell / "result.json").read_text(encoding="utf-8"))["per_rank"]
        assert sum(r["samples"] for r in ranks) == samples_per_step * record.world_size * WINDOW
        own_clock = _printed(folder, record)
        assert record.samples_per_s is not None
        assert abs(record.samples_per_s / own_clock - 1) <= 0.05, (record.samples_per_s, own_clock)
        assert record.runtime["sync_probe"] == "ran after the measured window"
    return records


def _left_running(marker: str) -> List[str]:
    """Processes whose command line names ``marker`` (a folder of this test's)."""
    left = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if marker in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
            left.append(f"{proc.info['pid']}: {cmdline}")
    return left


def test_workers_amp_accumulation_and_checkpoints_are_measured_as_printed(amp: Path) -> None:
    records = _check_measured(amp, samples_per_step=32 * 2)  # batch 32, two micro-batches
    # the script ran on: rank 0 saved its checkpoints (every 7th step, until torchscale ended it after its windows)
    state = __import__("torch").load(amp.parent.parent / "checkpoints" / "last.pt")
    assert (
        state["step"] % 7 == 0
        and state["step"] > 2 * WINDOW
        and set(state) >= {"model", "optimizer", "scaler", "scheduler"}
    )
    for record in records:
        log = (amp / "cells" / record.cell_id / "launch.log").read_text(encoding="utf-8")
        # the uploader daemon, out of the ranks' sessions, was ended with the launch
        assert re.search(r"torchscale: ended 1 process\(es\) the ranks left running: \d+", log)


def test_nothing_the_script_started_outlives_its_cells(amp: Path, compiled: Path) -> None:
    """No uploader (its command line names the checkpoint folder), no DataLoader worker (forked
    from a rank: the rank's command line names the cell's folder) is left."""
    assert _left_running(str(amp.parent.parent / "checkpoints")) == []
    assert _left_running(str(amp)) == []
    assert _left_running(str(compiled)) == []


def test_compiled_ddp_two_optimizers_and_activation_checkpointing(compiled: Path) -> None:
    records = _check_measured(compiled, samples_per_step=32)
    for record in records:
        # the step ends at the first optimizer that steps the DDP model's parameters (AdamW)
        assert record.runtime["ddp"]["bucket_sizes"]
        log = (compiled / "cells" / record.cell_id / "launch.log").read_text(encoding="utf-8")
        assert "UnsafeScriptObjectError" not in log and "Traceback" not in log


def test_profile_traces_the_compiled_amp_script_with_workers_and_analyses_it(
    tmp_path: Path,
) -> None:
    """``profile --script`` of the compiled AMP script with persistent DataLoader workers at 2
    ranks: the traced window is analysed (a sync stall per rank, findings), the cell is not
    "not profiled" (the workers end after the trace, not in the rank's face), and nothing the
    script started is left."""
    config = tmp_path / "corpus.yaml"
    config.write_text(CONFIG.replace(f"measure_steps: {WINDOW}", "measure_steps: 4"))
    out = tmp_path / "results"
    command = ["profile", "--script", str(CORPUS / "train_amp_accumulate.py"), "--gpus", "2"]
    command += ["-c", str(config), "-o", str(out), "--duration", "2s", "--json", "--"]
    command += ["--steps", "400", "--compile", "--compile-backend", "aot_eager", "--workers", "2"]
    command += ["--batch-size", "32", "--checkpoint-dir", str(tmp_path / "checkpoints")]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, result.output
    assert "not profiled" not in result.stderr
    document = json.loads(result.stdout)
    ranks = document["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert all(r["steps"] >= 2 and r["sync_stall_pct"] is not None for r in ranks), ranks
    assert document["sync_stall_pct"] is not None and document["findings"]
    (folder,) = out.glob("profile-corpus-g2-*")
    (record,) = _records(folder)
    assert record.status == "ok" and record.profile is not None and record.profile.profiled
    assert record.profile.note is None  # the script ran past its traced window
    log = (folder / "cells" / record.cell_id / "launch.log").read_text(encoding="utf-8")
    assert "Traceback" not in log and "UnsafeScriptObjectError" not in log
    assert _left_running(str(folder)) == [] and _left_running(str(tmp_path)) == []
