"""The host CPU that issues a GPU's kernels, and what one op costs it.

The per-op host cost is a measured figure, not fitted on any validated row: TransformerEngine
issue #2053 (2025-08-11, "[PyTorch] High CPU overhead on Grace systems"), the CPU time of one
``torch.nn.Linear`` forward call (BF16, hidden 2048, 8192 tokens): 13.48 us on a DGX H100
(Intel Xeon Platinum 8480C) and 37.08 us on GB200 (Grace). The same issue measures Transformer
Engine's ``Linear`` at 99.66 us on GB200: the torch figure is the lower of the two, and later
Transformer Engine releases brought its BF16 linear close to it (issue #2126, 2026-01-03).
DGX B200 / B300 hosts are Xeons as DGX H100's (the x86 figure); the NVL72 trays are Grace.
"""

from __future__ import annotations

from enum import StrEnum
from typing import assert_never


class HostCpu(StrEnum):
    """The host CPU that issues the kernels (a system key, ``host_cpu``)."""

    X86 = "x86"  # DGX H100 / H200 / B200 / B300: Intel Xeon
    GRACE = "grace"  # GB200 / GB300 NVL72 compute trays: NVIDIA Grace (Arm Neoverse V2)


def host_op_s(cpu: HostCpu) -> float:
    """One op's host issue time (module docstring: TransformerEngine issue #2053)."""
    match cpu:
        case HostCpu.X86:
            return 13.48e-6
        case HostCpu.GRACE:
            return 37.08e-6
        case _ as unreachable:
            assert_never(unreachable)
