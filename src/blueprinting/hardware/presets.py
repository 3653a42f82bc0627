"""Built-in systems, from vendor datasheets: ``SYSTEM_PRESETS`` and ``system_preset(name)``.

Names: ``dgx-a100-40gb``, ``dgx-a100-80gb`` (NVIDIA Selene's nodes, the machine of the Megatron-LM
papers: Narayanan et al. 2021, Section 5; Korthikanti et al. 2022, Section 6), ``dgx-h100``,
``dgx-h200``, ``dgx-h800`` (DeepSeek's cluster: H100 compute with NVLink cut to 400 GB/s),
``dgx-b200``, ``dgx-b300``, ``dgx-gb200`` and ``dgx-gb300`` (NVL72 racks: 18 compute trays of 4
GPUs, one NVLink domain of 72), ``mi300x-8``.

Peaks are dense (no 2:4 sparsity). Link bandwidths are per GPU and per direction: NVIDIA quotes
NVLink bidirectionally ("600 GB/s" for A100 = 300 GB/s each way), and every system here has one
scale-out NIC per GPU, so the scale-out figure is one NIC's line rate (HDR 200 Gb/s = 25 GB/s;
NDR 400 Gb/s = 50 GB/s; XDR / ConnectX-8 800 Gb/s = 100 GB/s). Facts for the Blackwell parts
and the NVL72 domain: ``shared/reference/modern_parallelism.md`` sections 3.6 (peaks, HBM) and
3.7 (NVLink, NIC, domain size).

Efficiency defaults are physical quantities, each overridable by name in ``[system]`` (see
:mod:`blueprinting.hardware.system_mapping`). Each is read from an independent microbenchmark in
``shared/reference/microbenchmarks.md`` (section and source key named below, "MB 1
mlengr_mamf"), never fitted on the runs ``blueprinting validate`` scores, except the A100 GEMM
fraction (:data:`A100_GEMM_PEAK_FRACTION`, the one documented fit). Where the microbenchmarks
hold a series (shapes, message sizes), the figure is the fit of :mod:`blueprinting.hardware.fit`
on it (the constants ``*_FIT`` below, each naming its series of
:mod:`blueprinting.hardware.microbenchmarks`; ``tests/hardware/test_microbenchmark_fits.py``
refits them); else a single reading. Where no measurement of a part exists the figure is an
assumption, said so. Ratios are rounded to 0.01.

* GEMMs with shape-resolved points (MB 2): a :class:`GemmShapeEfficiency` fitted on them
  (``peak_fraction``, ``half_saturation_dim``, ``half_saturation_flops``; fitted / leave-one-out
  RMS in docs/VALIDATION.md): H200 fp8 (:data:`H200_FP8_GEMM_FIT`, cuBLASLt), every Hopper
  part's ``fp8_blockwise`` (DeepGEMM on H800,
  :data:`HOPPER_FP8_BLOCKWISE_GEMM_FIT`), B200 bf16 / fp16 / fp32 (:data:`B200_BF16_GEMM_FIT`,
  torch.mm; B300, GB200, GB300 bf16 moved by MAMF), B200 and GB200 nvfp4
  (:data:`B200_NVFP4_GEMM_FIT`, torchao; GB200 moved by MAMF), B300 and GB300 nvfp4
  (:data:`B300_NVFP4_GEMM_FIT`, TE's pre-quantized B300 GEMMs; GB300 assumed),
  GB200 and GB300 fp8 (:data:`GB200_FP8_GEMM_FIT`, cuBLASLt; GB300 assumed), every Blackwell
  part's mxfp8 and blockwise and B200 / B300 fp8 (:data:`MXFP8_GEMM_FIT`; GB200 / GB300
  mxfp8 moved by MAMF).
* Other GEMMs: :class:`SaturatingGemmEfficiency` with ``peak_fraction`` = the Maximum Achievable
  Matmul FLOPS fraction of dense peak (MB 0-1, ``mlengr_mamf``, mamf-finder v2: best shape, cache
  wiped), per datatype (bf16/fp16 from the bf16 row, fp8 from the fp8 e4m3 row, fp32 as bf16:
  no fp32 measurement), and ``half_saturation_dim = 128`` (one tensor-core CTA tile edge: a GEMM
  whose smallest side is one tile reaches half of it). At d = 4096 the curve gives 0.97 of
  ``peak_fraction``. Per system (bf16 / fp8):

  - A100: 0.75, the fit on Korthikanti Table 4 (:data:`A100_GEMM_PEAK_FRACTION`); MAMF is 0.869,
    cuBLASLt 8192^3 0.813; the cuBLASLt shape fit :data:`A100_GEMM_FIT` (0.81) is reported, not
    adopted: it fails the Table 4 gate, and with the three Megatron-LM 2022 costs that the 0.72
    absorbs named (:mod:`blueprinting.validation.layer_terms`) it passes that gate but worsens
    Narayanan Table 1 (docs/VALIDATION.md, "What the A100 fraction absorbs").
  - H100, H800 fp8: the cuBLASLt shape fit :data:`H100_FP8_GEMM_FIT` (0.70, 196, 7.1e9; MAMF
    1402.6/1979 = 0.709 was the constant before). Adopted on its merit: the Hopper modern-run
    median goes 11.6% -> 8.5%, while the GPT-3 20B NeMo run, already slow for its exposed DP
    time, goes +43.2% -> +45.0% (docs/VALIDATION.md).
  - H100, H200, H800 bf16: 0.80 (MAMF 794.5/989 = 0.803, "H200 is the same"; H800: H100's
    tensor throughput, MB 2.2 note). Not fitted: the two shape-resolved H100 bf16 series (MB 2.3
    ``f8exp_38`` training shapes, 2.4 ``zzc_79`` square sweep) disagree by up to 30% at similar
    sizes (pooled fit RMS 15.5%).
  - No Blackwell GEMM takes its MAMF constant any more (B200 fp8 0.76, B300 0.79 / 0.75, GB200
    and GB300 bf16 0.73 were): on Blackwell the best shape MAMF finds reads well above every
    shape-resolved series of the same part and datatype, unlike Hopper's (H100 fp8: MAMF 0.709,
    cuBLASLt fit 0.70): GB200 fp8 MAMF 3,615.6 (0.723) against cuBLASLt's 2,834.6-2,906.9
    (0.567-0.581) from 4096^3 to 16384^3; B200 bf16 MAMF 1,745 (0.776) against torch.mm's
    1,420 (0.631) at 8192^3. So B200 and B300 fp8 (per-tensor scaling) take
    :data:`MXFP8_GEMM_FIT`, B200's one shape-resolved FP8-format series: Blackwell's per-tensor
    and MX-scaled FP8 GEMMs measure at about one rate (at 8192^3 GB200's per-tensor cuBLASLt
    2,876.6 and B200's MX-scaled cuBLAS 2,849.9 TFLOP/s; TE's pre-quantized B300 MXFP8 GEMMs
    sit within 3% of the fit). The rule for every part and format: its own shape-resolved
    series where it has one (GB200 fp8: :data:`GB200_FP8_GEMM_FIT`, so on GB200 per-tensor FP8
    runs 3.5% faster than MXFP8 at large shapes, 3,050 against 2,939 TFLOP/s); else B200's
    series of that format, moved by the two parts' measured ceilings (:func:`transferred_fit`:
    B200's achieved rate x the MAMF ratio, as a fraction of the part's own peak; the attention
    tables' rule), not by their
    datasheet peaks: GB200's 5,000 / 4,500 would add 11%, its MAMF adds 5.3% (fp8) and 4.4%
    (bf16), and at 8192^3 GB200's cuBLASLt fp8 (2,876.6) is within 1% of B200's cuBLAS MXFP8
    (2,849.9). So B300 bf16 :data:`B300_BF16_GEMM_FIT` (0.68), GB200 / GB300 bf16
    :data:`GB200_BF16_GEMM_FIT` (0.63). GB300: GB200's figures (same bf16 / fp8 peaks,
    modern_parallelism 3.6: GB300 improves only FP4).
  - MI300X: 0.51 (MAMF 668.4/1307.4 = 0.511, PyTorch TunableOp on); fp8 0.49 (no MAMF fp8
    measurement: AMD's own MAF, MB 1 ``rocm_maf``, 1273/2614.9 = 0.487).
* Low-precision GEMMs (``AcceleratorSpec.low_precision``: the rates Transformer Engine's linear
  layers run at under an FP8 / FP4 recipe, :mod:`blueprinting.mapping.precision`), each a
  :class:`SaturatingGemmEfficiency` with ``half_saturation_dim = 128`` like the others. Peaks are
  the dense FP8 / FP4 datasheet figures (modern_parallelism.md 3.6: H100 / H200 / H800 1,979;
  B200 4,500 / 9,000; B300 4,500 / 14,000, the upper of the "12,600-14,000" the sources give;
  GB200 5,000 / 10,000; GB300 5,000 / 15,000; MI300X 2,614.9). Fractions:

  - ``fp8`` (per-tensor scaling: the delayed and tensorwise recipes): the matrix engine's fp8
    figure above (the fit, or MAMF: mamf-finder times ``torch._scaled_mm`` with per-tensor
    scales, the same GEMM).
  - ``fp8_blockwise`` on Hopper: DeepGEMM's 1x128 / 128x128-scaled kernels on H800 (MB 2.2
    ``deepgemm``), fitted (:data:`HOPPER_FP8_BLOCKWISE_GEMM_FIT`). On Blackwell Transformer
    Engine runs blockwise through MXFP8 (modern_parallelism 3.1), so the ``mxfp8`` figure.
  - ``mxfp8``: :data:`MXFP8_GEMM_FIT` (0.62, 196, 7.5e9): the peak fraction of the cuBLAS
    MXFP8 squares on B200 / sm_100 (MB 2.6 ``triton_9044``, ``triton_9697``; 8192^3 2,849.9 to
    32768^3 2,587 TFLOP/s of 4,500) under the GB200 fp8 cuBLASLt fit's shape dependence, checked
    on TE's pre-quantized B300 MXFP8 GEMMs (within 3.0%), so B300's too; GB200 and GB300:
    :data:`GB200_MXFP8_GEMM_FIT` (0.59 of 5,000), moved by the fp8 MAMF ratio (no MXFP8
    measurement on them).
  - ``nvfp4``: B200 the torchao shape fit (MB 2.6 ``torchao_2427``, peak fraction 0.61; cuBLAS
    NVFP4 8192^3 on sm_100 reaches 5,589.8 / 9,000 = 0.62, ``triton_9697``); GB200:
    :data:`GB200_NVFP4_TRANSFERRED_FIT` (0.58 of 10,000), B200's moved by the fp8 MAMF ratio
    (no FP4 ceiling is measured on either part: assumed; the Azure cuBLASLt ``fp4`` sweep, MB
    2.1, is an FP4 GEMM without NVFP4's block scales, :data:`GB200_NVFP4_GEMM_FIT`, reported
    only); B300 and
    GB300: :data:`B300_NVFP4_GEMM_FIT` (0.37 of their FP4 figure), TE's own pre-quantized
    NVFP4 GEMMs on B300.
  - A100 has no FP8 tensor cores (none listed); MI300X lists ``fp8`` only at its fp8 fraction.
  Formats a part lacks: Hopper has no ``mxfp8`` / ``nvfp4`` (Blackwell SM 10.0 / 10.3 only,
  modern_parallelism 3.1), so the ``precision_recipe_accelerator`` law refuses those recipes there.
* Vector engine: constant 0.9. No microbenchmark isolates it (an assumption); elementwise ops are
  memory-bound, so the roofline almost always prices them at the HBM rate below.
* HBM: BabelStream Triad over the datasheet bandwidth (MB 5, ``azure_abg``): A100 80GB
  1700/2039 = 0.83 (A100 40GB: none measured, the 80GB figure assumed), H100 2970/3350 = 0.89
  (H800: the same HBM3, assumed equal), H200 4150/4800 = 0.86. B200, B300, GB200, GB300, MI300X:
  no measurement exists (MB 5, 7); 0.9 kept as a stated assumption (above every measured Triad
  ratio, 0.83-0.89; B200's driver-reported bus gives 7,672 of the 8,000 GB/s datasheet,
  ``torchao_4002``).
* NVLink / Infinity Fabric: nccl-tests ring all-reduce bus bandwidth (NVLS off; the cost model is
  a ring) over the per-direction bandwidth. Where a sweep over message sizes exists, the
  alpha-beta fit of :func:`~blueprinting.hardware.fit.fit_link` sets the latency and the
  efficiency: GB200 17 us, 0.68 (:data:`GB200_NVLINK_FIT`: MB 4.2 ``azure_abg_gb200`` 4-GPU ring
  sweep; GB300 assumed equal); A100 47 us, 0.69 (:data:`A100_NVLINK_FIT`, the ``mlengr_net``
  and ``azure_abg`` 8-GPU sweeps; was 234.89/300 = 0.78 at 16 GiB with 10 us assumed), with the
  Table 4 fraction refitted on it (0.72 -> 0.75): the issue #5 throughput gate passes (max 10.4%
  -> 7.9%), Table 4 itself moves from max 1.9% to 3.7% and Narayanan's max from 6.9% to 7.9%
  (docs/VALIDATION.md). Large messages only, latency 10 us kept: H100 / H200 0.82
  (367.2/450, 8x H200 ring, NVLS off, 16 GiB, MB 4.3 ``mlengr_net``; NCCL maintainers expect
  370 on H100, ``nccl_tests_212``; the fit over the 8 and 16 GiB rows, :data:`HOPPER_NVLINK_FIT`,
  gives 0.81 and is not adopted with the H100 fp8 fit); B200 0.76
  (:data:`B200_NVLINK_FIT`: 8x B200 ring, 8 GiB; B300 assumed); H800 160/200 = 0.80 (MB 4.6,
  ``deepep``: ~160 GB/s achieved NVLink on DeepSeek's H800s; no ring busbw measured); MI300X
  312.912/448 = 0.70 (MB 4.3, ``mlengr_net``, 8 GPUs, 4 GiB).
* InfiniBand: 0.96 of one NIC's line rate: 24 of 25 GB/s per 200 Gb NIC and 48 of 50 per 400 Gb
  NIC (MB 4.1, ``nvidia_gtc24_s62129``; DGX A100 multi-node 192 GB/s over 8 NICs,
  ``nccl_812``; "46-48 GB/s per NIC" for NDR, ``nccl_tests_290``). ConnectX-8 800 Gb (B300,
  GB300): no measurement, the same fraction assumed.
* Fused attention: measured causal forward + backward kernel rates
  (:mod:`blueprinting.hardware.attention`): A100 FlashAttention-2, H100 / H200 / H800
  FlashAttention-2, B200 FlashAttention-4 (one in-step point on H100's curve shape), B300 / GB200
  / GB300 the B200 table scaled by the parts' MAMF ratio (assumptions stated there); MI300X none
  (a fused kernel is timed as its matrix products at the GEMM efficiency).
* Runtime memory (:class:`~blueprinting.hardware.system.RuntimeMemory`): the CUDA context, NCCL
  buffers per communicator and cuBLAS workspaces, each with its source there.
* Latencies: fitted where a sweep exists and adopted (GB200, GB300 NVLink, above); else 10 us
  intra-node, 20 us scale-out (the order of NCCL small-message all-reduce latency), as in
  Calculon's A100 system file.

Changed by the microbenchmark fits (issue 15; before / after tables in docs/VALIDATION.md): the
adopted GEMM figures named above from MAMF fractions to shape fits (H200 fp8, Hopper
fp8_blockwise, B200 bf16 and nvfp4, B300 nvfp4, GB200 / GB300 fp8 and nvfp4); NVLink GB200 and
GB300 0.76 / 10 us -> 0.68 / 17 us; NVLink A100 0.78 / 10 us -> 0.69 / 47 us, with the A100 GEMM
fraction refitted on it, 0.72 -> 0.75.

Changed from the first defaults (which were approximate readings, not each tied to a source):
GEMM H100/H200 0.75 -> 0.80, B200 0.70 -> 0.78, MI300X 0.55 -> 0.51, and fp8 now has its own
fraction (was the bf16 one); HBM A100 0.9 -> 0.83, H100 0.9 -> 0.89, H200 0.9 -> 0.86; NVLink
A100 0.8 -> 0.78, H100/H200 0.8 -> 0.82, B200 0.8 -> 0.76; InfiniBand 0.9 -> 0.96.

Processing mode: ``roofline`` (an op runs at the slower of its compute and memory rates).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from difflib import get_close_matches
from types import MappingProxyType
from typing import final

from blueprinting.errors import ConfigError
from blueprinting.hardware.attention import (
    A100_FLASH_ATTENTION_2,
    B200_FLASH_ATTENTION_4,
    B300_FLASH_ATTENTION_4,
    GB200_FLASH_ATTENTION_4,
    H100_FLASH_ATTENTION_2,
    AttentionKernelRates,
)
from blueprinting.hardware.ceilings import mamf_ratio
from blueprinting.hardware.efficiency import (
    ConstantEfficiency,
    Efficiency,
    GemmShapeEfficiency,
    SaturatingGemmEfficiency,
)
from blueprinting.hardware.ep_kernels import (
    B200_DEEPEP,
    B200_HYBRIDEP,
    GB200_DEEPEP,
    GB200_HYBRIDEP,
    EpKernelRates,
)
from blueprinting.hardware.host import HostCpu
from blueprinting.hardware.system import (
    AcceleratorSpec,
    ByRankLayout,
    ComputeEngineSpec,
    DatatypeRate,
    GemmFormatRate,
    HostLink,
    LinkSpec,
    MemorySpec,
    NcclByTransport,
    NodeSpec,
    ProcessingMode,
    RankLayout,
    RuntimeMemory,
    SystemSpec,
)
from blueprinting.mapping.model import Datatype
from blueprinting.mapping.precision import GemmFormat

TERA = 1e12
GIGA = 1e9

# Tensor-core tile edge: the smallest GEMM side at which half the large-GEMM efficiency is reached.
HALF_SATURATION_DIM = 128.0
#: No microbenchmark isolates the vector engine: an assumption (module docstring).
VECTOR_EFFICIENCY = ConstantEfficiency(fraction=0.9)
#: HBM where no BabelStream run exists (B200, B300, GB200, GB300, MI300X): an assumption.
HBM_EFFICIENCY_UNMEASURED = ConstantEfficiency(fraction=0.9)
#: InfiniBand, 0.96 of a NIC's line rate (MB 4.1 ``nvidia_gtc24_s62129``: 24/25, 48/50).
INFINIBAND_EFFICIENCY = ConstantEfficiency(fraction=0.96)
#: NCCL's all-to-all (grouped send / receive, not a ring) on the scale-up link: NVIDIA's
#: all-to-all busbw over 8 GPUs (MB 4.1 ``nvidia_gtc25_s72583``; busbw = algbw (n-1)/n, the
#: share :meth:`~blueprinting.hardware.system.SystemSpec.all_to_all_time` sends) over the
#: per-direction line rate, rounded to 0.01: NVLink3 (A100) 210 / 300 = 0.70, NVLink4 (H100)
#: 320 / 450 = 0.71, NVLink5 (B200) 640 / 900 = 0.71; GB200 NVL72's 640 over 32 GPUs of the
#: domain is B200's fraction. The ring collectives on the same links reach 0.76-0.82 (the
#: ``nvlink_efficiency`` figures). H200 and B300 / GB300: their generation's (same NVLink);
#: H800 and MI300X: none measured, their ring figure.
A100_NVLINK_ALL_TO_ALL = 0.70
HOPPER_NVLINK_ALL_TO_ALL = 0.71
BLACKWELL_NVLINK_ALL_TO_ALL = 0.71
#: NCCL's all-to-all on a NIC: the same slides' 32-GPU all-to-all busbw over 4 nodes, 48 GB/s on
#: DGX H100 (8 x 400 Gb) and 24 on DGX A100 (8 x 200 Gb), 2 x 200 / 2 x 400 Gb nodes 6 / 12 per
#: GPU: one NIC's rate, "Alltoall cannot aggregate the bandwidth of multiple NICs" (MB 4.5
#: ``nccl_tests_267``). busbw counts the (n-1)/n = 31/32 of the buffer a rank sends, NVLink's
#: 7/32 with it, while the NIC carries (n-c)/n = 24/32 (``all_to_all_time``): the NIC's
#: fraction is 48 x (24/31) / 50 = 24 x (24/31) / 25 = 0.74 of its line rate, where the ring
#: collectives reach 0.96 (``INFINIBAND_EFFICIENCY``). Assumed for every NCCL NIC preset
#: (ConnectX-7 / -8); MI300X's RCCL: none. The flex dispatchers' libraries keep 0.96
#: (:class:`~blueprinting.hardware.collectives.ExchangeKernels`).
NIC_ALL_TO_ALL = 0.74
INTRA_NODE_LATENCY_S = 10e-6

#: A100 achieved-GEMM fraction, fitted once (not per run) on the named subset "Korthikanti et al.
#: 2022, Table 4" (forward and backward time of one 22B layer on 8 A100-80GB, t = 8, five
#: recompute/SP variants: the microbenchmark-like rows of the published fixture), with every other
#: efficiency at its microbenchmark default above and ``half_saturation_dim = 128``.
#: Least squares of the relative error over those 10 figures, rounded to 0.01, gives 0.75 (MAE
#: 2.9%, max 3.7%; ``blueprinting calibrate`` reproduces the fit) on the A100 NVLink sweep fit
#: A100_NVLINK_FIT (47 us, 0.69), adopted on the microbenchmarks' merit; on the single-point
#: 0.78 / 10 us NVLink figure used before it was 0.72 (max 1.9%), which absorbed the NVLink
#: fit's slower per-layer all-reduces (0.763 ms per 96 MiB at 0.78 / 10 us, 0.898 ms on the fit).
#: Held out after the change: Narayanan 2021 Table 1 MAE 3.5% -> 3.2%, max 6.9% -> 7.9%;
#: Korthikanti 2022 Table 5 MAE 5.1% -> 4.1%, max 10.4% -> 7.2% (issue #5's joint gate, max 10%,
#: now met). It is an in-situ figure, below the independent large-GEMM figures (MAMF 0.869,
#: cuBLASLt 8192^3 0.813: microbenchmarks.md 0, 2.1). What it absorbs, decomposed by
#: :mod:`blueprinting.validation.layer_terms` (docs/VALIDATION.md, "What the A100 fraction
#: absorbs"): on A100_GEMM_FIT and A100_NVLINK_FIT each Table 4 forward is within 1.4% and each
#: backward 1.0-1.2 ms (5.5-9.0%) short; Megatron-LM 2022's fp16 gradient accumulation
#: (0.20 ms), its separate bias reductions (0.05 ms) and the 24 of 108 SMs NCCL holds during the
#: hidden backward collectives (0.40 ms) name 0.65 ms of it, not costed by the planner: with
#: them the fits would make Narayanan 2021 Table 1 worse (MAE 3.5% -> 4.8%, max 6.9% -> 11.5%).
#: Held-out error (Narayanan 2021 Table 1, Korthikanti 2022 Table 5) is reported separately by
#: ``blueprinting validate``.
A100_GEMM_PEAK_FRACTION = 0.75
SCALE_OUT_LATENCY_S = 20e-6

# ---- Fits on shared/reference/microbenchmarks.json (hardware/fit.py, the series of
# hardware/microbenchmarks.py; tests/hardware/test_microbenchmark_fits.py refits them and checks
# these roundings: peak_fraction to 0.01, half_saturation_dim to 1, half_saturation_flops to two
# significant digits). (peak_fraction, half_saturation_dim, half_saturation_flops):
#: "A100 fp16 cuBLASLt" (MB 2.1 azure_abg, 8 shapes, CUDA 12.5). Reported, not adopted (module
#: docstring).
A100_GEMM_FIT = (0.81, 113.0, 2.2e9)
#: "H100 fp8 cuBLASLt" (MB 2.1 azure_abg, 9 shapes, e4m3). Reported, not adopted (module
#: docstring).
H100_FP8_GEMM_FIT = (0.70, 196.0, 7.1e9)
#: "H200 fp8 cuBLASLt" (MB 2.1 azure_abg, 9 shapes).
H200_FP8_GEMM_FIT = (0.69, 163.0, 7.1e9)
#: "H800 fp8 DeepGEMM" (MB 2.2 deepgemm, 18 dense shapes, 1x128 / 128x128 scaling): the
#: fp8_blockwise rate on every Hopper part (one SM 9.0 die).
HOPPER_FP8_BLOCKWISE_GEMM_FIT = (0.67, 163.0, 1.3e9)
#: "B200 bf16 torch.mm" (MB 2.6 torchao_2427, 7 square shapes).
B200_BF16_GEMM_FIT = (0.67, 0.0, 5.3e9)
#: "B200 nvfp4 torchao" (MB 2.6 torchao_2427, 7 square shapes); GB200: moved by MAMF
#: (:data:`GB200_NVFP4_TRANSFERRED_FIT`; the GB200 fp4 series below is not a block-scaled NVFP4
#: GEMM).
B200_NVFP4_GEMM_FIT = (0.61, 0.0, 3.2e10)
#: B300 (and GB300, Blackwell Ultra) NVFP4: TE's pre-quantized B300 NVFP4 GEMMs of a 4096 /
#: 16384 layer at M = 15,872 (NVIDIA/TransformerEngine@332941783386 ``docs/features/
#: low_precision_training/gemm_profiling/gemm_profiling.rst``: 1.273 / 1.297 / 1.184 ms per
#: Fprop / Dgrad / Wgrad pass, about 5,100 TFLOP/s), their peak fraction of the 14,000 TFLOP/s
#: figure under the torchao fit's shape dependence (``tests/hardware/
#: test_microbenchmark_fits.py``; per pass -1.8%, -3.6%, +5.6%): 0.37, i.e. B200's rate, not
#: the datasheet's 1.5x.
B300_NVFP4_GEMM_FIT = (0.37, 0.0, 3.2e10)
#: "GB200 fp8 cuBLASLt" (MB 2.1 azure_abg_gb200, 9 shapes); GB300: assumed equal.
GB200_FP8_GEMM_FIT = (0.61, 196.0, 7.5e9)
#: "GB200 fp4 cuBLASLt" (MB 2.1 azure_abg_gb200, 8 shapes, peak 10,000): reported, not adopted.
#: Azure's harness builds superbench's ``cublaslt_gemm`` from the gitaumark/superbenchmark fork
#: (Azure/AI-benchmarking-guide ``Benchmarks/NVIDIA/GEMMCublasLt.py``), whose ``fp4e2m1`` case
#: (``cublaslt_gemm.cu``@0b8aff5c, ``cublaslt_utils.cc``@65c9e7e1) writes an FP4 output and sets
#: no block-scale mode: not the VEC16 E4M3 block-scaled NVFP4 GEMM with a BF16 output that
#: Transformer Engine runs. It reaches 7,536 TFLOP/s at 8192^3, 1.35x B200's block-scaled
#: NVFP4 (5,370-5,590) where GB200's bf16 / fp8 MAMF are 1.04-1.05x B200's.
GB200_NVFP4_GEMM_FIT = (0.76, 359.0, 4.2e10)
#: A100 NVLink: the two 8-GPU all-reduce sweeps (MB 4.2 mlengr_net 32 KiB-16 GiB and azure_abg
#: 1 KiB-8 GiB, 44 rows) as one alpha-beta line: latency 47 us, 207 GB/s = 0.69 of 300. The
#: A100 presets' NVLink (module docstring).
A100_NVLINK_FIT = (47e-6, 0.69)
#: H100 / H200 NVLink: the 8x H200 ring rows with NVLS off (MB 4.3 mlengr_net, 8 and 16 GiB;
#: large messages only, so the latency stays the 10 us assumption): 366.5 GB/s = 0.81 of 450.
#: Reported, not adopted (module docstring).
HOPPER_NVLINK_FIT = (INTRA_NODE_LATENCY_S, 0.81)
#: B200 NVLink: the 8x B200 ring row with NVLS off (MB 4.3 mlengr_net, 8 GiB; latency 10 us
#: assumed): 682.5 GB/s = 0.76 of 900; B300: assumed equal.
B200_NVLINK_FIT = (INTRA_NODE_LATENCY_S, 0.76)
#: GB200 NVLink: the 4-GPU ring sweep (MB 4.2 azure_abg_gb200, 1 KiB-8 GiB, 24 rows): 17 us,
#: 608 GB/s = 0.68 of 900; GB300: assumed equal.
GB200_NVLINK_FIT = (17e-6, 0.68)


def _fitted_gemm(fit: tuple[float, float, float]) -> GemmShapeEfficiency:
    peak_fraction, half_dim, half_flops = fit
    return GemmShapeEfficiency(
        peak_fraction=peak_fraction,
        half_saturation_dim=half_dim,
        half_saturation_flops=half_flops,
    )


#: A GEMM figure: a MAMF / single-shape fraction (saturating, ``HALF_SATURATION_DIM``) or a fit.
GemmFigure = float | GemmShapeEfficiency


def _gemm(figure: GemmFigure) -> Efficiency:
    if isinstance(figure, GemmShapeEfficiency):
        return figure
    return SaturatingGemmEfficiency(peak_fraction=figure, half_saturation_dim=HALF_SATURATION_DIM)


def _constant(fraction: float) -> ConstantEfficiency:
    return ConstantEfficiency(fraction=fraction)


def _optional_constant(fraction: float | None) -> ConstantEfficiency | None:
    return None if fraction is None else _constant(fraction)


def _engine(rates: Mapping[Datatype, tuple[float, Efficiency]]) -> ComputeEngineSpec:
    """An engine from ``{datatype: (dense peak in TFLOP/s, efficiency)}``."""
    return ComputeEngineSpec(
        rates=tuple(
            DatatypeRate(datatype=dt, peak_flop_per_s=tflops * TERA, efficiency=efficiency)
            for dt, (tflops, efficiency) in rates.items()
        )
    )


def _matrix(
    *, bf16: float, fp8: float, fp32: float, bf16_fraction: GemmFigure, fp8_fraction: GemmFigure
) -> ComputeEngineSpec:
    """Tensor-core peaks (fp16 = bf16) with their MAMF fractions (module docstring)."""
    half = _gemm(bf16_fraction)
    return _engine(
        {
            Datatype.BF16: (bf16, half),
            Datatype.FP16: (bf16, half),
            Datatype.FP8: (fp8, _gemm(fp8_fraction)),
            Datatype.FP32: (fp32, half),
        }
    )


#: Blackwell MXFP8 GEMM model: the peak fraction of the four cuBLAS MXFP8 squares (MB 2.6
#: ``triton_9044``, ``triton_9697``; :data:`~blueprinting.hardware.microbenchmarks.
#: MXFP8_GEMM_SERIES`, :func:`~blueprinting.hardware.fit.fit_gemm_peak`: RMS 5.8%, max 6.9%,
#: leave-one-out 7.8% / 9.1%) under the shape dependence of :data:`GB200_FP8_GEMM_FIT` (the one
#: Blackwell fp8 shape sweep; squares alone cannot fix it). Held out: TE's pre-quantized B300
#: MXFP8 GEMMs of a 4096 / 16384 layer at M = 15,872 (NVIDIA/TransformerEngine@332941783386
#: ``docs/features/low_precision_training/gemm_profiling/gemm_profiling.rst``), per pass +0.9%,
#: -1.5%, -3.0%. Assumed on every Blackwell part (module docstring).
MXFP8_GEMM_FIT = (0.62, 196.0, 7.5e9)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class BlackwellPeaks:
    """A Blackwell part's dense datasheet peaks, TFLOP/s (modern_parallelism.md 3.6; the parts'
    presets below say whose datasheet)."""

    bf16: float
    fp8: float
    fp4: float


B200_PEAKS = BlackwellPeaks(bf16=2250, fp8=4500, fp4=9000)
#: FP4 "12,600-14,000": the upper figure.
B300_PEAKS = BlackwellPeaks(bf16=2250, fp8=4500, fp4=14000)
GB200_PEAKS = BlackwellPeaks(bf16=2500, fp8=5000, fp4=10000)
#: GB300 improves only FP4 over GB200.
GB300_PEAKS = BlackwellPeaks(bf16=2500, fp8=5000, fp4=15000)


def transferred_fit(
    fit: tuple[float, float, float],
    *,
    source_peak: float,
    target_peak: float,
    ceiling_ratio: float,
) -> tuple[float, float, float]:
    """A shape fit measured on one part (``source_peak`` TFLOP/s) for another (``target_peak``)
    with no series of its own: the same shape dependence, at the source's achieved rate times
    the two parts' measured ceiling ratio (``ceiling_ratio``, MAMF target / source), as a
    fraction of the target's peak rounded to 0.01 (the module's rule). The rule of the attention
    tables (:mod:`blueprinting.hardware.attention`: B200's FlashAttention-4 table scaled by MAMF
    for B300 / GB200 / GB300); a datasheet ratio would overstate GB200 (5,000 / 4,500 = 1.11 on
    paper, 1.05 by MAMF, 1.01 by cuBLAS at 8192^3: GB200's fp8 2,876.6 against B200's MXFP8
    2,849.9)."""
    peak_fraction, half_dim, half_flops = fit
    scaled = round(peak_fraction * source_peak * ceiling_ratio / target_peak, 2)
    return (scaled, half_dim, half_flops)


#: GB200 (and GB300) bf16: B200's torch.mm fit scaled by MAMF 1822 / 1745 (0.63 of 2,500).
GB200_BF16_GEMM_FIT = transferred_fit(
    B200_BF16_GEMM_FIT,
    source_peak=B200_PEAKS.bf16,
    target_peak=GB200_PEAKS.bf16,
    ceiling_ratio=mamf_ratio("GB200", "B200", Datatype.BF16),
)
#: B300 bf16: B200's torch.mm fit scaled by MAMF 1769 / 1745 (0.68 of 2,250).
B300_BF16_GEMM_FIT = transferred_fit(
    B200_BF16_GEMM_FIT,
    source_peak=B200_PEAKS.bf16,
    target_peak=B300_PEAKS.bf16,
    ceiling_ratio=mamf_ratio("B300", "B200", Datatype.BF16),
)
#: GB200 (and GB300) MXFP8 / blockwise: the B200 MXFP8 fit scaled by the fp8 MAMF 3615.6 / 3432.5
#: (0.59 of 5,000).
GB200_MXFP8_GEMM_FIT = transferred_fit(
    MXFP8_GEMM_FIT,
    source_peak=B200_PEAKS.fp8,
    target_peak=GB200_PEAKS.fp8,
    ceiling_ratio=mamf_ratio("GB200", "B200", Datatype.FP8),
)
#: GB200 NVFP4: B200's torchao fit scaled by the fp8 MAMF ratio (no FP4 ceiling is measured on
#: either part; assumed), 0.58 of 10,000.
GB200_NVFP4_TRANSFERRED_FIT = transferred_fit(
    B200_NVFP4_GEMM_FIT,
    source_peak=B200_PEAKS.fp4,
    target_peak=GB200_PEAKS.fp4,
    ceiling_ratio=mamf_ratio("GB200", "B200", Datatype.FP8),
)


def _low_precision(
    rates: Mapping[GemmFormat, tuple[float, GemmFigure]],
) -> tuple[GemmFormatRate, ...]:
    """Low-precision GEMM rates from ``{format: (dense peak in TFLOP/s, peak fraction)}``."""
    return tuple(
        GemmFormatRate(format=fmt, peak_flop_per_s=tflops * TERA, efficiency=_gemm(fraction))
        for fmt, (tflops, fraction) in rates.items()
    )


def _blackwell_low_precision(
    *,
    fp8: float,
    fp4: float,
    fp8_fraction: GemmFigure,
    mxfp8_fraction: GemmFigure,
    fp4_fraction: GemmFigure,
) -> tuple[GemmFormatRate, ...]:
    # Blockwise FP8 runs through MXFP8 on Blackwell (modern_parallelism.md 3.1).
    return _low_precision(
        {
            GemmFormat.FP8: (fp8, fp8_fraction),
            GemmFormat.FP8_BLOCKWISE: (fp8, mxfp8_fraction),
            GemmFormat.MXFP8: (fp8, mxfp8_fraction),
            GemmFormat.NVFP4: (fp4, fp4_fraction),
        }
    )


def _vector(*, half: float, fp32: float) -> ComputeEngineSpec:
    return _engine(
        {
            Datatype.BF16: (half, VECTOR_EFFICIENCY),
            Datatype.FP16: (half, VECTOR_EFFICIENCY),
            Datatype.FP8: (half, VECTOR_EFFICIENCY),
            Datatype.FP32: (fp32, VECTOR_EFFICIENCY),
        }
    )


#: Device memory NVML reports as total (``nvidia-smi --query-gpu=memory.total``, MiB), what a
#: training process can fill before it runs out: the HBM "GB" of a datasheet is neither this
#: nor 10**9 bytes. Modal's readings on their fleet (modal-labs/modal-client PR #2797,
#: 2025-01-23; thundergolfer.com/blog/nvidia-gpu-memory-capacity): H100 80GB 81,559 MiB,
#: A100 80GB 81,920 MiB, A100 40GB 40,960 MiB, H200 143,771 MiB; the H100 figure is also the
#: gpustat line "33321 / 81559 MB" of the measured-memory tutorial runs on 8 x H100 80GB
#: (vuiseng9/megatron-tutorials 0b2c030a1d, 01-dp-zero2.md; gpustat's MB is 2**20 bytes,
#: wookayin/gpustat core.py ``MB = 1024 * 1024``). H800: H100's (the same five 16 GiB HBM3
#: stacks, assumed). Blackwell and MI300X: no reading here, so their datasheet GB x 10**9
#: stays (below what NVML would report: B200's CUDA device query reads 178.35 GB, pytorch/ao
#: PR #4002, against the 180 used).
NVML_TOTAL_MIB: dict[str, int] = {
    "A100-SXM4-40GB": 40_960,
    "A100-SXM4-80GB": 81_920,
    "H100-SXM5-80GB": 81_559,
    "H800-SXM5-80GB": 81_559,
    "H200-SXM5-141GB": 143_771,
}

#: The frame buffer the driver keeps for itself inside NVML's total (NVML
#: ``nvmlMemory_v2_t.reserved``, "Device memory reserved for system use (driver or firmware)";
#: ``nvidia-smi -q`` "FB Memory Usage: Reserved"), MiB: CUDA never hands it to a process, so
#: a run fills at most the total less this (what PyTorch reports as the device's "total
#: capacity"), and the fit verdicts are taken against that. The reserve varies with the driver;
#: the largest reading per part is taken (the conservative bound for a fit). H100 80GB HBM3:
#: readings of 328 to 551 MiB in public ``nvidia-smi -q`` logs (551 on a GKE A3 node, driver
#: 535.309.01), and 81,559 - 551 = 81,008 MiB is the "total capacity of 79.11 GiB" of
#: PyTorch's out-of-memory messages on H100s (NVIDIA/TensorRT-LLM #10580, 2026-01-09, and
#: many 2025-2026 reports); H800: H100's (assumed). H200: readings of 700 MiB (and 606,
#: PyTorch's 139.81 GiB in modelscope/ms-swift #9191 and THUDM/slime #1951). A100 80GB: 557
#: to 834 MiB; A100 40GB: one reading, 620 MiB. Gpustat (>= 1.1 reads NVML's v2 ``used``,
#: ``gpustat/nvml.py``) and ``nvidia-smi``'s table leave the reserve out of "used", so the
#: measured device figures compare with a process's own memory; NVML's v1 ``used`` (older
#: gpustat, py3nvml) adds it.
DRIVER_RESERVED_MIB: dict[str, int] = {
    "A100-SXM4-40GB": 620,
    "A100-SXM4-80GB": 834,
    "H100-SXM5-80GB": 551,
    "H800-SXM5-80GB": 551,
    "H200-SXM5-141GB": 700,
}


def _hbm(
    capacity_gb: float,
    gbps: float,
    efficiency: ConstantEfficiency,
    *,
    part: str | None = None,
) -> MemorySpec:
    """``capacity_gb`` x 10**9 bytes, or, for a ``part`` whose NVML total was read
    (:data:`NVML_TOTAL_MIB`), that total less the driver's reserve
    (:data:`DRIVER_RESERVED_MIB`): the memory a process can fill."""
    if part is None or part not in NVML_TOTAL_MIB:
        capacity = capacity_gb * GIGA
    else:
        capacity = (NVML_TOTAL_MIB[part] - DRIVER_RESERVED_MIB[part]) * 2**20
    return MemorySpec(
        capacity_bytes=capacity,
        bandwidth_bytes_per_s=gbps * GIGA,
        efficiency=efficiency,
    )


#: NCCL's channel counts on an A100 NVSwitch node (:data:`HOPPER_NCCL`'s comment): the
#: RuntimeMemory defaults.
A100_NCCL = RuntimeMemory()


#: NVLink-C2C between a Grace CPU and a Blackwell GPU: 900 GB/s bidirectional per link, one
#: link per GPU (Transformer Engine ``docs/features/other_optimizations/cpu_offloading/
#: cpu_offloading.rst`` @d0067d0d and its figure), the GH200 link. Achieved by the copy
#: engines on a GH200: host-to-device 346 GB/s (NVIDIA/nvbandwidth #23,
#: ``host_to_device_memcpy_ce``), device-to-host about 15% below it (same report: "H2D is
#: approximately 15% faster than D2H"), 346 / 1.15 = 301 GB/s. Not modelled: the two GPUs of a
#: GB200 / GB300 superchip sharing one Grace's LPDDR5X when both copy at once.
GRACE_C2C_HOST_LINK = HostLink(
    device_to_host_bytes_per_s=301e9,
    host_to_device_bytes_per_s=346e9,
    source="NVLink-C2C, GH200 copy-engine memcpy (NVIDIA/nvbandwidth #23)",
)


def _system(
    *,
    name: str,
    accelerator: AcceleratorSpec,
    nvlink_gbps_per_direction: float,
    nvlink_efficiency: float,
    nic_gbps: float,
    gpus_per_node: int = 8,
    nvlink_domain_size: int | None = None,
    nvlink_latency_s: float = INTRA_NODE_LATENCY_S,
    host_cpu: HostCpu = HostCpu.X86,
    runtime: RuntimeMemory = A100_NCCL,
    ep_kernels: tuple[EpKernelRates, ...] = (),
    host_link: HostLink | None = None,
    nvlink_all_to_all_efficiency: float | None = None,
    nic_all_to_all_efficiency: float | None = None,
) -> SystemSpec:
    return SystemSpec(
        runtime=runtime,
        host_cpu=host_cpu,
        host_link=host_link,
        name=name,
        accelerator=accelerator,
        node=NodeSpec(
            gpus_per_node=gpus_per_node,
            link=LinkSpec(
                bandwidth_bytes_per_s=nvlink_gbps_per_direction * GIGA,
                latency_s=nvlink_latency_s,
                efficiency=_constant(nvlink_efficiency),
                all_to_all_efficiency=_optional_constant(nvlink_all_to_all_efficiency),
            ),
            nvlink_domain_size=nvlink_domain_size,
            ep_kernels=ep_kernels,
        ),
        scale_out=LinkSpec(
            bandwidth_bytes_per_s=nic_gbps * GIGA,
            latency_s=SCALE_OUT_LATENCY_S,
            efficiency=INFINIBAND_EFFICIENCY,
            all_to_all_efficiency=_optional_constant(nic_all_to_all_efficiency),
        ),
        processing_mode=ProcessingMode.ROOFLINE,
        network_assignment=ByRankLayout(layout=RankLayout.TP_DP_PP),
    )


# NCCL's channel counts per system (RuntimeMemory; NVIDIA/nccl v2.27.7-1 @593de54e). The
# defaults (24 ring channels, 32 P2P channels per peer, no NVLS) are A100 NVSwitch's: 12 NVLinks
# x 20 GB/s give 6 ring channels at 40 GB/s, doubled twice (nccl-tests #100 logs 24 on an HGX
# A100); SM80 has no NVLS. RCCL (mi300x-8) keeps them: its figures are not read here.
#: H100 / H200 (SM90, NVSwitch): 18 NVLinks x 20.6 GB/s give 6 ring channels at 60 GB/s, doubled
#: twice; P2P per peer pow2(min(24, 2 x 18)); NVLS_NCHANNELS_SM90.
HOPPER_NCCL = RuntimeMemory(
    nccl=NcclByTransport(ring_channels=24, p2p_channels_per_peer=32, nvls_channels=16)
)
#: H800: NVIDIA/nccl #892's 8 x H800 log, "16 coll channels, 0 nvls channels, 16 p2p channels,
#: 16 p2p channels per peer" (NVLink cut to 8 links).
H800_NCCL = RuntimeMemory(
    nccl=NcclByTransport(ring_channels=16, p2p_channels_per_peer=16, nvls_channels=0)
)
#: B200 / B300 / GB200 / GB300 (SM100, NVSwitch; NVL72: one multi-node NVLink domain): 18 NVLinks
#: x 40.1 GB/s (SM100_NVLINK_BW) give 8 ring channels at 90 GB/s, doubled twice; P2P per peer
#: pow2(min(32, 36)); NVLS_NCHANNELS_SM100_NVL (one node or one NVLink domain).
BLACKWELL_NCCL = RuntimeMemory(
    nccl=NcclByTransport(ring_channels=32, p2p_channels_per_peer=32, nvls_channels=24)
)


def _a100(hbm_gb: float, hbm_gbps: float) -> AcceleratorSpec:
    # NVIDIA A100 Tensor Core GPU datasheet (SXM): bf16/fp16 tensor 312 TFLOP/s dense, TF32 156,
    # fp32 19.5; fp16 non-tensor 78, bf16 non-tensor 39. HBM2 40 GB at 1,555 GB/s, HBM2e 80 GB at
    # 2,039 GB/s. fp32 matrix is plain fp32 (TF32 is opt-in in PyTorch; override to 156e12).
    # No fp8. HBM 0.83: BabelStream Triad 1,700 GB/s on A100 80GB (MB 5, azure_abg) / 2,039.
    # GEMM: the Korthikanti Table 4 fraction; the cuBLASLt shape fit (A100_GEMM_FIT) is reported
    # beside it, not adopted: it fails the Table 4 gate (docs/VALIDATION.md, "Efficiency fits").
    gemm = _gemm(A100_GEMM_PEAK_FRACTION)
    return AcceleratorSpec(
        name=f"A100-SXM4-{hbm_gb:g}GB",
        matrix=_engine(
            {Datatype.BF16: (312, gemm), Datatype.FP16: (312, gemm), Datatype.FP32: (19.5, gemm)}
        ),
        vector=_engine(
            {
                Datatype.BF16: (39, VECTOR_EFFICIENCY),
                Datatype.FP16: (78, VECTOR_EFFICIENCY),
                Datatype.FP32: (19.5, VECTOR_EFFICIENCY),
            }
        ),
        hbm=_hbm(
            hbm_gb,
            hbm_gbps,
            _constant(0.83),
            part=f"A100-SXM4-{hbm_gb:g}GB",
        ),
        attention=A100_FLASH_ATTENTION_2,
        # 108 SMs (NVIDIA A100 Tensor Core GPU Architecture whitepaper, Table 1).
        sm_count=108,
    )


def _hopper(
    name: str, hbm_gb: float, hbm_gbps: float, *, fp8_fraction: GemmFigure, hbm_fraction: float
) -> AcceleratorSpec:
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): bf16/fp16 989 TFLOP/s dense (1,979 sparse),
    # fp8 1,979 dense, TF32 495, fp32 67; H100 whitepaper: fp16/bf16 non-tensor 133.8
    # (modern_parallelism.md 3.6: 989 / 1979). H100 SXM: 80 GB HBM3 at 3.35 TB/s. H200 datasheet:
    # same compute, 141 GB HBM3e at 4.8 TB/s. H800 SXM5: H100's compute and memory.
    # GEMM, fp8 and HBM fractions: module docstring (MB 1 mlengr_mamf, MB 5 azure_abg).
    return AcceleratorSpec(
        name=name,
        matrix=_matrix(bf16=989, fp8=1979, fp32=67, bf16_fraction=0.80, fp8_fraction=fp8_fraction),
        vector=_vector(half=133.8, fp32=67),
        hbm=_hbm(hbm_gb, hbm_gbps, _constant(hbm_fraction), part=name),
        attention=H100_FLASH_ATTENTION_2,
        # FP8 only (no MXFP8 / NVFP4 on SM 9.0); blockwise at the per-tensor fraction (docstring).
        low_precision=_low_precision(
            {
                GemmFormat.FP8: (1979, fp8_fraction),
                GemmFormat.FP8_BLOCKWISE: (1979, _fitted_gemm(HOPPER_FP8_BLOCKWISE_GEMM_FIT)),
            }
        ),
        # 132 SMs on H100 SXM5 (NVIDIA H100 Tensor Core GPU Architecture whitepaper, Table 2);
        # H200 and H800 SXM keep the GH100 die's 132.
        sm_count=132,
    )


def _blackwell(
    name: str,
    *,
    bf16: float,
    fp8: float,
    hbm_gb: float,
    bf16_fraction: GemmFigure,
    fp8_fraction: GemmFigure,
    attention: AttentionKernelRates,
    sm_count: int,
    fp4: float,
    fp4_fraction: GemmFigure,
    mxfp8_fraction: GemmFigure,
) -> AcceleratorSpec:
    # Every Blackwell part here: 8 TB/s HBM3e (modern_parallelism.md 3.6; MB 5 mlengr_peaks).
    # fp32 80 TFLOP/s: the B200 figure (NVIDIA Blackwell datasheet; tabulated at
    # glennklockwood.com/garden/processors/B200); not in the shared references for B300 / GB200
    # / GB300, assumed equal. No published non-tensor bf16 rate: the fp32 vector rate is used
    # (lower bound). HBM efficiency: no measurement (module docstring).
    return AcceleratorSpec(
        name=name,
        matrix=_matrix(
            bf16=bf16,
            fp8=fp8,
            fp32=80,
            bf16_fraction=bf16_fraction,
            fp8_fraction=fp8_fraction,
        ),
        vector=_vector(half=80, fp32=80),
        hbm=_hbm(hbm_gb, 8000, HBM_EFFICIENCY_UNMEASURED),
        attention=attention,
        sm_count=sm_count,
        low_precision=_blackwell_low_precision(
            fp8=fp8,
            fp4=fp4,
            fp8_fraction=fp8_fraction,
            mxfp8_fraction=mxfp8_fraction,
            fp4_fraction=fp4_fraction,
        ),
    )


def _b200() -> AcceleratorSpec:
    # NVIDIA HGX B200 (1,000 W) per-GPU dense peaks: bf16/fp16 2,250 TFLOP/s, fp8 4,500, TF32 1,100
    # (NVIDIA Blackwell datasheet; modern_parallelism.md 3.6). DGX B200 datasheet: 1,440 GB HBM3e
    # over 8 GPUs (180 GB each), 64 TB/s (8 TB/s each).
    return _blackwell(
        "B200-SXM-180GB",
        bf16=B200_PEAKS.bf16,
        fp8=B200_PEAKS.fp8,
        hbm_gb=180,
        # bf16: the torch.mm shape fit (B200_BF16_GEMM_FIT); fp8: the MXFP8 cuBLAS fit (module
        # docstring: Blackwell's per-tensor and MX-scaled FP8 GEMMs measure at one rate).
        bf16_fraction=_fitted_gemm(B200_BF16_GEMM_FIT),
        fp8_fraction=_fitted_gemm(MXFP8_GEMM_FIT),
        attention=B200_FLASH_ATTENTION_4,
        # 148 SMs per B200 GPU (NVIDIA Blackwell datasheet; GB200's GPU is the same die).
        sm_count=148,
        # FP4 9,000 dense (modern_parallelism.md 3.6); NVFP4: the torchao shape fit.
        fp4=B200_PEAKS.fp4,
        fp4_fraction=_fitted_gemm(B200_NVFP4_GEMM_FIT),
        mxfp8_fraction=_fitted_gemm(MXFP8_GEMM_FIT),
    )


def _b300() -> AcceleratorSpec:
    # B300 (DGX B300): bf16 2,250, fp8 4,500 dense, 8 TB/s (modern_parallelism.md 3.6, MLE and
    # glennklockwood.com B300). HBM "~270-288 GB" there: 288 GB taken (eight 36 GB HBM3e stacks;
    # some summaries list 270 GB usable). fp4 (12.6-14 PF) has no Datatype here.
    return _blackwell(
        "B300-SXM-288GB",
        bf16=B300_PEAKS.bf16,
        fp8=B300_PEAKS.fp8,
        hbm_gb=288,
        # bf16: B200's torch.mm fit by MAMF; fp8 and MXFP8: the MXFP8 fit, which TE's own B300
        # MXFP8 GEMMs meet within 3% (module docstring)
        bf16_fraction=_fitted_gemm(B300_BF16_GEMM_FIT),
        fp8_fraction=_fitted_gemm(MXFP8_GEMM_FIT),
        attention=B300_FLASH_ATTENTION_4,
        # 160 SMs per Blackwell Ultra GPU (NVIDIA technical blog, Inside Blackwell Ultra, 2025).
        sm_count=160,
        # FP4 "12,600-14,000" (modern_parallelism.md 3.6): 14,000; NVFP4: TE's measured B300 GEMMs.
        fp4=B300_PEAKS.fp4,
        fp4_fraction=_fitted_gemm(B300_NVFP4_GEMM_FIT),
        mxfp8_fraction=_fitted_gemm(MXFP8_GEMM_FIT),
    )


def _gb200() -> AcceleratorSpec:
    # GB200 (NVL72, 1,200 W): bf16 2,500, fp8 5,000 dense; 13.4 TB HBM3e over 72 GPUs (186.1 GB
    # each), 8 TB/s (modern_parallelism.md 3.6: NVIDIA's GB200 NVL72 figures; the 2.25/4.5 PF of
    # a third-party table conflict with NVIDIA's rack totals and are not used).
    return _blackwell(
        "GB200-186GB",
        bf16=GB200_PEAKS.bf16,
        fp8=GB200_PEAKS.fp8,
        hbm_gb=13400 / 72,
        # bf16, MXFP8 and NVFP4: B200's fits scaled by MAMF (transferred_fit); fp8: its own sweep
        bf16_fraction=_fitted_gemm(GB200_BF16_GEMM_FIT),
        fp8_fraction=_fitted_gemm(GB200_FP8_GEMM_FIT),
        attention=GB200_FLASH_ATTENTION_4,
        # 148 SMs per B200 GPU (NVIDIA Blackwell datasheet; GB200's GPU is the same die).
        sm_count=148,
        # FP4 10,000 dense (modern_parallelism.md 3.6).
        fp4=GB200_PEAKS.fp4,
        fp4_fraction=_fitted_gemm(GB200_NVFP4_TRANSFERRED_FIT),
        mxfp8_fraction=_fitted_gemm(GB200_MXFP8_GEMM_FIT),
    )


def _gb300() -> AcceleratorSpec:
    # GB300 (NVL72): bf16 2,500, fp8 5,000 dense (only fp4 improves over GB200); 20 TB HBM3e over
    # 72 GPUs (277.8 GB each), 8 TB/s (modern_parallelism.md 3.6). No MAMF row: GB200's fractions
    # and attention table assumed (module docstring).
    return _blackwell(
        "GB300-278GB",
        bf16=GB300_PEAKS.bf16,
        fp8=GB300_PEAKS.fp8,
        hbm_gb=20000 / 72,
        bf16_fraction=_fitted_gemm(GB200_BF16_GEMM_FIT),
        fp8_fraction=_fitted_gemm(GB200_FP8_GEMM_FIT),
        attention=GB200_FLASH_ATTENTION_4,
        # 160 SMs per Blackwell Ultra GPU (NVIDIA technical blog, Inside Blackwell Ultra, 2025).
        sm_count=160,
        # FP4 15,000 dense (modern_parallelism.md 3.6: GB300 improves only FP4); B300's NVFP4
        # fraction assumed (the one Blackwell Ultra NVFP4 measurement).
        fp4=GB300_PEAKS.fp4,
        fp4_fraction=_fitted_gemm(B300_NVFP4_GEMM_FIT),
        mxfp8_fraction=_fitted_gemm(GB200_MXFP8_GEMM_FIT),
    )


def _mi300x() -> AcceleratorSpec:
    # AMD Instinct MI300X datasheet: bf16/fp16 matrix 1,307.4 TFLOP/s dense, fp8 2,614.9,
    # fp32 matrix and vector 163.4; 192 GB HBM3 at 5.3 TB/s. The bf16 vector rate is taken as
    # the fp32 vector rate (lower bound; packed math can double it). GEMM fractions: module
    # docstring (MB 1 mlengr_mamf bf16, rocm_maf fp8); HBM: no measurement.
    return AcceleratorSpec(
        name="MI300X-OAM-192GB",
        matrix=_matrix(bf16=1307.4, fp8=2614.9, fp32=163.4, bf16_fraction=0.51, fp8_fraction=0.49),
        vector=_vector(half=163.4, fp32=163.4),
        hbm=_hbm(192, 5300, HBM_EFFICIENCY_UNMEASURED),
        low_precision=_low_precision({GemmFormat.FP8: (2614.9, 0.49)}),
    )


_PRESETS: dict[str, SystemSpec] = {
    # DGX A100 datasheet: 8x A100 SXM4, NVLink3 600 GB/s bidirectional per GPU (300 each way)
    # through 6 NVSwitches, 8x ConnectX-6 HDR 200 Gb/s InfiniBand for compute (25 GB/s per GPU).
    # NVLink 0.78: 234.89 GB/s ring busbw (MB 4.2 mlengr_net) / 300.
    "dgx-a100-40gb": _system(
        name="dgx-a100-40gb",
        accelerator=_a100(40, 1555),
        nvlink_gbps_per_direction=300,
        nvlink_efficiency=A100_NVLINK_FIT[1],
        nvlink_latency_s=A100_NVLINK_FIT[0],
        nic_gbps=25,
        nvlink_all_to_all_efficiency=A100_NVLINK_ALL_TO_ALL,
        nic_all_to_all_efficiency=NIC_ALL_TO_ALL,
    ),
    "dgx-a100-80gb": _system(
        name="dgx-a100-80gb",
        accelerator=_a100(80, 2039),
        nvlink_gbps_per_direction=300,
        nvlink_efficiency=A100_NVLINK_FIT[1],
        nvlink_latency_s=A100_NVLINK_FIT[0],
        nic_gbps=25,
        nvlink_all_to_all_efficiency=A100_NVLINK_ALL_TO_ALL,
        nic_all_to_all_efficiency=NIC_ALL_TO_ALL,
    ),
    # DGX H100 datasheet: 8x H100 SXM5, NVLink4 900 GB/s bidirectional per GPU (450 each way)
    # through 4 NVSwitches, 8x ConnectX-7 NDR 400 Gb/s (50 GB/s per GPU; modern_parallelism.md
    # 3.7). NVLink 0.82: 367.2 GB/s ring busbw on 8x H200 (MB 4.3 mlengr_net) / 450. fp8: the
    # cuBLASLt shape fit H100_FP8_GEMM_FIT (module docstring).
    "dgx-h100": _system(
        name="dgx-h100",
        accelerator=_hopper(
            "H100-SXM5-80GB",
            80,
            3350,
            fp8_fraction=_fitted_gemm(H100_FP8_GEMM_FIT),
            hbm_fraction=0.89,
        ),
        nvlink_gbps_per_direction=450,
        nvlink_efficiency=0.82,
        nic_gbps=50,
        runtime=HOPPER_NCCL,
        nvlink_all_to_all_efficiency=HOPPER_NVLINK_ALL_TO_ALL,
        nic_all_to_all_efficiency=NIC_ALL_TO_ALL,
    ),
    # DGX H200 datasheet: as DGX H100 with H200 (141 GB HBM3e, 4.8 TB/s).
    "dgx-h200": _system(
        name="dgx-h200",
        accelerator=_hopper(
            "H200-SXM5-141GB",
            141,
            4800,
            fp8_fraction=_fitted_gemm(H200_FP8_GEMM_FIT),
            hbm_fraction=0.86,
        ),
        nvlink_gbps_per_direction=450,
        nvlink_efficiency=0.82,
        nic_gbps=50,
        runtime=HOPPER_NCCL,
        nvlink_all_to_all_efficiency=HOPPER_NVLINK_ALL_TO_ALL,
        nic_all_to_all_efficiency=NIC_ALL_TO_ALL,
    ),
    # H800 SXM5 (NVIDIA's export part; DeepSeek-V3's 2,048-GPU cluster, modern_parallelism.md 4):
    # H100 compute and HBM, NVLink cut to 400 GB/s bidirectional (H800 datasheet) = 200 GB/s per
    # direction; 8 GPUs per node, one ConnectX-7 400 Gb/s InfiniBand NIC per GPU (MB 4.6 deepep:
    # "CX7 400Gb/s IB per GPU"). NVLink 0.80: ~160 GB/s achieved (MB 4.6 deepep;
    # modern_parallelism.md 3.7) / 200.
    "dgx-h800": _system(
        name="dgx-h800",
        accelerator=_hopper(
            "H800-SXM5-80GB",
            80,
            3350,
            fp8_fraction=_fitted_gemm(H100_FP8_GEMM_FIT),
            hbm_fraction=0.89,
        ),
        nvlink_gbps_per_direction=200,
        nvlink_efficiency=0.80,
        nic_gbps=50,
        runtime=H800_NCCL,
        nic_all_to_all_efficiency=NIC_ALL_TO_ALL,
    ),
    # DGX B200 datasheet: 8x B200, NVLink5 1.8 TB/s bidirectional per GPU (900 each way) through
    # 2 NVSwitch chips, 8x ConnectX-7 400 Gb/s (50 GB/s per GPU; modern_parallelism.md 3.7).
    # NVLink 0.76: 682.5 GB/s, the fit on the 8x B200 ring row (B200_NVLINK_FIT; MB 4.3
    # mlengr_net) / 900.
    # The flex dispatcher's libraries inside the node: DeepEP's Hybrid-EP README's B200 table
    # (hardware/ep_kernels.py).
    "dgx-b200": _system(
        name="dgx-b200",
        accelerator=_b200(),
        nvlink_gbps_per_direction=900,
        nvlink_efficiency=B200_NVLINK_FIT[1],
        nic_gbps=50,
        runtime=BLACKWELL_NCCL,
        ep_kernels=(B200_HYBRIDEP, B200_DEEPEP),
        nvlink_all_to_all_efficiency=BLACKWELL_NVLINK_ALL_TO_ALL,
        nic_all_to_all_efficiency=NIC_ALL_TO_ALL,
    ),
    # DGX B300: 8x B300, NVLink5 900 GB/s per direction, 8x ConnectX-8 800 Gb/s = 100 GB/s per
    # GPU (modern_parallelism.md 3.7, MLE DGX B300 XDR row). NVLink 0.76: B200's (assumed).
    "dgx-b300": _system(
        name="dgx-b300",
        accelerator=_b300(),
        nvlink_gbps_per_direction=900,
        nvlink_efficiency=B200_NVLINK_FIT[1],
        nic_gbps=100,
        runtime=BLACKWELL_NCCL,
        nvlink_all_to_all_efficiency=BLACKWELL_NVLINK_ALL_TO_ALL,
        nic_all_to_all_efficiency=NIC_ALL_TO_ALL,
    ),
    # GB200 NVL72: 18 compute trays of 2 Grace + 4 B200-class GPUs, one NVLink5 domain of 72
    # (1.8 TB/s bidirectional = 900 GB/s per direction per GPU), 4 ConnectX-7 400 Gb/s per tray =
    # 50 GB/s per GPU (modern_parallelism.md 3.7, DGX GB200 user guide). NVLink 17 us, 0.68: the
    # alpha-beta fit on the 4-GPU ring sweep (GB200_NVLINK_FIT; its 8 GiB busbw is 679.61 / 900
    # = 0.76, and 680 over 32 GPUs of the domain, MB 4.1 nvidia_gtc25_s72583).
    "dgx-gb200": _system(
        name="dgx-gb200",
        accelerator=_gb200(),
        host_cpu=HostCpu.GRACE,
        host_link=GRACE_C2C_HOST_LINK,
        nvlink_gbps_per_direction=900,
        nvlink_efficiency=GB200_NVLINK_FIT[1],
        nvlink_latency_s=GB200_NVLINK_FIT[0],
        nic_gbps=50,
        gpus_per_node=4,
        nvlink_domain_size=72,
        runtime=BLACKWELL_NCCL,
        # the flex dispatcher's libraries over the rack's NVLink: the Hybrid-EP README's GB200
        # tables (hardware/ep_kernels.py); GB300 and B300 have no published table
        ep_kernels=(GB200_HYBRIDEP, GB200_DEEPEP),
        nvlink_all_to_all_efficiency=BLACKWELL_NVLINK_ALL_TO_ALL,
        nic_all_to_all_efficiency=NIC_ALL_TO_ALL,
    ),
    # GB300 NVL72: as GB200 NVL72 (72-GPU NVLink5 domain, 900 GB/s per direction, 4 GPUs per
    # tray) with one ConnectX-8 SuperNIC 800 Gb/s = 100 GB/s per GPU (modern_parallelism.md
    # 3.7). NVLink 17 us, 0.68: GB200's fit (assumed).
    "dgx-gb300": _system(
        name="dgx-gb300",
        accelerator=_gb300(),
        host_cpu=HostCpu.GRACE,
        host_link=GRACE_C2C_HOST_LINK,
        nvlink_gbps_per_direction=900,
        nvlink_efficiency=GB200_NVLINK_FIT[1],
        nvlink_latency_s=GB200_NVLINK_FIT[0],
        nic_gbps=100,
        gpus_per_node=4,
        nvlink_domain_size=72,
        runtime=BLACKWELL_NCCL,
        nvlink_all_to_all_efficiency=BLACKWELL_NVLINK_ALL_TO_ALL,
        nic_all_to_all_efficiency=NIC_ALL_TO_ALL,
    ),
    # AMD Instinct MI300X platform: 8 OAMs in a fully connected Infinity Fabric mesh, 7 links of
    # 64 GB/s per direction per GPU = 448 GB/s each way (896 GB/s bidirectional aggregate);
    # scale-out: one 400 Gb/s NIC per GPU (50 GB/s), as in typical MI300X clusters. Infinity
    # Fabric 0.70: 312.912 GB/s all-reduce busbw on 8 MI300X (MB 4.3 mlengr_net) / 448.
    "mi300x-8": _system(
        name="mi300x-8",
        accelerator=_mi300x(),
        nvlink_gbps_per_direction=448,
        nvlink_efficiency=0.70,
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
