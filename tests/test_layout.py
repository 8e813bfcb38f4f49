"""The package's layers: the lecture's model (`kqv.nn`) sits at the bottom and imports nothing from above it."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "kqv"
LAB = PACKAGE.parent / "kqv_lab"  # the applications beside the library (its own rule: tests/test_public_api.py)
ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def documented_layers(text: str) -> dict[str, set[str]]:
    """The table under "## Layers" in docs/architecture.md: each layer and the layers it may import (besides itself
    and the standard library / third parties)."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| `")]
    return {
        layer.strip().strip("`"): {name.strip().strip("`") for name in allowed.split(",")} - {"nothing"}
        for layer, allowed in rows
    }


ALLOWED = documented_layers(ARCHITECTURE.read_text())


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
            found.update(
                alias.name.split(".")[1]
                for alias in node.names
                if alias.name.startswith("kqv.") and alias.name.count(".")
            )
    return found


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_lower_layers_import_nothing_from_the_layers_above(layer):
    module = PACKAGE / f"{layer}.py"
    paths = [module] if module.is_file() else sorted((PACKAGE / layer).rglob("*.py"))
    assert paths, f"no layer {layer} in {PACKAGE}"
    for path in paths:
        imported = kqv_imports(path) - {layer}
        assert imported <= ALLOWED[layer], (
            f"{path.relative_to(PACKAGE)} imports {sorted(imported - ALLOWED[layer])} from above its layer"
        )


def test_the_library_never_imports_its_applications():
    """kqv_lab sits on kqv, never under it: no module of kqv imports it (its commands join `kqv` through the
    entry-point group "kqv.commands" instead)."""
    importing = [str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if imports_module(path, "kqv_lab")]
    assert not importing, f"the library imports its applications: {importing}"


def imports_module(path: Path, name: str) -> bool:
    """Whether a module imports `name` (a top-level module, e.g. argparse) anywhere in it."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(alias.name.split(".")[0] == name for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == name:
            return True
    return False


# The benchmarks' harness: the parser of every script under benchmarks/, which lives in a source checkout beside
# it (their shared flags, the repository's benchmarks/results folder), not in an installed package's world.
BENCHMARK_HARNESS = "benchmarking.py"


def test_only_the_command_line_parses_arguments():
    for package in (PACKAGE, LAB):
        parsing = {str(path.relative_to(package)) for path in package.rglob("*.py") if imports_module(path, "argparse")}
        parsing -= {BENCHMARK_HARNESS} if package == LAB else set()
        assert parsing and all(path.startswith("cli/") for path in parsing), sorted(parsing)


def test_the_argparse_checker_sees_both_forms_of_import(tmp_path):
    for source, expected in (
        ("import argparse\n", True),
        ("from argparse import Namespace\n", True),
        ("import argparser\n", False),
        ("x = 'argparse'\n", False),
    ):
        (tmp_path / "m.py").write_text(source)
        assert imports_module(tmp_path / "m.py", "argparse") is expected, source


def test_every_package_and_top_level_module_has_its_layer():
    layers = {
        path.stem if path.is_file() else path.name
        for path in PACKAGE.iterdir()
        if (path.is_file() and path.suffix == ".py") or (path / "__init__.py").is_file()
    }
    assert layers == set(ALLOWED), (
        f"give each its allowed imports in ALLOWED (and docs/architecture.md): {sorted(layers ^ set(ALLOWED))}"
    )


def test_the_layer_table_is_read_from_the_doc():
    assert ALLOWED["errors"] == {"flag_names"} and ALLOWED["flag_names"] == set()
    assert ALLOWED["validation"] == {"errors"}
    assert "explore" not in ALLOWED["jobs"] and "cli" not in ALLOWED["jobs"] and "cli" not in ALLOWED["explore"]
    # the command line calls the API: of the layers below it, it imports only the API and the leaves
    assert ALLOWED["cli"] == {"flag_names", "errors", "signals", "api", "explore"}
    assert documented_layers(
        "x\n## Layers\n| layer | may import |\n|---|---|\n| `a` | nothing |\n"
        "| `b` | `a`, `c` |\n## Next\n| `z` | `a` |\n"
    ) == {"a": set(), "b": {"a", "c"}}


def test_the_import_checker_sees_relative_and_absolute_imports(tmp_path):
    assert kqv_imports(PACKAGE / "jobs" / "lm.py") >= {"nn", "data", "train"}
    assert "nn" in kqv_imports(PACKAGE / "interop" / "convert.py")


# -- sizes: a reader can hold a module, and a function, in their head ----------------------------------------------

LOOK_AT_MODULE_LINES = 800  # past this a module gets a look: is it still one idea? Rooms by idea, not by a tape measure
MAX_FUNCTION_LINES = 60  # body lines, the docstring excluded
# functions that read better whole: {"kqv.module:Class.function": why}. Keep it short; split before adding here.
LONG_FUNCTIONS_ALLOWED: dict[str, str] = {}


def body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring to the end of the function."""
    body = function.body[1:] if ast.get_docstring(function) else function.body
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


def functions(path: Path, package: Path = PACKAGE) -> dict[str, int]:
    """Every function and method of a module (nested ones too), by qualified name, with its body lines."""
    module = ".".join(path.relative_to(package.parent).with_suffix("").parts)
    found = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[f"{module}:{prefix}{child.name}"] = body_lines(child)
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(path.read_text()), "")
    return found


MODULES = sorted([*PACKAGE.rglob("*.py"), *LAB.rglob("*.py")])


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_a_module_past_800_lines_gets_a_look(path):
    """No cap to split at: a module holds one idea whatever its length. Past `LOOK_AT_MODULE_LINES` it may hold
    two, so a reader looks and, if it does, splits it where the ideas part (never at a line count)."""
    lines = len(path.read_text().splitlines())
    assert lines <= LOOK_AT_MODULE_LINES, (
        f"{path.relative_to(PACKAGE.parent)} has {lines} lines, past {LOOK_AT_MODULE_LINES}: look whether it holds "
        f"more than one idea and, if so, split it by idea (where the ideas part), not by size"
    )


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_function_is_over_60_lines_unless_it_reads_better_whole(path):
    long = {
        name: n for name, n in functions(path).items() if n > MAX_FUNCTION_LINES and name not in LONG_FUNCTIONS_ALLOWED
    }
    assert not long, (
        f"functions over {MAX_FUNCTION_LINES} body lines: {long}: split them, or say in "
        f"LONG_FUNCTIONS_ALLOWED why they read better whole"
    )


def test_the_allow_list_names_only_long_functions_that_exist():
    every = {name: n for path in MODULES for name, n in functions(path).items()}
    stale = {name: every.get(name) for name in LONG_FUNCTIONS_ALLOWED if every.get(name, 0) <= MAX_FUNCTION_LINES}
    assert not stale, f"allow-listed functions that no longer exist or are no longer long: {stale}"


def test_the_size_checker_counts_body_lines_of_nested_functions_and_methods(tmp_path):
    text = (
        'def outer():\n    """Doc."""\n    def inner():\n' + "        x = 1\n" * 70 + "    return inner\n\n"
        "class A:\n    def method(self):\n        return 1\n"
    )
    path = tmp_path / "kqv" / "probe.py"
    path.parent.mkdir()
    path.write_text(text)
    assert functions(path, tmp_path / "kqv") == {
        "kqv.probe:outer": 72,
        "kqv.probe:outer.inner": 70,
        "kqv.probe:A.method": 1,
    }


# -- the package reads nothing from the source checkout it may sit in ----------------------------------------------


def levels_up(node: ast.expr) -> int | None:
    """How many folders up from its own file a path expression goes, where it is `Path(__file__)` climbed by
    `.parent` and `.parents[N]` (`.resolve()` between them); None for any other expression."""
    climbed = 0
    while True:
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            climbed, node = climbed + 1, node.value
        elif isinstance(node, ast.Subscript) and getattr(node.value, "attr", None) == "parents":
            if not isinstance(node.slice, ast.Constant):
                return None
            climbed, node = climbed + node.slice.value + 1, node.value.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "resolve":
            node = node.func.value
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Path" and len(node.args) == 1:
            return climbed if getattr(node.args[0], "id", None) == "__file__" else None
        else:
            return None


def paths_out_of_the_package(package: Path = PACKAGE) -> list[str]:
    """Each `__file__`-relative path of a module that climbs out of the package (to a checkout's docs/, say)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        depth = len(path.relative_to(package).parts)  # kqv_lab/experiments/runner.py: 2 folders up is kqv itself
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.expr) and (up := levels_up(node)) is not None and up > depth:
                found.append(f"{path.relative_to(package)}:{node.lineno}: {ast.unparse(node)}")
    return sorted(set(found))


def test_no_module_reads_a_path_outside_the_package():
    """The experiments (and every other module) work from an installed package: what they read ships with it
    (package data, constants) or is passed in, never a file of the source checkout around it."""
    found = paths_out_of_the_package() + paths_out_of_the_package(LAB)
    found = [line for line in found if not line.startswith(f"{BENCHMARK_HARNESS}:")]  # a checkout's tool
    assert not found, "\n".join(found)


def test_the_path_scan_finds_a_climb_out_of_the_package(tmp_path):
    (tmp_path / "kqv" / "experiments").mkdir(parents=True)
    module = tmp_path / "kqv" / "experiments" / "runner.py"
    module.write_text(
        "from pathlib import Path\nHERE = Path(__file__).parent / 'static'\nKQV = Path(__file__).resolve().parents[1]\n"
    )
    assert paths_out_of_the_package(tmp_path / "kqv") == []
    module.write_text("from pathlib import Path\nDOCS = Path(__file__).resolve().parents[3] / 'docs'\n")
    assert paths_out_of_the_package(tmp_path / "kqv") == [
        "experiments/runner.py:2: Path(__file__).resolve().parents[3]"
    ]
    module.write_text("from pathlib import Path\nROOT = Path(__file__).parent.parent.parent\n")
    assert len(paths_out_of_the_package(tmp_path / "kqv")) == 1
