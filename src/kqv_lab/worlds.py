"""An invented world of people whose facts a model can only know by reading their biographies.

`make_world(n_people, seed)` invents people, each with a unique first and last name built from syllables (so no real
name or pretrained knowledge helps), a birthplace among `N_TOWNS` invented towns, a birth year in 1900-1999 and a
trade among `TRADES`. Towns and trades are drawn with Zipf-like weights (a few common, most rare), as real places
and jobs are, so that answering the most frequent one is a baseline worth beating. All is fixed by the seed.

From it:
- `biography(person, rng)`: one paragraph per person, its sentences in a random order, each fact in one of several
  wordings, the person named in full or by pronoun. `biographies(people, seed)` is the pretraining text: one
  paragraph per line. `biographies(people, seed, style="encyclopedia")` writes as an encyclopedia does
  (`encyclopedia_entry`): one paragraph per person, the full name once, in the first sentence, then only pronouns,
  each fact stated once. Varied wording and order is what Allen-Zhu and Li ("Physics of Language Models, part 3.1",
  2023) find makes stored knowledge extractable by a fine-tune;
- `questions(people)`: "Where was NAME born?" -> " TOWN", "In which year was NAME born?" -> " 1957",
  "What does NAME do for a living?" -> " potter": one of each kind per person;
- `probes(people)`: each fact as a pretraining sentence cut before the answer ("NAME comes from" -> " TOWN"): what
  the pretrained model completes if it holds the fact, before any fine-tune.
- `split(people)`: the people whose questions a fine-tune (or a mixed pretraining) sees, and the held-out rest,
  whose questions are scored. Every person's biography is in the pretraining text.

`write_world(out, ...)` writes one world's files (`kqv world --out DIR`), to read or to train on by hand; the
benchmarks `pretrain_qa` and `example_throughput` train on them.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kqv.data import split_examples
from kqv.errors import FULL_NAMES, OUT, OVERWRITE, PEOPLE, STYLE_ENCYCLOPEDIA, VERSIONS, ConfigError, DataError, option

ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kl", "tr", "st"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou"]
CODAS = ["", "", "n", "r", "l", "s", "k", "m"]
TRADES = [
    "baker", "weaver", "sailor", "miller", "potter", "tanner", "mason", "cooper", "smith", "fisher",
    "carpenter", "glazier", "saddler", "brewer", "butcher", "chandler", "cobbler", "dyer", "farrier", "fletcher",
    "joiner", "locksmith", "roofer", "tailor", "thatcher", "turner", "wheelwright", "clockmaker", "bookbinder",
    "printer", "gardener", "shepherd", "beekeeper", "surveyor", "midwife", "apothecary", "ferryman", "innkeeper",
    "jeweller", "hatter",
]  # fmt: skip
N_TOWNS = 120
YEARS = range(1900, 2000)
ZIPF = 0.6  # the k-th most common town or trade is drawn with weight 1 / k**ZIPF

SENTENCES = {  # fact: wordings, {name} the full name or a pronoun (capitalised at the start of a sentence), {obj_name}
    # the full name or the pronoun as an object (him, her)
    "town": [
        "{name} was born in {town}.",
        "{name} comes from {town}.",
        "{town} is the birthplace of {obj_name}.",
        "{name} grew up in {town}, the town of {pos} birth.",
    ],
    "year": [
        "{name} was born in {year}.",
        "{pos_name} year of birth is {year}.",
        "In {year}, {name} was born.",
        "{name} came into the world in {year}.",
    ],
    "trade": [
        "{name} works as {a_trade}.",
        "{name} is {a_trade} by trade.",
        "For a living, {name} is {a_trade}.",
        "{pos_name} trade is that of {a_trade}.",
    ],
}
QUESTIONS = {
    "town": "Where was {name} born?",
    "year": "In which year was {name} born?",
    "trade": "What does {name} do for a living?",
}
PROBES = {"town": "{name} comes from", "year": "{name}'s year of birth is", "trade": "{name} works as"}
# An encyclopedia's wordings: {subject} the full name (first sentence) or the pronoun, {obj} and {pos} its object
# and possessive forms, and the verbs agreeing with the subject ("he was", "they were")
ENCYCLOPEDIA = {
    "town": ["{subject} {was} born in {town}.", "{subject} {comes} from {town}.", "{town} is the birthplace of {obj}."],
    "year": ["{subject} {was} born in {year}.", "{pos} year of birth is {year}.", "In {year}, {subject} {was} born."],
    "trade": [
        "{subject} {works} as {a_trade}.",
        "{subject} {is_} {a_trade} by trade.",
        "{pos} trade is that of {a_trade}.",
    ],
}
PRONOUNS = {  # subject: (object, possessive, was, comes, works, is)
    "he": ("him", "his", "was", "comes", "works", "is"),
    "she": ("her", "her", "was", "comes", "works", "is"),
    "they": ("them", "their", "were", "come", "work", "are"),
}
STYLES = ("varied", "encyclopedia")


@dataclass(frozen=True)
class Person:
    """One invented person: the full name, the pronoun the biographies use, and the three facts questions ask."""

    name: str
    pronoun: str  # "he" or "she"
    town: str
    year: int
    trade: str

    def answer(self, fact: str) -> str:
        """The answer to the question of `fact` ("town", "year" or "trade")."""
        return str(getattr(self, fact))


def word(rng: random.Random, syllables: int, onset: str) -> str:
    """An invented word of `syllables` syllables, capitalised, starting with `onset`."""
    rest = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(syllables - 1))
    return (onset + rng.choice(VOWELS) + rng.choice(CODAS) + rest).title()


def unique_words(rng: random.Random, count: int, syllables: int, taken: set[str]) -> list[str]:
    """`count` invented words of `syllables` syllables, none in `taken` (which grows). The k-th starts with the
    onset ONSETS[k % len(ONSETS)], so any run of len(ONSETS) consecutive words uses every capital letter: a
    character tokenizer built from either half of the people then knows the other half's letters."""
    found: list[str] = []
    while len(found) < count:
        candidate = word(rng, syllables, ONSETS[len(found) % len(ONSETS)])
        if candidate not in taken:
            taken.add(candidate)
            found.append(candidate)
    return found


def zipf_weights(count: int) -> list[float]:
    return [1 / (rank + 1) ** ZIPF for rank in range(count)]


def make_world(n_people: int, seed: int) -> list[Person]:
    """`n_people` people with unique names and drawn facts; the same world for the same seed on every machine."""
    rng = random.Random(seed)
    taken: set[str] = set()
    towns = unique_words(rng, N_TOWNS, 2, taken)
    firsts, lasts = unique_words(rng, n_people, 2, taken), unique_words(rng, n_people, 2, taken)
    trades = rng.sample(TRADES, len(TRADES))  # which trades are common is the seed's choice too
    people = []
    for first, last in zip(firsts, lasts[7:] + lasts[:7]):  # not both names from one onset
        town = rng.choices(towns, zipf_weights(len(towns)))[0]
        trade = rng.choices(trades, zipf_weights(len(trades)))[0]
        people.append(Person(f"{first} {last}", rng.choice(["he", "she"]), town, rng.choice(YEARS), trade))
    return people


def biography(person: Person, rng: random.Random, full_names: bool = False) -> str:
    """One paragraph: the three facts in a random order, each in a random wording; the first sentence names the
    person in full, each later one by name or pronoun, at random, or by name (`full_names`: Allen-Zhu and Li's
    "fullname" augmentation, every fact beside the name it belongs to)."""
    possessive = {"he": "his", "she": "her"}[person.pronoun]
    objective = {"he": "him", "she": "her"}[person.pronoun]
    sentences = []
    for k, fact in enumerate(rng.sample(list(SENTENCES), len(SENTENCES))):
        name = person.name if full_names or k == 0 or rng.random() < 0.5 else person.pronoun
        pos_name = person.name + "'s" if name == person.name else possessive
        obj_name = person.name if name == person.name else objective
        text = rng.choice(SENTENCES[fact]).format(
            name=name,
            obj_name=obj_name,
            pos=possessive,
            pos_name=pos_name,
            town=person.town,
            year=person.year,
            a_trade=a(person.trade),
        )
        sentences.append(text[0].upper() + text[1:])
    return " ".join(sentences)


def encyclopedia_entry(person: Person, rng: random.Random) -> str:
    """One paragraph as an encyclopedia writes it: the three facts in a random order, each stated once in one of
    `ENCYCLOPEDIA`'s wordings; the first sentence names the person in full (a wording with the name as its subject),
    every later one refers to them by pronoun only ("he", "she" or "they", as the person's `pronoun`, with its
    object and possessive forms and the verbs agreeing)."""
    obj, pos, was, comes, works, is_ = PRONOUNS[person.pronoun]
    sentences = []
    for k, fact in enumerate(rng.sample(list(ENCYCLOPEDIA), len(ENCYCLOPEDIA))):
        named = k == 0
        wordings = [w for w in ENCYCLOPEDIA[fact] if "{subject}" in w] if named else ENCYCLOPEDIA[fact]
        text = rng.choice(wordings).format(
            subject=person.name if named else person.pronoun,
            obj=obj,
            pos=pos,
            was="was" if named else was,
            comes="comes" if named else comes,
            works="works" if named else works,
            is_="is" if named else is_,
            town=person.town,
            year=person.year,
            a_trade=a(person.trade),
        )
        sentences.append(text[0].upper() + text[1:])
    return " ".join(sentences)


PREFACE = (  # the text's first line: a character tokenizer made from the text then knows the questions' characters
    "Who were these people? Where and when were they born, and what did they do for a living? Each line below "
    "tells of one of them."
)
# an encyclopedia's preface: the same, and the apostrophe a probe uses ("NAME's year of birth is"), which its entries,
# naming each person once, never write
ENCYCLOPEDIA_PREFACE = PREFACE + " Each person's entry names them once, then says he, she or they."


def biographies(
    people: list[Person], seed: int, versions: int = 1, full_names: bool = False, style: str = "varied"
) -> str:
    """The pretraining text: `PREFACE` (`ENCYCLOPEDIA_PREFACE` for an encyclopedia), then `versions` biographies per
    person (each drawn anew: knowledge augmentation, several wordings and orders of the same facts), one per line,
    all in a random order; each names its person in every sentence with `full_names`. `style="encyclopedia"`: one
    `encyclopedia_entry` per person (the name once, then pronouns, each fact once), so `versions` must be 1 and
    `full_names` off."""
    if style not in STYLES:
        raise ConfigError(f"style must be one of {', '.join(STYLES)}, got {style!r}")
    if style == "encyclopedia" and (versions != 1 or full_names):
        raise ConfigError("an encyclopedia states each fact once: one version, named in the first sentence only")
    rng = random.Random(seed)
    if style == "encyclopedia":
        lines = [encyclopedia_entry(person, rng) for person in people]
    else:
        lines = [biography(person, rng, full_names) for _ in range(versions) for person in people]
    rng.shuffle(lines)
    return "\n".join([ENCYCLOPEDIA_PREFACE if style == "encyclopedia" else PREFACE, *lines]) + "\n"


def questions(people: list[Person]) -> list[tuple[str, str]]:
    """(prompt, completion) pairs: each person's three facts asked, the answer after a space."""
    return [(QUESTIONS[fact].format(name=p.name), f" {p.answer(fact)}") for p in people for fact in QUESTIONS]


def probes(people: list[Person]) -> list[tuple[str, str]]:
    """(prompt, completion) pairs: each fact as a pretraining sentence cut before its answer (a trade with its
    article: " a potter")."""
    answer = {"town": lambda p: p.town, "year": lambda p: str(p.year), "trade": lambda p: a(p.trade)}
    return [(PROBES[fact].format(name=p.name), f" {answer[fact](p)}") for p in people for fact in PROBES]


def a(noun: str) -> str:
    """The noun with its indefinite article: "a potter", "an innkeeper"."""
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def kind(prompt: str) -> str:
    """The fact a question or probe asks: "town", "year" or "trade"."""
    for fact in QUESTIONS:
        for form in (QUESTIONS[fact], PROBES[fact]):
            before, after = form.split("{name}")
            if prompt.startswith(before) and prompt.endswith(after):
                return fact
    raise DataError(f"not a question or probe of this world: {prompt!r}")


def split(people: list[Person], seen: float = 0.5) -> tuple[list[Person], list[Person]]:
    """The people whose questions training sees (the first `seen` share) and the held-out rest."""
    middle = round(len(people) * seen)
    return people[:middle], people[middle:]


def pairs_tsv(pairs: list[tuple[str, str]]) -> str:
    """The text of a TSV file of prompt<TAB>completion lines."""
    return "".join(f"{prompt}\t{completion}\n" for prompt, completion in pairs)


def pairs_jsonl(pairs: list[tuple[str, str]], mask: str = "") -> str:
    """The text of a .jsonl file of pairs, each naming its kind of question (`kind`), which `kqv eval` reads to give
    each kind its own constant answer and the reading score; `mask`: what a prompt may end with besides its plain
    form (a probe in span-corruption form, `prefix MASK . MASK`)."""
    rows = [{"prompt": p, "completion": c, "kind": kind(p.removesuffix(f"{mask}.{mask}") if mask else p)}
            for p, c in pairs]  # fmt: skip
    return "".join(json.dumps(row) + "\n" for row in rows)


def write_pairs(path: Path, pairs: list[tuple[str, str]]) -> None:
    """A TSV file of prompt<TAB>completion lines (`pairs_tsv`)."""
    path.write_text(pairs_tsv(pairs), encoding="utf-8")


def write_jsonl(path: Path, pairs: list[tuple[str, str]], mask: str = "") -> None:
    """A .jsonl file of pairs (`pairs_jsonl`)."""
    path.write_text(pairs_jsonl(pairs, mask), encoding="utf-8")


def with_validation(
    text: str,
    seen: list[Person],
    seed: int,
    versions: int,
    val_fraction: float,
    full_names: bool = False,
    style: str = "varied",
) -> tuple[str, int]:
    """`text` (one document a line after the preface) with new biographies of seen people added at exactly the
    lines kqv's split (`kqv.data.completions.split_examples` at `val_fraction`) holds out for validation, so that
    validation withholds no document of the text (a held-out person's facts live in no other): the text and how
    many were added. The added biographies are written in the text's `style`."""
    lines = text.splitlines()
    added = 1
    while added != max(1, round(val_fraction * (len(lines) + added))):
        added += 1
    # new wordings (another seed), without the preface
    extra = biographies(seen, seed + 1, versions, full_names, style).splitlines()[1:]
    extra = (extra * (added // len(extra) + 1))[:added]
    _, held = split_examples(len(lines) + added, val_fraction)
    held_set, documents, pool = set(held), iter(lines), iter(extra)
    merged = [next(pool) if k in held_set else next(documents) for k in range(len(lines) + added)]
    return "\n".join(merged) + "\n", added


VAL_FRACTION = 0.05  # the validation share pretrain.txt is laid out for (`data.val_fraction`)


def check_world(n_people: int, versions: int, full_names: bool, style: str) -> None:
    """Refuse (ConfigError) a world that cannot be written: under two people (no held-out half), no version, or an
    encyclopedia asked for several versions or full names (it states each fact once)."""
    if n_people < 2 or versions < 1:
        raise ConfigError(f"{option(PEOPLE)} must be at least 2 and {option(VERSIONS)} at least 1")
    if style == "encyclopedia" and (versions != 1 or full_names):
        raise ConfigError(
            f"{option(STYLE_ENCYCLOPEDIA)} states each fact once: "
            f"no {option(VERSIONS)} above 1, no {option(FULL_NAMES)}"
        )


WORLD_FILES = (  # what `write_world` writes, and all a directory it may replace (`overwrite=True`) holds
    "biographies.txt", "pretrain.txt",
    *(f"{name}.{ext}" for name in ("questions-seen", "questions-held-out", "probes-seen", "probes-held-out")
      for ext in ("tsv", "jsonl")),
)  # fmt: skip
STAGING = ".kqv-world-"  # `.DIR.kqv-world-XXXXXXXX` beside DIR: a world being written, moved into place last


def world_files(
    people: list[Person], seed: int, versions: int = 1, full_names: bool = False, style: str = "varied"
) -> dict[str, str]:
    """Each file of the world of `people` (`write_world`) by name: its text."""
    seen, held_out = split(people)
    text = biographies(people, seed, versions, full_names, style)
    laid_out, _ = with_validation(text, seen, seed, versions, VAL_FRACTION, full_names, style)
    files = {"biographies.txt": text, "pretrain.txt": laid_out}
    pairs = {"questions-seen": questions(seen), "questions-held-out": questions(held_out),
             "probes-seen": probes(seen), "probes-held-out": probes(held_out)}  # fmt: skip
    for name, rows in pairs.items():
        files[f"{name}.tsv"] = pairs_tsv(rows)
        files[f"{name}.jsonl"] = pairs_jsonl(rows)
    return files


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse (ConfigError) to write a world where it would replace what a user holds: `out` must be new or an empty
    directory; with `overwrite`, also an earlier world (`is_world`), never anything else (a run, a prepared corpus,
    a user's own files)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ConfigError(f"{out} exists and is not a directory: give {option(OUT)} a new directory for the world")
    if not any(out.iterdir()) or (overwrite and is_world(out)):
        return
    if overwrite:
        raise ConfigError(
            f"{out} is not a world kqv wrote (it holds other files than a world's, or other text): "
            f"{option(OVERWRITE)} replaces only an earlier world; give {option(OUT)} a new directory"
        )
    raise ConfigError(
        f"{out} already exists and is not empty: give {option(OUT)} a new directory "
        f"(or {option(OVERWRITE)} to replace an earlier world written there)"
    )


def is_world(directory: Path) -> bool:
    """Whether `directory` holds an earlier world and nothing else: exactly the files `WORLD_FILES` names, its
    biographies opening with the world's preface."""
    if {path.name for path in directory.iterdir()} != set(WORLD_FILES):
        return False
    with open(directory / "biographies.txt", encoding="utf-8", errors="replace") as file:
        return file.readline().rstrip("\n") == PREFACE


def write_world(
    out: Path,
    n_people: int,
    seed: int,
    versions: int = 1,
    full_names: bool = False,
    style: str = "varied",
    overwrite: bool = False,
) -> list[Person]:
    """In `out`: biographies.txt (`versions` biographies per person, with `full_names` if asked, in `style`),
    pretrain.txt (the same with validation documents of seen people where `data.val_fraction = VAL_FRACTION` holds out:
    `with_validation`), the questions and probes of the seen and held-out people as .tsv and as .jsonl naming each
    question's kind; refused (`check_world`) where no such world can be written, and (`check_out`) where `out`
    holds anything but, with `overwrite`, an earlier world. The files are written into a staging directory beside
    `out` and moved into place last, so a killed write leaves the old world or none, never half of one."""
    check_world(n_people, versions, full_names, style)
    out = Path(out)
    check_out(out, overwrite)
    people = make_world(n_people, seed)
    files = world_files(people, seed, versions, full_names, style)
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}{STAGING}*"):  # what a killed write left
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}{STAGING}", dir=out.parent))
    try:
        os.chmod(staging, 0o777 & ~current_umask())  # mkdtemp's is private; the world is an ordinary directory
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
        swap(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return people


def current_umask() -> int:
    """The process's umask (read by setting it and back)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def swap(staging: Path, out: Path) -> None:
    """The complete world in `staging` moved to `out` (an empty directory there removed first; an earlier world
    renamed aside first and removed after)."""
    old = staging.with_name(staging.name + "-old")
    if out.exists():
        if any(out.iterdir()):
            os.replace(out, old)
        else:
            out.rmdir()
    os.replace(staging, out)
    shutil.rmtree(old, ignore_errors=True)
