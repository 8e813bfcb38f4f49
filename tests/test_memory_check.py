"""`check_memory` estimates one process's memory: its own rows of the global batch, in the run's precision, with
the attention kernel the device takes, and its shard of the weights under FSDP. The estimate is compared with an
independent count: the bytes autograd actually saves for the backward pass (saved-tensor hooks) and the
parameters of the model built on the meta device."""

import pytest
import torch

from kqv.errors import ConfigError
from kqv.nn.config import ModelConfig
from kqv.nn.devices import CPU_KERNELS, CUDA_KERNELS, Accelerator
from kqv.nn.models import DecoderLM
from kqv.train import preflight
from kqv.train.preflight import batch_memory, check_memory, keeps_scores

GPT2_SMALL = ModelConfig(
    d_model=768, n_heads=12, n_layers=12, d_ff=3072, max_len=1024, dropout=0.0, position="learned",
    activation="gelu", tie_embeddings=True,
)  # fmt: skip
H100 = 80 * 10**9


@pytest.fixture
def on_a_gpu(monkeypatch) -> Accelerator:
    """A CUDA device of 80 GB as check_memory sees it (its kernels and precision), on this CPU-only machine."""
    monkeypatch.setattr(preflight, "available_memory", lambda device: (H100, "the GPU's memory"))
    return Accelerator(torch.device("cuda"))


def test_nanogpt_s_eight_gpu_run_fits_one_gpu_per_process(on_a_gpu):
    # nanoGPT's GPT-2 small on 8 x 80 GB: 12 rows of 1024 tokens per GPU (96 in all), bf16, flash attention
    check_memory(GPT2_SMALL, 96, 1024, 50304, on_a_gpu, precision="bf16", processes=8)
    parts = batch_memory(GPT2_SMALL, 12, 1024, 50304, precision="bf16", kernels=CUDA_KERNELS)
    assert parts["scores"] == 0 and 5e9 < sum(parts.values()) < 40e9


def test_the_whole_global_batch_in_one_process_is_refused_with_its_share_named(on_a_gpu):
    with pytest.raises(ConfigError, match=r"train.batch_size=96 rows of data.context=1024 tokens in bf16 needs"):
        check_memory(GPT2_SMALL, 96, 1024, 50304, on_a_gpu, precision="bf16", processes=1)
    with pytest.raises(ConfigError) as refused:  # 128 rows per GPU cannot fit one of them
        check_memory(GPT2_SMALL, 1024, 1024, 50304, on_a_gpu, precision="bf16", processes=8)
    message = str(refused.value)
    assert "128 rows per process (train.batch_size=1024 over 8)" in message and "80.0 GB" in message
    assert "train.grad_accum" in message and "train.parallel='fsdp'" in message and "\n" not in message


def test_fsdp_holds_a_shard_of_the_weights_and_optimizer_state():
    replicated = batch_memory(GPT2_SMALL, 12, 1024, 50304, precision="bf16", kernels=CUDA_KERNELS)
    sharded = batch_memory(GPT2_SMALL, 12, 1024, 50304, precision="bf16", kernels=CUDA_KERNELS, shards=8)
    assert sharded["parameters"] < replicated["parameters"] / 3
    assert sharded["activations"] == replicated["activations"]


def test_the_math_kernel_keeps_every_layer_s_scores_and_flash_keeps_none():
    alibi = GPT2_SMALL.replace(position="alibi")
    assert not keeps_scores(GPT2_SMALL, CUDA_KERNELS, "bf16", 1024)  # flash
    assert not keeps_scores(alibi, CUDA_KERNELS, "bf16", 1024)  # flex_attention
    dropped = alibi.replace(dropout=0.1)  # flex has no dropout, and the blockwise path none either: plain
    assert keeps_scores(dropped, CUDA_KERNELS, "bf16", 1024)
    parts = batch_memory(dropped, 12, 1024, 50304, precision="bf16", kernels=CUDA_KERNELS)
    assert parts["scores"] == 12 * 12 * 12 * 1024 * 1024 * 2 * 3  # layers x rows x heads x n^2, softmax+mask+copy


def test_the_parameter_count_matches_the_model_built_on_the_meta_device():
    with torch.device("meta"):
        model = DecoderLM(GPT2_SMALL.replace(vocab_size=50304))
    counted = sum(p.numel() for p in model.parameters())
    estimated = batch_memory(GPT2_SMALL, 1, 1024, 50304)["parameters"] / preflight.TRAINING_BYTES_PER_PARAMETER
    assert estimated == pytest.approx(counted, rel=0.01)


def saved_bytes(model: DecoderLM, rows: int, context: int, precision: str) -> int:
    """The bytes autograd keeps for the backward pass of one training step's loss (distinct storages, the
    parameters themselves left out): what the activation estimate stands for, measured."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids = torch.randint(0, model.config.vocab_size, (rows, context), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            model(ids, ids)
    return sum(saved.values())


@pytest.mark.parametrize(
    "position, dropout, activation, precision, context",
    [
        ("learned", 0.0, "gelu", "fp32", 64),
        ("learned", 0.0, "gelu", "bf16", 64),  # the CPU's plain bf16 attention keeps the scores
        ("learned", 0.0, "gelu", "bf16", 320),  # its flash kernel does not
        ("learned", 0.1, "gelu", "fp32", 64),
        ("alibi", 0.0, "swiglu", "bf16", 64),
    ],
)
def test_the_estimate_bounds_what_autograd_saves_within_a_fifth(position, dropout, activation, precision, context):
    config = ModelConfig(
        vocab_size=512, d_model=128, n_heads=4, n_layers=3, d_ff=512, max_len=context, dropout=dropout,
        position=position, activation=activation,
    )  # fmt: skip
    torch.manual_seed(0)
    model = DecoderLM(config)
    measured = saved_bytes(model, 4, context, precision)
    parts = batch_memory(config, 4, context, 512, precision=precision, kernels=CPU_KERNELS)
    casts = sum(p.numel() for p in model.parameters()) * 2 if precision == "bf16" else 0  # autocast's weight copies
    estimated = parts["activations"] + parts["scores"] + parts["logits"] + casts
    assert measured <= estimated <= 1.25 * measured


def test_a_padded_vocabulary_is_counted_as_wide_as_the_device_makes_it():
    """GPT-2's 50,257 tokens padded to a multiple of 64 need what an unpadded 50,304-token model needs: the token
    table, the output layer and the logits are that wide."""
    gpt2 = ModelConfig(d_model=768, n_heads=12, n_layers=12, d_ff=3072, max_len=1024)
    padded = batch_memory(gpt2.replace(vocab_multiple=64), 12, 1024, 50_257)
    assert padded == batch_memory(gpt2, 12, 1024, 50_304) != batch_memory(gpt2, 12, 1024, 50_257)
