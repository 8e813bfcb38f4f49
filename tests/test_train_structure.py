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
