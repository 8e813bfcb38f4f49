"""What the explorer computes from attention: per-head statistics on heads of known shape, and the weights of the
sparse cores (which never form them), checked against the cores' own outputs."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from conftest import tiny_config
from kqv.data.tokenizers import CharTokenizer
from kqv.explore.analysis import head_statistics
from kqv.explore.sparse_views import bigbird_weights, linformer_weights
from kqv.explore.subjects import LMSubject, MLMSubject
from kqv.jobs.sampling import SampleConfig
from kqv.nn.heads import MaskedLM
from kqv.nn.models import DecoderLM, Encoder
from kqv.nn.sparse import BigBirdAttention, LinformerAttention, bigbird_mask

T = 6


def one_head(rows: torch.Tensor) -> torch.Tensor:
    return rows[None, None]  # (layers=1, heads=1, q, k)


def test_a_previous_token_head_is_measured_and_tagged():
    weights = torch.zeros(T, T)
    weights[0, 0] = 1.0
    weights[torch.arange(1, T), torch.arange(T - 1)] = 1.0
    (stats,) = head_statistics(one_head(weights))
    assert stats["entropy"] == 0.0 and stats["max_weight"] == 1.0
    assert stats["previous"] == 1.0 and stats["distance"] == pytest.approx((T - 1) / T, abs=1e-4)
    assert stats["first"] == pytest.approx(1 / (T - 1), abs=1e-4) and stats["self"] == pytest.approx(1 / T, abs=1e-4)
    assert stats["tags"] == ["previous"]


def test_a_uniform_causal_head_has_the_largest_entropy_it_can():
    weights = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]  # row i: 1 / (i + 1) on tokens 0..i
    (stats,) = head_statistics(one_head(weights))
    assert stats["entropy"] == pytest.approx(sum(math.log(i + 1) for i in range(T)) / T, abs=1e-4)
    assert stats["distance"] == pytest.approx(sum(i / 2 for i in range(T)) / T, abs=1e-4)
    assert stats["first"] == pytest.approx(sum(1 / (i + 1) for i in range(1, T)) / (T - 1), abs=1e-4)
    assert stats["tags"] == ["uniform"]


def test_a_first_token_head_is_tagged_and_cross_attention_has_no_distances():
    weights = torch.zeros(T, T)
    weights[:, 0] = 1.0
    (stats,) = head_statistics(one_head(weights))
    assert stats["first"] == 1.0 and stats["tags"] == ["first"]
    (cross,) = head_statistics(one_head(torch.full((3, 5), 0.2)), self_attention=False)
    assert set(cross) == {"layer", "head", "entropy", "max_weight", "tags"}
    assert cross["entropy"] == pytest.approx(math.log(5), abs=1e-4) and cross["tags"] == ["uniform"]


# ---------------------------------------------------------------------------------------------------------------
# Sparse cores: the rebuilt weights times the values are what the core computed


def core_calls(model: torch.nn.Module, run) -> list[tuple]:
    """(core, args, kwargs, output) of every sparse core call while run() runs the model."""
    calls = []
    cores = [m for m in model.modules() if isinstance(m, (BigBirdAttention, LinformerAttention))]
    hooks = [
        core.register_forward_hook(lambda m, a, k, out: calls.append((m, a, k, out)), with_kwargs=True)
        for core in cores
    ]
    with torch.no_grad():
        run()
    for hook in hooks:
        hook.remove()
    assert len(calls) == len(cores) > 0
    return calls


BIGBIRD = dict(
    attention="bigbird", bigbird={"block": 4, "window": 1, "global_blocks": 1, "random_blocks": 1}, position="rope"
)


@pytest.mark.parametrize("causal", [True, False])
def test_rebuilt_bigbird_weights_reproduce_the_cores_output_and_zero_outside_its_pattern(causal):
    config = tiny_config(**BIGBIRD)
    model = (DecoderLM if causal else Encoder)(config).eval()
    ids = torch.randint(0, 37, (1, 19))
    for core, args, kwargs, output in core_calls(model, lambda: model(ids)):
        weights = bigbird_weights(core, *args, **kwargs)  # (1, heads, 19, 19)
        torch.testing.assert_close(weights @ args[2], output, atol=1e-5, rtol=0)
        allowed = bigbird_mask(19, 4, 1, 1, 1, causal)
        assert (weights[..., ~allowed] == 0).all() and (weights[..., allowed] > 0).all()


@pytest.mark.parametrize("causal", [True, False])
def test_rebuilt_linformer_weights_reproduce_the_cores_output(causal):
    config = tiny_config(attention="linformer", linformer={"k": 8, "sharing": "none"}, position="rope")
    model = (DecoderLM if causal else Encoder)(config).eval()
    ids = torch.randint(0, 37, (1, 11))
    for core, args, kwargs, output in core_calls(model, lambda: model(ids)):
        weights = linformer_weights(core, *args, **kwargs)  # (1, heads, 11, k=8)
        _, f = core.projection(11)
        values = args[2]
        if causal:  # query i reads F[:i+1]^T V[:i+1]
            mixed = (f[None, :, :, :, None] * values[:, :, :, None, :]).cumsum(2)  # (1, heads, 11, k, d)
            rebuilt = torch.einsum("bhqk,bhqkd->bhqd", weights, mixed)
        else:
            rebuilt = weights @ (f.transpose(1, 2) @ values)
        torch.testing.assert_close(rebuilt, output, atol=1e-5, rtol=0)
        assert weights.shape[-1] == 8


def lm_subject(**changes) -> LMSubject:
    tokenizer = CharTokenizer.train("abcdefghij ")
    model = DecoderLM(tiny_config(vocab_size=tokenizer.vocab_size, **changes))
    run = SimpleNamespace(model=model, tokenizer=tokenizer, config=SimpleNamespace(sample=SampleConfig()))
    return LMSubject("tiny", run, limit=64)


def test_a_bigbird_lm_shows_its_sparse_pattern():
    body = lm_subject(**BIGBIRD).analyze({"text": "abc def ghij abc def"})
    view = body["attention"]["self"]
    assert "BigBird" in view["note"] and view["keys"] == view["queries"]
    allowed = bigbird_mask(20, 4, 1, 1, 1, causal=True)
    for layer in view["layers"]:
        for head in layer:
            weights = torch.tensor(head)
            assert (weights[~allowed] == 0).all() and (weights[allowed] > 0).all()


def test_a_linformer_model_attends_to_slots_and_says_so():
    body = lm_subject(attention="linformer", linformer={"k": 8}, position="rope").analyze({"text": "abc def"})
    view = body["attention"]["self"]
    assert view["keys"] == [f"slot {j}" for j in range(1, 9)] and "Linformer" in view["note"]
    assert not view["causal"] and "distance" not in view["stats"][0]
    assert torch.tensor(view["layers"]).shape == (2, 4, 7, 8)


def test_an_encoder_subject_with_full_attention_has_no_note():
    tokenizer = CharTokenizer.train("abc ")
    vocabulary = SimpleNamespace(
        tokenizer=tokenizer,
        specials={"[MASK]": 4, "[PAD]": 5, "[CLS]": 6, "[SEP]": 7},
        mask_id=4,
        encode=tokenizer.encode,
    )
    subject = MLMSubject("tiny", MaskedLM(tiny_config(vocab_size=8)), vocabulary, limit=64)
    body = subject.analyze({"text": "ab[MASK]c"})
    assert body["tokens"] == ["a", "b", "[MASK]", "c"] and body["attention"]["self"]["note"] is None
    assert [m["position"] for m in body["masked"]] == [2]
