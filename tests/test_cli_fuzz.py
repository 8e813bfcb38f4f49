"""Bad run configs, fuzzed: whatever is wrong with a `--set` override or the run TOML (a wrong type, an unknown key
or section, a value out of range, a table where a value belongs, broken TOML syntax), `kqv train lm` ends with one
`kqv: error: ...` line on stderr and exit status 2, never a traceback, and the run directory it was pointed at is
left as it was (every file hashed before and after; the lock file records who last asked for the lock)."""

import contextlib
import hashlib
import io
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kqv.cli.main import main
from test_cli import TINY

# The fields of the tiny config, by what they hold: every mutation below makes the config invalid by construction.
INTS = {
    "train": [
        "steps",
        "batch_size",
        "warmup_steps",
        "grad_accum",
        "eval_every",
        "eval_batches",
        "checkpoint_every",
        "seed",
        "log_every",
        "max_bad_steps",
    ],
    "model": ["d_model", "n_heads", "n_layers", "d_ff", "max_len"],
    "data": ["context", "vocab_size"],
    "sample": ["count", "max_new_tokens", "top_k"],
}
FLOATS = {
    "train": ["lr", "min_lr_ratio", "weight_decay", "grad_clip", "max_minutes"],
    "model": ["dropout", "norm_eps"],
    "data": ["val_fraction"],
    "sample": ["temperature"],
}
CHOICES = {
    "train": ["schedule", "precision", "parallel"],
    "model": ["position", "norm", "activation", "attention"],
    "data": ["tokenizer"],
}
BOOLS = {"model": ["norm_first", "bias", "tie_embeddings"]}
# (section, key, a value out of its range)
OUT_OF_RANGE = [
    ("train", "steps", 0),
    ("train", "batch_size", -3),
    ("train", "lr", 0.0),
    ("train", "lr", -1e-3),
    ("train", "min_lr_ratio", 1.5),
    ("train", "warmup_steps", -1),
    ("train", "grad_accum", 0),
    ("train", "eval_every", 0),
    ("train", "eval_batches", 0),
    ("train", "checkpoint_every", 0),
    ("train", "seed", -1),
    ("train", "seed", 2**63),
    ("train", "log_every", 0),
    ("train", "max_minutes", -1.0),
    ("train", "max_bad_steps", 0),
    ("train", "weight_decay", -0.1),
    ("train", "grad_clip", -1.0),
    ("train", "betas", [0.9, 1.0]),
    ("train", "betas", [0.9]),
    ("data", "context", 1),
    ("data", "val_fraction", 0.0),
    ("data", "val_fraction", 0.9),
    ("model", "d_model", 0),
    ("model", "d_model", 17),
    ("model", "n_heads", 0),
    ("model", "n_layers", -2),
    ("model", "d_ff", 0),
    ("model", "dropout", 1.0),
    ("model", "dropout", -0.5),
    ("model", "norm_eps", 0.0),
    ("sample", "count", 0),
    ("sample", "max_new_tokens", -5),
    ("sample", "temperature", -0.1),
    ("sample", "top_k", 0),
    ("sample", "prompt", "\x00"),  # cannot be encoded (an empty prompt means: the start of the corpus)
]
SECTIONS = ["train", "model", "data", "sample"]
BROKEN_TOML = [
    "[train",
    "x = ",
    "= 1",
    "[[",
    "key = 'unterminated",
    "[train]\n",
    "a = 1\na = 2",
    "[sample]\nx = 1\n",
    "v = [1, 2",
    "v = {a = 1",
    "\x00",
    "v = 1979-05-27T25:00:00",
    "[data]\ncontext = 3\n",
]

scalars = st.one_of(
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=10).filter(lambda s: s.lower() != "none"),
    st.booleans(),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(min_size=1, max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
tables = st.dictionaries(st.text(min_size=1, max_size=5), values, max_size=3)


def _field(groups: dict[str, list[str]]) -> st.SearchStrategy[tuple[str, str]]:
    return st.sampled_from([(section, key) for section, keys in groups.items() for key in keys])


@st.composite
def mutations(draw) -> tuple[str, str, object]:
    """(section, key, value) such that setting section.key = value makes the tiny config invalid."""
    kind = draw(st.sampled_from(["unknown key", "unknown section", "wrong type", "out of range", "table"]))
    if kind == "unknown key":
        section = draw(st.sampled_from(SECTIONS))
        key = draw(st.from_regex(r"[a-z_]{1,12}", fullmatch=True).filter(lambda k: k not in _known(section)))
        return section, key, draw(values)
    if kind == "unknown section":
        known = (*SECTIONS, "task", "finetune")
        section = draw(st.from_regex(r"[a-z_]{1,12}", fullmatch=True).filter(lambda s: s not in known))
        return section, draw(st.from_regex(r"[a-z_]{1,8}", fullmatch=True)), draw(values)
    if kind == "out of range":
        return draw(st.sampled_from(OUT_OF_RANGE))
    if kind == "table":  # a table (or an array of them) where a single value belongs
        section, key = draw(_field({s: INTS.get(s, []) + FLOATS.get(s, []) + CHOICES.get(s, []) for s in SECTIONS}))
        return section, key, draw(st.one_of(tables, st.lists(tables, min_size=1, max_size=2)))
    return draw(
        st.one_of(
            st.tuples(
                *_pair(INTS),
                st.one_of(
                    st.text(max_size=8).filter(lambda s: s.lower() != "none"),
                    st.booleans(),
                    st.floats(),
                    st.lists(scalars, max_size=2),
                ),
            ),  # 2.0 is no int either
            st.tuples(*_pair(FLOATS), st.one_of(st.text(max_size=8), st.booleans(), st.lists(scalars, max_size=2))),
            st.tuples(
                *_pair(CHOICES),
                st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.lists(scalars, max_size=2)),
            ),
            st.tuples(*_pair(BOOLS), st.one_of(st.integers(), st.text(max_size=8), st.lists(scalars, max_size=2))),
        )
    )


def _pair(groups: dict[str, list[str]]) -> tuple[st.SearchStrategy[str], st.SearchStrategy[str]]:
    pair = _field(groups)
    return pair.map(lambda p: p[0]), pair.map(lambda p: p[1])


def _known(section: str) -> set[str]:
    import dataclasses

    from kqv.jobs.lm import DataConfig
    from kqv.jobs.sampling import SampleConfig
    from kqv.nn.config import ModelConfig
    from kqv.train.config import TrainConfig

    config = {"train": TrainConfig, "model": ModelConfig, "data": DataConfig, "sample": SampleConfig}[section]
    return {f.name for f in dataclasses.fields(config)}


def toml_value(value: object) -> str:
    """`value` as TOML after `key = ` (what `--set section.key=` takes): tables and arrays inline."""
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(
                f"{tomli_w.dumps({k: 0}).rpartition('=')[0].strip()} = {toml_value(v)}" for k, v in value.items()
            )
            + "}"
        )
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return tomli_w.dumps({"v": value}).partition("=")[2].strip()


def snapshot(run: Path) -> dict[str, str]:
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


@pytest.fixture(scope="module")
def existing_run(tmp_path_factory):
    """A finished tiny run: what the bad commands are pointed at (to train over, resume, or overwrite)."""
    root = tmp_path_factory.mktemp("fuzz")
    corpus = root / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 40)
    config = root / "tiny.toml"
    config.write_text(TINY.format(position="rope"))
    run = root / "run"
    assert main(["train", "lm", "--config", str(config), "--data", str(corpus), "--out", str(run), "--quiet"]) == 0
    return root, config, corpus, run


def kqv(argv: list[str]) -> tuple[int, str]:
    """Run the command line in this process: (exit status, stderr). An exception escaping main is a traceback."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main(argv)
        except SystemExit as exit_:  # argparse's own errors
            status = exit_.code
    return status, stderr.getvalue()


def check_refused(existing_run, extra: list[str], config: Path, mode: list[str]) -> None:
    root, _, corpus, run = existing_run
    before = snapshot(run)
    status, stderr = kqv(
        ["train", "lm", "--config", str(config), "--data", str(corpus), "--out", str(run), "--quiet", *extra, *mode]
    )
    assert status == 2, stderr
    assert stderr.startswith("kqv: error: ") and stderr.count("\n") == 1, stderr
    assert snapshot(run) == before


MODES = st.sampled_from([[], ["--resume"], ["--overwrite"]])
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(mutation=mutations(), mode=MODES)
def test_a_bad_set_override_is_one_error_line_and_changes_nothing(existing_run, mutation, mode):
    root, config, _, _ = existing_run
    section, key, value = mutation
    check_refused(existing_run, [f"--set={section}.{key}={toml_value(value)}"], config, mode)


@FUZZ
@given(mutation=mutations(), mode=MODES)
def test_a_bad_run_toml_is_one_error_line_and_changes_nothing(existing_run, mutation, mode):
    import tomllib

    root, config, _, _ = existing_run
    values = tomllib.loads(config.read_text())
    section, key, value = mutation
    values.setdefault(section, {})
    if not isinstance(values[section], dict):
        values[section] = {}
    values[section][key] = value
    bad = root / "bad.toml"
    bad.write_text(tomli_w.dumps(values))
    check_refused(existing_run, [], bad, mode)


@FUZZ
@given(
    fragment=st.one_of(st.sampled_from(BROKEN_TOML), st.text(min_size=1, max_size=20).map(lambda t: "[" + t)),
    where=st.floats(0, 1),
    mode=MODES,
)
def test_broken_toml_syntax_is_one_error_line_and_changes_nothing(existing_run, fragment, where, mode):
    root, config, _, _ = existing_run
    lines = config.read_text().splitlines()
    at = round(where * len(lines))
    bad = root / "broken.toml"
    bad.write_text("\n".join([*lines[:at], fragment, *lines[at:]]) + "\n")
    check_refused(existing_run, [], bad, mode)


@pytest.mark.parametrize("override", ["train", "train.=3", "=3", "train.steps", ".steps=3", "model=3"])
def test_overrides_that_are_not_section_key_value_are_one_error_line(existing_run, override):
    check_refused(existing_run, [f"--set={override}"], existing_run[1], [])


@pytest.mark.parametrize("section, key, value", OUT_OF_RANGE, ids=lambda v: str(v))
def test_every_out_of_range_value_is_refused_before_anything_is_written(existing_run, section, key, value):
    check_refused(existing_run, [f"--set={section}.{key}={toml_value(value)}"], existing_run[1], ["--overwrite"])


@pytest.mark.parametrize(
    "job, option",
    [
        ("lm", "model.d_model=33"),
        ("mt", "model.d_model=33"),
        ("mt", "model.nope=1"),
        ("lm", 'model.position="learned"'),
    ],
)
def test_a_bad_model_option_is_refused_before_the_run_directory_exists(tmp_path, job, option):
    """[model] is checked when the config is read (with a stand-in vocabulary size), not after the data is
    prepared into the run directory (the MT job took 30 s and left its data there first)."""
    extra = ["--set", "model.max_len=8"] if "learned" in option else []
    status, stderr = kqv(["train", job, "--out", str(tmp_path / "run"), "--set", option, *extra])
    assert status == 2 and stderr.startswith("kqv: error: "), stderr
    assert not (tmp_path / "run").exists()


ENCODINGS = ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "latin-1", "cp1252"]


@FUZZ
@given(
    data=st.one_of(
        st.binary(max_size=200),
        st.tuples(st.sampled_from(ENCODINGS), st.text(max_size=80)).map(
            lambda pair: pair[1].encode(pair[0], errors="replace")
        ),
        st.tuples(st.binary(max_size=8), st.binary(max_size=8), st.floats(0, 1)),
    ),
    mode=MODES,
)
def test_random_config_bytes_are_one_error_line_and_change_nothing(existing_run, data, mode):
    """A config file of random bytes, text in any encoding (UTF-16 with its byte-order mark, Latin-1, ...), or the
    tiny config with random bytes spliced in: one error line, the run untouched."""
    root, config, _, _ = existing_run
    if isinstance(data, tuple):  # the tiny config, with bytes spliced into it
        head, tail, where = data
        text = config.read_bytes()
        at = round(where * len(text))
        data = text[:at] + head + b"\xff" + tail + text[at:]  # 0xFF: never UTF-8, so never a valid config
    bad = root / "bytes.toml"
    bad.write_bytes(data)
    check_refused(existing_run, [], bad, mode)
