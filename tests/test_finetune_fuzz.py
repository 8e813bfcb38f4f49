"""Issue 41, fuzzing the fine-tuning surface (hypothesis): files of pairs (any bytes, any line ends, any JSON), a
Hugging Face GPT-2 directory (any config.json value, a missing field, a damaged config.json or model.safetensors)
and the `[finetune]` options. Whatever comes in, the reader returns what it should or raises a `KqvError` of one
line, never another exception (a traceback on the command line), and writes nothing; `kqv train lm --init` refuses
bad `[finetune]` options in one `kqv: error:` line with nothing written. Python functions are called where they
decide (as in test_fuzz_operations.py), so that each example takes milliseconds."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kqv.data.completions import Example, read_examples
from kqv.errors import KqvError
from kqv.interop import from_hf
from kqv.interop.architectures import GPT2_FIELDS
from kqv.jobs.finetune import FinetuneConfig
from kqv.jobs.init import read_source
from kqv.nn.config import ModelConfig
from kqv.nn.lora import PROJECTIONS
from kqv.nn.models import DecoderLM, count_parameters
from kqv.train.preflight import batch_memory
from test_cli_fuzz import kqv
from test_finetune import FINETUNE, FINETUNE_TEXT, tiny_run

FAST = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def check_one_line(error: BaseException) -> None:
    """A refusal kqv means: a KqvError whose message is one printable line."""
    assert isinstance(error, KqvError), f"{type(error).__name__}: {error}"
    message = str(error)
    assert message and "\n" not in message and "Traceback" not in message, message
    message.encode("utf-8")  # printable on a UTF-8 terminal: no lone surrogate of the input leaks into it


def snapshot(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


# -- files of pairs --------------------------------------------------------------------------------------------

SPECIALS = ["\u2028", "\u2029", "\x85", "\x0c", "\x0b", "\r", "\x1c", "\ufeff", "\t", "\n", "\r\n", " ", "\x00", "é"]
words = st.sampled_from(["to be", "or not", " that", "is the", "question", "Q:", " A: 4", "é", "😀"])
fragments = st.lists(st.one_of(words, words, st.sampled_from(SPECIALS), st.text(max_size=4)), max_size=4).map("".join)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(), fragments),
    lambda inner: st.one_of(st.lists(inner, max_size=2), st.dictionaries(fragments, inner, max_size=2)),
    max_leaves=4,
)
ODD_LINES = [
    '{"prompt": "q", "completion": "a", "prompt": "r"}',
    '{"prompt": "q", "completion": "\\ud800"}',
    '{"prompt": "q", "completion": "a", "n": ' + "9" * 5000 + "}",
    "[" * 100_000 + "]" * 100_000,
    '{"prompt": ' * 3000 + '"q"' + "}" * 3000,
    '{"prompt": "q", "completion": NaN}',
    '{"prompt": "q", "completion": " \\t "}',
]


@st.composite
def jsonl_lines(draw) -> str:
    kind = draw(st.sampled_from(["pair", "pair", "pair", "value", "odd"]))
    if kind == "odd":
        return draw(st.sampled_from(ODD_LINES))
    if kind == "value":
        return json.dumps(draw(json_values), ensure_ascii=draw(st.booleans()))
    record = {key: draw(st.one_of(words, words, fragments, json_values)) for key in ("prompt", "completion")}
    return json.dumps(record, ensure_ascii=draw(st.booleans()))


@st.composite
def pair_files(draw) -> tuple[str, bytes]:
    suffix = draw(st.sampled_from([".tsv", ".jsonl"]))
    if draw(st.integers(0, 7)) == 7:
        return suffix, draw(st.binary(max_size=200))
    tsv_line = st.tuples(st.one_of(words, fragments), st.one_of(words, words, fragments)).map("\t".join)
    line = jsonl_lines() if suffix == ".jsonl" else tsv_line
    lines = draw(st.lists(st.one_of(line, line, line, fragments), min_size=1, max_size=4))
    ends = st.sampled_from(["\n", "\n", "\r\n", "\r", "\u2028", "\x85", ""])
    text = "".join(line + draw(ends) for line in lines)
    data = text.encode("utf-8", errors="surrogatepass")
    if draw(st.booleans()):
        data = b"\xef\xbb\xbf" + data
    if draw(st.integers(0, 7)) == 7 and data:  # a byte of another encoding somewhere
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\xe9", b"\xc3", b"\xed\xa0\x80"])) + data[at:]
    return suffix, data


@settings(FAST, max_examples=100)
@given(file=pair_files())
def test_any_file_of_pairs_is_read_or_refused_in_one_line(tmp_path, file):
    suffix, data = file
    path = tmp_path / f"pairs{suffix}"
    path.write_bytes(data)
    before = snapshot(tmp_path)
    try:
        examples = read_examples(path)
    except Exception as error:  # noqa: BLE001 -- what kind it is, is the test
        event(f"refused: {str(error).partition(': ')[2][:12]}")  # --hypothesis-show-statistics
        check_one_line(error)
        assert str(path) in str(error), error
    else:
        event("read")
        assert examples and all(isinstance(e, Example) for e in examples)
        for example in examples:
            assert example.prompt and example.completion.strip() and example.line >= 1
            assert "\ufeff" not in example.prompt + example.completion
            (example.prompt + example.completion).encode("utf-8")
            if suffix == ".tsv":
                assert "\n" not in example.prompt + example.completion
    assert snapshot(tmp_path) == before


INSIDE = [c for c in SPECIALS if c not in ("\n", "\r\n", "\t", "\ufeff")]  # what a line may hold
inside = st.text(st.characters(exclude_characters="\n\t\ufeff", exclude_categories=("Cs",)), max_size=4)
field_text = st.lists(st.one_of(words, st.sampled_from(INSIDE), inside), max_size=4).map("".join)
pair_texts = st.tuples(st.tuples(field_text, words).map("".join), st.tuples(field_text, words).map("".join))


@FAST
@given(pairs=st.lists(pair_texts, min_size=1, max_size=4), crlf=st.booleans(), bom=st.booleans())
def test_pairs_with_any_character_but_a_newline_read_back_exactly(tmp_path, pairs, crlf, bom):
    end, start = "\r\n" if crlf else "\n", "\ufeff" if bom else ""
    (tmp_path / "p.tsv").write_text(start + "".join(f"{p}\t{c}{end}" for p, c in pairs), encoding="utf-8", newline="")
    jsonl = "".join(json.dumps({"prompt": p, "completion": c}, ensure_ascii=False) + end for p, c in pairs)
    (tmp_path / "p.jsonl").write_text(start + jsonl, encoding="utf-8", newline="")
    expected = [Example(p, c) for p, c in pairs]
    assert read_examples(tmp_path / "p.jsonl") == expected
    assert read_examples(tmp_path / "p.tsv") == expected


# -- a Hugging Face GPT-2 directory ----------------------------------------------------------------------------

FIELDS = sorted(GPT2_FIELDS) + ["model_type", "bos_token_id", "eos_token_id", "dtype", "n_ctx", "initializer_range"]
config_values = st.one_of(
    st.integers(-3, 70),
    st.sampled_from([0, 1, 2, 3, 32, 64, 280, 768, 2**31, 2**64, 10**30, 1e-5, 0.5, 1.5, -1e-5, 1e308]),
    st.sampled_from(["gpt2", "bert", "two", "", "gelu_new", "relu", "GPT2LMHeadModel"]),
    st.sampled_from([None, True, False, [], ["GPT2LMHeadModel"], ["BertModel"], [1], {}, {"a": 1}]),
    json_values,
)


@st.composite
def damaged_directories(draw) -> tuple[str, object]:
    kind = draw(st.sampled_from(["set", "set", "set", "drop", "config bytes", "weights"]))
    if kind == "set":
        return kind, (draw(st.sampled_from(FIELDS)), draw(config_values))
    if kind == "drop":
        return kind, draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3))
    if kind == "config bytes":
        return kind, draw(st.one_of(st.binary(max_size=60), json_values.map(lambda v: json.dumps(v).encode())))
    return kind, (draw(st.floats(0, 1)), draw(st.binary(min_size=0, max_size=8)))


def damage(directory: Path, kind: str, how: object) -> None:
    config = directory / "config.json"
    values = json.loads(config.read_text())
    if kind == "set":
        field, value = how
        config.write_text(json.dumps({**values, field: value}))
    elif kind == "drop":
        config.write_text(json.dumps({k: v for k, v in values.items() if k not in how}))
    elif kind == "config bytes":
        config.write_bytes(how)
    else:  # cut model.safetensors short, or overwrite some bytes at a point of it
        fraction, noise = how
        weights = directory / "model.safetensors"
        data = weights.read_bytes()
        at = int(fraction * len(data))
        weights.write_bytes(data[:at] + noise + (data[at + len(noise) :] if noise else b""))


@settings(FAST, max_examples=50)
@given(damaged=damaged_directories())
def test_a_damaged_gpt2_directory_loads_or_is_refused_in_one_line(gpt2_dir, tmp_path, damaged):
    directory = tmp_path / "gpt2"
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(gpt2_dir, directory)
    damage(directory, *damaged)
    before = snapshot(directory)
    for read in (from_hf, read_source):
        try:
            read(directory)
        except Exception as error:  # noqa: BLE001 -- what kind it is, is the test
            event(f"{read.__name__}: {type(error).__name__}")  # --hypothesis-show-statistics
            check_one_line(error)
        else:
            event(f"{read.__name__}: read")
    assert snapshot(directory) == before


# -- [finetune] options ------------------------------------------------------------------------------------------

TINY = ModelConfig(vocab_size=40, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=16)
junk = st.sampled_from([-1, 0, 2**40, 2**73, 1e308, -16.0, float("nan"), float("inf"), "8", True, None, [], [1]])


def mostly(workable: st.SearchStrategy, *others: st.SearchStrategy) -> st.SearchStrategy:
    """A workable value 3 times in 4 (so that some fuzzed fine-tunes train), else anything."""
    return st.one_of(workable, workable, workable, *others, junk)


OPTIONS = {
    "lora_rank": mostly(st.integers(1, 16), st.integers(0, 20)),
    "lora_alpha": mostly(st.floats(0.5, 64), st.floats(-2, 3000)),
    "lora_dropout": mostly(st.floats(0, 0.9), st.floats(-0.5, 1.5)),
    "lora_targets": mostly(
        st.lists(st.sampled_from(PROJECTIONS), min_size=1, max_size=3, unique=True),
        st.lists(st.sampled_from([*PROJECTIONS, "query", ""]), max_size=4),
    ),
    "freeze_embeddings": st.one_of(st.just(False), st.just(False), st.booleans(), junk),
    "freeze_blocks": st.one_of(st.just(0), st.just(0), st.integers(-1, 3), junk),
}


@FAST
@given(values=st.fixed_dictionaries({}, optional=OPTIONS))
def test_any_finetune_options_train_something_or_are_refused_in_one_line(values):
    try:
        adaptation = FinetuneConfig.from_dict(values).adaptation
        adaptation.check(TINY)
    except Exception as error:  # noqa: BLE001 -- what kind it is, is the test
        event(f"refused: {str(error)[:24]}")  # --hypothesis-show-statistics
        check_one_line(error)
        return
    event("LoRA" if adaptation.lora else "trains")
    model = DecoderLM(TINY)
    adaptation.apply(model)
    assert count_parameters(model) > 0  # something trains
    ids = torch.randint(0, 40, (2, 9))
    loss = model(ids[:, :-1], ids[:, 1:])
    loss.backward()
    assert torch.isfinite(loss)
    parts = batch_memory(TINY, 4, 16, 40, adaptation.lora)
    assert ("adapters" in parts) == (adaptation.lora is not None) and all(size >= 0 for size in parts.values())


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("fuzz_source"), steps=1, extra=["model.n_layers=2", "model.d_model=32"])


INVALID = [  # (option, a TOML value it refuses), whatever else is set
    ("lora_alpha", "0"),
    ("lora_alpha", "-16"),
    ("lora_alpha", "1e308"),
    ("lora_alpha", "nan"),
    ("lora_alpha", "1e-400"),
    ("lora_dropout", "0.999999"),
    ("lora_dropout", "-0.1"),
    ("lora_targets", '["up", "up"]'),
    ("lora_targets", "[]"),
    ("lora_targets", '["query"]'),
    ("lora_rank", "33"),
    ("lora_rank", "100000"),
    ("lora_rank", str(2**40)),
    ("lora_rank", str(2**73)),
    ("lora_rank", "-1"),
    ("freeze_blocks", "3"),
    ("freeze_embeddings", '"yes"'),
]


@settings(FAST, max_examples=15)
@given(
    bad=st.lists(st.sampled_from(INVALID), min_size=1, max_size=2, unique_by=lambda pair: pair[0]), lora=st.booleans()
)
def test_kqv_train_init_refuses_bad_finetune_options_in_one_line_with_nothing_written(source, tmp_path, bad, lora):
    (tmp_path / "new.txt").write_text(FINETUNE_TEXT)
    out = tmp_path / "run"
    sets = [*FINETUNE, *(["finetune.lora_rank=2"] if lora else []), *(f"finetune.{k}={v}" for k, v in bad)]
    argv = ["train", "lm", "--init", str(source), "--data", str(tmp_path / "new.txt"), "--out", str(out), "--quiet"]
    status, stderr = kqv([*argv, "--steps", "1", *(f"--set={value}" for value in sets)])
    assert status == 2 and stderr.startswith("kqv: error: ") and stderr.count("\n") == 1, stderr
    assert not out.exists() and not list(tmp_path.glob("run.*"))
