"""`--config gpt2`: nanoGPT's GPT-2 small (124M) and its pretraining recipe, its tokens per update the same on any
number of processes, compiled by default on CUDA GPUs only."""

from dataclasses import replace

import pytest
import torch
from benchmarks.references.nanogpt import NanoGPT, NanoGPTConfig

from kqv.api import packaged_config
from kqv.errors import ConfigError
from kqv.jobs import JOBS
from kqv.jobs.base import planned_update
from kqv.nn import devices
from kqv.nn.models import DecoderLM
from kqv.train import compiling, preflight
from kqv.train.config import learning_rate
from kqv.train.topology import Topology

# GPT-2 small with its 50,257 tokens padded to 50,304 rows, as nanoGPT trains it, the output layer tied to the
# embeddings (124,439,808 unpadded)
GPT2_PARAMETERS = 124_475_904


@pytest.fixture(scope="module")
def config():
    return JOBS["lm"].load_config(packaged_config("gpt2"))


def test_the_model_is_nanogpt_s_gpt2_small(config):
    model_config = config.model_config(config.data.vocab_size)
    with torch.device("meta"):
        model, reference = DecoderLM(model_config), NanoGPT(NanoGPTConfig(vocab_size=50304))
    counted = sum(p.numel() for p in model.parameters())
    assert counted == sum(p.numel() for p in reference.parameters()) == GPT2_PARAMETERS
    # nanoGPT reports its count without the position embeddings: "number of parameters: 123.69M"
    assert round((counted - model_config.max_len * model_config.d_model) / 1e6, 2) == 123.69
    assert (model_config.position, model_config.activation, model_config.norm_first) == ("learned", "gelu", True)
    assert model_config.tie_embeddings and model_config.dropout == 0 and config.data.context == 1024


def test_the_recipe_is_nanogpt_s(config):
    train = config.train
    assert (train.lr, train.warmup_steps, train.steps, train.betas) == (6e-4, 2000, 600_000, (0.9, 0.95))
    assert (train.weight_decay, train.grad_clip) == (0.1, 1.0)
    assert learning_rate(train, 2000) == 6e-4 and learning_rate(train, 600_000) == pytest.approx(6e-5)


@pytest.mark.parametrize("processes, accumulation", [(1, 40), (2, 20), (8, 5)])
def test_an_update_is_half_a_million_tokens_on_any_number_of_processes(config, processes, accumulation):
    topology = Topology(world_size=processes)
    planned = planned_update(config, topology).train
    assert (planned.batch_size, planned.grad_accum) == (12 * processes, accumulation)
    assert planned.batch_size * planned.grad_accum * config.data.context == 491_520
    assert planned.tokens_per_update == 0  # spent: run.toml records the batch the run took
    assert planned_update(replace(config, train=planned), topology).train == planned


def test_tokens_per_update_on_a_job_without_blocks_is_refused():
    mt = JOBS["mt"].load_config(packaged_config("quick", "mt"))
    with pytest.raises(ConfigError, match="tokens_per_update counts blocks of data.context"):
        planned_update(replace(mt, train=replace(mt.train, tokens_per_update=1000)), Topology())


def test_compile_auto_compiles_on_cuda_kernels_and_not_on_the_cpu(config, monkeypatch):
    assert config.train.compile == "auto"
    model = torch.nn.Linear(2, 2)
    assert not compiling.compiles("auto", model)
    assert compiling.compiles(True, model) and not compiling.compiles(False, model)
    monkeypatch.setattr(compiling, "kernels", lambda device: devices.CUDA_KERNELS)
    assert compiling.compiles("auto", model)


def test_on_eight_gpus_of_80_gb_each_process_s_share_passes_the_memory_check(config, monkeypatch):
    monkeypatch.setattr(preflight, "available_memory", lambda device: (80 * 10**9, "the GPU's memory"))
    monkeypatch.setattr(devices, "cuda_native_bf16", lambda: True)  # an A100 or H100, as check_memory sees it
    planned = planned_update(config, Topology(world_size=8)).train
    gpu, fixed = devices.Accelerator(torch.device("cuda")), {"precision": planned.precision, "processes": 8}
    preflight.check_memory(config.model, planned.batch_size, 1024, 50257, gpu, **fixed)
    with pytest.raises(ConfigError, match="12 rows per process"):  # the same share on an 8 GB GPU is refused
        monkeypatch.setattr(preflight, "available_memory", lambda device: (8 * 10**9, "the GPU's memory"))
        preflight.check_memory(config.model, planned.batch_size, 1024, 50257, gpu, **fixed)
