"""kqv's own exceptions: the errors a user can cause and fix (a bad config, unusable data, a broken run directory).

Every one derives from `KqvError`, and from the built-in exception a caller would expect (`ValueError`,
`TypeError`), so `except ValueError` keeps working. The command line prints these as `kqv: error: <message>`
and exits with status 2; any other exception is a bug in kqv and shows its traceback.

A message names options and remedies in the words of the interface it reaches: each is a `Word` below, with its
Python and its command-line spelling, said by `option`; the command-line spelling names each flag through
`kqv.flag_names`, the command line's one vocabulary of flags, never by a string of its own.
"""

from __future__ import annotations

import contextvars
import errno
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from . import flag_names as flag

_COMMAND_LINE: contextvars.ContextVar[bool] = contextvars.ContextVar("kqv_command_line", default=False)


class KqvError(Exception):
    """An expected error whose message says what was wrong and what to do."""


class ConfigError(KqvError, ValueError):
    """A configuration value or option is invalid (unknown option, out of range, not one of the choices)."""


class ConfigTypeError(ConfigError, TypeError):
    """A configuration value has the wrong type (a float where an int is needed, a string for a bool, ...)."""


class DataError(KqvError, ValueError):
    """Input data cannot be used: a corpus, a TSV file, a prompt, a sentence, token ids."""


class DataTypeError(DataError, TypeError):
    """Input data of the wrong type: token ids that are not an integer tensor, images that are not floats, ..."""


class UnknownTokenError(DataError, KeyError):
    """A token that the tokenizer's vocabulary does not have (a KeyError too, as a dict lookup would raise)."""

    def __str__(self) -> str:  # KeyError's own str() would quote the message
        return str(self.args[0]) if self.args else ""


class RunError(KqvError, ValueError):
    """A run directory cannot be used: incomplete, corrupt, written by another job, or not a kqv run."""


class ConversionError(KqvError, ValueError):
    """A model that kqv.interop cannot convert: an architecture or option with no kqv (or Hugging Face) counterpart,
    or a checkpoint whose weights do not match its config."""


class ProcessLost(KqvError, RuntimeError):
    """Another process of a torchrun training stopped (killed, out of memory, its machine gone), so this one cannot
    go on: the message names the lost rank where it can tell."""


class MissingResourceError(KqvError, RuntimeError):
    """Something kqv needs is not installed and cannot be fetched (a corpus, pretrained weights); the message says
    how to get it."""


class DiskFullError(KqvError, OSError):
    """The disk filled up while kqv wrote `path` (`needed` bytes): what was half-written is removed, what was
    complete before stays. An OSError with errno ENOSPC, so `except OSError` keeps working."""

    def __init__(self, path: object, needed: int, free: int | None = None):
        super().__init__(errno.ENOSPC, "No space left on device", str(path))
        self.path, self.needed, self.free = path, needed, free
        if not needed:  # a write of unknown size: what is free, if known, and no made-up need
            available = "" if free is None else f" ({_sizes(free)[0]} free)"
            self.message = f"the disk is full at {path}{available}; free some space and run the command again"
            return
        if free is None:
            (wanted,), available = _sizes(needed), ""
        else:
            wanted, left = _sizes(needed, free)
            available = f" ({left} free)" if free < needed else f" ({left} free, short of what the write took)"
        self.message = (
            f"the disk is full: {wanted} needed at {path}{available}; free some space and run the command again"
        )

    def __str__(self) -> str:
        return self.message


def _sizes(*counts: int) -> list[str]:
    """Byte counts in one unit (MB = 10^6 bytes, or kB when the largest is under 0.1 MB) with as many decimals as
    it takes for different counts to read differently: "0.24 MB needed (0.20 MB free)", never "0.2 MB needed
    (0.2 MB free)"."""
    unit, scale, most = ("MB", 1e6, 6) if max(counts) >= 100_000 else ("kB", 1e3, 3)
    for decimals in range(1, most + 1):
        shown = [f"{n / scale:,.{decimals}f} {unit}" for n in counts]
        if len(set(shown)) == len(set(counts)):
            return shown
    return shown


# What to do about an operating-system error: the file system said no (full, read-only, not a directory, ...).
OS_REMEDIES = {
    errno.ENOSPC: "the disk is full: free some space and run the command again",
    errno.EDQUOT: "the disk quota is used up: free some space and run the command again",
    errno.EACCES: "check its permissions, or choose another path",
    errno.EPERM: "check its permissions, or choose another path",
    errno.EROFS: "the file system is read-only: choose another path",
    errno.ENOTDIR: "a part of the path is a file, not a directory: choose another path",
    errno.EISDIR: "it is a directory: give the path of a file (or remove the directory)",
    errno.ENAMETOOLONG: "choose a shorter path",
}


def describe_os_error(error: OSError) -> str:
    """One line for an OSError: kqv's own message (a FileNotFoundError that says what to train), or the file, what
    the system said, and what to do about it (`OS_REMEDIES`)."""
    if isinstance(error, KqvError) or error.errno is None or error.strerror is None:
        return str(error)
    path = error.filename2 if error.filename2 is not None else error.filename  # a rename's: its destination
    where = f"{path}: " if path is not None else ""
    remedy = OS_REMEDIES.get(error.errno)
    return f"{where}{error.strerror}" + (f"; {remedy}" if remedy else "")


# ---------------------------------------------------------------------------------------------------------------
# Messages in the words of the interface: a command-line user is told about flags, a Python user about arguments.
# Each option or remedy a message names is a `Word` below, with both spellings; `option` says the one of the
# interface in use, and `kqv.cli.main` runs every command inside `command_line`, so no message spells a flag itself
# (`tests/test_error_wording.py`).


@dataclass(frozen=True)
class Word:
    """An option or remedy as messages name it: `python` as a Python caller writes it ("beam_size",
    "if_exists='overwrite'"), `cli` as a command-line user types it ("--beam", "`--overwrite`"); either may have
    {placeholders}, which `option` fills."""

    python: str
    cli: str


@contextmanager
def command_line() -> Iterator[None]:
    """Within the block, messages are for a command-line user: `option` says each Word's `cli` spelling."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def option(word: Word, **fields: object) -> str:
    """How a message names an option, or a remedy, to whoever called: `word`'s Python spelling, or inside
    `command_line` its command-line spelling; `fields` fill its placeholders."""
    said = word.cli if _COMMAND_LINE.get() else word.python
    return said.format(**fields) if fields else said


# The options and remedies messages name (`option`), in both interfaces' words.
GENERATION_OPTIONS = {  # a generation option by its field name (`kqv.nn.generation.GenerationConfig`)
    name: Word(name, spelled)
    for name, spelled in (
        ("max_new_tokens", flag.MAX_NEW_TOKENS),
        ("temperature", flag.TEMPERATURE),
        ("top_k", flag.TOP_K),
        ("top_p", flag.TOP_P),
        ("count", flag.COUNT),
        ("seed", flag.SEED),
        ("use_cache", flag.NO_CACHE),  # the command line's negation of it
        ("dtype", flag.DTYPE),
    )
}
COUNT = GENERATION_OPTIONS["count"]
PROMPT = Word("prompt", flag.PROMPT)
PROMPT_EXAMPLE = Word("prompt='ROMEO:'", f"{flag.PROMPT} 'ROMEO:'")
TEXT = Word("text", flag.TEXT)
SENTENCES = Word("sentences", "the text")
MAX_TOKENS = Word("max_tokens", flag.MAX_TOKENS)
MAX_SENTENCES = Word("max_sentences", flag.MAX_SENTENCES)
BEAM_SIZE = Word("beam_size", flag.BEAM)
LENGTH_PENALTY = Word("length_penalty", flag.LENGTH_PENALTY)
IMAGES = Word("images", flag.IMAGES)
SRC = Word("src", flag.SRC)
TGT = Word("tgt", flag.TGT)
SRC_AND_REF = Word("src and ref", f"{flag.SRC} and {flag.REF}")
SEEDS = Word("seeds", flag.SEEDS)
PEOPLE = Word("n_people", flag.PEOPLE)  # the invented world's (`kqv world`)
VERSIONS = Word("versions", flag.VERSIONS)
FULL_NAMES = Word("full_names", flag.FULL_NAMES)
STYLE_ENCYCLOPEDIA = Word("style='encyclopedia'", f"{flag.STYLE} encyclopedia")
OUT = Word("out", flag.OUT)
HF = Word("hf", flag.HF)
HOST = Word("host", flag.HOST)
PORT = Word("port", flag.PORT)
COMMIT = Word("commit=", flag.COMMIT)
RUN_DIRECTORY = Word("the run directory", flag.OUT)
DATA_FILE = Word("data=PATH", f"{flag.DATA} FILE")
TRAIN_ON_TEXT = Word("overrides=['data.path=path/to/text.txt']", f"{flag.DATA} path/to/text.txt")
PREPARE = Word("kqv.prepare(TEXT, {path!r})", f"`kqv prepare TEXT {flag.OUT} {{path}}`")
VOCAB_SIZE = Word("vocab_size", flag.VOCAB_SIZE)
SAMPLE_MB = Word("sample_mb", flag.SAMPLE_MB)
TRAIN_ON_CORPUS = Word("overrides=['data.path={path}']", f"{flag.DATA} {{path}}")
EVAL_CORPUS = Word("kqv.load({run!r}).evaluate(data=DIR)", f"`kqv eval {{run}} {flag.DATA} DIR`")
MOVED_CORPUS = Word(
    "kqv.load({run!r}).evaluate(data=DIR), or train('lm', out={run!r}, resume=True, overrides=['data.path=DIR'])",
    f"`kqv eval {{run}} {flag.DATA} DIR` or `kqv train lm {flag.OUT} {{run}} {flag.RESUME} {flag.DATA} DIR`",
)
PREPARE_TOKENIZER = Word(
    "kqv.prepare(TEXT, DIR, tokenizer='char') (or 'bpe', vocab_size=N)",
    f"`kqv prepare TEXT {flag.OUT} DIR {flag.TOKENIZER} char` (or bpe, {flag.VOCAB_SIZE} N)",
)
PREPARE_WITH_TOKENIZER = Word(
    "kqv.prepare(TEXT, DIR, tokenizer={source!r})", f"`kqv prepare TEXT {flag.TOKENIZER} {{source}} {flag.OUT} DIR`"
)
MIXTURE = Word("data.sources=[TEXT, {path}]", f"{flag.DATA} TEXT {flag.DATA} {{path}}")
INIT = Word("init=", f"{flag.INIT} ")
INIT_DIR = Word("init=DIR", f"{flag.INIT} DIR")
INIT_SOURCE = Word("init=SOURCE", f"{flag.INIT} SOURCE")
STEPS = Word("steps=", flag.STEPS)
OVERRIDE = Word("the override ", f"{flag.SET} ")
OVERRIDE_EXAMPLE = Word("overrides=['steps=200']", f"{flag.SET} steps=200")
CONFIG_FIELD = Word("the config's {name}", f'{flag.SET} {{name}}="..."')
SOURCES = Word("data.sources=", f"{flag.DATA} ")
RUN_INPUTS = {  # what a run reads, by its [data] key (a run's output must not overwrite them)
    "init": Word("data.init=", f"{flag.INIT} "),
    "path": Word("data.path=", f"{flag.DATA} "),
    "tgt_path": Word("data.tgt_path=", f"{flag.SET} data.tgt_path="),
}
# remedies
OVERWRITE = Word("overwrite=True", flag.OVERWRITE)
IF_EXISTS_OVERWRITE = Word("if_exists='overwrite'", f"`{flag.OVERWRITE}`")
IF_EXISTS_RESUME = Word("if_exists='resume'", f"`{flag.RESUME}`")
TRAINER_RESUME = Word("Trainer.resume(...)", f"`{flag.RESUME}`")
RESUME = Word("if_exists='resume' or Trainer.resume(...)", f"`{flag.RESUME}`")
RUN_S_OWN_CONFIG = Word("no config", f"{flag.RESUME} without {flag.CONFIG}")
WITHOUT_OVERRIDES = Word(
    "; resume without these overrides, or train a new run with overwrite=True or another out",
    f"; resume without these {flag.SET} values, or train a new run with {flag.OVERWRITE} or another {flag.OUT}",
)
TRAIN = Word("the {task} job's train(config, run_dir)", f"`kqv train {{task}} {flag.OUT} {{run_dir}}`")
RUN_EXPERIMENT = Word(
    "list(kqv_lab.experiments.actions.run_experiments({name!r}, out={out!r}))",
    f"`kqv experiment run {{name}} {flag.OUT} {{out}}`",
)
RESEAL = Word("kqv.api.reseal({run!r})", "`kqv reseal {run}`")
EXPORT_MERGED = Word("kqv.export({path!r}, hf=DIR, merge=True)", f"`kqv export {{path}} {flag.HF} DIR {flag.MERGE}`")
MERGE = Word("pass merge=True", f"add {flag.MERGE}")
DEVICE_CPU = Word("device='cpu'", f"{flag.DEVICE} cpu")
MODEL_ON_CPU = Word("a model on the CPU", f"{flag.DEVICE} cpu")
BFLOAT16 = Word("dtype=torch.bfloat16", f"{flag.DTYPE} bf16")
