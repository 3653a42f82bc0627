"""Which datatype and which tensor-core format each costed op runs in: the one place the
precision recipe meets the ops (the scalar plan and the vectorized search both cost blocks
through :mod:`.passes`, so both use this rule).

Only the Transformer Engine linear layers inside each transformer block run their GEMMs in the
recipe's low-precision format: QKV, the attention output projection, FC1 and FC2, all three GEMMs
of each (forward, activation gradient, weight gradient; TE ``docs/features/low_precision_training/
speedups.rst``: "12 GEMMs per dense layer"). The attention core (fused or unfused), the
embedding, the LM head, norms, activation functions, dropout and the loss stay in the model's
datatype (Megatron-LM enters ``fp8_autocast`` per transformer layer, ``fp8_utils.py``
l.832-895 @d98e8a64; TE ``introduction.rst``: "Only linear operations are in lower precision";
``shared/reference/modern_parallelism.md`` 3.2). GEMM outputs return in high precision, so the
HBM traffic of an op is unchanged (an upper bound for the quantized operand reads). Grouped
expert GEMMs (TEGroupedLinear) join the set when MoE is modelled.

Quantization kernels (:meth:`OpPrecision.quantized_bytes`). Each TE linear quantizes two tensors
per microbatch that no other op writes in low precision: its input in the forward pass (rowwise
usage for Fprop, columnwise for Wgrad, made together and saved) and the gradient of its output
in the backward pass (rowwise for Dgrad, columnwise for Wgrad); weights are quantized once per
step (cached across micro-batches, or FP8 primary weights under ``--fp8-param-gather``) and are
not timed. The attention output projection under every recipe but delayed scaling keeps its
high-precision input instead (Megatron-Core's ``save_original_input``,
:func:`~blueprinting.mapping.precision.projection_saves_original_input`): its forward cast
writes the rowwise usage only, and the Wgrad pass casts the kept input again, columnwise.
The input of ``LayerNormLinear`` (QKV, FC1, MLA's up-projections) comes from the norm kernel,
which writes it quantized only under delayed scaling (TE
``pytorch/csrc/extensions/normalization.cpp`` ``layernorm_fwd`` / ``rmsnorm_fwd``,
``Impl::FULLY_FUSED`` for a ``Float8Quantizer``; the same at v2.4 @3cd6870c as
``force_unfused_kernel = false``): every other recipe's norm writes the high-precision output
and a separate pass quantizes it (:func:`norm_writes_quantized`). Since TE v2.8 the norm
kernel computes the amax a per-tensor current scale needs (``Impl::FUSED_NORM_AMAX_FP8``), so
that pass reads its input once; NVFP4's default quantizer takes its amax after the Hadamard
transform (``with_post_rht_amax``) and reads twice as in any linear. Two exceptions, behind
Transformer Engine's ``NVTE_NORM_FWD_USE_CUDNN`` environment variable (no Blueprinting key; a
Megatron-Bridge launcher sets it for some recipes, ``scripts/performance/utils/executors.py``):
the cuDNN norm writes MXFP8 itself (dimensions multiples of 128), and current scaling falls back
to the unfused pass with its own amax read. A pass is
memory-bound: it reads the high-precision tensor once, twice where the scale needs the tensor's
current amax first (``tensorwise``: TE ``Float8CurrentScaling``; NVFP4: its per-tensor FP32
scale), and writes each usage: 1 B per element for FP8 (+ an FP32 scale per 128 for blockwise,
an E8M0 per 32 for MXFP8), 0.5 B + an E4M3 scale per 16 for NVFP4. Rowwise and columnwise are
separate copies except for per-tensor FP8 on an accelerator that reads FP8 columnwise natively
(Blackwell: TE ``docs/features/low_precision_training/performance_considerations.rst``,
"Handling transposes"; Hopper needs a physical transpose). NVFP4's random Hadamard transform
and stochastic rounding run inside the same pass (16-point transforms: compute well below the
pass's bytes).

Sequence parallelism (:attr:`OpPrecision.sequence_shards`): a gathered tensor (a
column-parallel linear's input, a row-parallel linear's output gradient) is cast on the rank's
s/t rows and all-gathered in the recipe's format (:meth:`OpPrecision.collective_bytes`); per-tensor
FP8 gathers it rowwise and, where the accelerator needs one, transposes the gathered tensor
afterwards (:meth:`OpPrecision.fp8_transpose_elements`); current scaling and NVFP4 first
all-reduce its amax over TP, one latency-bound collective on the critical path
(:meth:`OpPrecision.amax_reductions`).

Cast-kernel rate (:func:`cast_bandwidth_fraction`, :meth:`OpPrecision.quantize_time`). The
block-scaled casts do not run at the streaming rate: Transformer Engine's own GEMM benchmark
(NVIDIA/TransformerEngine@332941783386 ``docs/features/low_precision_training/gemm_profiling/
gemm_profiling.rst``, B300, M = 15,872, h 4096, ffn 16384) times the 12 GEMM shapes of a layer
in autocast (each ``te.Linear`` forward casts its input rowwise and columnwise, the weight
requiring grad, and its weight rowwise: ``pytorch/module/linear.py`` ``backward_needs_input``)
and pre-quantized; the bytes of the casts above over the difference per pass (Fprop, Dgrad,
Wgrad) is the casts' achieved bandwidth. One fraction of the HBM datasheet rate per
recipe, the geometric mean over the three passes (``tests/synthesizer/
test_quantization_kernels.py`` refits it and gives the per-pass errors): FP8 blockwise 0.41
(RMS 4.1%, max 5.7%), MXFP8 0.96 (RMS 9.0%, max 12.3%), NVFP4 0.57 (RMS 4.3%, max 6.2%;
NVFP4BlockScaling's defaults: the random Hadamard transform of the columnwise copy and 2D
16 x 16 weight scales are inside the measured time, stochastic rounding of gradients is not,
a forward-only benchmark). The benchmark casts the same tensor every iteration, so part of it
stays in L2: MXFP8's 0.96 exceeds any streaming rate, and the time of a cast never goes below
the preset's HBM pass (the fraction is capped by the HBM efficiency). The fractions are taken
as the same on every accelerator with the recipe; per-tensor FP8 (delayed, tensorwise) has no
measurement and runs at the HBM pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import assert_never, final

from blueprinting.errors import ConfigError
from blueprinting.hardware.efficiency import efficiency_fraction
from blueprinting.hardware.system import SystemSpec
from blueprinting.mapping.model import Datatype
from blueprinting.mapping.precision import (
    Fp4Precision,
    Fp8Precision,
    Fp8Recipe,
    GemmFormat,
    HighPrecision,
    TrainingPrecision,
    gemm_format,
    projection_saves_original_input,
)
from blueprinting.mapping.transformer import (
    AllReduce,
    RecomputeModule,
    ReduceScatterAllGather,
    TensorParallel,
)
from blueprinting.synthesizer.dialects.transformer.training import (
    CollectiveKind,
    GemmShape,
    SemanticOpName,
)
from blueprinting.synthesizer.stages.distributed.ir import CollectiveTask, Phase

#: The block's Transformer Engine linear layers (Megatron ``linear_qkv``, ``linear_proj``,
#: ``linear_fc1``, ``linear_fc2``; MLA's down / up projections; the experts' ``GroupedLinear``
#: and the shared experts' linears). The router's gate stays at the base precision (shared
#: reference section 2.1: ``router_gating_linear``, not an FP8 GEMM).
TE_LINEAR_OPS: frozenset[SemanticOpName] = frozenset(
    {
        SemanticOpName.QKV_PROJECTION,
        SemanticOpName.OUTPUT_PROJECTION,
        SemanticOpName.MLP_UP,
        SemanticOpName.MLP_DOWN,
        SemanticOpName.MLA_DOWN_PROJECTION,
        SemanticOpName.MLA_UP_PROJECTION,
        SemanticOpName.EXPERT_FC1,
        SemanticOpName.EXPERT_FC2,
        SemanticOpName.SHARED_EXPERT_UP,
        SemanticOpName.SHARED_EXPERT_DOWN,
    }
)


#: TE linears whose input the preceding norm writes (``LayerNormLinear``: Megatron's
#: ``TELayerNormColumnParallelLinear`` for ``linear_qkv``, ``linear_fc1`` and MLA's
#: ``linear_q_up_proj`` / ``linear_kv_up_proj`` with their fused latent norms): quantized by the
#: norm itself under :func:`norm_writes_quantized` recipes, otherwise by a pass of their own.
NORM_FUSED_INPUT_OPS: frozenset[SemanticOpName] = frozenset(
    {
        SemanticOpName.QKV_PROJECTION,
        SemanticOpName.MLP_UP,
        SemanticOpName.MLA_UP_PROJECTION,
    }
)


#: Bytes of one amax all-reduce over the TP group (one fp32 per tensor).
AMAX_BYTES = 4

#: HBM bytes an element of an FP8 transpose moves (one read, one write).
FP8_TRANSPOSE_BYTES = 2

#: Row-parallel TE linears whose output gradient arrives by a TP all-gather under sequence
#: parallelism (TE ``base.py`` ``grad_output_preprocess``: ``row_parallel_mode and
#: sequence_parallel``): the rank casts its s/t rows, then gathers them quantized.
ROW_PARALLEL_OPS: frozenset[SemanticOpName] = frozenset(
    {SemanticOpName.OUTPUT_PROJECTION, SemanticOpName.MLP_DOWN, SemanticOpName.SHARED_EXPERT_DOWN}
)

#: Column-parallel TE linears whose input arrives by a TP all-gather under sequence
#: parallelism: the LayerNormLinears and the shared experts' FC1 (a ``TELinear`` that gathers
#: its input, TE ``linear.py`` ``with_input_all_gather``); each rank casts its s/t rows first.
GATHERED_INPUT_OPS: frozenset[SemanticOpName] = NORM_FUSED_INPUT_OPS | {
    SemanticOpName.SHARED_EXPERT_UP
}


#: Achieved fraction of the HBM datasheet rate of Transformer Engine's cast kernels, fitted on
#: TE's B300 autocast-minus-pre-quantized GEMM benchmark (module docstring).
FP8_BLOCKWISE_CAST_FRACTION = 0.41
MXFP8_CAST_FRACTION = 0.96
NVFP4_CAST_FRACTION = 0.57


def norm_writes_quantized(recipe: TrainingPrecision) -> bool:
    """Whether Transformer Engine's norm kernel writes a ``LayerNormLinear``'s input already in
    the recipe's format (module docstring: delayed scaling only, ``Impl::FULLY_FUSED``)."""
    match recipe:
        case HighPrecision():
            return False
        case Fp8Precision(recipe=fp8):
            match fp8:
                case Fp8Recipe.DELAYED:
                    return True
                case Fp8Recipe.TENSORWISE | Fp8Recipe.BLOCKWISE | Fp8Recipe.MXFP8:
                    return False
                case _ as unreachable_fp8:
                    assert_never(unreachable_fp8)
        case Fp4Precision():
            return False
        case _ as unreachable:
            assert_never(unreachable)


def sequence_shards(tensor: TensorParallel) -> int:
    """:attr:`OpPrecision.sequence_shards` of a TP variant: t with sequence parallelism (the
    norms run on s/t rows before the all-gather), 1 without."""
    match tensor.communication:
        case ReduceScatterAllGather():
            return tensor.degree
        case AllReduce():
            return 1
        case _ as unreachable:
            assert_never(unreachable)


def cast_bandwidth_fraction(recipe: TrainingPrecision) -> float | None:
    """The fitted fraction of the HBM datasheet rate the recipe's casts reach, or None (no
    measurement: the preset's HBM pass)."""
    match recipe:
        case HighPrecision():
            return None
        case Fp8Precision(recipe=fp8):
            match fp8:
                case Fp8Recipe.DELAYED | Fp8Recipe.TENSORWISE:
                    return None
                case Fp8Recipe.BLOCKWISE:
                    return FP8_BLOCKWISE_CAST_FRACTION
                case Fp8Recipe.MXFP8:
                    return MXFP8_CAST_FRACTION
                case _ as unreachable_fp8:
                    assert_never(unreachable_fp8)
        case Fp4Precision():
            return NVFP4_CAST_FRACTION
        case _ as unreachable:
            assert_never(unreachable)


def reads_fp8_columnwise(system: SystemSpec) -> bool:
    """Whether the accelerator's FP8 GEMMs read an operand columnwise in place (Blackwell, SM
    10.x: TE's ``is_non_tn_fp8_gemm_supported``; here the accelerators that run MXFP8, a
    Blackwell-only format), so per-tensor FP8 keeps one copy instead of a transpose."""
    return any(rate.format is GemmFormat.MXFP8 for rate in system.accelerator.low_precision)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class QuantizedTensorBytes:
    """HBM bytes per element of one quantization pass: ``read`` of the high-precision tensor
    (once, or twice when a current amax comes first) and ``per_usage`` written for each of its
    ``usages`` (rowwise, columnwise)."""

    read: float
    per_usage: float
    usages: int

    @property
    def total(self) -> float:
        return self.read + self.usages * self.per_usage


def quantized_tensor_bytes(
    recipe: TrainingPrecision,
    *,
    base_bytes: int,
    native_columnwise_fp8: bool,
    amax_from_norm: bool = False,
) -> QuantizedTensorBytes | None:
    """Bytes per element a recipe's quantization pass moves (module docstring); None: the
    recipe quantizes nothing. ``amax_from_norm``: the tensor is a norm's output whose kernel
    computed the per-tensor amax (``Impl::FUSED_NORM_AMAX_FP8``), so current scaling reads it
    once."""
    match recipe:
        case HighPrecision():
            return None
        case Fp8Precision(recipe=fp8):
            match fp8:
                case Fp8Recipe.DELAYED | Fp8Recipe.TENSORWISE:
                    current = fp8 is Fp8Recipe.TENSORWISE and not amax_from_norm
                    reads = 2 if current else 1
                    return QuantizedTensorBytes(
                        read=reads * base_bytes,
                        per_usage=1.0,
                        usages=1 if native_columnwise_fp8 else 2,
                    )
                case Fp8Recipe.BLOCKWISE:
                    return QuantizedTensorBytes(read=base_bytes, per_usage=1 + 4 / 128, usages=2)
                case Fp8Recipe.MXFP8:
                    return QuantizedTensorBytes(read=base_bytes, per_usage=1 + 1 / 32, usages=2)
                case _ as unreachable_fp8:
                    assert_never(unreachable_fp8)
        case Fp4Precision():
            return QuantizedTensorBytes(read=2 * base_bytes, per_usage=0.5 + 1 / 16, usages=2)
        case _ as unreachable:
            assert_never(unreachable)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class OpPrecision:
    """The model's datatype and the strategy's recipe, as the costing pass reads them.
    ``sequence_shards``: the pieces a LayerNormLinear's input is split into when its norm
    writes it (t under sequence parallelism, :func:`sequence_shards`; else 1)."""

    datatype: Datatype
    recipe: TrainingPrecision
    sequence_shards: int = 1
    #: the selective recompute modules (``mapping.transformer.recomputed_modules``): which
    #: linears keep their original input (:meth:`_saves_original_input`)
    recomputed: frozenset[RecomputeModule] = frozenset()

    def __post_init__(self) -> None:
        if self.sequence_shards < 1:
            raise ConfigError(
                [f"OpPrecision.sequence_shards must be >= 1, got {self.sequence_shards!r}"]
            )

    def gemm_format(self, op: SemanticOpName, *, is_gemm: bool) -> GemmFormat | None:
        """The low-precision format ``op``'s matrix FLOPs run in, or None (the datatype's
        matrix rate): a GEMM of a Transformer Engine linear under an FP8 / FP4 recipe."""
        if not is_gemm or op not in TE_LINEAR_OPS:
            return None
        return gemm_format(self.recipe)

    def quantized_elements(self, op: SemanticOpName, phase: Phase, gemm: GemmShape) -> int:
        """Elements a TE linear's GEMM task quantizes in its own pass (module docstring): the
        input (``m x n``) of a forward GEMM whose input no norm wrote quantized
        (:func:`norm_writes_quantized`), the output
        gradient (``m x k``) of an activation-gradient GEMM; 0 otherwise."""
        if op not in TE_LINEAR_OPS or gemm_format(self.recipe) is None:
            return 0
        match phase:
            case Phase.FORWARD | Phase.RECOMPUTE:
                # a recomputed forward re-quantizes its input as the forward does
                if op in NORM_FUSED_INPUT_OPS and norm_writes_quantized(self.recipe):
                    return 0
                # under sequence parallelism the rank casts its own s/t rows, then all-gathers
                # them quantized (TE layernorm_linear.py / linear.py, ``quantizer(ln_out)``
                # before ``gather_along_first_dim(..., quantizer=quantizer)``)
                return gemm.batch * gemm.m * gemm.n // self._shards(op, phase)
            case Phase.BACKWARD_ACTIVATION_GRAD:
                return gemm.batch * gemm.m * gemm.k // self._shards(op, phase)
            case Phase.BACKWARD_WEIGHT_GRAD:
                if self._saves_original_input(op):
                    # the linear kept its bf16 input (a gathered one: the rank's rows, cast
                    # before the Wgrad's all-gather): cast it columnwise for Wgrad
                    return gemm.batch * gemm.m * gemm.n // self._shards(op, phase)
                return 0  # Wgrad reads the columnwise copies made with the two above
            case _ as unreachable:
                assert_never(unreachable)

    def _saves_original_input(self, op: SemanticOpName) -> bool:
        """A TE linear Megatron-Core has keep its high-precision input
        (``set_save_original_input``): its forward cast makes the rowwise usage only, and the
        Wgrad pass casts the kept input columnwise. The attention output projection and the
        shared experts' FC1 under :func:`projection_saves_original_input`'s recipes
        (``attention.py`` l.428-444; ``moe/shared_experts.py`` l.147-161, not when the shared
        experts are recomputed), the routed experts' FC2 under ``moe_act`` recompute with any
        recipe (``moe/experts.py`` l.270-276: the activation's output is discarded and
        recomputed; delayed scaling refuses that recompute) @d98e8a64."""
        match op:
            case SemanticOpName.OUTPUT_PROJECTION:
                return projection_saves_original_input(self.recipe)
            case SemanticOpName.SHARED_EXPERT_UP:
                return (
                    projection_saves_original_input(self.recipe)
                    and RecomputeModule.SHARED_EXPERTS not in self.recomputed
                )
            case SemanticOpName.EXPERT_FC2:
                return (
                    gemm_format(self.recipe) is not None
                    and RecomputeModule.MOE_ACT in self.recomputed
                )
            case _:
                return False

    def _original_input_cast(
        self, op: SemanticOpName, phase: Phase, per_element: QuantizedTensorBytes
    ) -> QuantizedTensorBytes:
        """The usages a kept-input linear's casts write (TE ``linear.py`` @d0067d0d): the
        forward the rowwise one alone (l.393-398); the Wgrad recast the columnwise one for the
        block formats and for a tensor it gathers again (per-tensor FP8 gathers rowwise and
        transposes after), both for per-tensor FP8 otherwise (l.965-969:
        ``set_usage(rowwise=True, columnwise=not backward_input_needs_gather)``, one copy where
        the accelerator reads FP8 columnwise natively); the output gradient's cast as any
        linear's."""
        match phase:
            case Phase.FORWARD | Phase.RECOMPUTE:
                return replace(per_element, usages=1)
            case Phase.BACKWARD_WEIGHT_GRAD:
                if self._regathered(op) or not self._per_tensor_fp8():
                    return replace(per_element, usages=1)
                return per_element
            case Phase.BACKWARD_ACTIVATION_GRAD:
                return per_element
            case _ as unreachable:
                assert_never(unreachable)

    def _gathered(self, op: SemanticOpName, phase: Phase) -> bool:
        """Whether the tensor ``op`` casts in ``phase`` arrives by a TP all-gather under
        sequence parallelism: a column-parallel linear's input (forward, recompute) or a
        row-parallel linear's output gradient."""
        if self.sequence_shards == 1:
            return False
        if phase in (Phase.FORWARD, Phase.RECOMPUTE):
            return op in GATHERED_INPUT_OPS
        return phase is Phase.BACKWARD_ACTIVATION_GRAD and op in ROW_PARALLEL_OPS

    def _regathered(self, op: SemanticOpName) -> bool:
        """Whether ``op``'s Wgrad all-gathers its input again under sequence parallelism (TE
        saves the rank's rows: a column-parallel linear's input)."""
        return self.sequence_shards > 1 and op in GATHERED_INPUT_OPS

    def _shards(self, op: SemanticOpName, phase: Phase) -> int:
        """The pieces the rank's cast covers: its s/t rows of a gathered tensor (the Wgrad's
        regathered input included), else all."""
        gathered = self._gathered(op, phase) or (
            phase is Phase.BACKWARD_WEIGHT_GRAD and self._regathered(op)
        )
        return self.sequence_shards if gathered else 1

    def _per_tensor_fp8(self) -> bool:
        return gemm_format(self.recipe) is GemmFormat.FP8

    def collective_bytes(self, task: CollectiveTask) -> float:
        """Bytes a TP collective moves. A TE linear's all-gather under sequence parallelism
        (its input in the forward, the input again for the weight gradient, a row-parallel
        linear's output gradient) gathers the tensor already quantized (TE ``distributed.py``
        ``gather_along_first_dim``: ``_all_gather_fp8`` / ``_all_gather_mxfp8`` /
        ``_all_gather_nvfp4`` / the blockwise one, scales beside the data), one usage of it:
        per-tensor FP8 gathers its rowwise bytes and transposes after
        (``supports_only_rowwise_all_gather``); the block formats gather each usage the GEMMs
        need, rowwise for Fprop, columnwise for Wgrad, both for an output gradient (dgrad and
        wgrad; through userbuffers the rowwise one, and a second, columnwise all-gather
        overlapped in bulk with the dgrad GEMM, ``linear.py`` ``ub_obj_overlap_wgrad``, the same
        bytes). Reduce-scatters and all-reduces carry the GEMMs' high-precision outputs:
        ``task.bytes``."""
        if (
            task.kind is not CollectiveKind.ALL_GATHER
            or task.lineage.op not in TE_LINEAR_OPS
            or gemm_format(self.recipe) is None
        ):
            return float(task.bytes)
        per_element = quantized_tensor_bytes(
            self.recipe, base_bytes=self.datatype.bytes, native_columnwise_fp8=True
        )
        if per_element is None:
            return float(task.bytes)
        both = task.phase is Phase.BACKWARD_ACTIVATION_GRAD and not self._per_tensor_fp8()
        usages = 2 if both else 1
        return task.bytes / self.datatype.bytes * per_element.per_usage * usages

    def amax_reductions(self, op: SemanticOpName, phase: Phase) -> int:
        """TP all-reduces of a per-tensor amax a TE linear's task waits for before its cast
        (0 or 1): under sequence parallelism a gathered tensor needs one scale on every rank,
        so current scaling and NVFP4 (the quantizers with ``with_amax_reduction``) reduce the
        amax of a column-parallel linear's input and of a row-parallel linear's output
        gradient over the TP group (TE ``linear.py``: ``set_quantizer_amax_reduction_group``,
        ``tp_group if (sequence_parallel and parallel_mode == "column")`` for the input and
        ``"row"`` for the output gradient; ``layernorm_linear.py`` the same for its input).
        Delayed scaling reduces its amax history once per step; MXFP8 and blockwise scales are
        local."""
        if op not in TE_LINEAR_OPS or not self._gathered(op, phase):
            return 0
        match self.recipe:
            case Fp8Precision(recipe=Fp8Recipe.TENSORWISE) | Fp4Precision():
                return 1
            case HighPrecision() | Fp8Precision():
                return 0
            case _ as unreachable:
                assert_never(unreachable)

    def _gathered_rowwise(self, native_columnwise_fp8: bool) -> bool:
        """Per-tensor FP8 under sequence parallelism on an accelerator that needs a transposed
        copy: the gathered tensors are cast and gathered rowwise only, and their transpose is
        made after the all-gather (TE ``distributed.py`` ``_all_gather_fp8``:
        ``out._create_transpose()`` where ``is_non_tn_fp8_gemm_supported`` is false)."""
        return self.sequence_shards > 1 and not native_columnwise_fp8 and self._per_tensor_fp8()

    def fp8_transpose_elements(
        self, op: SemanticOpName, phase: Phase, gemm: GemmShape, *, native_columnwise_fp8: bool
    ) -> int:
        """Elements of the FP8 transposes a task's tensors take in a pass of their own on an
        accelerator that needs a transposed copy. After a rowwise all-gather
        (:meth:`_gathered_rowwise`): a row-parallel linear's gathered output gradient (its
        Wgrad reads it columnwise) and a LayerNormLinear's input regathered for its Wgrad
        (``set_quantizer_usage_for_wgrad_all_gather``). Without sequence parallelism, the
        delayed-scaling norm's FP8 output: the fused norm writes it rowwise and
        ``nvte_transpose`` makes the columnwise copy (``layernorm/ln_api.cpp``,
        ``rmsnorm/rmsnorm_api.cpp``: "Compute FP8 transpose if required"). 0 otherwise."""
        if op not in TE_LINEAR_OPS:
            return 0
        if self._gathered_rowwise(native_columnwise_fp8):
            if phase is Phase.BACKWARD_ACTIVATION_GRAD and op in ROW_PARALLEL_OPS:
                return gemm.batch * gemm.m * gemm.k
            if phase is Phase.BACKWARD_WEIGHT_GRAD and self._regathered(op):
                return gemm.batch * gemm.m * gemm.n
            return 0
        if (
            self.sequence_shards == 1
            and not native_columnwise_fp8
            and op in NORM_FUSED_INPUT_OPS
            and phase in (Phase.FORWARD, Phase.RECOMPUTE)
            and norm_writes_quantized(self.recipe)
        ):
            return gemm.batch * gemm.m * gemm.n
        return 0

    def quantized_bytes(
        self, op: SemanticOpName, phase: Phase, gemm: GemmShape, *, native_columnwise_fp8: bool
    ) -> float:
        """HBM bytes of the quantization passes a TE linear's GEMM task runs (0: none): its
        cast, and the FP8 transpose of a gathered tensor (1 B read, 1 B written an element)."""
        elements = self.quantized_elements(op, phase, gemm)
        transposed = self.fp8_transpose_elements(
            op, phase, gemm, native_columnwise_fp8=native_columnwise_fp8
        )
        if elements == 0 and transposed == 0:
            return 0.0
        gathered = self._gathered(op, phase)
        per_element = quantized_tensor_bytes(
            self.recipe,
            base_bytes=self.datatype.bytes,
            # a tensor gathered rowwise is cast rowwise only (its transpose comes after)
            native_columnwise_fp8=native_columnwise_fp8
            or (gathered and self._gathered_rowwise(native_columnwise_fp8)),
            amax_from_norm=op in NORM_FUSED_INPUT_OPS and phase in (Phase.FORWARD, Phase.RECOMPUTE),
        )
        if per_element is not None and self._saves_original_input(op):
            per_element = self._original_input_cast(op, phase, per_element)
        cast = 0.0 if per_element is None else elements * per_element.total
        return cast + transposed * FP8_TRANSPOSE_BYTES

    def quantize_time(self, system: SystemSpec, size_bytes: float) -> float:
        """Seconds of a cast pass moving ``size_bytes``: the HBM pass, or slower at the recipe's
        fitted cast rate (:func:`cast_bandwidth_fraction`; never faster than the HBM pass)."""
        fraction = cast_bandwidth_fraction(self.recipe)
        if fraction is None or size_bytes == 0:
            return system.memory_time(size_bytes)
        hbm = system.accelerator.hbm
        streaming = efficiency_fraction(hbm.efficiency, size_bytes)
        return size_bytes / (hbm.bandwidth_bytes_per_s * min(fraction, streaming))
