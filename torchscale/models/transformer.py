"""Transformer pieces shared by BERT and GPT-2: embeddings, attention, MLP, block, and the
encoder stack, plus what both language-model specs share (token batches, seq_len checks, FLOPs).

Layer shapes follow the reference implementations (Hugging Face ``BertModel`` and ``GPT2Model``),
so parameter counts match theirs exactly; the Q, K and V projections are fused into one linear
layer, which has the same parameter count as three.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Type, cast

import torch
import torch.nn.functional as F
from torch import nn

from torchscale.errors import ConfigError
from torchscale.models.flops import transformer_training_flops_per_sequence
from torchscale.models.spec import Batch, ModelSpec


@dataclass(frozen=True)
class TransformerConfig:
    vocab_size: int
    max_positions: int
    hidden: int
    layers: int
    heads: int
    ffn: int
    causal: bool  # GPT-2 attends to earlier tokens only; BERT to the whole sequence
    pre_norm: bool  # LayerNorm before each sublayer (GPT-2) or after the residual add (BERT)
    token_types: int = 0  # BERT's segment embeddings (2); GPT-2 has none
    embedding_norm: bool = False  # BERT normalises the summed embeddings
    gelu_approximate: str = "none"  # GPT-2 uses the tanh approximation
    layer_norm_eps: float = 1e-5
    dropout: float = 0.1  # both reference configs train with 0.1 everywhere

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by {self.heads} heads")

    def resized(self, layers: int, hidden: int, heads: int, **overrides: Any) -> TransformerConfig:
        """The same family at another size, with the usual FFN of 4 x hidden."""
        return replace(self, layers=layers, hidden=hidden, heads=heads, ffn=4 * hidden, **overrides)


class Embeddings(nn.Module):
    """Word + learned position (+ token type) embeddings."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.hidden)
        self.position = nn.Embedding(config.max_positions, config.hidden)
        self.token_type = (
            nn.Embedding(config.token_types, config.hidden) if config.token_types else None
        )
        self.norm = (
            nn.LayerNorm(config.hidden, eps=config.layer_norm_eps)
            if config.embedding_norm
            else None
        )
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word(input_ids) + self.position(positions)
        if self.token_type is not None:
            types = token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
            x = x + self.token_type(types)
        if self.norm is not None:
            x = self.norm(x)
        out: torch.Tensor = self.dropout(x)
        return out


class SelfAttention(nn.Module):
    """Multi-head self-attention through ``scaled_dot_product_attention``, so CUDA picks the
    flash or memory-efficient kernel when it can."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.causal = config.causal
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden)
        self.out = nn.Linear(config.hidden, config.hidden)
        self.out_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        # (batch, seq, 3, heads, head_dim) -> three (batch, heads, seq, head_dim) tensors
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=self.causal
        )
        merged = y.transpose(1, 2).reshape(batch, seq, hidden)
        out: torch.Tensor = self.out_dropout(self.out(merged))
        return out


class MLP(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.hidden, config.ffn)
        self.down = nn.Linear(config.ffn, config.hidden)
        self.approximate = config.gelu_approximate
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.gelu(self.up(x), approximate=self.approximate)
        out: torch.Tensor = self.dropout(self.down(hidden))
        return out


class Block(nn.Module):
    """Attention then MLP, each with a residual connection and a LayerNorm."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.pre_norm = config.pre_norm
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden, eps=config.layer_norm_eps)
        self.mlp = MLP(config)
        self.mlp_norm = nn.LayerNorm(config.hidden, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attention(self.attention_norm(x))
            out: torch.Tensor = x + self.mlp(self.mlp_norm(x))
            return out
        x = self.attention_norm(x + self.attention(x))
        out = self.mlp_norm(x + self.mlp(x))
        return out


class Encoder(nn.Module):
    """Embeddings and the block stack; a pre-norm stack ends with a final LayerNorm."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.final_norm = (
            nn.LayerNorm(config.hidden, eps=config.layer_norm_eps) if config.pre_norm else None
        )

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        x = self.embeddings(input_ids, token_type_ids)
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = x if self.final_norm is None else self.final_norm(x)
        return out

    def init_weights(self, std: float = 0.02, scale_residual: bool = False) -> None:
        """Normal(0, std) weights, zero biases, unit LayerNorms (both references' scheme).

        ``scale_residual``: GPT-2 divides the std of the layers that write into the residual
        stream by sqrt(2 x layers), so the stream's variance does not grow with depth.
        """
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=std)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        if scale_residual:
            residual_std = std / math.sqrt(2 * self.config.layers)
            for block in self.blocks:
                block = cast(Block, block)  # the ModuleList holds Blocks
                nn.init.normal_(block.attention.out.weight, std=residual_std)
                nn.init.normal_(block.mlp.down.weight, std=residual_std)


class LanguageModel(nn.Module):
    """An :class:`Encoder` plus a head that returns logits over the vocabulary; the head's
    output projection is the word embedding (tied weights, as in both references)."""

    encoder: Encoder

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.encoder = Encoder(config)

    @classmethod
    def head_parameters(cls, config: TransformerConfig) -> int:
        """Parameters of the head beyond the (tied) word embedding; subclasses with a head of
        their own override this, and a test checks it against the built model."""
        return 0


def encoder_matmul_parameters(config: TransformerConfig) -> int:
    """The encoder's parameters minus the position and token-type tables, from the config.

    Per block: qkv 3H^2+3H, output H^2+H, MLP H*F+F and F*H+H, two LayerNorms 4H.
    """
    hidden, ffn = config.hidden, config.ffn
    block = 4 * hidden * hidden + 2 * hidden * ffn + 9 * hidden + ffn
    norms = 2 * hidden * (int(config.embedding_norm) + int(config.pre_norm))
    return config.vocab_size * hidden + config.layers * block + norms


def matmul_parameters(model_class: Type[LanguageModel], config: TransformerConfig) -> int:
    """N for the FLOPs formula: every parameter except the position and token-type embeddings,
    which are only table lookups. The word embedding stays in N because it is tied to the output
    projection, a real hidden x vocab matmul on every token (nanoGPT's ``estimate_mfu`` counts
    it the same way).

    Closed form rather than counted on a model built on the meta device: initialising parameters
    there imports torch._dynamo (2 s in every worker process, torch 2.14)."""
    return encoder_matmul_parameters(config) + model_class.head_parameters(config)


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the target tokens; targets of -100 (unmasked positions) are
    ignored."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


def language_model_spec(
    name: str,
    model_class: Type[LanguageModel],
    config: TransformerConfig,
    seq_len: int,
    batch: Callable[[int, Any], Batch],
    unit: str,
    description: str,
) -> ModelSpec:
    """A ``ModelSpec`` for a tied-embedding language model trained with AdamW.

    ``flops_per_sample`` is PaLM's ``(6 N + 12 L H Q T) x T`` per sequence (appendix B), with
    N from :func:`matmul_parameters` and ``H x Q`` the hidden size.
    """
    flops = transformer_training_flops_per_sequence(
        matmul_parameters(model_class, config), config.layers, config.hidden, seq_len
    )
    return ModelSpec(
        name=name,
        build=lambda: model_class(config),
        batch=batch,
        loss=token_cross_entropy,
        unit=unit,
        flops_per_sample=flops,
        units_per_sample=float(seq_len) if unit == "tokens" else 1.0,
        optimizer="adamw",
        input_shape=(seq_len,),
        seq_len=seq_len,
        num_classes=config.vocab_size,
        description=description,
    )


def resolve_seq_len(name: str, seq_len: Optional[int], default: int, max_positions: int) -> int:
    """The sequence length to train on; ConfigError when it is out of the model's range."""
    resolved = default if seq_len is None else int(seq_len)
    if not 1 <= resolved <= max_positions:
        raise ConfigError(
            f"model '{name}': seq_len must be between 1 and {max_positions} "
            f"(its learned position table), got {resolved}"
        )
    return resolved
