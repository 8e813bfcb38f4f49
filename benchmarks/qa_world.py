"""A synthetic world for a question-answering fine-tune whose answers a model can only know from its pretraining.

`make_world(n_people, seed)` invents people, each with a unique first and last name (built from syllables, so no
real name or pretrained knowledge helps), a birthplace and a profession drawn from invented towns and real trades,
all fixed by the seed. From it:

- `biographies`: the pretraining text, every fact in several wordings (`BIRTH_WORDINGS`, `JOB_WORDINGS`), one fact
  per line, the lines shuffled, the whole written `copies` times in different orders. Paraphrases matter: Allen-Zhu
  and Li ("Physics of Language Models, part 3.1", 2023) find that knowledge stated in one wording is stored in a way
  a fine-tune cannot extract for other people, and that varied wordings make it extractable;
- `questions`: question -> answer pairs ("Q: Where was Zorbo Quill born? A:" -> " Lemvik"), one line each, so a
  character tokenizer's end of text (the newline) closes every answer;
- `probes`: each fact in its first pretraining wording, cut before the answer ("Zorbo Quill was born in" ->
  " Lemvik"): what the pretrained model completes if it holds the fact.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from pathlib import Path

from kqv_lab import benchmarking as harness
from kqv_lab.worlds import unique_words  # invented words from syllables, as the larger world's names

PROFESSIONS = ["baker", "weaver", "sailor", "miller", "potter", "tanner", "mason", "cooper", "smith", "fisher"]
N_TOWNS = 12

BIRTH_WORDINGS = [  # the first is the probe's
    "{name} was born in {town}",
    "The birthplace of {name} is {town}",
    "{name} came into the world in {town}",
    "{name} is a native of {town}",
]
JOB_WORDINGS = [
    "{name} works as a {job}",
    "By trade {name} is a {job}",
    "{name} earns a living as a {job}",
    "The trade of {name} is that of a {job}",
]
BIRTH_QUESTION = "Q: Where was {name} born? A:"
JOB_QUESTION = "Q: What is the trade of {name}? A:"


@dataclass(frozen=True)
class Person:
    name: str
    town: str
    job: str


def make_world(n_people: int, seed: int) -> list[Person]:
    """`n_people` people with unique first and last names, each born in one of `N_TOWNS` invented towns and
    working at one of `PROFESSIONS`; the same world for the same seed on every machine."""
    rng = random.Random(seed)
    taken: set[str] = set()
    towns = unique_words(rng, N_TOWNS, 2, taken)
    firsts = unique_words(rng, n_people, 2, taken)
    lasts = unique_words(rng, n_people, 2, taken)
    return [Person(f"{first} {last}", rng.choice(towns), rng.choice(PROFESSIONS)) for first, last in zip(firsts, lasts)]


def facts(person: Person) -> list[str]:
    """Every statement of `person`'s two facts, in every wording."""
    birth = [w.format(name=person.name, town=person.town) for w in BIRTH_WORDINGS]
    return birth + [w.format(name=person.name, job=person.job) for w in JOB_WORDINGS]


def biographies(people: list[Person], copies: int, seed: int) -> str:
    """The pretraining text: all facts of all people, one per line, shuffled anew for each of `copies` copies (so a
    validation split of lines still leaves every statement in the training text)."""
    rng = random.Random(seed)
    lines = [line for person in people for line in facts(person)]
    text = []
    for _ in range(copies):
        rng.shuffle(lines)
        text.extend(lines)
    return "\n".join(text) + "\n"


def questions(people: list[Person]) -> list[tuple[str, str]]:
    """(prompt, completion) pairs asking each person's two facts."""
    pairs = []
    for person in people:
        pairs.append((BIRTH_QUESTION.format(name=person.name), f" {person.town}"))
        pairs.append((JOB_QUESTION.format(name=person.name), f" {person.job}"))
    return pairs


def probes(people: list[Person]) -> list[tuple[str, str]]:
    """(prompt, completion) pairs: each fact in its first pretraining wording, cut before the answer."""
    pairs = []
    for person in people:
        pairs.append((BIRTH_WORDINGS[0].format(name=person.name, town="").rstrip(), f" {person.town}"))
        pairs.append((JOB_WORDINGS[0].format(name=person.name, job="").rstrip(), f" {person.job}"))
    return pairs


def halves(people: list[Person]) -> tuple[list[Person], list[Person]]:
    """The people whose questions the fine-tune sees (the first half) and those it is scored on (the rest)."""
    middle = len(people) // 2
    return people[:middle], people[middle:]


def write_pairs(path, pairs: list[tuple[str, str]]) -> None:
    """A TSV file of prompt<TAB>completion lines."""
    path.write_text("".join(f"{prompt}\t{completion}\n" for prompt, completion in pairs), encoding="utf-8")


def main() -> int:
    """Write one world's files, to look at or to fine-tune on by hand: the pretraining text, the question pairs of
    the fine-tune's half and of the scored half, and the probes."""
    parser = harness.arguments("write a synthetic question-answering world's files", output_flag=None, seed=True)
    parser.add_argument("--people", type=int, default=40, help="how many people (default 40)")
    parser.add_argument("--copies", type=int, default=2, help="times the biographies are written (default 2)")
    parser.add_argument("--out", type=Path, required=True, help="a directory to write into")
    args = parser.parse_args()
    people = make_world(args.people, args.seed)
    seen, held_out = halves(people)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "biographies.txt").write_text(biographies(people, args.copies, args.seed), encoding="utf-8")
    write_pairs(args.out / "questions-seen.tsv", questions(seen))
    write_pairs(args.out / "questions-held-out.tsv", questions(held_out))
    write_pairs(args.out / "probes-held-out.tsv", probes(held_out))
    print(f"wrote {args.out}: biographies.txt, questions-seen.tsv, questions-held-out.tsv, probes-held-out.tsv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
