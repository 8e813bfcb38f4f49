"""The checksums of a run's data files: `SHA256SUMS`, written when training starts and verified whenever a file
is read back, so that a damaged tokenizer or encoded corpus is reported as such instead of failing deep inside
a loader (or, worse, loading silently different data).

The checkpoint's files carry their own SHA-256 in `checkpoint/state.json` (kqv.train.checkpoints). This manifest
covers run.toml (a truncated one may still parse) and the rest of what is read back: `tokenizer/`,
`tokens.safetensors`, `pairs.safetensors` and `data/`. It is in `sha256sum`'s format, so
`cd RUN && sha256sum -c SHA256SUMS` checks a run by hand too. A run written before the manifest existed has none,
and loads unchecked, as it always did.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import RunError, option
from .files import MANIFEST_FILE, PAIRS_FILE, RUN_CONFIG, TEXT_DIR, TOKENIZER_DIR, TOKENS_FILE, sha256, write_atomically

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
    return [name for name in found if not name.endswith(".tmp")]


def record(run_dir: Path, names: tuple[str, ...] = DATA_FILES, *, keep: bool = False) -> None:
    """Write the SHA-256 of run.toml and the data files `names` of `run_dir` into its manifest (when training
    starts: run.toml just written, the data prepared). With `keep` (a resumed run, whose data were read back
    verified) a data file already recorded keeps its digest: a damaged file is never re-blessed."""
    digests = read_manifest(run_dir) if keep else {}
    digests.pop(RUN_CONFIG, None)  # rewritten by every start, a resumed one too
    names = (RUN_CONFIG, *names)
    for name in recorded_files(run_dir, names):
        digests.setdefault(name, sha256(run_dir / name))
    text = "".join(f"{digest}  {name}\n" for name, digest in sorted(digests.items()))
    write_atomically(run_dir / MANIFEST_FILE, text.encode())


def read_manifest(run_dir: Path) -> dict[str, str]:
    """The recorded digests by relative path; empty for a run without a manifest."""
    path = run_dir / MANIFEST_FILE
    if not path.exists():
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
    overwrite = option("if_exists='overwrite'")
    return f"restore the file from a backup, or train the run again with {overwrite} (which deletes {run_dir}'s run)"
