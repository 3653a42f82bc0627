"""Efficiency models fitted on microbenchmarks: one fitter per model.

The presets' GEMM, link and HBM figures (:mod:`blueprinting.hardware.presets`, derived from
``shared/reference/microbenchmarks.json`` by :mod:`blueprinting.hardware.microbenchmarks`) and
``blueprinting calibrate --gemm / --nccl / --stream`` (a user's own measurements) call these same
functions, and every prediction they score goes through the cost formula the planner uses
(:func:`~blueprinting.hardware.efficiency.efficiency_fraction`,
:func:`~blueprinting.hardware.collectives.collective_link_time`), so each formula exists once.

* GEMM -- :func:`fit_gemm`: a :class:`~blueprinting.hardware.efficiency.GemmShapeEfficiency`
  ``p / (1 + h / min(M, N, K)) / (1 + F0 / F)`` on shape-resolved (M, N, K, FLOP/s) points of one
  GPU and datatype. Least squares of ``log(predicted / measured)`` (a relative error, symmetric in
  over- and under-prediction): ``h`` and ``F0`` on a geometric grid (0 and 1..16384 elements;
  0 and 1e6..1e13 FLOPs, 6% steps), ``log p`` in closed form for each (the mean residual), ``p``
  capped at 1. Error: RMS and max of ``predicted time / measured time - 1`` on the fitted points
  and, held out, leave-one-out (each point predicted by the fit on all the others).
* Collectives -- :func:`fit_link`: nccl-tests rows of one op, scope and group size give the time
  ``t = S * w(n) / busbw`` (``S`` the printed size, ``w`` the ring wire factor of
  :func:`~blueprinting.hardware.collectives.ring_collective_costs`; nccl-tests defines busbw
  with the same factors, ``nccl-tests/doc/PERFORMANCE.md``). The link model's
  ``t = latency + S * w / (bandwidth * efficiency)`` is linear in ``(latency, 1 / (bandwidth *
  efficiency))``: weighted least squares of the relative time error (numpy ``lstsq``), latency
  clamped at 0. :func:`link_efficiency` divides the fitted rate by the link's datasheet rate.
* HBM -- :func:`fit_hbm`: the BabelStream Triad rate over the datasheet bandwidth. Triad
  (``a = b + s * c``: two reads, one write) is the read/write mix of the memory-bound training
  ops (optimizer steps, residual adds, norms); Copy (one read, one write) runs 2-5% lower on the
  measured parts and Dot (reads only) higher (microbenchmarks.md section 5).

Public API: ``FitError``, ``GemmPoint``, ``GemmFit``, ``fit_gemm``, ``CollectivePoint``,
``LinkFit``, ``fit_link``, ``link_efficiency``, ``StreamKernel``, ``StreamRate``, ``HbmFit``,
``fit_hbm``, ``toml_inline``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import final

import numpy as np

from blueprinting.errors import ConfigError
from blueprinting.hardware.collectives import (
    CollectiveKind,
    collective_link_time,
    ring_collective_costs,
)
from blueprinting.hardware.efficiency import (
    ConstantEfficiency,
    GemmShape,
    GemmShapeEfficiency,
    efficiency_fraction,
)
from blueprinting.hardware.system import LinkSpec

#: Grid of the GEMM shape parameters (module docstring): 0, then 160 geometric steps.
_DIM_GRID = np.concatenate([[0.0], np.geomspace(1.0, 16384.0, 161)])
_FLOP_GRID = np.concatenate([[0.0], np.geomspace(1e6, 1e13, 281)])
#: Three parameters and one point left out.
MIN_GEMM_POINTS = 4
MIN_LINK_POINTS = 2


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FitError:
    """RMS and largest |relative error| of ``count`` predictions."""

    count: int
    rms: float
    max: float

    @classmethod
    def of(cls, relative_errors: Sequence[float]) -> FitError:
        errors = np.asarray(relative_errors, dtype=float)
        if errors.size == 0:
            return cls(count=0, rms=0.0, max=0.0)
        return cls(
            count=int(errors.size),
            rms=float(np.sqrt(np.mean(errors**2))),
            max=float(np.max(np.abs(errors))),
        )

    def __str__(self) -> str:
        return f"{self.count} points, RMS {100 * self.rms:.1f}%, max {100 * self.max:.1f}%"


# --------------------------------------------------------------------------------------------
# GEMM
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class GemmPoint:
    """One measured GEMM: its shape and achieved FLOP/s."""

    shape: GemmShape
    flop_per_s: float

    def __post_init__(self) -> None:
        if not (self.flop_per_s > 0 and math.isfinite(self.flop_per_s)):
            raise ConfigError([f"GemmPoint.flop_per_s must be > 0, got {self.flop_per_s!r}"])


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class GemmFit:
    """A fitted GEMM model, its error on the fitted points and leave-one-out."""

    model: GemmShapeEfficiency
    fitted: FitError
    held_out: FitError
    #: Per fitted point, ``predicted time / measured time - 1``.
    errors: tuple[float, ...]


def _factor_table(shapes: Sequence[GemmShape], grid: np.ndarray, *, flops: bool) -> np.ndarray:
    """``[grid value, point]``: the model's one factor at that value (``efficiency_fraction``
    with the other factor off and ``peak_fraction = 1``)."""
    table = np.empty((grid.size, len(shapes)))
    for i, value in enumerate(grid):
        model = GemmShapeEfficiency(
            peak_fraction=1.0,
            half_saturation_dim=0.0 if flops else float(value),
            half_saturation_flops=float(value) if flops else 0.0,
        )
        table[i] = [efficiency_fraction(model, shape.flops, shape) for shape in shapes]
    return table


def _best_gemm_model(
    shapes: Sequence[GemmShape], log_fractions: np.ndarray, dim: np.ndarray, flop: np.ndarray
) -> GemmShapeEfficiency:
    # log f = log p + log a(h) + log b(F0): the model's product structure (efficiency.py).
    with np.errstate(divide="ignore"):
        log_dim = np.log(dim)[:, None, :]
        log_flop = np.log(flop)[None, :, :]
    residual = log_fractions[None, None, :] - log_dim - log_flop
    log_peak = np.minimum(residual.mean(axis=2), 0.0)
    cost = ((residual - log_peak[:, :, None]) ** 2).sum(axis=2)
    i, j = np.unravel_index(int(np.argmin(cost)), cost.shape)
    return GemmShapeEfficiency(
        peak_fraction=float(np.exp(log_peak[i, j])),
        half_saturation_dim=float(_DIM_GRID[i]),
        half_saturation_flops=float(_FLOP_GRID[j]),
    )


def _time_errors(
    model: GemmShapeEfficiency, points: Sequence[GemmPoint], peak_flop_per_s: float
) -> list[float]:
    """``predicted time / measured time - 1`` = measured rate / predicted rate - 1."""
    return [
        point.flop_per_s
        / (peak_flop_per_s * efficiency_fraction(model, point.shape.flops, point.shape))
        - 1.0
        for point in points
    ]


def _gemm_fit(
    model_of: Callable[[list[int]], GemmShapeEfficiency],
    points: Sequence[GemmPoint],
    peak_flop_per_s: float,
) -> GemmFit:
    """The fit on every point (``model_of`` the indices it fits on) with its fitted errors and
    the leave-one-out errors, each point predicted by the fit on the others: the one scoring
    :func:`fit_gemm` and :func:`fit_gemm_peak` share."""
    every = list(range(len(points)))
    model = model_of(every)
    held_out: list[float] = []
    for k in every:
        without = model_of([i for i in every if i != k])
        held_out.extend(_time_errors(without, [points[k]], peak_flop_per_s))
    errors = _time_errors(model, points, peak_flop_per_s)
    return GemmFit(
        model=model,
        fitted=FitError.of(errors),
        held_out=FitError.of(held_out),
        errors=tuple(errors),
    )


def fit_gemm(points: Sequence[GemmPoint], peak_flop_per_s: float) -> GemmFit:
    """The :class:`GemmShapeEfficiency` of ``points`` (one GPU and datatype) against
    ``peak_flop_per_s`` (the dense datasheet peak), with its fitted and leave-one-out errors."""
    if len(points) < MIN_GEMM_POINTS:
        raise ConfigError(
            [
                f"fitting a GEMM efficiency needs at least {MIN_GEMM_POINTS} shapes "
                f"(3 parameters and one held out), got {len(points)}"
            ]
        )
    if not (peak_flop_per_s > 0):
        raise ConfigError([f"GEMM peak must be > 0 FLOP/s, got {peak_flop_per_s!r}"])
    shapes = [point.shape for point in points]
    log_fractions = np.log([point.flop_per_s / peak_flop_per_s for point in points])
    dim = _factor_table(shapes, _DIM_GRID, flops=False)
    flop = _factor_table(shapes, _FLOP_GRID, flops=True)
    return _gemm_fit(
        lambda keep: _best_gemm_model(
            [shapes[i] for i in keep], log_fractions[keep], dim[:, keep], flop[:, keep]
        ),
        points,
        peak_flop_per_s,
    )


def fit_gemm_peak(
    points: Sequence[GemmPoint],
    peak_flop_per_s: float,
    *,
    half_saturation_dim: float,
    half_saturation_flops: float,
) -> GemmFit:
    """The peak fraction of ``points`` under a given shape dependence (the two shape parameters
    taken from another series of the same tensor-core pipeline, where ``points`` are too few or
    too alike to fix them: square shapes only); least squares of the log time, as
    :func:`fit_gemm`, with its fitted and leave-one-out errors."""
    if len(points) < 2:
        raise ConfigError(
            [
                "fitting a GEMM peak fraction needs at least 2 shapes (one held out), "
                f"got {len(points)}"
            ]
        )
    if not (peak_flop_per_s > 0):
        raise ConfigError([f"GEMM peak must be > 0 FLOP/s, got {peak_flop_per_s!r}"])
    shape_only = GemmShapeEfficiency(
        peak_fraction=1.0,
        half_saturation_dim=half_saturation_dim,
        half_saturation_flops=half_saturation_flops,
    )
    log_peaks = np.log(
        [
            point.flop_per_s
            / (peak_flop_per_s * efficiency_fraction(shape_only, point.shape.flops, point.shape))
            for point in points
        ]
    )

    def model_of(indices: list[int]) -> GemmShapeEfficiency:
        return GemmShapeEfficiency(
            peak_fraction=float(np.exp(min(float(log_peaks[indices].mean()), 0.0))),
            half_saturation_dim=half_saturation_dim,
            half_saturation_flops=half_saturation_flops,
        )

    return _gemm_fit(model_of, points, peak_flop_per_s)


# --------------------------------------------------------------------------------------------
# Collectives
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CollectivePoint:
    """One nccl-tests row: op, ranks, size (bytes, as printed) and bus bandwidth (bytes/s)."""

    kind: CollectiveKind
    group_size: int
    size_bytes: float
    bus_bandwidth_bytes_per_s: float

    def __post_init__(self) -> None:
        problems = []
        if self.group_size < 2:
            problems.append(f"CollectivePoint.group_size must be >= 2, got {self.group_size!r}")
        if not (self.size_bytes > 0):
            problems.append(f"CollectivePoint.size_bytes must be > 0, got {self.size_bytes!r}")
        if not (self.bus_bandwidth_bytes_per_s > 0):
            problems.append(
                "CollectivePoint.bus_bandwidth_bytes_per_s must be > 0, "
                f"got {self.bus_bandwidth_bytes_per_s!r}"
            )
        if problems:
            raise ConfigError(problems)

    @property
    def wire_factor(self) -> float:
        return ring_collective_costs().of(self.kind).wire_factor(self.group_size)

    @property
    def time_s(self) -> float:
        """nccl-tests' time: busbw = S * w(n) / t."""
        return self.size_bytes * self.wire_factor / self.bus_bandwidth_bytes_per_s


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LinkFit:
    """``t = latency_s + S * w(n) / bandwidth_bytes_per_s`` fitted on the rows of one link (any
    ops and group sizes: the link model costs them all with the same two numbers)."""

    latency_s: float
    #: The achieved per-direction wire rate (busbw's large-message limit), bytes/s.
    bandwidth_bytes_per_s: float
    fitted: FitError

    def link(self) -> LinkSpec:
        """The fitted line as a link at efficiency 1 (what the errors are computed on)."""
        return LinkSpec(
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s,
            latency_s=self.latency_s,
            efficiency=ConstantEfficiency(fraction=1.0),
        )

    def errors(self, points: Sequence[CollectivePoint]) -> list[float]:
        """``predicted time / measured time - 1`` of each row, through the link model."""
        link = self.link()
        return [
            collective_link_time(p.kind, p.size_bytes, p.group_size, link) / p.time_s - 1.0
            for p in points
        ]


def fit_link(points: Sequence[CollectivePoint], *, latency_s: float | None = None) -> LinkFit:
    """Alpha-beta fit of one link's rows (module docstring); ``latency_s`` given: only the
    rate is fitted (rows that hold large messages only do not determine a latency)."""
    if len(points) < MIN_LINK_POINTS and latency_s is None:
        raise ConfigError(
            [
                f"fitting a link's latency and bandwidth needs at least {MIN_LINK_POINTS} "
                f"message sizes, got {len(points)}"
            ]
        )
    if not points:
        raise ConfigError(["fitting a link's bandwidth needs at least 1 message size, got 0"])
    time = np.array([p.time_s for p in points])
    scaled = np.array([p.size_bytes * p.wire_factor for p in points]) / time
    # Relative error (alpha + x * beta) / t - 1: each row divided by t, target 1.
    if latency_s is None:
        design = np.stack([1.0 / time, scaled], axis=1)
        (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(time), rcond=None)
        if alpha < 0:
            alpha = 0.0
            beta = float(np.sum(scaled) / np.sum(scaled**2))
    else:
        alpha = latency_s
        beta = float(np.sum(scaled * (1.0 - alpha / time)) / np.sum(scaled**2))
    if not (beta > 0):
        raise ConfigError(
            [f"the fitted link bandwidth is not positive (1/beta with beta = {beta!r})"]
        )
    line = LinkFit(
        latency_s=float(alpha),
        bandwidth_bytes_per_s=1.0 / float(beta),
        fitted=FitError.of([]),
    )
    return LinkFit(
        latency_s=line.latency_s,
        bandwidth_bytes_per_s=line.bandwidth_bytes_per_s,
        fitted=FitError.of(line.errors(points)),
    )


def link_efficiency(
    fit: LinkFit, link_bandwidth_bytes_per_s: float, *, all_to_all: bool = False
) -> ConstantEfficiency:
    """The fitted rate as a fraction of the link's per-direction datasheet rate; a rate above
    it (NVLS / SHARP in-network reduction, or a hierarchical algorithm over several links) is
    not a ring over that link and is refused. ``all_to_all``: the rows are an all-to-all's
    (read as the link's share), whose refusal says so instead of naming the ring settings."""
    fraction = fit.bandwidth_bytes_per_s / link_bandwidth_bytes_per_s
    if not (0 < fraction <= 1):
        advice = (
            "an all-to-all's rate is read as one link's share (across hosts, the NIC's: check "
            "the run's hosts and --nccl-scope)"
            if all_to_all
            else "the cost model is a ring over one link (rerun nccl-tests with "
            "NCCL_NVLS_ENABLE=0 and NCCL_ALGO=Ring)"
        )
        raise ConfigError(
            [
                f"fitted bus bandwidth {fit.bandwidth_bytes_per_s / 1e9:.1f} GB/s is "
                f"{fraction:.2f} of the link's {link_bandwidth_bytes_per_s / 1e9:.1f} GB/s; "
                f"{advice}"
            ]
        )
    return ConstantEfficiency(fraction=fraction)


# --------------------------------------------------------------------------------------------
# HBM
# --------------------------------------------------------------------------------------------
class StreamKernel(StrEnum):
    """BabelStream's kernels (``BabelStream/src/main.cpp``: Copy, Mul, Add, Triad, Dot)."""

    COPY = "copy"
    MUL = "mul"
    ADD = "add"
    TRIAD = "triad"
    DOT = "dot"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StreamRate:
    kernel: StreamKernel
    bytes_per_s: float


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class HbmFit:
    """Triad over the datasheet bandwidth; the other kernels' ratios beside it."""

    efficiency: ConstantEfficiency
    ratios: Mapping[StreamKernel, float]


def fit_hbm(rates: Sequence[StreamRate], datasheet_bytes_per_s: float) -> HbmFit:
    """The HBM efficiency from BabelStream rates (Triad, module docstring)."""
    by_kernel = {rate.kernel: rate.bytes_per_s for rate in rates}
    if StreamKernel.TRIAD not in by_kernel:
        raise ConfigError(
            [f"BabelStream results hold no Triad rate (kernels: {', '.join(by_kernel) or 'none'})"]
        )
    ratios = {kernel: value / datasheet_bytes_per_s for kernel, value in by_kernel.items()}
    triad = ratios[StreamKernel.TRIAD]
    if not (0 < triad <= 1):
        raise ConfigError(
            [
                f"BabelStream Triad {by_kernel[StreamKernel.TRIAD] / 1e9:.1f} GB/s is {triad:.2f} "
                f"of the datasheet {datasheet_bytes_per_s / 1e9:.1f} GB/s (must be in (0, 1])"
            ]
        )
    return HbmFit(efficiency=ConstantEfficiency(fraction=triad), ratios=ratios)


# --------------------------------------------------------------------------------------------
# TOML
# --------------------------------------------------------------------------------------------
def toml_inline(value: object) -> str:
    """A TOML value: numbers, strings, lists and inline tables (the stdlib reads TOML but does
    not write it; the sections written here hold nothing else)."""
    match value:
        case bool():
            return "true" if value else "false"
        case int():
            return str(value)
        case float():
            # An integral float as an integer (a system file's numbers read either way).
            return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
        case str():
            return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        case list() | tuple():
            return "[" + ", ".join(toml_inline(item) for item in value) + "]"
        case dict():
            return "{" + ", ".join(f"{k} = {toml_inline(v)}" for k, v in value.items()) + "}"
        case _:
            raise TypeError(f"no TOML form for {value!r}")
