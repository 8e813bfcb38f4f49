"""Issue 34, scoring: `complete` (batched completions that stop at the end of text), `evaluate(pairs=...)` (completion
loss and exact match with a Wilson interval), and `kqv generate --prompts` / `kqv eval --data pairs.tsv`.

References are independent: a loop of argmax over the model's full-prefix logits one token at a time (and over
`transformers`' own GPT-2 for a GPT-2 directory), `F.cross_entropy` over the completion positions, and the closed
forms of the Wilson interval."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

import kqv
from conftest import tiny_config
from kqv.cli.main import main
from kqv.data.completions import end_of_text
from kqv.data.tokenizers import CharTokenizer
from kqv.errors import ConfigError, DataError
from kqv.jobs.answer_files import escape_line
from kqv.jobs.scoring import Prediction, complete, evaluate_pairs, normalise
from kqv.train.score_statistics import wilson_interval
from test_finetune import tiny_run

CHARS = "abcdefgh \n"
PROMPTS = ["abc", "h", "gfedcba", "aaaa", "bd", "hgh", "ee", "fgfgfgf"]
EOS_BIAS = {"learned": 3.0, "rope": 2.5}  # the end of text wins at some steps of some prompts, not at all
GREEDY = kqv.GenerationConfig(temperature=0, max_new_tokens=8)


def peaked_model(position):
    """A random tiny model with confident (std 0.5) weights, so its greedy tokens vary, and a bias towards the end
    of text (the newline), so that some completions stop early and others run to max_new_tokens."""
    tokenizer = CharTokenizer(list(CHARS))
    torch.manual_seed(0)
    model = kqv.DecoderLM(tiny_config(vocab_size=len(CHARS), position=position, output_bias=True)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0, 0.5)
        model.lm_head.bias.zero_()
        model.lm_head.bias[tokenizer.encode("\n")[0]] = EOS_BIAS[position]
    return model, tokenizer


def argmax_loop(logits_of, prompt_ids, eos_id, max_new_tokens):
    """The reference: append the argmax of the last position's logits over the whole prefix, one token at a time,
    until the end of text (not kept) or max_new_tokens."""
    ids, new = list(prompt_ids), []
    for _ in range(max_new_tokens):
        with torch.no_grad():
            token = int(logits_of(torch.tensor([ids]))[0, -1].argmax())
        if token == eos_id:
            break
        ids.append(token)
        new.append(token)
    return new


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_greedy_completions_are_the_argmax_loop_stopped_at_the_end_of_text(position):
    model, tokenizer = peaked_model(position)
    eos_id, _ = end_of_text(tokenizer)
    expected = [tokenizer.decode(argmax_loop(model, tokenizer.encode(p), eos_id, 8)) for p in PROMPTS]
    got = complete(model, tokenizer, PROMPTS, GREEDY)
    assert got == expected
    lengths = {len(text) for text in got}
    assert 8 in lengths and min(lengths) < 8  # some stopped at the end of text, some ran to max_new_tokens
    assert all("\n" not in text for text in got)


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_batched_completions_equal_one_at_a_time(position):
    model, tokenizer = peaked_model(position)
    one_by_one = [complete(model, tokenizer, [prompt], GREEDY)[0] for prompt in PROMPTS]
    assert complete(model, tokenizer, PROMPTS, GREEDY, batch_size=3) == one_by_one
    assert complete(model, tokenizer, PROMPTS, GREEDY, batch_size=len(PROMPTS)) == one_by_one
    sampled = kqv.GenerationConfig(temperature=1.0, max_new_tokens=8, seed=3)
    first = complete(model, tokenizer, PROMPTS, sampled)
    assert first == complete(model, tokenizer, PROMPTS, sampled)  # one seeded generator: reproducible
    assert all("\n" not in text and len(text) <= 8 for text in first)


def test_complete_refuses_what_it_cannot_continue():
    model, tokenizer = peaked_model("learned")
    with pytest.raises(DataError, match="prompt 2 is empty"):
        complete(model, tokenizer, ["ab", ""], GREEDY)
    with pytest.raises(DataError, match="list of strings"):
        complete(model, tokenizer, "ab", GREEDY)
    with pytest.raises(DataError, match="no prompts"):
        complete(model, tokenizer, [], GREEDY)
    with pytest.raises(DataError, match="prompt 1 is 65 tokens, more than the 64 positions"):
        complete(model, tokenizer, ["a" * 65], GREEDY)
    with pytest.raises(ConfigError, match="count must be 1"):
        complete(model, tokenizer, ["ab"], kqv.GenerationConfig(count=2))


def test_the_wilson_interval_is_the_closed_form():
    assert wilson_interval(8, 10) == pytest.approx((0.490, 0.943), abs=5e-4)  # the textbook example
    z2 = 1.959963984540054**2
    assert wilson_interval(0, 20) == pytest.approx((0.0, z2 / (20 + z2)), abs=1e-12)  # none right: [0, z^2/(n+z^2)]
    assert wilson_interval(20, 20) == pytest.approx((20 / (20 + z2), 1.0), abs=1e-12)
    low, high = wilson_interval(50, 100)
    assert (low + high) / 2 == pytest.approx(0.5) and high - low == pytest.approx(
        2 * 1.959964 * 0.5 / math.sqrt(100 + z2)
    )
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_exact_match_normalises_whitespace_only():
    assert normalise("  to be\t or\n\nnot ") == "to be or not"
    assert Prediction("p", " to  be ", "to be").correct
    assert not Prediction("p", "to be", "to  bee").correct and not Prediction("p", "To be", "to be").correct


def test_pairs_score_half_right_and_the_completion_loss_of_a_reference(tmp_path):
    model, tokenizer = peaked_model("learned")
    eos_id, _ = end_of_text(tokenizer)
    own = complete(model, tokenizer, PROMPTS, GREEDY)
    chosen = [(p, text) for p, text in zip(PROMPTS, own, strict=True) if text][:4]  # a TSV completion is non-empty
    pairs = [(p, text if i % 2 == 0 else text + "a") for i, (p, text) in enumerate(chosen)]  # every other one wrong
    pairs[0] = (pairs[0][0], f"  {pairs[0][1]} ")  # right up to whitespace
    (tmp_path / "qa.tsv").write_text("".join(f"{p}\t{c}\n" for p, c in pairs))
    result = evaluate_pairs(model, tokenizer, tmp_path / "qa.tsv", max_new_tokens=8)
    assert (result.n, result.correct) == (4, 2) and result.exact_match == 0.5
    assert (result.low, result.high) == wilson_interval(2, 4)
    assert [p.got for p in result.predictions] == [text for _, text in chosen]
    nats, count = 0.0, 0
    for prompt, completion in pairs:
        prompt_ids, answer = tokenizer.encode(prompt), tokenizer.encode(completion) + [eos_id]
        ids = torch.tensor([prompt_ids + answer])
        with torch.no_grad():
            logits = model(ids[:, :-1])[0, len(prompt_ids) - 1 :]
        nats += F.cross_entropy(logits, torch.tensor(answer), reduction="sum").item()
        count += len(answer)
    assert result.tokens == count
    assert result.loss == pytest.approx(nats / count, rel=1e-5)
    assert result.perplexity == pytest.approx(math.exp(nats / count), rel=1e-5)
    figures = result.to_dict()
    assert figures["exact_match_95"] == [result.low, result.high] and "predictions" not in figures


def test_pairs_with_the_default_answer_room_let_answers_run_past_their_expected_length(tmp_path):
    model, tokenizer = peaked_model("learned")
    own = complete(model, tokenizer, PROMPTS, GREEDY)
    kept = [(p, text) for p, text in zip(PROMPTS, own, strict=True) if text]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in kept))
    result = evaluate_pairs(model, tokenizer, tmp_path / "qa.jsonl")  # room for 16 tokens past the longest answer
    room = kqv.GenerationConfig(temperature=0, max_new_tokens=max(len(c) for _, c in kept) + 1 + 16)
    longer = complete(model, tokenizer, [p for p, _ in kept], room)
    assert [p.got for p in result.predictions] == longer
    assert result.correct == sum(a == b for (_, a), b in zip(kept, longer, strict=True)) < len(kept)  # 8 was a cut


# -- a trained run, a GPT-2 directory and the command line ----------------------------------------------------------


QA = "To be\t, or\nthat\t is\n"  # pairs short enough for the tiny run's 16 positions


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("scoring"))


def test_a_run_completes_and_scores_pairs_as_the_functions_do(run_dir, tmp_path):
    run = kqv.load(run_dir)
    prompts = ["To be", "that is", "or not"]
    got = run.complete(prompts, temperature=0, max_new_tokens=12)
    assert got == complete(run.model, run.tokenizer, prompts, kqv.GenerationConfig(temperature=0, max_new_tokens=12))
    (tmp_path / "qa.tsv").write_text(QA)
    result = run.evaluate(pairs=tmp_path / "qa.tsv")
    assert result.n == 2 and result.source == str(tmp_path / "qa.tsv")
    (tmp_path / "long.tsv").write_text("To be, or not\tto be, that is\n")  # 13 + 14 + 1 - 1 > 16 positions
    with pytest.raises(DataError, match="long.tsv: pair 1 is 27 tokens with its end of text, more than the 16"):
        run.evaluate(pairs=tmp_path / "long.tsv")
    (tmp_path / "qa.txt").write_text(QA)
    with pytest.raises(DataError, match="not a file of pairs"):
        run.evaluate(pairs=tmp_path / "qa.txt")
    with pytest.raises(ConfigError, match="either text"):
        run.evaluate(tmp_path / "qa.tsv", pairs=tmp_path / "qa.tsv")


def test_a_gpt2_directory_completes_and_scores_pairs_as_transformers_does(gpt2_dir, tmp_path):
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()
    run = kqv.load(gpt2_dir)
    eos_id, _ = end_of_text(run.tokenizer)
    prompts = ["To be, or", "that", "the question. To be"]
    expected = [
        run.tokenizer.decode(argmax_loop(lambda ids: hf(ids).logits, run.tokenizer.encode(p), eos_id, 6))
        for p in prompts
    ]
    assert run.complete(prompts, temperature=0, max_new_tokens=6) == expected
    pairs = [("To be, or", " not to be"), ("that is the", " question.")]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in pairs))
    result = run.evaluate(pairs=tmp_path / "qa.jsonl")
    nats, count = 0.0, 0
    for prompt, completion in pairs:  # transformers' logits over the completion positions
        prompt_ids = run.tokenizer.encode(prompt)
        answer = run.tokenizer.encode(completion) + [eos_id]
        with torch.no_grad():
            logits = hf(torch.tensor([prompt_ids + answer[:-1]])).logits[0, len(prompt_ids) - 1 :]
        nats += F.cross_entropy(logits, torch.tensor(answer), reduction="sum").item()
        count += len(answer)
    assert result.tokens == count and result.loss == pytest.approx(nats / count, rel=1e-5)


def test_kqv_generate_prompts_writes_one_completion_a_line(run_dir, tmp_path, capsys):
    (tmp_path / "prompts.txt").write_text("To be\nthat is\nor not\n")
    out = tmp_path / "preds.txt"
    flags = ["--prompts", str(tmp_path / "prompts.txt"), "--temperature", "0", "--max-new-tokens", "12"]
    assert main(["generate", str(run_dir), *flags, "--out", str(out)]) == 0
    expected = kqv.load(run_dir).complete(["To be", "that is", "or not"], temperature=0, max_new_tokens=12)
    assert out.read_text().splitlines() == [escape_line(text) for text in expected]
    assert capsys.readouterr().out.startswith(f"wrote {out}: 3 completions")
    assert main(["generate", str(run_dir), *flags]) == 0
    assert capsys.readouterr().out.splitlines() == [escape_line(text) for text in expected]
    for wrong in (["--prompt", "To", *flags], ["--temperature", "0"], ["--prompt", "To", "--out", str(out)]):
        before = out.read_text()
        assert main(["generate", str(run_dir), *wrong]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--prompt" in err and out.read_text() == before


@pytest.mark.parametrize(
    "content, words", [(None, "no file of prompts"), ("", "is empty"), ("To be\n\nthat\n", "1 blank line(s) (line 2)")]
)
def test_kqv_generate_refuses_a_bad_prompts_file_in_one_line_writing_nothing(run_dir, tmp_path, capsys, content, words):
    if content is not None:
        (tmp_path / "prompts.txt").write_text(content)
    out = tmp_path / "preds.txt"
    assert main(["generate", str(run_dir), "--prompts", str(tmp_path / "prompts.txt"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and not out.exists()


def test_kqv_eval_scores_pairs_by_suffix_and_writes_predictions(run_dir, tmp_path, capsys):
    (tmp_path / "qa.tsv").write_text(QA)
    predictions = tmp_path / "predictions.tsv"
    argv = ["eval", str(run_dir), "--data", str(tmp_path / "qa.tsv"), "--predictions", str(predictions), "--json"]
    assert main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    figures = json.loads(printed[-1])
    result = kqv.load(run_dir).evaluate(pairs=tmp_path / "qa.tsv")
    expected = result.to_dict()
    assert figures.pop("kind_constants") == expected.pop("kind_constants")  # approx takes no nested mapping
    assert figures.pop("reading_runner_ups") == expected.pop("reading_runner_ups")
    assert figures == pytest.approx(expected)
    assert any(line.strip().startswith("exact match") for line in printed)
    rows = predictions.read_text().splitlines()
    assert rows[0] == "prompt\texpected\tgot\tcorrect" and len(rows) == 3
    assert [row.split("\t")[2] for row in rows[1:]] == [escape_line(p.got) for p in result.predictions]
    assert main(["eval", str(run_dir), "--data", str(tmp_path / "missing.jsonl")]) == 2
    assert "no file of pairs" in capsys.readouterr().err
    (tmp_path / "bad.tsv").write_text("no tab here\n")
    assert main(["eval", str(run_dir), "--data", str(tmp_path / "bad.tsv"), "--predictions", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.tsv:1" in err and not (tmp_path / "p").exists()


def test_escape_line_keeps_a_completion_on_one_readable_line():
    assert escape_line("a\\b\nc\td\r") == "a\\\\b\\nc\\td\\r"


def test_a_run_of_another_job_says_complete_works_on_lm_runs(tmp_path):
    from kqv.jobs import get_job

    vit = get_job("vit")
    run = vit.run_class(vit, None, torch.nn.Linear(2, 2), None, tmp_path / "vit")
    with pytest.raises(
        kqv.errors.RunError, match="vit is .* run, which cannot complete prompts; complete works on lm runs"
    ):
        run.complete(["To be"])
