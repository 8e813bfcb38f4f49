"""What a careful user found (issue 25): inputs that gave a Python traceback, each now one `kqv: error: ...` line
and exit status 2 that says what was wrong and what to do; the operations raise the same KqvErrors in Python."""

import codecs
import errno
import json
import math
import os
from pathlib import Path

import pytest
import torch

from kqv.errors import ConfigError, DataError, RunError
from kqv.jobs import load_run
from kqv.jobs.lm import load_run_config
from kqv.train.runs import read_run
from kqv.train.topology import Topology
from test_cli import TINY
from test_cli_fuzz import kqv


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Tiny trained runs: `learned` (char tokenizer, learned positions), `rope` and `bpe` (byte-level BPE, rope)."""
    root = tmp_path_factory.mktemp("inputs")
    corpus = root / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 40)
    configs = {
        "learned": TINY.format(position="learned"),
        "rope": TINY.format(position="rope"),
        "bpe": TINY.format(position="rope").replace('tokenizer = "char"', 'tokenizer = "bpe"\nvocab_size = 270'),
    }
    made = {"root": root, "corpus": corpus}
    for name, text in configs.items():
        (root / f"{name}.toml").write_text(text)
        made[name] = root / name
        argv = ["train", "lm", "--config", str(root / f"{name}.toml"), "--data", str(corpus), "--out", str(root / name)]
        assert kqv([*argv, "--quiet"]) == (0, "")
    return made


def refused(argv: list[str], *words: str) -> str:
    """Run `kqv argv`: it must end with one `kqv: error:` line (exit 2) that contains every one of `words`."""
    status, stderr = kqv(argv)
    assert status == 2 and stderr.startswith("kqv: error: ") and stderr.count("\n") == 1, stderr
    assert all(word in stderr for word in words), stderr
    return stderr


# -- config files ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "encoding, bom, named",
    [("utf-16-le", codecs.BOM_UTF16_LE, "UTF-16"), ("utf-16-be", codecs.BOM_UTF16_BE, "UTF-16"),
     ("utf-32-le", codecs.BOM_UTF32_LE, "UTF-32"), ("latin-1", b"", "0xe9")],
)  # fmt: skip
def test_a_config_that_is_not_utf8_is_one_error_line(runs, tmp_path, encoding, bom, named):
    config = tmp_path / "config.toml"
    config.write_bytes(bom + ("# café\n" + TINY.format(position="rope")).encode(encoding))
    refused(["train", "lm", "--config", str(config), "--out", str(tmp_path / "run")], named, "UTF-8", str(config))
    assert not (tmp_path / "run").exists()


def test_a_utf8_byte_order_mark_is_accepted(runs, tmp_path):
    config = tmp_path / "config.toml"
    config.write_bytes(codecs.BOM_UTF8 + TINY.format(position="rope").encode())
    assert load_run_config(config) == load_run_config(runs["root"] / "rope.toml")


def test_a_run_toml_that_is_not_utf8_is_a_run_error(runs, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.toml").write_bytes(codecs.BOM_UTF16_LE + 'task = "lm"'.encode("utf-16-le"))
    with pytest.raises(RunError, match="UTF-16"):
        read_run(run)


# -- generate --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--temperature", "nan"], ["--temperature", "finite"]),
        (["--temperature", "inf"], ["--temperature", "finite"]),
        (["--temperature", "-1"], ["--temperature", "0 (greedy) or a number from 0.001 to 100"]),
        (["--seed", "99999999999999999999999"], ["--seed", "2**63 - 1"]),
        (["--seed", "9223372036854775808"], ["--seed", "2**63 - 1"]),
        (["--seed", "-1"], ["--seed", "from 0"]),
        (["--max-new-tokens", "1000000000"], ["--max-new-tokens", "100,000"]),
        (["--max-new-tokens", "0"], ["--max-new-tokens"]),
        (["--count", "0"], ["--count"]),
    ],
)
def test_generate_refuses_options_it_cannot_use(runs, flags, words):
    refused(["generate", str(runs["rope"]), "--prompt", "To", "--max-new-tokens", "3", *flags], *words)


def test_learned_positions_cap_max_new_tokens_at_what_the_model_can_use(runs):
    """A huge --max-new-tokens on learned positions is capped at max_len, as before, without allocating it."""
    (text,) = load_run(runs["learned"]).generate("To", max_new_tokens=1_000_000_000, temperature=0)
    assert len(text) == 2 + 15  # the prompt and max_len - 2 + 1 new characters (the last one needs no position)


def test_a_prompt_that_is_not_utf8_is_one_error_line_on_a_bpe_run(runs):
    prompt = b"To \xff\xfe".decode("utf-8", "surrogateescape")  # what Python makes of such bytes in argv
    refused(["generate", str(runs["bpe"]), "--prompt", prompt], "--prompt", "UTF-8", "0xff")


@pytest.mark.parametrize(
    "options, error",
    [
        ({"temperature": math.nan}, ConfigError),
        ({"temperature": math.inf}, ConfigError),
        ({"seed": 2**70}, ConfigError),
        ({"seed": 2**63}, ConfigError),
        ({"seed": -1}, ConfigError),
        ({"max_new_tokens": 10**9}, ConfigError),
        ({"count": 0}, ConfigError),
    ],
)
def test_python_callers_get_the_same_errors(runs, options, error):
    run = load_run(runs["bpe"])
    with pytest.raises(error) as raised:
        run.generate("To", **{"max_new_tokens": 3, **options})
    assert "--" not in str(raised.value)  # in a Python caller's words
    with pytest.raises(DataError, match="prompt is not UTF-8"):
        run.generate("To\udcff", max_new_tokens=3)


# -- attention and eval ----------------------------------------------------------------------------------------


def test_attention_on_a_long_text_is_bounded_with_a_message(runs, tmp_path):
    text = "To be, or not to be, that is the question.\n" * 70  # 3,010 characters
    out = tmp_path / "attention.png"
    refused(["attention", str(runs["rope"]), "--text", text, "--out", str(out)], "--max-tokens", "tokens")
    assert not out.exists()
    status, _ = kqv(["attention", str(runs["rope"]), "--text", text[:40], "--out", str(out)])
    assert status == 0 and out.exists()


@pytest.mark.parametrize("max_tokens", ["-1000", "0", "1"])
def test_eval_refuses_a_max_tokens_below_two(runs, max_tokens):
    refused(["eval", str(runs["rope"]), "--max-tokens", max_tokens], "--max-tokens", max_tokens)


# -- run directories and the file system -----------------------------------------------------------------------


def test_out_through_a_regular_file_is_one_error_line(runs, tmp_path):
    (tmp_path / "afile").write_text("")
    config = str(runs["root"] / "rope.toml")
    refused(["train", "lm", "--config", config, "--out", str(tmp_path / "afile" / "sub")], "Not a directory")


@pytest.mark.parametrize("how", ["set", "toml"])
@pytest.mark.parametrize("seed", [2**63, 2**70, -1])
def test_a_seed_torch_cannot_take_is_refused_before_anything_is_written(runs, tmp_path, how, seed):
    """Issue 35: train.seed >= 2**63 was a traceback from torch after run.toml, tokenizer/ and the data were written."""
    config, out = tmp_path / "config.toml", tmp_path / "run"
    text = TINY.format(position="rope")
    config.write_text(text.replace("[train]\n", f"[train]\nseed = {seed}\n") if how == "toml" else text)
    argv = ["train", "lm", "--config", str(config), "--data", str(runs["corpus"]), "--out", str(out), "--quiet"]
    refused([*argv, *(["--set", f"train.seed={seed}"] if how == "set" else [])], "seed", str(seed), "2**63 - 1")
    assert not out.exists()


def test_resuming_a_run_whose_seed_torch_cannot_take_is_refused_and_changes_nothing(runs, tmp_path):
    """What today's kqv left of such a run (run.toml, SHA256SUMS, tokenizer/, tokens.safetensors) stays as it is."""
    from kqv.train.layout import record

    run = copy_run(runs["rope"], tmp_path)
    (run / "run.toml").write_text((run / "run.toml").read_text().replace("seed = 0", f"seed = {2**63}"))
    record(run, keep=True)
    before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    argv = ["train", "lm", "--data", str(runs["corpus"]), "--out", str(run), "--resume", "--steps", "9", "--quiet"]
    refused(argv, "seed", str(2**63), "2**63 - 1")
    assert {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before


def test_the_largest_seed_trains(runs, tmp_path):
    """2**63 - 1 is allowed: the batch generators, seeded from it, wrap it into torch's range."""
    config = runs["root"] / "rope.toml"
    argv = ["train", "lm", "--config", str(config), "--data", str(runs["corpus"]), "--out", str(tmp_path / "run")]
    assert kqv([*argv, "--quiet", "--steps", "2", "--set", f"train.seed={2**63 - 1}"]) == (0, "")
    assert read_run(tmp_path / "run")["train"]["seed"] == 2**63 - 1


@pytest.mark.parametrize("out", ["/", "", ".", ".."])
@pytest.mark.parametrize("mode", [[], ["--resume"], ["--overwrite"]])
def test_an_out_that_names_no_directory_is_one_error_line(runs, tmp_path, monkeypatch, out, mode):
    """Issue 35: `--out /` (or "", ".") was `ValueError: PosixPath('/') has an empty name`; nothing is written."""
    monkeypatch.chdir(tmp_path)
    config = str(runs["root"] / "rope.toml")
    argv = ["train", "lm", "--config", config, "--data", str(runs["corpus"]), "--out", out, "--quiet", *mode]
    refused(argv, "--out", "name a directory", repr(out) if out else "an empty path")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("out", ["/", "", "."])
def test_a_trainer_given_a_run_directory_without_a_name_refuses_it(tmp_path, monkeypatch, out):
    from kqv.train.rundir import RunDirectory

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="the run directory must name a directory of its own"):
        with RunDirectory.open(out, topology=Topology()):
            pass
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("setting", ["model.nonexistent=3", "train.nonexistent=1", "data.nonexistent=1"])
def test_an_unknown_option_on_resume_is_called_unknown(runs, tmp_path, setting):
    """Issue 35: it said "cannot change model.nonexistent (None -> 3)", as if the option existed."""
    run = copy_run(runs["rope"], tmp_path)
    argv = ["train", "lm", "--data", str(runs["corpus"]), "--out", str(run), "--resume", "--set", setting]
    error = refused(argv, "unknown", "nonexistent")
    assert "cannot change" not in error


@pytest.mark.parametrize("flags", [["--steps", "2"], ["--config", "{config}"]])
def test_a_refused_resume_leaves_the_lock_file_as_it_was(runs, tmp_path, flags):
    """Issue 35: every refused `--resume` rewrote .lock; now it keeps its bytes and modification time."""
    run = copy_run(runs["rope"], tmp_path)
    lock = run / ".lock"
    os.utime(lock, ns=(1_000_000_000, 1_000_000_000))
    before = lock.read_bytes(), lock.stat().st_mtime_ns
    other = tmp_path / "other.toml"
    other.write_text(TINY.format(position="learned"))
    argv = ["train", "lm", "--data", str(runs["corpus"]), "--out", str(run), "--resume", "--quiet"]
    refused([*argv, *(f.format(config=other) for f in flags)], str(run))
    assert (lock.read_bytes(), lock.stat().st_mtime_ns) == before


def test_explore_html_onto_a_directory_is_one_error_line(runs, tmp_path):
    refused(["explore", str(runs["rope"]), "--html", str(tmp_path), "--text", "To be"], "--html", "directory")


def test_explore_html_with_text_that_is_not_utf8_is_one_error_line(runs, tmp_path):
    text = b"\xffTo".decode("utf-8", "surrogateescape")
    refused(["explore", str(runs["bpe"]), "--html", str(tmp_path / "x.html"), "--text", text], "UTF-8")


def copy_run(source: Path, tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(source, tmp_path / "run")
    return tmp_path / "run"


def test_a_read_only_run_directory_is_read_and_not_trained(runs, tmp_path, monkeypatch):
    """Every write under the run refused as a read-only directory would (the tests may run as root, whom chmod
    does not stop): generate works; train --resume is one error line that says what to check."""
    run = copy_run(runs["rope"], tmp_path)
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):  # the writer's lock is the first file a training opens to write
        inside = "dir_fd" not in kwargs and os.path.abspath(path).startswith(str(run))
        if inside and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    assert kqv(["generate", str(run), "--prompt", "To", "--max-new-tokens", "3"])[0] == 0
    config = str(runs["root"] / "rope.toml")
    argv = ["train", "lm", "--config", config, "--data", str(runs["corpus"]), "--out", str(run), "--resume"]
    refused([*argv, "--steps", "8"], "Permission denied", "permissions")


def test_a_full_disk_while_checkpointing_is_one_error_line_and_keeps_the_checkpoint(runs, tmp_path, monkeypatch):
    run = copy_run(runs["rope"], tmp_path)
    state = (run / "checkpoint" / "state.json").read_bytes()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(run / "checkpoint"))

    monkeypatch.setattr(torch, "save", full)
    config = str(runs["root"] / "rope.toml")
    argv = ["train", "lm", "--config", config, "--data", str(runs["corpus"]), "--out", str(run), "--resume"]
    refused([*argv, "--quiet", "--steps", "9"], "the disk is full", "needed at", "free some space")
    assert (run / "checkpoint" / "state.json").read_bytes() == state
    assert json.loads(state)["step"] == 6 and not list(run.glob(".checkpoint-tmp-*"))


@pytest.mark.parametrize(
    "name, command",
    [
        ("tokenizer/kqv_tokenizer.json", ["generate", "--prompt", "To"]),
        ("tokenizer/tokenizer.json", ["generate", "--prompt", "To"]),
        ("tokens.safetensors", ["eval"]),
    ],
)
def test_a_damaged_file_of_a_run_without_checksums_is_still_one_error_line(runs, tmp_path, name, command):
    """A run written before SHA256SUMS existed loads unchecked; a damaged file is still named, not a traceback."""
    from test_damaged_runs import from_before_checksums

    run = copy_run(runs["bpe"], tmp_path)
    from_before_checksums(run)
    (run / name).write_bytes((run / name).read_bytes()[:40])
    refused([command[0], str(run), *command[1:]], name.split("/")[0], "train the run again")


def test_a_sample_count_too_large_to_finish_is_refused_before_training():
    from kqv.jobs.sampling import SampleConfig
    from kqv.nn.generation import GenerationLimits

    MAX_COUNT = GenerationLimits().count
    with pytest.raises(ConfigError, match="sample.count must be an integer from 1 to 10,000"):
        SampleConfig(count=MAX_COUNT + 1).check()
    with pytest.raises(ConfigError, match="sample.max_new_tokens must be an integer from 1 to 100,000"):
        SampleConfig(max_new_tokens=10**12).check()
    SampleConfig(count=MAX_COUNT).check()  # the limit itself is allowed


def test_sampling_from_non_finite_probabilities_is_a_clear_error_not_torch_s():
    from kqv.nn.generation import sample_next

    with pytest.raises(DataError, match="not finite"):
        sample_next(torch.tensor([[float("nan"), 1.0, 2.0]]))
    assert sample_next(torch.tensor([[float("nan"), 1.0, 2.0]]), temperature=0).shape == (1,)  # greedy still answers
