"""Devices: the one per-device choice (`kqv.nn.devices.Accelerator`), device propagation through every model, and
runs moving between devices.

This machine may have no GPU, so device propagation is checked on the CPU by `created_on_its_device`: inside it
the default device is `meta` and every operation that returns a meta tensor fails. Any tensor a forward pass
creates without `device=` (`torch.arange(n)`, `torch.zeros(...)`, ...) would land on the CPU while the model is on
a GPU; under the guard it lands on `meta` and is named. The tests marked `cuda` run only where CUDA is.
"""

from contextlib import contextmanager

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from conftest import POSITIONS, VARIANTS, tiny_config
from kqv.nn.heads import MaskedLM, SequenceClassifier
from kqv.nn.models import DecoderLM, Encoder, EncoderDecoder
from kqv.nn.rnn import RNNConfig, RNNEncoderDecoder
from kqv.nn.vision import ViT

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class _NoDevicelessTensors(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in tree_flatten(out)[0]):
            raise AssertionError(f"{func} created a tensor without device= (it would be on the CPU, not the model's)")
        return out


def _own_functions(cls=torch.autograd.Function):
    """Every autograd Function not defined by torch itself (kqv's, and tests')."""
    for sub in cls.__subclasses__():
        if not sub.__module__.startswith("torch"):
            yield sub
        yield from _own_functions(sub)


def _on_meta(backward):
    def run(ctx, *grads):
        with torch.device("meta"):
            return backward(ctx, *grads)

    return run


@contextmanager
def created_on_its_device():
    """Fail on any tensor created without an explicit device while this is active (see the module docstring).

    The autograd engine does not carry the default device into backward passes, so the backward of every autograd
    Function defined outside torch (its `backward` is looked up when it runs) is wrapped to set it again."""
    functions = {cls: cls.__dict__["backward"] for cls in _own_functions() if "backward" in cls.__dict__}
    for cls, backward in functions.items():
        cls.backward = staticmethod(_on_meta(backward.__func__))
    try:
        with torch.device("meta"), _NoDevicelessTensors():
            yield
    finally:
        for cls, backward in functions.items():
            cls.backward = backward


def test_the_guard_catches_a_tensor_created_without_a_device():
    class Careless(nn.Module):
        def forward(self, x):
            return x + torch.arange(x.shape[-1])

    class Careful(nn.Module):
        def forward(self, x):
            return x + torch.arange(x.shape[-1], device=x.device)

    x, expected = torch.zeros(2, 3), torch.arange(3.0).expand(2, 3)
    with created_on_its_device():
        assert torch.equal(Careful()(x), expected)
        with pytest.raises(AssertionError, match="arange.*without device="):
            Careless()(x)


class _CarelessBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2 + torch.zeros(grad.shape)


def test_the_guard_catches_a_tensor_created_without_a_device_in_a_backward_pass():
    x = torch.ones(3, requires_grad=True)
    with created_on_its_device(), pytest.raises(AssertionError, match="zeros.*without device="):
        _CarelessBackward.apply(x).sum().backward()
    _CarelessBackward.apply(x).sum().backward()  # restored afterwards
    assert torch.equal(x.grad, torch.full((3,), 2.0))


def test_the_guard_catches_the_other_factories_too():
    x = torch.zeros(3)
    for make in (
        lambda: torch.zeros(3),
        lambda: torch.ones(3),
        lambda: torch.full((3,), 2.0),
        lambda: torch.tensor([1.0, 2.0, 3.0]),
        lambda: torch.empty(3).fill_(0),
        lambda: torch.ones(3, 3).tril(),
    ):
        # torch.tensor(list) skips the dispatcher: its meta tensor fails in the first operation that mixes devices
        with (
            created_on_its_device(),
            pytest.raises((AssertionError, RuntimeError), match="without device=|device meta"),
        ):
            x + make()


# ---------------------------------------------------------------------------------------------------------------
# Every architecture, position scheme and attention core creates its tensors on its inputs' device


def _ids(batch=2, time=12, vocab=37):
    return torch.randint(1, vocab, (batch, time))


def _padding(batch=2, time=12):
    mask = torch.ones(batch, time, dtype=torch.long)
    mask[0, -3:] = 0
    return mask


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_decoder_lm_forward_and_backward_stay_on_the_device(variant, training):
    model = DecoderLM(tiny_config(**VARIANTS[variant], dropout=0.1)).train(training)
    ids, mask = _ids(), _padding()
    with created_on_its_device():
        loss = model(ids, ids)
        loss.backward()
        model(ids, attention_mask=mask)
    assert torch.isfinite(loss)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_encoder_and_encoder_decoder_stay_on_the_device(variant):
    config = tiny_config(**VARIANTS[variant], dropout=0.1)
    encoder, seq2seq = Encoder(config).train(), EncoderDecoder(config).train()
    ids, mask = _ids(), _padding()
    with created_on_its_device():
        encoder(ids, mask).sum().backward()
        seq2seq(ids, ids[:, :7], ids[:, :7], src_mask=mask).backward()


@pytest.mark.parametrize("blockwise", ["always", "never"])
@pytest.mark.parametrize("position", POSITIONS)
def test_full_attention_kernels_stay_on_the_device(position, blockwise):
    model = DecoderLM(tiny_config(position=position, blockwise=blockwise))
    ids = _ids()
    with created_on_its_device():
        model(ids, ids).backward()
        model.decoder(ids, need_weights=True)


@pytest.mark.parametrize("variant", ["sinusoidal", "rope", "alibi", "relative", "switch", "local", "dmca"])
@pytest.mark.parametrize("batch", [1, 3])
def test_generation_stays_on_the_device(variant, batch):
    model = DecoderLM(tiny_config(**VARIANTS[variant])).eval()
    ids = _ids(batch, 5)
    generator = torch.Generator().manual_seed(0)
    with created_on_its_device(), torch.no_grad():
        out = model.generate(ids, 6, temperature=0.8, top_k=5, top_p=0.9, generator=generator)
        greedy = model.generate(ids, 6, temperature=0)
    assert out.shape == greedy.shape == (batch, 11)


def test_generation_of_left_padded_prompts_and_bf16_stays_on_the_device():
    model = DecoderLM(tiny_config(position="rope")).eval()
    ids, mask = _ids(2, 6), torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0
    with created_on_its_device(), torch.no_grad():
        model.generate(ids, 4, temperature=0, attention_mask=mask)
        model.generate(ids, 4, temperature=0, dtype=torch.bfloat16)


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize("variant", ["sinusoidal", "relative", "alibi", "moe"])
def test_translation_and_beam_search_stay_on_the_device(variant, beam_size):
    model = EncoderDecoder(tiny_config(**VARIANTS[variant])).eval()
    src, mask = _ids(2, 9), _padding(2, 9)
    with created_on_its_device(), torch.no_grad():
        out = model.generate(src, 5, bos_id=1, eos_id=2, beam_size=beam_size, src_mask=mask)
    assert out.shape[0] == 2


@pytest.mark.parametrize("beam_size", [1, 3])
def test_the_lstm_baseline_stays_on_the_device(beam_size):
    model = RNNEncoderDecoder(RNNConfig(vocab_size=37, d_embed=8, d_hidden=16, n_layers=1, attention_hidden=8))
    src, mask = _ids(2, 9), _padding(2, 9)
    with created_on_its_device():
        model.train()(src, src[:, :6], src[:, :6], src_mask=mask).backward()
        with torch.no_grad():
            model.eval().generate(src, 5, bos_id=1, eos_id=2, beam_size=beam_size, src_mask=mask)


def test_the_heads_and_the_vit_stay_on_the_device():
    config = tiny_config(dropout=0.1)
    ids, mask, labels = _ids(), _padding(), torch.tensor([0, 2])
    mlm, classifier = MaskedLM(config).train(), SequenceClassifier(config, 3).train()
    vit = ViT(tiny_config(vocab_size=None, position="learned"), (1, 8, 8), 4, n_classes=10).train()
    images, image_labels = torch.rand(3, 1, 8, 8), torch.tensor([1, 2, 3])
    with created_on_its_device():
        mlm(ids, ids, attention_mask=mask).backward()
        classifier(ids, labels, attention_mask=mask).backward()
        vit(images, image_labels).backward()
        vit.cls_attention(images)
