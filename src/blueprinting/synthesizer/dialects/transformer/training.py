"""The training block's work algebra (seed: "Tensor-parallel mapping").

A transformer block is a list of :class:`SemanticOp` values, each with its forward,
activation-gradient and weight-gradient :class:`Work` for one microbatch of ``b`` sequences of
``s`` tokens. The same builder, :func:`block_ops`, evaluated on *global* dimensions gives the
semantic block and on *local* (per TP rank) dimensions gives the local work, so conservation
(local work x shards = global work) is a property of the algebra, not of bookkeeping.

GEMM convention (seed): ``Y[M,K] = X[M,N] W[N,K]``; N is the contraction dimension. The forward
costs 2MNK FLOPs; the activation gradient dX = dY W^T and the weight gradient dW = X^T dY cost
2MNK each (Narayanan et al. 2021, Section 5.1: "backward pass requires double the number of
FLOPs"). A batched matmul with ``batch`` independent products costs 2*batch*MNK; both of its
operands are activations, so its backward is 2 x 2*batch*MNK of activation-gradient work and no
weight-gradient work (Calculon ``calculon/llm/layers.py`` BatchMatMul counts it the same way).

Tensor parallelism (Shoeybi et al. 2019, Section 3): the QKV projection and the MLP up projection
are column-parallel (weight output dimension split over t), the output projection and the MLP down
projection row-parallel (contraction dimension split over t), the attention core runs on
heads/t (and groups/t) heads. Local GEMM work is therefore 2MNK/t. Four semantic boundaries need
a collective (:func:`boundary_collectives`): before each column-parallel GEMM the full activation
must be present, after each row-parallel GEMM the partial sums must be reduced. With all-reduce
communication that is an all-reduce after the row-parallel GEMM in forward and after the
column-parallel GEMM's activation gradient in backward. With sequence parallelism (Korthikanti et
al. 2022, Section 4.2.2) the all-reduce becomes reduce-scatter + all-gather, norms, dropout and
residuals run on s/t tokens (requires ``s mod t = 0``), and Megatron re-gathers the column-
parallel GEMM's input in backward for its weight gradient (``megatron/core/tensor_parallel/
layers.py``, ``LinearWithGradAccumulationAndAsyncCommunication.backward``), which we model as a
REGATHER collective. Every collective carries the full activation it reconstructs:
``b*s*h*bytes`` (Calculon counts the same message size).

Element-wise per-element FLOP counts are a convention, not a measurement; LayerNorm, softmax,
GeLU, dropout counts follow Calculon's layer model (``calculon/llm/layers.py``); RMSNorm and
SwiGLU counts are our own estimates (stated at the constants). Nothing downstream compares them
exactly with anything.

Public API (used by training_derivation.py and stages/distributed/passes.py):

- :class:`BlockDims`, :func:`global_dims`, :func:`local_dims`
- :func:`block_ops(model, dims) -> tuple[SemanticOp, ...]` (forward order)
- :func:`first_stage_ops`, :func:`last_stage_ops` (embedding; final norm, LM head, cross-entropy)
- :class:`TpSharding` and :func:`placements` (how each op shards, DTensor-style S/R/P)
- :func:`boundary_collectives(model, dims, tp, sequence_parallel)`
- :class:`LocalBlockPlan` (what the derivation hands to the lowering pass)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import lru_cache
from typing import TypeAlias, assert_never, final

from blueprinting.hardware.attention import (
    BACKWARD_FLOPS_PER_PAIR_DIM,
    FORWARD_FLOPS_PER_PAIR_DIM,
    causal_attention_pairs,
    windowed_attention_pairs,
    windowed_rate_seq_length,
)
from blueprinting.hardware.ep_kernels import EpLeg
from blueprinting.mapping.model import (
    CapacityFactor,
    Dropless,
    MixtureOfExperts,
    MlpActivation,
    MultiLatentAttention,
    Normalization,
    PositionEmbedding,
    StandardAttention,
    TransformerModelSpec,
)
from blueprinting.mapping.transformer import (
    DEFAULT_RECOMPUTE_MODULES,
    AllGatherDispatcher,
    AllGatherKV,
    AllToAllDispatcher,
    AttentionKernel,
    ContextParallel,
    CrossEntropyFusionImpl,
    CrossEntropyKernel,
    DispatcherType,
    ExpertParallel,
    FlexBackend,
    FlexDispatcher,
    FusedAttention,
    FusedCrossEntropy,
    HeadAllToAll,
    HierarchicalAllToAllRing,
    KernelFusions,
    RecomputeModule,
    RingExchange,
    TokenDispatcher,
    UnfusedAttention,
    UnfusedCrossEntropy,
    dispatcher_overlaps,
    dispatcher_type,
    flex_sms,
)


# --------------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------------
class OpKind(StrEnum):
    """What kind of kernel an operation is, so a later stage can pick an efficiency model."""

    GEMM = "gemm"
    BATCHED_MATMUL = "batched_matmul"
    ELEMENTWISE = "elementwise"
    NORM = "norm"
    SOFTMAX = "softmax"
    FUSED_ATTENTION = "fused_attention"
    GATHER = "gather"
    CROSS_ENTROPY = "cross_entropy"


class CollectiveKind(StrEnum):
    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    P2P = "p2p"
    ALL_TO_ALL = "all_to_all"


class CollectivePurpose(StrEnum):
    """BOUNDARY collectives sit on the activation (or gradient) chain; REGATHER re-gathers a
    sequence-parallel input for a weight gradient; STATISTIC reduces per-token scalars of the
    vocab-parallel cross-entropy."""

    BOUNDARY = "boundary"
    REGATHER = "regather"
    STATISTIC = "statistic"
    KV_EXCHANGE = "kv_exchange"  # context parallelism: K/V (or Q/K/V/O) between cp ranks
    TOKEN_DISPATCH = "token_dispatch"  # expert parallelism: tokens to and from their experts


class Direction(StrEnum):
    FORWARD = "forward"
    BACKWARD = "backward"


class SemanticOpName(StrEnum):
    INPUT_NORM = "input_norm"
    QKV_PROJECTION = "qkv_projection"
    ATTENTION_SCORES = "attention_scores"
    SOFTMAX = "softmax"
    ATTENTION_DROPOUT = "attention_dropout"
    ATTENTION_OVER_VALUES = "attention_over_values"
    CORE_ATTENTION = "core_attention"  # the fused kernel (Megatron's core_attention module)
    OUTPUT_PROJECTION = "output_projection"
    ATTENTION_RESIDUAL = "attention_residual"
    ROTARY_EMBEDDING = "rotary_embedding"  # unfused RoPE on Q and K (eager passes)
    POST_ATTENTION_NORM = "post_attention_norm"
    MLP_UP = "mlp_up"
    MLP_ACTIVATION = "mlp_activation"
    MLP_DOWN = "mlp_down"
    MLP_RESIDUAL = "mlp_residual"
    # multi-head latent attention (replace the QKV projection)
    MLA_DOWN_PROJECTION = "mla_down_projection"  # x -> q latent, kv latent + rope key
    MLA_LATENT_NORM = "mla_latent_norm"  # the q and kv latents' norms
    MLA_UP_PROJECTION = "mla_up_projection"  # latents -> per-head Q, K_nope, V
    # mixture of experts (replace the MLP on MoE layers)
    ROUTER = "router"
    MOE_PERMUTE = "moe_permute"
    MOE_SORT_CHUNKS = "moe_sort_chunks"  # received rows into local-expert order (alltoall)
    EXPERT_FC1 = "expert_fc1"
    EXPERT_ACTIVATION_CLAMP = "expert_activation_clamp"  # eager clamp + cat before the GLU
    EXPERT_ACTIVATION = "expert_activation"
    EXPERT_FC2 = "expert_fc2"
    EXPERT_BIAS = "expert_bias"  # FC2's bias added per local expert (eager passes)
    MOE_UNSORT_CHUNKS = "moe_unsort_chunks"  # back into source-rank order before the combine
    MOE_UNPERMUTE = "moe_unpermute"
    SHARED_EXPERT_UP = "shared_expert_up"
    SHARED_EXPERT_ACTIVATION = "shared_expert_activation"
    SHARED_EXPERT_DOWN = "shared_expert_down"
    # first / last pipeline stage extras
    EMBEDDING = "embedding"
    POSITION_EMBEDDING = "position_embedding"
    FINAL_NORM = "final_norm"
    LM_HEAD = "lm_head"
    CROSS_ENTROPY = "cross_entropy"


#: The attention core that selective recompute re-runs (Korthikanti et al. 2022, Section 5;
#: Megatron's ``--recompute-modules core_attn``): the unfused ops, or the fused kernel.
ATTENTION_CORE: frozenset[SemanticOpName] = frozenset(
    {
        SemanticOpName.CORE_ATTENTION,
        SemanticOpName.ATTENTION_SCORES,
        SemanticOpName.SOFTMAX,
        SemanticOpName.ATTENTION_DROPOUT,
        SemanticOpName.ATTENTION_OVER_VALUES,
    }
)


class TpSharding(StrEnum):
    """How an op's work splits over the t ranks of the tp axis."""

    COLUMN = "column"  # weight's output dimension split; output S(features)
    ROW = "row"  # contraction dimension split; output partial sums P
    HEADS = "heads"  # attention core on heads/t heads
    FEATURES = "features"  # element-wise on a feature-sharded tensor (MLP activation)
    TOKENS = "tokens"  # token-wise: replicated under all-reduce, S(seq) under sequence parallelism
    VOCAB = "vocab"  # over V/t logits (vocab-parallel cross-entropy)
    REPLICATED = "replicated"  # every rank does the whole op (masked vocab-parallel lookup)


# --------------------------------------------------------------------------------------------
# Placements (DTensor style: S(dim), R, P)
# --------------------------------------------------------------------------------------------
class ShardDim(StrEnum):
    SEQ = "seq"
    HEADS = "heads"
    FFN = "ffn"
    VOCAB = "vocab"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Shard:
    dim: ShardDim

    def __str__(self) -> str:
        return f"S({self.dim})"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Replicate:
    def __str__(self) -> str:
        return "R"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Partial:
    def __str__(self) -> str:
        return "P"


Placement: TypeAlias = Shard | Replicate | Partial


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Placements:
    """Input and output placement of one op's forward (and of its activation gradient)."""

    forward_in: Placement
    forward_out: Placement
    backward_in: Placement
    backward_out: Placement


@lru_cache(maxsize=4096)
def placements(
    sharding: TpSharding, *, tp: int, sequence_parallel: bool, dim: ShardDim
) -> Placements:
    """Placements of an op on the tp axis; ``dim`` names the sharded feature dimension. With
    t = 1 every tensor is whole, so everything is replicated. Memoized: the lowering asks for
    every task of every block configuration a search costs."""
    r, p, s = Replicate(), Partial(), Shard(dim=dim)
    if tp == 1:
        return Placements(forward_in=r, forward_out=r, backward_in=r, backward_out=r)
    match sharding:
        case TpSharding.COLUMN:
            return Placements(forward_in=r, forward_out=s, backward_in=s, backward_out=p)
        case TpSharding.ROW:
            return Placements(forward_in=s, forward_out=p, backward_in=r, backward_out=s)
        case TpSharding.HEADS | TpSharding.FEATURES | TpSharding.VOCAB:
            return Placements(forward_in=s, forward_out=s, backward_in=s, backward_out=s)
        case TpSharding.TOKENS:
            t = Shard(dim=ShardDim.SEQ) if sequence_parallel else r
            return Placements(forward_in=t, forward_out=t, backward_in=t, backward_out=t)
        case TpSharding.REPLICATED:
            return Placements(forward_in=r, forward_out=p, backward_in=r, backward_out=r)
        case _ as unreachable:
            assert_never(unreachable)


# --------------------------------------------------------------------------------------------
# Work and shapes
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Work:
    """FLOPs (matrix-engine and vector-engine separately) and HBM bytes of one op in one phase."""

    matrix_flops: int = 0
    vector_flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    @property
    def flops(self) -> int:
        return self.matrix_flops + self.vector_flops

    @property
    def is_empty(self) -> bool:
        return self.flops == 0 and self.bytes_read == 0 and self.bytes_written == 0


class BatchedGemmCalls(StrEnum):
    """How the ``batch`` products of a :class:`GemmShape` are issued, which decides the shape
    the GEMM efficiency sees (its per-call term, :class:`~blueprinting.hardware.efficiency.
    GemmShapeEfficiency`, is paid once per call):

    - ``one_call``: one kernel over the whole batch (cuBLAS strided-batched, a fused kernel);
    - ``call_per_member``: one GEMM call per member. Transformer Engine's ``GroupedLinear`` (the
      experts of Megatron-Core's ``TEGroupedMLP``) issues one cuBLAS GEMM per local expert,
      round-robin over 4 compute streams (TransformerEngine
      ``transformer_engine/common/gemm/cublaslt_gemm.cu`` @5c62f728 ``multi_stream_cublas_gemm``;
      ``num_streams = 4`` in ``common/include/transformer_engine/gemm.h``), so each expert's
      GEMM runs at its own shape (M = the rows one expert receives) and pays its own per-call
      time. Costed as those calls back to back: where two streams' calls overlap, the time is
      an upper bound. Serving engines' fused MoE kernels are one call (the inference algebra)."""

    ONE_CALL = "one_call"
    CALL_PER_MEMBER = "call_per_member"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class GemmShape:
    """``Y[M,K] = X[M,N] W[N,K]`` repeated ``batch`` times (batch = 1 for a plain GEMM),
    issued as ``calls`` says."""

    m: int
    n: int
    k: int
    batch: int = 1
    calls: BatchedGemmCalls = BatchedGemmCalls.ONE_CALL

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    def __str__(self) -> str:
        prefix = f"{self.batch}x" if self.batch != 1 else ""
        return f"{prefix}[{self.m},{self.n}]x[{self.n},{self.k}]"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionShape:
    """A fused causal attention kernel over ``batch_heads`` (sequence, head) pairs of
    ``seq_length`` tokens with head dimension ``head_dim``: what its measured rate is looked up
    by (:mod:`blueprinting.hardware.attention`)."""

    batch_heads: int
    seq_length: int
    head_dim: int

    def __str__(self) -> str:
        return f"flash[{self.batch_heads}x{self.seq_length}x{self.head_dim}]"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SemanticOp:
    """One semantic operation of a block (or of a stage extra) with its work per phase."""

    name: SemanticOpName
    kind: OpKind
    sharding: TpSharding
    shard_dim: ShardDim
    forward: Work
    activation_grad: Work
    weight_grad: Work
    gemm: GemmShape | None = None
    attention: AttentionShape | None = None
    #: kernels the host launches for the op's (forward or recompute, activation gradient):
    #: one for a fused kernel; an eager chain launches one per PyTorch op
    #: (:func:`~blueprinting.synthesizer.stages.portable_plan.host_dispatch.host_ops`)
    launches: tuple[int, int] = (1, 1)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class BlockDims:
    """The dimensions a block's work depends on; global or as seen by one TP rank.

    ``gemm_tokens`` is the M of every GEMM (b*s/cp: a sequence-parallel rank all-gathers its
    cp rank's tokens before its column-parallel GEMM); ``token_rows`` the tokens of token-wise
    ops (b*s/cp, or b*s/(t*cp) under sequence parallelism). ``seq_length`` is the whole
    sequence; ``context`` the cp degree, whose ranks each hold 2 of its 2cp chunks
    (``shared/reference/modern_parallelism.md`` section 1.1). ``attention_seq`` and
    ``attention_heads`` are what one fused attention kernel launch sees: s/cp tokens on the
    rank's heads for the ring and the all-gather, s tokens on heads/cp for the all-to-all, s/p2p
    on heads/a2a for the hierarchical one.
    """

    micro_batch: int
    seq_length: int
    gemm_tokens: int
    token_rows: int
    hidden: int
    heads: int
    groups: int
    kv_channels: int
    ffn: int
    vocab: int
    context: int = 1
    attention_seq: int = 0
    attention_heads: int = 0
    #: per-head widths of Q/K and of V (MLA: no-rope + rope, and v_head_dim; else kv_channels)
    qk_dim: int = 0
    v_dim: int = 0
    #: a sliding-window layer's most keys per query (``TransformerModelSpec.window_keys``);
    #: None: full causal attention
    window_keys: int | None = None

    @property
    def qk_width(self) -> int:
        return self.qk_dim or self.kv_channels

    @property
    def v_width(self) -> int:
        return self.v_dim or self.kv_channels


def global_dims(model: TransformerModelSpec, micro_batch: int) -> BlockDims:
    """The unsharded dimensions: one rank holding everything."""
    return local_dims(model, micro_batch, tp=1, sequence_parallel=False)


def attention_split(context: ContextParallel) -> tuple[int, int]:
    """(how many ways the cp axis splits the sequence a kernel launch sees, how many ways it
    splits the heads): the ring and the all-gather split the sequence, the all-to-all the
    heads, the hierarchical one both by its two levels."""
    match context.communication:
        case RingExchange() | AllGatherKV():
            return context.degree, 1
        case HeadAllToAll():
            return 1, context.degree
        case HierarchicalAllToAllRing(a2a_size=a2a, p2p_size=ring):
            return ring, a2a
        case _ as unreachable:
            assert_never(unreachable)


def local_dims(
    model: TransformerModelSpec,
    micro_batch: int,
    *,
    tp: int,
    sequence_parallel: bool,
    context: ContextParallel | None = None,
) -> BlockDims:
    """Dimensions on one (tp, cp) rank. Callers check divisibility first (t | heads, groups,
    ffn, vocab; 2cp | s; t*cp | s under sequence parallelism); floor division here never
    repairs anything."""
    cp = 1 if context is None else context.degree
    seq_split, head_split = (1, 1) if context is None else attention_split(context)
    tokens = micro_batch * model.seq_length // cp
    heads = model.num_attention_heads // tp
    groups, qk_dim, v_dim = model.num_query_groups // tp, 0, 0
    match model.self_attention:
        case StandardAttention():
            pass
        case MultiLatentAttention() as mla:
            # K and V are expanded per head from the latent: MHA-shaped for the core
            groups, qk_dim, v_dim = heads, mla.qk_dim, mla.v_head_dim
        case _ as unreachable:
            assert_never(unreachable)
    return BlockDims(
        micro_batch=micro_batch,
        seq_length=model.seq_length,
        gemm_tokens=tokens,
        token_rows=tokens // tp if sequence_parallel else tokens,
        hidden=model.hidden_size,
        heads=heads,
        groups=groups,
        kv_channels=model.kv_channels,
        ffn=model.ffn_hidden_size // tp,
        vocab=model.padded_vocab_size // tp,
        context=cp,
        attention_seq=model.seq_length // seq_split,
        attention_heads=heads // head_split,
        qk_dim=qk_dim,
        v_dim=v_dim,
    )


def shards_of(sharding: TpSharding, *, tp: int, sequence_parallel: bool) -> int:
    """How many distinct pieces the global op is split into (1 = every rank does it all)."""
    match sharding:
        case TpSharding.COLUMN | TpSharding.ROW | TpSharding.HEADS:
            return tp
        case TpSharding.FEATURES | TpSharding.VOCAB:
            return tp
        case TpSharding.TOKENS:
            return tp if sequence_parallel else 1
        case TpSharding.REPLICATED:
            return 1
        case _ as unreachable:
            assert_never(unreachable)


# Per-element FLOP conventions: (forward, activation grad, weight grad).
# LayerNorm, softmax, GeLU: Calculon calculon/llm/layers.py (LayerNorm 9/14/7, SoftMax 5/8,
# GeLU 8/13). RMSNorm: our estimate, LayerNorm without the mean and the bias (6/10/2 per element).
# SwiGLU: our estimate, silu(gate)*up = 6 per output element forward, 10 backward.
# Squared ReLU: our estimate, max(x, 0) then a square = 2 forward; backward 2 * relu(x) * grad
# under the mask = 3.
_LAYERNORM_FLOPS: tuple[int, int, int] = (9, 14, 7)
_RMSNORM_FLOPS: tuple[int, int, int] = (6, 10, 2)
_SOFTMAX_FLOPS = (5, 8)
_GELU_FLOPS = (8, 13)
_SWIGLU_FLOPS = (6, 10)
_SQUARED_RELU_FLOPS = (2, 3)
_DROPOUT_MASK_BYTES = 1


def _gemm(
    name: SemanticOpName,
    sharding: TpSharding,
    dim: ShardDim,
    shape: GemmShape,
    *,
    bias: bool,
    width_bytes: int,
) -> SemanticOp:
    e = width_bytes
    m, n, k = shape.m, shape.n, shape.k
    bias_elems = k if bias else 0
    return SemanticOp(
        name=name,
        kind=OpKind.GEMM,
        sharding=sharding,
        shard_dim=dim,
        gemm=shape,
        forward=Work(
            matrix_flops=shape.flops,
            vector_flops=m * k if bias else 0,
            bytes_read=(m * n + n * k + bias_elems) * e,
            bytes_written=m * k * e,
        ),
        activation_grad=Work(
            matrix_flops=shape.flops,
            bytes_read=(m * k + n * k) * e,
            bytes_written=m * n * e,
        ),
        weight_grad=Work(
            matrix_flops=shape.flops,
            vector_flops=m * k if bias else 0,
            bytes_read=(m * n + m * k) * e,
            bytes_written=(n * k + bias_elems) * e,
        ),
    )


def _bmm(name: SemanticOpName, shape: GemmShape, *, width_bytes: int) -> SemanticOp:
    e, bt = width_bytes, shape.batch
    x, w, y = bt * shape.m * shape.n, bt * shape.n * shape.k, bt * shape.m * shape.k
    return SemanticOp(
        name=name,
        kind=OpKind.BATCHED_MATMUL,
        sharding=TpSharding.HEADS,
        shard_dim=ShardDim.HEADS,
        gemm=shape,
        forward=Work(matrix_flops=shape.flops, bytes_read=(x + w) * e, bytes_written=y * e),
        activation_grad=Work(
            matrix_flops=2 * shape.flops, bytes_read=(x + w + y) * e, bytes_written=(x + w) * e
        ),
        weight_grad=Work(),
    )


def _norm_flops(norm: Normalization) -> tuple[int, int, int]:
    match norm:
        case Normalization.LAYERNORM:
            return _LAYERNORM_FLOPS
        case Normalization.RMSNORM:
            return _RMSNORM_FLOPS
        case _ as unreachable:
            assert_never(unreachable)


def _activation_flops(activation: MlpActivation) -> tuple[int, int, int]:
    """(forward, backward) FLOPs per output element and the number of input tensors."""
    match activation:
        case MlpActivation.GELU:
            return (*_GELU_FLOPS, 1)
        case MlpActivation.SWIGLU:
            return (*_SWIGLU_FLOPS, 2)
        case MlpActivation.SQUARED_RELU:
            return (*_SQUARED_RELU_FLOPS, 1)
        case _ as unreachable:
            assert_never(unreachable)


def _norm(
    name: SemanticOpName, model: TransformerModelSpec, rows: int, *, width_bytes: int
) -> SemanticOp:
    e, h = width_bytes, model.hidden_size
    elems = rows * h
    fw, ag, wg = _norm_flops(model.normalization)
    params = model.norm_parameters
    return SemanticOp(
        name=name,
        kind=OpKind.NORM,
        sharding=TpSharding.TOKENS,
        shard_dim=ShardDim.SEQ,
        forward=Work(
            vector_flops=fw * elems, bytes_read=(elems + params) * e, bytes_written=elems * e
        ),
        activation_grad=Work(
            vector_flops=ag * elems, bytes_read=(2 * elems + params) * e, bytes_written=elems * e
        ),
        weight_grad=Work(
            vector_flops=wg * elems, bytes_read=2 * elems * e, bytes_written=params * e
        ),
    )


def _residual(
    name: SemanticOpName, rows: int, hidden: int, *, bias: bool, dropout: bool, width_bytes: int
) -> SemanticOp:
    """Bias + dropout + residual add, fused as Megatron's ``bias_dropout_add`` does; the
    row-parallel GEMM's bias therefore belongs here (added after the reduction). Without
    dropout (``hidden_dropout = 0``) no mask is written or read and nothing is multiplied."""
    e, elems = width_bytes, rows * hidden
    bias_flops = elems if bias else 0
    bias_elems = hidden if bias else 0
    mask = elems * _DROPOUT_MASK_BYTES if dropout else 0
    drop_flops = elems if dropout else 0
    return SemanticOp(
        name=name,
        kind=OpKind.ELEMENTWISE,
        sharding=TpSharding.TOKENS,
        shard_dim=ShardDim.SEQ,
        forward=Work(
            vector_flops=drop_flops + elems + bias_flops,  # dropout multiply, residual add
            bytes_read=(2 * elems + bias_elems) * e,
            bytes_written=elems * e + mask,
        ),
        activation_grad=Work(
            vector_flops=drop_flops + elems,  # mask the gradient, accumulate the residual
            bytes_read=2 * elems * e + mask,
            bytes_written=elems * e,
        ),
        weight_grad=Work(
            vector_flops=bias_flops,
            bytes_read=elems * e if bias else 0,
            bytes_written=bias_elems * e,
        ),
    )


def _unfused_attention_ops(
    dims: BlockDims, *, width_bytes: int, kv: int, score_elems: int, dropout: bool
) -> tuple[SemanticOp, ...]:
    """Korthikanti et al. 2022's attention core: ``Q K^T``, softmax, dropout and ``A V`` as
    separate kernels over the full ``s x s`` scores; no dropout kernel when
    ``attention_dropout = 0``."""
    e = width_bytes
    b, s = dims.micro_batch, dims.seq_length
    drop = (
        SemanticOp(
            name=SemanticOpName.ATTENTION_DROPOUT,
            kind=OpKind.ELEMENTWISE,
            sharding=TpSharding.HEADS,
            shard_dim=ShardDim.HEADS,
            forward=Work(
                vector_flops=score_elems,
                bytes_read=score_elems * e,
                bytes_written=score_elems * (e + _DROPOUT_MASK_BYTES),
            ),
            activation_grad=Work(
                vector_flops=score_elems,
                bytes_read=score_elems * (e + _DROPOUT_MASK_BYTES),
                bytes_written=score_elems * e,
            ),
            weight_grad=Work(),
        ),
    )
    return (
        _bmm(
            SemanticOpName.ATTENTION_SCORES,
            GemmShape(m=s, n=kv, k=s, batch=b * dims.heads),
            width_bytes=e,
        ),
        SemanticOp(
            name=SemanticOpName.SOFTMAX,
            kind=OpKind.SOFTMAX,
            sharding=TpSharding.HEADS,
            shard_dim=ShardDim.HEADS,
            forward=Work(
                vector_flops=_SOFTMAX_FLOPS[0] * score_elems,
                bytes_read=score_elems * e,
                bytes_written=score_elems * e,
            ),
            activation_grad=Work(
                vector_flops=_SOFTMAX_FLOPS[1] * score_elems,
                bytes_read=2 * score_elems * e,
                bytes_written=score_elems * e,
            ),
            weight_grad=Work(),
        ),
        *(drop if dropout else ()),
        _bmm(
            SemanticOpName.ATTENTION_OVER_VALUES,
            GemmShape(m=s, n=s, k=kv, batch=b * dims.heads),
            width_bytes=e,
        ),
    )


#: The fused kernel keeps one fp32 log-sum-exp per (query, head) for its backward
#: (FlashAttention-2, Dao 2023, Algorithm 1 line 13; cuDNN's ``softmax_stats``).
SOFTMAX_STATISTIC_BYTES = 4


def _fused_attention_op(dims: BlockDims, *, width_bytes: int) -> SemanticOp:
    """The fused causal kernel (FlashAttention's FLOP convention, :mod:`blueprinting.hardware.
    attention`): forward ``4 d`` FLOPs per attended pair, backward ``10 d`` (it recomputes the
    scores), ``d`` the mean of the Q/K and V head widths (``2 (d_qk + d_v)`` forward: MLA's
    192 + 128, Megatron-LM ``training.py`` l.1094-1135); it reads Q, K, V once and writes the
    output and the softmax statistics; its backward reads those and ``dO`` and writes ``dQ``,
    ``dK``, ``dV``. Dropout runs inside the kernel from its RNG state (no mask is stored)."""
    e = width_bytes
    b, s = dims.micro_batch, dims.seq_length
    qk, v = dims.qk_width, dims.v_width
    # FLOPs per pair are linear in the two widths; 2d = qk + v is even for every model here
    d = (qk + v) // 2
    # Under the load-balanced split each cp rank does exactly 1/cp of the causal pairs
    # (s^2/2 is a multiple of cp when 2cp | s): TE context_parallel.py l.1780-1795. A window's
    # band is as even over positions (all but its first W queries attend W keys), so 1/cp of
    # it too, rounded down (the a2a exchange's heads / cp make it exact).
    keys = dims.window_keys
    per_head = causal_attention_pairs(s) if keys is None else windowed_attention_pairs(s, keys)
    pairs = b * dims.heads * per_head // dims.context
    local_tokens = b * s // dims.context
    q = local_tokens * dims.heads * qk
    o = local_tokens * dims.heads * v
    kv_heads = max(1, dims.groups)
    k_and_v = local_tokens * kv_heads * (qk + v)
    stats = local_tokens * dims.heads * SOFTMAX_STATISTIC_BYTES
    launch_seq = windowed_rate_seq_length(dims.attention_seq or s, keys)
    launch_heads = dims.attention_heads or dims.heads
    return SemanticOp(
        name=SemanticOpName.CORE_ATTENTION,
        kind=OpKind.FUSED_ATTENTION,
        sharding=TpSharding.HEADS,
        shard_dim=ShardDim.HEADS,
        attention=AttentionShape(batch_heads=b * launch_heads, seq_length=launch_seq, head_dim=d),
        forward=Work(
            matrix_flops=FORWARD_FLOPS_PER_PAIR_DIM * d * pairs,
            bytes_read=(q + k_and_v) * e,
            bytes_written=o * e + stats,
        ),
        activation_grad=Work(
            matrix_flops=BACKWARD_FLOPS_PER_PAIR_DIM * d * pairs,
            bytes_read=(q + k_and_v + 2 * o) * e + stats,
            bytes_written=(q + k_and_v) * e,
        ),
        weight_grad=Work(),
    )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertDims:
    """What one rank's MoE layer sees for one micro-batch (shared reference section 7):
    ``tokens`` T = the rank's b*s/(t*cp) tokens entering the layer (sequence parallel),
    ``routed`` R = k*T (token, expert) copies it sends, ``received`` the rows its local experts
    compute after the ETP all-gather: ``R * etp * (1 + gamma)`` on the hottest rank (dropless;
    a capacity factor caps the factor at ``cf``, padding sets it to ``cf``);
    ``local_experts`` E/ep, each ``ffn`` = F/etp wide; ``shared_ffn`` the shared experts' width
    per TP rank (F_s/t, a dense MLP on the dense TP group)."""

    tokens: int
    routed: int
    received: int
    local_experts: int
    num_experts: int
    ffn: int
    shared_ffn: int
    expert_degree: int
    expert_tensor_degree: int
    #: ``--moe-token-dispatcher-type``: whether the received rows are sorted by local expert
    dispatcher: DispatcherType

    @property
    def sorts_chunks(self) -> bool:
        """Whether the received rows are sorted into local-expert order after the dispatch and
        back before the combine: the alltoall dispatcher's ``sort_chunks_by_idxs`` with more
        than one local expert (Megatron-LM @d98e8a64 ``moe/token_dispatcher.py``
        ``dispatch_postprocess`` / ``combine_preprocess``; the flex dispatchers' kernels write
        expert order themselves)."""
        return self.dispatcher is DispatcherType.ALLTOALL and self.local_experts > 1

    @property
    def rows_per_expert(self) -> int:
        """Rows of each local expert's GEMMs: the received rows spread evenly, rounded up."""
        return -(-self.received // self.local_experts)


def received_rows(moe: MixtureOfExperts, gathered: int) -> int:
    """Rows the hottest rank's experts compute out of ``gathered`` balanced ones:
    ``x (1 + gamma)`` dropless; a capacity factor caps the factor at ``cf`` (tokens beyond are
    dropped), padding to capacity makes it exactly ``cf`` (shared reference section 2.9)."""
    factor = 1.0 + moe.load_imbalance
    match moe.dropping:
        case Dropless():
            pass
        case CapacityFactor(factor=cf, pad_to_capacity=pad):
            factor = cf if pad else min(factor, cf)
        case _ as unreachable:
            assert_never(unreachable)
    return math.ceil(gathered * factor)


def expert_dims(
    model: TransformerModelSpec, dims: BlockDims, experts: ExpertParallel, *, tp: int
) -> ExpertDims:
    """The rank's :class:`ExpertDims` (callers check E % ep == 0 and etp | F first)."""
    moe = model.moe
    assert moe is not None, "expert_dims of a dense model"
    tokens = dims.token_rows
    routed = moe.top_k * tokens
    u = experts.tensor_degree
    return ExpertDims(
        tokens=tokens,
        routed=routed,
        received=received_rows(moe, routed * u),
        local_experts=moe.num_experts // experts.degree,
        num_experts=moe.num_experts,
        ffn=moe.expert_ffn_hidden_size // u,
        shared_ffn=moe.shared_expert_ffn_hidden_size // tp,
        expert_degree=experts.degree,
        expert_tensor_degree=u,
        dispatcher=dispatcher_type(experts.dispatcher),
    )


def _grouped_gemm(
    name: SemanticOpName, shape: GemmShape, *, bias: bool, width_bytes: int
) -> SemanticOp:
    """A grouped GEMM over ``shape.batch`` local experts (TE ``GroupedLinear``): every expert
    reads its own weight, so the weight bytes scale with the batch too."""
    e, g = width_bytes, shape.batch
    m, n, k = shape.m, shape.n, shape.k
    bias_elems = g * k if bias else 0
    return SemanticOp(
        name=name,
        kind=OpKind.GEMM,
        sharding=TpSharding.TOKENS,
        shard_dim=ShardDim.SEQ,
        gemm=shape,
        forward=Work(
            matrix_flops=shape.flops,
            vector_flops=g * m * k if bias else 0,
            bytes_read=(g * m * n + g * n * k + bias_elems) * e,
            bytes_written=g * m * k * e,
        ),
        activation_grad=Work(
            matrix_flops=shape.flops,
            bytes_read=(g * m * k + g * n * k) * e,
            bytes_written=g * m * n * e,
        ),
        weight_grad=Work(
            matrix_flops=shape.flops,
            vector_flops=g * m * k if bias else 0,
            bytes_read=(g * m * n + g * m * k) * e,
            bytes_written=(g * n * k + bias_elems) * e,
        ),
    )


def _elementwise(
    name: SemanticOpName,
    sharding: TpSharding,
    dim: ShardDim,
    *,
    elems: int,
    flops: tuple[int, int],
    inputs: int,
    width_bytes: int,
    out_elems: int | None = None,
) -> SemanticOp:
    """An element-wise op over ``elems`` inputs (each of ``inputs`` tensors) writing
    ``out_elems`` (default ``elems``); its backward reads the output gradient and the inputs."""
    e = width_bytes
    out = elems if out_elems is None else out_elems
    return SemanticOp(
        name=name,
        kind=OpKind.ELEMENTWISE,
        sharding=sharding,
        shard_dim=dim,
        forward=Work(
            vector_flops=flops[0] * out, bytes_read=inputs * elems * e, bytes_written=out * e
        ),
        activation_grad=Work(
            vector_flops=flops[1] * out,
            bytes_read=(inputs * elems + out) * e,
            bytes_written=inputs * elems * e,
        ),
        weight_grad=Work(),
    )


def _merged(name: SemanticOpName, first: SemanticOp, second: SemanticOp) -> SemanticOp:
    """Two GEMMs of one semantic op run back to back (MLA's Q and KV up projections): the work
    is their exact sum, the shape the larger one's (what the efficiency is looked up at)."""

    def add(a: Work, b: Work) -> Work:
        return Work(
            matrix_flops=a.matrix_flops + b.matrix_flops,
            vector_flops=a.vector_flops + b.vector_flops,
            bytes_read=a.bytes_read + b.bytes_read,
            bytes_written=a.bytes_written + b.bytes_written,
        )

    larger = max((first, second), key=lambda op: op.forward.matrix_flops)
    return SemanticOp(
        name=name,
        kind=first.kind,
        sharding=first.sharding,
        shard_dim=first.shard_dim,
        gemm=larger.gemm,
        forward=add(first.forward, second.forward),
        activation_grad=add(first.activation_grad, second.activation_grad),
        weight_grad=add(first.weight_grad, second.weight_grad),
    )


def mla_gathered_width(model: TransformerModelSpec) -> int:
    """Per-token width MLA's column-parallel up projections need whole on every TP rank: the
    q latent (or x itself without Q compression), the kv latent and the shared rope key
    (Megatron-Core ``multi_latent_attention.py`` gathers the down projections' outputs under
    sequence parallelism, not x)."""
    mla = model.self_attention
    assert isinstance(mla, MultiLatentAttention)
    q_in = model.hidden_size if mla.q_lora_rank is None else mla.q_lora_rank
    return q_in + mla.kv_lora_rank + mla.qk_pos_emb_head_dim


def _attention_input_ops(
    model: TransformerModelSpec, dims: BlockDims, *, width_bytes: int
) -> tuple[SemanticOp, ...]:
    """The projections that produce Q, K and V: one column-parallel QKV GEMM (MHA / GQA), or
    MLA's token-wise down projection and latent norms then its column-parallel up
    projections (Q per head of ``d_n + d_r``; K_nope and V per head from the kv latent)."""
    e, bias = width_bytes, model.add_bias_linear
    rows, m, h = dims.token_rows, dims.gemm_tokens, dims.hidden
    match model.self_attention:
        case StandardAttention():
            kv = dims.kv_channels
            qkv_width = (dims.heads + 2 * dims.groups) * kv
            return (
                _gemm(
                    SemanticOpName.QKV_PROJECTION,
                    TpSharding.COLUMN,
                    ShardDim.HEADS,
                    GemmShape(m=m, n=h, k=qkv_width),
                    bias=bias,
                    width_bytes=e,
                ),
            )
        case MultiLatentAttention() as mla:
            q_lora = mla.q_lora_rank
            latent = (q_lora or 0) + mla.kv_lora_rank
            down = _gemm(
                SemanticOpName.MLA_DOWN_PROJECTION,
                TpSharding.TOKENS,
                ShardDim.SEQ,
                GemmShape(m=rows, n=h, k=latent + mla.qk_pos_emb_head_dim),
                bias=False,
                width_bytes=e,
            )
            fw, ag, wg = _norm_flops(model.normalization)
            elems = rows * latent
            norm = SemanticOp(
                name=SemanticOpName.MLA_LATENT_NORM,
                kind=OpKind.NORM,
                sharding=TpSharding.TOKENS,
                shard_dim=ShardDim.SEQ,
                forward=Work(
                    vector_flops=fw * elems, bytes_read=elems * e, bytes_written=elems * e
                ),
                activation_grad=Work(
                    vector_flops=ag * elems, bytes_read=2 * elems * e, bytes_written=elems * e
                ),
                weight_grad=Work(vector_flops=wg * elems, bytes_read=2 * elems * e),
            )
            q_up = _gemm(
                SemanticOpName.MLA_UP_PROJECTION,
                TpSharding.COLUMN,
                ShardDim.HEADS,
                GemmShape(m=m, n=h if q_lora is None else q_lora, k=dims.heads * mla.qk_dim),
                bias=False,
                width_bytes=e,
            )
            kv_up = _gemm(
                SemanticOpName.MLA_UP_PROJECTION,
                TpSharding.COLUMN,
                ShardDim.HEADS,
                GemmShape(
                    m=m,
                    n=mla.kv_lora_rank,
                    k=dims.heads * (mla.qk_head_dim + mla.v_head_dim),
                ),
                bias=False,
                width_bytes=e,
            )
            return (down, norm, _merged(SemanticOpName.MLA_UP_PROJECTION, q_up, kv_up))
        case _ as unreachable:
            assert_never(unreachable)


def _mlp_ops(
    model: TransformerModelSpec,
    m: int,
    h: int,
    ffn: int,
    *,
    names: tuple[SemanticOpName, SemanticOpName, SemanticOpName],
    width_bytes: int,
) -> tuple[SemanticOp, ...]:
    """A TP-sharded MLP of (local) width ``ffn``: column-parallel up, activation, row-parallel
    down (the dense MLP, and the shared experts on the dense TP group)."""
    e, bias = width_bytes, model.add_bias_linear
    up_name, act_name, down_name = names
    up_width = 2 * ffn if model.activation is MlpActivation.SWIGLU else ffn
    ffn_elems = m * ffn
    act_fw, act_bw, act_inputs = _activation_flops(model.activation)
    return (
        _gemm(
            up_name,
            TpSharding.COLUMN,
            ShardDim.FFN,
            GemmShape(m=m, n=h, k=up_width),
            bias=bias,
            width_bytes=e,
        ),
        _elementwise(
            act_name,
            TpSharding.FEATURES,
            ShardDim.FFN,
            elems=ffn_elems,
            flops=(act_fw, act_bw),
            inputs=act_inputs,
            width_bytes=e,
        ),
        _gemm(
            down_name,
            TpSharding.ROW,
            ShardDim.FFN,
            GemmShape(m=m, n=ffn, k=h),
            bias=False,
            width_bytes=e,
        ),
    )


#: Router bookkeeping per (token, expert) score: softmax / sigmoid, top-k selection and the
#: gate's normalization (our estimate, like the other element-wise counts).
_ROUTER_FLOPS = (6, 6)
#: Bytes of the permutation's row-id map per routed copy (int64, fused permute: shared
#: reference section 2.8).
PERMUTE_INDEX_BYTES = 8


def _chunk_sort(name: SemanticOpName, elems: int, *, width_bytes: int) -> SemanticOp:
    """A row permutation of ``elems`` hidden values (TE's fused ``sort_chunks_by_map``): one
    read and one write of the rows in each direction, no arithmetic (the routing
    probabilities sorted beside them, 4 B per row, are not counted: 1/h of the rows' bytes)."""
    moved = Work(bytes_read=elems * width_bytes, bytes_written=elems * width_bytes)
    return SemanticOp(
        name=name,
        kind=OpKind.ELEMENTWISE,
        sharding=TpSharding.TOKENS,
        shard_dim=ShardDim.SEQ,
        forward=moved,
        activation_grad=moved,
        weight_grad=Work(),
    )


# --------------------------------------------------------------------------------------------
# Eager PyTorch passes: what Megatron runs op by op where no fused kernel applies
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class EagerPasses:
    """Which eager (one PyTorch op at a time) chains a training block runs beside its fused
    kernels, decided by :func:`eager_passes`. Each is an element-wise, memory-bound op priced
    by the roofline at the HBM rate; the default runs none (what the fused kernels and the
    serving engines run)."""

    #: ``_apply_rotary_pos_emb_bshd`` on Q and K instead of Transformer Engine's fused RoPE
    rope: bool = False
    #: the clamp and concatenation before the experts' fused quick-GeGLU
    activation_clamp: bool = False
    #: the experts' FC2 bias added in a per-expert Python loop (``_apply_bias``)
    expert_bias: bool = False


_NO_EAGER_PASSES = EagerPasses()


def eager_passes(model: TransformerModelSpec, fusions: KernelFusions) -> EagerPasses:
    """Megatron's rules for the eager chains (each cited at its op):

    - RoPE runs unfused unless ``apply_rope_fusion`` and ``position_embedding_type = rope``
      (Megatron-LM arguments.py l.1285-1286 @2edffadb; Megatron-Bridge ``utils/fusions.py``
      ``validate_rope_fusion_compatibility``); only multi-head / grouped-query attention here:
      MLA applies its rotary part inside its up projection, not costed;
    - the clamp runs as eager passes when the model sets ``activation_func_clamp_value`` on a
      GLU (Blueprinting's ``swiglu`` stands for both GLUs) and the experts do not run under
      Transformer Engine's op fuser;
    - the FC2 bias loop runs with ``add_bias_linear`` without the op fuser.
    Routed experts only: a dense model has neither expert chain."""
    moe = model.moe is not None
    fused_experts = fusions.use_transformer_engine_op_fuser
    gated = model.activation is MlpActivation.SWIGLU
    rope_fused = fusions.apply_rope_fusion and model.position_embedding is PositionEmbedding.ROPE
    rotary = model.position_embedding in (PositionEmbedding.ROPE, PositionEmbedding.YARN)
    return EagerPasses(
        rope=rotary and not rope_fused and isinstance(model.self_attention, StandardAttention),
        activation_clamp=moe
        and gated
        and model.activation_func_clamp_value is not None
        and not fused_experts,
        expert_bias=moe and model.add_bias_linear and not fused_experts,
    )


#: Kernels of the unfused RoPE on one tensor: forward ``t * cos``, ``-x2``, ``cat`` (the
#: rotated half), ``* sin``, ``+``, ``cat((t, t_pass))``, and per call ``cos``, ``sin`` of the
#: frequencies, each scaled by ``mscale`` and cast (6 small kernels); backward ``grad * cos``,
#: ``grad * sin``, ``neg``, the chunk's ``cat``, the empty ``t_pass`` slice's ``zeros`` and two
#: gradient accumulations.
ROPE_LAUNCHES = (12, 7)


def _rotary_op(dims: BlockDims, *, width_bytes: int) -> SemanticOp:
    """Megatron's unfused RoPE (Megatron-LM @2edffadb ``models/common/embeddings/rope_utils.py``
    ``apply_rotary_pos_emb`` l.250-316 falling through to ``_apply_rotary_pos_emb_bshd``
    l.92-126 and ``_rotate_half`` l.73-89; called on Q and on K by ``attention.py``
    l.1106-1125), on the ``N`` elements of Q and K (``b s/cp`` tokens, heads/t and groups/t
    heads of ``d``). Bytes per element of ``N``, in units of the element width:

    - forward: ``t * cos_`` reads 1 writes 1; ``-x2`` 1/2 and 1/2; ``cat((-x2, x1))`` 1 and 1;
      ``* sin_`` 1 and 1; ``+`` 2 and 1; ``cat((t, t_pass))`` (``t_pass`` empty: d is the rotary
      width) 1 and 1: reads 13/2, writes 11/2. The ``cos``/``sin`` of the ``[s, 1, 1, d]``
      frequencies are 1/(b n) of that and not counted in bytes, only in launches;
    - backward (PyTorch autograd): ``grad * sin_`` and ``grad * cos_`` 1 and 1 each (the
      frequencies need no gradient), ``neg`` 1/2 and 1/2, the chunk's ``split_backward`` cat 1
      and 1, the empty slice's ``slice_backward`` zeros 0 and 1, and the input gradient
      accumulated from three uses, two adds of 2 and 1: reads 15/2, writes 13/2.

    Stored for backward: nothing new (the multiplies save only the frequencies; the rotated Q
    and K are what the attention kernel keeps, counted with it), so no memory term. Not in any
    recompute module (``core_attn`` checkpoints the core after RoPE)."""
    e = width_bytes
    n = dims.gemm_tokens * (dims.heads + dims.groups) * dims.kv_channels
    return SemanticOp(
        name=SemanticOpName.ROTARY_EMBEDDING,
        kind=OpKind.ELEMENTWISE,
        sharding=TpSharding.HEADS,
        shard_dim=ShardDim.HEADS,
        # multiplies, negation, add: 4 per element forward; 2 multiplies, negation, 2 adds
        forward=Work(vector_flops=4 * n, bytes_read=13 * n * e // 2, bytes_written=11 * n * e // 2),
        activation_grad=Work(
            vector_flops=5 * n, bytes_read=15 * n * e // 2, bytes_written=13 * n * e // 2
        ),
        weight_grad=Work(),
        launches=(2 * ROPE_LAUNCHES[0], 2 * ROPE_LAUNCHES[1]),
    )


#: Kernels of the eager clamp: forward two ``clamp`` and the ``cat``; backward
#: ``clamp_backward`` of the gate (``le``, ``where``, the zero ``scalar_tensor``'s fill) and of
#: the linear half (``ge``, ``le``, ``logical_and_``, ``where``, fill), then the chunk's cat.
CLAMP_LAUNCHES = (3, 9)
#: Bytes of the boolean masks ``clamp_backward`` builds, per element.
_MASK_BYTES = 1


def _clamp_op(ex: ExpertDims, *, width_bytes: int) -> SemanticOp:
    """``weighted_bias_quick_geglu_impl`` with ``clamp_value`` (Megatron-LM @2edffadb
    ``megatron/core/fusions/fused_bias_geglu.py`` l.410-442; the same at cba6b0ed, e9a1b8a1,
    458c8d0e): ``input.chunk(2, -1)``, ``x_glu.clamp(max=v)``, ``x_linear.clamp(-v, v)`` and a
    ``torch.cat`` back to ``[R, 2F]`` before the compiled GLU, over the FC1 output of the
    ``n = R F`` elements per half (``R`` the received rows, ``F`` = F/etp). Bytes per element
    of ``n`` in element widths ``x`` and mask bytes:

    - forward: each clamp reads 1 and writes 1, the cat reads 2 and writes 2: 4x and 4x;
    - backward (PyTorch ``clamp_backward``, ``torch/csrc/autograd/FunctionsManual.cpp``:
      ``where(self <= max, grad, 0)`` for the gate, ``where((self >= min).logical_and_(self
      <= max), grad, 0)`` for the linear half, then ``split_backward``'s cat): the gate's
      compare reads x writes 1, its where reads x + 1 writes x; the linear half's two compares
      read x and write 1 each, the and reads 2 writes 1, its where reads x + 1 writes x; the
      cat reads 2x writes 2x: reads 7x + 4, writes 4x + 4.

    Recomputed with ``moe_act`` (``experts.py`` ``TEGroupedMLP.forward`` checkpoints the whole
    ``bias_act_func``). Stored for backward without that recompute: the clamps keep the FC1
    output (their input views) and the GLU saves the concatenated copy, a second ``R 2F x``
    (``analysis.memory.moe_ffn_activation_bytes``)."""
    e, n = width_bytes, ex.local_experts * ex.rows_per_expert * ex.ffn
    m = _MASK_BYTES
    return SemanticOp(
        name=SemanticOpName.EXPERT_ACTIVATION_CLAMP,
        kind=OpKind.ELEMENTWISE,
        sharding=TpSharding.TOKENS,
        shard_dim=ShardDim.SEQ,
        forward=Work(vector_flops=3 * n, bytes_read=4 * n * e, bytes_written=4 * n * e),
        activation_grad=Work(
            vector_flops=6 * n,
            bytes_read=n * (7 * e + 4 * m),
            bytes_written=n * (4 * e + 4 * m),
        ),
        weight_grad=Work(),
        launches=CLAMP_LAUNCHES,
    )


#: Bytes of an fp32 routing probability (the flex dispatchers' managers cast them).
FP32_PROBS_BYTES = 4


def routing_probs_bytes(dispatcher: DispatcherType, width_bytes: int) -> int:
    """The routing probabilities' element width at the experts: the model's datatype from the
    router (Megatron-LM's router computes in its input's dtype without ``moe_router_dtype``,
    which no Blueprinting key sets), fp32 under the flex dispatcher, whose backends take fp32
    weights only and cast them (Megatron-LM @d98e8a64 ``moe/token_dispatcher.py``: HybridEP
    l.1135-1141, DeepEP l.1312-1318, NCCL-EP's TE kernels l.1715-1718, "only supports float32
    probs")."""
    match dispatcher:
        case DispatcherType.FLEX:
            return FP32_PROBS_BYTES
        case DispatcherType.ALLTOALL | DispatcherType.ALLGATHER:
            return width_bytes
        case _ as unreachable:
            assert_never(unreachable)


def _expert_bias_op(ex: ExpertDims, hidden: int, *, width_bytes: int) -> SemanticOp:
    """``TEGroupedMLP._apply_bias`` (Megatron-LM @2edffadb ``moe/experts.py`` l.250-268, @d98e8a64
    l.345-380; FC2 is built with ``skip_bias_add``, l.206-216, and ``forward`` calls it after
    FC2, l.398): per local expert ``t + b * p`` on its rows (``b`` the expert's ``h`` bias,
    ``p`` its rows' routing probabilities, :func:`routing_probs_bytes`), one ``torch.cat`` over
    the ``N = R h`` outputs and ``.to`` the output's dtype. With fp32 probabilities (the flex
    dispatchers) ``b * p`` and the sum promote to fp32 (width ``w``) and the ``.to`` casts back
    (a no-op when the widths agree). Bytes, ``x`` the output's element width:

    - forward: ``b * p`` writes ``N w`` (reads the bias and the probabilities), ``+`` reads
      ``N x + N w`` writes ``N w``, the cat reads and writes ``N w``, the cast reads ``N w``
      writes ``N x``: at ``w = x`` reads 3N + g h + R, writes 3N (element widths);
    - backward: the cast's gradient back to ``w`` (read ``N x``, write ``N w``), the cat's
      pieces are views; per expert ``grad * p`` and its sum over the rows (the bias gradient),
      ``grad * b`` and its sum over h (the probabilities' gradient), each multiply reading and
      writing ``N w``, each sum reading it; ``t``'s gradient cast to ``x`` (read ``N w``, write
      ``N x``); the rows' gradients cat back (``split_backward``, ``N x``), the probabilities'
      too: at ``w = x`` reads 5N + 2R, writes 3N + g h + 2R. The bias gradient is computed here,
      in the autograd node, not in a deferred weight-gradient pass.

    Stored for backward: the probabilities and the bias (already held), so no memory term."""
    e, g = width_bytes, ex.local_experts
    pw = routing_probs_bytes(ex.dispatcher, e)
    w = max(e, pw)
    cast = w != e
    rows = g * ex.rows_per_expert
    n = rows * hidden
    return SemanticOp(
        name=SemanticOpName.EXPERT_BIAS,
        kind=OpKind.ELEMENTWISE,
        sharding=TpSharding.TOKENS,
        shard_dim=ShardDim.SEQ,
        forward=Work(
            vector_flops=2 * n,
            bytes_read=n * e + 2 * n * w + (n * w if cast else 0) + g * hidden * e + rows * pw,
            bytes_written=3 * n * w + (n * e if cast else 0),
        ),
        activation_grad=Work(
            vector_flops=4 * n,
            bytes_read=4 * n * w + n * e + (n * e + n * w if cast else 0) + 2 * rows * pw,
            bytes_written=2 * n * w
            + n * e
            + (n * w + n * e if cast else 0)
            + g * hidden * e
            + 2 * rows * pw,
        ),
        weight_grad=Work(),
        # forward: a multiply and an add per expert, the cat (and the cast); backward: two
        # multiplies and two sums per expert, the two cats (and the incoming gradient's cast and
        # each expert's row-gradient cast)
        launches=(2 * g + 1 + (1 if cast else 0), 4 * g + 2 + (1 + g if cast else 0)),
    )


def _moe_ops(
    model: TransformerModelSpec,
    dims: BlockDims,
    ex: ExpertDims,
    *,
    width_bytes: int,
    eager: EagerPasses,
) -> tuple[SemanticOp, ...]:
    """A MoE layer's feed-forward on one rank: the replicated h x E router on its T tokens,
    the permute into expert order, the grouped expert GEMMs on the rows it receives, the
    unpermute with the routing probabilities, then the shared experts as a TP-sharded MLP
    (Megatron-Core ``moe/moe_layer.py``, ``router.py``, ``experts.py``, ``shared_experts.py``)."""
    e, bias = width_bytes, model.add_bias_linear
    h, t_rows = dims.hidden, ex.tokens
    swiglu = model.activation is MlpActivation.SWIGLU
    up = 2 * ex.ffn if swiglu else ex.ffn
    rows = ex.rows_per_expert
    g = ex.local_experts
    act_fw, act_bw, act_inputs = _activation_flops(model.activation)
    scores = t_rows * ex.num_experts
    gate = _gemm(
        SemanticOpName.ROUTER,
        TpSharding.TOKENS,
        ShardDim.SEQ,
        GemmShape(m=t_rows, n=h, k=ex.num_experts),
        bias=False,
        width_bytes=e,
    )
    # the gate GEMM plus the scores' activation, top-k and normalization
    router = replace(
        gate,
        forward=replace(gate.forward, vector_flops=_ROUTER_FLOPS[0] * scores),
        activation_grad=replace(gate.activation_grad, vector_flops=_ROUTER_FLOPS[1] * scores),
    )
    sort, unsort = (
        _chunk_sort(name, ex.received * h, width_bytes=e)
        for name in (SemanticOpName.MOE_SORT_CHUNKS, SemanticOpName.MOE_UNSORT_CHUNKS)
    )
    ops: list[SemanticOp] = [
        router,
        _elementwise(
            SemanticOpName.MOE_PERMUTE,
            TpSharding.TOKENS,
            ShardDim.SEQ,
            elems=t_rows * h,
            out_elems=ex.routed * h,
            flops=(0, 1),
            inputs=1,
            width_bytes=e,
        ),
        *((sort,) if ex.sorts_chunks else ()),
        _grouped_gemm(
            SemanticOpName.EXPERT_FC1,
            GemmShape(m=rows, n=h, k=up, batch=g, calls=BatchedGemmCalls.CALL_PER_MEMBER),
            bias=bias,
            width_bytes=e,
        ),
        *((_clamp_op(ex, width_bytes=e),) if eager.activation_clamp else ()),
        _elementwise(
            SemanticOpName.EXPERT_ACTIVATION,
            TpSharding.TOKENS,
            ShardDim.SEQ,
            elems=g * rows * ex.ffn,
            flops=(act_fw + 1, act_bw + 2),  # the routing probability multiplies in (v0.13+)
            inputs=act_inputs,
            width_bytes=e,
        ),
        _grouped_gemm(
            SemanticOpName.EXPERT_FC2,
            GemmShape(m=rows, n=ex.ffn, k=h, batch=g, calls=BatchedGemmCalls.CALL_PER_MEMBER),
            # skip_bias_add: the bias is the eager loop's (or the op fuser's grouped linear's)
            bias=bias and not eager.expert_bias,
            width_bytes=e,
        ),
        *((_expert_bias_op(ex, h, width_bytes=e),) if eager.expert_bias else ()),
        *((unsort,) if ex.sorts_chunks else ()),
        _elementwise(
            SemanticOpName.MOE_UNPERMUTE,
            TpSharding.TOKENS,
            ShardDim.SEQ,
            elems=ex.routed * h,
            out_elems=t_rows * h,
            flops=(1, 1),
            inputs=1,
            width_bytes=e,
        ),
    ]
    if ex.shared_ffn:
        ops += _mlp_ops(
            model,
            dims.gemm_tokens,
            h,
            ex.shared_ffn,
            names=(
                SemanticOpName.SHARED_EXPERT_UP,
                SemanticOpName.SHARED_EXPERT_ACTIVATION,
                SemanticOpName.SHARED_EXPERT_DOWN,
            ),
            width_bytes=e,
        )
    return tuple(ops)


def block_ops(
    model: TransformerModelSpec,
    dims: BlockDims,
    *,
    attention: AttentionKernel,
    experts: ExpertDims | None = None,
    eager: EagerPasses = _NO_EAGER_PASSES,
) -> tuple[SemanticOp, ...]:
    """The block's semantic ops in forward order, evaluated on ``dims`` (global or local), with
    the attention core as ``attention`` runs it; ``experts``: the block is a MoE layer seen by
    one rank of that expert grid (None: the dense MLP); ``eager``: the eager chains it runs
    (:func:`eager_passes`; the default none)."""
    e = model.datatype.bytes
    feed_forward = (
        _mlp_ops(
            model,
            dims.gemm_tokens,
            dims.hidden,
            dims.ffn,
            names=(SemanticOpName.MLP_UP, SemanticOpName.MLP_ACTIVATION, SemanticOpName.MLP_DOWN),
            width_bytes=e,
        )
        if experts is None
        else _moe_ops(model, dims, experts, width_bytes=e, eager=eager)
    )
    head, residual = _attention_half(model, dims, attention, rope=eager.rope)
    return (*head, *feed_forward, residual)


def attention_core_ops(
    model: TransformerModelSpec, dims: BlockDims, attention: AttentionKernel
) -> tuple[SemanticOp, ...]:
    """The attention core of one block as ``attention`` runs it: the fused kernel over the
    causal mask, or over ``dims.window_keys`` keys per query on a sliding-window layer; the
    unfused ops compute and mask the whole ``s x s`` scores either way (a window saves them
    no work)."""
    e = model.datatype.bytes
    match attention:
        case FusedAttention():
            return (_fused_attention_op(dims, width_bytes=e),)
        case UnfusedAttention():
            b, s = dims.micro_batch, dims.seq_length
            return _unfused_attention_ops(
                dims,
                width_bytes=e,
                kv=dims.kv_channels,
                score_elems=b * dims.heads * s * s,
                dropout=model.has_attention_dropout,
            )
        case _ as unreachable:
            assert_never(unreachable)


@lru_cache(maxsize=4096)
def _attention_half(
    model: TransformerModelSpec, dims: BlockDims, attention: AttentionKernel, *, rope: bool
) -> tuple[tuple[SemanticOp, ...], SemanticOp]:
    """The ops of :func:`block_ops` that do not read the feed-forward: the attention half up
    to the pre-MLP norm, and the closing residual. Memoized (pure in its arguments): a search's
    MoE blocks that differ in the expert grid hold the same op objects here, which their
    lowering (distributed.passes._SPANS) and costing find by identity."""
    e = model.datatype.bytes
    bias = model.add_bias_linear
    rows, m, h = dims.token_rows, dims.gemm_tokens, dims.hidden
    core = attention_core_ops(model, dims, attention)
    head = (
        _norm(SemanticOpName.INPUT_NORM, model, rows, width_bytes=e),
        *_attention_input_ops(model, dims, width_bytes=e),
        *((_rotary_op(dims, width_bytes=e),) if rope else ()),
        *core,
        _gemm(
            SemanticOpName.OUTPUT_PROJECTION,
            TpSharding.ROW,
            ShardDim.HEADS,
            GemmShape(m=m, n=dims.heads * dims.v_width, k=h),
            bias=False,
            width_bytes=e,
        ),
        _residual(
            SemanticOpName.ATTENTION_RESIDUAL,
            rows,
            h,
            bias=bias,
            dropout=model.has_hidden_dropout,
            width_bytes=e,
        ),
        _norm(SemanticOpName.POST_ATTENTION_NORM, model, rows, width_bytes=e),
    )
    residual = _residual(
        SemanticOpName.MLP_RESIDUAL,
        rows,
        h,
        bias=bias,
        dropout=model.has_hidden_dropout,
        width_bytes=e,
    )
    return head, residual


# Vocab-parallel cross-entropy per-logit FLOPs (our convention, after Megatron's
# megatron/core/tensor_parallel/cross_entropy.py): forward max, subtract, exp, sum = 4;
# backward softmax minus one-hot and scale = 2.
_CROSS_ENTROPY_FLOPS = (4, 2)
_UNFUSED_CROSS_ENTROPY = UnfusedCrossEntropy()
#: Megatron's vocab-parallel cross-entropy reduces three per-token fp32 statistics over tp:
#: the logit max, the predicted logit and the sum of exponentials.
CROSS_ENTROPY_STATISTICS = ("logit_max", "predicted_logit", "sum_exp")
CROSS_ENTROPY_STATISTIC_BYTES = 4


def first_stage_ops(model: TransformerModelSpec, dims: BlockDims) -> tuple[SemanticOp, ...]:
    """Embedding lookup (vocab-parallel, masked on every rank) and learned positions."""
    e, h, tokens = model.datatype.bytes, dims.hidden, dims.gemm_tokens
    lookup = SemanticOp(
        name=SemanticOpName.EMBEDDING,
        kind=OpKind.GATHER,
        sharding=TpSharding.REPLICATED,
        shard_dim=ShardDim.VOCAB,
        forward=Work(bytes_read=tokens * h * e + tokens * 8, bytes_written=tokens * h * e),
        activation_grad=Work(),
        # scatter-add of every token's gradient row into the (vocab-sharded) table
        weight_grad=Work(
            vector_flops=tokens * h,
            bytes_read=tokens * h * e + tokens * 8,
            bytes_written=tokens * h * e,
        ),
    )
    match model.position_embedding:
        case PositionEmbedding.ROPE | PositionEmbedding.YARN | PositionEmbedding.NONE:
            return (lookup,)
        case PositionEmbedding.LEARNED_ABSOLUTE:
            rows = dims.token_rows
            positions = SemanticOp(
                name=SemanticOpName.POSITION_EMBEDDING,
                kind=OpKind.ELEMENTWISE,
                sharding=TpSharding.TOKENS,
                shard_dim=ShardDim.SEQ,
                forward=Work(
                    vector_flops=rows * h, bytes_read=2 * rows * h * e, bytes_written=rows * h * e
                ),
                activation_grad=Work(),
                weight_grad=Work(
                    vector_flops=rows * h, bytes_read=rows * h * e, bytes_written=rows * h * e
                ),
            )
            return (lookup, positions)
        case _ as unreachable:
            assert_never(unreachable)


#: fp32, the datatype every cross-entropy implementation computes the softmax in.
_FP32_BYTES = 4


def cross_entropy_work(kernel: CrossEntropyKernel, logits: int, e: int) -> tuple[Work, Work]:
    """(forward, activation gradient) of the vocab-parallel cross-entropy over ``logits``
    elements of the ``[tokens, V/t]`` logits in the model's ``e``-byte datatype, pass by pass
    as each implementation runs it (HBM bytes; per-token statistics and the TP all-reduces are
    negligible here, the collectives are their own tasks):

    - unfused (Megatron-LM @d98e8a64 ``tensor_parallel/cross_entropy.py``): ``.float()`` (read e,
      write 4), max (read 4), ``-= max`` and ``exp`` in place (read 4, write 4 each), sum
      (read 4), ``div_`` to the saved softmax (read 4, write 4); backward ``mul_`` by the
      loss gradient in place (read 4, write 4) and the cast back through ``.float()``'s
      backward (read 4, write e);
    - native fused (``fusions/fused_cross_entropy.py``, jit-fused): ``calculate_logits_max``
      (read e, write the fp32 copy), ``calculate_predicted_logits`` (read 4, write the
      exponentials), ``calculate_cross_entropy_loss`` (read 4, write the softmax); backward
      ``calculate_gradients`` (read 4, write the bf16 gradient);
    - TE (TransformerEngine@d0067d0d ``pytorch/triton/cross_entropy.py``): the online-softmax
      kernel (read e), the loss kernel (read e, write the fp32 gradient); backward
      ``element_mul_kernel`` in place (read 4, write 4) and autograd's cast of the fp32
      gradient to the logits' datatype (read 4, write e)."""
    n = logits
    ce_fw, ce_bw = _CROSS_ENTROPY_FLOPS
    forward, backward = _cross_entropy_bytes(kernel, e)
    return (
        Work(vector_flops=ce_fw * n, bytes_read=forward[0] * n, bytes_written=forward[1] * n),
        Work(vector_flops=ce_bw * n, bytes_read=backward[0] * n, bytes_written=backward[1] * n),
    )


def _cross_entropy_bytes(
    kernel: CrossEntropyKernel, e: int
) -> tuple[tuple[int, int], tuple[int, int]]:
    """((read, written) forward, (read, written) backward) bytes per logit
    (:func:`cross_entropy_work`)."""
    f = _FP32_BYTES
    match kernel:
        case UnfusedCrossEntropy():
            return (e + 5 * f, 4 * f), (2 * f, f + e)
        case FusedCrossEntropy(impl=impl):
            match impl:
                case CrossEntropyFusionImpl.NATIVE:
                    # calculate_gradients casts to bf16 whatever the logits' datatype
                    return (e + 2 * f, 3 * f), (f, 2)
                case CrossEntropyFusionImpl.TE:
                    return (2 * e, f), (2 * f, f + e)
                case _ as unreachable_impl:
                    assert_never(unreachable_impl)
        case _ as unreachable:
            assert_never(unreachable)


def last_stage_ops(
    model: TransformerModelSpec,
    dims: BlockDims,
    cross_entropy: CrossEntropyKernel = _UNFUSED_CROSS_ENTROPY,
) -> tuple[SemanticOp, ...]:
    """Final norm, LM head ``[b*s, h] x [h, V/t]`` (column-parallel) and the vocab-parallel
    cross-entropy (Megatron ``parallel_output=True`` path; :func:`cross_entropy_work`)."""
    e, tokens = model.datatype.bytes, dims.gemm_tokens
    logits = tokens * dims.vocab
    ce_forward, ce_backward = cross_entropy_work(cross_entropy, logits, e)
    return (
        _norm(SemanticOpName.FINAL_NORM, model, dims.token_rows, width_bytes=e),
        _gemm(
            SemanticOpName.LM_HEAD,
            TpSharding.COLUMN,
            ShardDim.VOCAB,
            GemmShape(m=tokens, n=dims.hidden, k=dims.vocab),
            bias=False,
            width_bytes=e,
        ),
        SemanticOp(
            name=SemanticOpName.CROSS_ENTROPY,
            kind=OpKind.CROSS_ENTROPY,
            sharding=TpSharding.VOCAB,
            shard_dim=ShardDim.VOCAB,
            forward=ce_forward,
            activation_grad=ce_backward,
            weight_grad=Work(),
        ),
    )


# --------------------------------------------------------------------------------------------
# Boundaries
# --------------------------------------------------------------------------------------------
class Boundary(StrEnum):
    """The four block boundaries where a TP collective reconstructs a semantic activation."""

    ATTENTION_INPUT = "attention_input"  # before the column-parallel QKV projection
    ATTENTION_OUTPUT = "attention_output"  # after the row-parallel output projection
    MLP_INPUT = "mlp_input"  # before the column-parallel MLP up projection
    MLP_OUTPUT = "mlp_output"  # after the row-parallel MLP down projection
    LM_HEAD_INPUT = "lm_head_input"
    EMBEDDING_OUTPUT = "embedding_output"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class BoundaryCollective:
    """A collective on the tp axis: what it reconstructs, in which direction, its bytes.

    ``bytes`` is the size of the full (unsharded) tensor, the convention of NCCL-tests' "size"
    and of Calculon's ``*_tp_comm_size``; a cost model turns it into bus traffic.
    """

    boundary: Boundary
    direction: Direction
    purpose: CollectivePurpose
    kind: CollectiveKind
    bytes: int
    source: Placement
    target: Placement
    after: SemanticOpName  # the op whose output (or whose input's gradient) it carries


def _collective_at(
    boundary: Boundary, op: SemanticOpName, size: int
) -> Callable[
    [Direction, CollectivePurpose, CollectiveKind, Placement, Placement], BoundaryCollective
]:
    """A maker of the collectives of one boundary: they share the boundary, op and size."""

    def make(
        direction: Direction,
        purpose: CollectivePurpose,
        kind: CollectiveKind,
        source: Placement,
        target: Placement,
    ) -> BoundaryCollective:
        return BoundaryCollective(
            boundary=boundary,
            direction=direction,
            purpose=purpose,
            kind=kind,
            bytes=size,
            source=source,
            target=target,
            after=op,
        )

    return make


def _column_input_collectives(
    boundary: Boundary, op: SemanticOpName, size: int, *, sequence_parallel: bool
) -> tuple[BoundaryCollective, ...]:
    """Before a column-parallel GEMM: AG in forward (SP); the input gradient is partial, so
    AR (or RS under SP) in backward; under SP Megatron re-gathers the input for dW."""
    seq, r, p = Shard(dim=ShardDim.SEQ), Replicate(), Partial()
    make = _collective_at(boundary, op, size)
    fw, bw = Direction.FORWARD, Direction.BACKWARD
    edge, regather = CollectivePurpose.BOUNDARY, CollectivePurpose.REGATHER
    if not sequence_parallel:
        return (make(bw, edge, CollectiveKind.ALL_REDUCE, p, r),)
    return (
        make(fw, edge, CollectiveKind.ALL_GATHER, seq, r),
        make(bw, edge, CollectiveKind.REDUCE_SCATTER, p, seq),
        make(bw, regather, CollectiveKind.ALL_GATHER, seq, r),
    )


def _row_output_collectives(
    boundary: Boundary, op: SemanticOpName, size: int, *, sequence_parallel: bool
) -> tuple[BoundaryCollective, ...]:
    """After a row-parallel GEMM: AR (or RS under SP) of the partial output in forward; under
    SP the output gradient is all-gathered in backward."""
    seq, r, p = Shard(dim=ShardDim.SEQ), Replicate(), Partial()
    make = _collective_at(boundary, op, size)
    fw, bw, edge = Direction.FORWARD, Direction.BACKWARD, CollectivePurpose.BOUNDARY
    if not sequence_parallel:
        return (make(fw, edge, CollectiveKind.ALL_REDUCE, p, r),)
    return (
        make(fw, edge, CollectiveKind.REDUCE_SCATTER, p, seq),
        make(bw, edge, CollectiveKind.ALL_GATHER, seq, r),
    )


def activation_bytes(model: TransformerModelSpec, micro_batch: int, cp: int = 1) -> int:
    """b*(s/cp)*h*bytes: the activation every TP boundary collective reconstructs (a cp rank's
    tokens)."""
    return micro_batch * model.seq_length // cp * model.hidden_size * model.datatype.bytes


# --------------------------------------------------------------------------------------------
# Context-parallel exchanges (shared/reference/modern_parallelism.md sections 1.2, 1.3, 7)
# --------------------------------------------------------------------------------------------
TP_AXIS = "tp"
CP_AXIS = "cp"
CP_A2A_AXIS = "cp_a2a"  # the all-to-all level of a2a+p2p (consecutive cp ranks)
CP_P2P_AXIS = "cp_p2p"  # its ring level
EP_AXIS = "ep"  # the expert grid (MoE parallel folding): experts over ep
ETP_AXIS = "etp"  # each expert's tensor parallelism
ETP_EP_AXIS = "etp_ep"  # both: the allgather and flex dispatchers' group


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class DomainForwarding:
    """A token exchange that crosses the NIC once per remote NVLink domain and fans out inside
    it (the flex dispatcher's DeepEP backend): each token's ``fanout`` (top-k)
    targets, each destination ``replicas`` (etp) ranks wide. Costed by
    :meth:`~blueprinting.hardware.system.SystemSpec.forwarded_all_to_all_time`."""

    fanout: int
    replicas: int


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FlexExchange:
    """A flex dispatcher's token exchange: its library (``--moe-flex-dispatcher-backend``) and
    which of the library's kernels moves the bytes, the dispatch (forward dispatch, backward of
    the combine) or the combine (forward combine, backward of the dispatch). Costed at the
    node's measured rate for the library where it has one
    (:mod:`blueprinting.hardware.ep_kernels`)."""

    backend: FlexBackend
    leg: EpLeg
    #: the SMs the library's kernels hold while it runs (:func:`flex_sms`; None: not set by
    #: Megatron, NCCL-EP's)
    sms: int | None = None


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ContextExchange:
    """One exchange of the attention core between cp ranks, in one direction.

    ``bytes`` is one ring step's message for a P2P (sent ``steps`` times, each step overlapped
    with the attention of the chunk already held when ``overlapped``), or the full tensor of a
    collective (NCCL-tests' size convention, as :class:`BoundaryCollective`; ``steps`` = 1).
    ``before``: it feeds the attention kernel (else it carries the kernel's output away).
    ``axis`` names the mesh axis (cp, or a level of the hierarchical exchange).
    """

    direction: Direction
    kind: CollectiveKind
    bytes: int
    steps: int
    axis: str
    overlapped: bool
    before: bool
    carries: str  # what it moves, for the printed IR and the report
    #: the op it sits next to, and why it exists (K/V exchange of the attention core, or a MoE
    #: layer's token dispatch / combine next to its expert GEMMs)
    op: SemanticOpName = SemanticOpName.CORE_ATTENTION
    purpose: CollectivePurpose = CollectivePurpose.KV_EXCHANGE
    #: a token dispatch forwarded per NVLink domain (None: a plain collective)
    forwarding: DomainForwarding | None = None
    #: a flex dispatcher's exchange, run by its library's kernels (None: an NCCL collective)
    flex: FlexExchange | None = None


def kv_chunk_bytes(model: TransformerModelSpec, dims: BlockDims) -> int:
    """``M_kv = b (s/cp) (n_kv/t) (d_k + d_v) bytes``: a cp rank's K and V (section 1.2)."""
    local_tokens = dims.micro_batch * dims.seq_length // dims.context
    width = dims.qk_width + dims.v_width  # MLA: full-head K (nope + rope) and V (section 1.2)
    return local_tokens * max(1, dims.groups) * width * model.datatype.bytes


def context_exchanges(
    model: TransformerModelSpec, dims: BlockDims, context: ContextParallel
) -> tuple[ContextExchange, ...]:
    """The K/V traffic of one block's attention core on one (tp, cp) rank for one micro-batch,
    per ``--cp-comm-type`` (TE ``context_parallel.py``; section 1.2 of the reference):

    - p2p: a ring of cp - 1 forward steps sending ``M_kv``; in backward cp - 1 steps carrying
      K/V and dK/dV, ``2 M_kv`` each (2 (cp-1) M_kv in all); every step overlapped;
    - all_gather: K, V all-gathered before the forward (exposed); in backward all-gathered
      again and dK, dV reduce-scattered after;
    - a2a: Q, K, V all-to-all before and O after the forward; dO before and dQ, dK, dV after
      the backward; all exposed;
    - a2a+p2p: the all-to-alls inside the a2a level, then a ring of p2p - 1 steps of ``M_kv``
      (``2 M_kv`` in backward) over the p2p level.
    """
    cp = context.degree
    if cp == 1:
        return ()
    e = model.datatype.bytes
    local_tokens = dims.micro_batch * dims.seq_length // cp
    q_bytes = local_tokens * dims.heads * dims.qk_width * e
    kv = kv_chunk_bytes(model, dims)
    fw, bw = Direction.FORWARD, Direction.BACKWARD
    p2p, a2a = CollectiveKind.P2P, CollectiveKind.ALL_TO_ALL

    def ring(axis: str, size: int) -> tuple[ContextExchange, ...]:
        if size == 1:
            return ()
        return (
            ContextExchange(
                direction=fw,
                kind=p2p,
                bytes=kv,
                steps=size - 1,
                axis=axis,
                overlapped=True,
                before=True,
                carries="kv",
            ),
            ContextExchange(
                direction=bw,
                kind=p2p,
                bytes=2 * kv,
                steps=size - 1,
                axis=axis,
                overlapped=True,
                before=True,
                carries="kv+dkv",
            ),
        )

    def all_to_all(axis: str, size: int) -> tuple[ContextExchange, ...]:
        if size == 1:
            return ()
        qkv, o = q_bytes + kv, local_tokens * dims.heads * dims.v_width * e

        def one(direction: Direction, n: int, before: bool, what: str) -> ContextExchange:
            return ContextExchange(
                direction=direction,
                kind=a2a,
                bytes=n,
                steps=1,
                axis=axis,
                overlapped=False,
                before=before,
                carries=what,
            )

        return (
            one(fw, qkv, True, "qkv"),
            one(fw, o, False, "o"),
            one(bw, o, True, "do"),
            one(bw, qkv, False, "dqkv"),
        )

    communication = context.communication
    match communication:
        case RingExchange():
            return ring(CP_AXIS, cp)
        case AllGatherKV():
            full = cp * kv

            def gathered(
                direction: Direction, kind: CollectiveKind, before: bool, what: str
            ) -> ContextExchange:
                return ContextExchange(
                    direction=direction,
                    kind=kind,
                    bytes=full,
                    steps=1,
                    axis=CP_AXIS,
                    overlapped=False,
                    before=before,
                    carries=what,
                )

            return (
                gathered(fw, CollectiveKind.ALL_GATHER, True, "kv"),
                gathered(bw, CollectiveKind.ALL_GATHER, True, "kv"),
                gathered(bw, CollectiveKind.REDUCE_SCATTER, False, "dkv"),
            )
        case HeadAllToAll():
            return all_to_all(CP_AXIS, cp)
        case HierarchicalAllToAllRing(a2a_size=a2a_size, p2p_size=ring_size):
            outer = all_to_all(CP_A2A_AXIS, a2a_size)
            inner = ring(CP_P2P_AXIS, ring_size)
            # forward: a2a(qkv), ring, a2a(o); backward: a2a(do), ring, a2a(dqkv)
            before = tuple(x for x in outer if x.before)
            after = tuple(x for x in outer if not x.before)
            return (*before, *inner, *after)
        case _ as unreachable:
            assert_never(unreachable)


#: Bytes of one per-expert token count the alltoall dispatcher exchanges (int64).
TOKEN_COUNT_BYTES = 8
#: Bytes of one routing probability sent with its routed copy (the router's fp32 probs).
ROUTING_PROB_BYTES = 4


def _flex_forwarding(backend: FlexBackend, *, top_k: int, etp: int) -> DomainForwarding | None:
    """DeepEP's internode normal kernels send a token once per remote NVLink domain and
    forward it there over NVLink (:class:`DomainForwarding`; DeepSeek-V3 report section
    3.2.2, DeepEP README). HybridEP and NCCL-EP are costed as plain hierarchical all-to-alls:
    their documentation describes RDMA plus NVLink levels but no source read here states the
    per-domain deduplication of their internode traffic."""
    match backend:
        case FlexBackend.DEEPEP:
            return DomainForwarding(fanout=top_k, replicas=etp)
        case FlexBackend.HYBRIDEP | FlexBackend.NCCLEP:
            return None
        case _ as unreachable:
            assert_never(unreachable)


def distinct_destinations(expert_degree: int, top_k: int) -> float:
    """Expected distinct EP ranks a token's top-k experts live on under uniform routing,
    ``e (1 - (1 - 1/e)^k)`` (shared reference section 2.3; DeepSeek-V3 k = 8: 7.6 at e = 64)."""
    e = expert_degree
    return e * (1.0 - (1.0 - 1.0 / e) ** top_k)


#: The ops a MoE layer's token exchanges sit at (:func:`expert_exchanges`): the dispatch's
#: (its forward, and the backward of the dispatch, ``ddispatch``) at the first routed op, the
#: combine's (and ``dcombine``) at the last.
DISPATCH_SIDE_OPS: frozenset[SemanticOpName] = frozenset(
    {SemanticOpName.MOE_SORT_CHUNKS, SemanticOpName.EXPERT_FC1}
)
COMBINE_SIDE_OPS: frozenset[SemanticOpName] = frozenset(
    {SemanticOpName.MOE_UNSORT_CHUNKS, SemanticOpName.EXPERT_FC2}
)


def expert_exchanges(
    model: TransformerModelSpec, ex: ExpertDims, dispatcher: TokenDispatcher
) -> tuple[ContextExchange, ...]:
    """The token traffic of one MoE layer on one rank for one micro-batch, per
    ``--moe-token-dispatcher-type`` (shared reference sections 2.3 and 7; Megatron-Core
    ``moe/token_dispatcher.py``), BF16 on the wire whatever the GEMM recipe (section 2.3: only
    ncclep with ``--moe-dispatch-fwd-dtype`` quantizes it, not modelled):

    - alltoall: the R = k*T permuted copies all-to-all over ep before the experts and back
      after (the hottest rank receives ``1 + gamma`` of its share), an all-gather over etp of
      the received rows before and a reduce-scatter after when etp > 1; backward the mirror;
    - allgather: all T tokens all-gathered over etp x ep (``T h (etp ep)`` gathered), each rank
      keeping its experts' rows, reduce-scattered back after; backward the mirror;
    - flex (DeepEP / HybridEP / NCCL-EP): one copy per (token, destination rank),
      ``T * etp * D * h`` with D = :func:`distinct_destinations`, over etp x ep; combine the same.

    The alltoall dispatcher's small exchanges beside them (Megatron-Core
    ``MoEAlltoAllTokenDispatcher``; shared reference section 2.3's alltoall row): the per-expert
    token counts all-gathered over etp x ep before the dispatch (``preprocess``:
    ``gather_from_sequence_parallel_region(num_local_tokens_per_expert, group=tp_ep_group)``,
    E int64 counts per rank), and the routing probabilities, one fp32 value per routed copy,
    sent with the tokens (``token_dispatch``: a second ``all_to_all`` of ``permuted_probs``
    over ep, all-gathered over etp beside the tokens), their gradients back in backward. They
    are latency-bound; the device-to-host sync of the counts before the all-to-all
    (``cuda_sync_point = "before_ep_alltoall"``, dropless) is a host stall with no measured
    figure and is not modelled, nor are the flex dispatchers' metadata exchanges.
    """
    moe = model.moe
    assert moe is not None
    e = model.datatype.bytes
    h = model.hidden_size
    u, ep = ex.expert_tensor_degree, ex.expert_degree
    fw, bw = Direction.FORWARD, Direction.BACKWARD
    # the alltoall dispatcher's exchanges sit outside its chunk sort (dispatch_postprocess
    # sorts what the all-to-all and the ETP all-gather delivered)
    first, last = (
        (SemanticOpName.MOE_SORT_CHUNKS, SemanticOpName.MOE_UNSORT_CHUNKS)
        if ex.sorts_chunks
        else (SemanticOpName.EXPERT_FC1, SemanticOpName.EXPERT_FC2)
    )
    assert first in DISPATCH_SIDE_OPS and last in COMBINE_SIDE_OPS
    dispatch = CollectivePurpose.TOKEN_DISPATCH
    gamma = ex.received / max(1, ex.routed * u)

    def x(
        direction: Direction,
        kind: CollectiveKind,
        size: int,
        where: tuple[str, SemanticOpName, bool, str],
        *,
        forwarding: DomainForwarding | None = None,
        flex: FlexExchange | None = None,
    ) -> ContextExchange:
        axis, op, before, what = where
        return ContextExchange(
            forwarding=forwarding,
            flex=flex,
            direction=direction,
            kind=kind,
            bytes=size,
            steps=1,
            axis=axis,
            overlapped=dispatcher_overlaps(dispatcher),
            before=before,
            carries=what,
            op=op,
            purpose=dispatch,
        )

    a2a, ag, rs = (
        CollectiveKind.ALL_TO_ALL,
        CollectiveKind.ALL_GATHER,
        CollectiveKind.REDUCE_SCATTER,
    )
    match dispatcher:
        case AllToAllDispatcher():
            received_copies = math.ceil(ex.routed * gamma)
            sent = received_copies * h * e
            gathered = ex.received * h * e
            out: list[ContextExchange] = []
            if u * ep > 1:
                counts = u * ep * ex.num_experts * TOKEN_COUNT_BYTES
                out.append(x(fw, ag, counts, (ETP_EP_AXIS, first, True, "token_counts")))
            if ep > 1:
                out.append(x(fw, a2a, sent, (EP_AXIS, first, True, "dispatch")))
                probs = received_copies * ROUTING_PROB_BYTES
                out.append(x(fw, a2a, probs, (EP_AXIS, first, True, "routing_probs")))
            if u > 1:
                out.append(x(fw, ag, gathered, (ETP_AXIS, first, True, "dispatch")))
                probs = ex.received * ROUTING_PROB_BYTES
                out.append(x(fw, ag, probs, (ETP_AXIS, first, True, "routing_probs")))
                out.append(x(fw, rs, gathered, (ETP_AXIS, last, False, "combine")))
            if ep > 1:
                out.append(x(fw, a2a, sent, (EP_AXIS, last, False, "combine")))
                out.append(x(bw, a2a, sent, (EP_AXIS, last, True, "dcombine")))
            if u > 1:
                out.append(x(bw, ag, gathered, (ETP_AXIS, last, True, "dcombine")))
                out.append(x(bw, rs, gathered, (ETP_AXIS, first, False, "ddispatch")))
                probs = ex.received * ROUTING_PROB_BYTES
                out.append(x(bw, rs, probs, (ETP_AXIS, first, False, "routing_probs_grad")))
            if ep > 1:
                out.append(x(bw, a2a, sent, (EP_AXIS, first, False, "ddispatch")))
                probs = received_copies * ROUTING_PROB_BYTES
                out.append(x(bw, a2a, probs, (EP_AXIS, first, False, "routing_probs_grad")))
            return tuple(out)
        case AllGatherDispatcher():
            if u * ep == 1:
                return ()
            gathered = ex.tokens * u * ep * h * e
            return (
                x(fw, ag, gathered, (ETP_EP_AXIS, first, True, "dispatch")),
                x(fw, rs, gathered, (ETP_EP_AXIS, last, False, "combine")),
                x(bw, ag, gathered, (ETP_EP_AXIS, last, True, "dcombine")),
                x(bw, rs, gathered, (ETP_EP_AXIS, first, False, "ddispatch")),
            )
        case FlexDispatcher():
            if u * ep == 1:
                return ()
            copies = ex.tokens * u * distinct_destinations(ep, moe.top_k) * gamma
            sent = math.ceil(copies) * h * e
            hops = _flex_forwarding(dispatcher.backend, top_k=moe.top_k, etp=u)
            held = flex_sms(dispatcher)
            to_experts = FlexExchange(backend=dispatcher.backend, leg=EpLeg.DISPATCH, sms=held)
            back = FlexExchange(backend=dispatcher.backend, leg=EpLeg.COMBINE, sms=held)
            return (
                x(
                    fw,
                    a2a,
                    sent,
                    (ETP_EP_AXIS, first, True, "dispatch"),
                    forwarding=hops,
                    flex=to_experts,
                ),
                x(fw, a2a, sent, (ETP_EP_AXIS, last, False, "combine"), forwarding=hops, flex=back),
                x(
                    bw,
                    a2a,
                    sent,
                    (ETP_EP_AXIS, last, True, "dcombine"),
                    forwarding=hops,
                    flex=to_experts,
                ),
                x(
                    bw,
                    a2a,
                    sent,
                    (ETP_EP_AXIS, first, False, "ddispatch"),
                    forwarding=hops,
                    flex=back,
                ),
            )
        case _ as unreachable:
            assert_never(unreachable)


def boundary_collectives(
    model: TransformerModelSpec,
    micro_batch: int,
    *,
    tp: int,
    sequence_parallel: bool,
    cp: int = 1,
) -> dict[SemanticOpName, tuple[BoundaryCollective, ...]]:
    """The block's TP collectives keyed by the GEMM they belong to (none when t = 1)."""
    if tp == 1:
        return {}
    size = activation_bytes(model, micro_batch, cp)
    sp = sequence_parallel
    attention_input: dict[SemanticOpName, tuple[BoundaryCollective, ...]]
    match model.self_attention:
        case StandardAttention():
            attention_input = {
                SemanticOpName.QKV_PROJECTION: _column_input_collectives(
                    Boundary.ATTENTION_INPUT,
                    SemanticOpName.QKV_PROJECTION,
                    size,
                    sequence_parallel=sp,
                )
            }
        case MultiLatentAttention():
            latent = size // model.hidden_size * mla_gathered_width(model)
            attention_input = {
                SemanticOpName.MLA_UP_PROJECTION: _column_input_collectives(
                    Boundary.ATTENTION_INPUT,
                    SemanticOpName.MLA_UP_PROJECTION,
                    latent,
                    sequence_parallel=sp,
                )
            }
        case _ as unreachable:
            assert_never(unreachable)
    return {
        **attention_input,
        SemanticOpName.SHARED_EXPERT_UP: _column_input_collectives(
            Boundary.MLP_INPUT, SemanticOpName.SHARED_EXPERT_UP, size, sequence_parallel=sp
        ),
        SemanticOpName.SHARED_EXPERT_DOWN: _row_output_collectives(
            Boundary.MLP_OUTPUT, SemanticOpName.SHARED_EXPERT_DOWN, size, sequence_parallel=sp
        ),
        SemanticOpName.OUTPUT_PROJECTION: _row_output_collectives(
            Boundary.ATTENTION_OUTPUT, SemanticOpName.OUTPUT_PROJECTION, size, sequence_parallel=sp
        ),
        SemanticOpName.MLP_UP: _column_input_collectives(
            Boundary.MLP_INPUT, SemanticOpName.MLP_UP, size, sequence_parallel=sp
        ),
        SemanticOpName.MLP_DOWN: _row_output_collectives(
            Boundary.MLP_OUTPUT, SemanticOpName.MLP_DOWN, size, sequence_parallel=sp
        ),
    }


def first_stage_collectives(
    model: TransformerModelSpec,
    micro_batch: int,
    *,
    tp: int,
    sequence_parallel: bool,
    cp: int = 1,
) -> dict[SemanticOpName, tuple[BoundaryCollective, ...]]:
    """The vocab-parallel lookup leaves partial rows: AR (or RS under SP) in forward; under SP
    the embedding gradient is all-gathered in backward (Megatron ``VocabParallelEmbedding`` with
    ``reduce_scatter_embeddings``)."""
    if tp == 1:
        return {}
    return {
        SemanticOpName.EMBEDDING: _row_output_collectives(
            Boundary.EMBEDDING_OUTPUT,
            SemanticOpName.EMBEDDING,
            activation_bytes(model, micro_batch, cp),
            sequence_parallel=sequence_parallel,
        )
    }


def last_stage_collectives(
    model: TransformerModelSpec,
    micro_batch: int,
    *,
    tp: int,
    sequence_parallel: bool,
    cp: int = 1,
) -> dict[SemanticOpName, tuple[BoundaryCollective, ...]]:
    """The LM head is column-parallel (same boundary as the MLP input); the cross-entropy
    all-reduces three fp32 statistics per token in forward."""
    if tp == 1:
        return {}
    tokens = micro_batch * model.seq_length // cp
    stats = tuple(
        BoundaryCollective(
            boundary=Boundary.LM_HEAD_INPUT,
            direction=Direction.FORWARD,
            purpose=CollectivePurpose.STATISTIC,
            kind=CollectiveKind.ALL_REDUCE,
            bytes=tokens * CROSS_ENTROPY_STATISTIC_BYTES,
            source=Partial(),
            target=Replicate(),
            after=SemanticOpName.CROSS_ENTROPY,
        )
        for _ in CROSS_ENTROPY_STATISTICS
    )
    return {
        SemanticOpName.LM_HEAD: _column_input_collectives(
            Boundary.LM_HEAD_INPUT,
            SemanticOpName.LM_HEAD,
            activation_bytes(model, micro_batch, cp),
            sequence_parallel=sequence_parallel,
        ),
        SemanticOpName.CROSS_ENTROPY: stats,
    }


# --------------------------------------------------------------------------------------------
# The local block plan (what the derivation decides, what the lowering consumes)
# --------------------------------------------------------------------------------------------
class RecomputeScope(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"  # the ops of the recompute modules (RECOMPUTE_MODULE_OPS)
    WHOLE_BLOCK = "whole_block"  # full: the whole forward incl. its TP collectives


#: The shared experts' ops (the ``shared_experts`` recompute module).
SHARED_EXPERT_OPS: frozenset[SemanticOpName] = frozenset(
    {
        SemanticOpName.SHARED_EXPERT_UP,
        SemanticOpName.SHARED_EXPERT_ACTIVATION,
        SemanticOpName.SHARED_EXPERT_DOWN,
    }
)

#: The block ops each of Megatron's ``--recompute-modules`` re-runs in backward, with the
#: collectives and token exchanges between them (Megatron-Core @d98e8a64):
#:
#: - ``core_attn`` the core attention, ``mlp`` the whole dense MLP with its TP collectives (a
#:   MoE layer's MLP is not a dense MLP: ``transformer_layer.py`` sets ``recompute_mlp`` only
#:   when the layer's MLP is not a ``MoELayer``), ``layernorm`` the two norms' outputs;
#: - ``moe_act`` the experts' activation function: ``moe/experts.py`` ``TEGroupedMLP.forward``
#:   runs ``bias_act_func(fc1_output, ...)`` under ``CheckpointWithoutOutput`` and discards its
#:   output once FC2 has consumed it; FC2's backward recomputes it from the kept FC1 output;
#: - ``mla_up_proj`` MLA's up projections (with the RoPE application):
#:   ``multi_latent_attention.py`` runs ``qkv_up_proj_and_rope_apply(q_compressed,
#:   kv_compressed, k_pos_emb, rotary_pos_emb)`` under ``CheckpointWithoutOutput``; its inputs
#:   are the latents already gathered over TP, so the gather is not re-run
#:   (:data:`RECOMPUTE_FROM_GATHERED_INPUT`);
#: - ``moe`` the whole MoE layer (``transformer_layer.py`` checkpoints ``self.mlp`` when it is
#:   a ``MoELayer``): router, dispatch, experts, combine and shared experts;
#: - ``shared_experts`` the shared experts (``moe/shared_experts.py`` checkpoints their
#:   forward), with their TP collectives.
#: A MoE layer's routed-expert ops: the dispatcher's postprocess (the chunk sort), the
#: experts and the combine's preprocess (the unsort), Megatron-Core's
#: ``routed_experts_compute`` (``moe_layer.py`` @d98e8a64). They read the expert grid (local
#: experts, received rows) and sit between the token dispatch and combine: the lowering's span
#: of the MoE block that changes with ep / etp, and combined 1F1B's ``mlp`` node.
ROUTED_EXPERT_OPS: frozenset[SemanticOpName] = frozenset(
    {
        SemanticOpName.MOE_SORT_CHUNKS,
        SemanticOpName.EXPERT_FC1,
        SemanticOpName.EXPERT_ACTIVATION_CLAMP,
        SemanticOpName.EXPERT_ACTIVATION,
        SemanticOpName.EXPERT_FC2,
        SemanticOpName.EXPERT_BIAS,
        SemanticOpName.MOE_UNSORT_CHUNKS,
    }
)

RECOMPUTE_MODULE_OPS: dict[RecomputeModule, frozenset[SemanticOpName]] = {
    RecomputeModule.CORE_ATTN: ATTENTION_CORE,
    RecomputeModule.MLP: frozenset(
        {SemanticOpName.MLP_UP, SemanticOpName.MLP_ACTIVATION, SemanticOpName.MLP_DOWN}
    ),
    RecomputeModule.LAYERNORM: frozenset(
        {SemanticOpName.INPUT_NORM, SemanticOpName.POST_ATTENTION_NORM}
    ),
    RecomputeModule.MOE_ACT: frozenset(
        {SemanticOpName.EXPERT_ACTIVATION_CLAMP, SemanticOpName.EXPERT_ACTIVATION}
    ),
    RecomputeModule.MLA_UP_PROJ: frozenset({SemanticOpName.MLA_UP_PROJECTION}),
    RecomputeModule.MOE: frozenset(
        {SemanticOpName.ROUTER, SemanticOpName.MOE_PERMUTE, SemanticOpName.MOE_UNPERMUTE}
    )
    | ROUTED_EXPERT_OPS
    | SHARED_EXPERT_OPS,
    RecomputeModule.SHARED_EXPERTS: SHARED_EXPERT_OPS,
}

#: Ops whose recompute starts from their input as gathered over TP (the checkpoint holds it),
#: so a recomputed segment does not re-run their forward input collective.
RECOMPUTE_FROM_GATHERED_INPUT: frozenset[SemanticOpName] = frozenset(
    {SemanticOpName.MLA_UP_PROJECTION}
)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LocalBlockPlan:
    """Everything the lowering needs about one local TP block, decided by the derivation."""

    model: TransformerModelSpec
    micro_batch: int
    tp: int
    sequence_parallel: bool
    recompute: RecomputeScope
    strategy: str  # one-line summary of the strategy it was derived from
    attention: AttentionKernel
    recompute_modules: frozenset[RecomputeModule] = DEFAULT_RECOMPUTE_MODULES
    context: ContextParallel = field(default_factory=ContextParallel)
    experts: ExpertParallel = field(default_factory=ExpertParallel)
    #: the eager chains the block runs (:func:`eager_passes` of the model and the fusions)
    eager: EagerPasses = _NO_EAGER_PASSES
    #: the loss's kernels (``KernelFusions.cross_entropy``; :func:`cross_entropy_work`)
    cross_entropy: CrossEntropyKernel = _UNFUSED_CROSS_ENTROPY
    #: the block is one of the model's sliding-window layers (its attention core over
    #: ``TransformerModelSpec.window_keys`` keys a query)
    windowed: bool = False

    @property
    def cp(self) -> int:
        return self.context.degree

    @property
    def local_experts(self) -> ExpertDims | None:
        """What one rank's MoE layer sees (None for a dense model)."""
        if self.model.moe is None:
            return None
        return expert_dims(self.model, self.local, self.experts, tp=self.tp)

    @property
    def local(self) -> BlockDims:
        dims = local_dims(
            self.model,
            self.micro_batch,
            tp=self.tp,
            sequence_parallel=self.sequence_parallel,
            context=self.context,
        )
        if self.windowed and self.model.window_keys is not None:
            return replace(dims, window_keys=self.model.window_keys)
        return dims

    @property
    def global_(self) -> BlockDims:
        return global_dims(self.model, self.micro_batch)

    def recomputes(self, op: SemanticOpName) -> bool:
        match self.recompute:
            case RecomputeScope.NONE:
                return False
            case RecomputeScope.SELECTIVE:
                return any(op in RECOMPUTE_MODULE_OPS[m] for m in self.recompute_modules)
            case RecomputeScope.WHOLE_BLOCK:
                return True
            case _ as unreachable:
                assert_never(unreachable)
