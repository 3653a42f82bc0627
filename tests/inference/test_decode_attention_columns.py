"""Decode attention on columns (issue 18): ``decode_attention_columns`` is the per-step ops'
algebra on an int64 column of contexts, and the analysis costed from it equals the analysis
costed op by op, bit for bit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.hardware.polymorphic import IntColumn
from blueprinting.hardware.presets import system_preset
from blueprinting.inference import analysis
from blueprinting.inference.analysis import analyze_inference
from blueprinting.mapping.flat_keys import inference_from_mapping
from blueprinting.mapping.model import Datatype, TransformerModelSpec
from blueprinting.mapping.presets import model_preset
from blueprinting.synthesizer.dialects.transformer.inference import (
    decode_attention_columns,
    decode_attention_ops,
)

LLAMA = model_preset("llama2-70b")
BF16 = Datatype.BF16


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 512),
    tp=st.sampled_from([1, 2, 4, 8, 16]),
    sp=st.booleans(),
    kv=st.sampled_from([Datatype.BF16, Datatype.FP8]),
    contexts=st.lists(st.integers(0, 1 << 20), min_size=1, max_size=40),
)
def test_columns_are_the_ops_of_every_step(
    batch: int, tp: int, sp: bool, kv: Datatype, contexts: list[int]
) -> None:
    figures = decode_attention_columns(
        LLAMA, batch=batch, contexts=contexts, tp=tp, sequence_parallel=sp, kv_datatype=kv
    )
    steps = decode_attention_ops(
        LLAMA, batch=batch, contexts=contexts, tp=tp, sequence_parallel=sp, kv_datatype=kv
    )
    assert figures is not None
    assert len(figures) == 3
    for j, f in enumerate(figures):
        for i, ops in enumerate(steps):
            op = ops[j]

            def at(x: IntColumn | int, i: int = i) -> int:
                return x if isinstance(x, int) else int(x[i])

            assert (f.name, f.kind) == (op.name, op.kind)
            assert at(f.matrix_flops) == op.work.matrix_flops
            assert at(f.vector_flops) == op.work.vector_flops
            assert at(f.bytes_read) == op.work.bytes_read
            assert at(f.bytes_written) == op.work.bytes_written
            assert at(f.kv_cache_bytes) == op.kv_cache_bytes
            assert op.weight_bytes == op.expert_weight_bytes == 0
            if f.gemm is None:
                assert op.gemm is None
            else:
                assert op.gemm is not None
                assert tuple(at(x) for x in f.gemm) == (
                    op.gemm.m,
                    op.gemm.n,
                    op.gemm.k,
                    op.gemm.batch,
                )


def test_a_context_beyond_exact_float64_and_mla_stay_per_step() -> None:
    def columns(model: TransformerModelSpec, contexts: list[int]) -> object:
        return decode_attention_columns(
            model, batch=4, contexts=contexts, tp=8, sequence_parallel=False, kv_datatype=BF16
        )

    # K bytes = b x groups x d x c x 2: above 2**53 at c = 2**40 with 8 KV groups of 128
    assert columns(LLAMA, [0, 2**40]) is None
    assert columns(LLAMA, [0, 2**20]) is not None
    assert columns(model_preset("deepseek-v2-lite"), [0, 5]) is None
    assert columns(LLAMA, []) is None


@pytest.mark.parametrize(
    ("model", "generated", "batch"),
    [("llama2-7b", 300, 3), ("llama2-70b", 5000, 16), ("llama2-70b", 2**30, 1)],
)
def test_the_report_equals_the_op_by_op_costing(
    model: str, generated: int, batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = inference_from_mapping(
        {
            "batch_size": batch,
            "prompt_length": 100,
            "generated_tokens": generated,
            "tensor_model_parallel_size": 8,
        },
        model=model_preset(model),
    )
    system = system_preset("dgx-h100")
    columns = analyze_inference(spec, system)
    monkeypatch.setattr(analysis, "decode_attention_columns", lambda *_, **__: None)
    per_step = analyze_inference(spec, system)
    assert columns == per_step
    assert columns.decode_total_s > 0
