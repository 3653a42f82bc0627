"""The typed strategy and schedule ADT (seed: "Algebraic data model").

``TransformerTrainingMappingSpec`` stores parallelism as its canonical pattern-matchable structure:

    TransformerTrainingParallelism
    ├── tensor: TensorParallel(degree, communication)
    ├── pipeline: PipelineParallel(degree, schedule)
    ├── data: DataParallel(degree, optimizer_sharding)
    ├── recompute: RecomputePolicy
    └── context: ContextParallel(degree, communication)

Degree-named properties (``tensor_degree``, ``world_size``, ``microbatch_count``...) are derived
projections: they are neither stored nor serialized. Every sum-type variant is its own frozen
dataclass; an option that matters for one variant lives inside it. ``__post_init__`` checks only
single-value invariants; cross-field laws live in :mod:`blueprinting.mapping.laws`.

Inference has its own top-level record whose parallelism uses :class:`ReplicaParallel`, so
independent serving replicas are never mislabeled as data parallelism with gradient sync.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeAlias, assert_never, final

from blueprinting.errors import ConfigError, positive_int_problems
from blueprinting.mapping.cuda_graphs import CudaGraphs, NoCudaGraphs
from blueprinting.mapping.divisors import divisors
from blueprinting.mapping.model import Datatype, TransformerModelSpec
from blueprinting.mapping.precision import HighPrecision, TrainingPrecision


def _require_positive(owner: str, **values: int) -> None:
    bad = positive_int_problems(owner, **values)
    if bad:
        raise ConfigError(bad)


# --------------------------------------------------------------------------------------------
# Tensor-parallel communication
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AllReduce:
    """Megatron's default TP boundary: an all-reduce after each row-parallel GEMM."""

    def __str__(self) -> str:
        return "ar"


#: Transformer Engine's default number of chunks of a pipelined reduce-scatter
#: (``transformer_engine/pytorch/module/base.py`` l.336-396 @d0067d0d: ``num_splits`` 4 for the
#: ``pipeline`` and ``bulk`` methods).
TE_PIPELINE_SPLITS = 4


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class BulkOverlap:
    """Transformer Engine's ``bulk`` backward overlap of a column-parallel linear (qkv, fc1;
    ``layernorm_linear.py`` l.706-713 @d0067d0d): ``dgrad`` runs the all-gather of the
    sequence-parallel input (needed by the weight gradient) beside the dgrad GEMM
    (Megatron ``tp_comm_bulk_dgrad``, TE ``ub_bulk_dgrad``); ``wgrad`` runs the reduce-scatter of
    the input gradient beside the wgrad GEMM (``tp_comm_bulk_wgrad``, ``ub_bulk_wgrad``). A
    collective not bulk-overlapped keeps Megatron's async overlap."""

    dgrad: bool = True
    wgrad: bool = True

    def __str__(self) -> str:
        parts = [name for name, on in (("dgrad", self.dgrad), ("wgrad", self.wgrad)) if on]
        return "bulk=" + ("+".join(parts) if parts else "none")


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PipelinedDgradReduceScatter:
    """``--tp-comm-overlap-rs-dgrad`` (TE ``ub_overlap_rs_dgrad``, base.py l.517-536): the
    reduce-scatter of a column-parallel linear's input gradient is pipelined behind its dgrad
    GEMM in ``splits`` chunks; both bulk overlaps are off (the re-gather keeps the async
    overlap)."""

    splits: int = TE_PIPELINE_SPLITS

    def __post_init__(self) -> None:
        _require_positive("PipelinedDgradReduceScatter", splits=self.splits)

    def __str__(self) -> str:
        return f"rs_dgrad/{self.splits}"


ColumnBackwardOverlap: TypeAlias = BulkOverlap | PipelinedDgradReduceScatter


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class NoTpCommOverlap:
    """Megatron's default: no userbuffer overlap (``tp_comm_overlap`` false)."""

    def __str__(self) -> str:
        return ""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class UserbufferOverlap:
    """``--tp-comm-overlap``: Transformer Engine's userbuffer communication-GEMM overlap
    (Megatron-LM ``model_parallel_config.py`` l.265-340 @d98e8a64; TE ``module/base.py``
    l.336-396 @d0067d0d), per GEMM class:

    - ``all_gather`` (``tp_comm_overlap_ag``): ring-exchange all-gather in t chunks before the
      column-parallel fprop GEMMs (qkv, fc1) and before the row-parallel dgrad GEMMs (proj, fc2);
    - ``reduce_scatter`` (``tp_comm_overlap_rs``): pipelined reduce-scatter in
      ``reduce_scatter_splits`` chunks after the row-parallel fprop GEMMs (proj, fc2);
    - ``column_backward``: bulk overlaps (default) or the pipelined dgrad reduce-scatter.
    """

    all_gather: bool = True
    reduce_scatter: bool = True
    reduce_scatter_splits: int = TE_PIPELINE_SPLITS
    column_backward: ColumnBackwardOverlap = field(default_factory=BulkOverlap)

    def __post_init__(self) -> None:
        _require_positive("UserbufferOverlap", reduce_scatter_splits=self.reduce_scatter_splits)

    def __str__(self) -> str:
        parts = [
            *(["ag=ring"] if self.all_gather else []),
            *([f"rs=pipe/{self.reduce_scatter_splits}"] if self.reduce_scatter else []),
            str(self.column_backward),
        ]
        return "ub(" + ",".join(parts) + ")"


TpCommOverlap: TypeAlias = NoTpCommOverlap | UserbufferOverlap


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ReduceScatterAllGather:
    """Sequence parallelism (Korthikanti et al. 2022, Section 4.2.2): reduce-scatter after the
    row-parallel GEMM, all-gather before the column-parallel one; norms and dropout run on s/t.
    ``overlap`` says whether and how Transformer Engine hides these collectives behind GEMMs
    (Megatron requires sequence parallelism for it, so it lives here)."""

    overlap: TpCommOverlap = field(default_factory=NoTpCommOverlap)

    def __str__(self) -> str:
        match self.overlap:
            case NoTpCommOverlap():
                return "rs+ag"
            case UserbufferOverlap():
                return f"rs+ag {self.overlap}"
            case _ as unreachable:
                assert_never(unreachable)


TensorCommunication: TypeAlias = AllReduce | ReduceScatterAllGather


def tensor_communication(sequence_parallel: bool) -> TensorCommunication:
    """Megatron's ``sequence_parallel`` flag as the TP boundary it selects."""
    return ReduceScatterAllGather() if sequence_parallel else AllReduce()


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TensorParallel:
    degree: int
    communication: TensorCommunication = field(default_factory=AllReduce)

    def __post_init__(self) -> None:
        _require_positive("TensorParallel", degree=self.degree)

    def __str__(self) -> str:
        return f"TP{self.degree}({self.communication})"


# --------------------------------------------------------------------------------------------
# Context parallelism
# --------------------------------------------------------------------------------------------
class CpCommType(StrEnum):
    """Megatron's ``--cp-comm-type`` values, spelt as Transformer Engine accepts them
    (``all_gather``: a plain ``allgather`` reaches TE's "Unsupported communication type",
    ``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``)."""

    P2P = "p2p"
    ALL_GATHER = "all_gather"
    A2A = "a2a"
    A2A_P2P = "a2a+p2p"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RingExchange:
    """``p2p``: KV chunks travel a ring of cp steps, each send overlapped with the attention
    of the chunk already held (TE ``AttnFuncWithCPAndKVP2P``)."""

    def __str__(self) -> str:
        return CpCommType.P2P.value


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AllGatherKV:
    """``all_gather``: K and V all-gathered over the cp group before attention (exposed), dK
    and dV reduce-scattered after its backward (TE ``AttnFuncWithCPAndKVAllGather``; Llama 3
    paper section 3.3.2)."""

    def __str__(self) -> str:
        return CpCommType.ALL_GATHER.value


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class HeadAllToAll:
    """``a2a`` (DeepSpeed-Ulysses): all-to-alls trade the sequence split for a head split
    around attention, which then runs on the full sequence with heads/(t*cp) heads (TE
    ``AttnFuncWithCPAndQKVOA2A``)."""

    def __str__(self) -> str:
        return CpCommType.A2A.value


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class HierarchicalAllToAllRing:
    """``a2a+p2p``: all-to-all inside groups of ``a2a_size`` ranks, then a KV ring over
    ``p2p_size`` such groups (``--hierarchical-context-parallel-sizes a2a_size p2p_size``; TE
    >= 1.12). ``a2a_size * p2p_size`` must equal cp (a law)."""

    a2a_size: int
    p2p_size: int

    def __post_init__(self) -> None:
        _require_positive(
            "HierarchicalAllToAllRing", a2a_size=self.a2a_size, p2p_size=self.p2p_size
        )

    def __str__(self) -> str:
        return f"{CpCommType.A2A_P2P.value}({self.a2a_size}x{self.p2p_size})"


CpCommunication: TypeAlias = RingExchange | AllGatherKV | HeadAllToAll | HierarchicalAllToAllRing


def cp_comm_type(communication: CpCommunication) -> CpCommType:
    """The ``--cp-comm-type`` value of a communication variant."""
    match communication:
        case RingExchange():
            return CpCommType.P2P
        case AllGatherKV():
            return CpCommType.ALL_GATHER
        case HeadAllToAll():
            return CpCommType.A2A
        case HierarchicalAllToAllRing():
            return CpCommType.A2A_P2P
        case _ as unreachable:
            assert_never(unreachable)


def single_level_communication(kind: CpCommType) -> CpCommunication:
    """The variant of a comm type that needs no sizes (a2a+p2p needs its two: refused)."""
    match kind:
        case CpCommType.P2P:
            return RingExchange()
        case CpCommType.ALL_GATHER:
            return AllGatherKV()
        case CpCommType.A2A:
            return HeadAllToAll()
        case CpCommType.A2A_P2P:
            raise ConfigError(
                ["cp_comm_type a2a+p2p needs its hierarchical sizes (a2a size, p2p size)"]
            )
        case _ as unreachable:
            assert_never(unreachable)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ContextParallel:
    """The cp axis: every sequence split into ``2 * degree`` chunks, rank r holding chunks r and
    2cp-1-r (load-balanced causal split, TE ``attn_forward_func_with_cp``); every module but the
    attention core runs unchanged on s/cp tokens, the core exchanges K/V by ``communication``."""

    degree: int = 1
    communication: CpCommunication = field(default_factory=RingExchange)

    def __post_init__(self) -> None:
        _require_positive("ContextParallel", degree=self.degree)

    def __str__(self) -> str:
        return f"CP{self.degree}({self.communication})"


# --------------------------------------------------------------------------------------------
# Expert parallelism (MoE parallel folding)
# --------------------------------------------------------------------------------------------
class FlexBackend(StrEnum):
    """``--moe-flex-dispatcher-backend`` (Megatron-LM ``token_dispatcher.py`` l.1809-1860)."""

    DEEPEP = "deepep"
    HYBRIDEP = "hybridep"
    NCCLEP = "ncclep"


class DispatcherType(StrEnum):
    """``--moe-token-dispatcher-type``."""

    ALLTOALL = "alltoall"
    ALLGATHER = "allgather"
    FLEX = "flex"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AllToAllDispatcher:
    """Permute, all-to-all over EP (one copy per (token, expert)), all-gather / reduce-scatter
    over ETP, experts, and back (shared reference section 2.3). ``overlap`` is
    ``--overlap-moe-expert-parallel-comm``: the combined-1F1B schedule runs one micro-batch's
    all-to-alls under another's compute. ``shared_expert_overlap`` is
    ``--moe-shared-expert-overlap``: the shared experts run on a side stream during dispatch and
    combine (Megatron-LM ``transformer_config.py`` l.1820-1826: alltoall or flex only; the laws
    refuse it beside ``overlap`` and without shared experts). ``delay_wgrad_compute`` is
    ``--delay-wgrad-compute``: the backward's weight-gradient GEMMs split from the data-gradient
    ones and run while the dispatch all-to-all of the backward is in flight
    (``model_chunk_schedule_plan.py`` ``TransformerLayerSchedulePlan.run`` @d98e8a64); Megatron
    asserts it only with ``overlap`` (a law, not repaired)."""

    overlap: bool = False
    shared_expert_overlap: bool = False
    delay_wgrad_compute: bool = False

    def __str__(self) -> str:
        return (
            "alltoall"
            + ("+overlap" if self.overlap else "")
            + ("+shared-overlap" if self.shared_expert_overlap else "")
            + ("+delay-wgrad" if self.delay_wgrad_compute else "")
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AllGatherDispatcher:
    """All-gather every token over the ETP x EP group, keep the local experts' ones,
    reduce-scatter back: volume independent of top-k."""

    def __str__(self) -> str:
        return "allgather"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FlexDispatcher:
    """DeepEP / HybridEP / NCCL-EP fused kernels: one copy per (token, destination rank).
    ``overlap``, ``shared_expert_overlap`` and ``delay_wgrad_compute`` as for
    :class:`AllToAllDispatcher`."""

    backend: FlexBackend = FlexBackend.DEEPEP
    overlap: bool = False
    shared_expert_overlap: bool = False
    delay_wgrad_compute: bool = False
    #: streaming multiprocessors the library's exchange kernels hold (Megatron's
    #: ``--moe-deepep-num-sms`` / ``--moe-hybridep-num-sms``); None: Megatron-Core's default
    #: for the backend (:func:`flex_sms`)
    sms: int | None = None

    def __post_init__(self) -> None:
        if self.sms is not None:
            problems = positive_int_problems("FlexDispatcher", sms=self.sms)
            if self.backend is FlexBackend.NCCLEP:
                problems.append(
                    "FlexDispatcher.sms: Megatron sets the SMs of deepep and hybridep only "
                    "(moe_deepep_num_sms, moe_hybridep_num_sms), not of ncclep"
                )
            if problems:
                raise ConfigError(problems)

    def __str__(self) -> str:
        return (
            f"flex-{self.backend.value}"
            + ("+overlap" if self.overlap else "")
            + ("+shared-overlap" if self.shared_expert_overlap else "")
            + ("+delay-wgrad" if self.delay_wgrad_compute else "")
        )


TokenDispatcher: TypeAlias = AllToAllDispatcher | AllGatherDispatcher | FlexDispatcher

#: Megatron-Core's default SMs of each flex library's kernels (``transformer_config.py``
#: ``moe_deepep_num_sms = 20``, ``moe_hybridep_num_sms = 16``); NCCL-EP's are NCCL's own.
FLEX_DEFAULT_SMS: Mapping[FlexBackend, int] = {FlexBackend.DEEPEP: 20, FlexBackend.HYBRIDEP: 16}


def flex_sms(dispatcher: FlexDispatcher) -> int | None:
    """The SMs the flex library's exchange kernels hold: the dispatcher's, else Megatron-Core's
    default for its backend (None for NCCL-EP, whose kernels NCCL sizes)."""
    if dispatcher.sms is not None:
        return dispatcher.sms
    return FLEX_DEFAULT_SMS.get(dispatcher.backend)


def dispatcher_type(dispatcher: TokenDispatcher) -> DispatcherType:
    match dispatcher:
        case AllToAllDispatcher():
            return DispatcherType.ALLTOALL
        case AllGatherDispatcher():
            return DispatcherType.ALLGATHER
        case FlexDispatcher():
            return DispatcherType.FLEX
        case _ as unreachable:
            assert_never(unreachable)


def shared_expert_overlaps(dispatcher: TokenDispatcher) -> bool:
    """Whether ``--moe-shared-expert-overlap`` is on."""
    match dispatcher:
        case (
            AllToAllDispatcher(shared_expert_overlap=on) | FlexDispatcher(shared_expert_overlap=on)
        ):
            return on
        case AllGatherDispatcher():
            return False
        case _ as unreachable:
            assert_never(unreachable)


def dispatcher_overlaps(dispatcher: TokenDispatcher) -> bool:
    """Whether ``--overlap-moe-expert-parallel-comm`` is on."""
    match dispatcher:
        case AllToAllDispatcher(overlap=overlap) | FlexDispatcher(overlap=overlap):
            return overlap
        case AllGatherDispatcher():
            return False
        case _ as unreachable:
            assert_never(unreachable)


def delays_wgrad(dispatcher: TokenDispatcher) -> bool:
    """Whether ``--delay-wgrad-compute`` is on."""
    match dispatcher:
        case AllToAllDispatcher(delay_wgrad_compute=on) | FlexDispatcher(delay_wgrad_compute=on):
            return on
        case AllGatherDispatcher():
            return False
        case _ as unreachable:
            assert_never(unreachable)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertParallel:
    """The expert grid of Megatron's MoE parallel folding (``parallel_state.py`` l.858-906
    @d98e8a64): within each pipeline stage the W/p ranks that run attention as t x cp x d run the
    routed experts as ``tensor_degree`` (ETP) x ``degree`` (EP) x expert-dp, so EP may exceed d.
    ``grouped_gemm`` is ``--moe-grouped-gemm`` (one grouped GEMM over the local experts)."""

    degree: int = 1
    tensor_degree: int = 1
    dispatcher: TokenDispatcher = field(default_factory=AllToAllDispatcher)
    grouped_gemm: bool = True

    def __post_init__(self) -> None:
        _require_positive("ExpertParallel", degree=self.degree, tensor_degree=self.tensor_degree)

    def __str__(self) -> str:
        return f"EP{self.degree}xETP{self.tensor_degree}({self.dispatcher})"


# --------------------------------------------------------------------------------------------
# Pipeline schedules
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SingleStage:
    """p = 1: no pipelining."""

    def __str__(self) -> str:
        return "single"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class OneForwardOneBackward:
    """Synchronous non-interleaved 1F1B (PipeDream-Flush; Narayanan et al. 2021, Section 2.2.1)."""

    def __str__(self) -> str:
        return "1F1B"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class InterleavedOneForwardOneBackward:
    """Interleaved 1F1B with ``virtual_stages`` model chunks per physical stage
    (Narayanan et al. 2021, Section 2.2.2).

    ``microbatch_group_size`` is Megatron's ``microbatch_group_size_per_vp_stage``; ``None`` means
    Megatron's default, the pipeline degree. ``overlap_p2p_comm`` is Megatron's asynchronous P2P
    overlap, which also lets interleaving run with p = 2.
    """

    virtual_stages: int
    microbatch_group_size: int | None = None
    overlap_p2p_comm: bool = False

    def __post_init__(self) -> None:
        _require_positive("InterleavedOneForwardOneBackward", virtual_stages=self.virtual_stages)
        if self.microbatch_group_size is not None:
            _require_positive(
                "InterleavedOneForwardOneBackward",
                microbatch_group_size=self.microbatch_group_size,
            )

    def __str__(self) -> str:
        group = "" if self.microbatch_group_size is None else f" N{self.microbatch_group_size}"
        return f"1F1B x{self.virtual_stages}{group}"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CombinedOneForwardOneBackward:
    """Megatron-Core's combined 1F1B (``--overlap-moe-expert-parallel-comm``;
    ``pipeline_parallel/combined_1f1b.py`` and ``models/common/model_chunk_schedule_plan.py``
    @d98e8a64): the interleaved 1F1B order with one more warm-up forward
    (``schedules.py`` l.966-970: "one extra micro-batch forward step before the 1f1b stages"),
    then every steady step runs the forward of one micro-batch and the backward of another as
    one co-scheduled pass, layer by layer, the all-to-alls of each under the other's compute on
    a second stream; the warm-up forwards and cool-down backwards run alone. Never chosen by a
    key of its own: :func:`training_schedule` derives it from the dispatcher's ``overlap``.
    ``virtual_stages`` = 1 is the no-pipelining path (``combined_1f1b_schedule_for_no_pipelining``)
    or, with p > 1, a strategy the laws refuse. The group size and P2P overlap are those of
    :class:`InterleavedOneForwardOneBackward`."""

    virtual_stages: int
    microbatch_group_size: int | None = None
    overlap_p2p_comm: bool = False

    def __post_init__(self) -> None:
        _require_positive("CombinedOneForwardOneBackward", virtual_stages=self.virtual_stages)
        if self.microbatch_group_size is not None:
            _require_positive(
                "CombinedOneForwardOneBackward", microbatch_group_size=self.microbatch_group_size
            )

    def __str__(self) -> str:
        group = "" if self.microbatch_group_size is None else f" N{self.microbatch_group_size}"
        return f"combined-1F1B x{self.virtual_stages}{group}"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardOnly:
    """Static inference forward pipeline."""

    def __str__(self) -> str:
        return "fwd"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ZeroBubbleH1:
    """ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", Section 3.1): 1F1B with each
    backward split into an input-gradient pass B and a weight-gradient pass W; W passes are
    deferred into the cool-down bubbles, keeping 1F1B's peak activation memory."""

    def __str__(self) -> str:
        return "ZB-H1"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class DualPipe:
    """DualPipe (DeepSeek-AI 2024, DeepSeek-V3 Technical Report, Section 3.2.1;
    deepseek-ai/DualPipe ``dualpipe/dualpipe.py`` @3da1bbe): bidirectional pipeline. Every rank
    holds two copies of the model's parameters: stage r of the forward direction and stage
    p - 1 - r of the reverse direction; half of the microbatches enter at rank 0, half at rank
    p - 1. Backward is split into input gradient and deferred weight gradient (zero bubble) in
    the warm-up and cool-down. Not in Megatron-LM: a planner-only schedule."""

    def __str__(self) -> str:
        return "DualPipe"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class DualPipeV:
    """DualPipeV ("cut-in-half" DualPipe, Sea AI Lab; deepseek-ai/DualPipe
    ``dualpipe/dualpipev.py`` @3da1bbe): a V-shaped schedule over 2p virtual stages; rank r
    holds stage r (chunk 0) and stage 2p - 1 - r (chunk 1), so each chunk has L / (2p) blocks
    and parameters are not duplicated. Not in Megatron-LM: a planner-only schedule."""

    def __str__(self) -> str:
        return "DualPipeV"


PipelineSchedule: TypeAlias = (
    SingleStage
    | OneForwardOneBackward
    | InterleavedOneForwardOneBackward
    | CombinedOneForwardOneBackward
    | ForwardOnly
    | ZeroBubbleH1
    | DualPipe
    | DualPipeV
)


def training_schedule(
    pipeline_degree: int,
    virtual_stages: int = 1,
    *,
    microbatch_group_size: int | None = None,
    overlap_p2p_comm: bool = False,
    ep_overlap: bool = False,
) -> PipelineSchedule:
    """The training schedule the degrees imply: combined 1F1B whenever ``ep_overlap`` (the
    dispatcher's ``overlap_moe_expert_parallel_comm``, its one source of truth), interleaved 1F1B
    for v > 1 (also with p = 1, which the laws then reject: nothing is repaired), SingleStage for
    p = 1, else 1F1B. The group size and P2P overlap belong to the interleaved schedules and are
    unused otherwise."""
    if ep_overlap:
        return CombinedOneForwardOneBackward(
            virtual_stages=virtual_stages,
            microbatch_group_size=microbatch_group_size,
            overlap_p2p_comm=overlap_p2p_comm,
        )
    if virtual_stages > 1:
        return InterleavedOneForwardOneBackward(
            virtual_stages=virtual_stages,
            microbatch_group_size=microbatch_group_size,
            overlap_p2p_comm=overlap_p2p_comm,
        )
    return SingleStage() if pipeline_degree == 1 else OneForwardOneBackward()


def inference_schedule(pipeline_degree: int) -> PipelineSchedule:
    """The inference schedule: ForwardOnly for p > 1, SingleStage for p = 1."""
    return ForwardOnly() if pipeline_degree > 1 else SingleStage()


def virtual_stages_of(schedule: PipelineSchedule) -> int:
    """v: model chunks per physical pipeline stage, the layer split (1 unless interleaved or
    DualPipeV). DualPipe's two chunks are two copies of one stage's layers: its split is v = 1
    (``model_copies`` says 2)."""
    match schedule:
        case (
            InterleavedOneForwardOneBackward(virtual_stages=v)
            | CombinedOneForwardOneBackward(virtual_stages=v)
        ):
            return v
        case DualPipeV():
            return 2
        case SingleStage() | OneForwardOneBackward() | ForwardOnly() | ZeroBubbleH1() | DualPipe():
            return 1
        case _ as unreachable:
            assert_never(unreachable)


def loss_stage(schedule: PipelineSchedule, pipeline_degree: int) -> int:
    """The physical stage that runs the LM head and loss: the last, except DualPipeV, whose
    V turns back to rank 0 (``dualpipev.py``: the loss is computed on the first rank). DualPipe
    runs it on both end ranks, one per direction; its rank r also holds stage p - 1 - r, which
    :func:`model_copies` accounts for, so its plan keeps the loss on the last stage."""
    match schedule:
        case DualPipeV():
            return 0
        case (
            SingleStage()
            | OneForwardOneBackward()
            | InterleavedOneForwardOneBackward()
            | CombinedOneForwardOneBackward()
            | ForwardOnly()
            | ZeroBubbleH1()
            | DualPipe()
        ):
            return pipeline_degree - 1
        case _ as unreachable:
            assert_never(unreachable)


def model_copies(schedule: PipelineSchedule) -> int:
    """Copies of its stage's parameters every rank holds: 2 for DualPipe (one per direction,
    the DualPipe README's "2x parameters"), else 1."""
    match schedule:
        case DualPipe():
            return 2
        case (
            SingleStage()
            | OneForwardOneBackward()
            | InterleavedOneForwardOneBackward()
            | CombinedOneForwardOneBackward()
            | ForwardOnly()
            | ZeroBubbleH1()
            | DualPipeV()
        ):
            return 1
        case _ as unreachable:
            assert_never(unreachable)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class EvenStages:
    """Every physical stage holds num_layers / p blocks (the seed's static planner)."""

    def __str__(self) -> str:
        return "even"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class UnevenStages:
    """Megatron's decoder_first/last_pipeline_num_layers: explicit first/last stage block counts;
    the remaining blocks are split evenly over the middle stages."""

    first_stage_layers: int | None = None
    last_stage_layers: int | None = None

    def __post_init__(self) -> None:
        # Both None would be a second spelling of EvenStages; one meaning, one value.
        if self.first_stage_layers is None and self.last_stage_layers is None:
            raise ConfigError(
                ["UnevenStages needs first_stage_layers or last_stage_layers; use EvenStages"]
            )
        for key, value in (
            ("first_stage_layers", self.first_stage_layers),
            ("last_stage_layers", self.last_stage_layers),
        ):
            if value is not None:
                _require_positive("UnevenStages", **{key: value})

    def __str__(self) -> str:
        return f"uneven({self.first_stage_layers},{self.last_stage_layers})"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutStage:
    """One virtual stage of a flexible layout: whether it holds the embedding, how many decoder
    blocks, whether it holds the loss (output layer, final norm and loss). ``position`` is where
    the stage's text begins in the layout string it was parsed from (for messages only; not part
    of the value)."""

    embedding: bool = False
    decoder_layers: int = 0
    loss: bool = False
    #: multi-token-prediction depths (``m``) the stage holds, after its decoder blocks
    mtp_layers: int = 0
    position: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.decoder_layers < 0 or self.mtp_layers < 0:
            raise ConfigError(
                [
                    f"LayoutStage decoder_layers / mtp_layers must be >= 0, got "
                    f"{self.decoder_layers} / {self.mtp_layers}"
                ]
            )

    def __str__(self) -> str:
        blocks = "t" * min(self.decoder_layers, 1)
        if self.decoder_layers > 1:
            blocks = f"t*{self.decoder_layers}"
        mtp = "m" * self.mtp_layers
        return ("E" if self.embedding else "") + blocks + mtp + ("L" if self.loss else "")


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FlexibleStages:
    """Megatron-LM's ``pipeline_model_parallel_layout`` (``megatron/core/transformer/
    pipeline_parallel_layer_layout.py`` @d98e8a64): the layers of every virtual stage, listed
    in virtual-stage order (stage k = chunk c * p + rank r, Megatron's flattened order). The
    laws check that it has p * v stages, covers num_layers blocks and places the embedding
    first and the loss last."""

    stages: tuple[LayoutStage, ...]

    def __post_init__(self) -> None:
        if not self.stages:
            raise ConfigError(["FlexibleStages needs at least one stage"])

    def __str__(self) -> str:
        # Megatron's own string, runs of equal stages as (X|)*n (a 128-stage layout in a line)
        from blueprinting.mapping.pipeline_layout import format_pipeline_layout

        return f"layout({format_pipeline_layout(self)})"

    def rank_blocks(self, p: int) -> tuple[int, ...]:
        """Transformer blocks each of the ``p`` physical ranks holds: virtual stage k lives on
        rank k mod p (Megatron's flattened order)."""
        return tuple(sum(stage.decoder_layers for stage in self.stages[r::p]) for r in range(p))


StageLayout: TypeAlias = EvenStages | UnevenStages | FlexibleStages


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineParallel:
    degree: int
    schedule: PipelineSchedule
    layout: StageLayout = field(default_factory=EvenStages)

    def __post_init__(self) -> None:
        _require_positive("PipelineParallel", degree=self.degree)

    def __str__(self) -> str:
        extra = "" if isinstance(self.layout, EvenStages) else f" {self.layout}"
        return f"PP{self.degree}({self.schedule}{extra})"


# --------------------------------------------------------------------------------------------
# Data parallelism and optimizer sharding
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class NoOptimizerSharding:
    """Every DP rank holds full weights, gradients and optimizer states (ZeRO-0)."""

    def __str__(self) -> str:
        return "no-shard"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class DistributedOptimizer:
    """Megatron's distributed optimizer (``use_distributed_optimizer``, sharding strategy
    ``optim``): optimizer states and fp32 main params sharded over DP (ZeRO-1, Rajbhandari et al.
    2020); gradients reduce-scattered, updated params all-gathered."""

    overlap_param_gather: bool = False

    def __str__(self) -> str:
        return "dist-opt"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ShardedGradients:
    """``optim_grads``: optimizer states and gradients sharded (ZeRO-2)."""

    overlap_param_gather: bool = False

    def __str__(self) -> str:
        return "zero2"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ShardedParameters:
    """``optim_grads_params``: states, gradients and parameters sharded (ZeRO-3 / FSDP);
    parameters are all-gathered before each forward and each backward."""

    overlap_param_gather: bool = False

    def __str__(self) -> str:
        return "zero3"


OptimizerSharding: TypeAlias = (
    NoOptimizerSharding | DistributedOptimizer | ShardedGradients | ShardedParameters
)


class ShardingVariant(StrEnum):
    """Megatron's ``data_parallel_sharding_strategy`` values, one per :data:`OptimizerSharding`
    variant. The member order is the search tables' sharding code (``SHARDING_CODES``)."""

    NO_SHARD = "no_shard"
    OPTIM = "optim"
    OPTIM_GRADS = "optim_grads"
    OPTIM_GRADS_PARAMS = "optim_grads_params"

    @staticmethod
    def of(sharding: OptimizerSharding) -> ShardingVariant:
        match sharding:
            case NoOptimizerSharding():
                return ShardingVariant.NO_SHARD
            case DistributedOptimizer():
                return ShardingVariant.OPTIM
            case ShardedGradients():
                return ShardingVariant.OPTIM_GRADS
            case ShardedParameters():
                return ShardingVariant.OPTIM_GRADS_PARAMS
            case _ as unreachable:
                assert_never(unreachable)

    def build(self, *, overlap_param_gather: bool = False) -> OptimizerSharding:
        """The variant's ADT value. ``no_shard`` has no parameter gather to overlap: the flag is
        dropped here, and each caller refuses ``overlap_param_gather`` with it in its own words."""
        match self:
            case ShardingVariant.NO_SHARD:
                return NoOptimizerSharding()
            case ShardingVariant.OPTIM:
                return DistributedOptimizer(overlap_param_gather=overlap_param_gather)
            case ShardingVariant.OPTIM_GRADS:
                return ShardedGradients(overlap_param_gather=overlap_param_gather)
            case ShardingVariant.OPTIM_GRADS_PARAMS:
                return ShardedParameters(overlap_param_gather=overlap_param_gather)
            case _ as unreachable:
                assert_never(unreachable)


class GradReduceDtype(StrEnum):
    """The datatype of the gradient buffers and of their data-parallel reduction.

    Megatron-Core keeps one contiguous gradient buffer per (param dtype, grad dtype) whose
    datatype is ``torch.float`` when ``DistributedDataParallelConfig.grad_reduce_in_fp32`` is set
    and the parameter's own datatype otherwise (NVIDIA/Megatron-LM
    ``megatron/core/distributed/param_and_grad_buffer.py`` ``group_params_for_buffers``
    @d98e8a64); the reduce-scatter / all-reduce runs on that buffer, routed experts' buffers
    included. Megatron-LM passes ``grad_reduce_in_fp32 = args.accumulate_allreduce_grads_in_fp32``
    (``megatron/training/training.py`` l.2635) and, with ``--bf16``, turns
    ``accumulate_allreduce_grads_in_fp32`` on unless ``--grad-reduce-in-bf16`` is given
    (``megatron/training/arguments.py`` l.1204-1217 @d98e8a64); with ``--fp16`` or fp32 training
    it stays as given (off: the gradients are fp16 / fp32, ``--grad-reduce-in-bf16`` is read
    only under ``--bf16``). Megatron-Bridge's DDP config follows MCore
    (``grad_reduce_in_fp32``, its mixed-precision recipes set it True) and its performance
    recipes set it False.

    ``default``: Megatron-LM's rule for the model's datatype (fp32 for bf16 training, the
    parameters' datatype otherwise). ``fp32``: ``--accumulate-allreduce-grads-in-fp32`` /
    ``grad_reduce_in_fp32 = True``. ``params``: the parameters' datatype,
    ``--grad-reduce-in-bf16`` for bf16 training / ``grad_reduce_in_fp32 = False``.
    """

    DEFAULT = "default"
    FP32 = "fp32"
    PARAMS = "params"


def parameter_datatype(datatype: Datatype) -> Datatype:
    """The datatype a model trained in ``datatype`` keeps its parameters in: FP8 GEMMs keep
    bf16 parameters (Transformer Engine casts them per GEMM), every other datatype its own."""
    return Datatype.BF16 if datatype is Datatype.FP8 else datatype


def grad_reduce_datatype(datatype: Datatype, choice: GradReduceDtype) -> Datatype:
    """The datatype the gradient buffers hold and reduce in when the parameters are
    ``datatype`` (:class:`GradReduceDtype`; :func:`parameter_datatype`: bf16's rule under FP8)."""
    params = parameter_datatype(datatype)
    match choice:
        case GradReduceDtype.FP32:
            return Datatype.FP32
        case GradReduceDtype.PARAMS:
            return params
        case GradReduceDtype.DEFAULT:
            return Datatype.FP32 if params is Datatype.BF16 else params
        case _ as unreachable:
            assert_never(unreachable)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class DataParallel:
    degree: int
    optimizer_sharding: OptimizerSharding = field(default_factory=NoOptimizerSharding)
    overlap_grad_reduce: bool = False
    #: the gradient buffers' and their reduction's datatype (:class:`GradReduceDtype`)
    grad_reduce_dtype: GradReduceDtype = GradReduceDtype.DEFAULT

    def __post_init__(self) -> None:
        _require_positive("DataParallel", degree=self.degree)

    def __str__(self) -> str:
        return f"DP{self.degree}({self.optimizer_sharding})"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaParallel:
    """Independent inference replicas: no gradients, no synchronization between them."""

    degree: int

    def __post_init__(self) -> None:
        _require_positive("ReplicaParallel", degree=self.degree)

    def __str__(self) -> str:
        return f"R{self.degree}"


# --------------------------------------------------------------------------------------------
# Activation recomputation (Korthikanti et al. 2022, Section 5)
# --------------------------------------------------------------------------------------------
class RecomputeMethod(StrEnum):
    """Megatron's ``recompute_method``: ``uniform`` checkpoints every ``num_layers`` blocks;
    ``block`` recomputes the first ``num_layers`` blocks of each stage and stores the rest."""

    UNIFORM = "uniform"
    BLOCK = "block"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class NoRecompute:
    def __str__(self) -> str:
        return "none"


class RecomputeModule(StrEnum):
    """Megatron-LM's ``--recompute-modules`` (``transformer_config.py`` ``recompute_modules``,
    default ``["core_attn"]``): the submodules selective recomputation re-runs in backward."""

    CORE_ATTN = "core_attn"
    MLP = "mlp"
    LAYERNORM = "layernorm"
    MOE_ACT = "moe_act"
    MOE = "moe"
    SHARED_EXPERTS = "shared_experts"
    MLA_UP_PROJ = "mla_up_proj"


#: The modules a dense GPT/Llama block has; the others need MoE or MLA layers.
DENSE_RECOMPUTE_MODULES: frozenset[RecomputeModule] = frozenset(
    {RecomputeModule.CORE_ATTN, RecomputeModule.MLP, RecomputeModule.LAYERNORM}
)
DEFAULT_RECOMPUTE_MODULES: frozenset[RecomputeModule] = frozenset({RecomputeModule.CORE_ATTN})


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SelectiveRecompute:
    """Recompute ``modules`` of every block in backward (Korthikanti et al. 2022, Section 5:
    the attention core; Megatron-Core's ``--recompute-modules`` adds the MLP and the norms)."""

    modules: frozenset[RecomputeModule] = DEFAULT_RECOMPUTE_MODULES

    def __post_init__(self) -> None:
        if not self.modules:
            raise ConfigError(["SelectiveRecompute needs at least one recompute module"])

    def __str__(self) -> str:
        if self.modules == DEFAULT_RECOMPUTE_MODULES:
            return "selective"
        return "selective(" + "+".join(sorted(m.value for m in self.modules)) + ")"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FullRecompute:
    """Store only block inputs and recompute whole blocks in backward."""

    method: RecomputeMethod = RecomputeMethod.UNIFORM
    num_layers: int = 1

    def __post_init__(self) -> None:
        _require_positive("FullRecompute", num_layers=self.num_layers)

    def __str__(self) -> str:
        return f"full({self.method},{self.num_layers})"


RecomputePolicy: TypeAlias = NoRecompute | SelectiveRecompute | FullRecompute


def recomputed_modules(recompute: RecomputePolicy) -> frozenset[RecomputeModule]:
    """The selective modules a policy recomputes; none for full or no recompute (Megatron reads
    ``--recompute-modules`` under selective granularity only)."""
    match recompute:
        case SelectiveRecompute(modules=modules):
            return modules
        case NoRecompute() | FullRecompute():
            return frozenset()
        case _ as unreachable:
            assert_never(unreachable)


# --------------------------------------------------------------------------------------------
# Activation offloading to host memory (Megatron-Core ``cpu_offloading``)
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class NoActivationOffload:
    def __str__(self) -> str:
        return "none"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCpuOffload:
    """Megatron-Core's layer-wise CPU offloading (``cpu_offloading`` with
    ``cpu_offloading_num_layers``; Megatron-LM's ``--cpu-offloading-num-layers``): the tensors
    the first ``num_layers`` transformer layers save for backward go to pinned host memory
    during the forward and come back before their backward, through Transformer Engine's
    ``get_cpu_offload_context`` (``megatron/core/transformer/transformer_block.py`` l.304-325,
    742 @d98e8a64; ``transformer_engine/pytorch/cpu_offload.py`` @d0067d0d). Weight offloading
    (``cpu_offloading_weights``) has no effect since TE 2.3 and is not a variant."""

    num_layers: int

    def __post_init__(self) -> None:
        _require_positive("LayerCpuOffload", num_layers=self.num_layers)

    def __str__(self) -> str:
        return f"cpu({self.num_layers})"


ActivationOffload: TypeAlias = NoActivationOffload | LayerCpuOffload


# --------------------------------------------------------------------------------------------
# The attention kernel (Megatron-LM ``--attention-backend``)
# --------------------------------------------------------------------------------------------
class AttentionBackend(StrEnum):
    """Megatron-LM's ``--attention-backend`` (``megatron/core/transformer/enums.py``
    ``AttnBackend``; default ``auto``). ``auto``, ``flash`` and ``fused`` run a fused kernel
    (Transformer Engine's FlashAttention or cuDNN FusedAttention); ``unfused`` runs Transformer
    Engine's ``UnfusedDotProductAttention`` and ``local`` Megatron-Core's own
    ``DotProductAttention``: both materialize the ``s x s`` scores."""

    AUTO = "auto"
    FLASH = "flash"
    FUSED = "fused"
    UNFUSED = "unfused"
    LOCAL = "local"


_FUSED_BACKENDS = frozenset({AttentionBackend.AUTO, AttentionBackend.FLASH, AttentionBackend.FUSED})


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FusedAttention:
    """A fused attention kernel (Dao et al. 2022, FlashAttention, Section 3; cuDNN fused
    attention in Transformer Engine): no ``s x s`` tensor reaches HBM; the forward saves its
    output and the per-row softmax statistics (fp32 log-sum-exp), and the backward recomputes
    the scores by design. Megatron-Core's default since 2023."""

    backend: AttentionBackend = AttentionBackend.AUTO

    def __post_init__(self) -> None:
        if self.backend not in _FUSED_BACKENDS:
            raise ConfigError(
                [
                    f"FusedAttention backend must be one of auto, flash, fused, "
                    f"got {self.backend.value!r}"
                ]
            )

    def __str__(self) -> str:
        return "fused" if self.backend is AttentionBackend.AUTO else f"fused({self.backend})"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class UnfusedAttention:
    """Attention as separate batched GEMMs, softmax and dropout kernels that store the
    ``s x s`` scores for backward: Megatron-LM 2021-2022 (Korthikanti et al. 2022, Section 4.1,
    the runs of Narayanan 2021 and Korthikanti 2022)."""

    backend: AttentionBackend = AttentionBackend.UNFUSED

    def __post_init__(self) -> None:
        if self.backend in _FUSED_BACKENDS:
            raise ConfigError(
                [f"UnfusedAttention backend must be unfused or local, got {self.backend.value!r}"]
            )

    def __str__(self) -> str:
        return "unfused" if self.backend is AttentionBackend.UNFUSED else f"unfused({self.backend})"


AttentionKernel: TypeAlias = FusedAttention | UnfusedAttention


def attention_kernel(backend: AttentionBackend) -> AttentionKernel:
    """The kernel a Megatron ``--attention-backend`` value selects."""
    if backend in _FUSED_BACKENDS:
        return FusedAttention(backend=backend)
    return UnfusedAttention(backend=backend)


class CrossEntropyFusionImpl(StrEnum):
    """Megatron's ``--cross-entropy-fusion-impl``: its own jit-fused vocab-parallel
    cross-entropy or Transformer Engine's Triton kernel."""

    NATIVE = "native"
    TE = "te"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class UnfusedCrossEntropy:
    """Megatron's default vocab-parallel cross-entropy (``--cross-entropy-loss-fusion`` off):
    eager fp32 passes over the ``[tokens, V/t]`` logits
    (``megatron/core/tensor_parallel/cross_entropy.py`` @d98e8a64)."""

    def __str__(self) -> str:
        return "ce-unfused"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FusedCrossEntropy:
    """``--cross-entropy-loss-fusion`` with its ``--cross-entropy-fusion-impl``
    (``language_module.py`` ``compute_language_model_loss``)."""

    impl: CrossEntropyFusionImpl = CrossEntropyFusionImpl.NATIVE

    def __str__(self) -> str:
        return f"ce-fused({self.impl})"


CrossEntropyKernel: TypeAlias = UnfusedCrossEntropy | FusedCrossEntropy


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class KernelFusions:
    """Megatron's kernel-fusion switches that decide whether a block runs eager PyTorch passes
    Blueprinting costs (``training.eager_passes`` turns them and the model into the passes):

    - ``apply_rope_fusion``: Transformer Engine's fused RoPE kernel (Megatron-LM's CLI default
      true, ``--no-rope-fusion``, arguments.py l.2480-2483 @2edffadb). Megatron turns it off
      unless ``position_embedding_type = rope`` (arguments.py l.1285-1286; Megatron-Bridge
      ``src/megatron/bridge/utils/fusions.py`` ``validate_rope_fusion_compatibility`` l.53
      @046518960 / l.71 @6124fbe38, applied in ``gpt_provider.py``), so a YaRN model runs the
      unfused path whatever this says.
    - ``use_transformer_engine_op_fuser``: the experts' FC1, activation and FC2 as Transformer
      Engine's fused grouped-MLP ops (TransformerConfig, default false; Megatron-LM @458c8d0e
      ``moe/experts.py`` l.268-273 and ``_fused_forward``): the clamped GLU runs in TE's
      ``ScaledClampedQGeGLU`` (l.447-472) and the FC2 bias inside the grouped linear
      (l.495-518), not in Megatron's eager passes."""

    apply_rope_fusion: bool = True
    use_transformer_engine_op_fuser: bool = False
    #: the vocab-parallel cross-entropy's kernels (Megatron's default: unfused)
    cross_entropy: CrossEntropyKernel = field(default_factory=UnfusedCrossEntropy)

    def __str__(self) -> str:
        parts = [] if self.apply_rope_fusion else ["no-rope-fusion"]
        if self.use_transformer_engine_op_fuser:
            parts.append("te-op-fuser")
        match self.cross_entropy:
            case UnfusedCrossEntropy():
                pass
            case FusedCrossEntropy():
                parts.append(str(self.cross_entropy))
            case _ as unreachable:
                assert_never(unreachable)
        return " ".join(parts)


# --------------------------------------------------------------------------------------------
# Top-level records
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TransformerTrainingParallelism:
    tensor: TensorParallel
    pipeline: PipelineParallel
    data: DataParallel
    recompute: RecomputePolicy = field(default_factory=NoRecompute)
    context: ContextParallel = field(default_factory=ContextParallel)
    #: the expert grid; only MoE models read it (a dense model with EP > 1 breaks a law)
    experts: ExpertParallel = field(default_factory=ExpertParallel)
    #: where stored activations live between a layer's forward and its backward
    offload: ActivationOffload = field(default_factory=NoActivationOffload)

    def __str__(self) -> str:
        cp = f" {self.context}" if self.context.degree > 1 else ""
        ep = f" {self.experts}" if self.experts.degree > 1 or self.experts.tensor_degree > 1 else ""
        offload = (
            "" if isinstance(self.offload, NoActivationOffload) else f" offload={self.offload}"
        )
        return (
            f"{self.tensor}{cp} {self.pipeline} {self.data}{ep} recompute={self.recompute}{offload}"
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class BatchSpec:
    """Sequences per optimizer step (global) and per forward/backward call (micro)."""

    global_batch_size: int
    micro_batch_size: int = 1

    def __post_init__(self) -> None:
        _require_positive(
            "BatchSpec",
            global_batch_size=self.global_batch_size,
            micro_batch_size=self.micro_batch_size,
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TransformerTrainingMappingSpec:
    parallelism: TransformerTrainingParallelism
    batch: BatchSpec
    attention: AttentionKernel = field(default_factory=FusedAttention)
    #: Transformer Engine's low-precision GEMM recipe on top of the model's datatype
    #: (:mod:`blueprinting.mapping.precision`).
    precision: TrainingPrecision = field(default_factory=HighPrecision)
    #: Megatron's ``--cuda-graph-impl`` / ``--cuda-graph-scope``
    #: (:mod:`blueprinting.mapping.cuda_graphs`): which ops replay from a graph instead of being
    #: issued by the host one by one.
    cuda_graphs: CudaGraphs = field(default_factory=NoCudaGraphs)
    #: Megatron's fusion switches that decide which eager passes a block runs
    fusions: KernelFusions = field(default_factory=KernelFusions)

    # Derived projections: computed, never stored or serialized. Divisions are exact only when
    # the laws hold; these use floor division and callers check laws first.
    @property
    def tensor_degree(self) -> int:
        return self.parallelism.tensor.degree

    @property
    def pipeline_degree(self) -> int:
        return self.parallelism.pipeline.degree

    @property
    def data_degree(self) -> int:
        return self.parallelism.data.degree

    @property
    def virtual_stages(self) -> int:
        return virtual_stages_of(self.parallelism.pipeline.schedule)

    @property
    def context_degree(self) -> int:
        return self.parallelism.context.degree

    @property
    def world_size(self) -> int:
        return self.tensor_degree * self.context_degree * self.pipeline_degree * self.data_degree

    @property
    def dense_gradient_degree(self) -> int:
        """Ranks that reduce (and, with the distributed optimizer, shard) the dense gradients:
        d x cp (Megatron's ``intra_dp_cp_group``, ``distributed_data_parallel.py``)."""
        return self.data_degree * self.context_degree

    @property
    def expert_degree(self) -> int:
        return self.parallelism.experts.degree

    @property
    def expert_tensor_degree(self) -> int:
        return self.parallelism.experts.tensor_degree

    @property
    def expert_data_degree(self) -> int:
        """Expert-dp: the ranks that reduce (and shard) the routed experts' gradients,
        ``W / (etp x ep x p)`` (``parallel_state.py`` l.874-884)."""
        return self.world_size // (
            self.expert_tensor_degree * self.expert_degree * self.pipeline_degree
        )

    @property
    def sequence_parallel(self) -> bool:
        return isinstance(self.parallelism.tensor.communication, ReduceScatterAllGather)

    @property
    def tp_comm_overlap(self) -> TpCommOverlap:
        """The userbuffer overlap of the TP collectives (none without sequence parallelism)."""
        communication = self.parallelism.tensor.communication
        match communication:
            case ReduceScatterAllGather(overlap=overlap):
                return overlap
            case AllReduce():
                return NoTpCommOverlap()
            case _ as unreachable:
                assert_never(unreachable)

    @property
    def local_batch(self) -> int:
        return self.batch.global_batch_size // self.data_degree

    @property
    def microbatch_count(self) -> int:
        return self.batch.global_batch_size // (self.data_degree * self.batch.micro_batch_size)

    def __str__(self) -> str:
        if isinstance(self.precision, HighPrecision):
            return str(self.parallelism)
        return f"{self.parallelism} {self.precision}"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ServingExpertParallel:
    """Expert parallelism of a serving replica: the routed experts of every MoE layer split over
    ``degree`` ranks of each pipeline stage's TP group, each expert's FFN over the other
    ``t / degree`` (the expert tensor degree). It is a remapping of the TP group for the MoE
    layers, attention and dense layers keep plain TP on the same ranks: vLLM's
    ``--enable-expert-parallel`` with one attention replica (EP = TP x DP, DP = 1; docs.vllm.ai
    "Expert Parallel Deployment"), TensorRT-LLM's ``moe_expert_parallel_size x
    moe_tensor_parallel_size = tp_size``, vLLM-Neuron's ``ep_degree < TP`` layout. Every rank
    holds every token after the attention block's all-reduce, so no token is dispatched: each
    rank runs its local experts on the tokens routed to them and the block's closing all-reduce
    combines the partial outputs."""

    degree: int = 1

    def __post_init__(self) -> None:
        _require_positive("ServingExpertParallel", degree=self.degree)

    def __str__(self) -> str:
        return f"EP{self.degree}"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TransformerInferenceParallelism:
    tensor: TensorParallel
    pipeline: PipelineParallel
    replicas: ReplicaParallel
    #: only MoE models read it (a dense model with EP > 1 breaks a law)
    experts: ServingExpertParallel = field(default_factory=ServingExpertParallel)

    def __str__(self) -> str:
        ep = f" {self.experts}" if self.experts.degree > 1 else ""
        return f"{self.tensor}{ep} {self.pipeline} {self.replicas}"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class InferenceWorkload:
    """One serving request shape: batch_size sequences of prompt_length tokens each generating
    generated_tokens tokens. ``kv_cache_datatype`` is the element type of the stored keys and
    values (an fp8 KV cache halves its bytes against bf16)."""

    batch_size: int
    prompt_length: int
    generated_tokens: int
    kv_cache_datatype: Datatype = Datatype.BF16

    def __post_init__(self) -> None:
        _require_positive(
            "InferenceWorkload",
            batch_size=self.batch_size,
            prompt_length=self.prompt_length,
            generated_tokens=self.generated_tokens,
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TransformerInferenceMappingSpec:
    parallelism: TransformerInferenceParallelism
    workload: InferenceWorkload

    @property
    def tensor_degree(self) -> int:
        return self.parallelism.tensor.degree

    @property
    def pipeline_degree(self) -> int:
        return self.parallelism.pipeline.degree

    @property
    def replica_degree(self) -> int:
        return self.parallelism.replicas.degree

    @property
    def expert_degree(self) -> int:
        return self.parallelism.experts.degree

    @property
    def expert_tensor_degree(self) -> int:
        """Ranks one routed expert's FFN is split over: ``t / ep`` (exact when the laws hold)."""
        return max(1, self.tensor_degree // self.expert_degree)

    @property
    def world_size(self) -> int:
        return self.tensor_degree * self.pipeline_degree * self.replica_degree

    def __str__(self) -> str:
        return str(self.parallelism)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSpec:
    """A model and a training mapping: what ``from_mapping`` returns and the laws check."""

    model: TransformerModelSpec
    mapping: TransformerTrainingMappingSpec

    def __str__(self) -> str:
        return f"{self.model.name}: {self.mapping}"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class InferenceSpec:
    """A model and an inference mapping."""

    model: TransformerModelSpec
    mapping: TransformerInferenceMappingSpec

    def __str__(self) -> str:
        return f"{self.model.name}: {self.mapping}"


# Re-exports: the boundary adapter and the laws live in their own modules (one concept per module)
# but are part of this module's public face. They import this module, so they come last; the
# package __init__ imports this module first so that either import order works.
from blueprinting.mapping.flat_keys import (  # noqa: E402
    from_mapping,
    inference_from_mapping,
    to_mapping,
    to_megatron_args,
)
from blueprinting.mapping.laws import (  # noqa: E402
    check_inference,
    check_training,
    validate_inference,
    validate_training,
)

__all__ = [
    "TE_PIPELINE_SPLITS",
    "AllGatherKV",
    "AllReduce",
    "BatchSpec",
    "BulkOverlap",
    "ColumnBackwardOverlap",
    "CombinedOneForwardOneBackward",
    "ContextParallel",
    "CpCommType",
    "CpCommunication",
    "DataParallel",
    "Datatype",
    "DistributedOptimizer",
    "DualPipe",
    "DualPipeV",
    "EvenStages",
    "FlexibleStages",
    "ForwardOnly",
    "FullRecompute",
    "GradReduceDtype",
    "HeadAllToAll",
    "HierarchicalAllToAllRing",
    "InferenceSpec",
    "InferenceWorkload",
    "InterleavedOneForwardOneBackward",
    "LayoutStage",
    "NoOptimizerSharding",
    "NoRecompute",
    "NoTpCommOverlap",
    "OneForwardOneBackward",
    "OptimizerSharding",
    "PipelineParallel",
    "PipelineSchedule",
    "PipelinedDgradReduceScatter",
    "RecomputeMethod",
    "RecomputePolicy",
    "ReduceScatterAllGather",
    "ReplicaParallel",
    "RingExchange",
    "SelectiveRecompute",
    "ServingExpertParallel",
    "ShardedGradients",
    "ShardedParameters",
    "ShardingVariant",
    "SingleStage",
    "StageLayout",
    "TensorCommunication",
    "TensorParallel",
    "TpCommOverlap",
    "TrainingSpec",
    "TransformerInferenceMappingSpec",
    "TransformerInferenceParallelism",
    "TransformerModelSpec",
    "TransformerTrainingMappingSpec",
    "TransformerTrainingParallelism",
    "UnevenStages",
    "UserbufferOverlap",
    "check_inference",
    "check_training",
    "cp_comm_type",
    "delays_wgrad",
    "divisors",
    "from_mapping",
    "grad_reduce_datatype",
    "inference_from_mapping",
    "inference_schedule",
    "loss_stage",
    "model_copies",
    "single_level_communication",
    "tensor_communication",
    "to_mapping",
    "to_megatron_args",
    "training_schedule",
    "validate_inference",
    "validate_training",
    "virtual_stages_of",
]
