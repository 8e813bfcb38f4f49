"""Every change to a run directory is checked in full before its first byte is written, and an overwrite is atomic
as a whole (issue 25, items 2, 3, 5 and 8): a refused resume leaves run.toml as it was, an interrupted overwrite
leaves the previous run usable, problems found only after the work are found before it, and a run is extended with
`--resume --steps N` alone."""

import tomllib
from pathlib import Path

import pytest

import kqv
from kqv.cli.main import main
from kqv.train.rundir import RunDirectory, RunDirectoryBusy, check_run_lock
from kqv.train.topology import Topology

TINY = """
[data]
tokenizer = "char"
context = 16

[model]
d_model = 32
n_heads = 2
n_layers = 1
d_ff = 64
dropout = 0.0

[train]
steps = 10
batch_size = 4
warmup_steps = 2
eval_every = 5
eval_batches = 2
checkpoint_every = 5
log_every = 5
precision = "fp32"

[sample]
count = 1
max_new_tokens = 8
"""
LINES = "To be, or not to be, that is the question.\n" * 40


@pytest.fixture
def files(tmp_path):
    """A tiny config and corpus, and a trained 10-step run R of them."""
    config, corpus, out = tmp_path / "tiny.toml", tmp_path / "tiny.txt", tmp_path / "R"
    config.write_text(TINY)
    corpus.write_text(LINES)
    assert train(config, corpus, out) == 0
    return config, corpus, out


def train(config: Path, corpus: Path, out: Path, *flags: str) -> int:
    return main(["train", "lm", "--config", str(config), "--data", str(corpus), "--out", str(out), "--quiet", *flags])


def snapshot(run: Path) -> dict[str, bytes]:
    """Every file of a run directory and its bytes (the lock file's pid aside)."""
    return {
        str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file() and p.name != ".lock"
    }


def run_toml(run: Path) -> dict:
    return tomllib.loads((run / "run.toml").read_text())


def usable(run: Path) -> bool:
    return main(["generate", str(run), "--prompt", "To", "--max-new-tokens", "4"]) == 0


# -- item 2: a refused resume writes nothing ---------------------------------------------------------------------


def test_a_resume_that_changes_the_model_is_refused_before_run_toml_is_written(files, capsys):
    _, _, out = files
    before = snapshot(out)
    assert main(["train", "lm", "--out", str(out), "--resume", "--steps", "20", "--set", "model.d_model=64"]) == 2
    error = capsys.readouterr().err
    assert "model.d_model" in error and "32" in error and "64" in error
    assert snapshot(out) == before and usable(out)


def test_a_resume_to_fewer_steps_than_done_is_a_clear_error_that_writes_nothing(files, capsys):
    _, _, out = files
    before = snapshot(out)
    assert main(["train", "lm", "--out", str(out), "--resume", "--steps", "6", "--quiet"]) == 2
    assert "already at step 10" in capsys.readouterr().err
    assert snapshot(out) == before
    assert main(["train", "lm", "--out", str(out), "--resume", "--quiet"]) == 0  # a plain resume still works
    assert run_toml(out)["train"]["steps"] == 10


def test_a_resume_with_another_config_and_data_is_refused_before_anything_is_written(files, tmp_path, capsys):
    config, _, out = files
    other_config, other_data = tmp_path / "other.toml", tmp_path / "other.txt"
    other_config.write_text(TINY.replace("d_model = 32", "d_model = 64"))
    other_data.write_text("Something else entirely, with other letters: xyz.\n" * 30)
    before = snapshot(out)
    assert train(other_config, other_data, out, "--resume") == 2
    assert "model.d_model" in capsys.readouterr().err
    assert snapshot(out) == before and usable(out)


def test_a_resume_that_changes_the_data_names_the_field_and_why(files, capsys):
    _, _, out = files
    before = snapshot(out)
    assert main(["train", "lm", "--out", str(out), "--resume", "--steps", "20", "--set", "data.context=8"]) == 2
    error = capsys.readouterr().err
    assert "data.context" in error and "tokenizer and data" in error
    assert snapshot(out) == before


# -- item 8: extending a run needs only the new number of steps --------------------------------------------------


def test_resume_with_steps_alone_extends_the_run_with_its_own_config(files):
    _, _, out = files
    assert main(["train", "lm", "--out", str(out), "--resume", "--steps", "15", "--quiet"]) == 0
    assert run_toml(out)["train"]["steps"] == 15 and run_toml(out)["model"]["d_model"] == 32
    assert kqv.train("lm", out=out, resume=True, steps=20, overrides=["sample.count=2"], quiet=True)["steps"] == 20
    assert run_toml(out)["sample"]["count"] == 2
    assert (out / "samples.txt").read_text().count("=====") == 1


# -- item 3: an overwrite is atomic as a whole --------------------------------------------------------------------


def test_ctrl_c_during_an_overwrite_right_after_the_tokenizer_leaves_the_previous_run_usable(
    files, tmp_path, monkeypatch
):
    config, _, out = files
    other = tmp_path / "other.txt"
    other.write_text("To quite different letters: jumping foxes, lazy dogs, quick brown zebras!\n" * 30)
    before = snapshot(out)
    from kqv.train import layout

    save = layout.write_files  # the run's tokenizer is written by it (RunFiles.write_tokenizer)

    def save_then_interrupt(directory, files):
        save(directory, files)
        raise KeyboardInterrupt

    monkeypatch.setattr(layout, "write_files", save_then_interrupt)
    assert train(config, other, out, "--overwrite") == 130
    monkeypatch.undo()
    assert snapshot(out) == before and usable(out)
    assert train(config, other, out, "--overwrite") == 0  # the next overwrite cleans up what the last one left
    assert [p.name for p in out.parent.iterdir() if p.name.startswith("R")] == ["R"]
    assert usable(out) and any("z" in p.read_text() for p in (out / "tokenizer").iterdir())


# -- item 5: problems found before the work, not after it --------------------------------------------------------


def test_a_sample_prompt_the_tokenizer_cannot_encode_is_refused_before_training(tmp_path, capsys):
    config, corpus, out = tmp_path / "tiny.toml", tmp_path / "tiny.txt", tmp_path / "R"
    config.write_text(TINY)
    corpus.write_text(LINES.replace("\n", " "))  # no newline: the prompt "\n" cannot be encoded
    assert train(config, corpus, out, "--set", 'sample.prompt="\\n"') == 2
    assert "sample.prompt" in capsys.readouterr().err
    assert not out.exists()  # a refused fresh run leaves no trace, not even its directory


def test_an_overwrite_whose_validation_split_is_shorter_than_the_context_keeps_the_previous_run(
    files, tmp_path, capsys
):
    config, _, out = files
    short = tmp_path / "short.txt"
    short.write_text("To be, or not to be, that is the question.\n" * 3)  # val split: 13 characters < 17
    before = snapshot(out)
    assert train(config, short, out, "--overwrite") == 2
    error = capsys.readouterr().err
    assert "validation split" in error and "data.context" in error
    assert snapshot(out) == before and usable(out)


def test_a_context_whose_batch_cannot_fit_in_memory_is_a_clear_error(files, capsys):
    config, corpus, out = files
    before = snapshot(out)
    assert train(config, corpus, out, "--overwrite", "--set", "data.context=100000000") == 2
    error = capsys.readouterr().err
    assert "memory" in error and "GB" in error and "data.context" in error
    assert snapshot(out) == before


# -- the overwrite's stage, its swap and its leftovers ----------------------------------------------------------


def test_an_overwrite_swapped_in_is_locked_and_keeps_the_user_s_own_files(files):
    _, _, out = files
    (out / "notes.md").write_text("my notes")
    with RunDirectory.open(out, "overwrite", topology=Topology(), stage=True) as run:
        assert run.path == out.with_name("R.kqv-new") and (out / "run.toml").exists()
        (run.path / "run.toml").write_text("task = 'lm'\n")
        run.commit()
        assert run.path == out and (out / "run.toml").read_text() == "task = 'lm'\n"
        assert not (out / "checkpoint").exists() and (out / "notes.md").read_text() == "my notes"
        with pytest.raises(RunDirectoryBusy):
            check_run_lock(out)  # the new run is held like the one it replaced
    assert [p.name for p in out.parent.iterdir() if p.name.startswith("R")] == ["R"]


def test_an_overwrite_refused_before_its_swap_leaves_no_stage(files):
    _, _, out = files
    before = snapshot(out)
    with pytest.raises(RuntimeError), RunDirectory.open(out, "overwrite", topology=Topology(), stage=True) as run:
        (run.path / "tokenizer").mkdir()
        raise RuntimeError("refused")
    assert snapshot(out) == before and not out.with_name("R.kqv-new").exists()


def test_a_run_caught_between_the_two_renames_of_a_swap_is_restored(files):
    _, _, out = files
    before = snapshot(out)
    out.rename(out.with_name("R.kqv-old"))  # the swap's first rename, then a kill -9
    out.with_name("R.kqv-new").mkdir()
    (out.with_name("R.kqv-new") / "run.toml").write_text("task = 'lm'\n")
    assert usable(out) is False
    with RunDirectory.open(out, "resume", topology=Topology()) as run:
        assert run.step == 10
    assert snapshot(out) == before and usable(out)
    assert [p.name for p in out.parent.iterdir() if p.name.startswith("R")] == ["R"]


def test_the_leftover_of_a_swap_not_yet_cleaned_up_is_removed_by_the_next_opening(files):
    _, _, out = files
    old = out.with_name("R.kqv-old")
    old.mkdir()
    (old / "run.toml").write_text("task = 'lm'\n")
    (old / "notes.md").write_text("my notes")
    with RunDirectory.open(out, "resume", topology=Topology()):
        pass
    assert not old.exists() and (out / "notes.md").read_text() == "my notes"


def test_an_overwrite_names_the_run_it_replaces_not_its_stage(files, capsys):
    config, corpus, out = files
    capsys.readouterr()
    assert main(["train", "lm", "--config", str(config), "--data", str(corpus), "--out", str(out), "--overwrite"]) == 0
    printed = capsys.readouterr().out
    assert f"run directory {out}\n" in printed and "kqv-new" not in printed
