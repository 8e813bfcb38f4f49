"""Defaults that fit the user's data: a fine-tune's context defaults to what its source holds (the shipped config's
128, or the source's positions if fewer), and the sample prompt to the start of the user's corpus ("ROMEO:\\n" on
the default Shakespeare). A value the user sets is kept, and refused in one line when it cannot work."""

from __future__ import annotations

import tomllib

import pytest
import torch

import kqv
from kqv.api import packaged_config
from kqv.cli.main import main
from kqv.data.tokenizers import BPETokenizer, CharTokenizer
from kqv.jobs.lm import JOB
from kqv.jobs.sampling import default_prompt
from test_cli import TINY

SOURCE_TEXT = "To be, or not to be, that is the question.\n" * 60
NO_ROMEO = "the cat sat on a mat,\tand then it ran off.\nnow the dog sat there too.\n" * 60  # no R, O, M, E or :


def run_toml(run_dir) -> dict:
    return tomllib.loads((run_dir / "run.toml").read_text())


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Tiny LM runs with learned positions, context 16: one whose max_len is 16, one whose max_len is 256."""
    root = tmp_path_factory.mktemp("sources")
    (root / "source.txt").write_text(SOURCE_TEXT)
    (root / "tiny.toml").write_text(TINY.format(position="learned"))
    runs = {}
    for max_len in (16, 256):
        runs[max_len] = root / f"max_len-{max_len}"
        overrides = [f"data.path={root / 'source.txt'}", f"model.max_len={max_len}"]
        kqv.train("lm", root / "tiny.toml", out=runs[max_len], overrides=overrides, steps=2, quiet=True)
        assert run_toml(runs[max_len])["model"]["max_len"] == max_len
    return runs


def finetune_argv(source, tmp_path, *flags: str) -> list[str]:
    text = tmp_path / "new.txt"
    text.write_text("that is the question, to be or not.\n" * 60)  # the source's characters only
    argv = ["train", "lm", "--init", str(source), "--data", str(text), "--out", str(tmp_path / "ft"), "--steps", "1"]
    small = ["--set", "train.batch_size=4", "--set", "sample.count=1", "--set", "sample.max_new_tokens=4"]
    return [*argv, "--quiet", *small, *flags]


@pytest.mark.parametrize("max_len, context", [(16, 16), (256, 128)])
def test_a_finetunes_context_defaults_to_what_its_source_holds(sources, tmp_path, max_len, context):
    """The shipped fine-tune config gives no context: 128, or the source's positions if fewer (this was refused:
    "data.context (128) is longer than the source's 16 learned positions")."""
    assert main(finetune_argv(sources[max_len], tmp_path)) == 0
    assert run_toml(tmp_path / "ft")["data"]["context"] == context
    assert kqv.load(tmp_path / "ft").config.data.context == context
    summary = kqv.train("lm", out=tmp_path / "ft", resume=True, steps=2, quiet=True)  # run.toml's context stays
    assert summary["steps"] == 2


def test_a_context_the_user_sets_beyond_the_source_is_refused_in_one_line(sources, tmp_path, capsys):
    assert main(finetune_argv(sources[16], tmp_path, "--set", "data.context=64")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "data.context (64) is longer than the source's 16 learned positions; set data.context to at most 16" in err
    assert not (tmp_path / "ft").exists()
    assert main(finetune_argv(sources[256], tmp_path, "--set", "data.context=32")) == 0  # one that fits is kept
    assert run_toml(tmp_path / "ft")["data"]["context"] == 32


def test_the_default_sample_prompt_is_the_start_of_the_users_corpus(tmp_path, capsys):
    """`kqv train lm --data my.txt` (the quick config) on a text without the characters of "ROMEO:" trains and
    samples from the text's first words (this was refused: "sample.prompt 'ROMEO:\\n' cannot be encoded")."""
    (tmp_path / "my.txt").write_text(NO_ROMEO)
    argv = ["train", "lm", "--data", str(tmp_path / "my.txt"), "--out", str(tmp_path / "r"), "--steps", "1"]
    small = ["--set", "train.batch_size=2", "--set", "sample.count=1", "--set", "sample.max_new_tokens=4"]
    assert main([*argv, "--quiet", *small]) == 0
    assert run_toml(tmp_path / "r")["sample"]["prompt"] == "the cat sat"
    assert (tmp_path / "r" / "samples.txt").read_text().startswith("the cat sat")


def test_a_prompt_the_user_sets_is_still_refused_when_the_corpus_cannot_encode_it(tmp_path, capsys):
    (tmp_path / "my.txt").write_text(NO_ROMEO)
    argv = ["train", "lm", "--data", str(tmp_path / "my.txt"), "--out", str(tmp_path / "r"), "--steps", "1"]
    assert main([*argv, "--quiet", "--set", 'sample.prompt="ROMEO:\\n"']) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sample.prompt 'ROMEO:\\n' cannot be encoded by this run's tokenizer" in err
    assert not (tmp_path / "r").exists()


def test_the_main_jobs_config_still_samples_from_romeo_on_shakespeare():
    """The README's main job (quick config, no --data) keeps "ROMEO:\\n"; so do the best and fine-tune configs."""
    tokenizer = CharTokenizer.train("ROMEO:\nabc")
    train = torch.tensor(tokenizer.encode("abc\nROMEO:\n"))
    for name in ("quick", "best", "finetune"):
        config = JOB.load_config(packaged_config(name))
        assert config.sample.prompt == "" and config.data.path is None
        assert default_prompt(config.data.path, tokenizer, train) == "ROMEO:\n"


@pytest.mark.parametrize(
    "text, prompt",
    [
        ("\n\n  Once upon a time there was\n", "Once upon a"),  # blank lines and indentation skipped
        ("Title\nthe rest of it\n", "Title"),  # the first line's words only
        ("one\ttwo three four", "one\ttwo three"),  # as the text writes them
        ("x" * 100 + " y", "x" * 40),  # at most 40 characters
        ("über straße größe maß\n", "über straße größe"),
    ],
)
def test_the_default_prompt_is_the_first_words_of_the_text_as_it_writes_them(text, prompt):
    char = CharTokenizer.train(text)
    assert default_prompt("my.txt", char, torch.tensor(char.encode(text))) == prompt
    bpe = BPETokenizer.train(text * 20, vocab_size=300)
    assert default_prompt("my.txt", bpe, torch.tensor(bpe.encode(text * 20))) == prompt
