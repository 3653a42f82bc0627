"""The hardware model: :class:`SystemSpec` and the primitive costs every later stage uses.

A system is one accelerator type replicated over nodes::

    SystemSpec
    ├── accelerator: AcceleratorSpec
    │   ├── matrix / vector: ComputeEngineSpec (DatatypeRate(datatype, peak, efficiency) each)
    │   ├── hbm: MemorySpec (capacity, bandwidth, efficiency)
    │   └── offload: MemorySpec | None (Calculon's mem2; host memory)
    ├── node: NodeSpec(gpus_per_node, link: LinkSpec,       intra-node / NVLink domain
    │            nvlink_domain_size=None)                   (NVLink, Infinity Fabric)
    ├── scale_out: LinkSpec                                 per-GPU scale-out NIC (InfiniBand)
    ├── processing_mode: ProcessingMode                     no_overlap (sum) | roofline (max)
    ├── runtime: RuntimeMemory                              CUDA context, NCCL buffers, allocator
    └── network_assignment: ByRankLayout(layout) | FixedTiers(tensor, pipeline, data)

Units are SI throughout: FLOP/s, bytes, bytes/s, seconds. Link bandwidths are per GPU and per
direction (NVLink3's "600 GB/s" is 300 GB/s each way).

Primitive costs (the PortablePlanIR stage costs each task with these):

* ``SystemSpec.compute_time(flops, engine, datatype, shape=None)``: ``flops / (peak *
  efficiency(flops, shape))`` (Calculon ``Processor.throughput``);
* ``SystemSpec.memory_time(size_bytes)``: ``bytes / (hbm_bw * efficiency(bytes))`` (Calculon
  ``Memory.throughput``);
* ``SystemSpec.processing_time(flop_time, mem_time)``: sum (``no_overlap``) or max
  (``roofline``) (Calculon ``System.get_processing_time``);
* ``SystemSpec.op_time(flops, size_bytes, engine, datatype, shape=None)``: the two combined;
* ``SystemSpec.collective_time(kind, size_bytes, group)``: see
  :mod:`blueprinting.hardware.collectives`;
* ``SystemSpec.comm_group(dim, tensor=t, pipeline=p, data=d)`` -> :class:`CommGroup`: the group
  a parallel dimension forms, on the slowest link it spans.

Rank placement (:func:`place_group`): ranks are numbered with the dimensions of a
:class:`RankLayout` from fastest to slowest varying. Megatron-LM's default is ``tp-dp-pp``
(``megatron/core/parallel_state.py``, ``RankGenerator(order="tp-cp-ep-dp-pp")`` without
context/expert parallelism): TP ranks are adjacent, then DP, then PP. Node ``i`` holds ranks
``[i*G, (i+1)*G)`` for ``G`` GPUs per node, NVLink domain ``j`` ranks ``[j*D, (j+1)*D)`` for
``D`` GPUs per domain (``D = G`` unless the NVLink fabric spans hosts, as in an NVL72 rack of 18
four-GPU trays, where ``D`` is the run of ranks the scheduler placed in one rack:
:class:`DomainPlacement`). A group whose ranks all sit in one NVLink domain uses the intra-node
(scale-up) link; otherwise the scale-out network, the slowest link it crosses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from math import ceil, gcd
from typing import TypeAlias, assert_never, final

from blueprinting.errors import ConfigError, UnsupportedError, positive_int_problems
from blueprinting.hardware.attention import AttentionKernelRates
from blueprinting.hardware.collectives import (
    CollectiveCosts,
    CollectiveKind,
    ExchangeKernels,
    collective_alpha_beta,
    collective_link_time,
    ring_collective_costs,
)
from blueprinting.hardware.efficiency import (
    Efficiency,
    GemmShape,
    ShapeFigures,
    efficiency_fraction,
    is_nonnegative,
    is_positive,
)
from blueprinting.hardware.ep_kernels import EpKernelRates, unique_backends
from blueprinting.hardware.host import HostCpu
from blueprinting.hardware.polymorphic import (
    Real,
    maximum,
    nonzero_sizes,
    where_positive,
    zeros_like,
)
from blueprinting.limits import domain_limit_problem
from blueprinting.mapping.model import Datatype
from blueprinting.mapping.precision import AcceleratorSupport, GemmFormat


class Engine(StrEnum):
    """Which compute unit runs an op: tensor cores (GEMM, batched GEMM) or the vector units."""

    MATRIX = "matrix"
    VECTOR = "vector"


class ProcessingMode(StrEnum):
    """How an op's compute and memory times combine (Calculon ``processing_mode``):
    ``no_overlap`` adds them, ``roofline`` takes the larger (Williams et al. 2009)."""

    NO_OVERLAP = "no_overlap"
    ROOFLINE = "roofline"


class LinkTier(StrEnum):
    """``intra_node``: the scale-up link inside one NVLink domain (the node, unless
    ``NodeSpec.nvlink_domain_size`` spans several); ``scale_out``: the per-GPU NIC."""

    INTRA_NODE = "intra_node"
    SCALE_OUT = "scale_out"


class ParallelDim(StrEnum):
    TENSOR = "tp"
    DATA = "dp"
    PIPELINE = "pp"
    #: Megatron's rank order puts cp right after tp (``RankGenerator(order="tp-cp-ep-dp-pp")``,
    #: ``parallel_state.py`` l.617): every layout here places it there.
    CONTEXT = "cp"


class RankLayout(StrEnum):
    """Rank order, fastest-varying dimension first (Megatron's ``order`` string)."""

    TP_DP_PP = "tp-dp-pp"
    TP_PP_DP = "tp-pp-dp"
    DP_TP_PP = "dp-tp-pp"
    DP_PP_TP = "dp-pp-tp"
    PP_TP_DP = "pp-tp-dp"
    PP_DP_TP = "pp-dp-tp"

    @property
    def order(self) -> tuple[ParallelDim, ...]:
        return tuple(ParallelDim(part) for part in self.value.split("-"))

    @property
    def order_with_context(self) -> tuple[ParallelDim, ...]:
        """The order with cp right after tp (see :attr:`ParallelDim.CONTEXT`)."""
        out: list[ParallelDim] = []
        for dim in self.order:
            out.append(dim)
            if dim is ParallelDim.TENSOR:
                out.append(ParallelDim.CONTEXT)
        return tuple(out)


def _require_positive_number(owner: str, **values: float) -> list[str]:
    return [
        f"{owner}.{key} must be a positive number, got {value!r}"
        for key, value in values.items()
        if not is_positive(value)
    ]


# --------------------------------------------------------------------------------------------
# Accelerator
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class DatatypeRate:
    """Dense peak of one engine for one datatype and the fraction ops of a given size reach."""

    datatype: Datatype
    peak_flop_per_s: float
    efficiency: Efficiency

    def __post_init__(self) -> None:
        problems = _require_positive_number("DatatypeRate", peak_flop_per_s=self.peak_flop_per_s)
        if problems:
            raise ConfigError(problems)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeEngineSpec:
    """The rates of one engine, one per supported datatype (each datatype at most once)."""

    rates: tuple[DatatypeRate, ...]

    def __post_init__(self) -> None:
        seen = [rate.datatype for rate in self.rates]
        if len(set(seen)) != len(seen):
            raise ConfigError([f"ComputeEngineSpec lists a datatype twice: {seen}"])

    def rate(self, datatype: Datatype) -> DatatypeRate:
        for rate in self.rates:
            if rate.datatype == datatype:
                return rate
        supported = ", ".join(rate.datatype.value for rate in self.rates) or "none"
        raise UnsupportedError(
            f"checking datatype: this engine has no {datatype.value} rate (has: {supported})"
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class GemmFormatRate:
    """Dense peak and achieved fraction of the tensor cores in one low-precision GEMM format
    (:class:`~blueprinting.mapping.precision.GemmFormat`): what Transformer Engine's linear
    layers run at under an FP8 / FP4 recipe."""

    format: GemmFormat
    peak_flop_per_s: float
    efficiency: Efficiency

    def __post_init__(self) -> None:
        problems = _require_positive_number("GemmFormatRate", peak_flop_per_s=self.peak_flop_per_s)
        if problems:
            raise ConfigError(problems)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MemorySpec:
    capacity_bytes: float
    bandwidth_bytes_per_s: float
    efficiency: Efficiency

    def __post_init__(self) -> None:
        problems = _require_positive_number(
            "MemorySpec",
            capacity_bytes=self.capacity_bytes,
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s,
        )
        if problems:
            raise ConfigError(problems)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AcceleratorSpec:
    name: str
    matrix: ComputeEngineSpec
    vector: ComputeEngineSpec
    hbm: MemorySpec
    offload: MemorySpec | None = None
    #: Measured fused-attention throughput; ``None``: a fused kernel is timed as its matrix
    #: products at the GEMM efficiency (:meth:`SystemSpec.attention_time`).
    attention: AttentionKernelRates | None = None
    #: Streaming multiprocessors (datasheet), for the share a communication kernel takes from a
    #: GEMM (Transformer Engine userbuffer overlap); ``None``: unknown, no SM share is charged.
    sm_count: int | None = None
    #: The low-precision GEMM formats the tensor cores run (each at most once); a recipe whose
    #: format is missing is refused by the ``precision_recipe_accelerator`` law.
    low_precision: tuple[GemmFormatRate, ...] = ()

    def __post_init__(self) -> None:
        if self.sm_count is not None and self.sm_count < 1:
            raise ConfigError(f"accelerator sm_count must be positive, got {self.sm_count}")
        seen = [rate.format for rate in self.low_precision]
        if len(set(seen)) != len(seen):
            raise ConfigError([f"accelerator lists a low-precision GEMM format twice: {seen}"])

    @property
    def support(self) -> AcceleratorSupport:
        """Its name and low-precision formats, for the precision laws."""
        return AcceleratorSupport(
            name=self.name, formats=frozenset(rate.format for rate in self.low_precision)
        )

    def low_precision_rate(self, gemm_format: GemmFormat) -> GemmFormatRate:
        for rate in self.low_precision:
            if rate.format is gemm_format:
                return rate
        supported = ", ".join(rate.format.value for rate in self.low_precision) or "none"
        raise UnsupportedError(
            f"checking GEMM format: {self.name} has no {gemm_format.value} rate (has: {supported})"
        )

    def engine(self, engine: Engine) -> ComputeEngineSpec:
        match engine:
            case Engine.MATRIX:
                return self.matrix
            case Engine.VECTOR:
                return self.vector
            case _ as unreachable:
                assert_never(unreachable)


# --------------------------------------------------------------------------------------------
# Links and nodes
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSpec:
    """One network tier as one GPU sees it.

    ``bandwidth_bytes_per_s`` is per GPU per direction; ``efficiency`` the achieved fraction of it
    (by message size); ``costs`` the per-collective wire factors. ``processor_usage`` is the
    fraction of compute throughput a running collective steals (Calculon's ``processor_usage``,
    used only by overlap models). ``all_to_all_efficiency``: the fraction NCCL's all-to-all
    reaches where it was measured apart from the ring collectives (None: ``efficiency``;
    :func:`~blueprinting.hardware.collectives.link_efficiency`); on the scale-out link it is the
    NIC's share, the bytes :meth:`SystemSpec.all_to_all_time` sends over it.
    """

    bandwidth_bytes_per_s: float
    latency_s: float
    efficiency: Efficiency
    costs: CollectiveCosts = field(default_factory=ring_collective_costs)
    processor_usage: float = 0.0
    all_to_all_efficiency: Efficiency | None = None

    def __post_init__(self) -> None:
        problems = _require_positive_number(
            "LinkSpec", bandwidth_bytes_per_s=self.bandwidth_bytes_per_s
        )
        if not is_nonnegative(self.latency_s):
            problems.append(f"LinkSpec.latency_s must be >= 0, got {self.latency_s!r}")
        if not (is_nonnegative(self.processor_usage) and self.processor_usage < 1):
            problems.append(
                f"LinkSpec.processor_usage must be in [0, 1), got {self.processor_usage!r}"
            )
        if problems:
            raise ConfigError(problems)


class DomainPlacement(StrEnum):
    """How a job's nodes sit in NVLink domains that span several hosts (a system fact about the
    scheduler, not the hardware; it only matters when ``nvlink_domain_size`` exceeds the node).

    - ``segmented``: the job's nodes come in equal segments, each inside one domain, of the
      largest size that divides the node count and fits a domain; ranks fill the segments in
      order. Megatron-Bridge's launcher asks Slurm for exactly this on 4-GPU-tray systems
      (``scripts/performance/utils/executors.py`` @023219ed ``slurm_executor``: ``segment =
      nodes`` up to 18 nodes, else the largest divisor of ``nodes`` that is <= 18, passed as
      ``sbatch --segment``), and Slurm's topology/block plugin places each segment in one block
      (rack); MLPerf's GB200/GB300 configs set ``SEGMENT=16``. A 256-GPU job on NVL72 racks is
      4 segments of 16 trays: 64-GPU domains. On a system whose domain is the node this is
      the node.
    - ``packed``: consecutive ranks fill whole domains (a job given complete racks)."""

    SEGMENTED = "segmented"
    PACKED = "packed"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """A host (``gpus_per_node`` GPUs: a DGX, or one compute tray of an NVL72 rack) and the
    scale-up link its GPUs use.

    ``nvlink_domain_size`` is the number of GPUs that share one NVLink fabric, when that fabric
    spans several hosts: 72 for a GB200 / GB300 NVL72 rack of 18 trays of 4 GPUs
    (``shared/reference/modern_parallelism.md`` section 3.7). ``None``: the domain is the node
    (every 8-GPU DGX / HGX and the MI300X platform). A group whose ranks all sit in one domain
    uses ``link``; the node keeps its meaning everywhere else (ranks per host, the search's
    default TP limit). ``domain_placement``: how a job's nodes fill the domains
    (:class:`DomainPlacement`); :meth:`placed_domain_size` is the run of consecutive ranks
    that shares one domain in a job of ``world`` GPUs.
    """

    gpus_per_node: int
    link: LinkSpec
    nvlink_domain_size: int | None = None
    domain_placement: DomainPlacement = DomainPlacement.SEGMENTED
    #: Measured dispatch / combine rates of the expert-parallel libraries inside one NVLink
    #: domain (:mod:`blueprinting.hardware.ep_kernels`), each library at most once; a flex
    #: dispatcher whose library is not listed is timed by the link model.
    ep_kernels: tuple[EpKernelRates, ...] = ()

    def __post_init__(self) -> None:
        problems = positive_int_problems("NodeSpec", gpus_per_node=self.gpus_per_node)
        if not problems and (
            too_many := domain_limit_problem("NodeSpec.gpus_per_node", self.gpus_per_node)
        ):
            problems.append(too_many)
        problems += unique_backends(self.ep_kernels)
        domain = self.nvlink_domain_size
        if domain is not None:
            domain_problems = positive_int_problems("NodeSpec", nvlink_domain_size=domain)
            if not domain_problems and (
                too_many := domain_limit_problem("NodeSpec.nvlink_domain_size", domain)
            ):
                domain_problems.append(too_many)
            problems += domain_problems
            if not domain_problems and not problems and domain % self.gpus_per_node != 0:
                problems.append(
                    f"NodeSpec.nvlink_domain_size must be a multiple of gpus_per_node "
                    f"({self.gpus_per_node}), got {domain}"
                )
        if problems:
            raise ConfigError(problems)

    @property
    def domain_size(self) -> int:
        """GPUs per NVLink domain: ``nvlink_domain_size``, or the node when that is ``None``."""
        return self.gpus_per_node if self.nvlink_domain_size is None else self.nvlink_domain_size

    def placed_domain_size(self, world: int) -> int:
        """The consecutive ranks of a ``world``-GPU job that share one NVLink domain: the
        domain (``packed``), or the segment the scheduler placed in one (``segmented``:
        every node of a job that fits one domain, else the largest divisor of the node count
        that fits; 1 node when none but 1 does)."""
        g = self.gpus_per_node
        match self.domain_placement:
            case DomainPlacement.PACKED:
                return self.domain_size
            case DomainPlacement.SEGMENTED:
                nodes = -(-world // g)
                fits = self.domain_size // g
                if nodes <= fits:
                    return nodes * g
                return g * max(d for d in range(1, fits + 1) if nodes % d == 0)
            case _ as unreachable:
                assert_never(unreachable)


# --------------------------------------------------------------------------------------------
# Which link each parallel group uses
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ByRankLayout:
    """Derive each group's link from the rank order and the node size (:func:`place_group`)."""

    layout: RankLayout = RankLayout.TP_DP_PP

    def __str__(self) -> str:
        return str(self.layout)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FixedTiers:
    """Each dimension's link given explicitly, as Calculon's ``tensor_par_net``,
    ``pipeline_par_net`` and ``data_par_net`` do. Ranks per node are then unknown (reported as 1
    for scale-out groups, the group size for intra-node ones)."""

    tensor: LinkTier
    pipeline: LinkTier
    data: LinkTier

    def tier(self, dim: ParallelDim) -> LinkTier:
        match dim:
            case ParallelDim.TENSOR:
                return self.tensor
            case ParallelDim.PIPELINE:
                return self.pipeline
            case ParallelDim.DATA:
                return self.data
            case ParallelDim.CONTEXT:
                # Calculon's files predate cp; Megatron places it beside tp.
                return self.tensor
            case _ as unreachable:
                assert_never(unreachable)

    def __str__(self) -> str:
        return f"tp:{self.tensor} pp:{self.pipeline} dp:{self.data}"


NetworkAssignment: TypeAlias = ByRankLayout | FixedTiers


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CommGroup:
    """A communicator: ``size`` ranks on link ``tier``; ``ranks_per_node``: the fewest of them
    any group has in one of its hosts (1 when every rank is on its own node);
    ``ranks_per_domain``: the same count per NVLink domain as the job is placed
    (:meth:`NodeSpec.placed_domain_size`), the members a rank reaches over NVLink (``size``
    on an intra-node group; equal to ``ranks_per_node`` where the domain is the node)."""

    size: int
    tier: LinkTier
    ranks_per_node: int
    ranks_per_domain: int

    def __post_init__(self) -> None:
        problems = positive_int_problems(
            "CommGroup",
            size=self.size,
            ranks_per_node=self.ranks_per_node,
            ranks_per_domain=self.ranks_per_domain,
        )
        if not problems and not (self.ranks_per_node <= self.ranks_per_domain <= self.size):
            problems.append(
                "CommGroup needs ranks_per_node <= ranks_per_domain <= size (a domain holds "
                f"whole nodes), got {self.ranks_per_node}, {self.ranks_per_domain}, {self.size}"
            )
        if problems:
            raise ConfigError(problems)

    def __str__(self) -> str:
        return f"{self.size}@{self.tier}"


def _fixed_group(size: int, tier: LinkTier) -> CommGroup:
    """A group on a fixed tier: its placement is unknown, so an intra-node group holds all its
    ranks in one node and a scale-out one is counted one rank per node."""
    per_node = size if tier == LinkTier.INTRA_NODE else 1
    return CommGroup(size=size, tier=tier, ranks_per_node=per_node, ranks_per_domain=per_node)


def _degree(dim: ParallelDim, tensor: int, pipeline: int, data: int, context: int = 1) -> int:
    match dim:
        case ParallelDim.TENSOR:
            return tensor
        case ParallelDim.PIPELINE:
            return pipeline
        case ParallelDim.DATA:
            return data
        case ParallelDim.CONTEXT:
            return context
        case _ as unreachable:
            assert_never(unreachable)


@lru_cache(maxsize=4096)
def place_group(
    layout: RankLayout,
    dim: ParallelDim,
    *,
    tensor: int,
    pipeline: int,
    data: int,
    gpus_per_node: int,
    nvlink_domain_size: int | None = None,
    context: int = 1,
    level: tuple[int, int] | None = None,
) -> CommGroup:
    """The group of dimension ``dim`` under ``layout``: its link and ranks per node.

    ``level = (size, inner)`` selects a sub-group of the cp group instead: ``size`` ranks
    ``inner`` cp ranks apart (the a2a level of a2a+p2p is ``(a2a, 1)``, its ring ``(p2p,
    a2a)``).

    A group's ranks are ``base + i * stride`` (``i < n``) with ``stride`` the product of the
    degrees of the dimensions faster than ``dim``. With ``G`` GPUs per node: if ``stride`` is a
    multiple of ``G`` every rank is on its own node; if ``c = G / stride`` is an integer and
    ``c`` divides ``n`` (or ``n`` divides ``c``) runs of ``c`` (or all ``n``) members share a
    node. Otherwise every group is enumerated. ``ranks_per_node`` is the fewest members any
    group has in one of its nodes (the per-node share of the slowest group). The same count
    with ``G`` = the NVLink domain (``nvlink_domain_size``: consecutive blocks of that many
    ranks, as the job is placed, :meth:`NodeSpec.placed_domain_size`; ``None``: the node) is
    ``ranks_per_domain`` and decides the link: the group uses the scale-out link iff any group
    spans more than one domain.
    """
    problems = positive_int_problems(
        "place_group",
        tensor=tensor,
        pipeline=pipeline,
        data=data,
        context=context,
        gpus_per_node=gpus_per_node,
    )
    domain = gpus_per_node if nvlink_domain_size is None else nvlink_domain_size
    problems += positive_int_problems("place_group", nvlink_domain_size=domain)
    if problems:
        raise ConfigError(problems)
    size = _degree(dim, tensor, pipeline, data, context)
    stride = 1
    for faster in layout.order_with_context:
        if faster == dim:
            break
        stride *= _degree(faster, tensor, pipeline, data, context)
    if level is not None:
        size, inner = level
        stride *= inner
    if size == 1:
        return _SINGLE
    world = tensor * pipeline * data * context
    return _placed(size, stride, world, gpus_per_node, domain)


_SINGLE = CommGroup(size=1, tier=LinkTier.INTRA_NODE, ranks_per_node=1, ranks_per_domain=1)


def _placed(size: int, stride: int, world: int, gpus_per_node: int, domain: int) -> CommGroup:
    """Groups of ``size`` ranks ``stride`` apart in blocks of ``gpus_per_node`` (hosts) and
    ``domain`` (NVLink domains) consecutive ranks: on the scale-out link iff any spans two
    domains."""
    per_node, _ = _spread(size, stride, world, gpus_per_node)
    per_domain, spans_domains = _spread(size, stride, world, domain)
    tier = LinkTier.SCALE_OUT if spans_domains else LinkTier.INTRA_NODE
    return CommGroup(
        size=size, tier=tier, ranks_per_node=per_node, ranks_per_domain=max(per_node, per_domain)
    )


def _spread(size: int, stride: int, world: int, unit: int) -> tuple[int, bool]:
    """(fewest members any group has in one block of ``unit`` consecutive ranks, whether any
    group spans more than one block) for groups of ``size`` ranks ``stride`` apart."""
    per_unit_if_aligned = unit // stride if unit % stride == 0 else 0
    if stride % unit == 0:
        return 1, True
    if per_unit_if_aligned and size % per_unit_if_aligned == 0:
        # Groups start at multiples of size * stride, so unit-aligned runs fill whole units.
        return per_unit_if_aligned, size > per_unit_if_aligned
    if per_unit_if_aligned and per_unit_if_aligned % size == 0:
        return size, False
    return _enumerate_groups(size, stride, world, unit)


def _enumerate_groups(size: int, stride: int, world: int, gpus_per_node: int) -> tuple[int, bool]:
    """(fewest members any group has on one of its nodes, whether any group spans nodes) for
    the groups ``base + i * stride`` (``i < size``), over every base rank of a ``world``-rank
    layout, without enumerating ranks or members (world and the node size can be huge).

    The groups of one "high" coordinate tile a block of ``P = size x stride`` consecutive ranks,
    one group per residue class mod ``stride``. A node boundary cuts a block into pieces; on a
    piece of ``len`` ranks every class present holds ``len // stride`` or one more members
    (exactly one where ``len < stride``), so the fewest members a group has on that piece is
    ``max(1, len // stride)``, and a cut block (with ``size > 1``) always has a group on both
    sides. A block's pieces depend only on its offset ``o = hi x P mod G``, and the offsets
    repeat after ``G / gcd(P, G)`` blocks: at most ``G`` distinct offsets are examined."""
    g = gpus_per_node
    if stride >= g:
        return 1, size > 1
    import numpy as np

    period = stride * size
    blocks = world // period
    offsets = np.unique(
        (np.arange(min(blocks, g // gcd(period, g)), dtype=np.int64) * (period % g)) % g
    )
    # cut: the block runs past its first node's end (o + P > G; g - P may be very negative)
    cut = offsets[offsets > g - period] if period > 0 else offsets[:0]
    if cut.size == 0:
        return size, False
    fewest = size
    first = int((g - cut).min())  # the piece on the block's first node
    fewest = min(fewest, max(1, first // stride))
    ends = (cut + period % g) % g  # the piece on its last node (0: the block ends on a boundary)
    if (ends > 0).any():
        fewest = min(fewest, max(1, int(ends[ends > 0].min()) // stride))
    if (cut >= 2 * g - period).any():  # a whole node inside the block
        fewest = min(fewest, g // stride)
    return fewest, size > 1


def _enumerate_groups_by_rank(
    size: int, stride: int, world: int, gpus_per_unit: int
) -> tuple[int, bool]:
    """:func:`_enumerate_groups` by visiting every rank (the definition; tests compare them)."""
    fewest = size
    spans = False
    for base in range(world):
        # A group's base rank has coordinate 0 in this dimension.
        if (base // stride) % size != 0:
            continue
        counts: dict[int, int] = {}
        for i in range(size):
            unit = (base + i * stride) // gpus_per_unit
            counts[unit] = counts.get(unit, 0) + 1
        fewest = min(fewest, *counts.values())
        spans = spans or len(counts) > 1
    return fewest, spans


# --------------------------------------------------------------------------------------------
# The system
# --------------------------------------------------------------------------------------------
MIB = 2**20


# NCCL's device buffers, every constant read from NVIDIA/nccl v2.27.7-1 @593de54e52679b514285
# 71c13271e2ea9f91b1b1 (the NCCL 2.27 line of the 2025 NGC PyTorch containers Megatron-Core 0.14
# runs in). Sizes are bytes of device memory one rank allocates.
NCCL_SOURCE = "NVIDIA/nccl v2.27.7-1 @593de54e52679b51428571c13271e2ea9f91b1b1"
_NCCL_STEPS = 8  # src/include/device.h NCCL_STEPS
#: src/init.cc DEFAULT_LL_BUFFSIZE: NCCL_LL_LINES_PER_THREAD (8) x NCCL_LL_MAX_NTHREADS (512) x
#: NCCL_STEPS x sizeof(ncclLLFifoLine) (16)
NCCL_LL_BUFFSIZE = 8 * 512 * _NCCL_STEPS * 16
#: src/init.cc DEFAULT_LL128_BUFFSIZE: NCCL_LL128_ELEMS_PER_THREAD (120) x NCCL_LL128_MAX_NTHREADS
#: (640) x NCCL_STEPS x sizeof(uint64_t)
NCCL_LL128_BUFFSIZE = 120 * 640 * _NCCL_STEPS * 8
NCCL_SIMPLE_BUFFSIZE = 1 << 22  # src/init.cc DEFAULT_BUFFSIZE (NCCL_BUFFSIZE), 4 MiB
_NCCL_CONN_MEM = 4096  # sizeof(ncclSendMem) == sizeof(ncclRecvMem): unions padded to MEM_ALIGN
_CUDA_IPC_MIN = 2 * 2**20  # src/include/comm.h CUDA_IPC_MIN: every connection's allocation unit


def _ipc_aligned(size: int) -> int:
    return -(-size // _CUDA_IPC_MIN) * _CUDA_IPC_MIN


#: src/transport/p2p.cc p2pSendSetup / p2pRecvSetup (NVLink and PCIe peers): the sender holds
#: its ncclSendMem, the receiver its ncclRecvMem and the LL, LL128 and SIMPLE buffers, each
#: rounded up to CUDA_IPC_MIN: 2,097,152 and 10,485,760 bytes, the two sizes NVIDIA/nccl #1685
#: logs on 8 x H100. (With P2P read, NCCL's choice on Ampere NVLink, the SIMPLE buffer moves to
#: the sender: 6 + 6 MiB, the same 12 MiB per connection.)
NCCL_P2P_SEND_BYTES = _ipc_aligned(_NCCL_CONN_MEM)
NCCL_P2P_RECV_BYTES = _ipc_aligned(
    _NCCL_CONN_MEM + NCCL_LL_BUFFSIZE + NCCL_LL128_BUFFSIZE + NCCL_SIMPLE_BUFFSIZE
)
#: src/transport/net.cc sendProxySetup / recvProxySetup with GPUDirect RDMA (the DGX networks):
#: dedicated ring buffers, the sender's LL128 and SIMPLE and the receiver's LL, LL128 and SIMPLE
#: in device memory (ncclSendMem / ncclRecvMem in host memory), each rounded to CUDA_IPC_MIN.
NCCL_NET_SEND_BYTES = _ipc_aligned(NCCL_LL128_BUFFSIZE + NCCL_SIMPLE_BUFFSIZE)
NCCL_NET_RECV_BYTES = _ipc_aligned(NCCL_LL_BUFFSIZE + NCCL_LL128_BUFFSIZE + NCCL_SIMPLE_BUFFSIZE)
#: src/transport/net.cc sharedNetBuffersInit: send / receive over the network share one pool
#: per direction, p2pnChannels x NCCL_SHARED_STEPS (16) x the network P2P chunk
#: (src/init.cc NCCL_P2P_NET_CHUNKSIZE, 128 KiB) bytes, whatever the number of remote peers.
_NCCL_SHARED_STEPS = 16
_NCCL_P2P_NET_CHUNK = 1 << 17
#: src/transport/nvls.cc ncclNvlsBufferSetup: per NVLS channel and head, a reduce and a
#: broadcast buffer of NCCL_NVLS_CHUNKSIZE (128 KiB) x NCCL_STEPS: 2 MiB of unicast memory
#: bound to the multicast object (the multicast mapping itself holds no memory of its own).
NCCL_NVLS_BYTES_PER_CHANNEL_HEAD = 2 * (1 << 17) * _NCCL_STEPS
_NCCL_NVLS_CREDIT = 64  # ncclNvlsSetup: memSize of one credit slot, per channel, head, direction
_NCCL_MAX_NVLS_ARITY = 32  # src/include/device.h: at most 32 NVLS heads


def _pow2_up(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ScalarCollectives:
    """A communicator whose collectives carry a few values (start-up barriers, loss, timer and
    gradient-norm reductions): NCCL picks its ring (LL) for them, and with runtime connection
    (src/init.cc NCCL_RUNTIME_CONNECT, on by default since 2.22) connects nothing else."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class BulkCollectives:
    """A communicator that also reduces or gathers large tensors (TP activations, DP gradients
    and parameters, the embedding gradient, CP's K/V): the ring, and NVLS where the tuner can
    choose it."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PeerSends:
    """A communicator used for send / receive with ``peers`` ranks of it (a pipeline stage's
    one or two neighbours; an all-to-all's every other member)."""

    peers: int

    def __post_init__(self) -> None:
        problems = positive_int_problems("PeerSends", peers=self.peers)
        if problems:
            raise ConfigError(problems)


CommunicatorUse: TypeAlias = ScalarCollectives | BulkCollectives | PeerSends


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Communicator:
    """One NCCL communicator as a rank sees it: ``size`` ranks, ``in_domain`` of them (the rank
    included) in the rank's NVLink domain, used as ``use`` says."""

    size: int
    in_domain: int
    use: CommunicatorUse

    def __post_init__(self) -> None:
        problems = positive_int_problems("Communicator", size=self.size, in_domain=self.in_domain)
        if not problems and self.in_domain > self.size:
            problems.append(
                f"Communicator needs in_domain <= size, got {self.in_domain} > {self.size}"
            )
        if problems:
            raise ConfigError(problems)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class NcclByTransport:
    """NCCL's buffers counted by the transport each communicator uses (:data:`NCCL_SOURCE`),
    from the channel counts NCCL derives for the system: ``ring_channels``, the ring's channels
    inside an NVLink domain (src/graph/search.cc ncclTopoCompute: the fastest per-channel speed
    of the SM's speed array whose channels fit the GPU's NVLink bandwidth, ncclTopoDupChannels
    doubling them, src/graph/connect.cc ncclTopoPostset doubling again; H100, 18 NVLinks x
    20.6 GB/s (graph/topo.h SM90_NVLINK_BW): 6 x 60 GB/s -> 12 -> 24; A100, 12 x 20: 6 x 40 ->
    12 -> 24, the 24 channels nccl-tests #100 logs on an HGX A100); ``p2p_channels_per_peer``
    (src/graph/paths.cc ncclTopoComputeP2pChannels: the next power of two of the ring's channels,
    at most 2 per NVLink to the peer: 32 on H100 and A100, the 32 channels per peer NVIDIA/nccl
    #1685 logs); ``nvls_channels``, NVLink SHARP's channels (src/transport/nvls.cc:
    NVLS_NCHANNELS_SM90 16, NVLS_NCHANNELS_SM100_NVL 24 on one node or NVLink domain; 0 where the
    system has no NVSwitch multicast or runs with ``NCCL_NVLS_ENABLE=0``, which
    NeMo-Framework-Launcher PR #127 and JAX-Toolbox PR #383 set "for memory saving")."""

    ring_channels: int = 24
    p2p_channels_per_peer: int = 32
    nvls_channels: int = 0

    def __post_init__(self) -> None:
        # a ring or a send / receive pair needs a channel (NCCL opens at least one); NVLS may be
        # off (0: NCCL_NVLS_ENABLE=0)
        bad = [
            f"NcclByTransport.{name} must be a positive integer, got {value!r}"
            for name, value in (
                ("ring_channels", self.ring_channels),
                ("p2p_channels_per_peer", self.p2p_channels_per_peer),
            )
            if type(value) is not int or value < 1
        ]
        if type(self.nvls_channels) is not int or self.nvls_channels < 0:
            bad.append(
                f"NcclByTransport.nvls_channels must be a non-negative integer, got "
                f"{self.nvls_channels!r}"
            )
        if bad:
            raise ConfigError(bad)

    def bytes_of(self, communicator: Communicator) -> int:
        """NCCL's device buffers on one rank for ``communicator`` (size > 1), once it has run
        what its ``use`` says:

        - a ring channel: one send and one receive connection, over NVLink
          (:data:`NCCL_P2P_SEND_BYTES` + :data:`NCCL_P2P_RECV_BYTES`, 12 MiB) or, on the
          channels where the rank is its NVLink domain's way out, over the network
          (:data:`NCCL_NET_SEND_BYTES` + :data:`NCCL_NET_RECV_BYTES`, 20 MiB): a ring through
          domains of ``c`` members crosses out of each once per channel, so ``ceil(R / c)`` of a
          rank's ``R`` channels are network ones;
        - NVLS (bulk collectives, more than two members in the domain: src/transport/nvls.cc
          ncclNvlsInit returns for two GPUs or fewer): channels x heads x 2 MiB, one head per
          member in the domain (src/graph/search.cc: the NVLS graph's channels are its GPUs,
          at most 32), and the credits, each allocation rounded to the 2 MiB granularity;
        - send / receive: per peer in the domain, ``p2p_channels_per_peer`` send and receive
          connections (12 MiB each pair); the peers outside share the network P2P pools (one
          per direction, ``pow2(R)`` x 16 x 128 KiB).

        Not counted: tree connections (the tuner can pick the tree for mid-sized all-reduces,
        one parent and up to three children per channel), CollNet, the per-communicator
        device structures (a few KiB per channel), and NCCL's host memory."""
        size, in_domain = communicator.size, communicator.in_domain
        match communicator.use:
            case ScalarCollectives():
                return self._ring_bytes(size, in_domain)
            case BulkCollectives():
                return self._ring_bytes(size, in_domain) + self._nvls_bytes(in_domain)
            case PeerSends(peers=peers):
                inside = min(peers, in_domain - 1)
                local = inside * self.p2p_channels_per_peer
                remote = (
                    2 * _pow2_up(self.ring_channels) * _NCCL_SHARED_STEPS * _NCCL_P2P_NET_CHUNK
                    if peers > inside
                    else 0
                )
                return local * (NCCL_P2P_SEND_BYTES + NCCL_P2P_RECV_BYTES) + remote
            case _ as unreachable:
                assert_never(unreachable)

    def _ring_bytes(self, size: int, in_domain: int) -> int:
        channels = self.ring_channels
        network = 0 if in_domain == size else -(-channels // in_domain)
        return (channels - network) * (NCCL_P2P_SEND_BYTES + NCCL_P2P_RECV_BYTES) + network * (
            NCCL_NET_SEND_BYTES + NCCL_NET_RECV_BYTES
        )

    def _nvls_bytes(self, in_domain: int) -> int:
        if self.nvls_channels == 0 or in_domain <= 2:
            return 0
        heads = min(in_domain, _NCCL_MAX_NVLS_ARITY)
        buffers = self.nvls_channels * heads * NCCL_NVLS_BYTES_PER_CHANNEL_HEAD
        credits = self.nvls_channels * 2 * _NCCL_NVLS_CREDIT * heads
        return _ipc_aligned(buffers) + _ipc_aligned(credits)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class NcclPerCommunicator:
    """NCCL's buffers as one measured figure per communicator that has run a collective,
    whatever its transport: ``bytes_per_communicator`` for a group of more than two ranks,
    ``bytes_per_pair_communicator`` for two (688 MB and 544 MB measured on 4 A100 with NVLink,
    one 4 MB all-reduce per group: NVIDIA/nccl #964). The model before issue 19's transport
    count, kept for the system files that give a measurement of their own
    (``[system.runtime] nccl_bytes_per_communicator`` / ``nccl_bytes_per_pair_communicator``)."""

    bytes_per_communicator: int = 688_000_000
    bytes_per_pair_communicator: int = 544_000_000

    def __post_init__(self) -> None:
        bad = [
            f"NcclPerCommunicator.{name} must be a non-negative integer (bytes), got {value!r}"
            for name, value in (
                ("bytes_per_communicator", self.bytes_per_communicator),
                ("bytes_per_pair_communicator", self.bytes_per_pair_communicator),
            )
            if type(value) is not int or value < 0
        ]
        if bad:
            raise ConfigError(bad)

    def bytes_of(self, communicator: Communicator) -> int:
        """The measured figure of ``communicator``'s size class (size > 1)."""
        if communicator.size == 2:
            return self.bytes_per_pair_communicator
        return self.bytes_per_communicator


NcclBuffers: TypeAlias = NcclByTransport | NcclPerCommunicator
#: NCCL's ``MAXCHANNELS`` (``src/include/device.h``): no kernel runs more channels.
NCCL_MAX_CHANNELS = 64


def held_sm_overhead(held: int | None, sm_count: int | None) -> float:
    """``f / (1 - f)`` for ``f = held / sm_count``: what a kernel holding ``held`` SMs adds, per
    second it runs beside them, to compute that needs every SM (the first-order rule of the
    hidden collectives: data-parallel buckets, context parallelism's P2P ring); 0 where either
    count is unknown or the kernel would hold every SM."""
    if held is None or sm_count is None or held >= sm_count:
        return 0.0
    return held / (sm_count - held)


#: ``NCCL_P2P_PER_CHANNEL_NET_BW`` (GB/s; ``src/graph/paths.cc``): a network peer's P2P
#: channels are its NIC bandwidth over this.
NCCL_P2P_PER_CHANNEL_NET_GBPS = 14


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeMemory:
    """Device memory a training process holds beside its tensors, per GPU.

    - ``cuda_context_bytes``: the CUDA context with lazily loaded kernels (CUDA >= 11.7, PyTorch's
      default ``CUDA_MODULE_LOADING=LAZY``): 287,047,680 bytes measured with one tensor
      (pytorch/pytorch PR #86509), "around 400MB" per the PyTorch maintainers
      (pytorch/pytorch #109888), 426 MiB on an RTX 6000 Ada (unslothai/unsloth-zoo PR #1053).
      Default 512 MiB: the 426 MiB reading plus the kernels of Transformer Engine, cuDNN and
      cuBLAS a training step loads. Outside the caching allocator (nvidia-smi sees it,
      ``max_memory_reserved`` does not).
    - ``nccl``: NCCL's buffers (:meth:`nccl_bytes`), outside the allocator: counted by
      transport from the system's channel counts (:class:`NcclByTransport`, the default), or a
      measured figure per communicator (:class:`NcclPerCommunicator`).
    - ``workspace_bytes``: cuBLAS / cuBLASLt workspaces, which PyTorch allocates through its
      caching allocator (``CUBLAS_WORKSPACE_CONFIG`` default ``:4096:8``, 8 x 4 MiB per handle;
      Transformer Engine's cuBLASLt workspace, 32 MiB on Hopper): 64 MiB, inside the allocator.
    """

    cuda_context_bytes: int = 512 * MIB
    nccl: NcclBuffers = field(default_factory=NcclByTransport)
    workspace_bytes: int = 64 * MIB

    def __post_init__(self) -> None:
        bad = [
            f"RuntimeMemory.{name} must be a non-negative integer (bytes), got {value!r}"
            for name, value in (
                ("cuda_context_bytes", self.cuda_context_bytes),
                ("workspace_bytes", self.workspace_bytes),
            )
            if type(value) is not int or value < 0
        ]
        if bad:
            raise ConfigError(bad)

    def nccl_bytes(self, communicator: Communicator) -> int:
        """NCCL's device buffers on one rank for ``communicator`` (none for a single rank: no
        NCCL communicator runs there), by the system's :attr:`nccl` model."""
        if communicator.size <= 1:
            return 0
        match self.nccl:
            case NcclByTransport() | NcclPerCommunicator() as model:
                return model.bytes_of(communicator)
            case _ as unreachable:
                assert_never(unreachable)

    @property
    def nccl_ring_ctas(self) -> int | None:
        """The thread blocks, one SM each, NCCL's ring collective kernel (all-reduce,
        reduce-scatter, all-gather of a large message) runs: one per channel of the launch
        (NVIDIA/nccl @5067397c ``src/enqueue.cc`` ``ncclLaunchKernel``: ``grid`` = the plan's
        channels; the tuner gives a large message every ring channel), the ring's channels of
        :class:`NcclByTransport`: 24 on A100 and H100, 16 on H800, 32 on Blackwell. None for a
        measured per-communicator figure."""
        match self.nccl:
            case NcclByTransport(ring_channels=ring):
                return ring
            case NcclPerCommunicator():
                return None
            case _ as unreachable:
                assert_never(unreachable)

    @property
    def nccl_p2p_ctas(self) -> int | None:
        """The thread blocks, one SM each, NCCL's grouped send / receive kernel (an all-to-all
        over every peer) runs while it moves its bytes: ``p2pnChannels``, the next power of two
        of the ring's channels, at most ``MAXCHANNELS`` = 64 (NVIDIA/nccl @5067397c
        ``src/graph/paths.cc`` ``ncclTopoComputeP2pChannels``, ``src/include/device.h``; every
        channel carries some peer's part, ``ncclP2pChannelForPart``, and ``src/enqueue.cc``
        ``ncclLaunchKernel`` launches one block per channel): 32 on H100, A100 and
        Blackwell, 16 on H800. None where the system gives NCCL's buffers as a measured figure
        (:class:`NcclPerCommunicator`: no channel count)."""
        match self.nccl:
            case NcclByTransport(ring_channels=ring):
                return min(NCCL_MAX_CHANNELS, 1 << (ring - 1).bit_length())
            case NcclPerCommunicator():
                return None
            case _ as unreachable:
                assert_never(unreachable)


def members_in_domain(*, size: int, stride: int, world: int, domain: int) -> int:
    """The fewest members any group of ``size`` ranks ``stride`` apart in a ``world``-rank job
    has in one NVLink domain of ``domain`` consecutive ranks (the placement of :func:`_placed`)."""
    if size == 1:
        return 1
    fewest, spans = _spread(size, stride, world, domain)
    return fewest if spans else size


def _rate_time(
    flops: Real, peak_flop_per_s: float, efficiency: Efficiency, shape: ShapeFigures[Real] | None
) -> Real:
    """``flops / (peak * efficiency(flops, shape))``, 0 at 0 FLOPs."""
    # Evaluated at 1 FLOP where a column holds 0 (a value where_positive discards).
    size = nonzero_sizes(flops, "op FLOPs must be >= 0")
    if size is None:
        return zeros_like(flops)
    fraction = efficiency_fraction(efficiency, size, shape)
    return where_positive(flops, size / (peak_flop_per_s * fraction), 0.0)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class HostLink:
    """A GPU's link to its host's memory, per GPU and per direction, as its copy engines move
    pinned memory (``cudaMemcpyAsync``, the copies activation offloading issues): what
    layer-wise CPU offloading is timed by (:mod:`blueprinting.analysis.offload`). ``source``
    names the measurement."""

    device_to_host_bytes_per_s: float
    host_to_device_bytes_per_s: float
    source: str = ""

    def __post_init__(self) -> None:
        bad = [
            f"HostLink.{name} must be a positive finite number (bytes/s), got {value!r}"
            for name, value in (
                ("device_to_host_bytes_per_s", self.device_to_host_bytes_per_s),
                ("host_to_device_bytes_per_s", self.host_to_device_bytes_per_s),
            )
            if type(value) not in (int, float) or not 0 < value < float("inf")
        ]
        if bad:
            raise ConfigError(bad)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SystemSpec:
    """A cluster of identical accelerators; the number of GPUs comes from the strategy (t*p*d)."""

    name: str
    accelerator: AcceleratorSpec
    node: NodeSpec
    scale_out: LinkSpec
    processing_mode: ProcessingMode = ProcessingMode.ROOFLINE
    network_assignment: NetworkAssignment = field(default_factory=ByRankLayout)
    #: Whether the software stack overlaps a column-parallel linear's backward TP collective
    #: with its weight-gradient GEMM (Megatron-LM's ``ColumnParallelLinearWithAsyncAllreduce``,
    #: first in NVIDIA/Megatron-LM commit cf7efd4f5a, 2021-08-30; on by default since). False
    #: reproduces the older code, where that all-reduce ran synchronously in the autograd
    #: backward of ``copy_to_tensor_model_parallel_region``: the Megatron-LM of the SC'21
    #: artifact (commit 6985e58938, 2021-08-18, Narayanan et al. 2021). A property of the
    #: software generation, not of the hardware; only validation of pre-Sept-2021 runs sets it.
    async_tp_backward_comm: bool = True
    runtime: RuntimeMemory = field(default_factory=RuntimeMemory)
    #: The CPU that issues the kernels: what one op costs the host (:mod:`.host`).
    host_cpu: HostCpu = HostCpu.X86
    #: The GPU's link to host memory (activation offloading); None: not measured for the
    #: system, and a strategy that offloads is refused until it is given.
    host_link: HostLink | None = None

    def __str__(self) -> str:
        domain = self.node.nvlink_domain_size
        nvlink = "" if domain is None else f" (NVLink domain {domain})"
        return (
            f"{self.name}: {self.node.gpus_per_node}x {self.accelerator.name}{nvlink}, "
            f"{self.processing_mode}, {self.network_assignment}"
        )

    @classmethod
    def from_calculon(
        cls,
        sys_json: Mapping[str, object],
        *,
        tensor_par_net: int,
        pipeline_par_net: int,
        data_par_net: int,
    ) -> SystemSpec:
        """See :func:`blueprinting.hardware.calculon.system_from_calculon`."""
        # Imported here: the adapter builds SystemSpecs, so it imports this module.
        from blueprinting.hardware.calculon import system_from_calculon

        return system_from_calculon(
            sys_json,
            tensor_par_net=tensor_par_net,
            pipeline_par_net=pipeline_par_net,
            data_par_net=data_par_net,
        )

    @property
    def gpus_per_node(self) -> int:
        return self.node.gpus_per_node

    def link(self, tier: LinkTier) -> LinkSpec:
        match tier:
            case LinkTier.INTRA_NODE:
                return self.node.link
            case LinkTier.SCALE_OUT:
                return self.scale_out
            case _ as unreachable:
                assert_never(unreachable)

    # ---- compute and memory -----------------------------------------------------------------
    def compute_time(
        self,
        flops: Real,
        engine: Engine,
        datatype: Datatype,
        shape: ShapeFigures[Real] | None = None,
    ) -> Real:
        """``flops / (peak * efficiency(flops, shape))`` on ``engine`` (Calculon
        ``Processor.throughput``; the step efficiency is looked up at the op's FLOPs). One op's
        figures or a column's (:mod:`blueprinting.hardware.polymorphic`)."""
        rate = self.accelerator.engine(engine).rate(datatype)
        return _rate_time(flops, rate.peak_flop_per_s, rate.efficiency, shape)

    def low_precision_gemm_time(
        self, flops: Real, gemm_format: GemmFormat, shape: ShapeFigures[Real] | None = None
    ) -> Real:
        """``flops / (peak * efficiency)`` at the accelerator's rate for ``gemm_format``
        (:meth:`compute_time` for a Transformer Engine linear under an FP8 / FP4 recipe)."""
        rate = self.accelerator.low_precision_rate(gemm_format)
        return _rate_time(flops, rate.peak_flop_per_s, rate.efficiency, shape)

    def attention_time(
        self,
        flops: Real,
        *,
        seq_length: Real,
        head_dim: int,
        datatype: Datatype,
        gemm: ShapeFigures[Real],
    ) -> Real:
        """A fused attention kernel's time: ``flops`` (FlashAttention's convention,
        :mod:`blueprinting.hardware.attention`) at the accelerator's measured rate, or, where
        none is measured, as the matrix products ``gemm`` at the GEMM efficiency."""
        rates = self.accelerator.attention
        if rates is None:
            return self.compute_time(flops, Engine.MATRIX, datatype, gemm)
        size = nonzero_sizes(flops, "attention FLOPs must be >= 0")
        if size is None:
            return zeros_like(flops)
        rate = rates.flop_per_s(seq_length=seq_length, head_dim=head_dim)
        return where_positive(flops, size / rate, 0.0)

    def memory_time(self, size_bytes: Real) -> Real:
        """``bytes / (hbm_bw * efficiency(bytes))`` (Calculon ``Memory.throughput``)."""
        size = nonzero_sizes(size_bytes, "memory traffic must be >= 0 bytes")
        if size is None:
            return zeros_like(size_bytes)
        hbm = self.accelerator.hbm
        return where_positive(
            size_bytes,
            size / (hbm.bandwidth_bytes_per_s * efficiency_fraction(hbm.efficiency, size)),
            0.0,
        )

    def offload_time(self, size_bytes: float) -> float:
        """Transfer time to/from the offload tier (Calculon ``compute_offload_time``)."""
        offload = self.accelerator.offload
        if offload is None:
            raise UnsupportedError(f"checking offload: system {self.name} has no offload memory")
        if size_bytes == 0:
            return 0.0
        return size_bytes / (
            offload.bandwidth_bytes_per_s * efficiency_fraction(offload.efficiency, size_bytes)
        )

    def processing_time(self, flop_time: Real, mem_time: Real) -> Real:
        """Sum (``no_overlap``) or max (``roofline``) of an op's compute and memory times."""
        match self.processing_mode:
            case ProcessingMode.NO_OVERLAP:
                return flop_time + mem_time
            case ProcessingMode.ROOFLINE:
                return maximum(flop_time, mem_time)
            case _ as unreachable:
                assert_never(unreachable)

    def op_time(
        self,
        flops: float,
        size_bytes: float,
        engine: Engine,
        datatype: Datatype,
        shape: GemmShape | None = None,
    ) -> float:
        """One op's time: compute and HBM traffic combined by the processing mode."""
        return self.processing_time(
            self.compute_time(flops, engine, datatype, shape), self.memory_time(size_bytes)
        )

    # ---- communication ---------------------------------------------------------------------
    def comm_group(
        self,
        dim: ParallelDim,
        *,
        tensor: int,
        pipeline: int,
        data: int,
        context: int = 1,
        level: tuple[int, int] | None = None,
    ) -> CommGroup:
        """The communicator of ``dim`` for a t x cp x p x d strategy on this system
        (``level``: a sub-group of the cp group, :func:`place_group`)."""
        match self.network_assignment:
            case ByRankLayout(layout=layout):
                return place_group(
                    layout,
                    dim,
                    tensor=tensor,
                    pipeline=pipeline,
                    data=data,
                    gpus_per_node=self.gpus_per_node,
                    nvlink_domain_size=self.node.placed_domain_size(
                        tensor * pipeline * data * context
                    ),
                    context=context,
                    level=level,
                )
            case FixedTiers() as fixed:
                size = _degree(dim, tensor, pipeline, data, context)
                if level is not None:
                    size = level[0]
                return _fixed_group(size, fixed.tier(dim))
            case _ as unreachable:
                assert_never(unreachable)

    def strided_group(self, *, size: int, stride: int, world: int, like: ParallelDim) -> CommGroup:
        """The communicator of ``size`` ranks ``stride`` apart in a ``world``-rank job: the
        expert grid's groups (Megatron-LM ``parallel_state.py`` l.858-906 @d98e8a64 orders it
        etp-ep-edp-pp, fastest first: etp stride 1, ep stride etp, expert-dp stride etp x ep).
        A system with fixed tiers (Calculon's files) puts it on ``like``'s tier."""
        if size == 1:
            return _SINGLE
        match self.network_assignment:
            case ByRankLayout():
                domain = self.node.placed_domain_size(world)
                return _placed(size, stride, world, self.gpus_per_node, domain)
            case FixedTiers() as fixed:
                return _fixed_group(size, fixed.tier(like))
            case _ as unreachable:
                assert_never(unreachable)

    def p2p_ring_step_ctas(self, group: CommGroup) -> int | None:
        """The thread blocks NCCL's send / receive kernel runs for one ring step over ``group``
        (a send to one peer, a receive from another: context parallelism's P2P ring): two
        peers' ``p2pnChannelsPerPeer`` each, within ``p2pnChannels``
        (:attr:`RuntimeMemory.nccl_p2p_ctas`). NVIDIA/nccl @5067397c ``src/graph/paths.cc``
        ``ncclTopoGetNchannels``: an NVLink peer gets 2 x its NVLinks (more than the 32 cap on
        A100, H100 and Blackwell), a network peer max(1 NIC, ceil(NIC GB/s / 14))
        (``NCCL_P2P_PER_CHANNEL_NET_BW`` = 14), and a communicator takes the minimum over its
        peers, rounded up to a power of two: 32 blocks inside one NVLink domain, 2 x 4 = 8
        across domains on 50 GB/s NICs, 16 on 100 GB/s. None without a channel count."""
        cap = self.runtime.nccl_p2p_ctas
        if cap is None:
            return None
        if group.tier is LinkTier.INTRA_NODE:
            return cap
        net_gbps = self.scale_out.bandwidth_bytes_per_s / 1e9
        per_peer = max(1, ceil(net_gbps / NCCL_P2P_PER_CHANNEL_NET_GBPS))
        return min(cap, 2 * (1 << (per_peer - 1).bit_length()))

    def all_to_all_time(
        self,
        size_bytes: float,
        group: CommGroup,
        kernels: ExchangeKernels = ExchangeKernels.NCCL,
    ) -> float:
        """An all-to-all of ``size_bytes`` per rank over ``group``, moved by ``kernels``
        (NCCL's or a library's: the links' efficiency, :func:`~blueprinting.hardware.
        collectives.link_efficiency`). Inside one NVLink domain the collective model's
        ``(n-1)/n`` share crosses the scale-up link; a group spread over several domains sends
        ``(c-1)/n`` of it over the scale-up link and ``(n-c)/n`` over the NIC at the same time
        (c = ``ranks_per_domain``, the members that share the NVLink domain of the worst-placed
        rank: 8 on a DGX, up to 72 on an NVL72 rack), the slower of the two bounding it (the
        hierarchical view of DeepEP's intranode / internode kernels, shared reference section
        2.3)."""
        if group.size == 1:
            return 0.0
        kind = CollectiveKind.ALL_TO_ALL
        if group.tier is LinkTier.INTRA_NODE:
            latency, bandwidth = collective_alpha_beta(
                kind, size_bytes, group.size, self.link(group.tier), kernels
            )
            return latency + size_bytes / bandwidth
        n, c = group.size, group.ranks_per_domain
        out = self.scale_out
        latency, bandwidth = collective_alpha_beta(kind, size_bytes, n, out, kernels)
        wire = out.costs.of(kind).wire_factor(n)
        # the remote share over the NIC: (n - c)/n of the buffer, not the model's (n-1)/n
        remote = size_bytes * (n - c) / n / (bandwidth * wire)
        local = 0.0
        if c > 1:
            inside = self.node.link
            l_latency, l_bandwidth = collective_alpha_beta(kind, size_bytes, c, inside, kernels)
            local = l_latency + size_bytes * (c - 1) / n / (
                l_bandwidth * inside.costs.of(kind).wire_factor(c)
            )
        return max(latency + remote, local)

    def forwarded_all_to_all_time(
        self, size_bytes: float, group: CommGroup, *, fanout: int, replicas: int = 1
    ) -> float:
        """A token all-to-all that crosses the NIC once per remote NVLink domain (DeepEP's
        internode normal kernels): ``size_bytes`` per rank are ``replicas`` x ``D``
        copies of each token, ``D = e (1 - (1 - 1/e)^fanout)`` the distinct ones of the
        ``e = n / replicas`` destinations its ``fanout`` uniformly placed targets touch
        (:func:`~blueprinting.synthesizer.dialects.transformer.training.distinct_destinations`).
        A token goes over RDMA once to each remote domain that holds one of its targets, to
        the GPU of the same local index, and fans out there over NVLink (DeepSeek-V3 technical
        report, arXiv:2412.19437, section 3.2.2; DeepEP README, "normal kernels ... forwarding
        data from NVLink domain to RDMA domain"): the NIC carries ``(m - 1)(1 - (1 - 1/m)^fanout)``
        copies of each token (m = n / c domains of c ranks), the NVLink every copy but the
        rank's own, ``(n - 1)/n`` of the buffer; the slower bounds it. Inside one domain, or
        where a domain holds less than one destination's replicas, it is
        :meth:`all_to_all_time`. The library's kernels move the bytes (``ExchangeKernels.
        LIBRARY``: the links' ring efficiency)."""
        n, c = group.size, group.ranks_per_domain
        library = ExchangeKernels.LIBRARY
        if group.tier is LinkTier.INTRA_NODE or n <= c or c < replicas:
            return self.all_to_all_time(size_bytes, group, library)
        kind = CollectiveKind.ALL_TO_ALL
        destinations = n / replicas
        distinct = destinations * (1.0 - (1.0 - 1.0 / destinations) ** fanout)
        domains = n / c
        remote_domains = (domains - 1.0) * (1.0 - (1.0 - 1.0 / domains) ** fanout)
        nic_bytes = size_bytes * remote_domains / (replicas * distinct)
        out = self.scale_out
        latency, bandwidth = collective_alpha_beta(kind, size_bytes, n, out, library)
        remote = nic_bytes / (bandwidth * out.costs.of(kind).wire_factor(n))
        inside = self.node.link
        l_latency, l_bandwidth = collective_alpha_beta(kind, size_bytes, c, inside, library)
        local = l_latency + size_bytes * (n - 1) / n / (
            l_bandwidth * inside.costs.of(kind).wire_factor(c)
        )
        return max(latency + remote, local)

    def dense_gradient_group(
        self, *, tensor: int, pipeline: int, data: int, context: int = 1
    ) -> CommGroup:
        """The d x cp ranks that reduce (and shard) dense gradients (Megatron's
        ``intra_dp_cp_group``): the pure dp group when cp = 1. Its members are the product of a
        cp group and a dp group, so it reaches the slower of their links and holds, per node,
        the product of their per-node counts (exact under tp-cp-dp-pp, where it is one
        contiguous strided run)."""
        dp = self.comm_group(
            ParallelDim.DATA, tensor=tensor, pipeline=pipeline, data=data, context=context
        )
        if context == 1:
            return dp
        cp = self.comm_group(
            ParallelDim.CONTEXT, tensor=tensor, pipeline=pipeline, data=data, context=context
        )
        slower = max(cp.tier, dp.tier, key=list(LinkTier).index)
        size = cp.size * dp.size
        return CommGroup(
            size=size,
            tier=slower,
            ranks_per_node=min(size, cp.ranks_per_node * dp.ranks_per_node),
            ranks_per_domain=min(size, cp.ranks_per_domain * dp.ranks_per_domain),
        )

    def collective_time(self, kind: CollectiveKind, size_bytes: float, group: CommGroup) -> float:
        """One collective of ``size_bytes`` over ``group`` on the group's link (see
        :func:`~blueprinting.hardware.collectives.collective_link_time`).

        A ring collective (all-reduce, reduce-scatter, all-gather) over a group spread over
        several NVLink domains with ``c = ranks_per_domain > 1`` members in each runs NCCL's
        rings one channel per NIC: each ring crosses a domain boundary through one of the c
        members' NICs, so a rank sends ``1/c`` of the ring's bytes over its NIC and the other
        ``(c-1)/c`` over NVLink at the same time, the slower bounding it. That is what
        nccl-tests measure across nodes: DGX A100 192 GB/s all-reduce busbw on 8 x 200 Gb/s
        NICs (25 GB/s each), DGX H100 370-380 on 8 x 400 Gb/s, two GB200 NVL72 racks 793-810
        (shared/reference/microbenchmarks.md sections 4.1, 4.4, 4.5; NCCL_812), not one NIC's
        rate. ``c = 1`` (every member on its own node, and Calculon's fixed tiers) is the flat
        ring on the NIC, as before; p2p is not a ring, and an all-to-all is NCCL's, the
        hierarchical :meth:`all_to_all_time` (context parallelism's a2a across nodes sends its
        domain peers' share over NVLink, the rest over the NIC)."""
        if kind is CollectiveKind.ALL_TO_ALL:
            return self.all_to_all_time(size_bytes, group, ExchangeKernels.NCCL)
        link = self.link(group.tier)
        c = group.ranks_per_domain
        ring = kind in (
            CollectiveKind.ALL_REDUCE,
            CollectiveKind.REDUCE_SCATTER,
            CollectiveKind.ALL_GATHER,
        )
        if group.tier is not LinkTier.SCALE_OUT or c == 1 or not ring or group.size == 1:
            return collective_link_time(kind, size_bytes, group.size, link)
        latency, bandwidth = collective_alpha_beta(kind, size_bytes, group.size, link)
        remote = latency + size_bytes / c / bandwidth
        inside = self.node.link
        l_latency, l_bandwidth = collective_alpha_beta(kind, size_bytes, group.size, inside)
        local = l_latency + size_bytes * (c - 1) / c / l_bandwidth
        return max(remote, local)
