"""MoE / MLA / MTP model keys: Megatron names both ways, model-only rules, moe_layer_freq."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.errors import ConfigError
from blueprinting.mapping.flat_keys import EXPERT_KEYS, from_mapping, to_mapping, to_megatron_args
from blueprinting.mapping.model import (
    CapacityFactor,
    Dropless,
    LoadBalancing,
    MixtureOfExperts,
    MoeLayerFrequency,
    MoeLayerList,
    MultiLatentAttention,
    RouterScore,
    SlidingWindow,
    SoftmaxType,
    StandardAttention,
    TransformerModelSpec,
)
from blueprinting.mapping.moe_layer_freq import format_moe_layer_freq, parse_moe_layer_freq
from blueprinting.mapping.presets import MODEL_PRESETS, model_preset
from blueprinting.mapping.transformer import TrainingSpec

_RUN = {"tensor_model_parallel_size": 1, "data_parallel_size": 1}
_SMALL = {
    "num_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "seq_length": 128,
    "vocab_size": 100,
    **_RUN,
}


def _unpublished(model: TransformerModelSpec) -> TransformerModelSpec:
    return replace(model, published_parameters=None, published_active_parameters=None)


@pytest.mark.parametrize("name", list(MODEL_PRESETS))
def test_every_preset_round_trips(name: str) -> None:
    spec = from_mapping(_RUN, model=_unpublished(MODEL_PRESETS[name]))
    assert from_mapping(to_mapping(spec)) == spec


def test_deepseek_v3_keys_are_megatron_names() -> None:
    keys = to_mapping(from_mapping(_RUN, model=model_preset("deepseek-v3")))
    assert {
        k: v
        for k, v in keys.items()
        if k.startswith(("moe_", "num_experts")) and k not in EXPERT_KEYS
    } == {
        "num_experts": 256,
        "moe_router_topk": 8,
        "moe_ffn_hidden_size": 2048,
        "moe_shared_expert_intermediate_size": 2048,
        "moe_layer_freq": "([0]*3+[1]*58)",
        "moe_router_score_function": "sigmoid",
        "moe_router_enable_expert_bias": True,
    }
    assert (keys["multi_latent_attention"], keys["q_lora_rank"], keys["kv_lora_rank"]) == (
        True,
        1536,
        512,
    )
    assert (keys["qk_head_dim"], keys["qk_pos_emb_head_dim"], keys["v_head_dim"]) == (128, 64, 128)
    assert (keys["qk_layernorm"], keys["mtp_num_layers"]) == (True, 1)


def test_megatron_flags() -> None:
    args = to_megatron_args(from_mapping(_RUN, model=model_preset("deepseek-v3")))
    text = " ".join(args)
    assert (
        "--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 "
        "--qk-pos-emb-head-dim 64 --v-head-dim 128 --qk-layernorm --num-experts 256 "
        "--moe-router-topk 8 --moe-ffn-hidden-size 2048 "
        "--moe-shared-expert-intermediate-size 2048 --moe-layer-freq ([0]*3+[1]*58) "
        "--moe-router-score-function sigmoid --moe-router-enable-expert-bias --mtp-num-layers 1"
    ) in text
    oss = " ".join(to_megatron_args(from_mapping(_RUN, model=model_preset("gpt-oss-120b"))))
    assert "--softmax-type learnable --window-size (128,0) --window-attn-skip-freq 2" in oss
    assert "--moe-load-imbalance" not in " ".join(
        to_megatron_args(
            from_mapping({**_SMALL, "num_experts": 4, "moe_load_imbalance": 0.2, "bf16": True})
        )
    )


def test_moe_defaults_are_megatron_defaults() -> None:
    """top-k 2, moe_ffn_hidden_size = ffn_hidden_size, softmax, dropless, every layer MoE."""
    moe = from_mapping({**_SMALL, "num_experts": 8}).model.moe
    assert moe == MixtureOfExperts(num_experts=8, top_k=2, expert_ffn_hidden_size=256)
    assert moe.dropping == Dropless() and moe.layer_pattern == MoeLayerFrequency(every=1)


def test_overrides_on_a_moe_preset() -> None:
    model = from_mapping(
        {**_RUN, "num_experts": 64, "mtp_num_layers": 0}, model=model_preset("deepseek-v3")
    ).model
    assert model.moe is not None
    assert (model.moe.num_experts, model.moe.top_k, model.mtp_num_layers) == (64, 8, 0)
    assert model.published_parameters is None


def test_model_rules_all_at_once() -> None:
    with pytest.raises(ConfigError) as error:
        from_mapping(
            {
                **_SMALL,
                "num_experts": 4,
                "moe_router_topk": 1,
                "moe_layer_freq": "([0]*3+[1]*2)",
                "multi_latent_attention": True,
                "group_query_attention": True,
                "num_query_groups": 2,
                "moe_router_enable_expert_bias": True,
                "moe_pad_expert_input_to_capacity": True,
            }
        )
    assert error.value.problems == (
        "multi_latent_attention cannot be combined with group_query_attention "
        "(Megatron-LM arguments.py l.1973-1974)",
        "moe_pad_expert_input_to_capacity needs moe_expert_capacity_factor "
        "(Megatron-LM transformer_config.py l.1836-1866)",
        "moe_layer_freq lists 5 layers, num_layers = 4 (Megatron-LM requires one flag per layer)",
        "moe_router_enable_expert_bias needs moe_router_score_function sigmoid or sqrtsoftplus, "
        "got softmax (Megatron-LM transformer_config.py l.2617-2625)",
        "moe_router_topk = 1 with moe_router_score_function = softmax needs "
        "moe_router_pre_softmax = true or sinkhorn balancing (Megatron-LM "
        'transformer_config.py l.2661-2669: "Please use --moe-router-pre-softmax when topk '
        'is 1")',
    )


def test_top_one_softmax_routing_plans_with_pre_softmax() -> None:
    """Megatron's functional tests route top-1 over softmax scores with
    --moe-router-pre-softmax: the key is read, written back and emitted as the flag."""
    keys: dict[str, object] = {**_SMALL, "bf16": True, "num_experts": 8, "moe_router_topk": 1}
    keys["moe_router_pre_softmax"] = True
    spec = from_mapping(keys)
    moe = spec.model.moe
    assert moe is not None and moe.pre_softmax and moe.top_k == 1
    assert to_mapping(spec)["moe_router_pre_softmax"] is True
    assert "--moe-router-pre-softmax" in to_megatron_args(spec)
    assert from_mapping(to_mapping(spec)) == spec
    # sinkhorn balancing is Megatron's other exemption
    del keys["moe_router_pre_softmax"]
    keys["moe_router_load_balancing_type"] = "sinkhorn"
    sinkhorn = from_mapping(keys)
    assert sinkhorn.model.moe is not None
    assert sinkhorn.model.moe.load_balancing is LoadBalancing.SINKHORN
    assert "--moe-router-load-balancing-type sinkhorn" in " ".join(to_megatron_args(sinkhorn))


def test_moe_and_mla_keys_need_their_switch() -> None:
    with pytest.raises(ConfigError) as error:
        from_mapping({**_SMALL, "moe_router_topk": 2, "kv_lora_rank": 64})
    assert error.value.problems == (
        "kv_lora_rank needs multi_latent_attention = true",
        "moe_router_topk needs num_experts (a mixture of experts)",
    )


def test_topk_above_experts_and_capacity_factor() -> None:
    with pytest.raises(ConfigError) as error:
        from_mapping(
            {**_SMALL, "num_experts": 4, "moe_router_topk": 5, "moe_expert_capacity_factor": -1}
        )
    assert error.value.problems == (
        "moe_expert_capacity_factor = -1 must be > 0 (Megatron-LM reads a negative factor as "
        "dropless: leave the key out instead)",
        "moe_router_topk = 5 exceeds num_experts = 4 (Megatron-LM: a token is routed to at "
        "most every expert)",
    )
    moe = from_mapping(
        {
            **_SMALL,
            "num_experts": 4,
            "moe_expert_capacity_factor": 1.25,
            "moe_pad_expert_input_to_capacity": True,
        }
    ).model.moe
    assert moe is not None and moe.dropping == CapacityFactor(factor=1.25, pad_to_capacity=True)


def test_misspelt_choice_gets_a_suggestion() -> None:
    with pytest.raises(ConfigError) as error:
        from_mapping({**_SMALL, "num_experts": 4, "moe_router_score_function": "sigmod"})
    assert error.value.problems[0] == (
        "moe_router_score_function must be one of softmax, sigmoid, sqrtsoftplus, got 'sigmod' "
        "(did you mean 'sigmoid'?)"
    )


@pytest.mark.parametrize(
    ("text", "layers"),
    [
        ("([0]*3+[1]*58)", (False,) * 3 + (True,) * 58),
        ("[0,1,1]", (False, True, True)),
        (" [0]*1 + ([1,0]*2) ", (False, True, False, True, False)),
    ],
)
def test_layer_freq_lists(text: str, layers: tuple[bool, ...]) -> None:
    assert parse_moe_layer_freq(text) == MoeLayerList(layers=layers)


def test_layer_freq_integer() -> None:
    assert parse_moe_layer_freq("2") == MoeLayerFrequency(every=2)
    assert parse_moe_layer_freq(3) == MoeLayerFrequency(every=3)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[0,1,1", "expected ']', found the end at position 6"),
        ("[0,2]", "layer flag 2 is not 0 or 1 at position 3"),
        ("[0]*x", "expected an integer, found 'x' at position 4"),
        ("__import__('os')", "expected '[', found '_' at position 0"),
        ("[1]]", "unexpected ']' at position 3"),
    ],
)
def test_layer_freq_errors_name_the_position(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_moe_layer_freq(text)
    assert error.value.problems == (f"moe_layer_freq {text!r}: {problem}",)


@st.composite
def _moe_models(draw: st.DrawFn) -> TransformerModelSpec:
    layers = draw(st.integers(1, 8))
    experts = draw(st.integers(1, 16))
    score = draw(st.sampled_from(RouterScore))
    top_k = draw(st.integers(2 if score is RouterScore.SOFTMAX else 1, max(experts, 2)))
    experts = max(experts, top_k)
    pattern = draw(
        st.one_of(
            st.builds(MoeLayerFrequency, every=st.integers(1, 4)),
            st.builds(
                MoeLayerList,
                layers=st.lists(st.booleans(), min_size=layers, max_size=layers).map(tuple),
            ),
        )
    )
    dropping = draw(
        st.one_of(
            st.just(Dropless()),
            st.builds(
                CapacityFactor,
                factor=st.floats(0.25, 4.0),
                pad_to_capacity=st.booleans(),
            ),
        )
    )
    moe = MixtureOfExperts(
        num_experts=experts,
        top_k=top_k,
        expert_ffn_hidden_size=draw(st.integers(1, 512)),
        shared_expert_ffn_hidden_size=draw(st.sampled_from([0, 64, 128])),
        score_function=score,
        expert_bias=score is not RouterScore.SOFTMAX and draw(st.booleans()),
        dropping=dropping,
        layer_pattern=pattern,
        # gamma <= E - 1: one expert has no EP ranks to be uneven over
        load_imbalance=draw(st.sampled_from([0.0, 0.1, 0.5])) if experts > 1 else 0.0,
    )
    attention = draw(
        st.one_of(
            st.just(StandardAttention()),
            st.builds(
                MultiLatentAttention,
                q_lora_rank=st.one_of(st.none(), st.integers(1, 64)),
                kv_lora_rank=st.integers(1, 64),
                qk_head_dim=st.integers(1, 64),
                qk_pos_emb_head_dim=st.integers(1, 32),
                v_head_dim=st.integers(1, 64),
            ),
        )
    )
    window = draw(
        st.one_of(
            st.just(model_preset("gpt-oss-20b").attention_window),
            st.builds(
                SlidingWindow,
                size=st.integers(1, 256),
                full_every=st.one_of(st.none(), st.integers(1, 4)),
            ),
        )
    )
    base = model_preset("llama3-8b")
    return replace(
        _unpublished(base),
        name="moe-model",
        num_layers=layers,
        num_query_groups=base.num_attention_heads
        if isinstance(attention, MultiLatentAttention)
        else 8,
        self_attention=attention,
        feed_forward=moe,
        qk_layernorm=draw(st.booleans()),
        mtp_num_layers=draw(st.integers(0, 2)),
        softmax_type=draw(st.sampled_from(SoftmaxType)),
        attention_window=window,
    )


@settings(max_examples=200, deadline=None)
@given(_moe_models())
def test_from_mapping_inverts_to_mapping_over_moe_fields(model: TransformerModelSpec) -> None:
    spec: TrainingSpec = from_mapping(_RUN, model=model)
    assert spec.model == model
    assert from_mapping(to_mapping(spec)) == spec
    moe = model.moe
    assert moe is not None
    assert parse_moe_layer_freq(format_moe_layer_freq(moe.layer_pattern)) == moe.layer_pattern


def test_load_imbalance_is_bounded_by_the_experts() -> None:
    """gamma = max / mean - 1 over the EP ranks lies in [0, E - 1]: the hottest rank receives at
    most every routed token (fuzz seed 1272 case 18358: inf reached an integer token count)."""
    for bad in (3.5, -0.1):
        with pytest.raises(ConfigError) as raised:
            from_mapping({**_SMALL, "num_experts": 4, "moe_load_imbalance": bad, "bf16": True})
        assert "must be >= 0 and at most num_experts - 1 = 3" in str(raised.value)
    with pytest.raises(ConfigError) as infinite:
        MixtureOfExperts(num_experts=4, top_k=2, expert_ffn_hidden_size=8, load_imbalance=math.inf)
    assert "moe_load_imbalance = inf must be >= 0 and at most num_experts - 1 = 3" in str(
        infinite.value
    )
    fine = from_mapping({**_SMALL, "num_experts": 4, "moe_load_imbalance": 3.0, "bf16": True})
    assert fine.model.moe is not None and fine.model.moe.load_imbalance == 3.0
