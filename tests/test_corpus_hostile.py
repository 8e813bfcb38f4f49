"""What a hostile user tried around prepared corpora and `kqv prepare`, each planted here: a run records its corpus's
absolute place and its tokens' SHA-256 and refuses, in one line, to resume or evaluate on any other corpus (one
prepared again from other text, a relative path read from another directory), takes the same corpus where it
moved, and refuses a tokenizer option the corpus would ignore; `kqv prepare` notices a text changed in place,
recovers a kill before its manifest, and refuses hostile options in one line with nothing written. Runs from before
the SHA-256 was recorded still load."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import shutil
from pathlib import Path

import pytest
import tomli_w

from kqv.cli.main import main
from kqv.data.token_corpus import ARRAY, MANIFEST
from kqv.errors import DiskFullError
from kqv.jobs import lm_prepared
from kqv.jobs.lm_prepared import PARTIAL, STATE, prepare
from kqv.train.runs import read_run
from test_damaged_runs import from_before_checksums
from test_finetune_fuzz import snapshot
from test_token_corpus import tiny_config, write_text


def kqv(argv: list[str]) -> tuple[int, str, str]:
    """The command line in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


def refused(argv: list[str], *words: str) -> str:
    """The one `kqv: error:` line `argv` ends with, holding `words`."""
    status, _, error = kqv(argv)
    assert status == 2 and error.startswith("kqv: error: ") and error.count("\n") == 1, error
    assert "Traceback" not in error and all(word in error for word in words), error
    return error


def evaluated(*argv: str) -> dict:
    status, out, error = kqv(["eval", *argv, "--json"])
    assert status == 0, error
    return json.loads(out.splitlines()[-1])


@pytest.fixture
def prepared(tmp_path, monkeypatch):
    """In tmp_path (the current directory): a text and the corpus `pc` prepared from it."""
    monkeypatch.chdir(tmp_path)
    write_text(tmp_path / "play.txt")
    prepare("play.txt", "pc", vocab_size=300, progress=False)
    return tmp_path


@pytest.fixture
def trained(prepared):
    """`prepared`, and a tiny run trained on it with the relative `--data pc`."""
    argv = ["train", "lm", "--config", tiny_config(prepared), "--data", "pc", "--out", "run", "--quiet"]
    status, _, error = kqv(argv)
    assert status == 0, error
    return prepared


def test_a_run_records_its_corpus_absolute_with_its_sha256_and_scores_that_one_from_anywhere(trained, monkeypatch):
    data, manifest = read_run(trained / "run")["data"], json.loads((trained / "pc" / MANIFEST).read_text())
    assert data["path"] == str(trained / "pc") and data["tokens_sha256"] == manifest["sha256"]
    assert (data["tokenizer"], data["vocab_size"]) == ("bpe", manifest["vocab_size"])  # the corpus's, not the config's
    here = evaluated("run")
    elsewhere = trained / "elsewhere"  # another directory holding another `pc`
    write_text((elsewhere / "t").mkdir(parents=True) or elsewhere / "t" / "play.txt", shift=3)
    prepare(elsewhere / "t", elsewhere / "pc", vocab_size=300, progress=False)
    monkeypatch.chdir(elsewhere)
    assert evaluated("../run") == here


def test_a_corpus_prepared_again_from_other_text_is_refused_by_resume_and_eval_with_nothing_written(trained):
    shutil.rmtree(trained / "pc")
    write_text(trained / "play.txt", shift=5)  # other text, the same tokenizer settings
    prepare("play.txt", "pc", vocab_size=300, progress=False)
    before = snapshot(trained / "run")
    refused(["eval", "run"], "pc is not the corpus run trained on", "SHA-256")
    refused(["train", "lm", "--out", "run", "--resume", "--steps", "8", "--quiet"], "is not the corpus run trained on")
    config = ["--config", tiny_config(trained), "--data", "pc"]
    refused(["train", "lm", *config, "--out", "run", "--resume", "--steps", "8", "--quiet"], "is not the corpus")
    assert snapshot(trained / "run") == before


def test_a_moved_corpus_is_named_with_the_way_to_point_at_it_and_given_so_it_resumes_and_scores(trained):
    here = evaluated("run")
    (trained / "pc").rename(trained / "moved")
    error = refused(["eval", "run"], "is not at", "moved or removed", "kqv eval run --data DIR", "--resume --data DIR")
    assert (
        "tokens.safetensors" not in error and "--overwrite" not in error
    )  # no blame of the run, no advice to delete it
    refused(["train", "lm", "--out", "run", "--resume", "--steps", "8", "--quiet"], "moved or removed")
    assert evaluated("run", "--data", "moved") == here
    status, _, error = kqv(["train", "lm", "--out", "run", "--resume", "--steps", "8", "--data", "moved", "--quiet"])
    assert status == 0, error
    assert read_run(trained / "run")["data"]["path"] == str(trained / "moved")
    assert json.loads((trained / "run" / "summary.json").read_text())["steps"] == 8
    write_text(trained / "other.txt", shift=2)  # a corpus of the same tokenizer settings, from other text
    prepare("other.txt", "other", vocab_size=300, progress=False)
    refused(["eval", "run", "--data", "other"], "is not the corpus run trained on")
    refused(["train", "lm", "--out", "run", "--resume", "--steps", "9", "--data", "other"], "is not the corpus")


@pytest.mark.parametrize("setting", ['data.tokenizer="char"', "data.vocab_size=500"])
def test_a_tokenizer_option_for_a_prepared_corpus_is_refused_not_recorded(prepared, setting):
    argv = ["train", "lm", "--config", tiny_config(prepared), "--data", "pc", "--out", "new", "--set", setting]
    refused(argv, setting.split("=")[0], "prepared corpus", "kqv prepare TEXT")
    assert not (prepared / "new").exists()


def test_a_run_from_before_the_sha256_was_recorded_still_loads_scores_and_resumes(trained):
    here = evaluated("run")
    values = read_run(trained / "run")
    del values["data"]["tokens_sha256"]
    values["data"]["path"] = "pc"  # as such runs recorded it: relative, no digest, no checksums
    (trained / "run" / "run.toml").write_text(tomli_w.dumps(values))
    from_before_checksums(trained / "run")
    assert evaluated("run") == here
    status, _, error = kqv(["train", "lm", "--out", "run", "--resume", "--steps", "8", "--quiet"])
    assert status == 0, error
    assert (
        read_run(trained / "run")["data"]["path"] == "pc" and "tokens_sha256" not in read_run(trained / "run")["data"]
    )
    resumed = evaluated("run")
    (trained / "pc").rename(trained / "moved")  # gone: said so, with the way to give it, not blamed on the run
    error = refused(["eval", "run"], "keeps no copy of the prepared corpus", "kqv eval run --data DIR")
    assert "tokens.safetensors" not in error and "--overwrite" not in error
    assert evaluated("run", "--data", "moved") == resumed
    prepare("play.txt", "pc", tokenizer="char", progress=False)  # another tokenizer: still told apart
    refused(["eval", "run"], "another tokenizer")


def test_prepare_notices_a_text_changed_in_place_at_the_same_size(tmp_path):
    text = write_text(tmp_path / "play.txt")
    argv = ["prepare", str(text), "--out", str(tmp_path / "pc"), "--vocab-size", "300", "--quiet"]
    assert kqv(argv)[0] == 0
    before = snapshot(tmp_path / "pc")
    text.write_bytes(text.read_bytes().replace(b"ROMEO", b"ROMEX"))  # the same size, other text
    refused(argv, "prepared from other text", "a source changed")
    assert snapshot(tmp_path / "pc") == before


def test_a_prepare_killed_between_the_array_s_rename_and_the_manifest_finishes_when_run_again(tmp_path, monkeypatch):
    text = write_text(tmp_path / "play.txt")
    prepare(text, tmp_path / "whole", vocab_size=300, progress=False)
    write = lm_prepared.write_text

    def killed_at_the_manifest(path, content):
        if path.name == MANIFEST:
            raise KeyboardInterrupt  # the process killed after tokens.bin's rename
        write(path, content)

    monkeypatch.setattr(lm_prepared, "write_text", killed_at_the_manifest)
    with pytest.raises(KeyboardInterrupt):
        prepare(text, tmp_path / "cut", vocab_size=300, progress=False)
    cut = tmp_path / "cut"
    assert (cut / ARRAY).is_file() and (cut / STATE).is_file() and not (cut / PARTIAL).exists()
    monkeypatch.setattr(lm_prepared, "write_text", write)
    status, out, error = kqv(["prepare", str(text), "--out", str(cut), "--vocab-size", "300", "--quiet"])
    assert status == 0 and "already" not in out, error
    assert (cut / ARRAY).read_bytes() == (tmp_path / "whole" / ARRAY).read_bytes()
    assert (cut / MANIFEST).read_text() == (tmp_path / "whole" / MANIFEST).read_text() and not (cut / STATE).exists()


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--sample-mb", "inf"], ("--sample-mb", "positive")),
        (["--sample-mb", "1e400"], ("--sample-mb", "positive")),  # inf once parsed
        (["--sample-mb", "nan"], ("--sample-mb", "positive")),
        (["--sample-mb", "1e-9"], ("--sample-mb", "0 bytes")),
        (["--vocab-size", "99999999999999999999"], ("--vocab-size", "up to 1,048,576")),
        (["--vocab-size", "2147483648"], ("--vocab-size", "up to 1,048,576")),  # once a 141 GB allocation, an abort
    ],
)
def test_prepare_refuses_hostile_options_in_one_line_with_nothing_written(tmp_path, flags, words):
    text = write_text(tmp_path / "play.txt", copies=2)
    refused(["prepare", str(text), "--out", str(tmp_path / "pc"), "--quiet", *flags], *words)
    assert not (tmp_path / "pc").exists()


def test_prepare_refuses_an_empty_path_which_would_encode_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_text(tmp_path / "play.txt", copies=2)
    refused(["prepare", "", "--out", "x", "--quiet"], "the text path is empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["play.txt"]


def test_a_training_refuses_a_vocabulary_too_large_to_allocate_with_no_run_left(tmp_path):
    text = write_text(tmp_path / "play.txt", copies=2)
    argv = ["train", "lm", "--config", tiny_config(tmp_path), "--data", str(text), "--out", str(tmp_path / "run")]
    refused([*argv, "--set", "data.vocab_size=99999999999999999999"], "data.vocab_size", "up to 1,048,576")
    assert not (tmp_path / "run").exists()


def test_prepare_with_an_exported_character_vocabulary_names_the_characters_it_lacks(tmp_path):
    from kqv.data.tokenizers import CharTokenizer
    from kqv.jobs.export import hf_tokenizer

    hf = tmp_path / "hf"  # what `kqv export` writes of a character run: a word-level vocabulary without [UNK]
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    hf_tokenizer(CharTokenizer.train("hello world\n")).save(str(hf / "tokenizer.json"))
    (tmp_path / "t.txt").write_text("hello Zürich\n")
    refused(
        ["prepare", str(tmp_path / "t.txt"), "--out", str(tmp_path / "pc"), "--tokenizer", str(hf), "--quiet"],
        "'Z', 'c'",
    )
    assert not (tmp_path / "pc").exists()


def test_a_prepared_corpus_in_a_mixture_is_refused_with_the_way_to_train_on_it(prepared):
    (prepared / "qa.tsv").write_text("Where?\tHere\n" * 20)
    argv = ["train", "lm", "--data", "pc", "--data", "qa.tsv", "--out", "mixed", "--quiet"]
    refused(argv, "pc is a prepared token corpus", "(--data pc)", "mix the text it was prepared from")
    assert not (prepared / "mixed").exists()


def test_a_full_disk_says_the_bytes_a_plot_needs_never_0_kb(tmp_path, monkeypatch):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from kqv.train.files import write_png

    figure = Figure()
    FigureCanvasAgg(figure)
    figure.add_subplot().plot([1, 2, 3])

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(DiskFullError) as error:
        write_png(tmp_path / "loss.png", figure)
    assert error.value.needed > 1000 and "0.0 kB" not in str(error.value) and "needed" in str(error.value)
    assert not list(tmp_path.iterdir())
    unknown = str(DiskFullError(tmp_path / "x", 0, 5 * 10**9))
    assert "needed" not in unknown and "5,000.0 MB free" in unknown
