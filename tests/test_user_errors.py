"""A user's error is a `KqvError` everywhere: the command line prints it as one `kqv: error:` line, and a Python
caller can catch every expected error with one `except KqvError` (or the built-in class it also derives from)."""

import ast
from pathlib import Path

import pytest
import torch

from kqv import DecoderLM, ModelConfig
from kqv.cli.main import main
from kqv.data.tokenizers import make_tokenizer
from kqv.errors import ConfigError, ConversionError, DataError, DataTypeError, KqvError, UnknownTokenError

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "kqv"
BUILT_INS = {"ValueError", "TypeError", "KeyError", "IndexError", "LookupError", "AttributeError"}
# raises of a built-in that are right where they are: {"path:function": why}
ALLOWED = {"measuring.py:_json_default": "json.dumps's `default` hook must raise TypeError for what it cannot encode"}


def bare_raises() -> list[str]:
    """Every `raise ValueError(...)` (or another built-in a user's mistake would raise) in kqv's source."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for function in [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Raise)
                    and isinstance(node.exc, ast.Call)
                    and isinstance(node.exc.func, ast.Name)
                    and node.exc.func.id in BUILT_INS
                ):
                    where = f"{path.relative_to(PACKAGE)}:{function.name}"
                    if where not in ALLOWED:
                        found.append(f"{where} (line {node.lineno}) raises {node.exc.func.id}")
    return sorted(set(found))


def test_no_module_raises_a_bare_built_in_error_for_a_users_mistake():
    assert bare_raises() == [], "raise a kqv.errors class instead (it derives from the built-in one too)"


def test_the_checker_finds_a_bare_raise(tmp_path, monkeypatch):
    probe = tmp_path / "kqv"
    probe.mkdir()
    (probe / "probe.py").write_text("def f(x):\n    if x:\n        raise ValueError('no')\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", probe)
    assert bare_raises() == ["probe.py:f (line 3) raises ValueError"]


@pytest.mark.parametrize(
    "call, error",
    [
        (
            lambda: DecoderLM(ModelConfig(vocab_size=10, d_model=8, n_heads=2, n_layers=1, d_ff=16))(torch.zeros(1, 3)),
            DataTypeError,
        ),
        (lambda: make_tokenizer("char", "abc").token_to_id("z"), UnknownTokenError),
        (lambda: make_tokenizer("char", "abc", special_tokens=["<s>"]), ConfigError),
    ],
)
def test_errors_from_deep_inside_are_kqv_errors_and_still_their_built_in_kind(call, error):
    with pytest.raises(error) as raised:
        call()
    assert isinstance(raised.value, KqvError)
    assert isinstance(raised.value, (ValueError, TypeError, KeyError))


def test_an_unknown_token_reads_as_its_message_not_as_a_quoted_key():
    with pytest.raises(UnknownTokenError) as raised:
        make_tokenizer("char", "abc").token_to_id("z")
    assert str(raised.value) == "'z' is not in this character tokenizer's vocabulary"


def test_the_kinds_of_user_error_share_one_base():
    for kind in (ConfigError, ConversionError, DataError, DataTypeError, UnknownTokenError):
        assert issubclass(kind, KqvError)


def test_a_hugging_face_directory_kqv_cannot_read_is_one_error_line(tmp_path, capsys):
    (tmp_path / "model").mkdir()  # no config.json
    from kqv.interop import from_hf

    with pytest.raises(ConversionError, match="no config.json"):
        from_hf(tmp_path / "model")
    assert main(["train", "lm", "--config", str(tmp_path / "missing.toml")]) == 2
    assert capsys.readouterr().err.startswith("kqv: error: ")
