"""Odd and hostile inputs that once ended in a traceback, a silent wrong answer or a hang, fuzzed where kqv decides
(hypothesis) and tried once through the command line or the explorer's API: a prompt template with a conversion
or a format spec, a character run exported to Hugging Face and given a character it never saw, a request nested
a thousand deep, source weights whose sum overflows, a mask that is the end of text, an invalid TOML value in
`--set`, a LoRA scale that underflows, a saved page whose text opens an HTML comment, a list of 100,000 heads to
switch off, and `<eos>` inside a BPE document. Each is one `kqv: error:` line (or a 400 with a JSON message) with
nothing written, or the right answer."""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from html.parser import HTMLParser
from pathlib import Path

import pytest
import tomli_w
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from torch import nn

import kqv
from kqv.data.documents import apply_template, check_template
from kqv.data.mixture import MixtureBatches
from kqv.data.tokenizers import CharTokenizer
from kqv.errors import ConfigError, DataError
from kqv.explore.export import standalone_page
from kqv.jobs.lm_data import DataSource
from kqv.nn.lora import LoRAConfig, LoRALinear
from kqv.train.runs import override_value
from test_cli import TINY
from test_cli_fuzz import kqv as command
from test_finetune import tiny_run
from test_finetune_fuzz import check_one_line, snapshot

FAST = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
MASK = "\u2047"
LINES = [f"{name} was born in {town}." for name, town in zip(["ann", "bob", "cyd", "dee"] * 3, ["rome", "oslo"] * 6)]


def refused(argv: list[str], root: Path, *phrases: str) -> str:
    """Run `kqv argv`: exit status 2, one `kqv: error:` line holding `phrases`, and nothing under `root` changed."""
    before = snapshot(root)
    status, stderr = command(argv)
    assert status == 2 and stderr.startswith("kqv: error: ") and stderr.count("\n") == 1, stderr
    assert all(phrase in stderr for phrase in phrases), stderr
    assert snapshot(root) == before
    return stderr


@pytest.fixture
def inputs(tmp_path):
    """A config, a text of documents and a file of pairs, as a first fine-tune of `kqv train lm` reads them."""
    (tmp_path / "tiny.toml").write_text(TINY.format(position="rope"))
    (tmp_path / "pre.txt").write_text("\n".join(LINES) + "\n")
    (tmp_path / "qa.tsv").write_text("".join(f"{line[:-6]}\t{line[-5:]}\n" for line in LINES))
    return tmp_path


CONTEXT = ["--set", "data.context=64", "--quiet"]


def train(root: Path, *args: str) -> list[str]:
    return [
        "train",
        "lm",
        "--config",
        str(root / "tiny.toml"),
        "--out",
        str(root / "run"),
        "--steps",
        "1",
        *CONTEXT,
        *args,
    ]


# -- T1, W3: a template's conversions and format specs -------------------------------------------------------------

PIECES = ["{prompt}", "{mask}", "{prompt", "prompt}", "mask}", "{", "}", "{{", "}}", "!r", "!s", "!x", ":d", ":>9"]
PIECES += [":{mask}", "[0]", ".upper", "{}", "{0}", "Q: ", " A:", "é", "\\n", "{prompt!r}", "{prompt:d}", "{mask!s}"]


def rendered(template: str, prompt: str, mask: str) -> str | None:
    """What a template means, read independently of str.format: `{prompt}` and `{mask}` replaced, `{{` and `}}` one
    brace each; None when anything else holds a brace."""
    parts = re.split(r"(\{\{|\}\}|\{prompt\}|\{mask\})", template)
    if any("{" in part or "}" in part for part in parts[::2]):
        return None
    meaning = {"{{": "{", "}}": "}", "{prompt}": prompt, "{mask}": mask}
    return "".join(meaning.get(part, part) if k % 2 else part for k, part in enumerate(parts))


@FAST
@given(template=st.lists(st.sampled_from(PIECES), max_size=6).map("".join), prompt=st.text(max_size=8))
def test_a_template_writes_each_prompt_as_it_reads_or_is_refused_in_one_line(template, prompt):
    try:
        check_template(template)
    except ConfigError as error:
        event("refused")
        check_one_line(error)
        return
    event("kept")
    expected = rendered(template, prompt, MASK)
    assert expected is not None, f"{template!r} was kept, but holds a brace that is neither a placeholder nor {{{{"
    assert apply_template(template, prompt, MASK) == expected


@pytest.mark.parametrize("template", ["{prompt:d}", "{prompt!x}", "{prompt:{mask}}", "{prompt!r}", "{prompt!s}: "])
def test_kqv_train_refuses_a_template_with_a_conversion_or_format_spec(inputs, template):
    value = tomli_w.dumps({"v": template})[4:].strip()  # the template as a TOML string
    argv = train(inputs, "--data", str(inputs / "qa.tsv"), "--set", f"data.template={value}")
    refused(argv, inputs, "data.template", "{prompt}")


# -- T2: a character run exported to Hugging Face, given a character it never saw -----------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("exported")
    run = tiny_run(root, steps=1)
    return run, kqv.export(run, hf=root / "hf")


@FAST
@given(text=st.text(st.sampled_from("To be,rq\n é😀{"), min_size=1, max_size=12))
def test_an_exported_character_tokenizer_encodes_as_the_runs_or_names_the_unseen_characters(exported, text):
    run, hf = exported
    chars = kqv.load(run).tokenizer
    assert isinstance(chars, CharTokenizer)
    tokenizer = kqv.load(hf).tokenizer
    unseen = sorted(set(text) - set(chars.chars))
    if not unseen:
        assert tokenizer.encode(text) == chars.encode(text)
        return
    with pytest.raises(DataError) as error:
        tokenizer.encode(text)
    check_one_line(error.value)
    assert all(repr(char) in str(error.value) for char in unseen), error.value


def test_the_commands_on_an_exported_character_run_name_an_unseen_character_in_one_line(exported, tmp_path):
    run, hf = exported
    exported_files = snapshot(hf.parent)  # the run and its export
    (tmp_path / "unseen.txt").write_text("To bé, or not to bé\n" * 4)
    for argv in (
        ["generate", str(hf), "--prompt", "To bé", "--max-new-tokens", "2"],
        ["eval", str(hf), "--data", str(tmp_path / "unseen.txt")],
        ["attention", str(hf), "--text", "To bé", "--out", str(tmp_path / "attention.json")],
        ["explore", str(hf), "--html", str(tmp_path / "page.html"), "--text", "To bé"],
    ):
        refused(argv, tmp_path, "'é'")
    assert snapshot(hf.parent) == exported_files
    status, _ = command(["explore", str(hf), "--html", str(tmp_path / "page.html"), "--text", "To be"])
    assert status == 0 and "To be" in (tmp_path / "page.html").read_text()  # known text draws the page


# -- the explorer's API: a request nested deep (T3), 100,000 heads to switch off (the hang) -------------------------


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from explore_runs import train_run
    from kqv.explore.app import create_app

    return TestClient(create_app(train_run("lm", tmp_path_factory.mktemp("hostile")), max_tokens=24))


def nested(depth: int, kind: str) -> str:
    return {"list": "[" * depth + "]" * depth, "object": '{"a":' * depth + "1" + "}" * depth}[kind]


@pytest.mark.parametrize("kind", ["list", "object"])
@pytest.mark.parametrize("depth", [50, 1_000, 5_000, 100_000])
@pytest.mark.parametrize("path", ["/api/analyze", "/api/ablate", "/api/continue"])
def test_a_request_nested_deep_is_a_400_that_says_so(client, caplog, kind, depth, path):
    body = '{"text": "To be", "x": ' + nested(depth, kind) + "}"
    response = client.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert "nested" in response.json()["error"] and "please report" not in response.text
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # no traceback in the server's terminal


def test_the_nesting_a_request_needs_is_answered(client):
    response = client.post("/api/ablate", json={"text": "To be", "heads": [[0, 1], [1, 0]], "mode": "mean"})
    assert response.status_code == 200 and response.json()["chosen"]["heads"] == [[0, 1], [1, 0]]


@pytest.mark.parametrize("heads", [[[0, 0]] * 100_000, [[n % 2, n // 2 % 2] for n in range(5)]])
def test_more_heads_to_switch_off_than_the_model_has_are_refused_before_any_work(client, heads):
    response = client.post("/api/ablate", json={"text": "To be", "heads": heads})
    assert response.status_code == 400, response.text[:200]
    assert "at most 4" in response.json()["error"] and f"{len(heads):,}" in response.json()["error"]


# -- W1: source weights whose sum overflows -------------------------------------------------------------------------


class Named:
    def __init__(self, name: int):
        self.name = name

    def batch(self, n: int) -> tuple[int, int]:
        return self.name, n

    def tokens(self, n: int) -> int:
        return 1


positive_floats = st.floats(min_value=5e-324, max_value=1.7976931348623157e308)


@FAST
@given(weights=st.lists(st.one_of(positive_floats, st.sampled_from([1e308, 5e-324, 1.0])), min_size=2, max_size=3))
def test_a_mixture_draws_each_source_by_its_exact_share_whatever_the_weights_scale(weights):
    n = 2000
    mixture = MixtureBatches([Named(s) for s in range(len(weights))], weights, seed=3)
    drawn = [mixture.batch(i)[0] for i in range(n)]
    total = sum(map(Fraction, weights))
    for s, weight in enumerate(weights):
        p = float(Fraction(weight) / total)  # the share, in exact arithmetic
        count = drawn.count(s)
        assert abs(count - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1, (weights, s, count)


@pytest.mark.parametrize("weight", [math.inf, math.nan, 0.0, -1.0])
def test_a_source_weight_that_is_not_positive_and_finite_is_refused(weight):
    with pytest.raises(ConfigError) as error:
        DataSource("a.txt", weight).check()
    check_one_line(error.value)
    assert "weight" in str(error.value)


@pytest.mark.parametrize("weights,phrase", [(["1e308", "1e308"], None), (["inf", "1"], "finite")])
def test_kqv_train_takes_weights_of_any_scale_and_refuses_an_infinite_one(inputs, weights, phrase):
    pre, qa = inputs / "pre.txt", inputs / "qa.tsv"
    sources = f'data.sources=[{{path="{pre}", weight={weights[0]}}}, {{path="{qa}", weight={weights[1]}}}]'
    if phrase is not None:
        refused(train(inputs, "--set", sources), inputs, phrase)
        return
    summary = kqv.train(
        "lm", inputs / "tiny.toml", out=inputs / "run", steps=1, quiet=True, overrides=[sources, "data.context=64"]
    )
    assert summary["val"]["examples"] > 0


# -- W2: a mask that is the end of text ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data,settings",
    [
        (["pre.txt", "qa.tsv"], ['data.objective="span_corruption"', 'data.mask="\\n"']),
        (["qa.tsv"], ['data.template="{prompt}{mask}"', 'data.mask="\\n"']),
        (["pre.txt", "qa.tsv"], ['data.objective="span_corruption"', 'data.mask="<eos>"', 'data.tokenizer="bpe"']),
        (["qa.tsv"], ['data.template="{prompt}{mask}"', 'data.mask="<eos>"', 'data.tokenizer="bpe"']),
    ],
)
def test_a_mask_that_is_the_end_of_text_is_refused(inputs, data, settings):
    argv = train(inputs, *(a for name in data for a in ("--data", str(inputs / name))))
    refused([*argv, *(a for s in settings for a in ("--set", s))], inputs, "data.mask")


# -- W4: an invalid TOML value in --set ---------------------------------------------------------------------------


@FAST
@given(value=st.text(max_size=12))
def test_a_quoted_set_value_is_read_as_toml(value):
    quoted = tomli_w.dumps({"v": value})[4:].strip()  # "..." with TOML's escapes
    assert override_value(quoted) == value


@FAST
@given(raw=st.text(st.sampled_from("\"'\\qn{}ab ["), max_size=10).filter(lambda r: r.strip()[:1] in ("'", '"')))
def test_a_value_that_looks_quoted_is_toml_or_refused_in_one_line(raw):
    try:
        value = override_value(raw)
    except ConfigError as error:
        check_one_line(error)
        assert "TOML" in str(error) and "'" in str(error)
        return
    import tomllib

    assert value == tomllib.loads(f"v = {raw}")["v"]  # kept only when TOML reads it


def test_kqv_train_refuses_an_invalid_toml_string_and_says_how_to_quote(inputs):
    argv = train(inputs, "--data", str(inputs / "qa.tsv"), "--set", 'data.template="{prompt}\\q"')
    refused(argv, inputs, "data.template", "TOML", "single quotes")


def test_an_unquoted_set_value_is_still_a_bare_string(inputs):
    assert override_value("input.txt") == "input.txt" and override_value("runs/a b") == "runs/a b"


# -- W5: a LoRA scale that underflows ------------------------------------------------------------------------------


@FAST
@given(
    alpha=st.one_of(st.floats(1e-320, 1e4), st.sampled_from([1e-300, 1e-45, 1e-8, 1.0, 16.0])), rank=st.integers(1, 64)
)
def test_lora_options_that_train_nothing_are_refused_and_others_move_the_output(alpha, rank):
    try:
        config = LoRAConfig(rank=rank, alpha=alpha, targets=("to_queries",))
    except ConfigError as error:
        event("refused")
        check_one_line(error)
        return
    event("kept")
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(8, 8), config)
    x = torch.randn(4, 8)
    before = layer(x).detach()
    optimizer = torch.optim.Adam([layer.lora_a, layer.lora_b], lr=0.1)
    layer(x).square().sum().backward()
    optimizer.step()
    assert not torch.equal(layer(x).detach(), before), f"alpha={alpha}, rank={rank} trains nothing"


def test_kqv_train_refuses_a_lora_alpha_that_underflows(inputs):
    source = tiny_run(inputs / "source", steps=1)
    (inputs / "new.txt").write_text("To be, or not to be.\n" * 20)
    argv = ["train", "lm", "--init", str(source), "--data", str(inputs / "new.txt"), "--out", str(inputs / "ft")]
    sets = ["finetune.lora_rank=2", "finetune.lora_alpha=1e-300", "data.context=16", "train.batch_size=2"]
    refused([*argv, "--steps", "1", "--quiet", *(f"--set={s}" for s in sets)], inputs, "finetune.lora_alpha")


# -- W7: a saved page whose text opens an HTML comment --------------------------------------------------------------


class Scripts(HTMLParser):
    """Each <script> element's content, as an HTML parser ends it (at the first `</script`)."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[tuple[dict, str]] = []
        self._open: dict | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self._open = dict(attrs)
            self.scripts.append((self._open, ""))

    def handle_data(self, data):
        if self._open is not None:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)

    def handle_endtag(self, tag):
        if tag == "script":
            self._open = None


def check_page(page: str) -> dict:
    """The page's script elements obey HTML's restrictions for their content (no `<!--`, `<script` or `</script`,
    which in a browser would end one early or swallow the next: HTML Living Standard 4.12.1.3), and its data
    block parses back: returned."""
    parser = Scripts()
    parser.feed(page)
    parser.close()
    assert len(parser.scripts) == 2, [attrs for attrs, _ in parser.scripts]
    for _, text in parser.scripts:
        assert not re.search(r"<!--|<script|</script", text, re.IGNORECASE), re.findall(r".{20}<[!s/].{20}", text)
    (attrs, data), (_, script) = parser.scripts
    assert attrs == {"id": "kqv-data", "type": "application/json"} and "function" in script
    return json.loads(data)


HOSTILE = ["<!--", "<script>", "</script>", "-->", "</", "<", ">", "&", "<!--<script>", "\u2028", "</SCRIPT ", "é"]


@FAST
@given(text=st.lists(st.sampled_from(HOSTILE) | st.text(max_size=3), max_size=5).map("".join))
def test_a_saved_page_holds_any_text_in_its_data_and_its_script_whole(text):
    data = {"info": {"name": text}, "analysis": {"tokens": [text]}, "request": {"text": text}, "view": text}
    page = standalone_page(data["info"], data["analysis"], data["request"], text)
    assert check_page(page) == data


def test_kqv_explore_html_writes_a_page_whose_script_survives_its_text(tmp_path):
    run = tiny_run(tmp_path / "bpe", tokenizer="bpe", steps=1)
    page = tmp_path / "x.html"
    status, stderr = command(["explore", str(run), "--html", str(page), "--text", "<!--<script>"])
    assert status == 0, stderr
    assert check_page(page.read_text(encoding="utf-8"))["request"]["text"] == "<!--<script>"


# -- wording: <eos> inside a BPE document -------------------------------------------------------------------------


def test_eos_inside_a_bpe_document_gives_advice_that_fits_the_bpe_tokenizer(inputs):
    (inputs / "pre.txt").write_text("\n".join(LINES[:6]) + "\nann<eos>bob\n")
    argv = train(inputs, "--data", str(inputs / "pre.txt"), "--data", str(inputs / "qa.tsv"))
    stderr = refused([*argv, "--set", 'data.tokenizer="bpe"', "--set", "data.vocab_size=300"], inputs, "'<eos>'")
    assert "use the 'bpe' tokenizer" not in stderr and "data.delimiter" in stderr
