"""The language-modelling job: text -> tokenizer -> `DecoderLM` -> trainer -> samples and perplexity.

A run directory holds everything needed to use the model later, and nothing that needs code to be executed to
load: `run.toml` (the whole configuration), `tokenizer/`, `tokens.safetensors` (the encoded splits, so resuming
is exact and quick), `checkpoint/`, `metrics.jsonl`, `loss.png`, `samples.txt` and `summary.json`.
`kqv generate`, `kqv eval` and `kqv attention` use it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from safetensors.torch import load_file, save

from ..data.batches import batch_generator, sample_batch
from ..data.shakespeare import load_text, split_text
from ..data.tokenizers import Tokenizer, encode_text, make_tokenizer
from ..errors import ConfigError, DataError, spoken
from ..nn.config import ModelConfig
from ..nn.models import DecoderLM, check_ids, count_parameters
from ..train.evaluation import perplexity
from ..train.checkpoints import write_atomically
from ..train.rundir import RunDirectory
from ..train.runs import SAMPLES_FILE, TOKENS_FILE, RunConfig
from ..validation import Config, check_at_least
from .base import Flag, Job, RunCommand, TrainedRun, report


@dataclass
class DataConfig(Config):
    """Where the text comes from and how it becomes training blocks."""

    section: ClassVar[str] = "data"
    path: str | None = None  # None: Shakespeare's complete works, the embedded default corpus
    tokenizer: Literal["char", "bpe"] = "char"
    vocab_size: int = 4096  # bpe only
    context: int = 256
    val_fraction: float = 0.1

    def check(self) -> None:
        if self.context < 2:
            raise ConfigError(f"data.context must be at least 2, got {self.context}")
        if not 0 < self.val_fraction <= 0.5:
            raise ConfigError(f"data.val_fraction must be in (0, 0.5], got {self.val_fraction}")


@dataclass
class SampleConfig(Config):
    """What to generate at the end of training, to see what the model learned."""

    section: ClassVar[str] = "sample"
    prompt: str = "\n"
    count: int = 3
    max_new_tokens: int = 300
    temperature: float = 0.8
    top_k: int | None = 40

    def check(self) -> None:  # here, not after training: a bad [sample] would waste the whole run
        for name in ("count", "max_new_tokens", *(("top_k",) if self.top_k is not None else ())):
            check_at_least(self.qualified(name), getattr(self, name), 1)
        if self.temperature < 0:
            raise ConfigError(f"sample.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not self.prompt:
            raise ConfigError("sample.prompt is empty; give at least one character, e.g. \"ROMEO:\\n\"")


@dataclass
class LMRunConfig(RunConfig):
    """The whole job: `model` is the ModelConfig (its vocab_size decided by the tokenizer; max_len defaults to
    data.context)."""

    task: ClassVar[str] = "lm"
    data: DataConfig = field(default_factory=DataConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)

    def model_defaults(self) -> dict[str, Any]:
        return {"max_len": self.data.context}

    def check(self) -> None:
        model = self.model
        if model.position == "learned" and model.max_len < self.data.context:
            raise ConfigError(f"model.max_len ({model.max_len}) is shorter than data.context ({self.data.context}), "
                              f"which learned positions cannot cover; raise max_len or drop it (it defaults to the "
                              f"context)")

    def model_config(self, vocab_size: int) -> ModelConfig:
        return self.model.replace(vocab_size=vocab_size)


def prepare_corpus(job: Job, data: Any, run: RunDirectory) -> tuple[Any, dict[str, torch.Tensor]]:
    """The tokenizer and encoded splits of a text corpus (`data`: a [data] section with path, tokenizer and
    val_fraction): loaded from the run when it resumes a checkpoint (they were written before it), else built
    with the job's `make_tokenizer` and saved (by rank 0 alone under torchrun). The LM and MLM jobs share it."""
    if run.resuming and (run.path / TOKENS_FILE).exists():
        return job.load_tokenizer(run.path), load_file(run.path / TOKENS_FILE)
    text = load_text(data.path)
    train_text, val_text = split_text(text, data.val_fraction)
    tokenizer = job.make_tokenizer(data, text if data.tokenizer == "char" else train_text)
    tokens = {"train": encode_text(tokenizer, train_text), "val": encode_text(tokenizer, val_text),
              "chars": torch.tensor([len(train_text), len(val_text)])}
    if run.writes:
        run.path.mkdir(parents=True, exist_ok=True)
        tokenizer.save(run.tokenizer_dir)
        write_atomically(run.path / TOKENS_FILE, save(tokens))  # present means complete, tokenizer too
    return tokenizer, tokens


def write_samples(model: DecoderLM, tokenizer: Tokenizer, sample: SampleConfig, path: Path) -> list[str]:
    generator = torch.Generator().manual_seed(0)
    texts = [generate_text(model, tokenizer, sample.prompt, sample.max_new_tokens, temperature=sample.temperature,
                           top_k=sample.top_k, generator=generator) for _ in range(sample.count)]
    path.write_text("\n\n=====\n\n".join(texts) + "\n")
    return texts


def generate_text(model: DecoderLM, tokenizer: Tokenizer, prompt: str, max_new_tokens: int, **options: Any) -> str:
    """The prompt and its continuation, as text."""
    if not prompt:
        example = spoken("--prompt 'ROMEO:'", "prompt='ROMEO:'")
        raise DataError(f"the prompt is empty; give at least one character (e.g. {example})")
    ids = torch.tensor([tokenizer.encode(prompt)])
    config = model.config
    if config.position == "learned":
        max_new_tokens = min(max_new_tokens, config.max_len - ids.shape[1] + 1)
    model.eval()
    return tokenizer.decode(model.generate(ids, max_new_tokens, **options)[0].tolist())


GENERATION_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "int8": torch.qint8}
JSON_FLAG = Flag("--json", "also print the result as JSON", options={"action": "store_true"})
OUT_PNG_FLAG = Flag("--out", "the PNG file to write", options={"default": "attention.png"})
TEXT_DATA_FLAG = Flag("--data", "a text file or directory of .txt files instead of Shakespeare", "data.path")


class LMJob(Job):
    """`kqv train lm`: a decoder-only language model; `kqv generate|eval|attention` on its runs."""

    name = "lm"
    help = "train a GPT-style language model (default: Shakespeare, quick config)"
    config_class = LMRunConfig
    train_flags = (TEXT_DATA_FLAG,)
    commands = {
        "generate": RunCommand("continue a prompt with a trained LM", "generate", (
            Flag("--prompt", "the text to continue", options={"required": True}),
            Flag("--max-new-tokens", "tokens to generate", options={"type": int, "default": 300}),
            Flag("--temperature", "0 = greedy", options={"type": float, "default": 0.8}),
            Flag("--top-k", "sample among the k most likely tokens", options={"type": int}),
            Flag("--top-p", "sample among the most likely tokens of total probability p", options={"type": float}),
            Flag("--count", "how many continuations", options={"type": int, "default": 1}),
            Flag("--seed", "seed of the sampling generator", options={"type": int, "default": 0}),
            Flag("--no-cache", "recompute the whole prefix each step", options={"action": "store_true"}),
            Flag("--dtype", "weights' precision while generating: bf16 reads half the bytes per token, int8 (torch's "
                            "dynamic quantisation of the linear layers) a quarter (default fp32)",
                 options={"choices": sorted(GENERATION_DTYPES), "default": "fp32"}))),
        "eval": RunCommand("perplexity and bits per character", "evaluate", (
            Flag("--data", "a text file to score instead of the held-out split"),
            Flag("--max-tokens", "score only this many tokens", options={"type": int}), JSON_FLAG)),
        "attention": RunCommand("draw the self-attention maps of every layer and head", "attention", (
            Flag("--text", "the text whose self-attention to draw"), OUT_PNG_FLAG)),
    }

    def make_tokenizer(self, data: DataConfig, text: str) -> Tokenizer:
        return make_tokenizer(data.tokenizer, text, data.vocab_size)

    def build_model(self, model_config: ModelConfig, config: RunConfig, values: dict[str, Any]) -> DecoderLM:
        return DecoderLM(model_config)

    def train(self, config: LMRunConfig, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
              quiet: bool = False) -> dict[str, Any]:
        """Train a DecoderLM as configured, write samples and a summary into run_dir, and return the summary."""
        with self.open_run(run_dir, resume=resume, overwrite=overwrite) as run:
            tokenizer, tokens = prepare_corpus(self, config.data, run)
            model = self.start(config, run, config.model_config(tokenizer.vocab_size))
            train_ids, val_ids = tokens["train"], tokens["val"]
            batch, context, seed = config.train.batch_size, config.data.context, config.train.seed

            def train_batches(i: int) -> tuple[torch.Tensor, torch.Tensor]:
                return sample_batch(train_ids, batch, context, batch_generator(seed, i))

            def val_batches(i: int) -> tuple[torch.Tensor, torch.Tensor]:
                return sample_batch(val_ids, batch, context, batch_generator(seed, -i - 1))

            quiet = quiet or not run.writes  # under torchrun rank 0 speaks for every process
            if not quiet:
                print(f"kqv: {count_parameters(model):,} parameters, {len(train_ids):,} training tokens "
                      f"({config.data.tokenizer} tokenizer, vocabulary {tokenizer.vocab_size}), run directory "
                      f"{run.path}")
            result = self.fit(self.make_trainer(model, config, run, quiet=quiet, train_batches=train_batches,
                                                loss_fn=lambda model, batch: model(*batch), val_batches=val_batches,
                                                tokens_per_batch=batch * context))
            if not run.writes:
                return {}  # under torchrun rank 0 alone evaluates and writes the run's outputs
            val = perplexity(model, val_ids, context=context, n_chars=int(tokens["chars"][1]),
                             precision=config.train.precision, max_tokens=200_000)
            samples = write_samples(model, tokenizer, config.sample, run.path / SAMPLES_FILE)
            summary = self.summarise(run.path, result, model, val=val)
        if not quiet:
            print(f"kqv: validation loss {val['loss']:.3f} nats/token ({val.get('bits_per_char', float('nan')):.3f} "
                  f"bits/char) after {summary['steps']} steps in {result.wall_seconds / 60:.1f} min\n"
                  f"--- sample ---\n{samples[0]}\n--- end of sample ---")
        return summary

    # -- commands on a trained run ---------------------------------------------------------------------------

    def generate(self, run: TrainedRun, args: argparse.Namespace) -> None:
        generator = torch.Generator().manual_seed(args.seed)
        for i in range(args.count):
            text = generate_text(run.model, run.tokenizer, args.prompt, args.max_new_tokens,
                                 temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                 use_cache=not args.no_cache, generator=generator,
                                 dtype=GENERATION_DTYPES[args.dtype])
            print(text if args.count == 1 else f"--- sample {i + 1} ---\n{text}")

    def evaluate(self, run: TrainedRun, args: argparse.Namespace) -> None:
        if args.data is not None:
            text = load_text(args.data)
            ids, n_chars, source = encode_text(run.tokenizer, text), len(text), args.data
        else:
            tokens = load_file(run.run_dir / TOKENS_FILE)
            ids, n_chars, source = tokens["val"], int(tokens["chars"][1]), "the held-out validation split"
        result = perplexity(run.model, ids, context=run.config.data.context, n_chars=n_chars,
                            max_tokens=args.max_tokens)
        report(f"{source}: {result['tokens']:,} tokens, loss {result['loss']:.4f} nats/token, perplexity "
               f"{result['perplexity']:.3f}, {result['bits_per_char']:.4f} bits/char", result, args.json)

    def attention(self, run: TrainedRun, args: argparse.Namespace) -> None:
        if args.text is None:
            raise ConfigError("kqv attention on a language model needs --text")
        ids = run.tokenizer.encode(args.text)
        if not ids:
            raise DataError("--text is empty; give the text whose attention to draw")
        ids_tensor = torch.tensor([ids])
        check_ids(ids_tensor, run.model.config.vocab_size)
        with torch.no_grad():
            weights = run.model.attention_weights(ids_tensor)
        tokens = [run.tokenizer.decode([i]) for i in ids]
        path = self.draw_attention(weights, tokens, tokens, args.out, f"{run.run_dir}: self-attention")
        print(f"wrote {path}: {len(weights)} layers x {weights[0].shape[1]} heads over {len(ids)} tokens")


JOB = LMJob()
load_run_config, read_run_config, load_run, train_lm = JOB.load_config, JOB.read_config, JOB.load, JOB.train
