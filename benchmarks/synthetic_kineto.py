"""Write a synthetic PyTorch profiler (Kineto) trace with the layout and event mix of a real one.

Used by ``trace_analysis_speed.py``. The structure follows the real traces in ``shared/traces``:
per kernel a ``cudaLaunchKernel`` runtime event and an ``ac2g`` flow pair; ``cpu_op`` events that
launch the kernels; ``ProfilerStep#N`` ranges; NCCL all-reduce kernels on their own stream that
overlap the backward pass; a host-to-device copy and a memset per step. Kineto's own layout
(one key group per line, ``args`` last) is reproduced so the file reads like one torch writes.
"""

# ruff: noqa: E501  (kernel names and trace text are data, kept whole)
from __future__ import annotations

import gzip
import random
from pathlib import Path
from typing import IO, List

COMPUTE_KERNELS = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, float, float,"
    " at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 2> >(int,"
    " at::native::AUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >,"
    " at::detail::Array<char*, 2>)",
    "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4"
    "_execute_kernel_trt",
    "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 32, true, 1>(float, float, float, float,"
    " cudnnTensorStruct, float const*, cudnnTensorStruct, float const*, cudnnTensorStruct, float*,"
    " float const*, float*, float*, float const*, float const*, float)",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float,"
    " float const*, float const*, float const*, float*, float*, float*)",
    "ampere_sgemm_128x64_tn",
    "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<"
    "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::"
    "{lambda()#7}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, "
    "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::"
    "{lambda()#7}::operator()() const::{lambda(float)#1} const&)::{lambda(int)#1}>(int, "
    "at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::"
    "{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}>"
    "(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::"
    "{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1} const&)::"
    "{lambda(int)#1})",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
    "namespace)::TensorListMetadata<3>, at::native::(anonymous namespace)::FusedSgdMathFunctor<float, 3>"
    ", float*, float, float, float, bool, bool, bool, float*, float*, float const*>(...)",
]
CPU_OPS = [
    "aten::addmm",
    "aten::mm",
    "aten::native_layer_norm",
    "aten::mul",
    "aten::copy_",
    "aten::cudnn_batch_norm_backward",
    "aten::_fused_sgd_",
]
ALLREDUCE_KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
COMPUTE_STREAM = 7
COMM_STREAM = 20
PID = 4242
MAIN_TID = 4242
BWD_TID = 4300


class _Writer:
    """Accumulate event text and flush it in large writes (the file can be gigabytes)."""

    def __init__(self, fh: IO[str]) -> None:
        self.fh = fh
        self.parts: List[str] = []
        self.count = 0

    def event(self, text: str) -> None:
        self.parts.append(text)
        self.count += 1
        if len(self.parts) >= 20000:
            self.flush()

    def flush(self) -> None:
        if self.parts:
            self.fh.write(",\n".join(self.parts) + ",\n")
            self.parts = []


def _x(cat: str, name: str, pid: int, tid: int, ts: float, dur: float, args: str) -> str:
    return (
        f'  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": {pid}, "tid": {tid},\n'
        f'    "ts": {ts:.3f}, "dur": {dur:.3f},\n    "args": {{\n      {args}\n    }}\n  }}'
    )


def _launch(tid: int, ts: float, dur: float, corr: int) -> str:
    return _x(
        "cuda_runtime",
        "cudaLaunchKernel",
        PID,
        tid,
        ts,
        dur,
        f'"External id": {corr}, "cbid": 211, "correlation": {corr}',
    )


def _flow(ph: str, ident: int, pid: int, tid: int, ts: float) -> str:
    end = ', "bp": "e"' if ph == "f" else ""
    return (
        f'  {{\n    "ph": "{ph}", "id": {ident}, "pid": {pid}, "tid": {tid}, "ts": {ts:.3f},\n'
        f'    "cat": "ac2g", "name": "ac2g"{end}\n  }}'
    )


def _kernel_args(ext: int, stream: int, corr: int, extra: str = "") -> str:
    return (
        f'"External id": {ext},      "queued": 0, "device": 0, "context": 1,      "stream": {stream}, '
        f'"correlation": {corr},      "registers per thread": 40,      "shared memory": 400,      '
        f'"blocks per SM": 4.740741,      "warps per SM": 75.851852,      "grid": [512, 1, 1],      '
        f'"block": [512, 1, 1],      "est. achieved occupancy %": 75{extra}'
    )


def write_kineto_trace(
    path: Path,
    *,
    rank: int = 0,
    world_size: int = 8,
    steps: int = 200,
    kernels_per_step: int = 5000,
    allreduce_every: int = 50,
    seed: int = 0,
) -> int:
    """Write the trace to ``path`` (``.json`` or ``.json.gz``); return the number of GPU kernels."""
    rng = random.Random(seed)
    opener = gzip.open if path.name.endswith(".gz") else open
    kernels = 0
    corr = 1
    with opener(path, "wt", encoding="utf-8") as fh:  # type: ignore[operator]
        fh.write(
            '{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {\n      "id": 0, "name": '
            '"NVIDIA H100 80GB HBM3", "totalGlobalMem": 84942979072,\n      "computeMajor": 9, '
            '"computeMinor": 0, "numSms": 132\n    }\n  ],\n  "distributedInfo": {"backend": "nccl", '
            f'"rank": {rank}, "world_size": {world_size}, "nccl_version": "2.21.5"}},\n'
            '  "traceEvents": [\n'
        )
        out = _Writer(fh)
        out.event(
            '  {\n    "name": "process_name", "ph": "M", "ts": 1000.000, "pid": 0, "tid": 0,\n'
            '    "args": {\n      "name": "python3"\n    }\n  }'
        )
        t = 1_000_000.0
        for step in range(steps):
            step_start = t
            gpu_t = t + 30.0
            bwd_start = kernels_per_step // 3
            opt_start = kernels_per_step - kernels_per_step // 10
            comm_t = 0.0
            copy_corr = corr
            corr += 1
            out.event(
                _x(
                    "cuda_runtime",
                    "cudaMemcpyAsync",
                    PID,
                    MAIN_TID,
                    t + 5,
                    8.0,
                    f'"External id": {copy_corr}, "cbid": 41, "correlation": {copy_corr}',
                )
            )
            out.event(
                _x(
                    "gpu_memcpy",
                    "Memcpy HtoD (Pinned -> Device)",
                    0,
                    COMPUTE_STREAM,
                    gpu_t,
                    25.0,
                    f'"External id": {copy_corr}, "device": 0, "context": 1, "stream": '
                    f'{COMPUTE_STREAM}, "correlation": {copy_corr}, "bytes": 6422528, '
                    '"memory bandwidth (GB/s)": 256.9',
                )
            )
            gpu_t += 26.0
            cpu_t = t + 20.0
            for k in range(kernels_per_step):
                tid = BWD_TID if bwd_start <= k < opt_start else MAIN_TID
                name = COMPUTE_KERNELS[k % len(COMPUTE_KERNELS)]
                dur = rng.uniform(2.0, 60.0)
                if k % 2 == 0:
                    op = CPU_OPS[(k // 2) % len(CPU_OPS)]
                    out.event(
                        _x(
                            "cpu_op",
                            op,
                            PID,
                            tid,
                            cpu_t,
                            14.0,
                            f'"External id": {corr}, "Record function id": 0, "Ev Idx": {corr}',
                        )
                    )
                launch_ts = cpu_t + 2.0
                out.event(_launch(tid, launch_ts, 4.5, corr))
                out.event(_flow("s", corr, PID, tid, launch_ts))
                gpu_t = max(gpu_t, launch_ts + 5.0)
                out.event(
                    _x(
                        "kernel",
                        name,
                        0,
                        COMPUTE_STREAM,
                        gpu_t,
                        dur,
                        _kernel_args(corr, COMPUTE_STREAM, corr),
                    )
                )
                out.event(_flow("f", corr, 0, COMPUTE_STREAM, gpu_t))
                kernels += 1
                corr += 1
                gpu_t += dur + rng.uniform(0.5, 4.0)
                cpu_t += 7.0
                if bwd_start < k < opt_start and k % allreduce_every == 0:
                    comm_ts = max(gpu_t, comm_t)
                    comm_dur = rng.uniform(200.0, 900.0)
                    out.event(
                        _x(
                            "user_annotation",
                            "nccl:all_reduce",
                            PID,
                            tid,
                            cpu_t,
                            12.0,
                            f'"External id": {corr}, "Record function id": 0',
                        )
                    )
                    out.event(_launch(tid, cpu_t + 3, 5.0, corr))
                    extra = (
                        ', "Collective name": "allreduce", "In msg nelems": 6637568, '
                        f'"Out msg nelems": 6637568, "Group size": {world_size}, "dtype": "Float",'
                        ' "Process Group Name": "0", "Process Group Description": "default_pg"'
                    )
                    out.event(
                        _x(
                            "kernel",
                            ALLREDUCE_KERNEL,
                            0,
                            COMM_STREAM,
                            comm_ts,
                            comm_dur,
                            _kernel_args(corr, COMM_STREAM, corr, extra),
                        )
                    )
                    kernels += 1
                    corr += 1
                    comm_t = comm_ts + comm_dur
                    cpu_t += 20.0
            if step % 10 == 0:
                out.event(
                    _x(
                        "gpu_memset",
                        "Memset (Device)",
                        0,
                        COMPUTE_STREAM,
                        gpu_t,
                        3.0,
                        f'"External id": {corr}, "device": 0, "context": 1, "stream": '
                        f'{COMPUTE_STREAM}, "correlation": {corr}, "bytes": 4096',
                    )
                )
                out.event(
                    _x(
                        "cuda_runtime",
                        "cudaMemsetAsync",
                        PID,
                        MAIN_TID,
                        cpu_t,
                        3.0,
                        f'"External id": {corr}, "cbid": 51, "correlation": {corr}',
                    )
                )
                corr += 1
            t = max(gpu_t, comm_t, cpu_t) + 50.0
            out.event(
                _x(
                    "user_annotation",
                    f"ProfilerStep#{step}",
                    PID,
                    MAIN_TID,
                    step_start,
                    t - step_start - 10.0,
                    f'"External id": {corr}, "Record function id": 0',
                )
            )
        out.flush()
        fh.write(
            '  {\n    "name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", '
            f'"ts": {t:.3f}\n  }}\n  ],\n  "traceName": "{path.name}",\n  "displayTimeUnit": "ms",\n'
            '  "baseTimeNanoseconds": 1711964646000000000\n}\n'
        )
    return kernels


DENSE_KERNELS = (
    "ampere_sgemm_128x64_tn",
    "vectorized_elementwise_kernel",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
)


def write_dense_trace(path: Path, events: int, *, kernels_per_step: int = 1000) -> int:
    """Write a trace of ``events`` compact events: per kernel a ``cpu_op``, its
    ``cudaLaunchKernel`` and the kernel (every 20th an NCCL all-reduce on its own stream), and a
    ``ProfilerStep#N`` range per ``kernels_per_step`` kernels. Short, repetitive lines, as a
    large trace of small kernels is: 10M events are ~1.1 GB of JSON, ~30 MB gzipped. Returns the
    number of events written."""
    opener = gzip.open if path.name.endswith(".gz") else open
    kwargs = {"compresslevel": 1} if path.name.endswith(".gz") else {}
    written = 0
    with opener(path, "wt", encoding="utf-8", **kwargs) as fh:  # type: ignore[operator]
        fh.write(
            '{"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, '
            '"world_size": 2}, "traceEvents": [\n'
        )
        parts: List[str] = []
        t, step, corr = 1_000_000, 0, 1
        step_start, in_step = t, 0
        while written + 4 <= events:
            name = DENSE_KERNELS[2] if corr % 20 == 0 else DENSE_KERNELS[corr % 2]
            stream = 20 if corr % 20 == 0 else 7
            parts.append(
                f'{{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":1,"ts":{t},"dur":9}},\n'
                f'{{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,'
                f'"ts":{t + 2},"dur":4,"args":{{"correlation":{corr}}}}},\n'
                f'{{"ph":"X","cat":"kernel","name":"{name}","pid":0,"tid":{stream},"ts":{t + 8},'
                f'"dur":{6 + corr % 5},"args":{{"stream":{stream},"correlation":{corr}}}}},\n'
            )
            written += 3
            t += 10
            corr += 1
            in_step += 1
            if in_step == kernels_per_step:
                parts.append(
                    f'{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#{step}","pid":1,'
                    f'"tid":1,"ts":{step_start},"dur":{t - step_start}}},\n'
                )
                written += 1
                step, step_start, in_step = step + 1, t, 0
            if len(parts) >= 20000:
                fh.write("".join(parts))
                parts = []
        fh.write("".join(parts))
        fh.write(f'{{"ph":"i","name":"end","pid":1,"tid":1,"ts":{t},"s":"g"}}\n]}}\n')
    return written


def write_kernel_trace(path: Path, events: int) -> int:
    """Write ``events`` kernel events and nothing else (every event is kept: the most memory an
    event can cost); every 20th an NCCL all-reduce on stream 20. Returns the events written."""
    opener = gzip.open if path.name.endswith(".gz") else open
    kwargs = {"compresslevel": 1} if path.name.endswith(".gz") else {}
    with opener(path, "wt", encoding="utf-8", **kwargs) as fh:  # type: ignore[operator]
        fh.write('{"traceEvents": [\n')
        parts: List[str] = []
        t = 1_000_000
        for i in range(events):
            stream = 20 if i % 20 == 0 else 7
            name = DENSE_KERNELS[2] if stream == 20 else DENSE_KERNELS[0]
            parts.append(
                f'{{"ph":"X","cat":"kernel","name":"{name}","pid":0,"tid":{stream},"ts":{t},'
                f'"dur":{6 + i % 5},"args":{{"stream":{stream},"correlation":{i}}}}},\n'
            )
            t += 10
            if len(parts) >= 50000:
                fh.write("".join(parts))
                parts = []
        fh.write("".join(parts))
        fh.write(f'{{"ph":"i","name":"end","pid":1,"tid":1,"ts":{t},"s":"g"}}\n]}}\n')
    return events
