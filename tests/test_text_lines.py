"""Every text file kqv reads line by line splits at newlines alone: a U+2028, form feed or lone carriage return
inside a prompt, a classification text or a sentence stays where it is (`str.splitlines` broke the line in two,
shifting every line after it), and bytes that are not UTF-8 are one DataError naming the line."""

from pathlib import Path

import pytest

from kqv.data.lines import text_lines
from kqv.data.pairs import read_texts, text_files
from kqv.data.tsv import read_tsv
from kqv.errors import DataError
from kqv.jobs.answer_files import read_prompts
from kqv.train.files import write_files

INSIDE = ["a\u2028b", "c\x0cd", "e\rf", "g\x85h"]  # each splits a line for str.splitlines


def test_lines_split_at_newlines_alone_and_a_leading_bom_is_skipped():
    data = ("\ufeff" + "\n".join(INSIDE) + "\r\nlast\n").encode()
    assert text_lines(data, "f.txt") == [*INSIDE, "last"]


def test_prompts_keep_their_unusual_characters(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_bytes(("\n".join(INSIDE) + "\n").encode())
    assert read_prompts(path) == INSIDE, "line i of the output completes line i of the prompts"


def test_classification_lines_keep_their_unusual_characters(tmp_path):
    path = tmp_path / "data.tsv"
    path.write_bytes("".join(f"{text}\tlabel{k}\n" for k, text in enumerate(INSIDE)).encode())
    assert read_tsv(path) == [(text, f"label{k}") for k, text in enumerate(INSIDE)]


def test_translation_texts_read_back_as_written(tmp_path):
    texts = {"dev": (INSIDE, ["1", "2", "3", "4"]), "test": (["x\u2028y"], ["z"])}
    write_files(tmp_path, text_files(texts))
    assert read_texts(tmp_path) == texts


@pytest.mark.parametrize("reader", [read_prompts, read_tsv])
def test_bytes_that_are_not_utf8_are_one_error_naming_the_line(tmp_path, reader):
    path = tmp_path / "bad.tsv"
    path.write_bytes(b"fine\tok\nbad \xff\tno\n")
    with pytest.raises(DataError, match=r"bad.tsv:2: not UTF-8 .* at byte 12"):
        reader(Path(path))
