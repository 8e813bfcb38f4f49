"""nanoGPT's model as a reference for the GPU benchmark and the op-count test: GPT-2's architecture as Karpathy's
nanoGPT (github.com/karpathy/nanoGPT, model.py, MIT licence) builds it, written here from its published design,
not copied, so that kqv is compared with what a nanoGPT user trains.

What makes it nanoGPT's and not just "a GPT-2":

* one fused query-key-value projection per block (`c_attn`, d -> 3d) and `F.scaled_dot_product_attention` with
  `is_causal=True`, heads split by `view` and `transpose`;
* LayerNorm with an optional bias (`bias=True` is GPT-2's), exact GELU (`nn.GELU()`), the MLP 4d wide;
* the output layer tied to the token embedding, and the loss `F.cross_entropy` over every logit at once
  (`ignore_index=-1`);
* the initialisation: normal(0, 0.02) everywhere, the residual projections (`c_proj`) at 0.02 / sqrt(2 L).

    from nanogpt import NanoGPT, NanoGPTConfig
    model = NanoGPT(NanoGPTConfig())                 # GPT-2 small, 124M parameters
    logits, loss = model(ids, targets)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class NanoGPTConfig:
    block_size: int = 1024  # context
    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in the linear layers and LayerNorms, as GPT-2


class SelfAttention(nn.Module):
    def __init__(self, config: NanoGPTConfig):
        super().__init__()
        self.heads, self.dropout = config.n_head, config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # queries, keys, values at once
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        batch, time, width = x.shape
        # (batch, heads, time, head_dim) each
        queries, keys, values = (
            part.view(batch, time, self.heads, width // self.heads).transpose(1, 2)
            for part in self.c_attn(x).split(width, dim=2)
        )
        dropout = self.dropout if self.training else 0.0
        attended = F.scaled_dot_product_attention(queries, keys, values, dropout_p=dropout, is_causal=True)
        return self.resid_dropout(self.c_proj(attended.transpose(1, 2).contiguous().view(batch, time, width)))


class FeedForward(nn.Module):
    def __init__(self, config: NanoGPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: NanoGPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = SelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = FeedForward(config)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, config: NanoGPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(config.vocab_size, config.n_embd),
                "wpe": nn.Embedding(config.block_size, config.n_embd),
                "drop": nn.Dropout(config.dropout),
                "h": nn.ModuleList(Block(config) for _ in range(config.n_layer)),
                "ln_f": nn.LayerNorm(config.n_embd, bias=config.bias),
            }
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied
        self.apply(self._init)
        for name, parameter in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(parameter, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, ids: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """ids (batch, time) -> logits (batch, time, vocab), and the mean cross-entropy against `targets`."""
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.transformer.drop(self.transformer.wte(ids) + self.transformer.wpe(positions))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss
