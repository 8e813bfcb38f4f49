"""`kqv.load` opens a Hugging Face model directory saved with its tokenizer (nothing downloaded): a GPT-2 continues
prompts with Hugging Face's own greedy tokens, and GPT-2 and BERT show Hugging Face's own attention weights."""

import json
import math

import pytest
import torch

import kqv
from kqv.data.tokenizers import BPETokenizer
from kqv.errors import ConversionError, RunError
from kqv.jobs.pretrained import PretrainedRun
from test_interop import bert_config, gpt2_config

TEXT = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer. " * 20


@pytest.fixture(scope="module")
def tokenizer():
    return BPETokenizer.train(TEXT, vocab_size=300)


def save(model, tokenizer, path):
    """A directory as `save_pretrained` writes it: config.json, model.safetensors and the tokenizer.json."""
    torch.manual_seed(0)
    model.save_pretrained(path)
    tokenizer.tokenizer.save(str(path / "tokenizer.json"))
    return path


@pytest.fixture(scope="module")
def gpt2_dir(tokenizer, tmp_path_factory):
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    config = gpt2_config(vocab_size=tokenizer.vocab_size, n_positions=64)
    return save(GPT2LMHeadModel(config).eval(), tokenizer, tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(scope="module")
def bert_dir(tokenizer, tmp_path_factory):
    from transformers import BertModel

    torch.manual_seed(0)
    config = bert_config(vocab_size=tokenizer.vocab_size, max_position_embeddings=64)
    return save(BertModel(config).eval(), tokenizer, tmp_path_factory.mktemp("bert"))


def test_a_gpt2_directory_generates_hugging_faces_greedy_tokens(gpt2_dir, tokenizer):
    from transformers import GPT2LMHeadModel

    run = kqv.load(gpt2_dir)
    assert isinstance(run, PretrainedRun) and run.hf_class == "GPT2LMHeadModel"
    prompt = "To be, or not"
    ids = torch.tensor([tokenizer.encode(prompt)])
    hf = GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()
    expected = hf.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert run.generate(prompt, max_new_tokens=12, temperature=0) == [tokenizer.decode(expected[0].tolist())]
    sampled = run.generate(prompt, max_new_tokens=5, count=2, seed=1)
    assert len(sampled) == 2 and all(text.startswith(prompt) for text in sampled)


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_a_directorys_attention_is_hugging_faces(kind, gpt2_dir, bert_dir, tokenizer):
    from transformers import AutoModel

    path = gpt2_dir if kind == "gpt2" else bert_dir
    text = "whether 'tis nobler"
    maps = kqv.load(path).attention(text)
    ids = torch.tensor([tokenizer.encode(text)])
    with torch.no_grad():
        expected = AutoModel.from_pretrained(path, attn_implementation="eager")(ids, output_attentions=True).attentions
    assert maps.layers == len(expected) and maps.rows == maps.columns == [tokenizer.decode([i]) for i in ids[0]]
    for ours, theirs in zip(maps.weights, expected):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


def test_what_a_directory_cannot_do_is_refused_by_name(bert_dir):
    run = kqv.load(bert_dir)
    with pytest.raises(
        RunError, match="BertModel directory, which cannot generate text; generate works on lm runs and causal LM"
    ):
        run.generate("hello")
    with pytest.raises(RunError, match="evaluate works on lm, mt and vit runs and causal LM directories"):
        run.evaluate()


def test_a_directory_without_its_tokenizer_says_how_to_save_it(gpt2_dir, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((gpt2_dir / name).read_bytes())
    with pytest.raises(ConversionError, match="save_pretrained"):
        kqv.load(bare)


# -- the commands take a directory as kqv.load does ------------------------------------------------------------


def kqv_main(argv, capsys):
    """`kqv argv` in this process: (status, stdout, stderr)."""
    from kqv.cli.main import main

    capsys.readouterr()
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_kqv_generate_on_a_gpt2_directory_prints_what_kqv_load_returns(gpt2_dir, capsys):
    run = kqv.load(gpt2_dir, device="cpu")
    prompt = "To be, or not"
    status, out, _ = kqv_main(
        ["generate", gpt2_dir, "--prompt", prompt, "--max-new-tokens", 9, "--temperature", 0], capsys
    )
    assert status == 0 and out == run.generate(prompt, max_new_tokens=9, temperature=0)[0] + "\n"
    argv = ["generate", gpt2_dir, "--prompt", prompt, "--max-new-tokens", 6, "--count", 2, "--seed", 7, "--top-p", 0.9]
    status, out, _ = kqv_main(argv, capsys)
    first, second = run.generate(prompt, kqv.GenerationConfig(max_new_tokens=6, count=2, seed=7, top_p=0.9))
    assert status == 0 and out == f"--- sample 1 ---\n{first}\n--- sample 2 ---\n{second}\n"
    assert first != second  # two samples of one generator, not one sample twice


def test_kqv_eval_on_a_gpt2_directory_is_hugging_faces_loss_on_the_text(gpt2_dir, tokenizer, tmp_path, capsys):
    from transformers import GPT2LMHeadModel

    text = tmp_path / "text.txt"
    text.write_text("To be, or not to be, that is the question")
    ids = torch.tensor([tokenizer.encode(text.read_text())])
    assert ids.shape[1] <= 64  # one block of the model's context: Hugging Face's mean loss over every next token
    with torch.no_grad():
        expected = GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()(ids, labels=ids).loss.item()
    status, out, _ = kqv_main(["eval", gpt2_dir, "--data", text, "--json"], capsys)
    figures = json.loads(out.splitlines()[-1])
    assert status == 0 and figures == kqv.load(gpt2_dir).evaluate(text).to_dict()
    assert figures["loss"] == pytest.approx(expected, rel=1e-5) and figures["tokens"] == ids.shape[1] - 1
    assert figures["perplexity"] == pytest.approx(math.exp(expected), rel=1e-5)
    status, _, err = kqv_main(["eval", gpt2_dir], capsys)
    assert status == 2 and err.count("\n") == 1 and "no held-out text of its own" in err and "--data FILE" in err


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_kqv_attention_on_a_directory_draws_kqv_loads_maps(kind, gpt2_dir, bert_dir, tmp_path, capsys):
    path, png = (gpt2_dir if kind == "gpt2" else bert_dir), tmp_path / "attention.png"
    maps = kqv.load(path).attention("whether 'tis nobler")
    status, out, _ = kqv_main(["attention", path, "--text", "whether 'tis nobler", "--out", png], capsys)
    assert status == 0 and png.stat().st_size > 0
    assert f"{maps.layers} layers x {maps.heads} heads over {len(maps.rows)} tokens" in out
    status, _, err = kqv_main(["attention", path, "--text", "whether 'tis nobler", "--max-tokens", 2], capsys)
    assert status == 2 and "--max-tokens=2" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["translate", "{gpt2}", "hello"],
            ["GPT2LMHeadModel directory, which cannot translate; translate works on mt runs and Marian and BART"],
        ),
        (
            ["generate", "{bert}", "--prompt", "hi"],
            ["BertModel directory, which cannot generate text; generate works on lm runs and causal LM directories"],
        ),
        (
            ["eval", "{bert}", "--data", "{gpt2}/config.json"],
            ["BertModel directory, which cannot evaluate its model; evaluate works on"],
        ),
        (["generate", "{gpt2}", "--prompt", "hi", "--seed", str(2**63)], ["--seed must be an integer from 0 to 2**63"]),
    ],
)
def test_what_a_directory_cannot_do_is_one_error_line_on_the_command_line(argv, words, gpt2_dir, bert_dir, capsys):
    status, out, err = kqv_main([a.format(gpt2=gpt2_dir, bert=bert_dir) for a in argv], capsys)
    assert status == 2 and out == "" and err.startswith("kqv: error: ") and err.count("\n") == 1, err
    assert all(word in err for word in words), err
