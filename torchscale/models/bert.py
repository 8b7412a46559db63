"""BERT-Large and a tiny BERT, masked language models in plain PyTorch.

Same shapes as Hugging Face's ``BertForMaskedLM`` (bert-large-uncased: 24 layers, hidden 1024,
16 heads, FFN 4096, vocabulary 30,522, 512 positions, 2 token types): post-LayerNorm blocks,
exact GELU, a normalised embedding sum, and the MLM head (dense + GELU + LayerNorm, then a
decoder tied to the word embedding plus its own bias). No pooler, as ``BertForMaskedLM`` has
none. Random init, no download.

FLOPs per sample (one sequence of T tokens): ``(6 N + 12 L H Q T) x T`` (PaLM appendix B) with N
= all parameters except the position and token-type embeddings. The MLM head runs on every
position (as in HF), so its decoder matmul is real work and counts.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from torchscale.models.spec import ModelSpec
from torchscale.models.transformer import (
    LanguageModel,
    TransformerConfig,
    language_model_spec,
    resolve_seq_len,
)

MASK_TOKEN_ID = 103  # [MASK] in the bert-*-uncased vocabulary
MASK_FRACTION = 0.15  # of the positions in each sequence, as in BERT pre-training


BERT_LARGE = TransformerConfig(
    vocab_size=30522,
    max_positions=512,
    hidden=1024,
    layers=24,
    heads=16,
    ffn=4096,
    causal=False,
    pre_norm=False,
    token_types=2,
    embedding_norm=True,
    layer_norm_eps=1e-12,
)


class BertForMaskedLM(LanguageModel):
    @classmethod
    def head_parameters(cls, config: TransformerConfig) -> int:
        # transform (H x H + H), its LayerNorm (2H), the decoder's own bias (V)
        return config.hidden * config.hidden + 3 * config.hidden + config.vocab_size

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config)
        self.transform = nn.Linear(config.hidden, config.hidden)
        self.transform_norm = nn.LayerNorm(config.hidden, eps=config.layer_norm_eps)
        self.decoder_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.encoder.init_weights()
        nn.init.normal_(self.transform.weight, std=0.02)
        nn.init.zeros_(self.transform.bias)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids, token_type_ids)
        hidden = self.transform_norm(F.gelu(self.transform(hidden)))
        return F.linear(hidden, self.encoder.embeddings.word.weight, self.decoder_bias)


def masked_batch(
    batch_size: int, seq_len: int, vocab_size: int, device: Any
) -> Tuple[Dict[str, torch.Tensor], torch.Tensor]:
    """Random sentence pairs with 15% of each sequence's positions replaced by [MASK].

    The same number of positions is masked in every sequence, so every step does the same work.
    Targets hold the original token at masked positions and -100 (ignored) elsewhere.
    """
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len), device=device)
    masked_count = max(1, round(MASK_FRACTION * seq_len))
    masked = torch.rand(batch_size, seq_len, device=device).argsort(dim=1)[:, :masked_count]
    is_masked = torch.zeros(batch_size, seq_len, dtype=torch.bool, device=device)
    is_masked.scatter_(1, masked, True)
    targets = tokens.masked_fill(~is_masked, -100)
    input_ids = tokens.masked_fill(is_masked, MASK_TOKEN_ID)
    # Two segments per sequence (sentence A, sentence B), as in pre-training data.
    token_type_ids = (torch.arange(seq_len, device=device) >= seq_len // 2).long()
    token_type_ids = token_type_ids.expand(batch_size, seq_len)
    return {"input_ids": input_ids, "token_type_ids": token_type_ids}, targets


def bert_spec(
    name: str, config: TransformerConfig, seq_len: Optional[int], default_seq_len: int
) -> ModelSpec:
    length = resolve_seq_len(name, seq_len, default_seq_len, config.max_positions)

    def batch(batch_size: int, device: Any) -> Tuple[Dict[str, torch.Tensor], torch.Tensor]:
        return masked_batch(batch_size, length, config.vocab_size, device)

    description = (
        f"BERT {config.layers} layers, hidden {config.hidden}, {config.heads} heads, "
        f"masked LM, seq_len {length}"
    )
    return language_model_spec(
        name, BertForMaskedLM, config, length, batch, "sequences", description
    )


def bert_large(seq_len: Optional[int] = None) -> ModelSpec:
    """BERT-Large masked LM: 335,174,458 parameters, default seq_len 512."""
    return bert_spec("bert-large", BERT_LARGE, seq_len, 512)


def bert_tiny(seq_len: Optional[int] = None) -> ModelSpec:
    """BERT's layout at toy size for CPU runs and tests: 2 layers, hidden 32, 2 heads, vocabulary
    512, default seq_len 128, no dropout (on CPU its random masks would cost more than the
    matmuls). Narrower than gpt2-tiny because its default sequences are twice as long."""
    config = BERT_LARGE.resized(2, 32, 2, vocab_size=512, dropout=0.0)
    return bert_spec("bert-tiny", config, seq_len, 128)
