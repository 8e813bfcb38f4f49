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


def write_report(record: dict[str, Any], experiment: Experiment) -> str:
    """The text of report.md for a results.json record."""
    machine = record["machine"]
    load = machine.get("load_average_before")
    checks = [
        [c["what"], c["threshold"], c["figure"], "holds" if c["holds"] else "does not hold"] for c in record["checks"]
    ]
    parts = [
        f"# `{record['experiment']}`: {record['verdict']}" + (" (quick run)" if record["quick"] else ""),
        f"**The claim, as the lecture makes it.** {record['lecture']}",
        f"**How it was tested.** {record['method']} Seeds: {', '.join(map(str, record['seeds']))}.",
        f"**Command.** `{record['command']}` ({record['seconds'] / 60:.1f} min on {machine['cpus']} cores, "
        f"{machine['torch_threads']} torch thread(s); load average {load[0] if load else 'unknown'} at the start"
        + (": a loaded machine, so times are upper bounds" if load and load[0] > machine["cpus"] else "")
        + ").",
        "## Results",
        markdown_table(record["table"]["columns"], record["table"]["rows"]),
        *[f"![{name}]({name})" for name in record["plots"]],
    ]
    if experiment.notes is not None:
        parts.append(experiment.notes(record["results"]))
    parts += [
        f"## Verdict: {record['verdict']}",
        "Each check's threshold was written in the experiment module "
        f"(`kqv/experiments/{experiment.module.rpartition('.')[2]}.py`) before it ran; the verdict "
        "is 'holds' when every check holds, 'does not hold here' when none does, 'holds in part' otherwise.",
        markdown_table(["check", "threshold (fixed in advance)", "measured", "outcome"], checks),
    ]
    return "\n\n".join(parts) + "\n"
