"""The applications beside the library (src/kqv_lab, and the benchmarks) import kqv only through its public API: the
modules `kqv`, `kqv.api`, `kqv.errors` and `kqv.flag_names` (the command line's vocabulary, which an application's
commands spell their flags with), and the names the packages `kqv.nn`, `kqv.data`, `kqv.train`, `kqv.interop`,
`kqv.jobs` and `kqv.cli` export in their `__all__`. Moving a module inside kqv then breaks no application."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PUBLIC_MODULES = {"kqv.api", "kqv.errors", "kqv.flag_names"}  # any name they define (not `_private`)
PUBLIC_PACKAGES = {"kqv", "kqv.nn", "kqv.data", "kqv.train", "kqv.interop", "kqv.jobs", "kqv.cli"}  # their __all__
LAB = sorted((SRC / "kqv_lab").rglob("*.py"))


def exported(package: str, src: Path = SRC) -> set[str]:
    """The names in a package's `__all__` (its `__init__.py`'s `__all__ = [...]` and `__all__ += [...]`)."""
    names: set[str] = set()
    for node in ast.parse(src.joinpath(*package.split("."), "__init__.py").read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(node, (ast.Assign, ast.AugAssign)) and getattr(target, "id", None) == "__all__":
            names |= set(ast.literal_eval(node.value))
    return names


def private_imports(path: Path, src: Path = SRC) -> list[str]:
    """Each import of `path` that reaches into kqv past its public API, as "LINE: what"."""
    public = PUBLIC_MODULES | PUBLIC_PACKAGES
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [
                f"{node.lineno}: import {alias.name}"
                for alias in node.names
                if alias.name.split(".")[0] == "kqv" and alias.name not in public
            ]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "kqv":
            if node.module not in public:
                found.append(f"{node.lineno}: from {node.module} import ...")
                continue
            allowed = exported(node.module, src) if node.module in PUBLIC_PACKAGES else None
            for alias in node.names:
                name, submodule = alias.name, f"{node.module}.{alias.name}"
                ok = submodule in public or (name in allowed if allowed is not None else not name.startswith("_"))
                if not ok:
                    found.append(f"{node.lineno}: from {node.module} import {name} (not exported)")
    return found


@pytest.mark.parametrize("path", LAB, ids=lambda p: str(p.relative_to(SRC)))
def test_kqv_lab_imports_only_kqv_s_public_api(path):
    assert not (found := private_imports(path)), f"{path.relative_to(ROOT)} imports kqv's insides: {found}"


# The benchmarks are held to the same rule by tests/test_benchmarks_public_api.py (with its one white-box study).


def test_the_scan_finds_a_planted_private_import(tmp_path):
    module = tmp_path / "probe.py"
    for source, expected in (
        ("from kqv.nn import DecoderLM\nfrom kqv import train\nimport kqv.api\nfrom kqv.errors import DataError\n", []),
        ("from kqv.nn.models import DecoderLM\n", ["1: from kqv.nn.models import ..."]),
        ("import kqv.train.trainer\n", ["1: import kqv.train.trainer"]),
        ("x = 1\nfrom kqv.nn import flex\n", ["2: from kqv.nn import flex (not exported)"]),
        ("from kqv.errors import _COMMAND_LINE\n", ["1: from kqv.errors import _COMMAND_LINE (not exported)"]),
        ("def f():\n    from kqv.validation import Config\n", ["2: from kqv.validation import ..."]),
        ("from .experiments import base\nimport kqvx.y\n", []),  # kqv_lab's own modules, another package
    ):
        module.write_text(source)
        assert private_imports(module) == expected, source


def test_what_kqv_lab_uses_is_exported_by_a_public_package():
    assert {"DecoderLM", "FullAttention", "cpu"} <= exported("kqv.nn")
    assert {"Trainer", "TrainConfig", "write_atomically"} <= exported("kqv.train")
    assert {"Command", "DEVICE_HELP", "APPLICATION_COMMANDS"} <= exported("kqv.cli")
    assert {"Config", "DecoderLM"} <= exported("kqv")
    assert len(LAB) > 30
