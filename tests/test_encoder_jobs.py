"""The encoder's jobs: BERT's masking, the MLM and classification heads, and both jobs end to end on tiny data."""

from __future__ import annotations

import json
import tomllib

import pytest
import torch

import kqv
from conftest import tiny_config
from kqv.cli.main import main
from kqv.data.masking import mask_tokens
from kqv.data.tokenizers import CharTokenizer
from kqv.data.tsv import read_tsv, split_examples
from kqv.data.vocabulary import Vocabulary
from kqv.nn.heads import predicted_positions
from kqv.train.metrics import read_metrics
from syncs import SyncCounter

# ---------------------------------------------------------------------------------------------------------------
# Masking (Devlin et al. 2019): 15% of the tokens selected; of those 80% [MASK], 10% random, 10% unchanged


def char_vocabulary() -> Vocabulary:
    return Vocabulary(
        CharTokenizer([chr(ord("a") + i) for i in range(26)] + list(" .,;")),
        {"[PAD]": 30, "[CLS]": 31, "[SEP]": 32, "[MASK]": 33},
    )


def test_special_tokens_of_a_char_vocabulary_follow_its_characters():
    vocabulary = Vocabulary.train("char", "to be or not", 0)
    assert vocabulary.tokenizer.vocab_size == 7 and vocabulary.size == 11
    assert (vocabulary.pad_id, vocabulary.cls_id, vocabulary.mask_id) == (7, 8, 10)
    assert vocabulary.regular_ids.tolist() == list(range(7))


def test_special_tokens_of_a_bpe_vocabulary_are_its_first_tokens():
    vocabulary = Vocabulary.train("bpe", "to be or not to be, that is the question " * 20, 280)
    assert (vocabulary.pad_id, vocabulary.cls_id, vocabulary.specials["[SEP]"], vocabulary.mask_id) == (0, 1, 2, 3)
    assert vocabulary.regular_ids.min() == 4 and vocabulary.size == vocabulary.tokenizer.vocab_size


@pytest.fixture(scope="module")
def masked_sample():
    """200,000 tokens: regular ones, with special tokens sprinkled in and the last quarter of every row padding."""
    vocabulary = char_vocabulary()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 30, (400, 500), generator=generator)
    ids[:, 0], ids[:, 250] = vocabulary.cls_id, vocabulary.specials["[SEP]"]
    attention_mask = torch.ones_like(ids)
    attention_mask[:, 375:] = 0
    ids[:, 375:] = vocabulary.pad_id
    inputs, targets = mask_tokens(ids, generator, vocabulary, attention_mask=attention_mask)
    return vocabulary, ids, attention_mask, inputs, targets


def test_fifteen_percent_of_the_eligible_tokens_are_selected(masked_sample):
    vocabulary, ids, attention_mask, inputs, targets = masked_sample
    eligible = attention_mask.bool() & ~torch.isin(ids, vocabulary.special_ids)
    selected = targets != -100
    assert abs(selected[eligible].float().mean().item() - 0.15) < 0.005  # 5 standard deviations on 149,200 tokens


def test_selected_tokens_become_mask_random_or_stay_in_80_10_10_proportions(masked_sample):
    vocabulary, ids, _, inputs, targets = masked_sample
    selected = targets != -100
    became_mask = (inputs[selected] == vocabulary.mask_id).float().mean().item()
    stayed = (inputs[selected] == ids[selected]).float().mean().item()
    replaced = 1 - became_mask - stayed
    n_regular = len(vocabulary.regular_ids)  # a random token equals the original one time in n_regular
    assert abs(became_mask - 0.8) < 0.01
    assert abs(replaced - 0.1 * (1 - 1 / n_regular)) < 0.01
    assert abs(stayed - (0.1 + 0.1 / n_regular)) < 0.01


def test_padding_and_special_tokens_are_never_selected_or_changed(masked_sample):
    vocabulary, ids, attention_mask, inputs, targets = masked_sample
    protected = ~attention_mask.bool() | torch.isin(ids, vocabulary.special_ids)
    assert (targets[protected] == -100).all()
    assert torch.equal(inputs[protected], ids[protected])


def test_targets_are_the_original_tokens_and_random_replacements_are_regular_tokens(masked_sample):
    vocabulary, ids, _, inputs, targets = masked_sample
    selected = targets != -100
    assert torch.equal(targets[selected], ids[selected])
    replaced = selected & (inputs != vocabulary.mask_id) & (inputs != ids)
    assert replaced.sum() > 1000 and torch.isin(inputs[replaced], vocabulary.regular_ids).all()


def test_masking_is_a_function_of_the_generator_seed():
    vocabulary, ids = char_vocabulary(), torch.randint(0, 30, (4, 64))
    first = mask_tokens(ids, torch.Generator().manual_seed(5), vocabulary)
    again = mask_tokens(ids, torch.Generator().manual_seed(5), vocabulary)
    other = mask_tokens(ids, torch.Generator().manual_seed(6), vocabulary)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[1], other[1])


def test_evaluation_masking_hides_every_selected_token():
    vocabulary, ids = char_vocabulary(), torch.randint(0, 30, (50, 100))
    inputs, targets = mask_tokens(
        ids, torch.Generator().manual_seed(0), vocabulary, mask_token_prob=1.0, random_token_prob=0.0
    )
    selected = targets != -100
    assert (inputs[selected] == vocabulary.mask_id).all() and torch.equal(inputs[~selected], ids[~selected])


# ---------------------------------------------------------------------------------------------------------------
# The heads


@torch.no_grad()
def test_masked_lm_loss_is_the_cross_entropy_of_its_logits_at_the_masked_positions():
    model = kqv.MaskedLM(tiny_config(position="learned")).eval()
    ids = torch.randint(0, 37, (3, 10))
    targets = torch.where(torch.rand(3, 10) < 0.3, ids, -100)
    logits = model(ids)
    assert logits.shape == (3, 10, 37)
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    torch.testing.assert_close(model(ids, targets), expected)


def test_predicted_positions_list_each_rows_targets_in_order_and_fill_with_minus_one():
    targets = torch.tensor([[-100, 5, -100, 7, 9], [-100, -100, -100, -100, 4], [-100] * 5])
    assert predicted_positions(targets).tolist() == [[1, 3, 4], [4, -1, -1], [-1, -1, -1]]
    assert predicted_positions(torch.full((2, 4), -100)).shape == (2, 0)


def test_masked_lm_loss_from_handed_over_positions_is_the_cross_entropy_at_the_masked_rows():
    """The training step's path (positions found with the batch) gives F.cross_entropy over the masked rows'
    logits, gradients included, and reads nothing back from the device."""
    model = kqv.MaskedLM(tiny_config(position="rope"))
    ids = torch.randint(0, 37, (4, 12))
    targets = torch.where(torch.rand(4, 12) < 0.2, ids, -100)
    targets[2] = -100  # a row with no target at all
    masked = targets != -100
    expected = torch.nn.functional.cross_entropy(model(ids)[masked], targets[masked])
    (expected_grad,) = torch.autograd.grad(expected, model.head.dense.weight)
    predicted = predicted_positions(targets)
    with SyncCounter() as syncs:
        loss = model(ids, targets, predicted=predicted)
        (grad,) = torch.autograd.grad(loss, model.head.dense.weight)
    assert syncs.count == 0, syncs.report()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, expected_grad)
    torch.testing.assert_close(model(ids, targets), expected)  # positions found in forward: the same loss
    with pytest.raises(kqv.errors.DataError, match=r"predicted must be a LongTensor \(batch, k\)"):
        model(ids, targets, predicted=predicted[:2])


def test_masked_lm_head_shares_its_matrix_with_the_token_embeddings():
    model = kqv.MaskedLM(tiny_config())
    assert model.head.to_vocab.weight is model.encoder.embeddings.tokens.weight
    assert model.head.to_vocab.bias is not None
    untied = kqv.MaskedLM(tiny_config(tie_embeddings=False))
    assert untied.head.to_vocab.weight is not untied.encoder.embeddings.tokens.weight


@pytest.mark.parametrize("pooling", ["first", "mean"])
@torch.no_grad()
def test_classifier_logits_do_not_depend_on_padding(pooling):
    model = kqv.SequenceClassifier(tiny_config(), n_classes=3, pooling=pooling).eval()
    ids = torch.randint(0, 37, (1, 6))
    padded = torch.cat((ids, torch.zeros(1, 4, dtype=torch.long)), dim=1)
    mask = torch.tensor([[1] * 6 + [0] * 4])
    torch.testing.assert_close(model(padded, attention_mask=mask), model(ids), atol=1e-5, rtol=0)


def test_classifier_rejects_unknown_pooling_and_labels_of_the_wrong_shape():
    with pytest.raises(ValueError, match="pooling must be 'first'"):
        kqv.SequenceClassifier(tiny_config(), 2, pooling="max")
    model = kqv.SequenceClassifier(tiny_config(), 2)
    with pytest.raises(ValueError, match=r"labels must have shape \(2,\)"):
        model(torch.randint(0, 37, (2, 5)), torch.zeros(2, 5, dtype=torch.long))


# ---------------------------------------------------------------------------------------------------------------
# The jobs end to end on tiny data, through the command line


TINY_MODEL = """
[model]
d_model = 32
n_heads = 2
n_layers = 2
d_ff = 64
dropout = 0.0
position = "learned"
norm_first = false
embed_norm = true
"""

TINY_MLM = (
    TINY_MODEL
    + """
[data]
tokenizer = "{tokenizer}"
vocab_size = 300
context = 32

[train]
steps = 60
batch_size = 16
lr = 3e-3
warmup_steps = 5
eval_every = 30
eval_batches = 4
checkpoint_every = 60
log_every = 5
precision = "fp32"
"""
)

TINY_CLS = (
    TINY_MODEL
    + """
[data]
tokenizer = "char"
max_tokens = 24

[head]
pooling = "mean"

[train]
steps = 40
batch_size = 16
lr = 3e-3
warmup_steps = 5
eval_every = 20
eval_batches = 2
checkpoint_every = 40
log_every = 5
precision = "fp32"
"""
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "tiny.txt"
    path.write_text("To be, or not to be, that is the question.\n" * 60)
    return path


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory, corpus):
    root = tmp_path_factory.mktemp("mlm")
    (root / "tiny.toml").write_text(TINY_MLM.format(tokenizer="char"))
    out = root / "run"
    assert (
        main(["train", "mlm", "--config", str(root / "tiny.toml"), "--data", str(corpus), "--out", str(out), "--quiet"])
        == 0
    )
    return out


@pytest.fixture(scope="module")
def tsv(tmp_path_factory):
    """Sentences whose label is whether they contain a positive or a negative word."""
    generator = torch.Generator().manual_seed(0)
    filler = "the a film plot actor story was is very quite".split()
    words = {"pos": ["good", "great", "lovely"], "neg": ["bad", "awful", "dull"]}
    lines = []
    for i in range(200):
        label = "pos" if i % 2 else "neg"
        chosen = [filler[j] for j in torch.randint(len(filler), (4,), generator=generator)]
        chosen.insert(int(torch.randint(5, (1,), generator=generator)), words[label][i % 3])
        lines.append(" ".join(chosen) + "\t" + label)
    path = tmp_path_factory.mktemp("cls") / "reviews.tsv"
    path.write_text("\n".join(lines) + "\n")
    return path


def losses(run) -> list[float]:
    return [r["train_loss"] for r in read_metrics(run / "metrics.jsonl") if "train_loss" in r]


def test_mlm_run_records_its_task_and_its_loss_falls(mlm_run):
    assert tomllib.loads((mlm_run / "run.toml").read_text())["task"] == "mlm"
    train_losses = losses(mlm_run)
    assert train_losses[-1] < 0.9 * train_losses[0]


def test_mlm_run_reports_masked_accuracy_and_the_unigram_baseline_at_every_evaluation(mlm_run):
    evaluations = [r for r in read_metrics(mlm_run / "metrics.jsonl") if "val_loss" in r]
    assert [r["step"] for r in evaluations] == [30, 60]
    assert all(0 <= r["masked_accuracy"] <= 1 and 0 < r["unigram_accuracy"] < 1 for r in evaluations)
    summary = json.loads((mlm_run / "summary.json").read_text())
    assert summary["masked_accuracy"] == evaluations[-1]["masked_accuracy"] and summary["masked_tokens"] > 0


def test_mlm_with_a_bpe_tokenizer_trains(tmp_path, corpus):
    (tmp_path / "tiny.toml").write_text(TINY_MLM.format(tokenizer="bpe"))
    assert (
        main(
            [
                "train",
                "mlm",
                "--config",
                str(tmp_path / "tiny.toml"),
                "--data",
                str(corpus),
                "--steps",
                "20",
                "--out",
                str(tmp_path / "run"),
                "--quiet",
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "run" / "tokenizer" / "specials.json").read_text())["[MASK]"] == 3
    assert losses(tmp_path / "run")[-1] < losses(tmp_path / "run")[0]


def test_mlm_model_exports_to_a_hugging_face_bert_for_masked_lm(mlm_run):
    from kqv.interop import to_hf
    from kqv.jobs.mlm import load_mlm_run

    run = load_mlm_run(mlm_run)
    ids = torch.randint(0, run.vocabulary.size, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(to_hf(run.model)(ids).logits, run.model(ids), atol=1e-5, rtol=0)


def test_kqv_export_writes_an_mlm_run_as_a_bert_that_transformers_loads(mlm_run, tmp_path):
    """`kqv export RUN --hf DIR` of an MLM run: AutoModelForMaskedLM gives the run's logits, AutoTokenizer its ids
    and its [MASK]."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from kqv.jobs.mlm import load_mlm_run

    assert main(["export", str(mlm_run), "--hf", str(tmp_path / "bert")]) == 0
    run = load_mlm_run(mlm_run)
    bert, tokenizer = (
        AutoModelForMaskedLM.from_pretrained(tmp_path / "bert"),
        AutoTokenizer.from_pretrained(tmp_path / "bert"),
    )
    text = "To be, or not to be"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == run.vocabulary.encode(text) and tokenizer.mask_token_id == run.vocabulary.mask_id
    batch = torch.tensor([[run.vocabulary.cls_id, *ids[:5], run.vocabulary.mask_id, *ids[6:]]])
    with torch.no_grad():
        torch.testing.assert_close(bert.eval()(batch).logits, run.model(batch), atol=1e-5, rtol=0)


def test_an_mlm_model_bert_cannot_hold_is_refused_by_name_with_nothing_written(tmp_path):
    from kqv.errors import ConversionError
    from kqv.jobs.export import export_hf

    vocabulary = char_vocabulary()
    model = kqv.MaskedLM(tiny_config(vocab_size=vocabulary.size, position="rope"))
    with pytest.raises(ConversionError, match="cannot be written as a Hugging Face BERT: .*position"):
        export_hf(model, vocabulary.tokenizer, tmp_path / "bert", "runs/mlm", "BertForMaskedLM", vocabulary.specials)
    assert not (tmp_path / "bert").exists()


def test_classifier_run_records_its_task_labels_and_dev_accuracy_and_its_loss_falls(tmp_path, tsv):
    (tmp_path / "tiny.toml").write_text(TINY_CLS)
    out = tmp_path / "run"
    assert (
        main(
            ["train", "cls", "--config", str(tmp_path / "tiny.toml"), "--data", str(tsv), "--out", str(out), "--quiet"]
        )
        == 0
    )
    run_config = tomllib.loads((out / "run.toml").read_text())
    assert run_config["task"] == "cls" and run_config["labels"]["names"] == ["neg", "pos"]
    train_losses = losses(out)
    assert train_losses[-1] < 0.8 * train_losses[0]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["train_examples"], summary["dev_examples"]) == (180, 20)
    assert 0 <= summary["dev_accuracy"] <= 1 and 0 < summary["majority_accuracy"] < 1


def test_classifier_fine_tunes_the_encoder_of_an_mlm_run(tmp_path, mlm_run, corpus):
    tsv = tmp_path / "lines.tsv"
    tsv.write_text("".join(f"{'to be, or not' if i % 2 else 'that is the question'}\t{i % 2}\n" for i in range(40)))
    (tmp_path / "tiny.toml").write_text(TINY_CLS)
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "cls",
                "--config",
                str(tmp_path / "tiny.toml"),
                "--data",
                str(tsv),
                "--init",
                str(mlm_run),
                "--steps",
                "10",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    mlm_model = tomllib.loads((mlm_run / "run.toml").read_text())["model"]
    assert tomllib.loads((out / "run.toml").read_text())["model"] == mlm_model
    assert (out / "tokenizer" / "specials.json").read_text() == (mlm_run / "tokenizer" / "specials.json").read_text()


def test_tsv_line_without_a_tab_is_reported_with_its_line_number(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_text("good film\tpos\n\nno tab here\n")
    with pytest.raises(ValueError, match=r"bad.tsv:3: expected text<TAB>label"):
        read_tsv(path)


def test_dev_split_is_deterministic_and_disjoint():
    examples = [(str(i), str(i % 2)) for i in range(50)]
    train, dev = split_examples(examples, 0.2, seed=0)
    assert (len(train), len(dev)) == (40, 10) and not set(train) & set(dev)
    assert split_examples(examples, 0.2, seed=0) == (train, dev)


def test_classification_without_data_says_to_pass_a_tsv(tmp_path, capsys):
    assert main(["train", "cls", "--out", str(tmp_path / "run")]) == 2
    assert "TSV file of text<TAB>label lines: give --data FILE" in capsys.readouterr().err


def test_unknown_section_in_an_mlm_config_is_named(tmp_path, capsys):
    (tmp_path / "bad.toml").write_text(TINY_MLM.format(tokenizer="char") + "\n[sample]\ncount = 1\n")
    assert main(["train", "mlm", "--config", str(tmp_path / "bad.toml"), "--out", str(tmp_path / "run")]) == 2
    assert "unknown section(s) ['sample']" in capsys.readouterr().err
