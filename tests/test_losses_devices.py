"""The loss's kernel per device (`Kernels.blocked_loss`, issue 43): on a GPU the output layer and its cross-entropy
are one piece, not the CPU's cache-sized blocks of rows. Counted on the meta device (free: no memory, no
arithmetic) over one forward and backward of GPT-2 small at its real sizes, with the kernels kqv takes on CUDA."""

import math
import sys
from contextlib import nullcontext
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import kqv.nn.losses as losses
from kqv import DecoderLM, ModelConfig
from kqv.nn.devices import CPU_KERNELS, CUDA_KERNELS, TORCH_KERNELS, Accelerator, Kernels, kernels
from kqv.nn.losses import linear_cross_entropy

VOCAB, BATCH, TIME = 50257, 8, 1024  # GPT-2 small's vocabulary, nanoGPT's micro-batch of 8 x 1,024 tokens
GPT2_SMALL = ModelConfig(
    vocab_size=VOCAB, d_model=768, n_heads=12, n_layers=12, d_ff=3072, max_len=TIME, dropout=0.0, position="learned"
)
MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}


class OpCounter(TorchDispatchMode):
    """Every aten op that runs inside it, with the shapes of its tensor arguments."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[object, list[tuple[int, ...]]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((func, [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]))
        return func(*args, **kwargs or {})

    def matmuls(self) -> list[list[tuple[int, ...]]]:
        return [shapes for func, shapes in self.ops if func in MATMULS]


def on_kernels(monkeypatch, chosen: Kernels) -> None:
    """Every kqv.nn module that asks `kernels(device)` gets `chosen` (as on a CUDA GPU) for any device."""
    for name, module in list(sys.modules.items()):
        if name.startswith("kqv.") and getattr(module, "kernels", None) is kernels:
            monkeypatch.setattr(module, "kernels", lambda device: chosen)


def count_step(loss_of) -> OpCounter:
    """The ops of one forward and backward of GPT-2 small on the meta device, its loss given by `loss_of`."""
    with torch.device("meta"):
        model = DecoderLM(GPT2_SMALL).train()
        ids = torch.randint(0, VOCAB, (BATCH, TIME))
    with OpCounter() as counter:
        loss_of(model, ids).backward()
    return counter


def kqv_loss(model, ids):
    return model(ids, ids)


def plain_head_and_cross_entropy(model, ids):  # nanoGPT's: the logits, then F.cross_entropy over all of them
    return F.cross_entropy(model(ids).flatten(0, -2).float(), ids.flatten(), ignore_index=-100)


def loss_matmuls(counter: OpCounter) -> list[list[tuple[int, ...]]]:
    """The products of the output layer: those with an operand as wide or as long as the vocabulary."""
    return [shapes for shapes in counter.matmuls() if any(VOCAB in shape for shape in shapes)]


def rows(shapes: list[tuple[int, ...]]) -> int:
    return shapes[-2][0]  # mm(a, b) and addmm(bias, a, b): the rows of a


def test_each_device_chooses_its_loss_once():
    assert CPU_KERNELS.blocked_loss
    assert not CUDA_KERNELS.blocked_loss and not TORCH_KERNELS.blocked_loss
    assert Accelerator(torch.device("cpu")).kernels.blocked_loss


def test_on_cuda_s_kernels_a_gpt2_small_step_has_the_ops_of_the_plain_head_and_no_small_product(monkeypatch):
    on_kernels(monkeypatch, CUDA_KERNELS)
    plain = count_step(plain_head_and_cross_entropy)
    ours = count_step(kqv_loss)
    assert len(ours.ops) <= 1.2 * len(plain.ops), (len(ours.ops), len(plain.ops))
    assert len(ours.matmuls()) <= len(plain.matmuls())
    in_loss = loss_matmuls(ours)
    assert len(in_loss) == 3  # the logits forward; the hidden states' and the weight's gradients backward
    assert min(rows(shapes) for shapes in in_loss) >= 1024, in_loss


def flops(counter: OpCounter) -> int:
    """2 m n k summed over the products: mm(a, b), addmm(bias, a, b), bmm(a, b)."""
    total = 0
    for shapes in counter.matmuls():
        a, b = shapes[-2:]
        total += 2 * math.prod(a) * b[-1]
    return total


def nanogpt() -> torch.nn.Module:
    """nanoGPT's GPT-2 small (benchmarks/references/nanogpt.py, the GPU benchmark's reference), dropout 0."""
    from references.nanogpt import NanoGPT, NanoGPTConfig  # benchmarks/ is on the tests' path (pyproject.toml)

    return NanoGPT(NanoGPTConfig(block_size=TIME, vocab_size=VOCAB))


def test_on_cuda_s_kernels_a_gpt2_small_step_costs_what_nanogpt_s_does(monkeypatch):
    """One forward and backward of GPT-2 small, kqv's on the kernels it takes on CUDA against nanoGPT's model:
    the same matmul FLOPs, at most 1.2x the aten ops (kqv projects queries apart from keys and values, which
    cross-attention shares: 3 products a layer more, of the same FLOPs), no product of fewer rows than d_model
    (the weight gradients' 768)."""
    on_kernels(monkeypatch, CUDA_KERNELS)
    with torch.device("meta"):
        reference = nanogpt().train()
        ids = torch.randint(0, VOCAB, (BATCH, TIME))
    with OpCounter() as theirs:
        reference(ids, ids)[1].backward()
    ours = count_step(kqv_loss)
    assert flops(ours) == flops(theirs) > 6 * 85e6 * BATCH * TIME  # 6 N per token, N = 85M outside the embeddings
    assert len(ours.ops) <= 1.2 * len(theirs.ops), (len(ours.ops), len(theirs.ops))
    assert len(ours.matmuls()) <= len(theirs.matmuls()) + 3 * GPT2_SMALL.n_layers
    assert min(shapes[-2][0] for shapes in ours.matmuls() if len(shapes[-2]) == 2) >= 768


def test_the_cpu_s_blocks_are_what_the_count_would_catch(monkeypatch):
    """The same count with the CPU's blocked loss (every other kernel CUDA's): 20 rows a block at this vocabulary,
    so hundreds of products of 20 rows, the step the test above rules out on a GPU."""
    on_kernels(monkeypatch, replace(CUDA_KERNELS, blocked_loss=True))
    enabled, autocast = torch.is_autocast_enabled, torch.autocast  # autocast has no meta device: none there
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda *on: False if on == ("meta",) else enabled(*on))
    monkeypatch.setattr(torch, "autocast", lambda on, **kw: nullcontext() if on == "meta" else autocast(on, **kw))
    plain = count_step(plain_head_and_cross_entropy)
    blocked = count_step(kqv_loss)
    assert len(blocked.ops) > 5 * len(plain.ops)
    block = losses.BLOCK_LOGITS // VOCAB  # 20 rows
    blocks = -(-BATCH * TIME // block)  # 410, the last of 12 rows
    assert sum(rows(shapes) == block for shapes in loss_matmuls(blocked)) == 2 * (blocks - 1)  # logits, d hidden


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("bias", [False, True])
def test_in_one_piece_it_is_the_blocked_loss(monkeypatch, smoothing, bias):
    """The GPU's one piece and the CPU's blocks give the same loss and gradients (fp32, on the CPU)."""
    torch.manual_seed(0)
    head = torch.nn.Linear(24, 53, bias=bias)
    hidden = torch.randn(2, 35, 24, requires_grad=True)
    targets = torch.randint(0, 53, (2, 35))
    targets[0, ::5] = -100
    results = []
    for chosen in (CPU_KERNELS, CUDA_KERNELS):
        monkeypatch.setattr(losses, "kernels", lambda device, chosen=chosen: chosen)
        monkeypatch.setattr(losses, "BLOCK_LOGITS", 530)  # ten rows a block
        hidden.grad = head.weight.grad = None
        loss = linear_cross_entropy(hidden, head, targets, label_smoothing=smoothing)
        loss.backward()
        results.append([loss.detach(), hidden.grad.clone(), head.weight.grad.clone()])
    for blocked, whole in zip(*results):
        torch.testing.assert_close(blocked, whole, rtol=1e-5, atol=1e-7)


def test_the_one_piece_keeps_the_checks_and_the_nan_of_nothing_counted(monkeypatch):
    monkeypatch.setattr(losses, "kernels", lambda device: CUDA_KERNELS)
    head, hidden = torch.nn.Linear(8, 11), torch.randn(2, 3, 8)
    assert torch.isnan(linear_cross_entropy(hidden, head, torch.full((2, 3), -100)))
    with pytest.raises(ValueError, match="targets must have shape"):
        linear_cross_entropy(hidden, head, torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="label_smoothing must be between 0 and 1"):
        linear_cross_entropy(hidden, head, torch.zeros(2, 3, dtype=torch.long), label_smoothing=2.0)


class AttentionCalls(torch.overrides.TorchFunctionMode):
    """The calls of `F.scaled_dot_product_attention`, seen before the meta device runs them as matmuls: whether each
    is in the form CUDA's flash kernel takes (causal by `is_causal`, no dense mask, no bias), and the matmuls
    forward that ran outside them (attention written out as products would show here)."""

    def __init__(self):
        super().__init__()
        self.fused: list[bool] = []
        self.inside = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        self.fused.append(kwargs.get("attn_mask") is None and len(args) < 4)
        return func(*args, **kwargs)


def test_on_cuda_s_kernels_gpt2_attention_is_flash_s_sdpa_call_as_in_nanogpt(monkeypatch):
    """The op count runs SDPA as its math on the meta device: the calls themselves say which kernel a GPU takes.
    kqv's GPT-2 small calls SDPA once a layer, maskless and causal (flash's form), as nanoGPT's model does, and
    its forward has no batched product of its own (scores written out as bmm would be)."""
    on_kernels(monkeypatch, CUDA_KERNELS)
    with torch.device("meta"):
        model, reference = DecoderLM(GPT2_SMALL).train(), nanogpt().train()
        ids = torch.randint(0, VOCAB, (BATCH, TIME))
    counts = []
    for forward in (lambda: model(ids, ids), lambda: reference(ids, ids)[1]):
        with AttentionCalls() as calls, OpCounter() as ops, torch.no_grad():
            forward()
        counts.append(calls.fused)
        bmm_outside = sum(func is torch.ops.aten.bmm.default for func, _ in ops.ops) - 2 * len(calls.fused)
        assert bmm_outside <= 0, bmm_outside  # the math kernel's two bmm per call, nothing else
    assert counts[0] == counts[1] == [True] * GPT2_SMALL.n_layers
