"""Per-rank operation order of each pipeline schedule, as Megatron-LM runs it.

Source: Megatron-LM ``megatron/core/pipeline_parallel/schedules.py``
(``forward_backward_pipelining_without_interleaving``, ``..._with_interleaving``,
``get_schedule_table``, ``get_pp_rank_microbatches``), summarised in
``shared/reference/schedules.md`` sections 1-3; ZB-H1 from Qi et al. 2023 (Section 3.1, Figure 3).

An order is an ``(ops, 3)`` integer array of ``(kind, chunk, microbatch)`` rows (built with numpy:
half a million of them for p=64, v=4, m=1024; hand-written orders may be lists of tuples) grouped
into *steps*. A step models one blocking P2P call of
Megatron: every message the step's operations need is received before the step's first
operation, and every message they produce is sent after its last one. Schedules whose P2P is
matched to each operation (non-interleaved 1F1B, overlapped interleaving, ZB-H1, forward-only)
have one operation per step: pure dataflow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import TypeAlias, assert_never, final

import numpy as np
import numpy.typing as npt

from blueprinting.errors import InvalidStrategyError, LawViolation, RuleSet
from blueprinting.mapping.laws import (
    interleaving_degree_ok,
    microbatch_group_in_bounds,
    microbatch_group_remainder_ok,
)
from blueprinting.mapping.transformer import (
    ForwardOnly,
    InterleavedOneForwardOneBackward,
    OneForwardOneBackward,
    PipelineSchedule,
    SingleStage,
    ZeroBubbleH1,
)


class OpKind(IntEnum):
    """Compute operation kinds. ``BACKWARD`` is the whole backward; split-backward schedules run
    ``BACKWARD_INPUT`` (input gradient, sent upstream) then ``WEIGHT_GRAD``."""

    FORWARD = 0
    BACKWARD = 1
    BACKWARD_INPUT = 2
    WEIGHT_GRAD = 3


Op = tuple[int, int, int]
"""(OpKind value, chunk, microbatch)."""

IntArray: TypeAlias = npt.NDArray[np.int64]

_F = int(OpKind.FORWARD)
_B = int(OpKind.BACKWARD)
_BI = int(OpKind.BACKWARD_INPUT)
_W = int(OpKind.WEIGHT_GRAD)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RankOrder:
    """The program of one pipeline rank's compute stream.

    ``step_starts`` lists the positions where a blocking P2P step begins (sorted, starting with 0);
    ``None`` means every operation is its own step (dataflow P2P). ``wait_own_sends``: each
    forward (backward) also waits until the previous forward's (backward's) outgoing message has
    left, as Megatron's overlapped interleaving does by waiting on ``fwd_wait_handles`` /
    ``bwd_wait_handles``, which hold both the receive and the previous send.
    """

    ops: IntArray | Sequence[Op]
    step_starts: IntArray | Sequence[int] | None = None
    wait_own_sends: bool = False


def megatron_violations(
    schedule: PipelineSchedule, pipeline_degree: int, microbatch_count: int, virtual_stages: int
) -> list[LawViolation]:
    """Every rule Megatron-LM enforces at start-up for this schedule (schedules.md section 3)."""
    p, m, v = pipeline_degree, microbatch_count, virtual_stages
    out: list[LawViolation] = []

    def bad(law: str, formula: str, message: str, **values: int | bool) -> None:
        out.append(
            LawViolation(
                law=law,
                formula=formula,
                values=tuple(values.items()),
                message=message,
                ruleset=RuleSet.MEGATRON,
            )
        )

    match schedule:
        case SingleStage():
            if p != 1:
                bad("single_stage_degree", "p == 1", f"SingleStage needs p = 1, got p = {p}", p=p)
            if v != 1:
                bad("single_stage_chunks", "v == 1", f"SingleStage has one chunk, got v = {v}", v=v)
        case OneForwardOneBackward() | ForwardOnly() | ZeroBubbleH1():
            if v != 1:
                bad(
                    "non_interleaved_chunks",
                    "v == 1",
                    f"{schedule} runs one chunk per stage, costs give v = {v}",
                    v=v,
                )
        case InterleavedOneForwardOneBackward(
            virtual_stages=sv, microbatch_group_size=group, overlap_p2p_comm=overlap
        ):
            n = p if group is None else group
            if sv != v:
                bad("chunk_count", "costs v == schedule v", f"costs give v = {v}, schedule {sv}")
            if not interleaving_degree_ok(p, overlap):
                bad(
                    "interleaving_degree",
                    "p > 2 or (p == 2 and overlap_p2p_comm)",
                    f"interleaving needs p > 2 (or p = 2 with overlap_p2p_comm), got p = {p}",
                    p=p,
                    overlap_p2p_comm=overlap,
                )
            if not microbatch_group_in_bounds(p, n, m):
                bad(
                    "microbatch_group_size_range",
                    "p <= N <= m",
                    f"microbatch group size N = {n} must lie in [p, m] = [{p}, {m}]",
                    N=n,
                    p=p,
                    m=m,
                )
            elif not microbatch_group_remainder_ok(p, n, m):
                bad(
                    "microbatch_group_remainder",
                    "m % N == 0 or m % N >= p",
                    f"m % N = {m % n} introduces dependency bubbles (needs 0 or >= p = {p})",
                    N=n,
                    p=p,
                    m=m,
                )
        case _ as unreachable:
            assert_never(unreachable)
    return out


def check_megatron(
    schedule: PipelineSchedule, pipeline_degree: int, microbatch_count: int, virtual_stages: int
) -> None:
    violations = megatron_violations(schedule, pipeline_degree, microbatch_count, virtual_stages)
    if violations:
        raise InvalidStrategyError(violations, subject=f"pipeline schedule {schedule}")


def one_f_one_b_order(p: int, m: int, r: int, *, forward_only: bool = False) -> RankOrder:
    """PipeDream-Flush 1F1B (Narayanan et al. 2021, Section 2.2.1): ``min(p-r-1, m)`` warm-up
    forwards, steady (F, B) pairs, cool-down backwards."""
    if forward_only:
        return RankOrder(ops=_ops(np.full(m, _F), np.zeros(m, np.int64), np.arange(m)))
    warm = min(p - r - 1, m)
    steady = m - warm
    kinds = np.concatenate([np.full(warm, _F), np.tile([_F, _B], steady), np.full(warm, _B)])
    pairs = np.stack([np.arange(warm, m), np.arange(steady)], axis=1).reshape(-1)
    micro = np.concatenate([np.arange(warm), pairs, np.arange(steady, m)])
    return RankOrder(ops=_ops(kinds, np.zeros(2 * m, np.int64), micro))


def _ops(kinds: npt.ArrayLike, chunks: npt.ArrayLike, micro: npt.ArrayLike) -> IntArray:
    return np.stack(
        [np.asarray(kinds, np.int64), np.asarray(chunks, np.int64), np.asarray(micro, np.int64)],
        axis=1,
    )


def interleaved_table(m: int, v: int, n: int) -> list[tuple[int, int]]:
    """Megatron's schedule table: (microbatch, chunk) in groups of N microbatches, each group run
    on chunk 0, then chunk 1, ...; the last group holds whatever microbatches remain."""
    table: list[tuple[int, int]] = []
    for lo in range(0, m, n):
        hi = m if lo + n >= m else lo + n
        table.extend((j, c) for c in range(v) for j in range(lo, hi))
    return table


def _table_arrays(m: int, v: int, n: int) -> tuple[IntArray, IntArray]:
    """:func:`interleaved_table` as two arrays (microbatch, chunk)."""
    micro: list[IntArray] = []
    chunk: list[IntArray] = []
    for lo in range(0, m, n):
        hi = m if lo + n >= m else lo + n
        micro.append(np.tile(np.arange(lo, hi, dtype=np.int64), v))
        chunk.append(np.repeat(np.arange(v, dtype=np.int64), hi - lo))
    return np.concatenate(micro), np.concatenate(chunk)


def interleaved_order(p: int, v: int, m: int, n: int, r: int, *, overlap: bool) -> RankOrder:
    """Interleaved 1F1B (Narayanan et al. 2021, Section 2.2.2; Megatron's
    ``forward_backward_pipelining_with_interleaving``).

    k-th forward = table[k]; k-th backward = (table[k].microbatch, v-1-table[k].chunk). Warm-up
    ``min(2(p-r-1) + (v-1)N, m v)`` forwards. Without ``overlap_p2p_comm`` every steady step
    (F then B) ends with one blocking ``send_forward_backward_recv_forward_backward``, so the
    forward's output leaves only after the step's backward; with it, P2P is asynchronous and
    each operation waits only for its own input.
    """
    micro, chunk = _table_arrays(m, v, n)
    total = m * v
    warm = min(2 * (p - r - 1) + (v - 1) * n, total)
    steady = total - warm
    kinds = np.concatenate([np.full(warm, _F), np.tile([_F, _B], steady), np.full(warm, _B)])
    steady_chunks = np.stack([chunk[warm:], v - 1 - chunk[:steady]], axis=1).reshape(-1)
    steady_micro = np.stack([micro[warm:], micro[:steady]], axis=1).reshape(-1)
    ops = _ops(
        kinds,
        np.concatenate([chunk[:warm], steady_chunks, v - 1 - chunk[steady:]]),
        np.concatenate([micro[:warm], steady_micro, micro[steady:]]),
    )
    if overlap:
        return RankOrder(ops=ops)
    starts = np.concatenate(
        [np.arange(warm), warm + 2 * np.arange(steady), warm + 2 * steady + np.arange(warm)]
    )
    return RankOrder(ops=ops, step_starts=starts)


def zero_bubble_h1_order(p: int, m: int, r: int) -> RankOrder:
    """ZB-H1 (Qi et al. 2023, Section 3.1): 1F1B order with B = input gradient only; rank r
    defers its first ``r`` weight-gradient passes W, so its B passes (the upstream critical path)
    run as early as in 1F1B with t_B instead of t_B + t_W, and the deferred W passes fill the
    cool-down. In-flight activations (+1 per F, -1 per W) peak at p - r + r = p on every rank."""
    warm = min(p - r - 1, m)
    ops: list[Op] = [(_F, 0, j) for j in range(warm)]
    next_w = 0
    done_b = 0
    for i in range(m - warm):
        ops.append((_F, 0, warm + i))
        ops.append((_BI, 0, i))
        done_b += 1
        if done_b - next_w > r:
            ops.append((_W, 0, next_w))
            next_w += 1
    for j in range(m - warm, m):
        ops.append((_BI, 0, j))
        done_b += 1
        if done_b - next_w > r:
            ops.append((_W, 0, next_w))
            next_w += 1
    ops.extend((_W, 0, j) for j in range(next_w, m))
    return RankOrder(ops=np.asarray(ops, dtype=np.int64).reshape(-1, 3))


def rank_orders(
    schedule: PipelineSchedule, pipeline_degree: int, microbatch_count: int, virtual_stages: int
) -> list[RankOrder]:
    """The compute-stream program of every rank, in Megatron's order."""
    p, m, v = pipeline_degree, microbatch_count, virtual_stages
    match schedule:
        case SingleStage() | OneForwardOneBackward():
            return [one_f_one_b_order(p, m, r) for r in range(p)]
        case ForwardOnly():
            return [one_f_one_b_order(p, m, r, forward_only=True) for r in range(p)]
        case ZeroBubbleH1():
            return [zero_bubble_h1_order(p, m, r) for r in range(p)]
        case InterleavedOneForwardOneBackward(
            microbatch_group_size=group, overlap_p2p_comm=overlap
        ):
            n = p if group is None else group
            return [interleaved_order(p, v, m, n, r, overlap=overlap) for r in range(p)]
        case _ as unreachable:
            assert_never(unreachable)
