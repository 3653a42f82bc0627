"""MoE and MLA serving: resident experts, active-expert prefill, touched-expert decode, the MLA
latent KV cache, the expert-parallel laws and the ep axis of the search.

Models are built here (Mixtral 8x7B and DeepSeek-V3 with the dimensions of
``shared/reference/modern_parallelism.md`` section 4), not taken from presets."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.errors import InvalidStrategyError, UnsupportedError
from blueprinting.hardware.presets import system_preset
from blueprinting.inference.analysis import analyze_inference
from blueprinting.inference.memory import memory_per_gpu
from blueprinting.inference.search import SearchOptions, search_inference, search_layouts
from blueprinting.mapping.flat_keys import inference_from_mapping
from blueprinting.mapping.model import (
    Datatype,
    DenseFeedForward,
    TransformerModelSpec,
)
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import InferenceSpec
from blueprinting.synthesizer.dialects.transformer.inference import (
    ServingOpName,
    experts_touched,
    kv_cache_bytes_per_token,
)
from blueprinting.synthesizer.dialects.transformer.inference_derivation import (
    derive_inference_plan,
)

MIXTRAL = model_preset("mixtral-8x7b")
DEEPSEEK_V3 = model_preset("deepseek-v3")

H = 4096
F = 14336
#: one Mixtral expert: SwiGLU up (h x 2F) and down (F x h)
MIXTRAL_EXPERT = 3 * H * F


def _spec(model: TransformerModelSpec, **keys: int | str | bool) -> InferenceSpec:
    base: dict[str, object] = {"batch_size": 1, "prompt_length": 128, "generated_tokens": 8}
    base.update(keys)
    return inference_from_mapping(base, model=model)


# ---- the touched-experts formula -----------------------------------------------------------
def test_one_token_touches_top_k_and_many_touch_nearly_all() -> None:
    assert experts_touched(256, 8, 1) == 8.0
    assert experts_touched(8, 2, 1) == 2.0
    # E (1 - (1 - k/E)^B) at B = 2: 8 (1 - 0.75^2) = 3.5
    assert experts_touched(8, 2, 2) == pytest.approx(3.5, rel=1e-12)
    assert experts_touched(256, 8, 4096) == pytest.approx(256.0, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    experts=st.integers(min_value=1, max_value=512),
    data=st.data(),
    tokens=st.integers(min_value=1, max_value=100_000),
)
def test_touched_experts_monotone_in_tokens_and_bounded(
    experts: int, data: st.DataObject, tokens: int
) -> None:
    k = data.draw(st.integers(min_value=1, max_value=experts))
    now, more = experts_touched(experts, k, tokens), experts_touched(experts, k, tokens + 1)
    assert k <= now + 1e-9
    assert now <= more + 1e-9
    assert more <= experts + 1e-9


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(min_value=1, max_value=2048))
def test_decode_expert_bytes_monotone_in_batch_and_bounded_by_all_experts(batch: int) -> None:
    """Decode reads the touched experts' weights: non-decreasing in B, never beyond every
    expert (Mixtral at t = 2, ep = 2: each rank holds 4 experts of full width)."""
    plan = derive_inference_plan(
        MIXTRAL, _spec(MIXTRAL, tensor_model_parallel_size=2, expert_model_parallel_size=2).mapping
    )

    def expert_bytes(b: int) -> int:
        return sum(op.expert_weight_bytes for op in plan.decode(b, 128).moe_block)

    resident = 4 * MIXTRAL_EXPERT * 2
    assert expert_bytes(batch) <= expert_bytes(batch + 1) <= resident


# ---- weights resident ----------------------------------------------------------------------
def test_mixtral_weight_bytes_per_gpu_at_t2_ep2() -> None:
    """Every expert resident: 4 of 8 full-width experts per GPU (ep 2, expert TP 1), attention
    split over t = 2 (8 KV groups / 2), embedding and LM head over t, norms and router
    replicated; bf16."""
    plan = derive_inference_plan(
        MIXTRAL, _spec(MIXTRAL, tensor_model_parallel_size=2, expert_model_parallel_size=2).mapping
    )
    memory = memory_per_gpu(plan, batch=1, capacity=141e9)
    experts = 32 * 4 * MIXTRAL_EXPERT * 2
    attention = H * (2048 + 2 * 512) + 2048 * H  # q, k, v / 2 and o / 2
    layer_dense = attention + H * 8 + 2 * H  # router h x E, two RMSNorm gains
    dense = (32 * layer_dense + 2 * (32000 // 2) * H + H) * 2
    assert memory.expert_weights == experts == 45_097_156_608
    assert memory.dense_weights == dense
    assert memory.weights == experts + dense


def test_mixtral_expert_tensor_split_holds_the_same_bytes_at_ep1() -> None:
    """t = 2 with ep = 1: all 8 experts per GPU at half width, the same expert bytes as ep 2."""
    by_ep = {
        ep: memory_per_gpu(
            derive_inference_plan(
                MIXTRAL,
                _spec(MIXTRAL, tensor_model_parallel_size=2, expert_model_parallel_size=ep).mapping,
            ),
            batch=1,
            capacity=141e9,
        )
        for ep in (1, 2)
    }
    assert by_ep[1].expert_weights == by_ep[2].expert_weights
    assert by_ep[1].dense_weights == by_ep[2].dense_weights


@pytest.mark.parametrize(
    "model",
    # gpt-oss (attention sinks, biased experts) and qwen3 (QK norms): every part is counted
    [MIXTRAL, DEEPSEEK_V3, model_preset("gpt-oss-20b"), model_preset("qwen3-30b-a3b")],
    ids=lambda m: m.name,
)
def test_single_gpu_weights_are_the_model_parameters(model: TransformerModelSpec) -> None:
    """At t = p = 1 the resident weights are exactly Megatron's parameter count (MTP layers not
    loaded for serving)."""
    plan = derive_inference_plan(model, _spec(model).mapping, megatron=False)
    memory = memory_per_gpu(plan, batch=1, capacity=1e15)
    assert memory.weights == model.num_parameters * 2
    moe = model.moe
    assert moe is not None
    assert memory.expert_weights == model.num_moe_layers * model.routed_expert_parameters * 2


# ---- prefill and decode work -----------------------------------------------------------------
def test_decode_at_batch_one_reads_dense_plus_top_k_experts_per_layer() -> None:
    """B = 1, t = 1: every dense weight once and exactly k = 2 experts per MoE layer."""
    plan = derive_inference_plan(MIXTRAL, _spec(MIXTRAL).mapping)
    step = plan.decode(1, 200)
    layer_weights = sum(op.weight_bytes for op in step.moe_block)
    layer_experts = sum(op.expert_weight_bytes for op in step.moe_block)
    dense_layer = MIXTRAL.moe_block_parameters - MIXTRAL.routed_expert_parameters
    assert layer_experts == 2 * MIXTRAL_EXPERT * 2
    assert layer_weights == (dense_layer + 2 * MIXTRAL_EXPERT) * 2
    assert step.experts_touched == 2.0


def test_prefill_computes_only_the_active_experts() -> None:
    """Routed-expert matrix FLOPs of a prefill = 2 x tokens x k x (3 h F) (section 2.5), on the
    t = 2, ep = 2 rank: half of them; the router 2 tokens h E on every rank."""
    tokens = 3 * 128
    plan = derive_inference_plan(
        MIXTRAL,
        _spec(
            MIXTRAL, batch_size=3, tensor_model_parallel_size=2, expert_model_parallel_size=2
        ).mapping,
    )
    ops = {op.name: op for op in plan.prefill(3).moe_block}
    routed = (
        ops[ServingOpName.EXPERT_UP].work.matrix_flops
        + ops[ServingOpName.EXPERT_DOWN].work.matrix_flops
    )
    assert routed == 2 * tokens * 2 * MIXTRAL_EXPERT // 2
    assert ops[ServingOpName.ROUTER].work.matrix_flops == 2 * tokens * H * 8


def test_deepseek_prefill_flops_per_token_by_hand() -> None:
    """One MoE layer's forward matrix FLOPs per token at t = 1 (section 2.5 and 2.10): 2 x
    (MLA projections + router + 8 routed + 1 shared expert), plus the causal MLA core of
    qk 192 and v 128 per head."""
    prompt = 64
    plan = derive_inference_plan(
        DEEPSEEK_V3, _spec(DEEPSEEK_V3, prompt_length=prompt).mapping, megatron=False
    )
    step = plan.prefill(1)
    h, n = 7168, 128
    projections = 1536 * h + 1536 * n * 192 + h * 576 + 512 * n * 256 + n * 128 * h
    expert = 3 * h * 2048
    per_token = 2 * (projections + h * 256 + 8 * expert + expert)
    pairs = prompt * (prompt + 1) // 2
    core = 2 * (192 + 128) * n * pairs
    assert sum(op.work.matrix_flops for op in step.moe_block) == prompt * per_token + core


def test_mla_kv_cache_bytes_per_token_is_the_latent() -> None:
    """DeepSeek-V3 in bf16: 61 x (512 + 64) x 2 bytes per token, whatever t (each TP rank keeps
    the latent); GQA unchanged."""
    per_layer = kv_cache_bytes_per_token(DEEPSEEK_V3, 8, Datatype.BF16)
    assert 61 * per_layer == 61 * (512 + 64) * 2 == 70_272
    assert kv_cache_bytes_per_token(MIXTRAL, 2, Datatype.BF16) == 2 * 4 * 128 * 2


def test_mla_decode_reads_the_latent_cache_once_per_layer() -> None:
    plan = derive_inference_plan(
        DEEPSEEK_V3, _spec(DEEPSEEK_V3, tensor_model_parallel_size=8).mapping, megatron=False
    )
    step = plan.decode(4, 999)
    assert sum(op.kv_cache_bytes for op in step.block) == 4 * 1000 * 576 * 2
    # the absorbed decode reads the same up-projection weights as the prefill's expansion
    prefill = plan.prefill(1)
    assert sum(op.weight_bytes for op in step.block) == sum(op.weight_bytes for op in prefill.block)


# ---- laws, keys, reports -------------------------------------------------------------------
def test_expert_laws_are_reported_all_at_once() -> None:
    spec = _spec(MIXTRAL, tensor_model_parallel_size=2, expert_model_parallel_size=3)
    with pytest.raises(InvalidStrategyError) as caught:
        derive_inference_plan(MIXTRAL, spec.mapping)
    laws = {v.law for v in caught.value.violations}
    assert {"serving_experts_in_tensor_group", "experts_per_expert_rank"} <= laws


def test_a_dense_model_refuses_expert_parallelism() -> None:
    model = replace(MIXTRAL, name="dense", feed_forward=DenseFeedForward())
    spec = _spec(model, tensor_model_parallel_size=2, expert_model_parallel_size=2)
    with pytest.raises(InvalidStrategyError) as caught:
        derive_inference_plan(model, spec.mapping)
    assert [v.law for v in caught.value.violations] == ["expert_parallel_needs_experts"]


def test_context_parallel_is_still_refused_in_serving() -> None:
    with pytest.raises(UnsupportedError, match="context_parallel_size = 2"):
        _spec(MIXTRAL, context_parallel_size=2)


def test_report_json_has_the_expert_split_and_touched_experts() -> None:
    spec = _spec(MIXTRAL, batch_size=4, tensor_model_parallel_size=2, expert_model_parallel_size=2)
    report = analyze_inference(spec, system_preset("dgx-h200"))
    data = json.loads(json.dumps(report.to_json_dict()))
    memory = data["memory_bytes"]
    assert memory["weights"] == memory["dense_weights"] + memory["expert_weights"]
    assert memory["expert_weights"] == 45_097_156_608
    experts = data["experts"]
    assert experts["expert_parallel_size"] == 2
    assert experts["expert_tensor_parallel_size"] == 1
    assert experts["experts_per_rank"] == 4
    touched = experts["experts_touched_per_layer"]
    assert touched["decode"] == pytest.approx(8 * (1 - 0.75**4), rel=1e-12)
    assert touched["prefill"] == pytest.approx(8.0, rel=1e-9)
    assert data["strategy"]["expert_model_parallel_size"] == 2
    assert "EP2" in data["summary"]
    decode = data["bounds"]["decode"]["bytes"]
    assert 0 < decode["expert_weights"] < decode["weights"]


def test_dense_reports_carry_no_experts() -> None:
    model = replace(MIXTRAL, name="dense", feed_forward=DenseFeedForward())
    data = analyze_inference(_spec(model), system_preset("dgx-h200")).to_json_dict()
    assert data["experts"] is None
    memory = data["memory_bytes"]
    assert isinstance(memory, dict)
    assert memory["expert_weights"] == 0


def test_search_covers_expert_parallelism_for_moe() -> None:
    spec = _spec(MIXTRAL, replicas=8, generated_tokens=16)
    reports = search_inference(spec, system_preset("dgx-h100"), SearchOptions(top=1000))
    degrees = {(r.spec.mapping.tensor_degree, r.spec.mapping.expert_degree) for r in reports}
    assert {(2, 2), (4, 4), (8, 8), (8, 1)} <= degrees
    assert all(t % ep == 0 for t, ep in degrees)


def test_search_lists_its_layouts_before_costing_them() -> None:
    """Mixtral (32 layers, 8 experts) on 16 H100s: t | 8, p | 32, t p | 16, ep | t with
    8 mod ep = 0; the progress callback counts every layout once, then the total."""
    spec = _spec(MIXTRAL, replicas=16, generated_tokens=4)
    system = system_preset("dgx-h100")
    layouts = search_layouts(spec, system)
    want = [
        (t, p, ep)
        for t in (1, 2, 4, 8)
        for p in (1, 2, 4, 8, 16, 32)
        if 16 % (t * p) == 0
        for ep in (1, 2, 4, 8)
        if t % ep == 0
    ]
    assert layouts == want
    assert len(layouts) == 5 + 4 * 2 + 3 * 3 + 2 * 4  # t = 1, 2, 4, 8
    seen: list[tuple[int, int]] = []
    reports = search_inference(
        spec, system, SearchOptions(top=5), progress=lambda done, total: seen.append((done, total))
    )
    assert seen == [(i, len(layouts)) for i in range(len(layouts) + 1)]
    assert reports == search_inference(spec, system, SearchOptions(top=5))
