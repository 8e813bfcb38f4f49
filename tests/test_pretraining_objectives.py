"""Issue 42, the training side: span corruption of a text's documents (`data.objective`), mixtures of sources drawn
by weight (`--data A --data B`, `[[data.sources]]`), sentence-order augmentation, and a prompt template that
reuses the pretraining's mask (`data.template`); every bad option is one line with nothing written."""

import json
import math

import pytest
import torch

import kqv
from kqv.cli.main import main
from kqv.data.completions import split_examples
from kqv.data.document_batches import (
    DocumentBatches,
    DocumentOptions,
    EncodedDocuments,
    corrupt,
    draw_random,
    prefix_max,
    shuffled,
)
from kqv.data.mixture import MixtureBatches
from kqv.errors import ConfigError, DataError
from kqv.jobs.lm_completions import pairs_tokenizer
from kqv.jobs.run_tokens import load_tokens
from kqv.train.topology import Topology
from test_cli import TINY

PEOPLE = ["ann", "bob", "cyd", "dee", "eve", "fay", "gus", "hal", "ivy", "jon", "kim", "lou"]
TOWNS = ["rome", "oslo", "lima", "bonn"]
LINES = [f"{name} was born in {TOWNS[k % 4]}. {name} is a cook." for k, name in enumerate(PEOPLE)]
MASK = "\u2047"
TOKENIZER = pairs_tokenizer("char", "\n".join(LINES), 0, MASK)


def documents(lines=LINES, corrupt_them=True, separator=None, sentences=None):
    ids = [TOKENIZER.encode(line) for line in lines]
    options = DocumentOptions(TOKENIZER.token_to_id(MASK), TOKENIZER.encode("\n")[0], corrupt_them, 0.3, 8, separator)
    counts = None if sentences is None else torch.tensor([len(s) for s in sentences], dtype=torch.int32)
    flat = None if sentences is None else torch.tensor([n for s in sentences for n in s], dtype=torch.int32)
    lengths = torch.tensor([(len(i), 0) for i in ids], dtype=torch.int32)
    return EncodedDocuments(
        torch.tensor([t for i in ids for t in i], dtype=torch.int32), lengths, options, flat, counts
    )


def test_a_corrupted_document_is_prefix_mask_suffix_mask_span_and_restores_exactly():
    mask, end = TOKENIZER.token_to_id(MASK), TOKENIZER.encode("\n")[0]
    for draw in range(200):
        doc = TOKENIZER.encode(LINES[draw % len(LINES)])
        assert mask not in doc  # the mask is a symbol of its own, never the text's
        prompt, completion = corrupt(doc, draw_random(3, draw), mask, end, 0.3, 8)
        assert prompt.count(mask) == 2 and prompt[-1] == mask and completion[-1] == end
        cut = prompt.index(mask)
        prefix, suffix, span = prompt[:cut], prompt[cut + 1 : -1], completion[:-1]
        assert prefix + span + suffix == doc and 1 <= len(span) <= 8


def test_the_loss_is_on_the_span_alone_or_on_every_token_as_chosen():
    made = documents()
    for weight, counted in ((0.0, "span"), (1.0, "all")):
        batches = DocumentBatches(made, batch_size=4, context=64, seed=1, prompt_loss_weight=weight)
        batch, rows = batches.batch(0), batches.rows(0)
        for r, (g,) in enumerate(rows):
            tokens, prompt = batches.example_tokens(g)
            targets = batch.targets[r]
            real = int(batch.attention_mask[r].sum())
            scored = (targets[:real] != -100).nonzero().flatten().tolist()
            expected = list(range(prompt - 1, real)) if counted == "span" else list(range(real))
            assert scored == expected
            assert targets[real:].eq(-100).all()
            mask, end = TOKENIZER.token_to_id(MASK), TOKENIZER.encode("\n")[0]
            assert tokens[:prompt].count(mask) == 2 and tokens[-1] == end and mask not in tokens[prompt:]


def test_span_corruption_batches_depend_only_on_the_batch_index_and_the_seed():
    def batches(seed):
        return DocumentBatches(documents(), batch_size=4, context=64, seed=seed, packing=True)

    first, again, other = batches(0), batches(0), batches(1)
    assert all(torch.equal(first.batch(i).ids, again.batch(i).ids) for i in (5, 0, 9, 2))  # any order
    assert not all(torch.equal(first.batch(i).ids, other.batch(i).ids) for i in range(4))
    # every epoch draws each document anew: epoch e's rows hold draws e * documents + k, and the same document is
    # corrupted differently in epoch 0 and epoch 1
    count, plain = len(PEOPLE), DocumentBatches(documents(), batch_size=4, context=64, seed=0)
    draws = [plain.stream_row(g)[0] for g in range(2 * count)]
    assert sorted(draws[:count]) == list(range(count)) and sorted(draws[count:]) == list(range(count, 2 * count))
    one, two = plain.example_tokens(0)[0], plain.example_tokens(count)[0]
    assert len(one) == len(two) and one != two


def test_sentence_order_augmentation_reorders_whole_sentences():
    space = TOKENIZER.encode(" ")
    doc = TOKENIZER.encode(LINES[0])
    first, second = LINES[0].split(". ")
    lengths = [len(first) + 1, len(second)]
    orders = {TOKENIZER.decode(shuffled(doc, lengths, space, draw_random(0, d))) for d in range(20)}
    assert orders == {LINES[0], f"{second} {first}."}


def test_a_mixture_draws_each_batch_s_source_by_weight():
    class Source:
        def __init__(self, name):
            self.name = name

        def batch(self, n):
            return (self.name, n)

        def tokens(self, n):
            return 1

    n, p = 4000, 0.75
    mixture = MixtureBatches([Source("a"), Source("b")], [3.0, 1.0], seed=7)
    drawn = [mixture.batch(i) for i in range(n)]
    count = sum(name == "a" for name, _ in drawn)
    assert abs(count - n * p) <= 4 * math.sqrt(n * p * (1 - p)), count  # a binomial bound, 4 standard deviations
    for name in "ab":  # each source walks through its own batches in order
        assert [m for s, m in drawn if s == name] == list(range(sum(s == name for s, _ in drawn)))
    again = MixtureBatches([Source("a"), Source("b")], [3.0, 1.0], seed=7)
    assert [again.batch(i) for i in (3999, 17, 0)] == [drawn[3999], drawn[17], drawn[0]]


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def write_inputs(tmp_path):
    (tmp_path / "pre.txt").write_text("\n".join(LINES + ["x" * 60]) + "\n")  # the last document needs windows
    (tmp_path / "qa.tsv").write_text("".join(f"{n} born?{MASK}\t{TOWNS[k % 4]}\n" for k, n in enumerate(PEOPLE)))
    config = tmp_path / "tiny.toml"
    config.write_text(TINY.format(position="rope"))
    return config


def test_a_span_corruption_mixture_trains_and_resumes_bit_identical(tmp_path):
    config = write_inputs(tmp_path)
    (tmp_path / "qa.tsv").write_text("".join(f"{n} born?\t{TOWNS[k % 4]}\n" for k, n in enumerate(PEOPLE)))
    sources = f'data.sources=[{{path="{tmp_path / "pre.txt"}", weight=2}}, {{path="{tmp_path / "qa.tsv"}"}}]'
    settings = [
        sources,
        'data.objective="span_corruption"',
        "data.shuffle_sentences=true",
        "data.context=48",
        'data.template="{prompt}{mask}"',
        'train.schedule="constant"',
    ]
    options = {"quiet": True, "overrides": settings}
    summary = kqv.train("lm", config, out=tmp_path / "full", steps=4, **options)
    kqv.train("lm", config, out=tmp_path / "cut", steps=2, **options)
    for name in ("pre.txt", "qa.tsv"):  # a resume reads the run's own tokens.safetensors
        (tmp_path / name).rename(tmp_path / f"gone-{name}")
    kqv.train("lm", out=tmp_path / "cut", resume=True, steps=4, quiet=True)

    def losses(name):
        return {r["step"]: r["train_loss"] for r in metrics(tmp_path / name) if "train_loss" in r}

    assert losses("cut") == losses("full") and len(losses("full")) == 4
    full, cut = kqv.load(tmp_path / "full"), kqv.load(tmp_path / "cut")
    assert all(torch.equal(a, b) for a, b in zip(full.model.state_dict().values(), cut.model.state_dict().values()))
    tokens = load_tokens(full.run_dir)
    assert tokens["windows"].tolist() == [1, 2]  # the 60-character document, cut into windows of 46 and 14 tokens
    assert summary["val"]["examples"] == int(tokens["val_sources"].sum())
    mask = full.tokenizer.token_to_id(MASK)
    questions = tokens["train"][-int(tokens["train_lengths"][-int(tokens["train_sources"][1]) :].sum()) :]
    assert (questions == mask).sum() == int(tokens["train_sources"][1])  # each templated prompt ends with the mask
    assert len(full.config.data.sources) == 2 and full.config.data.sources[0].weight == 2


def refuse(tmp_path, capsys, args, message):
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["train", "lm", "--config", str(tmp_path / "tiny.toml"), "--out", str(tmp_path / "run"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kqv: error: ") and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_every_bad_option_is_one_line_with_nothing_written(tmp_path, capsys):
    write_inputs(tmp_path)
    pre, qa = str(tmp_path / "pre.txt"), str(tmp_path / "qa.tsv")
    refuse(tmp_path, capsys, ["--data", pre, "--set", "data.objective=masked"], "data.objective must be one of")
    refuse(tmp_path, capsys, ["--data", qa, "--data", pre, "--set", 'data.objective="span_corruption"'], MASK)
    zero = f'data.sources=[{{path="{pre}", weight=1}}, {{path="{qa}", weight=0}}]'
    refuse(tmp_path, capsys, ["--set", zero], "must be positive")
    refuse(tmp_path, capsys, ["--data", qa, "--set", 'data.template="{mask}: "'], "has no {prompt}")
    refuse(tmp_path, capsys, ["--data", qa, "--set", 'data.template="{prompt}{answer}"'], "may hold only")
    refuse(tmp_path, capsys, ["--data", pre, "--data", pre, "--set", "data.path=x.txt"], "not both")


def test_a_template_s_mask_must_be_a_symbol_of_the_source_s_tokenizer(tmp_path):
    config = write_inputs(tmp_path)
    (tmp_path / "plain.tsv").write_text("".join(f"{n} was born in\t{TOWNS[k % 4]}\n" for k, n in enumerate(PEOPLE)))
    source = tmp_path / "source"
    overrides = [f"data.path={tmp_path / 'pre.txt'}", 'sample.prompt="ann"']
    kqv.train("lm", config, out=source, steps=1, quiet=True, overrides=overrides)
    overrides = [f"data.path={tmp_path / 'plain.tsv'}", 'data.template="{prompt}{mask}"']
    with pytest.raises(ConfigError, match="has no mask symbol"):
        kqv.train("lm", config, out=tmp_path / "ft", init=source, steps=1, quiet=True, overrides=overrides)
    assert not (tmp_path / "ft").exists()
    with pytest.raises(DataError, match="already contains the mask symbol"):
        overrides = [f"data.path={tmp_path / 'qa.tsv'}", 'data.template="{prompt}{mask}"']
        kqv.train("lm", config, out=tmp_path / "qa", steps=1, quiet=True, overrides=overrides)
    assert not (tmp_path / "qa").exists()


def test_eval_writes_prompts_into_the_run_s_template_and_takes_a_mixture_s_constant_from_its_pairs(tmp_path):
    from kqv.jobs.scoring import evaluate_pairs

    config = write_inputs(tmp_path)
    answers = ["rome"] * 6 + ["oslo", "lima", "bonn", "oslo", "lima", "bonn"]  # the trained pairs' most frequent: rome
    (tmp_path / "qa.tsv").write_text("".join(f"{n} born?\t{a}\n" for n, a in zip(PEOPLE, answers)))
    asked = [("ann", "oslo"), ("bob", "oslo"), ("cyd", "oslo"), ("dee", "rome")]  # the scored file's: oslo
    (tmp_path / "plain.tsv").write_text("".join(f"{n} born?\t{a}\n" for n, a in asked))
    (tmp_path / "masked.tsv").write_text("".join(f"{n} born?{MASK}\t{a}\n" for n, a in asked))
    sources = f'data.sources=[{{path="{tmp_path / "pre.txt"}"}}, {{path="{tmp_path / "qa.tsv"}"}}]'
    overrides = [sources, 'data.objective="span_corruption"', "data.context=48", 'data.template="{prompt}{mask}"']
    kqv.train("lm", config, out=tmp_path / "mixed", steps=2, quiet=True, overrides=overrides)
    run = kqv.load(tmp_path / "mixed")

    result = run.evaluate(pairs=tmp_path / "plain.tsv")
    by_hand = evaluate_pairs(run.model, run.tokenizer, tmp_path / "masked.tsv")
    untemplated = evaluate_pairs(run.model, run.tokenizer, tmp_path / "plain.tsv")
    assert result.loss == pytest.approx(by_hand.loss, rel=1e-6) and result.loss != pytest.approx(untemplated.loss)
    assert [p.got for p in result.predictions] == [p.got for p in by_hand.predictions]
    assert [p.prompt for p in result.predictions] == [f"{n} born?" for n, _ in asked]  # the file's own prompts
    assert result.constant == "rome" and result.constant_correct == 1  # from the mixture's pairs, not the file's
    (tmp_path / "qa.tsv").write_text("".join(f"{n} born?\toslo\n" for n in PEOPLE))  # changed after training
    assert run.evaluate(pairs=tmp_path / "plain.tsv").constant == "rome"  # the pairs as the run read them
    (tmp_path / "qa.tsv").rename(tmp_path / "moved.tsv")  # gone: the run holds its own record of them
    trained = [answers[k] for k in split_examples(len(answers), 0.1)[0]]  # the pairs it trained on, not validated
    assert run.trained_answers() == (trained, [""] * len(trained)) and len(trained) < len(answers)


def test_a_random_prefix_cuts_each_draw_to_4_to_its_longest_and_is_the_same_for_the_same_draw():
    mask, end = TOKENIZER.token_to_id(MASK), TOKENIZER.encode("\n")[0]
    options = DocumentOptions(mask, end, True, 0.25, 64, None, prefix_max(24))  # 7/8 of 24: at most 21 tokens
    assert options.prefix_max == 21
    kept = []
    for draw in range(400):
        doc = TOKENIZER.encode(LINES[draw % len(LINES)])  # 32 to 33 characters: longer than any prefix
        prompt, completion = options.example(doc, [len(doc)], draw_random(5, draw))
        cut = prompt.index(mask)
        restored = prompt[:cut] + completion[:-1] + prompt[cut + 1 : -1]
        assert restored == doc[: len(restored)]  # a prefix of the document, the span in its place
        assert (prompt, completion) == options.example(doc, [len(doc)], draw_random(5, draw))  # the same draw
        kept.append(len(restored))
    assert min(kept) == 4 and max(kept) == 21 and len(set(kept)) == 18  # uniform over 4..21: every length drawn
    short = TOKENIZER.encode("ab")  # shorter than the prefix: kept whole
    prompt, completion = options.example(short, [2], draw_random(0, 1))
    assert len(prompt) + len(completion) == 2 + 3


def test_a_random_prefix_s_batches_count_their_real_tokens_and_do_not_depend_on_the_order_drawn():
    made = documents()
    options = DocumentOptions(made.options.mask, made.options.end, True, 0.25, 64, None, 12)
    made = EncodedDocuments(made.ids, made.lengths, options)
    first = DocumentBatches(made, batch_size=4, context=64, seed=2)
    again = DocumentBatches(made, batch_size=4, context=64, seed=2)  # a resume builds its batches anew
    for i in (7, 0, 3):
        batch = first.batch(i)
        assert torch.equal(batch.ids, again.batch(i).ids)
        assert first.tokens(i) == int(batch.attention_mask.sum()) < 4 * (max(map(len, LINES)) + 2)


def test_span_loss_all_puts_the_loss_on_every_token_of_a_document_and_keeps_the_pairs_weight(tmp_path):
    config = write_inputs(tmp_path)
    (tmp_path / "qa.tsv").write_text("".join(f"{n} born?\t{TOWNS[k % 4]}\n" for k, n in enumerate(PEOPLE)))
    sources = f'data.sources=[{{path="{tmp_path / "pre.txt"}"}}, {{path="{tmp_path / "qa.tsv"}"}}]'
    settings = [sources, 'data.objective="span_corruption"', 'data.span_loss="all"', "data.random_prefix=true"]
    settings += ["data.context=48", 'data.template="{prompt}{mask}"', 'train.schedule="constant"']
    settings += ["data.packing=false"]  # one example a row, to read each one's targets (packed: test_reading_speed)
    options = {"quiet": True, "overrides": settings}
    kqv.train("lm", config, out=tmp_path / "full", steps=4, **options)
    kqv.train("lm", config, out=tmp_path / "cut", steps=2, **options)
    kqv.train("lm", out=tmp_path / "cut", resume=True, steps=4, quiet=True)
    losses = [{r["step"]: r["train_loss"] for r in metrics(tmp_path / n) if "train_loss" in r} for n in ("full", "cut")]
    assert losses[0] == losses[1] and len(losses[0]) == 4  # the same random prefixes after the resume
    run = kqv.load(tmp_path / "full")
    made = run.loaded_corpus.trainer_options(run.config.train, Topology(), run.model.config).train_batches
    mask = run.tokenizer.token_to_id(MASK)
    kinds = set()
    for i in range(12):
        batch = made(i)
        for ids, targets, real in zip(batch.ids, batch.targets, batch.attention_mask):
            n = int(real.sum())
            document = (ids[:n] == mask).sum() == 2  # prefix MASK suffix MASK span: every target counts
            counted = targets[:n] != -100
            kinds.add(bool(document))
            assert counted.all() if document else counted.sum() < n  # a pair's prompt keeps weight 0
    assert kinds == {True, False}


def test_the_span_options_are_refused_in_one_line_with_nothing_written(tmp_path, capsys):
    write_inputs(tmp_path)
    pre = str(tmp_path / "pre.txt")
    refuse(tmp_path, capsys, ["--data", pre, "--set", "data.random_prefix=true"], "set data.objective='span_")
    refuse(tmp_path, capsys, ["--data", pre, "--set", 'data.span_loss="all"'], "data.span_loss shapes span")
    span = 'data.objective="span_corruption"'
    refuse(tmp_path, capsys, ["--data", pre, "--set", span, "--set", 'data.span_loss="every"'], "data.span_loss")
    refuse(tmp_path, capsys, ["--data", pre, "--set", span, "--set", "data.random_prefix=true", "--set",
                              "data.context=4"], "drop data.random_prefix")  # fmt: skip
