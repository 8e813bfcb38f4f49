"""Tiny trained runs of every kind for the explorer's tests, made through `kqv train` in a few seconds each."""

from __future__ import annotations

from pathlib import Path

from kqv.cli.main import main
from test_mt import MODELS, TINY_RUN, number_corpus  # the MT job's own tiny run: numbers, German -> English

SHAKESPEARE = "To be, or not to be, that is the question.\nWhether 'tis nobler in the mind to suffer.\n" * 30

TRAIN = """
[train]
steps = {steps}
batch_size = 8
lr = 3e-3
warmup_steps = 1
eval_every = {steps}
eval_batches = 1
checkpoint_every = {steps}
log_every = 1
precision = "fp32"
"""

MODEL = """
[model]
d_model = 16
n_heads = 2
n_layers = 2
d_ff = 32
dropout = 0.0
position = "{position}"
"""

CONFIGS = {
    "lm": MODEL + TRAIN + '\n[data]\ntokenizer = "char"\ncontext = 32\n'
    '\n[sample]\nprompt = "To"\ncount = 1\nmax_new_tokens = 8\ntemperature = 0.8\ntop_k = 5\n',
    "mlm": MODEL + TRAIN + '\n[data]\ntokenizer = "char"\ncontext = 32\n',
    "cls": MODEL + TRAIN + '\n[data]\ntokenizer = "char"\nmax_tokens = 32\n\n[head]\npooling = "mean"\n',
    "mt": TINY_RUN.replace("{kind}", "transformer").replace("{model}", MODELS["transformer"]),
    "lstm": TINY_RUN.replace("{kind}", "lstm").replace("{model}", MODELS["lstm"]),
}


def corpus(task: str, directory: Path) -> Path:
    """The training data of a task: Shakespeare lines, number words (de -> en) or labelled sentences."""
    if task == "mt":
        path, text = directory / "numbers.tsv", "".join(f"{s}\t{t}\n" for s, t in number_corpus())
    elif task == "cls":
        words = {"pos": ["good", "great"], "neg": ["bad", "dull"]}
        lines = [f"the play was {words[label][i % 2]}\t{label}" for i in range(40) for label in ("pos", "neg")]
        path, text = directory / "reviews.tsv", "\n".join(lines) + "\n"
    else:
        path, text = directory / "shakespeare.txt", SHAKESPEARE
    path.write_text(text, encoding="utf-8")
    return path


def train_run(kind: str, directory: Path, steps: int = 4, position: str = "learned") -> Path:
    """Train a tiny run of `kind` (lm, mt, lstm, mlm, cls) into directory/kind and return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / f"{kind}.toml"
    task = "mt" if kind == "lstm" else kind
    config.write_text(CONFIGS[kind] if task == "mt" else CONFIGS[kind].format(steps=steps, position=position))
    out = directory / kind
    code = main(
        ["train", task, "--config", str(config), "--data", str(corpus(task, directory)), "--out", str(out), "--quiet"]
    )
    assert code == 0, f"training the tiny {task} run failed"
    return out
