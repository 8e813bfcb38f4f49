"""Issue 34, training on prompt -> completion pairs (`kqv.jobs.lm_completions`, `kqv.data.example_batches`): the loss is
on the completion (the prompt weighted by data.prompt_loss_weight), padded and packed batches never let one example
attend to another, a fine-tune from --init on pairs trains and resumes exactly, and bad input is one line with
nothing written."""

import json

import pytest
import torch
import torch.nn.functional as F

import kqv
from conftest import tiny_config
from kqv.cli.main import main
from kqv.data.completions import Example, encode_examples
from kqv.data.example_batches import EncodedExamples, ExampleBatches
from kqv.data.tokenizers import CharTokenizer
from kqv.errors import ConfigError, DataError
from kqv.jobs.lm_completions import example_loss
from kqv.jobs.run_tokens import load_tokens
from kqv.nn.config import ModelConfig
from kqv.nn.cores import packed_mask
from kqv.nn.losses import weighted_cross_entropy
from kqv.nn.models import DecoderLM
from kqv.train.config import TrainConfig
from kqv.train.trainer import Trainer
from syncs import SyncCounter
from test_cli import TINY
from test_finetune import tiny_run

WORDS = ["to", "be", "or", "not", "that", "is", "the", "question"]
EXAMPLES = [
    Example("to be, ", "or not"),
    Example("that is ", "the question."),
    Example("not to", " be"),
    Example("the q", "uestion"),
]
SHORT = [
    Example("to be, ", "or not"),
    Example("that is ", "the"),
    Example("not to", " be"),
    Example("the q", "uestion"),
]
TOKENIZER = CharTokenizer.train("".join(e.prompt + e.completion for e in EXAMPLES) + "\n")


def tiny_model(position="learned", seed=0):
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=TOKENIZER.vocab_size, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=64, dropout=0.0
    )
    return DecoderLM(config.replace(position=position)).eval()


def batches(examples=EXAMPLES, **options):
    ids = encode_examples(examples, TOKENIZER)
    return ExampleBatches(EncodedExamples(ids["ids"], ids["lengths"]), **{"batch_size": 4, "context": 32, **options})


def reference_terms(model, examples, prompt_weight):
    """(cross-entropy, weight) of every target of every example, each example run alone: computed from the
    strings, not from the batches."""
    terms = []
    for example in examples:
        prompt, completion = TOKENIZER.encode(example.prompt), TOKENIZER.encode(example.completion)
        ids = torch.tensor([prompt + completion + TOKENIZER.encode("\n")])
        with torch.no_grad():
            logits = model(ids[:, :-1])[0]
        losses = F.cross_entropy(logits, ids[0, 1:], reduction="none")
        for t, loss in enumerate(losses):
            terms.append((loss, prompt_weight if t + 1 < len(prompt) else 1.0))
    return terms


def test_with_weight_0_the_loss_is_the_completions_and_the_prompt_gets_no_gradient():
    model, examples = tiny_model(), batches()
    batch = examples.batch(0)
    hidden = []

    def keep(module, args, out):
        out[0].retain_grad()
        hidden.append(out[0])

    handle = model.decoder.register_forward_hook(keep)
    loss = example_loss(model, batch)
    loss.backward()
    handle.remove()
    terms = [loss for loss, weight in reference_terms(model, EXAMPLES, 0.0) if weight]
    torch.testing.assert_close(loss, torch.stack(terms).mean(), rtol=0, atol=1e-6)
    grad = hidden[0].grad.abs().sum(-1)  # (batch, time): the gradient reaching each position's last hidden state
    counted = batch.targets != -100
    assert (grad[~counted] == 0).all() and (grad[counted] > 0).all()
    ids = batch.ids
    for row, (k,) in enumerate(examples.rows(0)):  # the ignored targets are exactly the prompt's and padding
        example = EXAMPLES[k]
        prompt = len(TOKENIZER.encode(example.prompt))
        total = prompt + len(TOKENIZER.encode(example.completion)) + 1
        assert counted[row].tolist() == [prompt - 1 <= t < total - 1 for t in range(ids.shape[1])]


@pytest.mark.parametrize("weight", [0.25, 1.0])
def test_a_prompt_weight_gives_the_weighted_mean_of_the_cross_entropy(weight):
    model = tiny_model()
    batch = batches(prompt_loss_weight=weight).batch(0)
    assert (batch.weights is not None) == (weight != 1.0)
    terms = reference_terms(model, EXAMPLES, weight)
    expected = sum(loss * w for loss, w in terms) / sum(w for _, w in terms)
    torch.testing.assert_close(example_loss(model, batch), expected, rtol=0, atol=1e-6)


def test_weight_0_in_the_weighted_loss_is_the_ignored_prompt_and_gets_exactly_no_gradient():
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 11, requires_grad=True)
    targets = torch.randint(0, 11, (3, 7))
    weights = (torch.rand(3, 7) > 0.4).float()
    ignored = targets.masked_fill(weights == 0, -100)
    expected = F.cross_entropy(logits.flatten(0, 1), ignored.flatten())
    loss = weighted_cross_entropy(logits, targets, weights)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)  # the job itself sends weight 0 as -100
    loss.backward()
    assert (logits.grad[weights == 0] == 0).all() and (logits.grad[weights == 1].abs().sum(-1) > 0).all()


@pytest.mark.parametrize("position", ["learned", "sinusoidal", "rope", "alibi", "relative"])
def test_packed_examples_give_each_examples_logits_alone_and_never_see_each_other(position):
    model = tiny_model(position)
    packing = batches(packing=True, batch_size=1, context=64)
    packed, (row,) = packing.batch(0), packing.rows(0)  # the four examples fit one row of 64
    assert packed.sequences[0].max() == 3 and packed.ids.shape[0] == 1
    mask = packed_mask(packed.sequences)
    with torch.no_grad():
        logits = model(packed.ids, attention_mask=mask, positions=packed.positions)[0]
        for number, k in enumerate(row):
            ids = torch.tensor([TOKENIZER.encode(EXAMPLES[k].prompt + EXAMPLES[k].completion)])
            alone = model(ids)[0]
            torch.testing.assert_close(logits[packed.sequences[0] == number], alone, rtol=0, atol=1e-5)
        changed = packed.ids.clone()
        first = packed.sequences[0] == 0
        changed[0, first] = (changed[0, first] + 1) % TOKENIZER.vocab_size  # another first example
        other = model(changed, attention_mask=mask, positions=packed.positions)[0]
    assert not torch.equal(other[first], logits[first])
    assert torch.equal(other[~first], logits[~first])  # no other example's logits moved


def test_batches_are_deterministic_cover_each_epoch_and_pack_within_the_context():
    examples = [Example(w, " " + v) for w in WORDS for v in WORDS if w != v][:40]
    for packing in (False, True):
        one, two = batches(examples, packing=packing, seed=3), batches(examples, packing=packing, seed=3)
        same = [x is y is None or torch.equal(x, y) for i in (5, 0, 9) for x, y in zip(one.batch(i), two.batch(i))]
        assert all(same) and type(one.batch(0)) is type(two.batch(0))
        assert not torch.equal(one.batch(0).ids, batches(examples, packing=packing, seed=4).batch(0).ids)
        rows = one.epoch_rows(0)
        assert sorted(k for row in rows for k in row) == list(range(len(examples)))
        stream = [row for i in range(30) for row in two.rows(i)]  # 120 rows: the epochs one after another
        epochs = [row for e in range(40) for row in one.epoch_rows(e)]
        assert stream == epochs[:120] and one.epoch_rows(1) != rows
        assert all(sum(one.examples.inputs(k) for k in row) <= 32 for row in rows)
        assert len(rows) < len(examples) if packing else len(rows) == len(examples)
        real = one.batch(2).targets.ne(-100).sum() + sum(
            len(TOKENIZER.encode(examples[k].prompt)) - 1 for row in one.rows(2) for k in row
        )
        assert one.tokens(2) == real  # every token the model reads is a target, prompt ones ignored


@pytest.mark.parametrize(
    ("options", "model"),
    [
        ({}, {"ffn": "moe", "experts": {"count": 2}}),
        ({"packing": True}, {"position": "learned"}),
        ({"packing": True, "prompt_loss_weight": 0.3}, {"position": "alibi"}),
    ],
)
def test_a_training_step_on_pairs_reads_nothing_back_between_log_records(tmp_path, options, model):
    made = batches(EXAMPLES * 4, batch_size=4, context=64, **options)
    prepared = [made.batch(i) for i in range(8)]  # made on the host, as the job's train_batches makes them
    counter, marks = SyncCounter(), []

    def marked_loss(m, batch):  # on the training thread: the batches are made ahead on a worker
        marks.append(counter.count)
        return example_loss(m, batch)

    config = TrainConfig(steps=8, batch_size=4, lr=1e-3, warmup_steps=2, log_every=4, eval_every=100, precision="fp32")
    model = DecoderLM(tiny_config(vocab_size=TOKENIZER.vocab_size, max_len=64, **model))
    run = Trainer(model, config, tmp_path, train_batches=prepared.__getitem__, loss_fn=marked_loss, quiet=True)
    with counter:
        run.train()
    marks.append(counter.count)
    syncs = [after - before for before, after in zip(marks, marks[1:])]
    assert [count for step, count in enumerate(syncs, 1) if step % 4] == [0] * 6, counter.report()


def pairs_file(path, examples=SHORT * 3):  # each fits the context of 16 of TINY
    path.write_text("".join(f"{e.prompt}\t{e.completion}\n" for e in examples))
    return path


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_finetune_on_pairs_from_a_kqv_run_trains_and_resumes_exactly(tmp_path):
    source = tiny_run(tmp_path / "source", steps=1)
    qa = pairs_file(tmp_path / "qa.tsv")
    config = source.parent / "tiny.toml"
    overrides = [f"data.path={qa}", "data.packing=true", "data.prompt_loss_weight=0.5", 'train.schedule="constant"']
    options = {"init": source, "quiet": True, "overrides": overrides}
    summary = kqv.train("lm", config, out=tmp_path / "full", steps=4, **options)
    assert summary["val"]["examples"] == 1 and summary["source"]["path"] == str(source)
    kqv.train("lm", config, out=tmp_path / "cut", steps=2, **options)
    qa.rename(tmp_path / "gone.tsv")  # a resume reads the run's own tokens.safetensors, not the file
    kqv.train("lm", out=tmp_path / "cut", resume=True, steps=4, quiet=True)

    def losses(name):
        return {r["step"]: r["train_loss"] for r in metrics(tmp_path / name) if "train_loss" in r}

    assert losses("cut") == losses("full") and len(losses("full")) == 4
    full, cut = kqv.load(tmp_path / "full").model, kqv.load(tmp_path / "cut").model
    assert all(torch.equal(a, b) for a, b in zip(full.state_dict().values(), cut.state_dict().values()))
    assert (tmp_path / "full" / "samples.txt").read_text().startswith(tuple(e.prompt for e in SHORT))
    run = kqv.load(tmp_path / "full")  # its evaluation by default: the completion of its one validation example
    tokens = load_tokens(run.run_dir)
    ids, (prompt, completion) = tokens["val"].long(), tokens["val_lengths"][0].tolist()
    with torch.no_grad():
        logits = run.model.eval()(ids[None, :-1])[0]
    result = run.evaluate()
    assert result.loss == pytest.approx(F.cross_entropy(logits[prompt - 1 :], ids[prompt:]).item(), abs=1e-5)
    assert result.tokens == completion and result.loss == pytest.approx(summary["val"]["loss"], abs=1e-6)
    with pytest.raises(ConfigError, match="scored whole"):
        run.evaluate(max_tokens=10)


def test_kqv_train_lm_data_pairs_from_the_command_line(tmp_path, capsys):
    qa = pairs_file(tmp_path / "qa.jsonl", [])
    qa.write_text("".join(json.dumps({"prompt": e.prompt, "completion": e.completion}) + "\n" for e in SHORT * 3))
    config = tmp_path / "tiny.toml"
    config.write_text(TINY.format(position="rope"))
    flags = ["--config", str(config), "--data", str(qa), "--steps", "2", "--set", "data.prompt_loss_weight=0.1"]
    assert main(["train", "lm", *flags, "--out", str(tmp_path / "run")]) == 0
    assert "validation completion loss" in capsys.readouterr().out
    assert [r["step"] for r in metrics(tmp_path / "run") if "train_loss" in r] == [1, 2]
    assert main(["eval", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("the completions of the 1 held-out validation examples: ") and "bits/char" not in out


@pytest.mark.parametrize(
    ("lines", "settings", "error", "message"),
    [
        ("to be\tor not\nno tab here\n", (), DataError, r"qa.tsv:2: expected prompt<TAB>completion"),
        ("to be\tor not\n", (), DataError, r"has 1 pair: too few for a training and a validation example"),
        (
            "to be\tor not\n" * 3 + "that is the question.\tto be, or not to be\n",
            (),
            DataError,
            r"qa.tsv:4: the example is 41 tokens",
        ),
        (
            "to be\tor not\n" * 3,
            ("data.prompt_loss_weight=1.5",),
            ConfigError,
            r"prompt_loss_weight must be in \[0, 1\]",
        ),
        (
            "to be\tor not\n" * 3,
            ('model.attention="local"', "model.local.block=4"),
            ConfigError,
            "data.packing needs attention='full'",
        ),
    ],
)
def test_bad_pairs_are_one_line_errors_with_nothing_written(tmp_path, capsys, lines, settings, error, message):
    (tmp_path / "qa.tsv").write_text(lines)
    config = tmp_path / "tiny.toml"
    config.write_text(TINY.format(position="rope"))
    settings = ["data.packing=true", *settings]
    overrides = [f"data.path={tmp_path / 'qa.tsv'}", *settings]
    with pytest.raises(error, match=message):
        kqv.train("lm", config, out=tmp_path / "run", overrides=overrides, steps=1, quiet=True)
    flags = [f"--set={s}" for s in settings]
    assert (
        main(
            [
                "train",
                "lm",
                "--config",
                str(config),
                "--data",
                str(tmp_path / "qa.tsv"),
                *flags,
                "--out",
                str(tmp_path / "run"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kqv: error: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qa.tsv", "tiny.toml"]


def test_pair_options_on_text_are_refused(tmp_path):
    (tmp_path / "book.txt").write_text("to be or not to be\n" * 20)
    for setting in ("data.packing=true", "data.prompt_loss_weight=0.5"):
        with pytest.raises(ConfigError, match="to a file of prompt -> completion pairs"):
            kqv.train("lm", "quick", out=tmp_path / "run", overrides=[f"data.path={tmp_path / 'book.txt'}", setting])
    assert not (tmp_path / "run").exists()


def test_a_new_tokenizer_for_pairs_ends_each_example_with_its_end_of_text():
    from kqv.jobs.lm_completions import pairs_tokenizer

    text = "".join(e.prompt + e.completion for e in EXAMPLES)
    for kind, end in (("char", "\n"), ("bpe", "<eos>")):
        tokenizer = pairs_tokenizer(kind, text, 300)
        ids = encode_examples(EXAMPLES, tokenizer)
        ends = ids["lengths"].sum(dim=1).cumsum(0) - 1  # the last token of every example
        assert set(ids["ids"][ends].tolist()) == {
            tokenizer.token_to_id(end) if kind == "bpe" else tokenizer.encode(end)[0]
        }
        first = ids["lengths"][0].tolist()
        assert tokenizer.decode(ids["ids"][: first[0]].tolist()) == EXAMPLES[0].prompt


def test_a_4d_attention_mask_must_be_bool_and_the_ids_shape():
    model, ids = tiny_model(), torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(DataError, match=r"must be bool with shape \(batch, 1, time, time\) = \(2, 1, 5, 5\)"):
        model(ids, attention_mask=torch.ones(2, 1, 5, 4, dtype=torch.bool))
    with pytest.raises(DataError, match="must be bool"):
        model(ids, attention_mask=torch.ones(2, 1, 5, 5))
    with pytest.raises(DataError, match="positions must have the shape of the ids"):
        model(ids, positions=torch.zeros(2, 4, dtype=torch.long))


def test_a_packed_weighted_finetune_of_a_gpt2_directory_starts_at_the_loss_transformers_gives_each_example(
    gpt2_dir, tmp_path
):
    from transformers import GPT2LMHeadModel

    qa = pairs_file(tmp_path / "qa.tsv")
    settings = ["data.packing=true", "data.prompt_loss_weight=0.5", "model.dropout=0.0", "train.log_every=1"]
    overrides = [f"data.path={qa}", "data.context=16", "train.batch_size=2", 'train.precision="fp32"', *settings]
    kqv.train("lm", init=gpt2_dir, out=tmp_path / "run", overrides=overrides, steps=1, quiet=True)
    first = [r["train_loss"] for r in metrics(tmp_path / "run") if "train_loss" in r][0]
    tokens = load_tokens(tmp_path / "run")
    examples = EncodedExamples(tokens["train"], tokens["train_lengths"])
    rows = ExampleBatches(examples, batch_size=2, context=16, packing=True).rows(0)  # seed 0, the run's
    hf = GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()
    total, weights = 0.0, 0.0
    for k in (k for row in rows for k in row):  # each example alone through transformers
        prompt, completion = examples.parts(k)
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            losses = F.cross_entropy(hf(ids[:, :-1]).logits[0], ids[0, 1:], reduction="none")
        w = torch.tensor([0.5 if t + 1 < len(prompt) else 1.0 for t in range(len(losses))])
        total, weights = total + (losses * w).sum().item(), weights + w.sum().item()
    assert sum(len(row) for row in rows) > 2  # packed: more examples than rows
    assert first == pytest.approx(total / weights, abs=1e-5)
