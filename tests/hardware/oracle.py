"""Locating Calculon's oracle files (``shared/reference``) for the hardware tests.

Order: ``BLUEPRINTING_CALCULON_ORACLE`` (the JSON file; the per-layer file sits beside it),
``BLUEPRINTING_SHARED`` (a ``shared`` directory), then a ``shared/reference`` directory next to
one of this file's parents. Tests skip when none exists (a fresh CI clone has no ``shared``).
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path

import pytest

from blueprinting.validation.calculon import default_oracle_path

ORACLE_NAME = "calculon_oracle.json"
LAYERS_NAME = "calculon_oracle_layers.json.gz"

# Oracle record and layer values are JSON: nested dicts / lists of numbers and strings.
Json = dict[str, object]


def oracle_path() -> Path | None:
    """The oracle the whole suite reads (``validation.calculon.default_oracle_path``)."""
    return default_oracle_path()


@cache
def _records() -> tuple[Json, ...]:
    path = oracle_path()
    assert path is not None
    loaded = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(loaded, list)
    return tuple(loaded)


@cache
def _layers() -> dict[str, list[Json]]:
    path = oracle_path()
    assert path is not None
    with gzip.open(path.with_name(LAYERS_NAME), "rt", encoding="utf-8") as handle:
        loaded = json.load(handle)
    assert isinstance(loaded, dict)
    return loaded


def oracle_records() -> tuple[Json, ...]:
    path = oracle_path()
    if path is None or not path.is_file():
        pytest.skip(f"Calculon oracle {ORACLE_NAME} not found (set BLUEPRINTING_CALCULON_ORACLE)")
    return _records()


def oracle_layers() -> dict[str, list[Json]]:
    path = oracle_path()
    if path is None or not path.with_name(LAYERS_NAME).is_file():
        pytest.skip(f"Calculon per-layer oracle {LAYERS_NAME} not found")
    return _layers()


def table(value: object) -> Json:
    assert isinstance(value, dict)
    return value


def number(value: object) -> float:
    assert isinstance(value, int | float)
    return float(value)


def integer(value: object) -> int:
    assert isinstance(value, int)
    return value
