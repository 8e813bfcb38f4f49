"""A corpus bigger than memory: `prepare` encodes a text once into a token corpus on disk
(`kqv.data.token_corpus`), and `PreparedCorpus` is the LM job's corpus kind that trains on one (`data.path` a
prepared directory) without reading it into memory.

`prepare(text, out)` streams the text in chunks (`CHUNK_BYTES`), encodes each chunk's pieces in one batched call
(the Hugging Face tokenizers library encodes them on every core), appends the ids to `tokens.bin.partial` and
records after each chunk, atomically, where the text and the array stand (`prepare.json`): a prepare that is killed
continues from its last completed chunk, to the same bytes, and a finished one is not redone. The tokenizer is
`"bpe"` (kqv's byte-level BPE, trained on `SAMPLE_BYTES` of the text spread evenly over it), `"char"` (the text's
characters, in a first pass over it), or the directory of a saved kqv tokenizer or of a kqv run (its `tokenizer/`),
which `--init` needs: a fine-tune's corpus must be encoded with its source's tokenizer.

Training on it (`kqv train lm --data DIR`) holds out the last `data.val_fraction` of the ids for validation; blocks
are drawn as from a text (`kqv.data.batches.sample_batch`'s starts, from the generator of (seed, batch)), and
under torchrun each rank reads only the blocks of its own rows of the global batch, the rows
`kqv.train.distributed.share` would give it: the same windows for the same seed and step on any number of ranks.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from ..data.batches import batch_generator
from ..data.token_corpus import (
    ARRAY,
    FORMAT,
    MANIFEST,
    STATE,
    TOKENIZER,
    TokenCorpus,
    digest,
    is_token_corpus,
    no_texts,
    pieces,
    read_chunks,
    read_windows,
    sample_text,
    text_files,
    token_dtype,
    window_starts,
)
from ..data.tokenizers import Tokenizer, check_vocab_size, encode_texts, load_tokenizer, make_tokenizer
from ..errors import (
    MOVED_CORPUS,
    PREPARE_WITH_TOKENIZER,
    SAMPLE_MB,
    TRAIN_ON_CORPUS,
    VOCAB_SIZE,
    ConfigError,
    DataError,
    KqvError,
    RunError,
    option,
)
from ..interop.directories import read_hf_tokenizer
from ..nn.config import ModelConfig
from ..train.config import TrainConfig
from ..train.distributed import OwnRows
from ..train.files import disk_full_reported, sha256, write_files, write_text
from ..train.layout import RunFiles
from ..train.options import TrainerOptions
from ..train.perplexity import perplexity
from ..train.rundir import RunDirectory
from ..train.runs import read_run
from ..train.topology import Topology
from .base import is_hf_directory
from .lm_corpus import SCORED_TOKENS, Check, LMTokenizerSource, LoadedText, TextBlocks, block_options
from .lm_data import DataConfig

CHUNK_BYTES = 16 << 20  # the text read, encoded and recorded at a time
VOCAB_SIZE_DEFAULT = 4096  # a new BPE's vocabulary
SAMPLE_BYTES = 32 << 20  # the text a new BPE is trained on, in 1 MiB blocks spread over the corpus
PARTIAL, LOCK = ARRAY + ".partial", ".prepare.lock"
PIECES = 64  # the pieces of a chunk encoded in one batched call


@dataclass(frozen=True)
class Prepared:
    """What `prepare` made (or found made): the corpus directory and its manifest; `resumed_at` the tokens an
    unfinished prepare had written before this one went on, `already` whether it was finished before the call."""

    path: Path
    manifest: dict[str, Any]
    resumed_at: int = 0
    already: bool = False


def prepare(
    text: str | Path,
    out: str | Path,
    *,
    tokenizer: str = "bpe",
    vocab_size: int | None = None,
    sample_bytes: int | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    progress: bool = True,
) -> Prepared:
    """Encode the text file or directory of .txt files `text` into a token corpus at `out` (the module docstring):
    `tokenizer` "bpe" (of `vocab_size` tokens, `VOCAB_SIZE` unless given, trained on `sample_bytes` of the text,
    `SAMPLE_BYTES` unless given), "char", or a saved tokenizer's directory (which refuse both options: they would
    be ignored). Nothing is written over an input or over anything `out` held that is not an unfinished prepare of
    the same text and settings."""
    vocab_size, sample_bytes = bpe_options(tokenizer, vocab_size, sample_bytes)
    check_prepare_options(text, vocab_size, sample_bytes)
    files = [f.resolve() for f in text_files(Path(text).expanduser())]
    if tokenizer not in ("bpe", "char") and not Path(tokenizer).expanduser().is_dir():
        raise DataError(
            f"tokenizer {tokenizer!r} is not 'bpe', 'char', or the directory of a saved kqv tokenizer, a kqv run "
            f"or a Hugging Face GPT-2 model"
        )
    out = Path(out).expanduser()
    check_output(out, Path(text).expanduser(), files)
    plan = {
        "sources": [{"path": str(f), "bytes": f.stat().st_size, "sha256": digest(f)} for f in files],
        "tokenizer": tokenizer if tokenizer in ("bpe", "char") else str(Path(tokenizer).resolve()),
        "vocab_size": vocab_size if tokenizer == "bpe" else None,
        "sample_bytes": sample_bytes if tokenizer == "bpe" else None,
    }
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with locked(out):
            return prepare_into(out, files, plan, chunk_bytes, progress)
    except Exception as error:
        refused = isinstance(error, KqvError) and not isinstance(error, OSError)  # the text or settings: no resume
        if created and (refused or not holds_tokens(out)):  # what this call made and cannot resume goes
            shutil.rmtree(out, ignore_errors=True)
        raise


def bpe_options(tokenizer: str, vocab_size: int | None, sample_bytes: int | None) -> tuple[int, int]:
    """The vocabulary and sample of a new BPE (`VOCAB_SIZE`, `SAMPLE_BYTES` where not given); refused (ConfigError)
    when given for another tokenizer, which has its own vocabulary and trains on nothing."""
    if tokenizer != "bpe":
        named = {option(VOCAB_SIZE): vocab_size, option(SAMPLE_MB): sample_bytes}
        given = " and ".join(name for name, value in named.items() if value is not None)
        if given:
            verb = "shape" if " and " in given else "shapes"
            raise ConfigError(
                f"{given} {verb} only a new BPE tokenizer, and the tokenizer here is {tokenizer!r}, which keeps its "
                f"own vocabulary: drop {given}, or prepare with the tokenizer 'bpe'"
            )
    return (VOCAB_SIZE_DEFAULT if vocab_size is None else vocab_size), (
        SAMPLE_BYTES if sample_bytes is None else sample_bytes
    )


def check_prepare_options(text: str | Path, vocab_size: int, sample_bytes: int) -> None:
    """Refuse, before anything is written, an empty text path (which would name the current directory), a
    vocabulary no BPE can be trained to, and a sample of less than a byte."""
    if not str(text).strip():
        raise DataError("the text path is empty; give a text file or a directory of .txt files")
    check_vocab_size(vocab_size, option(VOCAB_SIZE))
    if sample_bytes < 1:
        raise ConfigError(
            f"{option(SAMPLE_MB)} leaves {sample_bytes} bytes of text to train a BPE on; give at least a few MiB "
            f"(default 32)"
        )


def prepare_into(out: Path, files: list[Path], plan: dict[str, Any], chunk_bytes: int, progress: bool) -> Prepared:
    """`prepare` in the locked directory `out`: the finished corpus found, an unfinished prepare continued, or a
    new one started."""
    if (out / MANIFEST).is_file():
        manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
        if not same_plan(manifest.get("plan"), plan):
            raise DataError(
                f"{out} holds a corpus prepared from other text or settings (a source changed, or other options); "
                f"give another output directory or remove it"
            )
        return Prepared(out, manifest, manifest["tokens"], already=True)
    state = read_state(out, plan)
    if state is None:
        tok = new_tokenizer(plan["tokenizer"], files, plan["vocab_size"], plan["sample_bytes"])
        write_files(out / TOKENIZER, tok.files())
        state = {"plan": plan, "file": 0, "offset": 0, "tokens": 0}
        with open(out / PARTIAL, "wb"):
            pass
        write_text(out / STATE, json.dumps(state, indent=2) + "\n")
    else:
        tok = load_tokenizer(out / TOKENIZER)
    return Prepared(out, encode_all(out, files, tok, state, chunk_bytes, progress), state["tokens"])


def same_plan(recorded: dict[str, Any] | None, plan: dict[str, Any]) -> bool:
    """Whether a finished corpus's `recorded` plan is `plan`: the same sources (path, size and SHA-256: a text
    changed in place at the same size is another text) and options. A corpus prepared before sources were hashed
    compares by path and size."""
    if recorded is None or any("sha256" in source for source in recorded["sources"]):
        return recorded == plan
    unhashed = [{k: v for k, v in source.items() if k != "sha256"} for source in plan["sources"]]
    return recorded == {**plan, "sources": unhashed}


def holds_tokens(out: Path) -> bool:
    """Whether `out` holds a finished corpus or an unfinished prepare that recorded tokens (what a failure keeps)."""
    if (out / MANIFEST).is_file():
        return True
    try:
        return json.loads((out / STATE).read_text(encoding="utf-8"))["tokens"] > 0
    except (OSError, ValueError, KeyError, TypeError):
        return False


def check_output(out: Path, text: Path, files: list[Path]) -> None:
    """Refuse an output that is an input, a file, or a directory holding anything but a prepare's own files."""
    if out.exists() and not out.is_dir():
        raise DataError(f"{out} is not a directory; give a new or empty directory for the corpus")
    if out.resolve() in {text.resolve(), *files} or any(f.is_relative_to(out.resolve()) for f in files):
        raise DataError(f"{out} holds the text being prepared; give the corpus a directory of its own")
    ours = {MANIFEST, ARRAY, TOKENIZER, STATE, PARTIAL, LOCK}
    others = sorted(p.name for p in out.iterdir() if p.name not in ours) if out.is_dir() else []
    if others:
        raise DataError(f"{out} holds other files ({', '.join(others[:3])}); give a new or empty directory")


@contextmanager
def locked(out: Path) -> Iterator[None]:
    """The prepare's lock on `out`: a second prepare into it at once is refused instead of mixing their writes."""
    with open(out / LOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataError(f"another prepare is writing {out}; wait for it, or give another directory") from None
        yield


def read_state(out: Path, plan: dict[str, Any]) -> dict[str, Any] | None:
    """An unfinished prepare's progress (None if there is none), its partial array cut back to what it recorded."""
    if not (out / STATE).is_file():
        return None
    state = json.loads((out / STATE).read_text(encoding="utf-8"))
    if state.get("plan") != plan:
        raise DataError(
            f"{out} holds an unfinished prepare of other text or settings; give another output directory or remove it"
        )
    size = state["tokens"] * token_dtype(load_tokenizer(out / TOKENIZER).vocab_size).itemsize
    if not (out / PARTIAL).is_file() and (out / ARRAY).is_file():  # stopped between the array's rename and the
        os.replace(out / ARRAY, out / PARTIAL)  # manifest: every chunk was recorded, the manifest is written again
    if not (out / PARTIAL).is_file() or (out / PARTIAL).stat().st_size < size:
        raise DataError(f"{out / PARTIAL} is shorter than {out / STATE} records; remove {out} and prepare again")
    os.truncate(out / PARTIAL, size)  # the ids of a chunk whose progress was never recorded go
    return state


def new_tokenizer(kind: str, files: list[Path], vocab_size: int, sample_bytes: int) -> Tokenizer:
    """The tokenizer of a new corpus: a BPE trained on a sample, the characters of the whole text, or a saved one
    (a tokenizer's directory, a run's with a `tokenizer/` in it, or a Hugging Face GPT-2 directory's)."""
    if kind == "bpe":
        return make_tokenizer("bpe", sample_text(files, sample_bytes), vocab_size)
    if kind == "char":
        chars: set[str] = set()
        for f in files:
            for text, _ in read_chunks(f, 0, CHUNK_BYTES):
                chars.update(text)
        return make_tokenizer("char", "".join(sorted(chars)))
    path = Path(kind).expanduser()
    if is_hf_directory(path):  # a Hugging Face GPT-2 directory: GPT-2's own BPE, as `--init` reads it
        return read_hf_tokenizer(path)
    if RunFiles(path).tokenizer_dir.is_dir():  # a run's
        path = RunFiles(path).tokenizer_dir
    return load_tokenizer(path)


def encode_chunk(tokenizer: Tokenizer, text: str, dtype: np.dtype) -> np.ndarray:
    """The ids of one chunk of text, its pieces encoded in one batched (parallel) call."""
    ids = encode_texts(tokenizer, pieces(text, PIECES))
    return np.concatenate([np.asarray(i, dtype=dtype) for i in ids]) if ids else np.zeros(0, dtype)


def encode_all(
    out: Path, files: list[Path], tokenizer: Tokenizer, state: dict[str, Any], chunk_bytes: int, progress: bool
) -> dict[str, Any]:
    """Encode the text from where `state` stands, recording after each chunk; then the manifest, which marks the
    corpus finished."""
    dtype = token_dtype(tokenizer.vocab_size)
    sizes = [f.stat().st_size for f in files]
    done = sum(sizes[: state["file"]]) + state["offset"]
    bar = tqdm(total=sum(sizes), initial=done, unit="B", unit_scale=True, desc="prepare", disable=not progress)
    with bar, open(out / PARTIAL, "ab") as array:
        for index in range(state["file"], len(files)):
            start = state["offset"] if index == state["file"] else 0
            for text, offset in read_chunks(files[index], start, chunk_bytes):
                ids = encode_chunk(tokenizer, text, dtype)
                with disk_full_reported(out / PARTIAL, ids.nbytes):  # a full disk: the bytes this chunk needs
                    array.write(ids.tobytes())
                    array.flush()
                    os.fsync(array.fileno())
                bar.update(offset - start)
                start = offset
                state = {**state, "file": index, "offset": offset, "tokens": state["tokens"] + len(ids)}
                write_text(out / STATE, json.dumps(state, indent=2) + "\n")
    if not state["tokens"]:
        raise DataError(f"{', '.join(str(f) for f in files)} holds no text; give a text with some")
    manifest = {
        "format": FORMAT,
        "version": 1,
        "dtype": dtype.str,
        "tokens": state["tokens"],
        "vocab_size": tokenizer.vocab_size,
        "sha256": sha256(out / PARTIAL),
        "tokenizer": {"kind": tokenizer.kind, "sample_bytes": state["plan"]["sample_bytes"]},
        "sources": state["plan"]["sources"],
        "plan": state["plan"],
    }
    os.replace(out / PARTIAL, out / ARRAY)
    write_text(out / MANIFEST, json.dumps(manifest, indent=2) + "\n")  # present means complete
    (out / STATE).unlink()
    return manifest


@dataclass(frozen=True, eq=False)
class LoadedPrepared(LoadedText):
    """A prepared token corpus, loaded: its tokenizer, and its splits (`train`, `val`) as views of its memmap
    (`ids`: the same, as numpy arrays), the last `data.val_fraction` held out; the characters are not counted."""

    ids: tuple[np.ndarray, np.ndarray]

    def vocab(self) -> int | None:
        return None  # a prepared corpus's ids are its tokenizer's (`TokenCorpus.open` checked them)

    def trainer_options(self, train: TrainConfig, topology: Topology, model: ModelConfig) -> TrainerOptions:
        """The Trainer's batches: blocks at the starts `sample_batch` draws for (seed, i), the rows of this process
        of `topology` alone, read from the memmap."""
        batch, context, seed = train.batch_size, self.data.context, train.seed
        rank, world = topology.rank, topology.world_size
        train_ids, val_ids = self.ids

        def train_batches(i: int) -> Any:
            return own_windows(train_ids, batch, context, batch_generator(seed, i), rank, world)

        def val_batches(i: int) -> Any:
            return own_windows(val_ids, batch, context, batch_generator(seed, -i - 1), rank, world)

        return block_options(train_batches, val_batches, batch * context)

    def held_out(self, model: torch.nn.Module, max_tokens: int | None) -> dict[str, Any]:
        """`perplexity` of the corpus's held-out tail (up to `max_tokens`, default `SCORED_TOKENS`), read from the
        corpus at `data.path` (a run keeps no copy of it)."""
        ids = torch.from_numpy(np.asarray(self.ids[1][: (max_tokens or SCORED_TOKENS) + 1], dtype=np.int64))
        return {"source": HELD_OUT_TAIL, **perplexity(model, ids, context=self.data.context, max_tokens=max_tokens)}


class PreparedCorpus(TextBlocks):
    """The LM job's corpus kind for a prepared token corpus (`data.path` names one, and a run records its tokens'
    SHA-256 as data.tokens_sha256): the tokenizer is the corpus's, the splits are views of its memmap
    (`LoadedPrepared`), and the batches are blocks read from it, each rank reading only its own rows."""

    own_tokenizer = True

    @staticmethod
    def reads(data: DataConfig) -> bool:
        return data.tokens_sha256 is not None or is_token_corpus(data.path)

    @classmethod
    def check_as_source(cls, path: str | None, data: DataConfig) -> None:
        """A prepared corpus trains alone, on its blocks: never as documents, nor in a mixture."""
        if not data.sources:
            raise ConfigError(
                f"{path} is a prepared token corpus, which trains on blocks with data.objective='next_token' "
                f"alone; drop data.objective and data.sources, or give the text itself"
            )
        raise ConfigError(
            f"{path} is a prepared token corpus, which trains alone ({option(TRAIN_ON_CORPUS, path=path)}), not in "
            f"a mixture of sources; mix the text it was prepared from instead"
        )

    @staticmethod
    def moves(saved: dict[str, Any]) -> bool:
        """`Corpus.moves`: a run that recorded its prepared corpus's tokens' SHA-256 (`saved`, run.toml's settings)
        checks the corpus at a new data.path against it (`recorded`)."""
        return saved.get("data", {}).get("tokens_sha256") is not None

    def check(self) -> None:
        super().check()
        if self.data.path is None:
            raise ConfigError("data.tokens_sha256 is a prepared corpus's; give its directory as data.path")

    def recorded(self, run_dir: Path, expected: str | None) -> TokenCorpus:
        """The corpus at data.path (`TokenCorpus.open`), refused in one line when it is not the one whose tokens'
        SHA-256 the run `run_dir` recorded (`expected`; None: a run from before kqv recorded it), or is gone."""
        path = Path(self.data.path).expanduser()
        moved = option(MOVED_CORPUS, run=str(run_dir))
        if expected is not None and not is_token_corpus(path):
            if (path / ARRAY).is_file() or (path / TOKENIZER).is_dir():
                raise no_texts(path)  # its manifest gone: said so, not "moved"
            raise DataError(
                f"the prepared corpus {run_dir} trained on is not at {path} (moved or removed); give its new place "
                f"with {moved}"
            )
        corpus = TokenCorpus.open(path)
        if expected is not None and corpus.manifest.get("sha256") != expected:
            raise DataError(
                f"{path} is not the corpus {run_dir} trained on: its tokens' SHA-256 is "
                f"{corpus.manifest.get('sha256', '?')[:12]}..., the run's {expected[:12]}... (prepared again from "
                f"other text or with another tokenizer); give the corpus it trained on with {moved}, or start a new run"
            )
        return corpus

    def settled_data(self, run: RunDirectory) -> DataConfig:
        """What run.toml records of this corpus: its absolute path, its tokens' SHA-256, and its tokenizer's kind
        and size (a prepared corpus fixes them, whatever the config said). A run recorded before kqv kept the
        SHA-256 resumes with its [data] as it was."""
        if run.resuming and recorded_sha256(run.path) is None:
            return self.data
        path = Path(self.data.path).expanduser().resolve()
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))  # `load` verified it
        kind = manifest["tokenizer"]["kind"]
        return replace(
            self.data,
            path=str(path),
            tokens_sha256=manifest["sha256"],
            tokenizer=kind,
            vocab_size=manifest["vocab_size"],
        )

    def load(self, tokenizers: LMTokenizerSource, run: RunDirectory, check: Check) -> LoadedPrepared:
        """The corpus verified (`TokenCorpus.open`; a resumed run's against the SHA-256 it recorded, `recorded`),
        its tokenizer checked against a fine-tune's source (`tokenizers.check_prepared`) and against a resumed
        run's, and saved in the run (by rank 0) so that the run is used without the corpus; `check`ed before
        anything is written."""
        data = self.data
        expected = data.tokens_sha256 or (recorded_sha256(run.path) if run.resuming else None)
        corpus = self.opened(self.recorded(run.path, expected))
        tokenizer = corpus.tokenizer
        tokenizers.check_prepared(tokenizer, data.path)
        if run.resuming and run.tokenizer_dir.is_dir():
            if tokenizers.load_tokenizer(run.path).files() != tokenizer.files():
                raise RunError(
                    f"{data.path}'s tokenizer is not the one {run.path} trained with: the corpus was prepared "
                    f"again or replaced; give the corpus it trained on, or start a new run"
                )
        check(corpus)
        if run.writes and not run.resuming:
            run.path.mkdir(parents=True, exist_ok=True)
            run.write_tokenizer(tokenizer.files())
        return corpus

    def opened(self, corpus: TokenCorpus) -> LoadedPrepared:
        """The loaded corpus of the token corpus `corpus`: its tokenizer and its splits."""
        train, val = corpus.split(self.data.val_fraction)
        return LoadedPrepared(corpus.tokenizer, tensor_view(train), tensor_view(val), None, self.data, (train, val))

    def trained(self, tokenizer: Tokenizer, run_dir: Path) -> LoadedPrepared:
        """A trained run's corpus: the one at `data.path` (a run keeps no copy of it) whose SHA-256 the run
        recorded (`recorded`), its tokens checked against it (read once: tokens changed in place, the manifest
        left as it was, are refused, as a resume refuses them), encoded by the run's `tokenizer`."""
        corpus = self.recorded(run_dir, self.data.tokens_sha256)
        if corpus.tokenizer.files() != tokenizer.files():
            remedy = (  # the run's own corpus, moved; or, for a run of a text or pairs, one encoded as it encodes
                f"give the corpus it trained on with {option(MOVED_CORPUS, run=str(run_dir))}"
                if self.data.tokens_sha256 is not None
                else f"a run scores a corpus its own tokenizer encoded: "
                f"{option(PREPARE_WITH_TOKENIZER, source=str(run_dir))}"
            )
            raise DataError(f"{self.data.path} was prepared with another tokenizer than {run_dir}'s; {remedy}")
        return self.opened(corpus)


HELD_OUT_TAIL = "the held-out tail of the prepared corpus"


def recorded_sha256(run_dir: Path) -> str | None:
    """The SHA-256 of the corpus's tokens that the run in `run_dir` recorded (None: none, or no run.toml yet)."""
    if not RunFiles(run_dir).config_file.is_file():
        return None
    return read_run(run_dir).get("data", {}).get("tokens_sha256")


def own_windows(
    ids: np.ndarray, batch: int, context: int, generator: torch.Generator, rank: int, world: int
) -> tuple[torch.Tensor, torch.Tensor] | OwnRows:
    """Batch i of `ids` as one process trains it, or under torchrun this rank's rows of it: the global batch's
    starts are drawn (`batch` numbers), rank r reads the blocks of rows [r * batch // world, (r + 1) * batch //
    world). A rank left without rows reads row 0 with weight 0, as `share` would cut it."""
    starts = window_starts(len(ids), batch, context, generator)
    if world == 1:
        return read_windows(ids, starts, context)
    first, end = rank * batch // world, (rank + 1) * batch // world
    if first == end:
        return OwnRows(read_windows(ids, starts[:1], context), 0.0)
    return OwnRows(read_windows(ids, starts[first:end], context), world * (end - first) / batch)


def tensor_view(ids: np.ndarray) -> torch.Tensor:
    """A read-only memmap as a tensor over the same pages (nothing read; torch warns that it is not writable)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(ids)


def describe(prepared: Prepared) -> str:
    """The line `kqv prepare` prints."""
    manifest = prepared.manifest
    done = (
        "already prepared"
        if prepared.already
        else f"resumed at {prepared.resumed_at:,} tokens"
        if prepared.resumed_at
        else "prepared"
    )
    size = sum(s["bytes"] for s in manifest["sources"])
    return (
        f"{prepared.path}: {done}, {manifest['tokens']:,} tokens ({np.dtype(manifest['dtype']).name}) of "
        f"{size:,} bytes of text, {manifest['tokenizer']['kind']} tokenizer of {manifest['vocab_size']:,} tokens"
    )
