"""The job contract: what every job (lm, mt, mlm, cls, vit) implements, and what a trained run offers.

A job is a `Job` subclass: it trains through the one lifecycle, `Job.train`, by supplying its corpus, model,
batches and outcome (hooks); it builds its model and loads its runs (`Job.load`) as its
`run_class`, a `TrainedRun` whose methods are the job's operations in plain Python (`LMRun.generate`,
`MTRun.translate`, ...), returning values and printing nothing; the capabilities it offers are the protocols of
`kqv.jobs.offers` it implements. The one registry of jobs is `kqv.jobs.JOBS`;
the command line (`kqv.cli`) parses flags and prints what these operations return.

`docs/architecture.md` shows a new job step by step.
"""

from __future__ import annotations

import dataclasses
import os
import time
import tomllib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import nn

from ..data.tokenizers import Tokenizer, load_tokenizer
from ..data.vocabulary import Vocabulary
from ..errors import (
    OUT,
    OVERWRITE,
    RUN_INPUTS,
    RUN_S_OWN_CONFIG,
    SOURCES,
    STEPS,
    ConfigError,
    DataError,
    DataTypeError,
    option,
)
from ..nn.config import ModelConfig
from ..nn.devices import Accelerator, peak_rss_bytes
from ..nn.models import count_parameters
from ..train.checkpoints import load_weights
from ..train.events import Event, Message, Plan, Sample, Summary
from ..train.files import refuse_writing_over, restored_on_failure
from ..train.layout import RunFiles
from ..train.options import TrainerOptions
from ..train.reporter import Reporter
from ..train.rundir import RunDirectory
from ..train.runs import (
    FIXED_SECTIONS,
    RunConfig,
    comparable,
    differences,
    override_key,
    read_config_values,
    read_run,
    read_summary,
    resumed_values,
    write_run_config,
    write_summary,
)
from ..train.slices import build_for
from ..train.topology import Topology
from ..train.trainer import Trainer
from ..validation import Config
from .offers import Offering

RunTokenizer = Tokenizer | Vocabulary | None  # a run's: text jobs' BPE or characters, the MLM's vocabulary, none (ViT)


@dataclass(frozen=True)
class AttentionMaps:
    """The attention weights of one input, with a label for each row (query) and column (key) token.

    `weights[layer]` is (1, heads, rows, columns); `kind` is "self" (a text over itself) or "cross" (target rows
    over source columns); `translation` is the target a translation run attended with.
    """

    weights: list[torch.Tensor]
    rows: list[str]
    columns: list[str]
    kind: str = "self"
    translation: str | None = None

    @property
    def layers(self) -> int:
        return len(self.weights)

    @property
    def heads(self) -> int:
        return self.weights[0].shape[1]

    def __repr__(self) -> str:
        extra = f", translation={self.translation!r}" if self.translation is not None else ""
        return (
            f"AttentionMaps({self.kind}, {self.layers} layers x {self.heads} heads, {len(self.rows)} rows x "
            f"{len(self.columns)} columns{extra})"
        )


def check_text(name: str, text: object) -> None:
    """Require `text` (an operation's input, `name` in the interface's words) to be a string of Unicode text.

    Bytes that are not UTF-8 on the command line reach Python as lone surrogates ("surrogate escapes"), which no
    tokenizer can encode: refuse them here, naming the first such byte."""
    if not isinstance(text, str):
        raise DataTypeError(f"{name} must be a string, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        char = ord(text[error.start])
        what = f"byte {char - 0xDC00:#04x}" if 0xDC80 <= char <= 0xDCFF else f"the lone surrogate {char:#06x}"
        raise DataError(
            f"{name} is not UTF-8 text: {what} at character {error.start}; give the text in UTF-8 (check the "
            f"encoding of your terminal or file)"
        ) from None


@dataclass
class TrainedRun(Offering):
    """A trained run, loaded: its job, config, model (in eval mode), tokenizer and the whole run.toml. What it can
    do is its job's run class's capabilities (`kqv.jobs.offers`: `LMRun` generates, `MTRun` translates, ...)."""

    job: Job
    config: RunConfig
    model: nn.Module
    tokenizer: RunTokenizer
    run_dir: Path
    values: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        """Its every parameter, and how many of them train when that is fewer (a LoRA run: the adapters)."""
        total, trainable = total_parameters(self.model), count_parameters(self.model)
        trains = f", {trainable:,} trainable" if trainable != total else ""
        return f"{type(self).__name__}({str(self.run_dir)!r}, task={self.job.name!r}, {total:,} parameters{trains})"

    @property
    def place(self) -> Path:
        return self.run_dir

    @property
    def kind(self) -> str:
        return f"{self.job.title} run"


@dataclass
class TrainingResult:
    """What `Job.fit` returns: the trainer (its step and train_seconds), the last metrics, and wall-clock time."""

    trainer: Trainer
    final: dict[str, float]
    wall_seconds: float

    @property
    def minutes(self) -> str:
        """The run's minutes as its progress lines count them (every session of it), and a resumed run's own."""
        run = f"{self.trainer.elapsed_s / 60:.1f} min"
        if self.trainer.resumed_from is None:
            return run
        return (
            f"{run} ({self.wall_seconds / 60:.1f} min in this session, resumed at update {self.trainer.resumed_from})"
        )


ConfigT = TypeVar("ConfigT", bound=RunConfig)
DataT = TypeVar("DataT")
HandedT = TypeVar("HandedT")


@dataclass
class Training(Generic[ConfigT, DataT, HandedT]):
    """One training as `Job.train` builds it, step by step: the job's config and the opened run directory, then
    what the job's hooks make (its `data`, `model`, the Trainer's `options`), then the Trainer's `result`. `handed`
    is what a job's hooks hand each other besides (the LM's `FineTuneStart`, the MT job's `TrainingFlops`), None
    when it has nothing to hand on. Each job names its own: `LMTraining = Training[LMRunConfig, ..., FineTuneStart]`.
    The config changes only through the hooks that return it (`Job.settled`)."""

    config: ConfigT
    run: RunDirectory
    data: DataT | None = None
    model: nn.Module | None = None
    options: TrainerOptions | None = None
    result: TrainingResult | None = None
    handed: HandedT | None = None


@dataclass(frozen=True)
class Outcome:
    """What a job measured after training: `figures` for summary.json, and `samples` (texts) to show."""

    figures: dict[str, Any] = field(default_factory=dict)
    samples: list[str] = field(default_factory=list)


class Job:
    """The contract of a job. Subclasses set the class attributes and implement `build_model` and the hooks of
    the one lifecycle, `train`: `make_corpus`, `make_model`, `trainer_options`, and as they need `settled`,
    `describe`, `outcome` and `conclusion`. Each hook takes the job's own `Training` (`LMTraining`, ...)."""

    name: ClassVar[str]  # its key in kqv.jobs.JOBS, configs/NAME-*.toml, `task = NAME` in run.toml
    help: ClassVar[str]
    config_class: ClassVar[type[RunConfig]]
    run_class: ClassVar[type[TrainedRun]] = TrainedRun  # what the job offers on a trained run (`kqv.jobs.offers`)
    noun: ClassVar[str | None] = None  # what its runs are called in messages ("translation"; default: the name)

    @property
    def title(self) -> str:
        """How messages name the job's runs: "a translation" (run), "an lm" (run)."""
        noun = self.noun or self.name
        return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"

    # -- configs ---------------------------------------------------------------------------------------------

    def load_config(self, path: str | Path, overrides: list[str] = ()) -> RunConfig:
        """Read a TOML run config and apply `section.key=value` overrides (as `kqv train NAME --set` does)."""
        values = read_config_values(path, overrides, f"configs/{self.name}-*.toml")
        return self.config_class.from_dict(values)

    def read_config(self, run_dir: str | Path, overrides: list[str] = ()) -> RunConfig:
        """The run config a run was trained with, from its run.toml, to resume it: as it was, or with
        `section.key=value` overrides of what may change mid-run (`kqv.train.runs.resumed_values`)."""
        values = read_run(run_dir, self.name)
        self.config_class.from_run(resumed_values(values, list(overrides), check=False))  # an unknown option first
        moves = [o for o in overrides if self.may_move(override_key(o), values)]
        values = resumed_values(values, moves, check=False)  # what the run checks itself when it starts
        return self.config_class.from_run(resumed_values(values, [o for o in overrides if o not in moves]))

    def may_move(self, key: str, saved: dict[str, Any]) -> bool:
        """Whether a resume may change the fixed setting `key` ("data.path") of the run whose run.toml holds
        `saved`, because the run checks what it names when it starts (none by default)."""
        return False

    # -- training --------------------------------------------------------------------------------------------

    def train(
        self,
        config: RunConfig,
        run_dir: str | Path,
        *,
        resume: bool = False,
        overwrite: bool = False,
        quiet: bool = False,
        on_event: Callable[[Event], object] | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        """Train as configured into run_dir (continue its checkpoint with `resume`, replace it with `overwrite`);
        write the run directory and return the summary. `options` are the job's flags without a config key.

        The one lifecycle of every job: open the run directory (`open_run`: everything is written through it, and
        a second writer must not replace run.toml, the tokenizer or the data under a running one), then the job's
        hooks make the corpus, the model and the batches, the Trainer trains, and the job's `outcome` is written
        into summary.json. Nothing is printed: the events (`kqv.train.events`) go to a `Reporter`, which shows
        them unless `quiet`; `on_event` receives every one instead (then nothing is shown)."""
        topology = Topology.of_process()  # this process among the run's, made once and handed down
        config = planned_update(config, topology)  # what run.toml records: the batch and accumulation this run takes
        refuse_writing_over(run_dir, self.inputs(config), option(OUT), directory=True)  # before anything is written
        config.train.check_installed()  # a logger's missing package, said before the data are made
        with self.open_run(run_dir, resume=resume, overwrite=overwrite, topology=topology) as run:
            speaks = run.writes  # under torchrun rank 0 speaks for every process
            report = Reporter(quiet or on_event is not None or not speaks, on_event if speaks else None)
            if (finished := finished_summary(run, config)) is not None:  # nothing asked of it: said, not redone
                report(Message(finished_line(run, finished)))
                return finished
            training = Training(config, run)
            training.data = self.make_corpus(training, **options)
            training.config = self.settled(training)
            training.model = self.make_model(training)
            training.options = self.trainer_options(training)
            report(Plan(self.describe(training), count_parameters(training.model), config.train.steps, run.destination))
            trainer = self.make_trainer(training.model, config, run, training.options, report)
            training.result = self.fit(trainer)
            if not run.writes:
                return {}  # under torchrun rank 0 alone evaluates and writes the run's outputs
            outcome = self.outcome(training)
            summary = self.summarise(run.path, training.result, training.model, **outcome.figures)
            run.complete()  # its last file written: an interrupt from now on loses nothing
        for text in outcome.samples:
            report(Sample(text))
        report(Summary(summary, self.conclusion(training, summary)))
        return summary

    def inputs(self, config: RunConfig) -> list[tuple[str, str | Path]]:
        """What a training of `config` reads, which its run directory must be neither equal to nor inside
        (`refuse_writing_over`): the model it starts from and its data (each source of a mixture), each as (what it
        is, its path)."""
        read = {"init": "the model it starts from", "path": "the data it reads", "tgt_path": "the data it reads"}
        data = getattr(config, "data", None)
        found = [
            (f"{what}, {option(RUN_INPUTS[name])}{value}", value)
            for name, what in read.items()
            if isinstance(value := getattr(data, name, None), (str, Path))
        ]
        for source in getattr(data, "sources", ()):  # a mixture's texts and files of pairs
            found.append((f"the data it reads, {option(SOURCES)}{source.path}", source.path))
        return found

    # The hooks of the lifecycle: what each job supplies.

    def make_corpus(self, training: Training, **options: Any) -> Any:
        """The job's data, read or built and written into `training.run` (rank 0 alone writes under torchrun);
        `options`: the job's training options without a config key."""
        raise NotImplementedError

    def settled(self, training: Training) -> RunConfig:
        """The config this training records in run.toml and trains with, decided once its data is made: by default
        `training.config` as given; a job that decides more from its data returns a changed copy (the LM: a
        fine-tune's context, the sample prompt)."""
        return training.config

    def make_model(self, training: Training) -> nn.Module:
        """The freshly seeded model for `training.data`: `start` (run.toml, then `build_model`), and whatever the
        job sets in it before training (pretrained weights)."""
        raise NotImplementedError

    def trainer_options(self, training: Training) -> TrainerOptions:
        """The Trainer's options for this training (`kqv.train.options.TrainerOptions`): train_batches and loss_fn,
        and any of val_batches, eval_fn, tokens_per_batch, extra_state, work_after_training."""
        raise NotImplementedError

    def describe(self, training: Training) -> str:
        """The line said before training: the model, the data and the run directory."""
        return f"{count_parameters(training.model):,} parameters, run directory {training.run.destination}"

    def outcome(self, training: Training) -> Outcome:
        """After training (rank 0): what the job measures and writes besides the Trainer's figures."""
        return Outcome()

    def conclusion(self, training: Training, summary: dict[str, Any]) -> str:
        """The line said after training, reading out `summary`."""
        return f"{summary['steps']} steps in {training.result.minutes}"

    @staticmethod
    def open_run(
        run_dir: str | Path, *, resume: bool, overwrite: bool, topology: Topology
    ) -> AbstractContextManager[RunDirectory]:
        """The run directory of one training, locked by rank 0 of `topology` and inspected (`RunDirectory.open`),
        which hands the topology on to the model's construction and the Trainer: `resume` continues
        its checkpoint, `overwrite` replaces its run, neither refuses one that is there. An overwrite is written
        beside the run it replaces and swapped in by `make_trainer`, once everything before training is done."""
        if resume and overwrite:
            raise ConfigError(
                "resume and overwrite exclude each other: continue the run in the directory, or replace it, not both"
            )
        if_exists = "resume" if resume else ("overwrite" if overwrite else "error")
        return RunDirectory.open(run_dir, if_exists, topology=topology, stage=True)

    def build_model(self, model_config: Config, config: RunConfig, values: dict[str, Any]) -> nn.Module:
        """The job's model for a model config (`values`: the run.toml being written or read)."""
        raise NotImplementedError

    def start(self, config: RunConfig, run: RunDirectory, model_config: Config, **extra: Any) -> nn.Module:
        """Write run.toml (with `extra` tables; rank 0 only under torchrun) and build the freshly seeded model: under
        torchrun with `train.parallel = "fsdp"`, on the meta device, each process keeping only its rows of every
        parameter for the Trainer's shards (`kqv.train.slices`), the same weights as one process's."""
        values = config.run_values(model_config.to_dict(), **extra)
        if run.resuming:
            self.check_resume(run, values)
        if run.writes:
            with restored_on_failure(run.config_file):  # run.toml and its checksum change together
                write_run_config(run.path, values)
                run.record(keep=run.resuming)  # the checksums of the data just prepared (or read back verified)
        torch.manual_seed(config.train.seed)
        return build_for(config.train.parallel, lambda: self.build_model(model_config, config, values), run.topology)

    def check_resume(self, run: RunDirectory, values: dict[str, Any]) -> None:
        """ConfigError, before anything is written, when the run.toml `values` a resume would write cannot continue
        `run`'s checkpoint: another model (its weights would not fit), other data (the run's tokenizer and
        encoded data stay), or fewer steps than already done."""
        run_toml = read_run(run.path, self.name)  # read into a config and written back: defaults compare equal
        saved_values = self.config_class.from_run(run_toml).run_values(self.model_config_of_run(run_toml).to_dict())
        saved, given = comparable(saved_values), comparable(values)
        fixed = [
            (f"{section}.{key}", was, now, why)
            for section, why in FIXED_SECTIONS.items()
            for key, was, now in differences(saved.get(section, {}), given.get(section, {}))
            if not self.may_move(f"{section}.{key}", saved)
        ]
        if fixed:
            raise ConfigError(
                f"{run.path} cannot be resumed with this config: "
                + "; ".join(f"{name} is {was!r} in the run, {now!r} here ({why})" for name, was, now, why in fixed)
                + f"; resume with the run's own config ({option(RUN_S_OWN_CONFIG)}) or "
                f"train a new run ({option(OVERWRITE)} or another directory)"
            )
        steps = values["train"]["steps"]
        if steps < run.step:
            raise ConfigError(
                f"the run in {run.path} is already at step {run.step}, past the {steps} steps asked for; to continue "
                f"it, ask for more than {run.step} steps ({option(STEPS)})"
            )

    def make_trainer(
        self, model: nn.Module, config: RunConfig, run: RunDirectory, options: TrainerOptions, reporter: Reporter
    ) -> Trainer:
        """The shared Trainer for `model` in the opened run directory, with the job's `options` (`trainer_options`),
        its events going to `reporter`. It resumes `run.checkpoint` when there is one. The run's preparation is
        done: an overwrite built beside the run it replaces is swapped in now (`RunDirectory.commit`)."""
        if run.writes:
            run.commit()
        return Trainer(model, config.train, run, options, reporter=reporter)

    @staticmethod
    def fit(trainer: Trainer) -> TrainingResult:
        """Run the trainer to the end, timing this session."""
        started = time.perf_counter()
        final = trainer.train()
        return TrainingResult(trainer, final, time.perf_counter() - started)

    def summarise(self, run_dir: Path, result: TrainingResult, model: nn.Module, **figures: Any) -> dict[str, Any]:
        """Write summary.json: the figures every job reports, then the job's own.

        `train_seconds` is the time spent in updates (evaluation and checkpoints excluded) summed over every
        session of the run, resumes included; `wall_seconds` is the wall-clock time of this session's training,
        evaluation included. `peak_rss_mb` is the process's peak resident memory so far (`peak_rss_mb()`): the
        job's own when it runs in a process of its own, as under `kqv train`.
        """
        trainer = result.trainer
        summary = {
            "steps": trainer.step,
            "train_seconds": round(trainer.train_seconds, 1),
            "wall_seconds": round(result.wall_seconds, 1),
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "parameters": count_parameters(model),
            "final_train_loss": result.final.get("train_loss"),
            "final_val_loss": result.final.get("val_loss"),
            **figures,
        }
        write_summary(run_dir, summary)
        return summary

    # -- using a trained run ---------------------------------------------------------------------------------

    def load(self, run_dir: str | Path, device: str = "cpu") -> TrainedRun:
        """A trained run for generation or evaluation (weights from safetensors, no code executed), its model on
        `device` ("auto": a CUDA GPU, then Apple silicon, then the CPU; `kqv.nn.devices.Accelerator.resolve`)
        whatever device it was trained on. The default is the CPU here; `kqv.load` and the commands choose "auto"."""
        run_dir, device = Path(run_dir), Accelerator.resolve(device)
        values = read_run(run_dir, self.name)
        config = self.config_class.from_run(values)
        model = self.build_model(self.model_config_of_run(values), config, values)
        load_weights(model, run_dir, self.restore(model, config, values, run_dir))  # CPU tensors, then moved
        held = RunFiles(run_dir)
        held.verify(held.tokenizer_dir)  # against the run's SHA256SUMS
        model = model.eval().to(device.device)
        return self.run_class(self, config, model, self.load_tokenizer(run_dir), run_dir, values)

    def restore(
        self, model: nn.Module, config: RunConfig, values: dict[str, Any], run_dir: Path
    ) -> Callable[[dict[str, torch.Tensor]], None] | None:
        """Make the freshly built `model` of the run `run_dir` ready for its checkpoint, and say how to load that
        (`load_weights`' `load`; None: the checkpoint holds every weight). A LoRA fine-tune (`LMJob`) gets its
        source's weights and adapters here, and its checkpoint holds the adapters alone."""
        return None

    def model_config_of_run(self, values: dict[str, Any]) -> Config:
        """The exact model config a run trained, from its run.toml."""
        return ModelConfig.from_dict(values["model"])

    def load_tokenizer(self, run_dir: Path) -> RunTokenizer:
        return load_tokenizer(RunFiles(run_dir).tokenizer_dir)


# -- what a run holds -------------------------------------------------------------------------------------------
# The files of a kqv run or a Hugging Face model directory that loading it reads, and its fine-tune's sources':
# what no command may write over (`kqv.train.files.refuse_writing_over`); and whether a run that a resume opens is
# finished (`finished_summary`: its summary, said instead of training it again).

HF_CONFIG_FILE = "config.json"  # what makes a directory a Hugging Face model's
# The files of a Hugging Face model directory that kqv reads (besides its *.safetensors weights).
HF_MODEL_FILES = frozenset(
    {
        HF_CONFIG_FILE,
        "generation_config.json",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "vocab.json",
        "merges.txt",
        "modules.json",  # a sentence-transformers directory's (kqv.interop.sentence_encoder)
        "sentence_bert_config.json",
        "1_Pooling",
    }
)


def is_hf_directory(path: str | Path) -> bool:
    """Whether `path` is a Hugging Face model directory (a config.json) rather than a kqv run (a run.toml): every
    job, the API and the explorer tell the two apart here."""
    path = Path(path)
    return (path / HF_CONFIG_FILE).is_file() and not RunFiles(path).config_file.exists()


def model_files(directory: str | Path) -> list[Path]:
    """The files of a run directory or a Hugging Face model directory that loading it reads (a kqv run's:
    `RunFiles.held`; a Hugging Face directory's: `HF_MODEL_FILES` and its weights): what no command may write over.
    Other files in it (a user's notes, an earlier answers.txt) are not the model's."""
    directory = Path(directory)
    weights = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
    held = {*RunFiles(directory).held(), *(directory / name for name in HF_MODEL_FILES)}
    return sorted(held) + weights


def run_inputs(run_dir: str | Path) -> list[tuple[str, Path]]:
    """What an operation on the run (or Hugging Face directory) `run_dir` reads, which no file it writes may be or
    lie inside (`refuse_writing_over`): the model's own files (`model_files`: SHA256SUMS and the lock file too)
    and, for a fine-tune, its source's (run.toml's `[source]`, and that source's source, if any), each as (what it
    is, its path)."""
    run_dir = Path(run_dir)
    found = [(f"{path.name} of the run {run_dir}", path) for path in model_files(run_dir)]
    seen = {os.path.realpath(run_dir)}
    while (source := recorded_source(run_dir)) is not None and os.path.realpath(source) not in seen:
        seen.add(os.path.realpath(source))
        found += [(f"{path.name} of the fine-tune's source {source}", path) for path in model_files(source)]
        run_dir = Path(source)
    return found


def recorded_source(run_dir: Path) -> str | None:
    """The path of the source a fine-tune `run_dir` started from (run.toml's `[source]`), else None."""
    try:
        source = tomllib.loads(RunFiles(run_dir).config_file.read_text()).get("source", {}).get("path")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError):
        return None  # no run.toml (a Hugging Face directory), or one that loading it will name
    return source if isinstance(source, str) and source else None


def finished_summary(run: RunDirectory, config: RunConfig) -> dict[str, Any] | None:
    """The summary of the run that `run` resumes when it is finished (its summary.json written after the update
    its checkpoint holds) and `config` asks for nothing more of it (every section as its run.toml's: more steps, a
    longer budget or another config resume as before), its data files verified; else None."""
    if not run.resuming or not run.summary_file.is_file():  # a RunDirectory is its RunFiles
        return None
    try:
        summary = read_summary(run.path)
    except (OSError, ValueError):  # damaged: the run is finished again, which writes it anew
        return None
    recorded = comparable(read_run(run.path))
    recorded.get("model", {}).pop("vocab_size", None)  # the tokenizer's, which a config leaves open
    asked = comparable(config.to_dict())
    planned = (run.checkpoint.state.get("plan") or {}).get("steps", config.train.steps)  # a budget's, or steps
    if summary.get("steps") != run.step or run.step < planned:  # a summary of an earlier end, before more was asked
        return None
    if any(recorded.get(name) != section for name, section in asked.items()):
        return None
    run.verify_data()  # a damaged run is said so, finished or not
    return summary


def finished_line(run: RunDirectory, summary: dict[str, Any]) -> str:
    """What a resume of a finished run says instead of training and evaluating it again."""
    return (
        f"{run.destination} is finished ({summary['steps']} steps; its figures are in summary.json): nothing to "
        f"resume; to train it further ask for more, {option(STEPS)} N above {summary['steps']} (or a longer "
        f"train.budget_minutes)"
    )


def total_parameters(model: nn.Module) -> int:
    """Every distinct parameter of `model`, trainable or frozen (tied weights counted once); `count_parameters`
    counts the trainable ones."""
    return sum(p.numel() for p in model.parameters())  # parameters() yields a shared tensor once


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB (10^6 bytes)."""
    return peak_rss_bytes() / 1e6


def planned_update(config: RunConfig, topology: Topology) -> RunConfig:
    """`config` with `train.tokens_per_update` resolved for the processes of `topology` (`TrainConfig.per_update`):
    the global batch and the accumulation it stands for, in blocks of `data.context` tokens."""
    if not config.train.tokens_per_update:
        return config
    context = getattr(getattr(config, "data", None), "context", None)
    if context is None:
        raise ConfigError(
            "train.tokens_per_update counts blocks of data.context tokens, which this job's "
            "batches are not; set train.grad_accum instead"
        )
    return dataclasses.replace(config, train=config.train.per_update(context, topology.world_size))
