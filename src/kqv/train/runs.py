"""Run configs shared by every job (lm, mt, mlm, cls): TOML files with `section.key=value` overrides."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import tomli_w


def read_config_values(path: str | Path, overrides: list[str] = (), examples: str = "configs/") -> dict[str, Any]:
    """The sections of a TOML run config with overrides applied; the string "none" stands for None."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no config file at {path}; see {examples} for examples")
    values = tomllib.loads(path.read_text())
    for override in overrides:
        apply_override(values, override)
    return none_for_string_none(values)


def apply_override(values: dict[str, Any], override: str) -> None:
    """Set `section.key=value` in values; the value is TOML (`200`, `"rope"`, `true`) or a bare string."""
    key, sep, raw = override.partition("=")
    section, dot, name = key.strip().partition(".")
    if not sep or not dot or not name:
        raise ValueError(f"override {override!r} must look like section.key=value, e.g. train.steps=200")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare string such as data.path=input.txt
    values.setdefault(section, {})[name] = value


def none_for_string_none(values: dict[str, Any]) -> dict[str, Any]:
    """TOML can't say None; the string "none" means it (e.g. --set sample.top_k=none)."""
    return {k: none_for_string_none(v) if isinstance(v, dict) else (None if v == "none" else v)
            for k, v in values.items()}


def toml_text(values: dict[str, Any]) -> str:
    """TOML of a run config: None values dropped (TOML has no null), tuples written as lists."""
    return tomli_w.dumps(_toml_ready(values))


def _toml_ready(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _toml_ready(v) if isinstance(v, dict) else list(v) if isinstance(v, tuple) else v
            for k, v in values.items() if v is not None}
