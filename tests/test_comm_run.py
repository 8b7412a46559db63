"""Real communication cells: torchrun launches of 2 and 4 gloo processes on CPU.

Each sweep runs once per module and many tests read its records. The 4-process sweep runs with
the test-only corruption hook, so its checks must catch exactly the perturbed elements.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest
from typer.testing import CliRunner

from tests.support.environ import restored_environ
from torchscale.cli.app import app
from torchscale.comm.busbw import busbw_factor, layout, size_sweep
from torchscale.comm.collective_ops import CORRUPT_ENV
from torchscale.comm.config import ELEMENT_BYTES
from torchscale.results.schema import CollectiveResult, TpGemmResult
from torchscale.results.store import ExperimentStore

pytestmark = pytest.mark.slow  # every test here reads real communication cells (torchrun launches)

runner = CliRunner()
COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]

TWO_RANKS = """\
experiment_name: comm2
gpu_counts: [2]
communication:
  min_bytes: 64
  max_bytes: 4K
  factor: 4
  dtype: [float32, bf16]
  warmup: 1
  iterations: 3
  link: pcie4x16
  tp_gemm: {m: 64, n: 32, k: 48, dtype: float32}
  cell_timeout_s: 240
"""

FOUR_RANKS = """\
experiment_name: comm4
gpu_counts: [4]
communication:
  min_bytes: 256
  max_bytes: 2500
  factor: 3
  warmup: 1
  iterations: 2
  tp_gemm: {m: 64, n: 16, k: 16, dtype: float32, orders: AG_after}
  cell_timeout_s: 240
"""
CORRUPT_SIZE = 768  # all_gather at 768 B on 4 ranks: 48 float32 per rank


def run(tmp: Path, text: str, env: Dict[str, str]) -> Dict:
    config = tmp / "comm.yaml"
    config.write_text(text)
    with restored_environ(*env):
        os.environ.update(env)
        result = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(tmp / "out")])
    name = text.split("\n", 1)[0].split(": ")[1]
    store = ExperimentStore(tmp / "out" / name)
    return {"result": result, "store": store, "records": store.records()}


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Dict:
    return run(tmp_path_factory.mktemp("comm2"), TWO_RANKS, {})


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict]:
    corrupt = f"all_gather:3:{CORRUPT_SIZE},send_recv:2:{CORRUPT_SIZE},tp_gemm:1"
    yield run(
        tmp_path_factory.mktemp("comm4"),
        FOUR_RANKS,
        {"TORCHSCALE_CPU_SLOTS": "4", CORRUPT_ENV: corrupt},
    )


def collectives(records: List) -> List[CollectiveResult]:
    return [r for r in records if isinstance(r, CollectiveResult)]


def _known(times: List[Optional[float]]) -> List[float]:
    """Every rank's time, each measured."""
    assert all(t is not None for t in times), times
    return [t for t in times if t is not None]


def test_two_rank_sweep_is_complete_correct_and_ok(two: Dict) -> None:
    assert two["result"].exit_code == 0, two["result"].output
    records = collectives(two["records"])
    sizes = size_sweep(64, 4096, 4)
    expected = [
        (op, dtype, layout(op, size, ELEMENT_BYTES[dtype], 2).size_bytes)
        for op in [*COLLECTIVES, "send_recv"]
        for dtype in ("float32", "bfloat16")
        for size in sizes
    ]
    assert [(r.op, r.dtype, r.size_bytes) for r in records] == expected
    for record in records:
        assert record.status == "ok" and record.error is None
        assert record.wrong == 0, (record.op, record.size_bytes)
        assert record.world_size == 2 and record.backend == "gloo"
        assert record.time_us is not None and record.time_us_min is not None
        assert record.time_us_max is not None and record.algbw_gbps is not None
        assert record.busbw_gbps is not None and record.requested_bytes is not None
        assert record.size_bytes is not None
        assert record.time_us_min <= record.time_us <= record.time_us_max
        assert record.algbw_gbps == pytest.approx(record.size_bytes / record.time_us / 1e3)
        factor = busbw_factor(record.op, 2)
        assert record.busbw_gbps == pytest.approx(record.algbw_gbps * factor)
        lay = layout(record.op, record.requested_bytes, ELEMENT_BYTES[record.dtype], 2)
        assert record.count == lay.count
        # busbw against PCIe 4.0 x16, the link the config declared
        assert record.link == "pcie4x16"
        assert record.busbw_peak_fraction == pytest.approx(
            record.busbw_gbps / (16 * 16 * 128 / 130 / 8)
        )
        if record.op != "send_recv":
            assert len(record.per_rank_time_us) == 2
            assert record.time_us == pytest.approx(sum(_known(record.per_rank_time_us)) / 2)


def test_p2p_matrix_has_every_ordered_pair(two: Dict, four: Dict) -> None:
    for run_, n in ((two, 2), (four, 4)):
        send_recv = [r for r in collectives(run_["records"]) if r.op == "send_recv"]
        assert send_recv
        for record in send_recv:
            matrix = record.pair_time_us
            assert matrix is not None
            assert len(matrix) == n and all(len(row) == n for row in matrix)
            for src in range(n):
                for dst in range(n):
                    assert (matrix[src][dst] is None) == (src == dst)
            times = [t for row in matrix for t in row if t is not None]
            assert len(times) == n * (n - 1) and min(times) > 0
            assert record.time_us == pytest.approx(sum(times) / len(times))
            assert (record.time_us_min, record.time_us_max) == (min(times), max(times))
            assert record.slowest_pair is not None and record.pair_busbw_gbps is not None
            src, dst = record.slowest_pair
            assert matrix[src][dst] == max(times)
            bw = record.pair_busbw_gbps[src][dst]
            slowest = matrix[src][dst]
            assert slowest is not None and record.size_bytes is not None
            assert bw == pytest.approx(record.size_bytes / slowest / 1e3)


def test_tp_gemm_both_orders_validated(two: Dict) -> None:
    gemms = [r for r in two["records"] if isinstance(r, TpGemmResult)]
    assert [g.order for g in gemms] == ["AG_before", "AG_after"]
    for gemm in gemms:
        assert gemm.status == "ok" and gemm.valid is True and gemm.wrong == 0
        assert gemm.max_abs_error is not None and gemm.time_us is not None
        assert gemm.comm_time_us is not None and gemm.gemm_time_us is not None
        assert gemm.comm_share is not None and gemm.reference_time_us is not None
        assert gemm.reference_tflops is not None and gemm.atol is not None
        assert gemm.max_abs_error <= gemm.atol
        assert gemm.tflops == pytest.approx(2 * 64 * 32 * 48 / (gemm.time_us * 1e-6) / 1e12)
        assert gemm.time_us == pytest.approx(gemm.comm_time_us + gemm.gemm_time_us)
        assert 0 < gemm.comm_share < 1
        assert gemm.comm_share == pytest.approx(gemm.comm_time_us / gemm.time_us)
        assert gemm.reference_time_us > 0 and gemm.reference_tflops > 0
    before, after = gemms
    assert before.comm_bytes == 64 * 48 * 4 and after.comm_bytes == 64 * 32 * 4  # A vs C


def test_summary_csv_and_console_table(two: Dict) -> None:
    store: ExperimentStore = two["store"]
    with open(store.root / "summary_comm.csv") as handle:
        rows = list(csv.DictReader(handle))
    records = collectives(two["records"])
    assert len(rows) == len(records)
    for row, record in zip(rows, records):
        assert (row["op"], int(row["size_bytes"])) == (record.op, record.size_bytes)
        assert float(row["busbw_gbps"]) == pytest.approx(record.busbw_gbps)
    with open(store.root / "summary_tp_gemm.csv") as handle:
        assert [r["order"] for r in csv.DictReader(handle)] == ["AG_before", "AG_after"]
    stderr = two["result"].stderr
    assert "#       size         count      type   redop    root" in stderr
    first = records[0]
    assert f"{first.size_bytes:>10}  {first.count:>12}   float32     sum      -1" in stderr
    assert "# send_recv GB/s at 4096 B, row = sender, column = receiver" in stderr


def test_four_ranks_corrupted_results_are_caught_and_counted(four: Dict) -> None:
    result = four["result"]
    assert result.exit_code == 1, result.output
    records = collectives(four["records"])
    sizes = [256, 768, 2304]  # factor 3, max 2500
    assert [r.requested_bytes for r in records if r.op == "all_reduce"] == sizes
    assert {r.world_size for r in records} == {4}
    for record in records:
        assert record.status == "failed"
        assert record.requested_bytes is not None
        lay = layout(record.op, record.requested_bytes, 4, 4)
        assert (record.size_bytes, record.count) == (lay.size_bytes, lay.count)
        if record.op == "all_gather" and record.size_bytes == CORRUPT_SIZE:
            assert record.wrong == 1 and record.wrong_per_rank == [0, 0, 0, 1]
        elif record.op == "send_recv" and record.size_bytes == CORRUPT_SIZE:
            # rank 2 perturbs each message it receives: from ranks 0, 1 and 3
            assert record.wrong == 3 and record.wrong_per_rank == [0, 0, 3, 0]
        else:
            assert record.wrong == 0, (record.op, record.size_bytes)
    (gemm,) = [r for r in four["records"] if isinstance(r, TpGemmResult)]
    assert gemm.valid is False and gemm.wrong == 1 and gemm.status == "failed"
    error = records[0].error
    assert error is not None
    assert f"all_gather float32 at {CORRUPT_SIZE} B: 1 wrong element(s) on rank 3" in error
    assert f"send_recv float32 at {CORRUPT_SIZE} B: 3 wrong element(s) on rank 2" in error
    assert "tp_gemm AG_after 64x16x16 float32: 1 element(s) outside tolerance" in error
    assert "> [FAIL] failed: wrong results:" in result.stderr
    assert "1 cell(s) failed or timed out" in result.stderr
