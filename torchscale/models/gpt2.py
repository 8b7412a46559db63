"""GPT-2 (small, medium, large, XL) and a tiny GPT-2, causal language models in plain PyTorch.

Same shapes as OpenAI's GPT-2 and Hugging Face's ``GPT2LMHeadModel``: learned positions,
pre-LayerNorm blocks with a final LayerNorm, GELU (tanh form), vocabulary 50,257, and the output
projection tied to the word embedding, so parameter counts match HF's exactly (124,439,808 for
``gpt2``). Random init, no download.

FLOPs per sample (one sequence of T tokens): ``(6 N + 12 L H Q T) x T`` (PaLM appendix B) with N
= all parameters except the position embedding; see :func:`transformer.matmul_parameters`.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F

from torchscale.models.spec import ModelSpec
from torchscale.models.transformer import (
    LanguageModel,
    TransformerConfig,
    language_model_spec,
    resolve_seq_len,
)

DEFAULT_SEQ_LEN = 1024

GPT2_SMALL = TransformerConfig(
    vocab_size=50257,
    max_positions=1024,
    hidden=768,
    layers=12,
    heads=12,
    ffn=3072,
    causal=True,
    pre_norm=True,
    gelu_approximate="tanh",
    layer_norm_eps=1e-5,
)


class GPT2(LanguageModel):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config)
        self.encoder.init_weights(scale_residual=True)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids)
        return F.linear(hidden, self.encoder.embeddings.word.weight)


def gpt2_spec(
    name: str, config: TransformerConfig, seq_len: Optional[int], default_seq_len: int
) -> ModelSpec:
    """A causal-LM spec: random token sequences, each position predicting the next token."""
    length = resolve_seq_len(name, seq_len, default_seq_len, config.max_positions)

    def batch(batch_size: int, device: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        # One token more than the model sees: targets are the inputs shifted left by one.
        tokens = torch.randint(0, config.vocab_size, (batch_size, length + 1), device=device)
        return tokens[:, :-1], tokens[:, 1:]

    description = (
        f"GPT-2 {config.layers} layers, hidden {config.hidden}, {config.heads} heads, "
        f"causal LM, seq_len {length}"
    )
    return language_model_spec(name, GPT2, config, length, batch, "tokens", description)


def gpt2(seq_len: Optional[int] = None) -> ModelSpec:
    """GPT-2 small: 12 layers, hidden 768, 12 heads; 124,439,808 parameters."""
    return gpt2_spec("gpt2", GPT2_SMALL, seq_len, DEFAULT_SEQ_LEN)


def gpt2_medium(seq_len: Optional[int] = None) -> ModelSpec:
    """GPT-2 medium: 24 layers, hidden 1024, 16 heads; 354,823,168 parameters."""
    return gpt2_spec("gpt2-medium", GPT2_SMALL.resized(24, 1024, 16), seq_len, DEFAULT_SEQ_LEN)


def gpt2_large(seq_len: Optional[int] = None) -> ModelSpec:
    """GPT-2 large: 36 layers, hidden 1280, 20 heads; 774,030,080 parameters."""
    return gpt2_spec("gpt2-large", GPT2_SMALL.resized(36, 1280, 20), seq_len, DEFAULT_SEQ_LEN)


def gpt2_xl(seq_len: Optional[int] = None) -> ModelSpec:
    """GPT-2 XL: 48 layers, hidden 1600, 25 heads; 1,557,611,200 parameters."""
    return gpt2_spec("gpt2-xl", GPT2_SMALL.resized(48, 1600, 25), seq_len, DEFAULT_SEQ_LEN)


def gpt2_tiny(seq_len: Optional[int] = None) -> ModelSpec:
    """GPT-2's layout at toy size for CPU runs and tests: 2 layers, hidden 64, 2 heads, vocabulary
    512, 512 positions, default seq_len 64, no dropout (on CPU its random masks would cost more
    than the matmuls)."""
    config = GPT2_SMALL.resized(2, 64, 2, vocab_size=512, max_positions=512, dropout=0.0)
    return gpt2_spec("gpt2-tiny", config, seq_len, 64)
