"""flex_attention's block masks inside torch.compile, with CUDA's kernel choices on the CPU: a padded batch through
an ALiBi model compiles to one graph, `fullgraph=True` holding, not a graph per layer's cache lookup (the padding
mask's cache is a weak reference and a version counter, Python state a graph cannot keep), and gives eager's
outputs. Forward only: flex_attention has no backward on the CPU."""

import sys
import warnings

import pytest
import torch

from kqv.nn.config import ModelConfig
from kqv.nn.devices import CUDA_KERNELS
from kqv.nn.models import DecoderLM, Encoder


@pytest.fixture
def cuda_kernels(monkeypatch):
    """Every kqv.nn module that asks which kernels a device takes gets CUDA's: flex_attention for score biases,
    SDPA's streaming padding, the whole-loss kernel."""
    for name, module in list(sys.modules.items()):
        if name.startswith("kqv.nn") and hasattr(module, "kernels"):
            monkeypatch.setattr(module, "kernels", lambda device: CUDA_KERNELS)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention.*")
        yield
    torch._dynamo.reset()


def padded(rows: int, time: int, real: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 50, (rows, time), generator=torch.Generator().manual_seed(seed))
    return ids, torch.arange(time) < torch.tensor(real)[:, None]  # (rows, time) True = token


@pytest.mark.parametrize("model_class", [DecoderLM, Encoder])
def test_a_padded_alibi_model_compiles_to_one_graph_over_batches(cuda_kernels, model_class):
    config = ModelConfig(
        vocab_size=50, d_model=64, n_heads=4, n_layers=4, d_ff=128, max_len=16, dropout=0.0, position="alibi"
    )  # head_dim 16: what flex's kernel takes
    torch.manual_seed(0)
    model = model_class(config).eval()
    graphs = []

    def counting(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    compiled = torch.compile(model, backend=counting, fullgraph=True)
    forward = lambda m, ids, mask: m(ids, attention_mask=mask)
    with torch.no_grad():
        for seed, real in enumerate(([13, 9], [11, 13], [13, 13])):
            ids, mask = padded(2, 13, real, seed)
            got, expected = forward(compiled, ids, mask), forward(model, ids, mask)
            torch.testing.assert_close(got, expected)
    assert len(graphs) == 1, f"{len(graphs)} graphs for 3 batches through {config.n_layers} layers"
