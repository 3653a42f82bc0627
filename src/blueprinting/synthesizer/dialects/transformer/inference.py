"""The inference block's work algebra: the training block's forward, with a KV cache as state.

A serving replica runs two kinds of forward step (Pope et al. 2022, "Efficiently Scaling
Transformer Inference", Section 2; Kwon et al. 2023, vLLM, Section 2.2):

* **prefill**: ``b`` sequences of ``prompt_length`` tokens each, causal self-attention over the
  prompt; it writes the prompt's keys and values into the KV cache and yields the first token;
* **decode**: one new token per sequence, attending to the ``c`` keys and values of its context
  (the cache plus itself); it appends one key and value per layer to the cache.

Both are :func:`~blueprinting.synthesizer.dialects.transformer.training.block_ops`' forward work
on ``InferenceStepDims``: every GEMM, norm and MLP activation is reused as is, with ``M = b * q``
rows (``q`` new tokens per sequence). Three things differ from a training forward:

* **attention**: computed by a fused kernel (FlashAttention, Dao et al. 2022, Section 3; Flash-
  Decoding and paged attention for decode): no ``s x s`` score tensor touches HBM. It reads Q and
  the K and V of the whole context from HBM once and writes the output once. Its FLOPs count the
  causal (query, key) pairs exactly: ``q * c0 + q (q + 1) / 2`` per head for ``q`` new tokens on
  ``c0`` cached ones (``q (q + 1) / 2`` for a prefill, ``c0 + 1`` for a decode step), each pair
  costing ``2 * kv_channels`` FLOPs in ``Q K^T`` and again in ``A V``; softmax ``5`` vector FLOPs
  per pair (Calculon's per-element convention, as in training).
* **sliding-window layers** (``SlidingWindow``: GPT-OSS's alternate layers, Mistral's): a query
  attends at most ``W = window + 1`` keys (itself and the ``window`` before it, Megatron / TE
  ``window_size = (window, 0)``), so a step counts the exact sum of ``min(position, W)`` keys
  over its queries (:func:`attended_pairs`), reads the keys some query of the step still sees
  (``min(c, q + W - 1)``: a decode step's last ``W``, a prefill's whole prompt), and the cache
  keeps the last ``W`` tokens of such a layer (``inference/memory.py``), as FlashAttention's
  ``window_size`` kernels and vLLM's sliding-window KV cache do.
* **KV cache (GQA-aware)**: keys and values are stored per query group, not per head (Ainslie et
  al. 2023). A TP rank holds ``groups_per_rank = max(1, groups / t)`` groups: Megatron-LM
  replicates a KV head over the ranks that share it when ``t > groups``. The K and V reads of a
  step are ``b * groups_per_rank * kv_channels * c * kv_bytes`` each per layer; the cache's
  element type may differ from the model's (an fp8 cache). The keys and values of the new tokens
  are the K and V columns of the QKV GEMM's output, written once there (not counted twice).
* **no dropout, no loss**: residual adds carry no dropout mask; the last stage runs the final norm,
  and the LM head only on the last position of each sequence (what serving engines do: vLLM's
  ``LogitsProcessor`` selects the last hidden state), then all-gathers the vocab-parallel logits
  for sampling (Megatron's ``gather_from_tensor_model_parallel_region``).

Tensor parallelism is the training block's (Shoeybi et al. 2019, Section 3): forward only, so one
all-reduce of the ``b * q * h`` activation after each row-parallel GEMM (two per block), or with
sequence parallelism a reduce-scatter there and an all-gather before each column-parallel GEMM
(Korthikanti et al. 2022, Section 4.2.2); the vocab-parallel embedding all-reduces (or reduce-
scatters) its output.

Every op also reports which of its HBM bytes are weights (and of those, routed experts') and
which are KV cache, so that an analysis can set a step against its compute and HBM-bandwidth
bounds term by term.

**Mixture of experts** (the serving layout of :class:`~blueprinting.mapping.transformer.
ServingExpertParallel`: EP over the TP group, expert TP ``t / ep``): a MoE layer's MLP is the
replicated router, the routed experts on the rows routed to the rank's ``E / ep`` experts (per
token ``k`` of them; section 2.5 of ``shared/reference/modern_parallelism.md``) and the shared
experts (TP-sharded). A step reads the weights of the experts its tokens touch, once each:
:func:`experts_touched` ``E (1 - (1 - k / E) ** (b q))`` expected under uniform routing (``k`` at
one token, nearly ``E`` at many), ``1 / ep`` of them per rank. No token is dispatched: every
rank holds every token after the attention all-reduce, and the block's closing all-reduce
combines the experts' partial outputs (the collectives are the dense block's). Load imbalance
gamma inflates the hottest rank's rows.

**Multi-head latent attention** (DeepSeek-V2, arXiv:2405.04434, Section 2.1): down projections
replicated per TP rank, up projections split by heads; the cache stores the latent
(``kv_lora_rank + qk_pos_emb_head_dim`` per token and layer); a prefill expands it to per-head K
and V (head dims ``qk_head_dim + qk_pos_emb_head_dim`` and ``v_head_dim``), a decode step absorbs
``W_UK`` / ``W_UV`` and attends over the latents (:func:`_mla_attention`). Multi-token-prediction
layers are not served (engines use them only as speculative-decoding drafts; not modelled).

Public API (used by inference_derivation.py and blueprinting.inference):

- :class:`InferencePhase`, :class:`InferenceStepDims`, :class:`ServingOpName`
- :class:`InferenceOp`, :class:`InferenceCollective`, :class:`InferenceStepWork`
- :func:`kv_groups_per_rank`, :func:`kv_cache_bytes_per_token`, :func:`experts_touched`,
  :func:`expert_weight_bytes`
- :func:`inference_step_work(model, dims, *, tp, sequence_parallel, kv_datatype, ep=1)`
- :func:`attention_ops(model, dims, *, tp, sequence_parallel, kv_datatype)`: the only block ops
  whose work depends on the context (an analysis re-costs just these from one decode step to the
  next); :data:`CONTEXT_DEPENDENT` names them
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Generic, TypeAlias, assert_never, final

from blueprinting.errors import ConfigError, positive_int_problems
from blueprinting.hardware.polymorphic import EXACT_INT_LIMIT, Count, IntColumn, maximum, minimum
from blueprinting.mapping.model import (
    Datatype,
    DenseFeedForward,
    MixtureOfExperts,
    MlpActivation,
    MultiLatentAttention,
    StandardAttention,
    TransformerModelSpec,
)
from blueprinting.mapping.transformer import UnfusedAttention
from blueprinting.synthesizer.dialects.transformer.training import (
    ATTENTION_CORE,
    BlockDims,
    CollectiveKind,
    GemmShape,
    OpKind,
    SemanticOp,
    SemanticOpName,
    Work,
    block_ops,
    first_stage_ops,
    last_stage_ops,
)

#: Softmax FLOPs per (query, key) pair in forward (Calculon ``calculon/llm/layers.py`` SoftMax).
SOFTMAX_FLOPS_PER_PAIR = 5


class ServingOpName(StrEnum):
    """The serving ops the training block has no name for: MLA's projections (and decode's
    weight absorption), the MoE layer's router, routed and shared experts."""

    Q_DOWN = "q_down_projection"
    Q_NORM = "q_norm"
    Q_UP = "q_up_projection"
    Q_PROJECTION = "q_projection"
    KV_DOWN = "kv_down_projection"
    KV_NORM = "kv_norm"
    KV_UP = "kv_up_projection"
    Q_ABSORB = "q_absorb"
    V_ABSORB = "v_absorb"
    ROUTER = "router"
    EXPERT_UP = "expert_up"
    EXPERT_ACTIVATION = "expert_activation"
    EXPERT_DOWN = "expert_down"
    EXPERT_COMBINE = "expert_combine"
    SHARED_EXPERT_UP = "shared_expert_up"
    SHARED_EXPERT_ACTIVATION = "shared_expert_activation"
    SHARED_EXPERT_DOWN = "shared_expert_down"


OpName: TypeAlias = SemanticOpName | ServingOpName

#: Router score and top-k selection FLOPs per (token, expert) logit (the softmax convention).
ROUTER_VECTOR_FLOPS_PER_LOGIT = 5


class InferencePhase(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class InferenceStepDims:
    """One forward step of a replica: ``batch`` sequences, ``new_tokens`` tokens each processed
    now, on top of ``cached_tokens`` already in the KV cache."""

    batch: int
    new_tokens: int
    cached_tokens: int

    def __post_init__(self) -> None:
        problems = positive_int_problems(
            "InferenceStepDims", batch=self.batch, new_tokens=self.new_tokens
        )
        if type(self.cached_tokens) is not int or self.cached_tokens < 0:
            problems.append(
                f"InferenceStepDims.cached_tokens must be >= 0, got {self.cached_tokens!r}"
            )
        if problems:
            raise ConfigError(problems)

    @property
    def phase(self) -> InferencePhase:
        return InferencePhase.PREFILL if self.cached_tokens == 0 else InferencePhase.DECODE

    @property
    def context(self) -> int:
        """Keys each sequence's last new token attends to: cache plus the new tokens."""
        return step_context(self.new_tokens, self.cached_tokens)

    @property
    def tokens(self) -> int:
        return self.batch * self.new_tokens

    @property
    def attended_pairs(self) -> int:
        """Causal (query, key) pairs of one sequence and one head (:func:`attended_pairs`)."""
        return attended_pairs(self.new_tokens, self.cached_tokens)


def step_context(new_tokens: int, cached: Count) -> Count:
    """Keys a sequence's last new token attends to after ``cached`` cached tokens (one step's
    int, or an int64 column of decode steps)."""
    return cached + new_tokens


def attended_pairs(new_tokens: int, cached: Count, keys: int | None = None) -> Count:
    """Causal (query, key) pairs of one sequence and one head when ``q = new_tokens`` queries
    follow ``c0 = cached`` keys: ``q c0 + q (q + 1) / 2`` (one step's int, or a column). With
    a sliding window of ``keys`` (W) keys, query ``i`` sees ``min(c0 + i + 1, W)``: the sum is
    ``(m (m + 1) - c0 (c0 + 1)) / 2 + W (c0 + q - m)`` with ``m = max(c0, min(c0 + q, W))``
    (the queries below the window's reach, then those at its full width)."""
    q = new_tokens
    if keys is None:
        return q * cached + q * (q + 1) // 2
    reach: Count = maximum(cached, minimum(cached + q, keys))
    # m (m + 1) - c0 (c0 + 1) is even, so the halving is exact (a column's int64 floor too)
    pairs: Count = (reach * (reach + 1) - cached * (cached + 1)) // 2 + keys * (cached + q - reach)
    return pairs


def keys_read(new_tokens: int, cached: Count, keys: int | None = None) -> Count:
    """Cached and new keys some query of the step attends, each read from HBM once: the whole
    context, or under a window of ``keys`` keys the last ``q + W - 1`` of it (a decode step's
    last W keys, a prefill's whole prompt)."""
    context = step_context(new_tokens, cached)
    return context if keys is None else minimum(context, new_tokens + keys - 1)


def keys_per_query(new_tokens: int, cached: Count, keys: int | None = None) -> Count:
    """The most keys one query of the step attends (the attention GEMM's inner extent): the
    context, or at most the window's ``keys``."""
    context = step_context(new_tokens, cached)
    return context if keys is None else minimum(context, keys)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class InferenceOp:
    """One op of a forward step on one TP rank: its work and which HBM bytes are weights and
    which KV cache (the rest are activations)."""

    name: OpName
    kind: OpKind
    work: Work
    gemm: GemmShape | None = None
    weight_bytes: int = 0
    #: the part of ``weight_bytes`` that is routed experts' weights
    expert_weight_bytes: int = 0
    kv_cache_bytes: int = 0

    @property
    def activation_bytes(self) -> int:
        return activation_bytes(
            self.work.bytes_read, self.work.bytes_written, self.weight_bytes, self.kv_cache_bytes
        )


def activation_bytes(bytes_read: int, bytes_written: int, weights: int, kv_cache: int) -> int:
    """An op's HBM bytes that are neither weights nor KV cache."""
    return bytes_read + bytes_written - weights - kv_cache


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class InferenceCollective:
    """A forward TP collective; ``bytes`` is the full tensor it reconstructs (NCCL-tests'
    "size", as in training)."""

    after: SemanticOpName
    kind: CollectiveKind
    bytes: int


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class InferenceStepWork:
    """The local (one TP rank) work of one forward step: per block, and the first / last
    pipeline stage's extras."""

    dims: InferenceStepDims
    tp: int
    block: tuple[InferenceOp, ...]
    block_collectives: tuple[InferenceCollective, ...]
    first_stage: tuple[InferenceOp, ...]
    first_stage_collectives: tuple[InferenceCollective, ...]
    last_stage: tuple[InferenceOp, ...]
    last_stage_collectives: tuple[InferenceCollective, ...]
    #: one MoE layer's ops (empty for a dense model); its collectives are ``block_collectives``
    moe_block: tuple[InferenceOp, ...] = ()
    #: expected distinct routed experts the step's tokens touch in one MoE layer, over the
    #: whole replica (:func:`experts_touched`; 0 for a dense model)
    experts_touched: float = 0.0
    #: a sliding-window layer's attention core (its :data:`CONTEXT_DEPENDENT` ops), which
    #: replaces ``block``'s / ``moe_block``'s full one there (empty: no layer is windowed)
    windowed_attention: tuple[InferenceOp, ...] = ()

    @property
    def phase(self) -> InferencePhase:
        return self.dims.phase


def kv_groups_per_rank(model: TransformerModelSpec, tp: int) -> int:
    """Query groups (KV heads) one TP rank stores: ``max(1, groups / t)`` (Megatron-LM
    replicates KV heads when t > groups)."""
    return max(1, model.num_query_groups // tp)


def kv_cache_bytes_per_token(model: TransformerModelSpec, tp: int, kv_datatype: Datatype) -> int:
    """KV-cache bytes one token adds on one TP rank in one layer. GQA: ``2 * groups_per_rank *
    kv_channels * kv_bytes`` (K and V). MLA: the compressed latent and the one shared rope key,
    ``(kv_lora_rank + qk_pos_emb_head_dim) * kv_bytes``, not per head (DeepSeek-V2,
    arXiv:2405.04434, Section 2.1.2 and Table 1: ``(d_c + d_h^R) l`` elements per token); every
    TP rank keeps the whole latent, since all its heads read it (vLLM's MLA backends)."""
    match model.self_attention:
        case StandardAttention():
            return 2 * kv_groups_per_rank(model, tp) * model.kv_channels * kv_datatype.bytes
        case MultiLatentAttention() as mla:
            return (mla.kv_lora_rank + mla.qk_pos_emb_head_dim) * kv_datatype.bytes
        case _ as unreachable:
            assert_never(unreachable)


def experts_touched(num_experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct experts that ``tokens`` tokens route to in one MoE layer, under uniform
    independent routing: each token picks ``k`` distinct experts of ``E`` uniformly, so a given
    expert is missed by one token with probability ``1 - k / E`` and by all of them with
    ``(1 - k / E) ** tokens``; by linearity of expectation ``E (1 - (1 - k / E) ** tokens)``.
    One token touches exactly ``k``; the count grows with the tokens and tends to ``E``. An EP
    rank holding ``E / ep`` experts expects ``1 / ep`` of it."""
    if tokens == 1 or top_k == num_experts:
        return float(top_k if tokens == 1 else num_experts)
    return num_experts * -math.expm1(tokens * math.log1p(-top_k / num_experts))


def _dense_view(model: TransformerModelSpec) -> TransformerModelSpec:
    """The model with plain GQA attention and dense MLPs: the training block whose norms,
    residuals and MLP the serving block reuses (MLA and MoE ops are built here)."""
    if isinstance(model.self_attention, StandardAttention) and isinstance(
        model.feed_forward, DenseFeedForward
    ):
        return model
    return replace(model, self_attention=StandardAttention(), feed_forward=DenseFeedForward())


def _local_dims(
    model: TransformerModelSpec, dims: InferenceStepDims, *, tp: int, sequence_parallel: bool
) -> BlockDims:
    """The training block's local dimensions with ``seq_length = q`` new tokens per sequence.
    Under sequence parallelism token-wise ops run on ``ceil(b q / t)`` rows (a decode step's
    ``b`` tokens need not divide by t; the laws check the prompt)."""
    tokens = dims.tokens
    return BlockDims(
        micro_batch=dims.batch,
        seq_length=dims.new_tokens,
        gemm_tokens=tokens,
        token_rows=-(-tokens // tp) if sequence_parallel else tokens,
        hidden=model.hidden_size,
        heads=model.num_attention_heads // tp,
        groups=kv_groups_per_rank(model, tp),
        kv_channels=model.kv_channels,
        ffn=model.ffn_hidden_size // tp,
        vocab=model.padded_vocab_size // tp,
    )


def _weight_bytes(
    op: SemanticOp, model: TransformerModelSpec, local: BlockDims, tokens: int
) -> int:
    """Bytes of parameters an op reads (block ops sum to ``block_parameters_per_rank`` bytes)."""
    e, h = model.datatype.bytes, local.hidden
    bias = model.add_bias_linear
    qkv = (local.heads + 2 * local.groups) * local.kv_channels
    up = 2 * local.ffn if model.activation is MlpActivation.SWIGLU else local.ffn
    match op.name:
        case (
            SemanticOpName.INPUT_NORM
            | SemanticOpName.POST_ATTENTION_NORM
            | SemanticOpName.FINAL_NORM
        ):
            return model.norm_parameters * e
        case SemanticOpName.QKV_PROJECTION:
            return (h * qkv + (qkv if bias else 0)) * e
        case SemanticOpName.OUTPUT_PROJECTION:
            return local.heads * local.kv_channels * h * e
        case SemanticOpName.MLP_UP:
            return (h * up + (up if bias else 0)) * e
        case SemanticOpName.MLP_DOWN:
            return local.ffn * h * e
        case SemanticOpName.LM_HEAD:
            return h * local.vocab * e
        case SemanticOpName.EMBEDDING | SemanticOpName.POSITION_EMBEDDING:
            return tokens * h * e  # the rows gathered from the table
        case _:
            return 0


def _adopt(
    op: SemanticOp, model: TransformerModelSpec, local: BlockDims, tokens: int
) -> InferenceOp:
    """A training op's forward work, as an inference op."""
    return InferenceOp(
        name=op.name,
        kind=op.kind,
        work=op.forward,
        gemm=op.gemm,
        weight_bytes=_weight_bytes(op, model, local, tokens),
    )


def _residual(
    name: SemanticOpName, model: TransformerModelSpec, rows: int, *, bias_added: bool = True
) -> InferenceOp:
    """Bias + residual add without dropout (inference): ``elems`` adds, plus the row-parallel
    GEMM's bias (added after the reduction, as Megatron's ``bias_dropout_add``). A MoE layer's
    routed experts add their own down biases before the combine (``bias_added`` False unless
    shared experts bring a row-parallel one)."""
    e, h = model.datatype.bytes, model.hidden_size
    elems = rows * h
    bias = h if model.add_bias_linear and bias_added else 0
    return InferenceOp(
        name=name,
        kind=OpKind.ELEMENTWISE,
        work=Work(
            vector_flops=elems + (elems if bias else 0),
            bytes_read=(2 * elems + bias) * e,
            bytes_written=elems * e,
        ),
        weight_bytes=bias * e,
    )


def _attention(
    model: TransformerModelSpec,
    dims: InferenceStepDims,
    local: BlockDims,
    kv_datatype: Datatype,
    keys: int | None = None,
) -> tuple[InferenceOp, ...]:
    """The attention core of one layer; ``keys``: a sliding-window layer's window
    (:attr:`TransformerModelSpec.window_keys`), None for full attention."""
    match model.self_attention:
        case StandardAttention():
            return _gqa_attention(model, dims, local, kv_datatype, keys)
        case MultiLatentAttention() as mla:
            return _mla_attention(model, mla, dims, local, kv_datatype, keys=keys)
        case _ as unreachable:
            assert_never(unreachable)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionOpFigures(Generic[Count]):
    """The figures of one fused-attention op of an :class:`InferenceOp` (its work, GEMM shape
    ``(m, n, k, batch)``, one call over the batch, and KV cache bytes; no weights) on one step
    (ints) or on a column of steps (int64 columns): :func:`_gqa_attention_figures`, the one
    algebra of both."""

    name: OpName
    kind: OpKind
    matrix_flops: Count | int = 0
    vector_flops: Count | int = 0
    bytes_read: Count | int = 0
    bytes_written: Count | int = 0
    gemm: tuple[Count | int, Count | int, Count | int, Count | int] | None = None
    kv_cache_bytes: Count | int = 0


def _gqa_attention_figures(
    model: TransformerModelSpec,
    *,
    batch: int,
    new_tokens: int,
    cached: Count,
    local: BlockDims,
    kv_datatype: Datatype,
    keys: int | None = None,
) -> tuple[AttentionOpFigures[Count], ...]:
    """Fused attention on heads/t heads (module docstring) after ``cached`` cached tokens (one
    step, or a column of decode steps: the same integer algebra), over a sliding window of
    ``keys`` keys where given. The efficiency shape stacks the ``heads / groups`` query heads
    that share a KV head as rows, as GQA decode kernels do."""
    e, kv_e = model.datatype.bytes, kv_datatype.bytes
    b, q = batch, new_tokens
    c = keys_per_query(q, cached, keys)
    heads, groups, d = local.heads, local.groups, local.kv_channels
    per_group = max(1, heads // groups)
    pairs = b * heads * attended_pairs(q, cached, keys)
    q_bytes = b * q * heads * d * e
    # V is the same size
    k_bytes = b * groups * d * keys_read(q, cached, keys) * kv_e
    rows = q * per_group
    return (
        AttentionOpFigures(
            name=SemanticOpName.ATTENTION_SCORES,
            kind=OpKind.BATCHED_MATMUL,
            matrix_flops=2 * d * pairs,
            bytes_read=q_bytes + k_bytes,
            gemm=(rows, d, c, b * groups),
            kv_cache_bytes=k_bytes,
        ),
        AttentionOpFigures(
            name=SemanticOpName.SOFTMAX,
            kind=OpKind.SOFTMAX,
            vector_flops=SOFTMAX_FLOPS_PER_PAIR * pairs,
        ),
        AttentionOpFigures(
            name=SemanticOpName.ATTENTION_OVER_VALUES,
            kind=OpKind.BATCHED_MATMUL,
            matrix_flops=2 * d * pairs,
            bytes_read=k_bytes,
            bytes_written=q_bytes,
            gemm=(rows, c, d, b * groups),
            kv_cache_bytes=k_bytes,
        ),
    )


def _gqa_attention(
    model: TransformerModelSpec,
    dims: InferenceStepDims,
    local: BlockDims,
    kv_datatype: Datatype,
    keys: int | None,
) -> tuple[InferenceOp, ...]:
    """:func:`_gqa_attention_figures` of one step as ops."""
    figures = _gqa_attention_figures(
        model,
        batch=dims.batch,
        new_tokens=dims.new_tokens,
        cached=dims.cached_tokens,
        local=local,
        kv_datatype=kv_datatype,
        keys=keys,
    )
    return tuple(_op_of(f) for f in figures)


def _op_of(f: AttentionOpFigures[int]) -> InferenceOp:
    gemm = None
    if f.gemm is not None:
        m, n, k, batch = f.gemm
        gemm = GemmShape(m=m, n=n, k=k, batch=batch)
    return InferenceOp(
        name=f.name,
        kind=f.kind,
        work=Work(
            matrix_flops=f.matrix_flops,
            vector_flops=f.vector_flops,
            bytes_read=f.bytes_read,
            bytes_written=f.bytes_written,
        ),
        gemm=gemm,
        kv_cache_bytes=f.kv_cache_bytes,
    )


#: The block ops whose work depends on the context length (the rest depend on b * q only).
CONTEXT_DEPENDENT: frozenset[SemanticOpName] = frozenset(
    {
        SemanticOpName.ATTENTION_SCORES,
        SemanticOpName.SOFTMAX,
        SemanticOpName.ATTENTION_OVER_VALUES,
    }
)


def attention_ops(
    model: TransformerModelSpec,
    dims: InferenceStepDims,
    *,
    tp: int,
    sequence_parallel: bool,
    kv_datatype: Datatype,
    keys: int | None = None,
) -> tuple[InferenceOp, ...]:
    """The fused attention ops of one block (the :data:`CONTEXT_DEPENDENT` ones), as
    :func:`inference_step_work` builds them; over a window of ``keys`` keys where given."""
    local = _local_dims(model, dims, tp=tp, sequence_parallel=sequence_parallel)
    return _attention(model, dims, local, kv_datatype, keys)


def decode_attention_ops(
    model: TransformerModelSpec,
    *,
    batch: int,
    contexts: Sequence[int],
    tp: int,
    sequence_parallel: bool,
    kv_datatype: Datatype,
    keys: int | None = None,
) -> list[tuple[InferenceOp, ...]]:
    """:func:`attention_ops` of the decode steps (one new token per sequence) on each cache
    length in ``contexts`` (over a window of ``keys`` keys where given); the block's local
    dimensions do not depend on the cache length and are derived once."""
    steps = [InferenceStepDims(batch=batch, new_tokens=1, cached_tokens=c) for c in contexts]
    if not steps:
        return []
    local = _local_dims(model, steps[0], tp=tp, sequence_parallel=sequence_parallel)
    return [_attention(model, dims, local, kv_datatype, keys) for dims in steps]


def decode_attention_columns(
    model: TransformerModelSpec,
    *,
    batch: int,
    contexts: Sequence[int],
    tp: int,
    sequence_parallel: bool,
    kv_datatype: Datatype,
    keys: int | None = None,
) -> tuple[AttentionOpFigures[IntColumn], ...] | None:
    """:func:`decode_attention_ops` as columns (op j's figures on every cache length in
    ``contexts``, element i equal to op j of step i), by the same algebra on an int64 column
    (issue 18: a long generation's thousands of contexts without an op object each). None
    where a column cannot hold them exactly: multi-latent attention (its ops stay per step), or
    a figure of the longest context above 2**53 (every figure grows with the context, so none
    overflows int64 or rounds in float64 below it). The shortest and longest contexts' ops are
    built (and so validated) as :func:`decode_attention_ops` builds them."""
    if not contexts or not isinstance(model.self_attention, StandardAttention):
        return None
    import numpy as np

    ends = decode_attention_ops(
        model,
        batch=batch,
        contexts=[min(contexts), max(contexts)],
        tp=tp,
        sequence_parallel=sequence_parallel,
        kv_datatype=kv_datatype,
        keys=keys,
    )
    largest = [
        value
        for op in ends[-1]
        for value in (
            op.work.matrix_flops,
            op.work.vector_flops,
            op.work.bytes_read,
            op.work.bytes_written,
            op.kv_cache_bytes,
            *((op.gemm.flops, op.gemm.m, op.gemm.n, op.gemm.k) if op.gemm else ()),
        )
    ]
    if max(largest) > EXACT_INT_LIMIT:
        return None
    first = InferenceStepDims(batch=batch, new_tokens=1, cached_tokens=contexts[0])
    return _gqa_attention_figures(
        model,
        batch=batch,
        new_tokens=1,
        cached=np.array(contexts, dtype=np.int64),
        local=_local_dims(model, first, tp=tp, sequence_parallel=sequence_parallel),
        kv_datatype=kv_datatype,
        keys=keys,
    )


def _linear(name: OpName, model: TransformerModelSpec, m: int, n: int, k: int) -> InferenceOp:
    """A bias-free ``[m, n] x [n, k]`` projection's forward: training's GEMM work (read input
    and weight, write output), its weight the ``n x k`` matrix."""
    e = model.datatype.bytes
    weight = n * k * e
    return InferenceOp(
        name=name,
        kind=OpKind.GEMM,
        work=Work(
            matrix_flops=2 * m * n * k, bytes_read=m * n * e + weight, bytes_written=m * k * e
        ),
        gemm=GemmShape(m=m, n=n, k=k),
        weight_bytes=weight,
    )


def _per_head(
    name: OpName, model: TransformerModelSpec, *, m: int, heads: int, n: int, k: int
) -> InferenceOp:
    """``heads`` independent ``[m, n] x [n, k]`` products with one weight matrix per head (MLA's
    absorbed ``W_UK`` / ``W_UV``)."""
    e = model.datatype.bytes
    weight = heads * n * k * e
    return InferenceOp(
        name=name,
        kind=OpKind.BATCHED_MATMUL,
        work=Work(
            matrix_flops=2 * heads * m * n * k,
            bytes_read=heads * m * n * e + weight,
            bytes_written=heads * m * k * e,
        ),
        gemm=GemmShape(m=m, n=n, k=k, batch=heads),
        weight_bytes=weight,
    )


def _norm_of(
    name: OpName, model: TransformerModelSpec, local: BlockDims, rows: int, width: int
) -> InferenceOp:
    """The model's norm over ``rows`` vectors of ``width`` (MLA's latent norms): the training
    block's input norm evaluated at that width."""
    narrow = replace(_dense_view(model), hidden_size=width)
    norm = block_ops(
        narrow, replace(local, token_rows=rows, hidden=width), attention=UnfusedAttention()
    )[0]
    return InferenceOp(
        name=name,
        kind=norm.kind,
        work=norm.forward,
        weight_bytes=narrow.norm_parameters * model.datatype.bytes,
    )


def _mla_projections(
    model: TransformerModelSpec, mla: MultiLatentAttention, dims: InferenceStepDims, heads: int
) -> tuple[InferenceOp, ...]:
    """MLA's Q and KV projections on one TP rank (DeepSeek-V2, arXiv:2405.04434, Section
    2.1.2-2.1.3): the down projections (to ``q_lora_rank``, and to ``kv_lora_rank`` plus the
    shared rope key, which is what the cache stores) and their norms are replicated on every TP
    rank (vLLM ``ReplicatedLinear``), the up projections split by heads. A prefill expands the
    latent to per-head K (no-rope part) and V; a decode step instead absorbs ``W_UK`` into the
    query (``q_nope W_UK``, per head ``qk_head_dim -> kv_lora_rank``) and attends in the latent
    space (Section 2.1.2's absorption, the FlashMLA / vLLM MLA decode path)."""
    m = dims.tokens
    h = model.hidden_size
    local = _local_dims(model, dims, tp=1, sequence_parallel=False)
    out: list[InferenceOp] = []
    if mla.q_lora_rank is None:
        out.append(_linear(ServingOpName.Q_PROJECTION, model, m, h, heads * mla.qk_dim))
    else:
        out.append(_linear(ServingOpName.Q_DOWN, model, m, h, mla.q_lora_rank))
        out.append(_norm_of(ServingOpName.Q_NORM, model, local, m, mla.q_lora_rank))
        out.append(_linear(ServingOpName.Q_UP, model, m, mla.q_lora_rank, heads * mla.qk_dim))
    latent = mla.kv_lora_rank + mla.qk_pos_emb_head_dim
    out.append(_linear(ServingOpName.KV_DOWN, model, m, h, latent))
    out.append(_norm_of(ServingOpName.KV_NORM, model, local, m, mla.kv_lora_rank))
    match dims.phase:
        case InferencePhase.PREFILL:
            width = heads * (mla.qk_head_dim + mla.v_head_dim)
            out.append(_linear(ServingOpName.KV_UP, model, m, mla.kv_lora_rank, width))
        case InferencePhase.DECODE:
            out.append(
                _per_head(
                    ServingOpName.Q_ABSORB,
                    model,
                    m=m,
                    heads=heads,
                    n=mla.qk_head_dim,
                    k=mla.kv_lora_rank,
                )
            )
        case _ as unreachable:
            assert_never(unreachable)
    return tuple(out)


def _mla_output(
    model: TransformerModelSpec, mla: MultiLatentAttention, dims: InferenceStepDims, heads: int
) -> tuple[InferenceOp, ...]:
    """The output projection (row-parallel, ``heads * v_head_dim -> h``); a decode step first
    maps each head's latent output through its ``W_UV`` (``kv_lora_rank -> v_head_dim``)."""
    m = dims.tokens
    out = _linear(
        SemanticOpName.OUTPUT_PROJECTION, model, m, heads * mla.v_head_dim, model.hidden_size
    )
    match dims.phase:
        case InferencePhase.PREFILL:
            return (out,)
        case InferencePhase.DECODE:
            absorb = _per_head(
                ServingOpName.V_ABSORB,
                model,
                m=m,
                heads=heads,
                n=mla.kv_lora_rank,
                k=mla.v_head_dim,
            )
            return (absorb, out)
        case _ as unreachable:
            assert_never(unreachable)


def _mla_attention(
    model: TransformerModelSpec,
    mla: MultiLatentAttention,
    dims: InferenceStepDims,
    local: BlockDims,
    kv_datatype: Datatype,
    *,
    keys: int | None,
) -> tuple[InferenceOp, ...]:
    """MLA's attention core on heads/t heads (a sliding window of ``keys`` keys bounds the
    pairs and the keys read as in GQA's). Prefill: multi-head attention on the expanded
    per-head keys of ``qk_head_dim + qk_pos_emb_head_dim`` and values of ``v_head_dim`` (the
    keys and values are this step's activations; the cache holds the latent). Decode: the
    absorbed query (``kv_lora_rank + qk_pos_emb_head_dim`` wide) attends to the cached latents
    like multi-query attention, every head reading the same latent, which is read from HBM once
    per step (FlashMLA); the values are the latents' ``kv_lora_rank`` part."""
    e, kv_e = model.datatype.bytes, kv_datatype.bytes
    b, q = dims.batch, dims.new_tokens
    c = keys_read(q, dims.cached_tokens, keys)
    span = keys_per_query(q, dims.cached_tokens, keys)
    heads = local.heads
    pairs = b * heads * attended_pairs(q, dims.cached_tokens, keys)
    softmax = InferenceOp(
        name=SemanticOpName.SOFTMAX,
        kind=OpKind.SOFTMAX,
        work=Work(vector_flops=SOFTMAX_FLOPS_PER_PAIR * pairs),
    )
    match dims.phase:
        case InferencePhase.PREFILL:
            qk, v = mla.qk_dim, mla.v_head_dim
            q_bytes = b * q * heads * qk * e
            k_bytes = b * heads * qk * c * e
            v_bytes = b * heads * v * c * e
            return (
                InferenceOp(
                    name=SemanticOpName.ATTENTION_SCORES,
                    kind=OpKind.BATCHED_MATMUL,
                    work=Work(matrix_flops=2 * qk * pairs, bytes_read=q_bytes + k_bytes),
                    gemm=GemmShape(m=q, n=qk, k=span, batch=b * heads),
                ),
                softmax,
                InferenceOp(
                    name=SemanticOpName.ATTENTION_OVER_VALUES,
                    kind=OpKind.BATCHED_MATMUL,
                    work=Work(
                        matrix_flops=2 * v * pairs,
                        bytes_read=v_bytes,
                        bytes_written=b * q * heads * v * e,
                    ),
                    gemm=GemmShape(m=q, n=span, k=v, batch=b * heads),
                ),
            )
        case InferencePhase.DECODE:
            width = mla.kv_lora_rank + mla.qk_pos_emb_head_dim
            cache = b * c * width * kv_e
            return (
                InferenceOp(
                    name=SemanticOpName.ATTENTION_SCORES,
                    kind=OpKind.BATCHED_MATMUL,
                    work=Work(
                        matrix_flops=2 * width * pairs,
                        bytes_read=b * q * heads * width * e + cache,
                    ),
                    gemm=GemmShape(m=q * heads, n=width, k=span, batch=b),
                    kv_cache_bytes=cache,
                ),
                softmax,
                InferenceOp(
                    name=SemanticOpName.ATTENTION_OVER_VALUES,
                    kind=OpKind.BATCHED_MATMUL,
                    work=Work(
                        matrix_flops=2 * mla.kv_lora_rank * pairs,
                        bytes_written=b * q * heads * mla.kv_lora_rank * e,
                    ),
                    gemm=GemmShape(m=q * heads, n=span, k=mla.kv_lora_rank, batch=b),
                ),
            )
        case _ as unreachable:
            assert_never(unreachable)


def expert_weight_bytes(model: TransformerModelSpec, *, tp: int, ep: int) -> tuple[int, int]:
    """(up, down) weight bytes of one routed expert on one rank: its FFN split over the
    ``t / ep`` expert tensor ranks (:meth:`TransformerModelSpec.expert_shard_parameters`)."""
    e = model.datatype.bytes
    up, down = model.expert_shard_parameters(max(1, tp // ep))
    return up * e, down * e


def _mlp_ops(
    model: TransformerModelSpec, local: BlockDims, tokens: int, *, ffn: int, gemm_tokens: int
) -> tuple[SemanticOp, SemanticOp, SemanticOp]:
    """The training block's (MLP_UP, MLP_ACTIVATION, MLP_DOWN) at ``ffn`` columns per rank on
    ``gemm_tokens`` rows."""
    dims = replace(local, ffn=ffn, gemm_tokens=gemm_tokens)
    ops = {
        op.name: op
        for op in block_ops(_dense_view(model), dims, attention=UnfusedAttention())
        if op.name in _MLP_NAMES
    }
    return (
        ops[SemanticOpName.MLP_UP],
        ops[SemanticOpName.MLP_ACTIVATION],
        ops[SemanticOpName.MLP_DOWN],
    )


_MLP_NAMES = frozenset(
    {SemanticOpName.MLP_UP, SemanticOpName.MLP_ACTIVATION, SemanticOpName.MLP_DOWN}
)


def _moe_ops(
    model: TransformerModelSpec,
    moe: MixtureOfExperts,
    dims: InferenceStepDims,
    local: BlockDims,
    *,
    tp: int,
    ep: int,
) -> tuple[InferenceOp, ...]:
    """One MoE layer's feed-forward on one rank (``shared/reference/modern_parallelism.md``
    sections 2.5 and 7): the replicated ``h x E`` router on every token; the routed experts on
    the ``ceil(b q k (1 + gamma) / ep)`` rows the rank's experts receive (the hottest rank under
    ``load_imbalance`` gamma), at ``F / etp`` columns, reading the weights of the experts those
    rows touch (``experts_touched / ep`` of its ``E / ep``, each once per step); the combine
    (each row scaled by its routing weight and summed into its token); the shared experts as a
    TP-sharded dense MLP of their total width."""
    e, h = model.datatype.bytes, model.hidden_size
    m = dims.tokens
    etp = max(1, tp // ep)
    num, k = moe.num_experts, moe.top_k
    routed = m * k
    rows = (
        -(-routed // ep)
        if moe.load_imbalance == 0
        else math.ceil(routed * (1 + moe.load_imbalance) / ep)
    )
    touched = experts_touched(num, k, m) / ep
    groups = max(1, math.ceil(touched))
    rows_per_expert = max(1, math.ceil(rows / max(touched, 1.0)))
    router_weights = model.router_parameters * e
    out: list[InferenceOp] = [
        InferenceOp(
            name=ServingOpName.ROUTER,
            kind=OpKind.GEMM,
            work=Work(
                matrix_flops=2 * m * h * num,
                vector_flops=ROUTER_VECTOR_FLOPS_PER_LOGIT * m * num,
                bytes_read=m * h * e + router_weights,
                bytes_written=m * num * e,
            ),
            gemm=GemmShape(m=m, n=h, k=num),
            weight_bytes=router_weights,
        )
    ]
    up_op, act_op, down_op = _mlp_ops(
        model, local, m, ffn=moe.expert_ffn_hidden_size // etp, gemm_tokens=rows
    )
    one_up, one_down = expert_weight_bytes(model, tp=tp, ep=ep)
    for op, name, one in (
        (up_op, ServingOpName.EXPERT_UP, one_up),
        (down_op, ServingOpName.EXPERT_DOWN, one_down),
    ):
        gemm = op.gemm
        assert gemm is not None  # the training MLP GEMMs carry their shape
        read = round(touched * one)
        # the one weight matrix (and MLP_UP's bias) the training GEMM reads
        bias = gemm.k if model.add_bias_linear and name is ServingOpName.EXPERT_UP else 0
        in_training = (gemm.n * gemm.k + bias) * e
        out.append(
            InferenceOp(
                name=name,
                kind=OpKind.GEMM,
                work=replace(op.forward, bytes_read=op.forward.bytes_read - in_training + read),
                gemm=GemmShape(m=rows_per_expert, n=gemm.n, k=gemm.k, batch=groups),
                weight_bytes=read,
                expert_weight_bytes=read,
            )
        )
        if name is ServingOpName.EXPERT_UP:
            out.append(
                InferenceOp(
                    name=ServingOpName.EXPERT_ACTIVATION, kind=act_op.kind, work=act_op.forward
                )
            )
    out.append(
        InferenceOp(
            name=ServingOpName.EXPERT_COMBINE,
            kind=OpKind.ELEMENTWISE,
            work=Work(vector_flops=2 * rows * h, bytes_read=rows * h * e, bytes_written=m * h * e),
        )
    )
    if moe.shared_expert_ffn_hidden_size:
        shared = moe.shared_expert_ffn_hidden_size // tp
        shared_local = replace(local, ffn=shared)
        names = (
            ServingOpName.SHARED_EXPERT_UP,
            ServingOpName.SHARED_EXPERT_ACTIVATION,
            ServingOpName.SHARED_EXPERT_DOWN,
        )
        for op, name in zip(
            _mlp_ops(model, local, m, ffn=shared, gemm_tokens=m), names, strict=True
        ):
            out.append(replace(_adopt(op, model, shared_local, m), name=name))
    return tuple(out)


def _block(
    model: TransformerModelSpec,
    dims: InferenceStepDims,
    local: BlockDims,
    kv_datatype: Datatype,
    *,
    moe_layer: bool = False,
    tp: int = 1,
    ep: int = 1,
) -> tuple[InferenceOp, ...]:
    """One block's ops: the training block's (of the dense view), with MLA's projections and
    attention in place of GQA's, and on a MoE layer the router and experts in place of the
    MLP."""
    out: list[InferenceOp] = []
    mla = model.self_attention if isinstance(model.self_attention, MultiLatentAttention) else None
    moe = model.moe if moe_layer else None
    # Serving prices its own fused attention (_attention): the training block's unfused core
    # is only the marker of where it goes.
    for op in block_ops(_dense_view(model), local, attention=UnfusedAttention()):
        if op.name in ATTENTION_CORE:
            if op.name is SemanticOpName.ATTENTION_SCORES:
                out.extend(_attention(model, dims, local, kv_datatype))
            continue
        if mla is not None and op.name is SemanticOpName.QKV_PROJECTION:
            out.extend(_mla_projections(model, mla, dims, local.heads))
            continue
        if mla is not None and op.name is SemanticOpName.OUTPUT_PROJECTION:
            out.extend(_mla_output(model, mla, dims, local.heads))
            continue
        if moe is not None and op.name in _MLP_NAMES:
            if op.name is SemanticOpName.MLP_UP:
                out.extend(_moe_ops(model, moe, dims, local, tp=tp, ep=ep))
            continue
        if op.name in (SemanticOpName.ATTENTION_RESIDUAL, SemanticOpName.MLP_RESIDUAL):
            shared_bias = moe is None or moe.shared_expert_ffn_hidden_size > 0
            bias_added = op.name is SemanticOpName.ATTENTION_RESIDUAL or shared_bias
            out.append(_residual(op.name, model, local.token_rows, bias_added=bias_added))
            continue
        out.append(_adopt(op, model, local, dims.tokens))
    return tuple(out)


def _block_collectives(
    dims: InferenceStepDims, model: TransformerModelSpec, *, tp: int, sequence_parallel: bool
) -> tuple[InferenceCollective, ...]:
    if tp == 1:
        return ()
    size = dims.tokens * model.hidden_size * model.datatype.bytes
    rows = (SemanticOpName.OUTPUT_PROJECTION, SemanticOpName.MLP_DOWN)
    if not sequence_parallel:
        return tuple(
            InferenceCollective(after=op, kind=CollectiveKind.ALL_REDUCE, bytes=size) for op in rows
        )
    order = (
        (SemanticOpName.QKV_PROJECTION, CollectiveKind.ALL_GATHER),
        (SemanticOpName.OUTPUT_PROJECTION, CollectiveKind.REDUCE_SCATTER),
        (SemanticOpName.MLP_UP, CollectiveKind.ALL_GATHER),
        (SemanticOpName.MLP_DOWN, CollectiveKind.REDUCE_SCATTER),
    )
    return tuple(InferenceCollective(after=op, kind=kind, bytes=size) for op, kind in order)


def inference_step_work(
    model: TransformerModelSpec,
    dims: InferenceStepDims,
    *,
    tp: int,
    sequence_parallel: bool,
    kv_datatype: Datatype,
    ep: int = 1,
) -> InferenceStepWork:
    """The local work of one prefill or decode step (module docstring). Callers check the laws
    first (t | heads, t | ffn, t | vocab, groups vs t, ep | t, ep | E)."""
    local = _local_dims(model, dims, tp=tp, sequence_parallel=sequence_parallel)
    e, h = model.datatype.bytes, model.hidden_size
    first = tuple(_adopt(op, model, local, dims.tokens) for op in first_stage_ops(model, local))
    # LM head on the last position of each sequence; the final norm on every token row.
    head_dims = replace(local, seq_length=1, gemm_tokens=dims.batch)
    last = tuple(
        _adopt(op, model, head_dims, dims.batch)
        for op in last_stage_ops(model, head_dims)
        if op.name is not SemanticOpName.CROSS_ENTROPY
    )
    first_collectives: tuple[InferenceCollective, ...] = ()
    last_collectives: tuple[InferenceCollective, ...] = ()
    if tp > 1:
        activation = dims.tokens * h * e
        first_collectives = (
            InferenceCollective(
                after=SemanticOpName.EMBEDDING,
                kind=CollectiveKind.REDUCE_SCATTER
                if sequence_parallel
                else CollectiveKind.ALL_REDUCE,
                bytes=activation,
            ),
        )
        gather_input = (
            (
                InferenceCollective(
                    after=SemanticOpName.FINAL_NORM,
                    kind=CollectiveKind.ALL_GATHER,
                    bytes=activation,
                ),
            )
            if sequence_parallel
            else ()
        )
        last_collectives = (
            *gather_input,
            InferenceCollective(
                after=SemanticOpName.LM_HEAD,
                kind=CollectiveKind.ALL_GATHER,
                bytes=dims.batch * model.padded_vocab_size * e,
            ),
        )
    moe = model.moe
    return InferenceStepWork(
        dims=dims,
        tp=tp,
        block=_block(model, dims, local, kv_datatype),
        moe_block=(
            ()
            if moe is None
            else _block(model, dims, local, kv_datatype, moe_layer=True, tp=tp, ep=ep)
        ),
        experts_touched=(
            0.0 if moe is None else experts_touched(moe.num_experts, moe.top_k, dims.tokens)
        ),
        block_collectives=_block_collectives(
            dims, model, tp=tp, sequence_parallel=sequence_parallel
        ),
        first_stage=first,
        first_stage_collectives=first_collectives,
        last_stage=last,
        last_stage_collectives=last_collectives,
        windowed_attention=(
            ()
            if model.window_keys is None
            else _attention(model, dims, local, kv_datatype, model.window_keys)
        ),
    )
