"""The training precision recipe: which GEMMs Transformer Engine runs below the model's datatype.

Megatron-LM picks the base datatype with ``--bf16`` / ``--fp16`` (the model's
:class:`~blueprinting.mapping.model.Datatype`: weights, activations, attention, norms) and turns
Transformer Engine's low-precision GEMMs on with ``--fp8-format {e4m3,hybrid}`` (config ``fp8``)
and ``--fp8-recipe {delayed,tensorwise,blockwise,mxfp8}`` (default ``delayed``), or with
``--fp4-format e2m1`` and ``--fp4-recipe nvfp4``; FP8 and FP4 exclude each other.
``--fp8-param-gather`` (``--fp4-param-gather``) keeps the primary weights in the low-precision
format. Source: Megatron-LM ``transformer_config.py`` l.584-690, ``fp8_utils.py`` l.752-812,
``fp4_utils.py`` l.219-245, ``arguments.py`` l.1095-1109 @d98e8a64, as summarized in
``shared/reference/modern_parallelism.md`` section 3.1.

The recipe is a sum type (:data:`TrainingPrecision`): :class:`HighPrecision` (every GEMM in the
model's datatype), :class:`Fp8Precision`, :class:`Fp4Precision`. Each low-precision recipe names
the tensor-core format its GEMMs need (:class:`GemmFormat`); an accelerator lists the formats it
runs (:class:`AcceleratorSupport`), and the law that a recipe needs its format
(:mod:`blueprinting.mapping.precision_laws`) names both. Only the Transformer Engine linear layers
run in the low-precision format (section 3.2): which ops those are is decided in one place, the
costing stage (:mod:`blueprinting.synthesizer.stages.portable_plan.precision`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TypeAlias, assert_never, final

from blueprinting.errors import ConfigError


class Fp8Format(StrEnum):
    """``--fp8-format``: E4M3 everywhere, or E4M3 forward and E5M2 gradients (``hybrid``)."""

    E4M3 = "e4m3"
    HYBRID = "hybrid"


class Fp8Recipe(StrEnum):
    """``--fp8-recipe``: the scaling granularity (Megatron-LM ``fp8_utils.py`` l.771-788: TE
    ``DelayedScaling``, ``Float8CurrentScaling``, ``Float8BlockScaling``,
    ``MXFP8BlockScaling``). Megatron's ``custom`` (a user quantizer factory) is not modelled."""

    DELAYED = "delayed"
    TENSORWISE = "tensorwise"
    BLOCKWISE = "blockwise"
    MXFP8 = "mxfp8"


class Fp4Format(StrEnum):
    """``--fp4-format``: E2M1 is the only FP4 element format Megatron-LM accepts."""

    E2M1 = "e2m1"


class Fp4Recipe(StrEnum):
    """``--fp4-recipe``: NVFP4 block scaling (TE ``NVFP4BlockScaling``). Megatron's ``custom``
    is not modelled."""

    NVFP4 = "nvfp4"


class GemmFormat(StrEnum):
    """The tensor-core format a low-precision recipe's GEMMs run in (section 3.1 "hardware").

    ``fp8``: per-tensor scaled E4M3/E5M2 (delayed and tensorwise recipes; SM 8.9+);
    ``fp8_blockwise``: 1x128 / 128x128 FP32-scaled blocks (native on Hopper, emulated through
    MXFP8 on Blackwell); ``mxfp8``: 1x32 blocks with E8M0 scales (Blackwell SM 10.0/10.3 only);
    ``nvfp4``: E2M1 with 1x16 E4M3 block scales (Blackwell SM 10.0/10.3 only)."""

    FP8 = "fp8"
    FP8_BLOCKWISE = "fp8_blockwise"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class HighPrecision:
    """Every GEMM in the model's datatype (``--bf16``, ``--fp16`` or fp32)."""

    def __str__(self) -> str:
        return "high-precision"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Fp8Precision:
    """Transformer Engine FP8 GEMMs (``--fp8-format``, ``--fp8-recipe``); ``param_gather`` is
    ``--fp8-param-gather``: FP8 primary weights, the DP parameter all-gather in FP8."""

    recipe: Fp8Recipe = Fp8Recipe.DELAYED
    format: Fp8Format = Fp8Format.HYBRID
    param_gather: bool = False
    #: ``--first-last-layers-bf16``: this many first / last decoder layers keep the base
    #: precision (``--num-layers-at-start-in-bf16`` / ``--num-layers-at-end-in-bf16``).
    high_precision_layers: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        _check_layers("Fp8Precision", self.high_precision_layers)

    def __str__(self) -> str:
        gather = ", param-gather" if self.param_gather else ""
        return f"fp8({self.recipe}, {self.format}{gather}{_layers_text(self)})"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Fp4Precision:
    """Transformer Engine NVFP4 GEMMs (``--fp4-format``, ``--fp4-recipe``); ``param_gather`` is
    ``--fp4-param-gather`` (packed NVFP4 weights gathered)."""

    recipe: Fp4Recipe = Fp4Recipe.NVFP4
    format: Fp4Format = Fp4Format.E2M1
    param_gather: bool = False
    high_precision_layers: tuple[int, int] = (0, 0)  # as Fp8Precision's

    def __post_init__(self) -> None:
        _check_layers("Fp4Precision", self.high_precision_layers)

    def __str__(self) -> str:
        gather = ", param-gather" if self.param_gather else ""
        return f"fp4({self.recipe}, {self.format}{gather}{_layers_text(self)})"


def _check_layers(owner: str, layers: tuple[int, int]) -> None:
    if min(layers) < 0:
        raise ConfigError(
            [f"{owner}.high_precision_layers must be two counts >= 0, got {layers!r}"]
        )


def _layers_text(precision: Fp8Precision | Fp4Precision) -> str:
    start, end = precision.high_precision_layers
    return f", base-precision layers {start}+{end}" if start or end else ""


def high_precision_layers(precision: TrainingPrecision) -> tuple[int, int]:
    """(first, last) decoder layers that keep the base precision under a low-precision recipe."""
    match precision:
        case HighPrecision():
            return (0, 0)
        case (
            Fp8Precision(high_precision_layers=layers) | Fp4Precision(high_precision_layers=layers)
        ):
            return layers
        case _ as unreachable:
            assert_never(unreachable)


TrainingPrecision: TypeAlias = HighPrecision | Fp8Precision | Fp4Precision


def gemm_format(precision: TrainingPrecision) -> GemmFormat | None:
    """The tensor-core format of the recipe's low-precision GEMMs (None: none run below the
    model's datatype)."""
    match precision:
        case HighPrecision():
            return None
        case Fp8Precision(recipe=recipe):
            match recipe:
                case Fp8Recipe.DELAYED | Fp8Recipe.TENSORWISE:
                    return GemmFormat.FP8
                case Fp8Recipe.BLOCKWISE:
                    return GemmFormat.FP8_BLOCKWISE
                case Fp8Recipe.MXFP8:
                    return GemmFormat.MXFP8
                case _ as unreachable_recipe:
                    assert_never(unreachable_recipe)
        case Fp4Precision():
            return GemmFormat.NVFP4
        case _ as unreachable:
            assert_never(unreachable)


def userbuffers_carry(precision: TrainingPrecision) -> bool:
    """Whether Transformer Engine's userbuffers (``--tp-comm-overlap``) can gather the recipe's
    tensors: the base precision, per-tensor FP8 and MXFP8 only; a blockwise-FP8 or NVFP4
    tensor raises "Unsupported quantizer for Userbuffers"
    (TransformerEngine@d0067d0d ``transformer_engine/pytorch/module/base.py``
    ``fill_userbuffers_buffer_for_all_gather`` l.754)."""
    return gemm_format(precision) in (None, GemmFormat.FP8, GemmFormat.MXFP8)


def projection_saves_original_input(precision: TrainingPrecision) -> bool:
    """Whether the attention output projection keeps its high-precision input for the weight
    gradient instead of a quantized copy: Megatron-Core sets Transformer Engine's
    ``save_original_input`` on ``linear_proj`` under every FP8 recipe but delayed scaling and
    under FP4, because the fused attention kernel already saves that tensor, the core's output,
    for its own backward (Megatron-LM ``megatron/core/transformer/attention.py`` l.428-444
    @d98e8a64; FP8 since Megatron-Core v0.14.0, with Transformer Engine >= 2.6; FP4 since
    v0.16.0, with TE >= 2.7: Blueprinting assumes TE versions that have it). Transformer Engine then
    casts the input rowwise in the forward and columnwise again in the backward, for the Wgrad
    GEMM (``pytorch/module/linear.py`` @d0067d0d l.393-398 and l.1175-1180); delayed scaling's
    quantizer cannot be rebuilt from the input and refuses it (l.318-326)."""
    match precision:
        case HighPrecision():
            return False
        case Fp8Precision(recipe=recipe):
            return recipe is not Fp8Recipe.DELAYED
        case Fp4Precision():
            return True
        case _ as unreachable:
            assert_never(unreachable)


def recipe_name(precision: TrainingPrecision) -> str:
    """The Megatron spelling of the recipe a law names (``fp8_recipe = mxfp8``)."""
    match precision:
        case HighPrecision():
            return "no low-precision recipe"
        case Fp8Precision(recipe=recipe):
            return f"fp8_recipe = {recipe}"
        case Fp4Precision(recipe=recipe):
            return f"fp4_recipe = {recipe}"
        case _ as unreachable:
            assert_never(unreachable)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AcceleratorSupport:
    """What the precision laws need to know of an accelerator: its name and the low-precision
    GEMM formats it runs (built by ``AcceleratorSpec.support``)."""

    name: str
    formats: frozenset[GemmFormat]


class PrecisionChoice(StrEnum):
    """Named recipes for ``blueprinting search --precision`` (one CLI value each): the model's
    datatype (``bf16``, ``fp16``) or a low-precision recipe on top of it."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8_DELAYED = "fp8-delayed"
    FP8_TENSORWISE = "fp8-tensorwise"
    FP8_BLOCKWISE = "fp8-blockwise"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"

    @property
    def precision(self) -> TrainingPrecision:
        match self:
            case PrecisionChoice.BF16 | PrecisionChoice.FP16:
                return HighPrecision()
            case PrecisionChoice.FP8_DELAYED:
                return Fp8Precision(recipe=Fp8Recipe.DELAYED)
            case PrecisionChoice.FP8_TENSORWISE:
                return Fp8Precision(recipe=Fp8Recipe.TENSORWISE)
            case PrecisionChoice.FP8_BLOCKWISE:
                return Fp8Precision(recipe=Fp8Recipe.BLOCKWISE)
            case PrecisionChoice.MXFP8:
                return Fp8Precision(recipe=Fp8Recipe.MXFP8)
            case PrecisionChoice.NVFP4:
                return Fp4Precision()
            case _ as unreachable:
                assert_never(unreachable)


def precision_choice(precision: TrainingPrecision, *, fp16: bool = False) -> PrecisionChoice:
    """The named recipe of a precision (the inverse of ``PrecisionChoice.precision`` on the
    default format, without param gather or base-precision layers): ``fp16`` names an fp16
    base for :class:`HighPrecision`."""
    match precision:
        case HighPrecision():
            return PrecisionChoice.FP16 if fp16 else PrecisionChoice.BF16
        case Fp8Precision(recipe=recipe):
            match recipe:
                case Fp8Recipe.DELAYED:
                    return PrecisionChoice.FP8_DELAYED
                case Fp8Recipe.TENSORWISE:
                    return PrecisionChoice.FP8_TENSORWISE
                case Fp8Recipe.BLOCKWISE:
                    return PrecisionChoice.FP8_BLOCKWISE
                case Fp8Recipe.MXFP8:
                    return PrecisionChoice.MXFP8
                case _ as unreachable_recipe:
                    assert_never(unreachable_recipe)
        case Fp4Precision():
            return PrecisionChoice.NVFP4
        case _ as unreachable:
            assert_never(unreachable)
