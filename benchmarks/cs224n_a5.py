"""CS224N assignment 5's birthplace task, on its real text: recipes that read Wikipedia lines and then answer
"Where was NAME born?" about people whose questions they never saw, beside the assignment's own minGPT.

The data is the assignment's (`--data DIR` holding `wiki.txt` and `birth_places_train.tsv`: see
docs/pretrain-to-answers.md for where the public files come from). Its held-out judge, `birth_dev.tsv`, is never
read here: the development split is carved out of the 2,000 training questions by person (`DEV_SIZE` people drawn
with `--split-seed`), every recipe fine-tunes or mixes in the other questions only, and it is scored on these.

Arms (`--arm`, repeatable; default: every arm), each trained with every `--seeds` seed, `--parallel` runs at a time
with `--threads` torch threads each:

- `kqv: --config cs224n-a5`: kqv's shipped recipe, one command: the assignment's span corruption of `wiki.txt`
  (random openings, a span of about a quarter, the loss on every token) and the questions (prompt, mask, answer)
  in one run (`kqv train lm --config cs224n-a5`), scored by `kqv eval --data dev.tsv`;
- `kqv: the text recipe`: one plain text of 40 passes, each pass every `wiki.txt` line cut to a random opening
  and span-corrupted as the assignment's dataset does, with the questions as lines `QUESTION⁇PLACE⁇`, shuffled,
  read as ordinary next-token text (blocks of 128 characters across lines);
- `minGPT: course settings` / `minGPT: schedule fitted to the budget`: the assignment's own code
  (`benchmarks/references/mingpt_a5.py --mingpt DIR`, a public solved copy's src/ folder), pretrained for
  `--mingpt-minutes` (or `--mingpt-epochs` passes over wiki.txt: a budget that no other load on the machine
  changes), then fine-tuned as the course does; skipped with a note when `--mingpt` is not given.

`--steps N` trains the kqv arms N updates; `--every K` also scores them after every K updates, from copies of their
checkpoints taken as each is written (a learning curve from one run: mid-schedule, not K-update runs of their own).
`--work DIR` keeps every run there, and a run already finished there is scored as it is, not trained again.

Every arm is scored by exact match on the development questions; the bar is the strongest answer that never reads
the question, the training split's most frequent answer (one kind of question here, so one constant; ties to the
first in sorted order), and the table shows each arm's mean over seeds with a seed-level 95% interval (Student's t),
its paired difference to the constant over questions (`kqv.train.difference_over_questions`, seeds
averaged per question), minutes and tokens read.

    python benchmarks/cs224n_a5.py --data ../shared/cs224n-a5 --mingpt minGPT_birthplace_prediction/src
    python benchmarks/cs224n_a5.py --data DIR --arm 'kqv: --config cs224n-a5' --seeds 0 1 2
    python benchmarks/cs224n_a5.py --data DIR --arm 'kqv: --config cs224n-a5' --steps 10000 --every 1000  # a curve
    python benchmarks/cs224n_a5.py --data DIR --quick      # seconds: a few updates, checks the script

Writes benchmarks/results/cs224n_a5.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kqv.train import difference_over_questions
from kqv_lab import benchmarking as harness

DEV_SIZE = 400  # development people carved out of the 2,000 training questions
MASK = "\u2047"  # the assignment's mask symbol (and kqv's character tokenizer's)
SNAPSHOT_POLL_S = 0.2  # how often a curve's run is looked at for a new checkpoint
TEXT_PASSES = 40  # the text recipe's passes over wiki.txt and the questions
KQV_ARM, TEXT_ARM = "kqv: --config cs224n-a5", "kqv: the text recipe"
MINGPT_ARMS = {"minGPT: course settings": "course", "minGPT: schedule fitted to the budget": "cpu"}
ARMS = [KQV_ARM, TEXT_ARM, *MINGPT_ARMS]
QUICK = ["--set", "train.steps=4", "--set", "model.d_model=32", "--set", "model.d_ff=64", "--set", "model.n_layers=1"]
TEXT_SETTINGS = ["--set", "data.context=128", "--set", "train.steps=4000", "--set", "train.warmup_steps=200"]
TEXT_SETTINGS += ["--set", "data.val_fraction=0.02", "--set", "train.budget_minutes=0"]


def read_pairs(path: Path) -> list[tuple[str, str]]:
    return [tuple(line.split("\t")) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def split(data: Path, work: Path, seed: int, size: int = DEV_SIZE) -> dict[str, Path]:
    """The training questions split by person into train.tsv and dev.tsv, `size` people drawn with `seed` (each
    question names one person)."""
    pairs = read_pairs(data / "birth_places_train.tsv")
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    dev, train = sorted(order[:size]), sorted(order[size:])
    files = {"train": work / "train.tsv", "dev": work / "dev.tsv", "dev_masked": work / "dev-masked.tsv"}
    files["train"].write_text("".join(f"{pairs[k][0]}\t{pairs[k][1]}\n" for k in train), encoding="utf-8")
    files["dev"].write_text("".join(f"{pairs[k][0]}\t{pairs[k][1]}\n" for k in dev), encoding="utf-8")
    masked = "".join(f"{pairs[k][0]}{MASK}\t{pairs[k][1]}{MASK}\n" for k in dev)  # the text recipe's answers end in ⁇
    files["dev_masked"].write_text(masked, encoding="utf-8")
    return files


def corrupted(line: str, rng: random.Random, longest: int = 112) -> str:
    """The assignment's span corruption of one line: a random opening of 4 to 7/8 of 128 characters, a span of
    about a quarter of it moved to the end (prefix ⁇ suffix ⁇ span)."""
    kept = line[: rng.randint(4, longest)]
    length = rng.randint(1, max(1, len(kept) // 2))
    start = rng.randint(0, len(kept) - length)
    return kept[:start] + MASK + kept[start + length :] + MASK + kept[start : start + length]


def text_recipe(data: Path, train: Path, out: Path, seed: int, passes: int = TEXT_PASSES) -> Path:
    """The text recipe's one file: `passes` shuffled passes of corrupted wiki lines and masked questions."""
    wiki = [line for line in (data / "wiki.txt").read_text(encoding="utf-8").splitlines() if line.strip()]
    questions = [f"{q}{MASK}{a}{MASK}" for q, a in read_pairs(train)]
    rng, lines = random.Random(seed), []
    for _ in range(passes):
        one = [corrupted(line, rng) for line in wiki] + questions
        rng.shuffle(one)
        lines += one
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def kqv(args: list[str], threads: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    command = [sys.executable, "-m", "kqv.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, check=False)


def checked(result: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed ({result.returncode}): {result.stderr[-2000:]}")
    return result


def tokens_read(run: Path, upto: int | None = None) -> int:
    """The tokens a run trained on (in its first `upto` updates), from its metrics.jsonl: each log interval's
    tokens/s times its seconds."""
    tokens, before = 0.0, 0.0
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if upto is not None and record.get("step", 0) > upto:
            break
        if "tokens_per_s" in record and "train_seconds" in record:
            tokens += record["tokens_per_s"] * (record["train_seconds"] - before)
            before = record["train_seconds"]
    return round(tokens)


def checkpoint_step(run: Path) -> int | None:
    """The update of the checkpoint `run` holds now (None before the first)."""
    try:
        return json.loads((run / "checkpoint" / "state.json").read_text(encoding="utf-8"))["step"]
    except (OSError, ValueError, KeyError):
        return None


def snapshot(run: Path, step: int) -> Path:
    """A copy of `run` as its checkpoint of update `step` left it (`run`-at-`step`), made under a unique temporary
    name and renamed, kept only if the checkpoint did not change while it was copied. A file that went while it was
    copied (the checkpoint being replaced) drops the copy: the next poll copies again."""
    done = run.with_name(f"{run.name}-at-{step}")
    copy = Path(tempfile.mkdtemp(prefix=f".{done.name}-", dir=run.parent))
    try:
        shutil.copytree(run, copy, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".lock", "*.tmp*", "*.old"))
    except shutil.Error:
        shutil.rmtree(copy, ignore_errors=True)
        return done
    if checkpoint_step(copy) == step == checkpoint_step(run) and not done.exists():
        copy.rename(done)
    else:
        shutil.rmtree(copy, ignore_errors=True)
    return done


def train_with_snapshots(args: list[str], run: Path, threads: int, every: int) -> None:
    """`kqv train` with `args` (checkpointing every `every` updates, into `run`); each checkpoint is copied as it is
    written (`snapshot`), so the run can be scored after every `every` updates: a learning curve from one run."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    logged = math.gcd(every, 100)  # a metrics line at every snapshot: the tokens read up to it
    command = [sys.executable, "-m", "kqv.cli", *args, "--set", f"train.checkpoint_every={every}"]
    command += ["--set", f"train.log_every={logged}"]
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, text=True, env=env)
        while process.poll() is None:
            step = checkpoint_step(run)
            if step and not run.with_name(f"{run.name}-at-{step}").exists():
                snapshot(run, step)
            time.sleep(SNAPSHOT_POLL_S)
        log.seek(0)
        checked(subprocess.CompletedProcess(command, process.returncode, "", log.read()), f"training {run.name}")


def snapshots(run: Path) -> list[tuple[int, Path]]:
    """(update, folder) of every snapshot of `run`, in order."""
    found = [(int(p.name.rsplit("-at-", 1)[1]), p) for p in run.parent.glob(f"{run.name}-at-*") if p.is_dir()]
    return sorted(found)


def score(run: Path, scored: Path, threads: int, what: str) -> tuple[dict, list[str]]:
    """`kqv eval` of `run` on the questions `scored`: its figures and each answer (the mask that ends it dropped)."""
    predictions = run / "dev-predictions.tsv"
    evaluated = kqv(["eval", str(run), "--data", str(scored), "--json", "--predictions", str(predictions)], threads)
    figures = json.loads(checked(evaluated, f"scoring {what}").stdout.strip().splitlines()[-1])
    got = [line.split("\t")[2] if line.count("\t") >= 2 else "" for line in predictions.read_text().splitlines()[1:]]
    return figures, [g.removesuffix(MASK).strip() for g in got]


def arm_command(name: str, seed: int, files: dict, data: Path, work: Path) -> tuple[list[str], Path]:
    """The `kqv` arguments that train one kqv arm with `seed` (all but --out), and the questions that score it."""
    if name == KQV_ARM:
        sources = f'[{{path="{data / "wiki.txt"}", weight=2}}, {{path="{files["train"]}", weight=1}}]'
        args = ["train", "lm", "--config", "cs224n-a5", "--set", f"data.sources={sources}"]
        scored = files["dev"]
    else:
        text = text_recipe(data, files["train"], work / f"text-{seed}.txt", seed)
        args = ["train", "lm", "--config", "quick", "--data", str(text), *TEXT_SETTINGS]
        scored = files["dev_masked"]
    return [*args, "--set", f"train.seed={seed}"], scored


def kqv_arm(name: str, seed: int, files: dict, data: Path, work: Path, options: argparse.Namespace) -> dict:
    """Train one kqv arm with `seed` (`options.steps` updates if given; a finished run already in `work` is scored as
    it is: `--work` resumes a benchmark), score it on the development questions, and with `options.every` score it
    after every that many updates too (its `curve`): its record."""
    out = work / f"{'kqv' if name == KQV_ARM else 'text'}-{seed}"
    args, scored = arm_command(name, seed, files, data, work)
    args += ["--out", str(out), *(QUICK if options.quick else [])]
    args += ["--set", f"train.steps={options.steps}"] if options.steps else []
    if not (out / "summary.json").is_file():
        if options.every:
            train_with_snapshots(args, out, options.threads, options.every)
        else:
            checked(kqv(args, options.threads), f"{name} seed {seed}")
    figures, answers = score(out, scored, options.threads, f"{name} seed {seed}")
    summary = json.loads((out / "summary.json").read_text())
    curve = []
    for step, folder in snapshots(out) if options.every else []:
        at, _ = score(folder, scored, options.threads, f"{name} seed {seed} after {step} updates")
        curve.append({"updates": step, "tokens": tokens_read(out, step), "exact_match": at["exact_match"]})
    return {
        "arm": name,
        "seed": seed,
        "correct": figures["correct"],
        "n": figures["n"],
        "exact_match": figures["exact_match"],
        "answers": answers,
        "minutes": summary["wall_seconds"] / 60,
        "updates": summary["steps"],
        "tokens": tokens_read(out),
        "curve": curve,
    }


def mingpt_arm(name: str, seed: int, files: dict, data: Path, mingpt: Path, budget: list[str], threads: int) -> dict:
    """The assignment's code pretrained for `budget` (["--epochs", E] or ["--minutes", M]), fine-tuned and scored on
    the development questions (a record already in the work folder is read as it is)."""
    script = Path(__file__).resolve().parent / "references" / "mingpt_a5.py"
    answers = files["dev"].parent / f"mingpt-{MINGPT_ARMS[name]}-{seed}.txt"
    done = answers.with_suffix(".json")
    if done.is_file():
        record = json.loads(done.read_text(encoding="utf-8"))
        got = answers.read_text(encoding="utf-8").splitlines()
        return record | {"arm": name, "answers": got, "tokens": record["pretrain_tokens_padded"]}
    command = [sys.executable, str(script), "--mingpt", str(mingpt), "--wiki", str(data / "wiki.txt")]
    command += ["--train", str(files["train"]), "--dev", str(files["dev"]), *budget]
    command += ["--settings", MINGPT_ARMS[name], "--seed", str(seed), "--threads", str(threads)]
    command += ["--predictions", str(answers)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    result = checked(subprocess.run(command, capture_output=True, text=True, env=env, check=False), name)
    record = json.loads(result.stdout.strip().splitlines()[-1])
    done.write_text(json.dumps(record), encoding="utf-8")
    got = answers.read_text(encoding="utf-8").splitlines()
    return record | {"arm": name, "answers": got, "tokens": record["pretrain_tokens_padded"]}


def mingpt_budget(args) -> list[str]:
    """minGPT's pretraining budget as its driver's flags: `--epochs E` (passes over wiki.txt, which no other load on
    the machine changes) or `--minutes M` (a few seconds with --quick)."""
    if args.quick:
        return ["--minutes", "0.1"]
    if args.mingpt_epochs is not None:
        return ["--epochs", str(args.mingpt_epochs)]
    return ["--minutes", str(args.mingpt_minutes)]


def rule_reader(data: Path, dev: list[tuple[str, str]]) -> list[str]:
    """A reference that reads the text by rule, not a model: the words after "born in" in the line that starts
    with the person's name (up to a comma, a full stop or a lower-case word); "" where the line has none. How much
    of the task the text states in so many words."""
    lines = {}
    for line in (data / "wiki.txt").read_text(encoding="utf-8").splitlines():
        lines.setdefault(line.split(".")[0].strip(), line)
    answers = []
    for question, _ in dev:
        line = lines.get(question.removeprefix("Where was ").removesuffix(" born?").strip(), "")
        after = line.split("born in ", 1)[1] if "born in " in line else ""
        words = []
        for word in after.replace(",", " , ").split():
            if word in {",", "."} or not word[0].isupper():
                break
            words.append(word)
        answers.append(" ".join(words))
    return answers


def seed_interval(values: list[float]) -> list[float]:
    """A 95% interval of the mean over seeds (Student's t); one seed: no interval."""
    t = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776}
    if len(values) < 2:
        return [values[0], values[0]]
    half = t.get(len(values), 2.0) * statistics.stdev(values) / len(values) ** 0.5
    return [statistics.mean(values) - half, statistics.mean(values) + half]


def summarise(runs: list[dict], dev: list[tuple[str, str]], train: list[tuple[str, str]]) -> dict:
    """Each arm's mean over seeds, its seed interval and its paired difference to the constant over questions."""
    counts = Counter(answer for _, answer in train)
    constant = sorted(counts, key=lambda a: (-counts[a], a))[0]
    constant_scores = [float(answer == constant) for _, answer in dev]
    arms = {}
    for name in dict.fromkeys(run["arm"] for run in runs):
        mine = [run for run in runs if run["arm"] == name]
        per_question = [
            statistics.mean(float(run["answers"][k] == dev[k][1].strip()) for run in mine) for k in range(len(dev))
        ]
        versus = difference_over_questions(per_question, constant_scores)
        scores = [run["exact_match"] for run in mine]
        arms[name] = {
            "seeds": [run["seed"] for run in mine],
            "exact_match": statistics.mean(scores),
            "per_seed": scores,
            "seed_95": seed_interval(scores),
            "versus_constant": versus.to_dict("versus_constant"),
            "minutes": [run["minutes"] for run in mine],
            "tokens": [run.get("tokens") for run in mine],
            "most_common_answers": Counter(a for run in mine for a in run["answers"]).most_common(5),
        }
    constant_em = statistics.mean(constant_scores)
    return {"constant": constant, "constant_exact_match": constant_em, "dev_questions": len(dev), "arms": arms}


def with_rule_reader(summary: dict, data: Path, dev: list[tuple[str, str]]) -> dict:
    """`summary` with the rule reader's exact match on the development questions (`rule_reader`)."""
    read = rule_reader(data, dev)
    return summary | {"rule_reader_exact_match": statistics.mean(a == e.strip() for a, (_, e) in zip(read, dev))}


def table(summary: dict) -> str:
    rows = [
        "| recipe | dev EM (seeds) [95% over seeds] | - constant [95%] | minutes | tokens |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, arm in summary["arms"].items():
        seeds = " / ".join(f"{s:.3f}" for s in arm["per_seed"])
        low, high = arm["seed_95"]
        versus = arm["versus_constant"]
        below, above = versus["versus_constant_95"]
        diff = f"{versus['versus_constant']:+.3f} [{below:+.3f}, {above:+.3f}]"
        minutes = statistics.mean(arm["minutes"])
        tokens = [t for t in arm["tokens"] if t]
        read = f"{statistics.mean(tokens) / 1e6:.1f}M" if tokens else ""
        score = f"**{arm['exact_match']:.3f}** ({seeds}) [{low:.3f}, {high:.3f}]"
        rows.append(f"| {name} | {score} | {diff} | {minutes:.1f} | {read} |")
    rows.append(f"| constant: always '{summary['constant']}' | {summary['constant_exact_match']:.3f} |  |  |  |")
    rule = summary["rule_reader_exact_match"]
    rows.append(f"| not a model: the words after 'born in' in the person's line | {rule:.3f} |  |  |  |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict:
    parser = harness.arguments(
        harness.summary(__doc__), quick="seconds: tiny models", output=harness.results_path("cs224n_a5"), threads=1
    )
    parser.add_argument("--data", type=Path, required=True, help="the folder of wiki.txt and birth_places_train.tsv")
    parser.add_argument("--arm", action="append", choices=ARMS, help="an arm to run (repeatable; default: all)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--mingpt-seeds", type=int, nargs="+", help="minGPT's seeds (default: --seeds)")
    parser.add_argument("--split-seed", type=int, default=0, help="the seed that draws the development people")
    parser.add_argument("--dev-size", type=int, default=DEV_SIZE, help=f"development people (default {DEV_SIZE})")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (default 2, one thread each)")
    parser.add_argument("--mingpt", type=Path, help="the src/ folder of a copy of the assignment's minGPT code")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--mingpt-minutes", type=float, default=28.0, help="minGPT's pretraining budget (minutes)")
    budget.add_argument("--mingpt-epochs", type=float, help="minGPT's pretraining budget in passes over wiki.txt")
    parser.add_argument("--steps", type=int, help="the kqv arms' updates (default: each recipe's own)")
    parser.add_argument("--every", type=int, help="also score the kqv arms after every this many updates (a curve)")
    parser.add_argument("--work", type=Path, help="keep the runs here (default: a temporary folder, removed)")
    args = parser.parse_args(argv)
    for name in ("wiki.txt", "birth_places_train.tsv"):
        if not (args.data / name).is_file():
            parser.error(f"--data {args.data} holds no {name}: give the folder of the assignment's files")
    work = args.work or Path(tempfile.mkdtemp(prefix="cs224n_a5-"))
    work.mkdir(parents=True, exist_ok=True)
    files = split(args.data, work, args.split_seed, args.dev_size)
    arms = args.arm or ARMS
    if args.mingpt is None:
        arms = [a for a in arms if a not in MINGPT_ARMS]
        print("minGPT arms skipped: give --mingpt (the assignment's src/ folder)", file=sys.stderr)
    jobs = []
    for name in arms:
        for seed in (args.mingpt_seeds or args.seeds) if name in MINGPT_ARMS else args.seeds:
            if name in MINGPT_ARMS:
                budget = mingpt_budget(args)
                jobs.append(
                    lambda n=name, s=seed, b=budget: mingpt_arm(n, s, files, args.data, args.mingpt, b, args.threads)
                )
            else:
                jobs.append(lambda n=name, s=seed: kqv_arm(n, s, files, args.data, work, args))
    with ThreadPoolExecutor(args.parallel) as pool:
        runs = list(pool.map(lambda job: job(), jobs))
    dev = read_pairs(files["dev"])
    summary = with_rule_reader(summarise(runs, dev, read_pairs(files["train"])), args.data, dev)
    record = {
        "split_seed": args.split_seed,
        "threads": args.threads,
        "parallel": args.parallel,
        **summary,
        "runs": runs,
    }
    print(table(summary))
    path = harness.output_path(args, "cs224n_a5", quick=args.quick)
    if path is not None:
        harness.write_record(path, record)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return record


if __name__ == "__main__":
    main()
