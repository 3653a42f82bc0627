"""A MoE layer's grouped expert GEMMs are issued one cuBLAS GEMM per local expert (Transformer
Engine's multi-stream grouped GEMM): each is costed at one expert's shape and pays the GEMM
efficiency's per-call term once per expert; a one-call batched GEMM pays it once."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.hardware.efficiency import (
    Efficiency,
    GemmShapeEfficiency,
    SaturatingGemmEfficiency,
    efficiency_fraction,
)
from blueprinting.hardware.efficiency import GemmShape as HardwareGemmShape
from blueprinting.hardware.presets import system_preset
from blueprinting.hardware.system import SystemSpec
from blueprinting.mapping.model import Datatype
from blueprinting.synthesizer.dialects.transformer.training import (
    BatchedGemmCalls,
    GemmShape,
    SemanticOpName,
    Work,
)
from blueprinting.synthesizer.dialects.transformer.training_derivation import (
    derive_training_block,
)
from blueprinting.synthesizer.stages.distributed.ir import ComputeTask
from blueprinting.synthesizer.stages.portable_plan.passes import work_time
from tests.synthesizer.moe_models import mixtral_like
from tests.synthesizer.test_moe_block import _mapping

FIT = GemmShapeEfficiency(peak_fraction=0.7, half_saturation_dim=196.0, half_saturation_flops=7.1e9)


def _with_bf16_gemm(system: SystemSpec, efficiency: Efficiency) -> SystemSpec:
    """``system`` with its bf16 matrix rate's efficiency replaced (everything else kept)."""
    matrix = system.accelerator.matrix
    rates = tuple(
        replace(rate, efficiency=efficiency) if rate.datatype is Datatype.BF16 else rate
        for rate in matrix.rates
    )
    return replace(
        system, accelerator=replace(system.accelerator, matrix=replace(matrix, rates=rates))
    )


def _matrix_only(flops: int) -> Work:
    return Work(matrix_flops=flops)


def test_the_expert_gemms_are_issued_one_call_per_local_expert() -> None:
    """Both grouped GEMMs carry ``call_per_member`` over their local experts; the attention
    and dense GEMMs stay single calls."""
    ir = derive_training_block(mixtral_like(), _mapping(ep=2, dp=2))
    assert ir.moe_block is not None
    calls = {
        task.lineage.op: task.gemm
        for task in ir.moe_block.tasks
        if isinstance(task, ComputeTask) and task.gemm is not None
    }
    for op in (SemanticOpName.EXPERT_FC1, SemanticOpName.EXPERT_FC2):
        gemm = calls[op]
        assert gemm.calls is BatchedGemmCalls.CALL_PER_MEMBER
        assert gemm.batch == 4  # Mixtral's 8 experts over ep 2
    for op in (SemanticOpName.ROUTER, SemanticOpName.QKV_PROJECTION):
        assert calls[op].calls is BatchedGemmCalls.ONE_CALL


def test_per_expert_calls_pay_the_per_call_term_once_per_expert() -> None:
    """16 experts of 1024 x 2048 x 1536: the grouped GEMM takes 16 times one expert's GEMM at
    that expert's FLOPs (its fraction 0.7 / (1 + 196/1024) / (1 + 7.1e9 / F1)), where one call
    over the batch would see 16 F1 in the per-call term."""
    system = _with_bf16_gemm(system_preset("dgx-h100"), FIT)
    peak = system.accelerator.matrix.rate(Datatype.BF16).peak_flop_per_s
    per_member = HardwareGemmShape(m=1024, n=2048, k=1536)
    one_flops = per_member.flops
    grouped = GemmShape(m=1024, n=2048, k=1536, batch=16, calls=BatchedGemmCalls.CALL_PER_MEMBER)
    batched = replace(grouped, calls=BatchedGemmCalls.ONE_CALL)
    work = _matrix_only(grouped.flops)
    fraction = 0.7 / (1 + 196 / 1024) / (1 + 7.1e9 / one_flops)
    assert efficiency_fraction(FIT, one_flops, per_member) == pytest.approx(fraction, rel=1e-12)
    assert work_time(work, grouped, system, Datatype.BF16) == pytest.approx(
        16 * one_flops / (peak * fraction), rel=1e-12
    )
    whole = 0.7 / (1 + 196 / 1024) / (1 + 7.1e9 / (16 * one_flops))
    assert work_time(work, batched, system, Datatype.BF16) == pytest.approx(
        16 * one_flops / (peak * whole), rel=1e-12
    )


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 8192),
    n=st.integers(1, 8192),
    k=st.integers(1, 8192),
    batch=st.integers(1, 64),
)
def test_calls_change_nothing_without_a_per_call_term(m: int, n: int, k: int, batch: int) -> None:
    """A fraction that reads only the smallest side (the saturating GEMM model) gives the same
    time however the batch is issued; with a per-call term, per-expert calls are never faster
    and a batch of one is the same call either way."""
    saturating = _with_bf16_gemm(
        system_preset("dgx-h100"),
        SaturatingGemmEfficiency(peak_fraction=0.8, half_saturation_dim=128.0),
    )
    fitted = _with_bf16_gemm(system_preset("dgx-h100"), FIT)
    grouped = GemmShape(m=m, n=n, k=k, batch=batch, calls=BatchedGemmCalls.CALL_PER_MEMBER)
    batched = replace(grouped, calls=BatchedGemmCalls.ONE_CALL)
    work = _matrix_only(grouped.flops)
    assert work_time(work, grouped, saturating, Datatype.BF16) == pytest.approx(
        work_time(work, batched, saturating, Datatype.BF16), rel=1e-12
    )
    per_expert = work_time(work, grouped, fitted, Datatype.BF16)
    one_call = work_time(work, batched, fitted, Datatype.BF16)
    assert per_expert >= one_call * (1 - 1e-12)
    if batch == 1:
        assert per_expert == pytest.approx(one_call, rel=1e-12)
