"""`kqv.load` opens a Hugging Face model directory saved with its tokenizer (nothing downloaded): a GPT-2 continues
prompts with Hugging Face's own greedy tokens, and GPT-2 and BERT show Hugging Face's own attention weights."""

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
    with pytest.raises(RunError, match="BertModel directory; generate works on GPT-2"):
        run.generate("hello")
    with pytest.raises(RunError, match="evaluate works on kqv runs"):
        run.evaluate()


def test_a_directory_without_its_tokenizer_says_how_to_save_it(gpt2_dir, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((gpt2_dir / name).read_bytes())
    with pytest.raises(ConversionError, match="save_pretrained"):
        kqv.load(bare)
