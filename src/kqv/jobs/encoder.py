"""The encoder's jobs: masked-language-model pretraining and sequence-classification fine-tuning.

Masked LM (Devlin et al. 2019). An encoder sees the whole sequence, so it cannot be trained to predict the next
token; BERT corrupts the input instead and asks for the originals: 15% of the tokens are selected, 80% of those
become [MASK], 10% a random token, 10% stay as they are (so the model cannot learn that only [MASK] needs
predicting), and the loss is the cross-entropy at the selected positions only. Training blocks come from the LM
job's corpora (`kqv.data`: Shakespeare by default). Every evaluation hides 15% of the validation tokens behind
[MASK] (no random or kept tokens: the model must infer each from its context alone) and reports the accuracy of
the model there, `masked_accuracy`, next to `unigram_accuracy`, the accuracy of always answering the token most
frequent among those positions.

Classification. A `SequenceClassifier` (encoder + pooled linear head) learns the labels of a TSV file of
`text<TAB>label` lines; a deterministic share is held out as the dev set, whose accuracy is reported with the
majority-class baseline. Starting from an MLM run (`init = "runs/mlm"`) fine-tunes its encoder and reuses its
tokenizer; otherwise everything is trained from scratch.

Both use the shared `kqv.training.Trainer` and write a run directory like the LM job's: `run.toml` (with
`task = "mlm"` or `"cls"`), `tokenizer/`, `checkpoint/`, `metrics.jsonl`, `loss.png`, `summary.json`.
"""

from __future__ import annotations

import json
import time
import tomllib
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from ..nn.config import ModelConfig
from ..data.shakespeare import load_text, split_text
from ..data.batches import sample_batch
from ..nn.heads import MaskedLM, SequenceClassifier
from .lm import encode
from ..train.runs import read_config_values, toml_text
from ..nn.models import count_parameters
from ..data.tokenizers import Tokenizer, load_tokenizer, make_tokenizer
from ..train.trainer import Trainer, TrainConfig, load_weights, read_checkpoint

RUN_CONFIG, TOKENIZER_DIR, TOKENS_FILE, SPECIALS_FILE = "run.toml", "tokenizer", "tokens.safetensors", "specials.json"
SPECIAL_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")


# ---------------------------------------------------------------------------------------------------------------
# The vocabulary: a kqv tokenizer plus the encoder's special tokens


class Vocabulary:
    """A kqv tokenizer and the ids of [PAD], [CLS], [SEP], [MASK].

    The BPE tokenizer learns them as special tokens (ids 0-3); the character tokenizer has none, so they take the
    ids after its characters. `regular_ids` are all the others: what a random replacement is drawn from.
    """

    def __init__(self, tokenizer: Tokenizer, specials: dict[str, int]):
        self.tokenizer, self.specials = tokenizer, dict(specials)
        self.size = max(tokenizer.vocab_size, max(specials.values()) + 1)
        self.pad_id, self.cls_id, self.mask_id = specials["[PAD]"], specials["[CLS]"], specials["[MASK]"]
        self.special_ids = torch.tensor(sorted(specials.values()))
        self.regular_ids = torch.tensor([i for i in range(self.size) if i not in set(specials.values())])

    @classmethod
    def train(cls, kind: str, text: str, vocab_size: int) -> Vocabulary:
        if kind == "char":
            tokenizer = make_tokenizer("char", text)
            return cls(tokenizer, {t: tokenizer.vocab_size + i for i, t in enumerate(SPECIAL_TOKENS)})
        tokenizer = make_tokenizer("bpe", text, vocab_size, SPECIAL_TOKENS)
        return cls(tokenizer, {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS})

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def save(self, directory: Path) -> None:
        self.tokenizer.save(directory)
        (directory / SPECIALS_FILE).write_text(json.dumps(self.specials, indent=1) + "\n")

    @classmethod
    def load(cls, directory: Path) -> Vocabulary:
        return cls(load_tokenizer(directory), json.loads((directory / SPECIALS_FILE).read_text()))


def mask_tokens(ids: Tensor, generator: torch.Generator, vocabulary: Vocabulary, *, mask_prob: float = 0.15,
                mask_token_prob: float = 0.8, random_token_prob: float = 0.1,
                attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """BERT's corruption of ids (batch, time) -> (inputs, targets).

    Each token that is neither padding (attention_mask 0) nor a special token is selected independently with
    probability `mask_prob`; a selected token becomes [MASK] with probability `mask_token_prob`, a random regular
    token with probability `random_token_prob`, and stays otherwise. targets hold the original id at the selected
    positions and -100 (ignored by the loss) everywhere else.
    """
    eligible = ~torch.isin(ids, vocabulary.special_ids)
    if attention_mask is not None:
        eligible &= attention_mask.bool()
    selected = eligible & (torch.rand(ids.shape, generator=generator) < mask_prob)
    how = torch.rand(ids.shape, generator=generator)  # which of the three corruptions a selected token gets
    to_mask = selected & (how < mask_token_prob)
    to_random = selected & (how >= mask_token_prob) & (how < mask_token_prob + random_token_prob)
    random_ids = vocabulary.regular_ids[torch.randint(len(vocabulary.regular_ids), ids.shape, generator=generator)]
    inputs = torch.where(to_mask, vocabulary.mask_id, torch.where(to_random, random_ids, ids))
    return inputs, torch.where(selected, ids, -100)


# ---------------------------------------------------------------------------------------------------------------
# Run configurations (TOML): [model] ModelConfig options, [train] TrainConfig, and the job's own sections


@dataclass
class MLMDataConfig:
    path: str | None = None  # None: Shakespeare's complete works, as for the LM job
    tokenizer: Literal["char", "bpe"] = "bpe"
    vocab_size: int = 2048  # bpe only, special tokens included
    context: int = 128  # tokens per training block
    val_fraction: float = 0.1

    def __post_init__(self) -> None:
        check_tokenizer(self.tokenizer)
        if self.context < 2:
            raise ValueError(f"data.context must be at least 2, got {self.context}")


@dataclass
class MaskingConfig:
    mask_prob: float = 0.15
    mask_token_prob: float = 0.8
    random_token_prob: float = 0.1

    def __post_init__(self) -> None:
        if not 0 < self.mask_prob < 1:
            raise ValueError(f"masking.mask_prob must be in (0, 1), got {self.mask_prob}")
        if self.mask_token_prob < 0 or self.random_token_prob < 0 or self.mask_token_prob + self.random_token_prob > 1:
            raise ValueError("masking.mask_token_prob and masking.random_token_prob must be non-negative and add up "
                             f"to at most 1, got {self.mask_token_prob} and {self.random_token_prob}")


@dataclass
class ClsDataConfig:
    path: str | None = None  # a TSV file of text<TAB>label lines (required)
    tokenizer: Literal["char", "bpe"] = "char"  # when not starting from an MLM run
    vocab_size: int = 1024
    max_tokens: int = 128  # [CLS] + text, longer texts are cut
    dev_fraction: float = 0.1
    init: str | None = None  # an MLM run directory whose encoder and tokenizer to start from

    def __post_init__(self) -> None:
        check_tokenizer(self.tokenizer)
        if not 0 < self.dev_fraction < 1:
            raise ValueError(f"data.dev_fraction must be in (0, 1), got {self.dev_fraction}")
        if self.max_tokens < 2:
            raise ValueError(f"data.max_tokens must be at least 2 ([CLS] and one token), got {self.max_tokens}")


@dataclass
class HeadConfig:
    pooling: Literal["first", "mean"] = "mean"


SECTIONS = {"mlm": {"data": MLMDataConfig, "masking": MaskingConfig},
            "cls": {"data": ClsDataConfig, "head": HeadConfig}}


@dataclass
class EncoderRunConfig:
    """A whole MLM or classification job: `model` holds ModelConfig options except vocab_size."""

    task: Literal["mlm", "cls"]
    model: dict[str, Any]
    train: TrainConfig
    sections: dict[str, Any] = field(default_factory=dict)  # the job's own sections, by name (SECTIONS[task])

    @property
    def data(self) -> MLMDataConfig | ClsDataConfig:
        return self.sections["data"]

    @property
    def masking(self) -> MaskingConfig:
        return self.sections["masking"]

    @property
    def head(self) -> HeadConfig:
        return self.sections["head"]

    @classmethod
    def from_dict(cls, task: str, values: dict[str, Any]) -> EncoderRunConfig:
        values = {k: v for k, v in values.items() if k not in ("task", "labels")}  # as written into run.toml
        known = {"model", "train", *SECTIONS[task]}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown section(s) {unknown} in the {task} run config; use {sorted(known)}")
        if "train" not in values:
            raise ValueError("the run config needs a [train] section with at least steps and batch_size")
        sections = {name: build_section(kind, values.get(name, {}), name) for name, kind in SECTIONS[task].items()}
        return cls(task, dict(values.get("model", {})), TrainConfig.from_dict(values["train"]), sections)

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "model": self.model, "train": self.train.to_dict(),
                **{name: asdict(section) for name, section in self.sections.items()}}


def check_tokenizer(kind: str) -> None:
    if kind not in ("char", "bpe"):
        raise ValueError(f"data.tokenizer must be 'char' or 'bpe', got {kind!r}")


def build_section(cls: type, values: dict[str, Any], section: str) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} in [{section}]; valid options are {sorted(known)}")
    return cls(**values)


def load_run_config(task: str, path: str | Path, overrides: list[str] = ()) -> EncoderRunConfig:
    """Read a TOML run config and apply `section.key=value` overrides (as `kqv train lm --set` does)."""
    return EncoderRunConfig.from_dict(task, read_config_values(path, overrides, f"configs/{task}-*.toml"))


def write_run_config(run_dir: Path, config: EncoderRunConfig, model_config: ModelConfig,
                     **extra: dict[str, Any]) -> None:
    values = {**config.to_dict(), "model": model_config.to_dict(), **extra}
    (run_dir / RUN_CONFIG).write_text(toml_text(values))


def read_run(run_dir: str | Path, task: str) -> tuple[dict[str, Any], ModelConfig]:
    """The run.toml of a run of `task` and the exact ModelConfig it trained."""
    path = Path(run_dir) / RUN_CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a kqv run: {path} is missing; train one with "
                                f"`kqv train {task} --out {run_dir}`")
    values = tomllib.loads(path.read_text())
    if values.get("task") != task:
        raise ValueError(f"{run_dir} is a run of task {values.get('task', 'lm')!r}, not {task!r}")
    return values, ModelConfig.from_dict(values["model"])


def make_trainer(model: torch.nn.Module, config: EncoderRunConfig, run_dir: Path, resume: bool, overwrite: bool,
                 quiet: bool, **functions: Any) -> Trainer:
    return Trainer(model, config.train, run_dir, quiet=quiet, **functions,
                   if_exists="resume" if resume else ("overwrite" if overwrite else "error"))


def batch_generator(seed: int, i: int) -> torch.Generator:
    """The generator of batch i: the same batch for the same i, as the trainer's determinism contract asks."""
    return torch.Generator().manual_seed(seed * 1_000_003 + i)


# ---------------------------------------------------------------------------------------------------------------
# Masked-language-model pretraining


def prepare_mlm_data(config: EncoderRunConfig, run_dir: Path, resume: bool) -> tuple[Vocabulary, dict[str, Tensor]]:
    """The vocabulary and encoded splits: loaded from the run when resuming, else built and saved."""
    if resume and (run_dir / TOKENS_FILE).exists():
        return Vocabulary.load(run_dir / TOKENIZER_DIR), load_file(run_dir / TOKENS_FILE)
    data = config.data
    text = load_text(data.path)
    train_text, val_text = split_text(text, data.val_fraction)
    vocabulary = Vocabulary.train(data.tokenizer, text if data.tokenizer == "char" else train_text, data.vocab_size)
    tokens = {"train": encode(vocabulary.tokenizer, train_text), "val": encode(vocabulary.tokenizer, val_text)}
    run_dir.mkdir(parents=True, exist_ok=True)
    vocabulary.save(run_dir / TOKENIZER_DIR)
    save_file(tokens, run_dir / TOKENS_FILE)
    return vocabulary, tokens


@torch.no_grad()
def masked_accuracy(model: torch.nn.Module, batches: list[tuple[Tensor, Tensor]]) -> dict[str, float]:
    """Accuracy at the masked positions, and that of always answering the most frequent token there."""
    correct, answers = 0, []
    for inputs, targets in batches:
        masked = targets != -100
        correct += int((model(inputs).argmax(dim=-1)[masked] == targets[masked]).sum())
        answers.append(targets[masked])
    answers = torch.cat(answers)
    most_frequent = int(answers.mode().values)
    return {"masked_accuracy": correct / len(answers),
            "unigram_accuracy": float((answers == most_frequent).float().mean()), "masked_tokens": len(answers)}


def train_mlm(config: EncoderRunConfig, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
              quiet: bool = False) -> dict[str, Any]:
    """Pretrain a `MaskedLM` as configured; write the run directory and return the summary."""
    run_dir = Path(run_dir)
    if resume:
        read_checkpoint(run_dir)  # a clear error before any work if there is nothing to resume
    vocabulary, tokens = prepare_mlm_data(config, run_dir, resume and not overwrite)
    context, seed, batch = config.data.context, config.train.seed, config.train.batch_size
    model_config = ModelConfig.from_dict({"max_len": context, **config.model, "vocab_size": vocabulary.size})
    write_run_config(run_dir, config, model_config)
    torch.manual_seed(seed)
    model = MaskedLM(model_config)
    masking = asdict(config.masking)
    hidden = {**masking, "mask_token_prob": 1.0, "random_token_prob": 0.0}  # evaluation: every selected token hidden

    def blocks(ids: Tensor, generator: torch.Generator) -> Tensor:
        return sample_batch(ids, batch, context, generator)[0]  # (batch, context): the inputs, not the next tokens

    def train_batches(i: int) -> tuple[Tensor, Tensor]:
        generator = batch_generator(seed, i)
        return mask_tokens(blocks(tokens["train"], generator), generator, vocabulary, **masking)

    def val_batches(i: int) -> tuple[Tensor, Tensor]:
        generator = batch_generator(seed, -i - 1)
        return mask_tokens(blocks(tokens["val"], generator), generator, vocabulary, **hidden)

    def loss_fn(model: torch.nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        inputs, targets = batch
        return model(inputs, targets)

    evaluation = [val_batches(i) for i in range(config.train.eval_batches)]
    if not quiet:
        print(f"kqv: {count_parameters(model):,} parameters, {len(tokens['train']):,} training tokens "
              f"({config.data.tokenizer} tokenizer, vocabulary {vocabulary.size}), run directory {run_dir}")
    trainer = make_trainer(model, config, run_dir, resume, overwrite, quiet, train_batches=train_batches,
                           loss_fn=loss_fn, val_batches=val_batches, tokens_per_batch=batch * context,
                           eval_fn=lambda model: masked_accuracy(model, evaluation))
    started = time.perf_counter()
    final = trainer.train()
    summary = {"steps": trainer.step, "train_seconds": round(time.perf_counter() - started, 1),
               "parameters": count_parameters(model), "final_train_loss": final.get("train_loss"),
               "final_val_loss": final.get("val_loss"), "masked_accuracy": final.get("masked_accuracy"),
               "unigram_accuracy": final.get("unigram_accuracy"), "masked_tokens": int(final.get("masked_tokens", 0))}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if not quiet:
        print(f"kqv: masked-token accuracy {summary['masked_accuracy']:.1%} on {summary['masked_tokens']:,} "
              f"hidden validation tokens (always answering the most frequent one: "
              f"{summary['unigram_accuracy']:.1%}) after {trainer.step} steps in "
              f"{summary['train_seconds'] / 60:.1f} min")
    return summary


@dataclass
class MLMRun:
    model: MaskedLM
    vocabulary: Vocabulary
    run_dir: Path


def load_mlm_run(run_dir: str | Path) -> MLMRun:
    """A trained MLM run: its model (weights from safetensors) and vocabulary."""
    run_dir = Path(run_dir)
    _, model_config = read_run(run_dir, "mlm")
    model = MaskedLM(model_config)
    load_weights(model, run_dir)
    return MLMRun(model.eval(), Vocabulary.load(run_dir / TOKENIZER_DIR), run_dir)


# ---------------------------------------------------------------------------------------------------------------
# Sequence classification


def read_tsv(path: str | Path) -> list[tuple[str, str]]:
    """(text, label) pairs of a file of `text<TAB>label` lines; blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no TSV file at {path}; give one with --data (lines of text<TAB>label)")
    examples = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        text, tab, label = line.rpartition("\t")
        if not tab or not text.strip() or not label.strip():
            raise ValueError(f"{path}:{number}: expected text<TAB>label, got {line[:60]!r}")
        examples.append((text.strip(), label.strip()))
    if len(examples) < 2:
        raise ValueError(f"{path} has {len(examples)} example(s); a train and a dev split need at least 2")
    return examples


def split_examples(examples: list, dev_fraction: float, seed: int) -> tuple[list, list]:
    """A deterministic shuffle, then the first `dev_fraction` (at least one example) is the dev set."""
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed)).tolist()
    n_dev = min(max(1, round(dev_fraction * len(examples))), len(examples) - 1)
    return [examples[i] for i in order[n_dev:]], [examples[i] for i in order[:n_dev]]


def pad_batch(sequences: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """(ids, attention_mask), each (batch, longest), right-padded."""
    longest = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    mask = torch.zeros(len(sequences), longest, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, :len(sequence)], mask[row, :len(sequence)] = torch.tensor(sequence), 1
    return ids, mask


def train_cls(config: EncoderRunConfig, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
              quiet: bool = False) -> dict[str, Any]:
    """Fine-tune (or train from scratch) a `SequenceClassifier` on a TSV file; return the summary."""
    run_dir, data = Path(run_dir), config.data
    if data.path is None:
        raise ValueError("kqv train cls needs a TSV file of text<TAB>label lines: pass --data file.tsv")
    if resume:
        read_checkpoint(run_dir)
    examples = read_tsv(data.path)
    train, dev = split_examples(examples, data.dev_fraction, config.train.seed)
    labels = sorted({label for _, label in examples})
    if len(labels) < 2:
        raise ValueError(f"{data.path} has only the label {labels}; classification needs at least two")
    pretrained = load_mlm_run(data.init) if data.init else None
    if pretrained is not None:
        vocabulary = pretrained.vocabulary
        model_config = pretrained.model.config.replace(**{k: v for k, v in config.model.items() if k == "dropout"})
    elif resume and (run_dir / TOKENIZER_DIR).exists():
        vocabulary = Vocabulary.load(run_dir / TOKENIZER_DIR)
        model_config = read_run(run_dir, "cls")[1]
    else:
        texts = [text for text, _ in (examples if data.tokenizer == "char" else train)]  # chars: all, or dev fails
        vocabulary = Vocabulary.train(data.tokenizer, "\n".join(texts), data.vocab_size)
        model_config = ModelConfig.from_dict({"max_len": data.max_tokens, **config.model,
                                              "vocab_size": vocabulary.size})
    max_tokens = min(data.max_tokens, model_config.max_len) if model_config.position == "learned" else data.max_tokens
    run_dir.mkdir(parents=True, exist_ok=True)
    vocabulary.save(run_dir / TOKENIZER_DIR)
    write_run_config(run_dir, config, model_config, labels={"names": labels})
    torch.manual_seed(config.train.seed)
    model = SequenceClassifier(model_config, len(labels), config.head.pooling)
    if pretrained is not None:
        model.encoder.load_state_dict(pretrained.model.encoder.state_dict())

    def encode_examples(part: list[tuple[str, str]]) -> tuple[list[list[int]], Tensor]:
        ids = [[vocabulary.cls_id, *vocabulary.encode(text)[:max_tokens - 1]] for text, _ in part]
        return ids, torch.tensor([labels.index(label) for _, label in part])

    train_ids, train_labels = encode_examples(train)
    dev_ids, dev_labels = encode_examples(dev)
    batch, seed = config.train.batch_size, config.train.seed

    def take(ids: list[list[int]], targets: Tensor, rows: list[int]) -> tuple[Tensor, Tensor, Tensor]:
        return (*pad_batch([ids[r] for r in rows], vocabulary.pad_id), targets[rows])

    def train_batches(i: int) -> tuple[Tensor, Tensor, Tensor]:
        rows = torch.randint(len(train_ids), (batch,), generator=batch_generator(seed, i)).tolist()
        return take(train_ids, train_labels, rows)

    def val_batches(i: int) -> tuple[Tensor, Tensor, Tensor]:
        start = (i * batch) % len(dev_ids)
        return take(dev_ids, dev_labels, [(start + j) % len(dev_ids) for j in range(batch)])

    def loss_fn(model: torch.nn.Module, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        ids, attention_mask, targets = batch
        return model(ids, targets, attention_mask=attention_mask)

    majority = Counter(train_labels.tolist()).most_common(1)[0][0]

    @torch.no_grad()
    def accuracy(model: torch.nn.Module) -> dict[str, float]:
        correct = 0
        for start in range(0, len(dev_ids), batch):
            rows = list(range(start, min(start + batch, len(dev_ids))))
            ids, attention_mask, targets = take(dev_ids, dev_labels, rows)
            correct += int((model(ids, attention_mask=attention_mask).argmax(dim=-1) == targets).sum())
        return {"dev_accuracy": correct / len(dev_ids),
                "majority_accuracy": float((dev_labels == majority).float().mean())}

    if not quiet:
        start = "the encoder of " + str(data.init) if pretrained is not None else "scratch"
        print(f"kqv: {count_parameters(model):,} parameters from {start}, {len(train)} training and {len(dev)} dev "
              f"examples, {len(labels)} labels, run directory {run_dir}")
    trainer = make_trainer(model, config, run_dir, resume, overwrite, quiet, train_batches=train_batches,
                           loss_fn=loss_fn, val_batches=val_batches, eval_fn=accuracy)
    started = time.perf_counter()
    final = trainer.train()
    summary = {"steps": trainer.step, "train_seconds": round(time.perf_counter() - started, 1),
               "parameters": count_parameters(model), "train_examples": len(train), "dev_examples": len(dev),
               "labels": labels, "final_train_loss": final.get("train_loss"), "final_val_loss": final.get("val_loss"),
               "dev_accuracy": final.get("dev_accuracy"), "majority_accuracy": final.get("majority_accuracy")}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if not quiet:
        print(f"kqv: dev accuracy {summary['dev_accuracy']:.1%} on {len(dev)} examples (majority class: "
              f"{summary['majority_accuracy']:.1%}) after {trainer.step} steps in "
              f"{summary['train_seconds'] / 60:.1f} min")
    return summary
