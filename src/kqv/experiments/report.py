"""report.md of an experiment: the claim, how it was tested, the table, the plots and the computed verdict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import Experiment


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table; numbers are right-aligned."""
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) for i in range(len(columns))]
    lines = [
        "| " + " | ".join(map(_cell, columns)) + " |",
        "| " + " | ".join("---:" if n else "---" for n in numeric) + " |",
    ]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


VERDICT_RULE = (
    "the verdict is 'holds' when every check holds, 'does not hold here' when none holds and some fails, "
    "'holds in part' when some hold and some fail, and 'inconclusive' when none fails but some could not be "
    "decided: a 95% interval over seeds (or repeats) that straddles its threshold, or an arm that did not learn"
)


def outcome(check: dict[str, Any]) -> str:
    """A results.json check's outcome (records written before outcomes existed hold only `holds`)."""
    return check.get("outcome") or ("holds" if check["holds"] else "does not hold")


def check_rows(record: dict[str, Any]) -> list[list[str]]:
    """The checks of a record as table rows: what, threshold, measured, outcome."""
    return [[c["what"], c["threshold"], c["figure"], outcome(c)] for c in record["checks"]]


def headline(record: dict[str, Any]) -> str:
    """The verdict as a heading shows it: a quick run's is labelled a smoke test first."""
    if record.get("quick"):
        return f"smoke test, not a test of the claim (checks at quick size: {record['verdict']})"
    return record["verdict"]


def provenance_line(record: dict[str, Any]) -> str:
    """Which code produced the numbers: the commit (dirty or clean) and the code hash, or why it is not known."""
    code, source = record.get("code") or {}, (record.get("provenance") or {}).get("git") or {}
    if code.get("hash"):
        state = {True: "with uncommitted changes", False: "clean", None: "state unknown"}[source.get("dirty")]
        return f"**Code.** commit {str(source.get('commit'))[:10]} ({state}); code hash {code['hash'][:12]}."
    return f"**Code.** {code.get('recorded', 'not recorded (results from before provenance was kept)')}."


def write_report(record: dict[str, Any], experiment: Experiment) -> str:
    """The text of report.md for a results.json record."""
    machine = record["machine"]
    load = machine.get("load_average_before")
    parts = [
        f"# `{record['experiment']}`: {headline(record)}",
        *([f"**{record['smoke_test']}.**"] if record.get("smoke_test") else []),
        f"**The claim, as the lecture makes it.** {record['lecture']}",
        f"**How it was tested.** {record['method']} Seeds: {', '.join(map(str, record['seeds']))}.",
        f"**Command.** `{record['command']}` ({record['seconds'] / 60:.1f} min on {machine['cpus']} cores, "
        f"{machine['torch_threads']} torch thread(s); load average {load[0] if load else 'unknown'} at the start"
        + (": a loaded machine, so times are upper bounds" if load and load[0] > machine["cpus"] else "")
        + ").",
        provenance_line(record),
        "## Results",
        markdown_table(record["table"]["columns"], record["table"]["rows"]),
        *[f"![{name}]({name})" for name in record["plots"]],
    ]
    if experiment.notes is not None:
        parts.append(experiment.notes(record["results"]))
    parts += [
        f"## Verdict: {headline(record)}",
        "Each check's threshold was written in the experiment module "
        f"(`kqv/experiments/{experiment.module.rpartition('.')[2]}.py`) before it ran; {VERDICT_RULE}.",
        markdown_table(["check", "threshold (fixed in advance)", "measured", "outcome"], check_rows(record)),
    ]
    return "\n\n".join(parts) + "\n"
