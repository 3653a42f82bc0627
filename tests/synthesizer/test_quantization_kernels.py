"""The low-precision recipes' quantization kernels (``OpPrecision.quantized_bytes``): which
tensors each Transformer Engine linear casts in a pass of its own, the bytes per element of each
recipe, and how the memory-bound pass compares with TE's own autocast-vs-pre-quantized GEMM
benchmark."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blueprinting.errors import ConfigError
from blueprinting.hardware.presets import system_preset
from blueprinting.mapping.model import Datatype
from blueprinting.mapping.precision import (
    Fp4Precision,
    Fp8Precision,
    Fp8Recipe,
    HighPrecision,
    TrainingPrecision,
    projection_saves_original_input,
)
from blueprinting.mapping.transformer import (
    FullRecompute,
    RecomputeModule,
    ReduceScatterAllGather,
    SelectiveRecompute,
    TensorParallel,
    recomputed_modules,
)
from blueprinting.synthesizer.dialects.transformer.training import (
    CollectiveKind,
    CollectivePurpose,
    GemmShape,
    Partial,
    Replicate,
    SemanticOpName,
    Shard,
    ShardDim,
)
from blueprinting.synthesizer.stages.distributed.ir import CollectiveTask, Lineage, Phase
from blueprinting.synthesizer.stages.portable_plan.precision import (
    FP8_BLOCKWISE_CAST_FRACTION,
    MXFP8_CAST_FRACTION,
    NORM_FUSED_INPUT_OPS,
    NVFP4_CAST_FRACTION,
    TE_LINEAR_OPS,
    OpPrecision,
    QuantizedTensorBytes,
    cast_bandwidth_fraction,
    norm_writes_quantized,
    quantized_tensor_bytes,
    reads_fp8_columnwise,
    sequence_shards,
)

H100 = system_preset("dgx-h100")
GB200 = system_preset("dgx-gb200")
B300 = system_preset("dgx-b300")
TENSORWISE = Fp8Precision(recipe=Fp8Recipe.TENSORWISE)
MXFP8 = Fp8Precision(recipe=Fp8Recipe.MXFP8)
BLOCKWISE = Fp8Precision(recipe=Fp8Recipe.BLOCKWISE)
NVFP4 = Fp4Precision()


@pytest.mark.parametrize(
    ("recipe", "native", "expected"),
    [
        # per-tensor FP8: an amax pass first (current scaling), a transposed copy on Hopper
        (TENSORWISE, False, QuantizedTensorBytes(read=4, per_usage=1, usages=2)),
        (TENSORWISE, True, QuantizedTensorBytes(read=4, per_usage=1, usages=1)),
        (Fp8Precision(), False, QuantizedTensorBytes(read=2, per_usage=1, usages=2)),
        (
            Fp8Precision(recipe=Fp8Recipe.BLOCKWISE),
            False,
            QuantizedTensorBytes(read=2, per_usage=1 + 4 / 128, usages=2),
        ),
        # block-scaled: rowwise and columnwise are separate quantizations on every accelerator
        (MXFP8, True, QuantizedTensorBytes(read=2, per_usage=1 + 1 / 32, usages=2)),
        (NVFP4, True, QuantizedTensorBytes(read=4, per_usage=0.5 + 1 / 16, usages=2)),
    ],
)
def test_bytes_per_element(
    recipe: TrainingPrecision, native: bool, expected: QuantizedTensorBytes
) -> None:
    got = quantized_tensor_bytes(recipe, base_bytes=2, native_columnwise_fp8=native)
    assert got == expected


def test_base_precision_quantizes_nothing() -> None:
    assert quantized_tensor_bytes(HighPrecision(), base_bytes=2, native_columnwise_fp8=True) is None
    plain = OpPrecision(datatype=Datatype.BF16, recipe=HighPrecision())
    shape = GemmShape(m=8192, n=4096, k=4096)
    for phase in Phase:
        assert (
            plain.quantized_bytes(
                SemanticOpName.MLP_DOWN, phase, shape, native_columnwise_fp8=False
            )
            == 0.0
        )


def test_blackwell_reads_fp8_columnwise_hopper_does_not() -> None:
    assert reads_fp8_columnwise(GB200) and reads_fp8_columnwise(B300)
    assert not reads_fp8_columnwise(H100)


@given(
    op=st.sampled_from(sorted(SemanticOpName)),
    phase=st.sampled_from(sorted(Phase)),
    m=st.integers(min_value=1, max_value=2**20),
    n=st.integers(min_value=1, max_value=2**16),
    k=st.integers(min_value=1, max_value=2**16),
)
def test_which_tensor_each_gemm_task_casts(
    op: SemanticOpName, phase: Phase, m: int, n: int, k: int
) -> None:
    """The forward (and recomputed forward) casts its input m x n (MXFP8's norm writes bf16:
    a LayerNormLinear's input is cast too), the activation-gradient GEMM casts the output
    gradient m x k, Wgrad reuses both; only TE linears cast. The attention output projection
    keeps its bf16 input (Megatron-Core's save_original_input): its forward writes the rowwise
    usage alone and its Wgrad casts the input again, columnwise."""
    precision = OpPrecision(datatype=Datatype.BF16, recipe=MXFP8)
    shape = GemmShape(m=m, n=n, k=k)
    got = precision.quantized_elements(op, phase, shape)
    projection = op is SemanticOpName.OUTPUT_PROJECTION
    if op not in TE_LINEAR_OPS or (phase is Phase.BACKWARD_WEIGHT_GRAD and not projection):
        assert got == 0
    elif phase is Phase.BACKWARD_ACTIVATION_GRAD:
        assert got == m * k
    else:
        assert got == m * n
    usages = 1 if projection and phase is not Phase.BACKWARD_ACTIVATION_GRAD else 2
    per_element = 2 + usages * (1 + 1 / 32)
    bytes_ = precision.quantized_bytes(op, phase, shape, native_columnwise_fp8=True)
    assert bytes_ == pytest.approx(got * per_element, rel=1e-12)


def test_the_projection_keeps_its_input_under_every_recipe_but_delayed_scaling() -> None:
    """Megatron-Core's ``set_save_original_input(self.linear_proj)`` (attention.py l.428-444
    @d98e8a64): FP8 but delayed, and FP4. On Hopper, tensorwise: the forward casts the rowwise
    copy alone (amax read, cast read, 1 B: 5 B an element, where FC2's input also takes its
    transpose, 6 B) and the Wgrad casts the kept input into both copies again (TE ``linear.py``
    l.965-969 for a tensor it does not gather: 6 B); NVFP4's Wgrad the columnwise copy alone."""
    recipes = (HighPrecision(), Fp8Precision(), TENSORWISE, BLOCKWISE, MXFP8, NVFP4)
    assert [projection_saves_original_input(r) for r in recipes] == [
        False,
        False,
        True,
        True,
        True,
        True,
    ]
    shape = GemmShape(m=4096, n=8192, k=8192)
    elements = 4096 * 8192
    proj, fc2 = SemanticOpName.OUTPUT_PROJECTION, SemanticOpName.MLP_DOWN

    def cast(recipe: TrainingPrecision, op: SemanticOpName, phase: Phase) -> float:
        precision = OpPrecision(datatype=Datatype.BF16, recipe=recipe)
        return precision.quantized_bytes(op, phase, shape, native_columnwise_fp8=False)

    forward, wgrad = Phase.FORWARD, Phase.BACKWARD_WEIGHT_GRAD
    assert cast(TENSORWISE, proj, forward) == elements * 5
    assert cast(TENSORWISE, proj, wgrad) == elements * 6
    # the output gradient's cast is any linear's: both usages (Dgrad and Wgrad)
    dgrad = Phase.BACKWARD_ACTIVATION_GRAD
    assert (
        cast(MXFP8, proj, dgrad)
        == cast(MXFP8, fc2, dgrad)
        == pytest.approx(elements * (2 + 2 * 33 / 32))
    )
    assert cast(TENSORWISE, fc2, forward) == elements * 6
    assert cast(TENSORWISE, fc2, wgrad) == 0.0
    # delayed scaling keeps the quantized copy: one pass, both usages, nothing in Wgrad
    assert cast(Fp8Precision(), proj, forward) == elements * 4
    assert cast(Fp8Precision(), proj, wgrad) == 0.0
    # NVFP4: amax read, cast read, one packed usage with its E4M3 scales, in each pass
    assert cast(NVFP4, proj, wgrad) == pytest.approx(elements * (4 + 9 / 16))


def test_the_experts_keep_their_inputs_where_megatron_core_says() -> None:
    """The shared experts' FC1 keeps its input under the projection's recipes unless the shared
    experts are recomputed (``shared_experts.py``); under sequence parallelism over t = 2 its
    Wgrad casts the rank's half of the rows before gathering them. The routed experts' FC2
    keeps its input under ``moe_act`` recompute (``experts.py``): its Wgrad casts it again."""
    shape = GemmShape(m=4096, n=2048, k=7168, batch=4)
    elements = 4 * 4096 * 2048
    up, fc2 = SemanticOpName.SHARED_EXPERT_UP, SemanticOpName.EXPERT_FC2
    wgrad = Phase.BACKWARD_WEIGHT_GRAD

    def cast(op: SemanticOpName, recomputed: frozenset[RecomputeModule], shards: int = 1) -> int:
        precision = OpPrecision(
            datatype=Datatype.BF16, recipe=MXFP8, sequence_shards=shards, recomputed=recomputed
        )
        return precision.quantized_elements(op, wgrad, shape)

    none: frozenset[RecomputeModule] = frozenset()
    assert cast(up, none) == elements
    assert cast(up, none, shards=2) == elements // 2
    assert cast(up, frozenset({RecomputeModule.SHARED_EXPERTS})) == 0
    assert cast(fc2, none) == 0
    assert cast(fc2, frozenset({RecomputeModule.MOE_ACT})) == elements
    assert recomputed_modules(SelectiveRecompute(modules=frozenset({RecomputeModule.MOE_ACT})))
    assert recomputed_modules(FullRecompute()) == frozenset()
    # the forward cast of a kept input writes the rowwise usage alone
    kept = OpPrecision(
        datatype=Datatype.BF16, recipe=MXFP8, recomputed=frozenset({RecomputeModule.MOE_ACT})
    )
    forward = kept.quantized_bytes(fc2, Phase.FORWARD, shape, native_columnwise_fp8=True)
    assert forward == pytest.approx(elements * (2 + 33 / 32))


def test_only_delayed_scaling_norms_write_the_quantized_input() -> None:
    """Transformer Engine's norm kernel writes a LayerNormLinear's input quantized for a
    delayed-scaling Float8Quantizer only (normalization.cpp ``Impl::FULLY_FUSED``): a 4096 x 8192
    QKV input costs no pass under delayed FP8; under current scaling one pass reading it once
    (the norm computed its amax: ``Impl::FUSED_NORM_AMAX_FP8``) where an FC2 input is read twice;
    MXFP8 and NVFP4 a full pass of their own."""
    shape = GemmShape(m=4096, n=8192, k=8192)
    qkv, fc2 = SemanticOpName.QKV_PROJECTION, SemanticOpName.MLP_DOWN
    assert qkv in NORM_FUSED_INPUT_OPS and fc2 not in NORM_FUSED_INPUT_OPS
    assert [norm_writes_quantized(r) for r in (Fp8Precision(), TENSORWISE, MXFP8, NVFP4)] == [
        True,
        False,
        False,
        False,
    ]
    elements = 4096 * 8192

    def cast(recipe: TrainingPrecision, op: SemanticOpName) -> float:
        precision = OpPrecision(datatype=Datatype.BF16, recipe=recipe)
        return precision.quantized_bytes(op, Phase.FORWARD, shape, native_columnwise_fp8=True)

    assert cast(Fp8Precision(), qkv) == 0.0
    assert cast(Fp8Precision(), fc2) == elements * (2 + 1)
    assert cast(TENSORWISE, qkv) == elements * (2 + 1)
    assert cast(TENSORWISE, fc2) == elements * (4 + 1)
    assert cast(MXFP8, qkv) == cast(MXFP8, fc2) == pytest.approx(elements * (2 + 2 * 33 / 32))
    assert cast(NVFP4, qkv) == cast(NVFP4, fc2) == pytest.approx(elements * (4 + 2 * 9 / 16))
    # sequence parallel over t = 4: the rank casts its 1/4 of the rows, then all-gathers them
    sharded = OpPrecision(datatype=Datatype.BF16, recipe=MXFP8, sequence_shards=4)
    assert sharded.quantized_elements(qkv, Phase.FORWARD, shape) == elements // 4
    assert sharded.quantized_elements(fc2, Phase.FORWARD, shape) == elements
    assert sequence_shards(TensorParallel(degree=4, communication=ReduceScatterAllGather())) == 4
    assert sequence_shards(TensorParallel(degree=4)) == 1
    with pytest.raises(ConfigError, match="sequence_shards must be >= 1, got 0"):
        OpPrecision(datatype=Datatype.BF16, recipe=MXFP8, sequence_shards=0)
    # the activation gradient is no norm's output: read twice under current scaling
    precision = OpPrecision(datatype=Datatype.BF16, recipe=TENSORWISE)
    dgrad = precision.quantized_bytes(
        qkv, Phase.BACKWARD_ACTIVATION_GRAD, shape, native_columnwise_fp8=True
    )
    assert dgrad == 4096 * 8192 * (4 + 1)


#: Transformer Engine's GEMM benchmark on B300 (NVIDIA/TransformerEngine@332941783386
#: docs/features/low_precision_training/gemm_profiling/gemm_profiling.rst): per-layer GEMM
#: time of a 4096 / 16384 model at M = 15,872 tokens, per pass (Fprop, Dgrad, Wgrad), ms, in
#: autocast (each te.Linear forward casts its input and weight first) and pre-quantized.
TE_B300_AUTOCAST_MS = {
    "fp8-blockwise": (2.992, 3.290, 3.317),
    "mxfp8": (2.692, 2.891, 2.924),
    "nvfp4": (1.944, 2.183, 2.312),
}
TE_B300_PREQUANTIZED_MS = {
    "fp8-blockwise": (2.264, 2.323, 2.243),
    "mxfp8": (2.391, 2.448, 2.485),
    "nvfp4": (1.273, 1.297, 1.184),
}
BENCHMARK_RECIPES: dict[str, TrainingPrecision] = {
    "fp8-blockwise": Fp8Precision(recipe=Fp8Recipe.BLOCKWISE),
    "mxfp8": MXFP8,
    "nvfp4": NVFP4,
}
_M = 15_872
#: The benchmark's (M, K, N) per pass: the four Fprop shapes, their Dgrad (K, N swapped) and
#: Wgrad (tokens as the reduction) shapes, each timed as a te.Linear forward.
BENCHMARK_SHAPES = (
    ((_M, 4096, 12288), (_M, 4096, 4096), (_M, 4096, 16384), (_M, 16384, 4096)),
    ((_M, 12288, 4096), (_M, 4096, 4096), (_M, 16384, 4096), (_M, 4096, 16384)),
    ((4096, _M, 12288), (4096, _M, 4096), (4096, _M, 16384), (16384, _M, 4096)),
)
B300_HBM_BYTES_PER_S = 8e12


def _pass_bytes(recipe: TrainingPrecision, shapes: tuple[tuple[int, int, int], ...]) -> float:
    """Bytes the benchmark's casts move in one pass: each te.Linear forward casts its input
    M x K rowwise and columnwise (the weight requires grad: TE linear.py
    ``backward_needs_input``) and its weight K x N rowwise (the input does not require grad)."""
    per = quantized_tensor_bytes(recipe, base_bytes=2, native_columnwise_fp8=True)
    assert per is not None
    return sum(
        m * k * (per.read + 2 * per.per_usage) + k * n * (per.read + per.per_usage)
        for m, k, n in shapes
    )


def _achieved_fractions(name: str) -> list[float]:
    recipe = BENCHMARK_RECIPES[name]
    overheads = [
        (auto - pre) * 1e-3
        for auto, pre in zip(TE_B300_AUTOCAST_MS[name], TE_B300_PREQUANTIZED_MS[name], strict=True)
    ]
    return [
        _pass_bytes(recipe, shapes) / seconds / B300_HBM_BYTES_PER_S
        for shapes, seconds in zip(BENCHMARK_SHAPES, overheads, strict=True)
    ]


@pytest.mark.parametrize(
    ("name", "fitted", "rms", "worst"),
    [
        ("fp8-blockwise", FP8_BLOCKWISE_CAST_FRACTION, 0.041, 0.057),
        ("mxfp8", MXFP8_CAST_FRACTION, 0.090, 0.123),
        ("nvfp4", NVFP4_CAST_FRACTION, 0.043, 0.062),
    ],
)
def test_cast_fractions_are_the_fit_on_te_benchmark(
    name: str, fitted: float, rms: float, worst: float
) -> None:
    """The constant is the geometric mean of the three passes' achieved fractions (least
    squares in log time); the per-pass errors are those docs/VALIDATION.md reports."""
    achieved = _achieved_fractions(name)
    fit = math.exp(sum(math.log(a) for a in achieved) / len(achieved))
    assert fitted == pytest.approx(fit, abs=0.005)
    errors = [a / fit - 1 for a in achieved]  # predicted time / measured time - 1
    assert math.sqrt(sum(e * e for e in errors) / len(errors)) == pytest.approx(rms, abs=0.001)
    assert max(abs(e) for e in errors) == pytest.approx(worst, abs=0.001)


def test_nvfp4_casts_are_slower_than_the_hbm_pass() -> None:
    """NVFP4 at 0.57 of 8 TB/s; MXFP8's fitted 0.96 is capped at the HBM pass (0.9: the
    benchmark's L2 reuse); tensorwise has no fit and stays the HBM pass."""
    size = 3e9
    nvfp4 = OpPrecision(datatype=Datatype.BF16, recipe=NVFP4)
    mxfp8 = OpPrecision(datatype=Datatype.BF16, recipe=MXFP8)
    tensorwise = OpPrecision(datatype=Datatype.BF16, recipe=TENSORWISE)
    assert nvfp4.quantize_time(GB200, size) == pytest.approx(size / (8e12 * 0.57), rel=1e-12)
    assert mxfp8.quantize_time(GB200, size) == pytest.approx(size / (8e12 * 0.9), rel=1e-12)
    assert tensorwise.quantize_time(GB200, size) == GB200.memory_time(size)
    assert cast_bandwidth_fraction(HighPrecision()) is None
    assert cast_bandwidth_fraction(Fp8Precision()) is None


def test_plan_reports_the_casts_of_llama3_70b_on_gb200() -> None:
    """Llama 3 70B, t1 FSDP over 64 GB200, m = 2 x 8192 tokens, fp8 tensorwise: per block the
    forward casts the projection's and FC2's inputs (m x 8192 + m x 28672 elements, 5 B each:
    amax read, cast read, one copy) and the two norms' outputs, QKV's and FC1's inputs (m x 8192
    x 2, 3 B each: the norm computed the amax), the backward the four output gradients (m x
    (10240 + 8192 + 57344 + 8192)), and the projection's Wgrad its kept bf16 input again (m x
    8192, 5 B: save_original_input), at GB200's 8 TB/s x 0.9."""
    from blueprinting.api import plan

    report = plan(
        model="llama3-70b",
        system="dgx-gb200",
        gpus=64,
        settings={
            "seq_length": 8192,
            "micro_batch_size": 2,
            "global_batch_size": 256,
            "use_distributed_optimizer": True,
            "use_megatron_fsdp": True,
            "data_parallel_sharding_strategy": "optim_grads_params",
            "bf16": True,
            "fp8_format": "hybrid",
            "fp8_recipe": "tensorwise",
        },
    )
    document = report.to_json_dict()
    quantization = document["quantization"]
    assert isinstance(quantization, dict)
    m, rate = 16_384, 8e12 * 0.9
    block = quantization["block_s"]
    assert isinstance(block, dict)
    forward_bytes = m * (8192 + 28672) * 5 + m * 8192 * 2 * 3
    assert block["forward"] == pytest.approx(forward_bytes / rate, rel=1e-9)
    assert block["backward_activation"] == pytest.approx(
        m * (10240 + 8192 + 57344 + 8192) * 5 / rate, rel=1e-9
    )
    assert block["backward_weight"] == pytest.approx(m * 8192 * 5 / rate, rel=1e-9)
    # 80 layers, 256 / (64 ranks x 2 sequences) = 2 micro-batches
    layers, microbatches = 80, 2
    forward, backward = block["forward"], block["backward_activation"]
    weight = block["backward_weight"]
    assert isinstance(forward, float) and isinstance(backward, float)
    assert isinstance(weight, float)
    per_block = forward + backward + weight
    assert quantization["iteration_s"] == pytest.approx(layers * microbatches * per_block, rel=1e-9)


def _tp_collective(
    kind: CollectiveKind, op: SemanticOpName, phase: Phase, size: int
) -> CollectiveTask:
    source = Partial() if kind is CollectiveKind.REDUCE_SCATTER else Shard(dim=ShardDim.SEQ)
    target = Shard(dim=ShardDim.SEQ) if kind is CollectiveKind.REDUCE_SCATTER else Replicate()
    return CollectiveTask(
        id=f"{phase}.{op}.{kind}",
        phase=phase,
        kind=kind,
        purpose=CollectivePurpose.BOUNDARY,
        bytes=size,
        axis="tp",
        lineage=Lineage(op=op, shards=1, source=source, target=target),
    )


def test_sequence_parallel_all_gathers_move_the_quantized_tensor() -> None:
    """A TE linear's SP all-gather carries the recipe's quantized tensor (TE distributed.py
    ``gather_along_first_dim``): 1 B an element for per-tensor FP8 (rowwise, transposed after),
    one usage of the block formats in the forward and two (dgrad and wgrad) for an output
    gradient (through userbuffers too: a second, columnwise gather beside the dgrad GEMM);
    reduce-scatters, the base precision and ops that are no TE linear keep the bf16 bytes."""
    size = 2 * 4096 * 8192  # bf16 bytes of a 4096 x 8192 tensor
    elements = size // 2
    forward = _tp_collective(
        CollectiveKind.ALL_GATHER, SemanticOpName.QKV_PROJECTION, Phase.FORWARD, size
    )
    grad = _tp_collective(
        CollectiveKind.ALL_GATHER, SemanticOpName.MLP_DOWN, Phase.BACKWARD_ACTIVATION_GRAD, size
    )
    scatter = _tp_collective(
        CollectiveKind.REDUCE_SCATTER, SemanticOpName.MLP_DOWN, Phase.FORWARD, size
    )
    not_linear = _tp_collective(
        CollectiveKind.ALL_GATHER, SemanticOpName.LM_HEAD, Phase.FORWARD, size
    )

    def moved(recipe: TrainingPrecision, task: CollectiveTask) -> float:
        precision = OpPrecision(datatype=Datatype.BF16, recipe=recipe)
        return precision.collective_bytes(task)

    assert moved(HighPrecision(), forward) == size
    assert moved(Fp8Precision(), forward) == moved(TENSORWISE, grad) == elements
    assert moved(MXFP8, forward) == pytest.approx(elements * 33 / 32)
    assert moved(MXFP8, grad) == pytest.approx(2 * elements * 33 / 32)
    assert moved(NVFP4, grad) == pytest.approx(2 * elements * 9 / 16)
    assert moved(NVFP4, scatter) == moved(NVFP4, not_linear) == size


def test_a_row_parallel_output_gradient_is_cast_on_the_ranks_rows() -> None:
    """Under SP the output gradient of FC2 / the projection arrives by all-gather: the rank casts
    its s/t rows first (TE base.py ``grad_output_preprocess``); FC1's is cast whole."""
    shape = GemmShape(m=8192, n=14336, k=4096)
    precision = OpPrecision(datatype=Datatype.BF16, recipe=MXFP8, sequence_shards=2)
    grad = Phase.BACKWARD_ACTIVATION_GRAD
    assert precision.quantized_elements(SemanticOpName.MLP_DOWN, grad, shape) == 8192 * 4096 // 2
    assert precision.quantized_elements(SemanticOpName.MLP_UP, grad, shape) == 8192 * 4096


def test_hopper_transposes_what_per_tensor_fp8_gathers_rowwise() -> None:
    """Per-tensor FP8 under SP on Hopper gathers rowwise and transposes the gathered tensor
    where a Wgrad reads it columnwise (TE ``_all_gather_fp8``: ``_create_transpose`` without
    ``is_non_tn_fp8_gemm_supported``): FC2's output gradient in the data-gradient pass, QKV's
    regathered input in the weight-gradient pass, 2 B an element; the local casts write one
    copy. Blackwell reads FP8 columnwise: no transpose; MXFP8 gathers each usage: none. Without
    SP, delayed scaling's fused norm transposes its FP8 output on Hopper."""
    shape = GemmShape(m=8192, n=8192, k=8192)
    grad, wgrad = Phase.BACKWARD_ACTIVATION_GRAD, Phase.BACKWARD_WEIGHT_GRAD
    fc2, qkv = SemanticOpName.MLP_DOWN, SemanticOpName.QKV_PROJECTION
    precision = OpPrecision(datatype=Datatype.BF16, recipe=TENSORWISE, sequence_shards=4)
    full, local = 8192 * 8192, 8192 * 8192 // 4

    def moved(p: OpPrecision, op: SemanticOpName, phase: Phase, *, native: bool) -> float:
        return p.quantized_bytes(op, phase, shape, native_columnwise_fp8=native)

    # amax read + cast read (2 B each) + one 1 B copy on the rank's rows, then the transpose
    assert moved(precision, fc2, grad, native=False) == local * 5 + full * 2
    assert moved(precision, qkv, wgrad, native=False) == full * 2
    # the norm's output: amax from the norm, one rowwise copy
    assert moved(precision, qkv, Phase.FORWARD, native=False) == local * 3
    assert moved(precision, fc2, grad, native=True) == local * 5
    assert moved(precision, qkv, wgrad, native=True) == 0.0
    unsharded = OpPrecision(datatype=Datatype.BF16, recipe=TENSORWISE)
    assert moved(unsharded, fc2, grad, native=False) == full * 6  # cast + transpose in one pass
    blocks = OpPrecision(datatype=Datatype.BF16, recipe=MXFP8, sequence_shards=4)
    assert blocks.fp8_transpose_elements(fc2, grad, shape, native_columnwise_fp8=False) == 0
    # delayed scaling without SP on Hopper: the fused norm writes rowwise FP8, then transposes
    delayed = OpPrecision(datatype=Datatype.BF16, recipe=Fp8Precision())
    assert moved(delayed, qkv, Phase.FORWARD, native=False) == full * 2
    assert moved(delayed, qkv, Phase.FORWARD, native=True) == 0.0
    sharded_delayed = OpPrecision(datatype=Datatype.BF16, recipe=Fp8Precision(), sequence_shards=4)
    assert moved(sharded_delayed, qkv, Phase.FORWARD, native=False) == 0.0
    # the shared experts' FC1 gathers its input: the rank's rows, rowwise; FC2 like FC2
    up, down = SemanticOpName.SHARED_EXPERT_UP, SemanticOpName.SHARED_EXPERT_DOWN
    assert precision.quantized_elements(up, Phase.FORWARD, shape) == local
    assert moved(precision, down, grad, native=False) == local * 5 + full * 2


def test_current_scaling_and_nvfp4_reduce_a_gathered_tensors_amax_over_tp() -> None:
    """Under SP a gathered tensor needs one scale on every rank: current scaling and NVFP4
    all-reduce the amax of a column-parallel linear's input (forward, recompute) and of a
    row-parallel linear's output gradient over TP (TE linear.py
    ``set_quantizer_amax_reduction_group``); delayed scaling, MXFP8, blockwise, the base
    precision and runs without SP reduce none."""
    qkv, fc2 = SemanticOpName.QKV_PROJECTION, SemanticOpName.MLP_DOWN
    grad = Phase.BACKWARD_ACTIVATION_GRAD
    reducing: tuple[TrainingPrecision, ...] = (TENSORWISE, NVFP4)
    local: tuple[TrainingPrecision, ...] = (
        Fp8Precision(),
        MXFP8,
        Fp8Precision(recipe=Fp8Recipe.BLOCKWISE),
        HighPrecision(),
    )
    for recipe in reducing:
        sharded = OpPrecision(datatype=Datatype.BF16, recipe=recipe, sequence_shards=2)
        assert sharded.amax_reductions(qkv, Phase.FORWARD) == 1
        assert sharded.amax_reductions(qkv, Phase.RECOMPUTE) == 1
        assert sharded.amax_reductions(fc2, grad) == 1
        assert sharded.amax_reductions(fc2, Phase.FORWARD) == 0  # its input is not gathered
        assert sharded.amax_reductions(qkv, grad) == 0
        plain = OpPrecision(datatype=Datatype.BF16, recipe=recipe)
        assert plain.amax_reductions(qkv, Phase.FORWARD) == 0
    for recipe in local:
        sharded = OpPrecision(datatype=Datatype.BF16, recipe=recipe, sequence_shards=2)
        assert sharded.amax_reductions(qkv, Phase.FORWARD) == 0
        assert sharded.amax_reductions(fc2, grad) == 0


def test_userbuffers_make_an_mxfp8_output_gradient_read_twice() -> None:
    """Through userbuffers TE casts a row-parallel linear's output gradient rowwise for the
    dgrad all-gather, then casts the bf16 gradient again, columnwise, for the wgrad buffer
    (``linear.py`` l.905-910, l.1185-1210): one more read of the rank's m/t x k rows at the
    recipe's cast rate; per-tensor FP8 transposes its gathered copy instead."""
    from blueprinting.mapping.flat_keys import from_mapping
    from blueprinting.mapping.presets import model_preset
    from blueprinting.synthesizer.dialects.transformer.training_derivation import (
        derive_training_block,
    )
    from blueprinting.synthesizer.stages.distributed.ir import ComputeTask
    from blueprinting.synthesizer.stages.portable_plan.passes import _userbuffer_recast_s

    spec = from_mapping(
        {
            "world_size": 2,
            "tensor_model_parallel_size": 2,
            "sequence_parallel": True,
            "micro_batch_size": 1,
            "global_batch_size": 1,
            "bf16": True,
        },
        model=model_preset("llama3-8b"),
    )
    block = derive_training_block(spec.model, spec.mapping).block
    fc2 = next(
        task
        for task in block.tasks
        if isinstance(task, ComputeTask)
        and task.phase is Phase.BACKWARD_ACTIVATION_GRAD
        and task.lineage.op is SemanticOpName.MLP_DOWN
    )
    assert fc2.gemm is not None
    rows = fc2.gemm.m * fc2.gemm.k // 2
    assert rows == 8192 * 4096 // 2
    mxfp8 = OpPrecision(datatype=Datatype.BF16, recipe=MXFP8, sequence_shards=2)
    # 2 B an element read at GB200's 8 TB/s x 0.9 (MXFP8's 0.96 cast fraction, capped by HBM)
    assert _userbuffer_recast_s(fc2, GB200, mxfp8) == pytest.approx(
        rows * 2 / (8e12 * 0.9), rel=1e-12
    )
    tensorwise = OpPrecision(datatype=Datatype.BF16, recipe=TENSORWISE, sequence_shards=2)
    assert _userbuffer_recast_s(fc2, GB200, tensorwise) == 0.0
