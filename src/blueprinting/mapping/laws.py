"""Every law relating a model and a mapping, reported all at once.

The planner's laws are the seed's composition and divisibility laws ("Typed Transformer Parallel
Strategies", section "Composition and divisibility laws")::

    world_size = t * p * d
    local_batch = global_batch / d
    microbatch_count = global_batch / (d * microbatch_size)
    blocks_per_pipeline_stage = transformer_blocks / p
    blocks_per_virtual_chunk = transformer_blocks / (p * v)

each required to be integral, plus ``sequence_length mod t = 0`` for RS+AG boundaries (Korthikanti
et al. 2022, Section 4.2.2), the schedule/degree agreement, the tensor-parallel split of the block
(Shoeybi et al. 2019, Section 3: heads, FFN columns and the vocabulary are partitioned over t) and
the recompute bounds. ``world_size = t * p * d`` holds by construction in the ADT (the world size
is a derived projection); :func:`blueprinting.mapping.flat_keys.from_mapping` checks it where a user
gives a world size.

Megatron-LM's start-up rules (``megatron/training/arguments.py``, ``model_parallel_config.py``,
``pipeline_parallel/schedules.py`` at d98e8a64; see ``shared/reference/megatron_rules.md`` and
``schedules.md`` section 3) form the separate :attr:`RuleSet.MEGATRON` set: a strategy may satisfy
the planner and still be refused by Megatron-LM. Nothing here repairs a strategy; a law either
holds or is reported.
"""

from __future__ import annotations

from typing import assert_never

from blueprinting.errors import InvalidStrategyError, LawViolation, RuleSet
from blueprinting.limits import MAX_PIPELINE_STAGES
from blueprinting.mapping.law_names import Law, law_violation
from blueprinting.mapping.model import (
    Datatype,
    MultiLatentAttention,
    PositionEmbedding,
    SoftmaxType,
    TransformerModelSpec,
)
from blueprinting.mapping.precision import AcceleratorSupport
from blueprinting.mapping.serving_laws import serving_expert_laws
from blueprinting.mapping.transformer import (
    AllGatherKV,
    AllReduce,
    AttentionBackend,
    AttentionKernel,
    CombinedOneForwardOneBackward,
    CrossEntropyFusionImpl,
    DistributedOptimizer,
    DualPipe,
    DualPipeV,
    EvenStages,
    FlexibleStages,
    ForwardOnly,
    FullRecompute,
    FusedAttention,
    FusedCrossEntropy,
    HeadAllToAll,
    HierarchicalAllToAllRing,
    InterleavedOneForwardOneBackward,
    NoOptimizerSharding,
    NoRecompute,
    NoTpCommOverlap,
    OneForwardOneBackward,
    PipelineParallel,
    RecomputeModule,
    ReduceScatterAllGather,
    RingExchange,
    SelectiveRecompute,
    ShardedGradients,
    ShardedParameters,
    SingleStage,
    TensorParallel,
    TpCommOverlap,
    TransformerInferenceMappingSpec,
    TransformerTrainingMappingSpec,
    UnevenStages,
    UnfusedAttention,
    UnfusedCrossEntropy,
    UserbufferOverlap,
    ZeroBubbleH1,
)

Value = int | float | str | bool | None


def _violation(
    law: str,
    formula: str,
    message: str,
    ruleset: RuleSet = RuleSet.PLANNER,
    **values: Value,
) -> LawViolation:
    return LawViolation(
        law=law,
        formula=formula,
        values=tuple(values.items()),
        message=message,
        ruleset=ruleset,
    )


# --------------------------------------------------------------------------------------------
# Stage block counts
# --------------------------------------------------------------------------------------------
def stage_blocks(num_layers: int, pipeline: PipelineParallel) -> tuple[int, ...] | None:
    """Transformer blocks held by each physical pipeline stage, first to last.

    ``None`` when the layout does not split ``num_layers`` into positive integral counts (the laws
    report why). With :class:`UnevenStages` the given first/last counts are fixed and the rest
    split evenly over the remaining stages, as Megatron-LM's
    ``decoder_first/last_pipeline_num_layers`` do (``transformer_config.py``).
    """
    p = pipeline.degree
    match pipeline.layout:
        case EvenStages():
            if num_layers % p != 0:
                return None
            return (num_layers // p,) * p
        case UnevenStages(first_stage_layers=first, last_stage_layers=last):
            fixed = [n for n in (first, last) if n is not None]
            rest_stages = p - len(fixed)
            rest_blocks = num_layers - sum(fixed)
            if p < 2 or rest_stages < 0:
                return None
            if rest_stages == 0:
                return (first or 0, last or 0) if rest_blocks == 0 else None
            if rest_blocks < rest_stages or rest_blocks % rest_stages != 0:
                return None
            middle = rest_blocks // rest_stages
            counts = [middle] * rest_stages
            if first is not None:
                counts.insert(0, first)
            if last is not None:
                counts.append(last)
            return tuple(counts)
        case FlexibleStages(stages=stages) as flexible:
            if len(stages) % p != 0 or sum(s.decoder_layers for s in stages) != num_layers:
                return None
            return flexible.rank_blocks(p)
        case _ as unreachable:
            assert_never(unreachable)


def uneven_split_hint(num_layers: int, p: int, v: int = 1) -> str:
    """How Megatron-LM runs ``num_layers`` blocks over ``p`` stages that do not divide them (a
    suffix of the ``blocks_per_pipeline_stage`` message; empty when no way exists): the most
    even ``decoder_first_pipeline_num_layers`` / ``decoder_last_pipeline_num_layers`` split (on a
    tie the lighter last stage, which also holds the LM head, the loss and any MTP depth, then
    the lighter ends; an end the even split of the others gives anyway is not named; with ``v``
    virtual stages every count a multiple of v: Megatron-LM's ``transformer_config.py`` checks
    that the first, last and middle stages' layers divide over v, and that the middle stages
    split the rest evenly), and ``account_for_embedding_in_pipeline_split`` /
    ``account_for_loss_in_pipeline_split`` where ``num_layers + 2`` divides over the p x v
    stages. Only middle counts next to ``num_layers / p`` are tried (a handful of stage splits,
    each p counts long; none above :data:`~blueprinting.limits.MAX_PIPELINE_STAGES` stages). A
    suggestion: the strategy stays refused."""
    if p < 2 or v < 1 or p > MAX_PIPELINE_STAGES:
        return ""
    ways = []
    split = _most_even_uneven(num_layers // v, p) if num_layers % v == 0 else None
    if split is not None:
        first, last, counts = (
            None if split[0] is None else split[0] * v,
            None if split[1] is None else split[1] * v,
            tuple(c * v for c in split[2]),
        )
        if not _uneven_laws(num_layers, p, v, first, last):
            keys = " and ".join(
                f"{key} = {value}"
                for key, value in (
                    ("decoder_first_pipeline_num_layers", first),
                    ("decoder_last_pipeline_num_layers", last),
                )
                if value is not None
            )
            shown = counts if p <= 16 else (*counts[:2], "...", counts[-1])
            ways.append(f"{keys} ({'/'.join(str(c) for c in shown)})")
    if (num_layers + 2) % (p * v) == 0:
        ways.append(
            "account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split "
            f"(({num_layers} + 2) / {p * v} = {(num_layers + 2) // (p * v)} "
            f"unit{'s' if (num_layers + 2) // (p * v) > 1 else ''} a "
            f"{'virtual ' if v > 1 else ''}stage)"
        )
    if not ways:
        return ""
    return "; Megatron-LM runs it uneven with " + ", or ".join(ways)


def _most_even_uneven(
    num_layers: int, p: int
) -> tuple[int | None, int | None, tuple[int, ...]] | None:
    """The (first, last, per-stage counts) of :func:`uneven_split_hint`'s split of
    ``num_layers`` over ``p`` stages, or None when there are fewer blocks than stages."""
    if num_layers < p:
        return None
    candidates: list[tuple[int | None, int | None]] = []
    around = num_layers // p
    for middle in range(max(around - 1, 1), around + 3):
        both = num_layers - middle * (p - 2)
        if both >= 2:
            candidates.append((both // 2, both - both // 2))
            candidates.append((both - both // 2, both // 2))
        one = num_layers - middle * (p - 1)
        if one >= 1:
            candidates.append((one, None))
            candidates.append((None, one))
    best: tuple[tuple[int, int, int], tuple[int | None, int | None, tuple[int, ...]]] | None = None
    for first, last in candidates:
        counts = _uneven_counts(num_layers, p, first, last)
        if counts is None:
            continue
        # the most even split; on a tie the lighter last stage (it also holds the LM head, the
        # loss and any MTP depth), then the lighter ends
        rank = (max(counts) - min(counts), counts[-1], (first or 0) + (last or 0))
        if best is None or rank < best[0]:
            best = (rank, (first, last, counts))
    if best is None:
        return None
    first, last, counts = best[1]
    # name no end that the even split of the others gives anyway
    for drop_first, drop_last in ((False, True), (True, False)):
        kept = (None if drop_first else first, None if drop_last else last)
        if kept not in ((None, None), (first, last)) and (
            _uneven_counts(num_layers, p, *kept) == counts
        ):
            first, last = kept
    return first, last, counts


def _uneven_counts(
    num_layers: int, p: int, first: int | None, last: int | None
) -> tuple[int, ...] | None:
    """:func:`stage_blocks` of a decoder_first / decoder_last split (the schedule plays no
    part in the counts)."""
    layout = UnevenStages(first_stage_layers=first, last_stage_layers=last)
    return stage_blocks(
        num_layers, PipelineParallel(degree=p, schedule=OneForwardOneBackward(), layout=layout)
    )


def balanced_layout_hint(num_layers: int, mtp_layers: int, chunks: int) -> str:
    """How Megatron-LM runs ``num_layers`` blocks over ``chunks`` = p x v virtual stages that do
    not divide them (a suffix of the ``blocks_per_virtual_chunk`` message; empty when none
    holds the model): ``pipeline_model_parallel_layout`` with the balanced layout
    (:func:`~blueprinting.mapping.pipeline_layout.balanced_layout`: the embedding, each MTP
    depth and the loss one unit each, the units spread as evenly as they go; what
    ``search --pipeline-layouts balanced`` plans). A suggestion: the strategy stays refused."""
    # imported here: pipeline_layout imports mapping.transformer, which re-exports these laws
    from blueprinting.mapping.pipeline_layout import (
        MAX_LAYOUT_STAGES,
        balanced_layout,
        format_pipeline_layout,
    )

    # only what the layout parser reads back: at most MAX_LAYOUT_STAGES stages, and no run of
    # blocks beyond its per-stage bound (which also keeps the hint's cost bounded)
    units_per_stage = -(-(num_layers + 2 + mtp_layers) // chunks)
    if chunks > MAX_LAYOUT_STAGES or units_per_stage > MAX_LAYOUT_STAGES * 8:
        return ""
    layout = balanced_layout(num_layers, mtp_layers, chunks)
    if layout is None:
        return ""
    return (
        "; Megatron-LM runs it with pipeline_model_parallel_layout = "
        f"'{format_pipeline_layout(layout)}' (the embedding, the loss"
        f"{' and each MTP depth' if mtp_layers else ''} one layer each, spread evenly; it sets "
        "v, in place of the virtual stage count)"
    )


def _layout_laws(
    num_layers: int,
    pipeline: PipelineParallel,
    v: int,
    mtp_layers: int = 0,
    *,
    hints: bool = True,
) -> list[LawViolation]:
    """The stage-layout laws; ``hints``: their messages name the training keys that would run the
    model (:func:`uneven_split_hint`, :func:`balanced_layout_hint`); serving takes none."""
    p = pipeline.degree
    out: list[LawViolation] = []
    # a layout string only where Megatron's interleaved schedules read one (DualPipe and
    # DualPipeV place their own chunks)
    takes_layout = isinstance(
        pipeline.schedule, InterleavedOneForwardOneBackward | CombinedOneForwardOneBackward
    )
    match pipeline.layout:
        case EvenStages():
            if num_layers % p != 0:
                out.append(
                    _violation(
                        "blocks_per_pipeline_stage",
                        "blocks_per_pipeline_stage = transformer_blocks / p",
                        f"blocks_per_pipeline_stage = {num_layers} / {p} is not integral"
                        + (uneven_split_hint(num_layers, p, v) if hints else ""),
                        transformer_blocks=num_layers,
                        p=p,
                    )
                )
            if v > 1 and num_layers % (p * v) != 0:
                out.append(
                    _violation(
                        "blocks_per_virtual_chunk",
                        "blocks_per_virtual_chunk = transformer_blocks / (p * v)",
                        f"blocks_per_virtual_chunk = {num_layers} / ({p} * {v}) is not integral"
                        + (
                            balanced_layout_hint(num_layers, mtp_layers, p * v)
                            if hints and takes_layout
                            else ""
                        ),
                        transformer_blocks=num_layers,
                        p=p,
                        v=v,
                    )
                )
        case UnevenStages(first_stage_layers=first, last_stage_layers=last):
            out.extend(_uneven_laws(num_layers, p, v, first, last))
        case FlexibleStages():
            out.extend(flexible_layout_laws(num_layers, pipeline.layout, p, v, mtp_layers))
        case _ as unreachable:
            assert_never(unreachable)
    return out


def _at(position: int | None) -> str:
    return "" if position is None else f" (position {position} of the layout string)"


def flexible_layout_laws(
    num_layers: int, layout: FlexibleStages, p: int, v: int, mtp_layers: int = 0
) -> list[LawViolation]:
    """Megatron-LM's checks of ``pipeline_model_parallel_layout`` (``arguments.py`` l.941-950
    and ``pipeline_parallel_layer_layout.py`` ``validate_layer_layout`` @d98e8a64): p * v
    stages, the embedding exactly once and first, the loss exactly once and last, and exactly
    num_layers decoder blocks. Megatron derives v from the stage count; here v comes from the
    schedule and the law checks that they agree."""
    stages = layout.stages
    out: list[LawViolation] = []
    if len(stages) != p * v:
        out.append(
            _violation(
                "layout_stage_count",
                "layout stages = p * v",
                f"the layout has {len(stages)} stages, p * v = {p} * {v} = {p * v}",
                stages=len(stages),
                p=p,
                v=v,
            )
        )
    blocks = sum(stage.decoder_layers for stage in stages)
    if blocks != num_layers:
        out.append(
            _violation(
                "layout_covers_model",
                "count(t) = num_layers",
                f"the layout holds {blocks} decoder blocks (t), the model has {num_layers}",
                layout_blocks=blocks,
                num_layers=num_layers,
            )
        )
    for role, name, expected in (("embedding", "E", 0), ("loss", "L", len(stages) - 1)):
        holders = [k for k, stage in enumerate(stages) if getattr(stage, role)]
        if holders == [expected]:
            continue
        where = ", ".join(f"stage {k}{_at(stages[k].position)}" for k in holders) or "no stage"
        place = "first" if expected == 0 else "last"
        out.append(
            _violation(
                f"layout_{role}_{place}",
                f"{name} exactly once, in the {place} stage",
                f"the {role} ({name}) must be given once, in the {place} stage ({expected}); "
                f"found in {where}",
                count=len(holders),
            )
        )
    # A layout that names the MTP depths names all of them (Megatron-LM
    # pipeline_parallel_layer_layout.py); one without 'm' leaves them where the default puts
    # them, with the loss. Blueprinting costs them on the loss's stage only.
    placed = [k for k, stage in enumerate(stages) if stage.mtp_layers]
    given = sum(stage.mtp_layers for stage in stages)
    if (given and given != mtp_layers) or any(k != len(stages) - 1 for k in placed):
        out.append(
            _violation(
                "layout_mtp_layers",
                "count(m) in {0, mtp_num_layers}, in the loss's stage",
                f"the layout holds {given} MTP depths (m) in "
                + (", ".join(f"stage {k}" for k in placed) or "no stage")
                + f", the model has mtp_num_layers = {mtp_layers}, costed on the last stage "
                "(with the loss)",
                layout_mtp=given,
                mtp_num_layers=mtp_layers,
            )
        )
    return out


def _uneven_laws(
    num_layers: int, p: int, v: int, first: int | None, last: int | None
) -> list[LawViolation]:
    fixed = {name: n for name, n in (("first", first), ("last", last)) if n is not None}
    if p < 2 or len(fixed) > p:
        return [
            _violation(
                "uneven_stages_need_pipeline",
                "uneven first/last stage counts need p >= 2",
                f"uneven layout fixes {len(fixed)} stage(s) but p = {p}",
                p=p,
            )
        ]
    out: list[LawViolation] = []
    rest_stages = p - len(fixed)
    rest_blocks = num_layers - sum(fixed.values())
    counts = dict(fixed)
    if rest_stages == 0:
        if rest_blocks != 0:
            out.append(
                _violation(
                    "uneven_stage_blocks_sum",
                    "first_stage_blocks + last_stage_blocks = transformer_blocks",
                    f"{first} + {last} = {(first or 0) + (last or 0)} != "
                    f"transformer_blocks = {num_layers}",
                    first=first,
                    last=last,
                    transformer_blocks=num_layers,
                )
            )
    elif rest_blocks < rest_stages or rest_blocks % rest_stages != 0:
        out.append(
            _violation(
                "blocks_per_middle_stage",
                "blocks_per_middle_stage = (transformer_blocks - first - last) / "
                "(p - fixed_stages), a positive integer",
                f"blocks_per_middle_stage = {rest_blocks} / {rest_stages} is not a positive "
                "integer",
                remaining_blocks=rest_blocks,
                remaining_stages=rest_stages,
            )
        )
    else:
        counts["middle"] = rest_blocks // rest_stages
    if v > 1:
        for where, n in counts.items():
            if n % v != 0:
                out.append(
                    _violation(
                        "blocks_per_virtual_chunk",
                        "blocks_per_virtual_chunk = stage_blocks / v",
                        f"blocks_per_virtual_chunk = {n} / {v} is not integral on the {where} "
                        "stage(s)",
                        stage_blocks=n,
                        v=v,
                    )
                )
    return out


# --------------------------------------------------------------------------------------------
# Block laws (tensor-parallel split of one transformer block)
# --------------------------------------------------------------------------------------------
def _block_laws(
    model: TransformerModelSpec, tensor: TensorParallel, *, replicated_kv: bool
) -> list[LawViolation]:
    """Shoeybi et al. 2019, Section 3: attention heads, MLP columns and vocabulary rows are
    partitioned over t ranks; Megatron asserts each split (``arguments.py``,
    ``transformer_config.py``). K/V heads: training splits them over t (Megatron-Core
    ``transformer/attention.py``: ``num_query_groups_per_partition =
    divide(num_query_groups, world_size)``, which asserts divisibility); serving with
    ``replicated_kv`` also takes t a multiple of the groups (each K/V head on t / g ranks)."""
    t = tensor.degree
    a = model.num_attention_heads
    g = model.num_query_groups
    out: list[LawViolation] = []
    if a % t != 0:
        out.append(
            _violation(
                "attention_heads_per_tensor_rank",
                "attention_heads_per_tensor_rank = num_attention_heads / t",
                f"attention_heads_per_tensor_rank = {a} / {t} is not integral",
                num_attention_heads=a,
                t=t,
            )
        )
    if g % t != 0 and not (replicated_kv and t % g == 0):
        formula, message = (
            (
                "num_query_groups mod t = 0 or t mod num_query_groups = 0",
                f"num_query_groups = {g} is neither a multiple nor a divisor of t = {t}",
            )
            if replicated_kv
            else (
                "num_query_groups mod t = 0",
                f"num_query_groups = {g} is not divisible by t = {t} (Megatron-Core splits the "
                "K/V heads over the TP ranks: attention.py divide(num_query_groups, t))",
            )
        )
        out.append(_violation("query_groups_vs_tensor", formula, message, num_query_groups=g, t=t))
    if a % g != 0:
        out.append(
            _violation(
                "heads_per_query_group",
                "heads_per_query_group = num_attention_heads / num_query_groups",
                f"heads_per_query_group = {a} / {g} is not integral",
                num_attention_heads=a,
                num_query_groups=g,
            )
        )
    f = model.ffn_hidden_size
    if f % t != 0:
        out.append(
            _violation(
                "ffn_per_tensor_rank",
                "ffn_per_tensor_rank = ffn_hidden_size / t",
                f"ffn_per_tensor_rank = {f} / {t} is not integral",
                ffn_hidden_size=f,
                t=t,
            )
        )
    h = model.hidden_size
    # kv_channels defaults to h // heads; only then must heads * kv_channels reproduce h exactly
    # (Megatron's bare assert). An explicit other kv_channels decouples the two.
    if model.kv_channels == h // a and h % a != 0:
        out.append(
            _violation(
                "hidden_per_head",
                "kv_channels = hidden_size / num_attention_heads (default kv_channels)",
                f"kv_channels = {h} / {a} is not integral",
                hidden_size=h,
                num_attention_heads=a,
            )
        )
    vocab = model.padded_vocab_size
    if vocab % t != 0:
        out.append(
            _violation(
                "vocab_per_tensor_rank",
                "vocab_per_tensor_rank = padded_vocab_size / t",
                f"vocab_per_tensor_rank = {vocab} / {t} is not integral",
                padded_vocab_size=vocab,
                t=t,
            )
        )
    return out


def _sequence_laws(
    tensor: TensorParallel, sequence: int, sequence_name: str, cp: int = 1
) -> list[LawViolation]:
    """Planner and Megatron rules of sequence parallelism; callers keep the Megatron ones only
    under the Megatron rule set. Under context parallelism a rank's t ranks split its s/cp
    tokens (``modern_parallelism.md`` section 1.6)."""
    t = tensor.degree
    out: list[LawViolation] = []
    match tensor.communication:
        case ReduceScatterAllGather():
            if sequence % (t * cp) != 0:
                by = f"({t} * {cp})" if cp > 1 else f"{t}"
                out.append(
                    _violation(
                        "local_sequence",
                        f"local_sequence = {sequence_name} / (t * cp) (RS+AG)"
                        if cp > 1
                        else f"local_sequence = {sequence_name} / t (RS+AG)",
                        f"local_sequence = {sequence} / {by} is not integral",
                        RuleSet.PLANNER,
                        **(
                            {sequence_name: sequence, "t": t, "cp": cp}
                            if cp > 1
                            else {sequence_name: sequence, "t": t}
                        ),
                    )
                )
            if t == 1:
                out.append(
                    _violation(
                        "sequence_parallel_needs_tensor",
                        "sequence_parallel => t > 1",
                        "sequence parallelism needs t > 1, got t = 1",
                        RuleSet.MEGATRON,
                        t=t,
                    )
                )
        case AllReduce():
            pass
        case _ as unreachable:
            assert_never(unreachable)
    return out


def _cross_entropy_laws(mapping: TransformerTrainingMappingSpec) -> list[LawViolation]:
    """``cross_entropy_te_fusion``: Megatron-LM refuses Transformer Engine's fused
    cross-entropy ("disabled due to stability issues", ``megatron/training/arguments.py``
    l.1697-1702 @d98e8a64); Megatron-Core, which Megatron-Bridge configures directly, only warns
    (``model_parallel_config.py`` l.536-543)."""
    match mapping.fusions.cross_entropy:
        case FusedCrossEntropy(impl=CrossEntropyFusionImpl.TE):
            return [
                law_violation(
                    Law.MEGATRON_CROSS_ENTROPY_TE_FUSION,
                    "cross_entropy_loss_fusion = true with cross_entropy_fusion_impl = te: "
                    "Megatron-LM refuses it ('Transformer Engine cross entropy loss fusion is "
                    "disabled due to stability issues', arguments.py l.1697-1702)",
                    cross_entropy_fusion_impl="te",
                )
            ]
        case FusedCrossEntropy() | UnfusedCrossEntropy():
            return []
        case _ as unreachable:
            assert_never(unreachable)


def _tp_comm_overlap_laws(
    tensor: TensorParallel, overlap: TpCommOverlap, sequence: int, micro_batch: int
) -> list[LawViolation]:
    """Megatron-LM / Transformer Engine start-up rules of ``--tp-comm-overlap``.

    - ``tp_comm_overlap_needs_sequence_parallel``: ``assert args.sequence_parallel``
      (``megatron/training/arguments.py`` l.1441-1442 @d98e8a64), after SP is switched off
      silently at t = 1 (l.1432-1439); the typed overlap lives inside RS+AG, so what is left to
      check is t > 1.
    - ``tp_comm_overlap_buffer_shape``: the userbuffer is ``[(seq_length * micro_batch) / cp,
      hidden]`` (``megatron/training/initialize.py`` l.217-226) and each rank's local tensor must
      fill a 1/t of it exactly (TE ``pytorch/csrc/extensions/comm_gemm_overlap.cpp`` l.345-349
      @d0067d0d), so ``(s * b) mod t == 0`` (cp = 1 here).
    """
    match overlap:
        case UserbufferOverlap():
            pass
        case NoTpCommOverlap():
            return []
        case _ as unreachable:
            assert_never(unreachable)
    t = tensor.degree
    out: list[LawViolation] = []
    if t == 1:
        out.append(
            _violation(
                "tp_comm_overlap_needs_sequence_parallel",
                Law.MEGATRON_TP_COMM_OVERLAP_NEEDS_SP.formula,
                "tp_comm_overlap needs sequence parallelism with t > 1 (Megatron-LM turns "
                "sequence parallelism off at t = 1, then asserts), got t = 1",
                RuleSet.MEGATRON,
                t=t,
            )
        )
    if (sequence * micro_batch) % t != 0:
        out.append(
            _violation(
                "tp_comm_overlap_buffer_shape",
                Law.MEGATRON_TP_COMM_OVERLAP_BUFFER.formula,
                f"the userbuffer of seq_length * micro_batch = {sequence} * {micro_batch} = "
                f"{sequence * micro_batch} rows does not split into t = {t} equal parts",
                RuleSet.MEGATRON,
                seq_length=sequence,
                micro_batch=micro_batch,
                t=t,
            )
        )
    return out


def _single_stage_laws(p: int) -> list[LawViolation]:
    if p == 1:
        return []
    return [
        _violation(
            "schedule_matches_pipeline",
            "SingleStage <=> p = 1",
            f"SingleStage needs p = 1, got p = {p}",
            p=p,
        )
    ]


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------
def _training_schedule_laws(p: int, pipeline: PipelineParallel) -> list[LawViolation]:
    schedule = pipeline.schedule
    match schedule:
        case SingleStage():
            return _single_stage_laws(p)
        case OneForwardOneBackward():
            if p == 1:
                return [
                    _violation(
                        "schedule_matches_pipeline",
                        "OneForwardOneBackward => p > 1",
                        "OneForwardOneBackward needs p > 1, got p = 1",
                        p=p,
                    )
                ]
        case InterleavedOneForwardOneBackward(virtual_stages=v):
            out: list[LawViolation] = []
            if p == 1:
                out.append(
                    _violation(
                        "schedule_matches_pipeline",
                        "InterleavedOneForwardOneBackward => p > 1",
                        "InterleavedOneForwardOneBackward needs p > 1, got p = 1",
                        p=p,
                    )
                )
            if v < 2:
                out.append(
                    _violation(
                        "interleaved_virtual_stages",
                        "InterleavedOneForwardOneBackward => v >= 2",
                        f"InterleavedOneForwardOneBackward needs v >= 2, got v = {v}",
                        v=v,
                    )
                )
            return out
        case ZeroBubbleH1():
            if p == 1:
                return [
                    _violation(
                        "schedule_matches_pipeline",
                        "ZeroBubbleH1 => p > 1",
                        "ZeroBubbleH1 needs p > 1, got p = 1",
                        p=p,
                    )
                ]
        case CombinedOneForwardOneBackward(virtual_stages=v):
            # p > 1 with v = 1 is the EP-overlap law's (ep_overlap_needs_virtual_pipeline)
            if p == 1 and v > 1:
                return [
                    _violation(
                        "schedule_matches_pipeline",
                        "CombinedOneForwardOneBackward with v > 1 => p > 1",
                        f"CombinedOneForwardOneBackward with v = {v} needs p > 1, got p = 1",
                        p=p,
                        v=v,
                    )
                ]
        case DualPipe() | DualPipeV():
            return []  # they need m: dualpipe_laws, from check_training
        case ForwardOnly():
            return [
                _violation(
                    "training_schedule",
                    "schedule in {SingleStage, OneForwardOneBackward, Interleaved}",
                    "ForwardOnly is an inference schedule, not a training schedule",
                )
            ]
        case _ as unreachable:
            assert_never(unreachable)
    return []


def dualpipe_laws(schedule: DualPipe | DualPipeV, p: int, m: int) -> list[LawViolation]:
    """deepseek-ai/DualPipe's assertions in ``step`` (``dualpipe.py`` / ``dualpipev.py``
    @3da1bbe): DualPipe needs an even number of ranks and ``num_chunks`` (microbatches) even and
    >= 2 p; DualPipeV ``num_chunks >= 2 p``. Both need p >= 2 (two ends to feed)."""
    out: list[LawViolation] = []
    name = str(schedule)
    if p < 2:
        out.append(
            _violation(
                "schedule_matches_pipeline", f"{name} => p >= 2", f"{name} needs p >= 2", p=p
            )
        )
    if isinstance(schedule, DualPipe) and p % 2 != 0:
        out.append(
            _violation(
                "dualpipe_even_ranks", "p mod 2 = 0", f"DualPipe needs an even p, got p = {p}", p=p
            )
        )
    if m < 2 * p:
        out.append(
            _violation(
                "dualpipe_microbatches",
                "m >= 2 p",
                f"{name} needs m >= 2 p = {2 * p} microbatches, got m = {m}",
                m=m,
                p=p,
            )
        )
    if isinstance(schedule, DualPipe) and m % 2 != 0:
        out.append(
            _violation(
                "dualpipe_even_microbatches",
                "m mod 2 = 0",
                f"DualPipe splits the microbatches in two directions: m = {m} is odd",
                m=m,
            )
        )
    return out


def interleaving_degree_ok(pipeline_degree: int, overlap_p2p_comm: bool) -> bool:
    """Megatron-LM runs the interleaved schedule only with p > 2, or p = 2 with P2P overlap
    (``schedules.md`` section 3; Megatron-LM issue #750)."""
    p = pipeline_degree
    return p > 2 or (p == 2 and overlap_p2p_comm)


def microbatch_group_in_bounds(pipeline_degree: int, group: int, microbatches: int) -> bool:
    """``p <= N <= m`` for the interleaved schedule's microbatch group N (``schedules.md`` 3)."""
    return pipeline_degree <= group <= microbatches


def microbatch_group_remainder_ok(pipeline_degree: int, group: int, microbatches: int) -> bool:
    """``m mod N = 0 or m mod N >= p``: a smaller last group stalls the schedule
    (``schedules.md`` section 3)."""
    remainder = microbatches % group
    return remainder == 0 or remainder >= pipeline_degree


def _megatron_interleaving_laws(
    pipeline: PipelineParallel, microbatches: int
) -> list[LawViolation]:
    """Megatron-LM's interleaved-schedule rules (``schedules.md`` section 3): p > 2 unless P2P
    overlap with p = 2 (Megatron-LM issue #750), p <= N <= m and (m mod N = 0 or m mod N >= p)."""
    p = pipeline.degree
    out: list[LawViolation] = []
    match pipeline.schedule:
        case CombinedOneForwardOneBackward(virtual_stages=1):
            pass  # no virtual pipeline: Megatron's no-pipelining combined path
        case (
            InterleavedOneForwardOneBackward(microbatch_group_size=group, overlap_p2p_comm=overlap)
            | CombinedOneForwardOneBackward(microbatch_group_size=group, overlap_p2p_comm=overlap)
        ):
            if not interleaving_degree_ok(p, overlap):
                out.append(
                    _violation(
                        "interleaving_pipeline_degree",
                        "interleaving => p > 2, or p = 2 with overlap_p2p_comm",
                        f"interleaving needs p > 2 (or p = 2 with overlap_p2p_comm), got p = {p}"
                        + (" with overlap_p2p_comm" if overlap else ""),
                        RuleSet.MEGATRON,
                        p=p,
                        overlap_p2p_comm=overlap,
                    )
                )
            n = p if group is None else group
            m = microbatches
            if not microbatch_group_in_bounds(p, n, m):
                out.append(
                    _violation(
                        "microbatch_group_bounds",
                        "p <= N <= m (N = microbatch_group_size_per_vp_stage, default p)",
                        f"p <= N <= m fails: {p} <= {n} <= {m}",
                        RuleSet.MEGATRON,
                        p=p,
                        N=n,
                        m=m,
                    )
                )
            if not microbatch_group_remainder_ok(p, n, m):
                out.append(
                    _violation(
                        "microbatch_group_remainder",
                        "m mod N = 0 or m mod N >= p",
                        f"m mod N = {m} mod {n} = {m % n} is neither 0 nor >= p = {p}",
                        RuleSet.MEGATRON,
                        m=m,
                        N=n,
                        p=p,
                    )
                )
        case ZeroBubbleH1():
            out.append(
                _violation(
                    "megatron_schedule_supported",
                    "schedule in {SingleStage, OneForwardOneBackward, Interleaved}",
                    "Megatron-LM has no ZB-H1 schedule (Qi et al. 2023 ship it in "
                    "sail-sg/zero-bubble-pipeline-parallelism, a fork)",
                    RuleSet.MEGATRON,
                )
            )
        case DualPipe() | DualPipeV():
            out.append(
                _violation(
                    "megatron_schedule_supported",
                    "schedule in {SingleStage, OneForwardOneBackward, Interleaved}",
                    f"Megatron-LM mainline has no {pipeline.schedule} schedule (DeepSeek ships "
                    "it as the standalone deepseek-ai/DualPipe module)",
                    RuleSet.MEGATRON,
                )
            )
        case SingleStage() | OneForwardOneBackward() | ForwardOnly():
            pass
        case _ as unreachable:
            assert_never(unreachable)
    return out


def _recompute_laws(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec
) -> list[LawViolation]:
    recompute = mapping.parallelism.recompute
    match recompute:
        case FullRecompute(num_layers=n):
            counts = stage_blocks(model.num_layers, mapping.parallelism.pipeline)
            bound = max(counts) if counts else model.num_layers // mapping.pipeline_degree
            if not 1 <= n <= bound:
                return [
                    _violation(
                        "recompute_num_layers",
                        "1 <= recompute_num_layers <= blocks_per_pipeline_stage",
                        f"recompute_num_layers = {n} is outside 1..{bound} "
                        "(blocks per pipeline stage)",
                        recompute_num_layers=n,
                        blocks_per_pipeline_stage=bound,
                    )
                ]
        case SelectiveRecompute(modules=modules):
            return recompute_module_laws(model, modules)
        case NoRecompute():
            pass
        case _ as unreachable:
            assert_never(unreachable)
    return []


def recompute_module_laws(
    model: TransformerModelSpec, modules: frozenset[RecomputeModule]
) -> list[LawViolation]:
    """A selective module needs the layer it recomputes: there is nothing to re-run otherwise,
    and a strategy that names one is refused rather than silently planned without it.
    Megatron-LM raises it for ``mla_up_proj`` ("only supported with multi_latent_attention",
    ``transformer_config.py`` recompute-module checks @d98e8a64) and runs the MoE ones as
    no-ops on a dense model."""
    missing: list[str] = []
    moe = model.moe
    for module in (RecomputeModule.MOE_ACT, RecomputeModule.MOE):
        if module in modules and moe is None:
            missing.append(f"{module.value} needs mixture-of-experts layers")
    if RecomputeModule.SHARED_EXPERTS in modules and (
        moe is None or moe.shared_expert_ffn_hidden_size == 0
    ):
        missing.append("shared_experts needs shared experts")
    if RecomputeModule.MLA_UP_PROJ in modules and not isinstance(
        model.self_attention, MultiLatentAttention
    ):
        missing.append(
            "mla_up_proj needs multi-latent attention (Megatron-LM: 'only supported with "
            "multi_latent_attention')"
        )
    if not missing:
        return []
    return [
        law_violation(
            Law.RECOMPUTE_MODULE_NEEDS_LAYER,
            f"recompute_modules: {'; '.join(missing)}; model {model.name!r} has none",
            modules=" ".join(sorted(m.value for m in modules)),
        )
    ]


def _optimizer_laws(mapping: TransformerTrainingMappingSpec) -> list[LawViolation]:
    data = mapping.parallelism.data
    sharding = data.optimizer_sharding
    match sharding:
        case NoOptimizerSharding():
            return []
        case DistributedOptimizer() | ShardedGradients() | ShardedParameters():
            if sharding.overlap_param_gather and not data.overlap_grad_reduce:
                return [
                    _violation(
                        "overlap_param_gather_needs_overlap_grad_reduce",
                        "overlap_param_gather => overlap_grad_reduce",
                        "overlap_param_gather needs overlap_grad_reduce",
                        RuleSet.MEGATRON,
                    )
                ]
            return []
        case _ as unreachable:
            assert_never(unreachable)


#: The widest head Transformer Engine's fused kernels take (FlashAttention-2 and cuDNN fused
#: attention: head dimension <= 256; ``transformer_engine/pytorch/attention`` backend filters).
FUSED_ATTENTION_MAX_HEAD_DIM = 256


def fused_attention_supported(model: TransformerModelSpec) -> bool:
    """Whether Transformer Engine's fused kernels run this model's attention: 16-bit (or fp8
    with bf16 attention) inputs and a head dimension of at most 256."""
    return model.datatype is not Datatype.FP32 and model.kv_channels <= FUSED_ATTENTION_MAX_HEAD_DIM


def _backend_feature_laws(
    model: TransformerModelSpec, backend: AttentionBackend
) -> list[LawViolation]:
    """``attention_backend_runs_window_and_sinks``: Megatron-Core's own ``DotProductAttention``
    (``local``) asserts "Sliding Window Attention is only supported by TEDotProductAttention!";
    ``flash`` leaves Transformer Engine only FlashAttention (Megatron sets NVTE_FUSED_ATTN and
    NVTE_UNFUSED_ATTN to 0), which runs no non-vanilla softmax (attention sinks), so TE finds
    no backend."""
    out: list[LawViolation] = []
    # the assert reads the config's window_size, whatever window_attn_skip_freq skips
    if model.window_keys is not None and backend is AttentionBackend.LOCAL:
        windowed = model.windowed_layers_in(0, model.num_layers)
        out.append(
            _violation(
                "attention_backend_runs_window_and_sinks",
                Law.MEGATRON_ATTENTION_BACKEND_WINDOW_SINKS.formula,
                f"attention_backend = local (Megatron-Core's DotProductAttention) asserts "
                f"window_size is None, and the model sets one (attention_window = "
                f"{model.attention_window}: {windowed} of {model.num_layers} layers windowed); "
                "use auto, fused, flash or unfused (Transformer Engine)",
                RuleSet.MEGATRON,
                attention_backend=backend.value,
                windowed_layers=windowed,
            )
        )
    if model.softmax_type is not SoftmaxType.VANILLA and backend is AttentionBackend.FLASH:
        out.append(
            _violation(
                "attention_backend_runs_window_and_sinks",
                Law.MEGATRON_ATTENTION_BACKEND_WINDOW_SINKS.formula,
                f"attention_backend = flash leaves Transformer Engine only FlashAttention, which "
                f"runs no softmax_type = {model.softmax_type} (attention sinks); use auto or "
                "fused (cuDNN)",
                RuleSet.MEGATRON,
                attention_backend=backend.value,
                softmax_type=model.softmax_type.value,
            )
        )
    return out


def _attention_laws(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec
) -> list[LawViolation]:
    attention = mapping.attention
    features = _backend_feature_laws(model, attention.backend)
    return features + _kernel_support_laws(model, attention)


def _kernel_support_laws(
    model: TransformerModelSpec, attention: AttentionKernel
) -> list[LawViolation]:
    match attention:
        case FusedAttention(backend=backend):
            if fused_attention_supported(model):
                return []
            return [
                _violation(
                    "fused_attention_support",
                    Law.MEGATRON_FUSED_ATTENTION_SUPPORT.formula,
                    f"attention_backend = {backend} needs a fused kernel, which takes fp16/bf16 "
                    f"inputs and kv_channels <= {FUSED_ATTENTION_MAX_HEAD_DIM} (got "
                    f"{model.datatype}, kv_channels = {model.kv_channels}); Transformer Engine's "
                    "auto backend would run unfused attention instead: set "
                    "attention_backend = unfused to plan that",
                    RuleSet.MEGATRON,
                    datatype=model.datatype.value,
                    kv_channels=model.kv_channels,
                )
            ]
        case UnfusedAttention():
            return []
        case _ as unreachable:
            assert_never(unreachable)


def local_kv_heads(model: TransformerModelSpec, t: int) -> int:
    """KV heads on one TP rank: groups / t, or 1 where t > groups replicates each group
    (Megatron-Core ``num_query_groups_per_partition``)."""
    return max(1, model.num_query_groups // t)


def _context_laws(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec
) -> list[LawViolation]:
    """Megatron-LM / Transformer Engine start-up rules of context parallelism
    (``shared/reference/modern_parallelism.md`` section 1.7):

    - ``cp_sequence_split``: ``seq_length % (2 * cp) == 0`` (``megatron/training/arguments.py``
      l.1335-1338; the load-balanced split needs 2cp equal chunks, so it is a planner law too);
    - ``cp_hierarchical_sizes``: the product of ``--hierarchical-context-parallel-sizes`` is cp
      (arguments.py l.580-582, ``parallel_state.py`` l.1127-1128);
    - ``cp_a2a_heads``: a2a needs the local query and KV heads divisible by its group (TE
      ``context_parallel.py`` l.4242-4249), for a2a+p2p by the a2a level;
    - ``cp_needs_fused_attention``: TE runs context parallelism only in its flash / cuDNN fused
      backends (the unfused ``UnfusedDotProductAttention`` has no cp path);
    - ``cp_sliding_window_comm_type``: no sliding window with the p2p ring or a2a+p2p (TE
      ``context_parallel.py`` l.5053-5060, "Context parallelism does not support sliding window
      attention with cp_comm_type=...");
    - ``cp_softmax_type_needs_a2a``: a non-vanilla softmax (attention sinks, GPT-OSS) only with
      a2a (TE l.5062-5067; shared reference section 1.7).
    """
    context = mapping.parallelism.context
    cp = context.degree
    if cp == 1:
        return []
    out: list[LawViolation] = []
    s = model.seq_length
    if s % (2 * cp) != 0:
        out.append(
            _violation(
                "cp_sequence_split",
                Law.CP_SEQUENCE_SPLIT.formula,
                f"seq_length = {s} is not a multiple of 2 * cp = {2 * cp} (Megatron-LM: "
                '"seq-length should be a multiple of 2 * context-parallel-size")',
                seq_length=s,
                cp=cp,
            )
        )
    a2a_group: int | None = None
    communication = context.communication
    match communication:
        case RingExchange() | AllGatherKV():
            pass
        case HeadAllToAll():
            a2a_group = cp
        case HierarchicalAllToAllRing(a2a_size=a2a, p2p_size=ring):
            a2a_group = a2a
            if a2a * ring != cp:
                out.append(
                    _violation(
                        "cp_hierarchical_sizes",
                        Law.CP_HIERARCHICAL_SIZES.formula,
                        f"hierarchical_context_parallel_sizes = {a2a} {ring}: their product "
                        f"{a2a * ring} is not cp = {cp}",
                        a2a_size=a2a,
                        p2p_size=ring,
                        cp=cp,
                    )
                )
        case _ as unreachable:
            assert_never(unreachable)
    t = mapping.tensor_degree
    if a2a_group is not None and a2a_group > 1:
        q_heads = model.num_attention_heads // t
        kv_heads = local_kv_heads(model, t)
        if q_heads % a2a_group != 0 or kv_heads % a2a_group != 0:
            out.append(
                _violation(
                    "cp_a2a_heads",
                    Law.MEGATRON_CP_A2A_HEADS.formula,
                    f"cp_comm_type = {communication} splits heads over {a2a_group} ranks, but a "
                    f"TP rank holds {q_heads} query heads and {kv_heads} KV heads "
                    f"(num_attention_heads = {model.num_attention_heads}, num_query_groups = "
                    f"{model.num_query_groups}, t = {t}); use p2p or all_gather",
                    RuleSet.MEGATRON,
                    local_query_heads=q_heads,
                    local_kv_heads=kv_heads,
                    a2a_group=a2a_group,
                )
            )
    ring = isinstance(communication, RingExchange | HierarchicalAllToAllRing)
    windowed = model.windowed_layers_in(0, model.num_layers)
    if windowed and ring:
        out.append(
            _violation(
                "cp_sliding_window_comm_type",
                Law.MEGATRON_CP_SLIDING_WINDOW.formula,
                f"cp_comm_type = {communication} passes K/V around a ring, which Transformer "
                f"Engine does not run with sliding-window attention ({windowed} of "
                f"{model.num_layers} layers keep a window of {model.window_keys} keys: "
                f"attention_window = {model.attention_window}); use a2a or all_gather",
                RuleSet.MEGATRON,
                cp=cp,
                cp_comm_type=str(communication),
                windowed_layers=windowed,
            )
        )
    if model.softmax_type is not SoftmaxType.VANILLA and not isinstance(
        communication, HeadAllToAll
    ):
        out.append(
            _violation(
                "cp_softmax_type_needs_a2a",
                Law.MEGATRON_CP_SOFTMAX_TYPE.formula,
                f"softmax_type = {model.softmax_type} (attention sinks) runs under context "
                f"parallelism only with cp_comm_type = a2a (Transformer Engine), got "
                f"{communication}",
                RuleSet.MEGATRON,
                cp=cp,
                cp_comm_type=str(communication),
                softmax_type=model.softmax_type.value,
            )
        )
    match mapping.attention:
        case FusedAttention():
            pass
        case UnfusedAttention(backend=backend):
            out.append(
                _violation(
                    "cp_needs_fused_attention",
                    Law.MEGATRON_CP_NEEDS_FUSED_ATTENTION.formula,
                    f"context_parallel_size = {cp} needs Transformer Engine's fused attention, "
                    f"but attention_backend = {backend} runs it unfused",
                    RuleSet.MEGATRON,
                    cp=cp,
                    attention_backend=backend.value,
                )
            )
        case _ as unreachable_attention:
            assert_never(unreachable_attention)
    return out


def check_training(
    model: TransformerModelSpec,
    mapping: TransformerTrainingMappingSpec,
    *,
    megatron: bool = True,
    accelerator: AcceleratorSupport | None = None,
) -> tuple[LawViolation, ...]:
    """Every violated law of a training strategy, planner laws first; ``()`` when all hold.

    With ``megatron=False`` only the planner's laws are checked. ``accelerator`` (the system's,
    ``AcceleratorSpec.support``) adds the law that the precision recipe runs on it
    (:mod:`blueprinting.mapping.precision_laws`). The expert grid's laws live in
    :mod:`blueprinting.mapping.expert_laws`.
    """
    from blueprinting.mapping.cuda_graph_laws import cuda_graph_laws
    from blueprinting.mapping.expert_laws import expert_laws
    from blueprinting.mapping.offload_laws import offload_laws
    from blueprinting.mapping.precision_laws import precision_laws

    p = mapping.pipeline_degree
    d = mapping.data_degree
    v = mapping.virtual_stages
    gbs = mapping.batch.global_batch_size
    mbs = mapping.batch.micro_batch_size
    pipeline = mapping.parallelism.pipeline
    out: list[LawViolation] = []

    if gbs % d != 0:
        out.append(
            _violation(
                "local_batch",
                "local_batch = global_batch / d",
                f"local_batch = {gbs} / {d} is not integral",
                global_batch=gbs,
                d=d,
            )
        )
    if gbs % (d * mbs) != 0:
        out.append(
            _violation(
                "microbatch_count",
                "microbatch_count = global_batch / (d * microbatch_size)",
                f"microbatch_count = {gbs} / ({d} * {mbs}) is not integral",
                global_batch=gbs,
                d=d,
                microbatch_size=mbs,
            )
        )
    out.extend(_layout_laws(model.num_layers, pipeline, v, model.mtp_num_layers))
    out.extend(_training_schedule_laws(p, pipeline))
    if isinstance(pipeline.schedule, DualPipe | DualPipeV):
        out.extend(dualpipe_laws(pipeline.schedule, p, mapping.microbatch_count))
    out.extend(_block_laws(model, mapping.parallelism.tensor, replicated_kv=False))
    out.extend(_recompute_laws(model, mapping))

    megatron_out = _sequence_laws(
        mapping.parallelism.tensor, model.seq_length, "sequence_length", mapping.context_degree
    )
    megatron_out += _context_laws(model, mapping)
    out.extend(x for x in megatron_out if x.ruleset is RuleSet.PLANNER)
    precision_out = precision_laws(model, mapping, accelerator, megatron=megatron)
    out.extend(x for x in precision_out if x.ruleset is RuleSet.PLANNER)
    expert_out = expert_laws(model, mapping)
    out.extend(x for x in expert_out if x.ruleset is RuleSet.PLANNER)
    graph_out = cuda_graph_laws(model, mapping)
    out.extend(x for x in graph_out if x.ruleset is RuleSet.PLANNER)
    if not megatron:
        return tuple(out)

    out.extend(x for x in megatron_out if x.ruleset is RuleSet.MEGATRON)
    microbatches = mapping.microbatch_count
    if microbatches < 1:
        out.append(
            _violation(
                "num_microbatches_positive",
                "num_microbatches = global_batch // (d * microbatch_size) >= 1",
                f"num_microbatches = {gbs} // ({d} * {mbs}) = {microbatches} < 1",
                RuleSet.MEGATRON,
                global_batch=gbs,
                d=d,
                microbatch_size=mbs,
            )
        )
    out.extend(_megatron_interleaving_laws(pipeline, microbatches))
    out.extend(_optimizer_laws(mapping))
    out.extend(_attention_laws(model, mapping))
    out.extend(_cross_entropy_laws(mapping))
    out.extend(
        _tp_comm_overlap_laws(
            mapping.parallelism.tensor, mapping.tp_comm_overlap, model.seq_length, mbs
        )
    )
    out.extend(x for x in precision_out if x.ruleset is RuleSet.MEGATRON)
    out.extend(x for x in expert_out if x.ruleset is RuleSet.MEGATRON)
    out.extend(x for x in graph_out if x.ruleset is RuleSet.MEGATRON)
    out.extend(offload_laws(model, mapping))
    return tuple(out)


def validate_training(
    model: TransformerModelSpec,
    mapping: TransformerTrainingMappingSpec,
    *,
    megatron: bool = True,
    accelerator: AcceleratorSupport | None = None,
) -> None:
    """Raise :class:`InvalidStrategyError` with every violated law, or return."""
    violations = check_training(model, mapping, megatron=megatron, accelerator=accelerator)
    if violations:
        raise InvalidStrategyError(violations, subject=f"{model.name}: {mapping}")


# --------------------------------------------------------------------------------------------
# Inference
# --------------------------------------------------------------------------------------------
def _inference_schedule_laws(p: int, pipeline: PipelineParallel) -> list[LawViolation]:
    schedule = pipeline.schedule
    match schedule:
        case SingleStage():
            return _single_stage_laws(p)
        case ForwardOnly():
            if p == 1:
                return [
                    _violation(
                        "schedule_matches_pipeline",
                        "ForwardOnly => p > 1",
                        "ForwardOnly needs p > 1, got p = 1",
                        p=p,
                    )
                ]
        case (
            OneForwardOneBackward()
            | InterleavedOneForwardOneBackward()
            | CombinedOneForwardOneBackward()
            | ZeroBubbleH1()
            | DualPipe()
            | DualPipeV()
        ):
            return [
                _violation(
                    "inference_schedule",
                    "schedule in {SingleStage, ForwardOnly}",
                    f"{type(schedule).__name__} is a training schedule, not an inference one",
                )
            ]
        case _ as unreachable:
            assert_never(unreachable)
    return []


def check_inference(
    model: TransformerModelSpec,
    mapping: TransformerInferenceMappingSpec,
    *,
    megatron: bool = True,
) -> tuple[LawViolation, ...]:
    """Every violated law of an inference strategy; ``()`` when all hold.

    Laws: the block's TP split, blocks per pipeline stage, the schedule (SingleStage iff p = 1,
    ForwardOnly otherwise), ``prompt_length mod t = 0`` with RS+AG, for learned absolute
    positions ``prompt_length + generated_tokens <= seq_length`` (there is no position beyond),
    and expert parallelism's (:mod:`blueprinting.mapping.serving_laws`).
    """
    p = mapping.pipeline_degree
    pipeline = mapping.parallelism.pipeline
    workload = mapping.workload
    out: list[LawViolation] = []
    # serving loads no MTP depth and takes none of the training keys the hints name
    out.extend(_layout_laws(model.num_layers, pipeline, 1, hints=False))
    out.extend(_inference_schedule_laws(p, pipeline))
    out.extend(_block_laws(model, mapping.parallelism.tensor, replicated_kv=True))
    out.extend(serving_expert_laws(model, mapping))
    context = workload.prompt_length + workload.generated_tokens
    if model.position_embedding is PositionEmbedding.LEARNED_ABSOLUTE and (
        context > model.seq_length
    ):
        out.append(
            _violation(
                "context_length",
                "prompt_length + generated_tokens <= seq_length (learned positions)",
                f"prompt_length + generated_tokens = {workload.prompt_length} + "
                f"{workload.generated_tokens} = {context} > seq_length = {model.seq_length}",
                prompt_length=workload.prompt_length,
                generated_tokens=workload.generated_tokens,
                seq_length=model.seq_length,
            )
        )
    sequence = _sequence_laws(mapping.parallelism.tensor, workload.prompt_length, "prompt_length")
    out.extend(x for x in sequence if x.ruleset is RuleSet.PLANNER)
    if megatron:
        out.extend(x for x in sequence if x.ruleset is RuleSet.MEGATRON)
    return tuple(out)


def validate_inference(
    model: TransformerModelSpec,
    mapping: TransformerInferenceMappingSpec,
    *,
    megatron: bool = True,
) -> None:
    """Raise :class:`InvalidStrategyError` with every violated law, or return."""
    violations = check_inference(model, mapping, megatron=megatron)
    if violations:
        raise InvalidStrategyError(violations, subject=f"{model.name}: {mapping}")
