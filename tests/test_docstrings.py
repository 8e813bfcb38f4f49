"""Every module and class of kqv says what it is: a docstring placed after a statement is no docstring."""

import ast
from pathlib import Path

import pytest

KQV = Path(__file__).resolve().parents[1] / "src" / "kqv"


@pytest.mark.parametrize("path", sorted(KQV.rglob("*.py")), ids=lambda p: str(p.relative_to(KQV)))
def test_every_module_and_class_of_kqv_has_a_docstring(path):
    tree = ast.parse(path.read_text())
    missing = [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and not ast.get_docstring(node)]
    assert ast.get_docstring(tree), f"{path.name} has no module docstring"
    assert not missing, f"classes without a docstring in {path.name}: {missing}"
