"""Squared ReLU (Megatron-LM ``--squared-relu``) and ``--apply-layernorm-1p``: the Nemotron
models' MLP activation and norm parametrization (issue 12: the three Nemotron rows of the
modern runs were refused on these keys)."""

from __future__ import annotations

import pytest

from blueprinting.errors import ConfigError
from blueprinting.mapping.config_file import model_from_hf_config
from blueprinting.mapping.model import MlpActivation
from blueprinting.mapping.transformer import (
    FusedAttention,
    from_mapping,
    to_mapping,
    to_megatron_args,
)
from blueprinting.synthesizer.dialects.transformer.training import (
    SemanticOpName,
    block_ops,
    global_dims,
)

NEMOTRON_8B: dict[str, object] = {
    "data_parallel_size": 1,
    "num_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "ffn_hidden_size": 16384,
    "seq_length": 4096,
    "vocab_size": 256000,
    "squared_relu": True,
    "normalization": "LayerNorm",
    "apply_layernorm_1p": True,
    "position_embedding_type": "rope",
    "untie_embeddings_and_output_weights": True,
    "disable_bias_linear": True,
    "bf16": True,
}


def test_keys_build_a_squared_relu_model_and_round_trip() -> None:
    spec = from_mapping(NEMOTRON_8B)
    model = spec.model
    assert model.activation is MlpActivation.SQUARED_RELU
    assert model.layernorm_zero_centered_gamma is True
    # non-gated: one h -> f up projection, like GELU
    assert model.mlp_up_width == 16384
    keys = to_mapping(spec)
    assert keys["squared_relu"] is True and keys["swiglu"] is False
    assert "squared_relu" not in to_mapping(from_mapping({**NEMOTRON_8B, "squared_relu": False}))
    assert keys["apply_layernorm_1p"] is True
    assert from_mapping(keys).model == model
    args = to_megatron_args(spec)
    assert "--squared-relu" in args and "--apply-layernorm-1p" in args
    assert "--swiglu" not in args


def test_default_ffn_is_4h_and_parameters_match_a_gelu_mlp() -> None:
    keys = {k: v for k, v in NEMOTRON_8B.items() if k != "ffn_hidden_size"}
    squared = from_mapping(keys).model
    assert squared.ffn_hidden_size == 4 * 4096
    gelu = from_mapping({**keys, "squared_relu": False}).model
    assert gelu.activation is MlpActivation.GELU
    # the activation has no parameters: the counts agree exactly
    assert squared.num_parameters == gelu.num_parameters


def test_squared_relu_and_swiglu_are_exclusive() -> None:
    with pytest.raises(ConfigError) as error:
        from_mapping({**NEMOTRON_8B, "swiglu": True})
    assert "swiglu and squared_relu are exclusive (Megatron-LM refuses both)" in (
        error.value.problems
    )


def test_the_activation_op_costs_two_and_three_flops_per_element() -> None:
    model = from_mapping(NEMOTRON_8B).model
    dims = global_dims(model, micro_batch=1)
    ops = {op.name: op for op in block_ops(model, dims, attention=FusedAttention())}
    act = ops[SemanticOpName.MLP_ACTIVATION]
    elements = 4096 * 16384  # s x f
    assert act.forward.vector_flops == 2 * elements
    assert act.activation_grad.vector_flops == 3 * elements
    assert act.forward.matrix_flops == 0
    up = ops[SemanticOpName.MLP_UP]
    assert up.forward.matrix_flops == 2 * 4096 * 4096 * 16384


def test_hugging_face_relu2_reads_as_squared_relu() -> None:
    model = model_from_hf_config(
        {
            "hidden_act": "relu2",
            "hidden_size": 4096,
            "intermediate_size": 16384,
            "max_position_embeddings": 4096,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "vocab_size": 256000,
        }
    )
    assert model.activation is MlpActivation.SQUARED_RELU
    assert model.mlp_up_width == 16384
    with pytest.raises(ConfigError) as error:
        model_from_hf_config(
            {
                "hidden_act": "tanh",
                "hidden_size": 64,
                "intermediate_size": 256,
                "max_position_embeddings": 64,
                "num_attention_heads": 4,
                "num_hidden_layers": 2,
                "vocab_size": 1000,
            }
        )
    assert "hidden_act 'tanh' is not supported (silu, gelu or relu2)" in error.value.problems
