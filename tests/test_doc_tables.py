"""Every table of measurements on the site is written from the JSON its command wrote: a page whose table differs
from what `docs/gen_tables.py` builds fails here (edit the JSON's source or rerun the command, never the table)."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def gen_tables():
    spec = importlib.util.spec_from_file_location("gen_tables", ROOT / "docs" / "gen_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_tables"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_page_table_is_what_the_script_writes_from_the_json():
    assert gen_tables().stale() == [], "a table differs from its JSON: run `python docs/gen_tables.py`"


def test_every_table_the_script_knows_is_on_a_page():
    tables = gen_tables()
    text = "".join(page.read_text() for page in tables.pages())
    assert all(f"<!-- table: {name} -->" in text for name in tables.TABLES)


@pytest.mark.parametrize("name", ["train-throughput", "generation-speed"])
def test_each_table_is_on_a_page_and_every_row_names_machine_date_and_command(name):
    tables = gen_tables()
    pages = [page for page in tables.pages() if f"<!-- table: {name} -->" in page.read_text()]
    assert pages, f"no page holds the table {name}"
    table, runs = tables.TABLES[name]().split("\nRuns:\n\n")
    rows, commands = table.splitlines()[2:], runs.splitlines()
    assert rows and all(re.match(r"\| [^|]+ \| 2026-\d\d-\d\d \| \d+ \|", row) for row in rows)
    numbers = {int(row.split("|")[3]) for row in rows}
    assert numbers == set(range(1, len(commands) + 1))
    assert all(re.match(r"\d+\. .+, 2026-\d\d-\d\d: `(PYTHONPATH=\S+ )?python benchmarks/", c) for c in commands)


@pytest.mark.parametrize("name", ["attention-scaling-train-cpu", "attention-scaling-2threads-train-wall"])
def test_a_table_of_one_run_names_its_machine_date_and_command_under_it(name):
    table = gen_tables().TABLES[name]()
    assert re.search(r"\nRun: .+, 2026-\d\d-\d\d: `python benchmarks/\S+\.py[^`]*` \(`benchmarks/results/", table)


def test_a_changed_figure_is_found():
    tables = gen_tables()
    page = next(page for page in tables.pages() if "<!-- table: train-throughput -->" in page.read_text())
    text = page.read_text()
    first_row = text.split("<!-- table: train-throughput -->\n", 1)[1].splitlines()[2]
    edited = text.replace(first_row, first_row.replace("| 1,", "| 9,", 1))
    assert edited != text and tables.regenerate(edited) == text


# tables whose figures are not a run of ours, each with what they are instead
NOT_RUNS = {"dmca-paper": "Liu et al. 2018's published perplexities, beside our DMCA runs"}
RUN = re.compile(r"^(?:Run:|\d+\.) .+, 2026-\d\d-\d\d: `[^`]+` \(`benchmarks/results/[\w.-]+\.json`\)$", re.M)


@pytest.mark.parametrize("name", sorted(gen_tables().TABLES))
def test_every_table_names_the_machine_date_command_and_json_of_each_run(name):
    text = gen_tables().TABLES[name]()
    if name in NOT_RUNS:
        assert "`benchmarks/results/" in text  # still read from a committed JSON, which names its source
    elif name == "lm-quick-job":  # one run per row: machine, date and command are columns
        rows = text.split("\n\n")[0].splitlines()[2:]
        assert rows and all(re.match(r"\| [^|]+ \| 2026-\d\d-\d\d \|.*\| `[^`]+` \|$", row) for row in rows)
    else:
        runs = RUN.findall(text)
        numbered = re.findall(r"^\d+\. ", text, re.M)
        assert runs and len(runs) == max(1, len(numbered)), f"{name}: every run needs its machine, date, command, JSON"
