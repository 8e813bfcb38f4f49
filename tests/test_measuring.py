"""kqv_lab.measuring, the one record of where a measurement came from: a benchmark's JSON names the machine (the CPU's
model from /proc/cpuinfo where there is one, its kernel flags and cores, torch's threads), the command, the date,
the commit and the seeds, and is written atomically; an experiment's results.json takes its machine from the same
place. And no benchmark script or test edits `sys.path` or reaches for the harness the benchmarks once had."""

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from kqv.errors import ConfigError
from kqv_lab.measuring import command, machine, write_json, write_record

ROOT = Path(__file__).resolve().parents[1]


def test_a_benchmark_record_names_the_machine_the_command_the_date_the_commit_and_the_seeds(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "x.py"), "--quick"])
    started = time.perf_counter() - 2.0
    path = write_record(tmp_path / "out" / "x.json", {"rows": [1], "date": "given"}, seeds=(0, 1), started=started)
    record = json.loads(path.read_text())
    assert record["rows"] == [1] and record["date"] == "given"  # what the record gives wins
    assert record["command"] == "python benchmarks/x.py --quick" and record["seeds"] == [0, 1]
    assert record["total_seconds"] >= 2.0 and len(record["load_average_end"]) == 3
    assert set(record["git"]) == {"commit", "dirty"}
    found = record["machine"]
    assert found["cores"] >= 1 and found["torch_threads"] >= 1 and isinstance(found["flags"], list)
    assert isinstance(found["gpus"], list) and found["torch"]
    if Path("/proc/cpuinfo").exists():
        assert found["model"] not in ("x86_64", "aarch64", "")


def test_the_date_is_added_when_the_record_has_none(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["kqv", "experiment", "run", "x"])
    record = json.loads(write_record(tmp_path / "x.json", {}).read_text())
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d .*", record["date"])
    assert record["command"] == "kqv experiment run x" and "seeds" not in record
    assert command(["/elsewhere/y.py", "a b"]) == "python /elsewhere/y.py 'a b'"


def test_a_record_that_cannot_be_written_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = write_json(tmp_path / "x.json", {"a": Path("p"), "t": __import__("torch").tensor([1, 2])})
    assert json.loads(path.read_text()) == {"a": "p", "t": [1, 2]}
    with pytest.raises(TypeError, match="JSON-serialisable, got object"):
        write_json(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": "p", "t": [1, 2]} and os.listdir(tmp_path) == ["x.json"]


def test_a_record_is_never_written_over_what_is_not_a_regular_file(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "kept.txt").write_text("kept")
    os.mkfifo(tmp_path / "fifo")
    for target in (tmp_path / "folder", tmp_path / "fifo"):
        with pytest.raises(ConfigError, match="is not a regular file"):
            write_json(target, {"a": 1})
    assert (tmp_path / "folder" / "kept.txt").read_text() == "kept" and (tmp_path / "fifo").is_fifo()


def test_an_experiment_records_its_machine_as_the_benchmarks_do(monkeypatch):
    from kqv_lab.experiments import runner

    recorded = runner.machine(3, ([1.0, 1.0, 1.0], [2.0, 2.0, 2.0]))
    assert recorded["torch_threads"] == 3 and recorded["load_average_before"] == [1.0, 1.0, 1.0]
    shared = machine()
    assert {key: recorded[key] for key in ("model", "flags", "cores", "gpus")} == {
        key: shared[key] for key in ("model", "flags", "cores", "gpus")
    }
    assert recorded["cpus"] == shared["cores"]  # the name earlier records and the reports read


# what edits the import path in code, and the harness the benchmarks had before kqv_lab.measuring
PATH_EDIT = re.compile(
    r"\bsys\.path\s*(\.\s*(insert|append|extend)\b|\+=|=[^=]|\[[^\]]*\]\s*=)|\b(syspath_prepend|addsitedir)\("
)
OLD_HARNESS = re.compile(r"\bsupport[./]harness\b")


def path_edits(*folders: Path) -> list[str]:
    """Each line of a Python or shell file under `folders` that edits sys.path or imports the old harness."""
    found = []
    for folder in folders:
        for path in sorted([*folder.rglob("*.py"), *folder.rglob("*.sh")]):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if PATH_EDIT.search(line) or OLD_HARNESS.search(line):
                    found.append(f"{path.relative_to(folder.parent)}:{number}: {line.strip()}")
    return found


def test_no_benchmark_script_or_test_edits_sys_path_or_imports_the_old_harness():
    assert path_edits(ROOT / "benchmarks", ROOT / "tests") == []
    assert not (ROOT / "benchmarks" / "support").exists()


@pytest.mark.parametrize(
    "line",
    [
        "sys.path" + ".insert(0, str(Path(__file__).parent))",
        "    sys.path" + ".append('benchmarks')",
        "python -c 'import sys; sys.path" + '.insert(0, "benchmarks"); import x\'',
        "sys.path" + " += ['x']",
        "sys.path" + "[:0] = ['x']",
        "from support" + ".harness import write_record",
        "    monkeypatch.syspath" + "_prepend(str(ROOT))",
    ],
)
def test_the_scan_finds_a_planted_path_edit_or_old_harness(tmp_path, line):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "ok.py").write_text("import sys\nprint(sys.path[0], sys.path == [])\n")
    assert path_edits(tmp_path / "benchmarks") == []
    (tmp_path / "benchmarks" / "x.sh" if line.startswith("python") else tmp_path / "benchmarks" / "x.py").write_text(
        f"import sys\n{line}\n"
    )
    assert len(path_edits(tmp_path / "benchmarks")) == 1
