"""kqv from Python (kqv.api): train tiny runs, load them, and get from each operation what `kqv` prints."""

import json
import math

import pytest
import sacrebleu
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import kqv
from kqv.api import AttentionMaps, LMEvaluation, LMRun, MTEvaluation, MTRun
from kqv.cli.main import main
from kqv.errors import ConfigError, RunError
from test_cli import TINY
from test_mt import MODELS, TINY_RUN, number_corpus


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    """A tiny LM trained by `kqv.train` on a repeated line (the corpus of test_cli.py)."""
    root = tmp_path_factory.mktemp("api_lm")
    (root / "tiny.txt").write_text("To be, or not to be, that is the question.\n" * 40)
    (root / "tiny.toml").write_text(TINY.format(position="learned"))
    summary = kqv.train(
        "lm", root / "tiny.toml", out=root / "run", overrides=[f"data.path={root / 'tiny.txt'}"], quiet=True
    )
    assert summary["steps"] == 6
    return root / "run"


@pytest.fixture(scope="module")
def mt_dir(tmp_path_factory):
    """A tiny Transformer translating German number words, trained by `kqv.train` (test_mt.py's corpus)."""
    root = tmp_path_factory.mktemp("api_mt")
    (root / "numbers.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in number_corpus()), encoding="utf-8")
    (root / "tiny.toml").write_text(TINY_RUN.format(kind="transformer", model=MODELS["transformer"]))
    summary = kqv.train(
        "mt", root / "tiny.toml", out=root / "run", overrides=[f"data.path={root / 'numbers.tsv'}"], steps=4, quiet=True
    )
    assert summary["steps"] == 4  # `steps` sets train.steps
    return root / "run"


def printed(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 0
    return capsys.readouterr().out


def test_generate_returns_the_texts_kqv_generate_prints(lm_dir, capsys):
    run = kqv.load(lm_dir)
    assert isinstance(run, LMRun) and not run.model.training
    assert repr(run) == f"LMRun({str(lm_dir)!r}, task='lm', {kqv.count_parameters(run.model):,} parameters)"
    (greedy,) = run.generate("To be", max_new_tokens=5, temperature=0)
    assert greedy.startswith("To be") and len(greedy) == len("To be") + 5
    assert (
        printed(capsys, ["generate", str(lm_dir), "--prompt", "To be", "--max-new-tokens", "5", "--temperature", "0"])
        == greedy + "\n"
    )
    samples = run.generate("To", max_new_tokens=6, count=2, seed=3)
    assert printed(
        capsys, ["generate", str(lm_dir), "--prompt", "To", "--max-new-tokens", "6", "--count", "2", "--seed", "3"]
    ) == "".join(f"--- sample {i} ---\n{t}\n" for i, t in enumerate(samples, 1))


def test_evaluate_returns_the_figures_kqv_eval_prints_and_they_match_a_direct_computation(lm_dir, capsys):
    run = kqv.load(lm_dir)
    result = run.evaluate(max_tokens=32)
    assert isinstance(result, LMEvaluation) and result.source == "the held-out validation split"
    report, as_json = printed(capsys, ["eval", str(lm_dir), "--max-tokens", "32", "--json"]).splitlines()
    assert json.loads(as_json) == result.to_dict()
    assert report == (
        f"the held-out validation split: {result.tokens:,} tokens, loss {result.loss:.4f} nats/token, "
        f"perplexity {result.perplexity:.3f}, {result.bits_per_char:.4f} bits/char"
    )
    ids = load_file(lm_dir / "tokens.safetensors")["val"].long()
    blocks = ids[:33]  # 32 scored tokens: two blocks of the run's context (16)
    inputs, targets = blocks[:-1].view(2, 16), blocks[1:].view(2, 16)
    with torch.no_grad():
        expected = F.cross_entropy(run.model(inputs).flatten(0, 1), targets.flatten()).item()
    assert result.tokens == 32 and result.loss == pytest.approx(expected, rel=1e-5)
    assert result.perplexity == pytest.approx(math.exp(expected), rel=1e-5)
    assert "perplexity=" in repr(result) and "loss=" in repr(result)


def test_attention_returns_causal_weights_with_their_tokens(lm_dir, capsys, tmp_path):
    maps = kqv.load(lm_dir).attention("To be")
    assert isinstance(maps, AttentionMaps) and maps.rows == maps.columns == list("To be")
    assert (maps.layers, maps.heads) == (1, 2) and maps.weights[0].shape == (1, 2, 5, 5)
    weights = maps.weights[0][0]  # (heads, rows, columns)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 5))
    assert torch.all(weights.triu(1) == 0)  # a token attends to none after it
    assert "1 layers x 2 heads" in repr(maps)
    out = tmp_path / "a.png"
    assert printed(capsys, ["attention", str(lm_dir), "--text", "To be", "--out", str(out)]) == (
        f"wrote {out}: 1 layers x 2 heads over 5 tokens\n"
    )


def test_translate_and_evaluate_return_what_kqv_translate_and_eval_print(mt_dir, capsys):
    run = kqv.load(mt_dir)
    assert isinstance(run, MTRun)
    sentences = ["eins zwei", "drei"]
    translations = run.translate(sentences)
    assert len(translations) == 2 and run.translate("drei") == translations[1:]
    assert printed(capsys, ["translate", str(mt_dir), "eins zwei"]) == translations[0] + "\n"
    assert run.translate(sentences, beam_size=1) == [run.translate(s, beam_size=1)[0] for s in sentences]
    result = run.evaluate(max_sentences=10, beam_size=1)
    assert isinstance(result, MTEvaluation) and (result.sentences, result.beam_size) == (10, 1)
    sources, references = (side[:10] for side in run.test_texts())
    hypotheses = run.translate(sources, beam_size=1)
    assert result.bleu == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert result.chrf == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score)
    report, as_json = printed(
        capsys, ["eval", str(mt_dir), "--max-sentences", "10", "--beam", "1", "--json"]
    ).splitlines()
    figures = json.loads(as_json)
    assert figures.pop("seconds") >= 0 and figures == {k: v for k, v in result.to_dict().items() if k != "seconds"}
    assert report.startswith(f"the held-out test split: 10 sentences, BLEU {result.bleu:.2f}, chrF {result.chrf:.2f}")


def test_the_cross_attention_of_a_translation_run(mt_dir, capsys, tmp_path):
    run = kqv.load(mt_dir)
    maps = run.attention("eins zwei")
    assert maps.kind == "cross" and maps.translation == run.translate("eins zwei")[0]
    assert maps.rows[0] == "<bos>" and maps.columns[-1] == "<eos>"
    assert maps.weights[0].shape == (1, 2, len(maps.rows), len(maps.columns))
    assert torch.allclose(maps.weights[0].sum(-1), torch.ones(1, 2, len(maps.rows)))
    given = run.attention("eins zwei", tgt="one two")
    assert given.translation == "one two" and given.rows[0] == "<bos>"
    out = tmp_path / "a.png"
    assert printed(capsys, ["attention", str(mt_dir), "--src", "eins zwei", "--out", str(out)]).startswith(
        f"translation: {maps.translation}\nwrote {out}: 1 layers x 2 heads, {len(maps.rows)} target x "
        f"{len(maps.columns)} source tokens"
    )


def test_an_operation_the_run_s_job_does_not_offer_is_a_clear_error(lm_dir, mt_dir):
    with pytest.raises(
        RunError, match=f"{mt_dir} is a translation run, which cannot generate text; generate works on lm runs"
    ):
        kqv.load(mt_dir).generate("eins")
    with pytest.raises(RunError, match="is a language-model run, which cannot translate; translate works on mt runs"):
        kqv.load(lm_dir).translate(["To be"])


def test_bad_arguments_are_kqv_errors_named_for_python(lm_dir, mt_dir, tmp_path):
    with pytest.raises(ConfigError, match="count must be an integer from 1 to 10,000, got 0"):
        kqv.load(lm_dir).generate("To", count=0)
    with pytest.raises(ConfigError, match=r"dtype must be one of \['bf16', 'fp32', 'int8'\]"):
        kqv.load(lm_dir).generate("To", dtype="fp16")
    with pytest.raises(ConfigError, match="give both src and ref"):
        kqv.load(mt_dir).evaluate(src=tmp_path / "x.de")
    with pytest.raises(ConfigError, match="beam_size must be at least 1"):
        kqv.load(mt_dir).translate("eins", beam_size=0)
    with pytest.raises(ConfigError, match="no job 'vision'"):
        kqv.train("vision")
    with pytest.raises(ConfigError, match=r"a resumed run cannot change model.d_model .*overwrite=True"):
        kqv.train("lm", out=lm_dir, resume=True, steps=8, overrides=["model.d_model=1024"])


def test_steps_and_init_apply_to_a_config_object_as_to_a_config_name(lm_dir, tmp_path):
    """`kqv.train(job, <RunConfig>, steps=N, init=SOURCE)` trains a checked copy of the object with train.steps and
    data.init set, the run a config name with the same settings trains; the object itself stays as it was."""
    from kqv.jobs import get_job

    lm = get_job("lm")
    (tmp_path / "tiny.txt").write_text("To be, or not to be, that is the question.\n" * 40)
    (tmp_path / "tiny.toml").write_text(TINY.format(position="learned"))
    config = lm.load_config(tmp_path / "tiny.toml", [f"data.path={tmp_path / 'tiny.txt'}"])
    assert kqv.train("lm", config, out=tmp_path / "short", steps=2, quiet=True)["steps"] == 2
    assert config.train.steps == 6
    with pytest.raises(ConfigError, match="steps"):
        kqv.train("lm", config, out=tmp_path / "none", steps=0, quiet=True)
    assert not (tmp_path / "none").exists()
    sets = [f"data.path={tmp_path / 'tiny.txt'}", "train.batch_size=4", 'train.precision="fp32"', "train.eval_every=2"]
    by_name = kqv.train("lm", "finetune", init=lm_dir, out=tmp_path / "name", overrides=sets, steps=2, quiet=True)
    finetune = lm.load_config(kqv.api.packaged_config("finetune"), sets)  # no data.context: the source's decides
    by_object = kqv.train("lm", finetune, init=lm_dir, out=tmp_path / "object", steps=2, quiet=True)
    assert by_object["source"] == by_name["source"] and by_object["source"]["path"] == str(lm_dir)
    assert by_object["final_train_loss"] == by_name["final_train_loss"]
    assert finetune.data.init is None and finetune.train.steps == 300
    assert finetune.starting_from(str(lm_dir)).data.context == 128  # no context given: a fine-tune's default
    assert config.starting_from(str(lm_dir)).data.context == 16  # a given one is kept
    mt = get_job("mt").load_config(kqv.api.packaged_config("quick", "mt"))
    with pytest.raises(ConfigError, match="init"):
        kqv.train("mt", mt, init=lm_dir, out=tmp_path / "mt", quiet=True)


def test_score_is_the_log_probability_the_model_s_loss_implies(mt_dir):
    run = kqv.load(mt_dir)
    sources = ["eins zwei", "drei"]
    translations = run.translate(sources)
    scores = run.score(sources, [*translations[:1], "three four"])
    pad, bos, eos = (run.tokenizer.token_to_id(t) for t in ("<pad>", "<bos>", "<eos>"))
    for source, target, score in zip(sources, [translations[0], "three four"], scores):
        src = torch.tensor([run.tokenizer.encode(source) + [eos]])
        ids = run.tokenizer.encode(target)
        with torch.no_grad():  # the model's mean cross-entropy, through its own loss path
            loss = run.model(src, torch.tensor([[bos] + ids]), torch.tensor([ids + [eos]])).item()
        assert score < 0 and score == pytest.approx(-loss * (len(ids) + 1), rel=1e-4)
    with pytest.raises(kqv.errors.DataError, match="2 sources for 1 translations"):
        run.score(sources, ["one"])
