"""The run directory has one writer: every file a run holds is written through `kqv.train.files` (atomically, a
full disk said as such). A language-model run, a LoRA fine-tune of it, a fine-tune on pairs, a translation run, a
second one trained on its data (`--data-from`) and overwritten (`--overwrite`), an experiment's results and figures
and the explorer's saved page are watched: each opening of a path inside their directories for writing, each
library save into one (safetensors, torch.save, matplotlib), each rename into one and each deletion of a file in
one must happen inside a call of kqv.train.files, or of the run directory that owns the run's files
(kqv.train.rundir: its lock, an overwrite's swap)."""

import builtins
import io
import os
import sys
import traceback
from pathlib import Path

import matplotlib.figure
import pytest
import safetensors.torch
import torch

import kqv.explore
from kqv.cli.main import main
from kqv.errors import ConfigError
from kqv.train.layout import read_manifest
from test_mt import MODELS, TINY_RUN, number_corpus
from test_torchrun import TINY_LM

SRC = Path(__file__).resolve().parents[1] / "src" / "kqv"
WRITERS = (SRC / "train" / "files.py", SRC / "train" / "rundir.py")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class Audit:
    """Who writes inside `root`: (the kqv module nearest the write, the file) for each write no frame of the
    writer's module is part of."""

    def __init__(self, root: Path):
        self.root, self.outside, self.seen = root.resolve(), [], 0

    def note(self, path: object) -> None:
        if not isinstance(path, (str, os.PathLike)):
            return
        target = Path(path).resolve()
        if self.root not in target.parents:
            return
        self.seen += 1
        stack = traceback.extract_stack()[:-2]
        frames = [Path(f.filename) for f in stack]
        if any(writer in frames for writer in WRITERS):
            return
        ours = [f for f in frames if SRC in f.parents]
        self.outside.append((str(ours[-1].relative_to(SRC)) if ours else "?", target.name))

    def watch(self, monkeypatch) -> None:
        real_open, real_os_open, real_replace, real_rename = builtins.open, os.open, os.replace, os.rename
        real_unlink, real_remove = os.unlink, os.remove

        def audited_open(file, mode="r", *args, **kwargs):
            if any(c in mode for c in "wax+"):
                self.note(file)
            return real_open(file, mode, *args, **kwargs)

        def audited_os_open(path, flags, *args, **kwargs):
            if flags & WRITE_FLAGS:
                self.note(path)
            return real_os_open(path, flags, *args, **kwargs)

        def moved(real):
            return lambda source, destination, *args, **kwargs: (
                self.note(destination),
                real(source, destination, *args, **kwargs),
            )[1]

        def saver(real, where):
            def save(*args, **kwargs):
                self.note(args[where] if len(args) > where else next(iter(kwargs.values())))
                return real(*args, **kwargs)

            return save

        monkeypatch.setattr(builtins, "open", audited_open)
        monkeypatch.setattr(io, "open", audited_open)
        monkeypatch.setattr(os, "open", audited_os_open)
        monkeypatch.setattr(os, "replace", moved(real_replace))
        monkeypatch.setattr(os, "rename", moved(real_rename))
        for name, real in (("unlink", real_unlink), ("remove", real_remove)):
            monkeypatch.setattr(
                os, name, lambda path, *args, real=real, **kwargs: (self.note(path), real(path, *args, **kwargs))[1]
            )
        monkeypatch.setattr(torch, "save", saver(torch.save, 1))
        monkeypatch.setattr(matplotlib.figure.Figure, "savefig", saver(matplotlib.figure.Figure.savefig, 1))
        for module in [m for name, m in list(sys.modules.items()) if name.startswith("kqv")] + [safetensors.torch]:
            for name in ("save_file", "save_model"):
                real = getattr(safetensors.torch, name) if module is not safetensors.torch else None
                if module is safetensors.torch or getattr(module, name, None) is real:
                    monkeypatch.setattr(module, name, saver(getattr(module, name), 1))


def test_only_the_run_directory_s_writer_writes_into_a_run(tmp_path, monkeypatch):
    corpus, config = tmp_path / "t.txt", tmp_path / "lm.toml"
    corpus.write_text("ROMEO: to be, or not to be, that is the question.\n" * 60)
    config.write_text(TINY_LM)
    pairs, mt_config = tmp_path / "numbers.tsv", tmp_path / "mt.toml"
    pairs.write_text("".join(f"{s}\t{t}\n" for s, t in number_corpus()), encoding="utf-8")
    mt_config.write_text(TINY_RUN.format(kind="transformer", model=MODELS["transformer"]))
    runs = tmp_path / "runs"
    audit = Audit(runs)
    audit.watch(monkeypatch)
    lm = ["train", "lm", "--config", str(config), "--data", str(corpus), "--quiet"]
    lm += ["--set", 'train.loggers=["csv","tensorboard"]']  # their files, opened by the run directory
    assert main([*lm, "--out", str(runs / "lm")]) == 0
    assert main([*lm, "--out", str(runs / "lm"), "--steps", "4", "--resume"]) == 0
    lora = ["--init", str(runs / "lm"), "--set", "finetune.lora_rank=2", "--steps", "2"]
    assert main(["train", "lm", "--data", str(corpus), *lora, "--out", str(runs / "lora"), "--quiet"]) == 0
    qa = tmp_path / "qa.tsv"
    qa.write_text(
        "".join(f"{p}\t{c}\n" for p, c in [("to be", "or not"), ("that is", "the"), ("the", "question")] * 10)
    )
    pairs_run = ["--init", str(runs / "lm"), "--data", str(qa), "--steps", "2", "--out", str(runs / "pairs")]
    assert main(["train", "lm", *pairs_run, "--set", "sample.count=1", "--quiet"]) == 0
    mt = ["train", "mt", "--config", str(mt_config), "--data", str(pairs), "--steps", "2", "--quiet"]
    assert main([*mt, "--out", str(runs / "mt")]) == 0
    assert audit.seen > 40  # the watch sees the runs' files being written
    assert not audit.outside, sorted(set(audit.outside))


def test_data_from_and_overwrite_write_a_run_only_through_its_writer(tmp_path, monkeypatch):
    """`--data-from` copies another run's tokenizer, encoded pairs and texts into the new run, and `--overwrite`
    replaces a run: both through the writer, the copies recorded in the new run's SHA256SUMS."""
    pairs, mt_config = tmp_path / "numbers.tsv", tmp_path / "mt.toml"
    pairs.write_text("".join(f"{s}\t{t}\n" for s, t in number_corpus()), encoding="utf-8")
    mt_config.write_text(TINY_RUN.format(kind="transformer", model=MODELS["transformer"]))
    runs = tmp_path / "runs"
    mt = ["train", "mt", "--config", str(mt_config), "--steps", "2", "--quiet"]
    assert main([*mt, "--data", str(pairs), "--out", str(runs / "source")]) == 0
    audit = Audit(runs)
    audit.watch(monkeypatch)
    copy = [*mt, "--data-from", str(runs / "source"), "--out", str(runs / "copy")]
    assert main(copy) == 0
    assert main([*copy, "--overwrite"]) == 0
    assert audit.seen > 20
    assert not audit.outside, sorted(set(audit.outside))
    monkeypatch.undo()
    source, copied = (read_manifest(runs / name) for name in ("source", "copy"))
    data = {name: digest for name, digest in source.items() if name != "run.toml"}
    assert data and {name: copied[name] for name in data} == data  # the copies, as the source recorded them


def test_an_experiment_and_a_saved_explorer_page_write_only_through_the_writer(tmp_path, monkeypatch):
    corpus, config = tmp_path / "t.txt", tmp_path / "lm.toml"
    corpus.write_text("ROMEO: to be, or not to be, that is the question.\n" * 60)
    config.write_text(TINY_LM)
    run, out = tmp_path / "lm", tmp_path / "out"
    assert main(["train", "lm", "--config", str(config), "--data", str(corpus), "--out", str(run), "--quiet"]) == 0
    audit = Audit(out)
    audit.watch(monkeypatch)
    assert main(["experiment", "run", "parallelism", "--quick", "--out", str(out / "experiments"), "--quiet"]) == 0
    assert main(["explore", str(run), "--html", str(out / "page.html"), "--text", "to be"]) == 0
    kqv.explore.show(str(run), "to be").save(out / "shown.html")  # a notebook's page, saved
    assert audit.seen >= 5  # results.json, report, a figure, the two pages
    assert not audit.outside, sorted(set(audit.outside))
    held = (run / "run.toml").read_bytes()
    with pytest.raises(ConfigError, match="run.toml of the run"):  # the output guard, before the write
        kqv.explore.show(str(run), "to be").save(run / "run.toml")
    assert (run / "run.toml").read_bytes() == held


def test_the_audit_sees_a_write_from_outside_the_writer(tmp_path, monkeypatch):
    audit = Audit(tmp_path)
    audit.watch(monkeypatch)
    (tmp_path / "samples.txt").write_text("written by this test, not by kqv.train.files")
    (tmp_path / "samples.txt").unlink()
    safetensors.torch.save_file({"x": torch.zeros(1)}, str(tmp_path / "t.safetensors"))
    from kqv.train.files import write_text

    write_text(tmp_path / "ok.txt", "through the writer")
    assert [name for _, name in audit.outside] == ["samples.txt", "samples.txt", "t.safetensors"]


@pytest.mark.parametrize("name", ["write_text", "write_tensors"])
def test_the_writer_leaves_the_old_file_when_a_write_fails(tmp_path, monkeypatch, name):
    from kqv.train import files

    path = tmp_path / "f"
    path.write_bytes(b"old")
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(Exception, match="disk"):
        files.write_text(path, "new") if name == "write_text" else files.write_tensors(path, {"x": torch.ones(2)})
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["f"]
