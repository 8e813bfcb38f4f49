"""The modules of `kqv.train` import one another without a circle, counting every import statement anywhere in a
file: at the top, under `if TYPE_CHECKING:`, and inside functions (issue 33: ten modules once formed one circle).
`kqv.train.files` is a leaf: it imports nothing else from the package."""

import ast
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[1] / "src" / "kqv" / "train"


def train_imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of kqv.train that `path` imports anywhere in it (relative or absolute)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("kqv.train."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("kqv.train."))
    return found & modules - {path.stem}


def import_graph(package: Path) -> dict[str, set[str]]:
    modules = {path.stem for path in package.glob("*.py")}
    return {path.stem: train_imports(path, modules) for path in package.glob("*.py")}


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (its modules in order, the first repeated at the end), or None."""
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                return path[path.index(imported) :] + [imported]
            if imported not in state and (found := visit(imported, path + [imported])):
                return found
        state[module] = "done"
        return None

    return next((found for module in sorted(graph) if module not in state and (found := visit(module, [module]))), None)


def test_the_modules_of_kqv_train_form_no_import_circle():
    graph = import_graph(TRAIN)
    assert len(graph) > 10 and "trainer" in graph
    assert circle(graph) is None, f"import circle: {' -> '.join(circle(graph))}"


def test_files_is_a_leaf():
    assert import_graph(TRAIN)["files"] == set()


def test_the_checker_sees_type_checking_and_lazy_imports(tmp_path):
    (tmp_path / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    (tmp_path / "b.py").write_text("def f():\n    from . import c\n")
    (tmp_path / "c.py").write_text("import kqv.train.a\n")
    graph = import_graph(tmp_path)
    assert graph == {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert circle(graph) == ["a", "b", "c", "a"]
    graph["c"] = set()
    assert circle(graph) is None


def private_names(tree: ast.AST) -> set[str]:
    """The private attributes a module defines: `self._x = ...` and methods `_x` (dunders aside)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def foreign_reads(tree: ast.AST) -> set[str]:
    """The private attributes a module reads from objects other than `self` and `cls`."""
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    }


def test_no_module_of_kqv_train_reads_another_ones_private_attributes():
    trees = {path.stem: ast.parse(path.read_text()) for path in TRAIN.glob("*.py")}
    defined = {stem: private_names(tree) for stem, tree in trees.items()}
    assert "_read" in defined["trainer"]
    for stem, tree in trees.items():
        others = set().union(*(names for other, names in defined.items() if other != stem)) - defined[stem]
        read = foreign_reads(tree) & others
        assert not read, f"{stem} reads {sorted(read)}, private to another module of kqv.train"


def test_the_private_reader_checker_sees_a_read_of_another_object():
    tree = ast.parse("def f(trainer):\n    return trainer._progress, self._own\n")
    assert foreign_reads(tree) == {"_progress"}
    assert private_names(ast.parse("class T:\n    def _plot(self):\n        self._left = 1\n")) == {"_plot", "_left"}


def test_the_training_loop_knows_no_architecture():
    """The trainer and what runs its steps (DDP, FSDP, compile) ask the model through kqv.nn.training, never
    importing its blocks, experts or model classes (issue 44: the trainer "knows nothing about models")."""
    loop = ("trainer", "sharding", "compiling", "distributed", "update", "evaluator")
    architecture = {"layers", "experts", "models", "attention", "cores", "heads", "rnn", "vision"}
    for name in loop:
        tree = ast.parse((TRAIN / f"{name}.py").read_text())
        imported = {
            node.module.split(".")[1]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 2 and (node.module or "").startswith("nn.")
        }
        assert not imported & architecture, f"kqv.train.{name} imports {sorted(imported & architecture)} of kqv.nn"
