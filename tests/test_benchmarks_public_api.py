"""The benchmarks are clients of kqv's public API: every script under benchmarks/ and their harness
(`kqv_lab.benchmarking`) import kqv only as a user would, so that moving a module inside the library breaks no
benchmark. Public: the modules `kqv`, `kqv.api`, `kqv.errors`, and the packages `kqv.nn`, `kqv.data`, `kqv.train`,
`kqv.interop`, `kqv.jobs` through the names their `__init__` exports (`__all__`); no `kqv.x.y` submodule."""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = [*sorted((ROOT / "benchmarks").rglob("*.py")), ROOT / "src" / "kqv_lab" / "benchmarking.py"]
MODULES = {"kqv.api", "kqv.errors"}  # every public name of these modules is kqv's API
# these through what their `__init__` exports (`__all__`): the command line's `main`, the explorer's `show` and server
PACKAGES = {"kqv", "kqv.nn", "kqv.data", "kqv.train", "kqv.interop", "kqv.jobs", "kqv.cli", "kqv.explore"}

# The one study that reaches inside on purpose: it takes one part of the model out of bf16 autocast by replacing
# kqv's attention core and fused output loss in place, which no public name can do (docs/translation.md).
WHITE_BOX = {
    ("mt_precision_parts.py", "kqv.nn.cores"): "replaces the attention core with an fp32 one",
    ("mt_precision_parts.py", "kqv.nn.losses"): "replaces the fused output loss with an fp32 one",
}


def exported(module: str) -> set[str]:
    """What a public package exports (its `__all__`) or a public module defines (its names not led by `_`), and the
    public modules and packages below it (`from kqv import api`)."""
    imported = importlib.import_module(module)
    if module in PACKAGES:
        names = set(getattr(imported, "__all__", ()))
    else:
        names = {name for name in vars(imported) if not name.startswith("_")}
    return names | {below.rsplit(".", 1)[1] for below in MODULES | PACKAGES if below.rpartition(".")[0] == module}


def imported_modules(tree: ast.AST) -> list[tuple[str, list[str]]]:
    """Each kqv import of a module's syntax tree as (module, names taken from it): `import kqv.x` gives
    ("kqv.x", []), `from kqv.x import a, b` ("kqv.x", ["a", "b"]), `importlib.import_module("kqv.x")` ("kqv.x", [])."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.append((node.args[0].value, []))
    return [(module, names) for module, names in found if module.split(".")[0] == "kqv"]


def private_imports(path: Path) -> list[tuple[str, str]]:
    """(file, what) for each import of `path` that reaches past kqv's public API: a module that is not public, or a
    name a public package does not export."""
    wrong = []
    for module, names in imported_modules(ast.parse(path.read_text(encoding="utf-8"))):
        if module not in MODULES | PACKAGES:
            wrong.append((path.name, module))
            continue
        public = exported(module)
        wrong += [(path.name, f"{module}.{name}") for name in names if name not in public]
    return wrong


def test_the_benchmarks_and_their_harness_import_only_kqv_s_public_api():
    assert len(SCANNED) > 20 and all(path.is_file() for path in SCANNED)
    found = sorted({wrong for path in SCANNED for wrong in private_imports(path)})
    assert found == sorted(WHITE_BOX), "imports past kqv's public API (export the name or use a public one)"


@pytest.mark.parametrize(
    "line",
    [
        "from kqv.nn.attention import MultiHeadAttention\n",
        "import kqv.train.trainer\n",
        "def f():\n    from kqv.jobs.lm import JOB\n",
        "from kqv.nn import attention\n",  # a submodule by name, not an export
        "from kqv.train import not_exported\n",
        "import importlib\nimportlib.import_module('kqv.cli.main')\n",
    ],
)
def test_the_scan_finds_a_planted_private_import(tmp_path, line):
    planted = tmp_path / "planted.py"
    planted.write_text(line)
    assert private_imports(planted)


@pytest.mark.parametrize(
    "line",
    ["import kqv\n", "from kqv import DecoderLM, api\n", "import kqv.api\n", "from kqv.errors import ConfigError\n"],
)
def test_the_scan_passes_the_public_api(tmp_path, line):
    clean = tmp_path / "clean.py"
    clean.write_text(line + "import torch\nfrom kqv_lab import benchmarking\n")
    assert private_imports(clean) == []
