"""The one exception hierarchy of Blueprinting.

Every error a user can provoke with input (a config file, a flag, a key) is a subclass of
:class:`BlueprintingError`; the CLI catches that base class and never shows a traceback.
Errors carry structured context so that callers (and tests) can inspect the rule and values
instead of parsing messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeGuard, final

from blueprinting.limits import MAX_INT, int_limit_text


class RuleSet(StrEnum):
    """Which body of rules a violation belongs to.

    The planner's laws are what Blueprinting's own analysis needs; Megatron-LM's compatibility
    rules are what Megatron-LM refuses at start-up. A strategy can satisfy the first and fail the
    second, so a violation always says which one it broke.
    """

    PLANNER = "planner"
    MEGATRON = "megatron"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LawViolation:
    """One violated rule: its name, the formula, the values plugged in and a readable message."""

    law: str
    formula: str
    values: tuple[tuple[str, int | float | str | bool | None], ...] = ()
    message: str
    ruleset: RuleSet = RuleSet.PLANNER

    def __str__(self) -> str:
        return f"[{self.ruleset}] {self.law}: {self.message}"


class BlueprintingError(Exception):
    """Base class of every error Blueprinting raises on purpose."""


class ConfigError(BlueprintingError):
    """A malformed input: unreadable file, unknown or conflicting key, wrong value type.

    The CLI exits with status 2 for these.
    """

    def __init__(self, problems: Sequence[str], *, source: str | None = None) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        self.source = source
        where = f" in {source}" if source else ""
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid configuration{where}:\n{lines}")


class InvalidStrategyError(BlueprintingError, ValueError):
    """A well-formed strategy that breaks one or more laws (planner or Megatron-LM rules).

    The CLI exits with status 1 for these and lists every violation.
    """

    def __init__(self, violations: Sequence[LawViolation], *, subject: str = "strategy") -> None:
        self.violations: tuple[LawViolation, ...] = tuple(violations)
        lines = "\n".join(f"  - {v}" for v in self.violations)
        super().__init__(f"checking {subject}: {len(self.violations)} law(s) violated:\n{lines}")


class VerificationError(BlueprintingError):
    """An IR failed its verifier: a bug in a pass, never a user error."""


class UnsupportedError(BlueprintingError):
    """A valid request that this version of Blueprinting does not model."""


class SweepError(BlueprintingError):
    """A sweep's cell could not be computed: its worker died past the retries, or the cell's
    search raised (a bug). The rows finished before it are kept; a rerun resumes."""


class DeadlockError(BlueprintingError):
    """A concrete schedule contains commands that can never start."""

    def __init__(self, message: str, *, stuck: Sequence[str] = ()) -> None:
        self.stuck: tuple[str, ...] = tuple(stuck)
        super().__init__(message)


def is_positive_int(value: object) -> TypeGuard[int]:
    """An ``int`` from 1 to ``MAX_INT`` (2**63 - 1); ``bool`` (an ``int`` subclass) is refused,
    as is ``1.0``."""
    return type(value) is int and 1 <= value <= MAX_INT


def positive_int_problem(name: str, value: object) -> str | None:
    """``"{name} must be a positive integer, got {value!r}"``, or the same naming the limit when
    ``value`` is an integer above ``MAX_INT``; None when ``value`` is a positive integer."""
    if is_positive_int(value):
        return None
    if type(value) is int and value > MAX_INT:
        return f"{name} must be a positive integer at most {int_limit_text()}, got {value!r}"
    return f"{name} must be a positive integer, got {value!r}"


def positive_int_problems(owner: str | None, /, **values: object) -> list[str]:
    """One problem per value that is not a positive integer, in argument order:
    ``"{owner}.{key} must be a positive integer, got {value!r}"`` (without ``"{owner}."`` when
    ``owner`` is None). Callers decide whether and how to raise."""
    # The common case, on every IR value's construction: no message built. A loop, not
    # all(<generator>): the generator's frame per call is most of this check's time (issue 18).
    for value in values.values():
        if type(value) is not int or not 1 <= value <= MAX_INT:
            break
    else:
        return []
    prefix = "" if owner is None else f"{owner}."
    problems = (positive_int_problem(f"{prefix}{key}", value) for key, value in values.items())
    return [problem for problem in problems if problem is not None]


@dataclass(slots=True)
class ProblemCollector:
    """Accumulates config problems so that every one is reported at once."""

    source: str | None = None
    problems: list[str] = field(default_factory=list)

    def add(self, problem: str) -> None:
        self.problems.append(problem)

    def raise_if_any(self) -> None:
        if self.problems:
            raise ConfigError(self.problems, source=self.source)
