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

from ..errors import CONFIG_FIELD, ConfigError, DataError, KqvError, option
from ..nn.checks import check_id_values
from ..nn.config import ModelConfig
from ..nn.cores import BLOCKWISE_MIN_PAIRS, PLAIN_BF16_PAIRS
from ..nn.devices import TORCH_KERNELS, Accelerator, Kernels, Precision, Resolved
from ..nn.flex import head_dim_fits
from ..nn.lora import LoRAConfig, adapted_layers
from ..nn.models import DecoderLM

FLOAT_BYTES = 4  # fp32: weights, gradients, AdamW's moments, and under autocast the residual stream and softmaxes
TRAINING_BYTES_PER_PARAMETER = 16  # fp32 weight, gradient and AdamW's two moments
ACTIVATION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}  # what autocast's matrix products return, and keep


def available_memory(device: str | Accelerator = "auto") -> tuple[int, str]:
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


def keeps_scores(model: ModelConfig, kernels: Kernels, precision: Resolved, context: int) -> bool:
    """Whether full attention keeps each layer's (rows, heads, context, context) attention weights for the backward
    pass, as `FullAttention.attend` chooses its kernel for a training batch (`kqv.nn.cores`): the plain reference
    does (Shaw et al.'s relative values need the weights; short bf16 inputs on the CPU; a score bias where neither
    flex_attention nor the blockwise path takes it; a device with no fused SDPA kernel); flash and
    memory-efficient SDPA, flex_attention and blockwise attention keep O(context) per row. The other attention kinds
    never build the whole matrix."""
    if model.attention != "full" and model.layer_pattern is None:
        return False
    if model.position == "relative" and model.relative.values:
        return True
    if model.position in ("alibi", "relative"):  # a score bias: flex on CUDA, blockwise when long, else plain
        flex_takes = kernels.flex_attention and model.dropout == 0 and head_dim_fits(model.head_dim)
        blockwise_takes = model.dropout == 0 and (
            model.blockwise == "always" or (model.blockwise == "auto" and context * context >= BLOCKWISE_MIN_PAIRS)
        )
        return not (flex_takes or blockwise_takes)
    if kernels.plain_bf16_attention and precision == "bf16" and context * context <= PLAIN_BF16_PAIRS:
        return True
    if kernels.fused_cpu_blocks and model.dropout:  # the CPU's SDPA takes attention dropout in its math kernel
        return True
    return not (kernels.sdpa_streams_padding or kernels.fused_cpu_blocks)  # SDPA fused on CUDA and the CPU only


def batch_memory(
    model: ModelConfig,
    batch: int,
    context: int,
    vocab: int,
    lora: LoRAConfig | None = None,
    *,
    precision: Resolved = "fp32",
    kernels: Kernels = TORCH_KERNELS,
    shards: int = 1,
) -> dict[str, int]:
    """A rough upper bound, in bytes by part, of the memory one process needs to train on `batch` rows of
    `context` tokens (its own share of a batch), in `precision` ("bf16"/"fp16": autocast; "fp32"), with the
    attention kernel `kernels` choose (`keeps_scores`), its weights and optimizer state split over `shards`
    processes (FSDP; 1 otherwise):

    * `activations`: what every layer keeps per token for the backward pass: the block's input and the second
      norm's input in fp32 (the residual stream stays fp32 under autocast), and in the precision of the products
      the two norms' outputs, the queries, keys and values, the attention's output and the feed-forward's hidden
      activations before and after the nonlinearity (for a gated one, both halves, the gate's activation and the
      product), and with dropout three masks of the width of the model;
    * `scores`: every layer's (batch, heads, context, context) attention weights, where the kernel keeps them
      (`keeps_scores`): the softmax in the precision of the products, with dropout also its mask and dropped copy;
    * `logits`: the (batch, context, vocab) logits in the precision of the products, their fp32 log-softmax and
      their fp32 gradient;
    * `parameters`: weights, gradients and AdamW's two moments (16 bytes per parameter, over `shards`; under
      FSDP two blocks at a time gathered whole, weights and gradients), and autocast's low-precision copy of each
      weight;
    * with `lora`, `adapters`: the LoRA adapters' weights, gradients and moments (16 bytes per parameter) and what
      each adapted layer keeps per token for the backward pass (its rank's floats, and its input when it drops out).

    A vocabulary padded to `model.vocab_multiple` counts its padded rows: the token table, the output layer and the
    logits its product makes are that wide on the device.
    """
    vocab = model.padded(vocab)
    tokens, d, act = batch * context, model.d_model, ACTIVATION_BYTES[precision]
    gated = model.activation in ("swiglu", "geglu")
    hidden = (4 if gated else 2) * model.d_ff  # gate and value, the gate's activation, their product; or in, out
    masks = 3 * d * act if model.dropout else 0  # two per block and the embeddings', at most a product's width
    per_token = 2 * d * FLOAT_BYTES + (2 * d + 3 * d + d + hidden) * act + masks
    attention = 2 * d * d + 2 * d * model.kv_heads * model.head_dim  # queries and output; keys and values
    block = attention + (3 if gated else 2) * d * model.d_ff  # one block's weights
    parameters = model.n_layers * block + vocab * d + model.max_len * d
    kept = keeps_scores(model, kernels, precision, context)
    score_bytes = act * (3 if model.dropout else 1)  # the softmax; with dropout its mask and dropped-out copy too
    parts = {
        "scores": model.n_layers * batch * model.n_heads * context * context * score_bytes if kept else 0,
        "activations": model.n_layers * tokens * per_token,
        "logits": tokens * vocab * (act + 2 * FLOAT_BYTES),
        "parameters": TRAINING_BYTES_PER_PARAMETER * parameters // shards
        + (2 * block * (act + FLOAT_BYTES) if shards > 1 else 0)
        + (parameters * act if precision != "fp32" else 0),
    }
    if lora is not None:
        with torch.device("meta"):  # the layers' shapes alone: no memory, no computation
            layers = [layer for _, layer in adapted_layers(DecoderLM(model.replace(vocab_size=vocab)), lora.targets)]
        weights = sum(lora.rank * (layer.in_features + layer.out_features) for layer in layers)
        per_token = sum(lora.rank + (layer.in_features if lora.dropout else 0) for layer in layers)
        parts["adapters"] = TRAINING_BYTES_PER_PARAMETER * weights + tokens * per_token * FLOAT_BYTES
    return parts


def check_memory(
    model: ModelConfig,
    batch: int,
    context: int,
    vocab: int,
    device: str | Accelerator = "auto",
    lora: LoRAConfig | None = None,
    *,
    precision: Precision = "fp32",
    processes: int,
    parallel: str = "ddp",
) -> None:
    """ConfigError when the memory one process needs (`batch_memory`, with a fine-tune's LoRA adapters) exceeds
    the memory there is on `device`. `batch` is the global micro-batch (`train.batch_size`), which `processes`
    (a job's: the world size of its `Topology`) split, so each holds ceil(batch / processes) rows,
    trained in what `precision` stands for on the device; under `parallel="fsdp"` each holds a shard of the
    weights and optimizer state."""
    accelerator = Accelerator.resolve(device)
    rows, resolved = -(-batch // processes), accelerator.precision(precision)
    shards = processes if parallel == "fsdp" else 1
    parts = batch_memory(
        model, rows, context, vocab, lora, precision=resolved, kernels=accelerator.kernels, shards=shards
    )
    needed, (available, where) = sum(parts.values()), available_memory(accelerator)
    if needed > available:
        detail = ", ".join(f"{name} {size / 1e9:.1f} GB" for name, size in parts.items() if size)
        share = (
            f"{rows} rows per process (train.batch_size={batch} over {processes})"
            if processes > 1
            else (f"train.batch_size={batch} rows")
        )
        fsdp = ", or shard the weights with train.parallel='fsdp'" if shards == 1 < processes else ""
        raise ConfigError(
            f"one micro-batch of {share} of data.context={context} tokens in {resolved} needs about "
            f"{needed / 1e9:.1f} GB of memory ({detail}; a rough upper bound), more than {where} "
            f"({available / 1e9:.1f} GB); lower data.context or train.batch_size (and raise train.grad_accum to "
            f"keep the batch), or model.d_model{fsdp}"
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
        how = option(CONFIG_FIELD, name=name)
        raise ConfigError(
            f"{name} {prompt!r} cannot be encoded by this run's tokenizer{reason or ' (it gives no tokens)'}; "
            f"set {how} to text made of the corpus's characters, e.g. its first words"
        )
