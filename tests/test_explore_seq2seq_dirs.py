"""`kqv explore DIR` on a Hugging Face Marian or BART directory (random-initialised `transformers` models saved with
save_pretrained and a tokenizer trained here with BPETokenizer.train, nothing downloaded): shown like a kqv MT run,
its translation the Hugging Face model's own greedy choice, its cross-, encoder and decoder attention Hugging
Face's weights. (Marian's own tokenizer is SentencePiece, which has no tokenizer.json: a Marian directory needs a
fast tokenizer saved beside it, as here.)"""

import pytest
import torch
from starlette.testclient import TestClient

from kqv.data.tokenizers import BPETokenizer
from kqv.explore.app import create_app
from test_interop import bart_config, marian_config
from test_pretrained_dirs import TEXT, save

SPECIALS = ["<s>", "<pad>", "</s>"]  # ids 0, 1, 2, as BART numbers them
SOURCE = "whether 'tis nobler in the mind"


@pytest.fixture(scope="module")
def tokenizer():
    return BPETokenizer.train(TEXT, vocab_size=300, special_tokens=SPECIALS)


@pytest.fixture(scope="module")
def dirs(tokenizer, tmp_path_factory):
    from transformers import BartForConditionalGeneration, MarianMTModel

    common = dict(vocab_size=tokenizer.vocab_size, max_position_embeddings=64, pad_token_id=1, eos_token_id=2)
    made = {}
    for name, model_class, config in [
        ("marian", MarianMTModel, marian_config(**common, decoder_start_token_id=1)),
        ("bart", BartForConditionalGeneration, bart_config(**common, bos_token_id=0, decoder_start_token_id=2)),
    ]:
        torch.manual_seed(0)
        made[name] = save(model_class(config).eval(), tokenizer, tmp_path_factory.mktemp(name))
    return made


def hf_greedy(path, src_ids, start_id, eos_id, steps):
    """The Hugging Face model's own greedy translation, one argmax at a time (no generate() options involved)."""
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(path).eval()
    out = [start_id]
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([src_ids]), decoder_input_ids=torch.tensor([out])).logits
            out.append(int(logits[0, -1].argmax()))
            if out[-1] == eos_id:
                break
    return out


def hf_attentions(path, src_ids, tgt_ids):
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor([src_ids]), decoder_input_ids=torch.tensor([tgt_ids]), output_attentions=True
        )
    return {"encoder": out.encoder_attentions, "decoder": out.decoder_attentions, "cross": out.cross_attentions}


@pytest.mark.parametrize(
    "name, hf_class, start_id", [("marian", "MarianMTModel", 1), ("bart", "BartForConditionalGeneration", 2)]
)
def test_a_seq2seq_directory_is_shown_like_an_mt_run_with_hugging_faces_translation_and_weights(
    dirs, tokenizer, name, hf_class, start_id
):
    client = TestClient(create_app(dirs[name]))
    info = client.get("/api/info").json()
    assert info["task"] == "mt" and info["hf_class"] == hf_class and info["max_tokens"] == 64
    assert "translation" in info["views"] and info["decode"]["beam_size"] == 4
    body = client.post("/api/analyze", json={"text": SOURCE, "beam": 1}).json()
    src_ids = tokenizer.encode(SOURCE) + [2]  # the source and its </s>
    steps = int(1.5 * len(src_ids) + 10)
    expected = hf_greedy(dirs[name], src_ids, start_id, 2, steps if name == "marian" else min(steps, 63))
    produced = [i for i in expected[1:] if i != 2]
    assert body["translation"] == tokenizer.tokenizer.decode(produced, skip_special_tokens=True)
    assert body["source_tokens"][-1] == "</s>" and len(body["source_tokens"]) == len(src_ids)
    assert set(body["attention"]) == {"cross", "encoder", "decoder"}
    tgt_ids = [start_id] + produced  # the decoder reads its start token and the tokens it chose
    theirs = hf_attentions(dirs[name], src_ids, tgt_ids)
    for kind in ("cross", "encoder", "decoder"):
        ours = body["attention"][kind]["layers"]
        assert len(ours) == len(theirs[kind])
        for layer, hf_layer in zip(ours, theirs[kind]):
            torch.testing.assert_close(
                torch.tensor(layer, dtype=torch.float64), hf_layer[0].double(), atol=2e-6, rtol=0
            )


def test_a_seq2seq_directory_refuses_a_source_past_its_positions_and_answers_a_beam(dirs):
    client = TestClient(create_app(dirs["bart"]))
    response = client.post("/api/analyze", json={"text": "to be " * 60})
    assert response.status_code == 400 and "max_len = 64" in response.json()["error"]
    beamed = client.post("/api/analyze", json={"text": SOURCE, "beam": 4}).json()
    assert beamed["beam"] == 4 and isinstance(beamed["translation"], str)


def test_a_bart_directory_draws_its_translation_page_in_chromium(dirs):
    """The page of a BART directory in Debian's Chromium: the cross-attention over the source and its </s>, the
    three kinds of attention to choose from, no request elsewhere and no console error."""
    shared = pytest.importorskip("test_explore_browser")
    with shared.launched(shared.sync_api) as browser:
        with shared.Server(create_app(dirs["bart"])) as server:
            p = shared.Page(browser, server.url)
            shared.analyze_in_page(p, server, SOURCE, beam="1")
            body = shared.api_analysis(server, text=SOURCE, beam=1)
            assert p.page.input_value("#kind") == "cross"
            keys = p.page.eval_on_selector_all("#head-view text.key", "ts => ts.map(t => t.textContent)")
            assert len(keys) == len(body["source_tokens"]) and keys[-1] == "</s>"
            kinds = p.page.eval_on_selector_all("#kind option", "os => os.map(o => o.value)")
            assert sorted(kinds) == ["cross", "decoder", "encoder"]
            assert p.page.inner_text("#translation") == body["translation"]
            p.close()


@pytest.mark.parametrize("name, start_id", [("marian", 1), ("bart", 2)])
def test_kqv_load_and_kqv_translate_give_a_seq2seq_directorys_translation(dirs, tokenizer, name, start_id, capsys):
    """The explorer's translation is the directory's own (`PretrainedRun.translate`): Hugging Face's greedy choice
    at beam 1, and `kqv translate DIR` prints what `kqv.load(DIR).translate` returns."""
    import kqv
    from kqv.cli.main import main

    run = kqv.load(dirs[name], device="cpu")
    src_ids = tokenizer.encode(SOURCE) + [2]
    steps = int(1.5 * len(src_ids) + 10)
    expected = hf_greedy(dirs[name], src_ids, start_id, 2, steps if name == "marian" else min(steps, 63))
    greedy = tokenizer.tokenizer.decode([i for i in expected[1:] if i != 2], skip_special_tokens=True)
    assert run.translate(SOURCE, beam_size=1) == [greedy]
    capsys.readouterr()
    assert main(["translate", str(dirs[name]), SOURCE, "--beam", "1"]) == 0
    assert capsys.readouterr().out == greedy + "\n"
    beamed = run.translate([SOURCE, "to be"])  # the MT job's [decode] default: beam 4
    assert len(beamed) == 2 and all(isinstance(text, str) for text in beamed)
    assert main(["translate", str(dirs[name]), SOURCE, "--beam", "0"]) == 2
    assert "--beam must be at least 1" in capsys.readouterr().err
