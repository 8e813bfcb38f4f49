"""Does what a model read in pretraining become answers? Recipes at equal compute on an invented world.

The world (`people_world.py`, 1,000 people at the default size): one biography per person, varied in wording and
order; three questions per person (birthplace among 120 towns, birth year among 100, trade among 40). Half of the
people's questions are seen in training; the other half's are held out and scored. Every biography is in the
pretraining text, so a held-out answer can only come from what the model read.

Arms, each the same model trained for the same number of updates in all (`pretrain_steps + finetune_steps`, batch
`batch_size`):
- `next-token -> fine-tune`: next-token pretraining on the biographies (one per person), then a full fine-tune on
  the seen questions;
- `next-token, augmented -> fine-tune`: the same on knowledge-augmented text (`versions` biographies per person,
  each worded and ordered anew; Allen-Zhu and Li 2023) read document by document, the sentences of each document
  shuffled at every draw (`data.shuffle_sentences`);
- `span corruption, augmented -> fine-tune` / `-> LoRA`: span-corruption pretraining on the augmented text
  (`data.objective="span_corruption"`), then a full or LoRA fine-tune whose prompts end in the mask symbol
  (`data.template="{prompt}{mask}"`);
- `mixed: span corruption, augmented + seen questions`: one run on the augmented text and the seen questions
  together (`--data bios.txt --data questions.tsv`), scored directly;
- `random init -> fine-tune`: the seen questions alone, no pretraining (what the questions teach by themselves).
Probes: each pretrained model completes a held-out person's own biography sentence ("NAME comes from"), before any
fine-tune: whether the knowledge was stored at all.

Scores: exact match on the held-out questions; the constant answer (`kqv eval`'s: the most frequent answer of the
seen questions), the most frequent answer per kind of question, and a uniform guess as baselines; every difference
paired over questions (`kqv.train.evaluation.difference_over_questions`), the question being the unit.

    python benchmarks/pretrain_qa.py                 # the default size: about 30 minutes on 2 CPU cores
    python benchmarks/pretrain_qa.py --size gpu      # a larger world and model, for one GPU
    python benchmarks/pretrain_qa.py --size quick    # seconds: checks the script

Runs go two at a time (one torch thread each) on a CPU, one at a time on a GPU. Writes
benchmarks/results/pretrain_qa[-SIZE].json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import people_world  # noqa: E402
from finetune_corpus import write_measurement  # noqa: E402
from finetune_qa import run_settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MASK = "\u2047"  # the character tokenizer's reserved mask symbol (kqv.data.documents.MASKS)
TEMPLATE = "{prompt}{mask}"

SIZES = {
    "default": {
        "people": 1000,
        "model": {"d_model": 128, "n_heads": 4, "n_layers": 4, "d_ff": 512},
        "context": 160,
        "batch_size": 32,
        "pretrain_steps": 1800,
        "pretrain_lr": 2e-3,
        "versions": 8,
        "finetune_steps": 300,
        "finetune_lr": 1e-3,
        "lora_rank": 16,
        "parallel": 2,
    },
    "gpu": {
        "people": 3000,
        "model": {"d_model": 384, "n_heads": 6, "n_layers": 6, "d_ff": 1536},
        "context": 192,
        "batch_size": 64,
        "pretrain_steps": 6000,
        "pretrain_lr": 1e-3,
        "versions": 16,
        "finetune_steps": 1000,
        "finetune_lr": 5e-4,
        "lora_rank": 16,
        "parallel": 1,
    },
    "quick": {
        "people": 60,
        "model": {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64},
        "context": 160,
        "batch_size": 8,
        "pretrain_steps": 4,
        "pretrain_lr": 2e-3,
        "versions": 2,
        "finetune_steps": 3,
        "finetune_lr": 1e-3,
        "lora_rank": 2,
        "parallel": 2,
    },
}

# Each pretraining: its text (bios.txt: one biography per person; bios_augmented.txt: `versions` per person, each
# worded and ordered anew) and its settings.
PRETRAININGS = {
    "next-token": ("bios.txt", []),
    "next-token, augmented": ("bios_augmented.txt", ["data.shuffle_sentences=true"]),
    "span corruption, augmented": ("bios_augmented.txt", ['data.objective="span_corruption"']),
}
ARMS = {  # name: (pretraining, last stage: "finetune" | "lora" | "mixed" | "alone", extra settings, template)
    "next-token -> fine-tune": ("next-token", "finetune", [], None),
    "next-token, augmented -> fine-tune": ("next-token, augmented", "finetune", [], None),
    "span corruption, augmented -> fine-tune": ("span corruption, augmented", "finetune", [], TEMPLATE),
    "span corruption, augmented -> LoRA": ("span corruption, augmented", "lora", [], TEMPLATE),
    "mixed: span corruption, augmented + seen questions": (None, "mixed", ['data.objective="span_corruption"'],
                                                           TEMPLATE),
    "random init -> fine-tune": (None, "alone", [], None),
}  # fmt: skip
KINDS = list(people_world.QUESTIONS)


# ---------------------------------------------------------------------------------------------------------------
# The world's files


def write_files(sizes: dict, world_seed: int, work: Path) -> dict:
    """The biographies (one and `versions` per person), the seen and held-out questions, and the probes (plain,
    and in span-corruption form: `prefix MASK . MASK`); what they hold, for the record."""
    people = people_world.make_world(sizes["people"], world_seed)
    seen, held_out = people_world.split(people)
    text = people_world.biographies(people, world_seed)
    augmented = people_world.biographies(people, world_seed, sizes["versions"])
    (work / "bios.txt").write_text(text, encoding="utf-8")
    (work / "bios_augmented.txt").write_text(augmented, encoding="utf-8")
    files = {
        "seen.tsv": people_world.questions(seen),
        "held_out.tsv": people_world.questions(held_out),
        "probe_held_out.tsv": people_world.probes(held_out),
    }
    files["probe_held_out_mask.tsv"] = [(f"{p}{MASK}.{MASK}", c) for p, c in files["probe_held_out.tsv"]]
    for name, pairs in files.items():
        people_world.write_pairs(work / name, pairs)
    unknown = {char for pairs in files.values() for pair in pairs for char in "".join(pair)} - set(text) - {MASK}
    if unknown:  # a fine-tune keeps its pretraining's character tokenizer
        raise SystemExit(f"the questions use characters the biographies never do: {sorted(unknown)}")
    return {
        "people": len(people),
        "seen_people": len(seen),
        "held_out_people": len(held_out),
        "biography_characters": len(text),
        "augmented_characters": len(augmented),
        "distinct_answers": {kind: len({p.answer(kind) for p in people}) for kind in KINDS},
        "example_biography": text.splitlines()[1],
        "example_question": files["held_out.tsv"][0],
        "example_probe": files["probe_held_out.tsv"][0],
    }


# ---------------------------------------------------------------------------------------------------------------
# One run, in its own process


def settings(sizes: dict, steps: int, lr: float, seed: int) -> list[str]:
    return run_settings(sizes, steps, lr, seed, val_fraction=0.05)


def sources(*paths: Path) -> str:
    return "data.sources=[" + ", ".join(f"{{path={json.dumps(str(p))}, weight=1}}" for p in paths) + "]"


def train_one(job: dict) -> dict:
    """Train one run as `job` says, score it on the files `job["score"]` names, and return its figures."""
    import kqv

    out = Path(job["out"])
    init = Path(job["init"]) if job["init"] else None
    summary = kqv.train("lm", "quick", out=out, overrides=job["overrides"], init=init, quiet=True, overwrite=True)
    result = {
        "steps": summary["steps"],
        "train_seconds": summary["train_seconds"],
        "trainable_parameters": summary.get("finetune", {}).get("trainable_parameters", summary["parameters"]),
        "parameters": summary["parameters"],
        "final_train_loss": summary["final_train_loss"],
        "val_loss": summary.get("final_val_loss"),
    }
    run = kqv.load(out)
    for key, path in job["score"].items():
        evaluation = run.evaluate(pairs=path)
        correct = [answered(p.got, p.expected) if key == "probe" else p.correct for p in evaluation.predictions]
        result[key] = evaluation.to_dict() | {
            "per_question": [int(c) for c in correct],
            "exact_match": statistics.fmean(correct),
            "answers": [p.got for p in evaluation.predictions][:12],
        }
    return result


def answered(got: str, expected: str) -> bool:
    """Whether a probe's completion starts with the expected answer as whole words: a next-token model goes on
    after it ("Lemvik. She works...") where a question's answer ends the text."""
    got, expected = got.strip(), expected.strip()
    return got.startswith(expected) and not got[len(expected) : len(expected) + 1].isalnum()


def in_subprocess(job: dict) -> dict:
    """`train_one(job)` in a fresh Python process with one torch thread per CPU run; its JSON read back."""
    env = dict(os.environ, OMP_NUM_THREADS=str(job["threads"]))
    answer = subprocess.run(
        [sys.executable, __file__, "--job", json.dumps(job)], capture_output=True, text=True, env=env
    )
    if answer.returncode != 0:
        raise SystemExit(f"the run {job['out']} failed:\n{answer.stderr[-3000:]}")
    return json.loads(answer.stdout.strip().splitlines()[-1])


def jobs(sizes: dict, work: Path, seed: int, threads: int, arms: list[str] | None = None) -> dict[str, dict]:
    """Every run of `arms` (default all): the pretrainings they start from, then each arm's last stage."""
    pre, fine = sizes["pretrain_steps"], sizes["finetune_steps"]
    seen = work / "seen.tsv"
    chosen = {arm: ARMS[arm] for arm in arms or ARMS}
    runs: dict[str, dict] = {}
    for name, (text, extra) in PRETRAININGS.items():
        if name not in {pretraining for pretraining, *_ in chosen.values()}:
            continue
        probe = "probe_held_out_mask.tsv" if "span" in name else "probe_held_out.tsv"
        documents = "data.shuffle_sentences=true" in extra  # read document by document: a source of its own
        data = sources(work / text) if documents else f"data.path={json.dumps(str(work / text))}"
        runs[name] = {
            "needs": None,
            "overrides": settings(sizes, pre, sizes["pretrain_lr"], seed) + [data] + extra,
            "score": {"probe": str(work / probe)},
        }
    for arm, (pretraining, stage, extra, template) in chosen.items():
        held_out, seen_scored = work / "held_out.tsv", seen  # kqv eval writes the prompts into the run's template
        options = [f"data.template={json.dumps(template)}"] if template else []
        if stage in ("finetune", "lora"):
            steps, lr, data = fine, sizes["finetune_lr"], [f"data.path={json.dumps(str(seen))}"]
            if stage == "lora":
                options.append(f"finetune.lora_rank={sizes['lora_rank']}")
        elif stage == "mixed":
            steps, lr, data = pre + fine, sizes["pretrain_lr"], [sources(work / "bios_augmented.txt", seen)]
        else:  # the questions alone, for as many updates as a pretraining and its fine-tune
            steps, lr, data = pre + fine, sizes["finetune_lr"], [f"data.path={json.dumps(str(seen))}"]
        runs[arm] = {
            "needs": pretraining,
            "overrides": settings(sizes, steps, lr, seed) + data + extra + options,
            "score": {"held_out": str(held_out), "seen": str(seen_scored)},
        }
    for name, job in runs.items():
        job |= {"out": str(work / name.replace(" ", "_").replace(",", "").replace(">", "")), "threads": threads}
    return runs


def train_all(runs: dict[str, dict], parallel: int) -> dict[str, dict]:
    """Train every run, `parallel` at a time, each after the run it starts from."""
    futures: dict[str, Future] = {}

    def go(name: str) -> dict:
        job = runs[name]
        if job["needs"]:
            futures[job["needs"]].result()
            job = job | {"init": runs[job["needs"]]["out"]}
        else:
            job = job | {"init": None}
        started = time.perf_counter()
        print(f"  {name} ...", file=sys.stderr, flush=True)
        result = in_subprocess(job)
        print(f"  {name}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        return result

    with ThreadPoolExecutor(parallel) as pool:
        # first the runs that read the biographies from the start (the long ones), then the rest, those that start
        # from another run last: a run waits only on one already started, and no process waits on a pretraining
        # while a run that needs nothing is still queued
        order = sorted(runs, key=lambda name: (runs[name]["needs"] is not None, not reads_text(runs[name])))
        for name in order:
            futures[name] = pool.submit(go, name)
        return {name: futures[name].result() for name in runs}


def reads_text(job: dict) -> bool:
    return any("bios" in option for option in job["overrides"])


# ---------------------------------------------------------------------------------------------------------------
# Baselines and comparisons, the question being the unit


def baselines(work: Path) -> dict:
    """Scores on the held-out questions of answers that never read the question: the most frequent answer of the
    seen questions (`kqv eval`'s constant), the most frequent per kind of question, and the expected score of a
    uniform guess among the seen questions' distinct answers of the question's kind."""
    from collections import Counter

    from kqv.data.completions import read_examples

    seen, held = read_examples(work / "seen.tsv"), read_examples(work / "held_out.tsv")
    kinds = [people_world.kind(e.prompt) for e in held]
    answers = {k: [e.completion.strip() for e in seen if people_world.kind(e.prompt) == k] for k in KINDS}
    constant = Counter(e.completion.strip() for e in seen).most_common(1)[0][0]
    per_kind = {k: Counter(a).most_common(1)[0][0] for k, a in answers.items()}
    expected = [e.completion.strip() for e in held]
    uniform = [(a in set(answers[k])) / len(set(answers[k])) for a, k in zip(expected, kinds)]
    return {
        "constant": {"answer": constant, "per_question": [int(a == constant) for a in expected]},
        "per_kind": {"answers": per_kind, "per_question": [int(a == per_kind[k]) for a, k in zip(expected, kinds)]},
        "uniform_per_kind": {"per_question": uniform},
        "kinds": kinds,
    }


def versus(a: list[float], b: list[float]) -> dict:
    """a - b paired over questions: the difference, its 95% interval (Student's t over questions) and McNemar."""
    from kqv.train.evaluation import difference_over_questions

    figures = difference_over_questions(a, b).to_dict()
    low, high = figures["difference_95"]
    return figures | {"verdict": "inconclusive" if low <= 0 <= high else ("higher" if low > 0 else "lower")}


def by_kind(per_question: list[float], kinds: list[str]) -> dict[str, float]:
    return {k: statistics.fmean(s for s, q in zip(per_question, kinds) if q == k) for k in KINDS}


def summarise(results: dict[str, dict], baseline: dict) -> dict:
    kinds, strongest = baseline["kinds"], baseline["per_kind"]["per_question"]
    arms = {}
    for arm in [arm for arm in ARMS if arm in results]:
        held = results[arm]["held_out"]["per_question"]
        arms[arm] = {
            "exact_match": statistics.fmean(held),
            "by_kind": by_kind(held, kinds),
            "seen_exact_match": results[arm]["seen"]["exact_match"],
            "versus_constant": versus(held, baseline["constant"]["per_question"]),
            "versus_constant_per_kind": versus(held, strongest),
            "train_seconds": results[arm]["train_seconds"]
            + (results[ARMS[arm][0]]["train_seconds"] if ARMS[arm][0] else 0.0),
            "trainable_parameters": results[arm]["trainable_parameters"],
        }
    best = max(arms, key=lambda a: arms[a]["exact_match"])
    others = {
        f"{best} - {arm}": versus(results[best]["held_out"]["per_question"], results[arm]["held_out"]["per_question"])
        for arm in arms
        if arm != best
    }
    probes = {name: results[name]["probe"]["exact_match"] for name in PRETRAININGS if name in results}
    table = {"constant": baseline["constant"], "per_kind": baseline["per_kind"]}
    rows = {name: {"exact_match": statistics.fmean(t["per_question"]), "by_kind": by_kind(t["per_question"], kinds)}
            for name, t in table.items()}  # fmt: skip
    uniform = baseline["uniform_per_kind"]["per_question"]
    rows["uniform guess per kind"] = {"exact_match": statistics.fmean(uniform), "by_kind": by_kind(uniform, kinds)}
    return {"arms": arms, "best": best, "best_versus": others, "probes": probes, "baselines": rows}


def print_table(summary: dict, baseline: dict) -> None:
    print("| arm | held-out exact match | town | year | trade | - constant per kind [95% over questions] | seen |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, arm in summary["arms"].items():
        gap = arm["versus_constant_per_kind"]
        low, high = gap["difference_95"]
        kinds = " | ".join(f"{arm['by_kind'][k]:.3f}" for k in KINDS)
        print(
            f"| {name} | {arm['exact_match']:.3f} | {kinds} | {gap['difference']:+.3f} [{low:+.3f}, {high:+.3f}] "
            f"| {arm['seen_exact_match']:.3f} |"
        )
    for name, row in summary["baselines"].items():
        kinds = " | ".join(f"{row['by_kind'][k]:.3f}" for k in KINDS)
        print(f"| {name} | {row['exact_match']:.3f} | {kinds} | | |")
    print(f"constant: {baseline['constant']['answer']!r}; per kind: {baseline['per_kind']['answers']}")
    print("probes (held-out people's own biography sentences, before fine-tuning): " + ", ".join(
        f"{name} {score:.3f}" for name, score in summary["probes"].items()))  # fmt: skip
    for name, comparison in summary["best_versus"].items():
        low, high = comparison["difference_95"]
        print(f"{name}: {comparison['difference']:+.3f} [{low:+.3f}, {high:+.3f}] ({comparison['verdict']})")


def measure(sizes: dict, world_seed: int, seed: int, threads: int, work: Path, arms: list[str] | None) -> dict:
    world = write_files(sizes, world_seed, work)
    print(f"{world['people']} people, {world['biography_characters']:,} characters of biographies", file=sys.stderr)
    results = train_all(jobs(sizes, work, seed, threads, arms), sizes["parallel"])
    baseline = baselines(work)
    summary = summarise(results, baseline)
    print_table(summary, baseline)
    return {"world": world, "runs": results, "baselines": baseline, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=list(SIZES), default="default", help="default (2 CPU cores), gpu, quick")
    parser.add_argument("--seed", type=int, default=0, help="the training seed of every run (default 0)")
    parser.add_argument("--world-seed", type=int, default=0, help="the seed of the invented world (default 0)")
    parser.add_argument("--pretrain-steps", type=int, help="the pretrainings' updates (default: the size's)")
    parser.add_argument("--arm", action="append", choices=list(ARMS), help="run this recipe (repeat; default all)")
    parser.add_argument("--output", type=Path, default=None, help="JSON path (default benchmarks/results/...)")
    parser.add_argument("--job", help=argparse.SUPPRESS)  # internal: one run, in a fresh process
    args = parser.parse_args(argv)
    if args.job:
        print(json.dumps(train_one(json.loads(args.job))))
        return 0
    sizes = SIZES[args.size] | ({"pretrain_steps": args.pretrain_steps} if args.pretrain_steps else {})
    if sizes["pretrain_steps"] < 1:
        parser.error("--pretrain-steps must be at least 1")
    threads = max(1, (os.cpu_count() or 2) // sizes["parallel"])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kqv-pretrain-qa-") as scratch:
        record = measure(sizes, args.world_seed, args.seed, threads, Path(scratch), args.arm)
    record = {"benchmark": "pretrain_qa", "size": args.size, "sizes": sizes, "seed": args.seed,
              "world_seed": args.world_seed, "threads_per_run": threads, "arms": args.arm or list(ARMS),
              **record}  # fmt: skip
    suffix = "" if args.size == "default" else f"-{args.size}"
    write_measurement(record, started, args.output or ROOT / "benchmarks" / "results" / f"pretrain_qa{suffix}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
