"""Prints the intra-op threads this process starts with: what plain torchrun gives a script."""

import os

import torch

print(f"rank {os.environ.get('RANK')} threads {torch.get_num_threads()}", flush=True)
