"""report.md of an experiment: the claim, how it was tested, the table, the plots and the computed verdict, and
for each inconclusive check how many seeds would decide it, with the command that would run them."""

from __future__ import annotations

import shlex
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
    "the verdict is decided by the checks of the claim alone: 'holds' when every one holds, 'does not hold here' "
    "when none holds and some fails, 'holds in part' when some hold and some fail, and 'inconclusive' when none "
    "fails but some could not be decided (a 95% interval over seeds or repeats that straddles its threshold, or an "
    "arm that did not learn), or when a control does not hold; checks that hold by construction are reported only"
)


def outcome(check: dict[str, Any]) -> str:
    """A results.json check's outcome (records written before outcomes existed hold only `holds`)."""
    return check.get("outcome") or ("holds" if check["holds"] else "does not hold")


def check_rows(record: dict[str, Any]) -> list[list[str]]:
    """The checks of a record as table rows: what, its role, threshold, measured, outcome."""
    return [[c["what"], c.get("role", "claim"), c["threshold"], c["figure"], outcome(c)] for c in record["checks"]]


CHECK_COLUMNS = ["check", "role", "threshold (fixed in advance)", "measured", "outcome"]


def headline(record: dict[str, Any]) -> str:
    """The verdict as a heading shows it: a quick run's is labelled a smoke test first."""
    if record.get("quick"):
        return f"smoke test, not a test of the claim (checks at quick size: {record['verdict']})"
    return record["verdict"]


def provenance_line(record: dict[str, Any]) -> str:
    """Which code the numbers stand for: its code hash, and what vouches for them when that code moves: the
    quick-size fingerprint (`kqv_lab.experiments.reproduction`), or for timings only that code, on the machine named."""
    from .provenance import TIMED

    code = record.get("code") or {}
    if not code.get("hash"):
        return f"**Code.** {code.get('recorded', 'not recorded (results from before provenance was kept)')}."
    line = f"**Code.** Code hash `{code['hash'][:12]}` (the experiment's module and the kqv modules it imports)."
    numbers = len(((code.get("quick") or {}).get("numbers")) or {})
    if record["experiment"] in TIMED and not record.get("quick"):
        cpu = ((record.get("provenance") or {}).get("cpu") or {}).get("model") or "an unrecorded CPU"
        line += (
            f" Its timings were measured on {cpu} ({record['machine'].get('cpus', '?')} cores) and stand only for "
            "code with this hash: no fingerprint can vouch for a time."
        )
    elif numbers:
        line += (
            f" Its quick-size fingerprint holds {numbers} numbers that every CPU kernel set computes alike and that "
            "move with the seed: changed code keeps the result while its quick run reproduces them."
        )
    return line


def stale_section(record: dict[str, Any]) -> list[str]:
    """'Needs a rerun' with why, for a full-size result of a `TIMED` experiment whose timed code changed since it
    ran (`provenance.timing_change`); nothing for any other record."""
    from . import get
    from .provenance import TIMED, code_hash, timing_change

    if record.get("quick") or record["experiment"] not in TIMED:
        return []
    why = timing_change(record, code_hash(get(record["experiment"]).module)["hash"])
    if why is None:
        return []
    return [f"**Needs a rerun: {why}.** Its numbers describe the code it ran; rerun: `{record['command']}`."]


def is_stale(record: dict[str, Any]) -> bool:
    """Whether `stale_section` marks the record as needing a rerun."""
    return bool(stale_section(record))


# a run estimated to take longer than this on the machine the record was made on is suggested for a GPU
GPU_AFTER_SECONDS = 3600
DECIDING_RULE = (
    "For each inconclusive check: the fewest seeds (or timed repeats) whose 95% interval would clear its threshold "
    "if the estimate and its spread over seeds stayed as measured (the same Student-t interval the check uses), "
    "and the command that would run them. The time is this record's, scaled by that number; a run estimated at "
    f"over {GPU_AFTER_SECONDS // 3600} hour on the CPU it ran on is marked for a GPU."
)


def deciding_runs(record: dict[str, Any]) -> list[str]:
    """One Markdown bullet for each inconclusive check of a record: how many seeds (or repeats) would decide it and
    the command that would run them (on a GPU when the record's CPU would need over `GPU_AFTER_SECONDS`), or why
    more seeds would not."""
    lines = []
    for check in record["checks"]:
        if outcome(check) != "inconclusive":
            continue
        plan = check.get("to_decide")
        if plan is None:
            said = f"not computed: `kqv experiment rejudge {record['experiment']}` computes it"
        elif plan["n"] is None:
            said = plan["reason"]
        else:
            said = _deciding_run(record, plan)
        lines.append(f"- *{check['what']}*: {said}")
    return lines


def _deciding_run(record: dict[str, Any], plan: dict[str, Any]) -> str:
    """'N seeds would decide it ...: `command` (about T on C cores[: on a GPU])' for a check's `to_decide`."""
    n, now, config = plan["n"], plan["now"], record["config"]
    if now == config.get("seeds"):
        unit, option = "seeds", ["--seeds", str(n)]
    else:
        field = next((k for k, v in config.items() if "repeat" in k and v == now), None)
        if field is None:
            return f"n={n} (now {now}) would decide it, but n counts neither the seeds nor the repeats of its config"
        unit, option = f"repeats ({field})", ["--set", f"{field}={n}"]
    seconds = record["seconds"] * n / now
    gpu = seconds > GPU_AFTER_SECONDS
    command = _with_option(record["command"], option + (["--device", "cuda"] if gpu else []))
    way = "holds" if plan["as"] == "holds" else "does not hold"
    said = f"{plan['reason']}. " if plan["reason"] else ""
    cores = record["machine"].get("cpus", "?")
    return (
        f"{said}{n} {unit} (now {now}) would decide that it {way}: `{command}` (about {_duration(seconds)} on "
        f"the {cores}-core CPU it ran on" + ("; so on a GPU)" if gpu else ")")
    )


def _with_option(command: str, option: list[str]) -> str:
    """`command` with `option` (['--seeds', N], ['--set', 'field=N'], or with ['--device', D] after) set: an
    earlier value of the same option (or field) replaced."""
    words = shlex.split(command)
    for flag, value in zip(option[::2], option[1::2]):
        at = _option_at(words, flag, value)
        if at is not None:
            words[at + 1] = value
        elif flag == "--device":  # where `runner.command_line` writes it: last
            words += [flag, value]
        else:  # after `kqv experiment run NAME [--quick]`
            end = 5 if words[4:5] == ["--quick"] else 4
            words[end:end] = [flag, value]
    return shlex.join(words)


def _option_at(words: list[str], flag: str, value: str) -> int | None:
    """Where `words` already give `flag` (for --set, the same field as `value`), or None."""
    for k in range(len(words) - 1):
        if words[k] == flag and (flag != "--set" or words[k + 1].partition("=")[0] == value.partition("=")[0]):
            return k
    return None


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= GPU_AFTER_SECONDS else f"{max(1, round(seconds / 60))} min"


def write_report(record: dict[str, Any], experiment: Experiment) -> str:
    """The text of report.md for a results.json record."""
    machine = record["machine"]
    load = machine.get("load_average_before")
    parts = [
        f"# `{record['experiment']}`: {headline(record)}",
        *([f"**{record['smoke_test']}.**"] if record.get("smoke_test") else []),
        f"**The claim, as the lecture makes it.** {record['lecture']}",
        f"**How it was tested.** {record['method']} Seeds: {', '.join(map(str, record['seeds']))}.",
        f"**Command.** `{record['command']}` ({record['seconds'] / 60:.1f} min on {machine['cpus']} cores"
        f"{_cpu_model(record)}, "
        f"{machine['torch_threads']} torch thread(s); load average {load[0] if load else 'unknown'} at the start"
        + (": a loaded machine, so times are upper bounds" if load and load[0] > machine["cpus"] else "")
        + ").",
        provenance_line(record),
        *stale_section(record),
        "## Results",
        markdown_table(record["table"]["columns"], record["table"]["rows"]),
        *[f"![{name}]({name})" for name in record["plots"]],
    ]
    if experiment.notes is not None:
        parts.append(experiment.notes(record["results"]))
    parts += [
        f"## Verdict: {headline(record)}",
        "Each check's threshold was written in the experiment module "
        f"(`kqv_lab/experiments/{experiment.module.rpartition('.')[2]}.py`) before it ran; {VERDICT_RULE}.",
        markdown_table(CHECK_COLUMNS, check_rows(record)),
        *deciding_section(record),
        *revisions_section(experiment),
    ]
    return "\n\n".join(parts) + "\n"


def _cpu_model(record: dict[str, Any]) -> str:
    """' of MODEL' for the CPU a record ran on, when its provenance names it."""
    model = ((record.get("provenance") or {}).get("cpu") or {}).get("model")
    return f" of {model}" if model else ""


def deciding_section(record: dict[str, Any], rule: bool = True) -> list[str]:
    """'What would decide the inconclusive checks' (with `DECIDING_RULE` when `rule`) and its bullets
    (`deciding_runs`), or nothing when no check is inconclusive."""
    lines = deciding_runs(record)
    if not lines:
        return []
    return [f"**What would decide the inconclusive checks.**{f' {DECIDING_RULE}' if rule else ''}", "\n".join(lines)]


def revisions_section(experiment: Experiment) -> list[str]:
    """'Changed after a trial': how the experiment's design or checks changed after a run had been seen, so a
    reader can weigh the verdict (`REVISIONS` of the experiment module), or nothing."""
    if not experiment.revisions:
        return []
    return ["**Changed after a trial.**", "\n".join(f"- {line}" for line in experiment.revisions)]
