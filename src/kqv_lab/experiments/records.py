"""An experiment's output directory: its record (`results.json`, every number a run measured and how it was judged)
and the report drawn from it (`report.md`), written atomically, read back. Below the runner and the reproduction
rule, which both read and write records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kqv.errors import RUN_EXPERIMENT, option
from kqv.train import write_atomically

from ..measuring import write_json
from . import get
from .report import write_report

RESULTS_FILE, REPORT_FILE = "results.json", "report.md"


def write_record(directory: Path, record: dict[str, Any]) -> None:
    """Write a record's results.json and the report.md drawn from it, each atomically (a reader sees the old file
    or the new one; a full disk leaves the old one)."""
    write_json(directory / RESULTS_FILE, record)
    write_atomically(directory / REPORT_FILE, write_report(record, get(record["experiment"])).encode("utf-8"))


def load_record(directory: str | Path) -> dict[str, Any]:
    """The results.json of an experiment's output directory."""
    path = Path(directory) / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no {RESULTS_FILE} in {directory}; run {option(RUN_EXPERIMENT, name='NAME', out='...')} first"
        )
    return json.loads(path.read_text(encoding="utf-8"))
