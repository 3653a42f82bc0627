"""Regression digests: a canonical JSON form of each report and its SHA-256 (issue #5).

Usage, from the repository root::

    python -m blueprinting.validation.digests --regenerate  # rewrite tests/regression/digests.json
    python -m blueprinting.validation.digests               # check: print what moved, exit 1

``tests/regression/configs.toml`` lists the configurations (model preset, system preset and
Megatron-LM flat keys); the report of each is ``blueprinting.api.plan(...).to_json_dict()``,
imported only when a digest is computed. ``digests.json`` keeps, per configuration, the digest
and the canonical snapshot itself, so that a failure can say which fields moved and by how much.

Canonical form: keys sorted, no whitespace, ASCII only, integers as written, and floats with
12 significant digits (``format(x, ".12g")``, always with a ``.`` or exponent so a float never
reads back as an int; ``-0.0`` is written ``0.0``; NaN and infinities as the strings ``"nan"``,
``"inf"``, ``"-inf"``). Why 12 and not ``repr``: ``repr`` round-trips every bit, so a digest would
move when a platform, a BLAS or a NumPy release changes a summation order by one ulp (relative
1e-16), which is not a change of the model. Twelve digits still catch any change above about
5e-13 relative, far below any figure the planner reports, and a 12-digit decimal parsed back and
printed again gives the same text, so stored snapshots re-digest to the same hash.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TypeAlias, final

from blueprinting.errors import BlueprintingError, ConfigError, ProblemCollector
from blueprinting.mapping.flat_keys import FlatValue
from blueprinting.validation.fields import flat_key_values
from blueprinting.validation.predictor import cost_model_function

JsonScalar: TypeAlias = bool | int | float | str | None
JsonValue: TypeAlias = JsonScalar | Sequence["JsonValue"] | Mapping[str, "JsonValue"]

FLOAT_FORMAT = ".12g"
SCHEMA_VERSION = 1
DEFAULT_CONFIGS = Path("tests/regression/configs.toml")
DEFAULT_DIGESTS = Path("tests/regression/digests.json")


# --------------------------------------------------------------------------------------------
# Canonical JSON
# --------------------------------------------------------------------------------------------
def canonical_float(value: float) -> str:
    if math.isnan(value):
        return '"nan"'
    if math.isinf(value):
        return '"inf"' if value > 0 else '"-inf"'
    if value == 0.0:
        return "0.0"
    text = format(value, FLOAT_FORMAT)
    if "." not in text and "e" not in text:
        text += ".0"
    return text


def canonical_json(value: JsonValue) -> str:
    """The canonical text of ``value`` (see the module docstring)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return canonical_float(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=True)
    if isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise ConfigError([f"report keys must be strings, got {key!r}"])
        items = sorted(value.items())
        return "{" + ",".join(f"{json.dumps(k)}:{canonical_json(v)}" for k, v in items) + "}"
    return "[" + ",".join(canonical_json(item) for item in value) + "]"


def digest(value: JsonValue) -> str:
    """SHA-256 (hex) of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value).encode("ascii")).hexdigest()


def canonicalize(value: JsonValue) -> JsonValue:
    """``value`` as its canonical text reads back: what a snapshot stores."""
    parsed: JsonValue = json.loads(canonical_json(value))
    return parsed


# --------------------------------------------------------------------------------------------
# Differences
# --------------------------------------------------------------------------------------------
def flatten(value: JsonValue, prefix: str = "") -> dict[str, JsonScalar]:
    """Nested dicts as dotted paths, lists as ``path[i]``; empty containers keep their path."""
    if isinstance(value, Mapping):
        if not value:
            return {prefix: "{}"} if prefix else {}
        flat: dict[str, JsonScalar] = {}
        for key, item in value.items():
            flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    if isinstance(value, Sequence) and not isinstance(value, str):
        if not value:
            return {prefix: "[]"}
        flat = {}
        for index, item in enumerate(value):
            flat.update(flatten(item, f"{prefix}[{index}]"))
        return flat
    return {prefix: value}


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FieldChange:
    """One leaf that differs; ``old`` / ``new`` is ``None`` with ``present_*`` False when absent."""

    path: str
    old: JsonScalar
    new: JsonScalar
    present_before: bool = True
    present_after: bool = True

    @property
    def relative_change(self) -> float | None:
        """``(new - old) / |old|`` for two numbers with ``old != 0``; else ``None``."""
        old, new = self.old, self.new
        if isinstance(old, bool) or isinstance(new, bool):
            return None
        if isinstance(old, int | float) and isinstance(new, int | float) and old != 0:
            return (float(new) - float(old)) / abs(float(old))
        return None

    def __str__(self) -> str:
        if not self.present_before:
            return f"{self.path}: added, {self.new!r}"
        if not self.present_after:
            return f"{self.path}: removed, was {self.old!r}"
        relative = self.relative_change
        tail = "" if relative is None else f" (rel {relative:+.3e})"
        return f"{self.path}: {self.old!r} -> {self.new!r}{tail}"


def diff(old: JsonValue, new: JsonValue) -> tuple[FieldChange, ...]:
    """Every leaf that differs between two canonical snapshots, sorted by path."""
    before, after = flatten(old), flatten(new)
    changes: list[FieldChange] = []
    for path in sorted(set(before) | set(after)):
        if path not in after:
            changes.append(FieldChange(path=path, old=before[path], new=None, present_after=False))
        elif path not in before:
            changes.append(FieldChange(path=path, old=None, new=after[path], present_before=False))
        elif canonical_json(before[path]) != canonical_json(after[path]):
            changes.append(FieldChange(path=path, old=before[path], new=after[path]))
    return tuple(changes)


def format_changes(name: str, changes: Sequence[FieldChange]) -> str:
    lines = [f"{name}: {len(changes)} field(s) moved"]
    lines += [f"  {change}" for change in changes]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Configurations and the store
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RegressionConfig:
    """One digest configuration: preset names and Megatron-LM flat keys."""

    name: str
    model: str
    system: str
    strategy_keys: Mapping[str, FlatValue]


ReportFunction = Callable[[RegressionConfig], JsonValue]


def load_configs(path: Path = DEFAULT_CONFIGS) -> tuple[RegressionConfig, ...]:
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError([f"cannot read regression configs: {error}"], source=str(path)) from error
    problems = ProblemCollector(source=str(path))
    raw_configs = document.get("config")
    if not isinstance(raw_configs, list):
        raise ConfigError(["expected [[config]] tables"], source=str(path))
    configs: list[RegressionConfig] = []
    for index, raw in enumerate(raw_configs):
        if not isinstance(raw, dict):
            problems.add(f"config[{index}] must be a table")
            continue
        fields = {key: raw.get(key) for key in ("name", "model", "system")}
        bad = [key for key, value in fields.items() if not isinstance(value, str)]
        for key in bad:
            problems.add(f"config[{index}].{key} must be a string")
        strategy = raw.get("strategy")
        if not isinstance(strategy, dict):
            problems.add(f"config[{index}].strategy must be a table")
            continue
        keys = flat_key_values(strategy, f"config[{index}].strategy", problems)
        if bad:
            continue
        configs.append(
            RegressionConfig(
                name=str(fields["name"]),
                model=str(fields["model"]),
                system=str(fields["system"]),
                strategy_keys=MappingProxyType(keys),
            )
        )
    names = [config.name for config in configs]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.add(f"duplicate config name {name!r}")
    problems.raise_if_any()
    return tuple(configs)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class DigestEntry:
    sha256: str
    snapshot: JsonValue


def compute_entries(
    configs: Sequence[RegressionConfig], report: ReportFunction
) -> dict[str, DigestEntry]:
    entries: dict[str, DigestEntry] = {}
    for config in configs:
        snapshot = canonicalize(report(config))
        entries[config.name] = DigestEntry(sha256=digest(snapshot), snapshot=snapshot)
    return entries


def write_store(path: Path, entries: Mapping[str, DigestEntry]) -> None:
    document = {
        "schema_version": SCHEMA_VERSION,
        "float_format": FLOAT_FORMAT,
        "configs": {
            name: {"sha256": entry.sha256, "snapshot": entry.snapshot}
            for name, entry in sorted(entries.items())
        },
    }
    path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def read_store(path: Path) -> dict[str, DigestEntry]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError([f"cannot read digests: {error}"], source=str(path)) from error
    configs = document.get("configs") if isinstance(document, dict) else None
    if not isinstance(configs, dict):
        raise ConfigError(["expected an object with 'configs'"], source=str(path))
    entries: dict[str, DigestEntry] = {}
    problems = ProblemCollector(source=str(path))
    for name, raw in configs.items():
        if not isinstance(raw, dict) or not isinstance(raw.get("sha256"), str):
            problems.add(f"configs.{name} needs a 'sha256' string and a 'snapshot'")
            continue
        entries[name] = DigestEntry(sha256=raw["sha256"], snapshot=raw.get("snapshot"))
    problems.raise_if_any()
    return entries


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class DigestMismatch:
    """A configuration whose digest moved (``changes`` empty when it is new or was removed)."""

    name: str
    stored: str | None
    computed: str | None
    changes: tuple[FieldChange, ...]

    def __str__(self) -> str:
        if self.stored is None:
            return f"{self.name}: no stored digest (regenerate)"
        if self.computed is None:
            return f"{self.name}: stored but no longer configured (regenerate)"
        return format_changes(self.name, self.changes)


def check(
    stored: Mapping[str, DigestEntry], computed: Mapping[str, DigestEntry]
) -> tuple[DigestMismatch, ...]:
    mismatches: list[DigestMismatch] = []
    for name in sorted(set(stored) | set(computed)):
        old, new = stored.get(name), computed.get(name)
        if old is not None and new is not None and old.sha256 == new.sha256:
            continue
        changes = diff(old.snapshot, new.snapshot) if old is not None and new is not None else ()
        mismatches.append(
            DigestMismatch(
                name=name,
                stored=None if old is None else old.sha256,
                computed=None if new is None else new.sha256,
                changes=changes,
            )
        )
    return tuple(mismatches)


# --------------------------------------------------------------------------------------------
# The cost model's report
# --------------------------------------------------------------------------------------------
def api_report_function() -> ReportFunction:
    """``blueprinting.api.plan(model=..., system=..., settings=...).to_json_dict()``.

    Raises :class:`UnsupportedError` when the cost model is not installed.
    """
    plan = cost_model_function("plan")

    def report(config: RegressionConfig) -> JsonValue:
        result = plan(model=config.model, system=config.system, settings=dict(config.strategy_keys))
        values: JsonValue = result.to_json_dict()
        return values

    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m blueprinting.validation.digests",
        description="Check or regenerate the regression digests of tests/regression/.",
    )
    parser.add_argument("--regenerate", action="store_true", help="rewrite the digest store")
    parser.add_argument("--configs", type=Path, default=DEFAULT_CONFIGS)
    parser.add_argument("--digests", type=Path, default=DEFAULT_DIGESTS)
    args = parser.parse_args(argv)
    try:
        configs = load_configs(args.configs)
        computed = compute_entries(configs, api_report_function())
        if args.regenerate:
            write_store(args.digests, computed)
            print(f"wrote {len(computed)} digests to {args.digests}")
            return 0
        mismatches = check(read_store(args.digests), computed)
    except BlueprintingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for mismatch in mismatches:
        print(mismatch)
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
