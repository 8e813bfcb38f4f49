"""What the Trainer reports of the device: model FLOPs per token (PaLM's and nanoGPT's estimate, checked against
the closed form from the parameters and against torch's own count), the MFU arithmetic against a device's peak,
and the fields of metrics.jsonl and the progress line."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import kqv
from kqv.nn import devices
from kqv.nn.devices import Accelerator
from kqv.train.flops import estimated_flops_per_token, model_flops_per_token, training_flops_per_token, utilisation
from kqv.train.metrics import progress_line, read_metrics
from test_budget import FakeMachine, budget_config, budget_trainer

GPT = kqv.ModelConfig(
    vocab_size=96, d_model=48, n_heads=3, n_layers=3, d_ff=192, max_len=40, dropout=0.0, position="learned", bias=False
)


def nanogpt_flops_per_token(model: kqv.DecoderLM) -> float:
    """nanoGPT's `estimate_mfu` numerator per token: 6N + 12·L·H·Q·T, N without the position table (wpe)."""
    config = model.config
    n = sum(p.numel() for p in model.parameters()) - model.decoder.embeddings.positions.embedding.weight.numel()
    return 6 * n + 12 * config.n_layers * config.n_heads * config.head_dim * config.max_len


def test_the_flops_per_token_are_nanogpts_estimate_for_a_gpt_with_tied_embeddings_and_learned_positions():
    torch.manual_seed(0)
    model = kqv.DecoderLM(GPT)
    assert model.lm_head.weight is model.decoder.embeddings.tokens.weight  # tied: counted once, as a product
    assert model_flops_per_token(model) == nanogpt_flops_per_token(model)


def test_the_estimate_agrees_with_torchs_count_of_a_forward_and_backward_pass():
    """FlopCounterMode counts the matrix products, and the attention where it runs as products (SDPA's math kernel:
    it does not see inside the CPU's flash kernel); the norms' few parameters, which the closed form counts as
    products, are the difference: under a percent here."""
    torch.manual_seed(0)
    model = kqv.DecoderLM(GPT)
    ids = torch.randint(0, GPT.vocab_size, (2, GPT.max_len + 1))
    with sdpa_kernel(SDPBackend.MATH):
        counted = training_flops_per_token(model, [(ids[:, :-1], ids[:, 1:])], lambda m, b: m(*b), 2 * GPT.max_len)
    assert model_flops_per_token(model) == pytest.approx(counted, rel=0.01)


def test_an_untied_token_table_is_looked_up_not_multiplied():
    torch.manual_seed(0)
    tied, untied = kqv.DecoderLM(GPT), kqv.DecoderLM(GPT.replace(tie_embeddings=False))
    assert model_flops_per_token(untied) == model_flops_per_token(tied)  # the table left, the head's own came


def test_mfu_is_the_achieved_flops_over_the_peak_of_every_device():
    assert utilisation(1e9, 1e5, 1e15) == pytest.approx(0.1)
    assert utilisation(1e9, 2e5, 1e15, processes=2) == pytest.approx(0.1)  # the throughput of two devices
    assert utilisation(1e9, 1e5, None) is None and utilisation(1e9, None, 1e15) is None
    assert estimated_flops_per_token(100, 8, 10) == 6 * 100 + 12 * 8 * 10


@pytest.mark.parametrize(
    "name, precision, tf32, peak",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", True, 989e12),
        ("NVIDIA H100 PCIe", "fp16", True, 756e12),
        ("NVIDIA H200", "bf16", True, 989e12),
        ("NVIDIA A100-SXM4-80GB", "bf16", True, 312e12),
        ("NVIDIA A100-SXM4-80GB", "fp32", True, 156e12),
        ("NVIDIA A100-SXM4-80GB", "fp32", False, None),  # plain fp32: no peak in the table
        ("NVIDIA GeForce GTX 1080", "fp16", True, None),  # unknown: no MFU
    ],
)
def test_the_peak_of_a_known_gpu_comes_from_the_table(monkeypatch, name, precision, tf32, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert Accelerator(torch.device("cuda")).peak_flops(precision, tf32) == peak


def test_the_cpus_peak_is_unknown_and_its_peak_memory_is_the_processs():
    cpu = Accelerator(torch.device("cpu"))
    assert cpu.peak_flops("bf16") is None and cpu.peak_memory() == devices.peak_rss_bytes() > 0


def test_metrics_records_and_progress_lines_carry_mfu_and_peak_memory(tmp_path, monkeypatch):
    """On the CPU: MFU None (no known peak) and the process's peak memory; with a fake device peak, the MFU of the
    record's tokens/s, shown on the progress line."""
    cfg = budget_config(steps=10, budget_minutes=0.0, log_every=5)
    run = budget_trainer(tmp_path / "cpu", cfg, FakeMachine(0.5))
    run.train()
    logged = [r for r in read_metrics(tmp_path / "cpu" / "metrics.jsonl") if "train_loss" in r]
    assert [r["step"] for r in logged] == [5, 10]
    assert all(r["mfu"] is None and r["peak_memory_mb"] > 0 for r in logged)

    monkeypatch.setattr(Accelerator, "peak_flops", lambda self, precision, tf32=True: 1e6)
    run = budget_trainer(tmp_path / "peak", cfg, FakeMachine(0.5))
    run.train()
    record = [r for r in read_metrics(tmp_path / "peak" / "metrics.jsonl") if "train_loss" in r][-1]
    tokens_per_s = cfg.batch_size * 16 / 0.5  # the fake machine: 0.5 s per batch of 4 rows of 16 tokens
    assert record["tokens_per_s"] == pytest.approx(tokens_per_s)
    assert record["mfu"] == pytest.approx(run.flops_per_token * tokens_per_s / 1e6)
    assert run.flops_per_token == model_flops_per_token(run.model)
    line = progress_line(record["step"], 10, record)
    assert f"MFU {record['mfu']:.1%}" in line and f"peak {record['peak_memory_mb']:,.0f} MB" in line
