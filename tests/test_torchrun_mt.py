"""Token-budget batches under torchrun (issue 43): `kqv train mt` yields batches of any number of rows up to
`batch_size`; every process takes its share of the rows, its loss weighted by its share of the batch's target
tokens (`kqv.train.distributed.share`), so 2 processes train as one does, and resume exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from kqv.cli.main import main
from kqv.data.pairs import TokenBatches, load_splits
from kqv.errors import DataError
from kqv.train.checkpoints import read_checkpoint
from kqv.train.distributed import share
from kqv.train.metrics import read_metrics
from test_fsdp import torchrun
from test_mt import MODELS, TINY_RUN, number_corpus


def test_a_batch_of_any_size_is_shared_so_that_the_weighted_losses_average_to_the_whole_batch_s():
    batch = {"x": torch.arange(5 * 3).reshape(5, 3), "targets": torch.tensor([[1, -100]] * 2 + [[1, 1]] * 3)}
    terms = TokenBatches.target_tokens
    parts = [share(batch, rank, 2, terms) for rank in range(2)]
    assert [p["x"].shape[0] for p, _ in parts] == [2, 3]  # rows cut at r * n // N
    assert torch.equal(torch.cat([p["x"] for p, _ in parts]), batch["x"])
    assert [w for _, w in parts] == [2 * 2 / 8, 2 * 6 / 8]  # world size * the rank's targets / the batch's
    # mean over ranks of (weight * the rank's mean over its targets) is the mean over the batch's targets
    per_token = torch.rand(5, 2).masked_fill(batch["targets"] == -100, 0)
    rank_means = [per_token[:2].sum() / 2, per_token[2:].sum() / 6]
    assert sum(w * m for (_, w), m in zip(parts, rank_means)) / 2 == pytest.approx(float(per_token.sum() / 8))
    assert [w for _, w in (share(batch["x"][:4], r, 2) for r in range(2))] == [1.0, 1.0]  # rows by default
    lonely = [share(batch["x"][:1], r, 2) for r in range(2)]  # one row for two ranks: rank 0 computes it at weight 0
    assert [(p.shape[0], w) for p, w in lonely] == [(1, 0.0), (1, 2.0)]
    assert share(batch, 0, 1) == (batch, 1.0)
    with pytest.raises(DataError, match="must have the batch's 5 rows"):
        share({"x": batch["x"], "y": torch.zeros(4)}, 0, 2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A tiny MT run without dropout in one process and under torchrun with 2 (6 updates), and 2 processes
    stopped after 3 updates and resumed to 6 by a new torchrun."""
    root = tmp_path_factory.mktemp("mt-torchrun")
    corpus, config = root / "numbers.tsv", root / "tiny.toml"
    corpus.write_text("".join(f"{s}\t{t}\n" for s, t in number_corpus()), encoding="utf-8")
    model = MODELS["transformer"] + "\ndropout = 0.0"
    config.write_text(TINY_RUN.format(kind="transformer", model=model).replace("log_every = 3", "log_every = 1"))
    common = ["train", "mt", "--config", str(config), "--data", str(corpus), "--quiet"]
    assert main([*common, "--out", str(root / "one")]) == 0
    torchrun("-m", "kqv.cli", *common, "--out", str(root / "two"))
    torchrun("-m", "kqv.cli", *common, "--out", str(root / "resumed"), "--steps", "3")
    torchrun("-m", "kqv.cli", *common, "--out", str(root / "resumed"), "--steps", "6", "--resume")
    return root


def test_two_processes_on_token_budget_batches_give_one_process_s_loss_curve(runs):
    seed = read_checkpoint(runs / "one").config.seed
    batches = TokenBatches(load_splits(runs / "one" / "pairs.safetensors")["train"], max_tokens=400, max_rows=64,
                           seed=seed, pad_id=0, bos_id=1, eos_id=2)  # fmt: skip
    sizes = [len(batches.indices(i)) for i in range(6)]
    assert any(size % 2 for size in sizes) and min(sizes) < 64, sizes  # rows split unevenly, fewer than batch_size
    one, two = (read_metrics(runs / name / "metrics.jsonl") for name in ("one", "two"))
    assert [r["step"] for r in two] == [r["step"] for r in one] and read_checkpoint(runs / "two").step == 6
    assert read_checkpoint(runs / "two").state["world_size"] == 2
    for key in ("train_loss", "grad_norm"):
        logged = [(a[key], b[key]) for a, b in zip(one, two) if key in a]
        assert len(logged) == 6
        assert [b for _, b in logged] == pytest.approx([a for a, _ in logged], abs=1e-5, rel=0)
    a, b = (load_file(runs / name / "checkpoint" / "model.safetensors") for name in ("one", "two"))
    assert max((a[name] - b[name]).abs().max().item() for name in a) < 1e-5


def test_a_two_process_mt_run_resumes_exactly(runs):
    straight, resumed = runs / "two", runs / "resumed"
    records = [read_metrics(run / "metrics.jsonl") for run in (straight, resumed)]
    curves = [[(r["step"], r["train_loss"], r["grad_norm"]) for r in run if "train_loss" in r] for run in records]
    assert len(curves[0]) == 6 and curves[1] == curves[0]
    a, b = (load_file(run / "checkpoint" / "model.safetensors") for run in (straight, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
