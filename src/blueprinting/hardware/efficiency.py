"""Efficiency models: what fraction of a peak rate an operation of a given size reaches.

One sum type, :data:`Efficiency`, serves every rate in a :class:`~blueprinting.hardware.system.
SystemSpec` (matrix and vector engines per datatype, HBM, each network link). Its variants:

* :class:`ConstantEfficiency` -- a fixed fraction, whatever the size.
* :class:`SteppedEfficiency` -- Calculon's step function (Isaev et al., SC'23, "Calculon",
  Section 3; ``calculon/processor.py`` ``Processor.efficiency`` and ``calculon/memory.py``
  ``Memory.efficiency``): a list of (threshold, fraction) pairs with strictly decreasing
  thresholds; an op of size ``x`` gets the fraction of the first pair whose threshold is
  ``<= x``. Thresholds are in SI units of the op's size (FLOPs for engines, bytes for memory and
  links); Calculon writes them in GFLOP and MB, the adapter multiplies by 1e9 and 1e6.
* :class:`SaturatingGemmEfficiency` -- a smooth, shape-aware GEMM model:
  ``fraction = peak_fraction * d / (d + half_saturation_dim)`` with ``d`` the GEMM's smallest
  dimension ``min(M, N, K)``. Small dimensions under-fill the tensor-core tiles and the SMs
  (wave quantization, NVIDIA "Matrix Multiplication Background User's Guide", sections "Math And
  Memory Bounds" and "Dimension Quantization Effects"); the hyperbola is a modelling choice with
  two named, calibratable parameters. Without a shape (a vector op, or a GEMM known only by its
  FLOP count) ``d`` is the side of the cube with the same FLOPs, ``(flops / 2) ** (1/3)``.
* :class:`GemmShapeEfficiency` -- the saturating hyperbola times a per-call term:
  ``fraction = peak_fraction / (1 + half_saturation_dim / d) / (1 + half_saturation_flops / F)``
  with ``F`` the GEMM's FLOPs. The second factor is a fixed time per call (launch, prologue and
  the last partial wave) written in FLOPs: ``half_saturation_flops = t0 * peak_fraction * peak``.
  The hyperbola in ``d`` alone cannot reproduce square sweeps (1024^3 runs at 0.14-0.38 of peak
  on A100 / H100 / GB200 cuBLASLt while a 802816x192x768 GEMM, smallest side 192, reaches 0.5):
  fitted on the shape-resolved points of ``shared/reference/microbenchmarks.json`` it has an RMS
  error of 30-90%, this model 5-10% (:mod:`blueprinting.hardware.fit`).

The memory-bound ceiling (roofline, Williams et al. 2009) is not part of these fractions: the
processor model takes ``max(compute time, memory time)`` (or their sum) in
:meth:`~blueprinting.hardware.system.SystemSpec.processing_time`.

Public API: ``Efficiency``, ``ConstantEfficiency``, ``SteppedEfficiency``, ``EfficiencyStep``,
``SaturatingGemmEfficiency``, ``GemmShapeEfficiency``, ``GemmShape``,
``efficiency_fraction(model, size, shape=None)``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias, TypeVar, assert_never, cast, final

from blueprinting.errors import ConfigError, positive_int_problems
from blueprinting.hardware.polymorphic import (
    Column,
    Count,
    IntColumn,
    Real,
    any_below,
    exact_column,
    maximum,
    minimum,
    ones_like,
    positive_or_one,
    power,
    step_index,
    take,
    where_positive,
)


# Validators take ``object``: a config file can put any value in a float field.
def is_fraction(value: object) -> bool:
    """``value`` is a number in (0, 1]."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1


def is_nonnegative(value: object) -> bool:
    """A finite number >= 0 (an infinite rate, size or latency is no hardware figure: fuzz seed
    1272 case 7138's ``capacity_bytes = inf`` reached ``int()`` as an OverflowError)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def is_positive(value: object) -> bool:
    """A finite number > 0 (:func:`is_nonnegative`'s reason)."""
    return is_nonnegative(value) and cast(float, value) > 0


def _check_fraction(owner: str, name: str, value: object) -> None:
    if not is_fraction(value):
        raise ConfigError([f"{owner}.{name} must be a fraction in (0, 1], got {value!r}"])


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class GemmShape:
    """A (batched) GEMM ``C[b, m, n] = A[b, m, k] @ B[b, k, n]``: 2*m*n*k*batch FLOPs."""

    m: int
    n: int
    k: int
    batch: int = 1

    def __post_init__(self) -> None:
        bad = positive_int_problems("GemmShape", m=self.m, n=self.n, k=self.k, batch=self.batch)
        if bad:
            raise ConfigError(bad)

    @property
    def flops(self) -> int:
        return gemm_flops(self.m, self.n, self.k, self.batch)

    @property
    def smallest_dim(self) -> int:
        return smallest_gemm_dim(self.m, self.n, self.k)

    def __str__(self) -> str:
        batch = "" if self.batch == 1 else f"{self.batch}x"
        return f"{batch}{self.m}x{self.n}x{self.k}"


def gemm_flops(m: Count, n: Count, k: Count, batch: Count) -> Count:
    """A (batched) GEMM's FLOPs, of one shape or of int64 columns of shapes."""
    return 2 * m * n * k * batch


def smallest_gemm_dim(m: Count, n: Count, k: Count) -> Count:
    """The smallest of a GEMM's three dimensions (of one shape or of columns)."""
    return minimum(minimum(m, n), k)


_Real_co = TypeVar("_Real_co", float, Column, covariant=True)


class ShapeFigures(Protocol[_Real_co]):
    """What the efficiency models read of a GEMM shape: a :class:`GemmShape` (one op) or a
    :class:`GemmShapeColumns` (a column of ops)."""

    @property
    def smallest_dim(self) -> _Real_co: ...

    @property
    def flops(self) -> _Real_co: ...


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class GemmShapeColumns:
    """A column of :class:`GemmShape` as the two figures the efficiency models read, element
    by element the shape's own (exact in float64: :meth:`of`)."""

    smallest_dim: Column
    flops: Column

    @staticmethod
    def of(shapes: Sequence[GemmShape]) -> GemmShapeColumns | None:
        """The shapes' figures, or None when one is not exact in float64."""
        smallest = exact_column([shape.smallest_dim for shape in shapes])
        flops = exact_column([shape.flops for shape in shapes])
        if smallest is None or flops is None:
            return None
        return GemmShapeColumns(smallest_dim=smallest, flops=flops)

    @staticmethod
    def of_dims(
        m: IntColumn | int, n: IntColumn | int, k: IntColumn | int, batch: IntColumn | int
    ) -> GemmShapeColumns:
        """The figures of the shapes ``(m[i], n[i], k[i], batch[i])`` (ints broadcast), by
        :class:`GemmShape`'s own formulas; the caller keeps every figure at most 2**53 (exact in
        int64 and in float64)."""
        import numpy as np

        dims = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (m, n, k, batch)))
        m_, n_, k_, b_ = (np.asarray(x, dtype=np.int64) for x in dims)
        return GemmShapeColumns(
            smallest_dim=smallest_gemm_dim(m_, n_, k_).astype(np.float64),
            flops=gemm_flops(m_, n_, k_, b_).astype(np.float64),
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ConstantEfficiency:
    """The same achieved fraction of peak for every op size."""

    fraction: float

    def __post_init__(self) -> None:
        _check_fraction("ConstantEfficiency", "fraction", self.fraction)

    def __str__(self) -> str:
        return f"{self.fraction:g}"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class EfficiencyStep:
    """Ops of size ``>= threshold`` (FLOPs or bytes) reach ``fraction`` of peak."""

    threshold: float
    fraction: float

    def __post_init__(self) -> None:
        _check_fraction("EfficiencyStep", "fraction", self.fraction)
        if not (is_nonnegative(self.threshold)):
            raise ConfigError([f"EfficiencyStep.threshold must be >= 0, got {self.threshold!r}"])


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SteppedEfficiency:
    """Calculon's step function: strictly decreasing thresholds, the last one 0 (so every size
    is covered; Calculon asserts on an uncovered size)."""

    steps: tuple[EfficiencyStep, ...]

    def __post_init__(self) -> None:
        thresholds = [step.threshold for step in self.steps]
        if not thresholds:
            raise ConfigError(["SteppedEfficiency.steps must not be empty"])
        problems = []
        if any(a <= b for a, b in itertools.pairwise(thresholds)):
            problems.append(
                f"SteppedEfficiency thresholds must decrease strictly, got {thresholds}"
            )
        if thresholds[-1] != 0:
            problems.append(
                f"SteppedEfficiency's last threshold must be 0 so every size is covered, "
                f"got {thresholds[-1]!r}"
            )
        if problems:
            raise ConfigError(problems)

    def __str__(self) -> str:
        return "steps(" + ", ".join(f">={s.threshold:g}:{s.fraction:g}" for s in self.steps) + ")"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SaturatingGemmEfficiency:
    """``peak_fraction * d / (d + half_saturation_dim)``, ``d = min(M, N, K)``.

    ``peak_fraction`` is what the largest GEMMs reach (cuBLAS on a large square bf16 GEMM);
    ``half_saturation_dim`` is the smallest dimension at which half of that is reached.
    """

    peak_fraction: float
    half_saturation_dim: float

    def __post_init__(self) -> None:
        _check_fraction("SaturatingGemmEfficiency", "peak_fraction", self.peak_fraction)
        if not (is_nonnegative(self.half_saturation_dim)):
            raise ConfigError(
                [
                    "SaturatingGemmEfficiency.half_saturation_dim must be >= 0, "
                    f"got {self.half_saturation_dim!r}"
                ]
            )

    def __str__(self) -> str:
        return f"sat({self.peak_fraction:g}, d1/2={self.half_saturation_dim:g})"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class GemmShapeEfficiency:
    """``peak_fraction / (1 + half_saturation_dim / d) / (1 + half_saturation_flops / F)``.

    ``d = min(M, N, K)``, ``F`` = the GEMM's FLOPs. ``half_saturation_flops`` is the size at
    which a fixed per-call time costs half the rate (module docstring).
    """

    peak_fraction: float
    half_saturation_dim: float
    half_saturation_flops: float

    def __post_init__(self) -> None:
        _check_fraction("GemmShapeEfficiency", "peak_fraction", self.peak_fraction)
        problems = [
            f"GemmShapeEfficiency.{name} must be >= 0, got {value!r}"
            for name, value in (
                ("half_saturation_dim", self.half_saturation_dim),
                ("half_saturation_flops", self.half_saturation_flops),
            )
            if not is_nonnegative(value)
        ]
        if problems:
            raise ConfigError(problems)

    def __str__(self) -> str:
        return (
            f"gemm({self.peak_fraction:g}, d1/2={self.half_saturation_dim:g}, "
            f"F1/2={self.half_saturation_flops:.3g})"
        )


Efficiency: TypeAlias = (
    ConstantEfficiency | SteppedEfficiency | SaturatingGemmEfficiency | GemmShapeEfficiency
)


def _equivalent_dim(size: Real, shape: ShapeFigures[Real] | None) -> Real:
    """``min(M, N, K)``, or without a shape the side of the cube of ``size`` FLOPs."""
    return shape.smallest_dim if shape is not None else power(maximum(size, 0.0) / 2, 1 / 3)


def _saturation(dim: Real, half: float) -> Real:
    """``1 / (1 + half / dim)``: 1 when ``half`` is 0, 0 at ``dim`` 0."""
    if half == 0:
        return ones_like(dim)
    # Written as a quotient by (1 + h/d) >= 1 so rounding never exceeds 1.
    return where_positive(dim, 1.0 / (1.0 + half / positive_or_one(dim)), 0.0)


def efficiency_fraction(
    model: Efficiency, size: Real, shape: ShapeFigures[Real] | None = None
) -> Real | float:
    """The achieved fraction of peak for an op of ``size`` (FLOPs or bytes) and optional shape;
    ``size`` and ``shape`` are one op's or a column's (:mod:`blueprinting.hardware.polymorphic`;
    a constant fraction stays a float)."""
    match model:
        case ConstantEfficiency(fraction=fraction):
            return fraction
        case SteppedEfficiency(steps=steps):
            # Negative sizes are the only way past a last threshold of 0.
            if any_below(size, 0):
                raise ConfigError([f"op size must be >= 0, got {size!r}"])
            # The first step (thresholds decreasing) whose threshold is <= size: the last of
            # the thresholds read in increasing order that is <= size.
            increasing = steps[::-1]
            at_or_below = step_index([step.threshold for step in increasing], size)
            return take([step.fraction for step in increasing], at_or_below - 1)
        case SaturatingGemmEfficiency(
            peak_fraction=peak_fraction, half_saturation_dim=half_saturation_dim
        ):
            return peak_fraction * _saturation(_equivalent_dim(size, shape), half_saturation_dim)
        case GemmShapeEfficiency(
            peak_fraction=peak_fraction,
            half_saturation_dim=half_saturation_dim,
            half_saturation_flops=half_saturation_flops,
        ):
            flops = shape.flops if shape is not None else maximum(size, 0.0)
            return (
                peak_fraction
                * _saturation(_equivalent_dim(size, shape), half_saturation_dim)
                * _saturation(flops, half_saturation_flops)
            )
        case _ as unreachable:
            assert_never(unreachable)
