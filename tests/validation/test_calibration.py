"""Calibration of the GEMM fraction on a named subset of measured runs (issue #5)."""

from __future__ import annotations

import pytest

from blueprinting.cli.main import main
from blueprinting.errors import ConfigError
from blueprinting.hardware.efficiency import ConstantEfficiency, SaturatingGemmEfficiency
from blueprinting.hardware.presets import A100_GEMM_PEAK_FRACTION, system_preset
from blueprinting.mapping.model import Datatype
from blueprinting.validation.calibration import (
    fit_gemm_peak_fraction,
    override_toml,
    with_gemm_peak_fraction,
)
from blueprinting.validation.published import SourceTable, load_published_runs


def test_with_gemm_peak_fraction_changes_only_the_matrix_fraction() -> None:
    base = system_preset("dgx-a100-80gb")
    changed = with_gemm_peak_fraction(base, 0.5)
    rate = changed.accelerator.matrix.rate(Datatype.BF16)
    assert rate.efficiency == SaturatingGemmEfficiency(peak_fraction=0.5, half_saturation_dim=128)
    assert rate.peak_flop_per_s == 312e12
    assert changed.accelerator.vector == base.accelerator.vector
    assert changed.node == base.node and changed.scale_out == base.scale_out


def test_a_system_without_a_saturating_gemm_model_is_refused() -> None:
    base = system_preset("dgx-a100-80gb")
    matrix = base.accelerator.matrix
    from dataclasses import replace

    flat = replace(
        base,
        accelerator=replace(
            base.accelerator,
            matrix=replace(
                matrix,
                rates=tuple(
                    replace(r, efficiency=ConstantEfficiency(fraction=0.8)) for r in matrix.rates
                ),
            ),
        ),
    )
    with pytest.raises(ConfigError, match="no saturating GEMM efficiency"):
        with_gemm_peak_fraction(flat, 0.5)


def test_the_preset_fraction_is_the_fit_on_korthikanti_table4() -> None:
    result = fit_gemm_peak_fraction(system_preset("dgx-a100-80gb"), load_published_runs())
    # with the A100 NVLink fit (47 us, 0.69): MAE 2.9%, max 3.7% on Table 4
    assert result.peak_fraction == A100_GEMM_PEAK_FRACTION == 0.75
    assert result.fit_tables == frozenset({SourceTable.KORTHIKANTI2022_TABLE4})
    assert result.fit.count == 10
    assert result.fit.max_error < 0.04
    assert SourceTable.KORTHIKANTI2022_TABLE4 not in result.held_out
    held = result.held_out[SourceTable.NARAYANAN2021_TABLE1]
    assert held.count == 10 and held.mae < 0.05
    assert "peak_fraction = 0.75, half_saturation_dim = 128}" in override_toml(
        result, "dgx-a100-80gb"
    )


def test_calibrate_command_prints_fit_held_out_and_override(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["calibrate"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "system dgx-a100-80gb: GEMM peak_fraction = 0.75"
    assert "held out narayanan2021_table1: 10 figures" in out
    assert '[system]\npreset = "dgx-a100-80gb"' in out
