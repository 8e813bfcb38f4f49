"""Does what a model read in pretraining become answers? Recipes at equal compute on an invented world.

The world (`kqv_lab.worlds`, 1,000 people at the default size): one biography per person, varied in wording and
order; three questions per person (birthplace among 120 towns, birth year among 100, trade among 40). Half of the
people's questions are seen in training; the other half's are held out and scored. Every biography is in the
pretraining text's training split, so a held-out answer can only come from what the model read: the validation
split is other documents (more biographies of seen people, put at the places `kqv.data.completions.split_examples`
holds out), never a held-out person's only biography. Each question names its kind (town, year, trade) in the
`.jsonl` files the runs train on and are scored with.

Arms, each the same model trained for the same number of updates in all (`pretrain_steps + finetune_steps`, batch
`batch_size`): equal compute is equal updates, and each arm's tokens and seconds are recorded beside them. Every arm
is trained with each of `--seeds` (default two).
- `next-token -> fine-tune`: next-token pretraining on the biographies (one per person, read document by
  document), then a full fine-tune on the seen questions;
- `next-token, augmented -> fine-tune`: the same on knowledge-augmented text (`versions` biographies per person,
  each worded and ordered anew; Allen-Zhu and Li 2023) read document by document, the sentences of each document
  shuffled at every draw (`data.shuffle_sentences`);
- `next-token, augmented, full names -> fine-tune`: the same on augmented text that names the person in every
  sentence (`kqv world --full-names`, Allen-Zhu and Li's "fullname" augmentation);
- `span corruption, augmented -> fine-tune` / `-> LoRA`: span-corruption pretraining on the augmented text
  (`data.objective="span_corruption"`), then a full or LoRA fine-tune whose prompts end in the mask symbol
  (`data.template="{prompt}{mask}"`);
- `mixed: next-token, augmented, full names + seen questions`: one next-token run on the full-name text and the
  seen questions together (text weighted 2:1, `MIXTURES`), scored directly and probed;
- `mixed: span corruption, augmented + seen questions`: one run on the augmented text and the seen questions
  together (`--data bios.txt --data questions.tsv`), scored directly;
- `random init -> fine-tune`: the seen questions alone, no pretraining (what the questions teach by themselves);
- on an encyclopedia's text (`kqv world --style encyclopedia`: one paragraph per person, the full name once in
  its first sentence, then pronouns, each fact once; read in its written order), `--world encyclopedia` runs:
  `next-token, encyclopedia -> fine-tune`; `mixed: next-token, encyclopedia + seen questions` (text weighted 2:1,
  probed); `mixed: span corruption, encyclopedia + seen questions (CS224N)`, span corruption as CS224N's assignment
  trains it (`data.random_prefix=true`, `data.span_loss="all"`, prompts `{prompt}{mask}` with
  `data.prompt_loss_weight=1`), the text and the questions weighted 1:1.
Splits (`--split`): `test` (default) trains on the seen people's questions and scores the held-out people's;
`dev` trains on the seen people but the last fifth of them (`DEV_SHARE`) and scores those, so that recipes and
settings are chosen without the held-out people, who are then scored once, with the recipe chosen.
Probes: each pretrained model completes a held-out person's own biography sentence ("NAME comes from"), before any
fine-tune: whether the knowledge was stored at all (right when the completion starts with the answer as whole
words; the record's count, rate and interval all come from that one scoring).

Scores: exact match on the held-out questions, each question's mean over the seeds. The decisive bar is the
strongest answer that never reads the question: each kind's most frequent seen answer (`kqv eval`'s per-kind
constant, `kqv.jobs.scoring.kind_constants`, ties to the first in sorted order, counted over the pairs a fine-tune
trains on, the seen questions less their validation share, as `kqv eval` counts them). Beside it the *reading
score*: exact match over the held-out questions whose answer is not their kind's constant, against a guess among
the kind's other seen answers by frequency (`kqv.jobs.scoring.reading_guess`). Every difference is paired over questions
(`kqv.train.evaluation.difference_over_questions`, the seeds averaged per question), and its verdict is "higher" or
"lower" only when the 95% interval and the exact sign test over the questions (p < 0.05) agree: McNemar's exact test
on one run's 1/0 scores, and on scores averaged over the seeds the count of questions leaning each way. Against the
reading guess each seed is tested on its own (`difference_from_guess`), the largest p deciding.

    python benchmarks/pretrain_qa.py --arm 'next-token, augmented, full names -> fine-tune'
                                                     # the best recipe, seeds 0 and 1: under 30 minutes, 2 cores
    python benchmarks/pretrain_qa.py                 # every arm: up to half an hour a run, two at a time
    python benchmarks/pretrain_qa.py --size gpu      # a larger world and model, for one GPU
    python benchmarks/pretrain_qa.py --size quick    # seconds: checks the script
    python benchmarks/pretrain_qa.py --world encyclopedia --split dev  # the encyclopedia's arms, development people
    python benchmarks/pretrain_qa.py --summarise benchmarks/results/pretrain_qa.json  # today's statistics, same answers
    python benchmarks/pretrain_qa.py --span-set data.random_prefix=true --span-set 'data.span_loss="all"'
                                                     # span corruption as CS224N's dataset and FIM train it

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

import harness
from finetune_qa import run_settings
from kqv_lab import worlds
from kqv_lab.measuring import command

MASK = "\u2047"  # the character tokenizer's reserved mask symbol (kqv.data.documents.MASKS)
TEMPLATE = "{prompt}{mask}"
VAL_FRACTION = worlds.VAL_FRACTION  # each source's validation share: documents no held-out answer needs
SIGNIFICANCE = 0.05  # a verdict needs McNemar's exact p below this as well as an interval clear of zero

SIZES = {
    "default": {
        "people": 1000,
        "model": {"d_model": 128, "n_heads": 4, "n_layers": 4, "d_ff": 512},
        "context": 160,
        "batch_size": 32,
        "pretrain_steps": 4800,
        "pretrain_lr": 2e-3,
        "versions": 8,
        "finetune_steps": 600,
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

# Each pretraining: its text (bios_pretrain.txt: one biography per person; bios_augmented_pretrain.txt: `versions`
# per person, each worded and ordered anew; bios_full_pretrain.txt: the same naming the person in every sentence;
# all with validation documents of their own: `with_validation`) and its settings. Every text is read document by
# document (a source of its own), so that its validation split is whole documents.
SHUFFLED = ["data.shuffle_sentences=true"]
SPANS = ['data.objective="span_corruption"']
# span corruption as CS224N's assignment trains it: random prefixes of each document, the loss on every token of
# the rearranged example, the questions in the same run with the loss on their prompts too
CS224N = [*SPANS, "data.random_prefix=true", 'data.span_loss="all"', "data.prompt_loss_weight=1"]
PRETRAININGS = {
    "next-token": ("bios_pretrain.txt", []),
    # an encyclopedia's text (`kqv world --style encyclopedia`) read in its written order: a pronoun refers to
    # the name of the sentence before it, so its sentences are not shuffled
    # its documents packed, the layout of the recorded runs ("auto" would pad paragraphs too long to share a row)
    "next-token, encyclopedia": ("bios_encyclopedia_pretrain.txt", ["data.packing=true"]),
    "next-token, augmented": ("bios_augmented_pretrain.txt", SHUFFLED),
    "next-token, augmented, full names": ("bios_full_pretrain.txt", SHUFFLED),
    "span corruption, augmented": ("bios_augmented_pretrain.txt", SPANS),
}
ARMS = {  # name: (pretraining, last stage: "finetune" | "lora" | "mixed" | "alone", extra settings, template);
    # a mixed run reads the text and the seen questions of MIXTURES
    "next-token -> fine-tune": ("next-token", "finetune", [], None),
    "next-token, augmented -> fine-tune": ("next-token, augmented", "finetune", [], None),
    "next-token, augmented, full names -> fine-tune": ("next-token, augmented, full names", "finetune", [], None),
    "span corruption, augmented -> fine-tune": ("span corruption, augmented", "finetune", [], TEMPLATE),
    "span corruption, augmented -> LoRA": ("span corruption, augmented", "lora", [], TEMPLATE),
    "mixed: next-token, augmented, full names + seen questions": (None, "mixed", SHUFFLED, None),
    "mixed: span corruption, augmented + seen questions": (None, "mixed", SPANS, TEMPLATE),
    "random init -> fine-tune": (None, "alone", [], None),
    "next-token, encyclopedia -> fine-tune": ("next-token, encyclopedia", "finetune", [], None),
    "mixed: next-token, encyclopedia + seen questions": (None, "mixed", [], None),
    "mixed: span corruption, encyclopedia + seen questions (CS224N)": (None, "mixed", CS224N, TEMPLATE),
}  # fmt: skip
ENCYCLOPEDIA_ARMS = [arm for arm in ARMS if "encyclopedia" in arm]  # what `--world encyclopedia` runs
MIXTURES = {  # a mixed arm's sources: (file, weight); the next-token ones read the text twice as often; QUESTIONS:
    # the questions the split trains on (`SPLITS`)
    "mixed: next-token, augmented, full names + seen questions": (("bios_full_pretrain.txt", 2), ("QUESTIONS", 1)),
    "mixed: span corruption, augmented + seen questions": (("bios_augmented_pretrain.txt", 1), ("QUESTIONS", 1)),
    "mixed: next-token, encyclopedia + seen questions": (("bios_encyclopedia_pretrain.txt", 2), ("QUESTIONS", 1)),
    "mixed: span corruption, encyclopedia + seen questions (CS224N)": (
        ("bios_encyclopedia_pretrain.txt", 1),
        ("QUESTIONS", 1),
    ),
}
# What a split trains on and scores: "test", the seen people's questions and the held-out people's (scored once,
# with the recipe chosen); "dev", the seen people but the last DEV_SHARE of them, and those people's questions, to
# choose recipes and settings on without looking at the held-out people. Files: (trained, scored, probes).
SPLITS = {
    "test": ("seen.jsonl", "held_out.jsonl", "probe_held_out"),
    "dev": ("seen_dev.jsonl", "dev.jsonl", "probe_dev"),
}
DEV_SHARE = 0.2  # of the seen people
KINDS = list(worlds.QUESTIONS)


# ---------------------------------------------------------------------------------------------------------------
# The world's files


def write_files(sizes: dict, world_seed: int, work: Path) -> dict:
    """The biographies (one and `versions` per person: bios.txt and bios_augmented.txt, the tutorial's text; the
    runs read them with validation documents of their own, *_pretrain.txt), the seen and held-out questions and
    the probes (plain, and in span-corruption form: `prefix MASK . MASK`), as TSV (the tutorial's) and as .jsonl
    naming each question's kind (what the runs train on and are scored with); what they hold, for the record."""
    people = worlds.make_world(sizes["people"], world_seed)
    seen, held_out = worlds.split(people)
    trained_dev, dev = dev_split(seen)
    text = worlds.biographies(people, world_seed)
    augmented = worlds.biographies(people, world_seed, sizes["versions"])
    named = worlds.biographies(people, world_seed, sizes["versions"], full_names=True)
    encyclopedia = worlds.biographies(people, world_seed, style="encyclopedia")
    validation = {}
    for name, whole, versions, full_names, style in (
        ("bios", text, sizes["versions"], False, "varied"),
        ("bios_augmented", augmented, sizes["versions"], False, "varied"),
        ("bios_full", named, sizes["versions"], True, "varied"),
        ("bios_encyclopedia", encyclopedia, 1, False, "encyclopedia"),
    ):
        (work / f"{name}.txt").write_text(whole, encoding="utf-8")
        laid_out, extra = worlds.with_validation(whole, seen, world_seed, versions, VAL_FRACTION, full_names, style)
        (work / f"{name}_pretrain.txt").write_text(laid_out, encoding="utf-8")
        validation[name] = extra
    files = {
        "seen.tsv": worlds.questions(seen),
        "held_out.tsv": worlds.questions(held_out),
        "probe_held_out.tsv": worlds.probes(held_out),
        "seen_dev.tsv": worlds.questions(trained_dev),
        "dev.tsv": worlds.questions(dev),
        "probe_dev.tsv": worlds.probes(dev),
    }
    for probes in ("probe_held_out", "probe_dev"):
        files[f"{probes}_mask.tsv"] = [(f"{p}{MASK}.{MASK}", c) for p, c in files[f"{probes}.tsv"]]
    for name, pairs in files.items():
        worlds.write_pairs(work / name, pairs)
        worlds.write_jsonl(work / name.replace(".tsv", ".jsonl"), pairs, MASK)
    asked = {char for pairs in files.values() for pair in pairs for char in "".join(pair)} - {MASK}
    for whole in (text, encyclopedia):  # a fine-tune keeps its pretraining's character tokenizer
        if asked - set(whole):
            raise SystemExit(
                f"the questions use characters a pretraining text never does: {sorted(asked - set(whole))}"
            )
    return {
        "validation_documents": validation,
        "people": len(people),
        "seen_people": len(seen),
        "held_out_people": len(held_out),
        "biography_characters": len(text),
        "augmented_characters": len(augmented),
        "encyclopedia_characters": len(encyclopedia),
        "dev_people": len(dev),
        "distinct_answers": {kind: len({p.answer(kind) for p in people}) for kind in KINDS},
        "example_biography": text.splitlines()[1],
        "example_encyclopedia": encyclopedia.splitlines()[1],
        "example_question": files["held_out.tsv"][0],
        "example_probe": files["probe_held_out.tsv"][0],
    }


def dev_split(seen: list) -> tuple[list, list]:
    """The seen people a development run trains on and the last `DEV_SHARE` of them, whose questions it scores:
    people other than the held-out ones, so recipes chosen on them are scored on the held-out people once."""
    middle = len(seen) - max(1, round(len(seen) * DEV_SHARE))
    return seen[:middle], seen[middle:]


# ---------------------------------------------------------------------------------------------------------------
# One run, in its own process


def settings(sizes: dict, steps: int, lr: float, seed: int) -> list[str]:
    return run_settings(sizes, steps, lr, seed, val_fraction=VAL_FRACTION)


def sources(*paths: Path, weights: tuple[int, ...] = ()) -> str:
    """The `data.sources` setting of files read with `weights` (default 1 each)."""
    weights = weights or (1,) * len(paths)
    files = (f"{{path={json.dumps(str(p))}, weight={w}}}" for p, w in zip(paths, weights, strict=True))
    return "data.sources=[" + ", ".join(files) + "]"


def train_one(job: dict) -> dict:
    """Train one run as `job` says, score it on the files `job["score"]` names, and return its figures."""
    import kqv

    out = Path(job["out"])
    init = Path(job["init"]) if job["init"] else None
    summary = kqv.train("lm", "quick", out=out, overrides=job["overrides"], init=init, quiet=True, overwrite=True)
    run = kqv.load(out)
    result = {
        "steps": summary["steps"],
        "tokens": trained_tokens(run, summary["steps"]),
        "train_seconds": summary["train_seconds"],
        "trainable_parameters": summary.get("finetune", {}).get("trainable_parameters", summary["parameters"]),
        "parameters": summary["parameters"],
        "final_train_loss": summary["final_train_loss"],
        "val_loss": summary.get("final_val_loss"),
    }
    for key, path in job["score"].items():
        evaluation = run.evaluate(pairs=path)
        result[key] = probe_record(evaluation) if key == "probe" else question_record(evaluation)
    return result


def question_record(evaluation) -> dict:
    """A question file's figures (`kqv eval`'s, `PairsEvaluation.to_dict`) and each question's score (1/0)."""
    return evaluation.to_dict() | {
        "per_question": [int(p.correct) for p in evaluation.predictions],
        "answers": [p.got for p in evaluation.predictions][:12],
    }


def probe_record(evaluation) -> dict:
    """A probe file's figures, every one from the same scoring (`answered`: the completion starts with the answer
    as whole words): the count, the rate and its 95% Wilson interval, beside the completion loss."""
    from kqv.train.evaluation import wilson_interval

    right = [int(answered(p.got, p.expected)) for p in evaluation.predictions]
    low, high = wilson_interval(sum(right), len(right))
    return {
        "scored_as": "the completion starts with the expected answer as whole words",
        "n": len(right),
        "correct": sum(right),
        "exact_match": sum(right) / len(right),
        "exact_match_95": [low, high],
        "loss": evaluation.loss,
        "tokens": evaluation.tokens,
        "per_question": right,
        "answers": [p.got for p in evaluation.predictions][:12],
    }


def trained_tokens(run, steps: int) -> int:
    """The real (not padding) tokens a run's `steps` batches fed the model, rebuilt from its stored examples."""
    from kqv.train.topology import Topology

    options = run.loaded_corpus.trainer_options(run.config.train, Topology())
    return sum(options.tokens_per_batch(i) for i in range(steps))


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
    """Every run of `arms` (default all): the pretrainings they start from, then each arm's last stage; each trains
    on and is scored with the questions of the split `sizes["split"]` names (`SPLITS`, default "test")."""
    pre, fine = sizes["pretrain_steps"], sizes["finetune_steps"]
    trained, scored, probes = SPLITS[sizes.get("split", "test")]
    seen = work / trained
    chosen = {arm: ARMS[arm] for arm in arms or ARMS}
    runs: dict[str, dict] = {}
    for name, (text, extra) in PRETRAININGS.items():
        if name not in {pretraining for pretraining, *_ in chosen.values()}:
            continue
        probe = f"{probes}_mask.jsonl" if "span" in name else f"{probes}.jsonl"
        runs[name] = {
            "needs": None,
            "overrides": settings(sizes, pre, sizes["pretrain_lr"], seed)
            + [sources(work / text)]
            + spans(extra, sizes),
            "score": {"probe": str(work / probe)},
        }
    for arm, (pretraining, stage, extra, template) in chosen.items():
        held_out, seen_scored = work / scored, seen  # kqv eval writes prompts into the run's template
        options = [f"data.template={json.dumps(template)}"] if template else []
        if stage in ("finetune", "lora"):
            steps, lr, data = fine, sizes["finetune_lr"], [f"data.path={json.dumps(str(seen))}"]
            if stage == "lora":
                options.append(f"finetune.lora_rank={sizes['lora_rank']}")
        elif stage == "mixed":
            files, weights = zip(*MIXTURES[arm])
            files = [trained if f == "QUESTIONS" else f for f in files]
            steps, lr, data = pre + fine, sizes["pretrain_lr"], [sources(*(work / f for f in files), weights=weights)]
        else:  # the questions alone, for as many updates as a pretraining and its fine-tune
            steps, lr, data = pre + fine, sizes["finetune_lr"], [f"data.path={json.dumps(str(seen))}"]
        runs[arm] = {
            "needs": pretraining,
            "overrides": settings(sizes, steps, lr, seed) + data + spans(extra, sizes) + options,
            "score": {"held_out": str(held_out), "seen": str(seen_scored)}
            | ({"probe": str(work / f"{probes}.jsonl")} if probed_mixture(arm) else {}),
        }
    for name, job in runs.items():
        directory = work / f"seed{seed}" / name.replace(" ", "_").replace(",", "").replace(">", "")
        job |= {"out": str(directory), "threads": threads}
    return runs


def probed_mixture(arm: str) -> bool:
    """Whether `arm` is a mixed next-token run, probed as well (it is its own pretraining): its stored facts,
    beside its answers."""
    _, stage, extra, _ = ARMS[arm]
    return stage == "mixed" and not any("span_corruption" in option for option in extra)


def spans(extra: list[str], sizes: dict) -> list[str]:
    """A run's own settings, and where it does span corruption, the `--span-set` settings (`span_options`)."""
    return extra + (sizes.get("span_options", []) if 'data.objective="span_corruption"' in extra else [])


def seeded_jobs(sizes: dict, work: Path, seeds: list[int], threads: int, arms: list[str] | None) -> dict[str, dict]:
    """`jobs` for every seed, each run named "NAME | seed S" and starting from its own seed's pretraining."""
    runs = {}
    for seed in seeds:
        for name, job in jobs(sizes, work, seed, threads, arms).items():
            needs = job["needs"] and seeded(job["needs"], seed)
            runs[seeded(name, seed)] = job | {"needs": needs}
    return runs


def seeded(name: str, seed: int) -> str:
    return f"{name} | seed {seed}"


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


def trained_questions(path: Path) -> list:
    """The examples of a questions file that a run trains on: all but the validation share kqv holds out of it
    (`kqv.data.completions.split_examples` at `VAL_FRACTION`), the answers `kqv eval` counts for a fine-tuned run's
    baselines ("the 1,425 pairs the run fine-tuned on")."""
    from kqv.data.completions import read_examples, split_examples

    examples = read_examples(path)
    train, _ = split_examples(len(examples), VAL_FRACTION)
    return [examples[k] for k in train]


def baselines(work: Path, split: str = "test") -> dict:
    """Scores on the scored questions of `split` (`SPLITS`: the held-out people's, or the development people's) of
    answers that never read the question, from the answers a fine-tune trains on (`trained_questions`: the trained
    file less its validation share, so that each kind's constant is the one `kqv eval` prints for the fine-tuned
    run) by `kqv eval`'s own functions (`kqv.jobs.scoring`): the constant (`constant_answer`), each kind's constant
    (`kind_constants`: the decisive bar), the expected score of a uniform guess among the kind's distinct seen
    answers; and for the reading score, which questions count (their answer is not their kind's constant), the
    expected score there of a guess among the kind's other seen answers by frequency (`reading_guess`), and the
    score there of each kind's runner-up, the most frequent of its other seen answers (ties as `constant_answer`
    breaks them): the strongest answer that never reads a reading question."""
    from collections import Counter

    from kqv.data.completions import read_examples
    from kqv.jobs.scoring import constant_answer, kind_constants, normalise, reading_guess, runner_up

    trained, scored, _ = SPLITS[split]
    seen, held = trained_questions(work / trained), read_examples(work / scored)
    kinds = [e.kind for e in held]
    constant = constant_answer([e.completion for e in seen])
    per_kind = kind_constants([e.completion for e in seen], [e.kind for e in seen])
    counts = {k: Counter(normalise(e.completion) for e in seen if e.kind == k) for k in per_kind}
    expected = [normalise(e.completion) for e in held]
    uniform = [(a in counts[k]) / len(counts[k]) for a, k in zip(expected, kinds)]
    reading = [k for k, (a, kind) in enumerate(zip(expected, kinds)) if a != per_kind[kind]]
    runner_ups = {kind: runner_up(counts[kind], per_kind[kind]) for kind in per_kind}  # kqv eval's rule
    return {
        "constant": {"answer": constant, "per_question": [int(a == constant) for a in expected]},
        "per_kind": {"answers": per_kind, "per_question": [int(a == per_kind[k]) for a, k in zip(expected, kinds)]},
        "uniform_per_kind": {"per_question": uniform},
        "reading": {
            "questions": reading,
            "guess": [reading_guess(expected[k], counts[kinds[k]], per_kind[kinds[k]]) for k in reading],
            "runner_up": {
                "answers": runner_ups,
                "per_question": [int(expected[k] == runner_ups[kinds[k]]) for k in reading],
            },
        },
        "kinds": kinds,
        "split": split,
        "reference": f"the {len(seen):,} pairs a fine-tune trains on ({trained} less its validation share)",
    }


def versus(a: list[float], b: list[float]) -> dict:
    """a - b paired over questions: the difference, its 95% interval (Student's t over questions) and McNemar's
    exact test (`verdict`)."""
    from kqv.train.evaluation import difference_over_questions

    return verdict(difference_over_questions(a, b).to_dict())


def verdict(figures: dict) -> dict:
    """A difference's figures with its verdict: "higher" or "lower" only when the interval is clear of zero and the
    exact test's p < SIGNIFICANCE agrees, else "inconclusive"."""
    low, high = figures["difference_95"]
    agreed = figures["p_value"] < SIGNIFICANCE
    return figures | {"verdict": "higher" if low > 0 and agreed else "lower" if high < 0 and agreed else "inconclusive"}


def by_kind(per_question: list[float], kinds: list[str]) -> dict[str, float]:
    return {k: statistics.fmean(s for s, q in zip(per_question, kinds) if q == k) for k in KINDS}


def over_seeds(results: dict[str, dict], name: str, seeds: list[int], key: str) -> list[float]:
    """Each question's mean score over the seeds (`mean_over_seeds`): the unit stays the question."""
    from kqv.train.evaluation import mean_over_seeds

    return mean_over_seeds([results[seeded(name, seed)][key]["per_question"] for seed in seeds])


def reading_score(per_question: list[float], baseline: dict, per_seed: list[list[int]]) -> dict:
    """The reading score of per-question scores (each the mean of the seeds' 1/0 scores `per_seed`): their mean over
    the reading questions with its 95% interval (Student's t over those questions; with one seed's 1/0 scores,
    Wald's), and the difference to the guess, its exact test each seed's own chance that a guess gets as many
    right, the largest of their p-values deciding (`difference_from_guess`: the seeds are not pooled)."""
    from kqv.train.evaluation import difference_from_guess, difference_over_questions

    questions = baseline["reading"]["questions"]
    chosen = [per_question[k] for k in questions]
    seeds_chosen = [[scores[k] for k in questions] for scores in per_seed]
    guess = baseline["reading"]["guess"]
    zero = [0.0] * len(chosen)
    interval = difference_over_questions(chosen, zero)  # the mean of the scores and its t interval over questions
    return {
        "questions": len(chosen),
        "exact_match": statistics.fmean(chosen),
        "exact_match_95": [max(0.0, interval.low), interval.high],
        "guess": statistics.fmean(guess),
        "versus_guess": verdict(difference_from_guess(chosen, guess, per_seed=seeds_chosen).to_dict()),
        "runner_up": statistics.fmean(baseline["reading"]["runner_up"]["per_question"]),
        "versus_runner_up": versus(chosen, baseline["reading"]["runner_up"]["per_question"]),
    }


def compute(results: dict[str, dict], arm: str, seeds: list[int]) -> dict:
    """What an arm spent, its pretraining included, per seed: updates (what the arms are equal in), tokens and
    seconds."""
    pretraining = ARMS[arm][0]
    spent = {}
    for seed in seeds:
        stages = [results[seeded(arm, seed)]] + ([results[seeded(pretraining, seed)]] if pretraining else [])
        spent[seed] = {key: sum(stage[key] for stage in stages) for key in ("steps", "tokens", "train_seconds")}
    return {"equal_in": "updates", "per_seed": spent}


def summarise(results: dict[str, dict], baseline: dict, seeds: list[int]) -> dict:
    kinds, strongest = baseline["kinds"], baseline["per_kind"]["per_question"]
    arms, held_out = {}, {}
    for arm in [arm for arm in ARMS if seeded(arm, seeds[0]) in results]:
        held_out[arm] = held = over_seeds(results, arm, seeds, "held_out")
        arms[arm] = {
            "exact_match": statistics.fmean(held),
            "per_seed": {seed: results[seeded(arm, seed)]["held_out"]["exact_match"] for seed in seeds},
            "by_kind": by_kind(held, kinds),
            "seen_exact_match": statistics.fmean(over_seeds(results, arm, seeds, "seen")),
            "versus_constant": versus(held, baseline["constant"]["per_question"]),
            "versus_constant_per_kind": versus(held, strongest),
            "reading": reading_score(
                held, baseline, [results[seeded(arm, seed)]["held_out"]["per_question"] for seed in seeds]
            ),
            "compute": compute(results, arm, seeds),
            "train_seconds": statistics.fmean(
                c["train_seconds"] for c in compute(results, arm, seeds)["per_seed"].values()
            ),
            "trainable_parameters": results[seeded(arm, seeds[0])]["trainable_parameters"],
        }
    best = max(arms, key=lambda a: arms[a]["exact_match"])
    others = {f"{best} - {arm}": versus(held_out[best], held_out[arm]) for arm in arms if arm != best}
    probes, probe_records = {}, {}  # each pretraining's mean over the seeds, and each seed's own figures
    probed = [*PRETRAININGS, *filter(probed_mixture, ARMS)]
    for name in [name for name in probed if seeded(name, seeds[0]) in results]:
        records = [results[seeded(name, seed)]["probe"] for seed in seeds]
        probes[name] = statistics.fmean(over_seeds(results, name, seeds, "probe"))
        probe_records[name] = {seed: {k: r[k] for k in ("correct", "n", "exact_match", "exact_match_95")}
                               for seed, r in zip(seeds, records)}  # fmt: skip
    table = {"constant": baseline["constant"], "per_kind": baseline["per_kind"]}
    rows = {name: {"exact_match": statistics.fmean(t["per_question"]), "by_kind": by_kind(t["per_question"], kinds)}
            for name, t in table.items()}  # fmt: skip
    uniform = baseline["uniform_per_kind"]["per_question"]
    rows["uniform guess per kind"] = {"exact_match": statistics.fmean(uniform), "by_kind": by_kind(uniform, kinds)}
    return {"seeds": seeds, "split": baseline.get("split", "test"), "arms": arms, "best": best,
            "best_versus": others, "probes": probes, "probe_records": probe_records, "baselines": rows}  # fmt: skip


def print_table(summary: dict, baseline: dict) -> None:
    seeds = ", ".join(map(str, summary["seeds"]))
    scored = {"test": "held-out", "dev": "development"}[summary.get("split", "test")]
    print(f"seeds {seeds}; each question's mean over them; a verdict needs the interval and the exact test's p < "
          f"{SIGNIFICANCE} (the sign test over the questions, which is McNemar's on one run's 1/0 scores; against "
          f"the guess, each seed's chance that a guess gets as many right, the largest p deciding)")  # fmt: skip
    print(f"| arm | {scored} exact match | town | year | trade | - constant per kind [95%] | reading [95%] "
          "| reading - guess [95%] | reading - runner-up [95%] | seen | updates | tokens | seconds |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, arm in summary["arms"].items():
        gap, reading = arm["versus_constant_per_kind"], arm["reading"]
        kinds = " | ".join(f"{arm['by_kind'][k]:.3f}" for k in KINDS)
        spent = list(arm["compute"]["per_seed"].values())
        mean = {key: statistics.fmean(s[key] for s in spent) for key in ("steps", "tokens", "train_seconds")}
        print(
            f"| {name} | {arm['exact_match']:.3f} | {kinds} | {interval_text(gap)} | {reading['exact_match']:.3f} "
            f"[{reading['exact_match_95'][0]:.3f}, {reading['exact_match_95'][1]:.3f}] "
            f"| {interval_text(reading['versus_guess'])} | {interval_text(reading['versus_runner_up'])} "
            f"| {arm['seen_exact_match']:.3f} | {mean['steps']:,.0f} "
            f"| {mean['tokens']:,.0f} | {mean['train_seconds']:,.0f} |"
        )
    for name, row in summary["baselines"].items():
        kinds = " | ".join(f"{row['by_kind'][k]:.3f}" for k in KINDS)
        print(f"| {name} | {row['exact_match']:.3f} | {kinds} | | | | | | | | |")
    reading = baseline["reading"]
    print(f"constant: {baseline['constant']['answer']!r}; per kind: {baseline['per_kind']['answers']} (from "
          f"{baseline.get('reference', 'the seen questions')}); reading: "
          f"{len(reading['questions'])} questions, guess {statistics.fmean(reading['guess']):.3f}, runner-up "
          f"{reading['runner_up']['answers']} "
          f"{statistics.fmean(reading['runner_up']['per_question']):.3f}")  # fmt: skip
    print("probes (the scored people's own biography sentences, before fine-tuning): " + ", ".join(
        f"{name} {score:.3f}" for name, score in summary["probes"].items()))  # fmt: skip
    for name, comparison in summary["best_versus"].items():
        print(f"{name}: {interval_text(comparison)}")


def interval_text(comparison: dict) -> str:
    low, high = comparison["difference_95"]
    verdict, p_value = comparison["verdict"], comparison["p_value"]
    seeds = comparison.get("seed_p_values")
    each = f" (seeds {', '.join(f'{p:.2g}' for p in seeds)})" if seeds else ""
    return f"{comparison['difference']:+.3f} [{low:+.3f}, {high:+.3f}] p={p_value:.2g}{each} ({verdict})"


def measure(sizes: dict, world_seed: int, seeds: list[int], threads: int, work: Path, arms: list[str] | None) -> dict:
    world = write_files(sizes, world_seed, work)
    print(f"{world['people']} people, {world['biography_characters']:,} characters of biographies", file=sys.stderr)
    results = train_all(seeded_jobs(sizes, work, seeds, threads, arms), sizes["parallel"])
    baseline = baselines(work, sizes.get("split", "test"))
    summary = summarise(results, baseline, seeds)
    print_table(summary, baseline)
    return {"world": world, "runs": results, "baselines": baseline, "summary": summary}


def summarise_again(parser: argparse.ArgumentParser, stored: Path, output: Path | None) -> int:
    """A stored record with its summary recomputed from its runs' per-question answers and its baselines (today's
    statistics over the same answers), written to `output` (the record itself when `output` is None): the
    measurement's machine and date kept, the recomputation's command and date added as `summarised`."""
    output = output or stored
    try:
        record = json.loads(stored.read_text(encoding="utf-8"))
        with tempfile.TemporaryDirectory(prefix="kqv-pretrain-qa-") as scratch:  # the world again, from its seed
            write_files(record["sizes"], record["world_seed"], Path(scratch))
            baseline = baselines(Path(scratch), record["sizes"].get("split", "test"))
        if baseline["kinds"] != record["baselines"]["kinds"]:
            parser.error(f"{stored}: its world's questions are not the ones this script writes for its seed")
        summary = summarise(record["runs"], baseline, record["seeds"])
    except (OSError, ValueError, KeyError) as error:
        parser.error(f"{stored} is not a pretrain_qa record with per-question answers ({error})")
    print_table(summary, baseline)
    summarised = {"command": command(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    harness.write_json(output, record | {"baselines": baseline, "summary": summary, "summarised": summarised})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = harness.arguments(
        __doc__.splitlines()[0], output=None, output_help="JSON path (default benchmarks/results/...)"
    )
    parser.add_argument("--size", choices=list(SIZES), default="default", help="default (2 CPU cores), gpu, quick")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="the training seeds (default 0 1)")
    parser.add_argument("--world-seed", type=int, default=0, help="the seed of the invented world (default 0)")
    parser.add_argument("--people", type=int, help="how many people the world has (default: the size's)")
    parser.add_argument(
        "--world",
        choices=["varied", "encyclopedia"],
        help="the arms of this text (encyclopedia: the name once, then pronouns, each fact once; varied: the other "
        "arms): without --arm, every one of them",
    )
    parser.add_argument(
        "--split",
        choices=list(SPLITS),
        default="test",
        help="test (default): train on the seen people's questions, score the held-out people's, once, with the "
        "recipe chosen; dev: train on the seen people but a fifth of them, score those, to choose recipes on",
    )
    parser.add_argument("--pretrain-steps", type=int, help="the pretrainings' updates (default: the size's)")
    parser.add_argument("--finetune-steps", type=int, help="the fine-tunes' updates (default: the size's)")
    parser.add_argument("--arm", action="append", choices=list(ARMS), help="run this recipe (repeat; default all)")
    parser.add_argument(
        "--span-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of every span-corruption run (pretraining and mixed), e.g. data.random_prefix=true (repeat)",
    )
    parser.add_argument(
        "--summarise",
        type=Path,
        metavar="RECORD",
        help="recompute a record's summary from its answers, into --output (default: the record itself)",
    )
    parser.add_argument("--job", help=argparse.SUPPRESS)  # internal: one run, in a fresh process
    args = parser.parse_args(argv)
    if args.job:
        print(json.dumps(train_one(json.loads(args.job))))
        return 0
    if args.summarise:
        return summarise_again(parser, args.summarise, args.output)
    sizes = SIZES[args.size] | ({"pretrain_steps": args.pretrain_steps} if args.pretrain_steps else {})
    sizes |= {"finetune_steps": args.finetune_steps} if args.finetune_steps else {}
    sizes |= {"span_options": args.span_set} if args.span_set else {}
    sizes |= {"people": args.people} if args.people else {}
    sizes |= {"split": args.split} if args.split != "test" else {}
    if sizes["pretrain_steps"] < 1 or sizes["finetune_steps"] < 1:
        parser.error("--pretrain-steps and --finetune-steps must be at least 1")
    if sizes["people"] < 20:
        parser.error("--people must be at least 20 (the development people are a fifth of the seen half)")
    arms = args.arm
    if args.world:
        on_world = [arm for arm in ARMS if (arm in ENCYCLOPEDIA_ARMS) == (args.world == "encyclopedia")]
        if arms and set(arms) - set(on_world):
            parser.error(f"--world {args.world} runs only these arms: {on_world}")
        arms = arms or on_world
    seeds = list(dict.fromkeys(args.seeds))
    if len(seeds) < 2:
        parser.error("--seeds needs at least two different seeds: a verdict is paired over questions and seeds")
    threads = max(1, (os.cpu_count() or 2) // sizes["parallel"])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kqv-pretrain-qa-") as scratch:
        record = measure(sizes, args.world_seed, seeds, threads, Path(scratch), arms)
    record = {"benchmark": "pretrain_qa", "size": args.size, "sizes": sizes, "seeds": seeds,
              "world_seed": args.world_seed, "split": args.split, "threads_per_run": threads,
              "arms": arms or list(ARMS), **record}  # fmt: skip
    suffix = "" if args.size == "default" else f"-{args.size}"
    suffix += "-encyclopedia" if args.world == "encyclopedia" else ""
    suffix += "-dev" if args.split == "dev" else ""
    output = args.output or harness.results_path(f"pretrain_qa{suffix}")
    harness.write_record(output, record, started=started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
