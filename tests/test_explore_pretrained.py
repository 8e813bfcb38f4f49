"""`kqv explore DIR` on a Hugging Face directory saved with its tokenizer (random-initialised `transformers` models,
a tokenizer trained with BPETokenizer.train, nothing downloaded): a GPT-2 is shown like an LM run and a BERT like
an encoder run, with Hugging Face's own attention weights and probabilities; a sentence-transformers directory is
still the embedding model; a directory kqv cannot convert is a clear error, never a traceback."""

import json

import pytest
import torch
from starlette.testclient import TestClient

from kqv.data.tokenizers import BPETokenizer
from kqv.explore.analysis import readable_piece
from kqv.explore.app import create_app
from kqv.explore.loading import load_subject
from test_interop import bert_config, gpt2_config
from test_pretrained_dirs import TEXT, save

PROMPT = "whether 'tis nobler"


@pytest.fixture(scope="module")
def tokenizer():
    return BPETokenizer.train(TEXT, vocab_size=300, special_tokens=["[MASK]"])


@pytest.fixture(scope="module")
def dirs(tokenizer, tmp_path_factory):
    from transformers import BertForMaskedLM, BertModel, GPT2LMHeadModel

    made = {}
    for name, model_class, config in [
        ("gpt2", GPT2LMHeadModel, gpt2_config(vocab_size=tokenizer.vocab_size, n_positions=64)),
        ("bert", BertModel, bert_config(vocab_size=tokenizer.vocab_size, max_position_embeddings=64)),
        ("bert-mlm", BertForMaskedLM, bert_config(vocab_size=tokenizer.vocab_size, max_position_embeddings=64)),
    ]:
        torch.manual_seed(0)
        made[name] = save(model_class(config).eval(), tokenizer, tmp_path_factory.mktemp(name))
    return made


def hf_attentions(path, ids):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(torch.tensor([ids]), output_attentions=True).attentions  # per layer (1, heads, t, t)


def assert_weights_equal(view, expected):
    assert len(view["layers"]) == len(expected)
    for ours, theirs in zip(view["layers"], expected):
        torch.testing.assert_close(torch.tensor(ours, dtype=torch.float64), theirs[0].double(), atol=2e-6, rtol=0)


def test_a_gpt2_directory_is_shown_like_an_lm_run_with_hugging_faces_numbers(dirs, tokenizer):
    from transformers import GPT2LMHeadModel

    client = TestClient(create_app(dirs["gpt2"]))
    info = client.get("/api/info").json()
    assert info["task"] == "lm" and info["hf_class"] == "GPT2LMHeadModel" and info["max_tokens"] == 64
    assert {"head", "model", "stats", "next", "continue"} <= set(info["views"])
    body = client.post("/api/analyze", json={"text": PROMPT, "top_k": 3}).json()
    ids = tokenizer.encode(PROMPT)
    assert body["ids"] == ids and body["tokens"] == [tokenizer.decode([i]) for i in ids]
    assert_weights_equal(body["attention"]["self"], hf_attentions(dirs["gpt2"], ids))
    with torch.no_grad():
        probs = GPT2LMHeadModel.from_pretrained(dirs["gpt2"]).eval()(torch.tensor([ids])).logits[0].softmax(-1)
    top = probs.topk(3, dim=-1)
    assert [[t["id"] for t in row] for row in body["next_tokens"]] == top.indices.tolist()
    torch.testing.assert_close(
        torch.tensor([[t["p"] for t in row] for row in body["next_tokens"]]), top.values.float(), atol=2e-6, rtol=0
    )
    lines = [json.loads(line) for line in client.post("/api/continue", json={"text": PROMPT}).text.splitlines()]
    assert lines[-1]["done"] and lines[-1]["text"].startswith(PROMPT) and len(lines) > 2


def test_a_bert_directory_is_shown_like_an_encoder_run_with_hugging_faces_weights(dirs, tokenizer):
    client = TestClient(create_app(dirs["bert"]))
    info = client.get("/api/info").json()
    assert info["task"] == "encoder" and info["hf_class"] == "BertModel" and "next" not in info["views"]
    body = client.post("/api/analyze", json={"text": PROMPT}).json()
    ids = tokenizer.encode(PROMPT)
    assert body["ids"] == ids and body["attention"]["self"]["causal"] is False
    assert_weights_equal(body["attention"]["self"], hf_attentions(dirs["bert"], ids))
    assert client.post("/api/continue", json={"text": PROMPT}).status_code == 400  # not a language model


def test_a_bert_masked_lm_directory_guesses_the_masks_with_hugging_faces_probabilities(dirs, tokenizer):
    from transformers import BertForMaskedLM

    client = TestClient(create_app(dirs["bert-mlm"]))
    assert "masked" in client.get("/api/info").json()["views"]
    text = "whether [MASK] nobler"
    body = client.post("/api/analyze", json={"text": text}).json()
    ids = tokenizer.encode(text)
    position = ids.index(tokenizer.token_to_id("[MASK]"))
    assert body["tokens"][position] == "[MASK]" and [m["position"] for m in body["masked"]] == [position]
    with torch.no_grad():
        logits = BertForMaskedLM.from_pretrained(dirs["bert-mlm"]).eval()(torch.tensor([ids])).logits[0, position]
    top = logits.softmax(-1).topk(5)
    assert [t["id"] for t in body["masked"][0]["top"]] == top.indices.tolist()
    assert_weights_equal(body["attention"]["self"], hf_attentions(dirs["bert-mlm"], ids))


def test_a_sentence_transformers_directory_is_still_the_embedding_model():
    from kqv.interop.sentence_encoder import minilm_directory

    assert load_subject(minilm_directory()).task == "embedding"


@pytest.mark.parametrize(
    "config,with_tokenizer,phrases",
    [
        (
            {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5"},
            True,
            ["has no weights", "model.safetensors"],
        ),
        ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, False, ["tokenizer.json", "save_pretrained"]),
    ],
)
def test_a_directory_kqv_cannot_convert_is_a_clear_error(tmp_path, dirs, config, with_tokenizer, phrases):
    (tmp_path / "config.json").write_text(json.dumps(config))
    if with_tokenizer:
        (tmp_path / "tokenizer.json").write_bytes((dirs["gpt2"] / "tokenizer.json").read_bytes())
    response = TestClient(create_app(tmp_path)).get("/api/info")
    assert response.status_code == 400 and all(p in response.json()["error"] for p in phrases), response.json()
    assert "Traceback" not in response.text and "internal error" not in response.text


def test_kqv_explore_html_on_an_unconvertible_directory_says_why_without_a_traceback(tmp_path, capsys):
    from kqv.cli.main import main

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["T5Model"], "model_type": "t5"}))
    (tmp_path / "tokenizer.json").write_text("{}")
    code = main(["explore", str(tmp_path), "--html", str(tmp_path / "out.html"), "--text", "hello"])
    captured = capsys.readouterr()
    assert code != 0 and "Traceback" not in captured.out + captured.err
    assert "cannot read" in captured.out + captured.err


def test_a_lone_byte_of_a_byte_level_piece_is_shown_by_its_bytes(tokenizer):
    ids = tokenizer.encode("\u2603")  # the snowman: three bytes E2 98 83, not merged in a Shakespeare vocabulary
    hf = tokenizer.tokenizer
    labels = [readable_piece(tokenizer.decode, hf.id_to_token, i) for i in ids]
    assert "".join(labels) == "<0xE2><0x98><0x83>" and all("\ufffd" not in label for label in labels)
    whole = tokenizer.encode(" to")
    assert [readable_piece(tokenizer.decode, hf.id_to_token, i) for i in whole] == [
        tokenizer.decode([i]) for i in whole
    ]
