"""Efficiency models: Calculon's step lookup, the saturating GEMM curve, validation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.errors import ConfigError
from blueprinting.hardware.efficiency import (
    ConstantEfficiency,
    EfficiencyStep,
    GemmShape,
    SaturatingGemmEfficiency,
    SteppedEfficiency,
    efficiency_fraction,
)

# Calculon's A100 matrix curve (systems/a100_80g.json): [[128, .99], [16, .9], [1, .6], [0, .1]]
# GFLOP, scaled to FLOPs.
A100_MATRIX_STEPS = SteppedEfficiency(
    steps=(
        EfficiencyStep(threshold=128e9, fraction=0.99),
        EfficiencyStep(threshold=16e9, fraction=0.9),
        EfficiencyStep(threshold=1e9, fraction=0.6),
        EfficiencyStep(threshold=0, fraction=0.1),
    )
)


def test_constant_ignores_size() -> None:
    model = ConstantEfficiency(fraction=0.7)
    assert efficiency_fraction(model, 0) == 0.7
    assert efficiency_fraction(model, 1e18, GemmShape(m=1, n=1, k=1)) == 0.7


@pytest.mark.parametrize(
    ("size", "fraction"),
    [
        (0, 0.1),
        (1e9 - 1, 0.1),
        (1e9, 0.6),
        (16e9, 0.9),
        (127.9e9, 0.9),
        (128e9, 0.99),
        (1e15, 0.99),
    ],
)
def test_steps_take_first_threshold_not_above_size(size: float, fraction: float) -> None:
    # Calculon Processor.efficiency: first pair with op_flops >= threshold.
    assert efficiency_fraction(A100_MATRIX_STEPS, size) == fraction


def test_saturating_gemm_uses_smallest_dimension() -> None:
    model = SaturatingGemmEfficiency(peak_fraction=0.8, half_saturation_dim=128)
    assert efficiency_fraction(model, 0, GemmShape(m=8192, n=128, k=4096)) == pytest.approx(0.4)
    assert efficiency_fraction(model, 0, GemmShape(m=384, n=4096, k=4096)) == pytest.approx(0.6)


def test_saturating_gemm_without_shape_uses_equivalent_cube() -> None:
    model = SaturatingGemmEfficiency(peak_fraction=0.8, half_saturation_dim=128)
    # 2 * 384^3 FLOPs is a 384-cube: 0.8 * 384 / 512.
    assert efficiency_fraction(model, 2 * 384**3) == pytest.approx(0.6)


@settings(max_examples=200)
@given(
    small=st.integers(min_value=1, max_value=1 << 16),
    extra=st.integers(min_value=0, max_value=1 << 16),
    peak=st.floats(min_value=0.01, max_value=1.0),
    half=st.floats(min_value=0.0, max_value=4096.0),
)
def test_saturating_gemm_is_monotone_and_bounded(
    small: int, extra: int, peak: float, half: float
) -> None:
    model = SaturatingGemmEfficiency(peak_fraction=peak, half_saturation_dim=half)
    low = efficiency_fraction(model, 0, GemmShape(m=small, n=1 << 16, k=1 << 16))
    high = efficiency_fraction(model, 0, GemmShape(m=small + extra, n=1 << 16, k=1 << 16))
    assert 0 < low <= high <= peak


def test_gemm_shape_flops() -> None:
    shape = GemmShape(m=2048, n=3 * 12288 // 8, k=12288, batch=1)
    assert shape.flops == 2 * 2048 * 4608 * 12288
    assert str(GemmShape(m=2, n=3, k=4, batch=5)) == "5x2x3x4"


def test_steps_must_decrease_and_end_at_zero() -> None:
    with pytest.raises(ConfigError) as raised:
        SteppedEfficiency(
            steps=(
                EfficiencyStep(threshold=1, fraction=0.5),
                EfficiencyStep(threshold=2, fraction=0.6),
            )
        )
    assert raised.value.problems == (
        "SteppedEfficiency thresholds must decrease strictly, got [1, 2]",
        "SteppedEfficiency's last threshold must be 0 so every size is covered, got 2",
    )


@pytest.mark.parametrize("fraction", [0.0, 1.5, -0.1])
def test_fraction_must_be_in_unit_interval(fraction: float) -> None:
    with pytest.raises(ConfigError) as raised:
        ConstantEfficiency(fraction=fraction)
    assert raised.value.problems == (
        f"ConstantEfficiency.fraction must be a fraction in (0, 1], got {fraction!r}",
    )
