"""A plain, hand-written DDP training loop: the baseline torchscale's throughput is checked against.

Run under torchrun: ``torchrun --nproc-per-node 2 benchmarks/plain_ddp_loop.py --model gpt2-tiny
--batch-size 8 --warmup 5 --steps 50``. It shares only the model definition with torchscale
(``load_model``); the loop, the timing and the throughput arithmetic are written here, the way a
user would write them. Rank 0 prints one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from torchscale.models.registry import load_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--cudnn-benchmark", action="store_true")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = args.cudnn_benchmark
    else:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("nccl" if cuda else "gloo")

    spec = load_model(args.model, seq_len=args.seq_len)
    torch.manual_seed(0)
    device_ids = [local_rank] if cuda else None
    module = spec.build().to(device)
    if args.channels_last:
        module = module.to(memory_format=torch.channels_last)
    model = DistributedDataParallel(module, device_ids=device_ids)
    if spec.optimizer == "adamw":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    inputs, targets = spec.batch(args.batch_size, device)
    if args.channels_last and isinstance(inputs, torch.Tensor) and inputs.dim() == 4:
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    # bf16 the way users write it: autocast around the forward, fp32 master weights.
    autocast: contextlib.AbstractContextManager[object] = (
        torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        if args.precision == "bf16"
        else contextlib.nullcontext()
    )

    # The spec's batch is a tensor, a tuple of positional inputs (BERT) or a dict of keywords.
    args_, kwargs = (
        ((), inputs)
        if isinstance(inputs, dict)
        else (tuple(inputs), {})
        if isinstance(inputs, (tuple, list))
        else ((inputs,), {})
    )

    def step() -> None:
        with autocast:
            loss = spec.loss(model(*args_, **kwargs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    elapsed = torch.tensor([time.perf_counter() - start], device=device)  # NCCL: on the GPU
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    world = dist.get_world_size()
    if dist.get_rank() == 0:
        samples = world * args.batch_size * args.steps
        print(json.dumps({"samples_per_s": samples / float(elapsed), "elapsed_s": float(elapsed)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
