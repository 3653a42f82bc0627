"""Per-rank operation order of each pipeline schedule, as Megatron-LM runs it.

Source: Megatron-LM ``megatron/core/pipeline_parallel/schedules.py``
(``forward_backward_pipelining_without_interleaving``, ``..._with_interleaving``,
``get_schedule_table``, ``get_pp_rank_microbatches``), summarised in
``shared/reference/schedules.md`` sections 1-3; ZB-H1 from Qi et al. 2023 (Section 3.1, Figure 3);
combined 1F1B from ``pipeline_parallel/combined_1f1b.py`` (@d98e8a64).

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

from blueprinting.analysis.pipeline_contract import combined_warmup
from blueprinting.errors import InvalidStrategyError, LawViolation, RuleSet
from blueprinting.mapping.laws import (
    dualpipe_laws,
    interleaving_degree_ok,
    microbatch_group_in_bounds,
    microbatch_group_remainder_ok,
)
from blueprinting.mapping.transformer import (
    CombinedOneForwardOneBackward,
    DualPipe,
    DualPipeV,
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
    receive_at: IntArray | Sequence[int] | None = None
    send_after: IntArray | Sequence[int] | None = None
    """Explicit P2P points (DualPipe's batched ``comm_ops``), overriding ``step_starts``: the
    input message of op i must have arrived before op ``receive_at[i]`` (<= i) starts, and
    op i's output leaves when op ``send_after[i]`` (>= i) has finished."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StageGraph:
    """Where every (rank, chunk) sits in the pipeline: ``position[r][c]`` numbers the
    virtual stages 0 .. p*v - 1 so that a microbatch's forward goes from position k to k + 1
    within one *line*; ``line_starts`` are the positions where a line begins (no forward input).
    ``microbatches``: microbatches per line. One line for 1F1B, interleaving and DualPipeV; two
    (one per direction, each with half the microbatches) for DualPipe."""

    position: tuple[tuple[int, ...], ...]
    line_starts: tuple[int, ...]
    microbatches: int
    local_handoff: bool = False
    """Whether consecutive stages on one rank hand over in memory (DualPipeV's turn) rather
    than through a P2P message (Megatron's ring, which sends even to itself when p = 1)."""


def stage_graph(schedule: PipelineSchedule, p: int, m: int, v: int) -> StageGraph:
    """The stage graph of ``schedule``: virtual stage c*p + r for Megatron's schedules
    (Narayanan et al. 2021, Section 2.2.2); for DualPipeV rank r holds stages r and 2p-1-r
    (``dualpipev.py``: the last rank hands chunk 0's output to its own chunk 1); for DualPipe
    chunk 0 of rank r is stage r of the forward line, chunk 1 stage p-1-r of the reverse line,
    each line running m / 2 microbatches (``dualpipe.py`` ``step``: ``half_num_chunks``)."""
    match schedule:
        case DualPipeV():
            return StageGraph(
                position=tuple((r, 2 * p - 1 - r) for r in range(p)),
                line_starts=(0,),
                microbatches=m,
                local_handoff=True,
            )
        case DualPipe():
            return StageGraph(
                position=tuple((r, p + (p - 1 - r)) for r in range(p)),
                line_starts=(0, p),
                microbatches=m // 2,
            )
        case (
            SingleStage()
            | OneForwardOneBackward()
            | InterleavedOneForwardOneBackward()
            | CombinedOneForwardOneBackward()
            | ForwardOnly()
            | ZeroBubbleH1()
        ):
            return StageGraph(
                position=tuple(tuple(c * p + r for c in range(v)) for r in range(p)),
                line_starts=(0,),
                microbatches=m,
            )
        case _ as unreachable:
            assert_never(unreachable)


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
        case CombinedOneForwardOneBackward(virtual_stages=1):
            if p != 1:
                bad(
                    "combined_1f1b_virtual_pipeline",
                    "p > 1 => v > 1",
                    f"combined 1F1B with p = {p} needs a virtual pipeline (v > 1), got v = 1",
                    p=p,
                )
            if v != 1:
                bad("chunk_count", "costs v == schedule v", f"costs give v = {v}, schedule 1")
        case (
            InterleavedOneForwardOneBackward(
                virtual_stages=sv, microbatch_group_size=group, overlap_p2p_comm=overlap
            )
            | CombinedOneForwardOneBackward(
                virtual_stages=sv, microbatch_group_size=group, overlap_p2p_comm=overlap
            )
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
        case DualPipe() | DualPipeV():
            # Not Megatron's: these are deepseek-ai/DualPipe's own start-up assertions.
            out.extend(dualpipe_violations(schedule, p, m, v))
        case _ as unreachable:
            assert_never(unreachable)
    return out


def dualpipe_violations(
    schedule: DualPipe | DualPipeV, p: int, m: int, v: int
) -> list[LawViolation]:
    """DeepSeek's start-up assertions (:func:`blueprinting.mapping.laws.dualpipe_laws`) and the
    two chunks per rank both schedules run."""
    out = dualpipe_laws(schedule, p, m)
    if v != 2:
        out.append(
            LawViolation(
                law="dualpipe_chunks",
                formula="v == 2",
                values=(("v", v),),
                message=f"{schedule} runs two chunks per rank, costs give v = {v}",
            )
        )
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
    warm = min(2 * (p - r - 1) + (v - 1) * n, m * v)
    return _table_order(m, v, n, warm, stepped=not overlap)


def _table_order(m: int, v: int, n: int, warm: int, *, stepped: bool) -> RankOrder:
    """Megatron's schedule table run as ``warm`` forwards, steady (forward of entry
    ``warm + k``, backward of entry ``k``) pairs and the cool-down backwards; ``stepped``: each
    steady pair is one step (its P2P blocking at the step's end), else every op is its own."""
    micro, chunk = _table_arrays(m, v, n)
    total = m * v
    steady = total - warm
    kinds = np.concatenate([np.full(warm, _F), np.tile([_F, _B], steady), np.full(warm, _B)])
    steady_chunks = np.stack([chunk[warm:], v - 1 - chunk[:steady]], axis=1).reshape(-1)
    steady_micro = np.stack([micro[warm:], micro[:steady]], axis=1).reshape(-1)
    ops = _ops(
        kinds,
        np.concatenate([chunk[:warm], steady_chunks, v - 1 - chunk[steady:]]),
        np.concatenate([micro[:warm], steady_micro, micro[steady:]]),
    )
    if not stepped:
        return RankOrder(ops=ops)
    starts = np.concatenate(
        [np.arange(warm), warm + 2 * np.arange(steady), warm + 2 * steady + np.arange(warm)]
    )
    return RankOrder(ops=ops, step_starts=starts)


def combined_order(p: int, v: int, m: int, n: int, r: int) -> RankOrder:
    """Combined 1F1B on rank r (Megatron-Core ``combined_1f1b.py``,
    ``combined_1f1b_schedule_for_interleaved_pipelining`` / ``..._for_no_pipelining``
    @d98e8a64): Megatron's schedule table as in :func:`interleaved_order`, with
    :func:`combined_warmup` forwards run alone, then steady steps that each run the forward of
    table entry ``warm + k`` and the backward of entry ``k`` as one co-scheduled pass
    (``TransformerModelChunkSchedulePlan.run``: every P2P receive before it, every send after),
    then the cool-down backwards alone. A step of two operations is the co-scheduled pair: the
    DAG builder gives single-operation steps the unpaired extra of
    :class:`~blueprinting.simulator.costs.ScheduleCosts`."""
    return _table_order(m, v, n, int(combined_warmup(p, v, m, n, r)), stepped=True)


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
        case CombinedOneForwardOneBackward(microbatch_group_size=group):
            n = p if group is None else group
            return [combined_order(p, v, m, n, r) for r in range(p)]
        case DualPipe():
            return [dualpipe_order(p, m, r) for r in range(p)]
        case DualPipeV():
            return [dualpipev_order(p, m, r) for r in range(p)]
        case _ as unreachable:
            assert_never(unreachable)


class _Program:
    """Records one rank's DualPipe program as ``dualpipe.py`` issues it: compute ops in order,
    and for every op the op before which its input is received (the ``comm_ops`` batch is
    committed and waited on at the start of every ``_*_chunk`` call) and the op after which its
    output is sent (sends join the next batch, issued at the next commit)."""

    def __init__(self, chunk_of_phase: tuple[int, int]) -> None:
        self.chunk = chunk_of_phase
        self.ops: list[Op] = []
        self.receive_at: list[int] = []
        self.send_after: list[int] = []
        self.count = {(kind, c): 0 for kind in (_F, _B) for c in (0, 1)}
        self.recv_count = dict(self.count)
        self.send_count = dict(self.count)
        self.index: dict[tuple[int, int, int], int] = {}  # (F or B, chunk, mb) -> op index
        self.pending_recv: list[tuple[int, int, int]] = []
        self.pending_send: list[tuple[int, int, int]] = []
        self.early_recv: dict[tuple[int, int, int], int] = {}
        self.weights: list[tuple[int, int]] = []  # FIFO of deferred weight gradients

    def recv(self, kind: int, phase: int) -> None:
        c = self.chunk[phase]
        self.pending_recv.append((kind, c, self.recv_count[kind, c]))
        self.recv_count[kind, c] += 1

    def send(self, kind: int, phase: int) -> None:
        c = self.chunk[phase]
        self.pending_send.append((kind, c, self.send_count[kind, c]))
        self.send_count[kind, c] += 1

    def commit(self) -> None:
        at = len(self.ops)
        for key in self.pending_recv:
            self.early_recv[key] = at
        for key in self.pending_send:
            self.send_after[self.index[key]] = at - 1
        self.pending_recv, self.pending_send = [], []

    def _append(self, kind: int, c: int, mb: int, key: tuple[int, int, int] | None) -> None:
        at = len(self.ops)
        self.ops.append((kind, c, mb))
        self.receive_at.append(at if key is None else self.early_recv.pop(key, at))
        self.send_after.append(at)
        if key is not None:
            self.index[key] = at

    def forward(self, phase: int) -> None:
        c = self.chunk[phase]
        mb = self.count[_F, c]
        self.count[_F, c] += 1
        self._append(_F, c, mb, (_F, c, mb))

    def backward(self, phase: int, *, zero_bubble: bool = False) -> None:
        c = self.chunk[phase]
        mb = self.count[_B, c]
        self.count[_B, c] += 1
        self._append(_BI if zero_bubble else _B, c, mb, (_B, c, mb))
        if zero_bubble:
            self.weights.append((c, mb))

    def weight(self) -> None:
        self.commit()
        c, mb = self.weights.pop(0)
        self._append(_W, c, mb, None)

    # The four calls of dualpipe.py, with its defaults.
    def forward_chunk(self, phase: int, *, recv: bool = True, send: bool = True) -> None:
        if recv:
            self.recv(_F, phase)
        self.commit()
        self.forward(phase)
        if send:
            self.send(_F, phase)

    def backward_chunk(
        self, phase: int, *, zero_bubble: bool = False, recv: bool = True, send: bool = True
    ) -> None:
        if recv:
            self.recv(_B, phase)
        self.commit()
        self.backward(phase, zero_bubble=zero_bubble)
        if send:
            self.send(_B, phase)

    def forward_backward_chunk(self, phase0: int, phase1: int, *, recv0: bool = True) -> None:
        # F&B: without an ``overlapped_forward_backward`` module the forward then the backward.
        if recv0:
            self.recv(_F, phase0)
        self.recv(_B, phase1)
        self.commit()
        self.forward(phase0)
        self.backward(phase1)
        self.send(_F, phase0)
        self.send(_B, phase1)

    def order(self) -> RankOrder:
        self.commit()
        if self.weights or self.early_recv:
            raise AssertionError("DualPipe program left weight passes or receives pending")
        return RankOrder(
            ops=np.asarray(self.ops, dtype=np.int64).reshape(-1, 3),
            receive_at=np.asarray(self.receive_at, dtype=np.int64),
            send_after=np.asarray(self.send_after, dtype=np.int64),
        )


def _dual_program(
    program: _Program, ranks: int, rank: int, chunks: int, *, last: bool, mirrored: bool
) -> None:
    """The eight steps shared by ``DualPipe.step`` and ``DualPipeV.step`` (@3da1bbe), for
    ``ranks`` = half the ranks (DualPipe) or all of them (DualPipeV), ``rank`` = the half rank
    (DualPipe) or the rank, ``chunks`` = microbatches per direction (DualPipe) or in all
    (DualPipeV), ``last`` = DualPipe's middle rank or DualPipeV's last rank, ``mirrored``: DualPipe
    (its middle ranks send the step-2 forwards of phase 0 at once, DualPipeV always after F1)."""
    pr = program
    for _ in range((ranks - rank - 1) * 2):  # step 1: nF0
        pr.forward_chunk(0)
    step_2 = rank + 1  # step 2: nF0F1
    pr.recv(_F, 0)
    for i in range(step_2):
        pr.forward_chunk(0, recv=False, send=mirrored and last)
        pr.recv(_F, 0)
        pr.forward_chunk(1, send=(not last) or (i < step_2 - 1))
        if not (mirrored and last):
            pr.send(_F, 0)
    for _ in range(ranks - rank - 1):  # step 3: nB1W1F1
        pr.backward_chunk(1, zero_bubble=True)
        pr.recv(_F, 1)
        pr.weight()
        pr.forward_chunk(1, recv=False)
    for i in range(chunks - 2 * ranks + rank + 1):  # step 4: nF0B1F1B0
        if i == 0:
            if last:
                pr.forward_chunk(0, recv=False, send=False)
                pr.send(_F, 1)
                pr.backward_chunk(1, send=False)
                pr.send(_F, 0)
                pr.send(_B, 1)
            else:
                pr.forward_backward_chunk(0, 1, recv0=False)
        else:
            pr.forward_backward_chunk(0, 1)
        pr.forward_backward_chunk(1, 0)
    for _ in range(ranks - rank - 1):  # step 5: nB1F1B0
        pr.backward_chunk(1)
        pr.forward_backward_chunk(1, 0)
    step_6 = rank + 1  # step 6: nB1B0, the second half with zero bubble
    zero_bubble = False
    for i in range(step_6):
        if i == step_6 // 2 and rank % 2 == 1:
            zero_bubble = True
        pr.backward_chunk(1, zero_bubble=zero_bubble)
        if i == step_6 // 2 and rank % 2 == 0:
            zero_bubble = True
        pr.backward_chunk(0, zero_bubble=zero_bubble)
    for _ in range(ranks - rank - 1):  # step 7: nWB0
        pr.weight()
        pr.backward_chunk(0, zero_bubble=True)
    for _ in range(rank + 1):  # step 8: nW
        pr.weight()


def dualpipe_order(p: int, m: int, r: int) -> RankOrder:
    """DualPipe's program on rank r (``dualpipe.py`` ``step``): ranks of the second half run the
    first half's program mirrored (``phase ^= is_in_second_half``), so their phase 0 is the
    reverse direction (chunk 1)."""
    second_half = r >= p // 2
    program = _Program((1, 0) if second_half else (0, 1))
    half_rank = min(r, p - 1 - r)
    _dual_program(program, p // 2, half_rank, m // 2, last=half_rank == p // 2 - 1, mirrored=True)
    return program.order()


def dualpipev_order(p: int, m: int, r: int) -> RankOrder:
    """DualPipeV's program on rank r (``dualpipev.py`` ``step``)."""
    program = _Program((0, 1))
    _dual_program(program, p, r, m, last=r == p - 1, mirrored=False)
    return program.order()
