"""precision = "auto": bf16 autocast exactly where the CPU has bf16 instructions, fp32 elsewhere; and the
trainer's token count per micro-batch index (real tokens of variable-size batches)."""

import os

import pytest
import torch

import kqv
from kqv.nn import devices
from kqv.train import precision
from kqv.train.config import TrainConfig
from kqv.train.metrics import read_metrics
from kqv.train.trainer import Trainer


@pytest.mark.parametrize(
    "avx512_bf16, amx, expected",
    [(False, False, "fp32"), (True, False, "bf16"), (False, True, "bf16"), (True, True, "bf16")],
)
def test_auto_is_bf16_exactly_when_the_cpu_has_bf16_instructions(monkeypatch, avx512_bf16, amx, expected):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    assert precision.native_bf16() == (expected == "bf16")
    assert precision.resolve_precision("auto") == expected


@pytest.mark.parametrize(
    "capability, onednn_cap, expected",
    [("AVX512", None, "bf16"), ("AVX2", None, "fp32"), ("DEFAULT", None, "fp32"), ("AVX512", "AVX2", "fp32")]
    + [("AVX512", "avx512_core", "fp32"), ("AVX512", "AVX512_CORE_BF16", "bf16"), ("AVX512", "ALL", "bf16")],
)
def test_auto_follows_the_kernels_torch_may_use(monkeypatch, capability, onednn_cap, expected):
    """A bf16 CPU whose kernels are capped below bf16 (ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2, as to
    run as an older CPU would) computes in fp32: bf16 there is emulated or dies inside oneDNN's LSTM."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if onednn_cap is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", onednn_cap)
    assert precision.resolve_precision("auto") == expected


@pytest.mark.parametrize("name", ["fp32", "bf16"])
def test_explicit_precisions_are_kept_whatever_the_cpu(monkeypatch, name):
    for native in (False, True):
        monkeypatch.setattr(devices, "native_bf16", lambda native=native: native)
        assert precision.resolve_precision(name) == name


def test_an_unknown_precision_is_a_clear_error():
    with pytest.raises(ValueError, match="precision must be 'fp32', 'bf16', 'fp16' or 'auto', got 'fp8'"):
        precision.resolve_precision("fp8")
    with pytest.raises(ValueError, match="precision must be one of"):
        TrainConfig(steps=1, batch_size=1, precision="fp8")


def test_fp16_on_the_cpu_is_a_clear_error():
    with pytest.raises(ValueError, match="precision 'fp16' is for GPUs"):
        precision.resolve_precision("fp16")
    with pytest.raises(ValueError, match="precision 'fp16' is for GPUs"):
        TrainConfig(steps=1, batch_size=1, precision="fp16", device="cpu")


def tiny_run(tmp_path, name: str, **options) -> tuple[Trainer, list]:
    torch.manual_seed(0)
    model = kqv.DecoderLM(kqv.ModelConfig(vocab_size=16, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=8))
    seen = []

    def batch(i):
        ids = torch.randint(0, 16, (2, 9), generator=torch.Generator().manual_seed(i))
        return ids[:, :-1], ids[:, 1:]

    def loss_fn(model, batch):
        seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
        return model(*batch)

    config = TrainConfig(
        steps=3, batch_size=2, grad_accum=2, warmup_steps=1, log_every=1, eval_every=100, precision=name
    )
    return Trainer(model, config, tmp_path, train_batches=batch, loss_fn=loss_fn, quiet=True, **options), seen


@pytest.mark.parametrize("native", [False, True])
def test_the_trainer_autocasts_auto_to_what_the_cpu_supports(tmp_path, monkeypatch, native):
    monkeypatch.setattr(devices, "native_bf16", lambda: native)
    run, seen = tiny_run(tmp_path, "auto")
    run.train()
    assert seen == [native] * 6


def test_tokens_per_batch_may_be_a_function_of_the_micro_batch_index(tmp_path):
    asked = []
    run, _ = tiny_run(tmp_path, "fp32", tokens_per_batch=lambda i: asked.append(i) or 1000)
    run.train()
    # 3 updates of 2 micro-batches each, in order, and the one after them made ahead (kqv.train.ahead)
    assert asked == list(range(7))
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert all(r["tokens_per_s"] > 0 for r in records if "tokens_per_s" in r)


def test_kernel_caches_are_bounded_unless_the_user_sized_them(monkeypatch):
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "7")
    precision.bound_kernel_caches()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(precision.KERNEL_CACHE_CAPACITY)
    assert os.environ["LRU_CACHE_CAPACITY"] == "7"


def test_creating_a_trainer_bounds_the_kernel_caches(tmp_path, monkeypatch):
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        monkeypatch.delenv(name, raising=False)
    tiny_run(tmp_path, "bf16")
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == os.environ["LRU_CACHE_CAPACITY"] == "64"


@pytest.mark.skipif(not devices.native_bf16(), reason="this CPU has no bf16 instructions: bf16 would be emulated")
@pytest.mark.parametrize("padded", [False, True], ids=["causal", "left-padded rows"])
def test_compiled_bf16_updates_on_the_cpu_are_finite(tmp_path, padded):
    """`train.compile = true` in bf16 on the CPU, through inductor (the backend the Trainer compiles with): the
    first updates have a finite loss and gradient norm, as uncompiled ones do. On an Intel AMX Xeon a compiled
    bf16 step gave a NaN gradient from its first update; with `max_bad_steps = 1` one such update stops the run
    here. Left-padded rows add queries that may attend to no key (a softmax over nothing but -inf, made 0)."""
    import math

    from test_training import make_model, token_batches

    def batches(i: int):
        ids, targets = token_batches(4)(i)
        if not padded:
            return ids, targets, None
        mask = torch.ones_like(ids)
        mask[1, :5] = mask[2, :1] = 0
        return ids, targets.masked_fill(mask == 0, -100), mask

    def loss(model, batch):
        ids, targets, mask = batch
        return model(ids, targets, attention_mask=mask)

    cfg = TrainConfig(
        steps=3, batch_size=4, lr=1e-3, warmup_steps=2, precision="bf16", device="cpu", compile=True,
        log_every=1, eval_every=100, checkpoint_every=100, max_bad_steps=1,
    )  # fmt: skip
    Trainer(make_model(dropout=0.0), cfg, tmp_path, train_batches=batches, loss_fn=loss, quiet=True).train()
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "train_loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3] and records[-1]["bad_steps"] == 0
    assert all(math.isfinite(r["train_loss"]) and math.isfinite(r["grad_norm"]) for r in records)
