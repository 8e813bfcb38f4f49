"""The gallery: one Markdown page with every experiment's verdict, table, plots and command, built from the
results.json files of a directory of runs, so the page and the committed results cannot disagree.

Each experiment's section starts with the hand-written discussion in DIR/NAME/discussion.md when there is one
(does the run reproduce the lecture's direction, with which numbers, and why not when it does not).
"""

from __future__ import annotations

import os
from pathlib import Path

from kqv.errors import RUN_EXPERIMENT, option

from . import get, names
from .records import RESULTS_FILE, load_record
from .report import (
    CHECK_COLUMNS,
    GPU_AFTER_SECONDS,
    VERDICT_RULE,
    check_rows,
    deciding_section,
    headline,
    is_stale,
    markdown_table,
    outcome,
    provenance_line,
    revisions_section,
    stale_section,
)

DISCUSSION_FILE = "discussion.md"
CHANGES_FILE = "verdict-changes.md"  # written by hand: the verdicts that changed, before -> after, and why
TITLE = """# Experiments: the lecture's claims, tested

Each claim below is one `kqv experiment`, run at its full size on a 2-core CPU: its verdict is computed from the
measured numbers against thresholds fixed in the experiment's module before it ran. The table gives each claim's
verdict and the number that decides it most directly; each row links to the experiment's section, with its table,
plots, checks and the command that produced them (rerun it to check)."""

METHOD = """## How the experiments were run and judged

The raw numbers, config, seeds, library versions and machine are in each `results.json`. `kqv experiment list`
names them all; `kqv experiment run all --quick` runs small versions of all of them in a few minutes (the test
suite does): a smoke test of the code, labelled so wherever it writes, not a test of the claims.

The experiments that time something (quadratic-cost, multihead-cost, parallelism, long-attention, and
rnn-vs-transformer, whose models train for a fixed time) ran one at a time on the otherwise idle machine. The
others ran two at a time, one torch thread each: that changes how long they took (the load average before each
run is in its results.json), not their losses, accuracies or BLEU after a fixed number of steps.

Each check is decided from the per-seed numbers: where arms share seeds, by the 95% Student-t interval of the
paired differences (or, for timings, of the repeats), against a threshold fixed in advance; {rule}. Each
results.json records the machine and the hash of the code that produced it (`code`: the experiment's module and
the kqv modules it imports, as syntax trees without docstrings, so a comment does not count as a change), the full
config it ran with, and a fingerprint of that code's numbers (`code.quick`, `kqv_lab.experiments.reproduction`): the
numbers of its quick size that every CPU kernel set (`ATEN_CPU_CAPABILITY` default, avx2 and avx512, oneDNN and MKL
capped alike) computed within 1e-4 of each other, and that another set of seeds moved, so echoes of the config,
counts fixed by construction, timings and whatever diverges on another CPU's rounding are left out. When the code
changes, the test suite reruns the quick size: a result stands only if its config is today's and today's code
reproduces every fingerprinted number within 1e-3, so moving code keeps it and changing what is computed makes it
stale until rerun. A fingerprint cannot vouch for a time: a result of an experiment that times something stands
only for the code it timed (its code hash) and names the CPU it was measured on; when that code changes, its
section says it needs a rerun.

Each check in a results.json also holds the intervals behind its figure as numbers (`intervals`: estimate, low,
high, n, the spread per seed, and the threshold or band each was judged against with the claimed side), and an
inconclusive check what would decide it (`to_decide`). Under "What would decide the inconclusive checks", each
experiment gives for each such check the fewest seeds (or timed repeats) whose 95% interval would clear its
threshold if the estimate and its spread over seeds stayed as measured (the standard sample-size calculation, with
the Student-t interval the check uses), and the command that would run them; a run estimated at over {hours} h on
the 2-core CPU (the record's time, scaled by that number) is marked for a GPU. Where the estimate lies on the wrong
side of the threshold, no number of seeds makes the check hold: it says so, and names the run that would show
that it does not.

This page is generated from the results by `kqv experiment gallery`; the discussion of each experiment is
written by hand in `docs/experiments/NAME/discussion.md`, and the verdicts that changed with a change of the rule or
of an experiment, at the end of this page, in `docs/experiments/verdict-changes.md`."""


METHOD = METHOD.replace("{rule}", VERDICT_RULE).replace("{hours}", f"{GPU_AFTER_SECONDS / 3600:g}")


def anchor(title: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation other than - and _ dropped, spaces as -."""
    return "".join(c for c in title.lower() if c.isalnum() or c in "-_ ").replace(" ", "-")


def section(directory: Path, page_dir: Path) -> str:
    """The gallery section of the experiment whose results are in `directory`; links relative to `page_dir`."""
    record = load_record(directory)
    link = lambda name: Path(os.path.relpath(directory / name, page_dir)).as_posix()
    load = record["machine"].get("load_average_before")
    parts = [
        f"## `{record['experiment']}`: {headline(record)}",
        f"*{record['claim']}.*",
        f"**The lecture.** {record['lecture']}",
    ]
    discussion = directory / DISCUSSION_FILE
    if discussion.is_file():
        parts.append(discussion.read_text(encoding="utf-8").strip())
    parts += [
        f"**How it was tested.** {record['method']} Seeds: {', '.join(map(str, record['seeds']))}.",
        f"**Command.** `{record['command']}` ({record['seconds'] / 60:.1f} min, "
        f"{record['machine']['torch_threads']} torch thread(s), load average {load[0] if load else '?'} on "
        f"{record['machine']['cpus']} cores of {cpu_name(record)}). Files: [results.json]({link(RESULTS_FILE)}), "
        f"[report.md]({link('report.md')}).",
        provenance_line(record),
        *stale_section(record),
        markdown_table(record["table"]["columns"], record["table"]["rows"]),
        *[f"![{name}]({link(name)})" for name in record["plots"]],
        *beside_the_paper(record),
        f"**Verdict: {headline(record)}.**",
        markdown_table(CHECK_COLUMNS, check_rows(record)),
        *deciding_section(record, rule=False),  # the rule is said once, in the introduction
        *revisions_section(get(record["experiment"])),
    ]
    return "\n\n".join(parts)


def claim_row(record: dict) -> list[str]:
    """A row of the table of claims: the experiment (linked to its section), its claim, its verdict (marked when
    it needs a rerun) and its first claim check's figure."""
    title = f"`{record['experiment']}`: {headline(record)}"
    deciding = [c for c in record["checks"] if c.get("role", "claim") == "claim"] or record["checks"]
    first = next((c for c in deciding if outcome(c) != "inconclusive"), deciding[0])
    verdict = headline(record) + ("; needs a rerun" if is_stale(record) else "")
    return [
        f"[`{record['experiment']}`](#{anchor(title)})",
        record["claim"],
        f"**{verdict}**",
        f"{first['what']}: {first['figure']}",
    ]


def cpu_name(record: dict) -> str:
    """The CPU a record ran on, as its provenance names it, with the kernel-relevant flags it had."""
    cpu = (record.get("provenance") or {}).get("cpu") or {}
    flags = cpu.get("flags") or []
    widest = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{cpu.get('model', 'an unrecorded CPU')} ({widest}{', bf16' if 'avx512_bf16' in flags else ''})"


def beside_the_paper(record: dict) -> list[str]:
    """The experiment's notes on its results (the published figures it is compared with), when it has them."""
    notes = get(record["experiment"]).notes
    return [notes(record["results"])] if notes is not None else []


def gallery(directory: str | Path, page: str | Path) -> str:
    """The text of the gallery page for the experiments found in `directory` (in the lecture's order)."""
    directory, page_dir = Path(directory), Path(page).parent
    found = [name for name in names() if (directory / name / RESULTS_FILE).is_file()]
    if not found:
        raise FileNotFoundError(
            f"no experiment results in {directory}; run {option(RUN_EXPERIMENT, name='NAME', out=str(directory))} first"
        )
    rows = [claim_row(load_record(directory / name)) for name in found]
    out = Path(os.path.relpath(directory, page_dir.parent)).as_posix()  # as typed from the page's parent directory
    missing = [f"`{name}` (`kqv experiment run {name} --out {out}`)" for name in names() if name not in found]
    claims = markdown_table(["experiment", "the claim", "verdict", "the deciding number"], rows)
    if missing:
        claims += f"\n\nNot yet run at full size here: {', '.join(missing)}."
    changes = directory / CHANGES_FILE
    changed = [changes.read_text(encoding="utf-8").strip()] if changes.is_file() else []
    parts = [TITLE, claims, METHOD, *(section(directory / n, page_dir) for n in found), *changed]
    return "\n\n".join(parts) + "\n"
