"""How much arithmetic training costs: floating-point operations per token, estimated in closed form (the Trainer's
MFU) or counted by torch (benchmarks), and the model FLOPs utilisation a measured throughput achieves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.training import attention_width, context_length, matmul_parameters


def estimated_flops_per_token(parameters: int, width: int, context: int) -> float:
    """FLOPs of one forward and backward pass per token, PaLM's estimate (appendix B) as nanoGPT's `estimate_mfu`
    takes it: 6N for the `parameters` (2N forward, 4N backward) plus 12 · `width` · `context` for the attention
    scores and their weighted sums (`width`: heads × head dimension summed over the layers; `context`: the
    sequence length, as if every query attended to all of it)."""
    return 6 * parameters + 12 * width * context


def model_flops_per_token(model: nn.Module) -> float:
    """`estimated_flops_per_token` for `model`, from its sizes (`kqv.nn.training`); 6N alone for a model without
    kqv's attention layers. Dense layers: a mixture of experts, which runs only some experts per token, is
    overcounted. A padded vocabulary (`ModelConfig.vocab_multiple`) counts at its padded rows: the GPU computes
    them (the product is the padded one, its real columns taken after it)."""
    return estimated_flops_per_token(matmul_parameters(model), attention_width(model), context_length(model))


def utilisation(flops_per_token: float, tokens_per_s: float | None, peak_flops: float | None, processes: int = 1):
    """Model FLOPs utilisation: the FLOP/s that `tokens_per_s` (over all `processes`, each on its own device of
    `peak_flops`) amounts to, as a fraction of the devices' peak; None without a throughput or a known peak."""
    if not tokens_per_s or not peak_flops:
        return None
    return flops_per_token * tokens_per_s / (peak_flops * processes)


def training_flops_per_token(
    model: nn.Module, batches: list[Any], loss_fn: Callable[[nn.Module, Any], Tensor], tokens: int
) -> float:
    """Floating-point operations of one forward and backward pass of `loss_fn` per token, measured on `batches`
    (which hold `tokens` real, non-padding tokens) with torch's FlopCounterMode (matrix products and attention).
    FlopCounterMode does not see inside `nn.LSTM`, so its gate products are added by hand: 2 * 4 * hidden *
    (input + hidden) per token and direction forward, times 3 with the backward pass. It counts what the kernels
    ran: a padded output layer at its padded rows on a GPU, at its real rows under the CPU's blocked loss."""
    from torch.utils.flop_counter import FlopCounterMode

    lstm_flops = [0]

    def count_lstm(module: nn.LSTM, inputs: tuple, _output: Any) -> None:
        x = inputs[0]
        tokens = x.data.shape[0] if isinstance(x, nn.utils.rnn.PackedSequence) else x.shape[0] * x.shape[1]
        directions = 2 if module.bidirectional else 1
        for layer in range(module.num_layers):
            width = module.input_size if layer == 0 else module.hidden_size * directions
            lstm_flops[0] += 3 * 2 * 4 * module.hidden_size * (width + module.hidden_size) * tokens * directions

    hooks = [m.register_forward_hook(count_lstm) for m in model.modules() if isinstance(m, nn.LSTM)]
    rng = torch.get_rng_state()
    try:
        with FlopCounterMode(display=False) as counter:
            for batch in batches:
                loss_fn(model, batch).backward()
    finally:
        for hook in hooks:
            hook.remove()
        model.zero_grad(set_to_none=True)
        torch.set_rng_state(rng)
    return (counter.get_total_flops() + lstm_flops[0]) / tokens
