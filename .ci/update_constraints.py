"""Write constraints.txt: the exact versions of kqv's dependency closure installed in this environment.

Run it deliberately, after the whole suite has passed in this environment (`python -m pytest`), so that
constraints.txt always names a set of versions the suite has been run with:

    python .ci/update_constraints.py            # rewrites constraints.txt at the repository root
    python .ci/update_constraints.py --check    # exit 1 if constraints.txt differs from this environment

The closure follows the requirements of kqv and of its `test`, `embed` and `bench` extras (the benchmarks'
peers are pinned too, so a ratio measured later compares the same versions), evaluating environment markers for this
interpreter. torch keeps the project's pin, torch==2.13.0 (the CPU build's local label `+cpu` is dropped).
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = ("test", "embed", "bench")
HEADER = """\
# Exact versions of everything kqv and its test extra install, as the whole suite was last run with.
# Used by the README's install commands (pip install -c constraints.txt ...) and .ci/run.
# Regenerate deliberately with `python .ci/update_constraints.py` after the suite passes; check the newest
# releases before each release with `bash .ci/latest` (docs/releasing.md).
"""


def closure(root: str = "kqv", extras: tuple[str, ...] = EXTRAS) -> dict[str, str]:
    """{distribution name: installed version} of `root`'s requirements, followed recursively."""
    found: dict[str, str] = {}
    pending = [(root, extras)]
    visited: set[tuple[str, tuple[str, ...]]] = set()
    while pending:
        name, wanted = pending.pop()
        if (canonicalize_name(name), wanted) in visited:
            continue
        visited.add((canonicalize_name(name), wanted))
        dist = metadata.distribution(name)
        found[dist.metadata["Name"]] = dist.version
        for text in dist.requires or []:
            requirement = Requirement(text)
            environments = [{"extra": extra} for extra in wanted] or [{"extra": ""}]
            if requirement.marker is None or any(requirement.marker.evaluate(env) for env in environments):
                pending.append((requirement.name, tuple(sorted(requirement.extras))))
    found.pop(metadata.distribution(root).metadata["Name"])
    return found


def constraints_text() -> str:
    lines = []
    for name, version in sorted(closure().items(), key=lambda item: canonicalize_name(item[0])):
        lines.append(f"{name}=={version.split('+')[0]}")
    return HEADER + "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    path, text = ROOT / "constraints.txt", constraints_text()
    if args.check:
        same = path.is_file() and path.read_text() == text
        print(f"{path} {'matches' if same else 'differs from'} this environment")
        return 0 if same else 1
    path.write_text(text)
    print(f"wrote {path}: {text.count(chr(10)) - HEADER.count(chr(10))} pinned distributions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
