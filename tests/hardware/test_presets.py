"""System presets: the names the issue lists, their datasheet figures and their efficiencies."""

from __future__ import annotations

import pytest

from blueprinting.errors import ConfigError
from blueprinting.hardware.attention import (
    B200_FLASH_ATTENTION_4,
    H100_FLASH_ATTENTION_2,
)
from blueprinting.hardware.efficiency import (
    ConstantEfficiency,
    Efficiency,
    GemmShapeEfficiency,
    SaturatingGemmEfficiency,
)
from blueprinting.hardware.presets import SYSTEM_PRESETS, system_preset
from blueprinting.hardware.system import Engine, LinkTier
from blueprinting.mapping.model import Datatype
from blueprinting.mapping.precision import GemmFormat

NAMES = [
    "dgx-a100-40gb",
    "dgx-a100-80gb",
    "dgx-h100",
    "dgx-h200",
    "dgx-h800",
    "dgx-b200",
    "dgx-b300",
    "dgx-gb200",
    "dgx-gb300",
    "mi300x-8",
]


def test_preset_names() -> None:
    assert list(SYSTEM_PRESETS) == NAMES
    for name, system in SYSTEM_PRESETS.items():
        assert system.name == name


# (preset, GPUs per node, GPUs per NVLink domain): NVL72 racks are 18 trays of 4 GPUs on one
# NVLink fabric (modern_parallelism.md 3.7); every other system is an 8-GPU node.
TOPOLOGY = [(name, 8, 8) for name in NAMES if name not in ("dgx-gb200", "dgx-gb300")] + [
    ("dgx-gb200", 4, 72),
    ("dgx-gb300", 4, 72),
]


@pytest.mark.parametrize(("name", "per_node", "domain"), TOPOLOGY)
def test_nodes_and_nvlink_domains(*, name: str, per_node: int, domain: int) -> None:
    system = system_preset(name)
    assert system.gpus_per_node == per_node
    assert system.node.domain_size == domain
    assert system.node.nvlink_domain_size == (None if domain == per_node else domain)


# (preset, dense bf16 peak FLOP/s, dense fp8 peak (None: no fp8), HBM bytes, HBM bytes/s,
#  intra-node B/s per direction, scale-out B/s per GPU): the datasheet figures cited in
#  presets.py and modern_parallelism.md 3.6 / 3.7; HBM bytes are NVML's total less the driver's
#  reserve in MiB where both were read (presets.NVML_TOTAL_MIB: Modal's nvidia-smi readings,
#  modal-labs/modal-client PR #2797; presets.DRIVER_RESERVED_MIB: nvidia-smi -q "Reserved").
MIB = 2**20
DATASHEET = [
    ("dgx-a100-40gb", 312e12, None, (40_960 - 620) * MIB, 1555e9, 300e9, 25e9),
    ("dgx-a100-80gb", 312e12, None, (81_920 - 834) * MIB, 2039e9, 300e9, 25e9),
    ("dgx-h100", 989e12, 1979e12, (81_559 - 551) * MIB, 3350e9, 450e9, 50e9),
    ("dgx-h200", 989e12, 1979e12, (143_771 - 700) * MIB, 4800e9, 450e9, 50e9),
    # H800: H100 compute and HBM; NVLink 400 GB/s bidirectional = 200 each way; CX7 400 Gb/s.
    ("dgx-h800", 989e12, 1979e12, (81_559 - 551) * MIB, 3350e9, 200e9, 50e9),
    ("dgx-b200", 2250e12, 4500e12, 180e9, 8000e9, 900e9, 50e9),
    # B300: 2.25 / 4.5 PF dense, 288 GB, 8 TB/s; NVLink5 900 each way; CX-8 800 Gb/s = 100 GB/s.
    ("dgx-b300", 2250e12, 4500e12, 288e9, 8000e9, 900e9, 100e9),
    # GB200: 2.5 / 5 PF dense, 13.4 TB / 72 GPUs, 8 TB/s; NVLink5 900 each way; CX-7 50 GB/s.
    ("dgx-gb200", 2500e12, 5000e12, 13.4e12 / 72, 8000e9, 900e9, 50e9),
    # GB300: GB200's bf16 / fp8 peaks, 20 TB / 72 GPUs, 8 TB/s; CX-8 100 GB/s.
    ("dgx-gb300", 2500e12, 5000e12, 20e12 / 72, 8000e9, 900e9, 100e9),
    ("mi300x-8", 1307.4e12, 2614.9e12, 192e9, 5300e9, 448e9, 50e9),
]


@pytest.mark.parametrize(("name", "bf16", "fp8", "hbm", "hbm_bw", "intra", "scale_out"), DATASHEET)
def test_datasheet_figures(
    *,
    name: str,
    bf16: float,
    fp8: float | None,
    hbm: float,
    hbm_bw: float,
    intra: float,
    scale_out: float,
) -> None:
    system = system_preset(name)
    matrix = system.accelerator.engine(Engine.MATRIX)
    assert matrix.rate(Datatype.BF16).peak_flop_per_s == bf16
    assert matrix.rate(Datatype.FP16).peak_flop_per_s == bf16
    assert [r.datatype for r in matrix.rates if r.datatype == Datatype.FP8] == (
        [] if fp8 is None else [Datatype.FP8]
    )
    if fp8 is not None:
        assert matrix.rate(Datatype.FP8).peak_flop_per_s == fp8
    assert system.accelerator.hbm.capacity_bytes == pytest.approx(hbm, rel=1e-15)
    assert system.accelerator.hbm.bandwidth_bytes_per_s == hbm_bw
    assert system.link(LinkTier.INTRA_NODE).bandwidth_bytes_per_s == intra
    assert system.link(LinkTier.SCALE_OUT).bandwidth_bytes_per_s == scale_out


def test_nvl72_capacities_per_gpu() -> None:
    # 13.4 TB and 20 TB of HBM3e per 72-GPU rack (modern_parallelism.md 3.6).
    assert system_preset("dgx-gb200").accelerator.hbm.capacity_bytes == pytest.approx(
        186.11e9, 1e-4
    )
    assert system_preset("dgx-gb300").accelerator.hbm.capacity_bytes == pytest.approx(
        277.78e9, 1e-4
    )


# (preset, GEMM bf16, fp8 (None: no fp8), HBM, NVLink, NVLink latency, scale-out): a float is a
# saturating fraction (half_saturation_dim 128) from the microbenchmark named in presets.py, MAMF
# rounded to 0.01 (microbenchmarks.md 1); a triple a gemm_shape fit on the shape-resolved points
# (section 2; refitted in test_microbenchmark_fits.py); HBM BabelStream Triad / datasheet (5);
# NVLink the alpha-beta link fit or ring busbw / per-direction bandwidth (4.2-4.6); NIC busbw /
# line rate (4.1); A100 GEMM is the one fit on measured runs (Korthikanti Table 4). The fits
# reported but not adopted (A100 cuBLASLt GEMM, Hopper NVLink) are checked in
# test_microbenchmark_fits.py; docs/VALIDATION.md says why.
Figure = float | tuple[float, float, float]
EFFICIENCIES: list[tuple[str, Figure, Figure | None, float, float, float, float]] = [
    # A100 NVLink: the 8-GPU all-reduce sweep fit (47 us, 0.69; MB 4.2); GEMM refitted on it.
    ("dgx-a100-40gb", 0.75, None, 0.83, 0.69, 47e-6, 0.96),
    ("dgx-a100-80gb", 0.75, None, 0.83, 0.69, 47e-6, 0.96),
    ("dgx-h100", 0.80, (0.70, 196, 7.1e9), 0.89, 0.82, 10e-6, 0.96),  # 794.5/989, 367.2/450
    ("dgx-h200", 0.80, (0.69, 163, 7.1e9), 0.86, 0.82, 10e-6, 0.96),  # HBM 4150/4800
    ("dgx-h800", 0.80, (0.70, 196, 7.1e9), 0.89, 0.80, 10e-6, 0.96),  # H100's; NVLink ~160/200
    # Blackwell: the shape fits, never MAMF's best shape (B200 fp8 3432.5/4500 = 0.76 was; the
    # MXFP8 cuBLAS fit stands for B200 / B300 per-tensor FP8); bf16 B200's torch.mm fit, on
    # B300 / GB200 scaled by MAMF: 0.67 x 1769/1745 = 0.68, 0.67 x 0.9 x 1822/1745 = 0.63
    ("dgx-b200", (0.67, 0, 5.3e9), (0.62, 196, 7.5e9), 0.9, 0.76, 10e-6, 0.96),
    ("dgx-b300", (0.68, 0, 5.3e9), (0.62, 196, 7.5e9), 0.9, 0.76, 10e-6, 0.96),
    ("dgx-gb200", (0.63, 0, 5.3e9), (0.61, 196, 7.5e9), 0.9, 0.68, 17e-6, 0.96),
    ("dgx-gb300", (0.63, 0, 5.3e9), (0.61, 196, 7.5e9), 0.9, 0.68, 17e-6, 0.96),  # GB200's
    ("mi300x-8", 0.51, 0.49, 0.9, 0.70, 10e-6, 0.96),  # 668.4/1307.4, 1273/2614.9, 312.9/448
]


def _expected(figure: Figure) -> Efficiency:
    if isinstance(figure, tuple):
        peak, dim, flops = figure
        return GemmShapeEfficiency(
            peak_fraction=peak, half_saturation_dim=dim, half_saturation_flops=flops
        )
    return SaturatingGemmEfficiency(peak_fraction=figure, half_saturation_dim=128)


@pytest.mark.parametrize(("name", "gemm", "fp8", "hbm", "nvlink", "latency", "ib"), EFFICIENCIES)
def test_efficiency_defaults(
    *,
    name: str,
    gemm: Figure,
    fp8: Figure | None,
    hbm: float,
    nvlink: float,
    latency: float,
    ib: float,
) -> None:
    system = system_preset(name)
    matrix = system.accelerator.matrix
    for datatype in (Datatype.BF16, Datatype.FP16, Datatype.FP32):
        assert matrix.rate(datatype).efficiency == _expected(gemm)
    if fp8 is not None:
        assert matrix.rate(Datatype.FP8).efficiency == _expected(fp8)
    assert system.accelerator.hbm.efficiency == ConstantEfficiency(fraction=hbm)
    assert system.node.link.efficiency == ConstantEfficiency(fraction=nvlink)
    assert system.node.link.latency_s == latency
    assert system.scale_out.efficiency == ConstantEfficiency(fraction=ib)


def test_attention_tables() -> None:
    assert system_preset("dgx-h800").accelerator.attention == H100_FLASH_ATTENTION_2
    b200 = B200_FLASH_ATTENTION_4.flop_per_s(seq_length=8192, head_dim=128)
    # B200 FA4 at 8k, d = 128: the measured 834 TFLOP/s (microbenchmarks.md 3.3).
    assert b200 == pytest.approx(834e12, rel=1e-12)
    # B300 and GB200: that point x the MAMF ratio to B200 (1769/1745, 1822/1745).
    for name, ratio in (("dgx-b300", 1769 / 1745), ("dgx-gb200", 1822 / 1745)):
        rates = system_preset(name).accelerator.attention
        assert rates is not None
        assert rates.flop_per_s(seq_length=8192, head_dim=128) == pytest.approx(834e12 * ratio)
    assert (
        system_preset("dgx-gb300").accelerator.attention
        == system_preset("dgx-gb200").accelerator.attention
    )
    assert system_preset("mi300x-8").accelerator.attention is None


def test_unknown_preset_suggests_a_name() -> None:
    with pytest.raises(ConfigError) as raised:
        system_preset("dgx-h10")
    assert raised.value.problems == (
        "system.preset: unknown system 'dgx-h10' (did you mean 'dgx-h100'?); presets: "
        "dgx-a100-40gb, dgx-a100-80gb, dgx-h100, dgx-h200, dgx-h800, dgx-b200, dgx-b300, "
        "dgx-gb200, dgx-gb300, mi300x-8",
    )


def test_a_fit_moves_to_a_part_without_a_sweep_by_the_measured_ceilings() -> None:
    """``transferred_fit``: B200's achieved rate times the MAMF ratio, as a fraction of the
    target's peak (the datasheet ratio 5,000 / 4,500 would give GB200 11% more, MAMF 5.3%)."""
    from blueprinting.hardware.presets import (
        GB200_MXFP8_GEMM_FIT,
        GB200_NVFP4_TRANSFERRED_FIT,
        MXFP8_GEMM_FIT,
        transferred_fit,
    )

    assert transferred_fit(
        (0.62, 196.0, 7.5e9), source_peak=4500, target_peak=5000, ceiling_ratio=3615.6 / 3432.5
    ) == (0.59, 196.0, 7.5e9)  # 0.62 x 0.9 x 1.0533 = 0.5878
    assert GB200_MXFP8_GEMM_FIT == (0.59, 196.0, 7.5e9)
    assert GB200_NVFP4_TRANSFERRED_FIT == (0.58, 0.0, 3.2e10)  # 0.61 x 0.9 x 1.0533 = 0.5783
    # a ratio of 1 between equal peaks is the fit itself
    assert transferred_fit(MXFP8_GEMM_FIT, source_peak=1, target_peak=1, ceiling_ratio=1.0) == (
        MXFP8_GEMM_FIT
    )
    gb200 = system_preset("dgx-gb200").accelerator
    rates = {rate.format: rate for rate in gb200.low_precision}
    assert rates[GemmFormat.MXFP8].efficiency == GemmShapeEfficiency(
        peak_fraction=0.59, half_saturation_dim=196.0, half_saturation_flops=7.5e9
    )
    assert rates[GemmFormat.FP8_BLOCKWISE].efficiency == rates[GemmFormat.MXFP8].efficiency
    assert rates[GemmFormat.NVFP4].efficiency == GemmShapeEfficiency(
        peak_fraction=0.58, half_saturation_dim=0.0, half_saturation_flops=3.2e10
    )
    b200 = {rate.format: rate for rate in system_preset("dgx-b200").accelerator.low_precision}
    assert b200[GemmFormat.FP8].efficiency == b200[GemmFormat.MXFP8].efficiency
