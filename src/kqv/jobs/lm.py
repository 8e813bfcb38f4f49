"""The language-modelling job: text -> tokenizer -> `DecoderLM` -> trainer -> samples and perplexity.

A run directory holds everything needed to use the model later, and nothing that needs code to be executed to
load: `run.toml` (the whole configuration), `tokenizer/`, `tokens.safetensors` (the encoded splits, so resuming
is exact and quick), `checkpoint/`, `metrics.jsonl`, `loss.png`, `samples.txt` and `summary.json`.
`kqv generate`, `kqv eval` and `kqv attention` use it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ..data.documents import mask_symbol
from ..data.shakespeare import load_text
from ..data.tokenizers import Tokenizer, encode_text
from ..errors import (
    INIT_SOURCE,
    MAX_TOKENS,
    MERGE,
    PREPARE_TOKENIZER,
    TEXT,
    TRAIN_ON_TEXT,
    ConfigError,
    DataError,
    option,
)
from ..nn.config import ModelConfig
from ..nn.devices import model_device
from ..nn.lora import is_adapted, merge_lora
from ..nn.models import DecoderLM, check_ids
from ..train.checkpoints import partial_loader
from ..train.options import TrainerOptions
from ..train.perplexity import perplexity
from ..train.preflight import check_memory
from ..train.runs import RunConfig, override_key, read_run
from ..validation import check_at_least
from .base import AttentionMaps, Job, Outcome, TrainedRun, Training, check_text, total_parameters
from .finetune import FINETUNE_CONTEXT, FinetuneConfig, FineTuneStart, fit_context
from .init import SourceTokenizer, finetune_config, load_source_weights, read_source
from .lm_corpus import SCORED_TOKENS, Check, Corpus, LMTokenizerSource, LoadedCorpus
from .lm_data import DataConfig
from .lm_kinds import corpus_of, data_may_move, kind_of_path
from .offers import Completes, Evaluates, ExportsHF, Generates, ShowsAttention
from .run_tokens import describe_corpus
from .sampling import Continues, SampleConfig, save_samples
from .scoring import PairsEvaluation, check_pairs_alone, evaluate_pairs


def with_prompt(config: LMRunConfig, corpus: LoadedCorpus) -> LMRunConfig:
    """`config` with its sample prompt decided: the one it gives, or its `corpus`'s (`LoadedCorpus.sample_prompt`;
    a corpus of examples samples from their own prompts: nothing to decide)."""
    prompt = None if config.sample.prompt else corpus.sample_prompt()
    if prompt is None:
        return config
    decided = copy.copy(config)
    decided.sample = replace(config.sample, prompt=prompt)
    return decided


@dataclass
class LMRunConfig(RunConfig):
    """The whole job: `model` is the ModelConfig (its vocab_size decided by the tokenizer; max_len defaults to
    data.context)."""

    task: ClassVar[str] = "lm"
    run_tables: ClassVar[tuple[str, ...]] = ("source",)  # a fine-tune's source (kqv.jobs.init.Source.record)
    data: DataConfig = field(default_factory=DataConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)  # what a fine-tune trains (kqv.jobs.finetune)

    def __post_init__(self) -> None:
        # a fine-tune's data.context that no [data] table or --set gives: FINETUNE_CONTEXT, lowered to its source's
        # positions once the source is read (`fit_context`); one given is kept, and refused if the source's learned
        # positions cannot hold it
        data = self.data
        self.context_given = not isinstance(data, dict) or "context" in data
        if not self.context_given and data.get("init") is not None:
            self.data = {**data, "context": FINETUNE_CONTEXT}
        super().__post_init__()

    def model_defaults(self) -> dict[str, Any]:
        return {"max_len": self.data.context}

    @property
    def corpus(self) -> Corpus:
        """What the run trains on (`kqv.jobs.lm_kinds.corpus_of`), made once from its [data] settings by `check`,
        and again when they are replaced (a fine-tune's context fitted to its source)."""
        if self.made_corpus.data is not self.data:
            self.made_corpus = corpus_of(self.data)
        return self.made_corpus

    def check(self) -> None:
        self.made_corpus = corpus_of(self.data)  # refuses at once the settings its kind does not take
        adaptation = self.finetune.adaptation
        if adaptation.active and self.data.init is None:
            raise ConfigError(
                f"the [finetune] options ({adaptation.describe()}) fine-tune a trained model: give the model to "
                f"start from with {option(INIT_SOURCE)} (a kqv LM run or a GPT-2 directory)"
            )
        model = self.model
        if model.position == "learned" and model.max_len < self.data.context:
            raise ConfigError(
                f"model.max_len ({model.max_len}) is shorter than data.context ({self.data.context}), "
                f"which learned positions cannot cover; raise max_len or drop it (it defaults to the "
                f"context)"
            )

    def model_config(self, vocab_size: int) -> ModelConfig:
        return self.model.replace(vocab_size=vocab_size)

    def starting_from(self, init: str) -> LMRunConfig:
        """A checked copy that fine-tunes `init` (data.init), as if its [data] table had named it: a context the
        config does not give becomes FINETUNE_CONTEXT (then fitted to the source, `fit_context`)."""
        started = copy.copy(self)
        context = {} if self.context_given else {"context": FINETUNE_CONTEXT}
        started.data = replace(self.data, init=init, **context)
        started.check()
        return started


def check_lm_run(config: LMRunConfig, processes: int, model: ModelConfig | None = None) -> Check:
    """What an LM training checks once its tokenizer and data exist, before it writes anything: the memory of
    one process's rows of a batch (of `processes`; of `model`, default the config's: a fine-tune's is its
    source's), a block of context + 1 tokens in each split, and the sample prompt (`kqv.train.preflight`); on
    pairs, that packing suits the model (the examples' lengths were checked as they were encoded)."""

    def check(corpus: LoadedCorpus) -> None:
        context, batch, lora = config.data.context, config.train.batch_size, config.finetune.adaptation.lora
        train = config.train
        check_memory(
            model or config.model, batch, context, corpus.tokenizer.vocab_size, train.device, lora,
            precision=train.precision, processes=processes, parallel=train.parallel,
        )  # fmt: skip
        corpus.check(model or config.model, config.sample.prompt)

    return check


ATTENTION_MAX_TOKENS = 256  # `kqv attention`: one PNG panel per head (the explorer takes the model's context)


def self_attention(
    model: nn.Module, tokenizer: Tokenizer, text: str, max_tokens: int = ATTENTION_MAX_TOKENS
) -> AttentionMaps:
    """The self-attention weights of every layer and head of a `DecoderLM` or an `Encoder` over `text`, rows and
    columns labelled by token. A text of more than `max_tokens` tokens is refused: the maps hold tokens x tokens
    weights per head."""
    check_text(option(TEXT), text)
    check_at_least(option(MAX_TOKENS), max_tokens, 1)
    ids = tokenizer.encode(text)
    if not ids:
        raise DataError(f"{option(TEXT)} is empty; give the text whose attention to draw")
    if len(ids) > max_tokens:
        raise DataError(
            f"{option(TEXT)} is {len(ids):,} tokens, more than {option(MAX_TOKENS)}"
            f"={max_tokens} (the maps hold tokens x tokens weights for each of {model.config.n_layers} "
            f"layers x {model.config.n_heads} heads); shorten the text, or raise the limit"
        )
    ids_tensor = torch.tensor([ids], device=model_device(model))  # (1, tokens)
    check_ids(ids_tensor, model.config.vocab_size)
    with torch.no_grad():
        weights = [w.cpu() for w in model.attention_weights(ids_tensor)]  # per layer (1, heads, tokens, tokens)
    tokens = [tokenizer.decode([i]) for i in ids]
    return AttentionMaps(weights, tokens, tokens)


@dataclass(frozen=True)
class LMEvaluation:
    """What `LMRun.evaluate` measured on `source`: mean loss (nats per next token), its perplexity exp(loss), bits
    per token and per character (None when the characters are unknown), over `tokens` scored tokens."""

    source: str
    loss: float
    perplexity: float
    bits_per_token: float
    tokens: int
    bits_per_char: float | None = None

    def to_dict(self) -> dict[str, float]:
        """The figures as `kqv.train.perplexity.perplexity` gives them (what `kqv eval --json` prints)."""
        figures = {
            "loss": self.loss,
            "perplexity": self.perplexity,
            "bits_per_token": self.bits_per_token,
            "tokens": self.tokens,
        }
        return figures if self.bits_per_char is None else {**figures, "bits_per_char": self.bits_per_char}


def check_max_tokens(max_tokens: int | None) -> None:
    if max_tokens is not None:
        check_at_least(option(MAX_TOKENS), max_tokens, 2)


def evaluate_text(
    model: DecoderLM, tokenizer: Tokenizer, data: str | Path, context: int, max_tokens: int | None = None
) -> LMEvaluation:
    """Loss, perplexity and bits per character of `model` on a text file or directory `data`, scored in blocks of
    `context` tokens (`max_tokens`: only a prefix of that many tokens): `LMRun.evaluate` and a GPT-2 directory's."""
    check_max_tokens(max_tokens)
    text = load_text(data)
    ids = encode_text(tokenizer, text)
    return LMEvaluation(str(data), **perplexity(model, ids, context=context, n_chars=len(text), max_tokens=max_tokens))


LMTraining = Training[LMRunConfig, LoadedCorpus, FineTuneStart]  # `LMJob.train`'s


@dataclass(repr=False)  # TrainedRun.__repr__: the model is too long to print
class LMRun(TrainedRun, Continues, Generates, Completes, Evaluates, ShowsAttention, ExportsHF):
    """A trained language model: continue prompts, score text, and show its self-attention."""

    def evaluate(
        self, data: str | Path | None = None, *, pairs: str | Path | None = None, max_tokens: int | None = None
    ) -> LMEvaluation | PairsEvaluation:
        """Loss, perplexity and bits per character on a text file or directory (`data`), by default on the run's
        held-out validation split (a pair run's: the completions of its validation examples); `max_tokens` scores
        only a prefix of that many tokens (at least 2). With `pairs` (a .tsv or .jsonl file of prompt ->
        completion pairs, each prompt written into the run's `data.template` as in training): the completion loss
        and the exact match of greedy completions, with its 95% interval, and the constant and uniform baselines
        from the answers the run trained on, if any, grouped by their kinds of question (`trained_answers`;
        `PairsEvaluation`)."""
        if pairs is not None:
            check_pairs_alone(data, max_tokens)
            settings, trained = self.config.data, self.trained_answers()
            answers, kinds = trained if trained is not None else (None, None)
            mask = mask_symbol(settings.mask, settings.tokenizer)
            return evaluate_pairs(
                self.model,
                self.tokenizer,
                pairs,
                reference=answers,
                template=settings.template,
                mask=mask,
                reference_kinds=kinds,
            )
        if data is not None and not kind_of_path(data).own_tokenizer:  # a text: scored whole
            return evaluate_text(self.model, self.tokenizer, data, self.config.data.context, max_tokens)
        check_max_tokens(max_tokens)  # what the run held out, as its corpus scores it (`LoadedCorpus.held_out`)
        corpus = self.loaded_corpus if data is None else self.moved_corpus(data)
        return LMEvaluation(**corpus.held_out(self.model, max_tokens))

    @cached_property
    def loaded_corpus(self) -> LoadedCorpus:
        """What the run trained on, as it stored it (`Corpus.trained`: its tokens.safetensors, or the prepared
        corpus it read), read once."""
        return self.config.corpus.trained(self.tokenizer, self.run_dir)

    def moved_corpus(self, path: str | Path) -> LoadedCorpus:
        """The prepared corpus at `path`: the one the run trained on, at its new place (`PreparedCorpus.trained`
        checks that it is the one whose SHA-256 the run recorded), or, for a run of another corpus (a text, pairs,
        a mixture), one prepared with the run's tokenizer. Only what a prepared corpus reads is taken from the
        run's [data]: a pairs run's packing or prompt weight is no setting of it."""
        data = self.config.data
        read = {name: getattr(data, name) for name in ("tokenizer", "vocab_size", "context", "val_fraction")}
        corpus = corpus_of(DataConfig(path=str(path), tokens_sha256=data.tokens_sha256, **read))
        return corpus.trained(self.tokenizer, self.run_dir)

    def trained_answers(self) -> tuple[list[str], list[str]] | None:
        """The completions of the pairs the run trained on and their kinds of question, the baselines' reference: a
        pair run's training examples and their kinds (its tokens.safetensors holds both), or every pair of a
        mixture's pairs files while they are where the run read them; None for a run that trained on no pairs
        (`Corpus.trained_answers`: it reads nothing)."""
        return self.config.corpus.trained_answers(lambda: self.loaded_corpus)

    def attention(self, text: str, *, max_tokens: int = ATTENTION_MAX_TOKENS) -> AttentionMaps:
        """The self-attention weights of every layer and head over `text`, rows and columns labelled by token.
        A text of more than `max_tokens` tokens is refused: the maps hold tokens x tokens weights per head."""
        return self_attention(self.model, self.tokenizer, text, max_tokens)

    def export_hf(self, directory: str | Path, *, merge: bool = False) -> Path:
        """Write the run as a Hugging Face GPT-2, GPT-NeoX or Llama directory, whichever holds its model
        (`kqv.jobs.export.export_hf`): config.json, model.safetensors and the tokenizer, which
        `transformers.AutoModelForCausalLM.from_pretrained` loads with the run's greedy tokens. A configuration no
        format holds (ALiBi, experts, post-LN, ...) is refused, nothing written. A LoRA run is written with its
        adapters merged into its weights (a copy: the run's model stays adapted), which it must be told with
        `merge` (the formats hold plain weights); `merge` changes nothing in a run without adapters."""
        from .export import export_hf

        model = self.model
        if is_adapted(model):
            if not merge:
                raise ConfigError(
                    f"{self.run_dir} is a LoRA fine-tune, and a Hugging Face model holds plain weights; "
                    f"{option(MERGE)} to write its adapters merged into them"
                )
            model = merge_lora(copy.deepcopy(model))
        return export_hf(model, self.tokenizer, directory, self.run_dir)


class LMJob(Job):
    """`kqv train lm`: a decoder-only language model; `kqv generate|eval|attention` on its runs."""

    name = "lm"
    help = "train a GPT-style language model (default: Shakespeare, quick config)"
    config_class = LMRunConfig
    run_class = LMRun
    noun = "language-model"

    def load_config(self, path: str | Path, overrides: list[str] = ()) -> LMRunConfig:
        """`Job.load_config`, refusing a tokenizer option set for a corpus that brings its own (a prepared one),
        which would be ignored."""
        config = super().load_config(path, overrides)
        keys = [override_key(o) for o in overrides]
        given = [key for key in keys if key in ("data.tokenizer", "data.vocab_size")]
        if given and config.corpus.own_tokenizer:
            raise ConfigError(
                f"{given[0]} cannot be set for the prepared corpus {config.data.path}, which was encoded once with "
                f"its own tokenizer; drop it, or prepare the text again with {option(PREPARE_TOKENIZER)}"
            )
        if given and config.data.init is not None:
            raise ConfigError(
                f"{given[0]} cannot be set for a fine-tune of {config.data.init}, which keeps its source's "
                f"tokenizer (the model's embeddings are its tokens'); drop it"
            )
        if "data.sources" in keys and not config.data.sources:
            raise ConfigError(
                "data.sources is empty: a mixture needs at least one source (a text or a file of pairs, with its "
                f"weight); give them, or drop data.sources and give the text with {option(TRAIN_ON_TEXT)}"
            )
        return config

    def may_move(self, key: str, saved: dict[str, Any]) -> bool:
        """A resume may give the run's data a new data.path where its kind of corpus checks the data found there
        (`kqv.jobs.lm_kinds.data_may_move`: a prepared corpus whose tokens' SHA-256 the run recorded)."""
        return key == "data.path" and data_may_move(saved)

    def restore(
        self, model: nn.Module, config: RunConfig, values: dict[str, Any], run_dir: Path
    ) -> Callable[[dict[str, torch.Tensor]], None] | None:
        """A fine-tune whose checkpoint holds part of the model (LoRA's adapters alone): its source's weights
        (checked against the SHA-256 run.toml records) and adapters, into which the checkpoint is loaded."""
        adaptation = config.finetune.adaptation
        if adaptation.saved_weights is None:
            return None
        adaptation.restore(model, values.get("source"), run_dir)
        return partial_loader(model, adaptation.saved_weights)

    def build_model(self, model_config: ModelConfig, config: RunConfig, values: dict[str, Any]) -> DecoderLM:
        return DecoderLM(model_config)

    def make_corpus(self, training: LMTraining) -> LoadedCorpus:
        """The tokenizer and the encoded train and validation splits, as the run's corpus reads them
        (`Corpus.load`); a new tokenizer is the corpus's own, a fine-tune's its source's (`kqv.jobs.init`)."""
        config, run = training.config, training.run
        tokenizers: LMTokenizerSource = config.corpus
        training.handed = start = FineTuneStart()
        if config.data.init is not None and not run.resuming:
            start.source = source = read_source(config.data.init)
            config = fit_context(config, source)  # as `settled` returns it
            start.model = finetune_config(source, config.model, config.model_options, config.data.context)
            config.finetune.adaptation.check(start.model)
            tokenizers = SourceTokenizer(source)
        return config.corpus.load(tokenizers, run, check_lm_run(config, run.topology.world_size, start.model))

    def settled(self, training: LMTraining) -> LMRunConfig:
        """What run.toml records and the samples start from: a fine-tune's config with a context its source holds
        (`fit_context`, as `make_corpus` prepared the data with), its sample prompt decided (`with_prompt`)."""
        config, source = training.config, training.handed.source
        config = config if source is None else fit_context(config, source)
        data = config.corpus.settled_data(training.run)  # a prepared corpus's place, SHA-256 and tokenizer
        if data != config.data:
            config = copy.copy(config)
            config.data = data
        return with_prompt(config, training.data)

    def make_model(self, training: LMTraining) -> DecoderLM:
        """A new model; a fine-tune's has its source's config and weights, and run.toml records the source."""
        config, run, tokenizer = training.config, training.run, training.data.tokenizer
        adaptation, start = config.finetune.adaptation, training.handed
        if start.source is None:  # a resume: the checkpoint has the weights (a LoRA run's: its adapters alone)
            start.record = read_run(run.path)["source"] if config.data.init is not None else None
            extra = {} if start.record is None else {"source": start.record}
            model = self.start(config, run, config.model_config(tokenizer.vocab_size), **extra)
            adaptation.restore(model, start.record, run.path)
        else:
            start.record = start.source.record()
            model = self.start(config, run, start.model, source=start.record)
            load_source_weights(model, start.source)
            adaptation.apply(model)
        return model

    def trainer_options(self, training: LMTraining) -> TrainerOptions:
        """The corpus's batches (`LoadedCorpus.trainer_options`: random blocks of a text, batches of examples). A
        LoRA run's checkpoints hold its adapters alone."""
        config, corpus = training.config, training.data
        return replace(
            corpus.trainer_options(config.train, training.run.topology, training.model.config),
            work_after_training=scoring_cost(config, corpus.val_tokens),
            saved_weights=config.finetune.adaptation.saved_weights,
        )

    def describe(self, training: LMTraining) -> str:
        corpus = training.data
        tokenizer = corpus.tokenizer
        line = describe_corpus(training, tokenizer, tokenizer.vocab_size, corpus.train_tokens) + corpus.describe()
        adaptation = training.config.finetune.adaptation
        if not adaptation.active:
            return line
        return f"{line}; {adaptation.describe()}, of {total_parameters(training.model):,} parameters"

    def outcome(self, training: LMTraining) -> Outcome:
        """The corpus's score of the validation split (`LoadedCorpus.score`: the perplexity of up to
        `SCORED_TOKENS` of a text, the completion loss of held-out examples), and its samples (`LoadedCorpus.samples`),
        written to samples.txt."""
        config, model, corpus = training.config, training.model, training.data
        val, samples = corpus.score(model, config.train), corpus.samples(model, config.sample)
        save_samples(training.run.samples_file, samples)
        record = training.handed.record
        source = {} if record is None else {"source": record}
        adaptation = config.finetune.adaptation
        if adaptation.active:
            source["finetune"] = {**config.finetune.to_dict(), **adaptation.counts(model)}
        return Outcome({"val": val, **source}, samples[:1])

    def conclusion(self, training: LMTraining, summary: dict[str, Any]) -> str:
        """The corpus's reading of its figures (`LoadedCorpus.conclusion`)."""
        return training.data.conclusion(summary["val"], f"after {summary['steps']} steps in {training.result.minutes}")


def scoring_cost(config: LMRunConfig, val_tokens: int) -> float:
    """The job's work after training in evaluations, for a budget's plan: the perplexity of up to 200,000 validation
    tokens (in smaller batches, counted twice) and the samples (counted as two evaluations)."""
    evaluated = config.train.eval_batches * config.train.batch_size * config.data.context
    return 2 * min(val_tokens, SCORED_TOKENS) / evaluated + 2


JOB = LMJob()
load_run_config, read_run_config, load_run, train_lm = JOB.load_config, JOB.read_config, JOB.load, JOB.train
