"""What `kqv experiment` does, as Python functions: list the claims, run one experiment or all of them in turn,
write the gallery page, and re-judge stored runs. The command line parses flags, calls these and prints what they
return; nothing here measures a number (that is the experiment modules' and `runner.run_experiment`'s work), so a
change here leaves every committed code hash as it is (`provenance.PRESENTATION`).

    from kqv_lab.experiments.actions import claims, run_experiments
    for name, claim in claims(): ...
    for position, record in run_experiments("all", quick=True, out="experiments"): ...
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from kqv.errors import OUT, RUN_EXPERIMENT, SEEDS, ConfigError, option
from kqv.train import refuse_writing_over, write_text

from . import get, names
from .base import Experiment
from .gallery import gallery
from .records import RESULTS_FILE
from .report import deciding_runs
from .reproduction import add_fingerprint
from .runner import expected_minutes, rejudge, run_experiment

ALL = "all"  # the name that stands for every experiment, in the lecture's order


def claims() -> list[tuple[str, str]]:
    """Every experiment's name and the claim it tests, in the lecture's order (`kqv experiment list`)."""
    return [(name, get(name).claim) for name in names()]


def planned_runs(name: str, quick: bool, overrides: Sequence[str], seeds: int | None) -> dict[str, list[str]]:
    """The experiments `name` names (`all`: every one) with the `field=value` overrides each takes (with `all`,
    those whose field its config has), every config checked before anything runs: an override no experiment
    has, a bad value or fewer than one seed is a ConfigError now rather than after hours of others' runs."""
    chosen = names() if name == ALL else [name]
    overrides = list(overrides)
    own = {n: own_overrides(get(n), overrides) if name == ALL else overrides for n in chosen}
    unknown = set(overrides) - {o for each in own.values() for o in each}
    if unknown:
        raise ConfigError(f"no experiment has the option(s) of {sorted(unknown)}; see each experiment's Config")
    for n in chosen:
        get(n).config(quick, own[n])
    if seeds is not None and seeds < 1:
        raise ConfigError(f"{option(SEEDS)} must be at least 1, got {seeds}")
    return own


def own_overrides(experiment: Experiment, overrides: Sequence[str]) -> list[str]:
    """The `field=value` overrides whose field the experiment's config has (for `run all`)."""
    return [o for o in overrides if o.partition("=")[0].strip() in experiment.options()]


def run_experiments(
    name: str,
    *,
    quick: bool = False,
    seeds: int | None = None,
    out: str | Path = "experiments",
    overrides: Sequence[str] = (),
    threads: int = 1,
    progress: bool = True,
    device: str = "cpu",
) -> Iterator[tuple[tuple[int, int], dict[str, Any]]]:
    """Run experiment `name`, or `all` of them one after another, into `out`; yield ((k, n), record) as each one
    finishes (its results.json record, `runner.run_experiment`). Everything is checked before the first runs
    (`planned_runs`); the progress of a run of several is weighted by each one's expected minutes."""
    plan = planned_runs(name, quick, overrides, seeds)
    return _run_planned(plan, quick, seeds, out, threads, progress, device)


def _run_planned(
    plan: dict[str, list[str]],
    quick: bool,
    seeds: int | None,
    out: str | Path,
    threads: int,
    progress: bool,
    device: str,
) -> Iterator[tuple[tuple[int, int], dict[str, Any]]]:
    work = [expected_minutes(n, quick) for n in plan]
    for k, (n, overrides) in enumerate(plan.items()):
        position = (k + 1, len(plan))
        record = run_experiment(
            n,
            quick=quick,
            seeds=seeds,
            out=out,
            overrides=overrides,
            threads=threads,
            progress=progress,
            device=device,
            position=position,
            share=(sum(work[:k]) / sum(work), work[k] / sum(work)),
        )
        yield position, record


def summary(record: dict[str, Any], position: tuple[int, int], out: str | Path) -> str:
    """The lines printed after an experiment: its place in the run, its verdict (labelled as a smoke test's when
    it was a quick run), each check's outcome, and what would decide each inconclusive one (`report.deciding_runs`)."""
    name, minutes = record["experiment"], record["seconds"] / 60
    verdict = f"smoke test only, checks read: {record['verdict']}" if record["quick"] else record["verdict"]
    lines = [f"[{position[0]}/{position[1]}] {name}: {verdict} ({minutes:.1f} min) -> {out}/{name}/report.md"]
    lines += [
        f"  [{check.get('outcome', check['holds'])}] {check['what']}: {check['figure']}" for check in record["checks"]
    ]
    lines += [f"  to decide {line.removeprefix('- ')}" for line in deciding_runs(record)]
    return "\n".join(lines)


def write_gallery(directory: str | Path, page: str | Path) -> Path:
    """Write the gallery page `page` (Markdown) of every experiment's results found in `directory`, atomically; a
    page that is one of the results' files, or not a regular file, is refused (`refuse_writing_over`)."""
    page = Path(page)
    results = sorted(Path(directory).glob(f"*/{RESULTS_FILE}")) if Path(directory).is_dir() else []
    reads = [(f"the results of {path.parent.name}, in {directory}", path.parent) for path in results]
    refuse_writing_over(page, reads, option(OUT))
    text = gallery(directory, page)
    page.parent.mkdir(parents=True, exist_ok=True)
    write_text(page, text)
    return page


def stored_runs(name: str, directory: str | Path) -> list[str]:
    """The experiments with a stored run in `directory`: `name`, or (`all`) every one found there. An unknown
    name, or no runs at all, is refused."""
    directory = Path(directory)
    if name != ALL:
        get(name)  # an unknown name is a clear error
    chosen = [n for n in names() if (directory / n / RESULTS_FILE).is_file()] if name == ALL else [name]
    if not chosen:
        raise ConfigError(
            f"no experiment results in {directory}; run {option(RUN_EXPERIMENT, name='NAME', out=str(directory))} first"
        )
    return chosen


def rejudge_runs(name: str, directory: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Re-judge the stored run of experiment `name` (`all`: every run found) in `directory` from its numbers
    (`runner.rejudge`); yield (name, record) for each. An unknown name, or no runs at all, is refused first."""
    chosen = stored_runs(name, directory)
    return ((n, rejudge(Path(directory) / n)) for n in chosen)


def fingerprint_runs(
    name: str, directory: str | Path, commit: str | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Store in the stored run of `name` (`all`: every run found) in `directory` its quick-size fingerprint, made
    by the code that made the run: today's, or that of `commit` (`reproduction.add_fingerprint`); yield (name,
    record) for each."""
    chosen = stored_runs(name, directory)
    return ((n, add_fingerprint(Path(directory) / n, commit)) for n in chosen)
