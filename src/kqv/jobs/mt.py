"""The machine-translation job: parallel corpus -> joint BPE -> encoder-decoder -> trainer -> BLEU and chrF.

The model is the Transformer (`kqv.EncoderDecoder`, `model.kind = "transformer"`) or the recurrent baseline it
replaced (`kqv.nn.rnn.RNNEncoderDecoder`, `model.kind = "lstm"`); both are trained by the same `Trainer` on the same
batches with the same tokenizer, so they can be compared.

* Data: the verse-aligned Bible (`data.pair`, default de-en) or a user corpus (`data.path`, TSV or with
  `data.tgt_path` two aligned files), split by whole chapters / blocks of lines (see `kqv.data.bible`).
* Tokens: one byte-level BPE for both languages (`<pad>`, `<bos>`, `<eos>` first), trained on the training split.
  A source is `ids + <eos>`; the decoder reads `<bos> + ids` and predicts `ids + <eos>` (teacher forcing).
* Batches: sentences sorted by length and packed so that rows * longest sentence <= `data.max_tokens` on both
  sides (and rows <= `train.batch_size`), shuffled per epoch by a generator seeded with (seed, epoch): batch `i`
  depends only on `i`, so a resumed run sees the same batches. Right padding, with `src_mask` marking real source
  tokens; the decoder needs no target mask since padding comes after every real token.
* Loss: cross-entropy with label smoothing (`train.label_smoothing`) in training, plain cross-entropy for
  `val_loss`. `train.max_minutes` stops training after that much training time (evaluation excluded).
* Evaluation at every `train.eval_every`: loss, BLEU and chrF (sacrebleu; greedy decoding) on
  `data.eval_sentences` dev sentences spread evenly over the dev split, and the training time so far (evaluation
  excluded); at the end, BLEU and chrF of the whole test split with beam search (`decode.beam_size`).

A run directory holds `run.toml` (with `task = "mt"`), `tokenizer/`, `pairs.safetensors` (the encoded splits),
`data/{dev,test}.{src,tgt}` (the cleaned text of the held-out splits), `checkpoint/`, `metrics.jsonl`, `loss.png`,
`test.hyp` (the test translations) and `summary.json`.
"""

from __future__ import annotations

import json
import shutil
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.bible import load_pairs, parse_pair, split_by_group
from ..data.padding import lengths_mask, pad_sequences
from ..data.pairs import Encoded, TokenBatches, encode_pairs, load_splits, read_texts, save_splits, write_texts
from ..data.tokenizers import Tokenizer, load_tokenizer, make_tokenizer
from ..nn.config import ModelConfig, build_dataclass
from ..nn.experts import with_auxiliary_loss
from ..nn.models import EncoderDecoder, count_parameters
from ..nn.rnn import RNNConfig, RNNEncoderDecoder
from ..train.checkpoints import load_weights, read_checkpoint
from ..train.config import TrainConfig
from ..train.runs import read_config_values, toml_text
from ..train.trainer import Trainer

RUN_CONFIG, TOKENIZER_DIR, PAIRS_FILE, TEXT_DIR = "run.toml", "tokenizer", "pairs.safetensors", "data"
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
MT_TRAIN_OPTIONS = ("label_smoothing",)  # [train] options of the MT job on top of TrainConfig's


@dataclass
class MTDataConfig:
    """Which corpus, and how it becomes batches."""

    pair: str = "de-en"  # a Bible pair; ignored when path is given
    path: str | None = None  # a TSV file (source<TAB>target), or the source side when tgt_path is given
    tgt_path: str | None = None
    vocab_size: int = 8000  # joint BPE, special tokens included
    max_tokens: int = 4096  # token budget of a batch: rows * longest sentence, on each side
    max_len: int = 256  # training pairs longer than this (in tokens, with <eos>) are left out
    dev_fraction: float = 0.02
    test_fraction: float = 0.03
    eval_sentences: int = 200  # dev sentences scored (loss, BLEU, chrF) at every evaluation

    def __post_init__(self) -> None:
        if self.path is None:
            parse_pair(self.pair)
        if self.tgt_path is not None and self.path is None:
            raise ValueError("data.tgt_path needs data.path (the source side)")
        for name in ("vocab_size", "max_tokens", "max_len", "eval_sentences"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"data.{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.max_tokens < self.max_len:
            raise ValueError(f"data.max_tokens ({self.max_tokens}) must hold at least one sentence of "
                             f"data.max_len ({self.max_len}) tokens")


@dataclass
class DecodeConfig:
    """How to translate: beam search, and at most max_len_a * source length + max_len_b new tokens."""

    beam_size: int = 4
    length_penalty: float = 1.0
    max_len_a: float = 1.5
    max_len_b: int = 10
    batch_sentences: int = 64

    def __post_init__(self) -> None:
        if not isinstance(self.beam_size, int) or self.beam_size < 1:
            raise ValueError(f"decode.beam_size must be a positive integer, got {self.beam_size!r}")
        if self.max_len_a < 0 or self.max_len_b < 1:
            raise ValueError("decode.max_len_a must be >= 0 and decode.max_len_b >= 1")


@dataclass
class MTRunConfig:
    """The whole job. `model` holds `kind` ("transformer" or "lstm") and that model's options except the
    vocabulary size, which the tokenizer decides; `train` is a TrainConfig plus `label_smoothing`."""

    model: dict[str, Any]
    train: TrainConfig
    data: MTDataConfig = field(default_factory=MTDataConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    label_smoothing: float = 0.1

    def __post_init__(self) -> None:
        kind = self.model.get("kind", "transformer")
        if kind not in ("transformer", "lstm"):
            raise ValueError(f"model.kind must be 'transformer' or 'lstm', got {kind!r}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"train.label_smoothing must be in [0, 1), got {self.label_smoothing}")

    @property
    def kind(self) -> Literal["transformer", "lstm"]:
        return self.model.get("kind", "transformer")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> MTRunConfig:
        values = {k: v for k, v in values.items() if k != "task"}
        unknown = sorted(set(values) - {"model", "train", "data", "decode"})
        if unknown:
            raise ValueError(f"unknown section(s) {unknown} in the MT run config; use [model], [train], [data], "
                             f"[decode]")
        if "train" not in values:
            raise ValueError("the run config needs a [train] section with at least steps and batch_size")
        train = dict(values["train"])
        extra = {name: train.pop(name) for name in MT_TRAIN_OPTIONS if name in train}
        return cls(model=dict(values.get("model", {})), train=TrainConfig.from_dict(train),
                   data=build_dataclass(MTDataConfig, values.get("data", {}), "[data]"),
                   decode=build_dataclass(DecodeConfig, values.get("decode", {}), "[decode]"), **extra)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "data": asdict(self.data), "decode": asdict(self.decode),
                "train": {**self.train.to_dict(), "label_smoothing": self.label_smoothing}}

    def model_config(self, vocab_size: int) -> ModelConfig | RNNConfig:
        options = {k: v for k, v in self.model.items() if k != "kind"}
        if self.kind == "lstm":
            return RNNConfig.from_dict({**options, "vocab_size": vocab_size})
        return ModelConfig.from_dict({"max_len": self.data.max_len, **options, "vocab_size": vocab_size})


def build_model(config: ModelConfig | RNNConfig) -> nn.Module:
    return RNNEncoderDecoder(config) if isinstance(config, RNNConfig) else EncoderDecoder(config)


def load_run_config(path: str | Path, overrides: list[str] = ()) -> MTRunConfig:
    """Read a TOML MT run config and apply `section.key=value` overrides."""
    return MTRunConfig.from_dict(read_config_values(path, overrides, "configs/mt-*.toml"))


# ---------------------------------------------------------------------------------------------------------------
# Data: tokenizer, encoded splits


@dataclass
class MTData:
    tokenizer: Tokenizer
    splits: dict[str, Encoded]
    texts: dict[str, tuple[list[str], list[str]]]  # dev and test: (sources, references)
    dropped: int = 0  # training pairs longer than data.max_len

    @property
    def pad_id(self) -> int:
        return self.tokenizer.token_to_id("<pad>")

    @property
    def bos_id(self) -> int:
        return self.tokenizer.token_to_id("<bos>")

    @property
    def eos_id(self) -> int:
        return self.tokenizer.token_to_id("<eos>")


def prepare_data(config: MTRunConfig, run_dir: Path, reuse: bool) -> MTData:
    """Tokenizer, encoded splits and held-out texts: loaded from run_dir when `reuse` and they are there (a
    resumed run, or data copied from another run), else built and saved."""
    if reuse and (run_dir / PAIRS_FILE).exists():
        tokenizer = load_tokenizer(run_dir / TOKENIZER_DIR)
        return MTData(tokenizer, load_splits(run_dir / PAIRS_FILE), read_texts(run_dir / TEXT_DIR))
    splits = split_by_group(load_pairs(config.data.pair, config.data.path, config.data.tgt_path),
                            config.data.dev_fraction, config.data.test_fraction)
    corpus = "\n".join(p.src + "\n" + p.tgt for p in splits["train"])
    tokenizer = make_tokenizer("bpe", corpus, config.data.vocab_size, SPECIAL_TOKENS)
    eos = tokenizer.token_to_id("<eos>")
    encoded = {name: encode_pairs(tokenizer, pairs, eos) for name, pairs in splits.items()}
    keep = [i for i in range(len(encoded["train"])) if max(len(encoded["train"].src[i]),
                                                            len(encoded["train"].tgt[i]) + 1) <= config.data.max_len]
    dropped = len(encoded["train"]) - len(keep)
    encoded["train"] = Encoded([encoded["train"].src[i] for i in keep], [encoded["train"].tgt[i] for i in keep])
    texts = {name: ([p.src for p in splits[name]], [p.tgt for p in splits[name]]) for name in ("dev", "test")}
    run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(run_dir / TOKENIZER_DIR)
    save_splits(encoded, run_dir / PAIRS_FILE)
    write_texts(texts, run_dir / TEXT_DIR)
    return MTData(tokenizer, encoded, texts, dropped)


def copy_data(source: str | Path, run_dir: Path) -> None:
    """Copy the tokenizer, encoded splits and held-out texts of another run into run_dir."""
    source = Path(source)
    if not (source / PAIRS_FILE).is_file():
        raise FileNotFoundError(f"{source} holds no prepared MT data ({PAIRS_FILE} is missing)")
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in (TOKENIZER_DIR, TEXT_DIR):
        shutil.copytree(source / name, run_dir / name, dirs_exist_ok=True)
    shutil.copy2(source / PAIRS_FILE, run_dir / PAIRS_FILE)


def mt_loss(model: nn.Module, batch: dict[str, Tensor], label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy of the next target token under teacher forcing (label-smoothed while training), plus the
    experts' load-balancing loss while training (`kqv.nn.experts`)."""
    logits = model(batch["src"], batch["tgt_in"], src_mask=batch["src_mask"])  # (batch, tgt_time, vocab)
    smoothing = label_smoothing if model.training else 0.0
    loss = F.cross_entropy(logits.flatten(0, 1).float(), batch["targets"].flatten(), ignore_index=-100,
                           label_smoothing=smoothing)
    return with_auxiliary_loss(model, loss)


# ---------------------------------------------------------------------------------------------------------------
# Translation and scores


@torch.no_grad()
def translate(model: nn.Module, tokenizer: Tokenizer, sentences: list[str], *, beam_size: int = 4,
              length_penalty: float = 1.0, max_len_a: float = 1.5, max_len_b: int = 10,
              batch_sentences: int = 64) -> list[str]:
    """Translate sentences (batched by length, output in input order). Empty sentences and, for learned positions,
    sources longer than the model's max_len raise ValueError."""
    pad, bos, eos = (tokenizer.token_to_id(t) for t in SPECIAL_TOKENS)
    sources = []
    for number, sentence in enumerate(sentences, 1):
        if not sentence.strip():
            raise ValueError(f"source sentence {number} is empty; give text to translate")
        sources.append(torch.tensor(tokenizer.encode(" ".join(sentence.split())) + [eos]))
    limit = _position_limit(model)
    for number, ids in enumerate(sources, 1):
        if limit is not None and len(ids) > limit:
            raise ValueError(f"source sentence {number} has {len(ids)} tokens but this model's learned positions "
                             f"cover max_len={limit}; shorten or split the sentence")
    was_training = model.training
    model.eval()
    order = sorted(range(len(sources)), key=lambda j: len(sources[j]))
    results: list[str] = [""] * len(sources)
    try:
        for start in range(0, len(order), batch_sentences):
            chunk = order[start:start + batch_sentences]
            src = pad_sequences([sources[j] for j in chunk], pad)
            src_mask = lengths_mask([len(sources[j]) for j in chunk], src.shape[1])
            max_new = int(max_len_a * src.shape[1] + max_len_b)
            if limit is not None:
                max_new = min(max_new, limit)
            out = model.generate(src, max_new, beam_size=beam_size, length_penalty=length_penalty, bos_id=bos,
                                 eos_id=eos, src_mask=src_mask)
            for j, row in zip(chunk, out.tolist()):
                row = row[1:]
                results[j] = tokenizer.decode(row[:row.index(eos)] if eos in row else row).strip()
    finally:
        model.train(was_training)
    return results


def _position_limit(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    return config.max_len if isinstance(config, ModelConfig) and config.position == "learned" else None


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """Corpus BLEU (sacrebleu's default 13a tokenisation) and chrF of detokenised hypotheses."""
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} translations for {len(references)} references")
    return {"bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
            "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score}


def spread(items: list, count: int) -> list:
    """`count` items evenly spaced through the list (all of them if it is shorter)."""
    if count >= len(items):
        return list(items)
    return [items[int(j * len(items) / count)] for j in range(count)]


# ---------------------------------------------------------------------------------------------------------------
# Training


def train_mt(config: MTRunConfig, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
             quiet: bool = False, data_from: str | Path | None = None) -> dict[str, Any]:
    """Train the configured model, translate the test split, write summary.json and return the summary.

    `data_from` is another MT run (or a directory written by `prepare_data`) whose tokenizer and encoded splits
    this run uses, e.g. to train the LSTM baseline on exactly the Transformer's data."""
    run_dir = Path(run_dir)
    if resume:
        read_checkpoint(run_dir)  # a clear error before any work if there is nothing to resume
    elif data_from is not None:
        copy_data(data_from, run_dir)
    data = prepare_data(config, run_dir, reuse=(resume and not overwrite) or data_from is not None)
    model_config = config.model_config(data.tokenizer.vocab_size)
    (run_dir / RUN_CONFIG).write_text(toml_text((
        {"task": "mt", **config.to_dict(), "model": {"kind": config.kind, **model_config.to_dict()}})))
    torch.manual_seed(config.train.seed)
    model = build_model(model_config)
    options = {"max_tokens": config.data.max_tokens, "max_rows": config.train.batch_size, "pad_id": data.pad_id,
               "bos_id": data.bos_id, "eos_id": data.eos_id}
    train_batches = TokenBatches(data.splits["train"], seed=config.train.seed, **options)
    chosen = spread(list(range(len(data.splits["dev"]))), config.data.eval_sentences)
    dev = data.splits["dev"]
    dev_batches = TokenBatches(Encoded([dev.src[j] for j in chosen], [dev.tgt[j] for j in chosen]), seed=0,
                               shuffle=False, **options)
    dev_sources, dev_references = ([side[j] for j in chosen] for side in data.texts["dev"])
    flops_per_token = training_flops_per_token(model, [train_batches(i) for i in range(3)])
    trainer: Trainer | None = None

    def evaluate(model: nn.Module) -> dict[str, float]:
        started = time.perf_counter()
        val_loss = sum(mt_loss(model, dev_batches(i)).item() * len(dev_batches.indices(i))
                       for i in range(len(dev_batches))) / len(chosen)
        hypotheses = translate(model, data.tokenizer, dev_sources, beam_size=1, max_len_a=config.decode.max_len_a,
                               max_len_b=config.decode.max_len_b, batch_sentences=config.decode.batch_sentences)
        scores = corpus_scores(hypotheses, dev_references)
        trainer.extra_state["eval_seconds"] = trainer.extra_state.get("eval_seconds", 0.0) + time.perf_counter() - started
        return {"val_loss": val_loss, "dev_bleu": scores["bleu"], "dev_chrf": scores["chrf"],
                "eval_seconds": trainer.extra_state["eval_seconds"]}

    if not quiet:
        print(f"kqv: {config.kind} with {count_parameters(model):,} parameters; {len(data.splits['train']):,} training "
              f"pairs ({data.dropped} longer than {config.data.max_len} tokens left out), {len(data.splits['dev'])} dev, "
              f"{len(data.splits['test'])} test; joint BPE vocabulary {data.tokenizer.vocab_size}; "
              f"{len(train_batches)} batches per epoch; run directory {run_dir}")
    trainer = Trainer(model, config.train, run_dir, train_batches=train_batches,
                      loss_fn=lambda m, b: mt_loss(m, b, config.label_smoothing), eval_fn=evaluate,
                      extra_state={"task": "mt"}, quiet=quiet,
                      if_exists="resume" if resume else ("overwrite" if overwrite else "error"))
    final = trainer.train()
    train_seconds = trainer.train_seconds
    tokens = sum(train_batches.real_tokens(i) for i in range(trainer.step * config.train.grad_accum))
    started = time.perf_counter()
    test_sources, test_references = data.texts["test"]
    hypotheses = translate(model, data.tokenizer, test_sources, **asdict(config.decode))
    (run_dir / "test.hyp").write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    test = corpus_scores(hypotheses, test_references)
    summary = {"kind": config.kind, "pair": config.data.pair if config.data.path is None else config.data.path,
               "steps": trainer.step, "train_seconds": round(train_seconds, 1),
               "eval_seconds": round(trainer.extra_state.get("eval_seconds", 0.0), 1),
               "threads": torch.get_num_threads(), "parameters": count_parameters(model),
               "train_tokens": tokens, "train_flops": flops_per_token * tokens,
               "final_train_loss": final.get("train_loss"), "final_val_loss": final.get("val_loss"),
               "dev_bleu": final.get("dev_bleu"), "dev_chrf": final.get("dev_chrf"),
               "test_bleu": test["bleu"], "test_chrf": test["chrf"], "test_sentences": len(test_sources),
               "beam_size": config.decode.beam_size, "test_translate_seconds": round(time.perf_counter() - started, 1)}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if not quiet:
        print(f"kqv: test BLEU {test['bleu']:.2f}, chrF {test['chrf']:.2f} (beam {config.decode.beam_size}, "
              f"{len(test_sources)} sentences) after {trainer.step} steps, {train_seconds / 60:.1f} min of training")
    return summary


def training_flops_per_token(model: nn.Module, batches: list[dict[str, Tensor]]) -> float:
    """Floating-point operations of one forward and backward pass per real (non-padding) token, measured on
    `batches` with torch's FlopCounterMode (matrix products and attention). FlopCounterMode does not see inside
    `nn.LSTM`, so its gate products are added by hand: 2 * 4 * hidden * (input + hidden) per token and direction
    forward, times 3 with the backward pass."""
    from torch.utils.flop_counter import FlopCounterMode

    lstm_flops = [0]

    def count_lstm(module: nn.LSTM, inputs: tuple, _output: Any) -> None:
        x = inputs[0]
        tokens = x.data.shape[0] if isinstance(x, nn.utils.rnn.PackedSequence) else x.shape[0] * x.shape[1]
        directions = 2 if module.bidirectional else 1
        for layer in range(module.num_layers):
            width = module.input_size if layer == 0 else module.hidden_size * directions
            lstm_flops[0] += 3 * 2 * 4 * module.hidden_size * (width + module.hidden_size) * tokens * directions

    hooks = [m.register_forward_hook(count_lstm) for m in model.modules() if isinstance(m, nn.LSTM)]
    rng = torch.get_rng_state()
    try:
        with FlopCounterMode(display=False) as counter:
            for batch in batches:
                mt_loss(model, batch).backward()
    finally:
        for hook in hooks:
            hook.remove()
        model.zero_grad(set_to_none=True)
        torch.set_rng_state(rng)
    tokens = sum(int(b["src_mask"].sum()) + int((b["targets"] != -100).sum()) for b in batches)
    return (counter.get_total_flops() + lstm_flops[0]) / tokens


# ---------------------------------------------------------------------------------------------------------------
# Using a trained run


@dataclass
class MTRun:
    config: MTRunConfig
    model: nn.Module
    tokenizer: Tokenizer
    run_dir: Path

    def translate(self, sentences: list[str], **options: Any) -> list[str]:
        return translate(self.model, self.tokenizer, sentences, **{**asdict(self.config.decode), **options})

    def test_texts(self) -> tuple[list[str], list[str]]:
        return read_texts(self.run_dir / TEXT_DIR)["test"]


def read_run_config(run_dir: str | Path) -> tuple[MTRunConfig, ModelConfig | RNNConfig]:
    """The run's configuration and the exact model config it trained (vocab_size included)."""
    path = Path(run_dir) / RUN_CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a kqv MT run: {path} is missing")
    values = tomllib.loads(path.read_text())
    if values.get("task") != "mt":
        raise ValueError(f"{run_dir} holds a run of task {values.get('task', 'lm')!r}, not a translation model")
    model_values = dict(values["model"])
    kind = model_values.pop("kind", "transformer")
    model_config = RNNConfig.from_dict(model_values) if kind == "lstm" else ModelConfig.from_dict(model_values)
    model_values.pop("vocab_size")
    return MTRunConfig.from_dict({**values, "model": {"kind": kind, **model_values}}), model_config


def load_run(run_dir: str | Path) -> MTRun:
    """Load a trained MT run for translation or evaluation (weights from safetensors, no code executed)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run directory at {run_dir}; train one with `kqv train mt --out {run_dir}`")
    config, model_config = read_run_config(run_dir)
    model = build_model(model_config)
    load_weights(model, run_dir)
    model.eval()
    return MTRun(config, model, load_tokenizer(run_dir / TOKENIZER_DIR), run_dir)

