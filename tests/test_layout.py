"""The package's layers: the lecture's model (`kqv.nn`) sits at the bottom and imports nothing from above it."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "kqv"
# each layer and the layers it may import (besides itself and the standard library / third parties)
BASE = {"errors", "validation"}  # the bottom: kqv's exceptions and the config validator, importable by everyone
ALLOWED = {
    "errors": set(),
    "validation": {"errors"},
    "nn": BASE,
    "data": BASE,
    "train": BASE | {"nn", "data"},
    "experiments": BASE | {"nn", "data", "train", "jobs"},
}


def kqv_imports(path: Path) -> set[str]:
    """The kqv subpackages (or top-level modules) a module imports, resolved from relative imports too."""
    module_parts = path.relative_to(PACKAGE).with_suffix("").parts
    package = module_parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                target = base + (node.module.split(".") if node.module else [])
                names = [alias.name for alias in node.names] if not node.module else []
                found.update(target[:1] if target else names)
            elif node.module and node.module.startswith("kqv."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[1] for alias in node.names
                         if alias.name.startswith("kqv.") and alias.name.count("."))
    return found


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_lower_layers_import_nothing_from_the_layers_above(layer):
    module = PACKAGE / f"{layer}.py"
    paths = [module] if module.is_file() else sorted((PACKAGE / layer).rglob("*.py"))
    assert paths, f"no layer {layer} in {PACKAGE}"
    for path in paths:
        imported = kqv_imports(path) - {layer}
        assert imported <= ALLOWED[layer], (
            f"{path.relative_to(PACKAGE)} imports {sorted(imported - ALLOWED[layer])} from above its layer")


def test_the_import_checker_sees_relative_and_absolute_imports(tmp_path):
    assert kqv_imports(PACKAGE / "jobs" / "lm.py") >= {"nn", "data", "train"}
    assert "nn" in kqv_imports(PACKAGE / "interop" / "convert.py")
