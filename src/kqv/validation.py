"""One validator for every kqv config dataclass, driven by its field annotations.

A config class derives from `Config` and is a `@dataclass`; making one checks every field against its annotation
(`int`, `float`, `bool`, `str`, `Literal[...]`, `X | None`, `tuple[...]`, `dict[...]`, a nested config), then
runs the class's own `check()` for what annotations cannot say (ranges, fields that constrain each other).
`build(cls, values)` makes one from a dict (a TOML section): unknown options and missing required ones are
errors that list the valid options, nested configs are built from their sub-dicts, and the string "none" stands
for None, but only in a field whose annotation allows None (TOML has no null; a choice such as
`position = "none"` stays a string).

This module sits at the bottom of kqv (the model's `kqv.nn` imports it), so it imports nothing from kqv but
`kqv.errors`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import types
import typing
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Literal

from .errors import ConfigError, ConfigTypeError


class Config:
    """Base of every config dataclass: fields checked against their annotations when the config is made.

    `section` names the TOML section a job config lives in (e.g. "data"): messages then say `data.context`, and an
    unknown option is reported as in `[data]`. Configs without a section are named by their class.
    """

    section: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        check_fields(self)
        self.check()

    def check(self) -> None:
        """Checks beyond the annotations (ranges, combinations of fields); raise ConfigError. None by default."""

    def qualified(self, name: str) -> str:
        """The field's name as messages show it: `data.context` for a config of section "data"."""
        return f"{self.section}.{name}" if self.section else name

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain values (tuples as lists), ready for JSON or TOML."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Any:
        return build(cls, values)


def did_you_mean(unknown: Sequence[str], valid: Iterable[str]) -> str:
    """ " (did you mean 'steps'?)": the valid names closest to the unknown ones (difflib's ratio, at least 0.6), for a
    refusal of a misspelled option; empty where none is close."""
    valid = list(valid)
    close = [match for name in unknown for match in difflib.get_close_matches(str(name), valid, n=1)]
    return f" (did you mean {' or '.join(map(repr, dict.fromkeys(close)))}?)" if close else ""


def build(cls: type, values: dict[str, Any], label: str | None = None) -> Any:
    """`cls(**values)`, with unknown or missing options reported by name and "none" read as None where allowed."""
    if not isinstance(values, dict):
        raise ConfigTypeError(f"{label or _label(cls)} must be a table of options, got {type(values).__name__}")
    label = label or _label(cls)
    hints = field_types(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown {label} option(s) {unknown}{did_you_mean(unknown, fields)}; valid options are {sorted(fields)}"
        )
    missing = [name for name, f in fields.items() if name not in values and _required(f)]
    if missing:
        raise ConfigError(f"{label} needs the option(s) {missing}")
    values = {name: None if value == "none" and allows_none(hints[name]) else value for name, value in values.items()}
    return cls(**values)


def check_fields(config: Any) -> None:
    """Check (and normalise: lists become tuples, sub-dicts nested configs) every field against its annotation."""
    hints = field_types(type(config))
    qualified = getattr(config, "qualified", lambda name: name)
    for f in dataclasses.fields(config):
        value = check_value(qualified(f.name), getattr(config, f.name), hints[f.name])
        object.__setattr__(config, f.name, value)


def check_value(name: str, value: Any, annotation: Any) -> Any:
    """`value` if it fits `annotation` (converted where the annotation says how); ConfigError otherwise."""
    origin, options = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin is Literal:
        if value not in options:
            raise ConfigError(f"{name} must be one of {list(options)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in options:
            return None
        alternatives = [t for t in options if t is not type(None)]
        return (
            check_value(name, value, alternatives[0]) if len(alternatives) == 1 else _any_of(name, value, alternatives)
        )
    if origin is tuple:
        return _check_tuple(name, value, options)
    if origin in (list, dict):
        return _check_container(name, value, origin, options)
    if dataclasses.is_dataclass(annotation):
        return (
            build(annotation, value, f"[{name}]")
            if isinstance(value, dict)
            else _check_instance(name, value, annotation)
        )
    return _check_scalar(name, value, annotation)


def allows_none(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in typing.get_args(
        annotation
    )


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """The resolved annotations of a dataclass's fields (string annotations evaluated once per class)."""
    return typing.get_type_hints(cls)


def check_at_least(name: str, value: float, minimum: float) -> None:
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")


def check_positive(name: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{name} must be positive, got {value}")


SEED_LIMIT = 2**63  # torch.manual_seed takes [-2**63, 2**64); kqv's seeds are the non-negative int64s


def check_seed(name: str, seed: Any) -> int:
    """`seed` if it is an integer from 0 to 2**63 - 1 (what every torch generator and an int64 take), else a
    one-line ConfigError naming `name`: a larger one would end in torch's overflow traceback, after files were
    written. Training seeds (`train.seed`) and generation seeds (`--seed`) share it."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigTypeError(f"{name} must be an integer from 0 to 2**63 - 1, got {type(seed).__name__} {seed!r}")
    if not 0 <= seed < SEED_LIMIT:
        raise ConfigError(f"{name} must be an integer from 0 to 2**63 - 1, got {seed}")
    return seed


def _check_scalar(name: str, value: Any, expected: type) -> Any:
    if expected is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigTypeError(f"{name} must be a finite number, got {type(value).__name__} {value!r}")
        return value
    if expected is int and isinstance(value, bool) or not isinstance(value, expected):
        raise ConfigTypeError(f"{name} must be {expected.__name__}, got {type(value).__name__} {value!r}")
    return value


def _check_tuple(name: str, value: Any, options: tuple) -> tuple:
    if not isinstance(value, (tuple, list)):
        raise ConfigTypeError(f"{name} must be a list, got {type(value).__name__} {value!r}")
    if len(options) == 2 and options[1] is Ellipsis:
        return tuple(check_value(f"{name}[{i}]", item, options[0]) for i, item in enumerate(value))
    if len(value) != len(options):
        raise ConfigError(f"{name} must have {len(options)} values, got {len(value)}: {list(value)}")
    return tuple(check_value(f"{name}[{i}]", item, t) for i, (item, t) in enumerate(zip(value, options)))


def _check_container(name: str, value: Any, origin: type, options: tuple) -> Any:
    if not isinstance(value, origin):
        raise ConfigTypeError(
            f"{name} must be a {'table' if origin is dict else 'list'}, got {type(value).__name__} {value!r}"
        )
    if origin is list and options:
        return [check_value(f"{name}[{i}]", item, options[0]) for i, item in enumerate(value)]
    if origin is dict and options:
        return {key: check_value(f"{name}.{key}", item, options[1]) for key, item in value.items()}
    return value


def _check_instance(name: str, value: Any, expected: type) -> Any:
    if not isinstance(value, expected):
        raise ConfigTypeError(
            f"{name} must be a {expected.__name__} or a table of its options, got {type(value).__name__}"
        )
    return value


def _any_of(name: str, value: Any, alternatives: list) -> Any:
    for annotation in alternatives:
        try:
            return check_value(name, value, annotation)
        except ConfigError:
            continue
    choices = [choice for t in alternatives for choice in described(t)]
    names = " or ".join(choices) if len(choices) < 3 else ", ".join(choices[:-1]) + " or " + choices[-1]
    raise ConfigTypeError(f"{name} must be {names}, got {type(value).__name__} {value!r}")


def described(annotation: Any) -> list[str]:
    """How a message names what an annotation admits: a Literal by its values (`"auto"`), a bool by `true` and
    `false` (as TOML writes them), a type by its name."""
    if typing.get_origin(annotation) is Literal:
        return [json.dumps(v) if isinstance(v, str) else repr(v) for v in typing.get_args(annotation)]
    if annotation is bool:
        return ["true", "false"]
    return [getattr(annotation, "__name__", str(annotation))]


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _label(cls: type) -> str:
    section = getattr(cls, "section", None)
    return f"[{section}]" if section else cls.__name__


def _plain(value: Any) -> Any:
    if isinstance(value, Config):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
