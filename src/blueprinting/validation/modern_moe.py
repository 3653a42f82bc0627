"""Measured mixture-of-experts training throughput, and scoring the iteration time on it (issue 13
item 7).

The fixture ``tests/validation/fixtures/modern_moe_runs.toml`` carries, in the format of
``modern_runs.toml`` (read by :func:`blueprinting.validation.modern.load_modern_runs`), the 65 MoE
records of ``shared/reference/modern_runs.json``: Megatron-Bridge's performance summaries
(DeepSeek-V3, Qwen3-30B-A3B, GPT-OSS-120B on DGX-H100, DGX-B200, DGX-GB200; NeMo containers 25.09
to 26.08; force-balanced, dropless unless labelled token-drop) and Megatron-MoE-ModelZoo's
Mixtral 8x22B on 128 H100 (approximate figures). Its header says which Megatron flat keys each
row sets and why.

Scoring (:func:`compare_moe_runs`) is the dense runs' (:func:`~blueprinting.validation.modern.
score_modern_runs`: measured iteration time from tokens/s per GPU, or model TFLOP/s under the
named convention; a run the planner refuses is "not planned" with its message), each row adding
its expert grid (ep, etp), virtual pipeline, pipeline layout and dispatcher; the error is
summarised by model, GPU generation, dispatcher, CUDA-graph capture and container release.
Gates (issue 13 item 7): median |relative error| <= :data:`MOE_MEDIAN_ERROR_LIMIT` and max
<= :data:`MOE_MAX_ERROR_LIMIT` on the iteration time over the planned rows, and every MoE row
planned. No efficiency is fitted on these runs: they are held out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import assert_never, final

from blueprinting.errors import ConfigError, ProblemCollector
from blueprinting.mapping.cuda_graphs import CudaGraphImpl, CudaGraphs, cuda_graph_impl
from blueprinting.mapping.flat_keys import FlatValue, canonical_key, cuda_graphs_from_keys
from blueprinting.mapping.presets import did_you_mean
from blueprinting.mapping.transformer import DispatcherType, FlexBackend
from blueprinting.validation.attainable import ErrorFloor
from blueprinting.validation.fields import fixture_path
from blueprinting.validation.modern import (
    ErrorSummary,
    GateResult,
    GpuGeneration,
    IterationValidation,
    ModernPredictor,
    ModernRow,
    ModernRun,
    ModernSource,
    error_summary,
    gates_json,
    iteration_gates,
    load_modern_runs,
    modern_row_json,
    planned_floor,
    release_groups,
    score_modern_runs,
    summaries_json,
)

#: Issue 13 item 7: median |relative error| of the iteration time over the planned MoE rows.
MOE_MEDIAN_ERROR_LIMIT = 0.10
#: Issue 13 item 7: largest |relative error| of the iteration time over the planned MoE rows.
MOE_MAX_ERROR_LIMIT = 0.25

#: The sources whose rows are mixture-of-experts runs (``modern_runs.md``).
MOE_SOURCES: frozenset[ModernSource] = frozenset(
    {ModernSource.MEGATRON_BRIDGE_MOE, ModernSource.MOE_MODELZOO_MIXTRAL}
)


class MoeDispatcher(StrEnum):
    """The token dispatcher a row runs, a flex dispatcher with its backend."""

    ALLTOALL = "alltoall"
    ALLGATHER = "allgather"
    FLEX_DEEPEP = "flex-deepep"
    FLEX_HYBRIDEP = "flex-hybridep"
    FLEX_NCCLEP = "flex-ncclep"


def _flex(backend: FlexBackend) -> MoeDispatcher:
    match backend:
        case FlexBackend.DEEPEP:
            return MoeDispatcher.FLEX_DEEPEP
        case FlexBackend.HYBRIDEP:
            return MoeDispatcher.FLEX_HYBRIDEP
        case FlexBackend.NCCLEP:
            return MoeDispatcher.FLEX_NCCLEP
        case _ as unreachable:
            assert_never(unreachable)


def moe_dispatcher(keys: Mapping[str, FlatValue]) -> MoeDispatcher:
    """The dispatcher ``keys`` set, with Megatron-LM's defaults (``transformer_config.py``:
    ``moe_token_dispatcher_type`` allgather, ``moe_flex_dispatcher_backend`` deepep; the
    deprecated ``moe_enable_deepep`` is flex with deepep). Read from the keys, not the planned
    spec, so that a row the planner refuses still names its dispatcher; :class:`ConfigError`
    for a value that is not a dispatcher."""
    canonical = {canonical_key(key): value for key, value in keys.items()}
    kind_text = str(canonical.get("moe_token_dispatcher_type", DispatcherType.ALLGATHER.value))
    backend_text = str(canonical.get("moe_flex_dispatcher_backend", FlexBackend.DEEPEP.value))
    kinds = {kind.value: kind for kind in DispatcherType}
    backends = {backend.value: backend for backend in FlexBackend}
    problems = [
        f"{key} {text!r} is not one of {', '.join(choices)}{did_you_mean(text, tuple(choices))}"
        for key, text, choices in (
            ("moe_token_dispatcher_type", kind_text, kinds),
            ("moe_flex_dispatcher_backend", backend_text, backends),
        )
        if text not in choices
    ]
    if problems:
        raise ConfigError(problems)
    kind = kinds[kind_text]
    match kind:
        case DispatcherType.ALLTOALL:
            return MoeDispatcher.ALLTOALL
        case DispatcherType.ALLGATHER:
            return MoeDispatcher.ALLGATHER
        case DispatcherType.FLEX:
            return _flex(backends[backend_text])
        case _ as unreachable:
            assert_never(unreachable)


def default_moe_fixture_path() -> Path:
    """``tests/validation/fixtures/modern_moe_runs.toml`` of the checkout this module is in."""
    return fixture_path("modern_moe_runs.toml")


def load_moe_runs(path: Path | None = None) -> tuple[ModernRun, ...]:
    """Read the MoE fixture (default :func:`default_moe_fixture_path`) with the modern-runs
    loader; every problem at once, including a row from a dense source or whose dispatcher keys
    name no dispatcher."""
    source = path if path is not None else default_moe_fixture_path()
    runs = load_modern_runs(source)
    problems = ProblemCollector(source=str(source))
    for run in runs:
        if run.source not in MOE_SOURCES:
            problems.add(
                f"run {run.id!r}: source {run.source.value!r} is not a mixture-of-experts "
                f"source ({', '.join(sorted(s.value for s in MOE_SOURCES))})"
            )
        try:
            moe_dispatcher(run.strategy_keys)
        except ConfigError as error:
            for problem in error.problems:
                problems.add(f"run {run.id!r}.strategy: {problem}")
    problems.raise_if_any()
    return runs


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------
def _size(keys: Mapping[str, FlatValue], key: str, default: int) -> int:
    value = keys.get(key, default)
    return value if type(value) is int else default


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MoeRow:
    """One MoE run scored: the dense scoring's row (layout, measured and predicted iteration
    time, the planner's message) with the expert grid, the virtual pipeline, the pipeline
    layout (``None``: Megatron's even split) and the dispatcher."""

    row: ModernRow
    expert_parallel: int
    expert_tensor_parallel: int
    virtual_pipeline: int
    pipeline_layout: str | None
    dispatcher: MoeDispatcher
    #: The CUDA graphs the recipe captures (``none``: eager launches, each op issued by the
    #: host); None where the row's graph keys do not read (the planner's message says why).
    cuda_graphs: CudaGraphs | None

    @property
    def run_id(self) -> str:
        return self.row.run_id

    @property
    def planned(self) -> bool:
        return self.row.planned

    @property
    def relative_error(self) -> float | None:
        return self.row.relative_error


def _moe_row(run: ModernRun, row: ModernRow) -> MoeRow:
    keys = run.strategy_keys
    layout = keys.get("pipeline_model_parallel_layout")
    return MoeRow(
        row=row,
        expert_parallel=_size(keys, "expert_model_parallel_size", 1),
        # Megatron-LM's default expert_tensor_parallel_size is t (arguments.py).
        expert_tensor_parallel=_size(keys, "expert_tensor_parallel_size", run.tensor_parallel),
        virtual_pipeline=_size(keys, "virtual_pipeline_model_parallel_size", 1),
        pipeline_layout=layout if isinstance(layout, str) else None,
        dispatcher=moe_dispatcher(keys),
        cuda_graphs=_graphs_or_none(keys),
    )


def _graphs_or_none(keys: Mapping[str, FlatValue]) -> CudaGraphs | None:
    """The row's CUDA graphs; None for keys that do not read, a row left not planned with the
    planner's own message (the split groups it as :data:`UNREAD_GRAPHS`)."""
    try:
        return cuda_graphs_from_keys(keys)
    except ConfigError:
        return None


class MoeSummaryAxis(StrEnum):
    """How the MoE error summaries split the rows."""

    ALL = "all"
    MODEL = "model"
    GENERATION = "generation"
    DISPATCHER = "dispatcher"
    CUDA_GRAPHS = "cuda_graphs"
    RELEASE = "release"


MoeErrorSummary = ErrorSummary[MoeSummaryAxis]


class MoeGate(StrEnum):
    """The issue 13 item 7 gates."""

    MEDIAN_ERROR = "MoE iteration time: median |error| (planned rows)"
    MAX_ERROR = "MoE iteration time: max |error| (planned rows)"
    ALL_PLANNED = "every MoE row planned"


MoeGateResult = GateResult[MoeGate]
MoeValidation = IterationValidation[MoeRow, MoeSummaryAxis, MoeGate]


def summarise_moe(rows: Sequence[MoeRow]) -> tuple[MoeErrorSummary, ...]:
    """All rows, then per model (in first-seen order), per GPU generation and per dispatcher
    (each in its enum's order), per CUDA-graph capture (eager first), per container release
    (:func:`~blueprinting.validation.modern.release_groups`); groups without rows are left
    out."""
    out = [error_summary(MoeSummaryAxis.ALL, "all", rows)]
    for model in dict.fromkeys(row.row.model for row in rows):
        members = [row for row in rows if row.row.model == model]
        out.append(error_summary(MoeSummaryAxis.MODEL, model, members))
    for generation in GpuGeneration:
        members = [row for row in rows if row.row.generation is generation]
        if members:
            out.append(error_summary(MoeSummaryAxis.GENERATION, generation.value, members))
    for dispatcher in MoeDispatcher:
        members = [row for row in rows if row.dispatcher is dispatcher]
        if members:
            out.append(error_summary(MoeSummaryAxis.DISPATCHER, dispatcher.value, members))
    order = {_graphs_label(row.cuda_graphs): _graphs_order(row.cuda_graphs) for row in rows}
    for label in sorted(order, key=order.__getitem__):
        members = [row for row in rows if _graphs_label(row.cuda_graphs) == label]
        out.append(error_summary(MoeSummaryAxis.CUDA_GRAPHS, label, members))
    for name, members in release_groups(rows, lambda row: row.row.release):
        out.append(error_summary(MoeSummaryAxis.RELEASE, name, members))
    return tuple(out)


#: The CUDA-graph split's order: eager launches, Transformer Engine's per-module captures, then
#: Megatron's local graphs (per layer or the full iteration); rows whose keys do not read last.
_GRAPHS_ORDER: tuple[CudaGraphImpl, ...] = (
    CudaGraphImpl.NONE,
    CudaGraphImpl.TRANSFORMER_ENGINE,
    CudaGraphImpl.LOCAL,
)

#: The CUDA-graph group of a row whose graph keys do not read.
UNREAD_GRAPHS = "unread"


def _graphs_label(graphs: CudaGraphs | None) -> str:
    return UNREAD_GRAPHS if graphs is None else str(graphs)


def _graphs_order(graphs: CudaGraphs | None) -> tuple[int, str]:
    """The implementation's place in :data:`_GRAPHS_ORDER` (unread last), then the scope."""
    if graphs is None:
        return (len(_GRAPHS_ORDER), UNREAD_GRAPHS)
    return (_GRAPHS_ORDER.index(cuda_graph_impl(graphs)), str(graphs))


def _gates(rows: Sequence[MoeRow], floor: ErrorFloor | None) -> tuple[MoeGateResult, ...]:
    return iteration_gates(
        rows,
        (MoeGate.MEDIAN_ERROR, MoeGate.MAX_ERROR, MoeGate.ALL_PLANNED),
        median_limit=MOE_MEDIAN_ERROR_LIMIT,
        max_limit=MOE_MAX_ERROR_LIMIT,
        max_floor=floor,
    )


def compare_moe_runs(
    predict: ModernPredictor, runs: Sequence[ModernRun] | None = None
) -> MoeValidation:
    """Score ``predict`` on the MoE ``runs`` (default: the fixture) with the modern runs' scoring
    (a :class:`~blueprinting.errors.BlueprintingError` leaves a run not planned, with the
    planner's message), then the MoE summaries and the issue 13 gates."""
    chosen = tuple(load_moe_runs() if runs is None else runs)
    rows = tuple(
        _moe_row(run, row)
        for run, row in zip(chosen, score_modern_runs(predict, chosen), strict=True)
    )
    # excluded rows stay in the table and the summaries' row counts, outside the gates
    compared = [(run, row) for run, row in zip(chosen, rows, strict=True) if run.excluded is None]
    floor = planned_floor((run, row.row) for run, row in compared)
    return MoeValidation(
        rows=rows,
        summaries=summarise_moe(rows),
        gates=_gates([row for _, row in compared], floor),
    )


def moe_to_json_dict(validation: MoeValidation) -> dict[str, object]:
    """The ``moe`` object of ``blueprinting validate --json`` (seconds; errors as fractions)."""
    return {
        "passed": validation.passed,
        "gates": gates_json(validation.gates),
        "summaries": summaries_json(validation.summaries),
        "rows": [
            modern_row_json(
                row.row,
                {
                    "ep": row.expert_parallel,
                    "etp": row.expert_tensor_parallel,
                    "vp": row.virtual_pipeline,
                    "pipeline_layout": row.pipeline_layout,
                    "dispatcher": str(row.dispatcher),
                    "cuda_graphs": None if row.cuda_graphs is None else str(row.cuda_graphs),
                },
            )
            for row in validation.rows
        ],
        "planned_runs": len(validation.planned_rows),
        "not_planned_runs": len(validation.not_planned_rows),
    }
