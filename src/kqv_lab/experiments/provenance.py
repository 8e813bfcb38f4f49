"""Where a result came from: the git commit (and whether the tree was dirty), torch, the machine, the load, and a
hash of the code that produced the numbers, so that stale results are found, not trusted.

The code an experiment ran (`code_files`): its own module and every kqv or kqv_lab module it imports, followed
through their own imports (`kqv.nn`, `kqv.train`, `kqv_lab.experiments.lm` ...; a name a public package exports to
the module that defines it), found by reading the import statements (`ast`), not by hand. Left out: the modules that
only present or judge the numbers (`PRESENTATION`: the verdict logic, report, plots, runner): a change there changes
no measured number, and the verdicts are recomputed from results.json by the test suite anyway.
tests/test_experiment_statistics.py fails when a committed experiment's code hash (`code.hash`, recorded when it
ran) differs from today's code.

The hash is over what the code does, not how it is written (`_normalised`): each file's syntax tree without its
docstrings, so a comment, a docstring or reformatting does not make results stale; a changed line of code does.
The experiment module's own wording and judging (`JUDGING`: its claim, `checks`, `table`, `plots`, `method`,
`notes`) are left out like the presentation modules: the verdict is recomputed from the stored numbers anyway.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path
from typing import Any

import torch

import kqv
from kqv.nn import cpu

from ..measuring import git_state

# the packages whose modules an experiment's code is read from: the library and this application
PACKAGES = {"kqv": Path(kqv.__file__).resolve().parent, "kqv_lab": Path(__file__).resolve().parents[1]}
SOURCE_ROOT = PACKAGES["kqv_lab"].parent  # where both sit (src/, or site-packages): code paths are relative to it
PRESENTATION = {
    "kqv_lab",
    "kqv_lab.experiments",
    "kqv_lab.experiments.base",
    "kqv_lab.experiments.statistics",
    "kqv_lab.experiments.provenance",
    "kqv_lab.experiments.plotting",
    "kqv_lab.experiments.report",
    "kqv_lab.experiments.runner",
    "kqv_lab.experiments.gallery",
    "kqv_lab.experiments.actions",
    "kqv_lab.experiments.reproduction",
}


def _module_file(name: str) -> Path | None:
    """The source file of kqv or kqv_lab module `name` (a package's __init__.py), None outside them."""
    top, *rest = name.split(".")
    if top not in PACKAGES:
        return None
    path = PACKAGES[top].joinpath(*rest)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _absolute(package: str, node: ast.ImportFrom) -> str:
    """The module a `from ... import` statement of a module of `package` imports from, made absolute."""
    base = package.rsplit(".", node.level - 1)[0] if node.level else ""
    return ".".join(part for part in (base, node.module or "") if part)


def _defined_in(module: str, name: str) -> str:
    """Where `name`, imported from `module`, is defined: a package that re-exports it (`from .cores import
    FullAttention` in kqv/nn/__init__.py) is followed to the module it comes from, so the code an experiment ran is
    the modules it uses, not every module the public package exports; a submodule (`from . import lm`) is itself."""
    if _module_file(submodule := f"{module}.{name}") is not None:
        return submodule
    path = _module_file(module)
    if path is None or path.name != "__init__.py":
        return module
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        for alias in node.names if isinstance(node, ast.ImportFrom) else ():
            if (alias.asname or alias.name) == name:
                return _defined_in(_absolute(module, node), alias.name)
    return module


def _imports(name: str, path: Path) -> set[str]:
    """The kqv and kqv_lab modules that module `name` (at `path`) imports, by reading its import statements."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found |= {_defined_in(_absolute(package, node), alias.name) for alias in node.names}
    return {m for m in found if _module_file(m) is not None}


def code_files(module: str) -> list[Path]:
    """The source files experiment module `module` ran: itself and the kqv modules it imports, transitively,
    less the `PRESENTATION` modules; sorted, relative to src/."""
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in seen or (name in PRESENTATION and name != module):
            continue
        seen.add(name)
        todo += sorted(_imports(name, _module_file(name)))
    return sorted(_module_file(name).relative_to(SOURCE_ROOT) for name in seen)


# the parts of an experiment's own module that only word, present or judge its numbers (`kqv_lab.experiments.base`):
# left out of its code hash like the PRESENTATION modules, so rewording a claim or a check keeps its results
JUDGING = {"CLAIM", "LECTURE", "REVISIONS", "table", "checks", "plots", "method", "notes"}


def _normalised(source: str, leave_out: set[str] = frozenset()) -> str:
    """The syntax tree of `source` without docstrings or positions: what the code does, not how it is laid out;
    without the top-level functions and assignments named in `leave_out`."""
    tree, documented = ast.parse(source), (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    tree.body = [node for node in tree.body if not (_names(node) and _names(node) <= leave_out)]
    for node in ast.walk(tree):
        if isinstance(node, documented) and ast.get_docstring(node, clean=False) is not None:
            node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree)


def _names(node: ast.stmt) -> set[str]:
    """The names a top-level statement defines: a function's, or an assignment's plain targets."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return {target.id for target in targets if isinstance(target, ast.Name)}


def code_hash(module: str) -> dict[str, Any]:
    """{'hash': sha256 over the paths and normalised code of `code_files(module)`, 'files': their paths}; the
    experiment module's own `JUDGING` parts left out."""
    digest = hashlib.sha256()
    files, own = code_files(module), _module_file(module).relative_to(SOURCE_ROOT)
    for path in files:
        leave_out = JUDGING if path == own else set()
        code = _normalised((SOURCE_ROOT / path).read_text(encoding="utf-8"), leave_out)
        digest.update(path.as_posix().encode() + b"\0" + code.encode() + b"\0")
    return {"hash": digest.hexdigest(), "files": [p.as_posix() for p in files]}


def provenance() -> dict[str, Any]:
    """Git state, torch version and build, and the CPU (`kqv_lab.measuring`), for results.json."""
    return {"git": git_state(), "torch": torch.__version__, "cpu": cpu()}


# experiments whose claims are timings (or, rnn-vs-transformer, decided within a wall-clock budget): no fingerprint
# can vouch for a time, so such a result stands only on the code it timed (its hash) and names the machine it ran on
TIMED = {"quadratic-cost", "multihead-cost", "parallelism", "long-attention", "rnn-vs-transformer"}


def timing_change(record: dict[str, Any], today_hash: str) -> str | None:
    """Why a result of a `TIMED` experiment no longer describes today's code (the code it timed changed, or the
    record names no machine its times were measured on), or None."""
    if not ((record.get("provenance") or {}).get("cpu") or {}).get("model"):
        return "its timings name no machine they were measured on"
    if (record.get("code") or {}).get("hash") != today_hash:
        return "the code it times changed since it ran, and a fingerprint cannot vouch for a timing"
    return None
