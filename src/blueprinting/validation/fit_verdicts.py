"""Fit verdicts on the measured modern runs (issue 19's "will it fit?" on the recipes users copy).

Every run of ``modern_runs.toml`` and ``modern_moe_runs.toml`` ran, so each should be predicted
to fit; those fixtures carry no measured memory, so this is a verdict count, not a memory-error
gate. :func:`modern_fit_verdicts` plans each run as ``validate`` does (its system preset, the
plan's default options) and names those predicted not to fit with their reserved peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from blueprinting.errors import BlueprintingError


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FitMiss:
    """A run that ran but is predicted not to fit: its predicted reserved peak and capacity."""

    run_id: str
    reserved_peak_bytes: int
    capacity_bytes: int


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FitVerdicts:
    """How many modern runs plan, and those of them predicted not to fit."""

    planned: int
    misses: tuple[FitMiss, ...]

    @property
    def fit(self) -> int:
        return self.planned - len(self.misses)


def modern_fit_verdicts() -> FitVerdicts:
    """The verdicts over both modern fixtures (a run the planner refuses is left out: ``validate``
    says why)."""
    from blueprinting.validation.modern import load_modern_runs
    from blueprinting.validation.modern_moe import load_moe_runs
    from blueprinting.validation.predictor import PlanCache

    cache = PlanCache()
    planned = 0
    misses: list[FitMiss] = []
    for run in (*load_modern_runs(), *load_moe_runs()):
        try:
            values = cache.values(
                run.training_spec(), run.system, megatron_rules=not run.waived_megatron_rules
            )
        except BlueprintingError:
            continue
        planned += 1
        memory = values.get("memory_bytes")
        if values.get("fits_in_memory") is not True and isinstance(memory, dict):
            misses.append(
                FitMiss(
                    run_id=run.id,
                    reserved_peak_bytes=int(memory["reserved_peak"]),
                    capacity_bytes=int(memory["capacity"]),
                )
            )
    return FitVerdicts(planned=planned, misses=tuple(misses))
