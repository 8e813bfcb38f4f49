"""Fuzzing what a user can type (hypothesis): the commands on a trained run and their options (generate, eval,
attention, translate, explore --html, train with --set values) and the explorer's JSON API. Whatever comes in,
a command exits 0, or 2 with one `kqv: error:` line (argparse's own usage errors exit 2 too); the API answers a
2xx, or a 4xx whose body is a JSON error, never a 500. An exception escaping `main` fails the test: a traceback."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from explore_runs import train_run
from test_cli_fuzz import kqv

FAST = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny trained runs: a language model (rope: any length) and a translation model, trained once."""
    root = tmp_path_factory.mktemp("fuzz-ops")
    return {"root": root, "lm": train_run("lm", root, position="rope"), "mt": train_run("mt", root)}


# -- values a careless or adversarial user types ---------------------------------------------------------------

NUMBER_WORDS = ["0", "-1", "-1000", "1", "2", "3", "nan", "inf", "-inf", "1e308", "1e-320", "99999999999999999999999"]
NUMBER_WORDS += ["1000000000", "0x10", "", " ", "½", "٣"]  # an Arabic-Indic three: int() reads it
texts = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", " ", "\n", "To be", "\x00", "\udcff\udcfe", "To \udcc3", "é" * 40, "To be, " * 60]),
)
numbers = st.one_of(st.sampled_from(NUMBER_WORDS), st.integers(-(10**30), 10**30).map(str), st.floats().map(str))


def small_int(low: int, high: int) -> st.SearchStrategy[str]:
    """An integer flag's value: mostly a workable one (so the command runs), else any number word."""
    workable = st.integers(low, high).map(str)
    return st.one_of(workable, workable, workable, numbers)  # one_of picks a branch uniformly: 3 in 4 workable


FLAGS = {
    "generate": {
        "--max-new-tokens": small_int(1, 8),
        "--temperature": st.one_of(st.floats(0, 2).map(str), numbers),
        "--top-k": small_int(1, 20),
        "--top-p": st.one_of(st.floats(0, 1).map(str), numbers),
        "--count": small_int(1, 2),
        "--seed": st.one_of(st.integers(-(2**70), 2**70).map(str), numbers),
        "--dtype": st.sampled_from(["fp32", "bf16", "int8", "fp16", ""]),
    },
    "eval": {"--max-tokens": small_int(2, 300)},
    "attention": {"--text": texts, "--max-tokens": small_int(1, 300)},
}
MT_FLAGS = {
    "translate": {"--beam": small_int(1, 3), "--length-penalty": st.one_of(st.floats(0, 2).map(str), numbers)},
    "eval": {"--beam": small_int(1, 3), "--max-sentences": small_int(1, 3)},
    "attention": {"--src": texts, "--tgt": st.one_of(st.none(), texts)},
}


@st.composite
def flags_of(draw, table: dict[str, st.SearchStrategy]) -> list[str]:
    chosen = draw(st.lists(st.sampled_from(sorted(table)), unique=True, max_size=3))
    argv = []
    for flag in chosen:
        value = draw(table[flag])
        if value is not None:
            argv.append(f"{flag}={value}")  # `=`: a value starting with '-' stays the flag's
    return argv


def check_outcome(status: int, stderr: str) -> None:
    """Exit 0, or exit 2 with one `kqv: error:` line (or argparse's usage and its error line)."""
    event(f"exit {status}" + (" (argparse)" if stderr.startswith("usage:") else ""))  # --hypothesis-show-statistics
    assert status in (0, 2), stderr
    if status == 2:
        assert "Traceback" not in stderr, stderr
        lines = stderr.splitlines()
        assert (lines[0].startswith("kqv: error: ") and len(lines) == 1) or lines[0].startswith("usage:"), stderr


# -- the commands ----------------------------------------------------------------------------------------------


@FAST
@given(data=st.data(), command=st.sampled_from(sorted(FLAGS)))
def test_commands_on_an_lm_run_never_show_a_traceback(runs, tmp_path, data, command):
    argv = [command, str(runs["lm"]), *data.draw(flags_of(FLAGS[command]))]
    if command == "generate":
        argv.append(f"--prompt={data.draw(st.one_of(st.just('To be'), texts))}")
    if command == "attention":
        argv.append(f"--out={tmp_path / 'attention.png'}")
    check_outcome(*kqv(argv))


@FAST
@given(data=st.data(), command=st.sampled_from(sorted(MT_FLAGS)))
def test_commands_on_a_translation_run_never_show_a_traceback(runs, tmp_path, data, command):
    argv = [command, str(runs["mt"]), *data.draw(flags_of(MT_FLAGS[command]))]
    if command == "translate":
        argv.append(f"--file={tmp_path / 'in.txt'}")
        (tmp_path / "in.txt").write_text(data.draw(texts), encoding="utf-8", errors="surrogateescape")
    if command == "attention":
        argv.append(f"--out={tmp_path / 'attention.png'}")
    if command == "eval":
        argv.append("--max-sentences=2")
    check_outcome(*kqv(argv))


@FAST
@given(
    text=st.one_of(st.just("To be, or not"), texts),
    max_tokens=small_int(8, 64),
    html=st.sampled_from(["page.html"] * 5 + [".", "missing/page.html", ""]),
)
def test_explore_html_never_shows_a_traceback(runs, tmp_path, text, max_tokens, html):
    target = str(tmp_path / html) if html else ""
    check_outcome(
        *kqv(["explore", str(runs["lm"]), f"--html={target}", f"--text={text}", f"--max-tokens={max_tokens}"])
    )


SET_KEYS = {  # each key with values that work, so that some fuzzed configs train
    "sample.prompt": ['"To"', '"\\n"'],
    "sample.count": ["1", "2"],
    "sample.max_new_tokens": ["1", "5"],
    "sample.temperature": ["0", "0.7"],
    "sample.top_k": ["1", "3"],
    "data.tokenizer": ['"char"', '"bpe"'],
    "data.vocab_size": ["270", "300"],
    "data.val_fraction": ["0.1", "0.5"],
    "model.position": ['"rope"', '"learned"', '"alibi"'],
    "model.d_model": ["8", "16"],
    "model.n_heads": ["1", "2"],
    "model.dropout": ["0.0", "0.1"],
    "train.lr": ["1e-3", "0.1"],
    "train.batch_size": ["1", "3"],
    "train.precision": ['"fp32"', '"bf16"'],
}
set_values = st.one_of(numbers, texts.map(json.dumps), st.sampled_from(["true", "[1, 2]", "{a = 1}", '"bpe"']))
settings_ = st.sampled_from(sorted(SET_KEYS)).flatmap(
    lambda key: st.tuples(st.just(key), st.one_of(st.sampled_from(SET_KEYS[key]), set_values))
)


@settings(FAST, max_examples=40)
@given(sets=st.lists(settings_, min_size=1, max_size=3))
def test_train_with_set_values_never_shows_a_traceback(runs, tmp_path_factory, sets):
    root = runs["root"]
    out = tmp_path_factory.mktemp("train") / "run"
    argv = ["train", "lm", "--config", str(root / "lm.toml"), "--data", str(root / "shakespeare.txt")]
    argv += ["--out", str(out), "--quiet", "--steps", "1", *[f"--set={key}={value}" for key, value in sets]]
    check_outcome(*kqv(argv))


# -- the explorer's JSON API -----------------------------------------------------------------------------------

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(10**40), 10**40),
        st.floats(allow_nan=False, allow_infinity=False),
        texts,
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=5,
)
FIELDS = ["text", "src", "tgt", "top_k", "beam", "max_new_tokens", "temperature", "top_p", "seed", "layer", "head"]
bodies = st.one_of(
    st.dictionaries(
        st.sampled_from(FIELDS),
        st.one_of(json_values, st.integers(0, 40), st.sampled_from(["To be", "eins zwei"])),
        max_size=5,
    ).map(lambda body: json.dumps({"text": "To be", **body}).encode()),
    json_values.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=40),
    st.sampled_from([b'{"text": NaN}', b'{"text": "To", "top_k": 1e400}', b'{"text": "\\udcff"}', b"{" * 50]),
)


@pytest.fixture(scope="module")
def clients(runs):
    pytest.importorskip("httpx")
    from starlette.testclient import TestClient

    from kqv.explore.app import create_app

    return {
        task: TestClient(create_app(runs[task], max_tokens=24), base_url="http://localhost") for task in ("lm", "mt")
    }


@FAST
@given(
    task=st.sampled_from(["lm", "mt"]),
    path=st.sampled_from(["/api/analyze", "/api/continue", "/api/export", "/api/info"]),
    body=bodies,
)
def test_the_json_api_answers_every_request_without_a_500(clients, task, path, body):
    client = clients[task]
    response = client.get(path) if path == "/api/info" else client.post(path, content=body)
    event(f"HTTP {response.status_code}")
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.headers["content-type"] == "application/json" and "error" in response.json()
    elif path == "/api/continue":  # a stream: an error after it started is a line with its status
        for line in response.text.splitlines():
            assert json.loads(line).get("status", 200) < 500, line
