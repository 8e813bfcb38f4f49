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
`test.hyp` (the test translations) and `summary.json`. `kqv translate`, `kqv eval` and `kqv attention` use it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from ..data.bible import load_pairs, parse_pair, split_by_group
from ..data.pairs import Encoded, TokenBatches, encode_pairs, load_splits, read_texts, split_tensors, text_files
from ..data.tokenizers import Tokenizer, load_tokenizer, make_tokenizer
from ..errors import BEAM_SIZE, MAX_SENTENCES, SRC, SRC_AND_REF, TGT, ConfigError, DataError, option
from ..nn.config import ModelConfig
from ..nn.devices import model_device, on_device_of
from ..nn.models import EncoderDecoder, count_parameters
from ..nn.rnn import RNNConfig, RNNEncoderDecoder
from ..train.config import TrainConfig
from ..train.flops import training_flops_per_token
from ..train.layout import RunFiles
from ..train.options import TrainerOptions
from ..train.runs import RunConfig
from ..train.slices import is_sliced
from ..validation import Config, check_at_least, check_value
from .base import AttentionMaps, Job, Outcome, TrainedRun, Training, check_text
from .offers import Evaluates, ShowsAttention, Translates
from .translation import SPECIAL_TOKENS, corpus_scores, spread, translate_sentences

ModelKind = Literal["transformer", "lstm"]


@dataclass
class MTDataConfig(Config):
    """Which corpus, and how it becomes batches."""

    section: ClassVar[str] = "data"
    pair: str = "de-en"  # a Bible pair; ignored when path is given
    path: str | None = None  # a TSV file (source<TAB>target), or the source side when tgt_path is given
    tgt_path: str | None = None
    vocab_size: int = 8000  # joint BPE, special tokens included
    max_tokens: int = 4096  # token budget of a batch: rows * longest sentence, on each side
    max_len: int = 256  # training pairs longer than this (in tokens, with <eos>) are left out
    dev_fraction: float = 0.02
    test_fraction: float = 0.03
    eval_sentences: int = 200  # dev sentences scored (loss, BLEU, chrF) at every evaluation

    def check(self) -> None:
        if self.path is None:
            parse_pair(self.pair)
        if self.tgt_path is not None and self.path is None:
            raise ConfigError("data.tgt_path needs data.path (the source side)")
        for name in ("vocab_size", "max_tokens", "max_len", "eval_sentences"):
            check_at_least(self.qualified(name), getattr(self, name), 1)
        if self.max_tokens < self.max_len:
            raise ConfigError(
                f"data.max_tokens ({self.max_tokens}) must hold at least one sentence of "
                f"data.max_len ({self.max_len}) tokens"
            )


@dataclass
class DecodeConfig(Config):
    """How to translate: beam search, and at most max_len_a * source length + max_len_b new tokens."""

    section: ClassVar[str] = "decode"
    beam_size: int = 4
    length_penalty: float = 1.0
    max_len_a: float = 1.5
    max_len_b: int = 10
    batch_sentences: int = 64

    def check(self) -> None:
        check_at_least("decode.beam_size", self.beam_size, 1)
        if self.max_len_a < 0 or self.max_len_b < 1:
            raise ConfigError("decode.max_len_a must be >= 0 and decode.max_len_b >= 1")


@dataclass
class MTTrainConfig(TrainConfig):
    """The trainer's options, plus the loss's label smoothing (Vaswani et al. 2017 use 0.1; training only)."""

    label_smoothing: float = 0.1

    def check(self) -> None:
        super().check()
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"train.label_smoothing must be in [0, 1), got {self.label_smoothing}")


@dataclass
class MTRunConfig(RunConfig):
    """The whole job. `model` is the Transformer's ModelConfig or the LSTM baseline's RNNConfig, as the [model]
    table's `kind` ("transformer" or "lstm") says; its vocabulary size is the tokenizer's, and max_len defaults to
    data.max_len."""

    task: ClassVar[str] = "mt"
    train: MTTrainConfig
    model: ModelConfig | RNNConfig = field(default_factory=ModelConfig)
    data: MTDataConfig = field(default_factory=MTDataConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def read_model(self, model: Any) -> ModelConfig | RNNConfig:
        if not isinstance(model, dict):
            return check_value("model", model, ModelConfig | RNNConfig)
        options = {k: v for k, v in model.items() if k != "kind"}
        kind = model.get("kind", "transformer")
        if kind not in ModelKind.__args__:
            raise ConfigError(f"model.kind must be 'transformer' or 'lstm', got {kind!r}")
        if kind == "lstm":
            return RNNConfig.from_dict(options)
        return ModelConfig.from_dict({**self.model_defaults(), **options})

    def model_defaults(self) -> dict[str, Any]:
        return {"max_len": self.data.max_len}  # the Transformer's

    @property
    def kind(self) -> ModelKind:
        return "lstm" if isinstance(self.model, RNNConfig) else "transformer"

    def model_config(self, vocab_size: int) -> ModelConfig | RNNConfig:
        return dataclasses.replace(self.model, vocab_size=vocab_size)

    def to_dict(self) -> dict[str, Any]:
        values = super().to_dict()
        return {**values, "model": {"kind": self.kind, **values["model"]}}

    def run_values(self, model: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return super().run_values({"kind": self.kind, **model}, **extra)


def build_model(config: ModelConfig | RNNConfig) -> nn.Module:
    return RNNEncoderDecoder(config) if isinstance(config, RNNConfig) else EncoderDecoder(config)


# ---------------------------------------------------------------------------------------------------------------
# Data: tokenizer, encoded splits


@dataclass
class MTData:
    """A translation corpus ready to train on: the joint tokenizer, the encoded splits, the held-out texts."""

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


def prepare_data(config: MTRunConfig, run_dir: Path, reuse: bool, write: bool = True) -> MTData:
    """Tokenizer, encoded splits and held-out texts: loaded from run_dir when `reuse` and they are there (a
    resumed run, or data copied from another run), else built and saved there (unless `write` is False: a
    torchrun rank other than 0)."""
    run = RunFiles(run_dir)
    if reuse:
        run.verify_data()  # a recorded file that is missing is an error, not a rebuild
    if reuse and run.pairs_file.exists():
        tokenizer = load_tokenizer(run.tokenizer_dir)
        return MTData(tokenizer, load_splits(run.pairs_file), read_texts(run.text_dir))
    splits = split_by_group(
        load_pairs(config.data.pair, config.data.path, config.data.tgt_path),
        config.data.dev_fraction,
        config.data.test_fraction,
    )
    corpus = "\n".join(p.src + "\n" + p.tgt for p in splits["train"])
    tokenizer = make_tokenizer("bpe", corpus, config.data.vocab_size, SPECIAL_TOKENS)
    eos = tokenizer.token_to_id("<eos>")
    encoded = {name: encode_pairs(tokenizer, pairs, eos) for name, pairs in splits.items()}
    keep = [
        i
        for i in range(len(encoded["train"]))
        if max(len(encoded["train"].src[i]), len(encoded["train"].tgt[i]) + 1) <= config.data.max_len
    ]
    dropped = len(encoded["train"]) - len(keep)
    encoded["train"] = Encoded([encoded["train"].src[i] for i in keep], [encoded["train"].tgt[i] for i in keep])
    texts = {name: ([p.src for p in splits[name]], [p.tgt for p in splits[name]]) for name in ("dev", "test")}
    if write:
        run.path.mkdir(parents=True, exist_ok=True)
        run.write_tokenizer(tokenizer.files())
        run.write_pairs(split_tensors(encoded))
        run.write_texts(text_files(texts))
    return MTData(tokenizer, encoded, texts, dropped)


def copy_data(source: str | Path, run: RunFiles) -> None:
    """Copy the tokenizer, encoded splits and held-out texts of another run into `run`, through its writer: the
    source's verified against its SHA256SUMS, the copies recorded in the run's (`RunFiles.copy_data_from`)."""
    source = RunFiles(source)
    if not source.pairs_file.is_file():
        raise FileNotFoundError(f"{source.path} holds no prepared MT data ({source.pairs_file.name} is missing)")
    run.path.mkdir(parents=True, exist_ok=True)
    run.copy_data_from(source)


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file (sentences to translate, or their references)."""
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise DataError(f"{path} is not UTF-8 text ({error}); save it as UTF-8") from None


# ---------------------------------------------------------------------------------------------------------------
# Training: the loss, what it measures of the dev split while it trains, and of the test split at the end


def mt_loss(model: nn.Module, batch: dict[str, Tensor], label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy of the next target token under teacher forcing (label-smoothed while training), plus the
    experts' load-balancing loss while training (`kqv.nn.experts`)."""
    smoothing = label_smoothing if model.training else 0.0
    return model(batch["src"], batch["tgt_in"], batch["targets"], src_mask=batch["src_mask"], label_smoothing=smoothing)


class DevEvaluation:
    """The evaluation during training: loss, greedy BLEU and chrF on `data.eval_sentences` dev sentences spread
    over the dev split, and the evaluation time so far, kept as `eval_seconds` in `extra_state`: the dict the
    Trainer saves with every checkpoint and restores a resumed run's entries into, so the time adds up across
    resumes."""

    def __init__(
        self,
        config: MTRunConfig,
        tokenizer: Tokenizer,
        dev: Encoded,
        texts: tuple[list[str], list[str]],
        options: dict[str, int],
        extra_state: dict[str, Any],
    ):
        """`dev`: the encoded dev split, `texts` its (sources, references), `tokenizer` the joint one."""
        self.chosen = spread(list(range(len(dev))), config.data.eval_sentences)
        self.batches = TokenBatches(
            Encoded([dev.src[j] for j in self.chosen], [dev.tgt[j] for j in self.chosen]),
            seed=0,
            shuffle=False,
            **options,
        )
        self.sources, self.references = ([side[j] for j in self.chosen] for side in texts)
        self.tokenizer, self.decode, self.extra_state = tokenizer, config.decode, extra_state

    def __call__(self, model: nn.Module) -> dict[str, float]:
        started = time.perf_counter()
        val_loss = sum(
            mt_loss(model, on_device_of(model, self.batches(i))).item() * len(self.batches.indices(i))
            for i in range(len(self.batches))
        ) / len(self.chosen)
        hypotheses = translate_sentences(
            model,
            self.tokenizer,
            self.sources,
            beam_size=1,
            max_len_a=self.decode.max_len_a,
            max_len_b=self.decode.max_len_b,
            batch_sentences=self.decode.batch_sentences,
        )
        scores = corpus_scores(hypotheses, self.references)
        spent = self.extra_state.get("eval_seconds", 0.0) + time.perf_counter() - started
        self.extra_state["eval_seconds"] = spent
        return {"val_loss": val_loss, "dev_bleu": scores["bleu"], "dev_chrf": scores["chrf"], "eval_seconds": spent}


def test_cost(config: MTRunConfig, test_sentences: int) -> float:
    """The test translation after training in dev evaluations, for a budget's plan: beam k costs about k / 2 greedy
    decodings a verse (a conservative estimate; docs/translation.md has the measured times)."""
    return test_sentences / config.data.eval_sentences * max(1.0, config.decode.beam_size / 2)


def real_tokens(batch: dict[str, Tensor]) -> int:
    """The real (non-padding) source and target tokens of a batch."""
    return int(batch["src_mask"].sum()) + int((batch["targets"] != -100).sum())


def translate_test_split(
    model: nn.Module, tokenizer: Tokenizer, sources: list[str], references: list[str], decode: dict, run: RunFiles
) -> dict[str, Any]:
    """Translate a test split with beam search (`decode`: the run's [decode] options), write the translations as
    the run's predictions, one a line, and score them."""
    started = time.perf_counter()
    hypotheses = translate_sentences(model, tokenizer, sources, **decode)
    run.write_predictions(hypotheses)
    scores = corpus_scores(hypotheses, references)
    return {
        "test_bleu": scores["bleu"],
        "test_chrf": scores["chrf"],
        "test_sentences": len(sources),
        "test_translate_seconds": round(time.perf_counter() - started, 1),
    }


# ---------------------------------------------------------------------------------------------------------------
# The job


@dataclass(frozen=True)
class MTEvaluation:
    """What `MTRun.evaluate` measured on `source`: corpus BLEU and chrF of `sentences` translations decoded with
    beam size `beam_size`, which took `seconds`."""

    source: str
    bleu: float
    chrf: float
    sentences: int
    beam_size: int
    seconds: float

    @property
    def sentences_per_second(self) -> float:
        return self.sentences / self.seconds

    def to_dict(self) -> dict[str, float]:
        """The figures as `kqv eval --json` prints them (seconds to one decimal)."""
        return {
            "bleu": self.bleu,
            "chrf": self.chrf,
            "sentences": self.sentences,
            "beam_size": self.beam_size,
            "seconds": round(self.seconds, 1),
        }


@dataclass(repr=False)  # TrainedRun.__repr__: the model is too long to print
class MTRun(TrainedRun, Translates, Evaluates, ShowsAttention):
    """A trained translation run: translate sentences with its decoding settings, score them, show the alignment."""

    def translate(
        self,
        sentences: str | list[str],
        *,
        beam_size: int | None = None,
        length_penalty: float | None = None,
        **options: float,
    ) -> list[str]:
        """The translation of each sentence (one string is one sentence), by beam search with the run's `[decode]`
        settings; `beam_size`, `length_penalty` and `options` (max_len_a, max_len_b, batch_sentences) replace them."""
        sentences = [sentences] if isinstance(sentences, str) else list(sentences)
        if beam_size is not None:
            check_at_least(option(BEAM_SIZE), beam_size, 1)
        chosen = {"beam_size": beam_size, "length_penalty": length_penalty, **options}
        decode = {**self.config.decode.to_dict(), **{k: v for k, v in chosen.items() if v is not None}}
        return translate_sentences(self.model, self.tokenizer, sentences, **decode)

    @torch.no_grad()
    def score(self, sources: list[str], translations: list[str]) -> list[float]:
        """log P(translation | source) under the model, in nats, for each pair (the translation's tokens and its
        <eos>, as in training): how likely the model finds a translation, its own or a given one."""
        if len(sources) != len(translations):
            raise DataError(f"{len(sources)} sources for {len(translations)} translations")
        _, bos, eos = (self.tokenizer.token_to_id(t) for t in SPECIAL_TOKENS)
        scores, device = [], model_device(self.model)
        for source, translation in zip(sources, translations):
            src = torch.tensor([self.tokenizer.encode(" ".join(source.split())) + [eos]], device=device)  # (1, src)
            tgt = torch.tensor([[bos] + self.tokenizer.encode(" ".join(translation.split())) + [eos]], device=device)
            log_probs = self.model(src, tgt[:, :-1]).log_softmax(-1)  # (1, tgt_time, vocab)
            scores.append(log_probs[0].gather(1, tgt[0, 1:, None]).sum().item())
        return scores

    def evaluate(
        self,
        src: str | Path | None = None,
        ref: str | Path | None = None,
        *,
        beam_size: int | None = None,
        length_penalty: float | None = None,
        max_sentences: int | None = None,
    ) -> MTEvaluation:
        """BLEU and chrF of the translations of `src` (a file, one sentence per line) against `ref` (aligned with
        it), by default of the run's held-out test split; `max_sentences` scores only the first ones."""
        if (src is None) != (ref is None):
            raise ConfigError(
                f"give both {option(SRC_AND_REF)} (aligned files), or neither to score the run's test split"
            )
        if src is not None:
            sources, references = (read_lines(path) for path in (src, ref))
            label = str(src)
        else:
            (sources, references), label = self.test_texts(), "the held-out test split"
        if max_sentences is not None:
            check_at_least(option(MAX_SENTENCES), max_sentences, 1)
            sources, references = sources[:max_sentences], references[:max_sentences]
        beam_size = beam_size if beam_size is not None else self.config.decode.beam_size
        started = time.perf_counter()
        hypotheses = self.translate(sources, beam_size=beam_size, length_penalty=length_penalty)
        seconds = time.perf_counter() - started
        scores = corpus_scores(hypotheses, references)
        return MTEvaluation(label, scores["bleu"], scores["chrf"], len(sources), beam_size, seconds)

    def attention(self, src: str, tgt: str | None = None) -> AttentionMaps:
        """The cross-attention of every layer and head while the decoder reads `tgt` (default: the model's own
        translation of `src`): rows are target tokens (<bos> first), columns source tokens (<eos> last)."""
        for name, text in ((option(SRC), src), (option(TGT), "" if tgt is None else tgt)):
            check_text(name, text)
        target = tgt if tgt is not None else self.translate([src])[0]
        _, bos, eos = (self.tokenizer.token_to_id(t) for t in SPECIAL_TOKENS)
        src_ids = self.tokenizer.encode(" ".join(src.split())) + [eos]
        tgt_ids = [bos] + self.tokenizer.encode(" ".join(target.split()))
        with torch.no_grad():  # per layer (1, heads, target tokens, source tokens)
            ids = (torch.tensor([x], device=model_device(self.model)) for x in (src_ids, tgt_ids))
            weights = [w.cpu() for w in self.model.attention_weights(*ids)["cross"]]
        rows, columns = ([self.tokenizer.decode([i]) for i in ids] for ids in (tgt_ids, src_ids))
        return AttentionMaps(weights, rows, columns, kind="cross", translation=target)

    def test_texts(self) -> tuple[list[str], list[str]]:
        run = RunFiles(self.run_dir)
        run.verify(run.text_dir)
        return read_texts(run.text_dir)["test"]


@dataclass
class TrainingFlops:
    """What the MT job's hooks hand each other for its FLOPs per token: a `sample` of training batches with the
    loss and their real tokens (`training_flops_per_token`'s arguments), and `per_token` once counted (before
    training; after it under FSDP, when rank 0 holds the whole model again)."""

    sample: tuple[list[dict[str, Tensor]], Callable[[nn.Module, dict[str, Tensor]], Tensor], int]
    per_token: float | None = None


MTTraining = Training[MTRunConfig, MTData, TrainingFlops]  # `MTJob.train`'s


class MTJob(Job):
    """`kqv train mt`: a Transformer (or LSTM) translation model; `kqv translate|eval|attention` on its runs."""

    name = "mt"
    help = "train a translation model (default: German -> English Bible, quick config)"
    config_class = MTRunConfig
    run_class = MTRun
    noun = "translation"

    def build_model(
        self, model_config: ModelConfig | RNNConfig, config: RunConfig, values: dict[str, Any]
    ) -> nn.Module:
        return build_model(model_config)

    def model_config_of_run(self, values: dict[str, Any]) -> ModelConfig | RNNConfig:
        model_values = dict(values["model"])
        kind = model_values.pop("kind", "transformer")
        return RNNConfig.from_dict(model_values) if kind == "lstm" else ModelConfig.from_dict(model_values)

    def make_corpus(
        self, training: MTTraining, *, data_from: str | Path | None = None, threads: int | None = None
    ) -> MTData:
        """The tokenizer, encoded splits and held-out texts (`prepare_data`). `data_from` is another MT run (or a
        directory written by `prepare_data`) whose tokenizer and encoded splits this run uses, e.g. to train the
        LSTM baseline on exactly the Transformer's data. `threads` sets torch's number of threads."""
        config, run = training.config, training.run
        resume = run.if_exists == "resume"
        if threads is not None:
            torch.set_num_threads(threads)
        if data_from is not None and not resume and run.writes:
            copy_data(data_from, run)
        return prepare_data(config, run.path, reuse=resume or data_from is not None, write=run.writes)

    def make_model(self, training: MTTraining) -> nn.Module:
        vocab_size = training.data.tokenizer.vocab_size
        return self.start(training.config, training.run, training.config.model_config(vocab_size))

    def trainer_options(self, training: MTTraining) -> TrainerOptions:
        """Token-budget batches of the training pairs, the label-smoothed loss and the dev evaluation (its time kept
        in the checkpoints' extra_state); the model's FLOPs per token, measured on three batches, go to `notes`."""
        config, data, model = training.config, training.data, training.model
        options = {
            "max_tokens": config.data.max_tokens,
            "max_rows": config.train.batch_size,
            "pad_id": data.pad_id,
            "bos_id": data.bos_id,
            "eos_id": data.eos_id,
        }
        train_batches = TokenBatches(data.splits["train"], seed=config.train.seed, **options)
        sample = [train_batches(i) for i in range(3)]
        training.handed = flops = TrainingFlops((sample, mt_loss, sum(real_tokens(b) for b in sample)))
        if not is_sliced(model):  # FSDP: no weights here yet, so counted after training, on rank 0's whole model
            flops.per_token = training_flops_per_token(model, *flops.sample)
        state = {"task": "mt"}  # the checkpoints' extra_state: the dev evaluation adds its time to it
        return TrainerOptions(
            train_batches=train_batches,
            extra_state=state,
            loss_fn=lambda m, b: mt_loss(m, b, config.train.label_smoothing),
            loss_terms=TokenBatches.target_tokens,  # under torchrun (kqv.train.distributed.share)
            eval_fn=DevEvaluation(config, data.tokenizer, data.splits["dev"], data.texts["dev"], options, state),
            work_after_training=test_cost(config, len(data.texts["test"][0])),
        )

    def describe(self, training: MTTraining) -> str:
        config, data, splits = training.config, training.data, training.data.splits
        return (
            f"{config.kind} with {count_parameters(training.model):,} parameters; {len(splits['train']):,} training "
            f"pairs ({data.dropped} longer than {config.data.max_len} tokens left out), {len(splits['dev'])} dev, "
            f"{len(splits['test'])} test; joint BPE vocabulary {data.tokenizer.vocab_size}; "
            f"{len(training.options.train_batches)} batches per epoch; run directory {training.run.destination}"
        )

    def outcome(self, training: MTTraining) -> Outcome:
        """The test split translated with beam search and scored (BLEU, chrF), with the training's figures: its
        real tokens, FLOPs, evaluation time and threads."""
        config, data, result = training.config, training.data, training.result
        train_batches, state = training.options.train_batches, training.options.extra_state
        tokens = sum(train_batches.real_tokens(i) for i in range(result.trainer.step * config.train.grad_accum))
        flops = training.handed.per_token
        if flops is None:  # an FSDP run's, on rank 0's whole model now
            flops = training_flops_per_token(training.model, *training.handed.sample)
        test = translate_test_split(
            training.model, data.tokenizer, *data.texts["test"], config.decode.to_dict(), training.run
        )
        return Outcome(
            {
                "kind": config.kind,
                "train_tokens": tokens,
                "pair": config.data.pair if config.data.path is None else config.data.path,
                "eval_seconds": round(state.get("eval_seconds", 0.0), 1),
                "threads": torch.get_num_threads(),
                "train_flops": flops * tokens,
                "dev_bleu": result.final.get("dev_bleu"),
                "dev_chrf": result.final.get("dev_chrf"),
                "beam_size": config.decode.beam_size,
                **test,
            }
        )

    def conclusion(self, training: MTTraining, summary: dict[str, Any]) -> str:
        return (
            f"test BLEU {summary['test_bleu']:.2f}, chrF {summary['test_chrf']:.2f} (beam {summary['beam_size']}, "
            f"{summary['test_sentences']} sentences) after {summary['steps']} steps, "
            f"{training.result.trainer.train_seconds / 60:.1f} min of training"
        )


JOB = MTJob()
load_run_config, read_run_config, load_run, train_mt = JOB.load_config, JOB.read_config, JOB.load, JOB.train
