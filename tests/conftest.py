import os

import pytest
import torch

import kqv
from kqv.nn import devices

POSITIONS = ["sinusoidal", "learned", "relative", "rope", "alibi", "none"]
# Every model variant the property families run over: each position scheme, each mixture-of-experts
# feed-forward (kqv.nn.experts), the DMCA cores and grouped-query attention. Names are the test ids; values are
# ModelConfig changes. The mixtures use token-dependent positions: at initialisation sinusoids (+-1) swamp the
# 0.02-sized token embeddings, so a first-layer router would see nearly the same vector at every position and send
# every token to one expert.
VARIANTS = {
    **{position: dict(position=position) for position in POSITIONS},
    "switch": dict(ffn="switch", experts={"count": 2}, position="rope"),
    "moe": dict(ffn="moe", experts={"count": 3}, position="learned"),
    "local": dict(attention="local", local={"block": 4}, position="rope"),
    "memory_compressed": dict(attention="memory_compressed", memory_compressed={"compression": 3}, position="learned"),
    "dmca": dict(
        layer_pattern="local,memory_compressed",
        local={"block": 8},
        memory_compressed={"compression": 2},
        position="sinusoidal",
    ),
    "grouped-query": dict(n_kv_heads=2, position="rope"),  # 4 query heads sharing 2 key/value heads
}


def tiny_config(**changes) -> kqv.ModelConfig:
    """A model small enough for property tests to run in milliseconds."""
    values = dict(
        vocab_size=37, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=64, dropout=0.0, relative={"max_distance": 4}
    )
    return kqv.ModelConfig(**{**values, **changes})


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _auto_is_the_cpu(request, monkeypatch):
    """device "auto" is the CPU in the suite, GPU or not: its tests compare with figures computed on the CPU.
    tests/test_devices.py chooses its devices itself (its CUDA tests run where CUDA is)."""
    if request.module.__name__ != "test_devices":
        monkeypatch.setattr(devices, "auto_device", lambda: "cpu")


def pytest_addoption(parser, pluginmanager):
    """pyproject's addopts ask pytest-xdist for 2 worker processes; with xdist not loaded (`-p no:xdist`) its
    options are accepted and mean nothing, so the suite runs in this one process."""
    if not pluginmanager.has_plugin("xdist"):
        parser.addoption("--numprocesses", dest="no_xdist_numprocesses", help="pytest-xdist is not loaded")
        parser.addoption("--dist", dest="no_xdist_dist", help="pytest-xdist is not loaded")


def pytest_configure(config):
    """Each xdist worker computes on one thread, and so do the processes its tests start (CLI runs, torchrun,
    notebooks): 2 workers on 2 cores, not 2 x cores threads fighting over them."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """The tests run tiny tensors, for which thread start-up costs more than it saves (and CI has 2 cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A random-weight Hugging Face GPT-2 saved with its (BPE) tokenizer, as save_pretrained writes one (shared by
    the fine-tuning and scoring tests)."""
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from kqv.data.tokenizers import BPETokenizer

    path = tmp_path_factory.mktemp("gpt2")
    tokenizer = BPETokenizer.train("To be, or not to be, that is the question.\n" * 40, vocab_size=300)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=tokenizer.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    GPT2LMHeadModel(config).save_pretrained(path)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer.tokenizer).save_pretrained(path)
    return path
