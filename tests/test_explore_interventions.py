"""Look closer and intervene (kqv.explore.interventions), every number against an independent computation: the
neuron view's products sum to the scores and its softmax is the model's own attention weights; a replaced token's
views are a forward pass on the edited ids; a head switched off is a copy of the model with that head's columns of
the output projection zeroed (zero ablation) or folded into its bias (mean ablation); on Hugging Face GPT-2 and BERT
directories, the same against Hugging Face's own models. And the front door refuses bad numbers on the new
endpoints."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import test_explore_pretrained as pretrained
from conftest import tiny_config
from kqv.data.tokenizers import CharTokenizer
from kqv.data.vocabulary import Vocabulary
from kqv.errors import DataError
from kqv.explore.interventions import ablate_heads, neuron_view, replace_token, self_attention_layers
from kqv.explore.subjects import ClassifierSubject, LMSubject, MLMSubject, NotApplicable
from kqv.jobs.sampling import SampleConfig
from kqv.nn.heads import MaskedLM, SequenceClassifier
from kqv.nn.models import DecoderLM

TEXT = "abc bad cafe"


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def lm_subject(**changes) -> LMSubject:
    tokenizer = CharTokenizer.train("abcdefghij ")
    model = DecoderLM(tiny_config(vocab_size=tokenizer.vocab_size, **changes))
    run = SimpleNamespace(model=model, tokenizer=tokenizer, config=SimpleNamespace(sample=SampleConfig()))
    return LMSubject("tiny", run, limit=64)


def mlm_subject(**changes) -> MLMSubject:
    vocabulary = Vocabulary.train("char", "abcdefghij ", 0)
    return MLMSubject("tiny", MaskedLM(tiny_config(vocab_size=vocabulary.size, **changes)), vocabulary, limit=64)


def ids_of(subject, text: str = TEXT) -> torch.Tensor:
    return torch.tensor([subject.tokenizer.encode(text)])


# ---------------------------------------------------------------------------------------------------------------
# The neuron view


@pytest.mark.parametrize("position", ["sinusoidal", "learned", "rope", "alibi", "relative"])
def test_neuron_products_sum_to_the_scores_and_their_softmax_is_the_models_attention(position):
    subject = lm_subject(position=position)
    weights = subject.model.attention_weights(ids_of(subject))  # per layer (1, heads, time, time)
    time, head_dim = weights[0].shape[-1], subject.model.config.head_dim
    for layer in range(2):
        for head in range(4):
            for token in (0, 5, time - 1):
                view = neuron_view(subject, {"text": TEXT, "layer": layer, "head": head, "token": token})
                products, scores = torch.tensor(view["products"]), torch.tensor(view["scores"])
                assert products.shape == (time, head_dim)
                torch.testing.assert_close(products.sum(-1), scores, atol=1e-5, rtol=0)
                query, keys = torch.tensor(view["query"]), torch.tensor(view["keys"])
                torch.testing.assert_close(keys @ query, scores, atol=1e-5, rtol=0)
                scaled = scores / math.sqrt(head_dim) + torch.tensor(view["bias"])
                torch.testing.assert_close(torch.tensor(view["scaled"]), scaled, atol=1e-5, rtol=0)
                torch.testing.assert_close(
                    torch.tensor(view["weights"]), weights[layer][0, head, token], atol=1e-5, rtol=0
                )
                assert view["allowed"] == [j <= token for j in range(time)]  # causal: the future is masked
    assert view["has_bias"] == (position in ("alibi", "relative"))


def test_an_encoders_neuron_view_sees_every_token_and_matches_its_attention():
    subject = mlm_subject(position="rope")
    text = "abc[MASK] dig"
    ids, _ = subject.tokenize(text)
    weights = subject.encoder.attention_weights(torch.tensor([ids]))
    view = neuron_view(subject, {"text": text, "layer": 1, "head": 2, "token": 1})
    assert view["tokens"][3] == "[MASK]" and all(view["allowed"]) and not view["causal"]
    torch.testing.assert_close(torch.tensor(view["weights"]), weights[1][0, 2, 1], atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# Replacing a token


def test_replacing_a_token_in_an_lm_equals_a_forward_pass_on_the_edited_ids():
    subject = lm_subject(position="rope")
    model, ids = subject.model, ids_of(subject)
    edited = ids.clone()
    edited[0, 4] = subject.tokenizer.encode("j")[0]
    answer = replace_token(subject, {"text": TEXT, "position": 4, "replacement": "j", "layer": 1, "head": 3})
    assert answer["tokens"][4] == "b" and answer["edited_tokens"][4] == "j"
    for key, batch in (("before", ids), ("after", edited)):
        torch.testing.assert_close(
            torch.tensor(answer[key]), model.attention_weights(batch)[1][0, 3], atol=1e-6, rtol=0
        )
    difference = model.attention_weights(edited)[1][0, 3] - model.attention_weights(ids)[1][0, 3]
    torch.testing.assert_close(torch.tensor(answer["difference"]), difference, atol=2e-6, rtol=0)
    probs = {key: model(batch)[0, -1].softmax(-1) for key, batch in (("before", ids), ("after", edited))}
    assert answer["predicts"] == "the next token after the text"
    for row in answer["predictions"]:
        for key in ("before", "after"):
            assert row[key] == pytest.approx(float(probs[key][row["id"]]), abs=1e-6)
    top = probs["before"].topk(5).indices.tolist()
    assert [row["id"] for row in answer["predictions"][:5]] == top
    # the heads' change: 0 in layer 1 for the tokens before the edit, the largest first
    changes = [row["change"] for row in answer["change"]]
    assert changes == sorted(changes, reverse=True) and len(changes) == 8


def test_masking_a_token_in_an_encoder_equals_a_forward_pass_with_the_mask_there():
    subject = mlm_subject()
    ids, _ = subject.tokenize(TEXT)
    edited = [*ids]
    edited[2] = subject.vocabulary.mask_id
    answer = replace_token(subject, {"text": TEXT, "position": 2, "layer": 0, "head": 1, "top_k": 3})
    assert answer["edited_tokens"][2] == "[MASK]" and answer["predicts"] == "the token at position 3"
    after = subject.model(torch.tensor([edited]))[0, 2].softmax(-1)
    before = subject.model(torch.tensor([ids]))[0, 2].softmax(-1)
    for row in answer["predictions"]:
        assert row["after"] == pytest.approx(float(after[row["id"]]), abs=1e-6)
        assert row["before"] == pytest.approx(float(before[row["id"]]), abs=1e-6)
    weights = subject.encoder.attention_weights(torch.tensor([edited]))[0][0, 1]
    torch.testing.assert_close(torch.tensor(answer["after"]), weights, atol=1e-6, rtol=0)


def test_replacing_a_token_in_a_classifier_compares_its_class_probabilities():
    vocabulary = Vocabulary.train("char", "abcdefghij ", 0)
    model = SequenceClassifier(tiny_config(vocab_size=vocabulary.size), n_classes=3, pooling="mean").eval()
    subject = ClassifierSubject("tiny", model, vocabulary, ["neg", "neutral", "pos"], limit=64)
    answer = replace_token(subject, {"text": TEXT, "position": 1, "replacement": "j"})
    ids, _ = subject.tokenize(TEXT)  # [CLS] + the text
    edited = [*ids]
    edited[1] = vocabulary.encode("j")[0]
    assert answer["tokens"][0] == "[CLS]" and answer["edited_tokens"][1] == "j"
    before, after = (model(torch.tensor([i]))[0].softmax(-1) for i in (ids, edited))
    assert answer["predicts"] == "the class probabilities"
    assert {row["token"] for row in answer["predictions"]} == {"neg", "neutral", "pos"}
    for row in answer["predictions"]:
        assert row["before"] == pytest.approx(float(before[row["id"]]), abs=1e-6)
        assert row["after"] == pytest.approx(float(after[row["id"]]), abs=1e-6)


@pytest.mark.parametrize(
    "request_, phrase",
    [
        ({"replacement": "abc"}, "is 3 tokens"),
        ({"replacement": None}, "has no mask token"),
        ({"replacement": 5}, "non-empty string"),
        ({"position": 12}, "position must be an integer from 0 to 11"),
    ],
)
def test_a_replacement_that_is_not_one_token_is_refused(request_, phrase):
    with pytest.raises(DataError, match=phrase):
        replace_token(lm_subject(), {"text": TEXT, **request_})


# ---------------------------------------------------------------------------------------------------------------
# Switching heads off: against a copy of the model whose output projection ignores the head


def zeroed_copy(model, heads, means=None):
    """The model with each (layer, head)'s columns of its output projection zeroed; with `means`, that head's
    mean output folded into the projection's bias first (mean ablation)."""
    copied = copy.deepcopy(model)
    layers = self_attention_layers(copied)
    with torch.no_grad():
        for layer, head in heads:
            out, part = (
                layers[layer].to_output,
                slice(head * layers[layer].head_dim, (head + 1) * layers[layer].head_dim),
            )
            if means is not None:
                out.bias += out.weight[:, part] @ means[layer][part]
            out.weight[:, part] = 0.0
    return copied


def reference(model, ids, heads, means=None) -> tuple[float, torch.Tensor]:
    logits = zeroed_copy(model, heads, means)(ids)[0]
    return float(F.cross_entropy(logits[:-1], ids[0, 1:])), logits[-1].softmax(-1)


def mean_head_outputs(model, ids) -> list[torch.Tensor]:
    """Each layer's heads' outputs averaged over the positions, from its attention weights times its values (the
    layer's input recorded by a hook on the attention module itself, not on its output projection)."""
    inputs = []
    hooks = [a.register_forward_pre_hook(lambda m, args: inputs.append(args[0])) for a in self_attention_layers(model)]
    weights = model.attention_weights(ids)
    for hook in hooks:
        hook.remove()
    means = []
    for attention, x, w in zip(self_attention_layers(model), inputs, weights):
        values = attention.split_heads(attention.to_keys_values(x).chunk(2, dim=-1)[1])  # (1, heads, time, hd)
        outputs = w @ values  # (1, heads, time, hd)
        means.append(outputs[0].mean(1).reshape(-1))  # (heads * hd,) = (d_model,)
    return means


@pytest.mark.parametrize("position", ["sinusoidal", "rope"])
def test_zero_ablation_of_each_head_equals_the_model_with_that_heads_output_columns_zeroed(position):
    subject = lm_subject(position=position)
    model, ids = subject.model, ids_of(subject)
    answer = ablate_heads(subject, {"text": TEXT, "mode": "zero", "heads": [[0, 1], [1, 3]]})
    clean = model(ids)[0]
    assert answer["loss"] == pytest.approx(float(F.cross_entropy(clean[:-1], ids[0, 1:])), abs=1e-6)
    assert [(row["layer"], row["head"]) for row in answer["heads"]] == [(n, h) for n in range(2) for h in range(4)]
    clean_next = clean[-1].softmax(-1)
    for row in answer["heads"]:
        loss, probs = reference(model, ids, [(row["layer"], row["head"])])
        assert row["loss"] == pytest.approx(loss, abs=1e-6)
        assert row["delta"] == pytest.approx(loss - answer["loss"], abs=1e-6)
        assert row["p_top"] == pytest.approx(float(probs[clean_next.argmax()]), abs=1e-6)
        kl = float((clean_next * (clean_next.log() - probs.log())).sum())
        assert row["kl"] == pytest.approx(kl, abs=1e-5)
    loss, probs = reference(model, ids, [(0, 1), (1, 3)])
    assert answer["chosen"]["loss"] == pytest.approx(loss, abs=1e-6) and answer["chosen"]["heads"] == [[0, 1], [1, 3]]
    for row in answer["chosen"]["next"]:
        assert row["after"] == pytest.approx(float(probs[row["id"]]), abs=1e-6)
    assert any(abs(row["delta"]) > 1e-4 for row in answer["heads"])  # the heads do something to be measured


def test_mean_ablation_equals_the_model_with_the_heads_mean_output_in_the_bias():
    subject = lm_subject(position="learned")
    model, ids = subject.model, ids_of(subject)
    means = mean_head_outputs(model, ids)
    answer = ablate_heads(subject, {"text": TEXT, "mode": "mean", "heads": [[1, 0], [1, 2]]})
    for row in answer["heads"]:
        loss, _ = reference(model, ids, [(row["layer"], row["head"])], means)
        assert row["loss"] == pytest.approx(loss, abs=1e-6)
    loss, _ = reference(model, ids, [(1, 0), (1, 2)], means)
    assert answer["chosen"]["loss"] == pytest.approx(loss, abs=1e-6)
    zero = ablate_heads(subject, {"text": TEXT, "mode": "zero"})
    assert [r["loss"] for r in zero["heads"]] != [r["loss"] for r in answer["heads"]] and "chosen" not in zero


@pytest.mark.parametrize(
    "request_, phrase",
    [
        ({"mode": "half"}, "mode must be one of"),
        ({"heads": [[2, 0]]}, "a layer in heads must be an integer from 0 to 1"),
        ({"heads": [[0, 4]]}, "a head in heads must be an integer from 0 to 3"),
        ({"heads": [0, 1]}, r"a \[layer, head\] pair"),
        ({"heads": []}, "non-empty list"),
        ({"text": "a"}, "at least two tokens"),
    ],
)
def test_bad_ablation_requests_are_refused_with_what_to_send(request_, phrase):
    with pytest.raises(DataError, match=phrase):
        ablate_heads(lm_subject(), {"text": TEXT, **request_})


def test_ablation_is_for_language_models():
    with pytest.raises(NotApplicable, match="language model's loss"):
        ablate_heads(mlm_subject(), {"text": TEXT})


# ---------------------------------------------------------------------------------------------------------------
# The endpoints, behind the front door


@pytest.fixture(scope="module")
def client():
    pytest.importorskip("httpx")
    from starlette.testclient import TestClient

    from kqv.explore.app import create_app

    return TestClient(create_app("tiny", subject=lm_subject(position="rope")))


def test_the_endpoints_answer_what_the_functions_compute(client):
    assert client.get("/api/interventions").json() == {
        "neuron": True, "replace": True, "ablate": True, "mask_token": None, "note": None
    }  # fmt: skip
    body = {"text": TEXT, "layer": 1, "head": 2, "token": 3}
    assert client.post("/api/neuron", json=body).json()["token"] == 3
    assert (
        client.post("/api/replace", json={**body, "position": 1, "replacement": "j"}).json()["edited_tokens"][1] == "j"
    )
    answer = client.post("/api/ablate", json={"text": TEXT, "heads": [[1, 2]]}).json()
    assert len(answer["heads"]) == 8 and answer["chosen"]["heads"] == [[1, 2]]


@pytest.mark.parametrize(
    "path, body, phrase",
    [
        ("/api/neuron", '{"text": "abc", "layer": NaN}', "layer is NaN"),
        ("/api/neuron", '{"text": "abc", "head": Infinity}', "head is Infinity"),
        ("/api/neuron", '{"text": "abc", "token": 1e400}', "token is Infinity"),
        ("/api/neuron", '{"text": "abc", "layer": 2}', "layer must be an integer from 0 to 1"),
        ("/api/neuron", '{"text": "abc", "layer": -1}', "layer must be an integer from 0 to 10000"),
        ("/api/neuron", '{"text": "abc", "head": 4}', "head must be an integer from 0 to 3"),
        ("/api/neuron", '{"text": "abc", "token": 1.5}', "token must be an integer"),
        ("/api/neuron", '{"text": "abc", "token": 3}', "token must be an integer from 0 to 2"),
        ("/api/neuron", '{"text": "abc", "token": true}', "token must be an integer"),
        (
            "/api/replace",
            '{"text": "abc", "position": 7, "replacement": "a"}',
            "position must be an integer from 0 to 2",
        ),
        ("/api/replace", '{"text": "abc", "position": -2}', "position must be an integer from 0 to 1000000"),
        ("/api/replace", '{"text": "abc", "top_k": 0, "replacement": "a"}', "top_k must be an integer from 1 to 50"),
        ("/api/ablate", '{"text": "abc", "heads": [[0, NaN]]}', "heads.0.1 is NaN"),
        ("/api/ablate", '{"text": "abc", "heads": [[0, 9]]}', "a head in heads must be an integer from 0 to 3"),
        ("/api/ablate", '{"text": "abc", "mode": "all"}', "mode must be one of"),
        ("/api/ablate", "[1, 2]", "must be a JSON object"),
        ("/api/neuron", '{"text": ""}', "text is empty"),
    ],
)
def test_the_front_door_refuses_bad_numbers_on_the_new_endpoints(client, path, body, phrase):
    response = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert phrase in response.json()["error"]


def test_the_new_endpoints_refuse_other_sites():
    pytest.importorskip("httpx")
    from starlette.testclient import TestClient

    from kqv.explore.app import create_app

    local = TestClient(create_app("tiny", subject=lm_subject()), base_url="http://localhost:8765")
    for path in ("/api/neuron", "/api/replace", "/api/ablate"):
        assert local.post(path, json={"text": TEXT}, headers={"host": "evil.example.com"}).status_code == 421
        response = local.post(path, json={"text": TEXT}, headers={"Origin": "http://evil.example.com"})
        assert response.status_code == 403 and "only the explorer's own page" in response.json()["error"]


def test_models_without_interventions_say_so_and_a_saved_page_leaves_them_out():
    from kqv.explore.export import standalone_page
    from kqv.explore.interventions import available
    from kqv.explore.subjects import Subject

    other = Subject("translation", torch.nn.Linear(2, 2), limit=8)
    other.task = "mt"
    answer = available(other)
    assert not (answer["neuron"] or answer["replace"] or answer["ablate"]) and "this is a mt run" in answer["note"]
    encoder = available(mlm_subject())
    assert encoder["neuron"] and encoder["replace"] and not encoder["ablate"] and encoder["mask_token"] == "[MASK]"
    assert not available(lm_subject(attention="linformer", linformer={"k": 8}))["neuron"]
    subject = lm_subject()
    page = standalone_page(subject.info(), subject.analyze({"text": TEXT}), {"text": TEXT})
    assert "/static/intervene" not in page and "<script>" in page  # no script or style that needs the server


# ---------------------------------------------------------------------------------------------------------------
# Hugging Face directories, against Hugging Face's own models


# the Hugging Face tests' fixtures, used here by name: a BPE tokenizer and GPT-2, BERT and BERT masked-LM directories
# saved from random-initialised transformers models
tokenizer, dirs = pretrained.tokenizer, pretrained.dirs


def test_a_gpt2_directorys_ablation_equals_hugging_faces_gpt2_with_the_heads_projection_rows_zeroed(tokenizer, dirs):
    from transformers import GPT2LMHeadModel

    from kqv.explore.loading import load_subject

    subject = load_subject(dirs["gpt2"])
    text = "whether 'tis nobler in the mind"
    answer = ablate_heads(subject, {"text": text, "heads": [[0, 1], [1, 0]]})
    ids = torch.tensor([tokenizer.encode(text)])

    def hf_loss(heads) -> float:
        model = GPT2LMHeadModel.from_pretrained(dirs["gpt2"]).eval()
        for layer, head in heads:
            projection = model.transformer.h[layer].attn.c_proj  # a Conv1D: weight (in, out)
            width = model.config.n_embd // model.config.n_head
            projection.weight.data[head * width : (head + 1) * width] = 0.0
        return float(model(ids, labels=ids).loss)

    assert answer["loss"] == pytest.approx(hf_loss([]), abs=1e-5)
    for row in answer["heads"]:
        assert row["loss"] == pytest.approx(hf_loss([(row["layer"], row["head"])]), abs=1e-5)
    assert answer["chosen"]["loss"] == pytest.approx(hf_loss([(0, 1), (1, 0)]), abs=1e-5)


def test_a_gpt2_directorys_neuron_view_and_replacement_match_hugging_face(tokenizer, dirs):
    from transformers import GPT2LMHeadModel

    from kqv.explore.loading import load_subject

    subject, text = load_subject(dirs["gpt2"]), "whether 'tis nobler in the mind"
    ids = tokenizer.encode(text)
    model = GPT2LMHeadModel.from_pretrained(dirs["gpt2"], attn_implementation="eager").eval()
    attentions = model(torch.tensor([ids]), output_attentions=True).attentions
    view = neuron_view(subject, {"text": text, "layer": 1, "head": 1, "token": 4})
    torch.testing.assert_close(torch.tensor(view["weights"]), attentions[1][0, 1, 4], atol=2e-6, rtol=0)
    piece = tokenizer.encode(" the")
    assert len(piece) == 1  # a byte-level piece with its space, one token
    answer = replace_token(subject, {"text": text, "position": 2, "replacement": " the"})
    edited = [*ids]
    edited[2] = piece[0]
    after = model(torch.tensor([edited])).logits[0, -1].softmax(-1)
    for row in answer["predictions"]:
        assert row["after"] == pytest.approx(float(after[row["id"]]), abs=2e-6)


def test_a_bert_masked_lm_directorys_masked_token_equals_hugging_faces_guess(tokenizer, dirs):
    from transformers import BertForMaskedLM

    from kqv.explore.loading import load_subject

    subject, text = load_subject(dirs["bert-mlm"]), "whether 'tis nobler in the mind"
    answer = replace_token(subject, {"text": text, "position": 3})
    ids = tokenizer.encode(text)
    edited = [*ids]
    edited[3] = tokenizer.token_to_id("[MASK]")
    assert answer["edited_tokens"][3] == "[MASK]" and answer["predicts"] == "the token at position 4"
    model = BertForMaskedLM.from_pretrained(dirs["bert-mlm"]).eval()
    after = model(torch.tensor([edited])).logits[0, 3].softmax(-1)
    for row in answer["predictions"]:
        assert row["after"] == pytest.approx(float(after[row["id"]]), abs=2e-6)
