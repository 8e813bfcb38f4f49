"""The flags of the `kqv` command line: each names its argparse options and, for `kqv train`, the config value it
sets. Only the command line knows about flags; below it (`kqv.api`, the jobs) everything is keyword arguments."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Any

from ..api import ModelKind
from ..flag_names import (
    BASELINE,
    BEAM,
    DATA,
    DATA_FROM,
    DEVICE,
    INIT,
    JSON,
    LENGTH_PENALTY,
    MODEL,
    OUT,
    OVERWRITE,
    PAIR,
    QUIET,
    RESUME,
    SET,
    STEPS,
    TGT_DATA,
    THREADS,
)


@dataclass(frozen=True)
class Flag:
    """A command-line flag: its argparse options and, for `kqv train`, the config value it sets.

    With `key` ("data.path") the flag is a shortcut for `--set data.path=VALUE`; without, its value reaches
    `kqv.api.train` (and so `Job.train`) as the keyword argument of its name (`--data-from` -> `data_from=`).
    """

    name: str
    help: str
    key: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # further argparse keywords: type, choices, default, ...
    many: str | None = None  # a repeatable flag given more than once sets this key: a list of {path, weight} tables

    def overrides(self, value: Any) -> list[str]:
        """The `--set` overrides the flag's `value` gives: `KEY=VALUE`, or for a repeated flag's several values
        `MANY=[{path = ..., weight = 1.0}, ...]` (one value: `KEY=VALUE`)."""
        if isinstance(value, list) and self.many is not None:
            if len(value) > 1:
                tables = ", ".join(f"{{path = {json.dumps(v)}, weight = 1.0}}" for v in value)
                return [f"{self.many}=[{tables}]"]
            value = value[0]
        return [f"{self.key}={json.dumps(value)}"]

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser, help: str | None = None) -> None:
        parser.add_argument(self.name, help=help or self.help, **self.options)


DEVICE_HELP = "where the model runs: auto (a CUDA GPU, then Apple silicon, then the CPU), cpu, cuda, cuda:N or mps"
# --device on every command that runs a model but `kqv train` (whose --device sets train.device)
DEVICE_FLAG = Flag(DEVICE, f"{DEVICE_HELP} (default auto)", options={"default": "auto"})

# The flags of `kqv train NAME` that every job has, and each job's own.
SHARED_TRAIN_FLAGS = (
    Flag(STEPS, "number of optimizer updates", "train.steps", {"type": int}),
    Flag(DEVICE, f"{DEVICE_HELP} (default: the config's train.device, auto)", "train.device"),
    Flag(
        SET,
        "override a config value, e.g. --set model.d_model=128 (repeatable)",
        options={"action": "append", "default": [], "metavar": "SECTION.KEY=VALUE"},
    ),
    Flag(
        RESUME,
        "continue the run in --out from its checkpoint; without --config, --steps and --set change its own run.toml",
        options={"action": "store_true"},
    ),
    Flag(OVERWRITE, "replace the run in --out", options={"action": "store_true"}),
    Flag(QUIET, "print nothing but errors", options={"action": "store_true"}),
)
TEXT_DATA_FLAG = Flag(DATA, "a text file or directory of .txt files instead of Shakespeare", "data.path")
TRAIN_FLAGS: dict[str, tuple[Flag, ...]] = {
    "cls": (
        Flag(DATA, "the TSV file of text<TAB>label lines (required)", "data.path"),
        Flag(INIT, "an MLM run directory whose encoder and tokenizer to fine-tune", "data.init"),
    ),
    "lm": (
        Flag(
            DATA,
            "a text file or directory of .txt files instead of Shakespeare, a .tsv/.jsonl file of "
            "prompt -> completion pairs (the loss on the completions), or a prepared corpus directory "
            "(`kqv prepare`); repeated, a mixture of texts and pairs with equal weights (data.sources)",
            "data.path",
            {"action": "append"},
            many="data.sources",
        ),
        Flag(INIT, "a kqv LM run or Hugging Face causal LM directory to fine-tune (default config: finetune)"),
    ),
    "mlm": (TEXT_DATA_FLAG,),
    "mt": (
        Flag(PAIR, "Bible language pair: de-en (default), fr-en, en-de, en-fr", "data.pair"),
        Flag(DATA, "your own corpus: a TSV file (source<TAB>target), or the source side", "data.path"),
        Flag(TGT_DATA, "the target side, aligned line by line with --data", "data.tgt_path"),
        Flag(DATA_FROM, "reuse the tokenizer and data splits of another MT run"),
        Flag(MODEL, "override model.kind", "model.kind", {"choices": list(ModelKind.__args__)}),
        Flag(THREADS, "torch threads (default: torch's choice)", options={"type": int}),
    ),
    "vit": (Flag(BASELINE, "the baseline trained beside the ViT: mlp, conv or none", "data.baseline"),),
}

# Flags several commands on runs share.
JSON_FLAG = Flag(JSON, "also print the result as JSON", options={"action": "store_true"})
OUT_PNG_FLAG = Flag(OUT, "the PNG file to write", options={"default": "attention.png"})
BEAM_FLAGS = (
    Flag(BEAM, "beam size (default: the run's decode.beam_size)", options={"type": int}),
    Flag(LENGTH_PENALTY, "length penalty of beam search", options={"type": float}),
)
