"""linear_cross_entropy against torch's F.linear + F.cross_entropy: the same loss and gradients, block by block."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kqv.nn.losses as losses
from kqv.nn.losses import linear_cross_entropy


def problem(bias: bool, tokens: int = 70, d_model: int = 24, vocab: int = 53, seed: int = 0):
    torch.manual_seed(seed)
    head = nn.Linear(d_model, vocab, bias=bias)
    hidden = torch.randn(2, tokens // 2, d_model, requires_grad=True)
    targets = torch.randint(0, vocab, (2, tokens // 2))
    targets[0, ::5] = -100
    return head, hidden, targets


def loss_and_grads(fn, head, hidden):
    hidden.grad, head.weight.grad = None, None
    if head.bias is not None:
        head.bias.grad = None
    loss = fn()
    loss.backward()
    grads = [hidden.grad, head.weight.grad] + ([] if head.bias is None else [head.bias.grad])
    return loss.detach(), [g.clone() for g in grads]


def reference(head, hidden, targets, smoothing):
    return F.cross_entropy(
        head(hidden).flatten(0, -2).float(), targets.flatten(), ignore_index=-100, label_smoothing=smoothing
    )


@pytest.mark.parametrize("block", [53, 530, 1 << 20])  # one row per block, ten rows, everything at once
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("bias", [False, True])
def test_same_loss_and_gradients_as_torch_in_fp32(monkeypatch, block, smoothing, bias):
    monkeypatch.setattr(losses, "BLOCK_LOGITS", block)
    head, hidden, targets = problem(bias)
    ours = loss_and_grads(lambda: linear_cross_entropy(hidden, head, targets, label_smoothing=smoothing), head, hidden)
    theirs = loss_and_grads(lambda: reference(head, hidden, targets, smoothing), head, hidden)
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-6, atol=1e-6)
    for mine, torchs in zip(ours[1], theirs[1]):
        torch.testing.assert_close(mine, torchs, rtol=1e-5, atol=1e-7)


def test_under_bf16_autocast_it_is_as_close_to_fp32_as_torch_is(monkeypatch):
    monkeypatch.setattr(losses, "BLOCK_LOGITS", 530)
    head, hidden, targets = problem(bias=True, tokens=400, d_model=64, vocab=211)
    exact = loss_and_grads(lambda: reference(head, hidden, targets, 0.1), head, hidden)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = loss_and_grads(lambda: linear_cross_entropy(hidden, head, targets, label_smoothing=0.1), head, hidden)
        theirs = loss_and_grads(lambda: reference(head, hidden, targets, 0.1), head, hidden)
    assert abs(ours[0] - exact[0]) <= 2 * abs(theirs[0] - exact[0]) + 1e-4
    for mine, torchs, truth in zip(ours[1], theirs[1], exact[1]):
        error, torch_error = (mine - truth).norm() / truth.norm(), (torchs - truth).norm() / truth.norm()
        assert error <= 2 * torch_error + 1e-3, (error, torch_error)


def test_the_incoming_gradient_scales_the_gradients():
    head, hidden, targets = problem(bias=False)
    once = loss_and_grads(lambda: linear_cross_entropy(hidden, head, targets), head, hidden)
    thrice = loss_and_grads(lambda: 3 * linear_cross_entropy(hidden, head, targets), head, hidden)
    for one, three in zip(once[1], thrice[1]):
        torch.testing.assert_close(three, 3 * one)


def test_without_gradients_it_only_computes_the_loss(monkeypatch):
    head, hidden, targets = problem(bias=True)
    asked = []
    blocks = losses._blocks
    monkeypatch.setattr(losses, "_blocks", lambda *args: asked.append(args[-1]) or blocks(*args))
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, head, targets)
    assert not loss.requires_grad
    assert asked == [False]  # no gradients formed under no_grad (validation)
    torch.testing.assert_close(loss, reference(head, hidden, targets, 0.0).detach())


def test_no_counted_target_gives_nan_as_torch_does():
    head, hidden, targets = problem(bias=False)
    nothing = torch.full_like(targets, -100)
    assert torch.isnan(linear_cross_entropy(hidden, head, nothing))
    assert torch.isnan(reference(head, hidden, nothing, 0.0))


def test_mismatched_targets_and_bad_smoothing_are_clear_errors():
    head, hidden, targets = problem(bias=False)
    with pytest.raises(ValueError, match="targets must have shape"):
        linear_cross_entropy(hidden, head, targets[:, :-1])
    with pytest.raises(ValueError, match="label_smoothing must be between 0 and 1"):
        linear_cross_entropy(hidden, head, targets, label_smoothing=1.5)
