"""Does pretraining help a question-answering fine-tune whose answers only the pretraining text holds? And LoRA
against full fine-tuning on the same task.

The world (`benchmarks/qa_world.py`, fixed by --world-seed): invented people with a birthplace and a trade. A small
character-level GPT is pretrained once on their biographies (every fact in four wordings, one per line) after an
excerpt of Shakespeare (general English, and the characters the questions use: a character tokenizer learns its
alphabet from the pretraining text). Then, for each seed, these arms fine-tune on the question -> answer pairs of
the first half of the people (`kqv train lm --data qa.tsv`: loss on the answers alone, a newline ending each) and are
scored by exact match of greedy answers (`run.evaluate(pairs=...)`) on the questions about the OTHER half, whose
answers they can only know from pretraining:

    pretrained, full     --init the pretrained run, every weight trains
    random init, full    the same model, batch, schedule and pairs from random weights
    pretrained, LoRA     --init the pretrained run, LoRA adapters (finetune.lora_rank) alone train

Each arm runs in a fresh process, so its peak resident memory (`peak_rss_mb`) is its own. Beside them, the probe:
the pretrained model completes each fact of the held-out people in its first pretraining wording ("Zorbo Quill was
born in" -> " Lemvik"): when pretraining does not help, it says whether the knowledge was missing or did not
transfer to the question format.

And the baselines that never read the question (`baselines`, from the world's files alone): the constant answer of
`kqv eval` (the most frequent answer of the pairs the fine-tunes trained on), the constant per question kind (the
most frequent town for a birthplace question, trade for a trade question: the stronger one, which each arm is
compared with) and the uniform guesses among those answers. The unit of every interval is the question: with
several seeds, each question's mean over the seeds (`kqv.train.mean_over_seeds`), never the seeds'
answers pooled as more questions; differences are paired over questions
(`kqv.train.difference_over_questions`: Student's t over the per-question differences, and the exact
sign test, McNemar's for one seed).

    python benchmarks/finetune_qa.py            # the measured sizes
    python benchmarks/finetune_qa.py --quick    # tiny sizes, seconds: checks the script, measures nothing
    python benchmarks/finetune_qa.py --add-baselines benchmarks/results/finetune_qa.json   # no training

Writes benchmarks/results/finetune_qa.json (or --output) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

import qa_world
from kqv_lab import benchmarking as harness

OUTPUT = harness.results_path("finetune_qa")

FULL = {
    "people": 40,
    "copies": 2,
    "general_chars": 5_000,
    "model": {"d_model": 96, "n_heads": 4, "n_layers": 3, "d_ff": 384},
    "context": 64,
    "batch_size": 16,
    "pretrain_steps": 600,
    "pretrain_lr": 2e-3,
    "finetune_steps": 100,
    "finetune_lr": 1e-3,
    "lora_rank": 8,
}
QUICK = {
    "people": 40,
    "copies": 1,
    "general_chars": 3_000,
    "model": {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64},
    "context": 64,
    "batch_size": 8,
    "pretrain_steps": 4,
    "pretrain_lr": 2e-3,
    "finetune_steps": 3,
    "finetune_lr": 1e-3,
    "lora_rank": 2,
}
VAL_FRACTION = 0.1  # of a fine-tune's pairs held out as its validation split (the same ones for every seed)
KINDS = {"birthplace": qa_world.BIRTH_QUESTION.split("{")[0], "trade": qa_world.JOB_QUESTION.split("{")[0]}
ARMS = {  # name: (starts from the pretrained run, extra settings)
    "pretrained, full": (True, []),
    "random init, full": (False, []),
    "pretrained, LoRA": (True, ["finetune.lora_rank={lora_rank}"]),
}


# ---------------------------------------------------------------------------------------------------------------
# The files: pretraining text, question pairs, probes


def general_text(corpus: str, length: int, needed: str) -> str:
    """The first `length` characters of `corpus`, or more, up to where it holds every character of `needed`
    (the question's, so that the pretrained character tokenizer can encode every question)."""
    missing = set(needed) - {"{", "}"} - set(corpus[:length])
    end = max([length] + [corpus.index(char) + 1 for char in missing])
    return corpus[:end]


def write_files(sizes: dict, world_seed: int, work: Path) -> dict:
    """Write the pretraining text and the pair files into `work`; what they hold, for the JSON."""
    from kqv.data import load_text

    people = qa_world.make_world(sizes["people"], world_seed)
    seen, held_out = qa_world.halves(people)
    general = general_text(load_text(None), sizes["general_chars"], qa_world.BIRTH_QUESTION + qa_world.JOB_QUESTION)
    text = general + "\n" + qa_world.biographies(people, sizes["copies"], world_seed)
    (work / "pretrain.txt").write_text(text, encoding="utf-8")
    files = {
        "qa_train.tsv": qa_world.questions(seen),
        "qa_test.tsv": qa_world.questions(held_out),
        "probe_train.tsv": qa_world.probes(seen),
        "probe_test.tsv": qa_world.probes(held_out),
    }
    for name, pairs in files.items():
        qa_world.write_pairs(work / name, pairs)
    unseen = sorted(set((work / "qa_test.tsv").read_text()) - set((work / "qa_train.tsv").read_text()))
    if unseen:  # the random-init arm's character tokenizer is built from qa_train.tsv
        raise SystemExit(f"held-out questions use characters no training question has: {unseen}; change --world-seed")
    return {
        "people": len(people),
        "seen_people": len(seen),
        "held_out_people": len(held_out),
        "pretrain_characters": len(text),
        "general_characters": len(general),
        "example_fact_lines": qa_world.facts(people[-1]),
        "example_question": files["qa_test.tsv"][0],
        "example_probe": files["probe_test.tsv"][0],
    }


# ---------------------------------------------------------------------------------------------------------------
# One training, in its own process


def settings(sizes: dict, steps: int, lr: float, seed: int, data: Path) -> list[str]:
    return [
        f"data.path={json.dumps(str(data))}",
        *run_settings(sizes, steps, lr, seed, VAL_FRACTION),
        'sample.prompt="\\n"',
    ]


def run_settings(sizes: dict, steps: int, lr: float, seed: int, val_fraction: float) -> list[str]:
    """The `--set` options of one benchmark run of `steps` updates at learning rate `lr`: the model and batch of
    `sizes`, a warm-up of a tenth of the updates, no time budget, one evaluation and checkpoint at the end, a
    sample of 16 tokens."""
    sets = [f"model.{name}={value}" for name, value in sizes["model"].items()]
    return sets + [
        f"data.context={sizes['context']}",
        f"data.val_fraction={val_fraction}",
        f"train.batch_size={sizes['batch_size']}",
        f"train.steps={steps}",
        f"train.lr={lr}",
        f"train.warmup_steps={max(1, steps // 10)}",
        "train.budget_minutes=0",
        f"train.seed={seed}",
        f"train.eval_every={steps}",
        "train.eval_batches=2",
        f"train.checkpoint_every={steps}",
        f"train.log_every={max(1, steps // 10)}",
        "sample.count=1",
        "sample.max_new_tokens=16",
    ]


def exact_match(run, pairs: Path) -> dict:
    """`run.evaluate(pairs=...)`'s figures (`PairsEvaluation.to_dict`: exact match with its 95% Wilson interval,
    completion loss, `kqv eval`'s baselines), with each question's score (1/0, in the file's order) and the
    constant answer's."""
    result = run.evaluate(pairs=pairs)
    per_question = [int(prediction.correct) for prediction in result.predictions]
    return result.to_dict() | {"per_question": per_question, "constant_per_question": result.constant_scores}


def tokens_per_s(run_dir: Path) -> float | None:
    """The median of the trainer's logged tokens/s (metrics.jsonl), the first interval left out (warm-up)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    speeds = [json.loads(line)["tokens_per_s"] for line in lines if '"tokens_per_s"' in line]
    return statistics.median(speeds[1:] or speeds) if speeds else None


def train_one(job: dict) -> dict:
    """Train one run (the pretraining or an arm) as `job` says, score it, and return its figures."""
    import kqv

    work, sizes, out = Path(job["work"]), job["sizes"], Path(job["out"])
    init = work / "pretrain" if job["init"] else None
    sets = settings(sizes, job["steps"], job["lr"], job["seed"], work / job["data"])
    sets += [extra.format(**sizes) for extra in job["extra"]]
    summary = kqv.train("lm", "quick", out=out, overrides=sets, init=init, quiet=True, overwrite=True)
    result = {
        "steps": summary["steps"],
        "train_seconds": summary["train_seconds"],
        "peak_rss_mb": summary["peak_rss_mb"],  # this process's peak: training, and the job's own evaluation
        "tokens_per_s": tokens_per_s(out),
        "parameters": summary["parameters"],
        "trainable_parameters": summary.get("finetune", {}).get("trainable_parameters", summary["parameters"]),
        "total_parameters": summary.get("finetune", {}).get("total_parameters", summary["parameters"]),
        "final_train_loss": summary["final_train_loss"],
    }
    run = kqv.load(out, device="cpu")
    for name in job["score"]:
        result[name.removesuffix(".tsv")] = exact_match(run, work / name)
    return result


def in_subprocess(job: dict) -> dict:
    """`train_one(job)` in a fresh Python process (its own peak memory), its JSON read back."""
    answer = subprocess.run(
        [sys.executable, __file__, "--job", json.dumps(job)], capture_output=True, text=True, env=os.environ
    )
    if answer.returncode != 0:
        raise SystemExit(f"the run {job['out']} failed:\n{answer.stderr[-3000:]}")
    return json.loads(answer.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------------
# Baselines, from the world's files alone


def kind(prompt: str) -> str:
    """The kind of a question: "birthplace" or "trade"."""
    return next(name for name, start in KINDS.items() if prompt.startswith(start))


def baselines(work: Path) -> dict:
    """The scores on the held-out questions (qa_test.tsv) of answers that never read the question, each from the
    pairs of qa_train.tsv the fine-tunes train on (its validation split of `VAL_FRACTION` left out, as the runs
    do): `constant` answers every question with the most frequent answer (what `kqv eval` prints), `per_kind`
    with the most frequent of the question's kind; `uniform` and `uniform_per_kind` are the expected exact match
    of a guess drawn uniformly from those distinct answers (an answer not among them scores 0)."""
    from kqv.data import read_examples, split_examples
    from kqv.jobs import constant_answer, normalise

    train = read_examples(work / "qa_train.tsv")
    chosen, _ = split_examples(len(train), VAL_FRACTION)
    trained = [train[k] for k in chosen]
    test = read_examples(work / "qa_test.tsv")
    expected = [normalise(example.completion) for example in test]
    kinds = [kind(example.prompt) for example in test]
    by_kind = {name: [e.completion for e in trained if kind(e.prompt) == name] for name in KINDS}
    constant = constant_answer([example.completion for example in trained])  # what `kqv eval` answers
    per_kind = {name: constant_answer(answers) for name, answers in by_kind.items()}
    distinct = {normalise(e.completion) for e in trained}
    distinct_by_kind = {name: {normalise(a) for a in answers} for name, answers in by_kind.items()}
    uniform = [(answer in distinct) / len(distinct) for answer in expected]
    uniform_per_kind = [(a in distinct_by_kind[k]) / len(distinct_by_kind[k]) for a, k in zip(expected, kinds)]
    constant_scores = [int(answer == constant) for answer in expected]
    per_kind_scores = [int(answer == per_kind[k]) for answer, k in zip(expected, kinds)]
    return {
        "trained_pairs": len(trained),
        "questions": len(test),
        "constant": {"answer": constant, **scored(constant_scores)},
        "per_kind": {"answers": per_kind, **scored(per_kind_scores)},
        "uniform": {"distinct_answers": len(distinct), "exact_match": statistics.fmean(uniform)},
        "uniform_per_kind": {
            "distinct_answers": {name: len(answers) for name, answers in distinct_by_kind.items()},
            "exact_match": statistics.fmean(uniform_per_kind),
        },
    }


def scored(per_question: list[int]) -> dict:
    """A baseline's exact match on the held-out questions, with its 95% Wilson interval (one answer per question,
    no seeds) and each question's score."""
    from kqv.train import wilson_interval

    correct, n = sum(per_question), len(per_question)
    return {
        "correct": correct,
        "n": n,
        "exact_match": correct / n,
        "exact_match_95": list(wilson_interval(correct, n)),
        "per_question": per_question,
    }


# ---------------------------------------------------------------------------------------------------------------
# Figures over seeds: the question is the unit


def over_seeds(results: list[dict], key: str) -> dict:
    """Exact match on the questions of `key` over the seeds' runs: each question's mean over the seeds
    (`per_question`: the scores a paired analysis takes, one per question), their mean, and each seed's."""
    from kqv.train import mean_over_seeds

    per_question = mean_over_seeds([r[key]["per_question"] for r in results])
    return {
        "exact_match": statistics.fmean(per_question),
        "questions": len(per_question),
        "seeds": len(results),
        "per_seed": [r[key]["exact_match"] for r in results],
        "per_question": per_question,
    }


def versus(a: list[float], b: list[float]) -> dict:
    """a - b paired over questions (`difference_over_questions`), with its verdict."""
    from kqv.train import difference_over_questions

    figures = difference_over_questions(a, b).to_dict()
    return figures | {"verdict": verdict(figures["difference_95"])}


def verdict(interval: list[float]) -> str:
    return "inconclusive" if interval[0] <= 0 <= interval[1] else ("higher" if interval[0] > 0 else "lower")


def summarise(arms: dict[str, list[dict]], baseline: dict) -> dict:
    table = {}
    for name, results in arms.items():
        held_out = over_seeds(results, "qa_test")
        table[name] = {
            "held_out_questions": held_out,
            "versus_constant_per_kind": versus(held_out["per_question"], baseline["per_kind"]["per_question"]),
            "seen_questions": over_seeds(results, "qa_train"),
            "trainable_parameters": results[0]["trainable_parameters"],
            **({"total_parameters": results[0]["total_parameters"]} if "total_parameters" in results[0] else {}),
            "parameters": results[0]["parameters"],
            "peak_rss_mb": statistics.fmean(r["peak_rss_mb"] for r in results),
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in results if r["tokens_per_s"]),
            "train_seconds": statistics.fmean(r["train_seconds"] for r in results),
        }
    comparisons = {}
    for a, b in (("pretrained, full", "random init, full"), ("pretrained, LoRA", "pretrained, full")):
        if a in table and b in table:
            first, second = table[a]["held_out_questions"], table[b]["held_out_questions"]
            comparisons[f"{a} - {b}"] = versus(first["per_question"], second["per_question"])
    return {"arms": table, "comparisons": comparisons}


def check_constant(arms: dict[str, list[dict]], baseline: dict) -> None:
    """Each run's `kqv eval` constant (from the pairs it trained on) must be the one `baselines` found."""
    for name, results in arms.items():
        for result in results:
            if result["qa_test"]["constant"] != baseline["constant"]["answer"]:
                raise SystemExit(
                    f"{name}, seed {result['seed']}: kqv eval's constant {result['qa_test']['constant']!r} is not "
                    f"the benchmark's {baseline['constant']['answer']!r}"
                )


def print_table(record: dict) -> None:
    probe, baseline = record["probe"]["held_out"], record["baselines"]
    print(
        f"probe (pretrained model, pretraining wording, held-out people): {probe['exact_match']:.3f} "
        f"[{probe['exact_match_95'][0]:.3f}, {probe['exact_match_95'][1]:.3f}] of {probe['n']}"
    )
    print(
        f"constant {baseline['constant']['answer']!r}: {baseline['constant']['exact_match']:.3f}; per kind "
        f"{baseline['per_kind']['answers']}: {baseline['per_kind']['exact_match']:.3f}; uniform "
        f"{baseline['uniform']['exact_match']:.3f}, per kind {baseline['uniform_per_kind']['exact_match']:.3f}"
    )
    print("| arm | held-out EM (mean over seeds) | - constant per kind [95% over questions] | seen EM | trainable |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, arm in record["summary"]["arms"].items():
        held, seen, gap = arm["held_out_questions"], arm["seen_questions"], arm["versus_constant_per_kind"]
        low, high = gap["difference_95"]
        print(
            f"| {name} | {held['exact_match']:.3f} | {gap['difference']:+.3f} [{low:+.3f}, {high:+.3f}] "
            f"| {seen['exact_match']:.3f} | {arm['trainable_parameters']:,} |"
        )
    for name, comparison in record["summary"]["comparisons"].items():
        low, high = comparison["difference_95"]
        print(f"{name}: {comparison['difference']:+.3f} [{low:+.3f}, {high:+.3f}] ({comparison['verdict']})")


def measure(sizes: dict, seeds: list[int], world_seed: int, work: Path, in_process: bool = False) -> dict:
    world = write_files(sizes, world_seed, work)
    run_job = train_one if in_process else in_subprocess
    common = {"work": str(work), "sizes": sizes}
    print(f"pretraining on {world['pretrain_characters']:,} characters", file=sys.stderr, flush=True)
    pretrain = run_job(
        common
        | {
            "out": str(work / "pretrain"),
            "init": False,
            "data": "pretrain.txt",
            "steps": sizes["pretrain_steps"],
            "lr": sizes["pretrain_lr"],
            "seed": 0,
            "extra": [],
            "score": ["probe_train.tsv", "probe_test.tsv"],
        }
    )
    arms: dict[str, list[dict]] = {name: [] for name in ARMS}
    for seed in seeds:
        for name, (init, extra) in ARMS.items():
            print(f"seed {seed}: {name}", file=sys.stderr, flush=True)
            job = common | {
                "out": str(work / f"{name.replace(', ', '-').replace(' ', '_')}-{seed}"),
                "init": init,
                "data": "qa_train.tsv",
                "steps": sizes["finetune_steps"],
                "lr": sizes["finetune_lr"],
                "seed": seed,
                "extra": extra,
                "score": ["qa_train.tsv", "qa_test.tsv"],
            }
            arms[name].append({"seed": seed, **run_job(job)})
            (work.parent / f"{work.name}.partial.json").write_text(json.dumps({"pretrain": pretrain, "runs": arms}))
    baseline = baselines(work)
    check_constant(arms, baseline)
    return {
        "world": world,
        "pretrain": {k: v for k, v in pretrain.items() if not k.startswith("probe")},
        "probe": {"seen": pretrain["probe_train"], "held_out": pretrain["probe_test"]},
        "baselines": baseline,
        "runs": arms,
        "summary": summarise(arms, baseline),
    }


def add_baselines(path: Path) -> None:
    """Add `baselines` to a record written before they were recorded: the world again from its sizes and seed (the
    files are deterministic), no training; the rest of the record is kept as it is."""
    record = json.loads(path.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="kqv-finetune-qa-") as scratch:
        world = write_files(record["sizes"], record["world_seed"], Path(scratch))
        if json.loads(json.dumps(world)) != record["world"]:
            raise SystemExit(f"the world of {path} is not the one its sizes and seed make now; rerun the benchmark")
        record["baselines"] = baselines(Path(scratch))
    harness.write_record(path, record)
    print(f"added the baselines to {path}")


def main(argv: list[str] | None = None) -> int:
    parser = harness.arguments(
        __doc__.splitlines()[0],
        quick="tiny sizes that only check the script (seconds)",
        output=None,
        output_help=f"JSON path (default {OUTPUT.relative_to(harness.ROOT)})",
    )
    parser.add_argument(
        "--seeds", type=harness.seed_list, default=[1, 2, 3], help="seeds of the fine-tunes (default 1,2,3)"
    )
    parser.add_argument("--world-seed", type=int, default=0, help="the seed of the invented world (default 0)")
    parser.add_argument(
        "--in-process", action="store_true", help="train every run in this process (faster; peak memory is shared)"
    )
    parser.add_argument(
        "--add-baselines", type=Path, metavar="JSON", help="add the baselines to a record of this script (no training)"
    )
    parser.add_argument("--job", help=argparse.SUPPRESS)  # internal: one training, in a fresh process
    args = parser.parse_args(argv)
    if args.add_baselines:
        add_baselines(args.add_baselines)
        return 0
    if args.job:
        print(json.dumps(train_one(json.loads(args.job))))
        return 0
    sizes = QUICK if args.quick else FULL
    arms = partial(measure, sizes, args.seeds, args.world_seed, in_process=args.in_process)
    threads = int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count()
    fields = dict(sizes=sizes, seeds=args.seeds, world_seed=args.world_seed, in_process=args.in_process)
    harness.measured_in_scratch("finetune_qa", args, arms, print_table, **fields, torch_threads=threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
