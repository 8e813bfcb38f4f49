"""Devices: the one per-device choice (`kqv.nn.devices.Accelerator`), device propagation through every model, and
runs moving between devices.

This machine may have no GPU, so device propagation is checked on the CPU by `created_on_its_device`: inside it
the default device is `meta` and every operation that returns a meta tensor fails. Any tensor a forward pass
creates without `device=` (`torch.arange(n)`, `torch.zeros(...)`, ...) would land on the CPU while the model is on
a GPU; under the guard it lands on `meta` and is named. The tests marked `cuda` run only where CUDA is.
"""

import dataclasses
import json
import math
import warnings
from contextlib import contextmanager, nullcontext

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import kqv
from conftest import POSITIONS, VARIANTS, tiny_config
from kqv.cli.main import main
from kqv.errors import ConfigError
from kqv.explore.loading import load_subject
from kqv.nn import devices
from kqv.nn.devices import CPU_KERNELS, CUDA_KERNELS, TORCH_KERNELS, Accelerator
from kqv.nn.heads import MaskedLM, SequenceClassifier
from kqv.nn.models import DecoderLM, Encoder, EncoderDecoder
from kqv.nn.rnn import RNNConfig, RNNEncoderDecoder
from kqv.nn.vision import ViT
from kqv.train.checkpoints import read_checkpoint
from kqv.train.config import TrainConfig
from kqv.train.precision import MixedPrecision
from kqv.train.runs import read_run
from kqv.train.trainer import Trainer

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class _NoDevicelessTensors(TorchDispatchMode):
    supports_higher_order_operators = True  # flex_attention is one: run as torch runs it, its output checked

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


# flex_attention's masks, score biases and their indices (`kqv.nn.flex`, CUDA only) built here with CUDA's kernel
# choices: the causal mask, padding, ALiBi, Shaw's relative keys, local attention's and BigBird's blocks, each
# builder's tensors on the queries' device (on an H200 ALiBi's, local's and BigBird's inputs met a CPU tensor)
FLEX_VARIANTS = {
    "alibi": dict(position="alibi"),
    "relative-keys": dict(position="relative", relative={"max_distance": 4, "values": False}),
    "local": dict(attention="local", local={"block": 4}, position="rope"),
    "bigbird": dict(attention="bigbird", bigbird={"block": 4, "window": 1, "global_blocks": 1, "random_blocks": 1}),
    "dmca": dict(VARIANTS["dmca"], local={"block": 4}),
}


def _flex_reads_on_the_queries_device(queries, keys, values, *, score_mod=None, block_mask=None, enable_gqa=False):
    """flex_attention as the guard can watch it (torch's own runs through torch.compile, which a dispatch mode
    stops): its score_mod and mask_mod read their captured tensors at every index, made on the queries' device
    as flex makes them, where a tensor on another device fails as on a GPU. The output is zeros, not attention."""
    from torch.nn.attention.flex_attention import create_mask

    shape = (queries.shape[0], queries.shape[1], queries.shape[2], keys.shape[2])
    for mod in (score_mod, None if block_mask is None else block_mask.mask_mod):
        if mod is not None:
            create_mask(mod, *shape, device=queries.device)
    return queries.new_zeros(*queries.shape[:-1], values.shape[-1])


@pytest.fixture
def flex_kernels(monkeypatch):
    """The CPU takes flex_attention as CUDA does (its kernel the stand-in above), counted (`calls`); flex's block
    mask caches start empty."""
    from kqv.nn import flex

    calls = []
    attend = flex.attend
    monkeypatch.setattr(flex, "kernels", lambda device: CUDA_KERNELS)
    monkeypatch.setattr(flex, "_kernel", lambda device: _flex_reads_on_the_queries_device)
    monkeypatch.setattr(flex, "attend", lambda *a, **k: calls.append(k) or attend(*a, **k))
    monkeypatch.setattr(flex, "_block_masks", type(flex._block_masks)())
    monkeypatch.setattr(flex, "_padding_block_mask", None)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention.*")
        yield calls


@pytest.mark.parametrize("variant", list(FLEX_VARIANTS))
@pytest.mark.parametrize("causal", [True, False], ids=["decoder", "encoder"])
def test_flex_attentions_masks_biases_and_indices_stay_on_the_device(variant, causal, flex_kernels):
    model = (DecoderLM if causal else Encoder)(tiny_config(d_model=64, **FLEX_VARIANTS[variant])).eval()
    ids, mask = _ids(2, 13), _padding(2, 13)
    with created_on_its_device(), torch.no_grad():
        model(ids) if causal else model(ids, mask)
    assert flex_kernels and all(call.get("mask_mod") or call.get("score_mod") for call in flex_kernels)


# ---------------------------------------------------------------------------------------------------------------
# The one per-device choice


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "mps_available", lambda: False)


@pytest.fixture
def one_gpu(monkeypatch):
    """A machine that says it has one CUDA GPU (nothing runs on it: the choice logic only)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_auto_is_the_cpu_without_a_gpu_and_cpu_keeps_its_own_kernels(no_gpu):
    chosen = Accelerator.resolve("auto")
    assert chosen.device == torch.device("cpu") and chosen.kernels == CPU_KERNELS
    assert Accelerator.resolve(None) == Accelerator.resolve("cpu") == chosen


def test_auto_prefers_cuda_then_mps(monkeypatch, one_gpu):
    assert Accelerator.resolve("auto").device == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "mps_available", lambda: True)
    assert Accelerator.resolve("auto").device == torch.device("mps")


@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:1"])
def test_an_absent_cuda_device_is_a_clear_error(no_gpu, name):
    with pytest.raises(ConfigError, match=rf"device '{name}' asked for, but this torch .*available: cpu.*CUDA build"):
        Accelerator.resolve(name)


def test_a_gpu_index_past_the_last_gpu_is_a_clear_error(one_gpu):
    assert Accelerator.resolve("cuda:0").device == torch.device("cuda:0")
    with pytest.raises(ConfigError, match=r"device 'cuda:1' asked for, but this machine has 1 CUDA GPU \(available"):
        Accelerator.resolve("cuda:1")


def test_an_absent_mps_device_and_an_unknown_name_are_clear_errors(no_gpu):
    with pytest.raises(ConfigError, match="device 'mps' .* not available here .*available: cpu"):
        Accelerator.resolve("mps")
    for name in ("gpu", "cuda:x", "CPU", 0):
        with pytest.raises(ConfigError, match="device must be auto, cpu, cuda, cuda:N or mps"):
            Accelerator.resolve(name)
    with pytest.raises(ConfigError, match="device must be"):
        TrainConfig(steps=1, batch_size=1, device="gpu")


@pytest.mark.parametrize("bf16, expected", [(True, "bf16"), (False, "fp16")])
def test_cuda_autocasts_bf16_where_the_gpu_has_it_else_fp16_with_a_gradient_scaler(
    monkeypatch, one_gpu, bf16, expected
):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16)
    gpu = Accelerator.resolve("cuda")
    assert gpu.kernels == CUDA_KERNELS
    assert gpu.precision("auto") == expected and gpu.precision("fp32") == "fp32"
    scaler = gpu.grad_scaler("auto")
    assert (scaler is not None) == (expected == "fp16")
    assert gpu.grad_scaler("bf16") is None and gpu.grad_scaler("fp32") is None
    assert isinstance(gpu.grad_scaler("fp16"), torch.amp.GradScaler)
    with warnings.catch_warnings():  # torch may warn that it disables a CUDA autocast on a machine without CUDA
        warnings.simplefilter("ignore")
        autocast = gpu.autocast("auto")
    assert (
        autocast.device == "cuda" and autocast.fast_dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[expected]
    )
    assert isinstance(gpu.autocast("fp32"), nullcontext)


def test_apple_silicon_trains_in_fp32_unless_fp16_is_asked_for():
    mps = Accelerator(torch.device("mps"))
    assert mps.precision("auto") == "fp32" and mps.precision("fp16") == "fp16" and mps.grad_scaler("auto") is None
    assert mps.kernels == TORCH_KERNELS


def test_the_cpu_keeps_its_precision_and_never_takes_fp16(monkeypatch):
    cpu = Accelerator.resolve("cpu")
    for native, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(devices, "native_bf16", lambda native=native: native)
        assert cpu.precision("auto") == expected and cpu.grad_scaler("auto") is None
    with pytest.raises(ConfigError, match="precision 'fp16' is for GPUs"):
        cpu.precision("fp16")


def _tf32_settings() -> list:
    return [getattr(owner, name) for owner, name, _, _ in devices.tf32_switches()]


def test_tf32_is_set_on_cuda_only_and_restored_after_the_block():
    before = _tf32_settings()
    with Accelerator.resolve("cpu").tf32(True):
        assert _tf32_settings() == before
    for enabled in (True, False):
        with Accelerator(torch.device("cuda")).tf32(enabled):
            assert _tf32_settings() == [on if enabled else off for _, _, on, off in devices.tf32_switches()]
        assert _tf32_settings() == before


def test_tf32_goes_through_torchs_fp32_precision_where_torch_has_it():
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.skip(f"torch {torch.__version__} has only the legacy allow_tf32 flags")
    assert [(owner, name) for owner, name, _, _ in devices.tf32_switches()] == [
        (torch.backends.cuda.matmul, "fp32_precision"),
        (torch.backends.cudnn.conv, "fp32_precision"),
    ]


def test_a_training_step_sets_tf32_and_leaves_it_as_it_was():
    precision = MixedPrecision(Accelerator(torch.device("cuda")), "fp32", tf32=True)
    before = _tf32_settings()
    seen = []
    with precision.autocast():
        seen.append(_tf32_settings())
    model = nn.Linear(2, 1)
    model.register_full_backward_hook(lambda *_: seen.append(_tf32_settings()))
    precision.backward(model(torch.ones(1, 2, requires_grad=True)).sum())
    tf32 = [on for _, _, on, _ in devices.tf32_switches()]
    assert seen == [tf32, tf32] and _tf32_settings() == before


def test_a_cpu_batch_is_left_untouched_and_other_devices_get_every_tensor():
    batch = {"ids": torch.ones(2, 3), "rest": (torch.zeros(1), 7)}
    assert Accelerator.resolve("cpu").batch(batch) is batch
    moved = Accelerator(torch.device("meta")).batch(batch)
    assert moved["ids"].device.type == moved["rest"][0].device.type == "meta" and moved["rest"][1] == 7


# ---------------------------------------------------------------------------------------------------------------
# Commands, checkpoints and fp16's loss scaler


def test_the_commands_refuse_an_absent_device_with_what_to_do(no_gpu, tmp_path, capsys):
    assert (
        main(["train", "lm", "--data", str(tmp_path / "none.txt"), "--out", str(tmp_path / "r"), "--device", "cuda"])
        == 2
    )
    error = capsys.readouterr().err
    assert "device 'cuda' asked for" in error and "--device cpu" in error and "pip install torch" in error
    assert not (tmp_path / "r").exists()
    assert main(["similarity", "a", "b", "--device", "cuda:2"]) == 2
    assert "device 'cuda:2' asked for" in capsys.readouterr().err


def tiny_lm_trainer(run_dir, steps=4, times=1.0, **changes):
    """A tiny LM's Trainer on fixed batches (resuming what is in run_dir); `times` multiplies its loss."""
    torch.manual_seed(0)
    model = DecoderLM(tiny_config(vocab_size=16, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=8, dropout=0.1))

    def batch(i):
        ids = torch.randint(0, 16, (2, 9), generator=torch.Generator().manual_seed(i))
        return ids[:, :-1], ids[:, 1:]

    values = dict(steps=steps, batch_size=2, warmup_steps=1, schedule="constant", log_every=1, checkpoint_every=2)
    config = TrainConfig(**{**values, "precision": "fp32", **changes})
    loss_fn = lambda m, b: m(*b) * times  # noqa: E731
    return Trainer(model, config, run_dir, train_batches=batch, loss_fn=loss_fn, quiet=True, if_exists="resume")


def test_an_optimizer_state_written_on_a_gpu_resumes_on_the_cpu(tmp_path, monkeypatch):
    """optimizer.pt records where its tensors lived; one written on a GPU must load where there is none. This
    machine is made one without CUDA while it loads (torch's loader asks `torch.cuda.is_available()`), so the claim
    is tested on a machine with CUDA too, where loading it as written would succeed."""
    whole = tiny_lm_trainer(tmp_path / "whole", device="cpu")
    whole.train()
    with monkeypatch.context() as patch:  # tag every tensor torch.save writes as a CUDA tensor, as on a GPU
        patch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        tiny_lm_trainer(tmp_path / "half", steps=2, device="cpu").train()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA"):  # what loading it without map_location does without CUDA
        torch.load(tmp_path / "half" / "checkpoint" / "optimizer.pt", weights_only=True)
    resumed = tiny_lm_trainer(tmp_path / "half", steps=4, device="cpu")
    assert resumed.step == 2
    held = [t for s in resumed.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    assert held and {t.device.type for t in held} == {"cpu"}
    resumed.train()
    for a, b in zip(whole.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)


def test_a_run_loads_on_the_device_asked_for(tmp_path):
    from test_cli import TINY

    corpus = tmp_path / "tiny.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 40)
    (tmp_path / "tiny.toml").write_text(TINY.format(position="rope"))
    out = tmp_path / "lm"
    assert (
        main(
            [
                "train",
                "lm",
                "--config",
                str(tmp_path / "tiny.toml"),
                "--data",
                str(corpus),
                "--out",
                str(out),
                "--quiet",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    run = kqv.load(out, device="cpu")
    assert {p.device.type for p in run.model.parameters()} == {"cpu"}
    assert run.generate("To", max_new_tokens=4, temperature=0) == kqv.load(out).generate(
        "To", max_new_tokens=4, temperature=0
    )
    assert read_run(out)["train"]["device"] == "cpu"
    subject = load_subject(out, device="cpu")
    with created_on_its_device():  # what the run's operations and the explorer make is made on the model's device
        run.generate("To", max_new_tokens=4, count=2, top_k=3)
        run.attention("To be")
        run.evaluate(max_tokens=40)
        subject.analyze({"text": "To be"})
        list(subject.continuation({"text": "To", "max_new_tokens": 3}))


def test_fp16_overflow_skips_are_the_scalers_not_a_diverging_run_and_resume_exactly(tmp_path, monkeypatch):
    """A loss scale far too large makes every gradient infinite until the scaler has halved it enough: those
    skipped updates must not stop the run (max_bad_steps=2), and the scale is saved and restored. On the CPU, with
    the CPU's scaler, wherever it runs: "auto" would be a GPU where there is one, whose training is compiled
    (`train.compile = "auto"`) and whose compiled backward may sum in another order from run to run, so that no
    two runs there, resumed or not, need be equal to the bit."""
    start = 2.0**127  # any gradient above 2 times this overflows fp32, as fp16 overflows on a GPU
    monkeypatch.setattr(Accelerator, "grad_scaler", lambda self, asked: torch.amp.GradScaler("cpu", init_scale=start))
    options = dict(times=64.0, max_bad_steps=2, lr=1e-2, device="cpu")
    initial = [p.detach().clone() for p in tiny_lm_trainer(tmp_path / "fresh", steps=1, **options).model.parameters()]
    whole = tiny_lm_trainer(tmp_path / "whole", steps=12, **options)
    whole.train()
    scale = whole.precision.scaler.get_scale()
    assert whole.bad_steps == 0 and scale < start / 4  # it skipped and halved, and nothing counted as bad
    assert not all(torch.equal(a, b) for a, b in zip(initial, whole.model.parameters()))  # then it updated
    saved = read_checkpoint(tmp_path / "whole").state["grad_scaler"]
    assert saved["scale"] == scale
    half = tiny_lm_trainer(tmp_path / "half", steps=4, **options)
    half.train()
    resumed = tiny_lm_trainer(tmp_path / "half", steps=12, **options)
    assert resumed.precision.scaler.get_scale() == half.precision.scaler.get_scale()
    resumed.train()
    assert resumed.precision.scaler.get_scale() == scale
    for a, b in zip(whole.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)


def test_overflow_at_a_scale_of_one_is_counted_by_the_guard():
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = MixedPrecision(Accelerator.resolve("cpu"), "fp32")
    for scale, counted in ((2.0**20, False), (1.0, True)):
        precision.scaler = torch.amp.GradScaler("cpu", init_scale=scale)
        before = [p.detach().clone() for p in model.parameters()]
        precision.backward(model(torch.full((1, 2), 3e38)).sum() * 10)  # overflows whatever the scale
        norm = precision.clip(optimizer, model, 1.0)
        overflowed = bool(precision.overflowed(norm))
        precision.step(optimizer, skip=~torch.isfinite(norm))
        assert not math.isfinite(norm) and overflowed is not counted
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # no update either way


# ---------------------------------------------------------------------------------------------------------------
# On a CUDA GPU (skipped without one): `python -m pytest tests/test_devices.py` on a machine that has one


@contextmanager
def exact_fp32():
    """fp32 products without TF32 (a Trainer's steps use TF32, as train.tf32 says)."""
    with devices.tf32_products(False):
        yield


@cuda
@pytest.mark.parametrize("precision", ["auto", "fp16", "fp32"])
def test_a_tiny_lm_trains_on_cuda_and_resumes_on_the_cpu(tmp_path, precision):
    trainer = tiny_lm_trainer(tmp_path, steps=4, device="cuda", precision=precision)
    assert trainer.device.type == "cuda" and next(trainer.model.parameters()).is_cuda
    assert (trainer.precision.scaler is not None) == (Accelerator.resolve("cuda").precision(precision) == "fp16")
    final = trainer.train()
    assert math.isfinite(final["train_loss"]) and trainer.bad_steps == 0
    saved = read_checkpoint(tmp_path).state
    assert (saved["grad_scaler"] is not None) == (trainer.precision.scaler is not None)
    on_cpu = tiny_lm_trainer(tmp_path, steps=6, device="cpu", precision="fp32")
    assert on_cpu.step == 4 and next(on_cpu.model.parameters()).device.type == "cpu"
    assert math.isfinite(on_cpu.train()["train_loss"])


@cuda
def test_fp16_on_cuda_resumes_with_its_loss_scale(tmp_path):
    tiny_lm_trainer(tmp_path, steps=3, device="cuda", precision="fp16").train()
    scale = read_checkpoint(tmp_path).state["grad_scaler"]["scale"]
    resumed = tiny_lm_trainer(tmp_path, steps=5, device="cuda", precision="fp16")
    assert resumed.precision.scaler.get_scale() == scale


@cuda
@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_on_cuda_matches_the_reference_core(position, causal):
    config = tiny_config(position=position, blockwise="never")
    model = (DecoderLM if causal else Encoder)(config).eval().cuda()
    ids, mask = _ids().cuda(), _padding().cuda()
    reference = (DecoderLM if causal else Encoder)(config).eval().cuda()
    reference.load_state_dict(model.state_dict())
    for module in reference.modules():
        if hasattr(module, "fused"):
            module.fused = False  # the plain softmax(q k^T / sqrt(d)) v of kqv.nn.cores
    with torch.no_grad(), exact_fp32():
        fast, plain = (m(ids) if causal else m(ids, mask) for m in (model, reference))
    torch.testing.assert_close(fast, plain, atol=1e-5, rtol=1e-4)


@cuda
def test_a_cpu_run_generates_the_same_greedy_tokens_on_cuda(tmp_path):
    from test_cli import TINY

    corpus = tmp_path / "tiny.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 40)
    (tmp_path / "tiny.toml").write_text(TINY.format(position="rope"))
    out = tmp_path / "lm"
    command = ["train", "lm", "--config", str(tmp_path / "tiny.toml"), "--data", str(corpus), "--out", str(out)]
    assert main([*command, "--quiet", "--device", "cpu"]) == 0
    with exact_fp32():
        on_gpu = kqv.load(out, device="cuda")
        assert next(on_gpu.model.parameters()).is_cuda
        greedy = {"max_new_tokens": 12, "temperature": 0}
        assert on_gpu.generate("To", **greedy) == kqv.load(out, device="cpu").generate("To", **greedy)
    on_gpu.generate("To", max_new_tokens=8, count=2, seed=1)  # sampling draws from a CUDA generator
    assert math.isfinite(on_gpu.evaluate().loss) and on_gpu.attention("To be").weights[0].device.type == "cpu"


@cuda
@pytest.mark.parametrize("beam_size", [1, 3])
def test_translation_and_beam_search_run_on_cuda(beam_size):
    model = EncoderDecoder(tiny_config(position="relative")).eval()
    src, mask = _ids(2, 9), _padding(2, 9)
    with torch.no_grad(), exact_fp32():
        on_cpu = model.generate(src, 6, bos_id=1, eos_id=2, beam_size=beam_size, src_mask=mask)
        on_gpu = model.cuda().generate(src.cuda(), 6, bos_id=1, eos_id=2, beam_size=beam_size, src_mask=mask.cuda())
    assert torch.equal(on_gpu.cpu(), on_cpu)


def test_host_batches_bound_for_a_gpu_are_pinned_first(monkeypatch):
    """A `non_blocking` copy from pageable memory is synchronous: host tensors go through pinned memory."""
    pinned, copied = [], []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: pinned.append(t) or t)
    monkeypatch.setattr(torch.Tensor, "to", lambda t, device, non_blocking=False: copied.append(non_blocking) or t)
    ids = torch.ones(2, 3, dtype=torch.long)
    Accelerator(torch.device("cuda")).put({"ids": ids, "rest": (torch.zeros(1), 7)})
    assert len(pinned) == 2 and pinned[0] is ids and copied == [True, True]
    pinned.clear()
    Accelerator(torch.device("mps")).put(ids)
    assert not pinned


@cuda
def test_a_batch_reaches_the_gpu_through_pinned_memory():
    batch = Accelerator.resolve("cuda").put({"ids": torch.arange(6).view(2, 3)})
    assert batch["ids"].is_cuda and torch.equal(batch["ids"].cpu(), torch.arange(6).view(2, 3))


def test_env_says_what_auto_chooses_here(capsys, monkeypatch):
    """`kqv env` prints what `kqv.nn.environment.environment()` returns: what a bug report needs."""
    from kqv.nn.environment import environment

    monkeypatch.setattr(devices, "auto_device", lambda: "cpu")
    values = environment()
    assert values["torch"] == torch.__version__ and values["cuda"]["available"] == torch.cuda.is_available()
    assert values["auto"]["device"] == "cpu" and values["auto"]["precision"] in ("fp32", "bf16")
    assert values["auto"]["kernels"] == dataclasses.asdict(CPU_KERNELS)
    assert values["cpu"]["capability"] == torch.backends.cpu.get_cpu_capability()
    assert main(["env", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(values))
    assert main(["env"]) == 0
    text = capsys.readouterr().out
    assert f"torch: {torch.__version__}" in text and "  device: cpu" in text
