"""The worker's CUDA-path decisions, checked on CPU: a real one-rank gloo DDP run of resnet-tiny,
with torch.cuda's calls replaced only where no GPU can answer. What the installed torch does
(its DDP logging rate, the flight recorder's variables) is observed by running it, never read
from its source files."""

from __future__ import annotations

import ast
import os
import pickle
import socket
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any, Dict, Iterator, List

import pytest
import torch
import torch.distributed as dist

import torchscale.worker.measure as measure
from torchscale.config.settings import CellSettings
from torchscale.launch.flight_recorder import (
    collective_timed_out,
    dump_note,
    dumps,
    flight_recorder_env,
)
from torchscale.models.registry import load_model
from torchscale.results.rank_files import RankReporter
from torchscale.runtime import process_group as distributed
from torchscale.runtime.clock import Clock
from torchscale.runtime.process_group import RankContext
from torchscale.worker import profiler
from torchscale.worker.aggregate import epoch_stats
from torchscale.worker.batches import LoaderBatches
from torchscale.worker.training import apply_math_settings, build_run

CPU = RankContext(0, 0, 1, 1, torch.device("cpu"), "gloo", socket.gethostname())
CUDA = RankContext(0, 0, 1, 1, torch.device("cuda", 0), "nccl", socket.gethostname())


@pytest.fixture
def one_rank() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one CPU "GPU", as the launched workers get
    dist.init_process_group(
        "gloo",
        store=dist.HashStore(),  # type: ignore[attr-defined]  # torch re-exports it implicitly
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=60),
    )
    try:
        yield
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(threads)


@pytest.fixture
def torch_flags() -> Iterator[None]:
    """Put torch's global math flags back after a test sets them."""
    saved = (
        torch.backends.cudnn.benchmark,
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    yield
    torch.backends.cudnn.benchmark = saved[0]
    torch.backends.cuda.matmul.allow_tf32 = saved[1]
    torch.backends.cudnn.allow_tf32 = saved[2]


def settings(**knobs: Any) -> CellSettings:
    base: Dict[str, Any] = {"model": "resnet-tiny", "batch_size": 2, "gpus": 1}
    return CellSettings.model_validate({**base, "warmup_steps": 1, "measure_steps": 2, **knobs})


def test_ddp_logging_goes_back_to_torchs_sample_rate_after_the_probe(one_rank):
    run = build_run(settings(), load_model("resnet-tiny"), CPU)
    rates: List[int] = []
    assert run.ddp is not None
    real = run.ddp._set_ddp_runtime_logging_sample_rate

    def recorded(rate: int) -> None:
        rates.append(rate)
        real(rate)

    run.ddp._set_ddp_runtime_logging_sample_rate = recorded  # type: ignore[method-assign]  # a spy
    timings = measure._ddp_logging_probe(run, Clock(CPU.device), 1)
    assert rates == [1, measure.DDP_DEFAULT_LOGGING_SAMPLE_RATE]
    assert timings["ddp_forward_compute_ms"] is not None
    # torch's own default, as a fresh DDP samples: the first ten iterations, then every R-th
    rate = measure.DDP_DEFAULT_LOGGING_SAMPLE_RATE
    assert _sampled_iterations(2 * rate + 12) == [*range(11), rate, 2 * rate]


def _sampled_iterations(steps: int) -> List[int]:
    """The iterations whose runtime stats a fresh DDP's logger recorded in ``steps`` steps."""
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    batch = torch.ones(1, 2)
    seen: List[int] = []
    for _ in range(steps):
        ddp(batch).sum().backward()
        iteration = ddp._get_ddp_logging_data().get("iteration")
        if iteration not in seen:
            seen.append(iteration)
    return seen


@pytest.mark.parametrize("source", ["synthetic", "tensor_file"])
def test_channels_last_converts_the_batches_once(one_rank, tmp_path, source):
    data: Dict[str, Any] = {"source": source}
    if source == "tensor_file":
        data |= {"path": str(tmp_path / "d.pt"), "num_workers": 0}
        inputs = torch.randn(8, 3, 32, 32)
        torch.save({"inputs": inputs, "targets": torch.randint(0, 10, (8,))}, data["path"])
    run = build_run(settings(channels_last=True, data=data), load_model("resnet-tiny"), CPU)
    first, _ = next(run.batches)
    assert first.is_contiguous(memory_format=torch.channels_last)
    assert not first.is_contiguous()  # NHWC strides, not a 1-channel corner case
    if source == "synthetic":
        assert next(run.batches)[0] is first  # converted once, reused every step
    plain = build_run(settings(), load_model("resnet-tiny"), CPU)
    assert next(plain.batches)[0].is_contiguous()


def test_cudnn_benchmark_and_tf32_knobs_are_applied_and_recorded(torch_flags):
    conv = load_model("resnet-tiny").build()
    default = apply_math_settings(settings(), CUDA, conv)
    assert torch.backends.cudnn.benchmark is True and default["cudnn_benchmark"] is True
    # PyTorch's defaults: cuDNN convolutions in TF32, matmuls not: a convnet's fp32 MFU is
    # scored against the TF32 peak, a transformer's against plain FP32
    assert default["allow_tf32"] == {"matmul": False, "cudnn": True}
    assert default["peak_precision"] == "tf32"
    linear = torch.nn.Sequential(torch.nn.Linear(4, 4))
    assert apply_math_settings(settings(), CUDA, linear)["peak_precision"] == "fp32"
    off = apply_math_settings(settings(cudnn_benchmark=False, tf32=False), CUDA, conv)
    assert torch.backends.cudnn.benchmark is False and off["cudnn_benchmark"] is False
    assert off["allow_tf32"] == {"matmul": False, "cudnn": False}
    assert off["peak_precision"] == "fp32"
    on = apply_math_settings(settings(tf32=True), CUDA, linear)
    assert on["allow_tf32"] == {"matmul": True, "cudnn": True}
    assert on["peak_precision"] == "tf32"
    assert apply_math_settings(settings(precision="bf16"), CUDA, conv)["peak_precision"] == "bf16"
    assert apply_math_settings(settings(), CPU, conv)["cudnn_benchmark"] is None


def test_peak_memory_starts_at_the_measured_window(one_rank, tmp_path, monkeypatch):
    run = build_run(settings(sync_probe_steps=0), load_model("resnet-tiny"), CPU)
    steps: List[bool] = []
    real_step = run.step
    run.step = lambda *a, **k: (steps.append(True), real_step(*a, **k))[1]  # type: ignore
    resets: List[int] = []
    monkeypatch.setattr(measure, "reset_peak_memory", lambda ctx: resets.append(len(steps)))
    measure.measure_rank(run, settings(sync_probe_steps=0), CPU, RankReporter(tmp_path, 0))
    assert resets == [1]  # after the one warm-up step, before the two measured ones


@pytest.mark.parametrize("epochs", [None, 2])
@pytest.mark.parametrize("strict", [True, False])
def test_sync_cuda_synchronises_the_device_after_every_measured_step(
    one_rank, tmp_path, monkeypatch, strict, epochs
):
    """``sync_cuda: true``: a device synchronize after each measured step (each epoch's too);
    false: only at the window's two ends, so the host runs ahead as on a real job."""
    events: List[str] = []

    class CountingClock(Clock):
        def synchronize(self) -> None:  # the device synchronize the measuring loop calls
            events.append("sync")
            super().synchronize()

    knobs = {"sync_probe_steps": 0, "measure_steps": 3, "sync_cuda": strict, "epochs": epochs}
    run = build_run(settings(**knobs), load_model("resnet-tiny"), CPU)
    real_step = run.step
    run.step = lambda *a, **k: (events.append("step"), real_step(*a, **k))[1]  # type: ignore
    monkeypatch.setattr(measure, "Clock", CountingClock)
    monkeypatch.setattr(measure, "reset_peak_memory", lambda ctx: events.append("measure"))
    result = measure.measure_rank(run, settings(**knobs), CPU, RankReporter(tmp_path, 0))
    passes = epochs or 1
    assert result["measure_steps"] == 3 * passes
    window = ["sync", *(["step", "sync"] if strict else ["step"]) * 3, "sync"]
    # then, outside the windows, the one step whose collectives are counted
    assert events[events.index("measure") + 1 :] == [*window * passes, "step"]


def test_epochs_over_an_image_folder_are_whole_passes(one_rank, tmp_path):
    """``epochs: 2`` over 2 classes x 5 images at batch 2: each epoch is one fresh pass of 5
    steps, timed on its own, never running into the next pass."""
    from PIL import Image

    for label in ("cat", "dog"):
        (tmp_path / "images" / label).mkdir(parents=True)
        for index in range(5):
            colour = (index * 40, 90 if label == "cat" else 180, 30)
            Image.new("RGB", (20, 20), colour).save(tmp_path / "images" / label / f"{index}.png")
    data = {"source": "image_folder", "path": str(tmp_path / "images"), "num_workers": 0}
    knobs = {"sync_probe_steps": 0, "measure_steps": None, "epochs": 2, "data": data}
    run = build_run(settings(**knobs), load_model("resnet-tiny"), CPU)
    result = measure.measure_rank(run, settings(**knobs), CPU, RankReporter(tmp_path, 0))
    assert [(e["epoch"], e["steps"]) for e in result["epochs"]] == [(1, 5), (2, 5)]
    assert all(e["window_s"] > 0 for e in result["epochs"])
    assert result["measure_steps"] == len(result["step_times_ms"]) == 10
    # the warm-up's, one fresh pass per epoch, then the counted step's (after the windows)
    assert isinstance(run.batches, LoaderBatches)
    assert run.batches.passes == 4
    # metrics_epoch.jsonl's lines: each pass's ten images at its own rate
    lines = epoch_stats([result], global_batch=2, units_per_sample=1.0)
    assert [e["samples"] for e in lines] == [10, 10]
    for index, (line, epoch) in enumerate(zip(lines, result["epochs"])):
        assert line["samples_per_s"] == pytest.approx(10 / epoch["window_s"])
        own = result["step_times_ms"][5 * index : 5 * index + 5]  # the epoch's own steps
        assert line["step_time_ms"]["mean"] == pytest.approx(sum(own) / 5)


def test_peak_memory_reset_is_torchs_on_the_rank_device(monkeypatch):
    reset_on: List[Any] = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset_on.append)
    measure.reset_peak_memory(CPU)
    measure.reset_peak_memory(CUDA)
    assert reset_on == [CUDA.device]


def test_activations_count_ddps_second_gradient_copy():
    gib = 1 << 30
    # 1 GiB params, 1 GiB grads, 2 GiB AdamW state, 10 GiB peak
    assert measure.activation_bytes(10 * gib, gib, gib, 2 * gib, True) == 6 * gib
    assert measure.activation_bytes(10 * gib, gib, gib, 2 * gib, False) == 5 * gib


def test_process_group_fails_a_hung_collective_before_the_launcher_kills_the_cell(monkeypatch):
    seen: Dict[str, Any] = {}
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: seen.update(kw))
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    distributed.init_distributed(1800.0)
    assert seen["timeout"] == timedelta(seconds=600)
    distributed.init_distributed(300.0)
    assert seen["timeout"] == timedelta(seconds=150)
    distributed.init_distributed(20.0)  # a test-sized cell: a minute, the launcher fires first
    assert seen["timeout"] == timedelta(seconds=60)


FLIGHT_RECORDER_NAMES = (
    "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE",
)  # fmt: skip
RECORDED = """
import os, pickle, sys, torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
for _ in range(3):
    dist.all_reduce(torch.ones(2))
dump = getattr(torch._C._distributed_c10d, "_dump_fr_trace", None)  # torch >= 2.6
# Without stack traces: symbolising them took seconds and the names are all that is read here.
entries = None if dump is None else pickle.loads(dump(includeStackTraces=False))["entries"]
print(None if entries is None else [e["profiling_name"] for e in entries])
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # torch's interpreter teardown (~1.5 s) checks nothing
"""


def test_the_flight_recorder_env_is_what_this_torch_reads(tmp_path, monkeypatch):
    for name in FLIGHT_RECORDER_NAMES:
        monkeypatch.delenv(name, raising=False)
    env = flight_recorder_env(tmp_path)
    prefix = str(tmp_path / "flight_recorder" / "rank_")
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == prefix
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    # The installed torch, run with that environment: it records the collectives, and warns of
    # no variable under a retired name (torch 2.14 warns for TORCH_NCCL_TRACE_BUFFER_SIZE).
    ran = subprocess.run(
        [sys.executable, "-c", RECORDED], env={**os.environ, **env}, capture_output=True,
        text=True, timeout=120, check=True,
    )  # fmt: skip
    assert "deprecated" not in ran.stderr, ran.stderr
    recorded = ast.literal_eval(ran.stdout.strip().splitlines()[-1])
    assert recorded is None or recorded == ["gloo:all_reduce"] * 3, recorded
    assert (tmp_path / "flight_recorder").is_dir() and dump_note(tmp_path) == ""
    (tmp_path / "flight_recorder" / "rank_1").write_bytes(b"pickle")
    assert "dumps of 1 rank(s)" in dump_note(tmp_path) and "torchfrtrace" in dump_note(tmp_path)
    # NCCL's watchdog aborts the process: no error file, but the dumps say a collective hung;
    # a rank that crashed is the root cause even with dumps beside it
    assert collective_timed_out([], tmp_path)
    assert not collective_timed_out([{"type": "RuntimeError", "message": "boom"}], tmp_path)
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", "/mine/")
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "10")
    mine = flight_recorder_env(tmp_path)  # the user's settings win
    assert not {"TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_TRACE_BUFFER_SIZE"} & set(mine)


NCCL_HANG = """
import sys, time, torch, torch.distributed as dist
from datetime import timedelta
rank = int(sys.argv[1])
torch.cuda.set_device(rank)
dist.init_process_group(
    "nccl", init_method=sys.argv[2], rank=rank, world_size=2, timeout=timedelta(seconds=5)
)
x = torch.ones(4, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
if rank == 0:
    dist.all_reduce(x)  # rank 1 never joins: NCCL's watchdog times it out and dumps
    torch.cuda.synchronize()
time.sleep(120)
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not (torch.cuda.device_count() >= 2 and dist.is_nccl_available()),
    reason="a hung NCCL collective needs two GPUs (the dump is NCCL's watchdog's)",
)
def test_a_hung_nccl_collective_dumps_into_the_cell_folder(tmp_path):
    env = {**os.environ, **flight_recorder_env(tmp_path)}
    store = f"file://{tmp_path / 'rendezvous'}"
    ranks = [
        subprocess.Popen([sys.executable, "-c", NCCL_HANG, str(rank), store], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for rank in (0, 1)
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not dumps(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2)  # the dump is written, then renamed into place: let it finish
    finally:
        for process in ranks:
            process.kill()
            process.wait()
    found = {path.name: path for path in dumps(tmp_path)}
    assert "rank_0" in found, sorted(found)
    entries = pickle.loads(found["rank_0"].read_bytes())["entries"]
    assert any("all_reduce" in entry["profiling_name"] for entry in entries)
    assert collective_timed_out([], tmp_path) and "torchfrtrace" in dump_note(tmp_path)


def test_gloo_collective_timeouts_are_timeouts_other_errors_are_not(tmp_path):
    gloo: Dict[str, object] = {
        "type": "RuntimeError",  # what torch 2.15's gloo raised in a 2-rank run here
        "message": "[third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
        "waiting 3000ms for recv operation to complete",
    }
    crash: Dict[str, object] = {"type": "RuntimeError", "message": "injected crash"}
    assert collective_timed_out([gloo], tmp_path)
    assert not collective_timed_out([gloo, crash], tmp_path)
    assert not collective_timed_out([], tmp_path)


def test_nsys_window_marks_the_rank_and_warms_up_before_step_ranges(monkeypatch):
    calls: List[str] = []

    class Ranged:
        def __init__(self, name: str) -> None:
            self.name = name

        def __enter__(self) -> None:
            calls.append(f"push {self.name}")

        def __exit__(self, *exc: Any) -> None:
            calls.append(f"pop {self.name}")

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("cudaProfilerStart"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("cudaProfilerStop"))
    monkeypatch.setattr(torch.cuda.nvtx, "range", Ranged)
    monkeypatch.setattr(torch.cuda.nvtx, "mark", lambda text: calls.append(f"mark {text}"))

    class Run:
        def step(self, clock: Any, annotate: Any = None) -> None:
            calls.append("step")

    ctx = RankContext(3, 3, 4, 4, torch.device("cuda", 3), "nccl", "h")
    profiler._nvtx_window(Run(), None, 2, ctx)  # type: ignore[arg-type]
    assert calls == [
        "cudaProfilerStart",
        "mark torchscale rank=3 world_size=4",
        f"push {profiler.NVTX_WARMUP}",
        "step",
        f"pop {profiler.NVTX_WARMUP}",
        "push step 0",
        "step",
        "pop step 0",
        "push step 1",
        "step",
        "pop step 1",
        "cudaProfilerStop",
    ]
    from torchscale.profiling.analyzers.steps import STEP_NAME_RE
    from torchscale.profiling.traces.nsys_ranks import RANK_MARK

    assert not STEP_NAME_RE.match(profiler.NVTX_WARMUP)
    marked = RANK_MARK.match("torchscale rank=3 world_size=4")
    assert marked is not None and marked.group(1) == "3"
