"""The laws as vectorized boolean masks over a table of candidate strategies.

One entry per :class:`~blueprinting.mapping.law_names.Law`, ``True`` where the candidate VIOLATES
the law, so that a rejection count is ``mask.sum()`` and a candidate breaking several laws is
counted under each. The conditions are exactly the ``Law.formula`` strings (the scalar checker
``blueprinting.mapping.laws.check_training`` states the same ones); the microbatch count used by
the Megatron group rule is the floor ``B // (d*b)``, like ``TransformerTrainingMappingSpec.
microbatch_count``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import numpy as np
import numpy.typing as npt

from blueprinting.errors import RuleSet
from blueprinting.mapping.law_names import EXPERT_LAWS, MEGATRON_LAWS, PLANNER_LAWS, Law
from blueprinting.mapping.laws import fused_attention_supported, recompute_module_laws
from blueprinting.mapping.model import (
    CapacityFactor,
    Datatype,
    SoftmaxType,
    TransformerModelSpec,
)
from blueprinting.mapping.transformer import (
    FlexDispatcher,
    RecomputeModule,
    TokenDispatcher,
    dispatcher_overlaps,
    shared_expert_overlaps,
)

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LawColumns:
    """The knobs the laws read, one int64/bool array per knob, all of one length.

    ``microbatch_group`` is 0 where the group size is Megatron's default (p);
    ``recompute_num_layers`` is read only where ``recompute_full`` is set.
    """

    num_gpus: IntArray
    tensor: IntArray
    pipeline: IntArray
    data: IntArray
    virtual_stages: IntArray
    micro_batch: IntArray
    sequence_parallel: BoolArray
    recompute_full: BoolArray
    recompute_num_layers: IntArray
    overlap_p2p_comm: BoolArray
    microbatch_group: IntArray
    context: IntArray
    cp_head_split: BoolArray  # the row's cp_comm_type splits heads (a2a)
    cp_ring: BoolArray  # the row's cp_comm_type passes K/V around a ring (p2p, a2a+p2p)
    tp_comm_overlap: BoolArray  # the row plans UserbufferOverlap (inside RS+AG)
    #: the row's precision recipe can go through userbuffers (``precision.userbuffers_carry``)
    userbuffer_recipe: BoolArray
    selective: BoolArray  # the row recomputes selectively (the space's one module set)
    expert: IntArray  # ep
    expert_tensor: IntArray  # etp
    dispatcher: IntArray  # index into the dispatchers law_violations is given
    #: the row runs a balanced ``pipeline_model_parallel_layout`` (``space.layout_of``): the
    #: even-split laws do not apply, ``flexible_layout_laws`` hold by construction
    balanced_layout: BoolArray
    #: the most blocks a physical stage of a balanced-layout row holds (0 elsewhere)
    layout_stage_blocks: IntArray


#: Laws that read only the free knobs (the data-parallel overlaps), not :class:`LawColumns`.
FREE_OPTION_LAWS: tuple[Law, ...] = (Law.MEGATRON_OVERLAP_PARAM_GATHER,)


def free_option_violations(
    overlap_param_gather: BoolArray, overlap_grad_reduce: BoolArray, *, megatron_rules: bool
) -> dict[Law, BoolArray]:
    """Violation mask of every applied law of :data:`FREE_OPTION_LAWS`, one entry per option
    (Megatron-LM ``megatron/training/arguments.py``: "Must use --overlap-param-gather with
    --overlap-grad-reduce")."""
    if not megatron_rules:
        return {}
    return {Law.MEGATRON_OVERLAP_PARAM_GATHER: overlap_param_gather & ~overlap_grad_reduce}


def applied_laws(*, megatron_rules: bool) -> tuple[Law, ...]:
    """The laws a search applies: the planner's always, Megatron-LM's unless dropped; never
    those of knobs the search does not vary (``Law.searched``)."""
    laws = PLANNER_LAWS + MEGATRON_LAWS if megatron_rules else PLANNER_LAWS
    return tuple(law for law in laws if law.searched)


def law_violations(
    columns: LawColumns,
    model: TransformerModelSpec,
    global_batch_size: int,
    *,
    megatron_rules: bool,
    dispatchers: tuple[TokenDispatcher, ...],
    selective_modules: frozenset[RecomputeModule],
) -> dict[Law, BoolArray]:
    """Violation mask of every applied law that reads ``columns`` (all but
    :data:`FREE_OPTION_LAWS`; see ``Law.formula`` for each condition). ``selective_modules``:
    what the selective rows recompute (read by the expert overlap laws)."""
    c = columns
    t, p, d, v, b = c.tensor, c.pipeline, c.data, c.virtual_stages, c.micro_batch
    big_l = model.num_layers
    # Guards keep the modulo defined on rows whose degrees are already illegal (d = 0 never comes
    # out of the enumeration, but a hand-built table may hold it); those rows fail world_size.
    d_safe = np.maximum(d, 1)
    # Products of two user numbers (d*b, p*v) can pass int64; the quotient forms are exact.
    local_batch = global_batch_size // d_safe
    microbatches = local_batch // b
    interleaved = v > 1
    groups = model.num_query_groups
    cp = c.context
    s = model.seq_length
    t_safe = np.maximum(t, 1)
    a2a = c.cp_head_split & (cp > 1)
    local_q = model.num_attention_heads // t_safe
    local_kv = np.maximum(1, groups // t_safe)

    masks: dict[Law, BoolArray] = {
        Law.WORLD_SIZE: t * cp * p * d != c.num_gpus,
        Law.LOCAL_BATCH: global_batch_size % d_safe != 0,
        Law.MICROBATCH_COUNT: (global_batch_size % d_safe != 0) | (local_batch % b != 0),
        Law.BLOCKS_PER_PIPELINE_STAGE: (big_l % p != 0) & ~c.balanced_layout,
        Law.BLOCKS_PER_VIRTUAL_CHUNK: ((big_l % p != 0) | ((big_l // p) % v != 0))
        & ~c.balanced_layout,
        Law.SEQUENCE_PARALLEL_DIVISIBILITY: c.sequence_parallel & (s % (t * cp) != 0),
        Law.ATTENTION_HEADS_DIVISIBILITY: model.num_attention_heads % t != 0,
        # training splits the K/V heads over t (laws._block_laws, replicated_kv=False)
        Law.QUERY_GROUPS_DIVISIBILITY: groups % t != 0,
        Law.FFN_DIVISIBILITY: model.ffn_hidden_size % t != 0,
        Law.VOCAB_DIVISIBILITY: model.padded_vocab_size % t != 0,
        Law.SCHEDULE_MATCHES_PIPELINE: interleaved & (p == 1),
        # laws._recompute_laws: the bound is the largest stage's blocks
        Law.RECOMPUTE_NUM_LAYERS_RANGE: c.recompute_full
        & (
            (c.recompute_num_layers < 1)
            | (
                c.recompute_num_layers
                > np.where(c.balanced_layout, c.layout_stage_blocks, big_l // p)
            )
        ),
        Law.CP_SEQUENCE_SPLIT: (cp > 1) & (s % (2 * cp) != 0),
        # the search enumerates no a2a+p2p (its two sizes are not searched)
        Law.CP_HIERARCHICAL_SIZES: np.zeros(t.shape, dtype=np.bool_),
    }
    masks.update(_expert_laws(c, model, dispatchers, selective_modules, megatron_rules))
    # one module set for every selective row: the scalar law on it, on those rows
    masks[Law.RECOMPUTE_MODULE_NEEDS_LAYER] = c.selective & bool(
        recompute_module_laws(model, selective_modules)
    )
    if megatron_rules:
        group = np.where(c.microbatch_group > 0, c.microbatch_group, p)
        remainder = microbatches % group
        group_ok = (p <= group) & (group <= microbatches) & ((remainder == 0) | (remainder >= p))
        masks[Law.MEGATRON_INTERLEAVING_MIN_PIPELINE] = interleaved & ~(
            (p > 2) | ((p == 2) & c.overlap_p2p_comm)
        )
        masks[Law.MEGATRON_MICROBATCH_GROUP] = interleaved & ~group_ok
        masks[Law.MEGATRON_SEQUENCE_PARALLEL_NEEDS_TP] = c.sequence_parallel & (t <= 1)
        # The search plans Megatron's default (fused) attention on every row: the rule reads
        # only the model.
        masks[Law.MEGATRON_FUSED_ATTENTION_SUPPORT] = np.full(
            t.shape, not fused_attention_supported(model), dtype=np.bool_
        )
        # the auto backend on every row runs windows and sinks (laws._backend_feature_laws)
        masks[Law.MEGATRON_ATTENTION_BACKEND_WINDOW_SINKS] = np.zeros(t.shape, dtype=np.bool_)
        masks[Law.MEGATRON_CP_A2A_HEADS] = a2a & ((local_q % cp != 0) | (local_kv % cp != 0))
        # fused attention on every row
        masks[Law.MEGATRON_CP_NEEDS_FUSED_ATTENTION] = np.zeros(t.shape, dtype=np.bool_)
        # mapping/laws.py _context_laws: both read the model and the row's cp_comm_type
        windowed = model.windowed_layers_in(0, big_l) > 0
        masks[Law.MEGATRON_CP_SLIDING_WINDOW] = (cp > 1) & c.cp_ring & windowed
        masks[Law.MEGATRON_CP_SOFTMAX_TYPE] = (
            (cp > 1) & ~c.cp_head_split & (model.softmax_type is not SoftmaxType.VANILLA)
        )
        # mapping/laws.py _tp_comm_overlap_laws. The enumeration plans the overlap only on
        # sequence-parallel rows with t > 1, so the first never fires there (a hand-built table
        # may break it); the second, (s*b) mod t with the factors reduced first so that the
        # product cannot pass int64, is implied by local_sequence (s mod t*cp == 0) on
        # sequence-parallel rows: it fires where that law does.
        overlap = c.tp_comm_overlap
        masks[Law.MEGATRON_TP_COMM_OVERLAP_NEEDS_SP] = overlap & (~c.sequence_parallel | (t <= 1))
        masks[Law.MEGATRON_TP_COMM_OVERLAP_BUFFER] = overlap & (
            ((s % t_safe) * (b % t_safe)) % t_safe != 0
        )
        masks[Law.MEGATRON_TP_COMM_OVERLAP_QUANTIZER] = overlap & ~c.userbuffer_recipe
    return masks


def _expert_laws(
    c: LawColumns,
    model: TransformerModelSpec,
    dispatchers: tuple[TokenDispatcher, ...],
    selective_modules: frozenset[RecomputeModule],
    megatron_rules: bool,
) -> dict[Law, BoolArray]:
    """The expert grid's laws (``mapping/expert_laws.py``, the same conditions on arrays). A
    dense model breaks only ``expert_parallel_needs_moe``; on a MoE model every law reads its
    row. The enumeration plans ``moe_grouped_gemm`` on (Megatron-Bridge's recipes), so
    ``moe_act_recompute_needs_grouped_gemm`` never fires there."""
    t, p, v, ep, etp = c.tensor, c.pipeline, c.virtual_stages, c.expert, c.expert_tensor
    none = np.zeros(t.shape, dtype=np.bool_)
    moe = model.moe
    if moe is None:
        masks = {
            law: none for law in EXPERT_LAWS if megatron_rules or law.ruleset is RuleSet.PLANNER
        }
        masks[Law.EXPERT_PARALLEL_NEEDS_MOE] = (ep > 1) | (etp > 1)
        return masks
    ep_safe, etp_safe = np.maximum(ep, 1), np.maximum(etp, 1)
    grid = etp_safe * ep_safe * np.maximum(p, 1)
    shared = moe.shared_expert_ffn_hidden_size
    masks = {
        Law.EXPERT_PARALLEL_NEEDS_MOE: none,
        # N mod (etp ep p), with the quotient form: etp ep p can pass N only on illegal rows
        Law.EXPERT_WORLD_SIZE: c.num_gpus % grid != 0,
        Law.EXPERTS_PER_EXPERT_RANK: moe.num_experts % ep_safe != 0,
        Law.EXPERT_FFN_DIVISIBILITY: moe.expert_ffn_hidden_size % etp_safe != 0,
        Law.SHARED_EXPERT_FFN_DIVISIBILITY: shared % np.maximum(t, 1) != 0,
        Law.MOE_TP_NEEDS_SEQUENCE_PARALLEL: (t > 1) & ~c.sequence_parallel,
    }
    if not megatron_rules:
        return masks

    def per_dispatcher(flag: list[bool]) -> BoolArray:
        return np.array(flag, dtype=np.bool_)[c.dispatcher]

    flex = per_dispatcher([isinstance(k, FlexDispatcher) for k in dispatchers])
    overlap = per_dispatcher([dispatcher_overlaps(k) for k in dispatchers])
    shared_overlap = per_dispatcher([shared_expert_overlaps(k) for k in dispatchers])
    padded = isinstance(moe.dropping, CapacityFactor) and moe.dropping.pad_to_capacity
    moe_module = c.selective & (RecomputeModule.MOE in selective_modules)
    shared_module = c.selective & (RecomputeModule.SHARED_EXPERTS in selective_modules)
    masks[Law.MEGATRON_EXPERT_TENSOR_WITHOUT_BIAS] = (etp > 1) & model.add_bias_linear
    masks[Law.MEGATRON_EP_NEEDS_SEQUENCE_PARALLEL] = (ep > 1) & (t > 1) & ~c.sequence_parallel
    masks[Law.MEGATRON_FLEX_NEEDS_EXPERT_GRID] = flex & (etp * ep == 1)
    masks[Law.MEGATRON_FLEX_NO_PAD_TO_CAPACITY] = flex & padded
    masks[Law.MEGATRON_EP_OVERLAP_NEEDS_EP] = overlap & (ep == 1)
    masks[Law.MEGATRON_EP_OVERLAP_NEEDS_VIRTUAL_PIPELINE] = overlap & (p > 1) & (v <= 1)
    masks[Law.MEGATRON_EP_OVERLAP_RECOMPUTE] = overlap & (c.recompute_full | moe_module)
    masks[Law.MEGATRON_EP_OVERLAP_MTP] = overlap & (model.mtp_num_layers > 1)
    masks[Law.MEGATRON_EP_OVERLAP_DATATYPE] = overlap & (model.datatype is Datatype.FP32)
    masks[Law.MEGATRON_SHARED_EXPERT_OVERLAP] = shared_overlap & (
        (shared == 0) | overlap | shared_module
    )
    masks[Law.MEGATRON_MOE_ACT_RECOMPUTE] = none
    return masks
