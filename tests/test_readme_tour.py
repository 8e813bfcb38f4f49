"""The README's tour, run as written: the main job of "Set up and run", then every line of "A tour", in order,
parsed from README.md, in a fresh directory holding the clone's `examples/`. The only change to a line is
`SHORTER`'s `--set` overrides, added to each command that trains (a tiny model, a few updates), and `FLAGS`'
`--quick` for the experiment, which the README says. The lines run in one worker process (tests/tour_worker.py:
kqv imported once), `kqv explore --open` answering one request in-process instead of listening and opening a
browser."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TINY = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64"]
FEW = ["train.steps=5", "train.batch_size=8", "train.eval_batches=1", "sample.count=1", "sample.max_new_tokens=20"]
# what each command that trains is given, as `--set KEY=VALUE`s, by its first three words
SHORTER = {
    ("kqv", "train", "lm"): [*TINY, *FEW, "data.val_fraction=0.001"],
    ("kqv", "train", "mt"): [
        *TINY,
        "model.n_encoder_layers=1",
        "model.n_decoder_layers=1",
        "train.steps=3",
        "data.vocab_size=300",
        "data.max_tokens=256",
        "data.eval_sentences=4",
        "decode.beam_size=1",
        "decode.max_len_a=0",
        "decode.max_len_b=2",
    ],
    ("kqv", "experiment", "run"): [
        "d_model=32",
        "n_heads=2",
        "n_layers=1",
        "d_ff=64",
        "context=32",
        "batch_size=8",
        "steps=5",
        "eval_every=5",
        "eval_batches=1",
        "control_steps=5",
        "sample_chars=20",
        "seeds=1",
    ],
}
FINE_TUNE = FEW  # a fine-tune's model is its source's: only its training is shortened
# an experiment also gets --quick: no fingerprint, which a full run makes in four more processes of its own
FLAGS = {("kqv", "experiment", "run"): ["--quick"]}


def section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    return text[start : text.index("\n## ", start + 1)]


def bash_lines(markdown: str) -> list[list[str]]:
    """Each command of the bash blocks, in order: comments dropped, a line's `&&` parts apart."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, re.DOTALL):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            while words:
                part, words = (
                    (words[: words.index("&&")], words[words.index("&&") + 1 :]) if "&&" in words else (words, [])
                )
                found.append(part)
    return found


def tour() -> list[list[str]]:
    """The main job (the set-up line's command after the install), then the tour's lines, as words."""
    main_job = [words for words in bash_lines(section("Set up and run")) if words[:2] == ["kqv", "train"]]
    assert len(main_job) == 1, main_job
    return main_job + bash_lines(section("A tour"))


def shortened(words: list[str]) -> list[str]:
    if "--resume" in words:
        return words  # a resumed run continues with its own run.toml
    overrides = FINE_TUNE if "--init" in words else SHORTER.get(tuple(words[:3]), [])
    for override in overrides:
        assert f" {override.split('=')[0]}=" not in f" {shlex.join(words)}", f"the README sets {override}"
    flags = FLAGS.get(tuple(words[:3]), [])
    assert not set(flags) & set(words), f"the README gives {flags}"
    return words + flags + [word for override in overrides for word in ("--set", override)]


def test_the_tour_is_the_readme_s_lines_in_order():
    lines = tour()
    assert [words[:3] for words in lines] == [
        ["kqv", "train", "lm"],
        ["kqv", "generate", "runs/lm"],
        ["kqv", "eval", "runs/lm"],
        ["kqv", "attention", "runs/lm"],
        ["kqv", "explore", "runs/lm"],
        ["kqv", "train", "lm"],
        ["kqv", "export", "runs/lm"],
        ["kqv", "train", "mt"],
        ["kqv", "translate", "runs/mt"],
        ["kqv", "train", "lm"],
        ["kqv", "eval", "runs/qa"],
        ["kqv", "export", "runs/qa"],
        ["kqv", "experiment", "list"],
        ["kqv", "experiment", "run"],
        ["python", "-c", 'import kqv; print(kqv.load("runs/lm").generate("ROMEO:", temperature=0))'],
    ]
    assert "`tests/test_readme_tour.py` runs every line as written" in section("A tour")
    every_file = {word for words in lines for word in words if word.startswith("examples/")}
    assert every_file and all((ROOT / path).is_file() for path in every_file), every_file


def test_every_line_of_the_readme_s_tour_runs_as_written(tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    lines = [shortened(words) for words in tour()]
    env = {**os.environ, "BROWSER": "true", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("tour_worker.py")), json.dumps(lines)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.stdout.count("TOUR OK: ") == len(lines), done.stdout
    for hf in (tmp_path / "lm-hf", tmp_path / "qa-hf"):  # the main job's quick RoPE model, and its fine-tune
        assert (hf / "config.json").is_file() and (hf / "model.safetensors").is_file()
        assert json.loads((hf / "config.json").read_text())["model_type"] == "gpt_neox"
    assert_the_export_is_the_run(tmp_path / "runs" / "lm", tmp_path / "lm-hf")
    assert (tmp_path / "attention.png").stat().st_size > 0
    assert (tmp_path / "experiments" / "no-causal-mask" / "results.json").is_file()


@torch.no_grad()
def assert_the_export_is_the_run(run_dir: Path, hf_dir: Path) -> None:
    """`transformers` loads the exported directory with the run's logits, and its tokenizer gives the run's ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import kqv

    run, hf = kqv.load(run_dir), AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    text = "ROMEO:\nTo be, or not to be"
    ids = run.tokenizer.encode(text)
    assert AutoTokenizer.from_pretrained(hf_dir)(text)["input_ids"] == ids
    torch.testing.assert_close(hf(torch.tensor([ids])).logits, run.model(torch.tensor([ids])), atol=1e-4, rtol=0)


def test_where_the_test_command_is_the_browser_it_needs_and_the_suite_s_time_are_said():
    """The browser tests skip without Debian's Chromium: each page that gives the test command says how to get it
    (the command tests/browser.py's skip names too) and how long the suite takes."""
    browser = (ROOT / "tests" / "browser.py").read_text(encoding="utf-8")
    assert "apt-get install -y chromium" in browser
    for page in ("README.md", "docs/getting-started.md", "docs/testing.md"):
        text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
        assert "python -m pytest" in text, page
        assert "`apt-get install -y chromium`" in text and "about 16 minutes on 2 cores" in text, page
