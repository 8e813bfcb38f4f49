"""The applications beside the library (src/kqv_lab, and the benchmarks under benchmarks/) import kqv only through
its public API, one definition for both: the modules `kqv.api`, `kqv.errors` and `kqv.flag_names` (the command
line's vocabulary, which an application's commands spell their flags with), any name they define; and the names the
packages `kqv`, `kqv.nn`, `kqv.data`, `kqv.train`, `kqv.interop`, `kqv.jobs`, `kqv.cli` and `kqv.explore` export in
their `__all__`; no other `kqv.x.y` module. Moving a module inside kqv then breaks no application."""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = {"kqv.api", "kqv.errors", "kqv.flag_names"}  # every public name of these modules is kqv's API
PACKAGES = {"kqv", "kqv.nn", "kqv.data", "kqv.train", "kqv.interop", "kqv.jobs", "kqv.cli", "kqv.explore"}  # __all__
LAB = sorted((ROOT / "src" / "kqv_lab").rglob("*.py"))
BENCHMARKS = sorted((ROOT / "benchmarks").rglob("*.py"))

# The one study that reaches inside on purpose: it takes one part of the model out of bf16 autocast by replacing
# kqv's attention core and fused output loss in place, which no public name can do (docs/translation.md).
WHITE_BOX = {
    ("benchmarks/mt_precision_parts.py", "kqv.nn.cores"): "replaces the attention core with an fp32 one",
    ("benchmarks/mt_precision_parts.py", "kqv.nn.losses"): "replaces the fused output loss with an fp32 one",
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
    ("kqv.x", []), `from kqv.x import a, b` ("kqv.x", ["a", "b"]), `importlib.import_module("kqv.x")` ("kqv.x", []).
    A relative import (an application's own modules) is none of kqv's."""
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


def private_imports(path: Path, name: str | None = None) -> list[tuple[str, str]]:
    """(`name`, what) for each import of `path` that reaches past kqv's public API: a module that is not public,
    or a name a public module or package does not export."""
    name = name or path.name
    wrong = []
    for module, names in imported_modules(ast.parse(path.read_text(encoding="utf-8"))):
        if module not in MODULES | PACKAGES:
            wrong.append((name, module))
            continue
        public = exported(module)
        wrong += [(name, f"{module}.{taken}") for taken in names if taken not in public]
    return wrong


@pytest.mark.parametrize("path", LAB, ids=lambda p: str(p.relative_to(ROOT / "src")))
def test_kqv_lab_imports_only_kqv_s_public_api(path):
    assert not (found := private_imports(path)), f"{path.relative_to(ROOT)} imports kqv's insides: {found}"


def test_the_benchmarks_import_only_kqv_s_public_api_but_for_their_one_white_box_study():
    assert len(BENCHMARKS) > 20 and len(LAB) > 30
    found = sorted({wrong for path in BENCHMARKS for wrong in private_imports(path, str(path.relative_to(ROOT)))})
    assert found == sorted(WHITE_BOX), "imports past kqv's public API (export the name or use a public one)"


@pytest.mark.parametrize(
    "line",
    [
        "from kqv.nn.attention import MultiHeadAttention\n",
        "import kqv.train.trainer\n",
        "def f():\n    from kqv.jobs.lm import JOB\n",
        "from kqv.nn import attention\n",  # a submodule by name, not an export
        "from kqv.train import not_exported\n",
        "from kqv.errors import _COMMAND_LINE\n",  # a public module's private name
        "def f():\n    from kqv.validation import Config\n",
        "import importlib\nimportlib.import_module('kqv.cli.main')\n",
    ],
)
def test_the_scan_finds_a_planted_private_import(tmp_path, line):
    planted = tmp_path / "planted.py"
    planted.write_text(line)
    assert private_imports(planted)


@pytest.mark.parametrize(
    "line",
    [
        "import kqv\n",
        "from kqv import DecoderLM, api\n",
        "import kqv.api\n",
        "from kqv.errors import ConfigError\n",
        "from kqv.nn import DecoderLM\nfrom kqv import train\n",
        "from kqv import flag_names\n",
        "from .experiments import base\nimport kqvx.y\n",  # an application's own modules, another package
    ],
)
def test_the_scan_passes_the_public_api(tmp_path, line):
    clean = tmp_path / "clean.py"
    clean.write_text(line + "import torch\nfrom kqv_lab import benchmarking\n")
    assert private_imports(clean) == []


def test_what_the_applications_use_is_exported_by_a_public_package():
    assert {"DecoderLM", "FullAttention", "cpu"} <= exported("kqv.nn")
    assert {"Trainer", "TrainConfig", "write_atomically"} <= exported("kqv.train")
    assert {"Command", "DEVICE_HELP", "APPLICATION_COMMANDS"} <= exported("kqv.cli")
    assert {"Config", "DecoderLM"} <= exported("kqv")
