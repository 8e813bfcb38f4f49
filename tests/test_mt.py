"""Specification of the machine-translation job (kqv.jobs.mt) and its commands: batches, loss, translation, a whole
run."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from kqv import EncoderDecoder, ModelConfig, RNNConfig, RNNEncoderDecoder
from kqv.cli.main import main
from kqv.data.tokenizers import make_tokenizer
from kqv.jobs.mt import Encoded, MTRunConfig, TokenBatches, load_run, mt_loss, read_run_config
from kqv.jobs.translation import translate_sentences
from kqv.train.checkpoints import read_checkpoint
from kqv.train.metrics import read_metrics
from kqv.train.runs import read_summary

GERMAN = ["null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun"]
ENGLISH = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

TINY_RUN = """
[data]
vocab_size = 300
max_tokens = 400
max_len = 32
dev_fraction = 0.1
test_fraction = 0.1
eval_sentences = 16

[model]
kind = "{kind}"
{model}

[train]
steps = 6
batch_size = 64
lr = 3e-3
schedule = "inverse_sqrt"
warmup_steps = 2
eval_every = 3
checkpoint_every = 3
log_every = 3
precision = "fp32"
label_smoothing = 0.1

[decode]
beam_size = 2
max_len_a = 1.0
max_len_b = 2
"""
MODELS = {
    "transformer": 'd_model = 32\nn_heads = 2\nn_layers = 1\nd_ff = 64\nposition = "learned"',
    "lstm": 'd_embed = 16\nd_hidden = 32\nn_layers = 1\nscore = "additive"\nattention_hidden = 8',
}


def number_corpus(lines: int = 1200) -> list[tuple[str, str]]:
    rng = random.Random(0)
    pairs = []
    for _ in range(lines):
        digits = [rng.randrange(10) for _ in range(rng.randint(1, 4))]
        pairs.append((" ".join(GERMAN[d] for d in digits), " ".join(ENGLISH[d] for d in digits)))
    return pairs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "numbers.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in number_corpus()), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained_runs(tmp_path_factory, corpus) -> dict[str, Path]:
    """A Transformer trained through `kqv train mt`, and the LSTM baseline trained on its data (--data-from)."""
    root = tmp_path_factory.mktemp("runs")
    runs = {}
    for kind, model in MODELS.items():
        config = root / f"{kind}.toml"
        config.write_text(TINY_RUN.format(kind=kind, model=model))
        runs[kind] = root / kind
        data = ["--data", str(corpus)] if kind == "transformer" else ["--data-from", str(runs["transformer"])]
        assert main(["train", "mt", "--config", str(config), "--out", str(runs[kind]), "--quiet", *data]) == 0
    return runs


# ---------------------------------------------------------------------------------------------------------------
# Batches and loss


def toy_split(count: int = 300) -> Encoded:
    rng = random.Random(1)
    src = [torch.randint(3, 50, (rng.randint(1, 30),)) for _ in range(count)]
    tgt = [torch.randint(3, 50, (rng.randint(1, 30),)) for _ in range(count)]
    return Encoded(src, tgt)


def test_batch_i_is_the_same_whenever_it_is_asked_for_so_resuming_is_exact():
    split = toy_split()
    options = {"max_tokens": 200, "max_rows": 32, "seed": 5, "pad_id": 0, "bos_id": 1, "eos_id": 2}
    first, second = TokenBatches(split, **options), TokenBatches(split, **options)
    for i in [0, 7, len(first) + 3, 2, 7]:  # out of order and across epochs
        a, b = first(i), second(i)
        assert all(torch.equal(a[key], b[key]) for key in a)
    assert not torch.equal(first.indices(0), first.indices(len(first)))  # a new epoch is shuffled anew


def test_batches_respect_the_token_budget_and_cover_every_sentence_once_per_epoch():
    split = toy_split()
    batches = TokenBatches(split, max_tokens=200, max_rows=16, seed=0, pad_id=0, bos_id=1, eos_id=2)
    seen = []
    for i in range(len(batches)):
        batch = batches(i)
        rows = batch["src"].shape[0]
        assert rows <= 16
        assert rows * max(batch["src"].shape[1], batch["tgt_in"].shape[1]) <= 200
        seen += batches.indices(i).tolist()
    assert sorted(seen) == list(range(len(split)))


def test_a_batch_is_teacher_forcing_with_right_padding_and_masks():
    split = Encoded([torch.tensor([5, 6, 2]), torch.tensor([7, 2])], [torch.tensor([8, 9]), torch.tensor([10])])
    batch = TokenBatches(split, max_tokens=100, max_rows=8, seed=0, pad_id=0, bos_id=1, eos_id=2, shuffle=False)(0)
    assert batch["src"].tolist() == [[7, 2, 0], [5, 6, 2]]
    assert batch["src_mask"].tolist() == [[True, True, False], [True, True, True]]
    assert batch["tgt_in"].tolist() == [[1, 10, 0], [1, 8, 9]]
    assert batch["targets"].tolist() == [[10, 2, -100], [8, 9, 2]]


@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_label_smoothing_applies_in_training_and_validation_loss_is_plain_cross_entropy(kind):
    torch.manual_seed(0)
    model = (
        EncoderDecoder(ModelConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0))
        if kind == "transformer"
        else RNNEncoderDecoder(RNNConfig(vocab_size=11, d_embed=8, d_hidden=16, dropout=0.0))
    )
    batch = {
        "src": torch.tensor([[4, 5, 6], [7, 8, 0]]),
        "src_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
        "tgt_in": torch.tensor([[1, 2, 3], [1, 9, 10]]),
        "targets": torch.tensor([[2, 3, -100], [9, 10, 5]]),
    }
    logits = model(batch["src"], batch["tgt_in"], src_mask=batch["src_mask"]).flatten(0, 1)
    targets = batch["targets"].flatten()
    plain = torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100)
    smoothed = torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, label_smoothing=0.1)
    model.eval()
    torch.testing.assert_close(mt_loss(model, batch, label_smoothing=0.1), plain)
    model.train()
    torch.testing.assert_close(mt_loss(model, batch, label_smoothing=0.1), smoothed)
    assert not torch.isclose(smoothed, plain)


# ---------------------------------------------------------------------------------------------------------------
# Translation: clear errors


def test_an_empty_source_sentence_is_a_clear_error(trained_runs):
    run = load_run(trained_runs["lstm"])
    with pytest.raises(ValueError, match="sentence 2 is empty"):
        run.translate(["eins zwei", "  "])


def test_a_source_too_long_for_learned_positions_is_a_clear_error():
    tokenizer = make_tokenizer("bpe", "eins zwei drei " * 50, 300, ("<pad>", "<bos>", "<eos>"))

    model = EncoderDecoder(
        ModelConfig(
            vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=8, position="learned"
        )
    )
    with pytest.raises(ValueError, match="learned positions cover max_len=8"):
        translate_sentences(model, tokenizer, ["eins zwei drei eins zwei drei eins zwei drei"])


def test_an_unknown_language_pair_in_the_config_is_a_clear_error(capsys):
    assert main(["train", "mt", "--pair", "de-fr", "--out", "/nonexistent/run", "--quiet"]) == 2
    assert "de-en, fr-en, en-de, en-fr" in capsys.readouterr().err


def test_an_mt_config_names_unknown_options():
    with pytest.raises(ValueError, match=r"unknown \[data\] option"):
        MTRunConfig.from_dict({"train": {"steps": 1, "batch_size": 1}, "data": {"pairs": "de-en"}})
    with pytest.raises(ValueError, match="model.kind"):
        MTRunConfig.from_dict({"train": {"steps": 1, "batch_size": 1}, "model": {"kind": "gru"}})


# ---------------------------------------------------------------------------------------------------------------
# A whole run through the command line


def test_a_tiny_run_trains_translates_and_scores_through_the_cli(trained_runs, capsys, tmp_path):
    for kind, run_dir in trained_runs.items():
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["kind"] == kind and summary["steps"] == 6 and summary["train_flops"] > 0
        assert 0 <= summary["test_bleu"] <= 100 and len((run_dir / "test.hyp").read_text().splitlines()) > 0
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records if "dev_bleu" in r] == [3, 6]  # BLEU per evaluation
        assert read_run_config(run_dir).kind == kind

        capsys.readouterr()
        assert main(["translate", str(run_dir), "eins zwei drei"]) == 0
        assert len(capsys.readouterr().out.splitlines()) == 1
        (tmp_path / "in.txt").write_text("eins\n\nzwei drei\n", encoding="utf-8")
        assert main(["translate", str(run_dir), "--file", str(tmp_path / "in.txt"), "--beam", "1"]) == 0
        assert len(capsys.readouterr().out.splitlines()) == 2

        assert main(["eval", str(run_dir), "--json"]) == 0
        result = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert result["sentences"] == summary["test_sentences"] and result["beam_size"] == 2
        assert result["bleu"] == pytest.approx(summary["test_bleu"])  # the same test set, the same decoding

        png = tmp_path / f"{kind}.png"
        assert main(["attention", str(run_dir), "--src", "eins zwei", "--out", str(png)]) == 0
        assert png.stat().st_size > 1000


def test_the_baseline_reuses_the_transformers_tokenizer_and_data_exactly(trained_runs):
    transformer, lstm = trained_runs["transformer"], trained_runs["lstm"]
    for name in ("pairs.safetensors", "tokenizer/tokenizer.json", "data/test.src", "data/test.tgt"):
        assert (transformer / name).read_bytes() == (lstm / name).read_bytes()


def test_an_interrupted_run_resumed_from_its_checkpoint_ends_with_the_same_weights(tmp_path, corpus):
    from safetensors.torch import load_file

    config = tmp_path / "run.toml"
    config.write_text(TINY_RUN.format(kind="transformer", model=MODELS["transformer"]))
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    common = ["train", "mt", "--config", str(config), "--data", str(corpus), "--quiet"]
    assert main([*common, "--out", str(straight), "--steps", "6"]) == 0
    assert main([*common, "--out", str(resumed), "--steps", "3"]) == 0
    first = read_checkpoint(resumed).extra_state
    assert main([*common, "--out", str(resumed), "--steps", "6", "--resume"]) == 0
    weights = [load_file(str(run / "checkpoint" / "model.safetensors")) for run in (straight, resumed)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    # the dev evaluation's time is kept in the checkpoint's extra_state and adds up across the resume
    final = read_checkpoint(resumed).extra_state
    assert first["task"] == final["task"] == "mt" and 0 < first["eval_seconds"] < final["eval_seconds"]
    last = read_metrics(resumed / "metrics.jsonl")[-1]
    assert last["step"] == 6 and last["eval_seconds"] == final["eval_seconds"]
    assert read_summary(resumed)["eval_seconds"] == round(final["eval_seconds"], 1)


@pytest.mark.parametrize("name", ["quick", "lstm"])
def test_the_shipped_mt_configs_build_their_models_and_differ_only_in_the_model(name):
    from kqv.cli.main import packaged_config
    from kqv.jobs.mt import build_model, load_run_config

    config = load_run_config(packaged_config(name, "mt"))
    model = build_model(config.model_config(8000))
    assert type(model).__name__ == {"quick": "EncoderDecoder", "lstm": "RNNEncoderDecoder"}[name]
    reference = load_run_config(packaged_config("quick", "mt"))
    assert (config.data, config.train, config.decode) == (reference.data, reference.train, reference.decode)
