"""Issue 34, fine-tuning: `kqv export RUN --hf DIR` writes a Hugging Face GPT-2 directory that `transformers` loads
with the run's greedy tokens, and refuses what GPT-2 cannot hold with nothing written."""

import json

import pytest
import torch

import kqv
from kqv.cli.main import main
from kqv.data.tokenizers import BPETokenizer, CharTokenizer
from kqv.errors import ConfigError, ConversionError
from kqv.jobs.export import hf_tokenizer
from test_cli import TINY

TEXT = "To be, or not to be, that is the question.\n" * 40


def tiny_run(root, position="learned", tokenizer="char", steps=6, extra=()):
    """A tiny LM trained by `kqv.train` on a repeated line (the corpus of test_cli.py)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "tiny.txt").write_text(TEXT)
    (root / "tiny.toml").write_text(TINY.format(position=position))
    overrides = [f"data.path={root / 'tiny.txt'}", f'data.tokenizer="{tokenizer}"', "data.vocab_size=300", *extra]
    kqv.train("lm", root / "tiny.toml", out=root / "run", overrides=overrides, steps=steps, quiet=True)
    return root / "run"


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("finetune_lm"))


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("finetune_bpe"), tokenizer="bpe")


def hf_greedy(directory, prompt, new_tokens):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return tokenizer.decode(out[0].tolist())


@pytest.mark.parametrize("which", ["char", "bpe"])
def test_an_exported_run_gives_transformers_the_runs_greedy_tokens(which, lm_dir, bpe_dir, tmp_path):
    run_dir = {"char": lm_dir, "bpe": bpe_dir}[which]
    out = kqv.export(run_dir, hf=tmp_path / "hf")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "config.json").read_text())["architectures"] == ["GPT2LMHeadModel"]
    prompt = "To be, or"
    expected = kqv.load(run_dir).generate(prompt, max_new_tokens=6, temperature=0)[0]
    assert hf_greedy(out, prompt, 6) == expected
    assert kqv.load(out).generate(prompt, max_new_tokens=6, temperature=0) == [expected]  # and back into kqv


def test_an_exported_runs_logits_are_the_runs(lm_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    run = kqv.load(lm_dir)
    out = run.export_hf(tmp_path / "hf")
    ids = torch.tensor([run.tokenizer.encode("To be, or not")])
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, run.model(ids), atol=1e-5, rtol=1e-5)


def test_a_char_tokenizer_round_trips_through_tokenizers_and_refuses_an_unseen_character():
    from transformers import PreTrainedTokenizerFast

    chars = CharTokenizer.train("Hello, world!\n\t  éü")
    text = "Hello,\n  world!\tü é"
    fast = PreTrainedTokenizerFast(tokenizer_object=hf_tokenizer(chars))
    assert fast(text)["input_ids"] == chars.encode(text)
    assert fast.decode(chars.encode(text)) == text
    with pytest.raises(Exception, match="UNK"):  # no silent replacement
        fast("xyz")
    bpe = BPETokenizer.train(TEXT, vocab_size=300)
    assert hf_tokenizer(bpe) is bpe.tokenizer


def test_what_gpt2_cannot_hold_is_refused_by_name_with_nothing_written(tmp_path):
    rope = tiny_run(tmp_path / "rope", position="rope", steps=1)
    with pytest.raises(ConversionError, match=r"cannot be written as a Hugging Face GPT-2: .*position='rope'"):
        kqv.export(rope, hf=tmp_path / "hf")
    assert not (tmp_path / "hf").exists() and [p.name for p in tmp_path.iterdir()] == ["rope"]
    for option, words in [
        ('model.norm="rmsnorm"', "norm='rmsnorm'"),
        ('model.activation="swiglu"', "swiglu"),
        ("model.norm_first=false", "norm_first=False"),
    ]:
        run = kqv.train(
            "lm",
            tmp_path / "rope" / "tiny.toml",
            out=tmp_path / "other",
            overrides=[f"data.path={tmp_path / 'rope' / 'tiny.txt'}", 'model.position="learned"', option],
            steps=1,
            quiet=True,
            overwrite=True,
        )
        assert run["steps"] == 1
        with pytest.raises(ConversionError, match=words):
            kqv.export(tmp_path / "other", hf=tmp_path / "hf")
        assert not (tmp_path / "hf").exists()


def test_kqv_export_prints_one_line_and_refuses_a_full_directory(lm_dir, tmp_path, capsys):
    assert main(["export", str(lm_dir), "--hf", str(tmp_path / "hf")]) == 0
    written = "a Hugging Face GPT-2 (config.json, model.safetensors, tokenizer.json)"
    assert capsys.readouterr().out == f"wrote {tmp_path / 'hf'}: {written}\n"
    assert main(["export", str(lm_dir), "--hf", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists and is not an empty directory" in err
    with pytest.raises(ConfigError):
        kqv.export(lm_dir, hf=tmp_path / "hf")
