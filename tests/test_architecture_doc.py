"""docs/architecture.md cannot rot: every module, file and registry it names exists in the tree, and every class,
constant, function and member it names in backquotes is defined in kqv."""

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
# `kqv/...py` or `kqv_lab/...py` or `src/...` or `tests/...py` or `configs/...`, as written in backquotes on the page
PATH = re.compile(r"`((?:src/)?kqv(?:_lab)?/[\w/]+(?:\.py)?|tests/\w+\.py|src/kqv/configs/[\w.-]+)`")


def named_paths() -> list[str]:
    return sorted(set(PATH.findall(PAGE.read_text())))


def resolve(name: str) -> Path:
    return ROOT / name if name.startswith(("src/", "tests/")) else ROOT / "src" / name


def test_the_page_names_modules_at_all():
    assert len(named_paths()) > 60


@pytest.mark.parametrize("name", named_paths())
def test_every_path_named_on_the_page_exists(name):
    if "NAME" in name:  # placeholders in the step-by-step guides (kqv/jobs/NAME.py)
        assert resolve(name).parent.is_dir(), f"{name}: its folder does not exist"
        return
    assert resolve(name).exists(), f"docs/architecture.md names {name}, which does not exist"


def test_every_module_of_the_package_map_is_on_the_page():
    """New modules appear in the map; the experiment modules are listed by `kqv experiment list` instead."""
    from kqv_lab.experiments import EXPERIMENTS

    registered = {experiment.module.rpartition(".")[2] for experiment in EXPERIMENTS.values()}
    named = set(named_paths())
    packages = [ROOT / "src" / "kqv", ROOT / "src" / "kqv_lab"]
    modules = [
        str(p.relative_to(ROOT / "src"))
        for p in sorted(path for package in packages for path in package.rglob("*.py"))
        if p.name not in ("__init__.py", "__main__.py")
        and not (p.parent.name == "experiments" and p.stem in registered)
    ]
    missing = [m for m in modules if m not in named]
    assert not missing, f"modules missing from docs/architecture.md's package map: {missing}"


@pytest.mark.parametrize(
    "registry",
    [
        "CORES",
        "AttentionKind",
        "Position",
        "POSITIONS",
        "VARIANTS",
        "EXPERIMENTS",
        "get_job",
        "load_run",
        "all_jobs",
        "JOBS",
        "COMMANDS",
        "TRAIN_FLAGS",
        "RUN_COMMANDS",
        "input_positions",
        "attention_positions",
        "has_score_bias",
        "has_value_bias",
        "PaddingOnlyCore",
    ],
)
def test_the_registries_the_guides_name_exist(registry):
    sources = [*(ROOT / "src").rglob("*.py"), ROOT / "tests" / "conftest.py"]
    assert any(re.search(rf"\b{registry}\b\s*[:=(]|(?:class|def) {registry}\b", p.read_text()) for p in sources), (
        f"docs/architecture.md names {registry}, which nothing in kqv, kqv_lab or tests/conftest.py defines"
    )
    assert f"`{registry}" in PAGE.read_text()


# What a backquoted name on the page is: a class or constant (`Trainer`, `CORPORA`, `Trainer(model, ...)`,
# `Training[...]`), a function or field (`corpus_of`, `work_after_training`), or a member (`Job.train`,
# `run.tokens_file`, `statistics.judge`, `kqv.interop.to_hf`). Anything else (file names, flags, TOML) is not checked.
NAME = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(.*?\)|\[.*?\])?`")
OBJECTS = {"run": "RunDirectory", "training": "Training"}  # how the page names an object by its usual variable
FILES = {"py", "md", "json", "jsonl", "toml", "safetensors", "txt", "png", "hyp", "bin"}  # `report.md`: a file
ELSEWHERE = {"setup", "create_lora_linear"}  # litgpt's names, where the page compares it with kqv


class Definitions:
    """What kqv (its source, tests, benchmarks and docs/gen_tables.py) defines: every name, each class's members (its
    own, and its bases' by name), each module's names by the module's name, and every string constant (file names)."""

    def __init__(self, paths: list[Path]):
        self.names: set[str] = set()
        self.strings: set[str] = set()
        self.classes: dict[str, tuple[set[str], list[str]]] = {}
        self.modules: dict[str, set[str]] = {}
        for path in paths:
            tree = ast.parse(path.read_text())
            before = set(self.names)
            for node in ast.walk(tree):
                self.read(node)
            self.modules.setdefault(path.stem, set()).update(self.bound(tree.body), self.names - before)

    def read(self, node: ast.AST) -> None:
        if isinstance(node, ast.ClassDef):
            members = self.bound(node.body) | {
                n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
            }
            own, bases = self.classes.setdefault(node.name, (set(), []))  # same-named classes: merged
            own |= members
            bases += [ast.unparse(base).split("[")[0].rpartition(".")[2] for base in node.bases]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.names.add(node.name)
        elif isinstance(node, ast.arg):
            self.names.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            self.names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            self.names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            self.names.add(node.attr)
        elif isinstance(node, ast.alias):
            self.names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            self.strings.add(node.value)

    @staticmethod
    def bound(body: list[ast.stmt]) -> set[str]:
        """The names a block of statements binds at its own level (definitions, assignments, imports)."""
        found = set()
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                found |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        return found

    def members(self, cls: str, seen: frozenset[str] = frozenset()) -> set[str]:
        """A class's members, with those of its bases that kqv defines."""
        own, bases = self.classes.get(cls, (set(), []))
        inherited = [self.members(base, seen | {cls}) for base in bases if base in self.classes and base not in seen]
        return own.union(*inherited)

    def undefined(self, name: str) -> str | None:
        """Why `name` (as backquoted on the page) is not defined, or None when it is."""
        head, *rest = name.split(".")
        if rest and rest[-1] in FILES:
            return None
        if head == "kqv":
            return None if resolves(name) else f"{name} does not resolve"
        head = OBJECTS.get(head, head)
        if not rest:
            known = head in self.names or head in self.strings or head in ELSEWHERE
            return None if known else f"{name} is defined nowhere in kqv"
        member = rest[-1] if len(rest) == 1 else None
        if head in self.classes and member is not None:
            return None if member in self.members(head) else f"{head} has no {member}"
        if head in self.modules and member is not None:
            return None if member in self.modules[head] else f"no module {head} defines {member}"
        return None  # a variable's attribute (`config.model`): not checked


def resolves(dotted: str) -> bool:
    """Whether `kqv.a.b` names a module or an attribute of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            if not hasattr(found, part):
                return False
            found = getattr(found, part)
        return True
    return False


def definitions() -> Definitions:
    places = [ROOT / "src" / "kqv", ROOT / "src" / "kqv_lab", ROOT / "tests", ROOT / "benchmarks"]
    paths = [path for place in places for path in place.rglob("*.py") if path != Path(__file__)]  # not its plants
    return Definitions([*paths, ROOT / "docs" / "gen_tables.py"])


def named_names(text: str) -> list[str]:
    """The backquoted names of `text` worth checking: with a capital, an underscore or a dot (not `auto`, `eval`)."""
    names = {name for name in NAME.findall(text) if re.search(r"[A-Z_.]", name) and not name.startswith("_")}
    return sorted(names)


def test_every_name_on_the_page_is_defined_in_kqv():
    known = definitions()
    stale = [why for name in named_names(PAGE.read_text()) if (why := known.undefined(name))]
    assert not stale, f"docs/architecture.md names what kqv does not define: {stale}"


def test_the_name_check_finds_planted_stale_names():
    """A class, a member, a module's function and an object's method that are not there: each is found."""
    planted = (
        "`Trainer` `Trainer(model, run)` `Job.train` `run.tokens_file` `statistics.judge` `kqv.interop.to_hf` "
        "`NoSuchClass` `Job.no_such_hook` `run.no_such_file` `statistics.no_such_test` `kqv.interop.no_such` "
        "`NoSuchRecord(a, b)`"
    )
    known = definitions()
    assert [name for name in named_names(planted) if known.undefined(name)] == [
        "Job.no_such_hook",
        "NoSuchClass",
        "NoSuchRecord",
        "kqv.interop.no_such",
        "run.no_such_file",
        "statistics.no_such_test",
    ]


def test_the_readme_links_the_page():
    assert "docs/architecture.md" in (ROOT / "README.md").read_text()
