"""Fuzzing the configuration surface of `kqv train`: `--set` overrides and the run TOML.

Every bad value (a wrong type, an unknown section or key, an out-of-range number, a table or array where a scalar
belongs) must end in one line `kqv: error: ...` that names the offending key, with exit status 2, never a
traceback, and must leave the run directory exactly as it was: an existing run is not touched even with
`--overwrite`, and a missing `--out` is not created.

The bad values are derived from the packaged quick configs: a key whose TOML value is an int gets strings,
booleans, arrays and tables; a string key gets numbers, arrays and tables; and so on. Out-of-range values come
from a table of limits the configs document.
"""

import contextlib
import hashlib
import io
import subprocess
import sys
import tempfile
import tomllib
from importlib import resources
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kqv.cli.main import main
from kqv.train.trainer import Trainer

TASKS = ("lm", "mt", "mlm", "cls")


def quick_config(task: str) -> dict:
    return tomllib.loads((resources.files("kqv") / "configs" / f"{task}-quick.toml").read_text())


# (task, section, key) -> values outside the documented range
OUT_OF_RANGE = {
    "train.steps": [0, -1], "train.batch_size": [0, -8], "train.lr": [0.0, -1e-3, float("inf"), float("nan")],
    "train.min_lr_ratio": [-0.1, 1.5], "train.warmup_steps": [-1], "train.weight_decay": [-0.1],
    "train.betas": [[1.0, 0.9], [0.9], [0.9, 0.95, 0.99], [-0.1, 0.9]], "train.grad_clip": [-1.0],
    "train.grad_accum": [0], "train.eval_every": [0], "train.eval_batches": [0], "train.checkpoint_every": [0],
    "train.log_every": [0], "train.seed": [-1], "train.max_minutes": [-1.0, float("nan")],
    "train.schedule": ["linear", ""], "train.precision": ["fp16", "BF16"],
    "model.d_model": [0, -16, 30], "model.n_heads": [0, -2, 7], "model.n_layers": [0, -1], "model.d_ff": [0],
    "model.dropout": [-0.1, 1.0, 2.0], "model.position": ["absolute", ""], "model.norm": ["batchnorm"],
    "model.activation": ["tanh-ish"], "model.kind": ["gru"],
    "data.context": [0, 1, -5], "data.val_fraction": [0.0, 0.9, -0.1], "data.tokenizer": ["word"],
    "data.vocab_size": [0, -1], "data.max_tokens": [0, -1], "data.max_len": [0], "data.eval_sentences": [-1],
    "data.dev_fraction": [0.0, 1.5], "data.pair": ["de-xx", "nonsense"],
    "sample.count": [0, -1], "sample.max_new_tokens": [-1], "sample.temperature": [-1.0],
    "sample.top_k": [0, -3], "masking.mask_prob": [0.0, 1.5, -0.1], "decode.beam_size": [0, -1],
    "head.pooling": ["max-ish"],
}

SCALARS_BY_TYPE = {
    int: st.one_of(st.text(min_size=1, max_size=5).filter(lambda s: s.lower() != "none"), st.booleans(),
                   st.lists(st.integers(-3, 3), max_size=2), st.just({"a": 1})),
    float: st.one_of(st.text(min_size=1, max_size=5).filter(lambda s: s.lower() != "none"), st.booleans(),
                     st.lists(st.floats(0, 1), max_size=2), st.just({"x": 0.5})),
    str: st.one_of(st.integers(-5, 5), st.booleans(), st.lists(st.text(max_size=3), max_size=2),
                   st.just({"name": "x"})),
    bool: st.one_of(st.integers(2, 5), st.text(min_size=2, max_size=5).filter(lambda s: s.lower() != "none"),
                    st.just([True]), st.just({"on": True})),
    list: st.one_of(st.integers(-5, 5), st.text(min_size=1, max_size=5).filter(lambda s: s.lower() != "none"),
                    st.just({"b": 0.9})),
}
FREE_STRINGS = {"data.path", "sample.prompt", "data.init", "data.tgt_path"}  # any string is a valid value here


def bad_values(task: str) -> st.SearchStrategy:
    """(dotted key, bad value) pairs for one task."""
    config, cases = quick_config(task), []
    for section, values in config.items():
        if not isinstance(values, dict):
            continue
        for key, value in values.items():
            dotted = f"{section}.{key}"
            kind = type(value) if type(value) in SCALARS_BY_TYPE else None
            if kind is int and isinstance(value, bool):
                kind = bool
            if kind is not None and dotted not in FREE_STRINGS:
                cases.append(st.tuples(st.just(dotted), SCALARS_BY_TYPE[kind]))
            if dotted in OUT_OF_RANGE:
                cases.append(st.tuples(st.just(dotted), st.sampled_from(OUT_OF_RANGE[dotted])))
    names = st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True)
    known = sorted(k for k, v in config.items() if isinstance(v, dict))
    cases.append(st.tuples(st.builds("{}.{}".format, st.sampled_from(known), names.map(lambda n: "zz_" + n)),
                           st.integers(0, 3)))  # an unknown key in a known section
    cases.append(st.tuples(st.builds("{}.{}".format, names.map(lambda n: "zz_" + n), names), st.integers(0, 3)))
    return st.one_of(cases)


def toml_value(value) -> str:
    return tomli_w.dumps({"v": value}).partition("=")[2].strip()


def snapshot(path: Path) -> dict[str, str]:
    """Every file under path (or nothing, if path does not exist) with the SHA-256 of its bytes."""
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(path.rglob("*"))}


def run_cli(argv: list[str]) -> tuple[int, str]:
    stderr, stdout = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
        status = main(argv)
    return status, stderr.getvalue()


@pytest.fixture(autouse=True)
def _never_train(monkeypatch):
    """A bad value that slips through would start a long training run: fail at once instead."""
    def refuse(*args, **kwargs):
        raise AssertionError("a bad config was accepted: a Trainer was about to be built")

    monkeypatch.setattr(Trainer, "__init__", refuse)


@pytest.fixture(scope="module")
def existing_run(tmp_path_factory):
    """A directory that looks like a finished run; nothing a bad config does may change it."""
    root = tmp_path_factory.mktemp("existing")
    (root / "checkpoint").mkdir()
    (root / "checkpoint" / "state.json").write_text('{"step": 3}')
    (root / "metrics.jsonl").write_text('{"step": 3, "train_loss": 1.0}\n')
    (root / "run.toml").write_text('task = "lm"\n')
    return root


def assert_clean_error(status: int, stderr: str, key: str) -> None:
    assert status == 2, stderr
    assert stderr.startswith("kqv: error: ") and stderr.count("\n") == 1, stderr
    assert "Traceback" not in stderr
    name = key.split(".")[-1]
    assert name in stderr, f"the message does not name {key!r}: {stderr}"


def extra_args(task: str, tmp: Path) -> list[str]:
    """What a task needs besides its config to get as far as validating it."""
    if task == "cls":
        data = tmp / "labels.tsv"
        data.write_text("good film\tpos\nbad film\tneg\n" * 4)
        return ["--data", str(data)]
    return []


@pytest.mark.parametrize("task", TASKS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_bad_set_override_is_a_clean_error_that_changes_nothing(task, data, existing_run, tmp_path):
    key, value = data.draw(bad_values(task), label="override")
    mode = data.draw(st.sampled_from(["fresh", "overwrite"]), label="mode")
    out = existing_run if mode == "overwrite" else Path(tempfile.mkdtemp(dir=tmp_path)) / "never-created"
    before = snapshot(out)
    argv = ["train", task, "--out", str(out), "--set", f"{key}={toml_value(value)}", "--quiet",
            *extra_args(task, tmp_path)] + (["--overwrite"] if mode == "overwrite" else [])
    status, stderr = run_cli(argv)
    assert_clean_error(status, stderr, key)
    assert snapshot(out) == before


@pytest.mark.parametrize("task", TASKS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_bad_run_toml_is_a_clean_error_that_changes_nothing(task, data, existing_run, tmp_path):
    config = quick_config(task)
    shape = data.draw(st.sampled_from(["value", "section-scalar", "top-level-key"]), label="shape")
    if shape == "value":
        key, value = data.draw(bad_values(task), label="value")
        section, _, name = key.partition(".")
        config.setdefault(section, {})[name] = value
    elif shape == "section-scalar":  # a scalar or array where a whole section belongs
        key = data.draw(st.sampled_from(sorted(k for k, v in config.items() if isinstance(v, dict))))
        config[key] = data.draw(st.one_of(st.integers(), st.text(max_size=4), st.lists(st.integers(), max_size=2)))
    else:
        key = "zz_" + data.draw(st.from_regex(r"[a-z]{1,8}", fullmatch=True))
        config[key] = data.draw(st.one_of(st.integers(), st.just({"a": 1})))
    path = tmp_path / "bad.toml"
    path.write_text(tomli_w.dumps(config))
    before = snapshot(existing_run)
    status, stderr = run_cli(["train", task, "--config", str(path), "--out", str(existing_run), "--overwrite",
                              "--quiet", *extra_args(task, tmp_path)])
    assert_clean_error(status, stderr, key)
    assert snapshot(existing_run) == before


def test_the_installed_command_exits_2_without_a_traceback(tmp_path):
    out = tmp_path / "never-created"
    done = subprocess.run([sys.executable, "-m", "kqv.cli", "train", "lm", "--out", str(out), "--set",
                           "train.steps={a = 1}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("kqv: error: ") and "steps" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()
