"""Look closer and intervene in a real headless Chromium (the recorder of test_explore_browser.py: no request
leaves the app, no console error): the neuron view draws the server's numbers for the chosen head and token, a
replaced token shows the attention and predictions of a forward pass on the edited ids, and the ablation table's
losses equal a forward pass of the model with that head's output columns zeroed."""

from __future__ import annotations

import pytest
import torch

import test_explore_browser as shared
from kqv.explore.interventions import neuron_view, replace_token
from test_explore_browser import Page, Server, create_app
from test_explore_browser_state import Held
from test_explore_interventions import TEXT, ids_of, lm_subject, mlm_subject, reference

browser = shared.browser  # the shared module's Chromium, used here by name


def wait_until(p: Page, check, what: str) -> None:
    """Poll `check(page)` (the page's CSP forbids the eval behind Playwright's wait_for_function)."""
    for _ in range(200):
        if check(p.page):
            return
        p.page.wait_for_timeout(50)
    raise AssertionError(f"the page never showed {what}")


def neuron_label(page) -> str:
    return page.get_attribute("#neuron", "aria-label") or ""


@pytest.fixture(scope="module")
def subjects():
    torch.manual_seed(0)
    return {"lm": lm_subject(position="rope"), "mlm": mlm_subject()}


@pytest.fixture(scope="module")
def servers(subjects):
    with Server(create_app("tiny-lm", subject=subjects["lm"])) as lm:
        with Server(create_app("tiny-mlm", subject=subjects["mlm"])) as mlm:
            yield {"lm": lm, "mlm": mlm}


@pytest.fixture
def opened(browser, servers):
    pages = []

    def open_page(kind: str, text: str = TEXT) -> Page:
        p = Page(browser, servers[kind].url)
        pages.append(p)
        p.page.goto(servers[kind].url + "/")
        p.page.wait_for_selector("#run:not(:empty)")
        p.page.fill("#text", text)
        p.page.click("#analyze")
        p.page.wait_for_selector("#intervene:not([hidden])")
        return p

    yield open_page
    for p in pages:
        p.close(getattr(p, "expected_errors", 0))


def test_the_neuron_view_draws_the_servers_numbers_for_the_chosen_head_and_token(opened, subjects, tmp_path):
    p = opened("lm")
    p.page.click("#model-view canvas[data-layer='1'][data-head='2']")  # open layer 2, head 3: the neuron view follows
    p.page.click("#head-view text.query[data-index='4']")
    wait_until(p, lambda page: "query 5" in neuron_label(page), "the neuron view of query 5")
    assert "layer 2, head 3" in p.page.get_attribute("#neuron", "aria-label")
    rows = p.page.eval_on_selector_all(
        "#neuron .neuron-row",
        "rs => rs.map(r => [+r.dataset.score, +r.dataset.weight, r.classList.contains('masked')])",
    )
    ids = ids_of(subjects["lm"])
    with torch.no_grad():
        weights = subjects["lm"].model.attention_weights(ids)[1][0, 2, 4]
    assert len(rows) == ids.shape[1]
    for j, (_score, weight, masked) in enumerate(rows):
        assert masked == (j > 4)
        assert weight == pytest.approx(float(weights[j]), abs=1e-5)
    # the products drawn are the server's: point at key 3's product in dimension 2 and read its numbers
    served = neuron_view(subjects["lm"], {"text": TEXT, "layer": 1, "head": 2, "token": 4})
    p.page.locator("#neuron image.products").scroll_into_view_if_needed()
    box = p.page.locator("#neuron image.products").bounding_box()
    head_dim = subjects["lm"].model.config.head_dim
    p.page.mouse.move(box["x"] + 1.5 * box["width"] / head_dim, box["y"] + 2.5 * box["height"] / len(rows))
    info = p.page.text_content("#neuron-info")
    assert f"key 3 (c), dimension 2: q = {served['query'][1]:.4f}, k = {served['keys'][2][1]:.4f}" in info
    assert f"q \u00d7 k = {served['products'][2][1]:.4f}" in info
    assert [row[0] for row in rows] == pytest.approx(served["scores"], abs=1e-6)
    p.page.screenshot(path=str(tmp_path / "neuron.png"), full_page=True)
    p.page.select_option("#iv-head", "0")
    wait_until(p, lambda page: "head 1," in neuron_label(page), "the neuron view of head 1")


def test_replacing_a_token_shows_a_forward_pass_on_the_edited_ids(opened, subjects, tmp_path):
    p = opened("lm")
    p.page.select_option("#replace-position", "4")
    p.page.fill("#replacement", "j")
    p.page.click("#replace")
    p.page.wait_for_selector("#replace-predictions tbody tr")
    assert p.page.locator(".replace-map canvas").count() == 3
    model, ids = subjects["lm"].model, ids_of(subjects["lm"])
    edited = ids.clone()
    edited[0, 4] = subjects["lm"].tokenizer.encode("j")[0]
    with torch.no_grad():
        after = model(edited)[0, -1].softmax(-1)
    shown = p.page.eval_on_selector_all(
        "#replace-predictions tbody tr",
        "rs => rs.map(r => [+r.dataset.id, +r.querySelector('[data-key=after]').textContent])",
    )
    assert shown and all(value == pytest.approx(float(after[i]), abs=1e-4) for i, value in shown)
    assert "after: \u201cj\u201d" in p.page.text_content("#replace-maps")
    p.page.screenshot(path=str(tmp_path / "replace.png"), full_page=True)


def test_masking_a_token_in_an_encoder_shows_the_guess_there(opened, subjects):
    p = opened("mlm")
    assert p.page.get_attribute("#replacement", "placeholder") == "[MASK]"
    assert p.page.is_hidden("#ablate-box")  # switching heads off measures an LM's loss
    p.page.select_option("#replace-position", "2")
    p.page.click("#replace")
    p.page.wait_for_selector("#replace-predictions tbody tr")
    assert "the token at position 3" in p.page.text_content("#replace-predicts")


def test_the_ablation_table_equals_a_forward_pass_with_the_head_zeroed_and_sorts(opened, subjects, tmp_path):
    p = opened("lm")
    p.page.click("#ablate")
    p.page.wait_for_selector("#ablation tbody tr")
    model, ids = subjects["lm"].model, ids_of(subjects["lm"])
    rows = p.page.eval_on_selector_all(
        "#ablation tbody tr",
        "rs => rs.map(r => [+r.dataset.layer, +r.dataset.head, +r.querySelector('[data-key=loss]').dataset.value])",
    )
    assert len(rows) == 8
    # the app's lock: the page may still be asking the server for a view, whose recording hooks a copy would carry
    with torch.no_grad(), subjects["lm"].lock:
        for layer, head, loss in rows:
            assert loss == pytest.approx(reference(model, ids, [(layer, head)])[0], abs=1e-6)
    p.page.click("#ablation th[data-key='delta']")  # sorted by the change of the loss, largest first
    deltas = p.page.eval_on_selector_all("#ablation td[data-key='delta']", "ts => ts.map(t => +t.dataset.value)")
    assert deltas == sorted(deltas, reverse=True)
    p.page.check("#ablation tr[data-layer='0'][data-head='1'] input")
    p.page.check("#ablation tr[data-layer='1'][data-head='3'] input")
    p.page.click("#ablate-chosen")
    p.page.wait_for_selector("#ablate-next caption")
    together = float(p.page.get_attribute("#ablate-next caption", "data-loss"))
    with torch.no_grad(), subjects["lm"].lock:
        assert together == pytest.approx(reference(model, ids, [(0, 1), (1, 3)])[0], abs=1e-6)
    assert "L1 H2, L2 H4 off together" in p.page.text_content("#ablate-next caption")
    p.page.screenshot(path=str(tmp_path / "ablation.png"), full_page=True)


def test_a_new_text_clears_the_old_results_and_a_refused_one_hides_the_section(opened):
    p = opened("lm")
    p.page.click("#ablate")
    p.page.wait_for_selector("#ablation tbody tr")
    p.page.fill("#text", "bad dog")  # 'o' is not in the tiny tokenizer's alphabet: refused
    p.page.click("#analyze")
    p.page.wait_for_selector("#error:not([hidden])")
    p.expected_errors = 1  # the browser logs the 400 of the refused input
    assert p.page.is_hidden("#intervene")
    p.page.fill("#text", "bad cab")
    p.page.click("#analyze")
    p.page.wait_for_selector("#intervene:not([hidden])")
    assert p.page.locator("#ablation tbody tr").count() == 0
    wait_until(p, lambda page: page.locator("#neuron .neuron-row").count() == 7, "the new text's neuron view")


def test_a_late_reply_is_never_drawn_over_a_newer_request(opened):
    p = opened("lm")
    wait_until(p, lambda page: "query 12" in neuron_label(page), "the first neuron view")
    held = Held(p, "/api/neuron")
    p.page.click("#head-view text.query[data-index='2']")
    held.wait(p)
    p.page.click("#head-view text.query[data-index='6']")
    held.wait(p, 2)
    held.release()  # both go on: the reply for token 3, if any, arrives after its request was replaced
    wait_until(p, lambda page: "query 7" in neuron_label(page), "the neuron view of the newer request")
    p.page.wait_for_timeout(300)
    assert "query 7" in neuron_label(p.page)
    replies = Held(p, "/api/replace")
    p.page.click("#replace")  # the LM has no mask token: this one would be refused, but it is held
    replies.wait(p)
    p.page.fill("#text", "bad cab")
    p.page.click("#analyze")
    wait_until(p, lambda page: page.locator("#neuron .neuron-row").count() == 7, "the new text's neuron view")
    replies.release()
    p.page.wait_for_timeout(300)
    assert p.page.is_hidden("#iv-error") and p.page.locator("#replace-predictions tr").count() == 0


def test_a_long_texts_neuron_view_opens_when_asked(browser):
    subject = lm_subject(max_len=320)
    subject.limit = 300
    with Server(create_app("tiny-long", subject=subject)) as server:
        p = Page(browser, server.url)
        asked = []
        p.page.on("request", lambda request: "/api/neuron" in request.url and asked.append(request.url))
        p.page.goto(server.url + "/")
        p.page.wait_for_selector("#run:not(:empty)")
        p.page.fill("#text", (TEXT + " ") * 22)  # 286 characters, one token each
        p.page.click("#analyze")
        p.page.wait_for_selector("#intervene:not([hidden])")
        p.page.wait_for_timeout(300)
        assert not asked and p.page.locator("#neuron .neuron-row").count() == 0  # closed: nothing asked or drawn
        p.page.click("#neuron-box summary")
        wait_until(p, lambda page: page.locator("#neuron .neuron-row").count() == 286, "the opened neuron view")
        assert len(asked) == 1
        p.close()


def test_replace_a_token_gives_each_colour_one_meaning_in_its_panel(opened, subjects):
    """In "Replace a token" red is more and blue is less, in the difference map and in the change column alike
    (the column once drew a decrease red); the weights of the before and after maps are grey, and a legend says so."""
    p = opened("lm")
    p.page.select_option("#replace-position", "4")
    p.page.fill("#replacement", "j")
    p.page.click("#replace")
    p.page.wait_for_selector("#replace-predictions tbody tr")
    served = replace_token(subjects["lm"], {"text": TEXT, "position": 4, "replacement": "j", "layer": 0, "head": 0})
    before, after, difference = p.page.eval_on_selector_all(
        ".replace-map canvas",
        "cs => cs.map(c => Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data))",
    )
    width = len(served["difference"][0])
    for image in (before, after):  # an amount: grey, never red or blue
        assert all(image[k] == image[k + 1] == image[k + 2] for k in range(0, len(image), 4))
    signs = {1: 0, -1: 0}
    for i, row in enumerate(served["difference"]):
        for j, change in enumerate(row):
            red, _, blue, _ = difference[4 * (i * width + j) : 4 * (i * width + j) + 4]
            if red != blue:  # a change too small to tint its cell stays white
                signs[1 if red > blue else -1] += 1
                assert (red > blue) == (change > 0), (i, j, change, red, blue)
    assert signs[1] and signs[-1]  # the map has both colours to tell apart
    rows = p.page.eval_on_selector_all(
        "#replace-predictions tbody tr",
        "rs => rs.map(r => { const td = r.querySelector('[data-key=change]');"
        " return [+td.textContent, getComputedStyle(td).color]; })",
    )
    colours = {"rgb(178, 24, 43)": 1, "rgb(33, 102, 172)": -1}  # the map's red and blue
    assert any(change for change, _ in rows)
    for change, colour in rows:
        if change:
            assert colours.get(colour) == (1 if change > 0 else -1), (change, colour)
    legend = p.page.inner_text("#replace-legend")
    assert "red, more" in legend and "blue, less" in legend and "change column" in legend
