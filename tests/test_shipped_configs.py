"""The configs kqv ships: the top-level configs/ copies are the packaged ones the CLI reads (`--config quick` loads
src/kqv/configs/; configs/ is a symlink to it); the MT configs let the CPU pick bf16."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from kqv.jobs.mt import load_run_config

REPO_CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PACKAGED = resources.files("kqv") / "configs"


def test_the_repository_configs_are_the_packaged_ones():
    repo = sorted(p.name for p in REPO_CONFIGS.glob("*.toml"))
    packaged = sorted(p.name for p in PACKAGED.iterdir() if p.name.endswith(".toml"))
    assert repo == packaged
    for name in repo:
        assert (REPO_CONFIGS / name).read_text(encoding="utf-8") == (PACKAGED / name).read_text(encoding="utf-8"), (
            f"configs/{name} differs from src/kqv/configs/{name}; the CLI reads the packaged copy")


@pytest.mark.parametrize("name", ["quick", "lstm"])
def test_the_mt_configs_do_not_force_bf16(name):
    """bf16 autocast is emulated, several times slower, on CPUs without bf16 instructions: "auto" picks it only where
    the CPU has them (kqv.train.precision)."""
    config = load_run_config(str(PACKAGED / f"mt-{name}.toml"), [])
    assert config.train.precision == "auto"
