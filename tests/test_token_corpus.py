"""A token corpus on disk (`kqv prepare`, `kqv.jobs.lm_prepared`): written once, deterministically and resumably,
to the tokenizer's own encoding of the text; trained on through a memmap, the same windows on 1 and 2 ranks;
damaged or mismatched corpora refused in one line."""

import hashlib
import json

import numpy as np
import pytest
import torch

from kqv.cli.main import main
from kqv.data.batches import batch_generator, sample_batch
from kqv.data.token_corpus import ARRAY, MANIFEST, TokenCorpus, token_dtype
from kqv.data.tokenizers import load_tokenizer, make_tokenizer
from kqv.errors import DataError
from kqv.jobs import lm_prepared
from kqv.jobs.lm_prepared import STATE, own_windows, prepare
from kqv.train.distributed import OwnRows, share
from test_cli import TINY

# lines that start with spaces, tabs, blank lines, non-ASCII text and long lines: where a careless cut would change
# a byte-level BPE's tokens
LINES = [
    "ROMEO: But, soft! what light through yonder window breaks?",
    "   It is the east, and Juliet is the sun.",
    "",
    "\tArise, fair sun, and kill the envious moon,",
    "Größe, naïveté, 東京 — and “quotes”.",
    "Who is already sick and pale with grief " * 5,
    "  ",
    "JULIET: O Romeo, Romeo! wherefore art thou Romeo?",
]


def write_text(path, copies=30, shift=0):
    path.write_text("\n".join(LINES[(k + shift) % len(LINES)] + f" {k}" for k in range(copies * len(LINES))) + "\n")
    return path


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return write_text(tmp_path_factory.mktemp("text") / "play.txt")


def test_the_corpus_is_the_tokenizer_s_encoding_of_the_text_whatever_the_chunks(text, tmp_path):
    small = prepare(text, tmp_path / "small", vocab_size=300, chunk_bytes=97, progress=False)
    large = prepare(text, tmp_path / "large", vocab_size=300, chunk_bytes=1 << 20, progress=False)
    assert (tmp_path / "small" / ARRAY).read_bytes() == (tmp_path / "large" / ARRAY).read_bytes()
    corpus = TokenCorpus.open(tmp_path / "small")
    assert isinstance(corpus.ids, np.memmap) and corpus.ids.dtype == np.uint16
    tokenizer = load_tokenizer(tmp_path / "small" / "tokenizer")
    assert corpus.ids.tolist() == tokenizer.encode(text.read_text())  # the whole text encoded in one call
    assert small.manifest["tokens"] == large.manifest["tokens"] == len(corpus.ids)
    text_sha256 = hashlib.sha256(text.read_bytes()).hexdigest()
    assert small.manifest["sources"] == [
        {"path": str(text.resolve()), "bytes": text.stat().st_size, "sha256": text_sha256}
    ]


def test_a_directory_is_each_file_encoded_in_order_and_char_covers_every_character(tmp_path):
    texts = tmp_path / "texts"
    (texts / "b").mkdir(parents=True)
    first, second = write_text(texts / "b" / "z.txt", 3), write_text(texts / "a.txt", 2, shift=3)
    prepare(texts, tmp_path / "out", tokenizer="char", chunk_bytes=64, progress=False)
    corpus = TokenCorpus.open(tmp_path / "out")
    expected = corpus.tokenizer.encode(second.read_text()) + corpus.tokenizer.encode(first.read_text())
    assert corpus.ids.tolist() == expected
    assert corpus.tokenizer.decode(corpus.ids[:10]) == second.read_text()[:10]


def test_the_array_is_uint16_while_the_vocabulary_fits():
    assert token_dtype(50_257) == np.uint16 and token_dtype(65_536) == np.uint16
    assert token_dtype(65_537) == np.uint32


def test_a_killed_prepare_resumes_to_the_same_bytes_and_a_finished_one_is_not_redone(text, tmp_path, monkeypatch):
    prepare(text, tmp_path / "whole", vocab_size=300, chunk_bytes=200, progress=False)
    encode, calls = lm_prepared.encode_chunk, []

    def killed_after_three(*args):
        calls.append(1)
        if len(calls) > 3:
            raise KeyboardInterrupt  # the process killed between chunks
        return encode(*args)

    monkeypatch.setattr(lm_prepared, "encode_chunk", killed_after_three)
    with pytest.raises(KeyboardInterrupt):
        prepare(text, tmp_path / "cut", vocab_size=300, chunk_bytes=200, progress=False)
    state = json.loads((tmp_path / "cut" / STATE).read_text())
    assert state["tokens"] > 0 and not (tmp_path / "cut" / MANIFEST).exists()
    with pytest.raises(DataError, match="is an unfinished prepare"):  # not trained on, nor read as text
        TokenCorpus.open(tmp_path / "cut")
    with open(tmp_path / "cut" / "tokens.bin.partial", "ab") as partial:
        partial.write(b"\x07\x00" * 11)  # a chunk written but never recorded: the resume drops it
    monkeypatch.setattr(lm_prepared, "encode_chunk", encode)
    resumed = prepare(text, tmp_path / "cut", vocab_size=300, chunk_bytes=200, progress=False)
    assert resumed.resumed_at == state["tokens"] and not resumed.already
    assert (tmp_path / "cut" / ARRAY).read_bytes() == (tmp_path / "whole" / ARRAY).read_bytes()
    assert (tmp_path / "cut" / MANIFEST).read_text() == (tmp_path / "whole" / MANIFEST).read_text()
    assert not (tmp_path / "cut" / STATE).exists()

    def never(*args):
        raise AssertionError("a finished corpus was encoded again")

    monkeypatch.setattr(lm_prepared, "encode_chunk", never)
    assert prepare(text, tmp_path / "cut", vocab_size=300, chunk_bytes=200, progress=False).already


def test_prepare_refuses_to_write_over_an_input_or_another_directory_s_files(text, tmp_path):
    with pytest.raises(DataError, match="holds the text"):
        prepare(text, text.parent, progress=False)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.md").write_text("mine")
    with pytest.raises(DataError, match="holds other files"):
        prepare(text, tmp_path / "busy", progress=False)
    assert (tmp_path / "busy" / "notes.md").read_text() == "mine"
    prepare(text, tmp_path / "done", vocab_size=300, progress=False)
    with pytest.raises(DataError, match="prepared from other text or settings"):
        prepare(text, tmp_path / "done", vocab_size=310, progress=False)


def test_the_windows_of_a_seed_and_step_are_the_same_on_one_and_two_ranks(text, tmp_path):
    prepare(text, tmp_path / "c", vocab_size=300, progress=False)
    ids = TokenCorpus.open(tmp_path / "c").ids
    for i in (0, 7):
        x, y = own_windows(ids, 6, 16, batch_generator(11, i), 0, 1)
        # the text path's draws from a tensor of the same ids: the same blocks
        ref_x, ref_y = sample_batch(torch.tensor(ids.astype(np.int64)), 6, 16, batch_generator(11, i))
        assert torch.equal(x, ref_x) and torch.equal(y, ref_y)
        for world in (2, 4):
            parts = [own_windows(ids, 6, 16, batch_generator(11, i), rank, world) for rank in range(world)]
            assert all(isinstance(part, OwnRows) for part in parts)
            assert torch.equal(torch.cat([part.batch[0] for part in parts]), x)
            assert torch.equal(torch.cat([part.batch[1] for part in parts]), y)
            assert sum(part.weight for part in parts) == pytest.approx(world)  # the mean of the ranks: the batch
            # what the trainer does with a rank's batch: takes it as it is, as share would have cut the whole
            for rank, part in enumerate(parts):
                cut, weight = share((x, y), rank, world)
                local, own_weight = share(part, rank, world)
                assert torch.equal(local[0], cut[0]) and own_weight == weight


@pytest.fixture(scope="module")
def corpus(text, tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus") / "c"
    prepare(text, out, vocab_size=300, progress=False)
    return out


def tiny_config(root):
    (root / "tiny.toml").write_text(TINY.format(position="rope").replace('tokenizer = "char"', 'tokenizer = "bpe"'))
    return str(root / "tiny.toml")


def test_training_reads_blocks_from_the_memmap_and_resumes(corpus, tmp_path, monkeypatch, capsys):
    read, arrays = lm_prepared.read_windows, []

    def spy(ids, starts, context):
        arrays.append(ids)
        return read(ids, starts, context)

    monkeypatch.setattr(lm_prepared, "read_windows", spy)
    argv = ["train", "lm", "--config", tiny_config(tmp_path), "--data", str(corpus), "--out", str(tmp_path / "run")]
    assert main([*argv, "--quiet"]) == 0
    assert arrays and all(isinstance(ids, np.memmap) for ids in arrays)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 6 and np.isfinite(summary["val"]["loss"])
    assert not (tmp_path / "run" / "tokens.safetensors").exists()  # the run holds no copy of the corpus
    assert main([*argv, "--resume", "--steps", "8", "--quiet"]) == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 8
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["tokens"] > 0


def refused(capsys, argv, *words):
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("kqv: error: ") and error.count("\n") == 1 and "Traceback" not in error, error
    assert all(word in error for word in words), error


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda c: (c / MANIFEST).write_text("{not json"), ("manifest.json is damaged",)),
        (lambda c: (c / ARRAY).write_bytes((c / ARRAY).read_bytes()[:-8]), ("truncated",)),
        (lambda c: (c / ARRAY).write_bytes(b"\x01\x00" + (c / ARRAY).read_bytes()[2:]), ("SHA-256",)),
        (lambda c: (c / ARRAY).unlink(), ("missing",)),
    ],
)
def test_a_damaged_corpus_is_refused_in_one_line(corpus, tmp_path, capsys, damage, words):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(corpus, broken)
    damage(broken)
    argv = ["train", "lm", "--config", tiny_config(tmp_path), "--data", str(broken), "--out", str(tmp_path / "run")]
    refused(capsys, [*argv, "--quiet"], *words, "kqv prepare TEXT --out")
    assert not (tmp_path / "run").exists()


def test_a_fine_tune_refuses_a_corpus_of_another_tokenizer(corpus, text, tmp_path, capsys):
    source = tmp_path / "source"
    argv = ["train", "lm", "--config", tiny_config(tmp_path), "--data", str(text), "--out", str(source), "--quiet"]
    assert main(argv) == 0
    argv = ["train", "lm", "--data", str(corpus), "--init", str(source), "--out", str(tmp_path / "ft"), "--quiet"]
    refused(capsys, argv, "another tokenizer", f"--tokenizer {source}")
    # prepared with the source's tokenizer, the same corpus fine-tunes it
    prepare(text, tmp_path / "same", tokenizer=str(source), progress=False)
    assert TokenCorpus.open(tmp_path / "same").tokenizer.files() == load_tokenizer(source / "tokenizer").files()
    argv[3] = str(tmp_path / "same")
    assert main([*argv, "--steps", "2", "--set", "data.context=16", "--set", "train.batch_size=2"]) == 0


def test_a_directory_that_is_not_a_corpus_is_refused(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(DataError, match="not a prepared token corpus"):
        TokenCorpus.open(tmp_path / "x")
    assert make_tokenizer("char", "ab").vocab_size == 2


def test_a_gpt2_directory_s_bpe_prepares_a_corpus_its_model_fine_tunes_on(gpt2_dir, text, tmp_path):
    from kqv.interop.directories import read_hf_tokenizer

    prepared = prepare(text, tmp_path / "c", tokenizer=str(gpt2_dir), progress=False)
    tokenizer = read_hf_tokenizer(gpt2_dir)
    assert prepared.manifest["vocab_size"] == tokenizer.vocab_size
    assert TokenCorpus.open(tmp_path / "c").ids.tolist() == tokenizer.encode(text.read_text())
    argv = ["train", "lm", "--data", str(tmp_path / "c"), "--init", str(gpt2_dir), "--out", str(tmp_path / "ft")]
    assert main([*argv, "--steps", "2", "--set", "data.context=16", "--set", "train.batch_size=2", "--quiet"]) == 0


def test_two_processes_under_torchrun_train_one_process_s_curve_on_a_prepared_corpus(corpus, tmp_path):
    import os
    import subprocess
    import sys

    from kqv.train.metrics import read_metrics
    from test_torchrun import SRC, TINY_LM

    (tmp_path / "tiny.toml").write_text(TINY_LM)
    common = ["train", "lm", "--config", str(tmp_path / "tiny.toml"), "--data", str(corpus), "--quiet"]
    common += ["--set", "train.batch_size=6"]  # rows 0-2 on rank 0, rows 3-5 on rank 1
    assert main([*common, "--out", str(tmp_path / "one")]) == 0
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    done = subprocess.run(
        [*command, "-m", "kqv.cli", *common, "--out", str(tmp_path / "two")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    one, two = (read_metrics(tmp_path / run / "metrics.jsonl") for run in ("one", "two"))
    for key in ("train_loss", "val_loss"):
        logged = [(a[key], b[key]) for a, b in zip(one, two) if key in a]
        assert logged and [b for _, b in logged] == pytest.approx([a for a, _ in logged], abs=1e-5, rel=0)


def test_a_new_bpe_is_trained_on_a_sample_spread_over_the_text(text, tmp_path):
    from kqv.data.token_corpus import sample_text

    size = text.stat().st_size
    sample = sample_text([text], 4096, block=1024)
    assert 2000 < len(sample.encode()) <= 4096 < size
    numbers = [int(line.rsplit(" ", 1)[1]) for line in sample.splitlines() if line.rsplit(" ", 1)[-1].isdigit()]
    last = len(text.read_text().splitlines()) - 1
    assert min(numbers) < last * 0.1 and max(numbers) > last * 0.7  # from the start to the end, not one block
    assert sample_text([text], 10 * size) == text.read_text()
    prepared = prepare(text, tmp_path / "c", vocab_size=300, sample_bytes=4096, progress=False)
    assert prepared.manifest["tokenizer"]["sample_bytes"] == 4096
    corpus = TokenCorpus.open(tmp_path / "c")  # a byte-level BPE encodes what its sample never held
    assert corpus.tokenizer.decode(corpus.ids) == text.read_text()


def test_kqv_prepare_prints_what_it_made_and_refuses_in_one_line(text, tmp_path, capsys):
    assert main(["prepare", str(text), "--out", str(tmp_path / "c"), "--vocab-size", "300", "--quiet"]) == 0
    assert "prepared" in capsys.readouterr().out
    assert main(["prepare", str(text), "--out", str(tmp_path / "c"), "--vocab-size", "300", "--quiet"]) == 0
    assert "already prepared" in capsys.readouterr().out
    refused(capsys, ["prepare", str(text), "--out", str(text.parent), "--quiet"], "holds the text")
    refused(capsys, ["prepare", str(tmp_path / "nowhere.txt"), "--out", str(tmp_path / "d")], "no text file")
    refused(capsys, ["prepare", str(text), "--out", str(tmp_path / "e"), "--tokenizer", "wordpiece"], "not 'bpe'")
    assert not (tmp_path / "e").exists()  # refused before anything was written


def test_a_resume_refuses_a_corpus_prepared_again_with_another_tokenizer(corpus, text, tmp_path, capsys):
    import shutil

    shutil.copytree(corpus, tmp_path / "c")
    argv = ["train", "lm", "--config", tiny_config(tmp_path), "--data", str(tmp_path / "c"), "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "run"), "--steps", "3"]) == 0
    shutil.rmtree(tmp_path / "c")
    prepare(text, tmp_path / "c", vocab_size=300, sample_bytes=4096, progress=False)  # other merges, same size
    resume = [*argv, "--out", str(tmp_path / "run"), "--resume", "--steps", "6"]
    refused(capsys, resume, "is not the corpus", "trained on")
