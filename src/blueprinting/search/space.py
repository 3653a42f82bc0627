"""Enumeration of the training-strategy space and its vectorized law filter (issue #8).

The candidate set is a structure of arrays: one numpy column per knob. It is built in two levels
so that the laws are evaluated once per distinct law-relevant combination:

1. The *core* table holds every knob some law reads: GPUs N, t, p, d = N / (t*p), v, micro-batch
   size b, sequence parallelism (with its TP comm overlap), the recompute variant (with its layer
   count), the P2P overlap and the microbatch group size G. It is a Cartesian product (numpy
   index grids) of ``(N, t, p)`` x v x b x sp x recompute, then a ragged expansion of
   interleaved rows (v > 1) by overlap_p2p_comm x G and of sequence-parallel rows with t > 1 by
   the TP comm overlap.
2. The *free* knobs no law reads (optimizer sharding, overlap_param_gather inside a sharded
   variant, overlap_grad_reduce) multiply each core row by a count that depends only on d. Laws
   are evaluated on the core table and each rejection is weighted by that count, so the report
   counts the full product; only the rows that pass are expanded into the returned table.

Axes (each generates only values that can pass its own law, so nothing is lost: a v that does not
divide L fails ``L mod (p*v)`` for every p, a b that does not divide B fails ``B mod (d*b)``):

- t: divisors of gcd(N, gpus_per_node) (a TP group stays inside one node, Megatron places TP ranks
  consecutively), or every divisor of N with ``allow_cross_node_tp``;
- p: every divisor of N / t; d = N / (t*p) (so ``world_size`` holds by construction);
- v: every divisor of L, for every p (p = 1 with v > 1 is generated and rejected by
  ``schedule_matches_pipeline``, so the report shows it);
- b: divisors of B up to ``max_microbatch_size`` (None: no cap, as Calculon does);
- sequence parallel: ``space.sequence_parallel`` (on with t = 1 is generated; Megatron's rule
  rejects it);
- recompute: ``space.recompute``; a full variant is crossed with ``space.recompute_num_layers``;
- interleaved rows only: overlap_p2p_comm in ``space.overlap_p2p_comm``; G = Megatron's default
  (p), plus G = m where it matters (policy ``where-it-matters``: m > p and m mod p != 0, where
  the default is refused by Megatron and one group of all m microbatches is legal; a legal G > p
  never shortens the bubble and only raises memory, see ``shared/reference/schedules.md`` 3-4);
- sequence-parallel rows with t > 1 only: the userbuffer TP overlap in ``space.tp_comm_overlap``
  (``UserbufferOverlap()``, Transformer Engine's default switches; default ``(False,)``, so the
  counts below are unchanged); its buffer-shape law (s*b) mod t follows from ``local_sequence``
  on those rows, so it fires only where that law does;
- d > 1 only: sharding in ``space.sharding`` (overlap_param_gather crossed in for a sharded
  variant) and overlap_grad_reduce; with d = 1 sharding is meaningless and only
  ``NoOptimizerSharding`` without overlap is produced.

Count for GPT-3 175B (L=96, heads=96, s=2048) on N=1024 GPUs of 8 per node, B=1536, default
space: t in {1,2,4,8}; p over the divisors of 1024/t gives 11+10+9+8 = 38 (t, p) pairs, 4 of them
with d = 1; free-knob weight 14 for d > 1 (no_shard + 3 sharded x 2 param-gather overlaps, x 2
grad-reduce overlaps) and 1 for d = 1, summing to 34*14 + 4 = 480; v: 1 + 11 interleaved divisors
of 96 x 2 P2P overlaps = 23; b: 20 divisors of 1536; sp 2 x recompute 3 = 6. That is
480 * 23 * 20 * 6 = 1,324,800, plus 55,968 interleaved candidates with G = m (m > p, m mod p != 0):
1,380,768 enumerated, of which 53,625 pass every law: 4,875 law-abiding core rows (all with d > 1)
times the 11 free options Megatron accepts (3 of the 14, a sharded variant with
overlap_param_gather but not overlap_grad_reduce, break ``--overlap-param-gather``'s rule;
``tests/search/test_space.py`` pins the counts, ``benchmarks/bench_search_space.py`` times it:
about 20 ms on one core).

Comparison with Calculon (calculon-ai/calculon at caa4b11, ``calculon/llm/optimal_execution.py``):
its loops run tp over divisors of N dividing h and heads (1..32, crossing nodes), pp over divisors
of min(N/tp, L) dividing both, interleaving over divisors of L/pp, recompute 3, optimizer sharding
2 (d > 1), TP communication 3 (ar, p2p_rs_ag, rs_ag), seq_par_ag_redo 2 (rs_ag without full
recompute), data_par_overlap 2 (d > 1), tensor_par_overlap 3 (t > 1), weight/activation/optimizer
offload 2 each (a100_80g has a 512 GiB mem2; activations not with full recompute), micro-batch
over divisors of the local batch, and a network tier (2 on a100_80g) for each of tp, pp, dp > 1.
Recounting those loops independently for GPT-3 175B / 1024 / max batch 1536 gives 11,698,528
executions, not the ~6.3 million quoted in the issue (no mix of its options we tried gives 6.3M;
without DP overlap it is 5,867,504). Its batch is the largest multiple of d under the maximum,
ours the exact global batch. Of its knobs, offloads, network-tier placement, tensor_par_overlap,
seq_par_ag_redo and p2p_rs_ag have no Megatron-LM flag we model (x8 offloads, up to x8 placements,
x3 TP overlap); we add what Megatron has and Calculon lacks: four sharding strategies with
overlap_param_gather, overlap_grad_reduce, overlap_p2p_comm and the microbatch group size.
Calculon also generates only law-abiding structures (its tp/pp/ppint/mbs generators pre-filter)
and rejects the rest inside its model, so its 11.7M are to be compared with our 53,625 valid
candidates rather than our 1.38M enumerated: our space is about 220x smaller for this case
because its x8 offload and x8 network-placement axes have no counterpart and because Megatron's
interleaving rules (G = p needs m mod p == 0, p > 2) remove combinations Calculon evaluates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from math import gcd
from typing import assert_never, final

import numpy as np
import numpy.typing as npt

from blueprinting.errors import ConfigError, positive_int_problem
from blueprinting.limits import MAX_SEARCH_CANDIDATES, MAX_SEARCH_ROWS
from blueprinting.mapping.divisors import divisor_count
from blueprinting.mapping.law_names import Law
from blueprinting.mapping.model import TransformerModelSpec
from blueprinting.mapping.pipeline_layout import (
    BALANCED_LAYOUT_MAX_VIRTUAL,
    PipelineLayouts,
    balanced_layout,
)
from blueprinting.mapping.precision import (
    Fp4Precision,
    Fp8Precision,
    HighPrecision,
    TrainingPrecision,
    userbuffers_carry,
)
from blueprinting.mapping.transformer import (
    AllReduce,
    AllToAllDispatcher,
    BatchSpec,
    ContextParallel,
    CpCommType,
    DataParallel,
    EvenStages,
    ExpertParallel,
    FlexibleStages,
    FullRecompute,
    GradReduceDtype,
    NoRecompute,
    NoTpCommOverlap,
    PipelineParallel,
    RecomputeMethod,
    RecomputeModule,
    RecomputePolicy,
    ReduceScatterAllGather,
    SelectiveRecompute,
    ShardingVariant,
    TensorParallel,
    TokenDispatcher,
    TrainingSpec,
    TransformerTrainingMappingSpec,
    TransformerTrainingParallelism,
    UserbufferOverlap,
    dispatcher_overlaps,
    divisors,
    single_level_communication,
    training_schedule,
)
from blueprinting.search.laws_vectorized import (
    FREE_OPTION_LAWS,
    LawColumns,
    applied_laws,
    free_option_violations,
    law_violations,
)
from blueprinting.search.strategy_text import (
    format_strategy_parts,
    format_strategy_text,
    parse_strategy_text,
)

__all__ = [
    "CandidateTable",
    "Enumeration",
    "EnumerationReport",
    "MicrobatchGroupPolicy",
    "PipelineLayouts",
    "RecomputeVariant",
    "SearchSpace",
    "ShardingVariant",
    "candidate_to_spec",
    "enumerate_strategies",
    "format_strategy_text",
    "parse_strategy_text",
]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


class RecomputeVariant(StrEnum):
    """Activation recomputation choices (Korthikanti et al. 2022, Section 5; Megatron's
    ``recompute_granularity`` / ``recompute_method``)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL_UNIFORM = "full-uniform"
    FULL_BLOCK = "full-block"

    @property
    def is_full(self) -> bool:
        return self in (RecomputeVariant.FULL_UNIFORM, RecomputeVariant.FULL_BLOCK)

    @staticmethod
    def of(recompute: RecomputePolicy) -> RecomputeVariant:
        match recompute:
            case NoRecompute():
                return RecomputeVariant.NONE
            case SelectiveRecompute():
                return RecomputeVariant.SELECTIVE
            case FullRecompute(method=method):
                match method:
                    case RecomputeMethod.UNIFORM:
                        return RecomputeVariant.FULL_UNIFORM
                    case RecomputeMethod.BLOCK:
                        return RecomputeVariant.FULL_BLOCK
                    case _ as unreachable_method:
                        assert_never(unreachable_method)
            case _ as unreachable:
                assert_never(unreachable)

    def build(self, num_layers: int) -> RecomputePolicy:
        """The variant's ADT value; ``num_layers`` is read by the full variants only."""
        match self:
            case RecomputeVariant.NONE:
                return NoRecompute()
            case RecomputeVariant.SELECTIVE:
                return SelectiveRecompute()
            case RecomputeVariant.FULL_UNIFORM:
                return FullRecompute(method=RecomputeMethod.UNIFORM, num_layers=num_layers)
            case RecomputeVariant.FULL_BLOCK:
                return FullRecompute(method=RecomputeMethod.BLOCK, num_layers=num_layers)
            case _ as unreachable:
                assert_never(unreachable)


def layout_of(model: TransformerModelSpec, pipeline: int, virtual: int) -> FlexibleStages | None:
    """The balanced layout a row with (p, v) runs under ``PipelineLayouts.BALANCED`` where the
    layers do not split evenly; None where they do (or where no balanced layout exists)."""
    if model.num_layers % (pipeline * virtual) == 0 or virtual > BALANCED_LAYOUT_MAX_VIRTUAL:
        return None
    return _balanced_layout(model.num_layers, model.mtp_num_layers, pipeline * virtual)


@lru_cache(maxsize=1024)
def _balanced_layout(num_layers: int, mtp_layers: int, stages: int) -> FlexibleStages | None:
    # one value per shape: a --csv of every row builds each row's parts, and the parts' own
    # cache hashes the layout's stages on every call
    return balanced_layout(num_layers, mtp_layers, stages)


def _virtual_stages(model: TransformerModelSpec, space: SearchSpace) -> list[int]:
    """v values: the divisors of L (an even split), and under balanced layouts every v up to
    ``BALANCED_LAYOUT_MAX_VIRTUAL`` besides."""
    values = set(divisors(model.num_layers))
    if space.pipeline_layouts is PipelineLayouts.BALANCED:
        values |= set(range(1, BALANCED_LAYOUT_MAX_VIRTUAL + 1))
    return sorted(values)


class MicrobatchGroupPolicy(StrEnum):
    """Which microbatch group sizes G an interleaved candidate gets (see the module docstring)."""

    DEFAULT = "default"
    WHERE_IT_MATTERS = "where-it-matters"


RECOMPUTE_CODES: tuple[RecomputeVariant, ...] = tuple(RecomputeVariant)
# ShardingVariant is defined beside OptimizerSharding (mapping/transformer.py) and re-exported
# here; tables store its member index, so the member order is part of the table format.
SHARDING_CODES: tuple[ShardingVariant, ...] = tuple(ShardingVariant)
CP_COMM_CODES: tuple[CpCommType, ...] = tuple(CpCommType)


def _cp_degrees(space: SearchSpace, model: TransformerModelSpec, rest: int) -> list[int]:
    """cp degrees dividing ``rest`` (= N / t) that the space allows."""
    if space.context_parallel is None:
        return [c for c in divisors(rest) if model.seq_length % (2 * c) == 0 or c == 1]
    return [c for c in space.context_parallel if rest % c == 0]


def _no_duplicates(name: str, values: tuple[object, ...], problems: list[str]) -> None:
    if not values:
        problems.append(f"SearchSpace.{name} must not be empty")
    elif len(set(values)) != len(values):
        problems.append(f"SearchSpace.{name} has repeated values: {values!r}")


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """The options of a strategy search: which values each knob may take."""

    gpu_counts: tuple[int, ...]
    global_batch_size: int
    gpus_per_node: int = 8
    allow_cross_node_tp: bool = False
    megatron_rules: bool = True
    max_microbatch_size: int | None = None
    sequence_parallel: tuple[bool, ...] = (False, True)
    recompute: tuple[RecomputeVariant, ...] = (
        RecomputeVariant.NONE,
        RecomputeVariant.SELECTIVE,
        RecomputeVariant.FULL_UNIFORM,
    )
    recompute_num_layers: tuple[int, ...] = (1,)
    sharding: tuple[ShardingVariant, ...] = field(default_factory=lambda: SHARDING_CODES)
    overlap_param_gather: tuple[bool, ...] = (False, True)
    overlap_grad_reduce: tuple[bool, ...] = (False, True)
    overlap_p2p_comm: tuple[bool, ...] = (False, True)
    microbatch_group: MicrobatchGroupPolicy = MicrobatchGroupPolicy.WHERE_IT_MATTERS
    #: cp degrees; ``None``: every divisor c of N / t with ``seq_length mod 2c == 0`` (the
    #: divisors ``cp_sequence_split`` allows). The default searches no context parallelism.
    context_parallel: tuple[int, ...] | None = (1,)
    #: comm types crossed with every cp > 1 (a2a+p2p's two sizes are not searched).
    cp_comm_types: tuple[CpCommType, ...] = (CpCommType.P2P,)
    #: precision recipes on the model's base datatype, crossed with every row (the
    #: recipe-vs-accelerator law is checked once per recipe by the caller,
    #: ``search.rank.run_search``; of the enumeration's laws only ``tp_comm_overlap_quantizer``
    #: reads the recipe).
    precision: tuple[TrainingPrecision, ...] = (HighPrecision(),)
    #: Transformer Engine's userbuffer TP communication overlap with its default switches
    #: (``UserbufferOverlap()``, Megatron's ``--tp-comm-overlap``), crossed with the
    #: sequence-parallel rows with t > 1 only: the overlap lives inside RS+AG, and at t = 1
    #: there is no TP collective to hide. Other rows take ``False``.
    tp_comm_overlap: tuple[bool, ...] = (False,)
    #: expert-parallel degrees of a MoE model; ``None``: every divisor of num_experts (the
    #: ``expert_world_size`` law keeps those whose grid folds into t x cp x d). Dense models
    #: take ep = 1 whatever this says.
    expert_parallel: tuple[int, ...] | None = None
    #: expert-tensor-parallel degrees; ``None``: every divisor of moe_ffn_hidden_size. The
    #: default is Megatron's (1), the published MoE recipes' choice.
    expert_tensor_parallel: tuple[int, ...] | None = (1,)
    #: token dispatchers (with their EP overlap) crossed with every MoE row.
    dispatchers: tuple[TokenDispatcher, ...] = (AllToAllDispatcher(),)
    #: the gradient reduction datatype of every row (``DataParallel.grad_reduce_dtype``; not
    #: searched: a numerics choice the user makes, as Megatron-Bridge's recipes do)
    grad_reduce_dtype: GradReduceDtype = GradReduceDtype.DEFAULT
    #: the stage layouts enumerated (:class:`PipelineLayouts`)
    pipeline_layouts: PipelineLayouts = PipelineLayouts.EVEN

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.pipeline_layouts is PipelineLayouts.BALANCED:
            based = [
                str(r)
                for r in self.precision
                if isinstance(r, Fp8Precision | Fp4Precision) and r.high_precision_layers != (0, 0)
            ]
            if based:
                problems.append(
                    "SearchSpace.pipeline_layouts = balanced is not searched with base-precision "
                    f"first / last layers ({', '.join(based)}): plan such a layout with "
                    "pipeline_model_parallel_layout"
                )
        for key, value in (
            ("global_batch_size", self.global_batch_size),
            ("gpus_per_node", self.gpus_per_node),
            ("max_microbatch_size", self.max_microbatch_size),
            *(("gpu_counts", n) for n in self.gpu_counts),
            *(("recompute_num_layers", n) for n in self.recompute_num_layers),
        ):
            if value is None and key == "max_microbatch_size":
                continue
            problem = positive_int_problem(f"SearchSpace.{key}", value)
            if problem is not None:
                problems.append(problem)
        _no_duplicates("gpu_counts", self.gpu_counts, problems)
        _no_duplicates("sequence_parallel", self.sequence_parallel, problems)
        _no_duplicates("recompute", self.recompute, problems)
        _no_duplicates("recompute_num_layers", self.recompute_num_layers, problems)
        _no_duplicates("sharding", self.sharding, problems)
        _no_duplicates("overlap_param_gather", self.overlap_param_gather, problems)
        _no_duplicates("overlap_grad_reduce", self.overlap_grad_reduce, problems)
        _no_duplicates("overlap_p2p_comm", self.overlap_p2p_comm, problems)
        _no_duplicates("cp_comm_types", self.cp_comm_types, problems)
        _no_duplicates("precision", self.precision, problems)
        _no_duplicates("tp_comm_overlap", self.tp_comm_overlap, problems)
        _no_duplicates("dispatchers", self.dispatchers, problems)
        for name, degrees in (
            ("expert_parallel", self.expert_parallel),
            ("expert_tensor_parallel", self.expert_tensor_parallel),
        ):
            if degrees is None:
                continue
            _no_duplicates(name, degrees, problems)
            for degree in degrees:
                problem = positive_int_problem(f"SearchSpace.{name}", degree)
                if problem is not None:
                    problems.append(problem)
        if self.context_parallel is not None:
            _no_duplicates("context_parallel", self.context_parallel, problems)
            for c in self.context_parallel:
                problem = positive_int_problem("SearchSpace.context_parallel", c)
                if problem is not None:
                    problems.append(problem)
        if CpCommType.A2A_P2P in self.cp_comm_types:
            problems.append(
                "SearchSpace.cp_comm_types: a2a+p2p is not searched (its hierarchical sizes are "
                "not enumerated); plan it with hierarchical_context_parallel_sizes"
            )
        if problems:
            raise ConfigError(problems, source="search space")


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CandidateTable:
    """Candidates as a structure of arrays, row i being one strategy.

    ``recompute`` and ``sharding`` index ``RECOMPUTE_CODES`` / ``SHARDING_CODES``;
    ``recompute_num_layers`` is 0 unless the variant is full; ``microbatch_group`` is 0 for
    Megatron's default (p). ``candidate_to_spec`` turns a row into the ADT value.
    """

    global_batch_size: int
    num_gpus: IntArray
    tensor: IntArray
    pipeline: IntArray
    data: IntArray
    virtual_stages: IntArray
    micro_batch: IntArray
    sequence_parallel: BoolArray
    recompute: IntArray
    recompute_num_layers: IntArray
    overlap_p2p_comm: BoolArray
    microbatch_group: IntArray
    sharding: IntArray
    overlap_param_gather: BoolArray
    overlap_grad_reduce: BoolArray
    context: IntArray
    cp_comm: IntArray  # index into CP_COMM_CODES
    precision: IntArray  # index into precisions
    tp_comm_overlap: BoolArray  # UserbufferOverlap() (only on sequence-parallel rows, t > 1)
    precisions: tuple[TrainingPrecision, ...] = (HighPrecision(),)
    #: the expert grid: ep, etp and the index into ``dispatchers`` (a dense model's rows hold
    #: 1, 1, 0 and plan Megatron's default ``ExpertParallel()``)
    expert: IntArray
    expert_tensor: IntArray
    dispatcher: IntArray
    dispatchers: tuple[TokenDispatcher, ...] = (AllToAllDispatcher(),)
    #: every row's ``DataParallel.grad_reduce_dtype`` (:attr:`SearchSpace.grad_reduce_dtype`)
    grad_reduce_dtype: GradReduceDtype = GradReduceDtype.DEFAULT

    def __len__(self) -> int:
        return int(self.tensor.shape[0])

    @property
    def microbatch_count(self) -> IntArray:
        """m = B / (d*b), exact on rows that satisfy the laws."""
        return (self.global_batch_size // self.data) // self.micro_batch


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class EnumerationReport:
    """What the law filter did: ``rejections`` has one entry per applied law, in ``Law`` order,
    zeros included; a candidate breaking several laws is counted under each."""

    candidates_enumerated: int
    candidates_valid: int
    rejections: tuple[tuple[Law, int], ...]

    def rejected(self, law: Law) -> int:
        for name, count in self.rejections:
            if name is law:
                return count
        raise KeyError(law)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Enumeration:
    """The candidates that satisfy every applied law, and the filter's report."""

    table: CandidateTable
    report: EnumerationReport


# --------------------------------------------------------------------------------------------
# Enumeration
# --------------------------------------------------------------------------------------------
def _ragged(counts: IntArray) -> tuple[IntArray, IntArray]:
    """Expand row i into counts[i] rows: (source row, option index within the row)."""
    rows = np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    option = np.arange(rows.shape[0], dtype=np.int64) - np.repeat(starts, counts)
    return rows, option


def _free_options(space: SearchSpace) -> tuple[IntArray, BoolArray, BoolArray]:
    """(sharding code, overlap_param_gather, overlap_grad_reduce) of a d > 1 row, sharding
    outermost, in the order the space lists them."""
    options: list[tuple[int, bool, bool]] = []
    for variant in space.sharding:
        gathers = (False,) if variant is ShardingVariant.NO_SHARD else space.overlap_param_gather
        for gather in gathers:
            for grad in space.overlap_grad_reduce:
                options.append((SHARDING_CODES.index(variant), gather, grad))
    return (
        np.array([o[0] for o in options], dtype=np.int64),
        np.array([o[1] for o in options], dtype=np.bool_),
        np.array([o[2] for o in options], dtype=np.bool_),
    )


def expert_grids(space: SearchSpace, model: TransformerModelSpec) -> list[tuple[int, int, int]]:
    """(ep, etp, dispatcher index) of every expert grid the space crosses with a row: for a
    MoE model ep over the divisors of num_experts (or the listed ones), etp over the divisors
    of moe_ffn_hidden_size (or the listed ones), each dispatcher; a dense model has one, the
    default grid."""
    moe = model.moe
    if moe is None:
        return [(1, 1, 0)]
    eps = divisors(moe.num_experts) if space.expert_parallel is None else space.expert_parallel
    etps = (
        divisors(moe.expert_ffn_hidden_size)
        if space.expert_tensor_parallel is None
        else space.expert_tensor_parallel
    )
    return [(ep, etp, k) for ep in eps for etp in etps for k in range(len(space.dispatchers))]


def _micro_batches(space: SearchSpace) -> list[int]:
    cap = (
        space.global_batch_size if space.max_microbatch_size is None else space.max_microbatch_size
    )
    return [b for b in divisors(space.global_batch_size) if b <= cap]


def space_rows(model: TransformerModelSpec, space: SearchSpace) -> int:
    """An upper bound on the law-relevant rows :func:`enumerate_strategies` builds, from divisor
    counts alone (nothing is enumerated): every interleaved row is counted with all its P2P and
    group options and every sequence-parallel row with all its TP-overlap options."""
    pairs = 0
    comm = len(space.cp_comm_types) * len(space.precision)
    plain = len(space.precision)
    grids = len(expert_grids(space, model))
    for n in space.gpu_counts:
        tp_limit = n if space.allow_cross_node_tp else gcd(n, space.gpus_per_node)
        for t in divisors(tp_limit):
            for c in _cp_degrees(space, model, n // t):
                pairs += divisor_count(n // (t * c)) * (comm if c > 1 else plain)
    recompute = sum(len(space.recompute_num_layers) if r.is_full else 1 for r in space.recompute)
    per_v = 1 + 2 * len(space.overlap_p2p_comm) * (len(_virtual_stages(model, space)) - 1)
    sp = sum(len(space.tp_comm_overlap) if on else 1 for on in space.sequence_parallel)
    return pairs * grids * per_v * len(_micro_batches(space)) * sp * recompute


def _refuse_size(what: str, value: int, limit: int, hint: str) -> ConfigError:
    return ConfigError(
        [f"search space too large: {what} = {value:,} exceeds the limit of {limit:,}; {hint}"],
        source="search space",
    )


def _selective_modules() -> frozenset[RecomputeModule]:
    """The modules the space's one selective variant recomputes (Megatron's default)."""
    selective = RecomputeVariant.SELECTIVE.build(1)
    return selective.modules if isinstance(selective, SelectiveRecompute) else frozenset()


def enumerate_strategies(model: TransformerModelSpec, space: SearchSpace) -> Enumeration:
    """Every strategy of ``space`` for ``model`` that satisfies the laws, plus the rejections.

    The space is sized first (:func:`space_rows`) and refused beyond ``MAX_SEARCH_ROWS``; the
    lawful candidates are counted before they are expanded and refused beyond
    ``MAX_SEARCH_CANDIDATES`` (both ``ConfigError``)."""
    gbs = space.global_batch_size
    bound = space_rows(model, space)
    if bound > MAX_SEARCH_ROWS:
        raise _refuse_size(
            "law-relevant rows (GPU counts x t x p x v x micro-batch x sp x recompute)",
            bound,
            MAX_SEARCH_ROWS,
            "search fewer GPU counts, cap --max-micro-batch, or choose a GPU count or global "
            "batch with fewer divisors",
        )
    triples: list[tuple[int, ...]] = []
    comm_codes = [CP_COMM_CODES.index(kind) for kind in space.cp_comm_types]
    grids = expert_grids(space, model)
    for n in space.gpu_counts:
        tp_limit = n if space.allow_cross_node_tp else gcd(n, space.gpus_per_node)
        for t in divisors(tp_limit):
            for c in _cp_degrees(space, model, n // t):
                for code in comm_codes if c > 1 else [CP_COMM_CODES.index(CpCommType.P2P)]:
                    for r in range(len(space.precision)):
                        triples.extend(
                            (n, t, p, c, code, r, *grid)
                            for p in divisors(n // (t * c))
                            for grid in grids
                        )
    triple = np.array(triples, dtype=np.int64).reshape(-1, 9)
    vs = np.array(_virtual_stages(model, space), dtype=np.int64)
    mbs = np.array(_micro_batches(space), dtype=np.int64)
    sps = np.array(space.sequence_parallel, dtype=np.bool_)
    rec_rows = [
        (RECOMPUTE_CODES.index(r), layers)
        for r in space.recompute
        for layers in (space.recompute_num_layers if r.is_full else (0,))
    ]
    rec = np.array(rec_rows, dtype=np.int64).reshape(-1, 2)

    grid = np.indices((triple.shape[0], vs.shape[0], mbs.shape[0], sps.shape[0], rec.shape[0]))
    i_tri, i_v, i_b, i_sp, i_rec = (axis.reshape(-1) for axis in grid)
    num_gpus, t, p = triple[i_tri, 0], triple[i_tri, 1], triple[i_tri, 2]
    cp, cp_code, recipe = triple[i_tri, 3], triple[i_tri, 4], triple[i_tri, 5]
    ep, etp, disp = triple[i_tri, 6], triple[i_tri, 7], triple[i_tri, 8]
    d = num_gpus // (t * cp * p)
    v, b, sp = vs[i_v], mbs[i_b], sps[i_sp]
    rec_code, rec_layers = rec[i_rec, 0], rec[i_rec, 1]

    # Interleaved rows: P2P overlap x group size. (B // d) // b = B // (d*b) without the product,
    # which can pass int64 when N and B are both large.
    m = (gbs // d) // b
    interleaved = v > 1
    whole_group = (
        interleaved
        & (space.microbatch_group is MicrobatchGroupPolicy.WHERE_IT_MATTERS)
        & (m > p)
        & (m % p != 0)
    )
    n_groups = 1 + whole_group.astype(np.int64)
    p2ps = np.array(space.overlap_p2p_comm, dtype=np.bool_)
    rows, k = _ragged(np.where(interleaved, p2ps.shape[0] * n_groups, 1))
    num_gpus, t, p, d, v, b, sp = (x[rows] for x in (num_gpus, t, p, d, v, b, sp))
    cp, cp_code, recipe = cp[rows], cp_code[rows], recipe[rows]
    ep, etp, disp = ep[rows], etp[rows], disp[rows]
    rec_code, rec_layers, m, n_g = rec_code[rows], rec_layers[rows], m[rows], n_groups[rows]
    interleaved = v > 1
    p2p = interleaved & p2ps[k // n_g]
    group = np.where(interleaved & (k % n_g == 1), m, 0)

    # Sequence-parallel rows with t > 1: x the TP-overlap options (the others have no TP
    # collective the userbuffers could hide, so they keep False alone).
    tp_overlaps = np.array(space.tp_comm_overlap, dtype=np.bool_)
    overlappable = sp & (t > 1)
    rows, k = _ragged(np.where(overlappable, tp_overlaps.shape[0], 1))
    num_gpus, t, p, d, v, b, sp = (x[rows] for x in (num_gpus, t, p, d, v, b, sp))
    cp, cp_code, recipe = cp[rows], cp_code[rows], recipe[rows]
    ep, etp, disp = ep[rows], etp[rows], disp[rows]
    rec_code, rec_layers, m = rec_code[rows], rec_layers[rows], m[rows]
    p2p, group = p2p[rows], group[rows]
    tp_overlap = overlappable[rows] & tp_overlaps[k]

    full = np.isin(rec_code, [RECOMPUTE_CODES.index(r) for r in RECOMPUTE_CODES if r.is_full])
    layout_rows, layout_blocks = _layout_columns(model, space, p, v)
    columns = LawColumns(
        num_gpus=num_gpus,
        tensor=t,
        pipeline=p,
        data=d,
        virtual_stages=v,
        micro_batch=b,
        sequence_parallel=sp,
        recompute_full=full,
        recompute_num_layers=rec_layers,
        overlap_p2p_comm=p2p,
        microbatch_group=group,
        context=cp,
        cp_head_split=cp_code == CP_COMM_CODES.index(CpCommType.A2A),
        cp_ring=np.isin(
            cp_code, [CP_COMM_CODES.index(c) for c in (CpCommType.P2P, CpCommType.A2A_P2P)]
        ),
        tp_comm_overlap=tp_overlap,
        userbuffer_recipe=np.array([userbuffers_carry(r) for r in space.precision])[recipe],
        selective=rec_code == RECOMPUTE_CODES.index(RecomputeVariant.SELECTIVE),
        expert=ep,
        expert_tensor=etp,
        dispatcher=disp,
        balanced_layout=layout_rows,
        layout_stage_blocks=layout_blocks,
    )
    masks = law_violations(
        columns,
        model,
        gbs,
        megatron_rules=space.megatron_rules,
        dispatchers=space.dispatchers,
        selective_modules=_selective_modules(),
    )
    free_sharding, free_gather, free_grad = _free_options(space)
    free_masks = free_option_violations(free_gather, free_grad, megatron_rules=space.megatron_rules)
    weight = np.where(d > 1, free_sharding.shape[0], 1)
    rejected = np.zeros(t.shape[0], dtype=np.bool_)
    free_rejected = np.zeros(free_sharding.shape[0], dtype=np.bool_)
    multi_rows = int((d > 1).sum())
    counts: list[tuple[Law, int]] = []
    for law in applied_laws(megatron_rules=space.megatron_rules):
        if law in FREE_OPTION_LAWS:
            # Broken by each of its free options on every d > 1 row (d = 1 has none).
            free_mask = free_masks[law]
            free_rejected |= free_mask
            counts.append((law, int(free_mask.sum()) * multi_rows))
            continue
        mask = masks[law]
        rejected |= mask
        counts.append((law, int(weight[mask].sum())))
    keep = ~rejected
    legal_free = np.flatnonzero(~free_rejected)
    lawful = int(np.where(d[keep] > 1, legal_free.shape[0], 1).sum())
    if lawful > MAX_SEARCH_CANDIDATES:
        raise _refuse_size(
            "lawful candidates",
            lawful,
            MAX_SEARCH_CANDIDATES,
            "narrow the space (fewer GPU counts, --max-micro-batch)",
        )

    rows, k = _ragged(np.where(d[keep] > 1, legal_free.shape[0], 1))
    multi = d[keep][rows] > 1
    # Index of the free option of each expanded row (0, unused, where d = 1 or none is legal).
    option = legal_free[np.where(multi, k, 0)] if legal_free.shape[0] else np.zeros_like(k)
    no_shard = SHARDING_CODES.index(ShardingVariant.NO_SHARD)
    table = CandidateTable(
        global_batch_size=gbs,
        num_gpus=num_gpus[keep][rows],
        tensor=t[keep][rows],
        pipeline=p[keep][rows],
        data=d[keep][rows],
        virtual_stages=v[keep][rows],
        micro_batch=b[keep][rows],
        sequence_parallel=sp[keep][rows],
        recompute=rec_code[keep][rows],
        recompute_num_layers=rec_layers[keep][rows],
        overlap_p2p_comm=p2p[keep][rows],
        microbatch_group=group[keep][rows],
        sharding=np.where(multi, free_sharding[option], no_shard),
        overlap_param_gather=multi & free_gather[option],
        overlap_grad_reduce=multi & free_grad[option],
        context=cp[keep][rows],
        cp_comm=cp_code[keep][rows],
        precision=recipe[keep][rows],
        tp_comm_overlap=tp_overlap[keep][rows],
        precisions=space.precision,
        expert=ep[keep][rows],
        expert_tensor=etp[keep][rows],
        dispatcher=disp[keep][rows],
        dispatchers=space.dispatchers,
        grad_reduce_dtype=space.grad_reduce_dtype,
    )
    report = EnumerationReport(
        candidates_enumerated=int(weight.sum()),
        candidates_valid=len(table),
        rejections=tuple(counts),
    )
    return Enumeration(table=table, report=report)


# --------------------------------------------------------------------------------------------
# One row as the ADT value
# --------------------------------------------------------------------------------------------
def _layout_columns(
    model: TransformerModelSpec, space: SearchSpace, p: IntArray, v: IntArray
) -> tuple[BoolArray, IntArray]:
    """(the rows that run a balanced layout, the most blocks any physical stage of theirs holds;
    0 elsewhere) under ``PipelineLayouts.BALANCED``; none otherwise."""
    rows = np.zeros(p.shape, dtype=np.bool_)
    blocks = np.zeros(p.shape, dtype=np.int64)
    if space.pipeline_layouts is PipelineLayouts.EVEN or p.shape[0] == 0:
        return rows, blocks
    pairs, inverse = np.unique(np.stack([p, v], axis=1), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    found = np.zeros(pairs.shape[0], dtype=np.bool_)
    most = np.zeros(pairs.shape[0], dtype=np.int64)
    for k, (degree, virtual) in enumerate(pairs.tolist()):
        layout = layout_of(model, int(degree), int(virtual))
        if layout is None:
            continue
        found[k] = True
        most[k] = max(layout.rank_blocks(int(degree)))
    return found[inverse], most[inverse]


def candidate_to_spec(table: CandidateTable, i: int, model: TransformerModelSpec) -> TrainingSpec:
    """Row ``i`` of ``table`` as a :class:`TrainingSpec` for ``model``.

    The parts (TP, PP, DP, recompute, CP, expert grid) are built by memoized constructors: a
    search builds one spec per block configuration and per row it lists or writes (``--csv``),
    and the parts repeat across rows; they are immutable, so rows may share them."""
    values = tuple(getattr(table, column)[i].item() for column in _PART_COLUMNS)
    parts = _row_parts(table, model, values)
    return TrainingSpec(
        model=model,
        mapping=TransformerTrainingMappingSpec(
            parallelism=TransformerTrainingParallelism(
                tensor=parts.tensor,
                pipeline=parts.pipeline,
                data=parts.data,
                recompute=parts.recompute,
                context=parts.context,
                experts=parts.experts,
            ),
            batch=parts.batch,
            precision=parts.precision,
        ),
    )


def strategy_texts(
    table: CandidateTable,
    rows: Sequence[int] | npt.NDArray[np.int64],
    model: TransformerModelSpec,
) -> list[str]:
    """``format_strategy_text(candidate_to_spec(table, i, model).mapping)`` for every ``i`` of
    ``rows``, from the same memoized parts without building each row's spec, the columns read
    once (``--csv`` writes the text of every candidate: up to ``MAX_SEARCH_CANDIDATES`` rows)."""
    index = np.asarray(rows, dtype=np.int64)
    columns = [getattr(table, column)[index].tolist() for column in _PART_COLUMNS]
    texts = []
    for values in zip(*columns, strict=True):
        parts = _row_parts(table, model, values)
        texts.append(
            format_strategy_parts(
                tensor=parts.tensor,
                context=parts.context,
                pipeline=parts.pipeline,
                data=parts.data,
                experts=parts.experts,
                recompute=parts.recompute,
                precision=parts.precision,
                batch=parts.batch,
            )
        )
    return texts


#: The table columns a row's parts are built from, in :func:`_row_parts`'s order.
_PART_COLUMNS = (
    "tensor",
    "sequence_parallel",
    "tp_comm_overlap",
    "pipeline",
    "virtual_stages",
    "microbatch_group",
    "overlap_p2p_comm",
    "data",
    "sharding",
    "overlap_param_gather",
    "overlap_grad_reduce",
    "recompute",
    "recompute_num_layers",
    "context",
    "cp_comm",
    "expert",
    "expert_tensor",
    "dispatcher",
    "micro_batch",
    "precision",
)


@final
@dataclass(frozen=True, slots=True)
class _RowParts:
    tensor: TensorParallel
    pipeline: PipelineParallel
    data: DataParallel
    recompute: RecomputePolicy
    context: ContextParallel
    experts: ExpertParallel
    batch: BatchSpec
    precision: TrainingPrecision


def _row_parts(
    table: CandidateTable, model: TransformerModelSpec, values: Sequence[int | bool]
) -> _RowParts:
    """One row's parts from its :data:`_PART_COLUMNS` values (Python scalars)."""
    (
        tensor,
        sequence_parallel,
        tp_overlap,
        pipeline,
        virtual,
        group,
        overlap_p2p,
        data,
        sharding,
        gather,
        grad,
        recompute,
        recompute_layers,
        context,
        cp_comm,
        expert,
        expert_tensor,
        dispatcher_code,
        micro_batch,
        precision,
    ) = values
    dispatcher = table.dispatchers[int(dispatcher_code)]
    return _RowParts(
        tensor=_tensor_part(
            int(tensor), sequence_parallel=bool(sequence_parallel), overlap=bool(tp_overlap)
        ),
        pipeline=_pipeline_part(
            int(pipeline),
            int(virtual),
            # Code 0 is Megatron's default group size (p).
            group=int(group) if group > 0 else None,
            overlap_p2p_comm=bool(overlap_p2p),
            ep_overlap=model.moe is not None and dispatcher_overlaps(dispatcher),
            # a row whose layers do not split evenly passed the laws with its balanced layout
            layout=layout_of(model, int(pipeline), int(virtual)) or _EVEN,
        ),
        data=_data_part(
            int(data),
            sharding=int(sharding),
            overlap_param_gather=bool(gather),
            overlap_grad_reduce=bool(grad),
            grad_reduce_dtype=table.grad_reduce_dtype,
        ),
        recompute=_recompute_part(int(recompute), int(recompute_layers)),
        context=_context_part(int(context), int(cp_comm)),
        experts=(
            _DEFAULT_EXPERTS
            if model.moe is None
            else _expert_part(int(expert), int(expert_tensor), dispatcher)
        ),
        batch=_batch_part(table.global_batch_size, int(micro_batch)),
        precision=table.precisions[int(precision)],
    )


@lru_cache(maxsize=1024)
def _batch_part(global_batch_size: int, micro_batch_size: int) -> BatchSpec:
    return BatchSpec(global_batch_size=global_batch_size, micro_batch_size=micro_batch_size)


_DEFAULT_EXPERTS = ExpertParallel()


@lru_cache(maxsize=1024)
def _tensor_part(degree: int, *, sequence_parallel: bool, overlap: bool) -> TensorParallel:
    return TensorParallel(
        degree=degree,
        communication=(
            ReduceScatterAllGather(overlap=UserbufferOverlap() if overlap else NoTpCommOverlap())
            if sequence_parallel
            else AllReduce()
        ),
    )


_EVEN = EvenStages()


@lru_cache(maxsize=4096)
def _pipeline_part(
    degree: int,
    virtual_stages: int,
    *,
    group: int | None,
    overlap_p2p_comm: bool,
    ep_overlap: bool,
    layout: EvenStages | FlexibleStages = _EVEN,
) -> PipelineParallel:
    return PipelineParallel(
        degree=degree,
        schedule=training_schedule(
            degree,
            virtual_stages,
            microbatch_group_size=group,
            overlap_p2p_comm=overlap_p2p_comm,
            ep_overlap=ep_overlap,
        ),
        layout=layout,
    )


@lru_cache(maxsize=4096)
def _data_part(
    degree: int,
    *,
    sharding: int,
    overlap_param_gather: bool,
    overlap_grad_reduce: bool,
    grad_reduce_dtype: GradReduceDtype = GradReduceDtype.DEFAULT,
) -> DataParallel:
    return DataParallel(
        degree=degree,
        optimizer_sharding=SHARDING_CODES[sharding].build(
            overlap_param_gather=overlap_param_gather
        ),
        overlap_grad_reduce=overlap_grad_reduce,
        grad_reduce_dtype=grad_reduce_dtype,
    )


@lru_cache(maxsize=1024)
def _recompute_part(code: int, num_layers: int) -> RecomputePolicy:
    return RECOMPUTE_CODES[code].build(num_layers)


@lru_cache(maxsize=1024)
def _context_part(degree: int, comm: int) -> ContextParallel:
    return ContextParallel(
        degree=degree, communication=single_level_communication(CP_COMM_CODES[comm])
    )


@lru_cache(maxsize=1024)
def _expert_part(degree: int, tensor_degree: int, dispatcher: TokenDispatcher) -> ExpertParallel:
    return ExpertParallel(degree=degree, tensor_degree=tensor_degree, dispatcher=dispatcher)
