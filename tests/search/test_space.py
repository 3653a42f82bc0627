"""The vectorized enumeration against a brute-force scalar one, and the pinned GPT-3 count."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from math import gcd

import numpy as np
import pytest

from blueprinting.errors import ConfigError
from blueprinting.mapping.law_names import EXPERT_LAWS, MEGATRON_LAWS, PLANNER_LAWS, Law
from blueprinting.mapping.laws import check_training
from blueprinting.mapping.model import Datatype, TransformerModelSpec
from blueprinting.mapping.pipeline_layout import BALANCED_LAYOUT_MAX_VIRTUAL, balanced_layout
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import (
    AllGatherDispatcher,
    AllReduce,
    AllToAllDispatcher,
    DistributedOptimizer,
    FlexDispatcher,
    FullRecompute,
    InterleavedOneForwardOneBackward,
    NoOptimizerSharding,
    OneForwardOneBackward,
    RecomputeMethod,
    ReduceScatterAllGather,
    SelectiveRecompute,
    ShardedParameters,
    SingleStage,
    TokenDispatcher,
    UserbufferOverlap,
    training_schedule,
)
from blueprinting.search.space import (
    RECOMPUTE_CODES,
    SHARDING_CODES,
    CandidateTable,
    MicrobatchGroupPolicy,
    PipelineLayouts,
    RecomputeVariant,
    SearchSpace,
    ShardingVariant,
    candidate_to_spec,
    enumerate_strategies,
)

GPT3_175B = TransformerModelSpec(
    name="gpt3-175b",
    num_layers=96,
    hidden_size=12288,
    num_attention_heads=96,
    num_query_groups=96,
    kv_channels=128,
    ffn_hidden_size=49152,
    seq_length=2048,
    vocab_size=51200,
    padded_vocab_size=51200,
)

# Small enough for nested loops, odd enough that every law fires: 12 blocks, 6 heads in 3 query
# groups (t = 6 passes the groups law only as a multiple of 3), ffn 36 and padded vocab 60 (t = 8
# and 16 fail), sequence 30 (t = 4, 8, 16 fail sequence parallelism).
TINY = TransformerModelSpec(
    name="tiny",
    num_layers=12,
    hidden_size=24,
    num_attention_heads=6,
    num_query_groups=3,
    kv_channels=4,
    ffn_hidden_size=36,
    seq_length=30,
    vocab_size=50,
    padded_vocab_size=60,
)

Row = tuple[int, ...]


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _brute_force(
    model: TransformerModelSpec, space: SearchSpace
) -> tuple[int, Counter[Law], set[Row]]:
    """Nested loops over the documented generation rules, every law recomputed by hand."""
    big_b = space.global_batch_size
    big_l = model.num_layers
    enumerated = 0
    rejections: Counter[Law] = Counter()
    valid: set[Row] = set()
    for n in space.gpu_counts:
        tp_limit = n if space.allow_cross_node_tp else gcd(n, space.gpus_per_node)
        for t in _divisors(tp_limit):
            for p in _divisors(n // t):
                d = n // (t * p)
                v_options = set(_divisors(big_l))
                if space.pipeline_layouts is PipelineLayouts.BALANCED:
                    v_options |= set(range(1, BALANCED_LAYOUT_MAX_VIRTUAL + 1))
                for v in sorted(v_options):
                    # a balanced layout where the blocks do not split: the even-split laws give
                    # way to it, and the recompute bound is its largest stage
                    layout = (
                        balanced_layout(big_l, model.mtp_num_layers, p * v)
                        if space.pipeline_layouts is PipelineLayouts.BALANCED
                        and big_l % (p * v)
                        and v <= BALANCED_LAYOUT_MAX_VIRTUAL
                        else None
                    )
                    bound = big_l // p
                    if layout is not None:
                        bound = max(
                            sum(s.decoder_layers for s in layout.stages[r::p]) for r in range(p)
                        )
                    for b in _divisors(big_b):
                        if space.max_microbatch_size is not None and b > space.max_microbatch_size:
                            continue
                        m = big_b // (d * b)
                        sp_options = [
                            (sp, ub)
                            for sp in space.sequence_parallel
                            for ub in (space.tp_comm_overlap if sp and t > 1 else (False,))
                        ]
                        for sp, ub in sp_options:
                            for rec in space.recompute:
                                layer_options = space.recompute_num_layers if rec.is_full else (0,)
                                for layers in layer_options:
                                    p2ps = space.overlap_p2p_comm if v > 1 else (False,)
                                    groups = [0]
                                    if (
                                        v > 1
                                        and space.microbatch_group
                                        is MicrobatchGroupPolicy.WHERE_IT_MATTERS
                                        and m > p
                                        and m % p != 0
                                    ):
                                        groups.append(m)
                                    for p2p in p2ps:
                                        for g in groups:
                                            frees: list[tuple[ShardingVariant, bool, bool]] = []
                                            if d == 1:
                                                frees = [(ShardingVariant.NO_SHARD, False, False)]
                                            else:
                                                for sh in space.sharding:
                                                    gathers = (
                                                        (False,)
                                                        if sh is ShardingVariant.NO_SHARD
                                                        else space.overlap_param_gather
                                                    )
                                                    frees += [
                                                        (sh, ga, gr)
                                                        for ga in gathers
                                                        for gr in space.overlap_grad_reduce
                                                    ]
                                            broken: list[Law] = []
                                            if t * p * d != n:
                                                broken.append(Law.WORLD_SIZE)
                                            if big_b % d:
                                                broken.append(Law.LOCAL_BATCH)
                                            if big_b % (d * b):
                                                broken.append(Law.MICROBATCH_COUNT)
                                            if big_l % p and layout is None:
                                                broken.append(Law.BLOCKS_PER_PIPELINE_STAGE)
                                            if big_l % (p * v) and layout is None:
                                                broken.append(Law.BLOCKS_PER_VIRTUAL_CHUNK)
                                            if sp and model.seq_length % t:
                                                broken.append(Law.SEQUENCE_PARALLEL_DIVISIBILITY)
                                            if model.num_attention_heads % t:
                                                broken.append(Law.ATTENTION_HEADS_DIVISIBILITY)
                                            qg = model.num_query_groups
                                            # training splits the K/V heads over t
                                            if qg % t:
                                                broken.append(Law.QUERY_GROUPS_DIVISIBILITY)
                                            if model.ffn_hidden_size % t:
                                                broken.append(Law.FFN_DIVISIBILITY)
                                            if model.padded_vocab_size % t:
                                                broken.append(Law.VOCAB_DIVISIBILITY)
                                            if v > 1 and p == 1:
                                                broken.append(Law.SCHEDULE_MATCHES_PIPELINE)
                                            if rec.is_full and not 1 <= layers <= bound:
                                                broken.append(Law.RECOMPUTE_NUM_LAYERS_RANGE)
                                            if space.megatron_rules:
                                                if v > 1 and not (p > 2 or (p == 2 and p2p)):
                                                    broken.append(
                                                        Law.MEGATRON_INTERLEAVING_MIN_PIPELINE
                                                    )
                                                gg = g or p
                                                if v > 1 and not (
                                                    p <= gg <= m and (m % gg == 0 or m % gg >= p)
                                                ):
                                                    broken.append(Law.MEGATRON_MICROBATCH_GROUP)
                                                if sp and t == 1:
                                                    broken.append(
                                                        Law.MEGATRON_SEQUENCE_PARALLEL_NEEDS_TP
                                                    )
                                                if ub and (not sp or t == 1):
                                                    broken.append(
                                                        Law.MEGATRON_TP_COMM_OVERLAP_NEEDS_SP
                                                    )
                                                if ub and (model.seq_length * b) % t:
                                                    broken.append(
                                                        Law.MEGATRON_TP_COMM_OVERLAP_BUFFER
                                                    )
                                            lawful_frees = []
                                            for sh, ga, gr in frees:
                                                enumerated += 1
                                                also = list(broken)
                                                if space.megatron_rules and ga and not gr:
                                                    also.append(Law.MEGATRON_OVERLAP_PARAM_GATHER)
                                                for law in also:
                                                    rejections[law] += 1
                                                if not also:
                                                    lawful_frees.append((sh, ga, gr))
                                            if broken:
                                                continue
                                            core: Row = (
                                                n,
                                                t,
                                                p,
                                                d,
                                                v,
                                                b,
                                                int(sp),
                                                RECOMPUTE_CODES.index(rec),
                                                layers,
                                            )
                                            core += (int(p2p), g, int(ub))
                                            for sh, ga, gr in lawful_frees:
                                                valid.add(
                                                    (
                                                        *core,
                                                        SHARDING_CODES.index(sh),
                                                        int(ga),
                                                        int(gr),
                                                    )
                                                )
    return enumerated, rejections, valid


def _rows(table: CandidateTable) -> list[Row]:
    columns = (
        table.num_gpus,
        table.tensor,
        table.pipeline,
        table.data,
        table.virtual_stages,
        table.micro_batch,
        table.sequence_parallel,
        table.recompute,
        table.recompute_num_layers,
        table.overlap_p2p_comm,
        table.microbatch_group,
        table.tp_comm_overlap,
        table.sharding,
        table.overlap_param_gather,
        table.overlap_grad_reduce,
    )
    return [tuple(int(x) for x in row) for row in zip(*columns, strict=True)]


TINY_SPACES = [
    SearchSpace(
        gpu_counts=(8, 12),
        global_batch_size=24,
        gpus_per_node=4,
        recompute=tuple(RecomputeVariant),
        recompute_num_layers=(1, 2, 5),
    ),
    SearchSpace(
        gpu_counts=(12,),
        global_batch_size=36,
        gpus_per_node=8,
        allow_cross_node_tp=True,
        megatron_rules=False,
        max_microbatch_size=4,
        sharding=(ShardingVariant.OPTIM, ShardingVariant.OPTIM_GRADS_PARAMS),
        overlap_grad_reduce=(True,),
        microbatch_group=MicrobatchGroupPolicy.DEFAULT,
    ),
    SearchSpace(
        gpu_counts=(6, 16),
        global_batch_size=40,
        allow_cross_node_tp=True,
        sequence_parallel=(True,),
        recompute=(RecomputeVariant.FULL_BLOCK,),
        recompute_num_layers=(3, 6),
        overlap_p2p_comm=(True,),
    ),
    # TP comm overlap on the sequence-parallel rows with t > 1: t = 3 and 6 pass, t = 4 and 12
    # break local_sequence (30 mod t) and, at odd b, the userbuffer shape ((30 * b) mod t).
    SearchSpace(
        gpu_counts=(12,),
        global_batch_size=24,
        gpus_per_node=12,
        recompute=(RecomputeVariant.NONE,),
        tp_comm_overlap=(False, True),
    ),
    # balanced layouts: 12 blocks over p v = 5, 7, 8, 9, 10, ... virtual stages (v up to 8),
    # the recompute bound the layout's largest stage
    SearchSpace(
        gpu_counts=(8, 10),
        global_batch_size=20,
        gpus_per_node=2,
        recompute=(RecomputeVariant.NONE, RecomputeVariant.FULL_UNIFORM),
        recompute_num_layers=(1, 3, 4),
        pipeline_layouts=PipelineLayouts.BALANCED,
    ),
]


@pytest.mark.parametrize("space", TINY_SPACES)
def test_vectorized_matches_brute_force(space: SearchSpace) -> None:
    enumerated, rejections, valid = _brute_force(TINY, space)
    result = enumerate_strategies(TINY, space)
    rows = _rows(result.table)
    assert len(rows) == len(set(rows)), "the enumeration produced duplicate candidates"
    assert set(rows) == valid
    assert result.report.candidates_enumerated == enumerated
    assert result.report.candidates_valid == len(valid)
    laws = PLANNER_LAWS + MEGATRON_LAWS if space.megatron_rules else PLANNER_LAWS
    laws = tuple(law for law in laws if law.searched)
    assert result.report.rejections == tuple((law, rejections[law]) for law in laws)


def test_tiny_spaces_exercise_every_law() -> None:
    fired: set[Law] = set()
    for space in TINY_SPACES:
        _, rejections, valid = _brute_force(TINY, space)
        fired |= {law for law, count in rejections.items() if count}
        assert valid
    # world_size holds by construction (p runs over divisors of N/t); the fused-attention rule
    # reads only the model (test_an_fp32_model_breaks_the_fused_attention_rule_everywhere).
    # tp_comm_overlap_needs_sequence_parallel cannot fire: the overlap is planned only on
    # sequence-parallel rows with t > 1 (test_tp_comm_overlap_rows_are_sequence_parallel).
    # The tiny spaces search no context parallelism: its laws are exercised by
    # test_context_parallel_candidates_are_lawful_and_complete.
    searched = {law for law in Law if law.searched}
    cp_laws = {
        Law.CP_SEQUENCE_SPLIT,
        Law.CP_HIERARCHICAL_SIZES,
        Law.MEGATRON_CP_A2A_HEADS,
        Law.MEGATRON_CP_NEEDS_FUSED_ATTENTION,
        # the tiny model has neither windows nor sinks:
        # test_windowed_sink_model_searches_cp_only_where_te_runs_it
        Law.MEGATRON_CP_SLIDING_WINDOW,
        Law.MEGATRON_CP_SOFTMAX_TYPE,
    }
    # The space's selective rows recompute Megatron's default core_attn, which every model
    # has: recompute_module_needs_its_layer cannot fire (test_moe_recompute.py checks it).
    # tp_comm_overlap_quantizer reads the recipe, which the tiny spaces keep at the base
    # precision: test_userbuffers_refuse_nvfp4_and_blockwise exercises it.
    never = {
        Law.WORLD_SIZE,
        Law.MEGATRON_FUSED_ATTENTION_SUPPORT,
        # the search plans the auto backend, which runs windows and sinks
        Law.MEGATRON_ATTENTION_BACKEND_WINDOW_SINKS,
        Law.MEGATRON_TP_COMM_OVERLAP_NEEDS_SP,
        Law.RECOMPUTE_MODULE_NEEDS_LAYER,
        Law.MEGATRON_TP_COMM_OVERLAP_QUANTIZER,
    }
    # the tiny model is dense: the expert laws are exercised by
    # test_moe_space_exercises_the_expert_laws
    assert fired == searched - never - cp_laws - EXPERT_LAWS
    assert Law.MEGATRON_TP_COMM_OVERLAP_BUFFER in fired


def test_context_parallel_candidates_are_lawful_and_complete() -> None:
    """With cp searched, every lawful row passes the scalar checker, and every (t, cp, comm,
    p) the scalar checker accepts at b = 1, v = 1 (no sp, no recompute) is enumerated; a2a
    rows whose local heads cp does not divide and cp degrees not dividing s / 2 are rejected
    under their law names."""
    from blueprinting.mapping.laws import check_training
    from blueprinting.mapping.transformer import (
        ContextParallel,
        CpCommType,
        TransformerTrainingMappingSpec,
        single_level_communication,
    )
    from blueprinting.search.space import CP_COMM_CODES

    space = SearchSpace(
        gpu_counts=(24,),
        global_batch_size=6,
        max_microbatch_size=1,
        sequence_parallel=(False,),
        recompute=(RecomputeVariant.NONE,),
        context_parallel=None,
        cp_comm_types=(CpCommType.P2P, CpCommType.A2A),
    )
    result = enumerate_strategies(TINY, space)
    table = result.table
    seen: set[tuple[int, int, int, int]] = set()
    for i in range(len(table)):
        spec = candidate_to_spec(table, i, TINY)
        assert check_training(spec.model, spec.mapping) == (), spec.mapping
        if table.virtual_stages[i] == 1:
            seen.add(
                (
                    int(table.tensor[i]),
                    int(table.context[i]),
                    int(table.cp_comm[i]),
                    int(table.pipeline[i]),
                )
            )
    expected: set[tuple[int, int, int, int]] = set()
    base = candidate_to_spec(table, 0, TINY)
    for t in (1, 2, 4, 8):  # t divides gcd(24, 8) = 8 (a TP group stays in a node)
        for cp in (1, 3, 5):  # s = 30: 2cp | 30 only for cp in {1, 3, 5}
            for kind in (CpCommType.P2P, CpCommType.A2A) if cp > 1 else (CpCommType.P2P,):
                for p in (1, 2, 3, 4, 6, 12):
                    if 24 % (t * cp * p):
                        continue
                    par = base.mapping.parallelism
                    d = 24 // (t * cp * p)
                    mapping = TransformerTrainingMappingSpec(
                        parallelism=dataclasses.replace(
                            par,
                            tensor=dataclasses.replace(par.tensor, degree=t),
                            pipeline=dataclasses.replace(
                                par.pipeline, degree=p, schedule=training_schedule(p, 1)
                            ),
                            data=dataclasses.replace(par.data, degree=d),
                            context=ContextParallel(
                                degree=cp, communication=single_level_communication(kind)
                            ),
                        ),
                        batch=base.mapping.batch,
                    )
                    if check_training(TINY, mapping) == ():
                        expected.add((t, cp, CP_COMM_CODES.index(kind), p))
    assert seen == expected
    assert any(cp > 1 for _, cp, _, _ in seen)
    assert result.report.rejected(Law.MEGATRON_CP_A2A_HEADS) > 0
    assert result.report.rejected(Law.CP_SEQUENCE_SPLIT) == 0  # never generated


def test_an_fp32_model_breaks_the_fused_attention_rule_everywhere() -> None:
    """The search plans Megatron's default (fused) attention, which Transformer Engine runs only
    on 16-bit inputs: every candidate of an fp32 model breaks that rule, none of a bf16 one."""
    space = TINY_SPACES[0]
    for datatype, expected_all in ((Datatype.FP32, True), (Datatype.BF16, False)):
        model = dataclasses.replace(TINY, datatype=datatype)
        report = enumerate_strategies(model, space).report
        rejected = report.rejected(Law.MEGATRON_FUSED_ATTENTION_SUPPORT)
        assert report.candidates_enumerated > 0
        assert rejected == (report.candidates_enumerated if expected_all else 0)
        assert (report.candidates_valid == 0) is expected_all


def _recount_gpt3_175b() -> tuple[int, int, int, int, int]:
    """A second count of the default space for GPT-3 175B (L = 96, 96 heads, s = 2048, ffn
    49152, V = 51200) on N = 1024 GPUs of 8 per node with B = 1536, by the generation rules of
    the space.py module docstring and the Law formulas of mapping/law_names.py, specialised by
    hand: t | 8 also divides the heads, ffn, vocabulary and sequence, so the TP divisibility laws
    never fire, and the one full recompute variant is uniform with num_layers = 1. Core rows are
    counted once and weighted by their free options: 14 when d > 1 (no_shard + 3 sharded x 2
    param-gather overlaps, x 2 grad-reduce overlaps), of which Megatron accepts 11 (not the 3
    sharded ones with overlap_param_gather but not overlap_grad_reduce); 1 when d = 1.

    Returns (enumerated, G = m candidates, core rows with d > 1, lawful core rows, valid)."""
    n, big_b, big_l = 1024, 1536, 96
    enumerated = extra_group = core_d = lawful_core = valid = 0
    pairs = [(t, p) for t in (1, 2, 4, 8) for p in range(1, n // t + 1) if (n // t) % p == 0]
    virtual = [v for v in range(1, big_l + 1) if big_l % v == 0]
    micro = [b for b in range(1, big_b + 1) if big_b % b == 0]
    for (t, p), v, b in itertools.product(pairs, virtual, micro):
        d = n // (t * p)
        m = big_b // (d * b)
        # G = 0 is Megatron's default (p); G = m is added where it matters.
        groups = (0, m) if v > 1 and m > p and m % p else (0,)
        p2ps = (False, True) if v > 1 else (False,)
        recomputes = ("none", "selective", "full-uniform")
        for p2p, group, sp, recompute in itertools.product(p2ps, groups, (False, True), recomputes):
            weight = 14 if d > 1 else 1
            enumerated += weight
            extra_group += weight if group else 0
            core_d += d > 1
            g = group or p
            broken = (
                big_b % (d * b) != 0,  # microbatch_count (and local_batch)
                big_l % p != 0,  # blocks_per_pipeline_stage
                big_l % (p * v) != 0,  # blocks_per_virtual_chunk
                v > 1 and p == 1,  # schedule_matches_pipeline
                recompute == "full-uniform" and big_l // p < 1,  # recompute_num_layers
                v > 1 and not (p > 2 or (p == 2 and p2p)),  # interleaving_pipeline_degree
                v > 1 and not (p <= g <= m and (m % g == 0 or m % g >= p)),  # microbatch group
                sp and t == 1,  # sequence_parallel_needs_tensor
            )
            if not any(broken):
                lawful_core += 1
                valid += 11 if d > 1 else 1
    return enumerated, extra_group, core_d, lawful_core, valid


def test_gpt3_175b_count_is_pinned() -> None:
    """(t, p) pairs: t in {1,2,4,8} (divisors of gcd(1024, 8)), p over the divisors of 1024/t:
    11 + 10 + 9 + 8 = 38, 4 of them with d = 1. Free-knob weight: d > 1 gives (no_shard + 3
    sharded x 2 param-gather overlaps) x 2 grad-reduce overlaps = 14, d = 1 gives 1, summing to
    34*14 + 4 = 480. v: 1 + 11 interleaved divisors of 96 x 2 P2P overlaps = 23 options; b: the 20
    divisors of 1536; sp 2 x recompute 3 = 6. 480 * 23 * 20 * 6 = 1,324,800, plus 55,968
    interleaved candidates with the extra group size G = m (m > p, m mod p != 0)."""
    result = enumerate_strategies(
        GPT3_175B, SearchSpace(gpu_counts=(1024,), global_batch_size=1536)
    )
    assert 480 * 23 * 20 * 6 == 1_324_800
    assert result.report.candidates_enumerated == 1_324_800 + 55_968
    # 4,875 law-abiding core rows (all d > 1) x the 11 of 14 free options Megatron accepts.
    assert result.report.candidates_valid == 4_875 * 11 == 53_625
    assert len(result.table) == 53_625
    # The 3 free options with overlap_param_gather but not overlap_grad_reduce, on every one of
    # the 97,800 core rows with d > 1, whatever else those rows break.
    assert result.report.rejected(Law.MEGATRON_OVERLAP_PARAM_GATHER) == 3 * 97_800
    assert result.report.rejected(Law.WORLD_SIZE) == 0
    # Pipeline degrees that do not divide 96 (64, 128, ..., 1024 for some t) are refused.
    assert set(np.unique(result.table.pipeline).tolist()) == {1, 2, 4, 8, 16, 32}
    assert set(np.unique(result.table.tensor).tolist()) == {1, 2, 4, 8}
    # The pinned figures, recounted by independent loops.
    enumerated, extra_group, core_d, lawful_core, valid = _recount_gpt3_175b()
    assert (enumerated, extra_group, core_d, lawful_core, valid) == (
        1_380_768,
        55_968,
        97_800,
        4_875,
        53_625,
    )
    assert result.report.candidates_enumerated == enumerated
    assert result.report.candidates_valid == valid == len(result.table)
    assert result.report.rejected(Law.MEGATRON_OVERLAP_PARAM_GATHER) == 3 * core_d


def test_gpt3_contains_the_megatron_paper_strategy() -> None:
    """Narayanan et al. 2021, Table 1 (175B row): t=8, p=8, d=16 on 1024 GPUs, B=1536, b=1,
    interleaved; here with v=2 and the distributed optimizer."""
    result = enumerate_strategies(
        GPT3_175B, SearchSpace(gpu_counts=(1024,), global_batch_size=1536)
    )
    table = result.table
    hit = np.flatnonzero(
        (table.tensor == 8)
        & (table.pipeline == 8)
        & (table.virtual_stages == 2)
        & (table.micro_batch == 1)
        & table.sequence_parallel
        & (table.recompute == RECOMPUTE_CODES.index(RecomputeVariant.SELECTIVE))
        & (table.sharding == SHARDING_CODES.index(ShardingVariant.OPTIM))
        & table.overlap_grad_reduce
        & ~table.overlap_param_gather
        & ~table.overlap_p2p_comm
    )
    assert hit.shape == (1,)
    spec = candidate_to_spec(table, int(hit[0]), GPT3_175B)
    mapping = spec.mapping
    assert mapping.data_degree == 16
    assert mapping.microbatch_count == 96
    assert mapping.parallelism.tensor.communication == ReduceScatterAllGather()
    assert mapping.parallelism.pipeline.schedule == InterleavedOneForwardOneBackward(
        virtual_stages=2, microbatch_group_size=None, overlap_p2p_comm=False
    )
    assert mapping.parallelism.data.optimizer_sharding == DistributedOptimizer()
    assert mapping.parallelism.data.overlap_grad_reduce
    assert mapping.parallelism.recompute == SelectiveRecompute()
    assert str(spec) == "gpt3-175b: TP8(rs+ag) PP8(1F1B x2) DP16(dist-opt) recompute=selective"


def test_candidate_to_spec_covers_every_variant() -> None:
    space = TINY_SPACES[0]
    result = enumerate_strategies(TINY, space)
    table = result.table
    seen_schedules: set[type] = set()
    seen_sharding: set[type] = set()
    seen_recompute: set[object] = set()
    for i in range(len(table)):
        mapping = candidate_to_spec(table, i, TINY).mapping
        assert mapping.world_size == table.num_gpus[i]
        assert mapping.virtual_stages == table.virtual_stages[i]
        assert mapping.sequence_parallel == bool(table.sequence_parallel[i])
        seen_schedules.add(type(mapping.parallelism.pipeline.schedule))
        seen_sharding.add(type(mapping.parallelism.data.optimizer_sharding))
        seen_recompute.add(mapping.parallelism.recompute)
        assert (mapping.parallelism.tensor.communication == AllReduce()) != bool(
            table.sequence_parallel[i]
        )
    assert seen_schedules == {
        SingleStage,
        OneForwardOneBackward,
        InterleavedOneForwardOneBackward,
    }
    assert NoOptimizerSharding in seen_sharding
    assert ShardedParameters in seen_sharding
    assert FullRecompute(method=RecomputeMethod.BLOCK, num_layers=2) in seen_recompute


def test_group_size_where_it_matters() -> None:
    """m = 12 microbatches on p = 8 stages (d = 1): Megatron refuses the default G = p
    (12 mod 8 = 4 < 8) and accepts one group of all 12; the space adds exactly that G."""
    model = TransformerModelSpec(
        name="g",
        num_layers=16,
        hidden_size=64,
        num_attention_heads=8,
        num_query_groups=8,
        kv_channels=8,
        ffn_hidden_size=256,
        seq_length=64,
        vocab_size=128,
        padded_vocab_size=128,
    )
    space = SearchSpace(
        gpu_counts=(8,),
        global_batch_size=12,
        gpus_per_node=1,
        max_microbatch_size=1,
        sequence_parallel=(False,),
        recompute=(RecomputeVariant.NONE,),
        overlap_p2p_comm=(False,),
    )
    table = enumerate_strategies(model, space).table
    interleaved = table.virtual_stages > 1
    # Every interleaved survivor has m mod p != 0 (B = 12 with p in {4, 8}), so it survives only
    # through the added group of all m microbatches.
    assert np.all(table.microbatch_group[interleaved] == table.microbatch_count[interleaved])
    eight = interleaved & (table.pipeline == 8)
    assert table.microbatch_group[eight].tolist() == [12]
    assert table.virtual_stages[eight].tolist() == [2]


def test_search_space_reports_every_problem() -> None:
    with pytest.raises(ConfigError) as info:
        SearchSpace(
            gpu_counts=(0, 8, 8),
            global_batch_size=-1,
            sequence_parallel=(),
            sharding=(ShardingVariant.OPTIM, ShardingVariant.OPTIM),
        )
    assert info.value.problems == (
        "SearchSpace.global_batch_size must be a positive integer, got -1",
        "SearchSpace.gpu_counts must be a positive integer, got 0",
        "SearchSpace.gpu_counts has repeated values: (0, 8, 8)",
        "SearchSpace.sequence_parallel must not be empty",
        "SearchSpace.sharding has repeated values: "
        "(<ShardingVariant.OPTIM: 'optim'>, <ShardingVariant.OPTIM: 'optim'>)",
    )


def test_precision_is_crossed_with_every_row_and_named_in_strategy_text() -> None:
    from blueprinting.mapping.precision import Fp8Precision, Fp8Recipe, HighPrecision
    from blueprinting.search.strategy_text import format_strategy_text, parse_strategy_text

    recipes = (HighPrecision(), Fp8Precision(recipe=Fp8Recipe.TENSORWISE))
    plain = enumerate_strategies(TINY, TINY_SPACES[0])
    both = enumerate_strategies(TINY, dataclasses.replace(TINY_SPACES[0], precision=recipes))
    assert len(both.table) == 2 * len(plain.table)
    assert both.report.candidates_enumerated == 2 * plain.report.candidates_enumerated
    # every strategy once per recipe, and the rows' specs carry the recipe of their code
    assert int((both.table.precision == 0).sum()) == len(plain.table)
    assert int((both.table.precision == 1).sum()) == len(plain.table)
    for i in range(0, len(both.table), max(1, len(both.table) // 50)):
        code = int(both.table.precision[i])
        assert candidate_to_spec(both.table, i, TINY).mapping.precision == recipes[code]
    fp8_row = int(np.flatnonzero(both.table.precision == 1)[0])
    mapping = candidate_to_spec(both.table, fp8_row, TINY).mapping
    text = format_strategy_text(mapping)
    assert "precision=fp8-tensorwise" in text
    assert parse_strategy_text(text) == mapping


def test_userbuffers_refuse_nvfp4_and_blockwise() -> None:
    """TE's userbuffers gather per-tensor FP8 and MXFP8 only: crossed with bf16, MXFP8 and
    NVFP4, the overlapped twins of the NVFP4 rows are rejected under
    ``tp_comm_overlap_quantizer`` (one per twin the other laws pass), the bf16 and MXFP8 twins
    stay, and the scalar checker refuses such a row under the same name (NVFP4 and blockwise
    FP8; MXFP8 passes)."""
    from blueprinting.mapping.laws import check_training
    from blueprinting.mapping.precision import Fp4Precision, Fp8Precision, Fp8Recipe, HighPrecision

    space = dataclasses.replace(TINY_SPACES[3], tp_comm_overlap=(False, True))
    recipes = (HighPrecision(), Fp8Precision(recipe=Fp8Recipe.MXFP8), Fp4Precision())
    plain = enumerate_strategies(TINY, space)
    crossed = enumerate_strategies(TINY, dataclasses.replace(space, precision=recipes))
    table = crossed.table
    twins = int(plain.table.tp_comm_overlap.sum())
    assert twins > 0
    # counted on every enumerated NVFP4 twin, lawful under the other laws or not
    assert crossed.report.rejected(Law.MEGATRON_TP_COMM_OVERLAP_QUANTIZER) >= twins
    assert plain.report.rejected(Law.MEGATRON_TP_COMM_OVERLAP_QUANTIZER) == 0
    assert not (table.tp_comm_overlap & (table.precision == 2)).any()
    for code in (0, 1):
        assert int((table.tp_comm_overlap & (table.precision == code)).sum()) == twins
    assert len(table) == 3 * len(plain.table) - twins
    row = int(np.flatnonzero(table.tp_comm_overlap & (table.precision == 1))[0])
    spec = candidate_to_spec(table, row, TINY)
    for recipe, refused in (
        (Fp4Precision(), True),
        (Fp8Precision(recipe=Fp8Recipe.BLOCKWISE), True),
    ):
        mapping = dataclasses.replace(spec.mapping, precision=recipe)
        names = {v.law for v in check_training(spec.model, mapping)}
        assert (Law.MEGATRON_TP_COMM_OVERLAP_QUANTIZER.value in names) is refused
    assert Law.MEGATRON_TP_COMM_OVERLAP_QUANTIZER.value not in {
        v.law for v in check_training(spec.model, spec.mapping)
    }


def test_tp_comm_overlap_rows_are_sequence_parallel() -> None:
    """GPT-3 175B / 1024 GPUs: ``tp_comm_overlap=(False, True)`` adds one overlapped twin of
    every sequence-parallel row with t > 1 and nothing else; the twins pass the same laws (the
    userbuffer shape, (s*b) mod t, follows from local_sequence, s mod t), and ``(True,)``
    replaces each such row by its twin. The default space's counts stay the pinned ones."""
    space = SearchSpace(gpu_counts=(1024,), global_batch_size=1536)
    off = enumerate_strategies(GPT3_175B, space)
    both = enumerate_strategies(
        GPT3_175B, dataclasses.replace(space, tp_comm_overlap=(False, True))
    )
    on = enumerate_strategies(GPT3_175B, dataclasses.replace(space, tp_comm_overlap=(True,)))
    assert off.report.candidates_enumerated == 1_380_768
    assert not off.table.tp_comm_overlap.any()
    # Every lawful sp row has t > 1 (sequence_parallel_needs_tensor): 25,641 of the 53,625.
    twins = off.table.sequence_parallel & (off.table.tensor > 1)
    assert int(twins.sum()) == int(off.table.sequence_parallel.sum()) == 25_641
    assert both.report.candidates_valid == 53_625 + 25_641
    assert on.report.candidates_valid == 53_625
    for result in (both, on):
        table = result.table
        overlap = table.tp_comm_overlap
        assert int(overlap.sum()) == 25_641
        assert not (overlap & ~(table.sequence_parallel & (table.tensor > 1))).any()
        assert result.report.rejected(Law.MEGATRON_TP_COMM_OVERLAP_NEEDS_SP) == 0
        assert result.report.rejected(Law.MEGATRON_TP_COMM_OVERLAP_BUFFER) == 0
    # Enumerated once more: every sp row with t > 1. t in {2, 4, 8} gives 10 + 9 + 8 = 27 of
    # the 38 (t, p) pairs, 3 of them with d = 1: weight 24 * 14 + 3 = 339, times 23 v options x
    # 20 b x 3 recomputes, plus the interleaved G = m rows among them (recounted below).
    n, big_b, big_l = 1024, 1536, 96
    extra_group = 0
    virtual = [v for v in range(2, big_l + 1) if big_l % v == 0]
    micro = [b for b in range(1, big_b + 1) if big_b % b == 0]
    for t in (2, 4, 8):
        for p in (p for p in range(1, n // t + 1) if (n // t) % p == 0):
            d = n // (t * p)
            for _, b in itertools.product(virtual, micro):
                m = big_b // (d * b)
                if m > p and m % p:
                    extra_group += 2 * 3 * (14 if d > 1 else 1)  # P2P overlap x recompute
    assert extra_group == 19_602
    assert both.report.candidates_enumerated == 1_380_768 + 339 * 23 * 20 * 3 + extra_group
    on_row = int(np.flatnonzero(on.table.tp_comm_overlap)[0])
    spec = candidate_to_spec(on.table, on_row, GPT3_175B)
    assert spec.mapping.parallelism.tensor.communication == ReduceScatterAllGather(
        overlap=UserbufferOverlap()
    )
    assert str(spec).split()[1] == "TP2(rs+ag"
    assert "ub(ag=ring,rs=pipe/4,bulk=dgrad+wgrad))" in str(spec)


def test_moe_space_exercises_the_expert_laws() -> None:
    """Mixtral 8x7B on 16 GPUs with every ep, etp and a dispatcher of each kind (and the EP
    overlap): every expert law that can read the space fires, and every lawful row passes the
    scalar checker."""
    model = model_preset("mixtral-8x7b")
    dispatchers: tuple[TokenDispatcher, ...] = (
        AllToAllDispatcher(),
        AllGatherDispatcher(),
        FlexDispatcher(),
        AllToAllDispatcher(overlap=True),
    )
    space = SearchSpace(
        gpu_counts=(16,),
        global_batch_size=8,
        max_microbatch_size=1,
        expert_parallel=(1, 2, 3, 8, 16),
        expert_tensor_parallel=(1, 2, 3),
        dispatchers=dispatchers,
    )
    result = enumerate_strategies(model, space)
    counts = dict(result.report.rejections)
    fired = {law for law in EXPERT_LAWS if law.searched and counts[law]}
    # Mixtral: no linear biases, no shared experts, no MTP, bf16, dropless; the space plans
    # only the default selective modules and the grouped GEMM; ep = 1 needs no MoE here
    assert fired == {
        Law.EXPERT_WORLD_SIZE,
        Law.EXPERTS_PER_EXPERT_RANK,
        Law.EXPERT_FFN_DIVISIBILITY,
        Law.MOE_TP_NEEDS_SEQUENCE_PARALLEL,
        Law.MEGATRON_EP_NEEDS_SEQUENCE_PARALLEL,
        Law.MEGATRON_FLEX_NEEDS_EXPERT_GRID,
        Law.MEGATRON_EP_OVERLAP_NEEDS_EP,
        Law.MEGATRON_EP_OVERLAP_NEEDS_VIRTUAL_PIPELINE,
        Law.MEGATRON_EP_OVERLAP_RECOMPUTE,
    }
    table = result.table
    assert len(table) > 0
    for i in range(0, len(table), max(1, len(table) // 300)):
        assert check_training(model, candidate_to_spec(table, i, model).mapping) == ()


def test_windowed_sink_model_searches_cp_only_where_te_runs_it() -> None:
    """GPT-OSS's sliding windows refuse the p2p ring and its attention sinks everything but
    a2a (Transformer Engine): a search over p2p, all_gather and a2a keeps only a2a rows with
    cp > 1, each lawful by the scalar checker, and counts both laws' rejections; without the
    sinks all_gather comes back."""
    from blueprinting.mapping.model import SoftmaxType
    from blueprinting.mapping.transformer import CpCommType
    from blueprinting.search.space import CP_COMM_CODES

    full = model_preset("gpt-oss-120b")
    assert full.moe is not None
    model = dataclasses.replace(
        full,
        num_layers=12,
        seq_length=1024,
        feed_forward=dataclasses.replace(full.moe, num_experts=16),
    )
    space = SearchSpace(
        gpu_counts=(16,),
        global_batch_size=8,
        max_microbatch_size=1,
        recompute=(RecomputeVariant.NONE,),
        context_parallel=None,
        cp_comm_types=(CpCommType.P2P, CpCommType.ALL_GATHER, CpCommType.A2A),
    )
    result = enumerate_strategies(model, space)
    table = result.table
    kinds = {
        CP_COMM_CODES[int(c)] for c, cp in zip(table.cp_comm, table.context, strict=True) if cp > 1
    }
    assert kinds == {CpCommType.A2A}
    for i in range(0, len(table), max(1, len(table) // 50)):
        spec = candidate_to_spec(table, i, model)
        assert check_training(spec.model, spec.mapping) == ()
    assert result.report.rejected(Law.MEGATRON_CP_SLIDING_WINDOW) > 0
    assert result.report.rejected(Law.MEGATRON_CP_SOFTMAX_TYPE) > 0
    plain = dataclasses.replace(model, softmax_type=SoftmaxType.VANILLA)
    again = enumerate_strategies(plain, space)
    kinds = {
        CP_COMM_CODES[int(c)]
        for c, cp in zip(again.table.cp_comm, again.table.context, strict=True)
        if cp > 1
    }
    assert kinds == {CpCommType.A2A, CpCommType.ALL_GATHER}
    assert again.report.rejected(Law.MEGATRON_CP_SOFTMAX_TYPE) == 0


def test_balanced_layouts_are_lawful_where_the_blocks_do_not_split() -> None:
    """Under ``PipelineLayouts.BALANCED`` the rows whose 12 blocks do not split over p v plan the
    balanced layout, which every scalar law accepts (its own ``flexible_layout_laws`` and the
    recompute bound included); the even rows keep Megatron's split. The even space is the
    balanced one less exactly those rows."""
    even = SearchSpace(gpu_counts=(8, 10), global_batch_size=20, gpus_per_node=2)
    balanced = dataclasses.replace(even, pipeline_layouts=PipelineLayouts.BALANCED)
    even_rows = set(_rows(enumerate_strategies(TINY, even).table))
    table = enumerate_strategies(TINY, balanced).table
    rows = _rows(table)
    uneven = [i for i in range(len(table)) if 12 % int(table.pipeline[i] * table.virtual_stages[i])]
    assert len(uneven) > 100
    assert {row for k, row in enumerate(rows) if k not in set(uneven)} == even_rows
    shapes = set()
    for i in uneven:
        spec = candidate_to_spec(table, i, TINY)
        pipeline = spec.mapping.parallelism.pipeline
        p, v = int(table.pipeline[i]), int(table.virtual_stages[i])
        assert pipeline.layout == balanced_layout(12, 0, p * v)
        assert check_training(TINY, spec.mapping) == ()
        shapes.add((p, v))
    # p = 5 (v 1..2), p = 8 (v = 1: 14 units over 8 stages) and the v the split refuses
    assert {(5, 1), (5, 2), (8, 1), (2, 5), (2, 7)} <= shapes
    assert all(p * v <= 14 for p, v in shapes)  # at least one unit per stage


def test_balanced_layouts_refuse_base_precision_layers() -> None:
    from blueprinting.mapping.precision import Fp8Precision, Fp8Recipe

    with pytest.raises(ConfigError, match="base-precision first / last layers"):
        SearchSpace(
            gpu_counts=(8,),
            global_batch_size=8,
            precision=(Fp8Precision(recipe=Fp8Recipe.TENSORWISE, high_precision_layers=(1, 1)),),
            pipeline_layouts=PipelineLayouts.BALANCED,
        )
