"""What a training loop asks of a kqv model, without knowing its classes: the layer blocks that FSDP shards and
torch.compile compiles one by one, whether a step may leave parameters without a gradient (mixture-of-experts
layers: an expert that got no tokens), and the figures of the last forward pass worth logging beside the loss
(their routing statistics), and the sizes its FLOPs per token are estimated from. `kqv.train` asks these
questions here instead of importing the model's blocks and experts, so the trainer holds no knowledge of the
architecture."""

from __future__ import annotations

from typing import Any

from torch import nn

from .attention import MultiHeadAttention
from .experts import expert_layers, routing_metrics
from .layers import DecoderBlock, EncoderBlock


def layer_blocks(model: nn.Module) -> list[nn.Module]:
    """The encoder and decoder blocks of `model`, in order: the units of sharding and of compiling in place."""
    return [module for module in model.modules() if isinstance(module, (EncoderBlock, DecoderBlock))]


def may_skip_parameters(model: nn.Module) -> bool:
    """Whether a forward pass may leave some parameters unused (an expert that got no tokens on this process)."""
    return bool(expert_layers(model))


def step_figures(model: nn.Module) -> dict[str, Any]:
    """What to log of the last forward pass beside the loss: mixture-of-experts routing (aux loss, dropped
    fraction, per-expert load); empty for a model without experts."""
    return routing_metrics(model)


def matmul_parameters(model: nn.Module) -> int:
    """The parameters that take part in matrix products, each counted once: all of them but embedding tables
    looked up by index (learned positions; a token table unless it is tied to the output layer, which multiplies
    by it), as nanoGPT's `get_num_params` counts for its FLOPs estimate."""
    products = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    looked_up = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)} - products
    return sum(p.numel() for p in model.parameters() if id(p) not in looked_up)


def attention_width(model: nn.Module) -> int:
    """Heads times head dimension, summed over every attention layer (self and cross): with the context length,
    what the attention scores and their weighted sums cost beyond the parameters' products."""
    return sum(m.n_heads * m.head_dim for m in model.modules() if isinstance(m, MultiHeadAttention))


def context_length(model: nn.Module) -> int:
    """The longest sequence `model` takes (its config's `max_len`), 0 for a model without one."""
    return int(getattr(getattr(model, "config", None), "max_len", 0) or 0)
