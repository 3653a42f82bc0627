"""Typed field readers for the validation loaders (published runs, Calculon oracle, digests).

Each reader takes the raw mapping a TOML or JSON document parsed into, the key, a ``where``
prefix for the message and a :class:`~blueprinting.errors.ProblemCollector`. A bad value is
reported (``<where>.<key> must be ...``) and replaced by a neutral fallback, so that a loader
carries on and reports every problem of a file at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Protocol, TypeVar

from blueprinting.errors import ConfigError, ProblemCollector
from blueprinting.mapping.flat_keys import FlatValue

_E = TypeVar("_E", bound=StrEnum)


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


_Run = TypeVar("_Run", bound=_HasId)


class MappingNoun(StrEnum):
    """What a nested mapping is called in its document's own words."""

    TOML_TABLE = "a table"
    JSON_OBJECT = "an object"


def fixture_path(name: str) -> Path:
    """``tests/validation/fixtures/<name>`` of the checkout this package is in."""
    return Path(__file__).resolve().parents[3] / "tests" / "validation" / "fixtures" / name


def run_tables(
    path: Path,
    what: str,
    problems: ProblemCollector,
    build: Callable[[Mapping[str, object], str, ProblemCollector], _Run | None],
) -> list[_Run]:
    """The ``[[run]]`` tables of a fixture file, read safely (``mapping.documents``), each
    built by ``build(table, where, problems)``; duplicate ids are one more problem."""
    from blueprinting.mapping.documents import parse_toml, read_text

    source = str(path)
    document = parse_toml(read_text(path, what=what), source)
    raw_runs = document.get("run") if isinstance(document, dict) else None
    if not isinstance(raw_runs, list):
        raise ConfigError(["expected [[run]] tables"], source=source)
    runs: list[_Run] = []
    for index, raw in enumerate(raw_runs):
        where = f"run[{index}]"
        run = build(toml_table(raw, where, problems), where, problems)
        if run is not None:
            runs.append(run)
    ids = [run.id for run in runs]
    duplicates = sorted({run_id for run_id in ids if ids.count(run_id) > 1})
    if duplicates:
        problems.add(f"duplicate run ids: {', '.join(duplicates)}")
    return runs


def toml_table(value: object, where: str, problems: ProblemCollector) -> Mapping[str, object]:
    """``value`` as a TOML table (:func:`as_mapping`), the problem reported otherwise."""
    return as_mapping(value, where, problems, noun=MappingNoun.TOML_TABLE)


def as_mapping(
    value: object, where: str, problems: ProblemCollector, *, noun: MappingNoun
) -> Mapping[str, object]:
    """``value`` when it is a mapping, else ``{}`` and a problem."""
    if not isinstance(value, dict):
        problems.add(f"{where} must be {noun}")
        return {}
    return value


def integer(
    raw: Mapping[str, object], key: str, where: str, problems: ProblemCollector, *, fallback: int
) -> int:
    """``raw[key]`` when it is an ``int`` (not a ``bool``), else ``fallback`` and a problem."""
    value = raw.get(key)
    if type(value) is not int:
        problems.add(f"{where}.{key} must be an integer, got {value!r}")
        return fallback
    return value


def boolean(raw: Mapping[str, object], key: str, where: str, problems: ProblemCollector) -> bool:
    value = raw.get(key)
    if type(value) is not bool:
        problems.add(f"{where}.{key} must be a boolean, got {value!r}")
        return False
    return value


def string(raw: Mapping[str, object], key: str, where: str, problems: ProblemCollector) -> str:
    value = raw.get(key)
    if not isinstance(value, str):
        problems.add(f"{where}.{key} must be a string, got {value!r}")
        return ""
    return value


def number_or_none(
    raw: Mapping[str, object], key: str, where: str, problems: ProblemCollector
) -> float | None:
    """``raw[key]`` as a float; ``None`` when absent (or, with a problem, not a number)."""
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        problems.add(f"{where}.{key} must be a number, got {value!r}")
        return None
    return float(value)


def positive_number(
    raw: Mapping[str, object], key: str, where: str, problems: ProblemCollector
) -> float:
    value = number_or_none(raw, key, where, problems)
    if value is None or value <= 0:
        problems.add(f"{where}.{key} must be a positive number, got {raw.get(key)!r}")
        return 1.0
    return value


def strings(
    raw: Mapping[str, object], key: str, where: str, problems: ProblemCollector
) -> tuple[str, ...]:
    """A list of strings; absent is empty."""
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        problems.add(f"{where}.{key} must be a list of strings")
        return ()
    return tuple(str(item) for item in value)


def enum_or_none(
    enum: type[_E], raw: Mapping[str, object], key: str, where: str, problems: ProblemCollector
) -> _E | None:
    """A member of ``enum``; ``None`` when absent (or, with a problem listing the choices,
    unknown)."""
    value = raw.get(key)
    if value is None:
        return None
    try:
        return enum(str(value))
    except ValueError:
        choices = ", ".join(member.value for member in enum)
        problems.add(f"{where}.{key} must be one of {choices}, got {value!r}")
        return None


def choice(
    enum: type[_E], raw: Mapping[str, object], key: str, where: str, problems: ProblemCollector
) -> _E:
    """A required member of ``enum``: a string, else (with a problem) the first member."""
    value = string(raw, key, where, problems)
    try:
        return enum(value)
    except ValueError:
        problems.add(f"{where}.{key}: unknown value {value!r}")
        return next(iter(enum))


def flat_key_values(
    raw: Mapping[str, object], where: str, problems: ProblemCollector
) -> dict[str, FlatValue]:
    """Megatron-LM flat keys as written: every value an integer, boolean, number or string."""
    keys: dict[str, FlatValue] = {}
    for key, value in raw.items():
        if isinstance(value, bool | int | float | str):
            keys[key] = value
        else:
            problems.add(f"{where}.{key} must be an integer, boolean, number or string")
    return keys
