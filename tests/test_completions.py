"""Files of prompt -> completion pairs and the end of text that closes each completion (kqv.data.completions)."""

import json

import pytest

from kqv.data.completions import Example, check_examples, end_of_text, is_pairs_file, read_examples
from kqv.data.tokenizers import BPETokenizer, CharTokenizer
from kqv.errors import DataError


def test_tsv_and_jsonl_give_the_same_examples(tmp_path):
    pairs = [("Q: 2+2?\tA:", " 4"), ("capital of France?", " Paris")]
    tsv = tmp_path / "qa.tsv"
    tsv.write_text("".join(f"{p}\t{c}\n" for p, c in [(p.replace("\t", " "), c) for p, c in pairs]) + "\n")
    jsonl = tmp_path / "qa.jsonl"
    jsonl.write_text("".join(json.dumps({"prompt": p.replace("\t", " "), "completion": c}) + "\n" for p, c in pairs))
    assert (
        read_examples(tsv)
        == read_examples(jsonl)
        == [Example("Q: 2+2? A:", " 4"), Example("capital of France?", " Paris")]
    )
    assert is_pairs_file(tsv) and is_pairs_file("x.JSONL") and not is_pairs_file("book.txt")


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.tsv", "no tab here\n", "a.tsv:1: expected prompt<TAB>completion"),
        ("a.tsv", "ok\tfine\nq\t\n", "a.tsv:2: expected prompt<TAB>completion"),
        ("a.tsv", "\n\n", "has no pairs"),
        ("a.jsonl", '{"prompt": "q"}\n', 'a.jsonl:1: expected {"prompt"'),
        ("a.jsonl", "{not json\n", "a.jsonl:1: not JSON"),
        ("a.txt", "q\ta\n", "is not a file of pairs"),
    ],
)
def test_malformed_files_are_refused_naming_the_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DataError, match=message.replace("{", r"\{").replace("(", r"\(")):
        read_examples(path)


def test_end_of_text_is_the_special_token_else_the_newline():
    bpe = BPETokenizer.train("some text to learn merges from\n" * 20, vocab_size=300, special_tokens=["<pad>", "<eos>"])
    assert end_of_text(bpe) == (bpe.token_to_id("<eos>"), "<eos>")
    char = CharTokenizer.train("ab\ncd")
    assert end_of_text(char) == (char.encode("\n")[0], "\n")
    with pytest.raises(DataError, match="no end-of-text token and no newline"):
        end_of_text(CharTokenizer.train("abcd"))


def test_a_completion_holding_the_end_of_text_is_refused():
    char = CharTokenizer.train("ab\ncd")
    check_examples([Example("a", "b")], char)
    with pytest.raises(DataError, match=r"1 completion\(s\) of the pairs contain the end-of-text '\\n' \(pairs 2\)"):
        check_examples([Example("a", "b"), Example("c", "d\nd")], char)
