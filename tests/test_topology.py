"""The process topology is made in one module and handed down: `kqv.train.topology.Topology` alone reads torchrun's
`RANK`, `LOCAL_RANK` and `WORLD_SIZE`, and alone asks torch.distributed for the rank or the world size; it is made
once per training, at a job's start (or at the Trainer given a plain path, the public entry), and the run
directory, the model's construction, the data, the memory check and the Trainer's parts are given it."""

import ast
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from kqv.errors import ConfigError
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


MAKERS = {"jobs/base.py", "train/trainer.py"}  # a job's start, and the Trainer given a path (the public entry)
ASKED = {"of_process": MAKERS, "get_rank": {str(THE_TOPOLOGY)}, "get_world_size": {str(THE_TOPOLOGY)}}


def second_truths(root: Path) -> list[str]:
    """Every call under `root` of `Topology.of_process` outside a job's start and the Trainer, and of
    torch.distributed's `get_rank` or `get_world_size` outside the topology's module: each a second answer to which
    process this is, besides the topology handed down."""
    found = []
    for path in sorted(root.rglob("*.py")):
        where = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
                if name in ASKED and where not in ASKED[name]:
                    found.append(f"{where}:{node.lineno} {name}")
    return found


def test_the_topology_is_made_at_a_job_s_start_and_the_rank_never_asked_of_torch_again():
    assert second_truths(SRC) == []


def test_the_scan_finds_a_second_topology_in_any_of_its_forms(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "jobs").mkdir()
    (tmp_path / "train" / "topology.py").write_text("import torch.distributed as dist\ndist.get_rank()\n")  # its own
    (tmp_path / "jobs" / "base.py").write_text("topology = Topology.of_process()\n")  # the job's start
    (tmp_path / "train" / "rundir.py").write_text("topology = topology or Topology.of_process()\n")
    (tmp_path / "a.py").write_text("from torch.distributed import get_world_size\nworld = get_world_size()\n")
    (tmp_path / "b.py").write_text('"""dist.get_rank() in words"""\nrank = torch.distributed.get_rank()\n')
    assert second_truths(tmp_path) == ["a.py:2 get_world_size", "b.py:2 get_rank", "train/rundir.py:1 of_process"]


def test_a_process_group_that_disagrees_with_the_topology_is_refused():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        Topology().check_group()  # rank 0 of 1, as the group says
        with pytest.raises(ConfigError, match="rank 0 of 1 in the process group it joined, but rank 1 of 2"):
            Topology(rank=1, local_rank=1, world_size=2).check_group()
    finally:
        dist.destroy_process_group()


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
