"""The fitters of hardware/fit.py: exact recovery of known parameters, errors, refusals."""

from __future__ import annotations

import math
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.errors import ConfigError, ProblemCollector
from blueprinting.hardware.collectives import CollectiveKind, collective_link_time
from blueprinting.hardware.efficiency import (
    ConstantEfficiency,
    GemmShape,
    GemmShapeEfficiency,
    efficiency_fraction,
)
from blueprinting.hardware.fit import (
    _DIM_GRID,
    _FLOP_GRID,
    CollectivePoint,
    FitError,
    GemmPoint,
    StreamKernel,
    StreamRate,
    fit_gemm,
    fit_hbm,
    fit_link,
    link_efficiency,
    toml_inline,
)
from blueprinting.hardware.system import LinkSpec
from blueprinting.hardware.system_mapping import efficiency_from_mapping, efficiency_to_mapping

SHAPES = (
    GemmShape(m=1024, n=1024, k=1024),
    GemmShape(m=2048, n=2048, k=2048),
    GemmShape(m=8192, n=8192, k=8192),
    GemmShape(m=802816, n=192, k=768),
    GemmShape(m=64, n=7168, k=2048),
    GemmShape(m=4096, n=4096, k=7168, batch=4),
)


def test_gemm_shape_efficiency_is_the_product_of_its_two_factors() -> None:
    model = GemmShapeEfficiency(
        peak_fraction=0.8, half_saturation_dim=128, half_saturation_flops=2e9
    )
    shape = GemmShape(m=384, n=4096, k=4096)  # d = 384, F = 2 * 384 * 4096**2 = 1.288e10
    expected = 0.8 * (384 / 512) * (shape.flops / (shape.flops + 2e9))
    assert efficiency_fraction(model, 0, shape) == pytest.approx(expected, rel=1e-12)
    # Without a shape: the cube of the same FLOPs (d = 384 for 2 * 384**3 FLOPs).
    flops = 2 * 384**3
    cube = 0.8 * 0.75 * flops / (flops + 2e9)
    assert efficiency_fraction(model, flops) == pytest.approx(cube, rel=1e-12)


def test_gemm_shape_efficiency_round_trips_through_a_system_mapping() -> None:
    model = GemmShapeEfficiency(
        peak_fraction=0.81, half_saturation_dim=113, half_saturation_flops=2.2e9
    )
    mapping = efficiency_to_mapping(model)
    assert mapping == {
        "model": "gemm_shape",
        "peak_fraction": 0.81,
        "half_saturation_dim": 113,
        "half_saturation_flops": 2.2e9,
    }
    out = ProblemCollector()
    assert efficiency_from_mapping(mapping, "e", out) == model
    assert out.problems == []


def test_gemm_shape_efficiency_refuses_negative_parameters() -> None:
    with pytest.raises(ConfigError) as raised:
        GemmShapeEfficiency(peak_fraction=0.5, half_saturation_dim=-1, half_saturation_flops=-2)
    assert raised.value.problems == (
        "GemmShapeEfficiency.half_saturation_dim must be >= 0, got -1",
        "GemmShapeEfficiency.half_saturation_flops must be >= 0, got -2",
    )


def test_fit_gemm_recovers_parameters_on_the_grid() -> None:
    truth = GemmShapeEfficiency(
        peak_fraction=0.75,
        half_saturation_dim=float(_DIM_GRID[100]),
        half_saturation_flops=float(_FLOP_GRID[150]),
    )
    peak = 989e12
    points = [
        GemmPoint(shape=s, flop_per_s=peak * efficiency_fraction(truth, s.flops, s)) for s in SHAPES
    ]
    fit = fit_gemm(points, peak)
    assert fit.model.half_saturation_dim == truth.half_saturation_dim
    assert fit.model.half_saturation_flops == truth.half_saturation_flops
    assert fit.model.peak_fraction == pytest.approx(0.75, rel=1e-12)
    assert fit.fitted.rms == pytest.approx(0.0, abs=1e-12)
    assert fit.held_out.max == pytest.approx(0.0, abs=1e-12)
    assert fit.fitted.count == fit.held_out.count == len(SHAPES)


def test_fit_gemm_errors_are_time_ratios() -> None:
    # A point measured at half the rate of the others is under-predicted in time.
    peak = 312e12
    truth = GemmShapeEfficiency(peak_fraction=0.8, half_saturation_dim=0, half_saturation_flops=0)
    points = [GemmPoint(shape=s, flop_per_s=0.8 * peak) for s in SHAPES[:5]]
    points.append(GemmPoint(shape=SHAPES[5], flop_per_s=0.4 * peak))
    fit = fit_gemm(points, peak)
    for point, error in zip(points, fit.errors, strict=True):
        predicted_time = point.shape.flops / (
            peak * efficiency_fraction(fit.model, point.shape.flops, point.shape)
        )
        assert error == pytest.approx(predicted_time / (point.shape.flops / point.flop_per_s) - 1)
    assert truth.peak_fraction == 0.8


def test_fit_gemm_needs_four_shapes() -> None:
    points = [GemmPoint(shape=s, flop_per_s=1e14) for s in SHAPES[:3]]
    with pytest.raises(ConfigError) as raised:
        fit_gemm(points, 312e12)
    assert raised.value.problems == (
        "fitting a GEMM efficiency needs at least 4 shapes (3 parameters and one held out), got 3",
    )


def test_fit_gemm_caps_the_peak_fraction_at_one() -> None:
    # Measurements above the stated peak (a wrong peak) fit at most 1.
    points = [GemmPoint(shape=s, flop_per_s=2e15) for s in SHAPES]
    assert fit_gemm(points, 1e15).model.peak_fraction == 1.0


def _alpha_beta_points(
    latency: float, rate: float, sizes: list[float], n: int
) -> list[CollectivePoint]:
    link = LinkSpec(
        bandwidth_bytes_per_s=rate, latency_s=latency, efficiency=ConstantEfficiency(fraction=1.0)
    )
    points = []
    for size in sizes:
        time = collective_link_time(CollectiveKind.ALL_REDUCE, size, n, link)
        busbw = size * 2 * (n - 1) / n / time
        points.append(
            CollectivePoint(
                kind=CollectiveKind.ALL_REDUCE,
                group_size=n,
                size_bytes=size,
                bus_bandwidth_bytes_per_s=busbw,
            )
        )
    return points


def test_fit_link_recovers_an_alpha_beta_line() -> None:
    points = _alpha_beta_points(25e-6, 230e9, [2.0**i for i in range(10, 34, 2)], 8)
    fit = fit_link(points)
    assert fit.latency_s == pytest.approx(25e-6, rel=1e-9)
    assert fit.bandwidth_bytes_per_s == pytest.approx(230e9, rel=1e-9)
    assert fit.fitted.max == pytest.approx(0.0, abs=1e-9)
    assert link_efficiency(fit, 300e9).fraction == pytest.approx(230 / 300, rel=1e-9)


@settings(max_examples=50, deadline=None)
@given(
    latency=st.floats(min_value=1e-6, max_value=1e-3),
    rate=st.floats(min_value=1e9, max_value=1e12),
    n=st.integers(min_value=2, max_value=1024),
)
def test_fit_link_recovers_any_line(latency: float, rate: float, n: int) -> None:
    points = _alpha_beta_points(latency, rate, [2.0**i for i in range(8, 36, 3)], n)
    fit = fit_link(points)
    assert fit.latency_s == pytest.approx(latency, rel=1e-6)
    assert fit.bandwidth_bytes_per_s == pytest.approx(rate, rel=1e-6)


def test_fit_link_with_a_given_latency_fits_the_rate_only() -> None:
    points = _alpha_beta_points(10e-6, 367e9, [2.0**33, 2.0**34], 8)
    fit = fit_link(points, latency_s=10e-6)
    assert fit.latency_s == 10e-6
    assert fit.bandwidth_bytes_per_s == pytest.approx(367e9, rel=1e-9)


def test_fit_link_refuses_one_size() -> None:
    with pytest.raises(ConfigError) as raised:
        fit_link(_alpha_beta_points(1e-5, 1e11, [1e6], 8))
    assert raised.value.problems == (
        "fitting a link's latency and bandwidth needs at least 2 message sizes, got 1",
    )


def test_fit_link_fits_several_ops_and_group_sizes_of_one_link() -> None:
    # One line costs every op: all-reduce over 8 and all-gather over 4 give the same latency
    # and rate back.
    link = LinkSpec(
        bandwidth_bytes_per_s=2e11, latency_s=3e-5, efficiency=ConstantEfficiency(fraction=1.0)
    )
    points = list(_alpha_beta_points(3e-5, 2e11, [2.0**i for i in range(12, 32, 4)], 8))
    for size in (2.0**14, 2.0**24, 2.0**30):
        time = collective_link_time(CollectiveKind.ALL_GATHER, size, 4, link)
        points.append(
            CollectivePoint(
                kind=CollectiveKind.ALL_GATHER,
                group_size=4,
                size_bytes=size,
                bus_bandwidth_bytes_per_s=size * 3 / 4 / time,
            )
        )
    fit = fit_link(points)
    assert fit.latency_s == pytest.approx(3e-5, rel=1e-9)
    assert fit.bandwidth_bytes_per_s == pytest.approx(2e11, rel=1e-9)
    assert fit.fitted.count == 8


def test_link_efficiency_refuses_a_rate_above_the_link() -> None:
    fit = fit_link(_alpha_beta_points(1e-5, 480e9, [1e6, 1e9], 8))
    with pytest.raises(ConfigError) as raised:
        link_efficiency(fit, 450e9)
    assert raised.value.problems[0].startswith(
        "fitted bus bandwidth 480.0 GB/s is 1.07 of the link's 450.0 GB/s"
    )


def test_fit_hbm_takes_triad() -> None:
    rates = [
        StreamRate(kernel=StreamKernel.COPY, bytes_per_s=1610e9),
        StreamRate(kernel=StreamKernel.TRIAD, bytes_per_s=1700e9),
    ]
    fit = fit_hbm(rates, 2039e9)
    assert fit.efficiency == ConstantEfficiency(fraction=1700 / 2039)
    assert fit.ratios[StreamKernel.COPY] == pytest.approx(1610 / 2039)
    with pytest.raises(ConfigError) as raised:
        fit_hbm(rates[:1], 2039e9)
    assert raised.value.problems == ("BabelStream results hold no Triad rate (kernels: copy)",)


def test_fit_error_summary() -> None:
    error = FitError.of([0.1, -0.2, 0.0, 0.1])
    assert error.count == 4
    assert error.rms == pytest.approx(math.sqrt((0.01 + 0.04 + 0.01) / 4))
    assert error.max == pytest.approx(0.2)
    assert str(error) == "4 points, RMS 12.2%, max 20.0%"


def test_toml_inline_round_trips() -> None:
    value = {"model": "gemm_shape", "peak_fraction": 0.81, "dims": [1, 2.5], "name": 'a"b'}
    assert tomllib.loads(f"x = {toml_inline(value)}")["x"] == value
