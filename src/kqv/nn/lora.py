"""LoRA (Hu et al. 2021, "Low-Rank Adaptation of Large Language Models"): fine-tune a frozen model through small
low-rank updates of its projections.

A projection y = x W^T + b becomes y = x W^T + b + (alpha / r) * dropout(x) A^T B^T, with A (r, in) and B (out, r)
the only weights that train: r (in + out) numbers instead of in x out. B starts at zero, so the adapted model starts
as the model itself; A starts as nn.Linear's default initialisation (Kaiming-uniform), as the paper and `peft` do.
`merge_lora` folds each update into its weight, W + (alpha / r) B A, leaving plain `nn.Linear`s with the same
outputs and no cost at inference.

Why kqv's own modules and not `peft`: kqv's projections are plain `nn.Linear`s with fixed names (attention's
`to_queries`, `to_keys_values`, `to_output`; the feed-forward network's `up` and `down`), so the whole method is
the ~100 lines below, readable beside the lecture, with no new dependency (`peft` is not installed with kqv) and
nothing between kqv's models and its checkpoints, FSDP wrapping and fast decoding (`kqv.nn.decoding` calls a
`LoRALinear` through its own forward, as it does any `nn.Linear` subclass with a forward of its own). Its
outputs are checked against the formula above and its merge against the unmerged model (`tests/test_lora.py`).
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError

Projection = Literal["to_queries", "to_keys_values", "to_output", "up", "down"]  # every projection LoRA may adapt
PROJECTIONS: tuple[str, ...] = typing.get_args(Projection)
MAX_SCALING = 100.0  # the largest alpha / rank: the paper's and peft's are 1 to 4; far above, the first updates diverge
MIN_SCALING = 1e-4  # the smallest: alpha 1 at rank 8,192 is 1.2e-4; far below, the updates vanish in rounding
MAX_DROPOUT = 0.9  # the largest dropout on the adapters' input: above it they see almost nothing of it


def check_options(
    rank: int, alpha: float, dropout: float, targets: tuple[str, ...], name: Callable[[str], str]
) -> None:
    """ConfigError for LoRA options that would train nothing or cannot work, each named by `name(field)`: an alpha
    that is not positive (0 keeps every update at zero; a negative one only flips its sign), an alpha / rank below
    `MIN_SCALING` (the update vanishes) or above `MAX_SCALING` (it overflows or diverges), a dropout outside [0,
    MAX_DROPOUT], targets named twice. A rank of 0 (no LoRA) skips the checks that need one; how large a rank may be
    depends on the model (`largest_rank`)."""
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
        raise ConfigError(
            f"{name('alpha')} must be positive and finite (each update is scaled by alpha / rank, so 0 trains "
            f"nothing), got {alpha!r}; 16 (with rank 8) is usual"
        )
    if rank and alpha / rank < MIN_SCALING:
        raise ConfigError(
            f"{name('alpha')} / {name('rank')} is {alpha / rank:.3g}, less than {MIN_SCALING:g}: updates scaled so "
            f"little are lost in rounding and the fine-tune trains nothing; raise {name('alpha')} or lower "
            f"{name('rank')} (alpha 16 with rank 8 is usual)"
        )
    if rank and alpha / rank > MAX_SCALING:
        raise ConfigError(
            f"{name('alpha')} / {name('rank')} is {alpha / rank:.3g}, more than {MAX_SCALING:g}: updates scaled so "
            f"much diverge; lower {name('alpha')} (16 with rank 8 is usual)"
        )
    if not 0.0 <= dropout <= MAX_DROPOUT:
        raise ConfigError(
            f"{name('dropout')} must be in [0, {MAX_DROPOUT}] (the fraction of the adapters' input dropped), got "
            f"{dropout}"
        )
    twice = sorted({target for target in targets if targets.count(target) > 1})
    if twice:
        raise ConfigError(f"{name('targets')} names {twice[0]!r} twice; name each projection once")


@dataclass(frozen=True)
class LoRAConfig:
    """`rank` r of each update, its scale `alpha` (the update is multiplied by alpha / r), `dropout` on the update's
    input, and the projections to adapt (by name: attention's to_queries, to_keys_values, to_output; the
    feed-forward network's up and down)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("to_queries", "to_keys_values", "to_output")

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or self.rank < 1:
            raise ConfigError(f"lora.rank must be an integer of at least 1, got {self.rank!r}")
        unknown = sorted(set(self.targets) - set(PROJECTIONS))
        if unknown or not self.targets:
            raise ConfigError(f"lora.targets must name some of {list(PROJECTIONS)}, got {list(self.targets)}")
        check_options(self.rank, self.alpha, self.dropout, tuple(self.targets), lambda field: f"lora.{field}")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


class LoRALinear(nn.Linear):
    """An `nn.Linear` whose (frozen) weight and bias are another layer's, plus a trainable low-rank update.

    A and B are matrices, so the optimizer decays them as it does every matrix (`kqv.train.optimizer`, with the
    run's train.weight_decay), as peft's adapters under transformers' Trainer, litgpt's and torchtune's are: decay
    pulls B A, the update, towards zero, that is the adapted model towards its source; train.weight_decay=0 turns
    it off. (The class calls nn.Module's __init__, not nn.Linear's, only to reuse the base layer's tensors.)"""

    def __init__(self, base: nn.Linear, config: LoRAConfig) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: the weight and bias are `base`'s own tensors, not new ones
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.scaling = config.scaling
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_a = nn.Parameter(torch.empty(config.rank, self.in_features, **factory))
        self.lora_b = nn.Parameter(torch.zeros(self.out_features, config.rank, **factory))  # starts as no update
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))  # nn.Linear's default initialisation
        self.lora_dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        update = F.linear(F.linear(self.lora_dropout(x), self.lora_a), self.lora_b)
        return F.linear(x, self.weight, self.bias) + self.scaling * update

    def merged(self) -> nn.Linear:
        """A plain nn.Linear with the update folded into its weight: W + (alpha / r) B A."""
        linear = nn.Linear(
            self.in_features,
            self.out_features,
            bias=self.bias is not None,
            device=self.weight.device,
            dtype=self.weight.dtype,
        )
        with torch.no_grad():
            linear.weight.copy_(self.weight + self.scaling * (self.lora_b @ self.lora_a))
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        linear.weight.requires_grad_(self.weight.requires_grad)
        return linear

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.lora_a.shape[0]}, scaling={self.scaling}"


def adapted_layers(model: nn.Module, targets: tuple[str, ...]) -> list[tuple[str, nn.Linear]]:
    """(name, layer) of every projection of `model` that LoRA on `targets` adapts (plain `nn.Linear`s only)."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if name.rsplit(".", 1)[-1] in targets and type(module) is nn.Linear
    ]


def largest_rank(layers: list[tuple[str, nn.Linear]]) -> tuple[int, str]:
    """(r, where) of the largest rank that is low rank for every layer of `layers` (`adapted_layers`): the smaller
    side of the narrowest one, and that layer's name and shape. A rank above it adds more numbers than the weight has
    and can express nothing more."""
    name, layer = min(layers, key=lambda item: min(item[1].in_features, item[1].out_features))
    side = min(layer.in_features, layer.out_features)
    return side, f"{name} ({layer.in_features} -> {layer.out_features})"


def add_lora(model: nn.Module, config: LoRAConfig) -> list[str]:
    """Adapt every projection of `model` named in `config.targets` with a `LoRALinear`, in place, and freeze every
    other parameter (requires_grad=False): only the adapters train. Returns the names of the adapted layers.
    ConfigError for a rank above the smaller side of a layer it adapts (`largest_rank`)."""
    adapted = adapted_layers(model, config.targets)
    if not adapted:
        raise ConfigError(f"the model has no projection named {list(config.targets)} to adapt with LoRA")
    limit, where = largest_rank(adapted)
    if config.rank > limit:
        raise ConfigError(f"lora.rank ({config.rank}) is more than {limit}, the smaller side of {where}")
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for name, module in adapted:
        replace(model, name, LoRALinear(module, config))
    return [name for name, _ in adapted]


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every `LoRALinear` of `model` into a plain `nn.Linear`, in place; the outputs stay the same (up to float
    rounding). Returns the model."""
    for name, module in list(model.named_modules()):
        if isinstance(module, LoRALinear):
            replace(model, name, module.merged())
    return model


def lora_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The adapters' tensors alone (lora_a and lora_b of each adapted layer): all a LoRA fine-tune must save
    beside a reference to its source."""
    return adapters(model.state_dict())


def adapters(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The adapters' tensors of a state dict (`lora_state_dict`'s part of it): what a LoRA run's checkpoint holds."""
    return {name: tensor for name, tensor in state.items() if name.rsplit(".", 1)[-1].startswith("lora_")}


def is_adapted(model: nn.Module) -> bool:
    """Whether `model` has LoRA adapters (not merged yet)."""
    return any(isinstance(module, LoRALinear) for module in model.modules())


def replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)
