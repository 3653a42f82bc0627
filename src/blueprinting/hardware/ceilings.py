"""Measured matmul ceilings of the accelerators: what a part without a measurement of its own is
scaled by (the attention tables, :mod:`blueprinting.hardware.attention`; the GEMM fits moved
between parts, :func:`blueprinting.hardware.presets.transferred_fit`).

Each figure is the Maximum Achievable Matmul FLOPS (mamf-finder v2, best shape, cache wiped) in
TFLOP/s, ``shared/reference/microbenchmarks.md`` section 1 (``mlengr_mamf``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from blueprinting.mapping.model import Datatype

#: (part, datatype) -> TFLOP/s.
MAMF_TFLOPS: Mapping[tuple[str, Datatype], float] = MappingProxyType(
    {
        ("B200", Datatype.BF16): 1745.0,
        ("B200", Datatype.FP8): 3432.5,
        ("B300", Datatype.BF16): 1769.0,
        ("B300", Datatype.FP8): 3353.3,
        ("GB200", Datatype.BF16): 1822.0,
        ("GB200", Datatype.FP8): 3615.6,
    }
)


def mamf_ratio(target: str, source: str, datatype: Datatype) -> float:
    """How much faster ``target``'s measured ceiling is than ``source``'s in ``datatype``."""
    return MAMF_TFLOPS[(target, datatype)] / MAMF_TFLOPS[(source, datatype)]
