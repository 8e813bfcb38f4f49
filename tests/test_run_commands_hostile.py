"""The commands on a run as a newcomer and a hostile user met them: `kqv eval` shows progress on a terminal while it
scores (and a Python call prints nothing), `--resume` of a finished run says so in one line instead of scoring and
sampling it again (more steps extend it), a misspelled `--set` key is answered with the closest one, and kinds of
questions print as themselves only when they would read as themselves."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

import kqv
from kqv.cli.main import main
from kqv.cli.runs import answers_by_kind
from kqv.jobs import lm_corpus
from kqv.train import perplexity as scoring
from kqv.train.trainer import Trainer
from test_cli import TINY, corpus, run  # noqa: F401 -- the shared tiny run
from test_finetune_fuzz import snapshot


class Terminal(io.StringIO):
    """Standard error as a terminal shows it."""

    def isatty(self) -> bool:
        return True


def command(argv: list[str], stderr: io.StringIO | None = None) -> tuple[int, str, str]:
    """The command line in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), stderr or io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


def test_kqv_eval_shows_a_scoring_bar_on_a_terminal_and_nowhere_else(run, monkeypatch):  # noqa: F811
    monkeypatch.setattr(scoring, "PROGRESS_DELAY_S", 0)  # as a scoring that takes a while shows it
    status, out, shown = command(["eval", str(run)], Terminal())
    assert status == 0 and "scoring" in shown and "tok" in shown and "perplexity" in out
    assert "scoring" not in command(["eval", str(run)])[2]  # not a terminal: no bar in a log
    (pairs := run.parent / "pairs.tsv").write_text("To be\tor not\nthat\tis\n")
    status, out, shown = command(["eval", str(run), "--data", str(pairs)], Terminal())  # greedy completions
    assert status == 0 and "scoring" in shown and "prompt" in shown and "exact match" in out, shown
    with contextlib.redirect_stderr(terminal := Terminal()):
        kqv.load(run).evaluate()  # a Python call returns its figures and prints nothing
    assert terminal.getvalue() == ""


def test_resuming_a_finished_run_says_so_in_one_line_without_scoring_it_again(tmp_path, corpus, monkeypatch):  # noqa: F811
    (tmp_path / "tiny.toml").write_text(TINY.format(position="learned"))
    argv = ["train", "lm", "--config", str(tmp_path / "tiny.toml"), "--data", str(corpus), "--out", str(tmp_path / "r")]
    assert main([*argv, "--quiet"]) == 0
    before, summary = snapshot(tmp_path / "r"), json.loads((tmp_path / "r" / "summary.json").read_text())

    def never(*args, **kwargs):
        raise AssertionError("a finished run was scored or sampled again")

    monkeypatch.setattr(lm_corpus, "perplexity", never)
    monkeypatch.setattr(lm_corpus, "sample_texts", never)
    status, out, error = command([*argv, "--resume"])
    assert status == 0 and out.count("\n") == 1, out + error
    assert "is finished (6 steps" in out and "--steps N above 6" in out
    assert snapshot(tmp_path / "r") == before
    assert kqv.train("lm", out=tmp_path / "r", resume=True, quiet=True) == summary  # its summary, as a new one's
    monkeypatch.undo()

    def interrupted(self):
        raise KeyboardInterrupt  # Ctrl-C once run.toml asks for 8 steps, before an update

    monkeypatch.setattr(Trainer, "train", interrupted)
    assert main([*argv, "--resume", "--steps", "8", "--quiet"]) == 130
    monkeypatch.undo()  # its own run.toml now asks for more than its summary's 6 steps: not finished, it trains on
    status, out, error = command(["train", "lm", "--out", str(tmp_path / "r"), "--resume", "--quiet"])
    assert status == 0 and "finished" not in out, out + error
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["steps"] == 8


@pytest.mark.parametrize(
    "setting, closest", [("train.stpes=3", "(did you mean 'steps'?)"), ("trian.steps=3", "(did you mean 'train'?)")]
)
def test_a_misspelled_set_key_is_answered_with_the_closest_one(tmp_path, setting, closest):
    status, _, error = command(["train", "lm", "--set", setting, "--out", str(tmp_path / "r")])
    assert status == 2 and error.count("\n") == 1 and closest in error, error
    assert not (tmp_path / "r").exists()
    status, _, error = command(["train", "lm", "--set", "train.zzzzqq=3", "--out", str(tmp_path / "r")])
    assert status == 2 and "did you mean" not in error  # nothing close: no guess


def test_kinds_of_questions_print_as_themselves_only_when_they_read_as_themselves():
    assert answers_by_kind({"": "Town1"}) == "'Town1'"  # a .tsv without kinds: its answer, not "(: 'Town1')"
    shown = answers_by_kind({"city": "Paris", "two\nlines": "x", "\u202eevil": "y", " padded ": "z"})
    assert shown == "city: 'Paris', 'two\\nlines': 'x', '\\u202eevil': 'y', ' padded ': 'z'"
    assert "\n" not in shown and "\u202e" not in shown
