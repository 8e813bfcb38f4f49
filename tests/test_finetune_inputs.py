"""Issue 41, the inputs of a fine-tune: options that would train nothing or cannot work are refused (S1), a file of
pairs is read line by line on newlines alone and every bad byte, key or nesting is one line that names where (S2),
and a broken Hugging Face GPT-2 directory or a LoRA run given to `--init` is one line that names the file and
field, never a traceback; nothing is written in any of these."""

import json
import shutil

import pytest

import kqv
from kqv.cli.main import main
from kqv.data.completions import Example, read_examples
from kqv.errors import ConfigError, ConversionError, DataError
from kqv.jobs.finetune import FinetuneConfig
from kqv.nn.config import ModelConfig
from kqv.nn.lora import LoRAConfig
from kqv.train import preflight
from test_finetune import FINETUNE, FINETUNE_TEXT, finetune, tiny_run

SOURCE = ["model.n_layers=2", "model.d_model=32", "model.d_ff=64"]  # every projection's smaller side is 32


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("inputs_source"), steps=2, extra=SOURCE)


def kqv_main(argv, capsys):
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.err


def refused_in_one_line(argv, capsys, out, words=()):
    status, err = kqv_main(argv, capsys)
    assert status == 2 and err.startswith("kqv: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert all(word in err for word in words), err
    assert not out.exists() and not list(out.parent.glob(f"{out.name}.*"))
    return err


def init_argv(source, tmp_path, *sets):
    (tmp_path / "new.txt").write_text(FINETUNE_TEXT)
    argv = ["train", "lm", "--init", str(source), "--data", str(tmp_path / "new.txt"), "--out", str(tmp_path / "run")]
    return [*argv, "--steps", "2", "--quiet", *(a for s in [*FINETUNE, *sets] for a in ("--set", s))]


# -- S1: [finetune] options that train nothing or cannot work ------------------------------------------------------


@pytest.mark.parametrize(
    "sets, words",
    [
        (["finetune.lora_alpha=0"], ["finetune.lora_alpha must be positive", "got 0"]),
        (["finetune.lora_alpha=-16"], ["finetune.lora_alpha must be positive"]),
        (["finetune.lora_alpha=1e308"], ["finetune.lora_alpha / finetune.lora_rank", "more than 100"]),
        (["finetune.lora_dropout=0.999999"], ["finetune.lora_dropout must be in [0, 0.9]"]),
        (['finetune.lora_targets=["up", "up"]'], ["finetune.lora_targets names 'up' twice"]),
        (["finetune.lora_rank=100000"], ["finetune.lora_rank (100000) is more than 32", "to_queries"]),
        (["finetune.lora_rank=33"], ["finetune.lora_rank (33) is more than 32"]),
        ([f"finetune.lora_rank={2**40}", f"finetune.lora_alpha={2**40}"], ["is more than 32"]),
        ([f"finetune.lora_rank={2**73}", f"finetune.lora_alpha={2**73}"], ["is more than 32"]),
        (["finetune.lora_alpha=1e-300"], ["finetune.lora_alpha / finetune.lora_rank", "less than 0.0001"]),
    ],
    ids=[
        "alpha-0",
        "alpha-negative",
        "alpha-1e308",
        "dropout",
        "targets-twice",
        "rank-1e5",
        "rank-33",
        "2**40",
        "2**73",
        "alpha-1e-300",
    ],
)
def test_s1_lora_options_that_train_nothing_or_cannot_work_are_one_line_with_nothing_written(
    source, tmp_path, capsys, sets, words
):
    rank = [] if any("lora_rank" in s for s in sets) else ["finetune.lora_rank=2"]
    refused_in_one_line(init_argv(source, tmp_path, *rank, *sets), capsys, tmp_path / "run", words)


def test_s1_the_largest_rank_is_the_smaller_side_of_the_adapted_layers():
    config = ModelConfig(vocab_size=40, d_model=32, n_heads=2, n_layers=2, d_ff=64, max_len=16)
    FinetuneConfig(lora_rank=32, lora_targets=("up", "down")).adaptation.check(config)  # up is 32 -> 64: 32 is its side
    with pytest.raises(ConfigError, match=r"lora_rank \(33\) is more than 32"):
        FinetuneConfig(lora_rank=33, lora_targets=("up",)).adaptation.check(config)
    FinetuneConfig(lora_rank=4, lora_alpha=400.0, lora_dropout=0.9)  # the bounds themselves are allowed
    with pytest.raises(ConfigError, match="lora.alpha must be positive"):
        LoRAConfig(alpha=0.0)
    with pytest.raises(ConfigError, match="lora.targets names 'up' twice"):
        LoRAConfig(targets=("up", "up"))


def test_s1_the_memory_estimate_counts_the_adapters_and_their_optimizer_state(monkeypatch):
    config = ModelConfig(vocab_size=40, d_model=32, n_heads=2, n_layers=2, d_ff=64, max_len=16)
    lora = LoRAConfig(rank=8, targets=("to_queries", "up"))
    plain = preflight.batch_memory(config, 4, 16, 40)
    adapted = preflight.batch_memory(config, 4, 16, 40, lora=lora)
    adapter_parameters = 2 * (8 * (32 + 32) + 8 * (32 + 64))  # two blocks: to_queries 32 -> 32, up 32 -> 64
    per_token = 2 * (8 + 8)  # each adapter keeps its (tokens, rank) middle for the backward pass
    assert adapted["adapters"] == 16 * adapter_parameters + 4 * 16 * per_token * 4
    assert {k: v for k, v in adapted.items() if k != "adapters"} == plain
    needed = sum(plain.values())
    monkeypatch.setattr(preflight, "available_memory", lambda device: (needed + 1, "this machine's memory"))
    preflight.check_memory(config, 4, 16, 40, processes=1)
    with pytest.raises(ConfigError, match="adapters"):
        preflight.check_memory(config, 4, 16, 40, lora=lora, processes=1)


# -- S2: files of pairs --------------------------------------------------------------------------------------------


def write(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x0c", "\x85", "\x1c", "\x1e", "\r", "\x0b"])
def test_s2_lines_are_split_on_newlines_alone(tmp_path, separator):
    jsonl = json.dumps({"prompt": f"to{separator}be", "completion": " or not"}, ensure_ascii=False) + "\n"
    tsv = f"to{separator}be\t or not\r\nthat is\t the{separator} question\n"
    assert (
        read_examples(write(tmp_path, "a.jsonl", (jsonl * 2).encode())) == [Example(f"to{separator}be", " or not")] * 2
    )
    assert read_examples(write(tmp_path, "a.tsv", tsv.encode())) == [
        Example(f"to{separator}be", " or not"),
        Example("that is", f" the{separator} question"),
    ]


def test_s2_a_bom_at_the_start_is_skipped_and_one_elsewhere_is_named(tmp_path):
    expected = [Example("to be", " or not"), Example("that is", " the question")]
    text = "to be\t or not\nthat is\t the question\n"
    assert read_examples(write(tmp_path, "a.tsv", b"\xef\xbb\xbf" + text.encode())) == expected
    jsonl = "".join(json.dumps({"prompt": e.prompt, "completion": e.completion}) + "\n" for e in expected)
    assert read_examples(write(tmp_path, "a.jsonl", b"\xef\xbb\xbf" + jsonl.encode())) == expected
    with pytest.raises(DataError, match=r"b.tsv:2: .*byte-order mark \(BOM, U\+FEFF\)"):
        read_examples(write(tmp_path, "b.tsv", ("to be\t or not\n\ufeff" + text).encode()))


@pytest.mark.parametrize(
    "name, data, words",
    [
        ("a.tsv", b"q\t a\nq\t \t\n", ["a.tsv:2: expected prompt<TAB>completion"]),
        ("a.tsv", b"q\t a\nq\t   \n", ["a.tsv:2: the completion is only whitespace"]),
        ("a.jsonl", b'{"prompt": "q", "completion": " \\t\\n"}\n', ["a.jsonl:1: the completion is only whitespace"]),
        ("a.jsonl", b'{"prompt": "q", "completion": "a", "completion": "b"}\n', ["a.jsonl:1: the key 'completion'"]),
        ("a.tsv", b"q\ta\nq\t\xe9t\xe9\n", ["a.tsv:2: not UTF-8", "byte 6"]),
        ("a.jsonl", b'{"prompt": "\xff"}\n', ["a.jsonl:1: not UTF-8", "byte 12"]),
        ("a.jsonl", b"[" * 100_000 + b"]" * 100_000 + b"\n", ["a.jsonl:1: ", "nested"]),
        ("a.jsonl", b'{"prompt": "q", "completion": "a", "n": 1' + b"0" * 5000 + b"}\n", ["a.jsonl:1: not JSON"]),
        ("a.jsonl", b'{"prompt": "q\\ud800", "completion": "a"}\n', ["a.jsonl:1: ", "surrogate"]),
    ],
    ids=["tab-in-completion", "blank-tsv", "blank-jsonl", "duplicate-key", "latin-1", "xff", "deep", "digits", "lone"],
)
def test_s2_bad_bytes_keys_and_completions_are_one_line_naming_file_and_line(tmp_path, name, data, words):
    with pytest.raises(DataError) as error:
        read_examples(write(tmp_path, name, data))
    message = str(error.value)
    assert "\n" not in message and len(message) < 400, message
    assert all(word in message for word in words), message


def test_s2_pairs_with_invalid_utf8_are_one_line_in_train_and_eval(source, tmp_path, capsys):
    pairs = write(tmp_path, "qa.tsv", b"to be\t or not\nthat is\t the \xff question\n" * 3)
    argv = init_argv(source, tmp_path)
    argv[argv.index("--data") + 1] = str(pairs)
    refused_in_one_line(argv, capsys, tmp_path / "run", ["qa.tsv:2: not UTF-8", "byte 27"])
    status, err = kqv_main(["eval", str(source), "--data", str(pairs)], capsys)
    assert status == 2 and err.count("\n") == 1 and "qa.tsv:2: not UTF-8" in err, err


# -- Hugging Face GPT-2 directories given to --init and eval -------------------------------------------------------


def broken_copy(gpt2_dir, tmp_path, config=None, weights=None):
    directory = tmp_path / "gpt2"
    shutil.copytree(gpt2_dir, directory)
    if config is not None:
        values = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps(config(values)))
    if weights is not None:
        file = directory / "model.safetensors"
        file.write_bytes(weights(file.read_bytes()))
    return directory


BROKEN_DIRECTORIES = {
    "a-list": (lambda c: [c], None, ["config.json holds a JSON array, not an object"]),
    "n_layer-two": (lambda c: {**c, "n_layer": "two"}, None, ["config.json: n_layer must be an integer", '"two"']),
    "n_layer-3": (lambda c: {**c, "n_layer": 3}, None, ["config.json: n_layer is 3", "h.0 to h.1"]),
    "n_layer-0": (lambda c: {**c, "n_layer": 0}, None, ["config.json: n_layer must be an integer of at least 1"]),
    "no-n_embd": (
        lambda c: {k: v for k, v in c.items() if k != "n_embd"},
        None,
        ["config.json: n_embd is missing", "768", "wte.weight", "(280, 32)"],
    ),
    "vocab-290": (lambda c: {**c, "vocab_size": 290}, None, ["config.json: vocab_size is 290", "wte.weight", "280"]),
    "n_head-3": (lambda c: {**c, "n_head": 3}, None, ["config.json: n_head (3) must divide n_embd (32)"]),
    "eps-string": (lambda c: {**c, "layer_norm_epsilon": "small"}, None, ["epsilon must be a positive number"]),
    "truncated": (None, lambda b: b[:5], ["model.safetensors is not a readable safetensors file", "header"]),
    "half": (None, lambda b: b[: len(b) // 2], ["model.safetensors is not a readable safetensors file"]),
    "empty": (None, lambda b: b"", ["model.safetensors is not a readable safetensors file"]),
    "not-json": (lambda c: None, None, ["config.json is not JSON"]),
}


@pytest.mark.parametrize("case", sorted(BROKEN_DIRECTORIES))
def test_a_broken_gpt2_directory_is_one_line_naming_file_and_field_in_init_and_eval(gpt2_dir, tmp_path, capsys, case):
    config, weights, words = BROKEN_DIRECTORIES[case]
    directory = broken_copy(gpt2_dir, tmp_path, config, weights)
    if case == "not-json":
        (directory / "config.json").write_text('{"model_type": "gpt2",')
    refused_in_one_line(init_argv(directory, tmp_path), capsys, tmp_path / "run", words)
    (tmp_path / "text.txt").write_text("To be, or not to be\n" * 4)
    status, err = kqv_main(["eval", str(directory), "--data", str(tmp_path / "text.txt")], capsys)
    assert status == 2 and err.startswith("kqv: error: ") and err.count("\n") == 1, err
    assert all(word in err for word in words), err
    with pytest.raises(ConversionError):
        kqv.interop.read_hf_directory(directory)


def test_a_sound_gpt2_directory_still_reads(gpt2_dir):
    hf_config, weights = kqv.interop.read_hf_directory(gpt2_dir)
    assert hf_config.n_layer == 2 and weights["transformer.wte.weight"].shape == (280, 32)


# -- --init of a LoRA run ------------------------------------------------------------------------------------------


def test_init_from_a_lora_run_is_one_short_line_saying_what_to_do(source, tmp_path, capsys):
    finetune(source, tmp_path / "lora", extra=["finetune.lora_rank=2"], steps=1)
    lora = tmp_path / "lora" / "run"
    (tmp_path / "next").mkdir()
    err = refused_in_one_line(init_argv(lora, tmp_path / "next"), capsys, tmp_path / "next" / "run")
    assert len(err) < 400 and "LoRA" in err and "--merge" in err and str(source) in err, err
