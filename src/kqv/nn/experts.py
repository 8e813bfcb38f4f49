"""Mixture-of-experts feed-forward: many feed-forward networks ("experts"), each token sent to one or two of them.

A learned router scores every expert for every token; the token goes to its best `top_k` experts, and the
layer's output is their outputs weighted by the router's gates. Parameters grow with the number of experts while
the compute per token stays that of `top_k` feed-forward networks.

* Switch (Fedus et al. 2021, `ffn="switch"`): top-1 routing; the gate is the router's probability of the chosen
  expert, so the router learns through it.
* Top-2 (Shazeer et al. 2017, `ffn="moe"`): the softmax of the `top_k` best logits (the probabilities renormalised
  over the chosen experts). Shazeer et al.'s trainable gating noise is left out: routing here is deterministic.

Capacity. In training each expert takes at most `ceil(capacity_factor * tokens * top_k / n_experts)` assignments
of a batch; the rest are dropped: the layer returns 0 for them, so the token passes through the residual
connection unchanged (a token with two choices loses only the dropped one). Slots are filled in the order
(position, batch row, choice), so a token is never dropped because of a token at a later position: in a decoder
the future cannot change the past even through capacity (tests/test_experts.py checks it). In eval mode there is
no capacity limit: nothing is dropped, so a token's output depends on its own routing only, and KV-cached
generation, which routes one token at a time, equals the full forward pass.

Load balancing. Without help the router collapses onto a few experts. Switch's auxiliary loss is
`coefficient * n_experts * sum_i f_i P_i`, with f_i the fraction of the batch's assignments routed to expert i
(before capacity) and P_i the mean router probability of expert i; it is minimal (= coefficient) when both are
uniform. With top_k = 2, f counts both choices (each token contributes 1/top_k per choice), so a balanced router
again scores `coefficient`. Padding tokens take no capacity and count in none of these statistics.

The router runs in float32 even under bf16 autocast or in a bf16 model ("selective precision", Fedus et al.
2021): its softmax decides discrete routes, and bf16 rounding would flip them.

Each layer keeps the statistics of its last forward pass in `stats` (`Routing`); `auxiliary_loss(model)` sums the
layers' losses (the models add it to their returned loss in training) and `routing_metrics(model)` summarises
them for the trainer's log.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig


@dataclass
class Routing:
    """Where a batch's tokens went: `experts` and `gates` (tokens, top_k), `kept` (tokens, top_k) bool (within
    capacity), `probs` (tokens, n_experts) the router's softmax, `real` (tokens,) bool (not padding)."""

    experts: Tensor
    gates: Tensor
    kept: Tensor
    probs: Tensor
    real: Tensor
    aux_loss: Tensor  # the weighted load-balancing loss of this layer (a scalar)

    def load(self) -> Tensor:
        """(n_experts,) fraction of the real tokens' assignments routed to each expert, before capacity."""
        return expert_fractions(self.experts, self.real, self.probs.shape[-1])

    def dropped_fraction(self) -> Tensor:
        """The fraction of the real tokens' assignments dropped for lack of capacity."""
        real = self.real[:, None].expand_as(self.kept)
        return (real & ~self.kept).sum() / real.sum().clamp(min=1)


def choices(experts: Tensor, real: Tensor, n_experts: int) -> Tensor:
    """(tokens, top_k, n_experts) long: one-hot of each real token's chosen experts, zero for padding. Built by
    comparison rather than `F.one_hot`, which reads its input's range back to the host."""
    return ((experts[..., None] == torch.arange(n_experts, device=experts.device)) & real[:, None, None]).long()


def expert_fractions(experts: Tensor, real: Tensor, n_experts: int) -> Tensor:
    """f: (n_experts,) the share of the real tokens' (token, choice) assignments that go to each expert."""
    counts = choices(experts, real, n_experts).flatten(0, -2).sum(0).float()  # (n_experts,)
    return counts / counts.sum().clamp(min=1)


def load_balancing_loss(probs: Tensor, experts: Tensor, real: Tensor, coefficient: float = 1.0) -> Tensor:
    """Switch's auxiliary loss `coefficient * N * sum_i f_i P_i` over the real tokens (see the module docstring).

    probs (tokens, N) router probabilities; experts (tokens, top_k) chosen experts; real (tokens,) bool. Padding
    is weighted out, not selected out: no shape depends on the data, so nothing is read back to the host."""
    n_experts = probs.shape[-1]
    fractions = expert_fractions(experts, real, n_experts)  # f, no gradient (argmax)
    weights = real.to(probs.dtype)[:, None]  # (tokens, 1)
    mean_probs = (probs * weights).sum(0) / weights.sum().clamp(min=1)  # P, differentiable; 0 without real tokens
    return coefficient * n_experts * (fractions * mean_probs).sum()


def expert_slots(experts: Tensor, real: Tensor, n_experts: int) -> Tensor:
    """(tokens, top_k) long: each assignment's slot in its expert, the number of real assignments to the same
    expert before it in (token, choice) order (padding's values are meaningless: it takes no slot)."""
    one_hot = choices(experts, real, n_experts)  # (tokens, top_k, n_experts)
    before = one_hot.flatten(0, 1).cumsum(0).view_as(one_hot) - 1  # assignments up to this one, per expert
    return (before * one_hot).sum(-1)


def within_capacity(experts: Tensor, real: Tensor, n_experts: int, capacity: float | Tensor | None) -> Tensor:
    """(tokens, top_k) bool: which assignments get a slot, filled in token order then choice order.

    Padding (real False) takes no slot and is never kept. `capacity` (slots per expert, a number or a 0-d tensor:
    ceil is not needed, slot < ceil(c) exactly when slot < c) None means no limit."""
    keep = real[:, None].expand_as(experts)
    if capacity is None:
        return keep
    return keep & (expert_slots(experts, real, n_experts) < capacity)


class MixtureOfExperts(nn.Module):
    """A drop-in replacement of a feed-forward network: a router and `n_experts` experts, each made by
    `make_expert()` (the blocks pass `FeedForward`'s constructor, so an expert is one position-wise network).

    x (batch, time, d_model) -> (batch, time, d_model); `token_mask` (batch, time) bool marks real tokens.

    In training (`dispatch`) every expert gets a fixed number of slots, an upper bound of its capacity known from
    the batch's shape, so no size depends on the routing and a training step reads nothing back to the host
    (the capacity itself, from the count of real tokens, stays a tensor). In eval mode nothing is dropped and
    each expert runs on exactly the rows routed to it (`gather`: sizes read from the routing, once per expert),
    which costs top_k feed-forward networks per token rather than an expert's full share of slots.
    """

    def __init__(self, config: ModelConfig, make_expert: Callable[[], nn.Module]):
        super().__init__()
        self.top_k = config.experts_per_token
        self.capacity_factor = config.experts.capacity_factor
        self.coefficient = config.experts.aux_loss_coefficient
        self.router = nn.Linear(config.d_model, config.experts.count, bias=False)
        self.experts = nn.ModuleList(make_expert() for _ in range(config.experts.count))
        self.stats: Routing | None = None

    @property
    def n_experts(self) -> int:
        return len(self.experts)

    def capacity(self, tokens: int | Tensor) -> float | Tensor | None:
        """Slots per expert: capacity_factor times an even share of the assignments (to be rounded up); no limit
        in eval mode. `tokens` may be a tensor (the count of real tokens), and the capacity is one then too."""
        if not self.training:
            return None
        return self.capacity_factor * tokens * self.top_k / self.n_experts

    def slot_bound(self, tokens: int) -> int:
        """Slots each expert gets in `dispatch`: its capacity were every one of `tokens` real (an expert never
        takes more than `tokens` assignments: a token's top_k experts differ)."""
        return min(tokens, math.ceil(self.capacity(tokens)))

    def route(self, tokens: Tensor, real: Tensor) -> Routing:
        """tokens (n, d_model) -> their routing, in float32 whatever the model's precision."""
        with torch.autocast(tokens.device.type, enabled=False):
            logits = F.linear(tokens.float(), self.router.weight.float())  # (n, n_experts)
        probs = logits.softmax(dim=-1)
        top_logits, experts = logits.topk(self.top_k, dim=-1)  # (n, top_k)
        # Switch gates by the chosen expert's probability; top-k renormalises over the chosen experts
        gates = probs.gather(-1, experts) if self.top_k == 1 else top_logits.softmax(dim=-1)
        kept = within_capacity(experts, real, self.n_experts, self.capacity(real.sum()))
        aux_loss = load_balancing_loss(probs, experts, real, self.coefficient)
        return Routing(experts, gates, kept, probs, real, aux_loss)

    def forward(self, x: Tensor, token_mask: Tensor | None = None) -> Tensor:
        batch, time, d_model = x.shape
        tokens = x.transpose(0, 1).reshape(time * batch, d_model)  # (time * batch, d_model): position-major order
        real = (
            (torch.ones(batch, time, dtype=torch.bool, device=x.device) if token_mask is None else token_mask.bool())
            .transpose(0, 1)
            .reshape(-1)
        )  # (time * batch,)
        self.stats = routing = self.route(tokens, real)
        output = self.dispatch(tokens, routing) if self.training else self.gather(tokens, routing)
        return output.view(time, batch, d_model).transpose(0, 1)  # (batch, time, d_model)

    def dispatch(self, tokens: Tensor, routing: Routing) -> Tensor:
        """Training: each kept assignment to its expert's slot in fixed-size buffers, every expert over its
        buffer, the outputs gathered back and weighted by the gates. Shapes depend on the batch's shape only."""
        n, d_model = tokens.shape
        bound = self.slot_bound(n)
        slots = expert_slots(routing.experts, routing.real, self.n_experts)  # (n, top_k)
        spare = self.n_experts * bound  # the one row dropped assignments (and padding) go to, never read
        index = torch.where(routing.kept, routing.experts * bound + slots, spare).flatten()  # (n * top_k,)
        chosen = tokens[:, None].expand(-1, self.top_k, -1).reshape(-1, d_model)  # (n * top_k, d_model)
        buffers = tokens.new_zeros(spare + 1, d_model).index_add(0, index, chosen)[:spare]
        buffers = buffers.view(self.n_experts, bound, d_model)
        outputs = torch.cat([expert(buffers[e]) for e, expert in enumerate(self.experts)])  # (spare, d_model)
        outputs = torch.cat([outputs, outputs.new_zeros(1, d_model)])[index].view(n, self.top_k, d_model)
        weights = (routing.gates * routing.kept)[..., None]  # (n, top_k, 1): 0 for dropped assignments
        return (outputs * weights).sum(1).to(tokens.dtype)

    def gather(self, tokens: Tensor, routing: Routing) -> Tensor:
        """Eval: each expert over exactly the rows routed to it (nothing is dropped, no slot is computed empty)."""
        output = torch.zeros_like(tokens)
        for index, expert in enumerate(self.experts):
            rows, choice = ((routing.experts == index) & routing.kept).nonzero(as_tuple=True)
            weighted = expert(tokens[rows]) * routing.gates[rows, choice, None]  # (assigned, d_model)
            output.index_add_(0, rows, weighted.to(output.dtype))
        return output


def expert_layers(model: nn.Module) -> list[MixtureOfExperts]:
    return [m for m in model.modules() if isinstance(m, MixtureOfExperts)]


def auxiliary_loss(model: nn.Module) -> Tensor | None:
    """The sum of the load-balancing losses of the model's last forward pass, None without experts."""
    losses = [layer.stats.aux_loss for layer in expert_layers(model) if layer.stats is not None]
    return torch.stack(losses).sum() if losses else None


def with_auxiliary_loss(model: nn.Module, loss: Tensor) -> Tensor:
    """The training loss: `loss` plus the experts' load-balancing losses while training, `loss` in eval mode
    (so validation loss and perplexity stay the plain cross-entropy, comparable with a dense model)."""
    aux = auxiliary_loss(model) if model.training else None
    return loss if aux is None else loss + aux.to(loss.dtype)


def routing_metrics(model: nn.Module) -> dict[str, Any]:
    """What the trainer logs of the last forward pass: `aux_loss` (summed over layers), `dropped_fraction` (mean
    over layers) and `expert_load` (one list of per-expert fractions per layer). Empty without experts."""
    stats = [layer.stats for layer in expert_layers(model) if layer.stats is not None]
    if not stats:
        return {}
    return {
        "aux_loss": float(sum(s.aux_loss.detach() for s in stats)),
        "dropped_fraction": float(sum(s.dropped_fraction() for s in stats)) / len(stats),
        "expert_load": [[round(float(f), 5) for f in s.load()] for s in stats],
    }
