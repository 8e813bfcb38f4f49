"""Figures the pages state beside the command that prints them, checked against that command's own source of the
number: the quick job's training tokens (its first line: the training split of Shakespeare, one token a
character), the size of getting-started's `cat docs/*.md > my.txt`, and the tutorial's time (its results table)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def test_the_quick_job_s_training_tokens_are_what_its_first_line_prints():
    from kqv.api import packaged_config
    from kqv.data.shakespeare import load_text, split_text

    config = packaged_config("quick", "lm").read_text(encoding="utf-8")
    val_fraction = float(re.search(r"^val_fraction = ([0-9.]+)", config, re.MULTILINE).group(1))
    train_text, _ = split_text(load_text(), val_fraction)  # the char tokenizer: one token a character
    printed = f"{len(train_text):,} training tokens"
    assert printed in config.splitlines()[0]
    assert f"({printed}, as the run's first line says;" in (DOCS / "language-modelling.md").read_text(encoding="utf-8")


def test_the_size_getting_started_gives_its_text_of_the_guide_s_pages_is_that_of_the_pages():
    page = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    said = re.search(r"cat docs/\*\.md > my\.txt .*\(about ([0-9.]+) MB\)", page)
    size = sum(path.stat().st_size for path in DOCS.glob("*.md"))  # what the glob concatenates
    assert said and float(said.group(1)) == round(size / 1e6, 1), (said and said.group(), size)


def test_the_tutorial_s_time_is_its_table_s_minutes_a_seed():
    page = (DOCS / "pretrain-to-answers.md").read_text(encoding="utf-8")
    row = re.search(r"^\| next-token, augmented, full names -> fine-tune \|(?: [^|]+ \|){6} ([0-9.]+) \|$", page, re.M)
    opening = " ".join(page.split("## 1.")[0].split())
    assert (
        row and f"each seed of the benchmark below took {row.group(1)} minutes on one core of a 2-core CPU" in opening
    )
    assert "half an hour" in opening and 25 <= float(row.group(1)) <= 35
    assert f"Each seed of the benchmark took {row.group(1)} minutes on one core" in page
