"""Issue 42, evaluation that cannot flatter: `evaluate(pairs=...)` and `kqv eval RUN --data pairs` give the constant
answer (the most frequent completion of the run's fine-tuning pairs, else of the scored file) and the uniform guess
beside the model, and the model's difference to the constant with a 95% interval whose unit is the question; with
several seeds, each question's mean over the seeds, never the seeds' answers pooled as more questions.

References are hand computations: differences written out, Student's t from a printed table, binomial tails
counted by hand."""

import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path

import pytest

import kqv
from kqv.cli.main import main
from kqv.data.completions import split_examples
from kqv.jobs.scoring import (
    PairsEvaluation,
    Prediction,
    constant_answer,
    fine_tuning_answers,
    kind_constants,
    with_baselines,
)
from kqv.train.score_statistics import (
    difference_from_guess,
    difference_over_questions,
    guess_test,
    mean_over_seeds,
    sign_test,
    t_quantile,
)
from test_finetune import tiny_run

ROOT = Path(__file__).resolve().parents[1]
T_TABLE = {1: 12.706205, 3: 3.182446, 4: 2.776445, 5: 2.570582, 9: 2.262157, 30: 2.042272, 1000: 1.962339}


def test_t_quantiles_are_the_printed_table():
    assert {df: round(t_quantile(df), 6) for df in T_TABLE} == T_TABLE


def test_the_difference_to_the_constant_over_questions_is_a_hand_computation():
    model = [1, 1, 1, 1, 1, 0, 0, 0, 1, 0]
    constant = [0, 0, 0, 1, 1, 1, 0, 0, 0, 0]
    # differences 1 1 1 0 0 -1 0 0 1 0: mean 0.3; squared deviations 4 x 0.7^2 + 1.3^2 + 5 x 0.3^2 = 4.1
    half = T_TABLE[9] * math.sqrt(4.1 / 9) / math.sqrt(10)
    result = difference_over_questions(model, constant)
    assert result.n == 10 and result.difference == pytest.approx(0.3)
    assert (result.low, result.high) == pytest.approx((0.3 - half, 0.3 + half), abs=1e-6)  # [-0.183, 0.783]
    assert (result.better, result.worse) == (4, 1)
    assert result.p_value == pytest.approx(2 * (1 + 5) / 2**5)  # McNemar exact: 2 P(X <= 1), X ~ Binomial(5, 1/2)


def test_the_sign_test_and_the_edges_of_the_interval():
    assert sign_test(0, 0) == 1.0 and sign_test(3, 3) == 1.0
    assert sign_test(5, 0) == pytest.approx(2 / 32) and sign_test(0, 10) == pytest.approx(2 / 1024)
    one = difference_over_questions([1], [0])  # one question says nothing about the next
    assert (one.low, one.high) == (-1.0, 1.0)
    same = difference_over_questions([1] * 5, [0] * 5)  # no spread: no width, and the sign test says 5 is few
    assert (same.low, same.high) == (1.0, 1.0) and same.p_value == pytest.approx(2 / 32)
    with pytest.raises(kqv.errors.DataError, match="same questions"):
        difference_over_questions([1, 0], [1])


def test_the_guess_test_is_the_binomial_test_when_every_guess_has_the_same_chance():
    n, chance = 30, 0.2
    binomial = [math.comb(n, k) * chance**k * (1 - chance) ** (n - k) for k in range(n + 1)]
    for hits in (0, 3, 6, 11, 30):
        expected = min(1.0, 2 * min(sum(binomial[: hits + 1]), sum(binomial[hits:])))
        assert guess_test(hits, [chance] * n) == pytest.approx(expected, rel=1e-9)


def test_a_model_that_never_answers_is_not_called_worse_than_a_guess_that_rarely_answers():
    """Against a guess right with chance 1/100 on each of 100 questions, no right answer happens 37% of the time
    (0.99**100): not a significant difference, though every question's difference is negative (the sign test, which
    needs 1/0 scores on both sides, would say p = 2**-99)."""
    versus = difference_from_guess([0.0] * 100, [0.01] * 100)
    assert versus.p_value == pytest.approx(min(1.0, 2 * 0.99**100)) and versus.p_value > 0.5
    assert versus.difference == pytest.approx(-0.01) and (versus.better, versus.worse) == (0, 1)
    assert versus.test == "guess" and versus.to_dict()["test"] == "guess"


def test_several_seeds_are_tested_against_the_guess_one_by_one_never_pooled():
    """Seed 0 gets 6 of 100 right where a guess expects 1 (p < 0.002); seed 1 gets 1 (p = 1). Pooled as 7 hits in 200
    independent trials the guess test would say p < 0.01; the seeds' answers to one question are not independent,
    so each seed is tested alone and the difference is called only when every seed's test is."""
    guesses = [0.01] * 100
    seed0, seed1 = [1] * 6 + [0] * 94, [1] + [0] * 99
    means = [(a + b) / 2 for a, b in zip(seed0, seed1)]
    pooled = guess_test(7, guesses * 2)
    assert pooled < 0.01
    versus = difference_from_guess(means, guesses, per_seed=[seed0, seed1])
    assert versus.seed_p_values == pytest.approx((guess_test(6, guesses), guess_test(1, guesses)))
    assert versus.seed_p_values[0] < 0.002 and versus.p_value == pytest.approx(1.0) and versus.p_value > pooled
    assert versus.to_dict()["seed_p_values"] == pytest.approx(list(versus.seed_p_values))
    both = difference_from_guess([1] * 6 + [0] * 94, guesses, per_seed=[seed0, seed0])  # every seed significant
    assert both.p_value == pytest.approx(guess_test(6, guesses)) and both.p_value < 0.002
    opposite = difference_from_guess([0.5] * 6 + [0] * 94, guesses, per_seed=[seed0, [0] * 100])
    assert opposite.p_value == 1.0  # one seed above the guess, the other below: no side is called
    with pytest.raises(kqv.errors.DataError, match="per_seed"):
        difference_from_guess(means, guesses)  # seed means cannot be tested as one run's answers
    with pytest.raises(kqv.errors.DataError, match="mean over the seeds"):
        difference_from_guess(means, guesses, per_seed=[seed0, seed0])


def test_the_exact_test_says_mcnemar_on_one_run_s_scores_and_sign_on_seed_means():
    assert difference_over_questions([1, 0, 1], [0, 0, 1]).test == "McNemar"
    averaged = difference_over_questions([0.5, 0, 1], [0, 0, 1])
    assert averaged.test == "sign" and averaged.to_dict()["test"] == "sign"


def test_several_seeds_give_each_question_its_mean_and_n_stays_the_questions():
    per_seed = [[1, 0, 0, 1, 0, 1], [1, 1, 0, 0, 0, 1], [1, 0, 0, 1, 0, 0]]
    means = mean_over_seeds(per_seed)
    assert means == pytest.approx([1, 1 / 3, 0, 2 / 3, 0, 2 / 3])
    differences = [1, 1 / 3, 0, -1 / 3, 0, -1 / 3]  # against a constant right on questions 4 and 6
    result = difference_over_questions(means, [0, 0, 0, 1, 0, 1])
    half = T_TABLE[5] * statistics.stdev(differences) / math.sqrt(6)
    assert result.n == 6 and result.difference == pytest.approx(1 / 9)
    assert (result.low, result.high) == pytest.approx((1 / 9 - half, 1 / 9 + half), abs=1e-6)
    with pytest.raises(kqv.errors.DataError, match="same questions"):
        mean_over_seeds([[1, 0], [1, 0, 1]])


def benchmark():
    spec = importlib.util.spec_from_file_location("finetune_qa", ROOT / "benchmarks" / "finetune_qa.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["finetune_qa"] = module
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_compares_arms_over_questions_not_over_seeds_times_questions():
    per_seed = {"a": [[1, 0, 0, 1, 0, 1], [1, 1, 0, 0, 0, 1], [1, 0, 0, 1, 0, 0]], "b": [[0, 0, 0, 1, 0, 1]] * 3}
    arms = {
        name: [
            {
                "seed": seed,
                "qa_test": {"per_question": scores, "exact_match": statistics.fmean(scores)},
                "qa_train": {"per_question": [1, 1], "exact_match": 1.0},
                "trainable_parameters": 10,
                "parameters": 10,
                "peak_rss_mb": 1.0,
                "tokens_per_s": 1.0,
                "train_seconds": 1.0,
            }
            for seed, scores in enumerate(runs, 1)
        ]
        for name, runs in per_seed.items()
    }
    summary = benchmark().summarise(arms, {"per_kind": {"per_question": [0, 0, 0, 1, 0, 1]}})
    expected = difference_over_questions(mean_over_seeds(per_seed["a"]), [0, 0, 0, 1, 0, 1]).to_dict()
    gap = summary["arms"]["a"]["versus_constant_per_kind"]
    assert gap["questions"] == 6 and gap["difference_95"] == pytest.approx(expected["difference_95"])
    assert summary["arms"]["a"]["held_out_questions"]["questions"] == 6
    assert summary["arms"]["b"]["versus_constant_per_kind"]["difference_95"] == [0.0, 0.0]  # b is the constant


def scored(expected, got):
    predictions = tuple(Prediction(f"q{i}", e, g) for i, (e, g) in enumerate(zip(expected, got)))
    correct = sum(p.correct for p in predictions)
    return PairsEvaluation("f", len(expected), correct, 0.0, 1.0, 1.0, math.e, 4, predictions)


def test_the_constant_and_uniform_baselines_of_a_reference_by_hand():
    assert constant_answer(["b", "a"]) == "a" and constant_answer(["b", " b", "a"]) == "b"  # ties: sorted first
    result = with_baselines(scored(["a", "b", "a", "c"], ["a", "b", "x", "x"]), ["a", " a ", "b"], "the reference")
    assert (result.constant, result.constant_correct, result.constant_exact_match) == ("a", 2, 0.5)
    assert result.constant_scores == [1, 0, 1, 0] and result.constant_reference == "the reference"
    assert result.distinct_answers == 2 and result.uniform == pytest.approx((1 / 2 + 1 / 2 + 1 / 2 + 0) / 4)
    versus = result.versus_constant  # model 1 1 0 0 against 1 0 1 0
    assert (versus.difference, versus.n, versus.better, versus.worse, versus.p_value) == (0.0, 4, 1, 1, 1.0)
    figures = result.to_dict()
    assert figures["constant"] == "a" and figures["versus_constant_95"] == [versus.low, versus.high]
    assert figures["versus_constant_questions"] == 4 and figures["uniform_exact_match"] == result.uniform


ANSWERS = [" be"] * 6 + [" or"] * 2 + [" that"] * 2  # the fine-tune's: "be" most often whichever pair is held out
SCORED = [("is it a", " or"), ("is it b", " or"), ("is it e", " or"), ("is it h", " be")]  # the file's own: "or"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("baselines")
    source = tiny_run(root / "source", steps=1)
    prompts = [f"is it {letter}" for letter in "abehinoqrs"]
    (root / "qa.tsv").write_text("".join(f"{p}\t{a}\n" for p, a in zip(prompts, ANSWERS)))
    (root / "scored.tsv").write_text("".join(f"{p}\t{a}\n" for p, a in SCORED))
    overrides = [f"data.path={root / 'qa.tsv'}"]
    kqv.train("lm", source.parent / "tiny.toml", out=root / "qa", init=source, overrides=overrides, steps=2, quiet=True)
    return {"text": source, "pairs": root / "qa", "scored": root / "scored.tsv"}


def test_a_pair_run_s_constant_is_the_most_frequent_answer_it_fine_tuned_on(runs):
    run = kqv.load(runs["pairs"])
    trained, _ = split_examples(len(ANSWERS), 0.1)
    assert sorted(fine_tuning_answers(run.tokenizer, run.loaded_corpus.train)) == sorted(ANSWERS[k] for k in trained)
    result = run.evaluate(pairs=runs["scored"])
    assert result.constant == "be" and result.constant_correct == 1  # not the scored file's "or"
    assert result.constant_reference == "the 9 pairs the run fine-tuned on"
    assert result.distinct_answers == 3 and result.uniform == pytest.approx(1 / 3)
    model = [int(p.correct) for p in result.predictions]
    assert result.versus_constant.n == 4 and result.versus_constant.difference == pytest.approx(sum(model) / 4 - 1 / 4)


def test_a_run_without_pairs_takes_the_constant_of_the_scored_file(runs):
    result = kqv.load(runs["text"]).evaluate(pairs=runs["scored"])
    assert result.constant == "or" and result.constant_correct == 3
    assert result.constant_reference.startswith("the 4 scored pairs")
    assert result.distinct_answers == 2 and result.uniform == pytest.approx(1 / 2)


def test_kqv_eval_prints_the_baselines_and_the_difference_over_questions(runs, capsys):
    assert main(["eval", str(runs["pairs"]), "--data", str(runs["scored"])]) == 0
    lines = {line.strip().split("  ", 1)[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    result = kqv.load(runs["pairs"]).evaluate(pairs=runs["scored"])
    versus = result.versus_constant
    assert "1/4 = 25.0%, always answering 'be' (the most frequent answer of the 9 pairs" in lines["constant baseline"]
    interval = f"{versus.difference:+.1%} (95% interval over the 4 questions {versus.low:+.1%} to {versus.high:+.1%}"
    assert interval in lines["model - constant"]
    assert f"McNemar exact p = {versus.p_value:.3g}" in lines["model - constant"]
    assert "33.3% expected, a guess among the 3 distinct answers" in lines["uniform baseline"]
    assert main(["eval", str(runs["pairs"]), "--data", str(runs["scored"]), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert figures["constant"] == "be" and figures["versus_constant_95"] == pytest.approx([versus.low, versus.high])
    assert figures["versus_constant_questions"] == 4 and figures["uniform_exact_match"] == pytest.approx(1 / 3)


def test_the_per_kind_constant_and_the_reading_score_by_hand_ties_included():
    reference = ["X", "X", "Y", "Z", "1990", "1999", "1999", "1990", "1945"]
    kinds = ["town"] * 4 + ["year"] * 5
    # the years tie (1990 and 1999 twice each): the first in sorted order, as `constant_answer` breaks every tie
    assert kind_constants(reference, kinds) == {"town": "X", "year": "1990"}
    rows = [("X", "X", "town"), ("Y", "Y", "town"), ("Z", "X", "town"), ("W", "W", "town")]
    rows += [("1990", "1999", "year"), ("1999", "1999", "year"), ("1945", "1990", "year"), ("Q", "Q", "trade")]
    predictions = tuple(Prediction(f"q{i}", e, g, k) for i, (e, g, k) in enumerate(rows))
    base = PairsEvaluation("f", 8, 5, 0.0, 1.0, 1.0, math.e, 4, predictions)
    result = with_baselines(base, reference, "the reference", kinds)
    assert result.constant == "1990"  # X, 1990 and 1999 twice each: a kind the reference lacks ("trade") takes it
    assert (result.per_kind_correct, result.per_kind_exact_match) == (2, 2 / 8)  # questions 1 and 5
    # reading questions: 2 3 4 6 7 8 (answers that are not their kind's constant); the model is right on 2 4 6 8
    assert (result.reading_n, result.reading_correct, result.reading_exact_match) == (6, 4, 4 / 6)
    assert (result.reading_low, result.reading_high) == pytest.approx(wilson(4, 6))
    # a guess among the kind's other seen answers by frequency: town Y 1/2, Z 1/2, W 0/2; year 1999 2/3, 1945 1/3;
    # trade, unseen, among the whole reference's answers other than the constant: Q 0/7
    guesses = [1 / 2, 1 / 2, 0, 2 / 3, 1 / 3, 0]
    assert result.reading_baseline == pytest.approx(sum(guesses) / 6) == pytest.approx(1 / 3)
    versus = result.versus_reading_baseline
    assert (
        versus.n == 6 and versus.difference == pytest.approx(4 / 6 - 1 / 3) and (versus.better, versus.worse) == (4, 2)
    )
    # a guess gets all 4 guessable questions right with chance 1/2 * 1/2 * 2/3 * 1/3 = 1/18, and never more
    assert versus.test == "guess" and versus.p_value == pytest.approx(2 / 18)
    # the runner-ups: town Y (Y and Z once each, the first in sorted order), year 1999, and trade, unseen, the whole
    # reference's most frequent answer after the constant 1990: X and 1999 twice each, 1999 first in sorted order;
    # right on questions 2 (Y) and 6 (1999); the model beats it on 4 (W) and 8 (Q) and is never worse
    assert result.reading_runner_ups == {"town": "Y", "trade": "1999", "year": "1999"}
    runner = result.versus_reading_runner_up
    assert result.reading_runner_up_correct == 2 and (runner.better, runner.worse) == (2, 0)
    assert runner.difference == pytest.approx(4 / 6 - 2 / 6) and runner.test == "McNemar"
    assert result.versus_per_kind.difference == pytest.approx(5 / 8 - 2 / 8) and result.versus_per_kind.n == 8
    figures = result.to_dict()
    assert figures["kind_constants"] == {"town": "X", "year": "1990"} and figures["reading_questions"] == 6
    assert figures["reading_95"] == [result.reading_low, result.reading_high]
    assert figures["versus_reading_baseline_95"] == [versus.low, versus.high]
    single = with_baselines(base, reference, "the reference")  # no kinds: one kind, its constant the constant
    assert single.kind_constants == {"": "1990"} and single.per_kind_correct == single.constant_correct == 1


def wilson(correct, n, z=1.959964):
    p = correct / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return ((centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n))


def test_kqv_eval_prints_the_per_kind_constant_and_the_reading_score_of_pairs_that_name_their_kind(runs, capsys):
    scored = runs["scored"].with_name("kinds.jsonl")
    kinds = ["a", "a", "b", "b"]
    scored.write_text("".join(json.dumps({"prompt": p, "completion": c, "kind": k}) + "\n"
                              for (p, c), k in zip(SCORED, kinds)))  # fmt: skip
    assert main(["eval", str(runs["text"]), "--data", str(scored)]) == 0
    lines = {line.strip().split("  ", 1)[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    result = kqv.load(runs["text"]).evaluate(pairs=scored)
    assert result.kind_constants == {"a": "or", "b": "be"}  # b: "or" and "be" once each, "be" first in sorted order
    assert (
        "3/4 = 75.0%, always answering a kind's most frequent answer (a: 'or', b: 'be')" in lines["per-kind constant"]
    )
    assert result.reading_n == 1  # "or" of kind b: the one answer that is not its kind's constant
    reading = f"{result.reading_correct}/1 = {result.reading_correct:.1%}"
    assert lines["reading score"].split("reading score")[1].strip().startswith(reading)
    assert "by frequency: 100.0%" in lines["reading score"]  # b's one other seen answer is the question's own


def test_a_pair_run_keeps_the_kinds_it_trained_on_without_its_file(runs):
    """The kinds of question of a pair run's training examples are stored with its tokens when it trains; `kqv eval`
    groups its baselines by them even once the file of pairs is changed or gone."""
    root, source = runs["pairs"].parent, runs["text"]
    path = root / "kinds-qa.jsonl"
    prompts = [f"is it {letter}" for letter in "abehinoqrs"]
    kinds = [f"k{i % 3}" for i in range(10)]
    path.write_text(
        "".join(
            json.dumps({"prompt": p, "completion": a, "kind": k}) + "\n" for p, a, k in zip(prompts, ANSWERS, kinds)
        )
    )
    out = root / "kinds-run"
    kqv.train(
        "lm", source.parent / "tiny.toml", out=out, init=source, overrides=[f"data.path={path}"], steps=1, quiet=True
    )
    trained, _ = split_examples(10, 0.1)
    expected = ([ANSWERS[k] for k in trained], [kinds[k] for k in trained])
    assert kqv.load(out).trained_answers() == expected
    path.write_text("".join(json.dumps({"prompt": p, "completion": a, "kind": "other"}) + "\n" for p, a in SCORED))
    assert kqv.load(out).trained_answers() == expected  # the file changed: the run's own record stands
    path.unlink()
    run = kqv.load(out)
    assert run.trained_answers() == expected
    constants = run.evaluate(pairs=runs["scored"]).kind_constants
    by_kind = {kind: sorted(a for a, k in zip(*expected) if k == kind) for kind in set(expected[1])}
    assert set(constants) == set(by_kind) and all(
        constants[k].strip() in {a.strip() for a in by_kind[k]} for k in by_kind
    )


@pytest.mark.parametrize("kind", ["3", '""', "null"])
def test_a_kind_that_is_not_a_non_empty_string_is_refused_in_one_line(runs, capsys, kind):
    bad = runs["scored"].with_name("bad-kind.jsonl")
    bad.write_text('{"prompt": "is it a", "completion": " or", "kind": ' + kind + "}\n")
    assert main(["eval", str(runs["text"]), "--data", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and 'bad-kind.jsonl:1: "kind" must be a non-empty string' in err
