"""The explorer's front door (kqv.explore.guard): only its own host and its own page reach the app, a body is read
only up to the limit, numbers JSON does not have are refused before a model runs, and everything the app and
metrics.jsonl write parses as strict JSON."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
import torch

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from starlette.testclient import TestClient

from explore_runs import train_run
from kqv.explore.app import MAX_BODY_BYTES, create_app
from kqv.train.metrics import append_metrics, plot_losses, read_metrics
from kqv.train.trainer import Trainer
from test_training import config, make_model, token_batches


def strict(text: str):
    """json.loads that refuses NaN, Infinity and -Infinity, as JavaScript's JSON.parse does."""

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("front-door")
    return {kind: train_run(kind, root) for kind in ("lm", "mt")}


@pytest.fixture(scope="module")
def lm(runs):
    return TestClient(create_app(runs["lm"], max_tokens=24), base_url="http://localhost:8765")


def assert_refused(response, status, *phrases):
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    message = strict(response.text)["error"]
    for phrase in phrases:
        assert phrase in message, message


# ---------------------------------------------------------------------------------------------------------------
# Host and Origin


@pytest.mark.parametrize(
    "host",
    [
        "evil.example.com",
        "evil.example.com:8765",
        "localhost.evil.example.com",
        "127.0.0.1.nip.io:8765",
        "user@localhost",
        "",
    ],
)
def test_a_foreign_host_is_refused_with_where_to_open_the_page(lm, host):
    response = lm.get("/api/info", headers={"host": host})
    assert_refused(response, 421, f"{host!r}" if host else "", "open it at http://localhost:8765/")
    assert_refused(lm.post("/api/analyze", json={"text": "To be"}, headers={"host": host}), 421)


@pytest.mark.parametrize(
    "host", ["localhost", "localhost:8765", "127.0.0.1", "127.0.0.1:8765", "[::1]:8765", "[::1]", "LocalHost:9000"]
)
def test_loopback_names_are_answered_with_or_without_a_port_and_no_other(lm, host):
    response = lm.post("/api/analyze", json={"text": "To be"}, headers={"host": host})
    assert response.status_code == 200 and strict(response.text)["tokens"] == list("To be")
    name, _, port = host.rpartition(":") if host.count(":") == 1 else (host, "", "")
    rebound = f"{name}.rebind.example.com" + (f":{port}" if port else "")  # a name of another site
    assert_refused(lm.post("/api/analyze", json={"text": "To be"}, headers={"host": rebound}), 421)


def test_the_host_given_to_listen_on_is_answered_and_others_are_not(runs):
    client = TestClient(create_app(runs["lm"], max_tokens=24, host="explorer.lan"), base_url="http://explorer.lan")
    assert client.get("/api/info").status_code == 200
    assert client.get("/api/info", headers={"host": "explorer.lan:8765"}).status_code == 200
    assert client.get("/api/info", headers={"host": "localhost"}).status_code == 200
    assert_refused(
        client.get("/api/info", headers={"host": "evil.example.com"}), 421, "open it at http://explorer.lan/"
    )


@pytest.mark.parametrize(
    "origin",
    [
        "https://evil.example.com",
        "http://evil.example.com:8765",
        "null",
        "http://localhost:3000",
        "https://localhost:8765",
        "http://127.0.0.1:8765",
    ],
)
def test_a_cross_site_post_is_refused_before_any_work(tmp_path, origin):
    client = TestClient(create_app(tmp_path / "nowhere"), base_url="http://localhost:8765")
    for path in ("/api/continue", "/api/analyze", "/api/export"):  # past the front door, these would be 404s
        response = client.post(path, json={"text": "To be"}, headers={"origin": origin})
        assert_refused(response, 403, repr(origin), "open it at http://localhost:8765/")
    assert_refused(client.post("/api/analyze", json={"text": "To be"}), 404, "no run directory")


def test_a_cross_site_request_without_origin_is_refused_by_sec_fetch_site(lm):
    cross = {"sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors"}
    assert_refused(lm.get("/api/info", headers=cross), 403, "cross-site")
    assert_refused(lm.post("/api/analyze", json={"text": "To"}, headers={**cross, "sec-fetch-mode": "navigate"}), 403)
    # a link from another site may open the page itself (it runs nothing); its requests are then same-origin
    assert lm.get("/", headers={"sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate"}).status_code == 200
    assert lm.get("/api/info", headers={"sec-fetch-site": "same-origin"}).status_code == 200


def test_a_same_origin_request_is_answered(lm):
    for origin, host in (
        ("http://localhost:8765", "localhost:8765"),
        ("http://127.0.0.1:9000", "127.0.0.1:9000"),
        ("http://[::1]:8765", "[::1]:8765"),
    ):
        headers = {"origin": origin, "host": host, "sec-fetch-site": "same-origin"}
        response = lm.post("/api/analyze", json={"text": "To be"}, headers=headers)
        assert response.status_code == 200, response.text
        other_port = {**headers, "origin": origin.rsplit(":", 1)[0] + ":1234", "sec-fetch-site": "same-site"}
        assert_refused(lm.post("/api/analyze", json={"text": "To be"}, headers=other_port), 403)


# ---------------------------------------------------------------------------------------------------------------
# Body size


def call_app(app, headers: dict[str, str], chunks):
    """Send one POST /api/analyze to the ASGI app, its body from `chunks` as it asks for it: (status, body)."""
    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/api/analyze",
        "raw_path": b"/api/analyze",
        "root_path": "",
        "query_string": b"",
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8765),
        "headers": [(k.encode(), v.encode()) for k, v in {"host": "localhost:8765", **headers}.items()],
    }
    sent = []

    async def receive():
        chunk = next(chunks, None)
        return (
            {"type": "http.disconnect"} if chunk is None else {"type": "http.request", "body": chunk, "more_body": True}
        )

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_an_oversized_streamed_body_is_refused_without_reading_the_rest(tmp_path):
    read = []

    def body():  # 64 KiB chunks, 1 GiB in all; reading past the limit + one chunk fails the test
        for _ in range((1 << 30) // (64 << 10)):
            read.append(64 << 10)
            if sum(read) > MAX_BODY_BYTES + (128 << 10):
                raise AssertionError(f"read {sum(read):,} bytes of an oversized body")
            yield b" " * (64 << 10)

    status, answer = call_app(create_app(tmp_path / "nowhere"), {"transfer-encoding": "chunked"}, body())
    assert status == 413 and "at most 1,048,576" in strict(answer)["error"]
    assert sum(read) <= MAX_BODY_BYTES + (64 << 10)


def test_a_content_length_over_the_limit_is_refused_before_reading(tmp_path):
    def body():
        raise AssertionError("the body was read although its Content-Length is over the limit")
        yield b""

    status, answer = call_app(create_app(tmp_path / "nowhere"), {"content-length": str(1 << 30)}, body())
    assert status == 413 and "Content-Length: 1,073,741,824" in strict(answer)["error"]


# ---------------------------------------------------------------------------------------------------------------
# Numbers


@pytest.mark.parametrize(
    "literal,shown", [("NaN", "NaN"), ("Infinity", "Infinity"), ("-Infinity", "-Infinity"), ("1e400", "Infinity")]
)
@pytest.mark.parametrize(
    "field,valid",
    [
        ("temperature", "0 (greedy) or a number from 0.001 to 100"),  # kqv.GenerationConfig's ranges
        ("top_p", "greater than 0 and at most 1"),
        ("top_k", "an integer of at least 1"),
        ("seed", "an integer from 0 to 2**63 - 1"),
    ],
)
def test_numbers_json_does_not_have_are_refused_before_continue_streams(lm, literal, shown, field, valid):
    raw = f'{{"text": "To be", "{field}": {literal}}}'.encode()
    response = lm.post("/api/continue", content=raw, headers={"content-type": "application/json"})
    assert_refused(response, 400, f"{field} is {shown}", "not a JSON number", valid)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "1e400"])
@pytest.mark.parametrize(
    "path,field,valid",
    [
        ("/api/analyze", "top_k", "an integer from 1 to 50"),
        ("/api/export", "top_k", "an integer from 1 to 50"),
        ("/api/analyze", "note", "a finite number"),
    ],
)
def test_numbers_json_does_not_have_are_refused_by_analyze_and_export(lm, literal, path, field, valid):
    raw = f'{{"text": "To be", "{field}": {literal}}}'.encode()
    response = lm.post(path, content=raw, headers={"content-type": "application/json"})
    assert_refused(response, 400, f"{field} is", "not a JSON number", valid)


@pytest.mark.parametrize(
    "body,phrase",
    [
        ({"temperature": 1e-300}, "temperature must be 0 (greedy) or a number from 0.001 to 100, got 1e-300"),
        ({"temperature": 1e6}, "temperature must be 0 (greedy) or a number from 0.001 to 100, got 1000000.0"),
        ({"temperature": True}, "temperature must be a finite number, got bool True"),
        ({"top_p": 0}, "top_p must be a number greater than 0 and at most 1, got 0"),
        ({"top_p": 1.5}, "top_p must be a number greater than 0 and at most 1, got 1.5"),
    ],
)
def test_out_of_range_sampling_options_are_refused_before_continue_streams(lm, body, phrase):
    assert_refused(lm.post("/api/continue", json={"text": "To be", **body}), 400, phrase)


def test_an_out_of_range_beam_is_refused_naming_its_range(runs):
    client = TestClient(create_app(runs["mt"], max_tokens=24), base_url="http://localhost")
    assert_refused(
        client.post("/api/analyze", json={"text": "eins", "beam": 10**6}), 400, "beam must be an integer from 1 to 16"
    )
    raw = b'{"text": "eins", "beam": NaN}'
    assert_refused(client.post("/api/analyze", content=raw), 400, "beam is NaN", "an integer from 1 to 16")


def test_an_integer_too_long_to_read_is_a_400(lm):
    raw = b'{"text": "To", "seed": ' + b"9" * 5000 + b"}"
    assert_refused(lm.post("/api/continue", content=raw), 400, "not valid JSON")


# ---------------------------------------------------------------------------------------------------------------
# Strict JSON out


def test_every_answer_parses_as_strict_json(lm):
    answers = [
        lm.get("/api/info"),
        lm.post("/api/analyze", json={"text": "To be", "top_k": 3}),
        lm.post("/api/analyze", json={"text": ""}),
        lm.get("/api/nothing"),
        lm.post("/api/continue", content=b'{"text": "To", "temperature": NaN}'),
        lm.get("/", headers={"host": "evil.example.com"}),
    ]
    for response in answers:
        assert isinstance(strict(response.text), dict)
    with lm.stream("POST", "/api/continue", json={"text": "To be", "temperature": 1e-3, "max_new_tokens": 4}) as r:
        lines = [strict(line) for line in r.iter_lines() if line]
    assert r.status_code == 200 and lines[-1]["done"] and lines[-1]["options"]["temperature"] == 1e-3


def test_non_finite_model_outputs_are_sent_as_null(runs, tmp_path):
    from kqv.explore.export import write_standalone
    from kqv.explore.loading import load_subject

    subject = load_subject(runs["lm"], 24)
    client = TestClient(create_app(runs["lm"], subject=subject), base_url="http://localhost")
    with torch.no_grad():
        for weight in subject.model.parameters():
            weight.fill_(math.nan)  # a diverged run: every logit, hence every probability, is NaN
    response = client.post("/api/analyze", json={"text": "To be", "top_k": 2})
    assert response.status_code == 200, response.text
    body = strict(response.text)
    assert all(entry["p"] is None for row in body["next_tokens"] for entry in row)
    inlined = lambda page: page.split('<script id="kqv-data" type="application/json">')[1].split("</script>")[0]
    assert strict(inlined(client.post("/api/export", json={"text": "To be", "top_k": 2}).text))["analysis"] == body
    saved = write_standalone(subject, "To be", tmp_path / "diverged.html")  # kqv explore RUN --html FILE
    assert all(
        entry["p"] is None for row in strict(inlined(saved.read_text()))["analysis"]["next_tokens"] for entry in row
    )


# ---------------------------------------------------------------------------------------------------------------
# metrics.jsonl


def test_metrics_of_a_run_whose_validation_loss_is_not_finite_parse_strictly(tmp_path):
    def loss_fn(model, batch):  # finite in training, infinite in evaluation (a validation set that overflows)
        return model(*batch) * (1.0 if model.training else math.inf)

    Trainer(
        make_model(),
        config(steps=3, eval_every=3),
        tmp_path,
        train_batches=token_batches(4),
        loss_fn=loss_fn,
        val_batches=token_batches(4, offset=10_000),
        quiet=True,
    ).train()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [strict(line) for line in lines]
    assert records[-1]["step"] == 3 and records[-1]["val_loss"] is None
    assert all(math.isfinite(r["train_loss"]) for r in records)
    assert read_metrics(tmp_path / "metrics.jsonl") == records
    assert (tmp_path / "loss.png").stat().st_size > 0  # the plot skips the missing point


def test_metrics_write_nan_and_infinity_as_null_and_old_files_still_read(tmp_path):
    path = tmp_path / "metrics.jsonl"
    append_metrics(path, {"step": 1, "train_loss": math.nan, "grad_norm": math.inf, "per_expert": [1.0, -math.inf]})
    assert strict(path.read_text()) == {"step": 1, "train_loss": None, "grad_norm": None, "per_expert": [1.0, None]}
    with open(path, "a") as file:
        file.write('{"step": 2, "val_loss": NaN}\n')  # as written before
    old = read_metrics(path)[1]
    assert old["step"] == 2 and math.isnan(old["val_loss"])
    plot_losses(path, tmp_path / "loss.png")
