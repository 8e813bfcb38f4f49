"""The pretrain-to-answers benchmark's world (kqv_lab.worlds, `kqv world`) is the one issue 42 asks for: at least 1,000
people with unique names, answers over at least 100 values, biographies in varied wording and order that state
every fact a question asks, held-out people never asked in training; and benchmarks/pretrain_qa.py's baselines are
the hand-computed ones."""

import importlib
import json
import re
from collections import Counter

import pytest

from kqv_lab import worlds


def script(name: str):
    """The benchmark script `name`, imported by name: benchmarks/ is on the tests' path (pyproject.toml)."""
    return importlib.import_module(name)


world = worlds
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
        assert person_facts_in(person, line)
        sentences = [s if s.endswith(".") else s + "." for s in line.split(". ")]
        assert len(sentences) == 3
        orders.add(tuple(next(k for k in world.SENTENCES if str(getattr(person, k)) in s) for s in sentences))
        for sentence in sentences:
            wordings.update(form for form, pattern in forms.items() if pattern.fullmatch(sentence))
    assert len(orders) == 6  # every order of the three facts occurs
    assert set(wordings) == set(forms)  # every wording of every fact occurs


def test_full_name_biographies_name_their_person_in_every_sentence_and_state_the_same_facts():
    people = PEOPLE[:200]
    plain, named = world.biographies(people, 0, 2), world.biographies(people, 0, 2, full_names=True)
    pronouns = re.compile(r"\b(he|she|his|her|him|He|She|His|Her)\b")
    assert pronouns.search(plain)  # the default names a person by pronoun too
    by_name = {p.name: p for p in people}
    lines = named.splitlines()[1:]
    no_possessive = re.sub(r"the town of (his|her) birth", "", "\n".join(lines))  # a possessive, not a subject
    assert len(lines) == 2 * len(people) and not pronouns.search(no_possessive)
    seen_people = Counter()
    for line in lines:
        sentences = [s if s.endswith(".") else s + "." for s in line.split(". ")]
        names = [{n for n in re.findall(r"[A-Z][a-z]+ [A-Z][a-z]+", s) if n in by_name} for s in sentences]
        assert len(sentences) == 3 and all(len(n) == 1 for n in names) and len(set.union(*names)) == 1
        (person,) = names[0]
        assert person_facts_in(by_name[person], line)
        seen_people[person] += 1
    assert set(seen_people.values()) == {2}  # each person twice, each version its own draw
    assert world.biographies(people, 0, 2) == plain  # the default world is unchanged by the option


def person_facts_in(person, line: str) -> bool:
    return person.town in line and str(person.year) in line and f" {person.trade} " in line.replace(".", " ")


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


def test_the_benchmark_s_baselines_are_the_hand_computed_ones_ties_broken_as_kqv_eval_breaks_them(tmp_path):
    bench = script("pretrain_qa")
    for name, pairs in {
        # the fifth pair (Z Z's) is the one kqv holds out of these ten for validation: no baseline counts it
        "seen.jsonl": [("Where was A B born?", " X"), ("Where was C D born?", " X"), ("Where was K L born?", " Y"),
                       ("In which year was A B born?", " 1999"), ("Where was Z Z born?", " Q"),
                       ("In which year was C D born?", " 1945"),
                       ("What does A B do for a living?", " potter"), ("What does C D do for a living?", " potter"),
                       ("What does E F do for a living?", " potter"), ("What does K L do for a living?", " smith")],
        "held_out.jsonl": [("Where was G H born?", " X"), ("Where was I J born?", " Y"), ("In which year was G H "
                           "born?", " 1999"), ("What does G H do for a living?", " smith"), ("What does I J do for a "
                           "living?", " baker")],
    }.items():  # fmt: skip
        world.write_jsonl(tmp_path / name, pairs)
    found = bench.baselines(tmp_path)
    assert [e.prompt for e in bench.trained_questions(tmp_path / "seen.jsonl")][4] != "Where was Z Z born?"
    assert found["constant"]["answer"] == "potter" and found["constant"]["per_question"] == [0, 0, 0, 0, 0]
    # the years tie (1999 and 1945 once each): kqv eval's rule, the first in sorted order, gives 1945 (the order
    # the file gives, or Counter.most_common, would give 1999)
    assert found["per_kind"]["answers"] == {"town": "X", "year": "1945", "trade": "potter"}
    assert found["per_kind"]["per_question"] == [1, 0, 0, 0, 0]
    assert found["uniform_per_kind"]["per_question"] == pytest.approx([1 / 2, 1 / 2, 1 / 2, 1 / 2, 0])
    assert found["kinds"] == ["town", "town", "year", "trade", "trade"]
    # reading questions: every one whose answer is not its kind's constant; the guess among the kind's other seen
    # answers by frequency: town Y 1/1, year 1999 1/1, trade smith 1/1 and baker (never seen) 0/1; the runner-ups,
    # each kind's most frequent other seen answer: Y, 1999, smith, right on all but baker
    runner_up = {"answers": {"town": "Y", "trade": "smith", "year": "1999"}, "per_question": [1, 1, 1, 0]}
    assert found["reading"] == {"questions": [1, 2, 3, 4], "guess": [1.0, 1.0, 1.0, 0.0], "runner_up": runner_up}
    difference = bench.versus([1, 1, 1, 0, 0], found["per_kind"]["per_question"])
    assert difference["difference"] == pytest.approx(0.4) and difference["verdict"] == "inconclusive"


def test_a_probe_record_s_count_rate_and_interval_come_from_one_scoring():
    from kqv.jobs.scoring import PairsEvaluation, Prediction

    bench = script("pretrain_qa")
    # a next-token model goes on after the answer: strict exact match finds none of these right, the probe 3 of 5
    got = [" Lemvik. She works", " Lemvik", " 1999, and", " Lemvikton", " potter"]
    predictions = tuple(Prediction(f"p{i}", e, g) for i, (e, g) in enumerate(zip([" Lemvik"] * 2 + [" 1999"] +
                        [" Lemvik", " a potter"], got)))  # fmt: skip
    strict = sum(p.correct for p in predictions)
    record = bench.probe_record(PairsEvaluation("probes", 5, strict, 0.0, 0.5, 1.0, 2.7, 9, predictions))
    assert record["per_question"] == [1, 1, 1, 0, 0] and strict == 1
    assert (record["n"], record["correct"], record["exact_match"]) == (5, 3, 0.6)
    # Wilson's interval of 3/5 by its closed form: (p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    z, p, n = 1.959964, 0.6, 5
    centre, half = p + z * z / (2 * n), z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    assert record["exact_match_95"] == pytest.approx(
        [(centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)]
    )
    assert record["exact_match_95"][0] <= record["exact_match"] <= record["exact_match_95"][1]


def test_validation_documents_are_added_where_the_split_holds_out_so_no_biography_is_withheld(tmp_path):
    from kqv.data.completions import split_examples

    bench = script("pretrain_qa")
    sizes = bench.SIZES["quick"]
    bench.write_files(sizes, 0, tmp_path)
    for name in ("bios", "bios_augmented", "bios_full"):
        original = (tmp_path / f"{name}.txt").read_text().splitlines()
        documents = (tmp_path / f"{name}_pretrain.txt").read_text().splitlines()
        train, val = split_examples(len(documents), bench.VAL_FRACTION)
        assert [documents[k] for k in train] == original  # every biography, in its order, in the training split
        assert val and not set(documents[k] for k in val) & set(original)  # validation: other biographies
    people = world.make_world(sizes["people"], 0)
    _, held_out = world.split(people)
    val_text = " ".join(documents[k] for k in val)
    assert not any(person.name in val_text for person in held_out)  # of seen people alone


def test_two_seeds_are_averaged_per_question_and_a_verdict_needs_the_interval_and_the_exact_test():
    bench = script("pretrain_qa")
    n = 40
    baseline = {
        "kinds": ["town", "year", "trade", "town"] * (n // 4),
        "constant": {"per_question": [0] * n},
        "per_kind": {"per_question": [1] * 4 + [0] * (n - 4)},
        "uniform_per_kind": {"per_question": [0.1] * n},
        "reading": {
            "questions": list(range(4, n)),
            "guess": [0.05] * (n - 4),
            "runner_up": {"answers": {}, "per_question": [0] * (n - 4)},
        },
    }
    arm = "next-token -> fine-tune"
    seed0 = [1] * 4 + [1] * 12 + [0] * (n - 16)  # right on the constant's 4 and on 12 reading questions
    seed1 = [1] * 4 + [1] * 6 + [0] * (n - 10)
    results = {}
    for seed, scores in ((0, seed0), (1, seed1)):
        for name in (arm, "next-token"):
            results[bench.seeded(name, seed)] = {
                "held_out": {"per_question": scores, "exact_match": sum(scores) / n},
                "seen": {"per_question": [1, 0]},
                "probe": {"per_question": [0, 1], "correct": 1, "n": 2, "exact_match": 0.5, "exact_match_95": [0, 1]},
                "steps": 10,
                "tokens": 1000 + seed,
                "train_seconds": 5.0,
                "trainable_parameters": 7,
            }
    summary = bench.summarise(results, baseline, [0, 1])
    figures = summary["arms"][arm]
    means = [(a + b) / 2 for a, b in zip(seed0, seed1)]
    assert figures["exact_match"] == pytest.approx(sum(means) / n) and figures["per_seed"] == {0: 16 / n, 1: 10 / n}
    gap = figures["versus_constant_per_kind"]  # per question: 12 reading questions above, none below
    assert gap["questions"] == n and gap["difference"] == pytest.approx((sum(means) - 4) / n)
    assert (gap["better"], gap["worse"]) == (12, 0) and gap["verdict"] == "higher"
    reading = figures["reading"]
    assert reading["questions"] == n - 4 and reading["exact_match"] == pytest.approx(9 / (n - 4))
    assert reading["guess"] == pytest.approx(0.05)
    spent = {seed: {"steps": 20, "tokens": 2000 + 2 * seed, "train_seconds": 10.0} for seed in (0, 1)}
    assert figures["compute"] == {"equal_in": "updates", "per_seed": spent} and figures["train_seconds"] == 10.0
    assert summary["probes"] == {"next-token": 0.5} and summary["probe_records"]["next-token"][1]["correct"] == 1
    # an interval clear of zero is not enough: 5 of 100 questions better, none worse: t's interval is clear of zero,
    # McNemar's exact p = 2 / 2^5 = 0.0625 is not below 0.05
    few = bench.versus([1] * 5 + [0] * 95, [0] * 100)
    assert few["difference_95"][0] > 0 and few["p_value"] == pytest.approx(0.0625) and few["verdict"] == "inconclusive"


def test_span_settings_reach_every_span_corruption_run_and_no_other(tmp_path):
    bench = script("pretrain_qa")
    sizes = bench.SIZES["quick"] | {"span_options": ["data.random_prefix=true"]}
    runs = bench.seeded_jobs(sizes, tmp_path, [0, 1], 1, None)
    given = {name for name, job in runs.items() if "data.random_prefix=true" in job["overrides"]}
    spans = {name for name, job in runs.items() if 'data.objective="span_corruption"' in job["overrides"]}
    assert given == spans and len(spans) == 6  # the span pretraining and the two mixed arms, for each seed
    assert runs["span corruption, augmented -> fine-tune | seed 1"]["needs"] == "span corruption, augmented | seed 1"
    assert len({job["out"] for job in runs.values()}) == len(runs) == 2 * (len(bench.PRETRAININGS) + len(bench.ARMS))


def test_the_mixed_next_token_arm_reads_the_full_name_text_twice_as_often_as_the_questions_and_is_probed(tmp_path):
    bench = script("pretrain_qa")
    runs = bench.jobs(bench.SIZES["quick"], tmp_path, 0, 1)
    mixed = runs["mixed: next-token, augmented, full names + seen questions"]
    full, seen = json.dumps(str(tmp_path / "bios_full_pretrain.txt")), json.dumps(str(tmp_path / "seen.jsonl"))
    assert f"data.sources=[{{path={full}, weight=2}}, {{path={seen}, weight=1}}]" in mixed["overrides"]
    assert "data.shuffle_sentences=true" in mixed["overrides"]
    assert not any("span_corruption" in o or "template" in o for o in mixed["overrides"])
    assert mixed["score"]["probe"] == str(tmp_path / "probe_held_out.jsonl") and mixed["needs"] is None
    assert "probe" not in runs["mixed: span corruption, augmented + seen questions"]["score"]
    steps = bench.SIZES["quick"]["pretrain_steps"] + bench.SIZES["quick"]["finetune_steps"]
    assert f"train.steps={steps}" in mixed["overrides"]  # equal updates with a pretraining and its fine-tune
    fine = runs["next-token, augmented, full names -> fine-tune"]
    assert fine["needs"] == "next-token, augmented, full names"
    assert any("bios_full_pretrain.txt" in o for o in runs["next-token, augmented, full names"]["overrides"])


def test_the_default_world_is_the_one_written_before_the_encyclopedia_style(tmp_path):
    """The text the benchmark's stored results were measured on, byte for byte (hashes of its output for a seed)."""
    import hashlib

    people = world.make_world(200, 0)
    digests = {
        (0, 1, False): "a2eaea18078bd6b653411f9b9796dea8a507721cc4c368012341410300de00ae",
        (0, 3, False): "9d1438ac308f33d6e96af4fa33a1c347cd3464293d47a8dd040581652a2043f8",
        (0, 2, True): "827c35ffd91efdb4e66f3e52bb236c5d926999b80f88b0a15025262be98e0157",
        (5, 1, False): "b23ea17a6e40de9c40913f619cb1210574ea490a4d8c526e674cfac6bb9d9642",
    }
    for (seed, versions, full_names), digest in digests.items():
        text = world.biographies(people, seed, versions, full_names)
        assert hashlib.sha256(text.encode()).hexdigest() == digest
        assert world.biographies(people, seed, versions, full_names, style="varied") == text
    world.write_world(tmp_path, 60, 3, 2)
    files = hashlib.sha256()
    for path in sorted(tmp_path.iterdir()):
        files.update(path.name.encode())
        files.update(path.read_bytes())
    assert files.hexdigest() == "fbabe6ba2b549a5c5f70f0c1c313e8d5f7463d5429c4f8498158f675c863b57e"


def test_an_encyclopedia_names_each_person_once_then_by_pronoun_and_states_each_fact_once():
    import random

    people = PEOPLE[:300]
    text = world.biographies(people, 0, style="encyclopedia")
    lines = text.splitlines()
    assert lines[0] == world.ENCYCLOPEDIA_PREFACE and len(lines) == len(people) + 1
    asked = world.questions(people) + world.probes(people)  # a character tokenizer made from the text knows them
    assert not {char for pair in asked for char in "".join(pair)} - set(text)
    by_name = {p.name: p for p in people}
    forms = {"he": {"He", "he", "His", "his", "him"}, "she": {"She", "she", "Her", "her"}}
    later_forms = set()
    for line in lines[1:]:
        names = [n for n in re.findall(r"[A-Z][a-z]+ [A-Z][a-z]+", line) if n in by_name]
        assert len(names) == 1  # the full name exactly once
        person = by_name[names[0]]
        first, *later = [s if s.endswith(".") else s + "." for s in line.split(". ")]
        assert person.name in first and len(later) == 2  # named in the first sentence, two facts after it
        facts = [re.compile(rf"\b{fact}\b") for fact in (person.town, str(person.year), person.trade)]
        assert all(len(fact.findall(line)) == 1 for fact in facts)  # each fact stated once
        assert sum(bool(fact.search(first)) for fact in facts) == 1  # one fact first, the others after it
        for sentence in later:
            assert person.name.split()[0] not in sentence and person.name.split()[1] not in sentence
            words = set(re.findall(r"[A-Za-z]+", sentence))
            assert words & forms[person.pronoun]  # a pronoun of the person's, never the other's
            assert not words & forms["she" if person.pronoun == "he" else "he"]
            later_forms.add(re.sub(r"[A-Z][a-z]+|\d+|an? [a-z]+", "X", sentence))
    assert len(later_forms) >= 8  # the later sentences vary in wording
    they = world.Person("Ab Cd", "they", "Xo", 1901, "innkeeper")
    entries = {world.encyclopedia_entry(they, random.Random(k)) for k in range(40)}
    assert all(e.startswith(("Ab Cd ", "In 1901, Ab Cd ")) for e in entries)
    assert not any(re.search(r"\b(He|She|he|she|his|him|was|comes|works)\b", e.split(". ", 1)[1]) for e in entries)
    with pytest.raises(ValueError, match="once"):
        world.biographies(people, 0, 2, style="encyclopedia")
    with pytest.raises(ValueError, match="style"):
        world.biographies(people, 0, style="wiki")


def test_each_kind_s_constant_is_the_one_kqv_eval_prints_for_a_fine_tune_from_the_pairs_it_trained_on(tmp_path):
    """A tie broken by the validation share: of the 20 seen years, 1917 and 1945 come 2 times each in the whole
    file, but kqv holds one 1917 out for validation, so a fine-tune trains on one 1917 and two 1945s and `kqv eval`
    prints 1945. The benchmark's constant is that one, not the whole file's (1917, first in sorted order)."""
    from kqv.data.completions import split_examples
    from kqv.jobs.scoring import kind_constants

    bench = script("pretrain_qa")
    _, (held,) = split_examples(20, bench.VAL_FRACTION)
    years = [str(1950 + k) for k in range(20)]
    others = [k for k in range(20) if k != held]
    years[held], years[others[0]], years[others[1]], years[others[2]] = "1917", "1917", "1945", "1945"
    seen = [(f"In which year was P{k} Q born?", f" {year}") for k, year in enumerate(years)]
    world.write_jsonl(tmp_path / "seen.jsonl", seen)
    world.write_jsonl(tmp_path / "held_out.jsonl", [("In which year was R S born?", " 1945")])
    whole = kind_constants([c for _, c in seen], ["year"] * 20)
    assert whole == {"year": "1917"}  # what counting the whole file gives
    found = bench.baselines(tmp_path)
    assert found["per_kind"]["answers"] == {"year": "1945"} and found["per_kind"]["per_question"] == [1]
    assert found["reference"].startswith("the 19 pairs a fine-tune trains on")


def test_a_development_split_scores_other_people_than_the_held_out_ones(tmp_path):
    bench = script("pretrain_qa")
    sizes = bench.SIZES["quick"]
    bench.write_files(sizes, 0, tmp_path)
    people = world.make_world(sizes["people"], 0)
    seen, held_out = world.split(people)
    trained, dev = bench.dev_split(seen)
    assert dev and trained and len(dev) == round(len(seen) * bench.DEV_SHARE) and trained + dev == seen

    def asked(name):
        return {re.search(r"[A-Z][a-z]+ [A-Z][a-z]+", json.loads(line)["prompt"]).group(0)
                for line in (tmp_path / name).read_text().splitlines()}  # fmt: skip

    assert asked("dev.jsonl") == {p.name for p in dev} and asked("probe_dev.jsonl") == {p.name for p in dev}
    assert asked("seen_dev.jsonl") == {p.name for p in trained}
    assert not asked("dev.jsonl") & {p.name for p in held_out}  # the held-out people are never scored on dev
    runs = bench.jobs(sizes | {"split": "dev"}, tmp_path, 0, 1)
    for name, job in runs.items():
        text = " ".join(job["overrides"]) + " " + " ".join(job["score"].values())
        assert "held_out" not in text, name
        if "held_out" in job["score"]:  # the key of the scored questions, whichever split
            assert job["score"]["held_out"] == str(tmp_path / "dev.jsonl")
            assert job["score"]["seen"] == str(tmp_path / "seen_dev.jsonl")
    assert str(tmp_path / "seen_dev.jsonl") in " ".join(
        runs["mixed: next-token, encyclopedia + seen questions"]["overrides"]
    )
    test = bench.jobs(sizes, tmp_path, 0, 1)  # the default split: the seen people, scored on the held-out ones
    assert test["next-token -> fine-tune"]["score"]["held_out"] == str(tmp_path / "held_out.jsonl")
    dev_baseline = bench.baselines(tmp_path, "dev")
    assert len(dev_baseline["kinds"]) == 3 * len(dev) and dev_baseline["split"] == "dev"


def test_the_encyclopedia_arms_read_the_encyclopedia_text_as_their_recipes_say(tmp_path):
    bench = script("pretrain_qa")
    sizes = bench.SIZES["quick"]
    runs = bench.jobs(sizes, tmp_path, 0, 1, bench.ENCYCLOPEDIA_ARMS)
    assert set(runs) == {"next-token, encyclopedia", *bench.ENCYCLOPEDIA_ARMS} and len(bench.ENCYCLOPEDIA_ARMS) == 3
    text, seen = json.dumps(str(tmp_path / "bios_encyclopedia_pretrain.txt")), json.dumps(str(tmp_path / "seen.jsonl"))
    pre = runs["next-token, encyclopedia"]
    assert f"data.sources=[{{path={text}, weight=1}}]" in pre["overrides"]
    assert not any("shuffle" in o or "span" in o for o in pre["overrides"])  # a pronoun follows its name
    assert runs["next-token, encyclopedia -> fine-tune"]["needs"] == "next-token, encyclopedia"
    mixed = runs["mixed: next-token, encyclopedia + seen questions"]
    assert f"data.sources=[{{path={text}, weight=2}}, {{path={seen}, weight=1}}]" in mixed["overrides"]
    assert "probe" in mixed["score"] and not any("span" in o for o in mixed["overrides"])
    cs224n = runs["mixed: span corruption, encyclopedia + seen questions (CS224N)"]["overrides"]
    assert f"data.sources=[{{path={text}, weight=1}}, {{path={seen}, weight=1}}]" in cs224n
    for option in ('data.objective="span_corruption"', "data.random_prefix=true", 'data.span_loss="all"',
                   "data.prompt_loss_weight=1", 'data.template="{prompt}{mask}"'):  # fmt: skip
        assert option in cs224n
    steps = sizes["pretrain_steps"] + sizes["finetune_steps"]
    assert f"train.steps={steps}" in cs224n and f"train.steps={steps}" in mixed["overrides"]
    bench.write_files(sizes, 0, tmp_path)
    lines = (tmp_path / "bios_encyclopedia.txt").read_text()
    assert lines == world.biographies(world.make_world(sizes["people"], 0), 0, style="encyclopedia")


def test_a_stored_record_summarised_again_keeps_its_figures(tmp_path):
    """The stored records were summarised by today's code: summarising one again changes no figure."""
    bench = script("pretrain_qa")
    stored = bench.harness.results_path("pretrain_qa-plain")
    out = tmp_path / "again.json"
    assert bench.main(["--summarise", str(stored), "--output", str(out)]) == 0
    record, again = json.loads(stored.read_text()), json.loads(out.read_text())
    assert again["summary"] == record["summary"] and again["baselines"] == record["baselines"]
    guess = again["summary"]["arms"]["next-token -> fine-tune"]["reading"]["versus_guess"]
    assert len(guess["seed_p_values"]) == 2 and guess["p_value"] == max(guess["seed_p_values"])
    assert again["baselines"]["per_kind"]["answers"]["year"] == "1945"  # kqv eval's, from the 1,425 trained pairs


def test_kqv_world_writes_the_library_s_world_and_refuses_an_impossible_one_in_the_caller_s_words(tmp_path, capsys):
    """`kqv world` is `kqv_lab.worlds.write_world` (the same bytes); a world it cannot write is refused before any
    file is, naming the flags on the command line and the arguments in Python."""
    from kqv.cli.main import main
    from kqv.errors import ConfigError

    assert main(["world", "--people", "12", "--versions", "2", "--seed", "4", "--out", str(tmp_path / "cli")]) == 0
    worlds.write_world(tmp_path / "lib", 12, 4, 2)
    names = sorted(path.name for path in (tmp_path / "cli").iterdir())
    assert names == sorted(path.name for path in (tmp_path / "lib").iterdir()) and len(names) == 10
    assert all((tmp_path / "cli" / n).read_bytes() == (tmp_path / "lib" / n).read_bytes() for n in names)
    capsys.readouterr()
    for argv, said in (
        (["--people", "1"], "--people must be at least 2 and --versions at least 1"),
        (["--style", "encyclopedia", "--full-names"], "--style encyclopedia states each fact once"),
    ):
        assert main(["world", *argv, "--out", str(tmp_path / "no")]) == 2
        assert said in capsys.readouterr().err and not (tmp_path / "no").exists()
    with pytest.raises(ConfigError, match="n_people must be at least 2 and versions at least 1"):
        worlds.write_world(tmp_path / "no", 1, 0)
    assert not (tmp_path / "no").exists()
