"""The one op cost rule on floats and on columns (issue 18): ``work_times`` (the rule called once
on a column of ops) equals ``work_time`` per op bit for bit, over shapes, systems (every
efficiency model, both processing modes), datatypes and low-precision formats; and decode
attention costed on columns gives the report the op-by-op loop gives."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TypeAlias

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from blueprinting.errors import ConfigError
from blueprinting.hardware.efficiency import (
    ConstantEfficiency,
    Efficiency,
    EfficiencyStep,
    GemmShapeEfficiency,
    SaturatingGemmEfficiency,
    SteppedEfficiency,
)
from blueprinting.hardware.presets import SYSTEM_PRESETS, system_preset
from blueprinting.hardware.system import ProcessingMode, SystemSpec
from blueprinting.inference import analysis
from blueprinting.inference.analysis import analyze_inference
from blueprinting.mapping.flat_keys import inference_from_mapping
from blueprinting.mapping.model import Datatype
from blueprinting.mapping.precision import GemmFormat
from blueprinting.mapping.presets import model_preset
from blueprinting.synthesizer.dialects.transformer.training import (
    AttentionShape,
    BatchedGemmCalls,
    GemmShape,
    Work,
)
from blueprinting.synthesizer.stages.portable_plan.passes import work_time, work_times

fractions = st.floats(min_value=0.01, max_value=1.0)
halves = st.one_of(st.just(0.0), st.floats(min_value=1.0, max_value=1e12))


@st.composite
def stepped(draw: st.DrawFn) -> SteppedEfficiency:
    thresholds = draw(
        st.lists(st.floats(min_value=1.0, max_value=1e15), min_size=0, max_size=4, unique=True)
    )
    ordered = [*sorted(thresholds, reverse=True), 0.0]
    return SteppedEfficiency(
        steps=tuple(EfficiencyStep(threshold=t, fraction=draw(fractions)) for t in ordered)
    )


efficiencies: st.SearchStrategy[Efficiency] = st.one_of(
    st.builds(ConstantEfficiency, fraction=fractions),
    stepped(),
    st.builds(SaturatingGemmEfficiency, peak_fraction=fractions, half_saturation_dim=halves),
    st.builds(
        GemmShapeEfficiency,
        peak_fraction=fractions,
        half_saturation_dim=halves,
        half_saturation_flops=halves,
    ),
)


@st.composite
def systems(draw: st.DrawFn) -> SystemSpec:
    """A preset with each of its rates' efficiency models redrawn, in either processing mode."""
    system = draw(st.sampled_from(sorted(SYSTEM_PRESETS)).map(system_preset))
    acc = system.accelerator
    matrix = replace(
        acc.matrix,
        rates=tuple(replace(r, efficiency=draw(efficiencies)) for r in acc.matrix.rates),
    )
    vector = replace(
        acc.vector,
        rates=tuple(replace(r, efficiency=draw(efficiencies)) for r in acc.vector.rates),
    )
    low = tuple(replace(r, efficiency=draw(efficiencies)) for r in acc.low_precision)
    hbm = replace(acc.hbm, efficiency=draw(efficiencies))
    accelerator = replace(acc, matrix=matrix, vector=vector, hbm=hbm, low_precision=low)
    mode = draw(st.sampled_from(list(ProcessingMode)))
    return replace(system, accelerator=accelerator, processing_mode=mode)


# Counts stay exact in float64 (a GEMM's FLOPs at most 2 * 4096**4 < 2**53).
dims = st.integers(min_value=1, max_value=4096)
counts = st.one_of(st.just(0), st.integers(min_value=1, max_value=2**50))


Column: TypeAlias = tuple[list[Work], list[GemmShape | None], list[AttentionShape] | None]


@st.composite
def columns(draw: st.DrawFn) -> Column:
    """Ops of one column: all with a GEMM shape (issued one way) or none; all fused attention
    kernels of one head dimension (over any sequence lengths, measured ones included) or none."""
    size = draw(st.integers(min_value=1, max_value=12))
    with_gemm = draw(st.booleans())
    calls = draw(st.sampled_from(list(BatchedGemmCalls)))
    head_dim = draw(st.sampled_from([32, 64, 96, 128, 192, 256, 576]))
    seq = st.one_of(st.sampled_from([512, 1024, 2048, 4096, 8192, 16384]), dims)
    attentions = (
        [
            AttentionShape(batch_heads=draw(dims), seq_length=draw(seq), head_dim=head_dim)
            for _ in range(size)
        ]
        if draw(st.booleans())
        else None
    )
    works, gemms = [], []
    for _ in range(size):
        gemm = (
            GemmShape(m=draw(dims), n=draw(dims), k=draw(dims), batch=draw(dims), calls=calls)
            if with_gemm
            else None
        )
        matrix = gemm.flops if gemm is not None and draw(st.booleans()) else draw(counts)
        works.append(
            Work(
                matrix_flops=matrix,
                vector_flops=draw(counts),
                bytes_read=draw(counts),
                bytes_written=draw(counts),
            )
        )
        gemms.append(gemm)
    return works, gemms, attentions


@settings(max_examples=200, deadline=None)
@given(system=systems(), ops=columns(), data=st.data())
def test_the_column_call_equals_the_scalar_call_bit_for_bit(
    system: SystemSpec, ops: Column, data: st.DataObject
) -> None:
    works, gemms, attentions = ops
    datatype = data.draw(st.sampled_from([r.datatype for r in system.accelerator.matrix.rates]))
    # The vector engine must rate the datatype too, as every preset's does for its own.
    assume(datatype in {r.datatype for r in system.accelerator.vector.rates})
    formats = [r.format for r in system.accelerator.low_precision]
    gemm_format = data.draw(st.one_of(st.none(), st.sampled_from(formats))) if formats else None
    column = work_times(works, gemms, system, datatype, attentions, gemm_format=gemm_format)
    assert column is not None
    kernels: list[AttentionShape | None] = [*attentions] if attentions else [None] * len(works)
    scalar = [
        work_time(w, g, system, datatype, a, gemm_format=gemm_format)
        for w, g, a in zip(works, gemms, kernels, strict=True)
    ]
    assert [float(x).hex() for x in scalar] == [x.hex() for x in column.tolist()]


def test_a_column_it_cannot_take_exactly_is_refused() -> None:
    system, bf16 = system_preset("dgx-h100"), Datatype.BF16
    gemm = GemmShape(m=8, n=128, k=4096)
    work = Work(matrix_flops=gemm.flops, bytes_read=2**40)
    # 2**53 + 1 bytes is not a float64: the column would round it.
    inexact = Work(matrix_flops=gemm.flops, bytes_read=2**53 + 1)
    assert work_times([work, inexact], [gemm, gemm], system, bf16) is None
    # GEMM shapes beside an op without one: no one column of shapes; the same for kernels,
    # and kernels of two head dimensions.
    assert work_times([work, work], [gemm, None], system, bf16) is None
    kernel = AttentionShape(batch_heads=64, seq_length=4096, head_dim=128)
    wider = replace(kernel, head_dim=256)
    assert work_times([work, work], [None, None], system, bf16, [kernel, None]) is None
    assert work_times([work, work], [None, None], system, bf16, [kernel, wider]) is None
    both = work_times([work, work], [None, None], system, bf16, [kernel, kernel])
    assert both is not None
    assert both.tolist() == [work_time(work, None, system, bf16, kernel)] * 2
    assert work_times([], [], system, bf16) is None
    exact = work_times([work, work], [gemm, gemm], system, bf16)
    assert exact is not None
    assert exact.tolist() == [work_time(work, gemm, system, bf16)] * 2


def test_a_negative_count_in_a_column_is_refused_as_in_the_scalar_call() -> None:
    system = system_preset("dgx-h100")
    bad = Work(vector_flops=-3)
    with pytest.raises(ConfigError, match=r"op FLOPs must be >= 0, got -3$"):
        work_time(bad, None, system, Datatype.BF16)
    with pytest.raises(ConfigError, match=r"op FLOPs must be >= 0, got array"):
        work_times([Work(), bad], [None, None], system, Datatype.BF16)


def test_low_precision_columns_use_the_recipe_rate() -> None:
    system = system_preset("dgx-b200")
    gemm = GemmShape(m=4096, n=4096, k=4096)
    work = Work(matrix_flops=gemm.flops)
    fp8 = work_times([work], [gemm], system, Datatype.BF16, gemm_format=GemmFormat.FP8)
    bf16 = work_times([work], [gemm], system, Datatype.BF16)
    assert fp8 is not None and bf16 is not None
    assert fp8[0] == work_time(work, gemm, system, Datatype.BF16, gemm_format=GemmFormat.FP8)
    assert fp8[0] < bf16[0]


@pytest.mark.parametrize(
    ("model", "keys"),
    [
        ("llama2-70b", {"tensor_model_parallel_size": 8, "batch_size": 16}),
        ("deepseek-v2-lite", {"tensor_model_parallel_size": 2, "batch_size": 4}),
    ],
)
def test_decode_attention_on_columns_reports_what_the_op_by_op_loop_reports(
    monkeypatch: pytest.MonkeyPatch, model: str, keys: dict[str, int]
) -> None:
    # 5,000 generated tokens: more than MAX_EXACT_DECODE_STEPS, so the sampled contexts too.
    settings_ = {"prompt_length": 1000, "generated_tokens": 5000, **keys}
    spec = inference_from_mapping(settings_, model=model_preset(model))
    system = system_preset("dgx-h100")
    on_columns = json.dumps(analyze_inference(spec, system).to_json_dict())
    monkeypatch.setattr(analysis, "_op_time_columns", lambda *_args: None)
    op_by_op = json.dumps(analyze_inference(spec, system).to_json_dict())
    assert on_columns == op_by_op
