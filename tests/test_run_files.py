"""The run directory owns its paths: what a run holds is asked of it (`kqv.train.layout.RunFiles`: its tokenizer,
tokens, pairs, texts, samples, predictions...), and the file names are kqv.train's alone. No module of the jobs,
the API, the explorer, the experiments or the CLI imports a run file's name or joins one onto a path by hand, and
`--data-from`'s copies are recorded in the new run's SHA256SUMS as the source recorded them, so that a damaged
copy is found when it is read back."""

import ast
from pathlib import Path

import pytest

from kqv.errors import RunError
from kqv.train import files, layout
from kqv.train.layout import RunFiles

SRC = Path(__file__).resolve().parents[1] / "src" / "kqv"
NAMES = {
    name
    for name, value in vars(layout).items()
    if name.isupper()
    and name != "TEMPORARY"
    and (isinstance(value, str) or (isinstance(value, (set, tuple)) and all(isinstance(v, str) for v in value)))
}
FILE_NAMES = {getattr(layout, name) for name in NAMES if isinstance(getattr(layout, name), str)}
SHARED = {
    layout.TEXT_DIR,
    layout.MODEL_FILE,
}  # also the names of other directories' files ("data", a Hugging Face model's)
ABOVE_TRAIN = ("jobs", "explore", "experiments", "cli", "api.py")  # the layers that may ask kqv.train for a run's files


def spelled_outside_train(tree: ast.AST) -> list[str]:
    """The run file names a module imports from kqv.train.layout, and those it joins onto a path (`p / "run.toml"`)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("train.layout"):
            found += [alias.name for alias in node.names if alias.name in NAMES]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant):
            if node.right.value in FILE_NAMES - SHARED:
                found.append(repr(node.right.value))
    return found


def test_no_module_outside_train_spells_a_run_file_s_name():
    spelled = {
        str(path.relative_to(SRC)): names
        for path in sorted(SRC.rglob("*.py"))
        if path.relative_to(SRC).parts[0] in ABOVE_TRAIN
        and (names := spelled_outside_train(ast.parse(path.read_text())))
    }
    assert not spelled, spelled


def test_the_scan_finds_a_name_imported_or_joined_by_hand():
    code = 'from ..train.layout import SAMPLES_FILE, RunFiles\npath = run.path / "run.toml"\n'
    assert spelled_outside_train(ast.parse(code)) == ["SAMPLES_FILE", "'run.toml'"]


def fake_run(path: Path) -> RunFiles:
    run = RunFiles(path)
    run.path.mkdir()
    run.write_tokenizer({"tokenizer.json": "{}"})
    run.write_pairs({"x": __import__("torch").zeros(3)})
    run.write_texts({"test.src": "a\n", "test.tgt": "b\n"})
    files.write_text(run.config_file, "[run]\n")
    run.record()
    return run


def test_copied_data_are_recorded_as_the_source_recorded_them(tmp_path):
    source = fake_run(tmp_path / "source")
    copy = RunFiles(tmp_path / "copy")
    copy.path.mkdir()
    files.write_text(copy.manifest_file, f"{'0' * 64}  tokens.safetensors\n")  # a stale record: replaced, not kept
    copy.copy_data_from(source)
    recorded, copied = layout.read_manifest(source.path), layout.read_manifest(copy.path)
    assert copied == {name: digest for name, digest in recorded.items() if name != "run.toml"}
    copy.verify_data()
    copy.pairs_file.write_bytes(b"damaged")
    with pytest.raises(RunError, match="corrupt"):
        copy.verify_data()


def test_a_damaged_source_is_refused_before_anything_is_copied(tmp_path):
    source = fake_run(tmp_path / "source")
    (source.text_dir / "test.src").write_text("changed\n")
    copy = RunFiles(tmp_path / "copy")
    copy.path.mkdir()
    with pytest.raises(RunError, match="corrupt"):
        copy.copy_data_from(source)
    assert list(copy.path.iterdir()) == []
