"""Scoring a predictor against the published runs (issue #5).

A predictor maps a :class:`PublishedRun` to a :class:`Prediction` in SI units. The engine turns
each prediction into the paper's unit and convention, so the predictor never has to know how a
paper counted FLOPs: TFLOP/s of Narayanan et al. 2021 Table 1 are recomputed from the predicted
iteration time with the paper's Eq. (3); MFU with Korthikanti et al. 2022's model FLOPs; Figure 7's
percentages from the predicted activation memory of the row and of its baseline row.

Relative error is ``(predicted - measured) / measured``. Gates (issue #5 acceptance):

* iteration time / TFLOP/s over Narayanan 2021 Table 1 and Korthikanti 2022 Table 5:
  mean absolute relative error <= :data:`THROUGHPUT_MAE_LIMIT`, every row
  <= :data:`THROUGHPUT_MAX_LIMIT`;
* per-layer forward and backward time, Korthikanti 2022 Table 4: every row
  <= :data:`LAYER_TIME_MAX_LIMIT`;
* activation memory, Korthikanti 2022 Figures 1 and 7 (Calculon's reading): every row
  <= :data:`ACTIVATION_MEMORY_MAX_LIMIT`.

Rows outside a gate (MFU/HFU, weights+optimizer memory, the 2240-GPU text rows) are still scored
and shown, as information.

Where a run's sources leave a strategy fact ambiguous, the fixture names the other reading
(``[[run.alternative]]``, :class:`~blueprinting.validation.published.AlternativeAssumption`). The
run is scored under the alternative too, as :class:`AlternativeRow` beside its primary row; the
gates read the primary rows only, so an alternative shows how much a figure hangs on the
assumption without ever being chosen to pass a gate.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import assert_never, final

from blueprinting.errors import BlueprintingError
from blueprinting.validation.published import FlopsConvention, PublishedRun, SourceTable

#: Issue #5: mean |relative error| of iteration time / TFLOP/s (Narayanan T1 + Korthikanti T5).
THROUGHPUT_MAE_LIMIT = 0.05
#: Issue #5: largest |relative error| of iteration time / TFLOP/s on any of those rows.
THROUGHPUT_MAX_LIMIT = 0.10
#: Issue #5: per-layer forward / backward time (Korthikanti T4), every row.
LAYER_TIME_MAX_LIMIT = 0.10
#: Issue #5: activation memory (Korthikanti Fig. 1 and Fig. 7), every row.
ACTIVATION_MEMORY_MAX_LIMIT = 0.05

_GIB = float(2**30)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """What a predictor says about one run, SI units; ``None`` where it has no figure.

    ``activation_memory_bytes`` and ``static_memory_bytes`` (weights + gradients + optimizer
    states) are per GPU on the first pipeline stage, where Korthikanti 2022 and Calculon measure.
    ``layer_*_s`` is one transformer layer for one microbatch; ``layer_backward_s`` includes the
    recompute, as Korthikanti's Table 4 does.
    """

    iteration_time_s: float | None = None
    layer_forward_s: float | None = None
    layer_backward_s: float | None = None
    activation_memory_bytes: float | None = None
    static_memory_bytes: float | None = None


Predictor = Callable[[PublishedRun], Prediction]


class MetricFamily(StrEnum):
    THROUGHPUT = "iteration time / TFLOP/s"
    UTILIZATION = "MFU"
    LAYER_TIME = "per-layer time"
    ACTIVATION_MEMORY = "activation memory"
    STATIC_MEMORY = "weights+grads+optimizer memory"


#: Families whose figures are times (or throughputs, i.e. inverse times) and so move with GEMMs.
TIME_FAMILIES = frozenset({MetricFamily.THROUGHPUT, MetricFamily.LAYER_TIME})


class Metric(StrEnum):
    """One compared quantity; the value is the fixture key it is read from."""

    TFLOPS_PER_GPU = "tflops_per_gpu"
    ITERATION_TIME = "iteration_time_s"
    MFU = "mfu_pct"
    LAYER_FORWARD = "layer_forward_ms"
    LAYER_BACKWARD = "layer_backward_ms"
    ACTIVATION_MEMORY = "memory_activations_GiB"
    ACTIVATION_MEMORY_PCT = "activation_memory_pct_of_tp_baseline"
    STATIC_MEMORY = "memory_params_grads_optimizer_GiB"

    @property
    def family(self) -> MetricFamily:
        match self:
            case Metric.TFLOPS_PER_GPU | Metric.ITERATION_TIME:
                return MetricFamily.THROUGHPUT
            case Metric.MFU:
                return MetricFamily.UTILIZATION
            case Metric.LAYER_FORWARD | Metric.LAYER_BACKWARD:
                return MetricFamily.LAYER_TIME
            case Metric.ACTIVATION_MEMORY | Metric.ACTIVATION_MEMORY_PCT:
                return MetricFamily.ACTIVATION_MEMORY
            case Metric.STATIC_MEMORY:
                return MetricFamily.STATIC_MEMORY
            case _ as unreachable:
                assert_never(unreachable)

    @property
    def unit(self) -> str:
        match self:
            case Metric.TFLOPS_PER_GPU:
                return "TFLOP/s"
            case Metric.ITERATION_TIME:
                return "s"
            case Metric.MFU | Metric.ACTIVATION_MEMORY_PCT:
                return "%"
            case Metric.LAYER_FORWARD | Metric.LAYER_BACKWARD:
                return "ms"
            case Metric.ACTIVATION_MEMORY | Metric.STATIC_MEMORY:
                return "GiB"
            case _ as unreachable:
                assert_never(unreachable)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Gate:
    """An acceptance threshold over the rows of some tables in one metric family."""

    name: str
    family: MetricFamily
    source_tables: frozenset[SourceTable]
    mae_limit: float | None
    max_limit: float

    def covers(self, run: PublishedRun, metric: Metric) -> bool:
        return metric.family == self.family and run.source_table in self.source_tables


THROUGHPUT_GATE = Gate(
    name="iteration time / TFLOP/s (Narayanan T1 + Korthikanti T5)",
    family=MetricFamily.THROUGHPUT,
    source_tables=frozenset({SourceTable.NARAYANAN2021_TABLE1, SourceTable.KORTHIKANTI2022_TABLE5}),
    mae_limit=THROUGHPUT_MAE_LIMIT,
    max_limit=THROUGHPUT_MAX_LIMIT,
)
LAYER_TIME_GATE = Gate(
    name="per-layer forward/backward (Korthikanti T4)",
    family=MetricFamily.LAYER_TIME,
    source_tables=frozenset({SourceTable.KORTHIKANTI2022_TABLE4}),
    mae_limit=None,
    max_limit=LAYER_TIME_MAX_LIMIT,
)
ACTIVATION_MEMORY_GATE = Gate(
    name="activation memory (Korthikanti Fig. 1 + Fig. 7)",
    family=MetricFamily.ACTIVATION_MEMORY,
    source_tables=frozenset({SourceTable.CALCULON_FIG1, SourceTable.CALCULON_FIG7}),
    mae_limit=None,
    max_limit=ACTIVATION_MEMORY_MAX_LIMIT,
)
GATES: tuple[Gate, ...] = (THROUGHPUT_GATE, LAYER_TIME_GATE, ACTIVATION_MEMORY_GATE)


def relative_error(predicted: float | None, measured: float) -> float | None:
    """``(predicted - measured) / measured``; ``None`` when there is no prediction."""
    if predicted is None:
        return None
    return (predicted - measured) / measured


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorStats:
    """Mean and largest |relative error| over ``count`` predicted figures (``None`` if none)."""

    count: int
    mae: float | None
    max_error: float | None


def error_stats(errors: Iterable[float | None]) -> ErrorStats:
    """:class:`ErrorStats` of signed relative errors; ``None`` entries (not predicted) are left
    out."""
    absolute = [abs(error) for error in errors if error is not None]
    return ErrorStats(
        count=len(absolute),
        mae=sum(absolute) / len(absolute) if absolute else None,
        max_error=max(absolute) if absolute else None,
    )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ComparisonRow:
    """One measured figure against its prediction, both in the paper's unit."""

    run_id: str
    source_table: SourceTable
    metric: Metric
    measured: float
    predicted: float | None
    gated: bool
    note: str = ""

    @property
    def relative_error(self) -> float | None:
        return relative_error(self.predicted, self.measured)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FamilySummary:
    """Mean and largest |relative error| of the predicted rows of one family (or one gate)."""

    family: MetricFamily
    count: int
    missing: int
    mae: float | None
    max_error: float | None


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class GateResult:
    gate: Gate
    count: int
    mae: float | None
    max_error: float | None
    missing: tuple[str, ...]

    @property
    def passed(self) -> bool:
        """Every covered row predicted, and both limits held (an empty gate fails)."""
        if self.missing or self.count == 0 or self.mae is None or self.max_error is None:
            return False
        if self.gate.mae_limit is not None and self.mae > self.gate.mae_limit:
            return False
        return self.max_error <= self.gate.max_limit


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AlternativeRow:
    """One figure of a run under an alternative reading, beside its primary prediction."""

    run_id: str
    label: str
    reason: str
    metric: Metric
    measured: float
    primary: float | None
    """Predicted under the fixture's own (primary) reading: the value the gates score."""
    predicted: float | None
    """Predicted under the alternative reading."""
    note: str = ""

    @property
    def primary_error(self) -> float | None:
        return relative_error(self.primary, self.measured)

    @property
    def relative_error(self) -> float | None:
        return relative_error(self.predicted, self.measured)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationTable:
    rows: tuple[ComparisonRow, ...]
    families: tuple[FamilySummary, ...]
    gates: tuple[GateResult, ...]
    alternatives: tuple[AlternativeRow, ...] = ()

    @property
    def passed(self) -> bool:
        return all(result.passed for result in self.gates)


# --------------------------------------------------------------------------------------------
# Engine
# --------------------------------------------------------------------------------------------
def _tflops_per_gpu(run: PublishedRun, convention: FlopsConvention, time_s: float) -> float:
    flops = convention.iteration_flops(run.model, run.global_batch_size)
    return flops / (time_s * run.num_gpus * 1e12)


def _predicted_value(
    run: PublishedRun,
    metric: Metric,
    prediction: Prediction,
    baseline: Prediction | None,
) -> float | None:
    match metric:
        case Metric.TFLOPS_PER_GPU:
            convention = run.measured.flops_convention
            if prediction.iteration_time_s is None or convention is None:
                return None
            return _tflops_per_gpu(run, convention, prediction.iteration_time_s)
        case Metric.ITERATION_TIME:
            return prediction.iteration_time_s
        case Metric.MFU:
            convention = run.measured.mfu_convention
            if prediction.iteration_time_s is None or convention is None:
                return None
            tflops = _tflops_per_gpu(run, convention, prediction.iteration_time_s)
            return 100.0 * tflops / run.peak_tflops_16bit
        case Metric.LAYER_FORWARD:
            return None if prediction.layer_forward_s is None else prediction.layer_forward_s * 1e3
        case Metric.LAYER_BACKWARD:
            if prediction.layer_backward_s is None:
                return None
            return prediction.layer_backward_s * 1e3
        case Metric.ACTIVATION_MEMORY:
            if prediction.activation_memory_bytes is None:
                return None
            return prediction.activation_memory_bytes / _GIB
        case Metric.ACTIVATION_MEMORY_PCT:
            if (
                baseline is None
                or baseline.activation_memory_bytes is None
                or prediction.activation_memory_bytes is None
            ):
                return None
            return 100.0 * prediction.activation_memory_bytes / baseline.activation_memory_bytes
        case Metric.STATIC_MEMORY:
            if prediction.static_memory_bytes is None:
                return None
            return prediction.static_memory_bytes / _GIB
        case _ as unreachable:
            assert_never(unreachable)


def _measured_value(run: PublishedRun, metric: Metric) -> float | None:
    measured = run.measured
    match metric:
        case Metric.TFLOPS_PER_GPU:
            return measured.tflops_per_gpu
        case Metric.ITERATION_TIME:
            return measured.iteration_time_s
        case Metric.MFU:
            return measured.mfu_pct
        case Metric.LAYER_FORWARD:
            return measured.layer_forward_ms
        case Metric.LAYER_BACKWARD:
            return measured.layer_backward_ms
        case Metric.ACTIVATION_MEMORY:
            return measured.memory_activations_GiB
        case Metric.ACTIVATION_MEMORY_PCT:
            return measured.activation_memory_pct_of_tp_baseline
        case Metric.STATIC_MEMORY:
            return measured.memory_params_grads_optimizer_GiB
        case _ as unreachable:
            assert_never(unreachable)


#: The metrics whose prediction reads the iteration time (:func:`_predicted_value`), hence the
#: simulated pipeline bubble; the others (per-layer times, memory) are the same without it.
ITERATION_TIME_METRICS = frozenset({Metric.TFLOPS_PER_GPU, Metric.ITERATION_TIME, Metric.MFU})


def needs_iteration_time(run: PublishedRun) -> bool:
    """Whether any measured figure of ``run`` is compared through the iteration time."""
    return any(_measured_value(run, metric) is not None for metric in ITERATION_TIME_METRICS)


def time_rows(
    rows: Iterable[ComparisonRow], tables: Collection[SourceTable]
) -> list[ComparisonRow]:
    """The rows of ``tables`` whose figure is a time (:data:`TIME_FAMILIES`), in order."""
    return [
        row for row in rows if row.source_table in tables and row.metric.family in TIME_FAMILIES
    ]


def _summaries(rows: Sequence[ComparisonRow], family: MetricFamily) -> FamilySummary:
    members = [row for row in rows if row.metric.family == family]
    stats = error_stats(row.relative_error for row in members)
    return FamilySummary(
        family=family,
        count=stats.count,
        missing=sum(1 for row in members if row.predicted is None),
        mae=stats.mae,
        max_error=stats.max_error,
    )


def _gate_result(
    gate: Gate, rows: Sequence[ComparisonRow], runs: dict[str, PublishedRun]
) -> GateResult:
    covered = [row for row in rows if gate.covers(runs[row.run_id], row.metric)]
    stats = error_stats(row.relative_error for row in covered)
    return GateResult(
        gate=gate,
        count=stats.count,
        mae=stats.mae,
        max_error=stats.max_error,
        missing=tuple(f"{row.run_id}:{row.metric}" for row in covered if row.predicted is None),
    )


def compare_published(
    predict: Predictor,
    runs: Sequence[PublishedRun] | None = None,
    *,
    gates: Sequence[Gate] = GATES,
) -> ValidationTable:
    """Score ``predict`` on ``runs`` (default: the fixture). A :class:`BlueprintingError` raised
    for one run marks that run's figures as not predicted, with the message as the row's note."""
    if runs is None:
        from blueprinting.validation.published import load_published_runs

        runs = load_published_runs()
    by_id = {run.id: run for run in runs}
    predictions: dict[str, Prediction] = {}
    failures: dict[str, str] = {}
    for run in runs:
        _predict_into(predict, run, predictions, failures)
    rows: list[ComparisonRow] = []
    for run in runs:
        baseline_id = run.measured.baseline_run
        baseline = predictions.get(baseline_id) if baseline_id is not None else None
        for metric, measured, predicted, note in _figures(run, predictions, failures, baseline):
            rows.append(
                ComparisonRow(
                    run_id=run.id,
                    source_table=run.source_table,
                    metric=metric,
                    measured=measured,
                    predicted=predicted,
                    gated=any(gate.covers(run, metric) for gate in gates),
                    note=note,
                )
            )
    return ValidationTable(
        rows=tuple(rows),
        families=tuple(_summaries(rows, family) for family in MetricFamily),
        gates=tuple(_gate_result(gate, rows, by_id) for gate in gates),
        alternatives=_alternative_rows(predict, runs, rows, predictions),
    )


def _figures(
    run: PublishedRun,
    predictions: Mapping[str, Prediction],
    failures: Mapping[str, str],
    baseline: Prediction | None,
) -> Iterator[tuple[Metric, float, float | None, str]]:
    """(metric, measured, predicted, note) of every figure ``run`` has a measurement of."""
    prediction = predictions.get(run.id, Prediction())
    for metric in Metric:
        measured = _measured_value(run, metric)
        if measured is None:
            continue
        predicted = _predicted_value(run, metric, prediction, baseline)
        note = failures.get(run.id, "")
        if predicted is None and not note:
            note = "not predicted"
        yield metric, measured, predicted, note


def _predict_into(
    predict: Predictor,
    run: PublishedRun,
    predictions: dict[str, Prediction],
    failures: dict[str, str],
) -> None:
    try:
        predictions[run.id] = predict(run)
    except BlueprintingError as error:
        failures[run.id] = str(error).splitlines()[0]


def _alternative_rows(
    predict: Predictor,
    runs: Sequence[PublishedRun],
    rows: Sequence[ComparisonRow],
    predictions: Mapping[str, Prediction],
) -> tuple[AlternativeRow, ...]:
    primary = {(row.run_id, row.metric): row.predicted for row in rows}
    out: list[AlternativeRow] = []
    for run in runs:
        baseline_id = run.measured.baseline_run
        # A percentage of a baseline row stays a percentage of that row's primary reading.
        baseline = predictions.get(baseline_id) if baseline_id is not None else None
        for alternative in run.alternatives:
            variant = run.under(alternative)
            variant_predictions: dict[str, Prediction] = {}
            failures: dict[str, str] = {}
            _predict_into(predict, variant, variant_predictions, failures)
            for metric, measured, predicted, note in _figures(
                variant, variant_predictions, failures, baseline
            ):
                out.append(
                    AlternativeRow(
                        run_id=run.id,
                        label=alternative.label,
                        reason=alternative.reason,
                        metric=metric,
                        measured=measured,
                        primary=primary.get((run.id, metric)),
                        predicted=predicted,
                        note=note,
                    )
                )
    return tuple(out)


# --------------------------------------------------------------------------------------------
# JSON (the text rendering is blueprinting.report.validation_text)
# --------------------------------------------------------------------------------------------
def to_json_dict(table: ValidationTable) -> dict[str, object]:
    """The table as plain JSON values (``blueprinting validate --json``); errors are fractions."""
    return {
        "passed": table.passed,
        "gates": [
            {
                "name": result.gate.name,
                "rows": result.count,
                "mae": result.mae,
                "mae_limit": result.gate.mae_limit,
                "max_error": result.max_error,
                "max_limit": result.gate.max_limit,
                "missing": list(result.missing),
                "passed": result.passed,
            }
            for result in table.gates
        ],
        "rows": [
            {
                "run": row.run_id,
                "source_table": str(row.source_table),
                "metric": str(row.metric),
                "unit": row.metric.unit,
                "measured": row.measured,
                "predicted": row.predicted,
                "relative_error": row.relative_error,
                "gated": row.gated,
                "note": row.note,
            }
            for row in table.rows
        ],
        "alternatives": [
            {
                "run": row.run_id,
                "label": row.label,
                "reason": row.reason,
                "metric": str(row.metric),
                "unit": row.metric.unit,
                "measured": row.measured,
                "primary": row.primary,
                "primary_relative_error": row.primary_error,
                "predicted": row.predicted,
                "relative_error": row.relative_error,
                "note": row.note,
            }
            for row in table.alternatives
        ],
    }
