"""Built-in systems, from vendor datasheets: ``SYSTEM_PRESETS`` and ``system_preset(name)``.

Names: ``dgx-a100-40gb``, ``dgx-a100-80gb`` (NVIDIA Selene's nodes, the machine of the Megatron-LM
papers: Narayanan et al. 2021, Section 5; Korthikanti et al. 2022, Section 6), ``dgx-h100``,
``dgx-h200``, ``dgx-b200``, ``mi300x-8``.

Peaks are dense (no 2:4 sparsity). Link bandwidths are per GPU and per direction: NVIDIA quotes
NVLink bidirectionally ("600 GB/s" for A100 = 300 GB/s each way), and a DGX has one scale-out NIC
per GPU, so the scale-out figure is one NIC's line rate (HDR 200 Gb/s = 25 GB/s; NDR 400 Gb/s =
50 GB/s).

Efficiency defaults are physical quantities, each overridable by name in ``[system]`` (see
:mod:`blueprinting.hardware.system_mapping`); they are starting points for calibration, not fits:

The figures below are approximate, order-of-magnitude readings of commonly published
microbenchmarks (cuBLAS / hipBLASLt GEMM sweeps, nccl-tests / rccl-tests, STREAM); none is a fit
except the A100 GEMM fraction, fitted on a named subset of measured runs (below).

* GEMMs: :class:`SaturatingGemmEfficiency` with ``peak_fraction`` = the fraction of dense peak
  that large square bf16 GEMMs reach, and ``half_saturation_dim = 128`` (one tensor-core CTA
  tile edge: a GEMM whose smallest side is one tile reaches half of it). A100 0.71: the one
  fitted figure, see :data:`A100_GEMM_PEAK_FRACTION` (isolated large GEMMs reach roughly
  250-280 of 312 TFLOP/s, i.e. 0.8-0.9; in a Megatron layer less); H100 / H200 0.75 (roughly
  700-800 of 989); B200 0.70
  (early software, assumed lower); MI300X 0.55 (large bf16 GEMMs reported around 650-750 of
  1307 TFLOP/s, e.g. SemiAnalysis, "MI300X vs H100 vs H200 Benchmark Part 1: Training", 2024).
* Vector engine: constant 0.9 (elementwise ops are memory-bound; the roofline picks HBM).
* HBM: constant 0.9 of datasheet bandwidth (STREAM-like copy kernels reach ~88-92%).
* NVLink: constant 0.8 of the per-direction bandwidth, the NCCL bus bandwidth of large
  all-reduces (nccl-tests ``all_reduce_perf``: roughly 230 GB/s on DGX A100, 360-370 GB/s on DGX
  H100 without NVLS); MI300X Infinity Fabric 0.7 (RCCL rings over a mesh of 64 GB/s links).
* InfiniBand: constant 0.9 of one NIC's line rate (NCCL inter-node busbw ~22-23 GB/s per HDR
  NIC, ~45 GB/s per NDR NIC).
* Fused attention: measured causal forward + backward kernel rates
  (:mod:`blueprinting.hardware.attention`): A100 FlashAttention-2, H100 / H200 FlashAttention-2,
  B200 FlashAttention-4 (one in-step point on H100's curve shape); MI300X none (a fused kernel is
  timed as its matrix products at the GEMM efficiency).
* Runtime memory (:class:`~blueprinting.hardware.system.RuntimeMemory`): the CUDA context, NCCL
  buffers per communicator and cuBLAS workspaces, each with its source there.
* Latencies: 10 us intra-node, 20 us scale-out (the order of NCCL small-message all-reduce
  latency), as in Calculon's A100 system file.

Processing mode: ``roofline`` (an op runs at the slower of its compute and memory rates).
"""

from __future__ import annotations

from collections.abc import Mapping
from difflib import get_close_matches
from types import MappingProxyType

from blueprinting.errors import ConfigError
from blueprinting.hardware.attention import (
    A100_FLASH_ATTENTION_2,
    B200_FLASH_ATTENTION_4,
    H100_FLASH_ATTENTION_2,
)
from blueprinting.hardware.efficiency import (
    ConstantEfficiency,
    Efficiency,
    SaturatingGemmEfficiency,
)
from blueprinting.hardware.system import (
    AcceleratorSpec,
    ByRankLayout,
    ComputeEngineSpec,
    DatatypeRate,
    LinkSpec,
    MemorySpec,
    NodeSpec,
    ProcessingMode,
    RankLayout,
    SystemSpec,
)
from blueprinting.mapping.model import Datatype

TERA = 1e12
GIGA = 1e9

# Tensor-core tile edge: the smallest GEMM side at which half the large-GEMM efficiency is reached.
HALF_SATURATION_DIM = 128.0
VECTOR_EFFICIENCY = ConstantEfficiency(fraction=0.9)
HBM_EFFICIENCY = ConstantEfficiency(fraction=0.9)
NVLINK_EFFICIENCY = ConstantEfficiency(fraction=0.8)
INFINIBAND_EFFICIENCY = ConstantEfficiency(fraction=0.9)
INTRA_NODE_LATENCY_S = 10e-6

#: A100 achieved-GEMM fraction, fitted once (not per run) on the named subset "Korthikanti et al.
#: 2022, Table 4" (forward and backward time of one 22B layer on 8 A100-80GB, t = 8, five
#: recompute/SP variants: the microbenchmark-like rows of the published fixture), with every other
#: efficiency at its datasheet / microbenchmark default above and ``half_saturation_dim = 128``.
#: Least squares of the relative error over those 10 figures, rounded to 0.01, gives 0.71 (max
#: |error| 1.5%; ``blueprinting calibrate`` reproduces the fit). It is an in-situ figure: it
#: absorbs what a layer's GEMMs lose in Megatron-LM beyond the bare cuBLAS sweep (fused bias /
#: GeLU epilogues, launch gaps, clocks under sustained load), which is why it sits below the
#: 0.85 of an isolated large square GEMM. Held-out error (Narayanan 2021 Table 1, Korthikanti
#: 2022 Table 5) is reported separately by ``blueprinting validate``.
A100_GEMM_PEAK_FRACTION = 0.71
SCALE_OUT_LATENCY_S = 20e-6


def _gemm(peak_fraction: float) -> SaturatingGemmEfficiency:
    return SaturatingGemmEfficiency(
        peak_fraction=peak_fraction, half_saturation_dim=HALF_SATURATION_DIM
    )


def _engine(peaks_tflops: Mapping[Datatype, float], efficiency: Efficiency) -> ComputeEngineSpec:
    return ComputeEngineSpec(
        rates=tuple(
            DatatypeRate(datatype=dt, peak_flop_per_s=tflops * TERA, efficiency=efficiency)
            for dt, tflops in peaks_tflops.items()
        )
    )


def _system(
    *,
    name: str,
    accelerator: AcceleratorSpec,
    nvlink_gbps_per_direction: float,
    nvlink_efficiency: ConstantEfficiency = NVLINK_EFFICIENCY,
    nic_gbps: float,
) -> SystemSpec:
    return SystemSpec(
        name=name,
        accelerator=accelerator,
        node=NodeSpec(
            gpus_per_node=8,
            link=LinkSpec(
                bandwidth_bytes_per_s=nvlink_gbps_per_direction * GIGA,
                latency_s=INTRA_NODE_LATENCY_S,
                efficiency=nvlink_efficiency,
            ),
        ),
        scale_out=LinkSpec(
            bandwidth_bytes_per_s=nic_gbps * GIGA,
            latency_s=SCALE_OUT_LATENCY_S,
            efficiency=INFINIBAND_EFFICIENCY,
        ),
        processing_mode=ProcessingMode.ROOFLINE,
        network_assignment=ByRankLayout(layout=RankLayout.TP_DP_PP),
    )


def _a100(hbm_gb: float, hbm_gbps: float) -> AcceleratorSpec:
    # NVIDIA A100 Tensor Core GPU datasheet (SXM): bf16/fp16 tensor 312 TFLOP/s dense, TF32 156,
    # fp32 19.5; fp16 non-tensor 78, bf16 non-tensor 39. HBM2 40 GB at 1,555 GB/s, HBM2e 80 GB at
    # 2,039 GB/s. fp32 matrix is plain fp32 (TF32 is opt-in in PyTorch; override to 156e12).
    return AcceleratorSpec(
        name=f"A100-SXM4-{hbm_gb:g}GB",
        matrix=_engine(
            {Datatype.BF16: 312, Datatype.FP16: 312, Datatype.FP32: 19.5},
            _gemm(A100_GEMM_PEAK_FRACTION),
        ),
        vector=_engine(
            {Datatype.BF16: 39, Datatype.FP16: 78, Datatype.FP32: 19.5}, VECTOR_EFFICIENCY
        ),
        hbm=MemorySpec(
            capacity_bytes=hbm_gb * GIGA,
            bandwidth_bytes_per_s=hbm_gbps * GIGA,
            efficiency=HBM_EFFICIENCY,
        ),
        attention=A100_FLASH_ATTENTION_2,
    )


def _hopper(name: str, hbm_gb: float, hbm_gbps: float) -> AcceleratorSpec:
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): bf16/fp16 989 TFLOP/s dense (1,979 sparse),
    # fp8 1,979 dense, TF32 495, fp32 67; H100 whitepaper: fp16/bf16 non-tensor 133.8.
    # H100 SXM: 80 GB HBM3 at 3.35 TB/s. H200 datasheet: same compute, 141 GB HBM3e at 4.8 TB/s.
    return AcceleratorSpec(
        name=name,
        matrix=_engine(
            {Datatype.BF16: 989, Datatype.FP16: 989, Datatype.FP8: 1979, Datatype.FP32: 67},
            _gemm(0.75),
        ),
        vector=_engine(
            {Datatype.BF16: 133.8, Datatype.FP16: 133.8, Datatype.FP8: 133.8, Datatype.FP32: 67},
            VECTOR_EFFICIENCY,
        ),
        hbm=MemorySpec(
            capacity_bytes=hbm_gb * GIGA,
            bandwidth_bytes_per_s=hbm_gbps * GIGA,
            efficiency=HBM_EFFICIENCY,
        ),
        attention=H100_FLASH_ATTENTION_2,
    )


def _b200() -> AcceleratorSpec:
    # NVIDIA HGX B200 (1,000 W) per-GPU dense peaks: bf16/fp16 2,250 TFLOP/s, fp8 4,500, TF32 1,100,
    # fp32 (vector) 80 (NVIDIA Blackwell datasheet; tabulated at glennklockwood.com/garden/
    # processors/B200). DGX B200 datasheet: 1,440 GB HBM3e over 8 GPUs (180 GB each), 64 TB/s
    # (8 TB/s each). No published non-tensor bf16 rate: the fp32 vector rate is used (lower bound).
    return AcceleratorSpec(
        name="B200-SXM-180GB",
        matrix=_engine(
            {Datatype.BF16: 2250, Datatype.FP16: 2250, Datatype.FP8: 4500, Datatype.FP32: 80},
            _gemm(0.70),
        ),
        vector=_engine(
            {Datatype.BF16: 80, Datatype.FP16: 80, Datatype.FP8: 80, Datatype.FP32: 80},
            VECTOR_EFFICIENCY,
        ),
        hbm=MemorySpec(
            capacity_bytes=180 * GIGA,
            bandwidth_bytes_per_s=8000 * GIGA,
            efficiency=HBM_EFFICIENCY,
        ),
        attention=B200_FLASH_ATTENTION_4,
    )


def _mi300x() -> AcceleratorSpec:
    # AMD Instinct MI300X datasheet: bf16/fp16 matrix 1,307.4 TFLOP/s dense, fp8 2,614.9,
    # fp32 matrix and vector 163.4; 192 GB HBM3 at 5.3 TB/s. The bf16 vector rate is taken as
    # the fp32 vector rate (lower bound; packed math can double it).
    return AcceleratorSpec(
        name="MI300X-OAM-192GB",
        matrix=_engine(
            {
                Datatype.BF16: 1307.4,
                Datatype.FP16: 1307.4,
                Datatype.FP8: 2614.9,
                Datatype.FP32: 163.4,
            },
            _gemm(0.55),
        ),
        vector=_engine(
            {Datatype.BF16: 163.4, Datatype.FP16: 163.4, Datatype.FP8: 163.4, Datatype.FP32: 163.4},
            VECTOR_EFFICIENCY,
        ),
        hbm=MemorySpec(
            capacity_bytes=192 * GIGA,
            bandwidth_bytes_per_s=5300 * GIGA,
            efficiency=HBM_EFFICIENCY,
        ),
    )


_PRESETS: dict[str, SystemSpec] = {
    # DGX A100 datasheet: 8x A100 SXM4, NVLink3 600 GB/s bidirectional per GPU (300 each way)
    # through 6 NVSwitches, 8x ConnectX-6 HDR 200 Gb/s InfiniBand for compute (25 GB/s per GPU).
    "dgx-a100-40gb": _system(
        name="dgx-a100-40gb",
        accelerator=_a100(40, 1555),
        nvlink_gbps_per_direction=300,
        nic_gbps=25,
    ),
    "dgx-a100-80gb": _system(
        name="dgx-a100-80gb",
        accelerator=_a100(80, 2039),
        nvlink_gbps_per_direction=300,
        nic_gbps=25,
    ),
    # DGX H100 datasheet: 8x H100 SXM5, NVLink4 900 GB/s bidirectional per GPU (450 each way)
    # through 4 NVSwitches, 8x ConnectX-7 NDR 400 Gb/s (50 GB/s per GPU).
    "dgx-h100": _system(
        name="dgx-h100",
        accelerator=_hopper("H100-SXM5-80GB", 80, 3350),
        nvlink_gbps_per_direction=450,
        nic_gbps=50,
    ),
    # DGX H200 datasheet: as DGX H100 with H200 (141 GB HBM3e, 4.8 TB/s).
    "dgx-h200": _system(
        name="dgx-h200",
        accelerator=_hopper("H200-SXM5-141GB", 141, 4800),
        nvlink_gbps_per_direction=450,
        nic_gbps=50,
    ),
    # DGX B200 datasheet: 8x B200, NVLink5 1.8 TB/s bidirectional per GPU (900 each way) through
    # 2 NVSwitch chips, 8x ConnectX-7 400 Gb/s (50 GB/s per GPU).
    "dgx-b200": _system(
        name="dgx-b200",
        accelerator=_b200(),
        nvlink_gbps_per_direction=900,
        nic_gbps=50,
    ),
    # AMD Instinct MI300X platform: 8 OAMs in a fully connected Infinity Fabric mesh, 7 links of
    # 64 GB/s per direction per GPU = 448 GB/s each way (896 GB/s bidirectional aggregate);
    # scale-out: one 400 Gb/s NIC per GPU (50 GB/s), as in typical MI300X clusters.
    "mi300x-8": _system(
        name="mi300x-8",
        accelerator=_mi300x(),
        nvlink_gbps_per_direction=448,
        nvlink_efficiency=ConstantEfficiency(fraction=0.7),
        nic_gbps=50,
    ),
}

SYSTEM_PRESETS: Mapping[str, SystemSpec] = MappingProxyType(_PRESETS)


def system_preset(name: str) -> SystemSpec:
    """The preset called ``name``; a ``ConfigError`` with a did-you-mean otherwise."""
    if name in SYSTEM_PRESETS:
        return SYSTEM_PRESETS[name]
    close = get_close_matches(name, list(SYSTEM_PRESETS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(
        [f"system.preset: unknown system {name!r}{hint}; presets: {', '.join(SYSTEM_PRESETS)}"]
    )
