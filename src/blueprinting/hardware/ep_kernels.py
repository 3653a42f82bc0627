"""Measured throughput of the expert-parallel communication libraries' dispatch and combine.

The flex token dispatcher (``--moe-token-dispatcher-type flex``) runs its token exchange in a
library's own kernels (DeepEP, HybridEP), not in an NCCL all-to-all: copies issued by a few SMs
(DeepEP) or by the Tensor Memory Accelerator (HybridEP), with their own preprocessing. What they
reach inside one NVLink domain is published as *algorithm bandwidth*: the bytes one rank
receives (one BF16 copy of each token for each distinct destination rank, its own included) over
the time of one call through the PyTorch API (deepseek-ai/DeepEP ``tests/test_hybrid_ep.py``
@098da2a6), which is the byte count the planner's dispatch task carries
(:func:`~blueprinting.synthesizer.dialects.transformer.training.expert_exchanges`). A node's
:class:`EpKernelRates` hold one such table per library; a flex dispatch or combine whose group
lies in one NVLink domain is timed as its bytes over the measured rate at its group size
(linear between the measured sizes; beyond the largest measured group the rate is the largest
group's, which is an optimistic bound for larger groups). A group smaller than the smallest
measured one, or one that leaves its domain, is timed by the link model
(:meth:`~blueprinting.hardware.system.SystemSpec.all_to_all_time`). ``sms`` records the SMs
the measurement ran with (provenance: the rates are used as measured; the SMs a run's library
holds are the strategy's, ``FlexDispatcher.sms``).

The published tables (deepseek-ai/DeepEP ``docs/README_Hybrid-EP.md`` @41cad944, "Performance
Results") are measured at 4096 tokens of hidden size 7168, top-8, 8 local experts, uniform random
routing: DeepSeek-V3's shape at micro-batch 1. The rate is applied at other shapes too (a MoE
layer's dispatch moves 0.1-0.5 GB per rank in the validated runs, as the benchmark does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import assert_never, final

from blueprinting.errors import ConfigError
from blueprinting.mapping.transformer import FlexBackend


class EpLeg(StrEnum):
    """Which kernel of the library moves the bytes: the dispatch (tokens to their experts'
    ranks; the backward of the combine is one too) or the combine (expert outputs back, reduced;
    the backward of the dispatch is one)."""

    DISPATCH = "dispatch"
    COMBINE = "combine"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class EpKernelRates:
    """One library's measured BF16 dispatch and combine algorithm bandwidth (bytes/s) inside
    one NVLink domain, at ``sms`` streaming multiprocessors, by EP group size ``ranks``
    (increasing). ``source`` names the measurement."""

    backend: FlexBackend
    source: str
    sms: int
    ranks: tuple[int, ...]
    dispatch_bytes_per_s: tuple[float, ...]
    combine_bytes_per_s: tuple[float, ...]

    def __post_init__(self) -> None:
        problems: list[str] = []
        n = len(self.ranks)
        if n == 0:
            problems.append("EpKernelRates.ranks must not be empty")
        if any(type(r) is not int or r < 2 for r in self.ranks):
            problems.append(f"EpKernelRates.ranks must be integers >= 2, got {self.ranks}")
        elif any(a >= b for a, b in zip(self.ranks, self.ranks[1:], strict=False)):
            problems.append(f"EpKernelRates.ranks must increase strictly, got {self.ranks}")
        if type(self.sms) is not int or self.sms < 1:
            problems.append(f"EpKernelRates.sms must be a positive integer, got {self.sms!r}")
        for name, rates in (
            ("dispatch_bytes_per_s", self.dispatch_bytes_per_s),
            ("combine_bytes_per_s", self.combine_bytes_per_s),
        ):
            if len(rates) != n:
                problems.append(f"EpKernelRates.{name} has {len(rates)} values for {n} group sizes")
            if any(not (math.isfinite(r) and r > 0) for r in rates):
                problems.append(f"EpKernelRates.{name} must be positive numbers, got {rates}")
        if not self.source:
            problems.append("EpKernelRates.source must name the measurement")
        if problems:
            raise ConfigError(problems)

    def _rates(self, leg: EpLeg) -> tuple[float, ...]:
        match leg:
            case EpLeg.DISPATCH:
                return self.dispatch_bytes_per_s
            case EpLeg.COMBINE:
                return self.combine_bytes_per_s
            case _ as unreachable:
                assert_never(unreachable)

    def covers(self, ranks: int) -> bool:
        """Whether a group of ``ranks`` is timed by this table: from the smallest measured
        group up. Below it the rate is not taken: a smaller group sends a smaller share of its
        bytes to other ranks ((n-1)/n), so the smallest group's rate would make it look slow."""
        return ranks >= self.ranks[0]

    def bytes_per_s(self, leg: EpLeg, ranks: int) -> float:
        """The measured rate of ``leg`` for a group of ``ranks``: linear in the group size
        between the measured ones, the nearest measured one outside them (callers check
        :meth:`covers` first)."""
        rates = self._rates(leg)
        sizes = self.ranks
        if ranks <= sizes[0]:
            return float(rates[0])
        if ranks >= sizes[-1]:
            return float(rates[-1])
        for (a, ra), (b, rb) in zip(
            zip(sizes, rates, strict=True), zip(sizes[1:], rates[1:], strict=True), strict=True
        ):
            if a <= ranks <= b:
                return float(ra + (rb - ra) * (ranks - a) / (b - a))
        raise AssertionError("unreachable: sizes cover ranks")  # pragma: no cover


def unique_backends(rates: tuple[EpKernelRates, ...]) -> list[str]:
    """The problems of a node's table list: each library at most once."""
    seen = [r.backend for r in rates]
    if len(set(seen)) != len(seen):
        return [f"ep_kernels lists a backend twice: {[str(b) for b in seen]}"]
    return []


def rates_for(rates: tuple[EpKernelRates, ...], backend: FlexBackend) -> EpKernelRates | None:
    """The node's measured table for ``backend`` (None: not measured)."""
    for table in rates:
        if table.backend is backend:
            return table
    return None


# The published tables, transcribed (GB/s = 1e9 bytes/s). Megatron-Bridge's performance
# scripts run HybridEP at 32 SMs (``scripts/performance/utils/overrides.py``: "
# moe_hybridep_num_sms = 32" for every hybridep recipe, r0.2.0 @046518960 onwards) and DeepEP at
# Megatron-Core's default ``moe_deepep_num_sms = 20`` (``transformer_config.py``); the DeepEP
# rows below are the mean of the 16- and 24-SM measurements (linear in SMs).
_README = "deepseek-ai/DeepEP docs/README_Hybrid-EP.md @41cad944"
_GB = 1e9

#: GB200 NVL72 (multi-node NVLink), HybridEP through the Torch API, 32 SMs, BF16 dispatch.
GB200_HYBRIDEP = EpKernelRates(
    backend=FlexBackend.HYBRIDEP,
    source=f"{_README}, GB200 table, Torch API, 32 SMs, dispatch (BF16) / combine",
    sms=32,
    ranks=(8, 16, 24, 32, 36),
    dispatch_bytes_per_s=tuple(x * _GB for x in (545.71, 523.48, 507.32, 484.22, 479.02)),
    combine_bytes_per_s=tuple(x * _GB for x in (568.94, 521.55, 483.76, 464.54, 447.89)),
)

#: GB200 NVL72, DeepEP through the Torch API at 20 SMs (mean of its 16- and 24-SM rows).
GB200_DEEPEP = EpKernelRates(
    backend=FlexBackend.DEEPEP,
    source=(
        f"{_README}, GB200 DeepEP table, Torch API, mean of the 16- and 24-SM rows (20 SMs, "
        "Megatron-Core's moe_deepep_num_sms), dispatch (BF16) / combine"
    ),
    sms=20,
    ranks=(8, 16, 24),
    dispatch_bytes_per_s=tuple(
        (a + b) / 2 * _GB for a, b in ((362.01, 512.72), (328.80, 442.47), (324.64, 450.22))
    ),
    combine_bytes_per_s=tuple(
        (a + b) / 2 * _GB for a, b in ((310.21, 425.95), (278.34, 378.32), (126.53, 163.62))
    ),
)

#: DGX / HGX B200 (one 8-GPU NVLink node): HybridEP measured at 16 SMs only (on GB200 at 8
#: ranks, 16 and 32 SMs differ by under 1% on the dispatch and 6% on the combine).
B200_HYBRIDEP = EpKernelRates(
    backend=FlexBackend.HYBRIDEP,
    source=f"{_README}, B200 table, HybridEP, Torch API, 16 SMs, dispatch (BF16) / combine",
    sms=16,
    ranks=(8,),
    dispatch_bytes_per_s=(535.94 * _GB,),
    combine_bytes_per_s=(530.86 * _GB,),
)

#: DGX / HGX B200: DeepEP at 20 SMs (mean of its 16- and 24-SM rows).
B200_DEEPEP = EpKernelRates(
    backend=FlexBackend.DEEPEP,
    source=(
        f"{_README}, B200 table, DeepEP, Torch API, mean of the 16- and 24-SM rows (20 SMs), "
        "dispatch (BF16) / combine"
    ),
    sms=20,
    ranks=(8,),
    dispatch_bytes_per_s=((348 + 494) / 2 * _GB,),
    combine_bytes_per_s=((302 + 420) / 2 * _GB,),
)
