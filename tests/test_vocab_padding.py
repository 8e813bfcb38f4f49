"""A vocabulary padded to a multiple of 64 (`ModelConfig.vocab_multiple`, as nanoGPT pads GPT-2's): the padded
rows change nothing the model says. Each padded model is checked against an independent reference: the unpadded
model with the same real weights, torch's cross-entropy, Hugging Face's models. The padded rows of the output layer
are made to win every argmax first, so a padded id that leaks into the logits, the loss or a sample shows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kqv
import kqv.interop
import test_interop
from kqv.api import packaged_config
from kqv.errors import ConfigError
from kqv.interop import from_hf
from kqv.jobs import JOBS
from kqv.nn.devices import CUDA_KERNELS
from kqv.nn.losses import whole_cross_entropy
from kqv.train.flops import model_flops_per_token, training_flops_per_token
from test_cli import TINY
from test_interop import CASES, hf_model, inputs, randomized
from test_losses_devices import on_kernels

VOCAB, MULTIPLE, PADDED = 37, 64, 64  # an odd vocabulary and the rows it is padded to
VOCABULARY_TENSORS = ("tokens.weight", "lm_head.weight", "to_vocab.weight", "to_vocab.bias")
SMALL = kqv.ModelConfig(vocab_size=VOCAB, d_model=24, n_heads=2, n_layers=2, d_ff=40, max_len=24, dropout=0.0)


def pair(cls=kqv.DecoderLM, **changes):
    """(padded model, unpadded model with the same real weights); the padded rows of every vocabulary tensor
    large, so that padded ids would win every argmax and most of every softmax if they were scored."""
    torch.manual_seed(0)
    config = SMALL.replace(**changes)
    padded = cls(config.replace(vocab_multiple=MULTIPLE)).eval()
    plain = cls(config).eval()
    state = {}
    with torch.no_grad():
        for name, tensor in padded.state_dict().items():
            if name.endswith(VOCABULARY_TENSORS):
                tensor[VOCAB:] = 3.0  # each padded logit ~ 3 * sum(hidden): far above the real ones
                tensor = tensor[:VOCAB]
            state[name] = tensor
    plain.load_state_dict(state)
    return padded, plain


def test_a_vocab_multiple_below_one_is_refused_in_one_line():
    for bad in (0, -64):
        with pytest.raises(ConfigError, match=r"^vocab_multiple must be at least 1 \(1: no padding; 64 pads") as error:
            kqv.ModelConfig(vocab_size=VOCAB, vocab_multiple=bad)
        assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="vocab_multiple must be at least 1"):
        kqv.ModelConfig.from_toml("vocab_size = 50257\nvocab_multiple = 0\n")


def test_the_table_and_the_output_layer_are_padded_and_the_outputs_are_the_real_vocabulary():
    config = SMALL.replace(vocab_multiple=MULTIPLE)
    assert config.padded(VOCAB) == PADDED and config.padded(64) == 64 and SMALL.padded(VOCAB) == VOCAB
    assert kqv.ModelConfig(vocab_multiple=64).padded(50257) == 50304  # nanoGPT's GPT-2 vocabulary
    assert kqv.ModelConfig.from_toml(config.to_toml()) == config
    padded, plain = pair()
    assert padded.decoder.embeddings.tokens.weight.shape == (PADDED, 24)
    assert padded.lm_head.weight is padded.decoder.embeddings.tokens.weight  # still tied
    ids = torch.randint(0, VOCAB, (2, 9))
    with torch.no_grad():
        logits = padded(ids)
        assert logits.shape == (2, 9, VOCAB)
        torch.testing.assert_close(logits, plain(ids), atol=1e-6, rtol=0)
    assert type(plain.lm_head) is torch.nn.Linear  # without padding nothing changes


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("kernel", ["blocked", "whole"])  # the CPU's kernel, and the GPU's (and compile's)
def test_the_loss_and_its_gradients_are_the_unpadded_models_and_torchs(kernel, smoothing, monkeypatch):
    if kernel == "whole":
        on_kernels(monkeypatch, CUDA_KERNELS)
    padded, plain = pair(cls=kqv.DecoderLM)
    ids, targets = torch.randint(0, VOCAB, (3, 10)), torch.randint(0, VOCAB, (3, 10))
    targets[0, :4] = -100
    hidden = padded.decoder(ids)[0].detach().requires_grad_()
    loss = kqv.nn.losses.linear_cross_entropy(hidden, padded.lm_head, targets, label_smoothing=smoothing)
    reference_hidden = hidden.detach().clone().requires_grad_()
    reference = F.cross_entropy(
        plain.lm_head(reference_hidden).flatten(0, 1), targets.flatten(), label_smoothing=smoothing
    )
    torch.testing.assert_close(loss, reference, atol=1e-5, rtol=0)
    loss.backward()
    reference.backward()
    torch.testing.assert_close(hidden.grad, reference_hidden.grad, atol=1e-6, rtol=0)
    weight_grad = padded.lm_head.weight.grad
    torch.testing.assert_close(weight_grad[:VOCAB], plain.lm_head.weight.grad, atol=1e-6, rtol=0)
    assert not weight_grad[VOCAB:].any()  # the padded rows learn nothing


def test_every_models_loss_is_the_unpadded_models():
    ids, targets = torch.randint(0, VOCAB, (2, 8)), torch.randint(0, VOCAB, (2, 8))
    with torch.no_grad():
        padded, plain = pair(kqv.DecoderLM)
        torch.testing.assert_close(padded(ids, targets), plain(ids, targets), atol=1e-5, rtol=0)
        padded, plain = pair(kqv.EncoderDecoder)
        src = torch.randint(0, VOCAB, (2, 5))
        got, want = padded(src, ids, targets, label_smoothing=0.1), plain(src, ids, targets, label_smoothing=0.1)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        padded, plain = pair(kqv.MaskedLM)
        masked = targets.masked_fill(torch.rand(2, 8) < 0.5, -100)
        torch.testing.assert_close(padded(ids, masked), plain(ids, masked), atol=1e-5, rtol=0)
        assert padded(ids).shape == (2, 8, VOCAB)
        hidden = torch.randn(4, 24)
        got = whole_cross_entropy(hidden, padded.head.to_vocab, targets[0, :4])
        torch.testing.assert_close(got, F.cross_entropy(plain.head.to_vocab(hidden), targets[0, :4]))


@pytest.mark.parametrize("batch", [1, 2])  # one row: the fast decoding step's one-row products
@pytest.mark.parametrize("use_cache", [True, False])
def test_generation_is_the_unpadded_models_and_never_gives_a_padded_id(batch, use_cache):
    padded, plain = pair()
    prompt = torch.randint(0, VOCAB, (batch, 3))
    greedy = padded.generate(prompt, 12, temperature=0.0, use_cache=use_cache)
    assert torch.equal(greedy, plain.generate(prompt, 12, temperature=0.0, use_cache=use_cache))
    sampled = [
        model.generate(prompt, 20, temperature=3.0, use_cache=use_cache, generator=torch.Generator().manual_seed(5))
        for model in (padded, plain)
    ]
    assert torch.equal(*sampled)
    assert int(sampled[0].max()) < VOCAB


def test_beam_search_is_the_unpadded_models():
    padded, plain = pair(kqv.EncoderDecoder)
    src = torch.randint(2, VOCAB, (2, 6))
    for beam in (1, 3):
        got = padded.generate(src, 8, bos_id=0, eos_id=1, beam_size=beam)
        assert torch.equal(got, plain.generate(src, 8, bos_id=0, eos_id=1, beam_size=beam))
        assert int(got.max()) < VOCAB


def test_the_flops_count_the_padded_output_layer_the_gpu_computes(monkeypatch):
    padded, plain = pair()
    extra = 6 * (PADDED - VOCAB) * SMALL.d_model  # its forward product and the two of its backward, per token
    assert model_flops_per_token(padded) - model_flops_per_token(plain) == extra
    on_kernels(monkeypatch, CUDA_KERNELS)  # the GPU's loss: the whole padded product
    ids = torch.randint(0, VOCAB, (2, 9))
    counted = [
        training_flops_per_token(model.train(), [(ids[:, :-1], ids[:, 1:])], lambda m, b: m(*b), 16)
        for model in (padded, plain)
    ]
    assert counted[0] - counted[1] == pytest.approx(extra)


def test_the_gpt2_config_pads_to_nanogpts_50304():
    config = JOBS["lm"].load_config(packaged_config("gpt2"))
    model = config.model_config(config.data.vocab_size)
    assert (model.vocab_size, model.vocab_multiple, model.padded(model.vocab_size)) == (50257, 64, 50304)


# ---------------------------------------------------------------------------------------------------------------
# Hugging Face weights keep the real vocabulary: exported sliced, imported padded


@torch.no_grad()
def test_a_padded_gpt_converts_to_a_gpt2_of_the_real_vocabulary_with_the_same_logits_and_back(tmp_path):
    torch.manual_seed(0)
    config = SMALL.replace(vocab_size=101, position="learned", activation="gelu_tanh", vocab_multiple=MULTIPLE)
    ours = randomized(kqv.DecoderLM(config))
    assert ours.lm_head.weight.shape == (128, 24)
    hf = kqv.interop.to_hf(ours)
    assert type(hf).__name__ == "GPT2LMHeadModel" and hf.config.vocab_size == 101
    assert hf.transformer.wte.weight.shape == (101, 24)
    ids = torch.randint(0, 101, (2, 12))
    expected = hf(ids).logits
    torch.testing.assert_close(ours(ids), expected, atol=1e-5, rtol=0)
    hf.save_pretrained(tmp_path)
    for source in (hf, tmp_path):
        back = from_hf(source, vocab_multiple=MULTIPLE)
        assert back.config.vocab_multiple == MULTIPLE and back.lm_head.weight.shape == (128, 24)
        torch.testing.assert_close(back(ids), expected, atol=1e-5, rtol=0)
        assert all(torch.equal(tensor, real_rows(ours)[name]) for name, tensor in real_rows(back).items())
        assert not back.lm_head.weight[101:].any()  # the padding comes in as zeros
    assert from_hf(hf).lm_head.weight.shape == (101, 24)  # unpadded unless asked


@pytest.mark.parametrize("case", CASES)
@torch.no_grad()
def test_every_architecture_loads_into_a_padded_model_with_the_same_outputs_and_exports_back(case, monkeypatch):
    torch.manual_seed(0)
    kind, changes = CASES[case]
    hf = hf_model(kind, **changes)
    padded = from_hf(hf, vocab_multiple=MULTIPLE)
    tables = [m for name, m in padded.named_modules() if name.endswith("embeddings.tokens")]
    assert tables and all(table.num_embeddings % MULTIPLE == 0 for table in tables)
    monkeypatch.setattr(test_interop, "from_hf", lambda source: from_hf(source, vocab_multiple=MULTIPLE))
    ours, expected, real = inputs(kind, hf, padded=True)  # the padded model's outputs
    assert ours.shape == expected.shape
    torch.testing.assert_close(ours[real.bool()], expected[real.bool()], atol=1e-5, rtol=0)
    back = kqv.interop.to_hf(padded).state_dict()
    assert sorted(back) == sorted(hf.state_dict())
    assert all(torch.equal(back[name], tensor) for name, tensor in hf.state_dict().items())


def real_rows(model, padded=128, vocab=101):
    """The state dict of `model` with every tensor of `padded` rows cut to its first `vocab`."""
    return {name: t[:vocab] if t.shape[:1] == (padded,) else t for name, t in model.state_dict().items()}


def test_a_padded_lm_run_trains_and_exports_a_gpt2_of_the_real_vocabulary(tmp_path):
    from transformers import GPT2LMHeadModel

    (tmp_path / "tiny.txt").write_text("To be, or not to be, that is the question.\n" * 40)
    config = TINY.format(position="learned").replace("dropout = 0.0", "dropout = 0.0\nvocab_multiple = 64")
    (tmp_path / "tiny.toml").write_text(config)
    data = f"data.path={tmp_path / 'tiny.txt'}"
    kqv.train("lm", tmp_path / "tiny.toml", out=tmp_path / "run", overrides=[data], steps=2, quiet=True)
    model = kqv.load(tmp_path / "run", device="cpu").model.eval()
    vocab = model.config.vocab_size  # the characters of the text
    assert model.lm_head.weight.shape == (MULTIPLE, 16) and vocab < MULTIPLE
    hf = GPT2LMHeadModel.from_pretrained(kqv.export(tmp_path / "run", hf=tmp_path / "hf")).eval()
    assert hf.config.vocab_size == vocab and hf.transformer.wte.weight.shape == (vocab, 16)
    ids = torch.randint(0, vocab, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=1e-5, rtol=0)
