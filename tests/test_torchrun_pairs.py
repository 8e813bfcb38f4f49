"""Pairs and masked-LM training under torchrun (issue 43): examples differ in length, so the rows of a batch hold
different numbers of the targets a loss averages over. Every process's loss is weighted by its share of them
(`loss_terms`, kqv.train.distributed.share), so 2 processes give the one-process loss curve, not a mean of the
per-process means."""

from __future__ import annotations

import random

import pytest
import torch

from kqv.cli.main import main
from kqv.data.example_batches import ExampleBatches, PackedBatch, PaddedBatch
from kqv.train.distributed import share
from kqv.train.metrics import read_metrics
from test_fsdp import torchrun

TINY_PAIRS = """
[data]
tokenizer = "char"
context = 48
val_fraction = 0.2
prompt_loss_weight = {weight}

[model]
d_model = 32
n_heads = 2
n_layers = 1
d_ff = 64
dropout = 0.0

[train]
steps = 4
batch_size = 4
lr = 3e-3
warmup_steps = 1
precision = "fp32"
log_every = 1
eval_every = 4
eval_batches = 2
checkpoint_every = 4

[sample]
count = 1
max_new_tokens = 4
"""


def pairs_file(path) -> None:
    """Questions with answers of 1 to 20 characters: rows of very different numbers of targets."""
    rng = random.Random(0)
    lines = [f"q{k}: say {n}?\t{'ab'[k % 2] * n}" for k, n in enumerate(rng.randint(1, 20) for _ in range(80))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def one_and_two_processes_agree(command: list[str], tmp_path) -> None:
    """`kqv COMMAND` in one process and under torchrun with 2 log the same losses, gradient norms and validation
    losses, within 1e-5."""
    assert main([*command, "--out", str(tmp_path / "one")]) == 0
    torchrun("-m", "kqv.cli", *command, "--out", str(tmp_path / "two"))
    one, two = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("one", "two"))
    for key in ("train_loss", "grad_norm", "val_loss"):
        logged = [(a[key], b[key]) for a, b in zip(one, two) if key in a]
        assert logged, key
        assert [b for _, b in logged] == pytest.approx([a for a, _ in logged], abs=1e-5, rel=0), key


def test_a_rank_s_weight_is_its_share_of_the_weighted_targets():
    targets = torch.tensor([[5, -100, -100], [5, 6, 7]])
    weights = torch.tensor([[0.5, 1.0, 1.0], [0.5, 1.0, 1.0]])
    ids, mask = torch.zeros_like(targets), targets != -100
    assert ExampleBatches.loss_terms(PaddedBatch(ids, targets, mask)) == 4
    weighted = PaddedBatch(ids, targets, mask, weights)
    assert ExampleBatches.loss_terms(weighted) == 3.0  # 0.5 + 0.5 + 1 + 1
    parts = [share(weighted, rank, 2, ExampleBatches.loss_terms) for rank in (0, 1)]
    assert [w for _, w in parts] == [2 * 0.5 / 3, 2 * 2.5 / 3]
    assert all(type(part) is PaddedBatch and part.weights.shape == (1, 3) for part, _ in parts)  # each rank's row
    unweighted, _ = share(PackedBatch(ids, targets, mask.long() - 1, ids), 1, 2, ExampleBatches.loss_terms)
    assert type(unweighted) is PackedBatch and unweighted.weights is None and unweighted.targets.tolist() == [[5, 6, 7]]


@pytest.mark.parametrize("weight", [0.0, 0.5])
def test_two_processes_fine_tuning_on_pairs_give_one_process_s_loss_curve(tmp_path, weight):
    config, data = tmp_path / "tiny.toml", tmp_path / "qa.tsv"
    config.write_text(TINY_PAIRS.format(weight=weight))
    pairs_file(data)
    common = ["train", "lm", "--config", str(config), "--data", str(data), "--quiet"]
    one_and_two_processes_agree(common, tmp_path)


def test_two_processes_training_a_masked_lm_give_one_process_s_loss_curve(tmp_path):
    """Each row hides its own random number of tokens: the loss averages over the hidden ones."""
    from test_encoder_jobs import TINY_MLM

    config, data = tmp_path / "tiny.toml", tmp_path / "t.txt"
    config.write_text(
        TINY_MLM.format(tokenizer="char")
        .replace("steps = 60", "steps = 4")
        .replace("log_every = 5", "log_every = 1")
        .replace("eval_every = 30", "eval_every = 4")
        .replace("checkpoint_every = 60", "checkpoint_every = 4")
        .replace("dropout = 0.1", "dropout = 0.0")
    )
    data.write_text("To be, or not to be, that is the question; whether 'tis nobler in the mind.\n" * 40)
    common = ["train", "mlm", "--config", str(config), "--data", str(data), "--quiet"]
    one_and_two_processes_agree(common, tmp_path)
