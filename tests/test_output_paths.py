"""Issue 41, output paths: no command writes over what it reads, whatever the spelling of the path (a symbolic link,
`..`); an overwrite works for any spelling of its run directory; an export leaves no staging directory behind (a
killed one's is reclaimed by the next) and a full disk is one line; an interrupt after a run's last file is written
loses nothing and exits 0.

Each test here failed on the code before issue 41 (the case it names: L1-L4, the export's staging directory and
full disk, the late Ctrl-C, the sizes, the empty `--hf`, transformers' chatter)."""

import errno
import fcntl
import hashlib
import json
import os
import signal
from pathlib import Path

import pytest
import torch

import kqv
from kqv.cli.main import main
from kqv.errors import ConfigError, DiskFullError
from kqv.train import files
from test_finetune import tiny_run
from test_signals import spawn, wait_for_line

PAIRS = "to be, \tor not\nthat is \tthe\nnot to\t be\nthe q\tuestion\n" * 3  # the source's characters only
REFUSED = "a command never writes over what it reads"


def tree(root: Path) -> dict[str, str]:
    """Every entry under `root` (hidden ones too), a file by its SHA-256: what a refusal must leave as it was."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


def refused(capsys, argv: list[str], *words: str) -> str:
    """`kqv argv` ends with one `kqv: error:` line (status 2) holding every one of `words`."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("kqv: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert all(word in err for word in words), err
    return err


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A tiny trained LM run (char tokenizer), the source of the fine-tunes here; `source.parent` holds its
    config (tiny.toml) and a file of pairs (qa.tsv)."""
    run = tiny_run(tmp_path_factory.mktemp("outputs"), steps=2)
    (run.parent / "qa.tsv").write_text(PAIRS)
    return run


def finetune_argv(source: Path, out: Path | str, *more: str) -> list[str]:
    config, pairs = source.parent / "tiny.toml", source.parent / "qa.tsv"
    return [
        *("train", "lm", "--config", str(config), "--init", str(source), "--data", str(pairs)),
        *("--set", "finetune.lora_rank=2", "--steps", "2", "--quiet", "--out", str(out), *more),
    ]


@pytest.fixture(scope="module")
def lora(source, tmp_path_factory) -> Path:
    """A LoRA fine-tune of `source` on its pairs."""
    out = tmp_path_factory.mktemp("lora") / "run"
    assert main(finetune_argv(source, out)) == 0
    return out


# -- L1: a fine-tune never writes into its source ----------------------------------------------------------------


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
@pytest.mark.parametrize("spelling", ["itself", "inside", "dot-dot", "link", "link inside"])
def test_a_finetune_whose_out_is_or_lies_inside_its_source_is_refused_and_the_source_is_untouched(
    source, tmp_path, capsys, spelling, overwrite
):
    (tmp_path / "link").symlink_to(source, target_is_directory=True)
    out = {
        "itself": source,
        "inside": source / "tuned",
        "dot-dot": f"{source}/../{source.name}",
        "link": tmp_path / "link",
        "link inside": tmp_path / "link" / "checkpoint",
    }[spelling]
    before = tree(source)
    inside = "inside " if spelling.endswith("inside") else ""
    refused(capsys, finetune_argv(source, out, *overwrite), f"is {inside}the model it starts from, --init", REFUSED)
    assert tree(source) == before  # not a byte written: no lock file, no stage beside it
    assert sorted(p.name for p in source.parent.iterdir() if p.name.startswith(source.name)) == [source.name]
    with pytest.raises(ConfigError, match="never writes over"):
        kqv.train("lm", source.parent / "tiny.toml", init=source, out=out, overwrite=bool(overwrite), quiet=True)
    assert tree(source) == before
    kqv.load(source)  # still loads


def test_a_finetune_beside_its_source_trains(lora, source):
    assert json.loads((lora / "summary.json").read_text())["source"]["path"] == str(source)


# -- L2, L3: eval --predictions and generate --out never replace what they read ------------------------------------


def test_eval_predictions_that_resolve_to_an_input_are_refused_and_the_input_is_kept(lora, source, tmp_path, capsys):
    pairs = tmp_path / "qa.tsv"
    pairs.write_text(PAIRS)
    (tmp_path / "link.tsv").symlink_to(pairs)
    (tmp_path / "sub").mkdir()
    outputs = {
        pairs: "the file of pairs it scores",
        tmp_path / "link.tsv": "the file of pairs it scores",
        tmp_path / "sub" / ".." / "qa.tsv": "the file of pairs it scores",
        lora / "run.toml": f"run.toml of the run {lora}",
        lora / "checkpoint" / "model.safetensors": f"checkpoint of the run {lora}",
        source / "checkpoint" / "model.safetensors": "checkpoint of the fine-tune's source",
    }
    before = {path: tree(path) for path in (tmp_path, lora, source)}
    for output, what in outputs.items():
        argv = ["eval", str(lora), "--data", str(pairs), "--predictions", str(output)]
        refused(capsys, argv, f"--predictions {output} is", what, REFUSED)
    assert {path: tree(path) for path in before} == before
    assert main(["eval", str(lora), "--data", str(pairs), "--predictions", str(lora / "predictions.tsv")]) == 0
    assert (lora / "predictions.tsv").read_text().startswith("prompt\texpected\tgot\tcorrect\n")  # a file of yours


def test_generate_out_that_resolves_to_its_prompts_or_the_runs_files_is_refused(lora, source, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("to be\nthat is\n")
    (tmp_path / "link.txt").symlink_to(prompts)
    outputs = {
        prompts: "the file of prompts",
        tmp_path / "link.txt": "the file of prompts",
        lora / "samples.txt": f"samples.txt of the run {lora}",
        source / "tokenizer" / "chars.json": f"inside tokenizer of the fine-tune's source {source}",
    }
    before = {path: tree(path) for path in (tmp_path, lora, source)}
    for output, what in outputs.items():
        argv = ["generate", str(lora), "--prompts", str(prompts), "--out", str(output), "--max-new-tokens", "2"]
        refused(capsys, argv, f"--out {output} is", what, REFUSED)
    assert {path: tree(path) for path in before} == before
    argv = ["attention", str(lora), "--text", "to be", "--out", str(lora / "loss.png")]
    refused(capsys, argv, f"--out {lora / 'loss.png'} is loss.png of the run", REFUSED)
    assert tree(lora) == before[lora]


# -- L4: an overwrite works for any spelling of its run directory ------------------------------------------------


@pytest.mark.parametrize("spelling", ["dot-dot", "link"])
def test_an_overwrite_through_dot_dot_or_a_link_replaces_the_run_and_leaves_nothing_beside_it(
    source, tmp_path, capsys, spelling
):
    config, data = source.parent / "tiny.toml", source.parent / "tiny.txt"
    run = tmp_path / "runs" / "x"
    argv = ["train", "lm", "--config", str(config), "--data", str(data), "--quiet", "--steps"]
    assert main([*argv, "2", "--out", str(run)]) == 0
    (run / "notes.txt").write_text("mine")
    (tmp_path / "link").symlink_to(run, target_is_directory=True)
    out = f"{run}/../x" if spelling == "dot-dot" else str(tmp_path / "link")
    assert main([*argv, "3", "--out", out, "--overwrite"]) == 0, capsys.readouterr().err
    assert json.loads((run / "summary.json").read_text())["steps"] == 3  # the new run, where the old one was
    assert (run / "notes.txt").read_text() == "mine"  # carried over, as by any overwrite
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["x"]  # no x.kqv-old, no x.kqv-new
    assert (tmp_path / "link").is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["link", "runs"]
    assert kqv.load(out).generate("to", max_new_tokens=2, temperature=0)
    assert main([*argv, "4", "--out", out, "--resume"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 4


# -- export: staging directories, a full disk, the empty path, transformers' chatter ------------------------------


def test_an_export_reclaims_the_staging_directories_of_exports_killed_while_writing(lora, tmp_path, capsys):
    """`kill -9` during `kqv export` leaves its staging directory (`.DIR.kqv-export-XXXXXXXX`, `.DIR.XXXXXXXX`
    before issue 41): the next export to DIR removes it, but not one a live export holds nor anything else."""
    stale = [tmp_path / ".hf.kqv-export-k1ll3d_9", tmp_path / ".hf.ab12cd34"]
    for staging in stale:
        staging.mkdir()
        (staging / "config.json").write_text("{}")
        (staging / "model.safetensors").write_bytes(b"\x08\x00\x00")  # cut short
    live = tmp_path / ".hf.kqv-export-l1vel1ve"
    live.mkdir()
    mine = [tmp_path / ".hf.notes", tmp_path / ".hf.abcdefgh"]  # not a staging name; not an export's files
    for path in mine:
        path.mkdir()
        (path / "notes.txt").write_text("mine")
    held = os.open(live, os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # a live export's lock
        assert main(["export", str(lora), "--hf", str(tmp_path / "hf"), "--merge"]) == 0
    finally:
        os.close(held)
    capsys.readouterr()
    assert not any(path.exists() for path in stale)
    assert live.is_dir() and all((path / "notes.txt").read_text() == "mine" for path in mine)
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    run = kqv.load(lora, device="cpu")
    exported = kqv.load(tmp_path / "hf", device="cpu")
    ids = torch.tensor([run.tokenizer.encode("to be, that")])
    with torch.no_grad():
        assert torch.allclose(exported.model(ids), run.model(ids), atol=1e-5)


@pytest.mark.parametrize("failure", ["ENOSPC", "SafetensorError"])
def test_an_export_onto_a_full_disk_is_one_line_and_leaves_nothing(lora, tmp_path, capsys, monkeypatch, failure):
    """What safetensors raises when the disk fills (not an OSError), and an OSError with ENOSPC: both are kqv's
    DiskFullError, and neither the directory nor its staging directory is left."""
    import transformers.modeling_utils
    from safetensors import SafetensorError

    def filling(tensors, filename, *args, **kwargs):
        Path(filename).write_bytes(b"partial")
        if failure == "ENOSPC":
            raise OSError(errno.ENOSPC, "No space left on device", filename)
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space')

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", filling)
    monkeypatch.setattr(files, "free_bytes", lambda path: 1000)
    hf = tmp_path / "out" / "hf"
    refused(capsys, ["export", str(lora), "--hf", str(hf), "--merge"], "the disk is full", f"needed at {hf}")
    with pytest.raises(DiskFullError):
        kqv.export(lora, hf=hf, merge=True)
    assert [p.name for p in hf.parent.iterdir()] == []


def test_an_empty_hf_path_is_refused_as_empty(lora, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    refused(capsys, ["export", str(lora), "--hf", "", "--merge"], "--hf is empty", "give the name of a new directory")
    with pytest.raises(ConfigError, match="hf is empty"):
        kqv.export(lora, hf="", merge=True)
    assert list(tmp_path.iterdir()) == []


def test_an_export_says_one_line_without_transformers_warnings_or_progress_bars(lora, tmp_path, capfd):
    from transformers.utils import logging as hf_logging

    hf_logging.warning_once.cache_clear()  # a warning said once in this process would not be said again
    assert main(["export", str(lora), "--hf", str(tmp_path / "hf"), "--merge"]) == 0
    out, err = capfd.readouterr()
    assert out.startswith(f"wrote {tmp_path / 'hf'}: ") and out.count("\n") == 1 and err == "", (out, err)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["bos_token_id"] is None and config["eos_token_id"] is None  # not GPT-2's 50256 in 17 tokens
    assert hf_logging.get_verbosity() == hf_logging.WARNING and hf_logging.is_progress_bar_enabled()  # put back


# -- a full disk's sizes ---------------------------------------------------------------------------------------------


def test_a_full_disk_names_sizes_that_differ_as_different():
    assert "0.24 MB needed at runs/x (0.20 MB free)" in str(DiskFullError("runs/x", 240_000, 200_000))
    assert "1.0004 MB needed at runs/x (1.0001 MB free)" in str(DiskFullError("runs/x", 1_000_400, 1_000_100))
    assert "0.4 kB needed at runs/x (0.1 kB free)" in str(DiskFullError("runs/x", 440, 100))


# -- an interrupt after the last file is written -----------------------------------------------------------------

# The `kqv` command (argv[0] "kqv", as its console script), announcing the training's summary (said once
# summary.json, the run's last file, is written) and pausing there, and again while the process exits: where the
# test's signals land.
LATE = """
import atexit, sys, time
sys.argv[0] = "kqv"
from kqv.train.events import Summary
from kqv.train.reporter import Reporter

report = Reporter.__call__

def announced(self, event):
    if isinstance(event, Summary):
        print("written", flush=True)
        time.sleep(1.0)
    return report(self, event)

def exiting():
    print("exiting", flush=True)
    time.sleep(1.0)

Reporter.__call__ = announced
atexit.register(exiting)
from kqv.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_after_the_last_file_is_written_exits_0_and_says_the_run_is_complete(source, tmp_path, stop):
    run = tmp_path / "run"
    argv = ["train", "lm", "--config", str(source.parent / "tiny.toml"), "--data", str(source.parent / "tiny.txt")]
    process = spawn(LATE, *argv, "--steps", "2", "--quiet", "--out", str(run))
    wait_for_line(process, "written")
    process.send_signal(stop)
    wait_for_line(process, "exiting")  # the command went on to its end
    process.send_signal(stop)  # and a signal while the process exits changes nothing either
    assert process.wait(timeout=120) == 0
    error = process.stderr.read()
    assert "Traceback" not in error and error.count("\n") == 1, error
    assert error.startswith(f"kqv: {run} is complete; ") and "after its last file was written" in error
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
    kqv.load(run)
