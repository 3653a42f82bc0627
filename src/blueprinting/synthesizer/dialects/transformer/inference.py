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

Every op also reports which of its HBM bytes are weights and which are KV cache, so that an
analysis can set a step against its compute and HBM-bandwidth bounds term by term.

Public API (used by inference_derivation.py and blueprinting.inference):

- :class:`InferencePhase`, :class:`InferenceStepDims`
- :class:`InferenceOp`, :class:`InferenceCollective`, :class:`InferenceStepWork`
- :func:`kv_groups_per_rank`, :func:`kv_cache_bytes_per_token`
- :func:`inference_step_work(model, dims, *, tp, sequence_parallel, kv_datatype)`
- :func:`attention_ops(model, dims, *, tp, sequence_parallel, kv_datatype)`: the only block ops
  whose work depends on the context (an analysis re-costs just these from one decode step to the
  next); :data:`CONTEXT_DEPENDENT` names them
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import final

from blueprinting.errors import ConfigError, positive_int_problems
from blueprinting.mapping.model import Datatype, MlpActivation, TransformerModelSpec
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
        return self.cached_tokens + self.new_tokens

    @property
    def tokens(self) -> int:
        return self.batch * self.new_tokens

    @property
    def attended_pairs(self) -> int:
        """Causal (query, key) pairs of one sequence and one head: ``q c0 + q (q + 1) / 2``."""
        q, c0 = self.new_tokens, self.cached_tokens
        return q * c0 + q * (q + 1) // 2


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class InferenceOp:
    """One op of a forward step on one TP rank: its work and which HBM bytes are weights and
    which KV cache (the rest are activations)."""

    name: SemanticOpName
    kind: OpKind
    work: Work
    gemm: GemmShape | None = None
    weight_bytes: int = 0
    kv_cache_bytes: int = 0

    @property
    def activation_bytes(self) -> int:
        return (
            self.work.bytes_read + self.work.bytes_written - self.weight_bytes - self.kv_cache_bytes
        )


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

    @property
    def phase(self) -> InferencePhase:
        return self.dims.phase


def kv_groups_per_rank(model: TransformerModelSpec, tp: int) -> int:
    """Query groups (KV heads) one TP rank stores: ``max(1, groups / t)`` (Megatron-LM
    replicates KV heads when t > groups)."""
    return max(1, model.num_query_groups // tp)


def kv_cache_bytes_per_token(model: TransformerModelSpec, tp: int, kv_datatype: Datatype) -> int:
    """KV-cache bytes one token adds on one TP rank in one layer: ``2 * groups_per_rank *
    kv_channels * kv_bytes`` (K and V)."""
    return 2 * kv_groups_per_rank(model, tp) * model.kv_channels * kv_datatype.bytes


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


def _residual(name: SemanticOpName, model: TransformerModelSpec, rows: int) -> InferenceOp:
    """Bias + residual add without dropout (inference): ``elems`` adds, plus the row-parallel
    GEMM's bias (added after the reduction, as Megatron's ``bias_dropout_add``)."""
    e, h = model.datatype.bytes, model.hidden_size
    elems = rows * h
    bias = h if model.add_bias_linear else 0
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
    model: TransformerModelSpec, dims: InferenceStepDims, local: BlockDims, kv_datatype: Datatype
) -> tuple[InferenceOp, ...]:
    """Fused attention on heads/t heads (module docstring). The efficiency shape stacks the
    ``heads / groups`` query heads that share a KV head as rows, as GQA decode kernels do."""
    e, kv_e = model.datatype.bytes, kv_datatype.bytes
    b, q, c = dims.batch, dims.new_tokens, dims.context
    heads, groups, d = local.heads, local.groups, local.kv_channels
    per_group = max(1, heads // groups)
    pairs = b * heads * dims.attended_pairs
    q_bytes = b * q * heads * d * e
    k_bytes = b * groups * d * c * kv_e  # V is the same size
    rows = q * per_group
    return (
        InferenceOp(
            name=SemanticOpName.ATTENTION_SCORES,
            kind=OpKind.BATCHED_MATMUL,
            work=Work(matrix_flops=2 * d * pairs, bytes_read=q_bytes + k_bytes),
            gemm=GemmShape(m=rows, n=d, k=c, batch=b * groups),
            kv_cache_bytes=k_bytes,
        ),
        InferenceOp(
            name=SemanticOpName.SOFTMAX,
            kind=OpKind.SOFTMAX,
            work=Work(vector_flops=SOFTMAX_FLOPS_PER_PAIR * pairs),
        ),
        InferenceOp(
            name=SemanticOpName.ATTENTION_OVER_VALUES,
            kind=OpKind.BATCHED_MATMUL,
            work=Work(matrix_flops=2 * d * pairs, bytes_read=k_bytes, bytes_written=q_bytes),
            gemm=GemmShape(m=rows, n=c, k=d, batch=b * groups),
            kv_cache_bytes=k_bytes,
        ),
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
) -> tuple[InferenceOp, ...]:
    """The fused attention ops of one block (the :data:`CONTEXT_DEPENDENT` ones), as
    :func:`inference_step_work` builds them."""
    local = _local_dims(model, dims, tp=tp, sequence_parallel=sequence_parallel)
    return _attention(model, dims, local, kv_datatype)


def _block(
    model: TransformerModelSpec, dims: InferenceStepDims, local: BlockDims, kv_datatype: Datatype
) -> tuple[InferenceOp, ...]:
    out: list[InferenceOp] = []
    # Serving prices its own fused attention (_attention): the training block's unfused core
    # is only the marker of where it goes.
    for op in block_ops(model, local, attention=UnfusedAttention()):
        if op.name in ATTENTION_CORE:
            if op.name is SemanticOpName.ATTENTION_SCORES:
                out.extend(_attention(model, dims, local, kv_datatype))
            continue
        if op.name in (SemanticOpName.ATTENTION_RESIDUAL, SemanticOpName.MLP_RESIDUAL):
            out.append(_residual(op.name, model, local.token_rows))
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
) -> InferenceStepWork:
    """The local work of one prefill or decode step (module docstring). Callers check the laws
    first (t | heads, t | ffn, t | vocab, groups vs t)."""
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
    return InferenceStepWork(
        dims=dims,
        tp=tp,
        block=_block(model, dims, local, kv_datatype),
        block_collectives=_block_collectives(
            dims, model, tp=tp, sequence_parallel=sequence_parallel
        ),
        first_stage=first,
        first_stage_collectives=first_collectives,
        last_stage=last,
        last_stage_collectives=last_collectives,
    )
