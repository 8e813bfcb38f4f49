"""Large inputs in the explorer: the input limit is the model's context (a GPT-2 of 1,024 positions takes 1,024
tokens and refuses 1,025 saying why), replies are gzip-compressed behind the front door and the continuation still
streams, and a 1,024-token input draws in Chromium as bitmaps, not a million SVG cells, with thinned labels and the
cell under the pointer described (the time per control change is benchmarks/explore_render.py's measure)."""

from __future__ import annotations

import gzip
import json

import httpx
import pytest
import torch
from starlette.testclient import TestClient

import test_explore_browser as shared
from kqv.data.tokenizers import BPETokenizer
from kqv.explore.app import create_app
from test_explore_browser import Page, Server
from test_interop import gpt2_config
from test_pretrained_dirs import TEXT, save

browser = shared.browser
TOKENS = 1024


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A random GPT-2 of 1,024 positions (1 layer, 2 heads) with its tokenizer, and a text of 1,024 of its tokens."""
    from transformers import GPT2LMHeadModel

    tokenizer = BPETokenizer.train(TEXT, vocab_size=300)
    torch.manual_seed(0)
    config = gpt2_config(vocab_size=tokenizer.vocab_size, n_positions=TOKENS, n_layer=1, n_head=2, n_embd=16)
    path = save(GPT2LMHeadModel(config).eval(), tokenizer, tmp_path_factory.mktemp("gpt2-1024"))
    ids = tokenizer.encode(TEXT * 8)
    text = tokenizer.decode(ids[:TOKENS])
    while len(tokenizer.encode(text)) > TOKENS:
        text = text[:-1]
    assert len(tokenizer.encode(text)) == TOKENS
    return path, text, tokenizer


@pytest.fixture(scope="module")
def client(gpt2):
    return TestClient(create_app(gpt2[0]), base_url="http://localhost:8765")


def test_the_input_limit_is_the_models_context_and_one_token_more_is_refused_saying_so(client, gpt2):
    _, text, tokenizer = gpt2
    assert client.get("/api/info").json()["max_tokens"] == TOKENS  # was 256 whatever the model
    longer = text + " question"
    assert len(tokenizer.encode(longer)) > TOKENS
    response = client.post("/api/analyze", json={"text": longer})
    assert response.status_code == 400
    message = response.json()["error"]
    assert "at most 1024" in message and "positions stop at max_len = 1024" in message and "--max-tokens" not in message


def test_an_explicit_limit_still_applies_below_the_context(gpt2):
    limited = TestClient(create_app(gpt2[0], max_tokens=100), base_url="http://localhost:8765")
    assert limited.get("/api/info").json()["max_tokens"] == 100
    error = limited.post("/api/analyze", json={"text": gpt2[1]}).json()["error"]
    # an app made in Python names the option in Python's words (`kqv explore` serves it in the command line's)
    assert "1024 tokens long" in error and "at most 100" in error and "larger max_tokens" in error


def test_replies_are_gzip_compressed_when_accepted_and_the_front_door_still_refuses_first(client, gpt2):
    _, text, _ = gpt2
    zipped = client.post("/api/analyze", json={"text": text}, headers={"Accept-Encoding": "gzip"})
    plain = client.post("/api/analyze", json={"text": text}, headers={"Accept-Encoding": "identity"})
    assert zipped.headers["content-encoding"] == "gzip" and "content-encoding" not in plain.headers
    assert zipped.json() == plain.json()  # the client decompressed it: the same numbers
    assert int(zipped.headers["content-length"]) * 5 < len(plain.content)
    assert len(zipped.json()["attention"]["self"]["layers"][0][0]) == TOKENS
    refused = client.post(
        "/api/analyze", json={"text": "To be"}, headers={"host": "evil.example", "Accept-Encoding": "gzip"}
    )
    assert refused.status_code == 421 and "open it at http://localhost:8765/" in refused.json()["error"]
    cross_site = client.post("/api/analyze", json={"text": "To be"}, headers={"Origin": "http://evil.example"})
    assert cross_site.status_code == 403


def test_the_continuation_still_streams_line_by_line_when_compressed(gpt2):
    with Server(create_app(gpt2[0])) as server:
        body = {"text": "To be", "max_new_tokens": 6}
        with httpx.stream(
            "POST", f"{server.url}/api/continue", json=body, headers={"Accept-Encoding": "gzip"}, timeout=60
        ) as response:
            assert response.headers["content-encoding"] == "gzip"
            chunks = [chunk for chunk in response.iter_raw() if chunk]
    # one compressed chunk per line as it is generated (flushed), not one at the end
    assert len(chunks) >= 7
    lines = gzip.decompress(b"".join(chunks)).decode().splitlines()
    assert len(lines) == 7 and json.loads(lines[-1])["done"]


def test_a_1024_token_input_draws_as_bitmaps_with_thinned_labels_and_no_console_errors(browser, gpt2):
    path, text, _ = gpt2
    with Server(create_app(path)) as server:
        p = Page(browser, server.url)
        p.page.goto(server.url + "/")
        p.page.wait_for_selector("#run:not(:empty)")
        p.page.fill("#text", text)
        p.page.click("#analyze")
        p.page.wait_for_selector("#head-view line.attn", state="attached", timeout=120_000)
        assert p.page.eval_on_selector_all("#head-view text.query", "ts => ts.length") == TOKENS
        assert p.page.eval_on_selector_all("#model-view canvas", "cs => cs.length") == 2
        p.page.click('#model-view canvas[data-layer="0"][data-head="1"]')
        assert p.page.eval_on_selector_all("#detail rect.weight", "rs => rs.length") == 0
        image = p.page.query_selector("#detail image.weights")
        assert image.get_attribute("data-rows") == image.get_attribute("data-columns") == str(TOKENS)
        labels = p.page.eval_on_selector_all("#detail g.labels text", "ts => ts.length")
        assert 50 < labels < TOKENS  # every few tokens on each axis, never 2 x 1,024 overlapping
        assert p.page.eval_on_selector_all("svg *", "es => es.length") < 10_000
        expected = httpx.post(f"{server.url}/api/analyze", json={"text": text}, timeout=120).json()
        weights = expected["attention"]["self"]["layers"][0][1]
        p.page.eval_on_selector("#detail-box", "box => box.scrollIntoView()")
        box = image.bounding_box()
        cell = box["width"] / TOKENS
        i, j = 400, 350
        p.page.mouse.move(box["x"] + (j + 0.5) * cell, box["y"] + (i + 0.5) * cell)
        assert p.page.is_visible("#tip")
        assert p.page.inner_text("#tip").endswith(f"weight {weights[i][j]:.4f}")
        p.page.select_option("#layer", index=0)  # a control change redraws without errors
        p.close()


def test_weights_in_millionths_decode_to_exactly_the_lists_numbers(client, gpt2):
    import base64

    import numpy as np

    text = gpt2[1][:300]
    lists = client.post("/api/analyze", json={"text": text}).json()["attention"]["self"]["layers"]
    packed = client.post("/api/analyze", json={"text": text, "weights": "micros"}).json()["attention"]["self"]["layers"]
    assert packed["encoding"] == "micros" and packed["shape"] == list(np.shape(lists))
    millionths = np.frombuffer(base64.b64decode(packed["data"]), dtype="<u4").reshape(packed["shape"])
    assert (millionths / 1e6).tolist() == lists  # the very same floats, as the page decodes them
    refused = client.post("/api/analyze", json={"text": text, "weights": "floats"})
    assert refused.status_code == 400 and "weights must be one of ['lists', 'micros']" in refused.json()["error"]
