"""`train.compile` over batches whose lengths change (issue 43): a pairs step and a translation step, each over 14
lengths, compile a bounded number of times (Dynamo's automatic dynamic shapes: the first shapes static, then one
graph for every value of the sizes that changed), with no graph break and no fall back to eager. Positions are
tensors made from the shapes (`kqv.nn.models`, `kqv.nn.attention`), never a Python range of the length, which fixed
it in the graph and recompiled the step for every length until Dynamo gave up after 8.

The backend is "aot_eager" (Dynamo's capture and guards and AOTAutograd's joint graph, as inductor would have
them, without its code generation); the Trainer's own `training_module` compiles the model, and the jobs' own loss
functions run the steps."""

import logging

import pytest
import torch

from conftest import tiny_config
from kqv import DecoderLM, EncoderDecoder
from kqv.data.example_batches import PaddedBatch
from kqv.jobs.lm_completions import example_loss
from kqv.jobs.mt import mt_loss
from kqv.train import compiling
from kqv.train.compiling import training_module

LENGTHS = (5, 9, 12, 16, 7, 23, 31, 18, 40, 11, 27, 35, 14, 48)  # 14 lengths, in no order
PAIRS_BOUND = 2  # the first length; then one graph for every length (the rows stay 4)
MT_BOUND = 4  # the first shapes; then at most once each for rows, source length and target length


class Counting:
    """The "aot_eager" backend, counting the graphs it compiles."""

    __name__ = "counting_aot_eager"

    def __init__(self):
        self.graphs = 0

    def __call__(self, graph, example_inputs, **options):
        self.graphs += 1
        return torch._dynamo.lookup_backend("aot_eager")(graph, example_inputs, **options)


@pytest.fixture
def counted(monkeypatch):
    """A counting backend for `training_module`; more compilations than `bound` raise instead of running eager."""
    backend = Counting()
    monkeypatch.setattr(compiling, "BACKEND", backend)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield backend
    torch._dynamo.reset()


def bounded(monkeypatch, bound: int) -> None:
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", bound)
    monkeypatch.setattr(torch._dynamo.config, "fail_on_recompile_limit_hit", True)


def pairs_batch(length: int, generator: torch.Generator) -> PaddedBatch:
    """Four right-padded examples, the longest `length` tokens, as `ExampleBatches` gives them (prompt ignored)."""
    lengths = torch.tensor([length, max(1, length - 3), max(1, length // 2), 2])
    ids = torch.randint(1, 37, (4, length), generator=generator)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    targets = torch.randint(1, 37, (4, length), generator=generator).masked_fill(~mask, -100)
    targets[:, :1] = -100  # the prompt's first target
    return PaddedBatch(ids, targets, mask)


def mt_batch(length: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A token-budget batch of `TokenBatches`'s form: rows, source and target lengths all vary with `length`."""
    rows, src_len, tgt_len = 2 + length % 3, length, max(2, length * 2 // 3)
    src = torch.randint(3, 37, (rows, src_len), generator=generator)
    src_mask = torch.arange(src_len)[None, :] < torch.tensor([src_len] + [max(1, src_len - 2)] * (rows - 1))[:, None]
    targets = torch.randint(3, 37, (rows, tgt_len), generator=generator)
    targets[1:, -1] = -100  # padding
    return {
        "src": src.masked_fill(~src_mask, 0),
        "src_mask": src_mask,
        "tgt_in": targets.clamp(min=1),
        "targets": targets,
    }


def steps(module, model, loss_fn, batches) -> list[float]:
    losses = []
    for batch in batches:
        model.zero_grad(set_to_none=True)
        loss = loss_fn(module, batch)
        loss.backward()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize(
    "job, build, loss_fn, batch, bound",
    [
        ("pairs", lambda: DecoderLM(tiny_config(position="rope")), example_loss, pairs_batch, PAIRS_BOUND),
        ("mt", lambda: EncoderDecoder(tiny_config()), lambda m, b: mt_loss(m, b, 0.1), mt_batch, MT_BOUND),
    ],
)
def test_a_step_over_14_lengths_compiles_at_most_the_bound_without_falling_back(
    counted, monkeypatch, caplog, job, build, loss_fn, batch, bound
):
    bounded(monkeypatch, bound)
    model = build().train()
    generator = torch.Generator().manual_seed(0)
    batches = [batch(length, generator) for length in LENGTHS]
    with caplog.at_level(logging.INFO, logger="kqv.train.trainer"):
        heard = []
        compiled = steps(training_module(model, 1, False, True, heard.append), model, loss_fn, batches)
    assert 1 <= counted.graphs <= bound, counted.graphs
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    eager = steps(model, model, loss_fn, batches)
    assert compiled == pytest.approx(eager, abs=1e-5)  # the compiled step is the model's, length by length
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("train.compile: graph")]
    assert len(said) == counted.graphs and "dynamic sizes" in said[-1], said
    assert heard == said  # and to the trainer, which makes each a line of the run's output
