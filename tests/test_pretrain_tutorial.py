"""The tutorial (docs/pretrain-to-answers.md) runs what benchmarks/pretrain_qa.py measured: its pretraining and
fine-tuning commands, read with the configs they name, set every option that shapes training as the benchmark's
recipe "next-token, augmented, full names -> fine-tune" does, and its world command writes the benchmark's text."""

import re
import shlex
import tomllib
from pathlib import Path

from kqv.cli.main import main
from kqv.train.config import TrainConfig
from kqv_lab import worlds
from test_pretrain_qa_world import script

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "src" / "kqv" / "configs"
SHAPING = {  # the options that change what is trained (not logging, evaluation, checkpoints or samples)
    "model": ("d_model", "n_heads", "n_layers", "d_ff"),
    "data": ("context", "val_fraction", "objective", "template", "shuffle_sentences"),
    "train": ("batch_size", "steps", "lr", "warmup_steps", "min_lr_ratio", "weight_decay", "grad_clip",
              "budget_minutes", "precision", "seed"),
}  # fmt: skip


def commands(real_text: bool = False) -> list[list[str]]:
    """The tutorial's shell commands, one argument list each (continuation lines joined): those of the invented
    world (from its step 1 on), or with `real_text` those of the CS224N section before it."""
    page = (ROOT / "docs" / "pretrain-to-answers.md").read_text()
    before, world = page.split("\n## 1.", 1)
    page = before if real_text else world
    blocks = re.findall(r"```\n(.*?)```", page, re.S)
    return [shlex.split(block.replace("\\\n", " ")) for block in blocks]


def resolved(config: str, sets: list[str], source_model: dict | None = None) -> dict:
    """The shaping options of a config file with `--set` values over it (a fine-tune's model is its source's)."""
    table = tomllib.loads((CONFIGS / f"lm-{config}.toml").read_text())
    for assignment in sets:
        key, value = assignment.split("=", 1)
        section, name = key.split(".")
        try:
            parsed = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            parsed = value  # a bare word, as the CLI takes it
        table.setdefault(section, {})[name] = parsed
    if source_model is not None:
        table["model"] = source_model
    defaults = {"train": {"budget_minutes": TrainConfig.budget_minutes, "seed": TrainConfig.seed}, "data": {}}
    return {
        f"{section}.{name}": table.get(section, {}).get(name, defaults.get(section, {}).get(name))
        for section, names in SHAPING.items()
        for name in names
    }


def options(argv: list[str], flag: str) -> list[str]:
    return [argv[k + 1] for k, arg in enumerate(argv) if arg == flag]


def test_the_tutorial_trains_the_benchmark_s_recipe(tmp_path):
    bench = script("pretrain_qa")
    jobs = bench.jobs(bench.SIZES["default"], tmp_path, 0, 1)
    recipe = "next-token, augmented, full names"
    wanted_pre = resolved("quick", [o for o in jobs[recipe]["overrides"] if "path" not in o and "sources" not in o])
    source = {k.split(".")[1]: v for k, v in wanted_pre.items() if k.startswith("model.")}
    fine_sets = [o for o in jobs[f"{recipe} -> fine-tune"]["overrides"] if "path" not in o]
    wanted_fine = resolved("quick", fine_sets, source_model=source)
    pre, fine, _ = [c for c in commands() if c[:3] == ["kqv", "train", "lm"]]
    assert options(pre, "--config") == ["quick"] and not options(pre, "--data")
    assert 'data.sources=[{path="world/pretrain.txt", weight=1}]' in options(pre, "--set")  # read as documents
    assert any("data.sources=[" in o and "weight=1}]" in o for o in jobs[recipe]["overrides"])
    got_pre = resolved("quick", options(pre, "--set"))
    assert got_pre == wanted_pre
    assert options(fine, "--init") == ["runs/bios"] and options(fine, "--data") == ["world/questions-seen.jsonl"]
    assert resolved("finetune", options(fine, "--set"), source_model=source) == wanted_fine


def test_the_tutorial_s_world_is_the_benchmark_s(tmp_path, monkeypatch):
    argv, _ = [c for c in commands() if c[:2] == ["kqv", "world"]]
    monkeypatch.chdir(tmp_path)
    assert main(argv[1:]) == 0
    bench = script("pretrain_qa")
    bench.write_files(bench.SIZES["default"], 0, tmp_path)
    assert (tmp_path / "world" / "biographies.txt").read_text() == (tmp_path / "bios_full.txt").read_text()
    pretrain = (tmp_path / "bios_full_pretrain.txt").read_text()
    assert (tmp_path / "world" / "pretrain.txt").read_text() == pretrain  # validation where the benchmark's is
    for name in ("questions-held-out", "questions-seen"):
        short = {"questions-held-out": "held_out", "questions-seen": "seen"}[name]
        assert (tmp_path / "world" / f"{name}.jsonl").read_text() == (tmp_path / f"{short}.jsonl").read_text()
    assert (tmp_path / "world" / "questions-held-out.tsv").read_text() == (tmp_path / "held_out.tsv").read_text()
    assert (tmp_path / "world" / "questions-seen.tsv").read_text() == (tmp_path / "seen.tsv").read_text()


def test_the_page_s_examples_are_in_the_files_it_puts_them_in(tmp_path, monkeypatch):
    """Each `world/FILE` the page describes with an example (a biography, a question, a probe) holds it."""
    argv, _ = [c for c in commands() if c[:2] == ["kqv", "world"]]
    monkeypatch.chdir(tmp_path)
    assert main(argv[1:]) == 0
    page = (ROOT / "docs" / "pretrain-to-answers.md").read_text()
    items = re.findall(r"^- `world/([\w.-]+)`: (.*?)(?=^- |^$)", page, re.M | re.S)
    assert len(items) == 4
    shown = 0
    for name, said in items:
        said = " ".join(said.split())  # the page's lines joined
        examples = [e for e in re.findall(r"\(`([^`]+)`(?: → `([^`]+)`)?\)", said) if " " in e[0]]  # not options
        shown += len(examples)
        text = (tmp_path / "world" / name).read_text()
        for first, answer in examples:
            line = f"{first}\t{answer}" if answer else first
            assert line in text, f"world/{name} does not hold the page's example {line!r}"
        assert "birthplace of he." not in text and "birthplace of she." not in text
    assert shown == 3  # a biography, a seen question, a held-out probe


def test_the_one_version_pretraining_differs_from_the_tutorial_s_only_where_the_pages_say(tmp_path):
    """The benchmark's `next-token` pretraining (the one-version text) reads its sentences in their written order;
    the tutorial's command shuffles them. That is the one shaping option in which they differ, and both pages say so
    where they quote that measurement."""
    bench = script("pretrain_qa")
    jobs = bench.jobs(bench.SIZES["default"], tmp_path, 0, 1, ["next-token -> fine-tune"])
    arm = resolved("quick", [o for o in jobs["next-token"]["overrides"] if "path" not in o and "sources" not in o])
    pre, _, _ = [c for c in commands() if c[:3] == ["kqv", "train", "lm"]]
    tutorial = resolved("quick", options(pre, "--set"))
    differing = {key for key in arm if arm[key] != tutorial[key]}
    assert differing == {"data.shuffle_sentences"} and tutorial["data.shuffle_sentences"] is True
    pages = {
        "fine-tuning.md": r"\*\*On text that states each fact once\.\*\*(.*?)<!-- table",
        "pretrain-to-answers.md": r"What the recipe needs from the text:(.*?)\n\n",
    }
    for page, paragraph in pages.items():
        (said,) = re.findall(paragraph, (ROOT / "docs" / page).read_text(), re.S)
        assert all(f"`{key}`" in said for key in differing), f"{page} does not say the one-version run differs"


def test_the_encyclopedia_example_on_the_fine_tuning_page_is_in_the_default_encyclopedia(tmp_path):
    page = (ROOT / "docs" / "fine-tuning.md").read_text()
    (example,) = re.findall(r"\*\*An encyclopedia's text\.\*\*.*?```\n(.*?)\n```", page, re.S)
    text = worlds.biographies(worlds.make_world(1000, 0), 0, style="encyclopedia")
    assert example in text.splitlines()


ENCYCLOPEDIA_ARM = "mixed: span corruption, encyclopedia + seen questions (CS224N)"
CS224N_SHAPING = ("data.random_prefix", "data.span_loss", "data.prompt_loss_weight")


def test_the_encyclopedia_section_trains_the_benchmark_s_cs224n_recipe_on_its_text(tmp_path, monkeypatch):
    bench = script("pretrain_qa")
    (job,) = bench.jobs(bench.SIZES["default"], tmp_path, 0, 1, [ENCYCLOPEDIA_ARM]).values()
    _, _, train = [c for c in commands() if c[:3] == ["kqv", "train", "lm"]]
    wanted, got = (
        [o for o in sets if "sources" not in o and "path" not in o]
        for sets in (job["overrides"], options(train, "--set"))
    )
    assert resolved("quick", got) == resolved("quick", wanted)
    assert {o.split("=", 1)[0]: o.split("=", 1)[1] for o in got if o.startswith(CS224N_SHAPING)} == {
        o.split("=", 1)[0]: o.split("=", 1)[1] for o in wanted if o.startswith(CS224N_SHAPING)
    }
    sources = [o for o in options(train, "--set") if o.startswith("data.sources=")]
    assert sources == [
        'data.sources=[{path="encyclopedia/pretrain.txt", weight=1}, '
        '{path="encyclopedia/questions-seen.jsonl", weight=1}]'
    ]
    _, argv = [c for c in commands() if c[:2] == ["kqv", "world"]]
    monkeypatch.chdir(tmp_path)
    assert main(argv[1:]) == 0
    bench.write_files(bench.SIZES["default"], 0, tmp_path)
    assert (tmp_path / "encyclopedia" / "pretrain.txt").read_text() == (
        tmp_path / "bios_encyclopedia_pretrain.txt"
    ).read_text()
    assert (tmp_path / "encyclopedia" / "questions-seen.jsonl").read_text() == (tmp_path / "seen.jsonl").read_text()


def test_the_real_text_section_trains_what_the_benchmark_s_kqv_arm_trains(tmp_path):
    """The CS224N section's command is the benchmark's `kqv: --config cs224n-a5` arm: the same config, the text and
    the training split as its two sources, weighted 2:1, and it is scored on the development split."""
    bench = script("cs224n_a5")
    benchmark, train, evaluate = commands(real_text=True)
    assert benchmark[:2] == ["python", "benchmarks/cs224n_a5.py"] and bench.KQV_ARM in benchmark
    assert train[:5] == ["kqv", "train", "lm", "--config", "cs224n-a5"]
    files = {"train": Path("a5-runs/train.tsv"), "dev": Path("a5-runs/dev.tsv")}
    args, scored = bench.arm_command(bench.KQV_ARM, 0, files, Path("a5"), Path("a5-runs"))
    assert (
        train[1:] + ["--set", "train.seed=0"] == args[:-2] + args[-2:]
        and train[-2:] == ["--out", "runs/a5"]
        or ([a for a in train[1:] if a not in ("--out", "runs/a5")] + ["--set", "train.seed=0"] == args)
    )
    assert evaluate[:3] == ["kqv", "eval", "runs/a5"] and options(evaluate, "--data") == [str(scored)]
