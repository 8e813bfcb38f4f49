"""No import circle anywhere in src/kqv (issue 44), counting every import statement in a file: at the top, under
`if TYPE_CHECKING:` and inside functions, relative or absolute. A circle patched with a deferred import still
says that two modules each need the other: one of them holds what should sit below both."""

import ast
from pathlib import Path

from test_train_imports import circle

SRC = Path(__file__).resolve().parents[1] / "src"


def module_names(root: Path) -> dict[str, Path]:
    """Every module under `root` by its dotted name (a package by its own name, for its __init__.py)."""
    names = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that module `name` (at `path`) imports anywhere in it: `from . import x` counts as
    an import of the module x when there is one, else of the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            base = ".".join([*base, *([node.module] if node.module else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imported(name, path, modules) for name, path in modules.items()}


def test_no_module_of_kqv_is_in_an_import_circle():
    graph = import_graph(SRC)
    assert len(graph) > 100 and "kqv.jobs.lm" in graph and "kqv.train.trainer" in graph
    found = circle(graph)
    assert found is None, f"import circle: {' -> '.join(found)}"


def test_the_checker_sees_relative_deferred_and_type_checking_imports_and_packages(tmp_path):
    package = tmp_path / "p"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from . import a\n")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub.b import B\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("def f():\n    from .. import c\n")
    (package / "c.py").write_text("import p.a\n")
    graph = import_graph(tmp_path)
    assert graph == {"p": {"p.a"}, "p.a": {"p.sub.b"}, "p.sub": set(), "p.sub.b": {"p.c"}, "p.c": {"p.a"}}
    assert circle(graph) == ["p.a", "p.sub.b", "p.c", "p.a"]
    (package / "sub" / "b.py").write_text("def f():\n    from .. import A\n")  # a name p's __init__ makes
    assert circle(import_graph(tmp_path)) == ["p", "p.a", "p.sub.b", "p"]  # p's __init__ imports a
    (package / "a.py").write_text("")
    assert circle(import_graph(tmp_path)) is None
