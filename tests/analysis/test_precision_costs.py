"""What a precision recipe changes in the costs (issue 12 item 4): only the Transformer Engine
linears run at the low-precision rate (``shared/reference/modern_parallelism.md`` 3.2); their
weight copies and the FP8 parameter all-gather (3.3, 7). Exact values from the formulas of
``synthesizer/stages/portable_plan/precision.py`` and ``analysis/precision_memory.py``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from blueprinting.analysis.precision_memory import (
    param_gather_bytes,
    weight_extra_bytes,
)
from blueprinting.analysis.rank_parameters import block_linear_weights_per_rank
from blueprinting.api import plan_spec
from blueprinting.hardware.efficiency import GemmShape, efficiency_fraction
from blueprinting.hardware.presets import system_preset
from blueprinting.hardware.system import Engine, ParallelDim
from blueprinting.mapping.flat_keys import from_mapping
from blueprinting.mapping.model import Datatype
from blueprinting.mapping.precision import (
    Fp4Precision,
    Fp8Precision,
    Fp8Recipe,
    GemmFormat,
    HighPrecision,
)
from blueprinting.mapping.presets import model_preset
from blueprinting.synthesizer.dialects.transformer.training import SemanticOpName
from blueprinting.synthesizer.dialects.transformer.training_derivation import (
    derive_training_block,
)
from blueprinting.synthesizer.stages.distributed.ir import ComputeTask, Phase
from blueprinting.synthesizer.stages.portable_plan.passes import (
    PlanContext,
    cost_task_groups,
    work_time,
)
from blueprinting.synthesizer.stages.portable_plan.precision import TE_LINEAR_OPS, OpPrecision

H100 = system_preset("dgx-h100")
MODEL = model_preset("llama3-8b")
KEYS: dict[str, object] = {
    "world_size": 16,
    "tensor_model_parallel_size": 2,
    "sequence_parallel": True,
    "global_batch_size": 32,
    "use_distributed_optimizer": True,
    "bf16": True,
}


def test_only_the_te_linears_change_format() -> None:
    fp8 = OpPrecision(datatype=Datatype.BF16, recipe=Fp8Precision())
    assert {op for op in SemanticOpName if fp8.gemm_format(op, is_gemm=True)} == TE_LINEAR_OPS
    assert fp8.gemm_format(SemanticOpName.QKV_PROJECTION, is_gemm=True) is GemmFormat.FP8
    assert fp8.gemm_format(SemanticOpName.QKV_PROJECTION, is_gemm=False) is None
    for op in (SemanticOpName.CORE_ATTENTION, SemanticOpName.LM_HEAD, SemanticOpName.EMBEDDING):
        assert fp8.gemm_format(op, is_gemm=True) is None
    high = OpPrecision(datatype=Datatype.BF16, recipe=HighPrecision())
    assert not any(high.gemm_format(op, is_gemm=True) for op in SemanticOpName)
    nvfp4 = OpPrecision(datatype=Datatype.BF16, recipe=Fp4Precision())
    assert nvfp4.gemm_format(SemanticOpName.MLP_DOWN, is_gemm=True) is GemmFormat.NVFP4


def test_fp8_linear_on_h100_runs_at_the_fp8_peak_times_its_efficiency() -> None:
    spec = from_mapping(KEYS, model=MODEL)
    ir = derive_training_block(spec.model, spec.mapping)
    qkv = next(
        task
        for task in ir.block.tasks
        if isinstance(task, ComputeTask)
        and task.phase is Phase.FORWARD
        and task.lineage.op is SemanticOpName.QKV_PROJECTION
    )
    assert qkv.gemm is not None
    shape = GemmShape(m=qkv.gemm.m, n=qkv.gemm.n, k=qkv.gemm.k, batch=qkv.gemm.batch)
    flops = qkv.work.matrix_flops
    rate = H100.accelerator.low_precision_rate(GemmFormat.FP8)
    assert rate.peak_flop_per_s == 1979e12  # modern_parallelism.md 3.6
    fraction = efficiency_fraction(rate.efficiency, flops, shape)
    # the cuBLASLt fp8 shape fit (0.70, 196, 7.1e9; microbenchmarks.md 5, azure_abg)
    smallest = min(shape.m, shape.n, shape.k)
    assert fraction == pytest.approx(0.70 / (1 + 196 / smallest) / (1 + 7.1e9 / flops))
    expected = flops / (1979e12 * fraction)
    assert H100.low_precision_gemm_time(flops, GemmFormat.FP8, shape) == expected
    got = work_time(qkv.work, qkv.gemm, H100, Datatype.BF16, gemm_format=GemmFormat.FP8)
    vector = H100.compute_time(qkv.work.vector_flops, Engine.VECTOR, Datatype.BF16)
    memory = H100.memory_time(qkv.work.bytes_read + qkv.work.bytes_written)
    assert got == max(expected + vector, memory)
    bf16 = work_time(qkv.work, qkv.gemm, H100, Datatype.BF16)
    assert bf16 > got


def test_block_costs_change_only_in_the_linears() -> None:
    spec = from_mapping(KEYS, model=MODEL)
    ir = derive_training_block(spec.model, spec.mapping)
    group = PlanContext(spec=spec, system=H100).group(ParallelDim.TENSOR)
    high = OpPrecision(datatype=Datatype.BF16, recipe=HighPrecision())
    fp8 = OpPrecision(
        datatype=Datatype.BF16, recipe=Fp8Precision(recipe=Fp8Recipe.TENSORWISE), sequence_shards=2
    )
    costs = {p: cost_task_groups(ir, H100, group, p) for p in (high, fp8)}
    saved = 0.0
    for task in ir.block.tasks:
        if not isinstance(task, ComputeTask) or task.phase is not Phase.FORWARD:
            continue
        before = work_time(task.work, task.gemm, H100, Datatype.BF16, task.attention)
        after = work_time(
            task.work,
            task.gemm,
            H100,
            Datatype.BF16,
            task.attention,
            gemm_format=fp8.gemm_format(task.lineage.op, is_gemm=task.gemm is not None),
        )
        if task.lineage.op in TE_LINEAR_OPS:
            assert after < before
        else:
            assert after == before  # attention core, norms, residuals: unchanged
        saved += before - after
    # The recipe's own casts, tensorwise on Hopper: FC2's input, amax read + cast read (2 B
    # each) and the rowwise and transposed copies (1 B each): 6 B per element; the
    # projection's, which keeps its bf16 input for Wgrad (save_original_input), the rowwise
    # copy only: 5 B; QKV's and FC1's, their norms' outputs, on the rank's s/t rows before the
    # all-gather (t = 2), with the amax the norm computed, rowwise only (Hopper transposes
    # after the gather, in the backward): 3 B per element.
    row_parallel = (SemanticOpName.OUTPUT_PROJECTION, SemanticOpName.MLP_DOWN)
    column_parallel = (SemanticOpName.QKV_PROJECTION, SemanticOpName.MLP_UP)
    per_element = {SemanticOpName.OUTPUT_PROJECTION: 5, SemanticOpName.MLP_DOWN: 6}
    casts = [
        H100.memory_time(task.gemm.m * task.gemm.n * per_element[task.lineage.op])
        if task.lineage.op in row_parallel
        else H100.memory_time(task.gemm.m * task.gemm.n // 2 * 3)
        for task in ir.block.tasks
        if isinstance(task, ComputeTask)
        and task.phase is Phase.FORWARD
        and task.gemm is not None
        and task.lineage.op in row_parallel + column_parallel
    ]
    assert len(casts) == 4
    assert costs[fp8].block.forward.quantize_s == pytest.approx(sum(casts), rel=1e-12)
    assert costs[high].block.forward.quantize_s == 0.0
    forward = {p: c.block.forward.compute_s for p, c in costs.items()}
    assert forward[high] - forward[fp8] == pytest.approx(saved - sum(casts), rel=1e-12)
    # the embedding and the LM head stay in bf16
    assert costs[high].lm_head == costs[fp8].lm_head
    assert costs[high].embedding == costs[fp8].embedding


def test_weight_copies_and_param_gather_bytes() -> None:
    n, base = 1_000_003, 2
    assert weight_extra_bytes(HighPrecision(), n, base) == 0
    assert weight_extra_bytes(Fp8Precision(), n, base) == 2 * n  # rowwise + columnwise, 1 B each
    assert weight_extra_bytes(Fp8Precision(param_gather=True), n, base) == 0  # no bf16 copy
    mx = Fp8Precision(recipe=Fp8Recipe.MXFP8)
    assert weight_extra_bytes(mx, n, base) == 2 * (n + 31251)  # + one E8M0 per 32
    block = Fp8Precision(recipe=Fp8Recipe.BLOCKWISE)
    assert weight_extra_bytes(block, n, base) == 2 * (n + 4 * 62)  # FP32 per 128x128 tile
    assert weight_extra_bytes(Fp4Precision(), n, base) == 2 * (500_002 + 62_501)
    params, linear = 3_000_000, n
    assert param_gather_bytes(HighPrecision(), params, linear, base) == 6_000_000
    assert param_gather_bytes(Fp8Precision(), params, linear, base) == 6_000_000
    gathered = Fp8Precision(param_gather=True)
    assert param_gather_bytes(gathered, params, linear, base) == 2 * (params - n) + n
    # MXFP8 gathers high precision through the grad buffer: no saving on the wire
    mx_gathered = Fp8Precision(recipe=Fp8Recipe.MXFP8, param_gather=True)
    assert param_gather_bytes(mx_gathered, params, linear, base) == 6_000_000
    fp4_gathered = Fp4Precision(param_gather=True)
    assert param_gather_bytes(fp4_gathered, params, linear, base) == 2 * (params - n) + 500_002


def test_plan_with_fp8_param_gather_halves_the_linear_all_gather() -> None:
    spec = from_mapping(
        {**KEYS, "fp8": "hybrid", "fp8_recipe": "tensorwise", "fp8_param_gather": True},
        model=MODEL,
    )
    base = replace(spec, mapping=replace(spec.mapping, precision=HighPrecision()))
    fp8 = plan_spec(spec, H100)
    bf16 = plan_spec(base, H100)
    # p = 1: one stage holding every block
    linear = MODEL.num_layers * block_linear_weights_per_rank(MODEL, 2)
    assert bf16.data_parallel.param_gather_bytes - fp8.data_parallel.param_gather_bytes == linear
    # weights: no persistent bf16 copy of the linears, their two FP8 copies instead (2 B)
    assert fp8.memory.weights == bf16.memory.weights
    plain = plan_spec(replace(spec, mapping=replace(spec.mapping, precision=Fp8Precision())), H100)
    assert plain.memory.weights - bf16.memory.weights == 2 * linear
    # MFU keeps the bf16 (model datatype) peak, Megatron-Bridge's convention
    assert fp8.peak_flops_per_gpu == bf16.peak_flops_per_gpu == 989e12
    assert fp8.iteration_time_s < bf16.iteration_time_s
