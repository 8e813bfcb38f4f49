"""AdamW with weight-decay groups: decay for matrices, none for biases, norms and embeddings."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .config import TrainConfig


def _is_norm(module: nn.Module) -> bool:
    norms = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.modules.batchnorm._NormBase)
    return isinstance(module, norms) or "Norm" in type(module).__name__


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: weight decay for matrices (>= 2-D weights of linear layers, attention scores, ...), none for
    biases, norm gains, embeddings (also when tied to an output layer), and parameters a module names in a
    `no_weight_decay` attribute (e.g. a table of relative-position embeddings). Tied weights appear once."""
    exempt: set[int] = set()
    for module in model.modules():
        whole = isinstance(module, (nn.Embedding, nn.EmbeddingBag)) or _is_norm(module)
        named = set(getattr(module, "no_weight_decay", ()))
        for name, param in module.named_parameters(recurse=False):
            if whole or name in named:
                exempt.add(id(param))
    decay, no_decay = [], []
    for param in model.parameters():  # yields each shared parameter once
        if param.requires_grad:
            (decay if param.dim() >= 2 and id(param) not in exempt else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW over `parameter_groups`; the fused kernel when possible (it also skips a non-finite update on the
    device: `found_inf`)."""
    groups = [g for g in parameter_groups(model, config.weight_decay) if g["params"]]
    if not groups:
        raise ConfigError("the model has no trainable parameters")
    fused = all(
        p.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16) for g in groups for p in g["params"]
    )
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, fused=fused or None)
