"""The least error a gate's rows allow: what no cost model can beat on a fixture.

A predictor reads a run's inputs (the system and the training spec its keys build), so runs with
the same inputs get the same prediction. Where such runs were measured at different times (the same
Megatron-Bridge recipe in two NeMo containers), every prediction misses one of them, and a gate
on the largest |relative error| has a floor no model can go under. For a group measured between
``lo`` and ``hi`` seconds, the relative error ``|p / m - 1|`` of the worst member is
``max((p - lo) / lo, (hi - p) / hi)`` for ``lo <= p <= hi`` (outside that range both grow), the
first term rising in ``p`` and the second falling; they meet at ``p = 2 lo hi / (lo + hi)``, the
harmonic mean of the two, where both equal ``(hi - lo) / (hi + lo)``. The floor of the max gate
is the largest of these over the groups, and the harmonic means attain it: exact for inputs as
the caller keys them (``ModernRun.inputs`` keys on the built spec, so spellings and stated
defaults that plan alike fall in one group).

The median gate has no such floor here: one prediction per group can match one run of it
exactly, and most groups hold one run.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import final

from blueprinting.errors import ConfigError


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredInput:
    """One scored run as the floor reads it: its id, what its inputs are (equal keys, equal
    inputs) and its measured seconds."""

    run_id: str
    inputs: Hashable
    measured_s: float


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorFloor:
    """The least max |relative error| any predictor that gives equal inputs equal predictions
    reaches on the rows (``value``), the runs of the group that sets it (``runs``, in the given
    order, with their ``measured_s``; empty where every group is one run or agrees) and the
    prediction that attains it there (``prediction_s``, the harmonic mean of the group's fastest
    and slowest time)."""

    value: float
    runs: tuple[str, ...]
    measured_s: tuple[float, ...]
    prediction_s: float | None


def max_error_floor(rows: Iterable[MeasuredInput]) -> ErrorFloor | None:
    """The floor of a max-|error| gate over ``rows`` (module docstring); None with no rows, 0
    where no two runs with equal inputs were measured apart. Computed from the ratio of the
    fastest to the slowest time, so no finite input overflows."""
    groups: dict[Hashable, list[MeasuredInput]] = defaultdict(list)
    problems: list[str] = []
    for row in rows:
        if not (math.isfinite(row.measured_s) and row.measured_s > 0):
            problems.append(
                f"run {row.run_id!r}: measured_s must be finite and > 0, got {row.measured_s!r}"
            )
        groups[row.inputs].append(row)
    if problems:
        raise ConfigError(problems)
    if not groups:
        return None
    best = ErrorFloor(value=0.0, runs=(), measured_s=(), prediction_s=None)
    for members in groups.values():
        lo = min(member.measured_s for member in members)
        hi = max(member.measured_s for member in members)
        ratio = lo / hi
        spread = (1.0 - ratio) / (1.0 + ratio)
        if spread > best.value:
            best = ErrorFloor(
                value=spread,
                runs=tuple(member.run_id for member in members),
                measured_s=tuple(member.measured_s for member in members),
                # 2 lo hi / (lo + hi), written so that it never exceeds hi
                prediction_s=hi * (2.0 * ratio / (1.0 + ratio)),
            )
    return best
