"""The configs kqv ships: the top-level configs/ copies are the packaged ones the CLI reads (`--config quick` loads
src/kqv/configs/; configs/ is a symlink to it); no config forces bf16 (the CPU picks it)."""

from __future__ import annotations

import tomllib
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
            f"configs/{name} differs from src/kqv/configs/{name}; the CLI reads the packaged copy"
        )


@pytest.mark.parametrize("name", ["quick", "lstm"])
def test_the_mt_configs_do_not_force_bf16(name):
    """bf16 autocast is emulated, several times slower, on CPUs without bf16 instructions: "auto" picks it only where
    the CPU has them (kqv.train.precision)."""
    config = load_run_config(str(PACKAGED / f"mt-{name}.toml"), [])
    assert config.train.precision == "auto"


@pytest.mark.parametrize("name", sorted(p.name for p in REPO_CONFIGS.glob("*.toml")))
def test_no_shipped_config_forces_bf16(name):
    """Every shipped config leaves the choice to the CPU: the README's main job in forced bf16 ran at 2,700
    tokens/s on an AVX512F-only Xeon, a quarter of its speed where bf16 is native."""
    precision = tomllib.loads((REPO_CONFIGS / name).read_text(encoding="utf-8")).get("train", {}).get("precision")
    assert precision in (None, "auto", "fp32"), f"configs/{name} forces precision {precision!r}"
