"""Communication benchmarks without launches: nccl-tests' definitions, the sweep, the expected
values of the correctness check, the config section, the plan, and records from a result."""

from __future__ import annotations

import math
from pathlib import Path
from typing import List

import pytest
import torch
from typer.testing import CliRunner

from torchscale.cli.app import app
from torchscale.comm import busbw
from torchscale.comm.busbw import layout, size_sweep
from torchscale.comm.collective_ops import (
    CORRUPT_ENV,
    ROOT,
    check_input,
    corruption_from_env,
    expected_output,
    pattern,
)
from torchscale.comm.config import ELEMENT_BYTES, CommCellSettings, CommunicationSection
from torchscale.comm.kind import KIND
from torchscale.comm.scopes import distinct_scopes, scope_groups
from torchscale.comm.tp_gemm import tolerance
from torchscale.config.loader import load_config
from torchscale.config.sizes import format_size, parse_size
from torchscale.errors import ConfigError
from torchscale.hardware.links import link_peak_gbps, parse_link, pcie_lane_gbps
from torchscale.plan.matrix import expand
from torchscale.plan.training_cells import MEMORY_WINDOW
from torchscale.results.schema import CollectiveResult

runner = CliRunner()
WORLD_SIZES = (2, 4, 8)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_busbw_factors_are_nccl_tests_formulas(n: int) -> None:
    expected = {
        "all_reduce": 2 * (n - 1) / n,
        "all_gather": (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "all_to_all": (n - 1) / n,
        "broadcast": 1.0,
        "send_recv": 1.0,
    }
    for op, factor in expected.items():
        assert busbw.busbw_factor(op, n) == pytest.approx(factor)
        size, time_s = 3 * 2**20, 250e-6
        algbw = size / time_s / 1e9
        assert busbw.algbw_gbps(size, time_s) == pytest.approx(algbw)
        assert busbw.busbw_gbps(op, size, time_s, n) == pytest.approx(algbw * factor)
    with pytest.raises(ValueError, match="unknown op"):
        busbw.busbw_factor("gather", n)
    with pytest.raises(ValueError, match="world_size"):
        busbw.busbw_factor("all_reduce", 0)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_sizes_follow_nccl_tests_convention(n: int) -> None:
    for dtype, elt in ELEMENT_BYTES.items():
        requested = 1 << 20
        count = requested // elt
        for op in ("all_reduce", "broadcast", "send_recv"):
            lay = layout(op, requested, elt, n)
            assert (lay.count, lay.size_bytes) == (count, requested), (op, dtype)
            assert lay.input_elements == lay.output_elements == count
        per_rank = count // n  # 1 MiB splits evenly and 16-byte aligned for n = 2, 4, 8
        gather = layout("all_gather", requested, elt, n)
        assert (gather.count, gather.size_bytes) == (per_rank, requested)
        assert (gather.input_elements, gather.output_elements) == (per_rank, per_rank * n)
        scatter = layout("reduce_scatter", requested, elt, n)
        assert (scatter.count, scatter.size_bytes) == (per_rank, requested)
        assert (scatter.input_elements, scatter.output_elements) == (per_rank * n, per_rank)
        a2a = layout("all_to_all", requested, elt, n)
        assert (a2a.count, a2a.size_bytes) == (per_rank, requested)
        assert a2a.input_elements == a2a.output_elements == per_rank * n


def test_split_ops_round_the_per_rank_count_down_to_16_bytes() -> None:
    # 1000 B of float32 on 3 ranks: 250 elements, 83 per rank, 80 after 16-byte alignment.
    lay = layout("all_gather", 1000, 4, 3)
    assert lay.count == 80 and lay.size_bytes == 80 * 3 * 4
    # Too small to give every rank 16 bytes: nccl-tests runs (and reports) a 0-byte op.
    assert layout("reduce_scatter", 24, 4, 2).size_bytes == 0
    assert layout("all_to_all", 100, 2, 4).count == 8  # 50 halves, 12 per rank, 8 aligned


def test_size_parsing_and_sweep() -> None:
    assert [parse_size(v) for v in ("8", "1K", "64M", "1G", "1.5k", "2KiB", 4096)] == [
        8, 1024, 64 * 2**20, 2**30, 1536, 2048, 4096,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="not a size"):
        parse_size("12Q")
    assert size_sweep(8, 1024, 2) == [8 * 2**i for i in range(8)]
    assert size_sweep(8, 1000, 3) == [8, 24, 72, 216, 648]  # max not on the grid: stop below
    assert size_sweep(64, 64, 5) == [64]
    section = CommunicationSection.model_validate(
        {"min_bytes": "1K", "max_bytes": "1M", "factor": 4}
    )
    assert section.sizes() == [1024 * 4**i for i in range(6)]
    assert format_size(3 * 2**20) == "3M" and format_size(1536) == "1536"


def simulate(op: str, inputs: List[torch.Tensor], n: int, count: int) -> List[torch.Tensor]:
    """What each rank receives, computed from all ranks' inputs (no process group)."""
    total = sum(inputs)
    assert isinstance(total, torch.Tensor)
    if op == "all_reduce":
        return [total] * n
    if op == "broadcast":
        return [inputs[ROOT]] * n
    if op == "all_gather":
        return [torch.cat(inputs)] * n
    if op == "reduce_scatter":
        return [total[r * count : (r + 1) * count] for r in range(n)]
    # all_to_all: rank r receives chunk r of every rank's input, in rank order
    return [torch.cat([inp[r * count : (r + 1) * count] for inp in inputs]) for r in range(n)]


@pytest.mark.parametrize("n", [2, 3, 8])
@pytest.mark.parametrize(
    "op", ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all"]
)
def test_expected_outputs_match_a_simulated_collective(op: str, n: int) -> None:
    lay = layout(op, 4096, 4, n)
    inputs = [check_input(lay, rank, n) for rank in range(n)]
    received = simulate(op, inputs, n, lay.count)
    for rank in range(n):
        assert torch.equal(received[rank], expected_output(lay, rank, n)), (op, rank)
        assert received[rank].numel() == lay.output_elements
    # Ranks and positions differ, so a swapped chunk or a missing rank cannot pass.
    assert not torch.equal(pattern(0, 0, 64, n), pattern(1, 0, 64, n))
    assert not torch.equal(pattern(0, 0, 64, n), pattern(0, 64, 64, n))


@pytest.mark.parametrize("n", [2, 64, 256])
def test_check_values_sum_exactly_in_bfloat16(n: int) -> None:
    """Every partial sum stays an integer of magnitude <= 256: bfloat16 holds it exactly."""
    values = torch.stack([pattern(rank, 0, 512, n) for rank in range(n)])
    partial = values.cumsum(dim=0)
    assert partial.abs().max() <= 256
    assert torch.equal(partial.to(torch.bfloat16).to(torch.int64), partial)


def test_corruption_hook_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CORRUPT_ENV, "all_gather:3:768, send_recv:2,tp_gemm:1")
    hook = corruption_from_env()
    assert hook is not None
    assert hook.applies("all_gather", 3, 768) and not hook.applies("all_gather", 3, 256)
    assert not hook.applies("all_gather", 2, 768)
    assert hook.applies("send_recv", 2, 64) and hook.applies("tp_gemm", 1, None)
    monkeypatch.delenv(CORRUPT_ENV)
    assert corruption_from_env() is None


def test_link_peaks() -> None:
    assert link_peak_gbps(parse_link("nvlink4x18")) == pytest.approx(18 * 25.0)
    assert str(parse_link("NVLink4")) == "nvlink4x18"  # the generation's usual link count
    assert link_peak_gbps(parse_link("nvlink3")) == pytest.approx(12 * 25.0)
    assert pcie_lane_gbps(4) == pytest.approx(16 * 128 / 130 / 8)
    assert link_peak_gbps(parse_link("pcie4x16")) == pytest.approx(16 * 16 * 128 / 130 / 8)
    assert link_peak_gbps(parse_link("pcie3x8")) == pytest.approx(8 * 8 * 128 / 130 / 8)
    for bad, message in (("pcie4", "lane count"), ("nvlink9", "not known"), ("ib", "not known")):
        with pytest.raises(ValueError, match=message):
            parse_link(bad)


def test_tp_gemm_tolerance_grows_with_sqrt_k() -> None:
    atol_small, rtol = tolerance("float32", 64)
    atol_large, _ = tolerance("float32", 4096)
    assert atol_large == pytest.approx(atol_small * math.sqrt(4096 / 64))
    assert tolerance("bfloat16", 64)[1] > rtol  # coarser dtype, looser check


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "comm.yaml"
    path.write_text(text)
    return path


def test_communication_only_config_plans_one_cell_per_gpu_count(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            "gpu_counts: [1, 2, 4]\nrepeats: 2\ncommunication:\n  min_bytes: 8\n  max_bytes: 64\n"
            "  tp_gemm: {m: [64, 128], n: 16, k: [8, 32], dtype: [float32, bf16]}\n",
        )
    )
    plan = expand(config)
    # With a TP GEMM section one GPU is a cell too: its reference GEMM and 1-rank gather path.
    assert [(c.kind, c.settings.gpus, c.settings.repeat) for c in plan.cells] == [
        ("communication", 1, 0),
        ("communication", 2, 0),
        ("communication", 4, 0),
        ("communication", 1, 1),
        ("communication", 2, 1),
        ("communication", 4, 1),
    ]
    cells = [c for c in plan.cells if c.settings.gpus > 1]
    settings = cells[0].settings
    assert isinstance(settings, CommCellSettings)
    assert settings.sizes == [8, 16, 32, 64] and settings.dtypes == ["float32"]
    cases = {(c.m, c.k, c.dtype, c.order) for c in settings.tp_gemm}
    assert len(cases) == 2 * 2 * 2 * 2 and ("m", 128) not in cases  # type: ignore[comparison-overlap]  # a key of another shape, never a case
    assert {c.order for c in settings.tp_gemm} == {"AG_before", "AG_after"}
    # Repeats share identity: only the repeat number differs in the id.
    assert cells[0].cell_id.replace("-r0-", "-r1-") == cells[2].cell_id
    # Collectives alone: a single rank has no one to talk to.
    collectives_only = load_config(
        write(tmp_path, "gpu_counts: [1, 2]\ncommunication:\n  min_bytes: 8\n  max_bytes: 64\n")
    )
    assert [c.settings.gpus for c in expand(collectives_only).cells] == [2]


def test_scopes_split_ranks_node_by_node() -> None:
    assert scope_groups("world", 4, 2) == [[0, 1, 2, 3]]
    assert scope_groups("intra_node", 8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert scope_groups("inter_node", 8, 2) == [[0, 2, 4, 6]]
    # A scope equal to the world (one node, or one rank per node) measures nothing new.
    assert distinct_scopes(["inter_node", "world", "intra_node"], 2, 4) == [
        "inter_node",
        "world",
        "intra_node",
    ]
    assert distinct_scopes(["world", "intra_node", "inter_node"], 1, 8) == ["world"]
    assert distinct_scopes(["world", "inter_node"], 4, 1) == ["world"]
    with pytest.raises(ValueError, match="do not split into nodes of 3"):
        scope_groups("world", 4, 3)


def test_communication_cells_spread_over_nodes_like_training_cells(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            "gpu_counts: [2, 4]\nnodes: [1, 2]\n"
            "communication: {collectives: [all_reduce], scope: [world, inter_node]}\n",
        )
    )
    cells = expand(config).cells
    comm = [c.settings for c in cells if isinstance(c.settings, CommCellSettings)]
    assert len(comm) == len(cells)
    layout_ = [(s.gpus, s.nnodes, s.scopes) for s in comm]
    assert layout_ == [
        (2, 1, ["world"]),
        (2, 2, ["world"]),  # 2 x 1: the one rank per node is the world
        (4, 1, ["world"]),
        (4, 2, ["world", "inter_node"]),
    ]
    assert cells[3].cell_id.startswith("comm-g4-n2-r0-")
    # The launch's node size spreads a count when the config says nothing.
    plain = load_config(write(tmp_path, "gpu_counts: [8]\ncommunication: {scope: intra_node}\n"))
    (cell,) = expand(plain, gpus_per_node=4).cells
    assert isinstance(cell.settings, CommCellSettings)
    assert (cell.settings.nnodes, cell.settings.scopes) == (2, ["intra_node"])


def test_benchmark_selection(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            "models: [gpt2-tiny]\ngpu_counts: [1, 2]\nmeasure_steps: 40\n"
            "communication: {collectives: [all_reduce]}\n",
        )
    )
    kinds = lambda benchmark: [c.kind for c in expand(config, benchmark).cells]  # noqa: E731
    assert kinds("all") == ["training", "training", "communication"]
    assert kinds("training") == ["training", "training"]
    assert kinds("comm") == ["communication"]
    memory = expand(config, "memory").cells
    assert [c.kind for c in memory] == ["training", "training"]
    for cell in memory:
        for key, value in MEMORY_WINDOW.items():
            assert getattr(cell.settings, key) == value
    training_ids = {c.cell_id for c in expand(config, "training").cells}
    assert training_ids.isdisjoint(c.cell_id for c in memory)
    with pytest.raises(ConfigError, match="unknown --benchmark 'net'"):
        expand(config, "net")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "gpu_counts: [2]\ncommunication: {collectives: [allreduce]}\n",
            "communication.collectives[0]: Input should be 'all_reduce'",
        ),
        (
            "gpu_counts: [2]\ncommunication: {min_bytes: 1M, max_bytes: 1K}\n",
            "communication.max_bytes: 1024 B is smaller than min_bytes (1048576 B)",
        ),
        ("gpu_counts: [2]\ncommunication: {max_bytes: 12Q}\n", "'12Q' is not a size"),
        (
            "gpu_counts: [2]\ncommunication: {factor: 1}\n",
            "communication.factor: Input should be greater than or equal to 2",
        ),
        (
            "gpu_counts: [2]\ncommunication: {dtype: fp8}\n",
            "communication.dtype: Input should be 'float32'",
        ),
        ("gpu_counts: [2]\ncommunication: {link: pcie4}\n", "needs a lane count, e.g. pcie4x16"),
        (
            "gpu_counts: [2]\ncommunication: {scope: [inter-node]}\n",
            "communication.scope[0]: Input should be 'world', 'intra_node' or 'inter_node'",
        ),
        (
            "gpu_counts: [2]\ncommunication: {colectives: []}\n",
            "unknown key 'communication.colectives' (did you mean 'communication.collectives'?)",
        ),
        (
            "gpu_counts: [2]\ncommunication: {tp_gemm: {order: AG_after}}\n",
            "did you mean 'communication.tp_gemm.orders'?",
        ),
        (
            "gpu_counts: [2]\ncommunication: {collectives: [], p2p: false}\n",
            "communication: nothing to run",
        ),
        ("communication: {}\n", "communication needs at least 2 ranks but gpu_counts is [1]"),
        (
            "gpu_counts: [2, 3]\ncommunication: {tp_gemm: {m: 64}}\n",
            "m = 64 cannot be split evenly across 3 ranks",
        ),
        (
            "gpu_counts: [2]\n",
            "'models' is empty and there is no 'communication:' or 'script:' section",
        ),
    ],
)
def test_bad_communication_config_is_one_line_exit_2(
    tmp_path: Path, text: str, message: str
) -> None:
    out = tmp_path / "out"
    result = runner.invoke(app, ["benchmark", "-c", str(write(tmp_path, text)), "-o", str(out)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.stderr
    assert message in lines[0]
    assert not out.exists()


@pytest.mark.parametrize(
    ("text", "selection", "message"),
    [
        ("gpu_counts: [2]\ncommunication: {}\n", "training", "--benchmark training needs models"),
        ("models: [gpt2-tiny]\n", "comm", "--benchmark comm needs a communication: section"),
    ],
)
def test_benchmark_option_without_its_section(
    tmp_path: Path, text: str, selection: str, message: str
) -> None:
    config = write(tmp_path, text)
    args = ["benchmark", "-c", str(config), "-o", str(tmp_path / "o"), "--benchmark", selection]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and message in result.stderr


def test_records_from_a_result(tmp_path: Path) -> None:
    """The kind turns raw per-rank figures into nccl-tests figures, and any wrong element fails
    the whole cell with an error naming the op and size."""
    config = load_config(
        write(
            tmp_path,
            "gpu_counts: [2]\ncommunication: {collectives: [all_gather], p2p: true, min_bytes: 1K, max_bytes: 1K}\n",
        )
    )
    cell = expand(config).cells[0]
    lay = layout("all_gather", 1024, 4, 2)
    result = {
        "backend": "gloo",
        "device_name": "cpu",
        "hosts": ["h"],
        "collectives": [
            {
                "op": "all_gather",
                "dtype": "float32",
                "requested_bytes": 1024,
                "size_bytes": lay.size_bytes,
                "count": lay.count,
                "time_us": [10.0, 30.0],
                "wrong": [0, 2],
            },
        ],
        "p2p": [
            {
                "dtype": "float32",
                "requested_bytes": 1024,
                "size_bytes": 1024,
                "count": 256,
                "per_rank": [
                    {"send": {"0,1": 5.0}, "recv": {"1,0": 8.0}, "wrong": {"1,0": 0}},
                    {"send": {"1,0": 9.0}, "recv": {"0,1": 4.0}, "wrong": {"0,1": 0}},
                ],
            },
        ],
        "tp_gemm": [],
    }
    identity = {"cell_id": cell.cell_id, "experiment": "x", "world_size": 2, "nproc_per_node": 2}
    gather, send_recv = KIND.records(cell, identity, result)
    assert isinstance(gather, CollectiveResult) and isinstance(send_recv, CollectiveResult)
    assert gather.time_us == 20.0 and (gather.time_us_min, gather.time_us_max) == (10.0, 30.0)
    assert gather.algbw_gbps == pytest.approx(1024 / 20e-6 / 1e9)
    assert gather.algbw_gbps is not None
    assert gather.busbw_gbps == pytest.approx(gather.algbw_gbps * 0.5)
    assert gather.wrong == 2 and gather.wrong_per_rank == [0, 2]
    assert send_recv.pair_time_us == [[None, 5.0], [9.0, None]]  # the slower side of each pair
    assert send_recv.slowest_pair == [1, 0] and send_recv.wrong == 0
    assert send_recv.time_us == pytest.approx(7.0)
    for record in (gather, send_recv):
        assert record.status == "failed"
        assert (
            record.error
            == "wrong results: all_gather float32 at 1024 B: 2 wrong element(s) on rank 1"
        )


def test_a_hung_communication_cell_names_the_op_and_size(tmp_path: Path) -> None:
    from torchscale.launch.cell import _stuck_ranks
    from torchscale.results.rank_files import RankReporter

    slow, done = RankReporter(tmp_path, 0), RankReporter(tmp_path, 1)
    slow.phase("measure", where="all_reduce float32 at 4096 B")
    done.phase("gather")
    message = _stuck_ranks(tmp_path, 3, 60)
    assert message == (
        "no result after 60 s: rank(s) [2] never started; rank 0 stuck in 'measure' "
        "(all_reduce float32 at 4096 B); rank 1 waiting in 'gather'"
    )


def test_communication_config_errors_and_dry_run_do_not_import_torch(tmp_path: Path) -> None:
    from tests.test_cli import run_without_torch

    bad = write(tmp_path, "gpu_counts: [2]\ncommunication: {min_bytes: 1M, max_bytes: 1K}\n")
    assert run_without_torch(["benchmark", "--config", str(bad)]) == "2 []"
    good = tmp_path / "good.yaml"
    good.write_text("gpu_counts: [2]\ncommunication: {}\n")
    args = ["benchmark", "-c", str(good), "-o", str(tmp_path / "o"), "--dry-run"]
    assert run_without_torch(args) == "0 []"
