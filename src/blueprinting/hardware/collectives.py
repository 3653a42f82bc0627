"""Collective communication cost on one link.

The cost model is Calculon's (Isaev et al., SC'23; ``calculon/network.py`` ``Network.time`` at
calculon-ai/calculon caa4b11), which generalizes the bandwidth term of the classic ring
algorithms (Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective Communication
Operations in MPICH", Section 4; Patarasuk & Yuan 2009 for the bandwidth-optimal ring
all-reduce)::

    time(S, n) = latency + S * scalar * (1 + offset / n) / (bandwidth * efficiency(S))

``S`` is the message size in bytes (the full tensor each rank holds before a reduce-scatter /
after an all-gather or all-reduce), ``n`` the group size, ``bandwidth`` the per-GPU,
per-direction bandwidth of the link and ``(scalar, offset)`` a per-operation factor pair.
``offset = None`` (p2p) means no ``1/n`` term. The ring algorithms are
:func:`ring_collective_costs`:

* all-reduce (ring RS then AG) moves ``2 (n-1)/n * S``: ``scalar = 2, offset = -1``;
* reduce-scatter and all-gather move ``(n-1)/n * S``: ``scalar = 1, offset = -1``;
* p2p sends ``S`` once: ``scalar = 1, offset = None``.

NCCL's all-to-all is grouped point-to-point sends, not a ring, and reaches less of the link than
the rings do where both were measured (NVIDIA GTC25 S72583: 8 x H100 all-to-all busbw 320 GB/s
against 370 for the ring collectives; :func:`link_efficiency`).

A group of one rank communicates nothing and costs 0 (Calculon never calls ``time`` then; it
asserts ``n >= 2``).

Public API: ``CollectiveKind``, ``CollectiveCost``, ``CollectiveCosts``,
``ring_collective_costs()``, ``ExchangeKernels``, ``link_efficiency(link, kind, kernels)``,
``collective_link_time(kind, size_bytes, group_size, link)`` (``link``
is a :class:`~blueprinting.hardware.system.LinkSpec`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, assert_never, final

from blueprinting.errors import ConfigError
from blueprinting.hardware.efficiency import Efficiency, efficiency_fraction, is_positive

if TYPE_CHECKING:
    from blueprinting.hardware.system import LinkSpec


class CollectiveKind(StrEnum):
    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    P2P = "p2p"
    ALL_TO_ALL = "all_to_all"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveCost:
    """Bytes on the wire per byte of message: ``scalar * (1 + offset / n)``; no ``1/n`` term when
    ``offset`` is ``None``."""

    scalar: float
    offset: float | None

    def __post_init__(self) -> None:
        if not (is_positive(self.scalar)):
            raise ConfigError([f"CollectiveCost.scalar must be > 0, got {self.scalar!r}"])

    def wire_factor(self, group_size: int) -> float:
        if self.offset is None:
            return self.scalar
        return self.scalar * (1.0 + self.offset / group_size)

    def __str__(self) -> str:
        return (
            f"{self.scalar:g}" if self.offset is None else f"{self.scalar:g}(1{self.offset:+g}/n)"
        )


DEFAULT_ALL_TO_ALL = CollectiveCost(scalar=1.0, offset=-1.0)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveCosts:
    """The cost factors of each collective on one link."""

    all_reduce: CollectiveCost
    reduce_scatter: CollectiveCost
    all_gather: CollectiveCost
    p2p: CollectiveCost
    #: Each rank keeps 1/n of an all-to-all's tensor and sends (n-1)/n, as an all-gather's
    #: ring moves (nccl-tests ``alltoall_perf``: busbw = algbw (n-1)/n). Optional in system
    #: files and Calculon's, which predate it.
    all_to_all: CollectiveCost = field(default_factory=lambda: DEFAULT_ALL_TO_ALL)

    def of(self, kind: CollectiveKind) -> CollectiveCost:
        match kind:
            case CollectiveKind.ALL_REDUCE:
                return self.all_reduce
            case CollectiveKind.REDUCE_SCATTER:
                return self.reduce_scatter
            case CollectiveKind.ALL_GATHER:
                return self.all_gather
            case CollectiveKind.P2P:
                return self.p2p
            case CollectiveKind.ALL_TO_ALL:
                return self.all_to_all
            case _ as unreachable:
                assert_never(unreachable)


def ring_collective_costs() -> CollectiveCosts:
    """Ring algorithms: AR 2(n-1)/n, RS and AG (n-1)/n, p2p once (Thakur et al. 2005, Sec. 4)."""
    return CollectiveCosts(
        all_reduce=CollectiveCost(scalar=2.0, offset=-1.0),
        reduce_scatter=CollectiveCost(scalar=1.0, offset=-1.0),
        all_gather=CollectiveCost(scalar=1.0, offset=-1.0),
        p2p=CollectiveCost(scalar=1.0, offset=None),
    )


def collective_link_time(
    kind: CollectiveKind, size_bytes: float, group_size: int, link: LinkSpec
) -> float:
    """Seconds for one collective of ``size_bytes`` over ``group_size`` ranks on ``link``.

    Calculon's ``Network.time``: ``latency + S * scalar * (1 + offset/n) / (bw * eff)``; the
    efficiency is looked up at the message size ``S``. ``group_size == 1`` costs 0.
    """
    if group_size == 1 and size_bytes >= 0:
        return 0.0
    latency, bandwidth = collective_alpha_beta(kind, size_bytes, group_size, link)
    return latency + size_bytes / bandwidth


class ExchangeKernels(StrEnum):
    """Whose kernels move an all-to-all's bytes, which decides the link efficiency it reaches
    (:func:`link_efficiency`).

    - ``nccl``: ``torch.distributed.all_to_all_single``, NCCL's grouped send / receive (the
      alltoall token dispatcher, context parallelism's a2a): the link's
      ``all_to_all_efficiency`` where one was measured.
    - ``library``: an expert-parallel library's own copy kernels (DeepEP, HybridEP: the flex
      dispatcher), which reach the link's ring efficiency (DeepEP's internode normal kernels
      43-58 GB/s of RDMA on 50 GB/s NICs, shared/reference/microbenchmarks.md 4.6), not NCCL's
      all-to-all figure."""

    NCCL = "nccl"
    LIBRARY = "library"


def link_efficiency(
    link: LinkSpec, kind: CollectiveKind, kernels: ExchangeKernels = ExchangeKernels.NCCL
) -> Efficiency:
    """The efficiency model a collective of ``kind`` reaches on ``link``: NCCL's all-to-all
    at the link's ``all_to_all_efficiency`` where the system gives one, every other collective
    (and a library's exchange) at ``efficiency``."""
    measured = link.all_to_all_efficiency
    if kind is CollectiveKind.ALL_TO_ALL and kernels is ExchangeKernels.NCCL and measured:
        return measured
    return link.efficiency


def collective_alpha_beta(
    kind: CollectiveKind,
    size_bytes: float,
    group_size: int,
    link: LinkSpec,
    kernels: ExchangeKernels = ExchangeKernels.NCCL,
) -> tuple[float, float]:
    """(latency s, effective bytes/s) of :func:`collective_link_time`: the time is
    ``latency + size / effective``, with ``effective = bw * eff(size) / wire factor`` (``eff``
    by :func:`link_efficiency`); the simulator schedules transfers from these two numbers."""
    if size_bytes < 0:
        raise ConfigError([f"collective size must be >= 0 bytes, got {size_bytes!r}"])
    if group_size < 1:
        raise ConfigError([f"collective group size must be >= 1, got {group_size!r}"])
    wire = link.costs.of(kind).wire_factor(group_size)
    fraction = efficiency_fraction(link_efficiency(link, kind, kernels), size_bytes)
    return link.latency_s, link.bandwidth_bytes_per_s * fraction / wire
