"""Specification of kqv.data.tokenizers: character and byte-level BPE tokenizers, saving and loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kqv.data.tokenizers import BPETokenizer, CharTokenizer, Tokenizer, load_tokenizer, make_tokenizer

SAMPLE = (
    "To be, or not to be, that is the question:\n"
    "Whether 'tis nobler in the mind to suffer\n"
    "The slings and arrows of outrageous fortune,\n"
    "Or to take arms against a sea of troubles\n"
    "And by opposing end them. To die—to sleep,\n"
) * 20
SPECIALS = ["<pad>", "<bos>", "<eos>"]


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train(SAMPLE, vocab_size=330, special_tokens=SPECIALS)


@pytest.fixture(scope="module")
def char() -> CharTokenizer:
    return CharTokenizer.train(SAMPLE)


# ---------------------------------------------------------------------------------------------------
# CharTokenizer
# ---------------------------------------------------------------------------------------------------


def test_char_vocabulary_is_the_sorted_set_of_characters() -> None:
    tokenizer = CharTokenizer.train("hello world")
    assert tokenizer.chars == [" ", "d", "e", "h", "l", "o", "r", "w"]
    assert tokenizer.vocab_size == 8
    assert tokenizer.encode("hello") == [3, 2, 4, 4, 5]
    assert tokenizer.token_to_id("w") == 7


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1))
def test_char_tokenizer_round_trips_its_training_text(text: str) -> None:
    tokenizer = CharTokenizer.train(text)
    ids = tokenizer.encode(text)
    assert len(ids) == len(text) and all(0 <= i < tokenizer.vocab_size for i in ids)
    assert tokenizer.decode(ids) == text


def test_char_tokenizer_rejects_unknown_character_with_message(char: CharTokenizer) -> None:
    with pytest.raises(ValueError) as error:
        char.encode("To be, or not to be? Zounds! ✓")
    message = str(error.value)
    assert "'?'" in message and "'Z'" in message and "'✓'" in message
    assert "'T'" not in message  # known characters are not listed
    assert "trained on different text" in message


def test_char_tokenizer_rejects_empty_training_text() -> None:
    with pytest.raises(ValueError, match="empty text"):
        CharTokenizer.train("")


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_decode_rejects_ids_outside_the_vocabulary(kind: str, char: CharTokenizer, bpe: BPETokenizer) -> None:
    tokenizer = {"char": char, "bpe": bpe}[kind]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.decode([0, tokenizer.vocab_size])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.decode([-1])


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_decode_accepts_a_tensor_of_ids(kind: str, char: CharTokenizer, bpe: BPETokenizer) -> None:
    tokenizer = {"char": char, "bpe": bpe}[kind]
    ids = tokenizer.encode("To be, or not to be")
    assert tokenizer.decode(torch.tensor(ids)) == "To be, or not to be"


# ---------------------------------------------------------------------------------------------------
# BPETokenizer
# ---------------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_bpe_round_trips_arbitrary_unicode(bpe: BPETokenizer, text: str) -> None:
    ids = bpe.encode(text)
    assert all(0 <= i < bpe.vocab_size for i in ids)
    assert bpe.decode(ids) == text


@pytest.mark.parametrize(
    "text", ["", " leading space", "trailing  \n\n", "\x00\t\r\n", "emoji 🎭 and 漢字 and é/é", "<eos><pad>"]
)
def test_bpe_round_trips_edge_cases(bpe: BPETokenizer, text: str) -> None:
    assert bpe.decode(bpe.encode(text)) == text


def test_bpe_learns_merges_that_compress_the_training_text(bpe: BPETokenizer) -> None:
    assert bpe.vocab_size == 330
    assert len(bpe.encode(SAMPLE)) < len(SAMPLE.encode("utf-8")) / 2  # bytes alone would give ratio 1


def test_bpe_vocabulary_stops_growing_when_the_text_has_nothing_left_to_merge() -> None:
    tokenizer = BPETokenizer.train("abab abab", vocab_size=1000)
    assert tokenizer.vocab_size < 300
    assert tokenizer.encode("abab abab") == [tokenizer.token_to_id("abab"), tokenizer.token_to_id("Ġabab")]


def test_bpe_training_is_deterministic() -> None:
    first = BPETokenizer.train(SAMPLE, vocab_size=350)
    again = BPETokenizer.train(SAMPLE, vocab_size=350)
    assert first.tokenizer.to_str() == again.tokenizer.to_str()


def test_bpe_special_tokens_take_the_first_ids_and_are_matched_whole(bpe: BPETokenizer) -> None:
    assert [bpe.token_to_id(token) for token in SPECIALS] == [0, 1, 2]
    assert bpe.encode("<bos>") == [1]
    ids = bpe.encode("<bos>To be<eos>")
    assert ids[0] == 1 and ids[-1] == 2
    assert bpe.decode(ids) == "<bos>To be<eos>"


def test_bpe_token_to_id_raises_key_error_for_unknown_token(bpe: BPETokenizer) -> None:
    with pytest.raises(KeyError, match="<unk>"):
        bpe.token_to_id("<unk>")


@pytest.mark.parametrize(("vocab_size", "specials"), [(256, []), (200, []), (259, SPECIALS)])
def test_bpe_rejects_vocab_size_not_above_bytes_plus_specials(vocab_size: int, specials: list[str]) -> None:
    with pytest.raises(ValueError, match=f"vocab_size must exceed 256 byte tokens \\+ {len(specials)} special"):
        BPETokenizer.train(SAMPLE, vocab_size, specials)


def test_bpe_accepts_the_smallest_valid_vocab_size() -> None:
    tokenizer = BPETokenizer.train(SAMPLE, vocab_size=260, special_tokens=SPECIALS)
    assert tokenizer.vocab_size == 260


@pytest.mark.parametrize("specials", [["<eos>", "<eos>"], [""]])
def test_bpe_rejects_duplicate_or_empty_special_tokens(specials: list[str]) -> None:
    with pytest.raises(ValueError, match="Special tokens must be"):
        BPETokenizer.train(SAMPLE, 400, specials)


# ---------------------------------------------------------------------------------------------------
# Saving, loading, choosing a kind
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_saved_tokenizer_loads_identically(kind: str, char: CharTokenizer, bpe: BPETokenizer, tmp_path: Path) -> None:
    tokenizer: Tokenizer = {"char": char, "bpe": bpe}[kind]
    tokenizer.save(tmp_path / "tok")
    loaded = load_tokenizer(tmp_path / "tok")
    assert type(loaded) is type(tokenizer)
    assert loaded.vocab_size == tokenizer.vocab_size
    text = SAMPLE[:300] + ("<eos>" if kind == "bpe" else "")
    assert loaded.encode(text) == tokenizer.encode(text)
    assert loaded.decode(tokenizer.encode(text)) == text
    if kind == "bpe":
        assert loaded.special_tokens == SPECIALS
        assert [loaded.token_to_id(token) for token in SPECIALS] == [0, 1, 2]


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_saved_tokenizer_is_plain_json_with_its_kind(
    kind: str, char: CharTokenizer, bpe: BPETokenizer, tmp_path: Path
) -> None:
    {"char": char, "bpe": bpe}[kind].save(tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["kqv_tokenizer.json", "tokenizer.json"]
    assert json.loads((tmp_path / "kqv_tokenizer.json").read_text())["kind"] == kind
    json.loads((tmp_path / "tokenizer.json").read_text())  # raises if it is not JSON


def test_load_tokenizer_without_metadata_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="kqv_tokenizer.json is missing"):
        load_tokenizer(tmp_path)


def test_load_tokenizer_rejects_unknown_kind(char: CharTokenizer, tmp_path: Path) -> None:
    char.save(tmp_path)
    (tmp_path / "kqv_tokenizer.json").write_text(json.dumps({"kind": "sentencepiece"}))
    with pytest.raises(ValueError, match="unknown tokenizer kind 'sentencepiece'"):
        load_tokenizer(tmp_path)


def test_make_tokenizer_builds_the_requested_kind() -> None:
    assert isinstance(make_tokenizer("char", SAMPLE, None), CharTokenizer)
    bpe = make_tokenizer("bpe", SAMPLE, 300)
    assert isinstance(bpe, BPETokenizer) and bpe.vocab_size == 300


def test_make_tokenizer_unknown_kind_lists_the_options() -> None:
    with pytest.raises(ValueError, match=r"Unknown tokenizer kind 'word'; choose one of \['bpe', 'char'\]"):
        make_tokenizer("word", SAMPLE, 300)


def test_make_tokenizer_bpe_requires_vocab_size() -> None:
    with pytest.raises(ValueError, match="needs a vocab_size"):
        make_tokenizer("bpe", SAMPLE, None)
