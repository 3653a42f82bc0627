"""What a low-precision recipe changes in memory and in the DP parameter all-gather.

From ``shared/reference/modern_parallelism.md`` 3.3 and the formula sheet of section 7 (Transformer
Engine ``docs/.../performance_considerations.rst`` "Memory usage", ``mxfp8.rst``,
``fp8_blockwise_scaling.rst``, ``nvfp4.rst`` @d0067d0d; Megatron-LM ``arguments.py``
l.1095-1109, ``param_and_grad_buffer.py`` l.301-330 @d98e8a64). Only the weights of the
Transformer Engine linear layers (QKV, proj, FC1, FC2, MLA's projections, the experts' grouped
linears: :mod:`.rank_parameters`) are quantized; biases, norms, the embedding and the LM head
keep the model's datatype.

Weights, per linear weight element (``n`` elements on the rank):

- without ``--fp8-param-gather``: TE keeps the high-precision weight and adds the quantized
  copies it caches across microbatches, a rowwise one for the forward GEMM and a columnwise one
  for the activation gradient (a transpose on Hopper, a separately quantized copy for MXFP8):
  ``2 x 1 B`` for FP8 (the "up to 2 x 1 B" of section 3.3: both copies are counted), plus the
  block scales (MXFP8 one E8M0 byte per 32 elements per copy; blockwise 128 x 128 weight tiles one
  FP32 scale per 16,384 elements per copy; per-tensor recipes one scale per tensor, not counted),
  and for NVFP4 ``2 x (n/2 + n/16)`` bytes (packed E2M1 plus one E4M3 scale per 16);
- with the param gather the high-precision weight is not kept (FP8 primary weights, FP32 master
  in the distributed optimizer): the same copies, less the ``n x base`` bytes.

The extra over ``n x base`` is :func:`weight_extra_bytes` (negative with the param gather).

DP parameter all-gather (distributed optimizer): ``--fp8-param-gather`` gathers 1 B per linear
weight element ("50% parameter all-gather") except MXFP8, which gathers the high-precision values
through the idle grad buffer (``--reuse-grad-buf-for-mxfp8-param-ag``) and so moves the base bytes;
``--fp4-param-gather`` gathers the packed NVFP4 rowwise bytes, ``n/2`` (scales not counted):
:func:`param_gather_bytes`.

Activations saved for the weight gradient (section 3.3 "Activations"): a Transformer Engine
linear under a recipe keeps its input quantized, the columnwise usage the Wgrad GEMM reads
(TE ``module/linear.py`` / ``layernorm_linear.py``: the input quantizer's rowwise usage is dropped
before saving; ``save_original_input`` is False by default), in place of the high-precision
input: per element 1 B for per-tensor FP8 (delayed, tensorwise), 1 B + one FP32 scale per 128
for blockwise (1 x 128 activation blocks), 1 B + one E8M0 byte per 32 for MXFP8, and 1/2 B + one
E4M3 byte per 16 for NVFP4 (the per-tensor global scale not counted): :func:`saved_input_bytes`.
Which stored tensors are linear inputs, and which stay high precision beside them (the attention
output a fused attention kernel keeps for its own backward), is :mod:`.memory`'s
``layer_activation_bytes``.

Not modelled: padding of grouped GEMMs (MoE); ``activation_func_fp8_input_store`` (the
activation function's input in FP8).
"""

from __future__ import annotations

from typing import assert_never

from blueprinting.mapping.precision import (
    Fp4Precision,
    Fp8Precision,
    Fp8Recipe,
    HighPrecision,
    TrainingPrecision,
)

MXFP8_BLOCK = 32
BLOCKWISE_WEIGHT_TILE = 128 * 128
FP32_SCALE_BYTES = 4
NVFP4_BLOCK = 16


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def _fp8_scale_bytes(recipe: Fp8Recipe, elements: int) -> int:
    """Scale bytes of one quantized copy of ``elements`` weight elements."""
    match recipe:
        case Fp8Recipe.DELAYED | Fp8Recipe.TENSORWISE:
            return 0
        case Fp8Recipe.BLOCKWISE:
            return FP32_SCALE_BYTES * _ceil_div(elements, BLOCKWISE_WEIGHT_TILE)
        case Fp8Recipe.MXFP8:
            return _ceil_div(elements, MXFP8_BLOCK)
        case _ as unreachable:
            assert_never(unreachable)


def quantized_copy_bytes(precision: TrainingPrecision, elements: int) -> int:
    """Bytes of the rowwise and columnwise quantized copies of ``elements`` weight elements
    (module docstring); 0 for :class:`HighPrecision`."""
    n = elements
    match precision:
        case HighPrecision():
            return 0
        case Fp8Precision(recipe=recipe):
            return 2 * (n + _fp8_scale_bytes(recipe, n))
        case Fp4Precision():
            return 2 * (_ceil_div(n, 2) + _ceil_div(n, NVFP4_BLOCK))
        case _ as unreachable:
            assert_never(unreachable)


#: FP8 blockwise recipe: one FP32 scale per 1 x 128 block of an activation (section 3.1).
BLOCKWISE_ACTIVATION_BLOCK = 128


def saved_input_bytes(precision: TrainingPrecision, elements: int, base_bytes: int) -> int:
    """Bytes a Transformer Engine linear keeps of an input of ``elements`` elements for its
    weight gradient (module docstring): ``elements x base_bytes`` under :class:`HighPrecision`,
    the recipe's columnwise quantized copy otherwise."""
    n = elements
    match precision:
        case HighPrecision():
            return n * base_bytes
        case Fp8Precision(recipe=recipe):
            match recipe:
                case Fp8Recipe.DELAYED | Fp8Recipe.TENSORWISE:
                    return n
                case Fp8Recipe.BLOCKWISE:
                    return n + FP32_SCALE_BYTES * _ceil_div(n, BLOCKWISE_ACTIVATION_BLOCK)
                case Fp8Recipe.MXFP8:
                    return n + _ceil_div(n, MXFP8_BLOCK)
                case _ as unreachable_recipe:
                    assert_never(unreachable_recipe)
        case Fp4Precision():
            return _ceil_div(n, 2) + _ceil_div(n, NVFP4_BLOCK)
        case _ as unreachable:
            assert_never(unreachable)


def _gathers_low_precision(precision: TrainingPrecision) -> bool:
    match precision:
        case HighPrecision():
            return False
        case Fp8Precision(param_gather=gather) | Fp4Precision(param_gather=gather):
            return gather
        case _ as unreachable:
            assert_never(unreachable)


def weight_extra_bytes(precision: TrainingPrecision, elements: int, base_bytes: int) -> int:
    """Weight bytes a recipe adds on top of ``elements x base_bytes`` for ``elements`` linear
    weight elements (negative when the param gather drops the high-precision copy)."""
    copies = quantized_copy_bytes(precision, elements)
    return copies - elements * base_bytes if _gathers_low_precision(precision) else copies


def param_gather_bytes(
    precision: TrainingPrecision, parameters: int, linear_elements: int, base_bytes: int
) -> int:
    """Bytes of the DP parameter all-gather of ``parameters`` parameters, ``linear_elements`` of
    them Transformer Engine linear weights (module docstring)."""
    full = parameters * base_bytes
    if not _gathers_low_precision(precision):
        return full
    rest = (parameters - linear_elements) * base_bytes
    match precision:
        case HighPrecision():
            return full
        case Fp8Precision(recipe=Fp8Recipe.MXFP8):
            return full
        case Fp8Precision():
            return rest + linear_elements
        case Fp4Precision():
            return rest + _ceil_div(linear_elements, 2)
        case _ as unreachable:
            assert_never(unreachable)
