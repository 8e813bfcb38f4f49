"""The process topology is made in one module and handed down: `kqv.train.topology.Topology` alone reads torchrun's
`RANK`, `LOCAL_RANK` and `WORLD_SIZE`; the run directory, the model's construction, the data and the Trainer are
given it."""

import ast
from pathlib import Path

import torch

from kqv.train.topology import Topology

SRC = Path(__file__).resolve().parents[1] / "src" / "kqv"
TORCHRUN_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK"}
THE_TOPOLOGY = Path("train/topology.py")


def environment_reads(root: Path) -> list[str]:
    """Every place under `root` (a package's source) outside the topology's module that names one of torchrun's
    variables in code (`os.environ.get("RANK")`, `os.getenv("WORLD_SIZE")`, `environ["LOCAL_RANK"]`, a
    tuple of them...): a string constant spelling one exactly, which docstrings never do."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root) == THE_TOPOLOGY:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in TORCHRUN_VARIABLES:
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.value}")
    return found


def test_no_module_but_the_topology_s_reads_rank_or_world_size_from_the_environment():
    assert (SRC / THE_TOPOLOGY).is_file()
    assert environment_reads(SRC) == []


def test_the_scan_finds_a_read_in_any_of_its_forms(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "topology.py").write_text('import os\nos.environ.get("RANK")\n')  # its one reader
    (tmp_path / "a.py").write_text('import os\nworld = int(os.environ.get("WORLD_SIZE", "1"))\n')
    (tmp_path / "b.py").write_text('import os\nos.getenv("LOCAL_RANK")\nos.environ["RANK"]\n"""RANK is read..."""\n')
    assert environment_reads(tmp_path) == ["a.py:2 WORLD_SIZE", "b.py:2 LOCAL_RANK", "b.py:3 RANK"]


def test_the_topology_is_torchrun_s_and_one_process_outside_it(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert Topology.of_process() == Topology(rank=0, local_rank=0, world_size=1)
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "3")  # a single process is rank 0, whatever else is set
    assert Topology.of_process() == Topology()
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    topology = Topology.of_process()
    assert (topology.rank, topology.local_rank, topology.world_size) == (3, 1, 4)
    assert topology.several and not topology.writes
    assert topology.device(torch.device("cuda")) == torch.device("cuda", 1)
    assert Topology(world_size=4).writes and not Topology().several
