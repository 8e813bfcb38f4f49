"""A loaded LM corpus is one frozen type per kind (`kqv.jobs.lm_corpus.LoadedCorpus`): the type tells the kind, so
no code asks a corpus's splits which keys they hold, and no function of the jobs takes its data or its tokenizer's
maker as `Any`. The scans read the source (each is shown finding the forms the code used before); the behaviour
tests load each kind."""

import ast
import os
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
import torch

import kqv
from kqv.jobs.lm_completions import LoadedPairs, Pairs
from kqv.jobs.lm_corpus import LoadedCorpus, LoadedText, TextBlocks
from kqv.jobs.lm_data import DataConfig
from kqv.jobs.lm_documents import Documents, LoadedDocuments
from kqv.jobs.lm_kinds import corpus_of
from kqv.jobs.lm_prepared import LoadedPrepared, PreparedCorpus, prepare
from kqv.jobs.run_tokens import load_tokens
from kqv.train.rundir import RunDirectory
from kqv.train.topology import Topology

SRC = Path(os.environ.get("KQV_SCAN_SRC") or Path(__file__).resolve().parents[1] / "src") / "kqv"
CORPUS_NAMES = {"tokens", "tensors", "splits", "split", "val", "train", "stored", "loaded", "corpus"}
CODEC = {"from_tensors", "load_tokens"}  # the one place that reads tokens.safetensors's keys (older runs hold fewer)


def named(node: ast.AST) -> str | None:
    """The name a corpus would go by: `tokens`, `self.tokens`, `set(tokens)`, `tokens.keys()`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "set" and node.args:
        return named(node.args[0])
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "keys":
        return named(node.func.value)
    return None


def key_tests(node: ast.AST) -> bool:
    """Whether `node` asks a corpus-named value which keys it holds: `"x" in val`, `"x" not in tokens`,
    `{"train", "val"} <= set(tokens)`, `tokens.get("x")`."""
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        membership = any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
        keys = isinstance(node.left, ast.Constant) and isinstance(node.left.value, str)
        if membership and keys and any(named(side) in CORPUS_NAMES for side in node.comparators):
            return True
        subset = any(isinstance(op, ast.LtE | ast.GtE | ast.Lt | ast.Gt) for op in node.ops)
        return subset and any(isinstance(side, ast.Call) and named(side) in CORPUS_NAMES for side in sides)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        keyed = bool(node.args) and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
        return keyed and named(node.func.value) in CORPUS_NAMES
    return False


def key_reads(source: str) -> list[int]:
    """The lines of `source` that test a corpus's keys, outside the codec's reading functions (`CODEC`)."""
    tree = ast.parse(source)
    codec = {id(n) for f in ast.walk(tree) if getattr(f, "name", None) in CODEC for n in ast.walk(f)}
    return sorted({node.lineno for node in ast.walk(tree) if id(node) not in codec and key_tests(node)})


def any_data(source: str) -> list[int]:
    """The lines of `source` with a parameter `data` or `maker` annotated `Any`, or any parameter `maker`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            arguments = node.args
            for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                untyped = isinstance(arg.annotation, ast.Name) and arg.annotation.id == "Any"
                if arg.arg == "maker" or (arg.arg == "data" and untyped):
                    found.append(arg.lineno)
    return found


def scan(find, root: Path) -> list[str]:
    return [f"{path.relative_to(SRC)}:{line}" for path in sorted(root.rglob("*.py")) for line in find(path.read_text())]


def test_no_code_asks_a_corpus_which_keys_it_holds():
    """`"examples" in val`, `"chars" in tokens` or `tokens.get("windows")` outside the codec learns the corpus's kind
    again from its keys: ask its type instead (a method of `LoadedCorpus`)."""
    found = scan(key_reads, SRC)
    assert not found, found


def test_no_function_of_the_jobs_takes_its_data_or_a_tokenizer_maker_as_any():
    found = scan(any_data, SRC / "jobs")
    assert not found, found


def test_the_scans_find_the_forms_the_lm_job_used():
    """A planted fault: each form the LM job, its corpus kinds and its scoring used is found, and the codec's
    reading of an older run's keys is not."""
    old = """
def conclusion(self, training, summary):
    if "examples" in val:
        bits = "bits_per_char" in val
    n_chars = int(tokens["chars"][1]) if "chars" in tokens else None
    if not {"train", "train_lengths"} <= set(tokens):
        return None
    if "windows" not in tokens or self.tokens.get("left_out") is None:
        pass
def from_tensors(cls, tokenizer, tensors):
    return tensors.get("train_kinds"), "windows" in tensors
def build(maker: Any, data: Any, other: Any, settings: dict):
    return maker
def load(self, maker, run, data: DataConfig):
    return self
"""
    assert key_reads(old) == [3, 4, 5, 6, 8]
    assert any_data(old) == [12, 12, 14]


def written(tmp_path: Path) -> dict[str, DataConfig]:
    """[data] settings of each kind over a small text and a small file of pairs."""
    (tmp_path / "book.txt").write_text("".join(f"Line {i} of the book, a sentence or two.\n" for i in range(80)))
    (tmp_path / "qa.tsv").write_text("".join(f"question {i}?\tanswer {i % 3}\n" for i in range(20)))
    book, qa = str(tmp_path / "book.txt"), str(tmp_path / "qa.tsv")
    prepare(book, tmp_path / "prepared", tokenizer="char", progress=False)
    return {
        "text": DataConfig(path=book, tokenizer="char", context=16),
        "pairs": DataConfig(path=qa, tokenizer="char", context=32),
        "documents": DataConfig(sources=({"path": book}, {"path": qa}), tokenizer="char", context=48),
        "prepared": DataConfig(path=str(tmp_path / "prepared"), context=16),
    }


SPLITS = {"train", "train_lengths", "val", "val_lengths", "chars"}
STORED = {
    "text": {"train", "val", "chars"},
    "pairs": SPLITS | {"train_kinds", "kind_names"},
    "documents": SPLITS
    | {"train_sources", "val_sources", "train_sentence_counts", "train_sentence_lengths"}
    | {"windows", "left_out", "pair_answers"},
}
KINDS = {
    "text": (TextBlocks, LoadedText),
    "pairs": (Pairs, LoadedPairs),
    "documents": (Documents, LoadedDocuments),
    "prepared": (PreparedCorpus, LoadedPrepared),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_loads_to_its_own_frozen_type_and_stores_it_by_one_codec(tmp_path, kind):
    data = written(tmp_path)[kind]
    corpus = corpus_of(data)
    assert type(corpus) is KINDS[kind][0]
    with RunDirectory.open(tmp_path / "run", topology=Topology()) as run:
        checked = []
        loaded = corpus.load(corpus, run, checked.append)
        assert type(loaded) is KINDS[kind][1] and isinstance(loaded, LoadedCorpus) and checked == [loaded]
        with pytest.raises(FrozenInstanceError):
            loaded.tokenizer = None
        assert loaded.train_tokens > 0 and loaded.val_tokens > 0 and loaded.data is data
        again = corpus.trained(loaded.tokenizer, run.path)  # as a trained run reads it back
    assert type(again) is type(loaded) and again != loaded and {loaded: 1}[loaded] == 1  # itself alone
    if kind == "prepared":  # read from the corpus itself: the run stores no splits
        assert not (tmp_path / "run" / "tokens.safetensors").exists()
        assert torch.equal(again.val, loaded.val)
        return
    on_disk, stored, read = load_tokens(tmp_path / "run"), loaded.tensors(), again.tensors()
    assert set(on_disk) == STORED[kind]  # tokens.safetensors as every kqv version before wrote it
    assert all(torch.equal(on_disk[k], stored[k]) and torch.equal(on_disk[k], read[k]) for k in on_disk)


def test_the_type_tells_what_a_run_trained_on(tmp_path):
    """The answers a run's baselines count come from a corpus of examples; a text's corpus has none to give."""
    data = written(tmp_path)
    with RunDirectory.open(tmp_path / "run", topology=Topology()) as run:
        pairs = corpus_of(data["pairs"]).load(corpus_of(data["pairs"]), run, lambda loaded: None)
    answers, kinds = pairs.answers()
    assert len(answers) == len(pairs.train) and set(answers) <= {"answer 0", "answer 1", "answer 2"}
    assert kinds == [""] * len(answers) and not hasattr(LoadedText, "answers")
    assert corpus_of(data["text"]).trained_answers(lambda: pytest.fail("a text reads nothing")) is None


def test_a_trained_run_reads_its_corpus_once(tmp_path, monkeypatch):
    """`kqv eval` and the baselines ask the same loaded corpus: tokens.safetensors is read once."""
    data = written(tmp_path)
    config = tmp_path / "tiny.toml"
    config.write_text(
        "[data]\ntokenizer='char'\ncontext=32\n[model]\nd_model=16\nn_heads=2\nn_layers=1\nd_ff=32\n"
        "[train]\nbatch_size=2\nsteps=1\neval_every=1\neval_batches=1\n"
    )
    kqv.train("lm", config, out=tmp_path / "run", overrides=[f"data.path='{data['pairs'].path}'"], quiet=True)
    run = kqv.load(tmp_path / "run")
    from kqv.jobs import lm_corpus

    reads, load_tokens = [], lm_corpus.load_tokens
    monkeypatch.setattr(lm_corpus, "load_tokens", lambda path: reads.append(path) or load_tokens(path))
    run.evaluate()
    assert run.trained_answers() == run.loaded_corpus.answers() and reads == [run.run_dir]
