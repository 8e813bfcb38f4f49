"""Damaged run directories: every file of a trained run truncated, corrupted, deleted or replaced by a directory,
then `kqv generate|eval|attention` and `kqv train --resume`. Each either works (a file it does not need) or ends
with one `kqv: error:` line and exit status 2: never a traceback, and a resume never silently starts over."""

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

from kqv.cli.main import main
from test_cli import TINY

DAMAGES = ("truncate", "corrupt", "delete", "directory")
COMMANDS = ("generate", "eval", "attention", "resume", "resume-own")  # resume-own: with the run's own run.toml
# The files each command reads: damaging one of them must be an error, never a silent success.
CHECKPOINT = {f"checkpoint/{name}" for name in ("model.safetensors", "optimizer.pt", "rng.safetensors", "state.json")}
MODEL = {"run.toml", "tokenizer/kqv_tokenizer.json", "tokenizer/tokenizer.json", *CHECKPOINT}
NEEDED = {
    "generate": MODEL,
    "attention": MODEL,
    "eval": MODEL | {"tokens.safetensors"},
    "resume": (MODEL - {"run.toml"}) | {"tokens.safetensors"},  # --config given: run.toml is written, not read
    "resume-own": MODEL | {"tokens.safetensors"},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, list[str]]:
    """A finished tiny run (6 steps, checkpoints at 3 and 6) and the flags that trained it."""
    root = tmp_path_factory.mktemp("damaged")
    corpus = root / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 40)
    (root / "tiny.toml").write_text(TINY.format(position="rope"))
    run = root / "run"
    flags = ["--config", str(root / "tiny.toml"), "--data", str(corpus)]
    assert main(["train", "lm", *flags, "--out", str(run), "--quiet"]) == 0
    return run, flags


def from_before_checksums(run: Path) -> None:
    """Make `run` as kqv left a run before it kept SHA256SUMS: no manifest, and checkpoints that do not say the run
    kept one (state.json without `checksums`)."""
    (run / "SHA256SUMS").unlink()
    for state in run.glob("checkpoint*/state.json"):
        values = json.loads(state.read_text())
        del values["checksums"]
        state.write_text(json.dumps(values))


def run_files(run: Path) -> list[str]:
    return sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file() and p.name != ".lock")


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "corrupt":  # 0xFF is no UTF-8 byte: text files stop parsing, binary ones change their digest
        middle = len(data) // 2
        path.write_bytes(data[:middle] + b"\xff" + data[middle + 1 :])
    elif how == "delete":
        path.unlink()
    else:
        path.unlink()
        path.mkdir()


def kqv(argv: list[str]) -> tuple[int, str]:
    """The command line in this process: (exit status, stderr); an exception escaping main fails the test."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        status = main(argv)
    return status, stderr.getvalue()


def command(name: str, run: Path, flags: list[str]) -> list[str]:
    return {
        "generate": ["generate", str(run), "--prompt", "To", "--max-new-tokens", "4"],
        "eval": ["eval", str(run), "--max-tokens", "200"],
        "attention": ["attention", str(run), "--text", "To be", "--out", str(run.parent / "attention.png")],
        "resume": ["train", "lm", *flags, "--out", str(run), "--resume", "--quiet", "--steps", "7"],
        "resume-own": ["train", "lm", "--out", str(run), "--resume", "--quiet"],
    }[name]


def metrics_steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.is_file() else []


def check(trained, tmp_path, name: str, how: str, operation: str) -> None:
    source, flags = trained
    run = tmp_path / "run"
    shutil.copytree(source, run)
    damage(run / name, how)
    argv = command(operation, run, flags)
    before = metrics_steps(run) if name != "metrics.jsonl" else None
    status, stderr = kqv(argv)
    assert status in (0, 2), stderr
    if status == 2:
        assert stderr.startswith("kqv: error: ") and stderr.count("\n") == 1, stderr
        assert "Traceback" not in stderr and "weights_only=False" not in stderr, stderr
    if name in NEEDED[operation]:
        assert status == 2, f"{operation} worked with {name} damaged ({how})"
    if operation.startswith("resume") and status == 0 and before is not None:
        assert metrics_steps(run)[: len(before)] == before  # continued from step 6, not from 0
        assert metrics_steps(run)[-1] == (7 if operation == "resume" else 6)


FILES = [
    "run.toml",
    "tokenizer/kqv_tokenizer.json",
    "tokenizer/tokenizer.json",
    "tokens.safetensors",
    "checkpoint/model.safetensors",
    "checkpoint/optimizer.pt",
    "checkpoint/rng.safetensors",
    "checkpoint/state.json",
    "metrics.jsonl",
    "loss.png",
    "samples.txt",
    "summary.json",
    "SHA256SUMS",
]


def test_the_list_is_every_file_of_a_run(trained):
    assert sorted(FILES) == run_files(trained[0])


@pytest.mark.parametrize("operation", COMMANDS)
@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("name", FILES)
def test_a_damaged_file_is_one_error_line_or_not_needed(trained, tmp_path, name, how, operation):
    check(trained, tmp_path, name, how, operation)


@pytest.mark.parametrize("operation", COMMANDS)
def test_a_checkpoint_replaced_by_a_file_is_refused_and_resume_does_not_start_over(trained, tmp_path, operation):
    source, flags = trained
    run = tmp_path / "run"
    shutil.copytree(source, run)
    shutil.rmtree(run / "checkpoint")
    (run / "checkpoint").write_text("not a checkpoint\n")
    metrics = (run / "metrics.jsonl").read_bytes()
    status, stderr = kqv(command(operation, run, flags))
    assert status == 2 and "checkpoint is not a directory" in stderr, stderr
    assert (run / "metrics.jsonl").read_bytes() == metrics  # not truncated to a fresh start


def test_a_tampered_optimizer_state_never_suggests_running_its_code(trained, tmp_path):
    """An optimizer.pt that holds a pickled object (its digest recorded to match, as a tamperer would): the error
    says the file is damaged or untrusted and how to recover, never `weights_only=False`."""
    import hashlib
    import pickle

    source, flags = trained
    run = tmp_path / "run"
    shutil.copytree(source, run)
    evil = pickle.dumps(print)  # loading it runs code: a global that weights_only refuses
    (run / "checkpoint" / "optimizer.pt").write_bytes(evil)
    state = json.loads((run / "checkpoint" / "state.json").read_text())
    state["files"]["optimizer.pt"] = hashlib.sha256(evil).hexdigest()
    (run / "checkpoint" / "state.json").write_text(json.dumps(state))
    status, stderr = kqv(command("resume", run, flags))
    assert status == 2 and stderr.count("\n") == 1, stderr
    assert "weights_only" not in stderr and "damaged or not kqv's" in stderr and "--overwrite" in stderr, stderr


@pytest.fixture(scope="module")
def translation_run(tmp_path_factory) -> Path:
    from explore_runs import train_run

    return train_run("mt", tmp_path_factory.mktemp("damaged-mt"))


MT_FILES = ["pairs.safetensors", "data/test.src", "data/test.tgt", "tokenizer/tokenizer.json", "run.toml"]


def test_the_translation_run_records_its_data_files(translation_run):
    recorded = {line.split("  ", 1)[1] for line in (translation_run / "SHA256SUMS").read_text().splitlines()}
    assert set(MT_FILES) <= recorded


@pytest.mark.parametrize("operation", ["translate", "eval", "resume-own"])
@pytest.mark.parametrize("how", ["corrupt", "delete"])
@pytest.mark.parametrize("name", MT_FILES)
def test_a_damaged_translation_run_is_one_error_line_or_not_needed(translation_run, tmp_path, name, how, operation):
    run = tmp_path / "run"
    shutil.copytree(translation_run, run)
    damage(run / name, how)
    argv = {
        "translate": ["translate", str(run), "eins zwei"],
        "eval": ["eval", str(run), "--max-sentences", "2"],
        "resume-own": ["train", "mt", "--out", str(run), "--resume", "--quiet"],
    }[operation]
    status, stderr = kqv(argv)
    assert status in (0, 2) and "Traceback" not in stderr, stderr
    if status == 2:
        assert stderr.startswith("kqv: error: ") and stderr.count("\n") == 1, stderr
    needed = {"run.toml", "tokenizer/tokenizer.json"}
    needed |= {"data/test.src", "data/test.tgt"} if operation == "eval" else set()
    needed |= set(MT_FILES) if operation == "resume-own" else set()
    assert (status == 2) == (name in needed), stderr
