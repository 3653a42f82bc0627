"""Contracts of the typed strategy ADT (seed: "Algebraic data model", "Composition and
divisibility laws"): pattern-matching destructuring, derived projections, the flat-key round trip
and the laws against an independent brute-force recomputation."""

from __future__ import annotations

from fractions import Fraction
from typing import assert_never, get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.errors import ConfigError, RuleSet
from blueprinting.mapping.model import TransformerModelSpec
from blueprinting.mapping.presets import MODEL_PRESETS, PUBLISHED_ROUNDING
from blueprinting.mapping.transformer import (
    AllReduce,
    BatchSpec,
    CombinedOneForwardOneBackward,
    DataParallel,
    DistributedOptimizer,
    DualPipe,
    DualPipeV,
    ForwardOnly,
    FullRecompute,
    InterleavedOneForwardOneBackward,
    NoOptimizerSharding,
    NoRecompute,
    OneForwardOneBackward,
    OptimizerSharding,
    PipelineParallel,
    PipelineSchedule,
    RecomputeMethod,
    RecomputePolicy,
    ReduceScatterAllGather,
    SelectiveRecompute,
    ShardedGradients,
    ShardedParameters,
    SingleStage,
    TensorCommunication,
    TensorParallel,
    TrainingSpec,
    TransformerTrainingMappingSpec,
    TransformerTrainingParallelism,
    ZeroBubbleH1,
    check_inference,
    check_training,
    from_mapping,
    to_mapping,
)
from tests.strategies import (
    lawful_inference_specs,
    lawful_training_specs,
    training_specs,
)


def _gpt3_mapping() -> TransformerTrainingMappingSpec:
    return TransformerTrainingMappingSpec(
        parallelism=TransformerTrainingParallelism(
            tensor=TensorParallel(degree=8, communication=ReduceScatterAllGather()),
            pipeline=PipelineParallel(
                degree=8, schedule=InterleavedOneForwardOneBackward(virtual_stages=3)
            ),
            data=DataParallel(degree=16, optimizer_sharding=DistributedOptimizer()),
            recompute=SelectiveRecompute(),
        ),
        batch=BatchSpec(global_batch_size=1536, micro_batch_size=1),
    )


# --------------------------------------------------------------------------------------------
# ADT shape
# --------------------------------------------------------------------------------------------
def test_seed_destructuring_pattern_binds_every_degree() -> None:
    mapping = _gpt3_mapping()
    match mapping.parallelism:
        case TransformerTrainingParallelism(
            tensor=TensorParallel(degree=tp, communication=communication),
            pipeline=PipelineParallel(degree=pp, schedule=schedule),
            data=DataParallel(degree=dp),
            recompute=recompute,
        ):
            assert (tp, pp, dp) == (8, 8, 16)
            assert communication == ReduceScatterAllGather()
            assert schedule == InterleavedOneForwardOneBackward(virtual_stages=3)
            assert recompute == SelectiveRecompute()


def test_derived_projections_are_exact() -> None:
    mapping = _gpt3_mapping()
    assert mapping.world_size == 1024
    assert mapping.local_batch == 96
    assert mapping.microbatch_count == 96
    assert mapping.virtual_stages == 3
    assert mapping.sequence_parallel is True


def test_compact_str_of_the_gpt3_strategy() -> None:
    spec = TrainingSpec(model=MODEL_PRESETS["gpt3-175b"], mapping=_gpt3_mapping())
    assert str(spec) == "gpt3-175b: TP8(rs+ag) PP8(1F1B x3) DP16(dist-opt) recompute=selective"


def test_degree_must_be_a_positive_integer() -> None:
    with pytest.raises(ConfigError) as error:
        TensorParallel(degree=0)
    assert error.value.problems == ("TensorParallel.degree must be a positive integer, got 0",)


def _describe(schedule: PipelineSchedule) -> str:
    match schedule:
        case SingleStage():
            return "none"
        case OneForwardOneBackward():
            return "1f1b"
        case InterleavedOneForwardOneBackward(virtual_stages=v):
            return f"interleaved/{v}"
        case CombinedOneForwardOneBackward(virtual_stages=v):
            return f"combined/{v}"
        case ForwardOnly():
            return "forward"
        case ZeroBubbleH1():
            return "zb-h1"
        case DualPipe():
            return "dualpipe"
        case DualPipeV():
            return "dualpipev"
        case _ as unreachable:
            assert_never(unreachable)


def test_every_schedule_variant_is_matchable() -> None:
    """Every member of the union (a new variant must be added here, or this fails)."""
    examples: dict[type, PipelineSchedule] = {
        SingleStage: SingleStage(),
        OneForwardOneBackward: OneForwardOneBackward(),
        InterleavedOneForwardOneBackward: InterleavedOneForwardOneBackward(virtual_stages=2),
        CombinedOneForwardOneBackward: CombinedOneForwardOneBackward(virtual_stages=2),
        ForwardOnly: ForwardOnly(),
        ZeroBubbleH1: ZeroBubbleH1(),
        DualPipe: DualPipe(),
        DualPipeV: DualPipeV(),
    }
    assert set(examples) == set(get_args(PipelineSchedule))
    assert [_describe(s) for s in examples.values()] == [
        "none",
        "1f1b",
        "interleaved/2",
        "combined/2",
        "forward",
        "zb-h1",
        "dualpipe",
        "dualpipev",
    ]


# --------------------------------------------------------------------------------------------
# Flat keys round trip
# --------------------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(training_specs())
def test_from_mapping_inverts_to_mapping(spec: TrainingSpec) -> None:
    assert from_mapping(to_mapping(spec)) == spec


@settings(max_examples=150, deadline=None)
@given(lawful_training_specs())
def test_lawful_specs_satisfy_every_law(spec: TrainingSpec) -> None:
    assert check_training(spec.model, spec.mapping) == ()
    assert from_mapping(to_mapping(spec)) == spec


@settings(max_examples=100, deadline=None)
@given(lawful_inference_specs())
def test_lawful_inference_specs_satisfy_every_law(spec: object) -> None:
    from blueprinting.mapping.transformer import InferenceSpec

    assert isinstance(spec, InferenceSpec)
    assert check_inference(spec.model, spec.mapping) == ()


# --------------------------------------------------------------------------------------------
# Laws against a brute-force recomputation
# --------------------------------------------------------------------------------------------
def _integral(numerator: int, denominator: int) -> bool:
    return Fraction(numerator, denominator).denominator == 1


def _brute_force_laws(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec
) -> set[tuple[str, RuleSet]]:
    """The laws an independent reading of the seed and Megatron-LM's rules says are broken
    (even stage layouts only)."""
    par = mapping.parallelism
    t, p, d = par.tensor.degree, par.pipeline.degree, par.data.degree
    gbs, mbs = mapping.batch.global_batch_size, mapping.batch.micro_batch_size
    schedule = par.pipeline.schedule
    v = schedule.virtual_stages if isinstance(schedule, InterleavedOneForwardOneBackward) else 1
    layers = model.num_layers
    broken: set[tuple[str, RuleSet]] = set()
    planner, megatron = RuleSet.PLANNER, RuleSet.MEGATRON
    if not _integral(gbs, d):
        broken.add(("local_batch", planner))
    if not _integral(gbs, d * mbs):
        broken.add(("microbatch_count", planner))
    if not _integral(layers, p):
        broken.add(("blocks_per_pipeline_stage", planner))
    if v > 1 and not _integral(layers, p * v):
        broken.add(("blocks_per_virtual_chunk", planner))
    sp = isinstance(par.tensor.communication, ReduceScatterAllGather)
    if sp and not _integral(model.seq_length, t):
        broken.add(("local_sequence", planner))
    if isinstance(schedule, SingleStage) and p != 1:
        broken.add(("schedule_matches_pipeline", planner))
    pipelined = OneForwardOneBackward | InterleavedOneForwardOneBackward | ZeroBubbleH1
    if isinstance(schedule, pipelined) and p < 2:
        broken.add(("schedule_matches_pipeline", planner))
    if isinstance(schedule, ForwardOnly):
        broken.add(("training_schedule", planner))
    if isinstance(schedule, InterleavedOneForwardOneBackward) and v < 2:
        broken.add(("interleaved_virtual_stages", planner))
    a, g = model.num_attention_heads, model.num_query_groups
    if not _integral(a, t):
        broken.add(("attention_heads_per_tensor_rank", planner))
    # training splits the K/V heads over t (Megatron-Core attention.py divide)
    if not _integral(g, t):
        broken.add(("query_groups_vs_tensor", planner))
    if not _integral(a, g):
        broken.add(("heads_per_query_group", planner))
    if not _integral(model.ffn_hidden_size, t):
        broken.add(("ffn_per_tensor_rank", planner))
    if model.kv_channels == model.hidden_size // a and not _integral(model.hidden_size, a):
        broken.add(("hidden_per_head", planner))
    if not _integral(model.padded_vocab_size, t):
        broken.add(("vocab_per_tensor_rank", planner))
    if isinstance(par.recompute, FullRecompute) and not (
        1 <= par.recompute.num_layers <= layers // p
    ):
        broken.add(("recompute_num_layers", planner))
    # Megatron-LM rules
    if sp and t == 1:
        broken.add(("sequence_parallel_needs_tensor", megatron))
    if isinstance(schedule, ZeroBubbleH1):  # Megatron-LM ships no ZB-H1 schedule
        broken.add(("megatron_schedule_supported", megatron))
    m = gbs // (d * mbs)
    if m == 0:
        broken.add(("num_microbatches_positive", megatron))
    if isinstance(schedule, InterleavedOneForwardOneBackward):
        if p <= 2 and not (p == 2 and schedule.overlap_p2p_comm):
            broken.add(("interleaving_pipeline_degree", megatron))
        n = schedule.microbatch_group_size or p
        if n < p or n > m:
            broken.add(("microbatch_group_bounds", megatron))
        if m % n not in {0} and m % n < p:
            broken.add(("microbatch_group_remainder", megatron))
    sharding = par.data.optimizer_sharding
    if (
        not isinstance(sharding, NoOptimizerSharding)
        and sharding.overlap_param_gather
        and not par.data.overlap_grad_reduce
    ):
        broken.add(("overlap_param_gather_needs_overlap_grad_reduce", megatron))
    return broken


@st.composite
def _any_training(draw: st.DrawFn) -> tuple[TransformerModelSpec, TransformerTrainingMappingSpec]:
    t = draw(st.integers(1, 8))
    p = draw(st.integers(1, 8))
    v = draw(st.integers(1, 4))
    schedules: list[PipelineSchedule] = [
        SingleStage(),
        OneForwardOneBackward(),
        ForwardOnly(),
        ZeroBubbleH1(),
        InterleavedOneForwardOneBackward(
            virtual_stages=v,
            microbatch_group_size=draw(st.none() | st.integers(1, 12)),
            overlap_p2p_comm=draw(st.booleans()),
        ),
    ]
    schedule = draw(st.sampled_from(schedules))
    heads = draw(st.integers(1, 32))
    hidden = heads * draw(st.integers(1, 16)) + draw(st.sampled_from([0, 0, 1, 3]))
    kv_default = draw(st.booleans())
    model = TransformerModelSpec(
        name="m",
        num_layers=draw(st.integers(1, 64)),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=draw(st.integers(1, 32)),
        kv_channels=hidden // heads if kv_default else draw(st.integers(1, 64)),
        ffn_hidden_size=draw(st.integers(1, 256)),
        seq_length=draw(st.integers(1, 256)),
        vocab_size=100,
        padded_vocab_size=draw(st.integers(100, 1200)),
    )
    shardings: list[OptimizerSharding] = [
        NoOptimizerSharding(),
        DistributedOptimizer(overlap_param_gather=draw(st.booleans())),
        ShardedGradients(overlap_param_gather=draw(st.booleans())),
        ShardedParameters(overlap_param_gather=draw(st.booleans())),
    ]
    sharding = draw(st.sampled_from(shardings))
    recomputes: list[RecomputePolicy] = [
        NoRecompute(),
        SelectiveRecompute(),
        FullRecompute(method=RecomputeMethod.BLOCK, num_layers=draw(st.integers(1, 20))),
        FullRecompute(method=RecomputeMethod.UNIFORM, num_layers=draw(st.integers(1, 20))),
    ]
    recompute = draw(st.sampled_from(recomputes))
    communications: list[TensorCommunication] = [AllReduce(), ReduceScatterAllGather()]
    mapping = TransformerTrainingMappingSpec(
        parallelism=TransformerTrainingParallelism(
            tensor=TensorParallel(
                degree=t,
                communication=draw(st.sampled_from(communications)),
            ),
            pipeline=PipelineParallel(degree=p, schedule=schedule),
            data=DataParallel(
                degree=draw(st.integers(1, 8)),
                optimizer_sharding=sharding,
                overlap_grad_reduce=draw(st.booleans()),
            ),
            recompute=recompute,
        ),
        batch=BatchSpec(
            global_batch_size=draw(st.integers(1, 256)),
            micro_batch_size=draw(st.integers(1, 4)),
        ),
    )
    return model, mapping


@settings(max_examples=400, deadline=None)
@given(_any_training())
def test_laws_report_exactly_the_brute_force_violations(
    case: tuple[TransformerModelSpec, TransformerTrainingMappingSpec],
) -> None:
    model, mapping = case
    found = {(v.law, v.ruleset) for v in check_training(model, mapping)}
    assert found == _brute_force_laws(model, mapping)
    planner_only = {(v.law, v.ruleset) for v in check_training(model, mapping, megatron=False)}
    assert planner_only == {x for x in found if x[1] is RuleSet.PLANNER}


# --------------------------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(MODEL_PRESETS))
def test_preset_matches_its_published_parameter_count(name: str) -> None:
    """Within 1%, or within half a unit of the source's last printed digit where the source
    rounds more coarsely than 1% (Narayanan et al. print 1.65B as "1.7B")."""
    model = MODEL_PRESETS[name]
    assert model.published_parameters is not None
    tolerance = max(0.01 * model.published_parameters, PUBLISHED_ROUNDING.get(name, 0))
    assert abs(model.num_parameters - model.published_parameters) <= tolerance


@pytest.mark.parametrize("name", [n for n in MODEL_PRESETS if n.startswith("llama")])
def test_llama_presets_reproduce_checkpoint_counts_exactly(name: str) -> None:
    model = MODEL_PRESETS[name]
    assert model.num_parameters == model.published_parameters
