"""What a hostile audit of prepared corpora, data options, `kqv world`, the tour and interrupts found, each planted
here: `kqv world` writes over nothing a user holds (only, with --overwrite, its own earlier world) and atomically;
no traceback where a number overflows or Ctrl-C comes at the first instant; each option that would be ignored is
refused in one line naming it; a run whose checksums were deleted says so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import kqv as kqv_api
from kqv.cli.main import main
from kqv.data.token_corpus import ARRAY
from kqv.errors import DataError, RunError
from kqv.jobs import lm_prepared
from kqv_lab import worlds
from test_corpus_hostile import kqv, prepared, refused, trained  # noqa: F401 -- a corpus and a run trained on it
from test_token_corpus import write_text


def contents(directory) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def test_kqv_world_writes_over_nothing_a_user_holds_and_replaces_only_its_own_world(tmp_path):
    (own := tmp_path / "w").mkdir()
    (own / "biographies.txt").write_text("MY OWN\n")
    (own / "questions-seen.tsv").write_text("q\ta\n")
    before = contents(own)
    refused(["world", "--people", "4", "--out", str(own)], "already exists and is not empty", "--overwrite")
    refused(["world", "--people", "4", "--out", str(own), "--overwrite"], "is not a world kqv wrote")
    assert contents(own) == before
    (tmp_path / "file").write_text("mine")
    refused(["world", "--people", "4", "--out", str(tmp_path / "file")], "not a directory")
    assert (tmp_path / "file").read_text() == "mine"

    world = tmp_path / "world"
    assert kqv(["world", "--people", "4", "--out", str(world)])[0] == 0
    first = contents(world)
    refused(["world", "--people", "6", "--out", str(world)], "already exists")  # a world is not replaced unasked
    assert contents(world) == first
    assert kqv(["world", "--people", "6", "--out", str(world), "--overwrite"])[0] == 0  # asked: replaced
    assert contents(world) != first and set(contents(world)) == set(worlds.WORLD_FILES)
    (world / "notes.txt").write_text("mine")  # a world the user added to is theirs
    refused(["world", "--people", "4", "--out", str(world), "--overwrite"], "is not a world kqv wrote")
    assert (world / "notes.txt").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    assert kqv(["world", "--people", "4", "--out", str(tmp_path / "empty")])[0] == 0  # an empty directory is new
    assert sorted(os.listdir(tmp_path)) == ["empty", "file", "w", "world"]  # no staging directory left


def test_kqv_world_never_writes_into_a_run_or_a_corpus(tmp_path):
    for kind, marker in (("run", "run.toml"), ("corpus", "manifest.json")):
        (directory := tmp_path / kind).mkdir()
        (directory / marker).write_text("kept")
        for extra in ([], ["--overwrite"]):
            refused(["world", "--people", "4", "--out", str(directory), *extra], str(directory))
        assert contents(directory) == {marker: b"kept"}


def test_a_killed_world_write_leaves_the_old_world_or_none_never_half(tmp_path, monkeypatch):
    world = tmp_path / "world"
    worlds.write_world(world, 4, 0)
    first = contents(world)
    written = []

    def dies_after_three(self, text, encoding=None):
        if len(written) == 3:
            raise KeyboardInterrupt
        written.append(self.name)
        return real(self, text, encoding=encoding)

    real = type(world).write_text
    monkeypatch.setattr(type(world), "write_text", dies_after_three)
    with pytest.raises(KeyboardInterrupt):
        worlds.write_world(world, 6, 1, overwrite=True)
    written.clear()
    with pytest.raises(KeyboardInterrupt):
        worlds.write_world(tmp_path / "new", 6, 1)
    monkeypatch.undo()
    assert contents(world) == first and not (tmp_path / "new").exists()
    assert sorted(os.listdir(tmp_path)) == ["world"]


def test_a_huge_sample_is_the_whole_text_not_an_overflow(tmp_path):
    write_text(tmp_path / "a.txt")
    status, out, error = kqv(["prepare", str(tmp_path / "a.txt"), "--out", str(tmp_path / "c"), "--sample-mb", "1e308",
                              "--vocab-size", "300", "--quiet"])  # fmt: skip
    assert status == 0 and "prepared" in out, error
    whole = lm_prepared.prepare(tmp_path / "a.txt", tmp_path / "d", vocab_size=300, progress=False)
    assert (tmp_path / "c" / ARRAY).read_bytes() == (tmp_path / "d" / ARRAY).read_bytes() and not whole.already


@pytest.mark.parametrize("tokenizer", ["char", "RUN"])
@pytest.mark.parametrize("given", [["--vocab-size", "100"], ["--sample-mb", "1"]])
def test_bpe_options_with_another_tokenizer_are_refused_not_ignored(tmp_path, tokenizer, given):
    write_text(tmp_path / "a.txt")
    if tokenizer == "RUN":
        lm_prepared.prepare(tmp_path / "a.txt", tmp_path / "base", tokenizer="char", progress=False)
        tokenizer = str(tmp_path / "base")
    argv = ["prepare", str(tmp_path / "a.txt"), "--out", str(tmp_path / "c"), "--tokenizer", tokenizer, "--quiet"]
    refused([*argv, *given], given[0], "drop", repr(tokenizer))
    assert not (tmp_path / "c").exists()
    assert kqv(argv)[0] == 0
    refused([*argv, *given], given[0], "drop")  # a re-prepare with it: refused, not "already prepared"


# The `kqv` command with a Ctrl-C sent to itself at the `MOMENT`-th function called once kqv's own code began
# (`kqv/__init__.py`): where Python acts on a signal (a call's start), there and then, wherever the import is.
EARLY = """
import os, signal, sys

MOMENT, calls = int(sys.argv[1]), [-1]

def trace(frame, event, arg):
    if frame.f_code.co_filename.endswith(os.path.join("kqv", "__init__.py")):
        calls[0] = 0  # kqv's first instant: its calls count from here
    elif calls[0] >= 0:
        calls[0] += 1
        if calls[0] > MOMENT:
            sys.settrace(None)
            os.kill(os.getpid(), signal.SIGINT)

sys.argv = [sys.argv[2], "generate", "nowhere"]  # "kqv": the command; any other name: a script importing kqv
sys.settrace(trace)
from kqv.cli import main
sys.exit(main())
"""


def test_ctrl_c_at_any_early_moment_ends_the_command_in_one_line_without_a_traceback():
    moments = [*range(40), 60, 100, 200, 400, 1000, 3000, 10000]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    said = {}
    for start in range(0, len(moments), 8):  # eight children at a time
        children = {
            moment: subprocess.Popen([sys.executable, "-c", EARLY, str(moment), "kqv"], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            for moment in moments[start : start + 8]
        }  # fmt: skip
        for moment, child in children.items():
            _, error = child.communicate(timeout=120)
            said[moment] = (child.returncode, error.strip())
    wrong = {moment: result for moment, result in said.items() if result != (130, "kqv: interrupted")}
    assert not wrong, wrong
    script = subprocess.run([sys.executable, "-c", EARLY, "20", "script.py"], env=env, capture_output=True, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    # (Ctrl-C at its default, as for the command above: a suite started in the background has SIGINT ignored)
    assert script.returncode != 130 and script.stderr.rstrip().endswith("KeyboardInterrupt")  # a script's own to catch


def test_eval_refuses_a_corpus_whose_tokens_changed_in_place(trained):  # noqa: F811
    evaluated = kqv(["eval", "run", "--json"])
    assert evaluated[0] == 0, evaluated[2]
    tokens = trained / "pc" / ARRAY
    ids = np.fromfile(tokens, dtype=np.uint16)
    ids[-5:] = (ids[-5:] + 1) % 300  # the held-out tail, other valid tokens: same size, manifest unchanged
    ids.tofile(tokens)
    refused(["eval", "run"], str(tokens), "SHA-256")
    with pytest.raises(DataError, match="SHA-256"):
        kqv_api.load(trained / "run").evaluate()


def test_a_fine_tune_refuses_a_tokenizer_option_it_would_ignore_and_an_empty_mixture_is_refused(tmp_path):
    from test_cli import TINY

    (tmp_path / "tiny.toml").write_text(TINY.format(position="learned"))
    (tmp_path / "t.txt").write_text("To be, or not to be, that is the question.\n" * 40)
    base = ["train", "lm", "--config", str(tmp_path / "tiny.toml"), "--quiet"]
    assert kqv([*base, "--data", str(tmp_path / "t.txt"), "--out", str(tmp_path / "r")])[0] == 0
    for setting in ("data.tokenizer=bpe", "data.vocab_size=300"):
        argv = ["train", "lm", "--init", str(tmp_path / "r"), "--data", str(tmp_path / "t.txt"), "--out",
                str(tmp_path / "ft"), "--set", setting, "--quiet"]  # fmt: skip
        refused(argv, setting.partition("=")[0], "fine-tune", "drop it")
    refused([*base, "--out", str(tmp_path / "m"), "--set", "data.sources=[]"], "data.sources is empty", "--data")
    assert sorted(os.listdir(tmp_path)) == ["r", "t.txt", "tiny.toml"]


def test_a_run_that_lost_its_checksums_says_so_until_it_is_sealed_again(tmp_path):
    from test_cli import TINY

    (tmp_path / "tiny.toml").write_text(TINY.format(position="learned"))
    (tmp_path / "t.txt").write_text("To be, or not to be, that is the question.\n" * 40)
    run = tmp_path / "r"
    assert kqv(["train", "lm", "--config", str(tmp_path / "tiny.toml"), "--data", str(tmp_path / "t.txt"), "--out",
                str(run), "--quiet"])[0] == 0  # fmt: skip
    here = kqv(["eval", str(run), "--json"])[1]
    (run / "SHA256SUMS").unlink()
    for argv in (["eval", str(run)], ["generate", str(run), "--prompt", "To", "--max-new-tokens", "2"],
                 ["train", "lm", "--out", str(run), "--resume", "--steps", "8", "--quiet"]):  # fmt: skip
        refused(argv, "SHA256SUMS is missing", "restore it from a backup", f"kqv reseal {run}")
    assert not (run / "SHA256SUMS").exists()  # the resume re-blessed nothing
    with pytest.raises(RunError, match=r"kqv.api.reseal\("):
        kqv_api.load(run)
    status, out, _ = kqv(["reseal", str(run)])
    assert status == 0 and "SHA256SUMS records" in out
    assert kqv(["eval", str(run), "--json"])[1] == here  # sealed again: the run's files, checked as they are now
    (run / "tokens.safetensors").write_bytes(b"damaged")  # and checked from now on
    refused(["eval", str(run)], "tokens.safetensors", "corrupt")


def test_a_corpus_without_its_manifest_is_named_as_such(trained):  # noqa: F811
    (trained / "pc" / "manifest.json").unlink()
    for argv in (["eval", "run"], ["train", "lm", "--data", "pc", "--out", "new", "--quiet"]):
        refused(argv, "pc holds a prepared corpus's tokens.bin but no manifest.json", "kqv prepare TEXT --out")


def test_eval_of_a_pairs_run_on_a_corpus_blames_no_option_the_user_never_set(tmp_path):
    from test_cli import TINY

    (tmp_path / "tiny.toml").write_text(TINY.format(position="learned"))
    (tmp_path / "qa.tsv").write_text("".join(f"Q{k} is\t A{k % 7}\n" for k in range(60)))
    run = tmp_path / "pairs"
    weighted = ["--set", "data.packing=true", "--set", "data.prompt_loss_weight=0.1"]  # the run's, not the eval's
    assert kqv(["train", "lm", "--config", str(tmp_path / "tiny.toml"), "--data", str(tmp_path / "qa.tsv"), "--out",
                str(run), *weighted, "--quiet"])[0] == 0  # fmt: skip
    (tmp_path / "other.txt").write_text("To be, or not to be, that is the question.\n" * 20)
    lm_prepared.prepare(tmp_path / "other.txt", tmp_path / "other", tokenizer="char", progress=False)
    error = refused(["eval", str(run), "--data", str(tmp_path / "other")], "another tokenizer", "--tokenizer")
    assert "prompt_loss_weight" not in error and "packing" not in error
    (tmp_path / "own.txt").write_text("".join(f"Q{k} is A{k % 7}\n" for k in range(40)))
    lm_prepared.prepare(tmp_path / "own.txt", tmp_path / "own", tokenizer=str(run), progress=False)
    status, out, error = kqv(["eval", str(run), "--data", str(tmp_path / "own")])  # its own tokenizer's: scored
    assert status == 0 and "held-out tail of the prepared corpus" in out, error


def test_a_wrong_value_of_an_option_of_several_kinds_names_the_values_it_takes(tmp_path):
    refused(["train", "lm", "--out", str(tmp_path / "r"), "--set", "data.packing=yes"],
            'data.packing must be true, false or "auto", got str \'yes\'')  # fmt: skip


def test_a_mixture_source_with_too_few_pairs_is_named(tmp_path):
    (tmp_path / "t.txt").write_text("To be, or not to be, that is the question.\n" * 40)
    (tmp_path / "one.tsv").write_text("To be\tor not\n")
    refused(["train", "lm", "--data", str(tmp_path / "t.txt"), "--data", str(tmp_path / "one.tsv"), "--out",
             str(tmp_path / "r")], f"{tmp_path / 'one.tsv'} has 1 pair: too few")  # fmt: skip
    (tmp_path / "one.txt").write_text("To be, or not to be\n")
    refused(["train", "lm", "--data", str(tmp_path / "t.txt"), "--data", str(tmp_path / "one.txt"), "--out",
             str(tmp_path / "r")], f"{tmp_path / 'one.txt'} has 1 document")  # fmt: skip


@pytest.mark.parametrize("command", [["train", "lm"], ["eval"]])
def test_the_help_of_data_names_a_prepared_corpus(command, capsys):
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    assert "prepared corpus directory" in " ".join(capsys.readouterr().out.split())


def test_a_progress_line_leaves_the_batch_pipeline_s_times_to_metrics_jsonl():
    from kqv.train.metrics import progress_line

    record = {"train_loss": 4.02864, "batch_ms": 0.62, "wait_ms": 0.068, "aux_loss": 0.5, "elapsed_s": 60.0}
    line = progress_line(10, 100, record, 30.0)
    assert "train 4.029" in line and "aux_loss 0.5" in line  # the model's own figures stay
    assert "batch_ms" not in line and "wait_ms" not in line
