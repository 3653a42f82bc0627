"""Serving a model with sliding-window layers (GPT-OSS's alternate 128-token window): the
windowed (query, key) pairs, the keys a step reads, the KV cache a windowed layer keeps, and the
prefill and decode costs of its stages.

The window's semantics are the model's (``SlidingWindow``: a query sees itself and the
``window`` positions before it, Megatron / TE ``window_size = (window, 0)``), so W = window + 1
keys."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.hardware.presets import system_preset
from blueprinting.inference.analysis import analyze_inference
from blueprinting.inference.memory import kv_cache_bytes
from blueprinting.mapping.flat_keys import inference_from_mapping
from blueprinting.mapping.model import (
    Datatype,
    FullAttention,
    SlidingWindow,
    TransformerModelSpec,
)
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import InferenceSpec
from blueprinting.synthesizer.dialects.transformer.inference import (
    InferenceOp,
    attended_pairs,
    decode_attention_columns,
    decode_attention_ops,
    keys_read,
)
from blueprinting.synthesizer.dialects.transformer.inference_derivation import (
    LocalInferencePlan,
    derive_inference_plan,
)
from blueprinting.synthesizer.dialects.transformer.training import SemanticOpName

GPT_OSS = model_preset("gpt-oss-120b")
FULL_GPT_OSS = replace(GPT_OSS, attention_window=FullAttention())


def _brute_pairs(q: int, cached: int, keys: int) -> int:
    return sum(min(cached + i + 1, keys) for i in range(q))


def test_windowed_pairs_by_hand() -> None:
    # a 5-token prefill under W = 3: the queries see 1, 2, 3, 3, 3 keys
    assert attended_pairs(5, 0, keys=3) == 12
    # a decode step sees min(context, W): 4 of an 11-key context, 3 of a 3-key one
    assert attended_pairs(1, 10, keys=4) == 4
    assert attended_pairs(1, 2, keys=4) == 3
    # causal without a window: q c0 + q (q + 1) / 2
    assert attended_pairs(5, 0) == 15
    assert attended_pairs(3, 4, keys=100) == attended_pairs(3, 4) == 18


@settings(max_examples=300, deadline=None)
@given(
    q=st.integers(1, 300),
    cached=st.integers(0, 400),
    keys=st.integers(1, 500),
)
def test_windowed_pairs_equal_the_sum_over_queries(q: int, cached: int, keys: int) -> None:
    pairs = attended_pairs(q, cached, keys)
    assert pairs == _brute_pairs(q, cached, keys)
    assert pairs <= attended_pairs(q, cached)
    if keys >= cached + q:
        assert pairs == attended_pairs(q, cached)
    # the keys some query still sees: never more than the context, at least the window's
    read = keys_read(q, cached, keys)
    assert min(cached + q, keys) <= read <= cached + q


@settings(max_examples=100, deadline=None)
@given(
    contexts=st.lists(st.integers(0, 10_000), min_size=1, max_size=20),
    keys=st.integers(1, 4096),
)
def test_windowed_pairs_on_a_column_equal_the_scalar(contexts: list[int], keys: int) -> None:
    column = attended_pairs(1, np.array(contexts, dtype=np.int64), keys)
    assert column.tolist() == [attended_pairs(1, c, keys) for c in contexts]


def test_a_decode_step_beyond_the_window_reads_as_a_step_at_the_window() -> None:
    """At any cache longer than the window, a windowed layer's decode attention is the full
    layer's at a context of exactly W keys (cache W - 1): same FLOPs, bytes and shapes."""
    keys = GPT_OSS.window_keys
    assert keys == 129

    def ops(contexts: list[int], window: int | None) -> list[tuple[InferenceOp, ...]]:
        return decode_attention_ops(
            GPT_OSS,
            batch=4,
            contexts=contexts,
            tp=8,
            sequence_parallel=False,
            kv_datatype=Datatype.BF16,
            keys=window,
        )

    far = ops([5000, 100_000], keys)
    assert far[0] == far[1] == ops([keys - 1], None)[0]
    # below the window the windowed layer is the full one
    assert ops([50], keys) == ops([50], None)
    columns = decode_attention_columns(
        GPT_OSS,
        batch=4,
        contexts=[50, 5000],
        tp=8,
        sequence_parallel=False,
        kv_datatype=Datatype.BF16,
        keys=keys,
    )
    assert columns is not None
    scores = columns[0]
    assert scores.name is SemanticOpName.ATTENTION_SCORES
    # 2 d pairs FLOPs: 64 heads / 8 = 8 heads, d = 64, batch 4, 51 then 129 keys
    assert np.asarray(scores.matrix_flops).tolist() == [2 * 64 * 4 * 8 * 51, 2 * 64 * 4 * 8 * 129]


def _plan(
    model: TransformerModelSpec, *, prompt: int, generated: int, batch: int, pp: int = 1
) -> tuple[InferenceSpec, LocalInferencePlan]:
    spec = inference_from_mapping(
        {
            "tensor_model_parallel_size": 8,
            "expert_model_parallel_size": 8,
            "pipeline_model_parallel_size": pp,
            "batch_size": batch,
            "prompt_length": prompt,
            "generated_tokens": generated,
        },
        model=model,
    )
    return spec, derive_inference_plan(spec.model, spec.mapping)


def test_gpt_oss_kv_cache_keeps_a_window_on_alternate_layers() -> None:
    """36 layers, even ones windowed (window_attn_skip_freq 2): 18 keep 132,096 tokens, 18
    keep W = 129. One KV head per rank at t = 8: 2 x 1 x 64 x 2 B = 256 B a token a layer."""
    _, plan = _plan(GPT_OSS, prompt=131_072, generated=1024, batch=8)
    assert plan.windowed_blocks(0) == 18
    expected = 256 * 8 * (18 * 132_096 + 18 * 129)
    assert kv_cache_bytes(plan, 0, 8) == expected == 4_874_342_400
    _, full = _plan(FULL_GPT_OSS, prompt=131_072, generated=1024, batch=8)
    assert kv_cache_bytes(full, 0, 8) == 256 * 8 * 36 * 132_096


def test_windowed_layers_split_over_pipeline_stages() -> None:
    """p = 4: 9 layers a stage; stage 0 holds layers 0..8 (5 even), stage 1 9..17 (4)."""
    _, plan = _plan(GPT_OSS, prompt=1024, generated=8, batch=1, pp=4)
    assert [plan.windowed_blocks(s) for s in range(4)] == [5, 4, 5, 4]
    model = replace(GPT_OSS, attention_window=SlidingWindow(size=16))
    _, every = _plan(model, prompt=1024, generated=8, batch=1, pp=4)
    assert [every.windowed_blocks(s) for s in range(4)] == [9, 9, 9, 9]


def test_the_window_makes_long_context_serving_cheaper_and_short_context_serving_equal() -> None:
    system = system_preset("dgx-h100")
    long_windowed = analyze_inference(
        _plan(GPT_OSS, prompt=32_768, generated=64, batch=2)[0], system
    )
    long_full = analyze_inference(
        _plan(FULL_GPT_OSS, prompt=32_768, generated=64, batch=2)[0], system
    )
    assert long_windowed.prefill_latency_s < 0.8 * long_full.prefill_latency_s
    assert long_windowed.decode_round_mean_s < long_full.decode_round_mean_s
    # a context within the window: every windowed layer is its full twin
    short_windowed = analyze_inference(_plan(GPT_OSS, prompt=64, generated=16, batch=2)[0], system)
    short_full = analyze_inference(_plan(FULL_GPT_OSS, prompt=64, generated=16, batch=2)[0], system)
    assert short_windowed.prefill_latency_s == pytest.approx(
        short_full.prefill_latency_s, rel=1e-12
    )
    assert short_windowed.decode_round_mean_s == pytest.approx(
        short_full.decode_round_mean_s, rel=1e-12
    )


def test_infer_json_names_the_window() -> None:
    spec, _ = _plan(GPT_OSS, prompt=256, generated=4, batch=1)
    report = analyze_inference(spec, system_preset("dgx-h100"))
    assert report.to_json_dict()["attention_window"] == {
        "window_keys": 129,
        "windowed_layers": 18,
        "layers": 36,
    }
    full, _ = _plan(FULL_GPT_OSS, prompt=256, generated=4, batch=1)
    assert (
        analyze_inference(full, system_preset("dgx-h100")).to_json_dict()["attention_window"]
        is None
    )
