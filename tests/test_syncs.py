"""No host sync in a training step's forward and backward, for every architecture, position scheme, attention core
and feed-forward kind (issue 33): each would stall a GPU once per step. Counted on the CPU by `tests/syncs.py`."""

import pytest
import torch

from conftest import POSITIONS, tiny_config
from kqv import DecoderLM, Encoder, EncoderDecoder
from kqv.nn.heads import SequenceClassifier
from kqv.nn.rnn import RNNConfig, RNNEncoderDecoder
from kqv.nn.vision import ViT
from syncs import SyncCounter

# One axis at a time over the tiny model: each position scheme, each activation, each feed-forward kind, each
# attention core (full attention's plain path with attention dropout, its fused path without), and DMCA's pattern.
KINDS = {
    **{position: dict(position=position) for position in POSITIONS},
    **{activation: dict(activation=activation) for activation in ("relu", "gelu", "swiglu", "geglu")},
    "switch": dict(ffn="switch", experts={"count": 2}, position="rope"),
    "moe": dict(ffn="moe", experts={"count": 3, "capacity_factor": 0.5}, position="learned"),
    "dropout": dict(dropout=0.1, position="relative"),
    "linformer": dict(attention="linformer", linformer={"k": 4}),
    "bigbird": dict(attention="bigbird", bigbird={"block": 4}, position="rope"),
    "local": dict(attention="local", local={"block": 4}, position="rope"),
    "memory_compressed": dict(attention="memory_compressed", memory_compressed={"compression": 3}),
    "dmca": dict(layer_pattern="local,memory_compressed", local={"block": 8}, memory_compressed={"compression": 2}),
}

IDS = torch.randint(0, 37, (2, 16), generator=torch.Generator().manual_seed(0))
MASK = torch.arange(16)[None, :] < torch.tensor([[16], [10]])  # bool, as the batch makers give it: no value read

ARCHITECTURES = {
    "decoder_lm": (DecoderLM, lambda m: m(IDS, IDS)),
    "encoder": (Encoder, lambda m: m(IDS, MASK).square().mean()),
    "encoder_decoder": (EncoderDecoder, lambda m: m(IDS, IDS, IDS, src_mask=MASK, tgt_mask=MASK)),
    "classifier": (lambda c: SequenceClassifier(c, 3), lambda m: m(IDS, torch.tensor([0, 2]), attention_mask=MASK)),
    "vit": (lambda c: ViT(c, (1, 8, 8), 2, 10), lambda m: m(torch.randn(2, 1, 8, 8), torch.tensor([1, 3]))),
}


def syncs_of_a_step(model: torch.nn.Module, loss) -> SyncCounter:
    model.train()
    with SyncCounter() as syncs:
        loss(model).backward()
    return syncs


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_a_training_step_reads_nothing_back_to_the_host(architecture, kind):
    build, loss = ARCHITECTURES[architecture]
    syncs = syncs_of_a_step(build(tiny_config(**KINDS[kind])), loss)
    assert syncs.count == 0, syncs.report()


def test_the_lstm_baseline_reads_only_the_source_lengths_packing_needs():
    """cuDNN's packed LSTM takes the lengths on the host: one read per step with a source mask (carrying the mask's
    checks with it), none without one."""
    model = RNNEncoderDecoder(RNNConfig(vocab_size=37))
    assert syncs_of_a_step(model, lambda m: m(IDS, IDS, IDS)).count == 0
    syncs = syncs_of_a_step(model, lambda m: m(IDS, IDS, IDS, src_mask=MASK))
    from_kqv = [
        where for _, where in syncs.syncs if "in source_lengths" not in where and "self.lstm(packed)" not in where
    ]
    assert syncs.count >= 1 and not from_kqv, syncs.report()


def test_the_counter_sees_every_kind_of_read():
    x = torch.arange(5.0, requires_grad=True)
    with SyncCounter() as syncs:
        x.sum().item()
        x.tolist()
        bool(x.any())
        x[x > 1]
        x.nonzero()
        int(x[0])
    assert syncs.count == 6, syncs.report()
    with SyncCounter() as none:
        (x * 2).sum().backward()
    assert none.count == 0, none.report()


@pytest.mark.parametrize("kind", ["learned", "moe"])
def test_the_training_forward_compiles_as_one_graph(kind):
    """`train.compile` without graph breaks: `fullgraph=True` raises at the first break (a host read, a
    data-dependent branch or shape); Dynamo's "eager" backend keeps it fast, as the capture is what is checked."""
    torch._dynamo.reset()
    model = DecoderLM(tiny_config(**KINDS[kind])).train()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    loss = compiled(IDS, IDS)
    loss.backward()
    torch.testing.assert_close(loss, model(IDS, IDS))


def test_the_ids_of_every_batch_are_checked_once_on_the_host_before_training():
    """The LM's and MLM's batches are blocks of their splits: the preflight checks the splits' ids against the
    vocabulary once, so the model's forward reads none."""
    from kqv.errors import DataError
    from kqv.train.preflight import check_splits

    check_splits({"train": torch.arange(37), "val": torch.arange(20)}, 8, vocab_size=37)
    with pytest.raises(DataError, match=r"the validation split contains token id 40, outside the vocabulary \[0, 37\)"):
        check_splits({"train": torch.arange(37), "val": torch.arange(20) + 21}, 8, vocab_size=37)


def test_a_direct_call_with_an_id_outside_the_vocabulary_is_still_a_clear_error():
    """Without reading the ids in forward: the embedding lookup's IndexError becomes kqv's DataError."""
    from kqv.errors import DataError

    model = EncoderDecoder(tiny_config(tgt_vocab_size=11))
    with pytest.raises(DataError, match=r"tgt_ids contains token id 20, outside the vocabulary \[0, 11\)"):
        model(torch.tensor([[1, 2]]), torch.tensor([[20]]))
    with pytest.raises(DataError, match=r"ids contains token id -1"):
        DecoderLM(tiny_config())(torch.tensor([[-1, 3]]))
