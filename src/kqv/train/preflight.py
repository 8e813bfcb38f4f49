"""Checks a training passes before the first byte of its run directory is written: what would otherwise fail
only after the work (or after `--overwrite` deleted the previous run).

`check_memory` compares a rough upper bound of the memory one batch needs with the memory of the machine;
`check_splits` that every split of the encoded data holds at least one block of `context + 1` tokens;
`check_prompt` that the tokenizer can encode the prompt sampled at the end of training. Each raises a
`kqv.errors.KqvError` that names the setting to change.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..errors import ConfigError, DataError, KqvError, option
from ..nn.checks import check_id_values
from ..nn.config import ModelConfig
from ..nn.devices import Accelerator
from ..nn.lora import LoRAConfig, adapted_layers
from ..nn.models import DecoderLM

FLOAT_BYTES = 4  # fp32: the widest dtype training keeps activations in
TRAINING_BYTES_PER_PARAMETER = 16  # fp32 weight, gradient and AdamW's two moments


def available_memory(device: str = "auto") -> tuple[int, str]:
    """(bytes, what they are) of the memory a batch is held in: the GPU's when training runs on one (CUDA,
    `device` as `train.device` says), else the machine's physical memory (psutil's total when installed, else
    `os.sysconf`)."""
    chosen = Accelerator.resolve(device).device
    if chosen.type == "cuda":
        return torch.cuda.get_device_properties(chosen).total_memory, "the GPU's memory"
    try:
        import psutil

        return psutil.virtual_memory().total, "this machine's physical memory"
    except ImportError:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's physical memory"


def batch_memory(
    model: ModelConfig, batch: int, context: int, vocab: int, lora: LoRAConfig | None = None
) -> dict[str, int]:
    """A rough upper bound, in bytes by part, of the memory training on one (batch, context) batch needs in fp32:

    * `scores`: one layer's (batch, heads, context, context) attention scores, for full attention (what a
      non-fused kernel builds; the other kinds never build the whole matrix);
    * `activations`: what every layer keeps for the backward pass, about 12 d_model + 2 d_ff floats per token;
    * `logits`: the (batch, context, vocab) logits, their softmax and gradient;
    * `parameters`: weights, gradients and AdamW's two moments (16 bytes per parameter);
    * with `lora`, `adapters`: the LoRA adapters' weights, gradients and moments (16 bytes per parameter) and what
      each adapted layer keeps per token for the backward pass (its rank's floats, and its input when it drops out).
    """
    tokens, d = batch * context, model.d_model
    parameters = model.n_layers * (4 * d * d + 2 * d * model.d_ff) + vocab * d + model.max_len * d
    parts = {
        "scores": batch * model.n_heads * context * context * FLOAT_BYTES if model.attention == "full" else 0,
        "activations": model.n_layers * tokens * (12 * d + 2 * model.d_ff) * FLOAT_BYTES,
        "logits": 3 * tokens * vocab * FLOAT_BYTES,
        "parameters": TRAINING_BYTES_PER_PARAMETER * parameters,
    }
    if lora is not None:
        with torch.device("meta"):  # the layers' shapes alone: no memory, no computation
            layers = [layer for _, layer in adapted_layers(DecoderLM(model.replace(vocab_size=vocab)), lora.targets)]
        weights = sum(lora.rank * (layer.in_features + layer.out_features) for layer in layers)
        per_token = sum(lora.rank + (layer.in_features if lora.dropout else 0) for layer in layers)
        parts["adapters"] = TRAINING_BYTES_PER_PARAMETER * weights + tokens * per_token * FLOAT_BYTES
    return parts


def check_memory(
    model: ModelConfig, batch: int, context: int, vocab: int, device: str = "auto", lora: LoRAConfig | None = None
) -> None:
    """ConfigError when the memory one batch needs (`batch_memory`, with a fine-tune's LoRA adapters) exceeds the
    memory there is on `device`."""
    parts = batch_memory(model, batch, context, vocab, lora)
    needed, (available, where) = sum(parts.values()), available_memory(device)
    if needed > available:
        detail = ", ".join(f"{name} {size / 1e9:.1f} GB" for name, size in parts.items() if size)
        raise ConfigError(
            f"one batch of train.batch_size={batch} blocks of data.context={context} tokens needs about "
            f"{needed / 1e9:.1f} GB of memory ({detail}; a rough upper bound), more than {where} "
            f"({available / 1e9:.1f} GB); lower data.context or train.batch_size (and raise train.grad_accum to "
            f"keep the batch), or model.d_model"
        )


def check_splits(splits: Mapping[str, torch.Tensor], context: int, vocab_size: int | None = None) -> None:
    """DataError when a split of encoded token ids is shorter than one block of `context + 1` tokens (the inputs
    and their next-token targets): its first batch, or its first evaluation, would fail. With `vocab_size`, also
    when an id is outside the vocabulary: the token ids of every batch, which are blocks of these splits, are
    checked here, once, on the host, so that a training step on a device reads none back (`kqv.nn.checks`)."""
    for name, ids in splits.items():
        what = "training split" if name == "train" else "validation split" if name == "val" else f"{name} split"
        if vocab_size is not None:
            check_id_values(ids, vocab_size, f"the {what}")
        if len(ids) < context + 1:
            raise DataError(
                f"the {what} has {len(ids)} tokens, fewer than data.context + 1 = {context + 1} (one block and its "
                f"shifted targets); use more text, a larger data.val_fraction, or a shorter data.context"
            )


def check_prompt(encode: Callable[[str], Any], prompt: str, name: str = "sample.prompt") -> None:
    """ConfigError when the tokenizer (`encode`) cannot encode the prompt sampled after training."""
    try:
        ids = encode(prompt)
    except (KqvError, KeyError, ValueError) as error:
        ids, reason = None, f" ({str(error).rstrip('.')})"
    else:
        reason = ""
    if not ids:
        how = option("the config's {name}", name=name)
        raise ConfigError(
            f"{name} {prompt!r} cannot be encoded by this run's tokenizer{reason or ' (it gives no tokens)'}; "
            f"set {how} to text made of the corpus's characters, e.g. its first words"
        )
