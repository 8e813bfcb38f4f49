"""The output guard, fuzzed: no command that writes a file the user names (`eval --predictions`, `generate --out`,
`attention --out`, `explore --html`, `train --out`) loses what already exists. Whatever path it is given, it never
writes over a file a run or its source holds (SHA256SUMS and the lock file included), nor over an input of the same
command, nor replaces anything that is not a regular file (a FIFO, a device node, a directory); its temporary file
has a name of its own, so a user's `X.tmp` is never taken for it; a full disk leaves nothing half-written behind.
Each refusal is one `kqv: error:` line and leaves every byte as it was.

One test per cause of lost data found by an audit: D1 (SHA256SUMS and the rest of a run's files), D2 (`--html`
unchecked), D3 (a fixed temporary name), D4 (a FIFO or a device node replaced), W6 (a mixture's sources
unprotected), the full disk's leftovers, and a source whose checkpoint survives only as `checkpoint.old`."""

from __future__ import annotations

import builtins
import errno
import hashlib
import io
import json
import os
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kqv
from kqv.cli.main import main
from kqv.errors import ConfigError
from kqv.train import files
from test_cli_fuzz import kqv as run_kqv
from test_finetune import tiny_run
from test_output_paths import PAIRS, REFUSED, tree


def one_line_error(status: int, error: str, *words: str) -> None:
    assert status == 2 and error.startswith("kqv: error: ") and error.count("\n") == 1, (status, error)
    assert "Traceback" not in error and all(word in error for word in words), error


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A tiny trained LM run (char tokenizer); `source.parent` holds its config (tiny.toml), its text (tiny.txt)
    and a file of pairs (qa.tsv)."""
    run = tiny_run(tmp_path_factory.mktemp("guard"), steps=2)
    (run.parent / "qa.tsv").write_text(PAIRS)
    return run


@pytest.fixture(scope="module")
def lora(source, tmp_path_factory) -> Path:
    """A LoRA fine-tune of `source` on its pairs: a run whose source's files are read too."""
    out = tmp_path_factory.mktemp("guard_lora") / "run"
    config, pairs = source.parent / "tiny.toml", source.parent / "qa.tsv"
    argv = ["train", "lm", "--config", str(config), "--init", str(source), "--data", str(pairs)]
    assert main([*argv, "--set", "finetune.lora_rank=2", "--steps", "2", "--quiet", "--out", str(out)]) == 0
    return out


@pytest.fixture()
def inputs(tmp_path, source) -> Path:
    """A directory of the user's inputs: a file of pairs (qa.tsv) and a file of prompts (prompts.txt)."""
    directory = tmp_path / "inputs"
    directory.mkdir()
    shutil.copy(source.parent / "qa.tsv", directory / "qa.tsv")
    (directory / "prompts.txt").write_text("to be\nthat is\n")
    return directory


# Each command that writes a file the user names: its argv on `run`, writing `out`, reading from `inputs`.
WRITERS: dict[str, Callable[[Path, Path | str, Path], list[str]]] = {
    "eval --predictions": lambda run, out, inputs: [
        *("eval", str(run), "--data", str(inputs / "qa.tsv"), "--predictions", str(out))
    ],
    "generate --out": lambda run, out, inputs: [
        *("generate", str(run), "--prompts", str(inputs / "prompts.txt"), "--out", str(out)),
        *("--max-new-tokens", "2", "--temperature", "0"),
    ],
    "attention --out": lambda run, out, inputs: ["attention", str(run), "--text", "to be", "--out", str(out)],
    "explore --html": lambda run, out, inputs: ["explore", str(run), "--html", str(out), "--text", "to be"],
}


def spellings(path: Path, scratch: Path, i: int) -> Path | str:
    """The `i`-th way of naming `path` (cycling): as it is, through `..`, through a link to it, or through a link
    to its directory: the guard compares what the file system resolves, not the spelling."""
    scratch.mkdir(exist_ok=True)
    way = i % 4
    if way == 0:
        return path
    if way == 1:
        return f"{path.parent}/../{path.parent.name}/{path.name}"
    link = scratch / f"link{i}"
    if way == 2:
        link.symlink_to(path)
        return link
    link.symlink_to(path.parent, target_is_directory=True)
    return link / path.name


# -- D1, D2: no output goes over a file a run or its source holds --------------------------------------------------


@pytest.mark.parametrize("writer", WRITERS)
def test_no_output_goes_over_any_file_the_run_or_its_source_holds(lora, source, inputs, tmp_path, writer):
    """Every file of the LoRA run and of its source (SHA256SUMS, run.toml, the weights, the lock file, ...), each
    named one of four ways, is refused as the output of every command, and neither run changes by a byte."""
    before = {path: tree(path) for path in (lora, source, inputs)}
    held = [p for run in (lora, source) for p in sorted(run.rglob("*")) if p.is_file()]
    assert {"SHA256SUMS", "run.toml", "model.safetensors", ".lock"} <= {p.name for p in held}
    for i, path in enumerate(held):
        output = spellings(path, tmp_path / "links", i)
        status, error = run_kqv(WRITERS[writer](lora, output, inputs))
        one_line_error(status, error, REFUSED)
        assert {path: tree(path) for path in before} == before, (writer, path)
    kqv.load(lora).generate("to", max_new_tokens=2, temperature=0)  # still whole


@pytest.mark.parametrize("writer", WRITERS)
def test_an_output_beside_the_runs_files_is_written(lora, inputs, writer):
    """The guard refuses the run's own files, not the run's directory: a file of the user's there is written."""
    out = lora / f"mine-{writer.split()[0]}.out"
    try:
        assert run_kqv(WRITERS[writer](lora, out, inputs)) == (0, "")
        assert out.is_file() and out.stat().st_size > 0
    finally:
        out.unlink(missing_ok=True)


def test_a_hugging_face_directorys_files_are_protected_as_a_runs(source, inputs, tmp_path):
    hf = tmp_path / "hf"
    assert main(["export", str(source), "--hf", str(hf)]) == 0
    before = tree(hf)
    held = sorted(p for p in hf.iterdir() if p.is_file())
    for i, (path, writer) in enumerate((path, writer) for path in held for writer in WRITERS.values()):
        one_line_error(*run_kqv(writer(hf, spellings(path, tmp_path / "links", i), inputs)), REFUSED)
    assert tree(hf) == before


# -- D4: nothing that is not a regular file is replaced ------------------------------------------------------------


@contextmanager
def drained(fifo: Path) -> Iterator[None]:
    """A reader on `fifo` for the block, so that a command that wrongly writes into it does not hang."""
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            try:
                if not os.read(fd, 1 << 16):
                    stop.wait(0.01)
            except BlockingIOError:
                stop.wait(0.01)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        yield
    finally:
        stop.set()
        reader.join()
        os.close(fd)


def special(kind: str, path: Path) -> int:
    """Make a `kind` of non-regular file at `path`; its mode, to compare after."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        try:  # a node of the device /dev/null is, in the test's own directory: replacing it harms nothing else
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a device node needs root")
    else:
        path.mkdir()
    return os.lstat(path).st_mode


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
@pytest.mark.parametrize("writer", WRITERS)
def test_an_output_that_exists_and_is_not_a_regular_file_is_refused_and_kept(lora, inputs, tmp_path, writer, kind):
    out = tmp_path / f"out.{kind}"
    mode = special(kind, out)
    link = tmp_path / "link"
    link.symlink_to(out)  # a link to it is refused as well
    for named in (out, link):
        with drained(out) if kind == "fifo" else nullcontext():
            status, error = run_kqv(WRITERS[writer](lora, named, inputs))
        one_line_error(status, error, str(named), "not a regular file" if kind != "directory" else "a directory")
        assert os.lstat(out).st_mode == mode and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["inputs", "link", out.name])  # no temporary file


# -- D3: a temporary file of its own ------------------------------------------------------------------------------


def test_prompts_named_like_the_outputs_temporary_file_are_read_and_kept(lora, tmp_path):
    prompts = tmp_path / "q.txt.tmp"
    prompts.write_text("to be\nthat is\n")
    argv = ["generate", str(lora), "--prompts", str(prompts), "--out", str(tmp_path / "q.txt"), "--max-new-tokens"]
    assert run_kqv([*argv, "2", "--temperature", "0"]) == (0, "")
    assert prompts.read_text() == "to be\nthat is\n"
    assert len((tmp_path / "q.txt").read_text().splitlines()) == 2


@pytest.mark.parametrize("writer", WRITERS)
def test_a_users_files_named_like_temporary_files_beside_the_output_are_kept(lora, inputs, tmp_path, writer):
    out = tmp_path / "out" / "a.txt"
    out.parent.mkdir()
    mine = ["a.txt.tmp", ".a.txt.tmp", "a.txt.kept.tmp", ".a.txt.1234abcd.tmp", "a.txt.tmp-x"]
    for name in mine:
        (out.parent / name).write_text(f"mine: {name}")
    assert run_kqv(WRITERS[writer](lora, out, inputs)) == (0, "")
    assert sorted(p.name for p in out.parent.iterdir()) == sorted([*mine, "a.txt"])
    assert all((out.parent / name).read_text() == f"mine: {name}" for name in mine)


NAMES = st.text(st.sampled_from("ab.-_~"), min_size=1, max_size=6).filter(lambda n: n not in (".", ".."))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES, others=st.lists(st.tuples(NAMES, st.sampled_from(["", ".", "_"]), NAMES), max_size=6))
def test_an_atomic_write_touches_no_other_file_whatever_their_names(tmp_path, name, others):
    """kqv's one atomic writer, with files around the target named like it (`X.tmp`, `.X.abc.tmp`, ...): a write,
    a second write in the middle of the first (two writers of one file) and a failed write change nothing but the
    target and leave no temporary file."""
    directory = tmp_path / "w"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    target = directory / name
    around = {f"{dot}{name}{'.' + a if a else ''}.{b}.tmp" for a, dot, b in others} | {f"{name}.tmp", f".{name}.tmp"}
    for other in around:
        (directory / other).write_text(other)

    def first(tmp: Path) -> None:
        tmp.write_text("first")
        files.write_text(target, "second")  # a second writer of the same file, meanwhile

    def failing(tmp: Path) -> None:
        tmp.write_text("half")
        raise RuntimeError("failed")

    files.write_through(target, first)
    assert target.read_text() == "first"
    with pytest.raises(RuntimeError, match="failed"):
        files.write_through(target, failing)
    assert target.read_text() == "first"
    assert {p.name: p.read_text() for p in directory.iterdir()} == {name: "first", **{o: o for o in around}}


# -- W6: every input of a training is protected -------------------------------------------------------------------


@pytest.mark.parametrize("position", [0, 1])
@pytest.mark.parametrize("where", ["itself", "inside", "link"])
def test_a_mixtures_sources_are_never_the_run_directory(source, tmp_path, position, where):
    """`--data corpus --data qa.tsv --out corpus` (either source, any spelling) is refused like one `--data corpus`."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("to be, or not to be, that is the question\n" * 20)
    pairs = tmp_path / "qa.tsv"
    shutil.copy(source.parent / "qa.tsv", pairs)
    (tmp_path / "link").symlink_to(corpus, target_is_directory=True)
    data = [corpus, pairs] if position == 0 else [pairs, corpus]
    out = {"itself": corpus, "inside": corpus / "run", "link": tmp_path / "link"}[where]
    before = tree(tmp_path)
    argv = ["train", "lm", "--config", str(source.parent / "tiny.toml"), "--data", str(data[0]), "--data"]
    for more in ([], ["--overwrite"]):
        status, error = run_kqv([*argv, str(data[1]), "--out", str(out), "--steps", "2", "--quiet", *more])
        one_line_error(status, error, f"--data {corpus}", REFUSED)
        assert tree(tmp_path) == before
    sources = f'data.sources=[{{path="{data[0]}"}}, {{path="{data[1]}"}}]'
    with pytest.raises(ConfigError, match="never writes over"):
        kqv.train("lm", source.parent / "tiny.toml", out=out, overrides=[sources], steps=2, quiet=True)
    assert tree(tmp_path) == before


# -- a full disk leaves nothing half-written ---------------------------------------------------------------------


class FullDisk:
    """A full disk under `root` alone, from its `fail_from`-th write there on (`calls` counts them): a file opened
    for writing by `open` is created empty, as on a disk with an inode but no block left, and the write fails with
    ENOSPC; `os.open` creating a file and `os.replace` fail before doing anything."""

    def __init__(self, root: Path, fail_from: int | None = None):
        self.root, self.calls, self.fail_from = root.resolve(), 0, fail_from

    def full(self, path: object) -> bool:
        if not isinstance(path, (str, os.PathLike)) or self.root not in Path(os.path.abspath(path)).parents:
            return False
        self.calls += 1
        return self.fail_from is not None and self.calls >= self.fail_from

    def install(self, monkeypatch) -> None:
        real_open, real_os_open, real_replace = builtins.open, os.open, os.replace

        def no_room(path: object) -> OSError:
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

        def open_(file, mode="r", *args, **kwargs):
            opened = real_open(file, mode, *args, **kwargs)
            if any(c in mode for c in "wax+") and self.full(file):
                opened.close()
                raise no_room(file)
            return opened

        def os_open(path, flags, *args, **kwargs):  # no room for the file's inode either
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and self.full(path):
                raise no_room(path)
            return real_os_open(path, flags, *args, **kwargs)

        def replace(src, dst, *args, **kwargs):
            if self.full(dst):
                raise no_room(dst)
            return real_replace(src, dst, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", open_)
        monkeypatch.setattr(io, "open", open_)
        monkeypatch.setattr(os, "open", os_open)
        monkeypatch.setattr(os, "replace", replace)


@pytest.mark.parametrize("writer", WRITERS)
def test_a_full_disk_at_any_write_of_an_output_leaves_nothing_behind(lora, inputs, tmp_path, monkeypatch, writer):
    out = tmp_path / "out"
    out.mkdir()
    with monkeypatch.context() as patch:
        counter = FullDisk(out)
        counter.install(patch)
        assert run_kqv(WRITERS[writer](lora, out / "result", inputs)) == (0, "")
    assert counter.calls >= 1
    (out / "result").unlink()
    for k in range(1, counter.calls + 1):
        with monkeypatch.context() as patch:
            FullDisk(out, fail_from=k).install(patch)
            status, error = run_kqv(WRITERS[writer](lora, out / "result", inputs))
        one_line_error(status, error, "the disk is full")
        assert list(out.iterdir()) == [], (k, list(out.iterdir()))


# -- a source whose checkpoint is only checkpoint.old -----------------------------------------------------------


def test_a_source_whose_checkpoint_survives_as_checkpoint_old_loads_everywhere(source, tmp_path):
    """A checkpoint swap cut short leaves `checkpoint.old` alone; eval and generate load it, and so does --init
    (it said "train it first")."""
    interrupted = tmp_path / "source"
    shutil.copytree(source, interrupted)
    (interrupted / "checkpoint").rename(interrupted / "checkpoint.old")
    pairs = source.parent / "qa.tsv"
    assert run_kqv(["eval", str(interrupted), "--data", str(pairs)])[0] == 0
    argv = ["train", "lm", "--config", str(source.parent / "tiny.toml"), "--init", str(interrupted), "--data"]
    out = tmp_path / "tuned"
    assert run_kqv([*argv, str(pairs), "--steps", "2", "--quiet", "--out", str(out)]) == (0, "")
    weights = interrupted / "checkpoint.old" / "model.safetensors"
    recorded = json.loads((out / "summary.json").read_text())["source"]["weights_sha256"]
    assert recorded == hashlib.sha256(weights.read_bytes()).hexdigest()
    shutil.rmtree(interrupted / "checkpoint.old")
    status, error = run_kqv([*argv, str(pairs), "--steps", "2", "--quiet", "--out", str(tmp_path / "again")])
    one_line_error(status, error, "has no trained weights", "train it first")


# -- the other commands that write a file the user names: embed --out, experiment gallery --out -------------------


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_embed_out_that_is_not_a_regular_file_is_refused_before_the_model_loads(tmp_path, kind):
    out = tmp_path / "vectors.npy"
    mode = special(kind, out)
    with drained(out) if kind == "fifo" else nullcontext():
        status, error = run_kqv(["embed", "some text", "--out", str(out), "--model", str(tmp_path / "no-model")])
    one_line_error(status, error, f"--out {out} is", "not a regular file")
    assert os.lstat(out).st_mode == mode


def test_the_gallery_page_never_goes_over_the_results_it_reads_nor_a_fifo(tmp_path):
    results = tmp_path / "experiments"
    shutil.copytree(Path(__file__).resolve().parents[1] / "docs" / "experiments", results)
    before = tree(results)
    for path in sorted(results.glob("*/*"))[:12]:
        status, error = run_kqv(["experiment", "gallery", "--dir", str(results), "--out", str(path)])
        one_line_error(status, error, f"--out {path} is inside the results of {path.parent.name}", REFUSED)
    os.mkfifo(tmp_path / "page.md")
    with drained(tmp_path / "page.md"):
        status, error = run_kqv(["experiment", "gallery", "--dir", str(results), "--out", str(tmp_path / "page.md")])
    one_line_error(status, error, "a FIFO (named pipe), not a regular file")
    assert tree(results) == before and stat.S_ISFIFO(os.lstat(tmp_path / "page.md").st_mode)
    assert run_kqv(["experiment", "gallery", "--dir", str(results), "--out", str(tmp_path / "gallery.md")]) == (0, "")
    assert "heads" in (tmp_path / "gallery.md").read_text()


def test_the_temporary_files_a_killed_writer_left_in_a_run_are_removed_when_it_is_next_opened(source, tmp_path):
    """A temporary file outlives a `kill -9` in the middle of a write; training into the run again removes those of
    the run's own files (and in tokenizer/), never a file of the user's that merely looks like one."""
    run = tmp_path / "run"
    shutil.copytree(source, run)
    left = [run / ".run.toml.0123abcd.tmp", run / ".SHA256SUMS.89ef0123.tmp", run / "tokenizer" / ".x.4567cdef.tmp"]
    mine = [run / ".notes.txt.0123abcd.tmp", run / "run.toml.tmp", run / ".run.toml.tmp"]
    for path in left + mine:
        path.write_text("left")
    assert run_kqv(["train", "lm", "--out", str(run), "--resume", "--steps", "3", "--quiet"]) == (0, "")
    assert not any(path.exists() for path in left) and all(path.read_text() == "left" for path in mine)
