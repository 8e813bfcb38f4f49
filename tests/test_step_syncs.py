"""No host sync in a whole training step between log records (issue 33): the Trainer's update (forward, backward,
clipping, the non-finite guard's verdict, the optimizer step, the counters) reads nothing back to the host; the
loss, gradient norm and verdicts are read once, when a log record, a checkpoint or the end is due. Counted on the
CPU by `tests/syncs.py` for several architectures, position schemes, attention cores and feed-forward kinds."""

import pytest
import torch

import kqv
from conftest import tiny_config
from kqv.nn.heads import predicted_positions
from kqv.train.config import TrainConfig
from kqv.train.metrics import read_metrics
from kqv.train.trainer import Trainer
from syncs import SyncCounter
from test_nonfinite_guard import _InfGradient

SEQ, VOCAB = 16, 37

KINDS = {
    "sinusoidal": dict(position="sinusoidal"),
    "learned": dict(position="learned"),
    "rope+swiglu": dict(position="rope", activation="swiglu"),
    "alibi": dict(position="alibi"),
    "relative+dropout": dict(position="relative", dropout=0.1),
    "switch": dict(ffn="switch", experts={"count": 2}, position="rope"),
    "moe": dict(ffn="moe", experts={"count": 3, "capacity_factor": 0.5}, position="learned"),
    "linformer": dict(attention="linformer", linformer={"k": 4}),
    "local": dict(attention="local", local={"block": 4}, position="rope"),
    "blockwise+alibi": dict(blockwise="always", position="alibi"),
    "blockwise+relative": dict(blockwise="always", position="relative"),
}


def lm_batches(i: int):
    ids = torch.randint(0, VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(i))
    return ids[:, :-1], ids[:, 1:]


def mlm_batches(i: int):
    """BERT-style batches as the MLM job makes them: the positions with a target found here, on the host."""
    generator = torch.Generator().manual_seed(i)
    ids = torch.randint(0, VOCAB, (4, SEQ), generator=generator)
    targets = torch.where(torch.rand(4, SEQ, generator=generator) < 0.15, ids, -100)
    return ids, targets, predicted_positions(targets)


def syncs_per_update(
    model, tmp_path, loss_fn=lambda m, b: m(*b), make_batch=lm_batches, **changes
) -> tuple[list[int], Trainer]:
    """The host syncs of each update of a short run (from one micro-batch's loss to the next, so an update's
    count includes the read that follows it when a log record or a checkpoint is due). The mark is taken where the
    step computes its loss, on the training thread: the batches themselves are made ahead on a worker thread."""
    counter, marks = SyncCounter(), []

    def marked_loss(m, batch):
        marks.append(counter.count)
        return loss_fn(m, batch)

    values = dict(steps=8, batch_size=4, lr=1e-3, warmup_steps=2, log_every=4, eval_every=100)
    cfg = TrainConfig(**{**values, "checkpoint_every": 100, "precision": "fp32", **changes})
    run = Trainer(model, cfg, tmp_path, train_batches=make_batch, loss_fn=marked_loss, quiet=True)
    with counter:
        run.train()
    marks.append(counter.count)
    return [after - before for before, after in zip(marks, marks[1:])], run


@pytest.mark.parametrize("kind", KINDS)
def test_a_training_step_reads_nothing_back_between_log_records(tmp_path, kind):
    syncs, run = syncs_per_update(kqv.DecoderLM(tiny_config(max_len=SEQ, **KINDS[kind])), tmp_path)
    assert run.step == 8 and len(syncs) == 8
    between = [count for step, count in enumerate(syncs, 1) if step % 4]  # updates 1-3 and 5-7
    assert between == [0] * 6, syncs
    assert syncs[3] >= 1  # the log record of update 4 reads the window: the counter does see the trainer's reads


def test_an_encoder_decoder_and_gradient_accumulation_read_nothing_between_log_records(tmp_path):
    model = kqv.EncoderDecoder(tiny_config(max_len=SEQ, position="rope"))
    syncs, _ = syncs_per_update(model, tmp_path, loss_fn=lambda m, b: m(b[0], b[0], b[1]), grad_accum=2)
    per_update = [a + b for a, b in zip(syncs[0::2], syncs[1::2])]  # two micro-batches per update
    assert [count for step, count in enumerate(per_update, 1) if step % 4] == [0] * 6, per_update


def test_a_masked_lm_step_reads_nothing_between_log_records(tmp_path):
    """The MLM job's step: the head gathers the masked rows at positions made with the batch (no boolean mask).
    The batches are made before counting: finding the positions reads host memory, which the CPU-only counter
    cannot tell from a device's."""
    model = kqv.MaskedLM(tiny_config(max_len=SEQ, position="rope"))
    batches = [mlm_batches(i) for i in range(16)]
    syncs, _ = syncs_per_update(
        model,
        tmp_path,
        loss_fn=lambda m, b: m(b[0], b[1], predicted=b[2]),
        make_batch=batches.__getitem__,
        grad_accum=2,
    )
    per_update = [a + b for a, b in zip(syncs[0::2], syncs[1::2])]  # two micro-batches per update
    assert [count for step, count in enumerate(per_update, 1) if step % 4] == [0] * 6, per_update


def test_skipped_updates_are_decided_on_the_device_and_counted_at_the_next_read(tmp_path):
    """A non-finite gradient in update 2 is skipped without a sync there; the log read at update 4 counts it."""

    bad = {5}  # micro-batch 5: update 6

    def poisoned(model, batch):
        marks.append(counter.count)  # on the training thread (batches are made ahead on a worker)
        index, (inputs, targets) = batch
        loss = model(inputs, targets)
        return _InfGradient.apply(loss) if index in bad else loss

    counter, marks = SyncCounter(), []

    def batches(i: int):
        return i, lm_batches(i)

    cfg = TrainConfig(steps=8, batch_size=4, lr=1e-3, warmup_steps=2, log_every=4, eval_every=100, precision="fp32")
    model = kqv.DecoderLM(tiny_config(max_len=SEQ))
    run = Trainer(model, cfg, tmp_path, train_batches=batches, loss_fn=poisoned, quiet=True)
    with counter:
        run.train()
    marks.append(counter.count)
    syncs = [after - before for before, after in zip(marks, marks[1:])]
    assert [count for step, count in enumerate(syncs, 1) if step % 4] == [0] * 6, syncs
    logged = [(r["step"], r["bad_steps"]) for r in read_metrics(tmp_path / "metrics.jsonl") if "train_loss" in r]
    assert run.bad_steps == 1 and logged == [(4, 0), (8, 1)]
