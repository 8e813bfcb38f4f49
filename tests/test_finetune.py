"""Issue 34, fine-tuning: `kqv export RUN --hf DIR` writes a Hugging Face GPT-2 directory that `transformers` loads
with the run's greedy tokens, and refuses what GPT-2 cannot hold with nothing written."""

import json

import pytest
import torch

import kqv
from kqv.cli.main import main
from kqv.data.tokenizers import BPETokenizer, CharTokenizer
from kqv.errors import ConfigError, ConversionError, DataError
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


def test_what_no_hugging_face_format_holds_is_refused_by_name_with_nothing_written(tmp_path):
    alibi = tiny_run(tmp_path / "rope", position="alibi", steps=1)  # GPT-2 and GPT-NeoX each need one option more
    with pytest.raises(
        ConversionError, match=r"cannot be written as a Hugging Face model: .*position='alibi'"
    ) as error:
        kqv.export(alibi, hf=tmp_path / "hf")
    assert "GPT2LMHeadModel, which needs position='learned'" in str(error.value)
    assert "GPTNeoXForCausalLM, which needs position='rope'" in str(error.value) and "\n" not in str(error.value)
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
    written = "a Hugging Face GPT2LMHeadModel (config.json, model.safetensors, tokenizer.json)"
    assert capsys.readouterr().out == f"wrote {tmp_path / 'hf'}: {written}\n"
    assert main(["export", str(lm_dir), "--hf", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists and is not an empty directory" in err
    with pytest.raises(ConfigError):
        kqv.export(lm_dir, hf=tmp_path / "hf")


# -- kqv train lm --init SOURCE ----------------------------------------------------------------------------------

FINETUNE_TEXT = "that is the question, to be or not.\n" * 30  # only characters the source's tokenizer knows
FINETUNE = [
    "data.context=16",
    "train.batch_size=4",
    "train.log_every=1",
    "train.eval_every=2",
    "train.eval_batches=1",
    'train.precision="fp32"',
    "train.warmup_steps=1",
    "sample.count=1",
    "sample.max_new_tokens=4",
    'sample.prompt="to"',
]


def finetune(source, root, text=FINETUNE_TEXT, extra=(), steps=2):
    root.mkdir(parents=True, exist_ok=True)
    (root / "new.txt").write_text(text)
    overrides = [f"data.path={root / 'new.txt'}", *FINETUNE, *extra]
    return kqv.train("lm", init=source, out=root / "run", overrides=overrides, steps=steps, quiet=True)


def first_batch_loss(model, run_dir):
    """The loss of `model` on the fine-tune's first training batch (update 0 uses `train_batches(0)`)."""
    from kqv.data.batches import batch_generator, sample_batch
    from kqv.jobs.run_tokens import load_tokens

    run = kqv.load(run_dir)
    batch = sample_batch(load_tokens(run_dir)["train"], 4, 16, batch_generator(run.config.train.seed, 0))
    with torch.no_grad():
        return model.train()(*batch).item()


def logged_losses(run_dir):
    return [
        r["train_loss"]
        for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        if "train_loss" in r
    ]


def test_a_finetune_of_a_kqv_run_starts_at_the_runs_loss_and_records_its_source(lm_dir, tmp_path):
    from kqv.train.files import sha256 as file_sha256

    summary = finetune(lm_dir, tmp_path / "ft")
    run_dir = tmp_path / "ft" / "run"
    source_model = kqv.load(lm_dir).model
    assert logged_losses(run_dir)[0] == pytest.approx(first_batch_loss(source_model, run_dir), abs=1e-6)
    digest = file_sha256(lm_dir / "checkpoint" / "model.safetensors")
    record = {"path": str(lm_dir), "kind": "kqv run", "weights_sha256": digest}
    assert summary["source"] == record
    import tomllib

    assert tomllib.loads((run_dir / "run.toml").read_text())["source"] == record
    tuned = kqv.load(run_dir)
    assert tuned.model.config == source_model.config and tuned.tokenizer.chars == kqv.load(lm_dir).tokenizer.chars
    assert kqv.train("lm", out=run_dir, resume=True, steps=3, quiet=True)["steps"] == 3  # resumes without --init


def test_a_finetune_of_a_gpt2_directory_starts_at_its_loss(gpt2_dir, tmp_path):
    from transformers import GPT2LMHeadModel

    from kqv.interop import from_hf

    summary = finetune(gpt2_dir, tmp_path / "ft", extra=["model.dropout=0.0"])
    run_dir = tmp_path / "ft" / "run"
    assert summary["source"]["kind"] == "Hugging Face GPT-2"
    expected = first_batch_loss(from_hf(gpt2_dir), run_dir)
    assert logged_losses(run_dir)[0] == pytest.approx(expected, abs=1e-5)
    hf = GPT2LMHeadModel.from_pretrained(gpt2_dir, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    assert expected == pytest.approx(first_batch_loss_hf(hf, run_dir), abs=1e-5)  # the loss transformers computes


def first_batch_loss_hf(hf, run_dir):
    from kqv.data.batches import batch_generator, sample_batch
    from kqv.jobs.run_tokens import load_tokens

    x, y = sample_batch(load_tokens(run_dir)["train"], 4, 16, batch_generator(0, 0))
    with torch.no_grad():
        logits = hf.eval()(x.long()).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.long().flatten()).item()


@pytest.mark.parametrize(
    "extra, text, error, words",
    [
        (["model.d_model=64"], FINETUNE_TEXT, ConfigError, r"model.d_model is 16 in the source, 64 here"),
        (["data.context=64"], FINETUNE_TEXT, ConfigError, r"data.context \(64\) is longer than the source's 16"),
        ([], FINETUNE_TEXT + "Zebra é Z\n", DataError, r"3 characters of 2 kinds .*'Z' \(2x\), 'é' \(1x\)"),
    ],
    ids=["shape", "context", "unknown-characters"],
)
def test_what_a_finetune_cannot_do_is_refused_with_nothing_written(lm_dir, tmp_path, extra, text, error, words):
    with pytest.raises(error, match=words):
        finetune(lm_dir, tmp_path / "ft", text=text, extra=extra)
    assert not (tmp_path / "ft" / "run").exists()


def test_kqv_train_lm_init_refuses_a_shape_change_in_one_line(lm_dir, tmp_path, capsys):
    (tmp_path / "new.txt").write_text(FINETUNE_TEXT)
    argv = ["train", "lm", "--init", str(lm_dir), "--data", str(tmp_path / "new.txt"), "--out", str(tmp_path / "r")]
    assert main([*argv, "--set", "model.n_layers=3", "--set", "data.context=16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.n_layers is 1 in the source, 3 here" in err
    assert not (tmp_path / "r").exists()


def test_an_exported_char_run_is_a_source_whose_unseen_characters_are_named(lm_dir, tmp_path):
    """export -> --init: the GPT-2 directory of a character run fine-tunes from the run's loss, and its word-level
    tokenizer refuses unseen characters by name as the run's own tokenizer does."""
    exported = kqv.export(lm_dir, hf=tmp_path / "hf")
    finetune(exported, tmp_path / "ft")
    run_dir = tmp_path / "ft" / "run"
    assert logged_losses(run_dir)[0] == pytest.approx(first_batch_loss(kqv.load(lm_dir).model, run_dir), abs=1e-5)
    with pytest.raises(DataError, match=r"1 characters of 1 kinds .*'Q' \(1x\)"):
        finetune(exported, tmp_path / "bad", text=FINETUNE_TEXT + "Q\n")
    assert not (tmp_path / "bad" / "run").exists()


def test_a_hub_name_is_fetched_as_safetensors_and_tokenizer_only(gpt2_dir, monkeypatch):
    """`--init openai-community/gpt2` (no such directory) asks huggingface_hub for the snapshot, weights as
    safetensors and the tokenizer only, and reads it as the directory it is (no network: the download is faked)."""
    import huggingface_hub

    from kqv.jobs.init import read_source

    asked = {}

    def snapshot_download(name, allow_patterns):
        asked.update(name=name, patterns=allow_patterns)
        return str(gpt2_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    source = read_source("openai-community/gpt2")
    assert source.path == gpt2_dir and source.kind == "Hugging Face GPT-2"
    assert asked["name"] == "openai-community/gpt2" and "model.safetensors" in asked["patterns"]
    assert not any(pattern.endswith((".bin", ".pt", ".pkl")) for pattern in asked["patterns"])


def test_a_hub_name_that_cannot_be_fetched_is_one_clear_error(monkeypatch, tmp_path):
    import huggingface_hub

    from kqv.errors import command_line
    from kqv.jobs.init import read_source

    def offline(name, allow_patterns):
        raise OSError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ConfigError, match=r"^init=gpt2: no such directory, and it could not be fetched .*\(OSError\)"):
        read_source("gpt2")
    with command_line(), pytest.raises(ConfigError, match=r"^--init gpt2: no such directory"):
        read_source("gpt2")  # the command line's words for the option
    with pytest.raises(ConfigError, match="neither a kqv LM run"):
        read_source(tmp_path)  # an existing directory is never taken for a hub name
