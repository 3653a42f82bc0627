"""The seed's analytic 1F1B bubble contract, exactly as written and labelled.

Seed, "Pipeline-schedule mapping":

    T_chunk  = T_forward_chunk + T_backward_chunk          (of ONE virtual chunk)
    n_bubble = (p - 1) + extra_interleaving_bubbles
    extra_interleaving_bubbles = (v - 1) * (p - m mod p)   when m mod p != 0, else 0
    T_bubble = n_bubble * T_chunk - T_imbalance_correction

It is the same contract as Calculon's ``bubble_time`` (calculon/llm/llm.py, caa4b11), whose
imbalance correction is ``(p - L mod p) * (T_fw_block + T_bw_block)`` for uneven layer counts.

This is an analytical contract, not an execution fact. ``../shared/reference/schedules.md`` §4
records where it departs from what Megatron-LM runs: for every schedule Megatron accepts the real
bubble is (p - 1) * T_chunk; the extra interleaving term only describes schedules Megatron refuses,
and the imbalance correction still overestimates uneven bubbles. The concrete scheduler
(:mod:`blueprinting.simulator`) reports the measured figure beside this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import numpy as np
import numpy.typing as npt

from blueprinting.hardware.polymorphic import Count, Real, where


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class BubbleContract:
    """The seed's contract evaluated: every term kept so a report can show its arithmetic."""

    pipeline_degree: int
    virtual_stages: int
    microbatch_count: int
    chunk_time_s: float
    extra_interleaving_bubbles: int
    imbalance_correction_s: float

    @property
    def n_bubble(self) -> int:
        return bubble_count(self.pipeline_degree, self.extra_interleaving_bubbles)

    @property
    def bubble_s(self) -> float:
        return bubble_seconds(float(self.n_bubble), self.chunk_time_s, self.imbalance_correction_s)


# The contract's terms on a plan's numbers or on the search's columns of them
# (:mod:`blueprinting.hardware.polymorphic`): the scalar plan and the vectorized search share them.


def extra_interleaving_bubbles(p: Count, v: Count, m: Count) -> Count:
    """(v - 1) * (p - m mod p) when m mod p != 0, else 0 (seed)."""
    remainder = m % p
    return where(remainder == 0, remainder * 0, (v - 1) * (p - remainder))


def bubble_count(p: Count, extra: Count) -> Count:
    """n_bubble = (p - 1) + extra_interleaving_bubbles (seed)."""
    return (p - 1) + extra


def bubble_seconds(n_bubble: Real, chunk_time_s: Real, correction_s: Real) -> Real:
    """T_bubble = n_bubble * T_chunk - T_imbalance_correction (seed)."""
    return n_bubble * chunk_time_s - correction_s


def analytic_bubble(
    *,
    p: int,
    v: int,
    m: int,
    forward_chunk_s: float,
    backward_chunk_s: float,
    imbalance_correction_s: float = 0.0,
) -> BubbleContract:
    """Evaluate the seed's contract. ``forward_chunk_s``/``backward_chunk_s`` are the critical
    paths of ONE virtual chunk (L / (p*v) blocks), backward including recompute."""
    return BubbleContract(
        pipeline_degree=p,
        virtual_stages=v,
        microbatch_count=m,
        chunk_time_s=forward_chunk_s + backward_chunk_s,
        extra_interleaving_bubbles=extra_interleaving_bubbles(p, v, m),
        imbalance_correction_s=imbalance_correction_s,
    )


def imbalance_correction(
    *, p: Real, max_blocks_per_stage: Real, total_blocks: Real, block_fw_bw_s: Real
) -> Real:
    """T_imbalance_correction: the stages that hold fewer blocks than the most loaded one shorten
    the bubble by their missing blocks' forward+backward time (Calculon's
    ``bubble_reduction_time``: (p - L mod p) missing blocks when L = p*ceil(L/p) - missing); the
    counts as floats (exact below 2**53)."""
    missing = p * max_blocks_per_stage - total_blocks
    return missing * block_fw_bw_s


def combined_warmup(
    p: npt.ArrayLike, v: npt.ArrayLike, m: npt.ArrayLike, n: npt.ArrayLike, r: npt.ArrayLike
) -> npt.NDArray[np.int64]:
    """Warm-up forwards of combined 1F1B on rank r: the interleaved count plus one
    (``schedules.py`` l.964-970 @d98e8a64, "one extra micro-batch forward step before the 1f1b
    stages", so that the forward and the backward of every steady step are independent), at
    most m v; 1 without pipelining (``combined_1f1b_schedule_for_no_pipelining``). On arrays
    too: the plan and the vectorized search read it for the unpaired passes."""
    pa, va, ma, na, ra = (np.asarray(x, dtype=np.int64) for x in (p, v, m, n, r))
    return np.asarray(np.minimum(2 * (pa - ra - 1) + (va - 1) * na + 1, ma * va), dtype=np.int64)
