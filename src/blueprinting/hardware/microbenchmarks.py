"""The shared microbenchmark file as fit inputs: ``shared/reference/microbenchmarks.json``.

Reads the ``gemm`` rows with a shape (M, N, K; ``batch`` or ``groups`` as the GEMM's batch),
the ``collectives`` rows with a message size and group size, and the ``hbm`` BabelStream rows,
into the point types of :mod:`blueprinting.hardware.fit`, grouped the way they are fitted: GEMMs
by (gpu, dtype, source, library), collectives by (system, op, group size, scope, algo, source).

:data:`GEMM_SERIES` / :data:`LINK_SERIES` / :data:`STREAM_SERIES` name the series that set a
preset's figure (:mod:`blueprinting.hardware.presets`) and the peak each is divided by; the
test ``tests/hardware/test_microbenchmark_fits.py`` fits them and checks the presets against
the fits.

Public API: ``GemmSeries``, ``LinkSeries``, ``StreamSeries``, ``GEMM_SERIES``,
``MXFP8_GEMM_SERIES``, ``LINK_SERIES``, ``STREAM_SERIES``, ``load_microbenchmarks(path)``,
``Microbenchmarks``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import final

from blueprinting.errors import ConfigError
from blueprinting.hardware.collectives import CollectiveKind
from blueprinting.hardware.efficiency import GemmShape
from blueprinting.hardware.fit import CollectivePoint, GemmPoint, StreamKernel, StreamRate

TERA = 1e12
GIGA = 1e9


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class GemmSeries:
    """Rows of one GPU x dtype x source x library (``library`` matched as a prefix)."""

    label: str
    gpu: str
    dtype: str
    source: str
    library: str
    peak_tflops: float


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSeries:
    """nccl-tests rows of one system x op x group size (``algo`` None: not stated)."""

    label: str
    system: str
    op: CollectiveKind
    group_size: int
    source: str
    algo: str | None
    link_gbps: float


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StreamSeries:
    label: str
    gpu: str
    source: str
    datasheet_gbps: float


#: The shape-resolved GEMM series (microbenchmarks.md section 2), each with the dense datasheet
#: peak its fraction is taken of (the presets' peaks; GB200 fp4: 10,000, ``_gb200``).
GEMM_SERIES: tuple[GemmSeries, ...] = (
    GemmSeries(
        label="A100 fp16 cuBLASLt",
        gpu="A100 SXM4 80GB (Azure ND A100 v4)",
        dtype="fp16",
        source="azure_abg",
        library="cuBLASLt",
        peak_tflops=312,
    ),
    GemmSeries(
        label="H100 fp8 cuBLASLt",
        gpu="H100 80GB HBM3 (Azure ND H100 v5)",
        dtype="fp8",
        source="azure_abg",
        library="cuBLASLt",
        peak_tflops=1979,
    ),
    GemmSeries(
        label="H200 fp8 cuBLASLt",
        gpu="H200 141GB (Azure ND H200 v5)",
        dtype="fp8",
        source="azure_abg",
        library="cuBLASLt",
        peak_tflops=1979,
    ),
    GemmSeries(
        label="GB200 fp8 cuBLASLt",
        gpu="GB200 (Azure ND GB200 v6, per GPU)",
        dtype="fp8",
        source="azure_abg_gb200",
        library="cuBLASLt",
        peak_tflops=5000,
    ),
    GemmSeries(
        label="GB200 fp4 cuBLASLt",
        gpu="GB200 (Azure ND GB200 v6, per GPU)",
        dtype="fp4",
        source="azure_abg_gb200",
        library="cuBLASLt",
        peak_tflops=10000,
    ),
    GemmSeries(
        label="H800 fp8 DeepGEMM",
        gpu="H800 SXM5",
        dtype="fp8",
        source="deepgemm",
        library="DeepGEMM (JIT",
        peak_tflops=1979,
    ),
    GemmSeries(
        label="H800 fp8 DeepGEMM grouped",
        gpu="H800 SXM5",
        dtype="fp8",
        source="deepgemm",
        library="DeepGEMM grouped",
        peak_tflops=1979,
    ),
    GemmSeries(
        label="H100 bf16 torch.mm (training shapes)",
        gpu="H100 SXM (implied: script's peak constants are H100 SXM; GPU not named in the PR)",
        dtype="bf16",
        source="f8exp_38",
        library="torch.mm",
        peak_tflops=989,
    ),
    GemmSeries(
        label="H100 fp8 torch._scaled_mm (training shapes)",
        gpu="H100 SXM (implied, see above)",
        dtype="fp8",
        source="f8exp_38",
        library="torch._scaled_mm",
        peak_tflops=1979,
    ),
    GemmSeries(
        label="H100 bf16 torch.mm (square)",
        gpu="H100 80GB HBM3",
        dtype="bf16",
        source="zzc_79",
        library="torch.mm",
        peak_tflops=989,
    ),
    GemmSeries(
        label="H100 fp16 torch.mm (square)",
        gpu="H100 80GB HBM3",
        dtype="fp16",
        source="zzc_79",
        library="torch.mm",
        peak_tflops=989,
    ),
    GemmSeries(
        label="B200 bf16 torch.mm",
        gpu="NVIDIA B200",
        dtype="bf16",
        source="torchao_2427",
        library="torch.mm",
        peak_tflops=2250,
    ),
    GemmSeries(
        label="B200 nvfp4 torchao",
        gpu="NVIDIA B200",
        dtype="nvfp4",
        source="torchao_2427",
        library="torchao nvfp4",
        peak_tflops=9000,
    ),
)

#: Blackwell MXFP8 GEMMs (microbenchmarks.md 2.6): cuBLAS on B200 (``triton_9044``, unlocked
#: clocks, 8192^3) and cuBLAS baselines on an sm_100 part the PR does not name (``triton_9697``,
#: 8192^3 to 32768^3; read as B200, 4,500 TFLOP/s). Square shapes only: pooled, they fix a peak
#: fraction under the GB200 fp8 cuBLASLt fit's shape dependence
#: (:func:`~blueprinting.hardware.fit.fit_gemm_peak`). The Triton tutorial kernel's row is not
#: what Transformer Engine runs and is left out.
MXFP8_GEMM_SERIES: tuple[GemmSeries, ...] = (
    GemmSeries(
        label="B200 mxfp8 cuBLAS (triton_9044)",
        gpu="NVIDIA B200 (unlocked clocks)",
        dtype="mxfp8",
        source="triton_9044",
        library="cuBLAS",
        peak_tflops=4500,
    ),
    GemmSeries(
        label="sm_100 mxfp8 cuBLAS (triton_9697)",
        gpu="Blackwell sm_100 (GPU model not named in the PR text)",
        dtype="mxfp8",
        source="triton_9697",
        library="cuBLAS",
        peak_tflops=4500,
    ),
)

#: Ring all-reduce sweeps over message size on one node (microbenchmarks.md 4.2); NVLS rows
#: are left out (busbw above the link rate: not a ring over it).
LINK_SERIES: tuple[LinkSeries, ...] = (
    LinkSeries(
        label="A100 8-GPU all-reduce (mlengr_net)",
        system="A100 node, 8 GPUs, NVLink3",
        op=CollectiveKind.ALL_REDUCE,
        group_size=8,
        source="mlengr_net",
        algo=None,
        link_gbps=300,
    ),
    LinkSeries(
        label="A100 8-GPU all-reduce (azure_abg)",
        system="Azure ND A100 v4 (8x A100 SXM4 80GB)",
        op=CollectiveKind.ALL_REDUCE,
        group_size=8,
        source="azure_abg",
        algo=None,
        link_gbps=300,
    ),
    LinkSeries(
        label="GB200 4-GPU ring all-reduce (azure_abg_gb200)",
        system="Azure ND GB200 v6 (one host = 4 GB200 GPUs)",
        op=CollectiveKind.ALL_REDUCE,
        group_size=4,
        source="azure_abg_gb200",
        algo="Ring",
        link_gbps=900,
    ),
    LinkSeries(
        label="H200 8-GPU ring all-reduce, NVLS off (mlengr_net)",
        system="8x H200 node",
        op=CollectiveKind.ALL_REDUCE,
        group_size=8,
        source="mlengr_net",
        algo="Ring (NVLS off)",
        link_gbps=450,
    ),
    LinkSeries(
        label="B200 8-GPU ring all-reduce, NVLS off (mlengr_net)",
        system="8x B200 AWS p6-b200.48xlarge",
        op=CollectiveKind.ALL_REDUCE,
        group_size=8,
        source="mlengr_net",
        algo="Ring (NVLS off)",
        link_gbps=900,
    ),
)

STREAM_SERIES: tuple[StreamSeries, ...] = (
    StreamSeries(
        label="A100 80GB",
        gpu="A100 SXM4 80GB (Azure ND A100 v4)",
        source="azure_abg",
        datasheet_gbps=2039,
    ),
    StreamSeries(
        label="H100 80GB",
        gpu="H100 80GB HBM3 (Azure ND H100 v5)",
        source="azure_abg",
        datasheet_gbps=3350,
    ),
    StreamSeries(
        label="H200 141GB",
        gpu="H200 141GB (Azure ND H200 v5)",
        source="azure_abg",
        datasheet_gbps=4800,
    ),
)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Microbenchmarks:
    """The parsed rows of the three sections used for fits."""

    gemm: tuple[Mapping[str, object], ...]
    collectives: tuple[Mapping[str, object], ...]
    hbm: tuple[Mapping[str, object], ...]

    def gemm_points(self, series: GemmSeries) -> tuple[GemmPoint, ...]:
        points = []
        for row in self.gemm:
            if (row.get("gpu"), row.get("dtype"), row.get("source")) != (
                series.gpu,
                series.dtype,
                series.source,
            ):
                continue
            if not str(row.get("library", "")).startswith(series.library):
                continue
            m, n, k = row.get("M"), row.get("N"), row.get("K")
            if not (isinstance(m, int) and isinstance(n, int) and isinstance(k, int)):
                continue
            batch = row.get("batch") or row.get("groups") or 1
            tflops = row.get("tflops")
            if not isinstance(batch, int) or not isinstance(tflops, int | float):
                raise ConfigError([f"microbenchmarks gemm row {row!r}: batch or tflops unreadable"])
            points.append(
                GemmPoint(
                    shape=GemmShape(m=m, n=n, k=k, batch=batch), flop_per_s=float(tflops) * TERA
                )
            )
        return tuple(points)

    def link_points(self, series: LinkSeries) -> tuple[CollectivePoint, ...]:
        points = []
        for row in self.collectives:
            if (row.get("system"), row.get("op"), row.get("group_size"), row.get("source")) != (
                series.system,
                series.op.value,
                series.group_size,
                series.source,
            ):
                continue
            if row.get("algo") != series.algo:
                continue
            size, busbw = row.get("bytes"), row.get("busbw_GBps")
            if not isinstance(size, int) or not isinstance(busbw, int | float):
                continue
            points.append(
                CollectivePoint(
                    kind=series.op,
                    group_size=series.group_size,
                    size_bytes=float(size),
                    bus_bandwidth_bytes_per_s=float(busbw) * GIGA,
                )
            )
        return tuple(points)

    def stream_rates(self, series: StreamSeries) -> tuple[StreamRate, ...]:
        rates = []
        for row in self.hbm:
            if (row.get("gpu"), row.get("source")) != (series.gpu, series.source):
                continue
            kernel = str(row.get("kernel", "")).rsplit(" ", 1)[-1].lower()
            value = row.get("GBps")
            if kernel in StreamKernel.__members__.values() and isinstance(value, int | float):
                rates.append(StreamRate(kernel=StreamKernel(kernel), bytes_per_s=value * GIGA))
        return tuple(rates)


def load_microbenchmarks(path: Path) -> Microbenchmarks:
    """The ``gemm``, ``collectives`` and ``hbm`` rows of a microbenchmarks.json file."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError([f"{path}: cannot read microbenchmarks ({error})"]) from None
    if not isinstance(document, dict):
        raise ConfigError([f"{path}: expected a JSON object"])
    sections = {}
    for name in ("gemm", "collectives", "hbm"):
        rows = document.get(name)
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            raise ConfigError([f"{path}: section {name!r} must be a list of objects"])
        sections[name] = tuple(rows)
    return Microbenchmarks(
        gemm=sections["gemm"], collectives=sections["collectives"], hbm=sections["hbm"]
    )
