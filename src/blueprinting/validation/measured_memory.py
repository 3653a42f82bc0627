"""Measured GPU memory of Megatron training runs, and scoring the memory model on them (issue 19).

The fixture ``tests/validation/fixtures/measured_memory.toml`` carries, in the project's own format,
every record of ``shared/reference/measured_memory.json`` (see ``measured_memory.md`` there):

* NVIDIA/Megatron-LM functional-test golden values (``tests/functional_tests/test_cases/*/*/
  golden_values_*.json`` with their ``model_config.yaml``), Megatron-Core 0.11 to 0.20 on DGX A100,
  H100 and GB200: ``torch.cuda.memory_stats()`` allocated-bytes peak and current, written by the
  last global rank, i.e. the **last** pipeline stage;
* Megatron-LM's fine-grained activation offloading README: ``report_memory`` lines (allocated and
  reserved, peak and current) of the first rank of each stage;
* vuiseng9/megatron-tutorials (0b2c030a1d), Megatron-LM core_r0.14.0 on 8 x H100 80GB: per-GPU
  device memory as gpustat / nvidia-smi shows it (CUDA context and allocator cache included) and
  out-of-memory outcomes.

Each run keeps the model and the strategy as the Megatron-LM flat keys its launch script sets,
the GPU count (its ``world_size``) and Megatron's ``--attention-backend``; figures keep their
source's unit, named in the key (``max_allocated_mib``: MiB = 2**20 bytes, what Megatron prints as
"MB"; ``nvidia_smi_mb``: gpustat's "MB", also 2**20 bytes: ``MB = 1024 * 1024`` and
``memory.used // MB`` in wookayin/gpustat ``gpustat/core.py``, whose H100 80GB total reads
"81559 MB", NVML's 81,559 MiB; gpustat >= 1.1 reads NVML's v2 ``used``, ``gpustat/nvml.py``,
which leaves out the driver's reserve, so a figure is the process's own memory, compared with
the plan's reserved peak as it is). A run Blueprinting cannot describe names
why in ``excluded`` (:class:`ExclusionReason`) and keeps the keys that say so.

Scoring (:func:`compare_measured_memory`): every included run is planned with
``blueprinting.api.plan_spec`` and its prediction read on the stage the source reports
(:class:`ReportedStage`): the allocator peak ``max_allocated`` against the plan's allocated peak,
the reserved peak ``max_reserved`` and the device figure ``nvidia_smi`` against its reserved peak
(what decides out-of-memory); the plan's ``fits_in_memory`` against the run's ``oom``. Gates
(issue 19): median |relative error| <= :data:`MEDIAN_ERROR_LIMIT` over every figure of the
included runs; every out-of-memory run predicted not to fit; every run that ran predicted to fit.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, assert_never, final

from blueprinting.errors import BlueprintingError, ProblemCollector
from blueprinting.mapping.flat_keys import FlatValue, canonical_key, from_mapping
from blueprinting.mapping.transformer import AttentionBackend, TrainingSpec
from blueprinting.validation.attainable import ErrorFloor
from blueprinting.validation.fields import (
    boolean,
    choice,
    fixture_path,
    flat_key_values,
    integer,
    number_or_none,
    run_tables,
    string,
    strings,
    toml_table,
)
from blueprinting.validation.modern import gates_json

if TYPE_CHECKING:
    from blueprinting.validation.predictor import PlanCache

#: Issue 19: median |relative error| of the peaks over the runs that plan.
MEDIAN_ERROR_LIMIT = 0.10

_MIB = float(2**20)
#: gpustat's "MB" (module docstring): a mebibyte, like Megatron's.
_GPUSTAT_MB = _MIB


class MeasurementSource(StrEnum):
    """Where a run's figures come from (module docstring)."""

    MEGATRON_FUNCTIONAL_TEST = "megatron_functional_test"
    MEGATRON_OFFLOADING_README = "megatron_offloading_readme"
    VUISENG9_TUTORIAL = "vuiseng9_tutorial"


class ReportedStage(StrEnum):
    """Which pipeline stage a run's figure is on.

    ``last``: the functional tests (the last global rank writes them); ``first``: the offloading
    README's rank 0; ``most_loaded``: p = 1, the only stage; ``unknown``: the tutorial does not
    say which GPU of a pipeline it reports, scored against the most loaded stage (its notes:
    "likely the most-used GPU").
    """

    LAST = "last"
    FIRST = "first"
    MOST_LOADED = "most_loaded"
    UNKNOWN = "unknown"


class ExclusionReason(StrEnum):
    """Why Blueprinting cannot plan a run today. Each names a feature the flat keys cannot say
    (:attr:`keys`: the launch-script keys that set it) or a missing input."""

    #: planned in full since the memory model keeps a recipe's quantized linear inputs
    #: (``analysis/precision_memory.saved_input_bytes``); kept so that a fixture naming it loads
    FP8_RECIPE = "fp8_recipe"
    TP_COMM_OVERLAP = "tp_comm_overlap"
    ACTIVATION_OFFLOAD = "activation_offload"
    INCOMPLETE_CONFIGURATION = "incomplete_configuration"
    NO_SYSTEM_PRESET = "no_system_preset"

    @property
    def keys(self) -> frozenset[str]:
        """The flat keys that set this feature (empty for the two that name a missing input)."""
        match self:
            case ExclusionReason.FP8_RECIPE:
                return frozenset({"fp8_recipe", "fp8_param_gather"})
            case ExclusionReason.TP_COMM_OVERLAP:
                return frozenset({"tp_comm_overlap"})
            case ExclusionReason.ACTIVATION_OFFLOAD:
                return frozenset({"fine_grained_activation_offloading", "offload_modules"})
            case ExclusionReason.INCOMPLETE_CONFIGURATION | ExclusionReason.NO_SYSTEM_PRESET:
                return frozenset()
            case _ as unreachable:
                assert_never(unreachable)


class FigureKind(StrEnum):
    """A measured memory figure, and which predicted peak it is compared with."""

    MAX_ALLOCATED = "max_allocated"
    MAX_RESERVED = "max_reserved"
    NVIDIA_SMI = "nvidia_smi"

    @property
    def unit(self) -> str:
        """The source's unit (the fixture key's suffix)."""
        match self:
            case FigureKind.MAX_ALLOCATED | FigureKind.MAX_RESERVED:
                return "MiB"
            case FigureKind.NVIDIA_SMI:
                return "MB"
            case _ as unreachable:
                assert_never(unreachable)

    @property
    def peak(self) -> PredictedPeak:
        """The allocator peak for ``max_allocated``; the reserved peak for the others."""
        match self:
            case FigureKind.MAX_ALLOCATED:
                return PredictedPeak.ALLOCATED
            case FigureKind.MAX_RESERVED | FigureKind.NVIDIA_SMI:
                return PredictedPeak.RESERVED
            case _ as unreachable:
                assert_never(unreachable)


class PredictedPeak(StrEnum):
    """The two peaks of a plan report: ``memory_bytes[<value>]`` on the most loaded stage."""

    ALLOCATED = "allocated_peak"
    RESERVED = "reserved_peak"

    @property
    def per_stage_key(self) -> str:
        """The ``plan --json`` list of this peak per pipeline stage, stage 0 first."""
        match self:
            case PredictedPeak.ALLOCATED:
                return "memory_allocated_peak_bytes_per_stage"
            case PredictedPeak.RESERVED:
                return "memory_reserved_peak_bytes_per_stage"
            case _ as unreachable:
                assert_never(unreachable)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredMemory:
    """A run's figures in its source's units (``None``: not reported); per-stage tuples are
    stage 0 first, where the source reports every stage."""

    max_allocated_mib: float | None = None
    allocated_mib: float | None = None
    max_reserved_mib: float | None = None
    reserved_mib: float | None = None
    nvidia_smi_mb: float | None = None
    oom: bool | None = None
    max_allocated_mib_per_stage: tuple[float, ...] = ()
    allocated_mib_per_stage: tuple[float, ...] = ()
    max_reserved_mib_per_stage: tuple[float, ...] = ()
    reserved_mib_per_stage: tuple[float, ...] = ()

    def figure_bytes(self, kind: FigureKind) -> float | None:
        """The figure of ``kind`` in bytes, ``None`` when not reported."""
        match kind:
            case FigureKind.MAX_ALLOCATED:
                return None if self.max_allocated_mib is None else self.max_allocated_mib * _MIB
            case FigureKind.MAX_RESERVED:
                return None if self.max_reserved_mib is None else self.max_reserved_mib * _MIB
            case FigureKind.NVIDIA_SMI:
                return None if self.nvidia_smi_mb is None else self.nvidia_smi_mb * _GPUSTAT_MB
            case _ as unreachable:
                assert_never(unreachable)


#: Scalar figures of ``[run.measured]`` (the unit in the name).
MEASURED_FIGURE_KEYS: tuple[str, ...] = (
    "max_allocated_mib",
    "allocated_mib",
    "max_reserved_mib",
    "reserved_mib",
    "nvidia_smi_mb",
)
#: Per-stage figures of ``[run.measured]``.
MEASURED_PER_STAGE_KEYS: tuple[str, ...] = tuple(
    f"{key}_per_stage" for key in MEASURED_FIGURE_KEYS[:4]
)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredMemoryRun:
    """One measured run: provenance, the system it ran on, its flat keys and its figures."""

    id: str
    source: MeasurementSource
    provenance: str
    megatron_core: str
    system: str
    gpu: str
    num_gpus: int
    transformer_impl: str
    attention_backend: AttentionBackend
    stage: ReportedStage
    model_keys: Mapping[str, FlatValue]
    strategy_keys: Mapping[str, FlatValue]
    measured: MeasuredMemory
    excluded: tuple[ExclusionReason, ...] = ()
    complete: bool = True
    notes: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()

    @property
    def included(self) -> bool:
        return not self.excluded

    def flat_keys(self) -> dict[str, FlatValue]:
        """Model and strategy keys with the GPU count as ``world_size`` (Megatron derives the
        data-parallel degree from the launcher's world size); no attention backend."""
        keys: dict[str, FlatValue] = {
            **self.model_keys,
            **self.strategy_keys,
            "world_size": self.num_gpus,
        }
        layout = keys.get("pipeline_model_parallel_layout")
        if isinstance(layout, str):
            # Megatron's CI scripts shell-escape the layout (``Et*3\\|\\(tt...``); the shell
            # hands Megatron the string without the backslashes.
            keys["pipeline_model_parallel_layout"] = layout.replace("\\", "")
        return keys

    def training_spec(self) -> TrainingSpec:
        """The run as a :class:`TrainingSpec`, built by the flat-key adapter."""
        return _from_mapping_with_attention_backend(self.flat_keys(), self.attention_backend)


def _from_mapping_with_attention_backend(
    keys: Mapping[str, FlatValue], backend: AttentionBackend
) -> TrainingSpec:
    """``from_mapping`` with the run's ``attention_backend`` among the keys."""
    return from_mapping({**keys, "attention_backend": backend.value})


def default_fixture_path() -> Path:
    """``tests/validation/fixtures/measured_memory.toml`` of the checkout this module is in."""
    return fixture_path("measured_memory.toml")


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------
_table = toml_table


def _numbers(
    raw: Mapping[str, object], key: str, where: str, problems: ProblemCollector
) -> tuple[float, ...]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(
        isinstance(item, int | float) and not isinstance(item, bool) for item in value
    ):
        problems.add(f"{where}.{key} must be a list of numbers")
        return ()
    return tuple(float(item) for item in value)


def _measured(raw: Mapping[str, object], where: str, problems: ProblemCollector) -> MeasuredMemory:
    known = {*MEASURED_FIGURE_KEYS, *MEASURED_PER_STAGE_KEYS, "oom"}
    unknown = sorted(set(raw) - known)
    if unknown:
        problems.add(f"{where} has unknown keys: {', '.join(unknown)}")
    figures = {key: number_or_none(raw, key, where, problems) for key in MEASURED_FIGURE_KEYS}
    for key, value in figures.items():
        if value is not None and value <= 0:
            problems.add(f"{where}.{key} must be positive, got {value!r}")
    oom: bool | None = None
    if "oom" in raw:
        oom = boolean(raw, "oom", where, problems)
    if oom is None and all(value is None for value in figures.values()):
        problems.add(f"{where} reports neither a figure nor an out-of-memory outcome")
    per_stage = {key: _numbers(raw, key, where, problems) for key in MEASURED_PER_STAGE_KEYS}
    return MeasuredMemory(
        max_allocated_mib=figures["max_allocated_mib"],
        allocated_mib=figures["allocated_mib"],
        max_reserved_mib=figures["max_reserved_mib"],
        reserved_mib=figures["reserved_mib"],
        nvidia_smi_mb=figures["nvidia_smi_mb"],
        oom=oom,
        max_allocated_mib_per_stage=per_stage["max_allocated_mib_per_stage"],
        allocated_mib_per_stage=per_stage["allocated_mib_per_stage"],
        max_reserved_mib_per_stage=per_stage["max_reserved_mib_per_stage"],
        reserved_mib_per_stage=per_stage["reserved_mib_per_stage"],
    )


def _exclusions(
    raw: Mapping[str, object],
    keys: Mapping[str, FlatValue],
    where: str,
    problems: ProblemCollector,
) -> tuple[ExclusionReason, ...]:
    reasons: list[ExclusionReason] = []
    for value in strings(raw, "excluded", where, problems):
        try:
            reasons.append(ExclusionReason(value))
        except ValueError:
            choices = ", ".join(reason.value for reason in ExclusionReason)
            problems.add(f"{where}.excluded: unknown reason {value!r} (one of {choices})")
    if len(set(reasons)) != len(reasons):
        problems.add(f"{where}.excluded repeats a reason")
    given = {canonical_key(key) for key in keys}
    for reason in reasons:
        if reason.keys and not reason.keys & given:
            problems.add(
                f"{where}.excluded names {reason} but the run sets none of "
                f"{', '.join(sorted(reason.keys))}"
            )
    return tuple(reasons)


def _run(
    raw: Mapping[str, object], where: str, problems: ProblemCollector
) -> MeasuredMemoryRun | None:
    run_id = string(raw, "id", where, problems)
    where = f"run {run_id!r}" if run_id else where
    model_keys = flat_key_values(
        _table(raw.get("model"), f"{where}.model", problems), f"{where}.model", problems
    )
    strategy_keys = flat_key_values(
        _table(raw.get("strategy"), f"{where}.strategy", problems), f"{where}.strategy", problems
    )
    both = sorted(set(model_keys) & set(strategy_keys))
    if both:
        problems.add(f"{where}: key(s) in both model and strategy: {', '.join(both)}")
    measured = _measured(
        _table(raw.get("measured"), f"{where}.measured", problems), f"{where}.measured", problems
    )
    num_gpus = integer(raw, "num_gpus", where, problems, fallback=1)
    if num_gpus < 1:
        problems.add(f"{where}.num_gpus must be positive, got {num_gpus}")
    complete = raw.get("complete", True)
    if type(complete) is not bool:
        problems.add(f"{where}.complete must be a boolean, got {complete!r}")
        complete = True
    run = MeasuredMemoryRun(
        id=run_id,
        source=choice(MeasurementSource, raw, "source", where, problems),
        provenance=string(raw, "provenance", where, problems),
        megatron_core=string(raw, "megatron_core", where, problems),
        system=string(raw, "system", where, problems),
        gpu=string(raw, "gpu", where, problems),
        num_gpus=num_gpus,
        transformer_impl=string(raw, "transformer_impl", where, problems),
        attention_backend=choice(AttentionBackend, raw, "attention_backend", where, problems),
        stage=choice(ReportedStage, raw, "stage", where, problems),
        model_keys=MappingProxyType(model_keys),
        strategy_keys=MappingProxyType(strategy_keys),
        measured=measured,
        excluded=_exclusions(raw, {**model_keys, **strategy_keys}, where, problems),
        complete=complete,
        notes=strings(raw, "notes", where, problems),
        assumptions=strings(raw, "assumptions", where, problems),
    )
    return run if run_id else None


def load_measured_memory(path: Path | None = None) -> tuple[MeasuredMemoryRun, ...]:
    """Read the fixture (default :func:`default_fixture_path`), reporting every problem at once."""
    source = path if path is not None else default_fixture_path()
    problems = ProblemCollector(source=str(source))
    runs = run_tables(source, "measured-memory runs", problems, _run)
    problems.raise_if_any()
    return tuple(runs)


# --------------------------------------------------------------------------------------------
# Predictions (the only place that knows how a plan report spells the peaks)
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryPrediction:
    """Predicted peaks in bytes on the stage the run's source reports; ``None``: no figure."""

    allocated_peak_bytes: float | None = None
    reserved_peak_bytes: float | None = None
    fits_in_memory: bool | None = None

    def peak_bytes(self, peak: PredictedPeak) -> float | None:
        match peak:
            case PredictedPeak.ALLOCATED:
                return self.allocated_peak_bytes
            case PredictedPeak.RESERVED:
                return self.reserved_peak_bytes
            case _ as unreachable:
                assert_never(unreachable)


MemoryPredictor = Callable[[MeasuredMemoryRun], MemoryPrediction]


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _stage_number(values: object, stage: ReportedStage) -> float | None:
    """Entry ``0`` (first) or ``-1`` (last) of a per-stage list."""
    if not isinstance(values, list) or not values:
        return None
    match stage:
        case ReportedStage.FIRST:
            return _number(values[0])
        case ReportedStage.LAST:
            return _number(values[-1])
        case ReportedStage.MOST_LOADED | ReportedStage.UNKNOWN:
            return None
        case _ as unreachable:
            assert_never(unreachable)


def _predicted_figure(
    values: Mapping[str, object], peak: PredictedPeak, stage: ReportedStage
) -> float | None:
    """``peak`` in a ``plan --json`` object, on ``stage``: ``<peak.per_stage_key>[0]`` or
    ``[-1]`` for the first or last stage, ``memory_bytes[<peak>]`` (the most loaded stage)
    otherwise."""
    memory = values.get("memory_bytes")
    memory_bytes: Mapping[str, object] = memory if isinstance(memory, Mapping) else {}
    per_stage = values.get(peak.per_stage_key)
    most_loaded = memory_bytes.get(peak.value)
    match stage:
        case ReportedStage.FIRST | ReportedStage.LAST:
            return _stage_number(per_stage, stage)
        case ReportedStage.MOST_LOADED | ReportedStage.UNKNOWN:
            return _number(most_loaded)
        case _ as unreachable:
            assert_never(unreachable)


def prediction_from_report(values: Mapping[str, object], stage: ReportedStage) -> MemoryPrediction:
    """Both peaks on ``stage`` and the fit verdict (``fits_in_memory``) of a report's JSON."""
    fits = values.get("fits_in_memory")
    return MemoryPrediction(
        allocated_peak_bytes=_predicted_figure(values, PredictedPeak.ALLOCATED, stage),
        reserved_peak_bytes=_predicted_figure(values, PredictedPeak.RESERVED, stage),
        fits_in_memory=fits if isinstance(fits, bool) else None,
    )


def api_memory_predictor(plans: PlanCache | None = None) -> MemoryPredictor:
    """A predictor backed by ``blueprinting.api.plan_spec`` (the plan's default options), on the
    run's system preset, through ``plans`` (a new cache when None), without the schedule
    simulation (the memory figures do not read it).

    Raises :class:`UnsupportedError` (with the reason) when the cost model is not installed.
    """
    from blueprinting.validation.predictor import PlanCache

    cache = PlanCache() if plans is None else plans

    def predict(run: MeasuredMemoryRun) -> MemoryPrediction:
        # Memory figures do not depend on the schedule simulation (PlanCache).
        return prediction_from_report(
            cache.values(run.training_spec(), run.system, simulate=False), run.stage
        )

    return predict


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------
def _relative_error(predicted: float | None, measured: float) -> float | None:
    return None if predicted is None else (predicted - measured) / measured


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryRow:
    """One measured figure of an included run against the predicted peaks (bytes)."""

    run_id: str
    kind: FigureKind
    stage: ReportedStage
    measured_bytes: float
    predicted_allocated_bytes: float | None
    predicted_reserved_bytes: float | None
    note: str = ""

    @property
    def predicted_bytes(self) -> float | None:
        """The peak this figure is compared with (:attr:`FigureKind.peak`)."""
        match self.kind.peak:
            case PredictedPeak.ALLOCATED:
                return self.predicted_allocated_bytes
            case PredictedPeak.RESERVED:
                return self.predicted_reserved_bytes
            case _ as unreachable:
                assert_never(unreachable)

    @property
    def relative_error(self) -> float | None:
        return _relative_error(self.predicted_bytes, self.measured_bytes)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FitRow:
    """An included run's outcome (``oom``) against the predicted verdict."""

    run_id: str
    oom: bool
    predicted_fits: bool | None
    note: str = ""

    @property
    def agrees(self) -> bool:
        """The run went out of memory exactly when the plan says it does not fit."""
        return self.predicted_fits is not None and self.predicted_fits is not self.oom


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ExcludedRun:
    run_id: str
    reasons: tuple[ExclusionReason, ...]


class MemoryGate(StrEnum):
    """The issue 19 gates."""

    MEDIAN_ERROR = "peak memory: median |error|"
    OOM_PREDICTED = "out-of-memory runs predicted not to fit"
    RAN_PREDICTED = "runs that ran predicted to fit"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryGateResult:
    """``value``: the median |error| (MEDIAN_ERROR) or the fraction of runs whose verdict agrees;
    ``failing``: the rows that break the gate (for the median, the rows without a prediction)."""

    gate: MemoryGate
    count: int
    value: float | None
    limit: float
    failing: tuple[str, ...]

    @property
    def floor(self) -> ErrorFloor | None:
        """No floor is derived for the memory gates (a verdict or a median, not a max: the
        :mod:`~blueprinting.validation.attainable` argument needs a max over the runs)."""
        return None

    @property
    def passed(self) -> bool:
        if self.count == 0 or self.value is None or self.failing:
            return False
        match self.gate:
            case MemoryGate.MEDIAN_ERROR:
                return self.value <= self.limit
            case MemoryGate.OOM_PREDICTED | MemoryGate.RAN_PREDICTED:
                return self.value >= self.limit
            case _ as unreachable:
                assert_never(unreachable)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryValidation:
    rows: tuple[MemoryRow, ...]
    fits: tuple[FitRow, ...]
    excluded: tuple[ExcludedRun, ...]
    gates: tuple[MemoryGateResult, ...]

    @property
    def passed(self) -> bool:
        return all(result.passed for result in self.gates)

    @property
    def exclusion_counts(self) -> dict[ExclusionReason, int]:
        """Runs naming each reason (a run can name several), in the reasons' order."""
        return {
            reason: count
            for reason in ExclusionReason
            if (count := sum(1 for run in self.excluded if reason in run.reasons))
        }


def _median_gate(rows: Sequence[MemoryRow]) -> MemoryGateResult:
    errors = [abs(error) for row in rows if (error := row.relative_error) is not None]
    return MemoryGateResult(
        gate=MemoryGate.MEDIAN_ERROR,
        count=len(errors),
        value=statistics.median(errors) if errors else None,
        limit=MEDIAN_ERROR_LIMIT,
        failing=tuple(f"{row.run_id}:{row.kind}" for row in rows if row.predicted_bytes is None),
    )


def _fit_gate(gate: MemoryGate, fits: Sequence[FitRow], *, oom: bool) -> MemoryGateResult:
    members = [row for row in fits if row.oom is oom]
    return MemoryGateResult(
        gate=gate,
        count=len(members),
        value=sum(1 for row in members if row.agrees) / len(members) if members else None,
        limit=1.0,
        failing=tuple(row.run_id for row in members if not row.agrees),
    )


def compare_measured_memory(
    predict: MemoryPredictor, runs: Sequence[MeasuredMemoryRun] | None = None
) -> MemoryValidation:
    """Score ``predict`` on the included ``runs`` (default: the fixture). A
    :class:`BlueprintingError` raised for one run leaves its figures and verdict unpredicted,
    with the message as the rows' note (and fails the gates)."""
    chosen = load_measured_memory() if runs is None else runs
    rows: list[MemoryRow] = []
    fits: list[FitRow] = []
    excluded: list[ExcludedRun] = []
    for run in chosen:
        if not run.included:
            excluded.append(ExcludedRun(run_id=run.id, reasons=run.excluded))
            continue
        note = ""
        try:
            prediction = predict(run)
        except BlueprintingError as error:
            prediction = MemoryPrediction()
            note = str(error).splitlines()[0]
        for kind in FigureKind:
            measured = run.measured.figure_bytes(kind)
            if measured is None:
                continue
            rows.append(
                MemoryRow(
                    run_id=run.id,
                    kind=kind,
                    stage=run.stage,
                    measured_bytes=measured,
                    predicted_allocated_bytes=prediction.allocated_peak_bytes,
                    predicted_reserved_bytes=prediction.reserved_peak_bytes,
                    note=note
                    or ("" if prediction.peak_bytes(kind.peak) is not None else "not predicted"),
                )
            )
        if run.measured.oom is not None:
            fits.append(
                FitRow(
                    run_id=run.id,
                    oom=run.measured.oom,
                    predicted_fits=prediction.fits_in_memory,
                    note=note,
                )
            )
    gates = (
        _median_gate(rows),
        _fit_gate(MemoryGate.OOM_PREDICTED, fits, oom=True),
        _fit_gate(MemoryGate.RAN_PREDICTED, fits, oom=False),
    )
    return MemoryValidation(
        rows=tuple(rows), fits=tuple(fits), excluded=tuple(excluded), gates=gates
    )


def memory_to_json_dict(validation: MemoryValidation) -> dict[str, object]:
    """The ``memory`` object of ``blueprinting validate --json`` (bytes; errors as fractions)."""
    return {
        "passed": validation.passed,
        "gates": gates_json(validation.gates),
        "rows": [
            {
                "run": row.run_id,
                "figure": str(row.kind),
                "stage": str(row.stage),
                "measured_bytes": row.measured_bytes,
                "predicted_allocated_peak_bytes": row.predicted_allocated_bytes,
                "predicted_reserved_peak_bytes": row.predicted_reserved_bytes,
                "compared_with": str(row.kind.peak),
                "relative_error": row.relative_error,
                "note": row.note,
            }
            for row in validation.rows
        ],
        "fits": [
            {
                "run": row.run_id,
                "oom": row.oom,
                "predicted_fits": row.predicted_fits,
                "agrees": row.agrees,
                "note": row.note,
            }
            for row in validation.fits
        ],
        "excluded": [
            {"run": run.run_id, "reasons": [str(reason) for reason in run.reasons]}
            for run in validation.excluded
        ],
        "excluded_counts": {
            str(reason): count for reason, count in validation.exclusion_counts.items()
        },
        "excluded_runs": len(validation.excluded),
    }
