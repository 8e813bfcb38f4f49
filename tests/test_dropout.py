"""kqv's dropout against torch's: the same expectation, rate and scaling, independent draws, seeded."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kqv.nn.dropout import Dropout, dropout

N = 400_003  # not a multiple of 4: the last 64-bit draw is only partly used


def within_sigmas(count: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_drops_at_rate_p_and_scales_the_rest_as_torch_does(p, dtype):
    torch.manual_seed(0)
    x = torch.rand(N, dtype=dtype) + 0.5
    ours, theirs = dropout(x, p), F.dropout(x, p)
    assert within_sigmas(int((ours == 0).sum()), N, p)
    kept = (ours != 0) & (theirs != 0)
    assert kept.sum() > 0
    torch.testing.assert_close(ours[kept], theirs[kept], rtol=0, atol=0)


def test_neighbouring_elements_are_dropped_independently():
    """Four elements share one 64-bit draw; each pair of neighbours must still be dropped with probability p^2."""
    torch.manual_seed(1)
    p = 0.3
    dropped = dropout(torch.ones(N - 3), p) == 0
    for shift in (1, 2, 3, 4):
        both = int((dropped[:-shift] & dropped[shift:]).sum())
        assert within_sigmas(both, N - 3 - shift, p * p), shift


def test_draws_are_seeded_and_fresh_on_each_call():
    x = torch.ones(10_000)
    torch.manual_seed(7)
    first, second = dropout(x, 0.5), dropout(x, 0.5)
    torch.manual_seed(7)
    assert torch.equal(dropout(x, 0.5), first)
    assert within_sigmas(int((first == second).sum()), 10_000, 0.5)  # agreement p^2 + (1-p)^2 = 1/2


def test_gradient_is_the_mask():
    torch.manual_seed(2)
    x = torch.randn(64, 33, requires_grad=True)
    out = dropout(x, 0.25)
    out.sum().backward()
    mask = torch.where(out != 0, 1 / 0.75, 0.0)
    torch.testing.assert_close(x.grad, mask)
    torch.testing.assert_close(out, x.detach() * mask)


def test_identity_outside_training_and_at_p_zero():
    x = torch.randn(5, 7)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))


def test_non_contiguous_input_keeps_its_shape():
    torch.manual_seed(3)
    x = torch.ones(30, 40).t()
    out = dropout(x, 0.5)
    assert out.shape == (40, 30)
    assert set(out.unique().tolist()) <= {0.0, 2.0}


def test_module_is_a_drop_in_for_nn_dropout():
    ours, theirs = Dropout(0.2), nn.Dropout(0.2)
    assert repr(ours) == repr(theirs)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    x = torch.randn(3, 4)
    assert ours.eval()(x) is x


@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_a_probability_outside_0_1_is_refused(p):
    with pytest.raises(ValueError, match="between 0 and 1"):
        dropout(torch.ones(3), p)
