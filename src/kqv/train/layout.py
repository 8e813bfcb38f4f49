"""What a run directory holds, by what each file is: the one place that turns "the run's tokenizer" into a path.

`RunFiles(path)` names a run's files (its tokenizer, encoded tokens or pairs, held-out texts, samples,
predictions, run.toml, checksums, metrics, checkpoint) and writes and verifies them through the one writer
(`kqv.train.files`), so that jobs, commands and the explorer ask the run for what it holds and never spell a file
name of their own: the names are train/'s (`kqv.train.files`). `RunDirectory` (kqv.train.rundir), the run opened
for a training, is one; a finished run read back (`kqv generate`, `kqv eval`, the explorer) is named by one too.
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from .checkpoints import checkpoint_dir
from .files import (
    CHECKPOINT_DIR,
    DATA_FILES,
    MANIFEST_FILE,
    METRICS_FILE,
    MODEL_FILE,
    PAIRS_FILE,
    PLOT_FILE,
    RUN_CONFIG,
    RUN_FORMAT,
    SAMPLES_FILE,
    SUMMARY_FILE,
    TEST_HYPOTHESES_FILE,
    TEXT_DIR,
    TOKENIZER_DIR,
    TOKENS_FILE,
    copy_files,
    read_verified,
    record,
    verify,
    write_atomically,
    write_files,
    write_tensors,
    write_text,
)


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
        """SHA256SUMS: the checksums of run.toml and the data files (`kqv.train.files.record`)."""
        return self.path / MANIFEST_FILE

    # -- what the trainer writes -----------------------------------------------------------------------------

    @property
    def metrics_file(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def plot_file(self) -> Path:
        return self.path / PLOT_FILE

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / CHECKPOINT_DIR

    @property
    def weights_file(self) -> Path:
        """The checkpoint's model weights (checkpoint.old/'s while a swap is interrupted, as a reader takes them)."""
        return checkpoint_dir(self.path) / MODEL_FILE

    def held(self) -> list[Path]:
        """Every path kqv writes into a run directory (present or not): what no command may write over."""
        return [self.path / name for name in sorted(RUN_FORMAT)]

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
        """run.toml's and the data files' checksums in SHA256SUMS (`kqv.train.files.record`)."""
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
