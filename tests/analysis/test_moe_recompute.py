"""The MoE and MLA recompute modules (``--recompute-modules moe_act mla_up_proj moe
shared_experts``): what each drops from the stored activations, what it re-runs in backward
(the DistributedTaskIR's recompute chains), its FLOPs, and the laws of their start-up rules."""

from __future__ import annotations

from dataclasses import replace

import pytest

from blueprinting.analysis.evaluate import PlanOptions
from blueprinting.analysis.flops import FlopsConvention, recompute_flops_per_iteration
from blueprinting.analysis.memory import layer_activation_bytes, moe_ffn_activation_bytes
from blueprinting.api import plan_spec
from blueprinting.mapping.flat_keys import from_mapping
from blueprinting.mapping.laws import check_training
from blueprinting.mapping.model import MultiLatentAttention
from blueprinting.mapping.precision import Fp8Precision, Fp8Recipe
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import (
    AllToAllDispatcher,
    BatchSpec,
    DataParallel,
    DistributedOptimizer,
    ExpertParallel,
    FusedAttention,
    PipelineParallel,
    RecomputeModule,
    ReduceScatterAllGather,
    SelectiveRecompute,
    SingleStage,
    TensorParallel,
    TrainingSpec,
    TransformerTrainingMappingSpec,
    TransformerTrainingParallelism,
)
from blueprinting.synthesizer.dialects.transformer.training import (
    CollectivePurpose,
    EagerPasses,
    SemanticOpName,
)
from blueprinting.synthesizer.dialects.transformer.training_derivation import (
    derive_training_block,
)
from blueprinting.synthesizer.stages.distributed.ir import (
    CollectiveTask,
    ComputeTask,
    Phase,
    TaskGroup,
)
from tests.synthesizer.moe_models import deepseek_like, mixtral_like

M = RecomputeModule


def _mapping(
    modules: frozenset[RecomputeModule], *, tp: int = 1, ep: int = 8, dp: int = 8
) -> TransformerTrainingMappingSpec:
    return TransformerTrainingMappingSpec(
        parallelism=TransformerTrainingParallelism(
            tensor=TensorParallel(degree=tp, communication=ReduceScatterAllGather())
            if tp > 1
            else TensorParallel(degree=1),
            pipeline=PipelineParallel(degree=1, schedule=SingleStage()),
            data=DataParallel(degree=dp, optimizer_sharding=DistributedOptimizer()),
            experts=ExpertParallel(degree=ep, dispatcher=AllToAllDispatcher()),
            recompute=SelectiveRecompute(modules=modules),
        ),
        batch=BatchSpec(global_batch_size=dp, micro_batch_size=1),
    )


def _recompute(group: TaskGroup | None) -> list[ComputeTask | CollectiveTask]:
    assert group is not None
    return [t for t in group.tasks if t.phase is Phase.RECOMPUTE]


def _ops(tasks: list[ComputeTask | CollectiveTask]) -> list[SemanticOpName]:
    return [t.lineage.op for t in tasks if isinstance(t, ComputeTask)]


# ---- what is re-run ------------------------------------------------------------------------
def test_moe_act_reruns_the_expert_activation_alone() -> None:
    ir = derive_training_block(deepseek_like(), _mapping(frozenset({M.MOE_ACT})))
    again = _recompute(ir.moe_block)
    assert _ops(again) == [SemanticOpName.EXPERT_ACTIVATION]
    assert ir.moe_block is not None
    forward = [
        t
        for t in ir.moe_block.tasks
        if t.phase is Phase.FORWARD
        and isinstance(t, ComputeTask)
        and t.lineage.op is SemanticOpName.EXPERT_ACTIVATION
    ]
    assert [t.work for t in again if isinstance(t, ComputeTask)] == [t.work for t in forward]
    # the dense block has no expert activation: nothing to re-run
    assert _recompute(ir.block) == []


def test_mla_up_proj_reruns_from_the_gathered_latents() -> None:
    """t = 2 with SP: the up projections re-run on every layer, without the latents'
    all-gather (the checkpoint holds the gathered latents); the dense MLP module, by contrast,
    re-runs its sequence-parallel all-gather."""
    ir = derive_training_block(
        deepseek_like(), _mapping(frozenset({M.MLA_UP_PROJ, M.MLP}), tp=2, ep=8, dp=4)
    )
    moe_again = _recompute(ir.moe_block)
    assert _ops(moe_again) == [SemanticOpName.MLA_UP_PROJECTION]
    assert not [t for t in moe_again if isinstance(t, CollectiveTask)]
    dense_again = _recompute(ir.block)
    assert _ops(dense_again) == [
        SemanticOpName.MLA_UP_PROJECTION,
        SemanticOpName.MLP_UP,
        SemanticOpName.MLP_ACTIVATION,
        SemanticOpName.MLP_DOWN,
    ]
    gathers = [t for t in dense_again if isinstance(t, CollectiveTask)]
    assert [(t.kind.value, t.purpose) for t in gathers] == [
        ("all_gather", CollectivePurpose.BOUNDARY),
        ("reduce_scatter", CollectivePurpose.BOUNDARY),
    ]


def test_moe_module_reruns_the_layer_with_its_dispatch() -> None:
    """The whole MoE layer: router to unpermute (with the alltoall dispatcher's chunk sort of
    the 32 local experts) and the shared expert, with the dispatch and combine exchanges of the
    forward (same bytes)."""
    ir = derive_training_block(deepseek_like(), _mapping(frozenset({M.MOE})))
    again = _recompute(ir.moe_block)
    assert _ops(again) == [
        SemanticOpName.ROUTER,
        SemanticOpName.MOE_PERMUTE,
        SemanticOpName.MOE_SORT_CHUNKS,
        SemanticOpName.EXPERT_FC1,
        SemanticOpName.EXPERT_ACTIVATION,
        SemanticOpName.EXPERT_FC2,
        SemanticOpName.MOE_UNSORT_CHUNKS,
        SemanticOpName.MOE_UNPERMUTE,
        SemanticOpName.SHARED_EXPERT_UP,
        SemanticOpName.SHARED_EXPERT_ACTIVATION,
        SemanticOpName.SHARED_EXPERT_DOWN,
    ]
    assert ir.moe_block is not None
    forward_a2a = [
        t.bytes
        for t in ir.moe_block.tasks
        if isinstance(t, CollectiveTask)
        and t.phase is Phase.FORWARD
        and t.purpose is CollectivePurpose.TOKEN_DISPATCH
    ]
    again_a2a = [t.bytes for t in again if isinstance(t, CollectiveTask)]
    # the token counts' all-gather, the tokens' and the routing probabilities' all-to-alls,
    # the combine
    assert again_a2a == forward_a2a and len(again_a2a) == 4


def test_shared_experts_module_reruns_the_shared_expert() -> None:
    ir = derive_training_block(deepseek_like(), _mapping(frozenset({M.SHARED_EXPERTS})))
    assert _ops(_recompute(ir.moe_block)) == [
        SemanticOpName.SHARED_EXPERT_UP,
        SemanticOpName.SHARED_EXPERT_ACTIVATION,
        SemanticOpName.SHARED_EXPERT_DOWN,
    ]


# ---- what is no longer stored ---------------------------------------------------------------
def test_mla_up_proj_drops_q_k_and_v() -> None:
    """DeepSeek-V3 (128 heads, d_qk = 128 + 64, d_v = 128), t = 1, bf16: s x 2 x 128 x
    (2 x 192 + 128) bytes per layer; the core output and the latents stay."""
    model = deepseek_like()
    assert isinstance(model.self_attention, MultiLatentAttention)

    def stored(recomputed: frozenset[RecomputeModule]) -> int:
        return layer_activation_bytes(
            model,
            micro_batch=1,
            tensor_degree=1,
            sequence_parallel=False,
            attention=FusedAttention(),
            recomputed=recomputed,
            activation_bytes=2,
        )

    assert stored(frozenset()) - stored(frozenset({M.MLA_UP_PROJ})) == 4096 * 2 * 128 * (
        2 * 192 + 128
    )


def _ffn(model_name: str, recomputed: frozenset[RecomputeModule]) -> int:
    model = deepseek_like() if model_name == "deepseek" else mixtral_like()
    return moe_ffn_activation_bytes(
        model,
        micro_batch=1,
        tensor_degree=1,
        sequence_parallel=False,
        experts=ExpertParallel(degree=8),
        activation_bytes=2,
        recomputed=recomputed,
        eager=EagerPasses(),
    )


def test_moe_act_drops_the_activation_output_and_keeps_fc1s() -> None:
    """DeepSeek-V3, T = 4096, k = 8, F = 2048: the activation output k T F x = 134 MB (section
    2.8's worked example) leaves; the FC1 output (2F wide) stays as the checkpoint's input."""
    assert _ffn("deepseek", frozenset()) - _ffn("deepseek", frozenset({M.MOE_ACT})) == (
        8 * 4096 * 2048 * 2
    )


def test_moe_and_shared_expert_modules_drop_their_stores() -> None:
    """shared_experts: the shared expert's FC1 output (2 x 2048) and activation (2048) at
    t = 1 (no gathered input); moe: everything the MoE feed-forward stores."""
    full = _ffn("deepseek", frozenset())
    assert full - _ffn("deepseek", frozenset({M.SHARED_EXPERTS})) == 4096 * 2 * (2 * 2048 + 2048)
    assert _ffn("deepseek", frozenset({M.MOE})) == 0
    assert _ffn("mixtral", frozenset({M.SHARED_EXPERTS})) == _ffn("mixtral", frozenset())


# ---- FLOPs --------------------------------------------------------------------------------
def test_recompute_flops_of_the_moe_modules() -> None:
    """Per iteration (B = 8 sequences of 4096): mla_up_proj adds 2 (q_lora n d_qk + c_kv n
    (d_n + d_v)) per token and layer; moe_act none (no GEMM); moe the routed and shared
    experts of the MoE layers; mlp only the dense layers' MLPs."""
    model = deepseek_like()
    convention = FlopsConvention.MEGATRON_BRIDGE
    tokens = 8 * 4096

    def flops(modules: frozenset[RecomputeModule]) -> int:
        return recompute_flops_per_iteration(model, _mapping(modules), convention)

    up = 1536 * 128 * 192 + 512 * 128 * (128 + 128)
    assert flops(frozenset({M.MLA_UP_PROJ})) == tokens * 4 * 2 * up
    assert flops(frozenset({M.MOE_ACT})) == 0
    h, f, shared, dense_ffn = 7168, 2048, 2048, 18432
    routed = 8 * 2 * 3 * h * f  # top-8, SwiGLU: 2 h (2F) + 2 F h per expert
    assert flops(frozenset({M.MOE})) == tokens * 3 * (routed + 2 * 3 * h * shared)
    assert flops(frozenset({M.SHARED_EXPERTS})) == tokens * 3 * 2 * 3 * h * shared
    assert flops(frozenset({M.MLP})) == tokens * 1 * 2 * 3 * h * dense_ffn


# ---- the plan -----------------------------------------------------------------------------
def test_recomputing_moe_act_costs_time_and_saves_memory() -> None:
    model = deepseek_like()
    options = PlanOptions(megatron_rules=False, simulate=False)
    base = plan_spec(
        TrainingSpec(model=model, mapping=_mapping(frozenset({M.CORE_ATTN}))), "dgx-h100", options
    )
    act = plan_spec(
        TrainingSpec(model=model, mapping=_mapping(frozenset({M.CORE_ATTN, M.MOE_ACT}))),
        "dgx-h100",
        options,
    )
    assert act.breakdown.recompute > base.breakdown.recompute
    saved = base.memory.activations - act.memory.activations
    # three MoE layers, one micro-batch in flight on the single stage
    assert saved == 3 * 8 * 4096 * 2048 * 2


# ---- laws ---------------------------------------------------------------------------------
def test_a_module_without_its_layer_is_refused() -> None:
    gpt = model_preset("gpt3-175b")
    spec = from_mapping(
        {
            "tensor_model_parallel_size": 8,
            "pipeline_model_parallel_size": 1,
            "data_parallel_size": 1,
            "micro_batch_size": 1,
            "global_batch_size": 8,
            "recompute_granularity": "selective",
            "recompute_modules": "moe_act mla_up_proj shared_experts",
            "sequence_parallel": True,
        },
        model=gpt,
    )
    laws = {v.law: v.message for v in check_training(gpt, spec.mapping, megatron=False)}
    assert laws["recompute_module_needs_its_layer"] == (
        "recompute_modules: moe_act needs mixture-of-experts layers; shared_experts needs "
        "shared experts; mla_up_proj needs multi-latent attention (Megatron-LM: 'only "
        "supported with multi_latent_attention'); model 'gpt3-175b' has none"
    )
    mixtral = mixtral_like()
    mapping = _mapping(frozenset({M.MLA_UP_PROJ, M.SHARED_EXPERTS, M.MOE_ACT}))
    refused = [v for v in check_training(mixtral, mapping, megatron=False)]
    assert [v.law for v in refused] == ["recompute_module_needs_its_layer"]
    assert "moe_act" not in refused[0].message.split(";")[0]


def test_delayed_fp8_refuses_moe_act_and_layernorm_with_the_others() -> None:
    model = deepseek_like()
    mapping = replace(
        _mapping(frozenset({M.MOE_ACT, M.LAYERNORM, M.CORE_ATTN})),
        precision=Fp8Precision(recipe=Fp8Recipe.DELAYED),
    )
    laws = {v.law: v for v in check_training(model, mapping)}
    assert laws["fp8_delayed_scaling_recompute"].values == (("modules", "layernorm moe_act"),)
    ok = replace(mapping, precision=Fp8Precision(recipe=Fp8Recipe.TENSORWISE))
    assert "fp8_delayed_scaling_recompute" not in {v.law for v in check_training(model, ok)}
    with_mla = {v.law for v in check_training(model, _mapping(frozenset({M.MLA_UP_PROJ})))}
    assert "recompute_module_needs_its_layer" not in with_mla


@pytest.mark.parametrize("module", [M.MOE_ACT, M.MLA_UP_PROJ, M.MOE, M.SHARED_EXPERTS])
def test_every_module_round_trips_through_the_flat_keys(module: RecomputeModule) -> None:
    from blueprinting.mapping.flat_keys import to_mapping

    spec = TrainingSpec(model=deepseek_like(), mapping=_mapping(frozenset({module})))
    back = from_mapping(to_mapping(spec), model=spec.model)
    assert back.mapping.parallelism.recompute == SelectiveRecompute(modules=frozenset({module}))


def test_full_recompute_still_regathers_the_latents() -> None:
    """Under full recompute the block re-runs from its input, so the latents' all-gather runs
    again before the up projections (the verifier's recompute chain holds S(seq) there)."""
    from blueprinting.mapping.transformer import FullRecompute

    mapping = replace(
        _mapping(frozenset({M.CORE_ATTN}), tp=2, ep=8, dp=4),
        parallelism=replace(
            _mapping(frozenset({M.CORE_ATTN}), tp=2, ep=8, dp=4).parallelism,
            recompute=FullRecompute(),
        ),
    )
    ir = derive_training_block(deepseek_like(), mapping)
    again = _recompute(ir.moe_block)
    at = next(
        i
        for i, t in enumerate(again)
        if isinstance(t, ComputeTask) and t.lineage.op is SemanticOpName.MLA_UP_PROJECTION
    )
    before = again[at - 1]
    assert isinstance(before, CollectiveTask) and before.kind.value == "all_gather"
