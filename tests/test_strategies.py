"""Data-parallel strategies as matrix cells, and the gradient check every training cell runs.

The fast tests plan cells and judge gradient-check figures in process. The ``slow`` ones share
three launches: gpt2-tiny with a planted fault (rank 1 scales its output gradient by 2; no rank 1,
no fault) under ddp, replicate and fsdp2 at 1 and 2 gloo ranks (two warm groups), and an
11M-parameter GPT-2 under the three at 2 ranks (one warm group): healthy cells and memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
from typer.testing import CliRunner

from tests.support.shared_runs import Run
from torchscale.config.loader import load_config
from torchscale.launch.strategy_support import strategy_skip_reason
from torchscale.plan.matrix import expand
from torchscale.results.validity import problems
from torchscale.worker.gradient_check import cause, fit_shares, parameters_disagree

STRATEGIES = ("ddp", "replicate", "fsdp2")


def _plan(tmp_path: Path, text: str) -> List[object]:
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    return list(expand(load_config(path)).cells)


def test_each_strategy_is_its_own_cell_and_ddp_ids_stay(tmp_path: Path) -> None:
    cells = _plan(
        tmp_path,
        "models: [gpt2-tiny]\nbatch_sizes: [2]\nstrategy: [ddp, replicate, fsdp2]\n"
        "reshard_after_forward: [true, false]\n",
    )
    ids = [c.cell_id for c in cells]  # type: ignore[attr-defined]
    # reshard_after_forward splits fsdp2 only: ddp and replicate are one cell each
    assert len(ids) == 4 and len(set(ids)) == 4
    assert ids[0].startswith("gpt2-tiny-b2-g1-fp32-r0-")  # ddp: the id it had before strategies
    assert sum("-fsdp2-" in i for i in ids) == 2 and sum("-replicate-" in i for i in ids) == 1
    before = _plan(tmp_path, "models: [gpt2-tiny]\nbatch_sizes: [2]\n")
    assert before[0].cell_id == ids[0]  # type: ignore[attr-defined]


def test_unknown_strategy_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("models: [gpt2-tiny]\nstrategy: [zero3]\n", encoding="utf-8")
    with pytest.raises(Exception) as info:
        load_config(path)
    assert "strategy" in str(info.value) and "fsdp2" in str(info.value)


def test_hybrid_needs_several_nodes() -> None:
    reason = strategy_skip_reason("fsdp2_hybrid", 1)
    assert reason is not None and "one node" in reason and "fsdp2" in reason
    assert strategy_skip_reason("fsdp2_hybrid", 2) is None
    assert strategy_skip_reason("replicate", 1) is None  # this torch has it


def test_causes_name_rank_and_factor() -> None:
    healthy = cause(0, [1.0, 1.0], 1e-7, 1e-3, "fp32")
    assert healthy is None
    summed = cause(1, [2.0, 2.0], 1.0, 1e-3, "fp32")
    assert summed == (
        "rank 1's gradients are 2.00x the reference: a reduction that sums instead of averaging"
    )
    skipped = cause(1, [0.0, 2.0], 0.7, 1e-3, "fp32")
    assert skipped is not None and skipped.startswith("rank 1's gradients are its own batch's")
    assert "synchronisation was skipped" in skipped
    scaled = cause(0, [1.0, 3.0], 1.0, 1e-3, "fp32")
    assert scaled is not None and scaled.startswith("rank 1's gradients are 3.00x the reference")


def test_shares_are_fitted_from_each_ranks_gradient() -> None:
    torch.manual_seed(0)
    own = torch.randn(3, 1000)
    observed = (own[0] + 2.5 * own[1] + own[2]) / 3
    shares = fit_shares(observed, own)
    assert shares == pytest.approx([1.0, 2.5, 1.0], abs=1e-6)


def test_parameters_that_drift_apart_are_named() -> None:
    base = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    assert parameters_disagree([base, base.clone()]) is None
    text = parameters_disagree([base, base * 1.01])
    assert text is not None and text.startswith("rank 1's parameters differ from rank 0's")


def test_a_failed_check_makes_the_record_invalid() -> None:
    doc = {
        "kind": "training",
        "status": "ok",
        "gradient_check": {"passed": False, "cause": "rank 1's gradients are 2.00x the reference"},
    }
    assert "gradient check failed: rank 1's gradients are 2.00x the reference" in problems(doc)


@pytest.fixture(scope="module")
def tiny(strategy_runs: Dict[str, Any]) -> List[Dict[str, object]]:
    """gpt2-tiny with a scaled rank, each strategy on 1 and 2 ranks: its records (made in the
    session's lanes; tests/support/strategy_runs.py says why sharing the cores changes none of
    what is read here)."""
    return strategy_runs["tiny"].value()


@pytest.fixture(scope="module")
def memory(strategy_runs: Dict[str, Any]) -> List[Dict[str, object]]:
    """The 11M GPT-2, each strategy on 2 ranks: its records (made in the session's lanes)."""
    return strategy_runs["memory"].value()


def _cell(records: List[Dict[str, object]], model: str, strategy: str, gpus: int) -> dict:
    (found,) = [
        r
        for r in records
        if r["model"] == model
        and r["settings"]["strategy"] == strategy  # type: ignore[index]
        and r["world_size"] == gpus
    ]
    return found


SCALED = "tests.support.strategy_models:gpt2_scaled_rank"
GPT2_10M = "tests.support.strategy_models:gpt2_10m"


@pytest.mark.slow
@pytest.mark.parametrize("gpus", [1, 2])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_healthy_strategies_run_and_pass_the_check(
    tiny: List[Dict[str, object]], memory: List[Dict[str, object]], strategy: str, gpus: int
) -> None:
    # 1 rank: gpt2-tiny (the planted fault needs a rank 1); 2 ranks: the 11M GPT-2
    record = _cell(tiny, SCALED, strategy, 1) if gpus == 1 else _cell(memory, GPT2_10M, strategy, 2)
    assert record["status"] == "ok", record.get("error")
    check = record["gradient_check"]
    assert check["passed"] is True and check["cause"] is None
    assert check["relative_error"] < 1e-4
    assert check["shares"] == pytest.approx([1.0] * gpus, abs=1e-3)
    assert check["check_s"] > 0
    assert record["runtime"]["strategy"]["strategy"] == strategy
    assert record["samples_per_s"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_scaled_rank_is_named_with_its_factor(
    tiny: List[Dict[str, object]], strategy: str
) -> None:
    record = _cell(tiny, SCALED, strategy, 2)
    assert record["status"] == "invalid"
    assert "gradient check failed: rank 1's gradients are 2.00x the reference" in str(
        record["error"]
    )


@pytest.mark.slow
def test_fsdp2_halves_the_model_state_per_rank(memory: List[Dict[str, object]]) -> None:
    ddp, replicate, fsdp2 = (_cell(memory, GPT2_10M, s, 2) for s in STRATEGIES)
    assert ddp["status"] == "ok" and fsdp2["status"] == "ok"
    assert ddp["memory"]["params_bytes"] / 4 >= 10_000_000
    for field in ("params_bytes", "optimizer_bytes"):
        ratio = fsdp2["memory"][field] / ddp["memory"][field]
        assert ratio == pytest.approx(0.5, rel=0.10), field
        # replicate keeps the whole model state on every rank, as DDP does
        assert replicate["memory"][field] == ddp["memory"][field]


@pytest.mark.slow
def test_each_strategy_issues_its_own_collectives(memory: List[Dict[str, object]]) -> None:
    issued = {
        s: {c["op"]: c for c in _cell(memory, GPT2_10M, s, 2)["collectives"]} for s in STRATEGIES
    }
    for strategy in ("ddp", "replicate"):  # gradients all-reduced, parameters never gathered
        assert issued[strategy]["all_reduce"]["calls"] >= 1, issued[strategy]
        assert not {"all_gather", "reduce_scatter"} & set(issued[strategy])
    fsdp2 = issued["fsdp2"]
    assert "all_reduce" not in fsdp2, fsdp2
    ddp = _cell(memory, GPT2_10M, "ddp", 2)
    whole = ddp["memory"]["params_bytes"]
    # every parameter gathered for forward and, resharded after it, again for backward (all but
    # the root's); every gradient reduce-scattered once, all-reduced once under DDP
    assert issued["ddp"]["all_reduce"]["bytes"] == pytest.approx(whole, rel=0.01)
    assert fsdp2["all_gather"]["bytes"] > 1.5 * whole, fsdp2
    assert fsdp2["reduce_scatter"]["bytes"] == pytest.approx(whole, rel=0.05)
    # each issued op timed alone: a positive busbw, bytes / time x nccl-tests' factor at 2 ranks
    factors = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "broadcast": 1.0}
    for strategy, ops in issued.items():
        for op, c in ops.items():
            assert c["time_s"] > 0 and c["busbw_gbps"] > 0, (strategy, c)
            algbw = c["bytes"] / c["time_s"] / 1e9
            assert c["algbw_gbps"] == pytest.approx(algbw, rel=1e-6), (strategy, c)
            assert c["busbw_gbps"] == pytest.approx(algbw * factors[op], rel=1e-6), (strategy, c)


@pytest.mark.slow
def test_console_and_report_recommend_with_the_measured_tradeoff(
    memory: List[Dict[str, object]], tiny: List[Dict[str, object]]
) -> None:
    import re

    from torchscale.results.schema import TrainingResult
    from torchscale.training.strategy_section import strategy_lines, strategy_section

    records = [TrainingResult.model_validate(r) for r in memory + tiny]
    lines = strategy_lines(records)  # type: ignore[arg-type]
    (big,) = [line for line in lines if "gpt2_10m at 2 ranks" in line]
    fsdp2 = re.search(r"fsdp2 uses (\d\.\d\d)x the memory per rank at (\d\.\d\d)x", big)
    assert fsdp2 is not None, big
    ddp, sharded = (_cell(memory, GPT2_10M, s, 2) for s in ("ddp", "fsdp2"))
    keys = ("params_bytes", "grads_bytes", "optimizer_bytes")
    state = [sum(c["memory"][k] for k in keys) for c in (ddp, sharded)]
    assert float(fsdp2.group(1)) == pytest.approx(state[1] / state[0], abs=0.005)
    rate = sharded["throughput"] / ddp["throughput"]
    assert float(fsdp2.group(2)) == pytest.approx(rate, abs=0.005)
    (faulty,) = [line for line in lines if "gpt2_scaled_rank at 2 ranks" in line]
    assert "ddp, replicate, fsdp2 not ok: no figure" in faulty
    section = strategy_section(records)  # type: ignore[arg-type]
    assert section is not None and big.removeprefix("Strategy: ") in section.notes
    # each strategy's collectives with their busbw, on the console and in the section's table
    busbw = sharded["collectives"][0]["busbw_gbps"]
    shown = f"all_gather {sharded['collectives'][0]['calls']} x "
    (line,) = [x for x in lines if x.startswith("  fsdp2's collectives per step: ") and shown in x]
    assert f"busbw {busbw:.3g} GB/s" in line, line
    cells = [text for row in section.tables[0].rows for text, _ in row]
    assert line.split(": ", 1)[1] in cells


def test_compile_modes_read_as_before_and_skip_with_the_reason() -> None:
    from torchscale.config.settings import CellSettings
    from torchscale.launch.strategy_support import compile_skip_reason

    base = {"model": "gpt2-tiny", "batch_size": 2, "gpus": 1}
    assert CellSettings.model_validate({**base, "compile": True}).compile == "ddp_optimizer"
    assert CellSettings.model_validate({**base, "compile": "off"}).compile is False
    mode = CellSettings.model_validate({**base, "compile": "compiled_autograd"}).compile
    assert mode == "compiled_autograd"
    assert compile_skip_reason("compiled_autograd") is None  # this torch has it
    assert compile_skip_reason(False) is None


@pytest.mark.slow
def test_a_compiled_autograd_cell_proves_its_gradients(tmp_path: Path) -> None:
    """In process on one gloo rank (no launch): the backward traced by compiled autograd, with
    aot_eager, and the gradient check passes on it."""
    import socket
    from datetime import timedelta

    import torch._dynamo
    import torch._dynamo.config as dynamo
    import torch.distributed as dist

    from torchscale.config.settings import CellSettings
    from torchscale.models.registry import load_model
    from torchscale.results.rank_files import RankReporter
    from torchscale.runtime.process_group import RankContext
    from torchscale.worker.measure import measure_rank
    from torchscale.worker.training import build_run

    saved = (dynamo.compiled_autograd, dynamo.optimize_ddp)
    ctx = RankContext(0, 0, 1, 1, torch.device("cpu"), "gloo", socket.gethostname())
    dist.init_process_group(
        "gloo",
        store=dist.HashStore(),  # type: ignore[attr-defined]  # torch re-exports it implicitly
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=60),
    )
    try:
        settings = CellSettings.model_validate(
            {
                "model": "gpt2-tiny",
                "batch_size": 2,
                "gpus": 1,
                "compile": "compiled_autograd",
                "compile_backend": "aot_eager",
                "warmup_steps": 1,
                "measure_steps": 2,
                "sync_probe_steps": 0,
            }
        )
        run = build_run(settings, load_model("gpt2-tiny", seq_len=16), ctx)
        result = measure_rank(run, settings, ctx, RankReporter(tmp_path, 0))
        assert run.applied["compile"] == "compiled_autograd" and dynamo.compiled_autograd
        assert dynamo.optimize_ddp == "python_reducer"
        check = result["gradient_check"]
        assert check["passed"] is True and check["relative_error"] < 1e-4, check
        assert result["collectives"] == []  # not counted around compiled code
    finally:
        dist.destroy_process_group()
        dynamo.compiled_autograd, dynamo.optimize_ddp = saved
        torch._dynamo.reset()


NO_SYNC_CONFIG = """\
experiment_name: no-sync
warmup_steps: 3
measure_steps: 5
sync_probe_steps: 2
cell_timeout_s: 240
"""


@pytest.mark.slow
def test_a_script_that_skips_synchronisation_is_invalid_naming_rank_and_factor(
    tmp_path: Path,
) -> None:
    from tests.support.shared_runs import SUPPORT_SCRIPTS
    from torchscale.cli.app import app

    config = tmp_path / "c.yaml"
    config.write_text(NO_SYNC_CONFIG, encoding="utf-8")
    script = SUPPORT_SCRIPTS / "no_sync_always.py"
    args = ["benchmark", "--script", str(script), "--gpus", "2", "-c", str(config)]
    result = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "out")])
    assert result.exit_code != 0  # an invalid cell fails the run
    (line,) = (tmp_path / "out" / "no-sync" / "results.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["status"] == "invalid"
    assert record["error"].endswith(
        "gradient check failed: rank 0's gradients are its own batch's only (2.00x its share, "
        "the other ranks' 0.00x): gradient synchronisation was skipped"
    )
    assert record["gradient_check"]["shares"] == pytest.approx([2.0, 0.0], abs=1e-6)


@pytest.mark.slow
def test_a_healthy_scripts_gradients_agree_across_ranks(own_script_run: Run) -> None:
    from torchscale.results.schema import TrainingResult
    from torchscale.results.store import ExperimentStore

    run = own_script_run
    records = [
        r for r in ExperimentStore(run.experiment_dir).records() if isinstance(r, TrainingResult)
    ]
    two = [r for r in records if r.world_size == 2]
    assert two and all(r.status == "ok" for r in two)
    for record in records:
        check = record.gradient_check
        assert check is not None and check.passed and check.cause is None
        assert check.relative_error is not None and check.relative_error <= 1e-5


def test_a_scripts_cells_are_one_per_strategy(tmp_path: Path) -> None:
    from tests.support.shared_runs import SCRIPTS
    from torchscale.script.script_kind import KIND

    script = SCRIPTS / "train_transformer.py"
    head = f"experiment_name: s\ngpu_counts: [2]\nscript:\n  path: {script}\n"
    cells = _plan(tmp_path, head + "strategy: [ddp, replicate, fsdp2]\n"
                  "reshard_after_forward: [true, false]\n")  # fmt: skip
    settings = [c.settings for c in cells]  # type: ignore[attr-defined]
    # fsdp2 once per reshard_after_forward value, the others once: each its own cell
    assert [(s.strategy, s.reshard_after_forward) for s in settings] == [
        ("ddp", True), ("replicate", True), ("fsdp2", True), ("fsdp2", False),
    ]  # fmt: skip
    ids = [c.cell_id for c in cells]  # type: ignore[attr-defined]
    assert len(set(ids)) == 4 and "-fsdp2-g2-" in ids[2] and "-replicate-g2-" in ids[1]
    (before,) = _plan(tmp_path, head)
    assert before.cell_id == ids[0]  # type: ignore[attr-defined]  # ddp: the id it had before
    assert KIND.describe(cells[3]).endswith(  # type: ignore[arg-type]
        "(your script under fsdp2, no reshard after forward)"
    )


SCRIPT_FSDP2_CONFIG = """\
experiment_name: script-fsdp2
strategy: [replicate, fsdp2]
warmup_steps: 3
measure_steps: 4
sync_probe_steps: 2
cell_timeout_s: 240
"""


@pytest.mark.slow
def test_a_scripts_ddp_call_runs_fsdp2_in_its_place(tmp_path: Path, own_script_run: Run) -> None:
    """The example script under replicate and fsdp2 at 1 and 2 ranks (a script cell is a launch
    of its own), against the shared run's ddp cells of the same script (same model: its state
    and collectives are DDP's)."""
    from tests.support.shared_runs import SCRIPTS
    from torchscale.cli.app import app
    from torchscale.results.schema import TrainingResult
    from torchscale.results.store import ExperimentStore

    config = tmp_path / "c.yaml"
    config.write_text(SCRIPT_FSDP2_CONFIG, encoding="utf-8")
    script = SCRIPTS / "train_transformer.py"
    args = ["benchmark", "--script", str(script), "--gpus", "1", "--gpus", "2", "-c", str(config)]
    # --clip 0: the script's own gradient clipping all-reduces the norm under fsdp2
    args += ["-o", str(tmp_path / "out"), "--", "--steps", "30", "--clip", "0"]
    result = CliRunner().invoke(app, args)
    lines = (tmp_path / "out" / "script-fsdp2" / "results.jsonl").read_text().splitlines()
    cells = {(r["settings"]["strategy"], r["world_size"]): r for r in map(json.loads, lines)}
    assert sorted(cells) == [("fsdp2", 1), ("fsdp2", 2), ("replicate", 1), ("replicate", 2)]
    for (strategy, ranks), cell in cells.items():
        assert cell["status"] == "ok", (strategy, ranks, cell.get("error"), result.output)
        assert cell["runtime"]["strategy"]["strategy"] == strategy
        assert cell["gradient_check"]["passed"] is True, cell["gradient_check"]
    fsdp2 = cells[("fsdp2", 2)]
    (ddp,) = [
        r
        for r in ExperimentStore(own_script_run.experiment_dir).records()
        if isinstance(r, TrainingResult) and r.world_size == 2
    ]
    assert ddp.status == "ok" and ddp.memory is not None
    assert fsdp2["settings"]["strategy"] == "fsdp2"
    applied = fsdp2["runtime"]["strategy"]
    # the model's blocks: the two layers of its TransformerEncoder's ModuleList, then the root
    assert applied["strategy"] == "fsdp2" and applied["blocks"] == 2 and applied["mesh"] == [2]
    assert fsdp2["runtime"]["ddp"] == {}  # no DDP was built
    assert fsdp2["gradient_check"]["passed"] is True
    # model state per rank: half of DDP's (the same model), within 10%
    for field in ("params_bytes", "grads_bytes", "optimizer_bytes"):
        ratio = fsdp2["memory"][field] / getattr(ddp.memory, field)
        assert ratio == pytest.approx(0.5, rel=0.10), field
    # fsdp2's collectives: parameters all-gathered, gradients reduce-scattered, no all-reduce
    issued = {c["op"]: c for c in fsdp2["collectives"]}
    whole = ddp.memory.params_bytes
    assert "all_reduce" not in issued, issued
    assert issued["all_gather"]["bytes"] > 1.5 * whole, issued  # forward, and again backward
    assert issued["reduce_scatter"]["bytes"] == pytest.approx(whole, rel=0.05)
    ddp_issued = {c.op: c for c in ddp.collectives}
    assert ddp_issued["all_reduce"].bytes == pytest.approx(whole, rel=0.01)
    assert not {"all_gather", "reduce_scatter"} & set(ddp_issued)
    # replicate: every rank keeps the whole model, its gradients all-reduced block by block
    replicate = cells[("replicate", 2)]
    replicated = {c["op"]: c for c in replicate["collectives"]}
    assert not {"all_gather", "reduce_scatter"} & set(replicated), replicated
    assert replicated["all_reduce"]["bytes"] == pytest.approx(whole, rel=0.05)
    assert replicate["memory"]["params_bytes"] == pytest.approx(whole, rel=0.05)
