"""Train a small GPT-style language model with DistributedDataParallel on synthetic tokens.

A training script written the way people write them: nothing here knows about torchscale.

    torchrun --nproc-per-node 2 examples/scripts/train_transformer.py --steps 200
    torchscale benchmark --script examples/scripts/train_transformer.py --gpus 1 --gpus 2 \\
        -- --steps 200

Rank 0 prints the job's sequences/s (samples/s) and tokens/s every --log-every steps, over the
wall time of those steps. Mixed precision with --bf16 (autocast), gradient clipping with --clip.
"""

import argparse
import contextlib
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps to train")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per rank per step")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--clip", type=float, default=1.0, help="max gradient norm (0: off)")
    parser.add_argument("--bf16", action="store_true", help="autocast to bfloat16")
    parser.add_argument("--log-every", type=int, default=10, help="print samples/s every N steps")
    return parser.parse_args()


class TinyGPT(nn.Module):
    def __init__(self, vocab, d_model, heads, layers, seq_len):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Parameter(torch.zeros(1, seq_len, d_model))
        block = nn.TransformerEncoderLayer(
            d_model, heads, 4 * d_model, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(block, layers)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        mask = torch.triu(torch.full((seq_len, seq_len), -math.inf), diagonal=1)
        self.register_buffer("causal_mask", mask)

    def forward(self, tokens):
        x = self.tokens(tokens) + self.positions[:, : tokens.shape[1]]
        x = self.blocks(x, mask=self.causal_mask, is_causal=True)
        return self.head(self.norm(x))


def main():
    args = parse_args()
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(0)
    model = TinyGPT(args.vocab, args.d_model, args.heads, args.layers, args.seq_len).to(device)
    model = DDP(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    generator = torch.Generator().manual_seed(1000 + rank)

    def batch():
        tokens = torch.randint(0, args.vocab, (args.batch_size, args.seq_len + 1),
                               generator=generator)  # fmt: skip
        tokens = tokens.to(device, non_blocking=True)
        return tokens[:, :-1], tokens[:, 1:]

    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()
    )
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        inputs, targets = batch()
        with autocast:
            logits = model(inputs)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        if step % args.log_every == 0:
            if use_cuda:
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - started
            if rank == 0:
                sequences = world * args.batch_size * args.log_every / elapsed
                print(
                    f"step {step}: loss {loss.item():.3f}, {sequences:.1f} samples/s "
                    f"({sequences * args.seq_len:,.0f} tokens/s) over steps "
                    f"{step - args.log_every + 1}-{step}",
                    flush=True,
                )
            started = time.perf_counter()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
