"""Fitting a system's achieved-GEMM fraction on measured runs (issue #5, "calibration without
cheating").

The efficiency parameters of a system are physical quantities, set once per system. This module
fits exactly one of them, ``peak_fraction`` of the matrix engine's
:class:`~blueprinting.hardware.efficiency.SaturatingGemmEfficiency` (every datatype of the matrix
engine at once), on a *named subset* of measured runs, and reports the error on the rest
separately, so that the held-out figure stays a test. Every other efficiency keeps its preset
value (datasheet / microbenchmark figures, see :mod:`blueprinting.hardware.presets`).

Objective: the sum over the fit rows of ``((predicted - measured) / measured)^2``, every gated or
informational time-like figure of those rows (per-layer times, iteration times, TFLOP/s);
minimised by golden-section search on ``[low, high]`` (the objective is unimodal in the fraction:
every predicted time is a sum of terms non-increasing in it), then rounded to ``resolution``.

``blueprinting calibrate`` runs it on the published fixture (default subset: Korthikanti et al.
2022, Table 4, the per-layer times, which behave like a microbenchmark) or on a user's own table
of measured runs in the fixture's TOML format, and prints the ``[system]`` override to paste.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import final

from blueprinting.errors import ConfigError
from blueprinting.hardware.efficiency import GemmShapeEfficiency, SaturatingGemmEfficiency
from blueprinting.hardware.fit import toml_inline
from blueprinting.hardware.system import DatatypeRate, SystemSpec
from blueprinting.hardware.system_mapping import efficiency_to_mapping
from blueprinting.validation.comparison import (
    ComparisonRow,
    ValidationTable,
    compare_published,
    error_stats,
    time_rows,
)
from blueprinting.validation.predictor import PlanCache, system_predictor
from blueprinting.validation.published import PublishedRun, SourceTable

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def with_gemm_peak_fraction(system: SystemSpec, peak_fraction: float) -> SystemSpec:
    """``system`` with every saturating matrix-engine efficiency at ``peak_fraction``."""
    matrix = system.accelerator.matrix
    rates: list[DatatypeRate] = []
    changed = False
    for rate in matrix.rates:
        model = rate.efficiency
        if isinstance(model, SaturatingGemmEfficiency | GemmShapeEfficiency):
            rates.append(replace(rate, efficiency=replace(model, peak_fraction=peak_fraction)))
            changed = True
        else:
            rates.append(rate)
    if not changed:
        raise ConfigError(
            [
                f"calibrating {system.name}: its matrix engine has no saturating GEMM efficiency "
                "(model = saturating_gemm) to fit"
            ]
        )
    accelerator = replace(system.accelerator, matrix=replace(matrix, rates=tuple(rates)))
    return replace(system, accelerator=accelerator)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorSummary:
    """Mean and largest |relative error| of a set of rows (``count`` rows)."""

    count: int
    mae: float
    max_error: float

    @staticmethod
    def of(rows: Sequence[ComparisonRow]) -> ErrorSummary:
        stats = error_stats(row.relative_error for row in rows)
        if stats.mae is None or stats.max_error is None:
            return ErrorSummary(count=0, mae=math.nan, max_error=math.nan)
        return ErrorSummary(count=stats.count, mae=stats.mae, max_error=stats.max_error)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationResult:
    system: SystemSpec
    peak_fraction: float
    fit_tables: frozenset[SourceTable]
    fit: ErrorSummary
    held_out: dict[SourceTable, ErrorSummary]
    table: ValidationTable


def _objective(
    system: SystemSpec,
    fraction: float,
    runs: Sequence[PublishedRun],
    tables: frozenset[SourceTable],
    plans: PlanCache,
) -> float:
    table = compare_published(
        system_predictor(with_gemm_peak_fraction(system, fraction), plans), runs
    )
    rows = time_rows(table.rows, tables)
    errors = [e for row in rows if (e := row.relative_error) is not None]
    if not errors:
        raise ConfigError(
            [f"calibrating: no predicted time figure in the fit tables {sorted(tables)}"]
        )
    return sum(error * error for error in errors)


def fit_gemm_peak_fraction(
    system: SystemSpec,
    runs: Sequence[PublishedRun],
    *,
    fit_tables: frozenset[SourceTable] = frozenset({SourceTable.KORTHIKANTI2022_TABLE4}),
    low: float = 0.3,
    high: float = 1.0,
    resolution: float = 0.01,
) -> CalibrationResult:
    """Fit ``peak_fraction`` on the runs of ``fit_tables``; score every run with the fit."""
    fit_runs = [run for run in runs if run.source_table in fit_tables]
    if not fit_runs:
        raise ConfigError([f"calibrating: no run of {sorted(fit_tables)} in the table"])
    # One cache for the search: each fraction is its own system, so it plans a strategy that
    # several rows share once per fraction.
    plans = PlanCache()
    a, b = low, high
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc = _objective(system, c, fit_runs, fit_tables, plans)
    fd = _objective(system, d, fit_runs, fit_tables, plans)
    while b - a > resolution / 4:
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = _objective(system, c, fit_runs, fit_tables, plans)
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = _objective(system, d, fit_runs, fit_tables, plans)
    fraction = round(round((a + b) / 2 / resolution) * resolution, 6)
    fitted = with_gemm_peak_fraction(system, fraction)
    table = compare_published(system_predictor(fitted, plans), runs)
    held_out_rows = {
        source: time_rows(table.rows, {source})
        for source in SourceTable
        if source not in fit_tables
    }
    held_out = {source: ErrorSummary.of(rows) for source, rows in held_out_rows.items() if rows}
    return CalibrationResult(
        system=fitted,
        peak_fraction=fraction,
        fit_tables=fit_tables,
        fit=ErrorSummary.of(time_rows(table.rows, fit_tables)),
        held_out=held_out,
        table=table,
    )


def override_toml(result: CalibrationResult, preset: str) -> str:
    """The ``[system]`` section that applies the fitted fraction to ``preset``."""
    lines = ["[system]", f'preset = "{preset}"']
    for rate in result.system.accelerator.matrix.rates:
        model = rate.efficiency
        if isinstance(model, SaturatingGemmEfficiency | GemmShapeEfficiency):
            lines.append(f"[system.accelerator.matrix.{rate.datatype.value}]")
            lines.append(f"efficiency = {toml_inline(efficiency_to_mapping(model))}")
    return "\n".join(lines)
