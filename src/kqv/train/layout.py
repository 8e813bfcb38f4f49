"""What a run directory holds and writes: the names of its files, the one place that turns "the run's tokenizer"
into a path (`RunFiles`), and its checksums (SHA256SUMS).

A run directory (`kqv train NAME --out DIR`) holds:

    run.toml            the whole run config, `task = NAME`, and the exact [model] it trained (vocab_size included)
    tokenizer/          the tokenizer (kqv.data.tokenizers; plus specials.json for the encoder's vocabulary)
    tokens.safetensors  the encoded splits of a language-model corpus (lm, mlm)
    pairs.safetensors   the encoded sentence pairs (mt), with data/{dev,test}.{src,tgt}, the held-out text
    checkpoint/         weights, optimizer and generator states (kqv.train.checkpoints; shards: kqv.train.shards)
    metrics.jsonl       one record per log or evaluation step, and loss.png (kqv.train.metrics)
    tensorboard/        the same records as TensorBoard's events, metrics.csv as a table, wandb/ a Weights & Biases
                        run's files: each only where `train.loggers` names it (kqv.train.loggers)
    samples.txt         generated text (lm); test.hyp: the test translations (mt)
    summary.json        the final figures of the run
    SHA256SUMS          the checksums of run.toml and the data files, verified when read back (`record`)
    .lock               the writer's lock (kqv.train.rundir.hold_run_lock)

Runs written before kqv had subpackages use the same files and load unchanged.

`RunFiles(path)` names a run's files by what each holds and writes and verifies them through the one writer
(`kqv.train.files`), so that jobs, commands, the explorer, the checkpoints and the run directory's owner during a
training (`kqv.train.rundir.RunDirectory`, a `RunFiles`) ask the run for a path and never join a file name to it
themselves (`tests/test_train_structure.py` scans for that). A checkpoint's own files (`CHECKPOINT_FORMAT`) are
joined to its directory by the checkpoints' modules alone (`kqv.train.checkpoints`, `kqv.train.saving`,
`kqv.train.shards`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from torch import Tensor

from ..errors import IF_EXISTS_OVERWRITE, RESEAL, RunError, option
from .files import TEMPORARY, sha256, write_atomically, write_files, write_tensors, write_text, write_through

# what a job writes
RUN_CONFIG, TOKENIZER_DIR, SUMMARY_FILE = "run.toml", "tokenizer", "summary.json"
TOKENS_FILE, PAIRS_FILE, TEXT_DIR = "tokens.safetensors", "pairs.safetensors", "data"
SAMPLES_FILE, TEST_HYPOTHESES_FILE = "samples.txt", "test.hyp"
MANIFEST_FILE = "SHA256SUMS"  # the data files' checksums (`record`)
# what the trainer writes
METRICS_FILE, PLOT_FILE = "metrics.jsonl", "loss.png"
TENSORBOARD_DIR, CSV_FILE, WANDB_DIR = "tensorboard", "metrics.csv", "wandb"  # train.loggers' (kqv.train.loggers)
WANDB_ID_FILE = "kqv-run-id"  # in wandb/: the id of the W&B run a resume continues
CHECKPOINT_DIR = "checkpoint"
PREVIOUS_CHECKPOINT_DIR = "checkpoint.old"  # exists only between the two renames of a checkpoint swap
MODEL_FILE, OPTIMIZER_FILE, RNG_FILE, STATE_FILE = "model.safetensors", "optimizer.pt", "rng.safetensors", "state.json"
SHARDS_DIR = "shards"  # a sharded run's checkpoint: every rank's shards, torch.distributed.checkpoint's layout
STAGING_PREFIX = ".checkpoint-tmp-"  # a checkpoint being written, beside the run's (`write_directory`)
LOCK_FILE = ".lock"  # the writer's lock (kqv.train.rundir.hold_run_lock)

JOB_FILES = {
    RUN_CONFIG,
    TOKENIZER_DIR,
    SUMMARY_FILE,
    TOKENS_FILE,
    PAIRS_FILE,
    TEXT_DIR,
    SAMPLES_FILE,
    TEST_HYPOTHESES_FILE,
}
# what marks an earlier run (the loggers' files too: an overwrite deletes them with the rest)
TRAINER_FILES = (CHECKPOINT_DIR, PREVIOUS_CHECKPOINT_DIR, METRICS_FILE, PLOT_FILE, TENSORBOARD_DIR, CSV_FILE, WANDB_DIR)
RUN_FORMAT = {*JOB_FILES, MANIFEST_FILE, *TRAINER_FILES, LOCK_FILE}  # everything kqv writes into a run directory

CHECKPOINT_FORMAT = {MODEL_FILE, OPTIMIZER_FILE, RNG_FILE, STATE_FILE, SHARDS_DIR}  # what a checkpoint/ holds


class RunFiles:
    """The files of the run directory `path`, by what each holds; each written atomically and read back verified
    against the run's SHA256SUMS (`verify`)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    # -- what a job writes -----------------------------------------------------------------------------------

    @property
    def config_file(self) -> Path:
        """run.toml: the run's whole config, read back to resume, generate or evaluate."""
        return self.path / RUN_CONFIG

    @property
    def summary_file(self) -> Path:
        """summary.json: the finished run's figures, written last."""
        return self.path / SUMMARY_FILE

    @property
    def tokenizer_dir(self) -> Path:
        """tokenizer/: the files of the run's tokenizer (or vocabulary)."""
        return self.path / TOKENIZER_DIR

    @property
    def tokens_file(self) -> Path:
        """The encoded splits of a text corpus (the LM and MLM jobs')."""
        return self.path / TOKENS_FILE

    @property
    def pairs_file(self) -> Path:
        """The encoded splits of a translation run's sentence pairs."""
        return self.path / PAIRS_FILE

    @property
    def text_dir(self) -> Path:
        """The held-out texts a translation run scores (sources and references of dev and test)."""
        return self.path / TEXT_DIR

    @property
    def samples_file(self) -> Path:
        """The samples (or a fine-tune's completions) generated when training ends."""
        return self.path / SAMPLES_FILE

    @property
    def predictions_file(self) -> Path:
        """A translation run's translations of its test sources (hypotheses, one a line)."""
        return self.path / TEST_HYPOTHESES_FILE

    @property
    def manifest_file(self) -> Path:
        """SHA256SUMS: the checksums of run.toml and the data files (`record`)."""
        return self.path / MANIFEST_FILE

    # -- what the trainer writes -----------------------------------------------------------------------------

    @property
    def metrics_file(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def plot_file(self) -> Path:
        return self.path / PLOT_FILE

    @property
    def tensorboard_dir(self) -> Path:
        """tensorboard/: the metrics as TensorBoard's event files (`train.loggers`), written by its own writer."""
        return self.path / TENSORBOARD_DIR

    @property
    def csv_file(self) -> Path:
        """metrics.csv: the metrics as a table, a row per record (`train.loggers`)."""
        return self.path / CSV_FILE

    @property
    def wandb_dir(self) -> Path:
        """wandb/: a Weights & Biases run's files (`train.loggers`), written by wandb itself."""
        return self.path / WANDB_DIR

    @property
    def wandb_id_file(self) -> Path:
        """The id of the run's W&B run, which a resume continues."""
        return self.wandb_dir / WANDB_ID_FILE

    @property
    def checkpoint_dir(self) -> Path:
        """checkpoint/: the last checkpoint, swapped in whole (`kqv.train.checkpoints.write_checkpoint`)."""
        return self.path / CHECKPOINT_DIR

    @property
    def previous_checkpoint_dir(self) -> Path:
        """checkpoint.old/: the checkpoint a swap moved aside, there only between the swap's two renames."""
        return self.path / PREVIOUS_CHECKPOINT_DIR

    @property
    def checkpoint_to_read(self) -> Path:
        """The directory of the checkpoint a reader reads: checkpoint/, or checkpoint.old/ when a swap was
        interrupted after the old checkpoint moved aside and before the new one moved in."""
        if not self.checkpoint_dir.exists() and self.previous_checkpoint_dir.exists():
            return self.previous_checkpoint_dir
        return self.checkpoint_dir

    @property
    def weights_file(self) -> Path:
        """The checkpoint's model weights (checkpoint.old/'s while a swap is interrupted, as a reader takes them)."""
        return self.checkpoint_to_read / MODEL_FILE

    @property
    def lock_file(self) -> Path:
        """.lock: the writer's lock, held for a whole training (`kqv.train.rundir.hold_run_lock`)."""
        return self.path / LOCK_FILE

    def held(self) -> list[Path]:
        """Every path kqv writes into a run directory (present or not): what no command may write over."""
        return [self.path / name for name in sorted(RUN_FORMAT)]

    def job_files(self) -> list[Path]:
        """Every path a job's preparation writes (present or not): run.toml, the tokenizer, the data, samples,
        predictions, summary.json and SHA256SUMS."""
        return [self.path / name for name in sorted({*JOB_FILES, MANIFEST_FILE})]

    def trainer_files(self) -> list[Path]:
        """The trainer's files of an earlier run that are there (checkpoint, metrics, plot): what refusing,
        resuming or overwriting decides about."""
        return [self.path / name for name in TRAINER_FILES if (self.path / name).exists()]

    def data_directories(self) -> list[Path]:
        """The directories a run writes whole (tokenizer/, data/), where a killed writer may leave temporaries."""
        return [self.tokenizer_dir, self.text_dir]

    # -- writing ---------------------------------------------------------------------------------------------

    def write_tokenizer(self, files: dict[str, str]) -> None:
        """The tokenizer's files (its `files()`: name -> text) in tokenizer/, each atomically."""
        write_files(self.tokenizer_dir, files)

    def write_tokens(self, data: bytes) -> None:
        """The encoded splits (a safetensors file's bytes), atomically: present means complete, tokenizer too."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomically(self.tokens_file, data)

    def write_pairs(self, tensors: dict[str, Tensor]) -> None:
        """A translation run's encoded splits, atomically."""
        write_tensors(self.pairs_file, tensors)

    def write_texts(self, files: dict[str, str]) -> None:
        """A translation run's held-out texts (name -> text), each atomically."""
        write_files(self.text_dir, files)

    def write_predictions(self, lines: list[str]) -> None:
        """A translation run's translations of its test sources, one a line, atomically."""
        write_text(self.predictions_file, "".join(line + "\n" for line in lines))

    def copy_data_from(self, source: RunFiles) -> None:
        """The tokenizer, encoded data and texts of the run `source`, verified against its SHA256SUMS, copied in
        through the writer and recorded in this run's SHA256SUMS with the digests the source recorded: reading them
        back (`verify_data`) checks the copies against the source's record (`--data-from`)."""
        copy_files(source.path, self.path, DATA_FILES)

    def record(self, *, keep: bool = False) -> None:
        """run.toml's and the data files' checksums in SHA256SUMS (`record`)."""
        record(self.path, keep=keep)

    # -- reading back, verified ------------------------------------------------------------------------------

    def verify(self, *held: Path) -> None:
        """RunError when a file under the paths `held` (this run's: `tokenizer_dir`, `tokens_file`...) that the
        run's SHA256SUMS records is missing or differs from its record."""
        verify(self.path, *(self._name(path) for path in held))

    def verify_data(self) -> None:
        """`verify` for every data file a run reads back besides its checkpoint (tokenizer, tokens, pairs, texts)."""
        verify(self.path, *DATA_FILES)

    def read_verified(self, held: Path) -> bytes:
        """The bytes of this run's file `held`, verified against its SHA256SUMS (RunError if damaged or missing)."""
        return read_verified(self.path, self._name(held))

    def _name(self, held: Path) -> str:
        return Path(held).relative_to(self.path).as_posix()


def remedy(path: Path) -> str:
    """What to do about a broken checkpoint, in the words of the interface the user called (`option`)."""
    overwrite = option(IF_EXISTS_OVERWRITE)
    return f"restore {path} from a backup, or start the run over with {overwrite} (which deletes it)"


# ---------------------------------------------------------------------------------------------------------------
# The checksums of a run's data files (SHA256SUMS)
#
# The checksums of a run's data files: `SHA256SUMS`, written when training starts and verified whenever a file
# is read back, so that a damaged tokenizer or encoded corpus is reported as such instead of failing deep inside
# a loader (or, worse, loading silently different data).
#
# The checkpoint's files carry their own SHA-256 in `checkpoint/state.json` (kqv.train.checkpoints). This manifest
# covers run.toml (a truncated one may still parse) and the rest of what is read back: `tokenizer/`,
# `tokens.safetensors`, `pairs.safetensors` and `data/`. It is in `sha256sum`'s format, so
# `cd RUN && sha256sum -c SHA256SUMS` checks a run by hand too. A run written before the manifest existed has none,
# and loads unchecked, as it always did. A run that had one and lost it is damaged, not old: each checkpoint's
# state.json says whether the run held its manifest when it was written (`CHECKSUMS_KEPT`), and a manifest missing
# from such a run is an error (`lost_checksums`) until the run is sealed again on purpose (`reseal`).


DATA_FILES = (TOKENIZER_DIR, TOKENS_FILE, PAIRS_FILE, TEXT_DIR)  # what a run reads back besides its checkpoint


def recorded_files(run_dir: Path, names: tuple[str, ...]) -> list[str]:
    """The files among `names` (each a file or a directory of files) that `run_dir` holds, as relative paths."""
    found = []
    for name in names:
        path = run_dir / name
        if path.is_file():
            found.append(name)
        elif path.is_dir():
            found += sorted(p.relative_to(run_dir).as_posix() for p in path.rglob("*") if p.is_file())
    return [name for name in found if not name.endswith(TEMPORARY)]


def record(
    run_dir: Path, names: tuple[str, ...] = DATA_FILES, *, keep: bool = False, known: dict[str, str] | None = None
) -> None:
    """Write the SHA-256 of run.toml and the data files `names` of `run_dir` into its manifest (when training
    starts: run.toml just written, the data prepared). With `keep` (a resumed run, whose data were read back
    verified) a data file already recorded keeps its digest: a damaged file is never re-blessed. `known`: digests
    to record as given (copies of another run's files, recorded as it recorded them: `copy_files`)."""
    digests = read_manifest(run_dir) if keep else {}
    digests.update(known or {})
    digests.pop(RUN_CONFIG, None)  # rewritten by every start, a resumed one too
    names = (RUN_CONFIG, *names)
    for name in recorded_files(run_dir, names):
        digests.setdefault(name, sha256(run_dir / name))
    text = "".join(f"{digest}  {name}\n" for name, digest in sorted(digests.items()))
    write_atomically(run_dir / MANIFEST_FILE, text.encode())


def copy_files(source: Path, run_dir: Path, names: tuple[str, ...]) -> None:
    """Copy the data files `names` (files or directories of files) of the run `source` into `run_dir`: the source's
    verified against its manifest first, each copy written atomically, and `run_dir`'s manifest rewritten to record
    them with the digests the source recorded (computed for a file it does not list), so that reading the copies
    back verifies them against the source's record."""
    verify(source, *names)
    recorded = read_manifest(source)
    for name in recorded_files(source, names):
        target = run_dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        write_through(
            target, lambda tmp, name=name: shutil.copyfile(source / name, tmp), (source / name).stat().st_size
        )
    record(run_dir, names, known={name: recorded[name] for name in recorded_files(source, names) if name in recorded})


CHECKSUMS_KEPT = "checksums"  # state.json: true where the run held its SHA256SUMS when the checkpoint was written


def kept_checksums(run_dir: Path) -> bool:
    """Whether a checkpoint of `run_dir` (the current one or the one a swap left) says the run held its manifest
    when it was written (state.json's `CHECKSUMS_KEPT`); a state.json that cannot be read says nothing here (the
    checkpoint's own check names it)."""
    for name in (CHECKPOINT_DIR, PREVIOUS_CHECKPOINT_DIR):
        try:
            state = json.loads((run_dir / name / STATE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(state, dict) and state.get(CHECKSUMS_KEPT) is True:
            return True
    return False


def lost_checksums(run_dir: Path) -> RunError:
    """The error for a run whose manifest is gone though its checkpoint says it had one."""
    return RunError(
        f"{run_dir / MANIFEST_FILE} is missing, though {run_dir} kept its checksums there: without it no file of the "
        f"run can be checked; restore it from a backup, or, to accept the run's files as they are now, seal them "
        f"again with {option(RESEAL, run=str(run_dir))}"
    )


def reseal(run_dir: Path) -> list[str]:
    """Record run.toml's and the data files' checksums in `run_dir`'s manifest anew, as the files are now (`record`,
    nothing kept): what a user does on purpose after restoring a run's files by hand or losing its manifest. Returns
    the files recorded."""
    if not (run_dir / RUN_CONFIG).is_file():
        raise RunError(f"{run_dir} is not a kqv run: {run_dir / RUN_CONFIG} is missing")
    record(run_dir)
    return sorted(read_manifest(run_dir))


def read_manifest(run_dir: Path) -> dict[str, str]:
    """The recorded digests by relative path; empty for a run without a manifest (one written before manifests
    existed), RunError for a run that had one and lost it (`kept_checksums`)."""
    path = run_dir / MANIFEST_FILE
    if not path.exists():
        if kept_checksums(run_dir):
            raise lost_checksums(run_dir)
        return {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        digests = {name: digest for digest, name in (line.split("  ", 1) for line in lines if line)}
    except (ValueError, IsADirectoryError) as error:
        raise RunError(f"{path} is corrupt ({error}); {_remedy(run_dir)}") from None
    if not all(len(d) == 64 and all(c in "0123456789abcdef" for c in d) for d in digests.values()):
        raise RunError(f"{path} is corrupt: a line is not a SHA-256 and a file name; {_remedy(run_dir)}")
    return digests


def verify(run_dir: Path, *names: str) -> None:
    """Check every recorded file under `names` (files or directories) against the manifest: RunError for a file
    that is missing, unreadable as a file, or whose SHA-256 differs. Files the manifest does not list pass."""
    digests = read_manifest(run_dir)
    for name, digest in digests.items():
        if not any(name == n or name.startswith(n.rstrip("/") + "/") for n in names):
            continue
        path = run_dir / name
        if not path.is_file():
            what = "is missing" if not path.exists() else "is not a file"
            raise RunError(f"{path} {what}, so the run is incomplete; {_remedy(run_dir)}")
        if sha256(path) != digest:
            raise RunError(
                f"{path} is corrupt: its SHA-256 differs from the one recorded in {run_dir / MANIFEST_FILE}; "
                f"{_remedy(run_dir)}"
            )


def read_verified(run_dir: Path, name: str) -> bytes:
    """The bytes of the run file `name`, verified against the manifest (RunError if it is damaged)."""
    verify(run_dir, name)
    path = run_dir / name
    if not path.is_file():
        what = "is missing" if not path.exists() else "is not a file"
        raise RunError(f"{path} {what}, so the run is incomplete; {_remedy(run_dir)}")
    return path.read_bytes()


def _remedy(run_dir: Path) -> str:
    overwrite = option(IF_EXISTS_OVERWRITE)
    return f"restore the file from a backup, or train the run again with {overwrite} (which deletes {run_dir}'s run)"
