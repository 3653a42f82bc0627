"""System presets: the names the issue lists and their datasheet figures."""

from __future__ import annotations

import pytest

from blueprinting.errors import ConfigError
from blueprinting.hardware.presets import SYSTEM_PRESETS, system_preset
from blueprinting.hardware.system import Engine, LinkTier
from blueprinting.mapping.model import Datatype


def test_preset_names() -> None:
    assert list(SYSTEM_PRESETS) == [
        "dgx-a100-40gb",
        "dgx-a100-80gb",
        "dgx-h100",
        "dgx-h200",
        "dgx-b200",
        "mi300x-8",
    ]
    for name, system in SYSTEM_PRESETS.items():
        assert system.name == name
        assert system.gpus_per_node == 8


# (preset, dense bf16 peak FLOP/s, HBM bytes, HBM bytes/s, intra-node B/s per direction,
#  scale-out B/s per GPU): the datasheet figures cited in presets.py.
DATASHEET = [
    ("dgx-a100-40gb", 312e12, 40e9, 1555e9, 300e9, 25e9),
    ("dgx-a100-80gb", 312e12, 80e9, 2039e9, 300e9, 25e9),
    ("dgx-h100", 989e12, 80e9, 3350e9, 450e9, 50e9),
    ("dgx-h200", 989e12, 141e9, 4800e9, 450e9, 50e9),
    ("dgx-b200", 2250e12, 180e9, 8000e9, 900e9, 50e9),
    ("mi300x-8", 1307.4e12, 192e9, 5300e9, 448e9, 50e9),
]


@pytest.mark.parametrize(("name", "bf16", "hbm", "hbm_bw", "intra", "scale_out"), DATASHEET)
def test_datasheet_figures(
    *, name: str, bf16: float, hbm: float, hbm_bw: float, intra: float, scale_out: float
) -> None:
    system = system_preset(name)
    assert system.accelerator.engine(Engine.MATRIX).rate(Datatype.BF16).peak_flop_per_s == bf16
    assert system.accelerator.hbm.capacity_bytes == hbm
    assert system.accelerator.hbm.bandwidth_bytes_per_s == hbm_bw
    assert system.link(LinkTier.INTRA_NODE).bandwidth_bytes_per_s == intra
    assert system.link(LinkTier.SCALE_OUT).bandwidth_bytes_per_s == scale_out


def test_fp8_peaks() -> None:
    assert system_preset("dgx-h100").accelerator.matrix.rate(Datatype.FP8).peak_flop_per_s == (
        1979e12
    )
    assert system_preset("dgx-b200").accelerator.matrix.rate(Datatype.FP8).peak_flop_per_s == (
        4500e12
    )


def test_unknown_preset_suggests_a_name() -> None:
    with pytest.raises(ConfigError) as raised:
        system_preset("dgx-h10")
    assert raised.value.problems == (
        "system.preset: unknown system 'dgx-h10' (did you mean 'dgx-h100'?); presets: "
        "dgx-a100-40gb, dgx-a100-80gb, dgx-h100, dgx-h200, dgx-b200, mi300x-8",
    )
