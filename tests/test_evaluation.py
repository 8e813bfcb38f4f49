"""`kqv.train.perplexity.perplexity` against cross-entropy computed by torch from the model's full logits."""

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_config
from kqv import DecoderLM
from kqv.train.perplexity import perplexity


@pytest.mark.parametrize("length", [41, 50])  # 50 - 1 targets = 3 full blocks of 16 + 1 left over; 41: 2 + 8
def test_perplexity_scores_every_next_token_once_as_torch_cross_entropy_does(length):
    model = DecoderLM(tiny_config()).train()  # perplexity scores in eval mode and restores training mode
    ids = torch.randint(0, 37, (length,))
    result = perplexity(model, ids, context=16, batch_size=2, n_chars=3 * length)
    assert model.training
    model.eval()
    with torch.no_grad():  # the reference: each block's logits from the model, then torch's cross-entropy
        blocks = [(start, min(start + 16, length - 1)) for start in range(0, length - 1, 16)]
        nats = [
            F.cross_entropy(model(ids[start:end][None])[0], ids[start + 1 : end + 1], reduction="sum")
            for start, end in blocks
        ]
    expected = sum(n.item() for n in nats) / (length - 1)
    assert result["tokens"] == length - 1
    assert result["loss"] == pytest.approx(expected, rel=1e-5)
    assert result["perplexity"] == pytest.approx(math.exp(expected), rel=1e-5)
    assert result["bits_per_token"] == pytest.approx(expected / math.log(2), rel=1e-5)
    assert result["bits_per_char"] == pytest.approx(expected * (length - 1) / math.log(2) / (3 * length), rel=1e-5)


def test_max_tokens_scores_a_prefix():
    model = DecoderLM(tiny_config()).eval()
    ids = torch.randint(0, 37, (100,))
    assert perplexity(model, ids, context=16, max_tokens=30)["loss"] == pytest.approx(
        perplexity(model, ids[:31], context=16)["loss"], rel=1e-6
    )
