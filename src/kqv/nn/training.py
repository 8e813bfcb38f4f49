"""What a training loop asks of a kqv model, without knowing its classes: the layer blocks that FSDP shards and
torch.compile compiles one by one, whether a step may leave parameters without a gradient (mixture-of-experts
layers: an expert that got no tokens), and the figures of the last forward pass worth logging beside the loss
(their routing statistics). `kqv.train` asks these questions here instead of importing the model's blocks and
experts, so the trainer holds no knowledge of the architecture."""

from __future__ import annotations

from typing import Any

from torch import nn

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
