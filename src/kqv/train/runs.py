"""Run configs: the format every job reads and writes (run.toml among a run's files), defined once.

A run config is a TOML file: [model] (a ModelConfig, whose vocab_size the tokenizer decides; a kind's options in
its sub-table such as [model.linformer]), [train] (TrainConfig) and the job's own sections ([data], [sample],
[decode], ...), with `section.key=value` (or `model.linformer.k=128`) overrides from the command line. A job's
run config is a `RunConfig` subclass whose fields are those sections.

What a run directory holds, and where, is `kqv.train.layout`'s to say (`RunFiles`): run.toml is written, read and
verified here through it.
"""

from __future__ import annotations

import codecs
import copy
import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import tomli_w

from ..errors import TRAIN, WITHOUT_OVERRIDES, ConfigError, KqvError, RunError, option
from ..nn.config import ModelConfig
from ..validation import Config, build, check_fields, check_value, did_you_mean
from .config import TrainConfig
from .files import write_atomically
from .layout import RunFiles


@dataclass
class RunConfig(Config):
    """A whole run config: `model` the ModelConfig (its vocab_size None until the job's tokenizer decides it),
    `train` the TrainConfig, and each further field is one of the job's sections.

    A job's model default that depends on another section (the LM's max_len is its data.context) comes from
    `model_defaults`, applied once when the [model] table is read: an option given in the table wins.
    `model_options` names the options the [model] table gave (the CLS job takes only a given dropout when it
    fine-tunes an MLM run's model).
    """

    train: TrainConfig
    model: ModelConfig = field(default_factory=ModelConfig)

    task: ClassVar[str] = ""
    run_tables: ClassVar[tuple[str, ...]] = ()  # tables the job adds to run.toml beyond its config (cls: labels)

    def __post_init__(self) -> None:
        given = self.model
        self.model = ModelConfig()  # the other sections first: the model's defaults may depend on them
        check_fields(self)
        self.model_options = frozenset(given if isinstance(given, dict) else ())  # the options the table gave
        self.model = self.read_model(given)
        self.check()  # a bad [model] option fails here, when the config is read, before any work

    def model_defaults(self) -> dict[str, Any]:
        """Model options whose default depends on the job's other sections (none by default)."""
        return {}

    def read_model(self, model: Any) -> Any:
        """The model config of a [model] table, over `model_defaults` (old flat names read into their sub-tables)."""
        if isinstance(model, dict):
            return ModelConfig.from_dict({**self.model_defaults(), **model})
        return check_value("model", model, ModelConfig)

    @classmethod
    def sections(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Any:
        values = {k: v for k, v in values.items() if k not in ("task", *cls.run_tables)}
        unknown = sorted(set(values) - set(cls.sections()))
        if unknown:
            raise ConfigError(
                f"unknown section(s) {unknown}{did_you_mean(unknown, cls.sections())} in the {cls.task} run config; "
                f"use "
                f"{', '.join(f'[{name}]' for name in cls.sections())}"
            )
        if not isinstance(values.get("train"), dict):
            raise ConfigError("the run config needs a [train] section with at least steps and batch_size")
        return build(cls, values, f"{cls.task} run config")

    @classmethod
    def from_run(cls, values: dict[str, Any]) -> Any:
        """The run config of a run's run.toml: its sections, with the vocabulary size left to the tokenizer."""
        model = {k: v for k, v in values.get("model", {}).items() if k != "vocab_size"}
        return cls.from_dict({**{k: v for k, v in values.items() if k in cls.sections()}, "model": model})

    def run_values(self, model: dict[str, Any], **extra: Any) -> dict[str, Any]:
        """What run.toml holds: the task, this config with the exact model config, and `extra` tables."""
        return {"task": self.task, **self.to_dict(), "model": model, **extra}


def read_config_values(path: str | Path, overrides: list[str] = (), examples: str = "configs/") -> dict[str, Any]:
    """The sections of a TOML run config with `section.key=value` overrides applied."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no config file at {path}; see {examples} for examples")
    values = read_toml(path, ConfigError, f"save it as UTF-8 TOML (see {examples} for examples)")
    for override in overrides:
        apply_override(values, override)
    return values


BOMS = {
    codecs.BOM_UTF32_LE: "UTF-32",
    codecs.BOM_UTF32_BE: "UTF-32",
    codecs.BOM_UTF16_LE: "UTF-16",
    codecs.BOM_UTF16_BE: "UTF-16",
}  # UTF-32 first: its little-endian mark starts with UTF-16's


def read_toml(path: Path, error: type[KqvError], remedy: str, damage: str = "not valid TOML") -> dict[str, Any]:
    """The tables of the TOML file at `path`, the one reader of every TOML file kqv reads (configs, run.toml).

    TOML is UTF-8 (its spec says so): a UTF-8 byte-order mark is skipped, as editors on Windows write one; a file
    in UTF-16 or UTF-32 (a byte-order mark says which) or in any other encoding, or with broken syntax, raises
    `error` naming the file and what was wrong, then `remedy`. An unreadable file (permissions, a directory)
    raises its OSError.
    """
    data = path.read_bytes()
    encoding = next((name for bom, name in BOMS.items() if data.startswith(bom)), None)
    if encoding is not None:
        raise error(f"{path} is {damage}: it is {encoding} text, and TOML is UTF-8; {remedy}")
    try:
        text = data.removeprefix(codecs.BOM_UTF8).decode("utf-8")
    except UnicodeDecodeError as decode:
        line = data[: decode.start].count(b"\n") + 1
        raise error(
            f"{path} is {damage}: byte {data[decode.start]:#04x} on line {line} is not UTF-8, and TOML is UTF-8; "
            f"{remedy}"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as decode:
        raise error(f"{path} is {damage}: {decode}; {remedy}") from None


def override_key(override: str) -> str:
    """The `section.key` that an override `section.key=value` sets."""
    return override.partition("=")[0].strip()


def apply_override(values: dict[str, Any], override: str) -> None:
    """Set `section.key=value` in values; the value is TOML (`200`, `"rope"`, `true`) or a bare string. A key of a
    sub-table takes one more dot: `model.linformer.k=128`."""
    key, sep, raw = override.partition("=")
    section, *path = override_key(override).split(".")
    if not sep or not path or not all(path):
        raise ConfigError(f"override {override!r} must look like section.key=value, e.g. train.steps=200")
    table = values.setdefault(section, {})
    for name in path[:-1]:
        table = table.setdefault(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"override {override!r}: {section}.{name} is not a table of options")
    table[path[-1]] = override_value(raw, key.strip())


FIXED_SECTIONS = {
    "model": "the model's shape is that of its checkpoint's weights",
    "data": "the tokenizer and data were written when the run started and every step so far used them",
    "finetune": "what trains decides what the checkpoint and its optimizer state hold",
}


def resumed_values(values: dict[str, Any], overrides: list[str], check: bool = True) -> dict[str, Any]:
    """A run's run.toml `values` with `section.key=value` overrides applied, to continue it (`kqv train NAME --out
    RUN --resume --steps N`): ConfigError, naming the fields and why, for an override of what cannot change
    mid-run (`FIXED_SECTIONS`: [model], [data] and a fine-tune's [finetune]). Setting a field to the value it has
    is no change. Without `check`, the overrides are only applied (to build a config from, which says first what it
    does not know)."""
    changed = copy.deepcopy(values)
    for override in overrides:
        apply_override(changed, override)
    if not check:
        return changed
    fixed = [
        (f"{section}.{key}", was, now, why)
        for section, why in FIXED_SECTIONS.items()
        for key, was, now in differences(values.get(section, {}), changed.get(section, {}))
    ]
    if fixed:
        raise ConfigError(
            "a resumed run cannot change "
            + "; ".join(f"{name} ({was!r} -> {now!r}): {why}" for name, was, now, why in fixed)
            + option(WITHOUT_OVERRIDES)
        )
    return changed


def differences(was: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, value in `was`, value in `now`) for every key whose value differs (None: absent), sub-tables
    compared key by key."""
    found = []
    for key in sorted(set(was) | set(now)):
        a, b = was.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            found.append((f"{prefix}{key}", a, b))
    return found


def override_value(raw: str, name: str = "the value") -> Any:
    """The value of a command-line override: TOML (`200`, `0.5`, `[64, 128]`, `"rope"`, `true`), else the bare
    string (`data.path=input.txt`). A value in quotes that TOML cannot read (`"{prompt}\\q"`: an unknown escape)
    is a ConfigError, not a string that keeps its quotes. Run configs (`--set section.key=value`) and experiments
    (`--set field=value`) both read their values here; `name` is the option's, for the message."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError as error:
        if raw.strip()[:1] in ("'", '"'):
            raise ConfigError(
                f"{name} {raw!r} is quoted but is not a TOML string ({error}); in double quotes write a backslash "
                f"as \\\\ (\\n is a newline), or use single quotes, which keep every character as it is"
            ) from None
        return raw


def toml_text(values: dict[str, Any]) -> str:
    """TOML of a run config: None values dropped (TOML has no null), tuples written as lists."""
    return tomli_w.dumps(_toml_ready(values))


def comparable(values: dict[str, Any]) -> dict[str, Any]:
    """`values` as run.toml would hold them (None dropped, tuples as lists): what a resume compares."""
    return tomllib.loads(toml_text(values))


def _toml_ready(values: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _toml_ready(v) if isinstance(v, dict) else list(v) if isinstance(v, tuple) else v
        for k, v in values.items()
        if v is not None
    }


def read_run(run_dir: str | Path, task: str | None = None) -> dict[str, Any]:
    """The run.toml of a run directory (of `task`, if given), with errors that say what is missing."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        how = option(TRAIN, task=task or "lm", run_dir=run_dir)
        raise FileNotFoundError(f"no run directory at {run_dir}; train one with {how}")
    run = RunFiles(run_dir)
    path = run.config_file
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a kqv run: {path} is missing")
    run.verify(path)  # against SHA256SUMS: a truncated run.toml may still parse
    values = read_toml(path, RunError, "restore it from a backup or train the run again", "corrupt")
    if task is not None and run_task(values) != task:
        raise RunError(f"{run_dir} is a run of task {run_task(values)!r}, not {task!r}")
    return values


def run_task(values: dict[str, Any]) -> str:
    """Which job wrote a run: the `task` of its run.toml (runs of the first kqv releases are language models)."""
    return values.get("task", "lm")


def write_run_config(run_dir: Path, values: dict[str, Any]) -> None:
    """The run.toml of `values` in the run `run_dir`, atomically (a resume rewrites it: never torn)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(RunFiles(run_dir).config_file, toml_text(values).encode())


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """The finished run's figures in its summary.json, atomically."""
    write_atomically(RunFiles(run_dir).summary_file, (json.dumps(summary, indent=1) + "\n").encode())


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    """The figures of the finished run `run_dir` (its summary.json)."""
    return json.loads(RunFiles(run_dir).summary_file.read_text())
