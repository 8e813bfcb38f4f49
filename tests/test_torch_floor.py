"""pyproject's torch floor is at least what the code needs: every torch feature kqv uses without a fallback
(`kqv.nn.environment.TORCH_FEATURES`) exists from that version on, and those with a fallback take it."""

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from kqv.nn.environment import TORCH_FEATURES
from kqv.train.distributed import no_buffer_sync

ROOT = Path(__file__).resolve().parents[1]


def torch_floor() -> Version:
    """The lowest torch pyproject's dependency allows (its `>=` bound)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (torch,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "torch"]
    (floor,) = [Version(s.version) for s in torch.specifier if s.operator == ">="]
    return floor


def test_the_floor_is_at_least_every_required_feature_s_first_torch():
    required = {what: Version(since) for what, since, fallback in TORCH_FEATURES if fallback == "required"}
    assert required, "the table names the features that set the floor"
    for what, since in required.items():
        assert torch_floor() >= since, f"pyproject allows torch {torch_floor()}, but {what} needs {since}"


def test_ddp_skips_buffer_sync_by_the_option_the_installed_ddp_takes():
    class Before213:  # DDP's signature before forward_sync_buffers
        def __init__(self, module, broadcast_buffers=True, find_unused_parameters=False): ...

    class From213:
        def __init__(self, module, broadcast_buffers=True, forward_sync_buffers=None): ...

    assert no_buffer_sync(Before213) == {"broadcast_buffers": False}
    assert no_buffer_sync(From213) == {"forward_sync_buffers": False}
