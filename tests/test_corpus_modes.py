"""What an LM run trains on is one object (issue 49): `kqv.jobs.lm_kinds.corpus_of` makes a corpus of one kind from
the run's `DataConfig` once, and the corpus decides how its data is read, encoded, batched, checked and scored;
nothing else in kqv asks the settings again which kind they make."""

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from kqv.api import packaged_config
from kqv.errors import ConfigError
from kqv.jobs.lm import JOB
from kqv.jobs.lm_completions import Pairs
from kqv.jobs.lm_corpus import TextBlocks
from kqv.jobs.lm_data import DataConfig
from kqv.jobs.lm_documents import Documents
from kqv.jobs.lm_kinds import CORPORA, SETTINGS, corpus_of, data_may_move, kind_of_path
from kqv.jobs.lm_prepared import PreparedCorpus

SRC = Path(__file__).resolve().parents[1] / "src" / "kqv"
MODES = {"pairs", "mixture", "objective", "prepared"}  # what told the LM job its data's kind, read at each use
OWNERS = {cls.__name__ for kind in CORPORA for cls in kind.__mro__[:-1]} | {"DataConfig"}


def mode_reads(source: str) -> list[int]:
    """The lines of `source` that read a data-mode setting (`x.pairs`, `getattr(x, "mixture", ...)`, ...) outside
    the corpus kinds' classes and `DataConfig`."""
    tree = ast.parse(source)
    allowed = {
        id(node)
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef) and cls.name in OWNERS
        for node in ast.walk(cls)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in allowed:
            continue
        if isinstance(node, ast.Attribute) and node.attr in MODES and isinstance(node.ctx, ast.Load):
            found.append(node.lineno)
        named = (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"getattr", "hasattr"}
        )
        if named and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value in MODES:
            found.append(node.lineno)
    return sorted(found)


def test_no_module_but_the_corpus_kinds_asks_the_data_settings_what_kind_they_make():
    """`if data.pairs`, `data.objective == ...` or `getattr(data, "mixture")` outside a corpus kind is a second place
    that decides what the run trains on: ask the run's corpus instead (`LMRunConfig.corpus`)."""
    found = [f"{path.relative_to(SRC)}:{line}" for path in SRC.rglob("*.py") for line in mode_reads(path.read_text())]
    assert not found, found


def test_the_scan_finds_the_branches_the_lm_job_used_to_take():
    """The forms the LM job, its sources and the shared corpus loader used (a planted fault: each is found)."""
    old = """
def trainer_options(self, training):
    options = (
        sources.trainer_options(config, *training.data)
        if config.data.mixture
        else completions.trainer_options(config, tokens)
        if config.data.pairs
        else text_batches(config, tokens)
    )
    load = PreparedCorpus.load if config.data.prepared else prepare_corpus
    corrupt = data.objective == "span_corruption"
    if getattr(data, "mixture", False):
        pass
class Elsewhere:
    def f(self, data):
        return hasattr(data, "pairs")
"""
    assert mode_reads(old) == [5, 7, 10, 11, 12, 16]
    assert mode_reads(old.replace("class Elsewhere", "class DataConfig")) == [5, 7, 10, 11, 12]


def test_each_kind_of_data_makes_its_own_corpus(tmp_path):
    (tmp_path / "qa.tsv").write_text("q\ta\n")
    (tmp_path / "book.txt").write_text("a text\n")
    assert type(corpus_of(DataConfig())) is TextBlocks
    assert type(corpus_of(DataConfig(path=str(tmp_path / "book.txt")))) is TextBlocks
    assert type(corpus_of(DataConfig(path=str(tmp_path / "qa.tsv")))) is Pairs
    span = corpus_of(DataConfig(path=str(tmp_path / "book.txt"), objective="span_corruption"))
    assert type(span) is Documents and span.corrupt and span.mask() == "\u2047"
    mixed = corpus_of(DataConfig(sources=({"path": str(tmp_path / "book.txt")}, {"path": str(tmp_path / "qa.tsv")})))
    assert type(mixed) is Documents and not mixed.corrupt and mixed.mask() is None
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "manifest.json").write_text("{}")
    assert type(corpus_of(DataConfig(path=str(tmp_path / "corpus")))) is PreparedCorpus


SET = {"span_rate": 0.3, "span_max": 5, "random_prefix": True, "span_loss": "all", "shuffle_sentences": True,
       "delimiter": "|", "long_documents": "windows", "prompt_loss_weight": 0.5, "packing": True,
       "template": "{prompt}:"}  # a value other than its default for each setting of a group  # fmt: skip


def test_each_kind_refuses_every_group_of_settings_it_does_not_take_and_only_those(tmp_path):
    """The groups (`SETTINGS`, gathered from the kinds' own `settings`) are refused by every kind that does not take
    them, with their own advice; a kind never refuses its own."""
    (tmp_path / "qa.tsv").write_text("q\ta\n")
    (tmp_path / "book.txt").write_text("a text\n")
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "manifest.json").write_text("{}")
    data = {
        TextBlocks: DataConfig(path=str(tmp_path / "book.txt")),
        Pairs: DataConfig(path=str(tmp_path / "qa.tsv")),
        PreparedCorpus: DataConfig(path=str(tmp_path / "corpus")),
        Documents: DataConfig(sources=({"path": str(tmp_path / "book.txt")}, {"path": str(tmp_path / "qa.tsv")})),
    }
    assert set(data) == set(CORPORA) and {name for group in SETTINGS for name in group.names} == set(SET)
    for kind, settings in data.items():
        for group in SETTINGS:
            for name in group.names:
                given = dataclasses.replace(settings, **{name: SET[name]})
                if group in kind.takes(given):
                    assert type(corpus_of(given)) is kind
                else:
                    with pytest.raises(ConfigError, match=f"data.{name}"):
                        corpus_of(given)
    span = dataclasses.replace(data[Documents], objective="span_corruption", span_rate=0.3)
    assert corpus_of(span).corrupt  # a span's settings are taken under span corruption alone
    with pytest.raises(ConfigError, match="data.span_rate shapes span corruption's examples"):
        corpus_of(dataclasses.replace(span, objective="next_token"))


def test_a_path_s_kind_and_whether_its_run_may_move_it_are_asked_of_the_kinds(tmp_path):
    (tmp_path / "qa.jsonl").write_text("{}\n")
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "manifest.json").write_text("{}")
    assert kind_of_path(None) is TextBlocks and kind_of_path(tmp_path / "qa.jsonl") is Pairs
    assert kind_of_path(tmp_path / "corpus") is PreparedCorpus and kind_of_path(tmp_path / "x.txt") is TextBlocks
    assert data_may_move({"data": {"tokens_sha256": "ab"}}) and not data_may_move({"data": {"path": "x.txt"}})


def configured(data: dict):
    """The quick config with `data`'s settings (as `kqv train lm quick --set data.KEY=VALUE` gives them)."""
    return JOB.load_config(packaged_config("quick"), [f"data.{key}={json.dumps(value)}" for key, value in data.items()])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"packing": True}, "data.packing applies to a file of prompt -> completion pairs"),
        ({"template": "{prompt}:"}, "data.template applies to a file of prompt -> completion pairs"),
        ({"path": "pc.txt", "template": "{prompt}:", "packing": True}, "data.packing and data.template apply to"),
        ({"objective": "span_corruption", "template": "{prompt}:"}, "data.template writes the prompts of a file"),
        ({"span_max": 5}, "data.span_max shapes span corruption's examples"),
        ({"path": "qa.tsv", "span_rate": 0.3}, "data.span_rate shapes span corruption's examples"),
        ({"shuffle_sentences": True}, "read a text as documents"),
        ({"random_prefix": True}, "data.random_prefix shapes span corruption's examples"),
        ({"path": "qa.tsv", "objective": "span_corruption"}, "masks spans of text documents"),
        ({"path": "qa.tsv", "span_loss": "all"}, "data.span_loss shapes span corruption's examples"),
    ],
)
def test_a_kind_refuses_the_settings_it_does_not_take_when_the_run_is_configured(settings, message):
    with pytest.raises(ConfigError, match=message):
        configured(settings)


def test_the_run_s_corpus_is_made_once_and_again_when_its_settings_are_replaced():
    config = configured({"context": 32})
    corpus = config.corpus
    assert config.corpus is corpus and corpus.data is config.data
    fitted = config.starting_from("elsewhere")
    assert fitted.corpus is not corpus and fitted.corpus.data.init == "elsewhere"


def packing_owners(source: str) -> list[int]:
    """The lines of `source` that decide packing outside `decide_packing`, or ask a batch its layout by its keys: a
    call of the fill estimate (`.fills()`), a `packing` attribute rewritten (a config settled inside a check), a
    string tested `in batch` (`"sequences" in batch`: a batch's layout and weights are its type and fields)."""
    tree = ast.parse(source)
    owner = {id(n) for f in ast.walk(tree) if getattr(f, "name", "") == "decide_packing" for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        estimate = isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "fills" and id(node) not in owner
        rewritten = isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and any(
            isinstance(target, ast.Attribute) and target.attr == "packing"
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        )
        keyed = (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Constant)
            and isinstance(node.left.value, str)
            and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)
            and any(isinstance(c, ast.Name) and "batch" in c.id for c in node.comparators)
        )
        if estimate or rewritten or keyed:
            found.append(node.lineno)
    return sorted(found)


def test_packing_is_decided_in_one_place_and_a_batch_s_layout_is_its_type():
    found = [f"{path.relative_to(SRC)}:{n}" for path in SRC.rglob("*.py") for n in packing_owners(path.read_text())]
    assert not found, found


def test_the_packing_scan_finds_the_owners_packing_used_to_have():
    old = """
class DataConfig:
    def settle_packing(self, attention_kinds):
        if self.packing == "auto" and set(attention_kinds) - {"full"}:
            self.packing = False
class ExampleBatches:
    def packs(self):
        padded, packed = self.fills()
        return packed > padded
def example_loss(model, batch):
    if "sequences" in batch:
        pass
    if "weights" not in batch:
        pass
def decide_packing(model, packing, batches):
    return batches.fills()
"""
    assert packing_owners(old) == [5, 8, 11, 13]
