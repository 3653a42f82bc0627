"""Search: enumerate, evaluate (vectorized), keep what fits in memory, rank, Pareto front, explain.

Ranking objectives (lower score is better; ties keep enumeration order, so results are stable):

- ``iteration-time``: seconds per iteration (the scalar plan's ``iteration_time_s``);
- ``tokens-per-second``: ``B s / T`` (descending);
- ``time-to-train``: whole iterations to process ``train_tokens`` tokens times ``T``
  (``IterationReport.time_to_train_s``);
- ``gpu-hours``: ``time-to-train x N / 3600``, the cost in GPU-hours.

For one GPU count and one global batch the first three give the same order; ``gpu-hours`` differs
when the space lists several GPU counts.

A candidate *fits* when its most loaded stage's memory plus the requested headroom is at most the
HBM capacity (``memory_reserved_peak + headroom <= capacity``: the device peak, issue #19).
Every figure uses the seed's contract bubble (``BubbleSource.CONTRACT``), never the simulated one.

Every law, including Megatron-LM's ``overlap_param_gather => overlap_grad_reduce``, is applied by
the enumeration (``search/space.py``) before evaluation; a candidate that reaches the ranking is
lawful, and only memory can still exclude it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeAlias, assert_never, final

import numpy as np
import numpy.typing as npt

from blueprinting.analysis.evaluate import PlanOptions
from blueprinting.analysis.flops import FlopsConvention
from blueprinting.analysis.iteration import BubbleSource
from blueprinting.analysis.report import IterationReport
from blueprinting.errors import (
    InvalidStrategyError,
    LawViolation,
    VerificationError,
)
from blueprinting.hardware.system import SystemSpec
from blueprinting.mapping.law_names import Law
from blueprinting.mapping.laws import check_training
from blueprinting.mapping.model import TransformerModelSpec
from blueprinting.mapping.precision_laws import accelerator_violation
from blueprinting.mapping.transformer import (
    CombinedOneForwardOneBackward,
    DistributedOptimizer,
    DualPipe,
    DualPipeV,
    ForwardOnly,
    FullRecompute,
    FusedAttention,
    HierarchicalAllToAllRing,
    InterleavedOneForwardOneBackward,
    NoOptimizerSharding,
    NoRecompute,
    NoTpCommOverlap,
    OneForwardOneBackward,
    SelectiveRecompute,
    ShardedGradients,
    ShardedParameters,
    SingleStage,
    TrainingSpec,
    TransformerTrainingMappingSpec,
    UserbufferOverlap,
    ZeroBubbleH1,
    cp_comm_type,
)
from blueprinting.search.evaluate_vectorized import CandidateFigures, evaluate_candidates
from blueprinting.search.space import (
    CP_COMM_CODES,
    RECOMPUTE_CODES,
    SHARDING_CODES,
    CandidateTable,
    EnumerationReport,
    RecomputeVariant,
    SearchSpace,
    ShardingVariant,
    candidate_to_spec,
    enumerate_strategies,
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

PARAM_GATHER_LAW = str(Law.MEGATRON_OVERLAP_PARAM_GATHER)
MEMORY_REASON = "memory_exceeds_capacity"
DEFAULT_TRAIN_TOKENS = 300_000_000_000
"""GPT-3's training run (Brown et al. 2020, Section 2.2): 300B tokens."""


class Objective(StrEnum):
    """What the search minimizes (module docstring)."""

    ITERATION_TIME = "iteration-time"
    TOKENS_PER_SECOND = "tokens-per-second"
    TIME_TO_TRAIN = "time-to-train"
    GPU_HOURS = "gpu-hours"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RankOptions:
    objective: Objective = Objective.ITERATION_TIME
    memory_headroom_bytes: int = 0
    train_tokens: int = DEFAULT_TRAIN_TOKENS
    flops_convention: FlopsConvention = FlopsConvention.MEGATRON_LEGACY


def objective_score(figures: CandidateFigures, options: RankOptions) -> FloatArray:
    """The score each candidate is ranked by (lower is better)."""
    iteration = figures.iteration_time_s
    iterations = -(-options.train_tokens // figures.tokens_per_iteration)
    match options.objective:
        case Objective.ITERATION_TIME:
            return iteration
        case Objective.TOKENS_PER_SECOND:
            return -figures.tokens_per_second
        case Objective.TIME_TO_TRAIN:
            return iterations * iteration
        case Objective.GPU_HOURS:
            return iterations * iteration * figures.world_size / 3600.0
        case _ as unreachable:
            assert_never(unreachable)


def ranking_order(score: FloatArray, eligible: BoolArray) -> IntArray:
    """Indices of the eligible rows, best score first, enumeration order on ties."""
    rows = np.flatnonzero(eligible)
    return rows[np.argsort(score[rows], kind="stable")].astype(np.int64)


def pareto_front(time_s: FloatArray, memory: IntArray, eligible: BoolArray) -> IntArray:
    """Eligible rows no other eligible row beats on both iteration time and peak memory (at
    least as good on both and better on one), fastest first; of exact duplicates the first."""
    rows = ranking_order(time_s, eligible)
    if rows.shape[0] == 0:
        return rows
    mem = memory[rows]
    # Sorted by time (then by memory for equal times), a row is on the front iff its memory is
    # below every earlier row's.
    by_time_then_memory = np.lexsort((mem, time_s[rows]))
    rows, mem = rows[by_time_then_memory], mem[by_time_then_memory]
    earlier_min = np.minimum.accumulate(np.concatenate(([np.iinfo(np.int64).max], mem[:-1])))
    return rows[mem < earlier_min]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResult:
    """A finished search: the candidates, their figures and the ranking."""

    model: TransformerModelSpec
    system: SystemSpec
    space: SearchSpace
    options: RankOptions
    table: CandidateTable
    figures: CandidateFigures
    enumeration: EnumerationReport
    fits: BoolArray
    score: FloatArray
    order: IntArray
    seconds: float

    @property
    def candidates_enumerated(self) -> int:
        return self.enumeration.candidates_enumerated

    @property
    def candidates_valid(self) -> int:
        return len(self.table)

    @property
    def candidates_fit(self) -> int:
        return int(self.order.shape[0])

    @property
    def memory_limit_bytes(self) -> int:
        return self.figures.memory_capacity - self.options.memory_headroom_bytes

    def rejections(self) -> dict[str, int]:
        """Every reason a candidate left the ranking, with its count (a candidate breaking
        several laws counts under each)."""
        counts = {str(law): count for law, count in self.enumeration.rejections}
        counts[MEMORY_REASON] = int((~self.fits).sum())
        return counts

    def pareto(self) -> IntArray:
        return pareto_front(
            self.figures.iteration_time_s, self.figures.memory_reserved_peak, self.fits
        )


def run_search(
    model: TransformerModelSpec,
    system: SystemSpec,
    space: SearchSpace,
    options: RankOptions | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    sized: Callable[[int], None] | None = None,
) -> SearchResult:
    """Enumerate ``space``, evaluate every valid candidate, rank those that fit.

    ``sized(candidates)`` is called once the lawful candidates are counted, before any is
    evaluated; ``progress(done, total)`` while the block configurations are costed."""
    chosen = RankOptions() if options is None else options
    start = time.perf_counter()
    if space.megatron_rules:
        refused = [
            violation
            for precision in space.precision
            if (violation := accelerator_violation(precision, system.accelerator.support))
            is not None
        ]
        if refused:
            raise InvalidStrategyError(refused, subject=f"search on {system.name}")
    enumeration = enumerate_strategies(model, space)
    table = enumeration.table
    if len(table) == 0:
        raise VerificationError(
            "search: no candidate of the space satisfies the laws "
            f"(rejections: {dict((str(k), v) for k, v in enumeration.report.rejections)})"
        )
    if sized is not None:
        sized(len(table))
    figures = evaluate_candidates(
        table, model, system, flops_convention=chosen.flops_convention, progress=progress
    )
    fits = figures.memory_reserved_peak + chosen.memory_headroom_bytes <= figures.memory_capacity
    score = objective_score(figures, chosen)
    order = ranking_order(score, fits)
    return SearchResult(
        model=model,
        system=system,
        space=space,
        options=chosen,
        table=table,
        figures=figures,
        enumeration=enumeration.report,
        fits=fits,
        score=score,
        order=order,
        seconds=time.perf_counter() - start,
    )


# --------------------------------------------------------------------------------------------
# Why not: where a given strategy stands
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ExcludedByLaw:
    violations: tuple[LawViolation, ...]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class NotInSpace:
    """Legal, but a knob takes a value the searched space does not list; ``layout_differs``:
    its (p, v) is a row, but the row runs another pipeline layout (the even split, or the
    balanced one of ``--pipeline-layouts balanced``)."""

    row: None = None
    layout_differs: bool = False


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ExcludedByMemory:
    row: int
    total_bytes: int
    limit_bytes: int


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Ranked:
    row: int
    rank: int
    of: int
    score: float
    best_score: float

    @property
    def gap(self) -> float:
        """Relative distance to the best score (0 for the best)."""
        return (self.score - self.best_score) / abs(self.best_score)


Standing: TypeAlias = ExcludedByLaw | NotInSpace | ExcludedByMemory | Ranked


def _row_values(mapping: TransformerTrainingMappingSpec) -> dict[str, int | bool]:
    """The table columns of a strategy (see ``CandidateTable``)."""
    par = mapping.parallelism
    values: dict[str, int | bool] = {
        "tensor": par.tensor.degree,
        "pipeline": par.pipeline.degree,
        "data": par.data.degree,
        "micro_batch": mapping.batch.micro_batch_size,
        "sequence_parallel": mapping.sequence_parallel,
        "tp_comm_overlap": mapping.tp_comm_overlap == UserbufferOverlap(),
        "overlap_grad_reduce": par.data.overlap_grad_reduce,
        "virtual_stages": 1,
        "overlap_p2p_comm": False,
        "microbatch_group": 0,
        "recompute_num_layers": 0,
        "overlap_param_gather": False,
    }
    match par.pipeline.schedule:
        case (
            InterleavedOneForwardOneBackward(
                virtual_stages=v, microbatch_group_size=group, overlap_p2p_comm=overlap
            )
            | CombinedOneForwardOneBackward(
                virtual_stages=v, microbatch_group_size=group, overlap_p2p_comm=overlap
            )
        ):
            values["virtual_stages"] = v
            values["overlap_p2p_comm"] = overlap
            values["microbatch_group"] = 0 if group is None else group
        case SingleStage() | OneForwardOneBackward():
            pass
        case ZeroBubbleH1() | ForwardOnly() | DualPipe() | DualPipeV():
            values["virtual_stages"] = -1  # no such schedule in a search table
        case _ as unreachable_schedule:
            assert_never(unreachable_schedule)
    recompute = par.recompute
    values["recompute"] = RECOMPUTE_CODES.index(RecomputeVariant.of(recompute))
    match recompute:
        case FullRecompute(num_layers=n):
            values["recompute_num_layers"] = n
        case NoRecompute() | SelectiveRecompute():
            pass
        case _ as unreachable_recompute:
            assert_never(unreachable_recompute)
    sharding = par.data.optimizer_sharding
    values["sharding"] = SHARDING_CODES.index(ShardingVariant.of(sharding))
    match sharding:
        case DistributedOptimizer() | ShardedGradients() | ShardedParameters():
            values["overlap_param_gather"] = sharding.overlap_param_gather
        case NoOptimizerSharding():
            pass
        case _ as unreachable:
            assert_never(unreachable)
    return values


def find_row(table: CandidateTable, mapping: TransformerTrainingMappingSpec) -> int | None:
    """The row of ``table`` holding ``mapping``, or None (also for a choice the space never
    varies and fixes at Megatron's default: the attention kernel, selective recompute's
    modules, the userbuffer overlap's switches)."""
    if mapping.batch.global_batch_size != table.global_batch_size:
        return None
    if mapping.attention != FusedAttention():
        return None
    recompute = mapping.parallelism.recompute
    if isinstance(recompute, SelectiveRecompute) and recompute != SelectiveRecompute():
        return None
    # the space plans the userbuffer overlap with Transformer Engine's default switches only
    if mapping.tp_comm_overlap not in (NoTpCommOverlap(), UserbufferOverlap()):
        return None
    # the cp axis and the precision recipe: a2a+p2p and recipes outside the space are not rows
    context = mapping.parallelism.context
    if isinstance(context.communication, HierarchicalAllToAllRing):
        return None
    if mapping.precision not in table.precisions:
        return None
    mask = np.ones(len(table), dtype=np.bool_)
    for column, value in _row_values(mapping).items():
        mask &= getattr(table, column) == value
    mask &= table.context == context.degree
    mask &= table.cp_comm == CP_COMM_CODES.index(cp_comm_type(context.communication))
    mask &= table.precision == table.precisions.index(mapping.precision)
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.shape[0] else None


def standing(result: SearchResult, spec: TrainingSpec) -> Standing:
    """Why ``spec`` is (or is not) where it is in ``result``'s ranking."""
    violations = check_training(spec.model, spec.mapping, megatron=result.space.megatron_rules)
    if violations:
        return ExcludedByLaw(violations=violations)
    row = find_row(result.table, spec.mapping)
    if row is None:
        return NotInSpace()
    # the row's layout is the one the search plans for its (p, v): another layout of the same
    # p and v is another strategy, not this row
    planned = candidate_to_spec(result.table, row, spec.model).mapping.parallelism.pipeline
    if planned.layout != spec.mapping.parallelism.pipeline.layout:
        return NotInSpace(layout_differs=True)
    total = int(result.figures.memory_reserved_peak[row])
    if not result.fits[row]:
        return ExcludedByMemory(row=row, total_bytes=total, limit_bytes=result.memory_limit_bytes)
    position = np.flatnonzero(result.order == row)
    return Ranked(
        row=row,
        rank=int(position[0]) + 1,
        of=result.candidates_fit,
        score=float(result.score[row]),
        best_score=float(result.score[result.order[0]]),
    )


def exact_reports(result: SearchResult, rows: IntArray) -> list[IterationReport]:
    """The scalar plan of each row (contract bubble), checked against the vectorized figures:
    a relative difference above 1e-9 in the iteration time or a different memory total is a
    bug, raised as :class:`VerificationError`."""
    from blueprinting.api import plan_spec

    options = PlanOptions(
        flops_convention=result.options.flops_convention,
        bubble_source=BubbleSource.CONTRACT,
        megatron_rules=result.space.megatron_rules,
        train_tokens=result.options.train_tokens,  # search --json's time_to_train reads it
        simulate=False,  # the contract is what is compared; no schedule to build
    )
    reports = []
    for row in rows:
        report = plan_spec(
            candidate_to_spec(result.table, int(row), result.model), result.system, options
        )
        fast = float(result.figures.iteration_time_s[row])
        exact = report.iteration_time_s
        if abs(fast - exact) > 1e-9 * abs(exact) or report.memory.reserved_peak != int(
            result.figures.memory_reserved_peak[row]
        ):
            raise VerificationError(
                f"search: the vectorized figures of {report.spec.mapping} differ from the plan "
                f"(iteration {fast!r} vs {exact!r} s, reserved memory peak "
                f"{int(result.figures.memory_reserved_peak[row])} vs "
                f"{report.memory.reserved_peak} bytes)"
            )
        reports.append(report)
    return reports
