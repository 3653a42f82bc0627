"""Measured throughput of fused attention kernels, and how a training step's kernel is timed.

A fused attention kernel (FlashAttention, Dao et al. 2022; cuDNN fused attention in Transformer
Engine) is neither a GEMM nor an elementwise op: its throughput depends on the sequence length
(tiles per head), the head dimension and the mask, and it is published as achieved TFLOP/s per
kernel, not as a GEMM fraction. :class:`AttentionKernelRates` holds one such measurement table
(causal, forward + backward, by head dimension and sequence length) and interpolates it.

FLOP convention: the one the measurements use (``flash-attention/benchmarks``
``benchmark_flash_attention.py``): a forward counts ``4 * b * heads * s^2 * d``, halved for a
causal mask; a backward 2.5 times the forward (it recomputes ``Q K^T`` and runs four more matrix
products); forward + backward 3.5 times. :func:`causal_attention_pairs` and the ``FORWARD_`` /
``BACKWARD_`` factors below are that convention, so that time = FLOPs / measured rate is exact
at the measured points.

Interpolation: linear in ``log2(seq_length)`` between the measured sequence lengths and linear in
the head dimension between the measured ones, clamped at both ends; a kernel below the shortest
measured sequence is taken at the shortest one's rate times :func:`short_kernel_fraction` (cuDNN's
measured 128-key window, a 256-token kernel, runs at 0.45 of the clamped rate; a long kernel
beyond the longest row keeps that row's rate: an optimistic bound, said here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import final

from blueprinting.errors import ConfigError, positive_int_problems
from blueprinting.hardware.ceilings import mamf_ratio
from blueprinting.hardware.polymorphic import (
    Real,
    log2,
    maximum,
    minimum,
    step_index,
    take,
    zeros_like,
)
from blueprinting.mapping.model import Datatype

#: FlashAttention's FLOPs per attended (query, key) pair and head dimension: ``Q K^T`` and ``P V``.
FORWARD_FLOPS_PER_PAIR_DIM = 4
#: The backward is 2.5 x the forward in the same convention (``benchmark_flash_attention.py``).
BACKWARD_FLOPS_PER_PAIR_DIM = 10


def causal_attention_pairs(seq_length: int) -> int:
    """(query, key) pairs of one head under a causal mask in FlashAttention's convention,
    ``s^2 / 2`` (rounded down; the diagonal's ``s / 2`` is within the convention's slack)."""
    return seq_length * seq_length // 2


def windowed_attention_pairs(seq_length: int, keys: int) -> int:
    """(query, key) pairs of one head when each query attends at most ``keys`` keys (a sliding
    window, ``keys`` = W = window + 1), in the same convention: the band's area
    ``s W - floor(W^2 / 2)`` (an odd W's half pair rounded up), which is
    :func:`causal_attention_pairs` at ``W = s`` and
    differs from the exact count ``s W - W (W - 1) / 2`` (serving's ``attended_pairs``) by the
    convention's ``W / 2`` on the diagonal. A window at least as long as the sequence is the
    causal mask."""
    if keys >= seq_length:
        return causal_attention_pairs(seq_length)
    return seq_length * keys - keys * keys // 2


#: The shortest kernel length a rate is measured at below the tables' shortest row, and its rate
#: as a fraction of the table's clamped one. A fused kernel shorter than the table (the module
#: docstring's optimistic clamp) does a query tile's work over a few key tiles, so its prologue
#: and epilogue (loading Q, rescaling and writing O) are not amortised as in a long row. Measured
#: on the sliding window, whose kernel :func:`windowed_rate_seq_length` reads at ``2 W``: cuDNN's
#: SDPA training benchmark on GB200 (NVIDIA/cudnn-frontend @20dc108987f2
#: ``benchmark/sdpa_benchmark_training/results/gpt_oss/gb200/gpt_oss_20260813_110803.csv``,
#: cuDNN 9.27, bf16, d = 64, B 2 x 128 heads, ``sliding_window_size`` 128 keys, in-window
#: FLOPs) times GPT-OSS's window at 163 TFLOP/s forward and 185 backward at s = 4096 (156-170 /
#: 172-190 from 2k to 32k: the rate of a window does not move with s), 178.1 forward + backward
#: in this module's convention, against the GB200 table's 398.6 at its 512 clamp (d = 64):
#: 0.447, rounded 0.45 (``tests/hardware/test_attention_rates.py`` recomputes it), at the
#: kernel length 2 W = 256. Windows of 512 and 1,024 keys (2 W inside the table) stay within 5%
#: and 1% of the table's rule (cuDNN on SM120, cudnn-frontend PR #505; on GB200 at 32k,
#: ``results/gb200_919_only_cudnn/gpt_oss_20260226_175022.csv``, 632 / 660 TFLOP/s). Between 256
#: and the table's shortest length the fraction is linear in ``log2(s)``; below 256 it stays (the
#: clamp's optimism again: nothing shorter is measured). A short causal kernel (s < 512) takes the
#: same fraction: the rule that reads a window at ``2 W`` is that such a kernel's work per query
#: tile is a window's. The same fraction on every table (an assumption: no Hopper or B200 short
#: kernel is measured).
SHORT_KERNEL_SEQ = 256
SHORT_KERNEL_FRACTION = 0.45


def short_kernel_fraction(seq_length: Real, shortest_seq_length: int) -> Real:
    """The fraction of a table's clamped rate a kernel of ``seq_length`` tokens reaches
    (:data:`SHORT_KERNEL_FRACTION`; exactly 1 from the table's shortest length up), on one
    length or a column of them (:mod:`blueprinting.hardware.polymorphic`)."""
    if shortest_seq_length <= SHORT_KERNEL_SEQ:
        return zeros_like(seq_length) + 1.0
    span = math.log2(shortest_seq_length / SHORT_KERNEL_SEQ)
    above = (log2(maximum(seq_length, 1)) - math.log2(SHORT_KERNEL_SEQ)) / span
    weight = minimum(maximum(above, 0.0), 1.0)
    # exactly f at w = 0 and exactly 1 at w = 1 in binary floating point: every kernel the table
    # covers keeps the table's rate bit for bit
    return SHORT_KERNEL_FRACTION + (1.0 - SHORT_KERNEL_FRACTION) * weight


def windowed_rate_seq_length(seq_length: int, keys: int | None) -> int:
    """The sequence length whose causal kernel rate a windowed kernel is priced at: the causal
    kernel attends ``s / 2`` keys per query on average, a window of W keys about W, so the rate
    is read at ``min(s, 2 W)`` (FlashAttention and cuDNN skip the tiles outside the band, and a
    query tile's work is then as short as a causal kernel's at that length; below the table's
    shortest length, :func:`short_kernel_fraction` of its rate: GPT-OSS's 128-key window is the
    measurement that sets it). Checked
    against cuDNN's measured SWA backward (cudnn-frontend PR #505, SM120, d = 64): the windowed /
    causal time ratio within 3% at s = 4096 (``tests/synthesizer/test_training_sliding_window.py``).
    ``keys`` None: full attention, ``s``."""
    return seq_length if keys is None else min(seq_length, 2 * keys)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionKernelRates:
    """Achieved causal forward + backward throughput of one fused kernel on one accelerator.

    ``tflops[i][j]`` is the rate at ``head_dims[i]`` and ``seq_lengths[j]`` in TFLOP/s
    (FlashAttention's convention, module docstring); ``source`` names the measurement.
    """

    kernel: str
    source: str
    head_dims: tuple[int, ...]
    seq_lengths: tuple[int, ...]
    tflops: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        problems: list[str] = []
        for name, axis in (("head_dims", self.head_dims), ("seq_lengths", self.seq_lengths)):
            if not axis or list(axis) != sorted(set(axis)):
                problems.append(f"{name} must be non-empty and strictly increasing, got {axis}")
            problems += positive_int_problems(
                "AttentionKernelRates", **{f"{name}[{i}]": v for i, v in enumerate(axis)}
            )
        if len(self.tflops) != len(self.head_dims) or any(
            len(row) != len(self.seq_lengths) for row in self.tflops
        ):
            problems.append(
                f"tflops must be {len(self.head_dims)} rows of {len(self.seq_lengths)} values"
            )
        if any(not (rate > 0 and math.isfinite(rate)) for row in self.tflops for rate in row):
            problems.append("every tflops value must be positive and finite")
        if problems:
            raise ConfigError(problems, source=f"attention kernel rates {self.kernel!r}")

    def flop_per_s(self, *, seq_length: Real, head_dim: int) -> Real:
        """The interpolated rate in FLOP/s (module docstring), at one sequence length or a
        column of them (:mod:`blueprinting.hardware.polymorphic`); below the table's shortest
        length, :func:`short_kernel_fraction` of the clamped rate."""
        logs = tuple(math.log2(s) for s in self.seq_lengths)
        j, w = _segment(logs, log2(maximum(seq_length, 1)))
        rows = [_blend(take(row, j - 1), take(row, j), w) for row in self.tflops]
        i, v = _segment(self.head_dims, float(head_dim))
        rate = _blend(rows[int(i) - 1], rows[int(i)], v) * 1e12
        return rate * short_kernel_fraction(seq_length, self.seq_lengths[0])


def _segment(xs: tuple[float, ...] | tuple[int, ...], x: Real) -> tuple[Real, Real]:
    """Where ``x`` falls among the points ``xs``: the segment j - 1 .. j (j in 1 .. n - 1) and
    the weight in it, clamped to [0, 1] so that a point beyond either end takes that end's value
    exactly (``y0 * 1 + y1 * 0``); one point: j = 0, weight 0 (its value twice: index -1, 0)."""
    if len(xs) == 1:
        return zeros_like(x), zeros_like(x)
    j = minimum(maximum(step_index(xs, x), 1.0), float(len(xs) - 1))
    x0, x1 = take(xs, j - 1), take(xs, j)
    return j, minimum(maximum((x - x0) / (x1 - x0), 0.0), 1.0)


def _blend(y0: Real, y1: Real, w: Real | float) -> Real:
    """Linear interpolation between two values at weight ``w``."""
    return y0 * (1 - w) + y1 * w


def _table(
    kernel: str,
    source: str,
    seq_lengths: tuple[int, ...],
    rows: dict[int, tuple[float, ...]],
) -> AttentionKernelRates:
    dims = tuple(sorted(rows))
    return AttentionKernelRates(
        kernel=kernel,
        source=source,
        head_dims=dims,
        seq_lengths=seq_lengths,
        tflops=tuple(rows[d] for d in dims),
    )


_FA2_SEQ = (512, 1024, 2048, 4096, 8192, 16384)

#: A100 80GB SXM4, FlashAttention-2, causal, forward + backward, bf16/fp16
#: (``shared/reference/microbenchmarks.md`` section 3.1, ``fa2_readme``).
A100_FLASH_ATTENTION_2 = _table(
    "FlashAttention-2",
    "microbenchmarks.md 3.1 (fa2_readme): A100 80GB SXM4, causal, fwd+bwd",
    _FA2_SEQ,
    {64: (88, 119, 140, 156, 165, 171), 128: (99, 133, 155, 173, 182, 189)},
)

#: H100 80GB SXM5, FlashAttention-2, causal, forward + backward (microbenchmarks.md 3.1). The
#: only forward + backward Hopper table there; cuDNN fused attention and FlashAttention-3 are
#: published forward-only (3.2), so Hopper's fused attention is priced at FA2's rates (a lower
#: bound on what Transformer Engine's cuDNN backend reaches). H200: the Azure FA2 figure at 8k,
#: d = 128 (329.3 TFLOP/s) equals H100's (327.9), so H200 uses the same table.
H100_FLASH_ATTENTION_2 = _table(
    "FlashAttention-2",
    "microbenchmarks.md 3.1 (fa2_readme): H100 80GB SXM5, causal, fwd+bwd",
    _FA2_SEQ,
    {64: (141, 192, 232, 257, 273, 284), 128: (163, 221, 265, 294, 308, 328)},
)


def _scaled(
    base: AttentionKernelRates, factor: float, kernel: str, source: str
) -> AttentionKernelRates:
    return AttentionKernelRates(
        kernel=kernel,
        source=source,
        head_dims=base.head_dims,
        seq_lengths=base.seq_lengths,
        tflops=tuple(tuple(rate * factor for rate in row) for row in base.tflops),
    )


#: B200: one measured point, FlashAttention-4 inside a Llama-3.1-8B training step, causal
#: forward + backward at 8k tokens: 834 TFLOP/s (microbenchmarks.md 3.3, ``mlengr_upgrade``).
#: The curve's shape over sequence length and head dimension is H100 FA2's, scaled so that its
#: d = 128, 8k point equals that measurement (834 / 308): an assumption, stated.
B200_FLASH_ATTENTION_4 = _scaled(
    H100_FLASH_ATTENTION_2,
    834 / 308,
    "FlashAttention-4",
    "microbenchmarks.md 3.3 (mlengr_upgrade): B200, causal fwd+bwd at 8k = 834 TFLOP/s; "
    "shape of H100 FA2 (3.1)",
)

#: B300: no attention measurement (microbenchmarks.md 3 has none). B200's table scaled by the two
#: parts' measured bf16 matmul ceilings, MAMF 1769 / 1745 TFLOP/s (microbenchmarks.md 1,
#: ``mlengr_mamf``): an assumption that the fused kernel tracks the tensor cores, stated.
B300_FLASH_ATTENTION_4 = _scaled(
    B200_FLASH_ATTENTION_4,
    mamf_ratio("B300", "B200", Datatype.BF16),
    "FlashAttention-4",
    "B200 FA4 table (microbenchmarks.md 3.3) x MAMF B300/B200 bf16 1769/1745 (1); assumed",
)

#: GB200 (and GB300, whose bf16 peak is GB200's): B200's table scaled by MAMF 1822 / 1745
#: (microbenchmarks.md 1, ``mlengr_mamf``), an assumption as for B300. The one GB200 attention
#: measurement, FlashAttention-2 at 8k, d = 128 on Azure ND GB200 v6 (373.9 TFLOP/s,
#: microbenchmarks.md 3.3, ``azure_abg_gb200``; mode and mask not stated), is not used: FA2 does
#: not use Blackwell's tensor-core instructions (on the same harness it is only 373.9 / 327.9 =
#: 1.14 x H100, while FA4 in a training step reaches 834 / 308 = 2.7 x H100's FA2), and training
#: on Blackwell runs cuDNN / FlashAttention-4 kernels.
GB200_FLASH_ATTENTION_4 = _scaled(
    B200_FLASH_ATTENTION_4,
    mamf_ratio("GB200", "B200", Datatype.BF16),
    "FlashAttention-4",
    "B200 FA4 table (microbenchmarks.md 3.3) x MAMF GB200/B200 bf16 1822/1745 (1); assumed",
)
