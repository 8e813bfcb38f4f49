"""`kqv train lm --init SOURCE`: a language model that starts from trained weights instead of random ones.

SOURCE is a kqv LM run directory (its run.toml, tokenizer and checkpoint) or a Hugging Face causal language model
directory (GPT-2, GPT-NeoX, Llama, Mistral or Qwen2) saved with its tokenizer (config.json, model.safetensors,
tokenizer.json; converted offline by `kqv.interop.from_hf`).
The fine-tune takes from SOURCE:

- the model config: every option that shapes a weight stays the source's. An option the run config gives that
  differs is refused by name (`ConfigError`), except those that change no weight (`FREE_OPTIONS`: dropout and the
  attention's exact O(n)-memory path); data.context must fit the source's learned positions;
- the tokenizer: the fine-tuning text is encoded with it, and a character it cannot encode is refused, naming
  each such character and how often it occurs, never silently dropped or replaced;
- the weights, loaded into the freshly built model before the first update (not on a resume: the run's own
  checkpoint has them).

The run records its source in run.toml and summary.json (`[source]`: the path, its kind and the SHA-256 of its
weights, every shard of them counted: `weights_sha256`), so a fine-tune says what it started from even after
SOURCE has changed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open
from torch import nn

from ..data.tokenizers import BPETokenizer, CharTokenizer, Tokenizer, load_tokenizer
from ..errors import EXPORT_MERGED, INIT, INIT_DIR, PREPARE_WITH_TOKENIZER, ConfigError, DataError, option
from ..interop.directories import read_hf_tokenizer
from ..nn.config import ModelConfig
from ..nn.lora import adapters
from ..train.checkpoints import load_weights, read_checkpoint
from ..train.files import sha256
from ..train.layout import RunFiles
from ..train.runs import read_run
from ..train.slices import is_sliced, load_slices, set_slices
from .base import is_hf_directory

FREE_OPTIONS = frozenset({"dropout", "blockwise"})  # model options a fine-tune may change: no weight depends on them
INDEX_FILE = "model.safetensors.index.json"  # a Hugging Face directory's weights in shards: the files it names


@dataclass(frozen=True)
class Source:
    """Where a fine-tune starts: `path`, `kind` ("kqv run", "Hugging Face GPT-2", "Hugging Face Llama", ...), its
    model config and the
    SHA-256 of its weights file."""

    path: Path
    kind: str
    config: ModelConfig
    weights_sha256: str

    def record(self) -> dict[str, str]:
        """The `[source]` table of run.toml and summary.json."""
        return {"path": str(self.path), "kind": self.kind, "weights_sha256": self.weights_sha256}


def read_source(path: str | Path) -> Source:
    """The source of a fine-tune: a kqv LM run or a Hugging Face causal-LM directory (`ConfigError` for anything
    else; a `ConversionError` naming the setting kqv cannot compute, such as RoPE scaling)."""
    path = Path(path) if Path(path).exists() or not is_hub_name(str(path)) else download_from_hub(str(path))
    if is_hf_directory(path):
        from ..interop import config_from_hf, read_hf_directory

        hf_config, _ = read_hf_directory(path)
        family = causal_lm_families().get(getattr(hf_config, "model_type", None))
        if family is None:
            raise ConfigError(
                f"{option(INIT)}{path} is a Hugging Face {hf_config.model_type!r} directory; a language model "
                f"starts from a kqv LM run or a {', '.join(causal_lm_families().values())} directory"
            )
        return Source(path, f"Hugging Face {family}", config_from_hf(hf_config), weights_sha256(path))
    if not RunFiles(path).config_file.is_file():
        raise ConfigError(
            f"{option(INIT)}{path} is neither a kqv LM run (run.toml) nor a Hugging Face language model directory "
            f"(config.json)"
        )
    values = read_run(path, "lm")
    weights, source = RunFiles(path).weights_file, values.get("source")  # checkpoint.old/'s, as eval reads
    if not weights.is_file():
        raise ConfigError(f"{option(INIT)}{path} has no trained weights ({weights} is missing): train it first")
    if isinstance(source, dict) and holds_adapters_alone(weights):
        export = option(EXPORT_MERGED, path=str(path))
        raise ConfigError(
            f"{option(INIT)}{path} is a LoRA fine-tune, which holds only its adapters; start from its merged "
            f"weights ({export}, then {option(INIT_DIR)}), or from its source {source.get('path')}"
        )
    return Source(path, "kqv run", ModelConfig.from_dict(values["model"]), sha256(weights))


def causal_lm_families() -> dict[str, str]:
    """model_type -> family name of the Hugging Face causal language models kqv reads (`kqv.interop`'s
    architectures whose kqv class is a `DecoderLM`): what `--init` takes besides a kqv run."""
    from ..interop import ARCHITECTURES
    from ..nn.models import DecoderLM

    return {a.model_type: a.name for a in ARCHITECTURES.values() if a.kqv_class is DecoderLM}


HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")  # "gpt2", "openai-community/gpt2"
HUB_FILES = ("config.json", "model.safetensors", INDEX_FILE, "tokenizer.json", "generation_config.json")


def is_hub_name(name: str) -> bool:
    """Whether `name` (not an existing path) reads as a Hugging Face hub model id rather than a mistyped path."""
    return bool(HUB_NAME.fullmatch(name))


def download_from_hub(name: str) -> Path:
    """The local snapshot of hub model `name` (safetensors weights and the tokenizer only: nothing that would run
    code), downloaded by `huggingface_hub` into its cache, or read from there when it is already cached. Weights
    in shards take a second call: the shards the index names, from the revision the first call fetched."""
    try:
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(name, allow_patterns=list(HUB_FILES)))
        if (path / INDEX_FILE).is_file() and not (path / "model.safetensors").is_file():
            shards = json.loads((path / INDEX_FILE).read_text(encoding="utf-8"))["weight_map"].values()
            names = sorted({shard for shard in shards if isinstance(shard, str) and shard == Path(shard).name})
            path = Path(snapshot_download(name, allow_patterns=names, revision=path.name))  # a snapshot's commit
        return path
    except Exception as error:  # offline, unknown id, gated model: all end the same way for the user
        raise ConfigError(
            f"{option(INIT)}{name}: no such directory, and it could not be fetched from the Hugging Face hub "
            f"({type(error).__name__}); give a directory (a kqv LM run, or a Hugging Face model saved with "
            f"save_pretrained)"
        ) from None


def weights_sha256(path: Path) -> str:
    """The fingerprint of a Hugging Face directory's weights: model.safetensors's SHA-256, or, for weights in
    shards, the SHA-256 of `sha256sum`'s listing of the index and every shard it names, so any changed file counts."""
    from ..interop.convert import weight_files

    files = weight_files(path)
    if files == [path / "model.safetensors"]:
        return sha256(files[0])
    listing = "".join(f"{sha256(file)}  {file.name}\n" for file in [path / INDEX_FILE, *files])
    return hashlib.sha256(listing.encode()).hexdigest()


def index_only_sha256(source: Source) -> str | None:
    """What kqv recorded for a source in shards before every shard counted (its index's SHA-256; None for any
    other source): a run recorded so is still taken, its shards unchecked as they were then."""
    index = source.path / INDEX_FILE
    sharded = source.kind.startswith("Hugging Face") and not (source.path / "model.safetensors").is_file()
    return sha256(index) if sharded and index.is_file() else None


def holds_adapters_alone(weights: Path) -> bool:
    """Whether a checkpoint's weights file holds LoRA adapters and nothing else (a LoRA fine-tune's), read from its
    safetensors header alone."""
    try:
        with safe_open(weights, "pt") as file:
            names = list(file.keys())
    except Exception:  # noqa: BLE001 - a damaged file: loading it says what is wrong
        return False
    return bool(names) and adapters(dict.fromkeys(names)).keys() == set(names)


def source_tokenizer(source: Source) -> Tokenizer:
    """The tokenizer saved with the source: a kqv run's tokenizer/, a Hugging Face directory's tokenizer.json."""
    if source.kind == "kqv run":
        return load_tokenizer(RunFiles(source.path).tokenizer_dir)
    return read_hf_tokenizer(source.path)


@dataclass(frozen=True)
class SourceTokenizer:
    """A fine-tune's `kqv.jobs.lm_corpus.LMTokenizerSource`: its source's tokenizer, checked on the text, which
    a fine-tune keeps (a prepared corpus must have been encoded with it)."""

    source: Source

    def make_tokenizer(self, text: str) -> Tokenizer:
        tokenizer = source_tokenizer(self.source)
        check_encodable(tokenizer, text, self.source.path)
        return tokenizer

    def load_tokenizer(self, run_dir: Path) -> Tokenizer:
        return load_tokenizer(RunFiles(run_dir).tokenizer_dir)

    def check_prepared(self, tokenizer: Tokenizer, path: str | Path) -> None:
        """Refuse a prepared corpus encoded with another tokenizer than the source's."""
        source = self.source
        if source_tokenizer(source).files() != tokenizer.files():
            raise DataError(
                f"{path} was prepared with another tokenizer than {source.path}'s, which a fine-tune keeps; "
                f"prepare it with {option(PREPARE_WITH_TOKENIZER, source=str(source.path))}"
            )


def load_source_weights(model: nn.Module, source: Source) -> None:
    """Copy the source's weights into `model` (built from `finetune_config`, so every tensor has its shape). A
    model built in slices for FSDP (`kqv.train.slices`) takes only this process's rows: of a kqv run, read alone
    from its safetensors file; of a Hugging Face directory, cut from the whole model converted in memory (the
    conversion transposes and splits GPT-2's tensors, so this process holds the whole source for that moment)."""
    if source.kind == "kqv run":
        if is_sliced(model):
            checkpoint = read_checkpoint(source.path)  # its files verified by their SHA-256, as load_weights does
            checkpoint.close()
            load_slices(model, RunFiles(source.path).weights_file)
        else:
            load_weights(model, source.path)
        return
    from ..interop import from_hf

    weights = from_hf(source.path).state_dict()
    if is_sliced(model):
        set_slices(model, weights)
    else:
        model.load_state_dict(weights)


def finetune_config(source: Source, given: ModelConfig, options: frozenset[str], context: int) -> ModelConfig:
    """The source's model config with the options of `FREE_OPTIONS` the run config gave (`options`, its
    `model_options`); any other option given with another value than the source's is refused, naming each."""
    differ = {
        name: (getattr(source.config, name), getattr(given, name))
        for name in sorted(options - FREE_OPTIONS - {"vocab_size"})
        if getattr(given, name) != getattr(source.config, name)
    }
    if differ:
        listed = "; ".join(
            f"model.{name} is {was!r} in the source, {now!r} here" for name, (was, now) in differ.items()
        )
        raise ConfigError(
            f"a fine-tune keeps its source's weights, so it cannot change the options that shape them: {listed}; "
            f"drop those settings (only {', '.join(sorted(FREE_OPTIONS))} may change)"
        )
    config = source.config.replace(**{name: getattr(given, name) for name in options & FREE_OPTIONS})
    if config.position == "learned" and context > config.max_len:
        raise ConfigError(
            f"data.context ({context}) is longer than the source's {config.max_len} learned positions; "
            f"set data.context to at most {config.max_len}"
        )
    return config


def check_encodable(tokenizer: Tokenizer, text: str, source: Path) -> None:
    """DataError naming every character of `text` that `tokenizer` has no token for, with its count; a byte-level
    BPE tokenizer encodes every text."""
    if isinstance(tokenizer, CharTokenizer):
        known = set(tokenizer.chars)
    elif isinstance(tokenizer, BPETokenizer) and type(tokenizer.tokenizer.model).__name__ == "WordLevel":
        known = {t for t in tokenizer.tokenizer.get_vocab() if len(t) == 1}  # an exported character tokenizer
    else:
        return
    unknown = Counter(char for char in text if char not in known)
    if unknown:
        listed = ", ".join(f"{char!r} ({count:,}x)" for char, count in unknown.most_common(20))
        more = f" and {len(unknown) - 20} more" if len(unknown) > 20 else ""
        raise DataError(
            f"the text has {unknown.total():,} characters of {len(unknown)} kinds that the tokenizer of {source} "
            f"never saw: {listed}{more}; remove or replace them (a fine-tune keeps its source's vocabulary)"
        )
