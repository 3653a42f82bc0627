"""The expert grid's laws (mapping/expert_laws.py): exact messages, all reported at once, and
hypothesis properties over any MoE strategy."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings

from blueprinting.errors import InvalidStrategyError, LawViolation, RuleSet
from blueprinting.mapping.expert_laws import expert_laws
from blueprinting.mapping.flat_keys import from_mapping
from blueprinting.mapping.law_names import EXPERT_LAWS, Law
from blueprinting.mapping.laws import check_training
from blueprinting.mapping.model import (
    CapacityFactor,
    Datatype,
    MixtureOfExperts,
    TransformerModelSpec,
)
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import (
    AllToAllDispatcher,
    CombinedOneForwardOneBackward,
    ExpertParallel,
    FlexDispatcher,
    FullRecompute,
    InterleavedOneForwardOneBackward,
    RecomputeModule,
    SelectiveRecompute,
    TrainingSpec,
    TransformerTrainingMappingSpec,
)
from tests.moe_models import DEEPSEEK_V3_LIKE, DEEPSEEK_V3_MOE, GPT_OSS_LIKE
from tests.strategies import moe_training_specs


def _spec(model: TransformerModelSpec, **keys: object) -> TrainingSpec:
    return from_mapping(keys, model=model)


def _with_experts(
    mapping: TransformerTrainingMappingSpec, experts: ExpertParallel
) -> TransformerTrainingMappingSpec:
    return replace(mapping, parallelism=replace(mapping.parallelism, experts=experts))


EXPERT_LAW_NAMES = frozenset(str(law) for law in EXPERT_LAWS)


def _names(violations: tuple[LawViolation, ...] | list[LawViolation]) -> list[str]:
    return [v.law for v in violations]


# The trained layout of DeepSeek-V3 (technical report section 3.2: 2048 H800, PP16, EP64, no TP),
# with a flexible layout of 16 stages so that the 61 layers place (4 on the first stage).
_DSV3_LAYOUT = "Et*3|" + "t*4|" * 14 + "t*2L"


def test_deepseek_v3_as_trained_keeps_every_expert_law() -> None:
    spec = _spec(
        DEEPSEEK_V3_LIKE,
        world_size=2048,
        pipeline_model_parallel_size=16,
        pipeline_model_parallel_layout=_DSV3_LAYOUT,
        expert_model_parallel_size=64,
        moe_token_dispatcher_type="alltoall",
        moe_grouped_gemm=True,
        global_batch_size=15360,
        use_distributed_optimizer=True,
    )
    mapping = spec.mapping
    assert (mapping.data_degree, mapping.expert_degree, mapping.expert_tensor_degree) == (
        128,
        64,
        1,
    )
    # expert-dp = W / (etp * ep * p) = 2048 / (1 * 64 * 16); the expert grid tiles t * cp * d
    assert mapping.expert_data_degree == 2
    assert (
        mapping.expert_tensor_degree * mapping.expert_degree * mapping.expert_data_degree
        == mapping.tensor_degree * mapping.context_degree * mapping.data_degree
        == 128
    )
    assert expert_laws(spec.model, mapping) == []
    assert check_training(spec.model, mapping) == ()


def test_check_with_p15_and_ep48_lists_every_violated_law_at_once() -> None:
    """Issue 13's "check with ep 48 and p 15": 61 layers over 15 stages and 256 experts over 48
    ranks, with the world-size laws both grids break, in one error."""
    with pytest.raises(InvalidStrategyError) as raised:
        _spec(
            DEEPSEEK_V3_LIKE,
            world_size=2048,
            pipeline_model_parallel_size=15,
            expert_model_parallel_size=48,
            global_batch_size=15360,
        )
    assert [str(v) for v in raised.value.violations] == [
        "[planner] world_size: d = world_size / (t * p) = 2048 / (1 * 15) is not integral",
        "[planner] blocks_per_pipeline_stage: blocks_per_pipeline_stage = 61 / 15 is not integral"
        "; Megatron-LM runs it uneven with decoder_first_pipeline_num_layers = 5 "
        "(5/4/4/4/4/4/4/4/4/4/4/4/4/4/4)",
        "[planner] experts_per_expert_rank: num_experts = 256 is not divisible by "
        "expert_model_parallel_size = 48: an expert rank would hold 5.33333 experts "
        "(Megatron-LM arguments.py l.1655-1658, moe_layer.py l.184-187)",
        "[planner] expert_world_size: world_size = 2048 is not divisible by etp * ep * p = "
        '1 * 48 * 15 = 720 (Megatron-LM parallel_state.py l.874-884: "not divisible by '
        'expert_tensor_model_pipeline_parallel size"): the expert grid etp x ep x expert-dp '
        "does not tile the ranks of a pipeline stage",
    ]
    world = raised.value.violations[-1]
    assert world.values == (("world_size", 2048), ("etp", 1), ("ep", 48), ("p", 15))
    assert world.formula == Law.EXPERT_WORLD_SIZE.formula


def test_the_expert_world_law_with_an_integral_dense_grid() -> None:
    """d integral (2048 = 1 * 16 * 128) but the expert grid 1 x 48 x edp cannot tile 128."""
    spec = _spec(
        DEEPSEEK_V3_LIKE,
        world_size=2048,
        pipeline_model_parallel_size=16,
        pipeline_model_parallel_layout=_DSV3_LAYOUT,
        global_batch_size=15360,
        moe_token_dispatcher_type="alltoall",
        expert_model_parallel_size=48,
    )
    assert spec.mapping.data_degree == 128
    assert _names(check_training(spec.model, spec.mapping)) == [
        "expert_world_size",
        "experts_per_expert_rank",
    ]


def test_expert_parallelism_on_a_dense_model() -> None:
    gpt3 = model_preset("gpt3-175b")
    spec = _spec(gpt3, world_size=64, tensor_model_parallel_size=8, expert_model_parallel_size=2)
    assert spec.mapping.parallelism.experts == ExpertParallel(degree=2)
    (violation,) = expert_laws(gpt3, spec.mapping)
    assert str(violation) == (
        "[planner] expert_parallel_needs_moe: expert_model_parallel_size = 2 and "
        "expert_tensor_parallel_size = 1 need a mixture-of-experts model; 'gpt3-175b' has "
        "dense feed-forward layers (Megatron-LM arguments.py l.1655-1658: the experts must be "
        "set for ep > 1)"
    )
    # ... also under the planner's rules alone: Blueprinting cannot cost experts a model lacks
    assert "expert_parallel_needs_moe" in _names(check_training(gpt3, spec.mapping, megatron=False))
    # the default grid of a dense model is unread and lawful
    lawful = _spec(gpt3, world_size=64, tensor_model_parallel_size=8)
    assert expert_laws(gpt3, lawful.mapping) == []


def _dsv3_mapping(**keys: object) -> TransformerTrainingMappingSpec:
    base: dict[str, object] = {
        "world_size": 512,
        "pipeline_model_parallel_size": 16,
        "pipeline_model_parallel_layout": _DSV3_LAYOUT,
        "global_batch_size": 4096,
    }
    return _spec(DEEPSEEK_V3_LIKE, **(base | keys)).mapping


def test_expert_ffn_and_shared_expert_splits() -> None:
    model = replace(
        DEEPSEEK_V3_LIKE,
        feed_forward=replace(
            DEEPSEEK_V3_MOE,
            expert_ffn_hidden_size=2002,
            shared_expert_ffn_hidden_size=2050,
        ),
    )
    mapping = _dsv3_mapping(
        tensor_model_parallel_size=4, sequence_parallel=True, expert_model_parallel_size=4
    )
    # Megatron's default: etp = t
    assert mapping.expert_tensor_degree == 4
    assert [str(v) for v in expert_laws(model, mapping)] == [
        "[planner] expert_ffn_per_expert_tensor_rank: moe_ffn_hidden_size = 2002 does not split "
        "over expert_tensor_parallel_size = 4 ranks (each expert's columns are partitioned over "
        "ETP, moe/experts.py l.210-238; Megatron-LM does not check it at start-up)",
        "[planner] shared_expert_ffn_per_tensor_rank: moe_shared_expert_intermediate_size = "
        "2050 does not split over t = 4 ranks (the shared experts use the dense TP group, "
        "moe/shared_experts.py l.127-131)",
    ]


def test_linear_biases_need_expert_tensor_degree_one() -> None:
    keys: dict[str, object] = {
        "world_size": 64,
        "tensor_model_parallel_size": 2,
        "sequence_parallel": True,
        "expert_model_parallel_size": 8,
    }
    mapping = _spec(GPT_OSS_LIKE, **keys).mapping
    assert [str(v) for v in expert_laws(GPT_OSS_LIKE, mapping)] == [
        "[megatron] expert_tensor_parallel_without_bias: routed experts with add_bias_linear = "
        "true need expert_tensor_parallel_size = 1, got 2 (transformer_config.py l.2612-2615)"
    ]
    lawful = _spec(GPT_OSS_LIKE, **keys, expert_tensor_parallel_size=1).mapping
    assert expert_laws(GPT_OSS_LIKE, lawful) == []


def test_expert_parallelism_with_tensor_parallelism_needs_sequence_parallelism() -> None:
    mapping = _dsv3_mapping(
        tensor_model_parallel_size=2, expert_tensor_parallel_size=1, expert_model_parallel_size=8
    )
    planner, megatron = expert_laws(DEEPSEEK_V3_LIKE, mapping)
    assert str(planner) == (
        "[planner] moe_tp_needs_sequence_parallel: MoE layers with t = 2 are modelled with "
        "sequence parallelism only (Megatron-LM warns without it: model_parallel_config.py "
        "l.560-565)"
    )
    assert str(megatron) == (
        "[megatron] expert_parallel_needs_sequence_parallel: expert_model_parallel_size = 8 "
        'with t = 2 needs sequence_parallel: Megatron-LM warns "sequence parallelism must be '
        'used" (model_parallel_config.py l.560-565; earlier releases refused it), Blueprinting '
        "refuses it under the Megatron rule set"
    )
    # the planner's rules alone keep only the planner's: the MoE block is modelled with SP
    names = _names(check_training(DEEPSEEK_V3_LIKE, mapping, megatron=False))
    assert "expert_parallel_needs_sequence_parallel" not in names
    assert "moe_tp_needs_sequence_parallel" in names


def test_flex_dispatcher_rules() -> None:
    padded = replace(
        DEEPSEEK_V3_LIKE,
        feed_forward=replace(
            DEEPSEEK_V3_MOE,
            dropping=CapacityFactor(factor=1.0, pad_to_capacity=True),
        ),
    )
    mapping = _dsv3_mapping(moe_token_dispatcher_type="flex")
    assert isinstance(mapping.parallelism.experts.dispatcher, FlexDispatcher)
    assert [str(v) for v in expert_laws(padded, mapping)] == [
        "[megatron] flex_dispatcher_needs_expert_grid: moe_token_dispatcher_type = flex (deepep) "
        'needs etp * ep > 1, got 1 * 1 (token_dispatcher.py l.1836, 1854: "Flex token '
        'dispatcher requires TPxEP > 1")',
        "[megatron] flex_dispatcher_no_pad_to_capacity: moe_token_dispatcher_type = flex does "
        "not support moe_pad_expert_input_to_capacity (transformer_config.py l.1868-1881)",
    ]


def test_ep_overlap_rules_are_all_reported() -> None:
    model = replace(DEEPSEEK_V3_LIKE, mtp_num_layers=2, datatype=Datatype.FP32)
    mapping = _dsv3_mapping(
        moe_token_dispatcher_type="alltoall",
        overlap_moe_expert_parallel_comm=True,
        moe_shared_expert_overlap=True,
        recompute_granularity="full",
        recompute_method="uniform",
        recompute_num_layers=1,
    )
    assert (
        isinstance(mapping.parallelism.pipeline.schedule, InterleavedOneForwardOneBackward) is False
    )
    assert [str(v) for v in expert_laws(model, mapping)] == [
        "[megatron] ep_overlap_needs_expert_parallel: overlap_moe_expert_parallel_comm needs "
        "expert_model_parallel_size > 1, got 1 (transformer_config.py l.3002-3071): there is no "
        "all-to-all to hide",
        "[megatron] ep_overlap_needs_virtual_pipeline: overlap_moe_expert_parallel_comm with "
        "p = 16 needs the interleaved schedule (a virtual pipeline size), got combined-1F1B x1 "
        "(transformer_config.py l.3002-3071)",
        "[megatron] ep_overlap_recompute: overlap_moe_expert_parallel_comm refuses recompute = "
        "full(uniform,1) (full recompute and the moe recompute module re-run the layer it "
        "splits; transformer_config.py l.3002-3071)",
        "[megatron] ep_overlap_mtp_layers: overlap_moe_expert_parallel_comm takes at most 1 "
        "multi-token-prediction layer, got mtp_num_layers = 2 (transformer_config.py "
        "l.3002-3071)",
        "[megatron] ep_overlap_datatype: overlap_moe_expert_parallel_comm needs bf16 or fp16, "
        "got float32 (transformer_config.py l.3002-3071)",
        "[megatron] shared_expert_overlap: moe_shared_expert_overlap = true: it excludes "
        "overlap_moe_expert_parallel_comm (transformer_config.py l.3039-3041)",
    ]


def test_ep_overlap_lawful_with_interleaving() -> None:
    """DeepSeek-V3 as Megatron's best practice runs it (ZOO best_practice: PP8 VP4 EP64 on
    1024 H100, overlap on, MTP 1): the EP overlap's rules hold."""
    spec = _spec(
        DEEPSEEK_V3_LIKE,
        world_size=1024,
        tensor_model_parallel_size=2,
        sequence_parallel=True,
        expert_tensor_parallel_size=1,
        pipeline_model_parallel_size=8,
        pipeline_model_parallel_layout="Et|" + "tt|" * 30 + "L",
        expert_model_parallel_size=64,
        moe_token_dispatcher_type="flex",
        overlap_moe_expert_parallel_comm=True,
        moe_grouped_gemm=True,
        global_batch_size=8192,
    )
    assert spec.mapping.virtual_stages == 4
    assert spec.mapping.expert_data_degree == 1024 // (1 * 64 * 8)
    assert expert_laws(spec.model, spec.mapping) == []


def test_shared_expert_overlap_needs_shared_experts_and_no_shared_recompute() -> None:
    model = replace(GPT_OSS_LIKE, add_bias_linear=False)
    mapping = _with_experts(
        _spec(model, world_size=8, expert_model_parallel_size=8).mapping,
        ExpertParallel(degree=8, dispatcher=AllToAllDispatcher(shared_expert_overlap=True)),
    )
    mapping = replace(
        mapping,
        parallelism=replace(
            mapping.parallelism,
            recompute=SelectiveRecompute(
                modules=frozenset({RecomputeModule.SHARED_EXPERTS, RecomputeModule.MOE_ACT})
            ),
        ),
    )
    mapping = _with_experts(mapping, replace(mapping.parallelism.experts, grouped_gemm=False))
    assert [str(v) for v in expert_laws(model, mapping)] == [
        "[megatron] shared_expert_overlap: moe_shared_expert_overlap = true: model "
        "'gpt-oss-120b' has no shared experts; it excludes the shared_experts recompute module "
        "(transformer_config.py l.1991-1997)",
        "[megatron] moe_act_recompute_needs_grouped_gemm: recompute module moe_act needs "
        "moe_grouped_gemm = true (transformer_config.py l.1940-2025)",
    ]


def test_full_recompute_and_the_moe_module_both_break_the_overlap() -> None:
    base = _with_experts(
        _dsv3_mapping(expert_model_parallel_size=8),
        ExpertParallel(degree=8, dispatcher=AllToAllDispatcher(overlap=True)),
    )
    moe_module = replace(
        base,
        parallelism=replace(
            base.parallelism, recompute=SelectiveRecompute(modules=frozenset({RecomputeModule.MOE}))
        ),
    )
    full = replace(base, parallelism=replace(base.parallelism, recompute=FullRecompute()))
    for mapping in (moe_module, full):
        assert "ep_overlap_recompute" in _names(expert_laws(DEEPSEEK_V3_LIKE, mapping))


def _predicted(spec: TrainingSpec) -> set[str]:
    """The expert laws a spec breaks, from each law's formula (an oracle written apart from
    mapping/expert_laws.py)."""
    model, mapping = spec.model, spec.mapping
    moe = model.moe
    assert isinstance(moe, MixtureOfExperts)
    experts = mapping.parallelism.experts
    ep, etp, t, p = (
        experts.degree,
        experts.tensor_degree,
        mapping.tensor_degree,
        mapping.pipeline_degree,
    )
    dispatcher = experts.dispatcher
    flex = isinstance(dispatcher, FlexDispatcher)
    overlap = isinstance(dispatcher, AllToAllDispatcher | FlexDispatcher) and dispatcher.overlap
    shared_overlap = (
        isinstance(dispatcher, AllToAllDispatcher | FlexDispatcher)
        and dispatcher.shared_expert_overlap
    )
    delay = isinstance(dispatcher, AllToAllDispatcher | FlexDispatcher) and (
        dispatcher.delay_wgrad_compute
    )
    schedule = mapping.parallelism.pipeline.schedule
    combined = isinstance(schedule, CombinedOneForwardOneBackward)
    recompute = mapping.parallelism.recompute
    modules = recompute.modules if isinstance(recompute, SelectiveRecompute) else frozenset()
    conditions = {
        Law.EXPERT_WORLD_SIZE: mapping.world_size % (etp * ep * p) != 0,
        Law.EXPERTS_PER_EXPERT_RANK: moe.num_experts % ep != 0,
        Law.EXPERT_FFN_DIVISIBILITY: moe.expert_ffn_hidden_size % etp != 0,
        Law.MOE_TP_NEEDS_SEQUENCE_PARALLEL: mapping.tensor_degree > 1
        and not mapping.sequence_parallel,
        Law.SHARED_EXPERT_FFN_DIVISIBILITY: moe.shared_expert_ffn_hidden_size % t != 0,
        Law.MEGATRON_EXPERT_TENSOR_WITHOUT_BIAS: etp > 1 and model.add_bias_linear,
        Law.MEGATRON_EP_NEEDS_SEQUENCE_PARALLEL: ep > 1 and t > 1 and not mapping.sequence_parallel,
        Law.MEGATRON_FLEX_NEEDS_EXPERT_GRID: flex and etp * ep == 1,
        Law.MEGATRON_FLEX_NO_PAD_TO_CAPACITY: flex
        and isinstance(moe.dropping, CapacityFactor)
        and moe.dropping.pad_to_capacity,
        Law.MEGATRON_EP_OVERLAP_NEEDS_EP: overlap and ep == 1,
        Law.MEGATRON_EP_OVERLAP_NEEDS_VIRTUAL_PIPELINE: overlap
        and p > 1
        and not (
            isinstance(schedule, InterleavedOneForwardOneBackward)
            or (isinstance(schedule, CombinedOneForwardOneBackward) and schedule.virtual_stages > 1)
        ),
        Law.MEGATRON_EP_OVERLAP_RECOMPUTE: overlap
        and (isinstance(recompute, FullRecompute) or RecomputeModule.MOE in modules),
        Law.MEGATRON_EP_OVERLAP_MTP: overlap and model.mtp_num_layers > 1,
        Law.MEGATRON_EP_OVERLAP_DATATYPE: overlap and model.datatype is Datatype.FP32,
        Law.MEGATRON_SHARED_EXPERT_OVERLAP: shared_overlap
        and (
            moe.shared_expert_ffn_hidden_size == 0
            or overlap
            or RecomputeModule.SHARED_EXPERTS in modules
        ),
        Law.MEGATRON_MOE_ACT_RECOMPUTE: RecomputeModule.MOE_ACT in modules
        and not experts.grouped_gemm,
        Law.MEGATRON_DELAY_WGRAD_NEEDS_EP_OVERLAP: delay and not overlap,
        Law.COMBINED_SCHEDULE_MATCHES_DISPATCHER: combined != overlap,
    }
    assert set(conditions) == EXPERT_LAWS - {Law.EXPERT_PARALLEL_NEEDS_MOE}
    return {str(law) for law, broken in conditions.items() if broken}


@settings(max_examples=300, deadline=None)
@given(moe_training_specs())
def test_every_broken_expert_law_is_reported_at_once(spec: TrainingSpec) -> None:
    violations = check_training(spec.model, spec.mapping)
    reported = [v for v in violations if v.law in EXPERT_LAW_NAMES]
    assert {v.law for v in reported} == _predicted(spec)
    assert all(v.ruleset is Law(v.law).ruleset for v in reported)
    planner_only = check_training(spec.model, spec.mapping, megatron=False)
    assert {v.law for v in planner_only if v.law in EXPERT_LAW_NAMES} == {
        law for law in _predicted(spec) if Law(law).ruleset is RuleSet.PLANNER
    }


@settings(max_examples=300, deadline=None)
@given(moe_training_specs())
def test_an_accepted_expert_grid_is_integral(spec: TrainingSpec) -> None:
    """Any strategy the expert laws accept has an integral expert-dp that, with etp and ep,
    tiles the t * cp * d ranks of each stage, and E / ep experts per rank."""
    names = set(_names(check_training(spec.model, spec.mapping)))
    mapping = spec.mapping
    moe = spec.model.moe
    assert moe is not None
    ep, etp = mapping.expert_degree, mapping.expert_tensor_degree
    if "expert_world_size" not in names:
        edp = mapping.expert_data_degree
        assert edp * etp * ep * mapping.pipeline_degree == mapping.world_size
        assert (
            etp * ep * edp == mapping.tensor_degree * mapping.context_degree * mapping.data_degree
        )
    if "experts_per_expert_rank" not in names:
        assert (moe.num_experts // ep) * ep == moe.num_experts
    if "expert_ffn_per_expert_tensor_rank" not in names:
        assert (moe.expert_ffn_hidden_size // etp) * etp == moe.expert_ffn_hidden_size
