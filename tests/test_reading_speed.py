"""Examples at the speed of plain text: packed rows hold only what was drawn (a random prefix's cut included) and
compute each example as if alone; long documents read from their openings; batches made ahead of the step."""

import random
import threading

import pytest
import torch
import torch.nn.functional as F

import kqv
from conftest import tiny_config
from kqv.cli.main import main
from kqv.data.document_batches import DocumentBatches, DocumentOptions, EncodedDocuments
from kqv.data.example_batches import PackedBatch, PaddedBatch, pack
from kqv.jobs.lm_completions import decide_packing, example_batches, example_loss, pairs_tokenizer
from kqv.jobs.run_tokens import load_tokens
from kqv.nn.cores import packed_mask
from kqv.train.ahead import BatchesAhead
from test_cli import TINY

MASK = "\u2047"
WORDS = ["ann", "bob", "was", "born", "in", "rome", "oslo", "lima", "she", "he", "is", "a", "cook", "poet"]


def lines(count: int, seed: int = 0) -> list[str]:
    """`count` documents of 2 to 40 words, so a random prefix's cut and the packing both matter."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 40))) + "." for _ in range(count)]


TEXT = lines(120)
TOKENIZER = pairs_tokenizer("char", "\n".join(TEXT), 0, MASK)


def documents(texts=TEXT, prefix_max=0, corrupt=True) -> EncodedDocuments:
    ids = [TOKENIZER.encode(text) for text in texts]
    mask, end = TOKENIZER.token_to_id(MASK), TOKENIZER.encode("\n")[0]
    options = DocumentOptions(mask, end, corrupt, 0.25, 16, None, prefix_max)
    lengths = torch.tensor([(len(i), 0) for i in ids], dtype=torch.int32)
    return EncodedDocuments(torch.tensor([t for i in ids for t in i], dtype=torch.int32), lengths, options)


@pytest.mark.parametrize("prefix_max", [0, 56])
def test_packed_rows_hold_only_the_drawn_tokens_and_are_nearly_full(prefix_max):
    context = 256
    made = documents(prefix_max=prefix_max)
    packed = DocumentBatches(made, batch_size=4, context=context, seed=3, packing=True)
    padded = DocumentBatches(made, batch_size=4, context=context, seed=3)
    real = filled = 0
    for i in range(6):
        batch, rows = packed.batch(i), packed.rows(i)
        assert batch.ids.shape[1] <= context
        for r, row in enumerate(rows):
            drawn = [padded.example_tokens(g)[0] for g in row]  # the same draw, made by the padded batches
            width = sum(len(tokens) - 1 for tokens in drawn)
            assert int((batch.sequences[r] >= 0).sum()) == width == sum(packed.inputs(g) for g in row)
            assert batch.ids[r, :width].tolist() == [t for tokens in drawn for t in tokens[:-1]]
            assert batch.positions[r, :width].tolist() == [p for tokens in drawn for p in range(len(tokens) - 1)]
        real += packed.tokens(i)
        filled += batch.ids.numel()
    assert real / filled > 0.9  # rows packed by what each draw holds, not by its whole document's length


def test_best_fit_fills_rows_that_next_fit_leaves_a_quarter_empty():
    rng = random.Random(0)
    sizes = [rng.randint(6, 142) for _ in range(2000)]
    rows = pack(list(range(2000)), sizes, 160)
    assert sorted(k for row in rows for k in row) == list(range(2000))  # each example once
    assert all(sum(sizes[k] for k in row) <= 160 for row in rows)
    assert sum(sizes) / (160 * len(rows)) > 0.95
    assert all(row == sorted(row) for row in rows)  # a row keeps its examples in the order they came


@pytest.mark.parametrize("position", ["rope", "learned", "alibi"])
def test_a_packed_row_gives_each_example_the_loss_it_has_alone(position):
    made = documents(prefix_max=56)
    packed = DocumentBatches(made, batch_size=3, context=128, seed=1, packing=True, prompt_loss_weight=1.0)
    model = kqv.DecoderLM(tiny_config(vocab_size=TOKENIZER.vocab_size, max_len=128, position=position)).eval()
    batch, rows = packed.batch(0), packed.rows(0)
    with torch.no_grad():
        logits = model(batch.ids, attention_mask=packed_mask(batch.sequences), positions=batch.positions)
        for r, row in enumerate(rows):
            start = 0
            for g in row:
                tokens = torch.tensor([packed.example_tokens(g)[0]])  # the example alone, in a row of its own
                alone = F.cross_entropy(model(tokens[:, :-1])[0], tokens[0, 1:], reduction="none")
                n = tokens.shape[1] - 1
                targets = batch.targets[r, start : start + n]
                inside = F.cross_entropy(logits[r, start : start + n], targets, reduction="none")
                torch.testing.assert_close(inside, alone, rtol=1e-5, atol=1e-5)
                start += n
        assert len(rows[0]) > 1  # the row does pack several examples


def test_a_packed_span_corruption_run_resumes_bit_identical(tmp_path):
    (tmp_path / "pre.txt").write_text("\n".join(TEXT) + "\n")
    config = tmp_path / "tiny.toml"
    config.write_text(TINY.format(position="rope").replace("context = 16", "context = 64"))
    settings = [
        f"data.path={str(tmp_path / 'pre.txt')!r}",
        'data.objective="span_corruption"',
        "data.random_prefix=true",
        "data.packing=true",
        'data.span_loss="all"',
    ]
    options = {"quiet": True, "overrides": settings}
    kqv.train("lm", config, out=tmp_path / "full", steps=4, **options)
    kqv.train("lm", config, out=tmp_path / "cut", steps=2, **options)
    kqv.train("lm", out=tmp_path / "cut", resume=True, steps=4, quiet=True)

    def losses(name):
        rows = [line for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines() if "train_loss" in line]
        return {r["step"]: r["train_loss"] for r in map(__import__("json").loads, rows)}

    assert losses("cut") == losses("full") and len(losses("full")) == 4


def write_long(tmp_path) -> list[str]:
    """A text of 20 short documents and three long ones, and its tiny config (context 32)."""
    long = [" ".join(["ann was born in rome."] * 12), " ".join(["bob is a poet."] * 9), "x" * 200]
    short = [f"{a} is {b}." for a in WORDS[:5] for b in WORDS[5:9]]  # 20 documents that fit the context
    (tmp_path / "pre.txt").write_text("\n".join(short + long) + "\n")
    (tmp_path / "tiny.toml").write_text(TINY.format(position="rope").replace("context = 16", "context = 32"))
    return long


@pytest.mark.parametrize("cut", ["auto", "windows", "opening"])
def test_long_documents_are_read_from_their_openings_with_a_random_prefix(tmp_path, capsys, cut):
    long = write_long(tmp_path)
    args = ["train", "lm", "--config", str(tmp_path / "tiny.toml"), "--data", str(tmp_path / "pre.txt"), "--steps", "1"]
    settings = ["data.objective=span_corruption", "data.random_prefix=true", f"data.long_documents={cut}"]
    runs = []
    for name in ("one", "two"):
        assert main([*args, "--out", str(tmp_path / name), *[f"--set={s}" for s in settings]]) == 0
        runs.append(load_tokens(tmp_path / name))
    said = capsys.readouterr().out
    one, two = runs
    assert all(torch.equal(one[key], two[key]) for key in one)  # the cut is the same every time
    lengths = one["train_lengths"][:, 0].tolist() + one["val_lengths"].sum(1).tolist()
    size = 32 + 1 - 3  # a document's most tokens: the context less two masks and the end of text
    assert max(one["train_lengths"][:, 0].tolist()) <= size
    if cut == "windows":
        assert "cut into" in said and len(lengths) > 20 + len(long) and int(one["left_out"][0]) == 0
        return
    assert len(lengths) == 20 + len(long)  # one example per document
    left_out, read = one["left_out"].tolist()
    assert left_out == sum(len(doc) - size for doc in long)  # a character a token: all after the first window
    share = left_out / (left_out + read)
    assert f"{len(long)} documents longer than the context read from their openings alone" in said
    assert f"leaving out {left_out:,} of {left_out + read:,} tokens ({share:.1%}" in said


def test_long_documents_is_refused_where_no_documents_are_read(tmp_path, capsys):
    write_long(tmp_path)
    args = ["train", "lm", "--config", str(tmp_path / "tiny.toml"), "--data", str(tmp_path / "pre.txt")]
    assert main([*args, "--out", str(tmp_path / "run"), "--set", "data.long_documents=opening"]) == 2
    err = capsys.readouterr().err
    assert "data.long_documents" in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_batches_made_ahead_are_the_batches_of_their_index_made_on_one_worker():
    threads: list[str] = []

    def make(i):
        threads.append(threading.current_thread().name)
        if i == 7:
            raise ValueError("batch 7 is bad")
        return torch.full((2,), i)

    ahead = BatchesAhead(make, lambda i: 10 * i)
    try:
        for i in (0, 1, 2, 3, 5, 6):  # 5: a guess that missed (a resume, say), made on the spot
            batch, tokens = ahead.get(i)
            assert batch.tolist() == [i, i] and tokens == 10 * i
        assert threads[0] == threading.current_thread().name  # the first batch: nothing was made ahead
        assert all(name.startswith("kqv-batches") for name in threads[1:4])  # 1, 2, 3: made ahead
        assert threads.count(threading.current_thread().name) == 2  # 0 and 5
        with pytest.raises(ValueError, match="batch 7 is bad"):  # an error surfaces at the update that asks
            ahead.get(7)
        times = ahead.take_times()
        assert set(times) == {"batch_ms", "wait_ms"} and times["batch_ms"] >= 0 and ahead.take_times() == {}
    finally:
        ahead.close()


def test_example_loss_of_a_packed_batch_is_the_mean_over_its_examples_alone():
    made = documents(prefix_max=56)
    packed = DocumentBatches(made, batch_size=2, context=128, seed=2, packing=True)
    padded = DocumentBatches(made, batch_size=2, context=128, seed=2)
    model = kqv.DecoderLM(tiny_config(vocab_size=TOKENIZER.vocab_size, max_len=128, position="rope")).eval()
    rows = packed.rows(0)
    draws = [g for row in rows for g in row]
    with torch.no_grad():
        together = example_loss(model, packed.batch(0))
        nats = count = 0
        for g in draws:  # each draw in a padded batch of its own
            one = padded.collate([[g]])
            n = int((one.targets != -100).sum())
            nats, count = nats + example_loss(model, one) * n, count + n
    torch.testing.assert_close(together, nats / count, rtol=1e-5, atol=1e-6)


def test_auto_packing_takes_the_layout_that_fills_the_batches_more():
    full = tiny_config(vocab_size=TOKENIZER.vocab_size, max_len=256)
    varied = DocumentBatches(documents(prefix_max=56), batch_size=8, context=256)
    padded, packed = varied.fills()
    assert packed > 0.9 > padded and decide_packing(full, "auto", varied)
    assert isinstance(example_batches(varied, full, "auto").batch(0), PackedBatch)
    # about half to 0.6 of the context each: two share a row only now and then, so packed batches are as wide as
    # the context and rows hold one example or two, where padded ones are as wide as the longest example
    rng = random.Random(4)
    long = [" ".join(rng.choice(WORDS) for _ in range(40))[: rng.randint(75, 95)] + "." for _ in range(64)]
    alike = DocumentBatches(documents(long, corrupt=False), batch_size=8, context=160)
    padded, packed = alike.fills()
    assert padded > 0.9 > 0.7 > packed and not decide_packing(full, "auto", alike)
    assert isinstance(example_batches(alike, full, "auto").batch(0), PaddedBatch)
    assert decide_packing(full, True, alike) and not decide_packing(full, False, varied)


def test_packing_is_decided_for_attention_that_takes_padding_masks_only():
    varied = DocumentBatches(documents(prefix_max=56), batch_size=8, context=256)
    sparse = tiny_config(vocab_size=TOKENIZER.vocab_size, max_len=256, attention="local", local={"block": 4})
    assert varied.fills()[1] > varied.fills()[0]  # "auto" would pack these for full attention
    assert not decide_packing(sparse, "auto", varied) and not decide_packing(sparse, False, varied)
    assert isinstance(example_batches(varied, sparse, "auto").batch(0), PaddedBatch)
    with pytest.raises(kqv.errors.ConfigError, match="data.packing needs attention='full' in every layer"):
        decide_packing(sparse, True, varied)
