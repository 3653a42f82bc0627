"""``attention_dropout`` / ``hidden_dropout`` (Megatron-LM ``--attention-dropout``,
``--hidden-dropout``, default 0.1): at probability 0 PyTorch's dropout returns its input, so no
mask is stored and no dropout work runs (issue 19: the MLA functional test that runs with both
at 0 was predicted +62% when the keys did not exist)."""

from __future__ import annotations

import dataclasses

import pytest

from blueprinting.analysis.memory import (
    DROPOUT_MASK_BYTES,
    attention_core_bytes,
    layer_activation_bytes,
)
from blueprinting.errors import ConfigError
from blueprinting.mapping.model import TransformerModelSpec
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import (
    AttentionKernel,
    FusedAttention,
    UnfusedAttention,
    from_mapping,
    to_mapping,
    to_megatron_args,
)
from blueprinting.synthesizer.dialects.transformer.training import (
    SemanticOpName,
    block_ops,
    global_dims,
)

GPT3 = model_preset("gpt3-175b")


def test_keys_round_trip_and_megatron_flags() -> None:
    spec = from_mapping(
        {"data_parallel_size": 1, "attention_dropout": 0.0, "hidden_dropout": 0.05}, model=GPT3
    )
    assert (spec.model.attention_dropout, spec.model.hidden_dropout) == (0.0, 0.05)
    keys = to_mapping(spec)
    assert (keys["attention_dropout"], keys["hidden_dropout"]) == (0.0, 0.05)
    assert from_mapping(keys).model == spec.model
    args = to_megatron_args(spec)
    i, j = args.index("--attention-dropout"), args.index("--hidden-dropout")
    assert (args[i + 1], args[j + 1]) == ("0", "0.05")
    # Megatron's defaults are written nowhere
    default = from_mapping({"data_parallel_size": 1}, model=GPT3)
    assert "attention_dropout" not in to_mapping(default)
    assert "--attention-dropout" not in to_megatron_args(default)


def test_a_probability_outside_zero_one_is_refused() -> None:
    with pytest.raises(ConfigError) as error:
        from_mapping({"data_parallel_size": 1, "attention_dropout": 1.0}, model=GPT3)
    assert "attention_dropout = 1.0 must be a probability in [0, 1)" in error.value.problems


def test_stored_bytes_without_dropout_are_exact() -> None:
    """GPT-3 175B, b = 1, t = 8 with SP: Korthikanti's layer less its two h-wide masks, and the
    unfused core with the softmax output alone (x = 2 bytes per score instead of 5)."""
    s, h, t, a = GPT3.seq_length, GPT3.hidden_size, 8, GPT3.num_attention_heads
    rows = s // t
    no_dropout = dataclasses.replace(GPT3, attention_dropout=0.0, hidden_dropout=0.0)

    def layer(model: TransformerModelSpec, attention: AttentionKernel) -> int:
        return layer_activation_bytes(
            model,
            micro_batch=1,
            tensor_degree=t,
            sequence_parallel=True,
            attention=attention,
            recomputed=frozenset(),
            activation_bytes=2,
        )

    unfused = UnfusedAttention()
    masks = 2 * DROPOUT_MASK_BYTES * rows * h
    core_with = s * s * (a // t) * (2 * 2 + 1)
    core_without = s * s * (a // t) * 2
    assert layer(GPT3, unfused) - layer(no_dropout, unfused) == masks + core_with - core_without
    assert attention_core_bytes(
        no_dropout, tensor_degree=t, attention=unfused, activation_bytes=2
    ) == (core_without)
    # the fused kernel stores no mask either way: only the hidden masks differ
    fused = FusedAttention()
    assert layer(GPT3, fused) - layer(no_dropout, fused) == masks


def test_no_dropout_kernel_and_no_mask_traffic_at_zero() -> None:
    no_dropout = dataclasses.replace(GPT3, attention_dropout=0.0, hidden_dropout=0.0)
    dims = global_dims(GPT3, micro_batch=1)
    with_ops = {op.name: op for op in block_ops(GPT3, dims, attention=UnfusedAttention())}
    without = {op.name: op for op in block_ops(no_dropout, dims, attention=UnfusedAttention())}
    assert SemanticOpName.ATTENTION_DROPOUT in with_ops
    assert SemanticOpName.ATTENTION_DROPOUT not in without
    elems = GPT3.seq_length * GPT3.hidden_size
    for name in (SemanticOpName.ATTENTION_RESIDUAL, SemanticOpName.MLP_RESIDUAL):
        a, b = with_ops[name], without[name]
        assert a.forward.bytes_written - b.forward.bytes_written == elems * DROPOUT_MASK_BYTES
        assert a.activation_grad.bytes_read - b.activation_grad.bytes_read == elems
        assert a.forward.vector_flops - b.forward.vector_flops == elems
