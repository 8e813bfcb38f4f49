"""The training layer's structure: the budget's pacing is given what it reads of the Trainer's session and returns
its plans to the Trainer, which owns its state; every path to a run's file is built by the run directory's
modules."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "kqv"


def pacing_couplings(source: str) -> list[str]:
    """What couples a pacing module's `Pacing` to the Trainer: a parameter typed `Any` or `Trainer` (or untyped),
    an import of the trainer, or a write to an attribute of anything but itself (the Trainer's state)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("trainer"):
            found.append(f"imports {node.module}")
        if isinstance(node, ast.ClassDef) and node.name == "Pacing":
            for method in (n for n in node.body if isinstance(n, ast.FunctionDef)):
                for arg in method.args.args[1:] + method.args.kwonlyargs:
                    kind = ast.unparse(arg.annotation) if arg.annotation else "untyped"
                    if kind in ("Any", "Trainer", "untyped") or "Trainer" in kind:
                        found.append(f"{method.name}({arg.arg}: {kind})")
                for target in (t for n in ast.walk(method) if isinstance(n, ast.Assign) for t in n.targets):
                    if isinstance(target, ast.Attribute) and not (
                        isinstance(target.value, ast.Name) and target.value.id == "self"
                    ):
                        found.append(f"{method.name} writes {ast.unparse(target)}")
    return found


def test_pacing_takes_what_it_reads_of_the_session_and_returns_its_plan():
    assert pacing_couplings((SRC / "train" / "pacing.py").read_text()) == []


def test_the_pacing_scan_finds_the_trainer_taken_whole_and_its_state_written():
    """Pacing as it was (a planted fault: each coupling is found)."""
    old = """
from typing import Any
class Pacing:
    def __init__(self, trainer: Any):
        self.trainer = trainer
    def apply(self, steps: int, plan, key: str) -> None:
        trainer = self.trainer
        trainer.state.plan = {"steps": steps}
"""
    found = pacing_couplings(old)
    assert found == ["__init__(trainer: Any)", "apply(plan: untyped)", "apply writes trainer.state.plan"]


def run_file_names(layout: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The names of a run's files and of its checkpoint's, as the run directory's module defines them: (constant or
    name) -> the file's name, for the names a run directory holds (`RUN_FORMAT`) and for those its checkpoint
    holds (`CHECKPOINT_FORMAT`), read from the module's own source."""
    values: dict[str, object] = {}
    tree = ast.parse(layout.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names = [t for t in node.targets if isinstance(t, ast.Name)] or [
                e for t in node.targets if isinstance(t, ast.Tuple) for e in t.elts
            ]
            value = node.value.elts if isinstance(node.value, ast.Tuple) and len(names) > 1 else [node.value]
            for name, made in zip(names, value):
                if isinstance(made, ast.Constant) and isinstance(made.value, str):
                    values[name.id] = made.value
                elif isinstance(made, ast.Set):
                    values[name.id] = {values.get(getattr(e, "id", None)) for e in made.elts} | {
                        item for e in made.elts if isinstance(e, ast.Starred) for item in values[e.value.id]
                    }
                elif isinstance(made, ast.Tuple):
                    values[name.id] = {values.get(getattr(e, "id", None)) for e in made.elts}
    run = values["RUN_FORMAT"]
    inside = ("MODEL_FILE", "OPTIMIZER_FILE", "RNG_FILE", "STATE_FILE", "SHARDS_DIR")  # before CHECKPOINT_FORMAT
    checkpoint = values.get("CHECKPOINT_FORMAT") or {values[name] for name in inside}
    by_name = {k: v for k, v in values.items() if isinstance(v, str)}
    top = {**{k: v for k, v in by_name.items() if v in run}, **{v: v for v in run if v}}
    inner = {**{k: v for k, v in by_name.items() if v in checkpoint}, **{v: v for v in checkpoint if v}}
    return top, inner


# the modules that may join a run's file names to a path: the run's (layout) and, for a checkpoint's own files,
# the checkpoints' (their files, a training's saving and loading of them, their shards)
RUN_MODULES = {"train/layout.py"}
CHECKPOINT_MODULES = {"train/layout.py", "train/checkpoints.py", "train/saving.py", "train/shards.py"}


def joined_name(node: ast.AST, names: dict[str, str], literals: bool) -> str | None:
    """The run file's name `node` spells, or None: a constant of the run directory's module, or with `literals` the
    name as a string (or a path that starts with it) where it is a file's name, not a plain word ("run.toml",
    "SHA256SUMS", ".lock"; "data" or "tokenizer" are other directories' too)."""
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.Attribute) and node.attr in names and node.attr.isupper():
        return names[node.attr]
    if literals and isinstance(node, ast.Constant) and isinstance(node.value, str):
        first = node.value.split("/")[0]
        plain_word = first.isalpha() and first.islower()
        return first if first == names.get(first) and not plain_word else None
    return None


def joins(tree: ast.AST) -> list[tuple[int, ast.AST]]:
    """Every (line, operand) joined onto a path: `path / x`, `path.joinpath(x, ...)`, `os.path.join(p, x, ...)`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            found.append((node.lineno, node.right))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "joinpath":
            found += [(node.lineno, arg) for arg in node.args]
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "os.path.join":
            found += [(node.lineno, arg) for arg in node.args[1:]]
    return found


def run_file_joins(root: Path) -> list[str]:
    """Every place under `root` (a package's source) that joins a run's file name to a path outside the modules
    that own those names (`RUN_MODULES`, `CHECKPOINT_MODULES`)."""
    layout = root / "train" / "layout.py"
    if "RUN_FORMAT =" not in layout.read_text():  # before the run's names had one module: train/files.py's
        layout = root / "train" / "files.py"
    top, inner = run_file_names(layout)
    found = []
    for path in sorted(root.rglob("*.py")):
        module = path.relative_to(root).as_posix()
        for line, operand in joins(ast.parse(path.read_text())):
            for names, allowed, literals in ((top, RUN_MODULES, True), (inner, CHECKPOINT_MODULES, False)):
                name = joined_name(operand, names, literals)
                if name is not None and module not in allowed:
                    found.append(f"{module}:{line} {name}")
    return found


def test_every_path_to_a_run_s_file_is_built_by_the_run_directory_s_module():
    top, inner = run_file_names(SRC / "train" / "layout.py")
    assert {"run.toml", "checkpoint", "metrics.jsonl", "SHA256SUMS", ".lock"} <= set(top.values())
    assert {"model.safetensors", "state.json", "shards"} <= set(inner.values())
    assert run_file_joins(SRC) == []


def test_the_join_scan_finds_a_run_s_file_name_joined_anywhere_else(tmp_path):
    """Joins as the modules made them before the run directory's module built every path (a planted fault)."""
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "layout.py").write_text(
        'RUN_CONFIG, TEXT_DIR, CHECKPOINT_DIR = "run.toml", "data", "checkpoint"\nMANIFEST_FILE = "SHA256SUMS"\n'
        'MODEL_FILE = "model.safetensors"\nJOB_FILES = {RUN_CONFIG, TEXT_DIR}\n'
        "RUN_FORMAT = {*JOB_FILES, MANIFEST_FILE, CHECKPOINT_DIR}\nCHECKPOINT_FORMAT = {MODEL_FILE}\n"
        "def config_file(path):\n    return path / RUN_CONFIG\n"
    )
    (tmp_path / "train" / "checkpoints.py").write_text(
        "def weights(checkpoint, run_dir):\n    return checkpoint / MODEL_FILE, run_dir / CHECKPOINT_DIR\n"
    )
    (tmp_path / "interop.py").write_text(
        "import os\ndef run(path, root):\n"
        '    return path / "run.toml", os.path.join(path, "SHA256SUMS"), root / "data"\n'
    )
    (tmp_path / "jobs.py").write_text(
        "from train import layout\ndef f(run, c):\n    return run.joinpath(layout.TEXT_DIR), c / MODEL_FILE\n"
    )
    assert run_file_joins(tmp_path) == [
        "interop.py:3 run.toml",
        "interop.py:3 SHA256SUMS",
        "jobs.py:3 data",
        "jobs.py:3 model.safetensors",
        "train/checkpoints.py:2 checkpoint",
    ]
