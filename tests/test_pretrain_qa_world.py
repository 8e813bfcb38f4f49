"""The pretrain-to-answers benchmark's world (benchmarks/people_world.py) is the one issue 42 asks for: at least 1,000
people with unique names, answers over at least 100 values, biographies in varied wording and order that state
every fact a question asks, held-out people never asked in training; and benchmarks/pretrain_qa.py's baselines are
the hand-computed ones."""

import importlib.util
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def script(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


world = script("people_world")
PEOPLE = world.make_world(1000, 0)


def test_a_thousand_people_with_unique_names_and_answers_spread_over_more_than_a_hundred_values():
    assert len({p.name for p in PEOPLE}) == 1000
    values = {kind: Counter(p.answer(kind) for p in PEOPLE) for kind in world.QUESTIONS}
    assert len(values["town"]) >= 100 and len(values["year"]) >= 90 and len(values["trade"]) >= 30
    top_town = values["town"].most_common(1)[0][1] / 1000
    assert 0.03 < top_town < 0.15  # common towns exist (a baseline worth beating), none dominates
    assert world.make_world(1000, 0) == PEOPLE and world.make_world(1000, 1) != PEOPLE


def test_each_biography_states_its_person_s_three_facts_in_varied_wording_and_order():
    text = world.biographies(PEOPLE, 0)
    lines = text.splitlines()
    assert lines[0] == world.PREFACE and len(lines) == 1001
    by_name = {p.name: p for p in PEOPLE}
    forms = {form: re.compile(re.sub(r"\\\{[a-z_]+\\\}", ".+", re.escape(form[0].upper() + form[1:])))
             for forms in world.SENTENCES.values() for form in forms}  # fmt: skip
    orders, wordings = set(), Counter()
    for line in lines[1:]:
        (person,) = {by_name[n] for n in re.findall(r"[A-Z][a-z]+ [A-Z][a-z]+", line) if n in by_name}
        assert person.town in line and str(person.year) in line and f" {person.trade} " in line.replace(".", " ")
        sentences = [s if s.endswith(".") else s + "." for s in line.split(". ")]
        assert len(sentences) == 3
        orders.add(tuple(next(k for k in world.SENTENCES if str(getattr(person, k)) in s) for s in sentences))
        for sentence in sentences:
            wordings.update(form for form, pattern in forms.items() if pattern.fullmatch(sentence))
    assert len(orders) == 6  # every order of the three facts occurs
    assert set(wordings) == set(forms)  # every wording of every fact occurs


def test_held_out_people_are_never_asked_in_training_and_their_questions_use_the_text_s_characters():
    seen, held_out = world.split(PEOPLE)
    assert len(seen) == len(held_out) == 500 and not {p.name for p in seen} & {p.name for p in held_out}
    questions = world.questions(held_out)
    assert len(questions) == 1500 and {world.kind(q) for q, _ in questions} == set(world.QUESTIONS)
    assert not {c for pair in questions for c in "".join(pair)} - set(world.biographies(PEOPLE, 0))
    by_name = {p.name: p for p in held_out}
    for prompt, answer in world.probes(held_out):  # a probe is cut before its person's own fact
        kind = world.kind(prompt)
        name = re.match(r"([A-Z][a-z]+ [A-Z][a-z]+)", prompt).group(1)
        assert answer.endswith(" " + by_name[name].answer(kind))
    with pytest.raises(ValueError, match="not a question"):
        world.kind("Who is Zorbo Quill?")


def test_the_benchmark_s_baselines_are_the_hand_computed_ones(tmp_path):
    bench = script("pretrain_qa")
    for name, pairs in {
        "seen.tsv": [("Where was A B born?", " X"), ("Where was C D born?", " X"), ("In which year was A B born?",
                     " 1900"), ("What does A B do for a living?", " potter"), ("What does C D do for a living?",
                     " potter"), ("What does E F do for a living?", " potter")],
        "held_out.tsv": [("Where was G H born?", " X"), ("Where was I J born?", " Y"), ("In which year was G H born?",
                         " 1900"), ("What does G H do for a living?", " smith")],
    }.items():  # fmt: skip
        world.write_pairs(tmp_path / name, pairs)
    found = bench.baselines(tmp_path)
    assert found["constant"]["answer"] == "potter" and found["constant"]["per_question"] == [0, 0, 0, 0]
    assert found["per_kind"]["answers"] == {"town": "X", "year": "1900", "trade": "potter"}
    assert found["per_kind"]["per_question"] == [1, 0, 1, 0]
    assert found["uniform_per_kind"]["per_question"] == [1, 0, 1, 0]  # one distinct answer per kind was seen
    assert found["kinds"] == ["town", "town", "year", "trade"]
    difference = bench.versus([1, 1, 1, 0], found["per_kind"]["per_question"])
    assert difference["difference"] == pytest.approx(0.25) and difference["verdict"] == "inconclusive"
