"""The seed's pure-Python command builder and event-driven engine, kept verbatim as the reference
the vectorized builder (simulator/commands.py) and the wavefront engine (simulator/engine.py) are
checked against: same commands, ids, dependencies, programs, and bitwise-equal start/end times.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import final

from blueprinting.errors import DeadlockError, VerificationError
from blueprinting.mapping.transformer import ForwardOnly, PipelineSchedule
from blueprinting.simulator.costs import DpBucket, ScheduleCosts
from blueprinting.simulator.schedules import OpKind, check_megatron, rank_orders
from blueprinting.simulator.schedules import RankOrder as FastRankOrder


class CommandKind(StrEnum):
    FORWARD = "F"
    BACKWARD = "B"
    BACKWARD_INPUT = "Bi"
    WEIGHT_GRAD = "W"
    SEND_FORWARD = "send_fwd"
    SEND_BACKWARD = "send_bwd"
    DP_REDUCE = "dp_reduce"


class Stream(StrEnum):
    COMPUTE = "compute"
    COMM = "comm"


# Codes stored per command; the first four equal OpKind values.
KIND_BY_CODE: tuple[CommandKind, ...] = tuple(CommandKind)
_F, _B, _BI, _W = (int(k) for k in OpKind)
_SEND_F, _SEND_B, _DP = 4, 5, 6
COMPUTE_STREAM, COMM_STREAM = 0, 1


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """One command, as read back from a :class:`CommandDag` (``microbatch`` is -1 for DP
    reduction; ``peer`` is the receiving rank of a transfer, else -1)."""

    index: int
    kind: CommandKind
    rank: int
    stream: Stream
    chunk: int
    microbatch: int
    duration_s: float
    deps: tuple[int, ...]
    peer: int

    def __str__(self) -> str:
        where = f"rank {self.rank}"
        match self.kind:
            case CommandKind.DP_REDUCE:
                return f"{where} dp_reduce chunk {self.chunk}"
            case CommandKind.SEND_FORWARD | CommandKind.SEND_BACKWARD:
                return (
                    f"{where} {self.kind} mb {self.microbatch} chunk {self.chunk} "
                    f"-> rank {self.peer}"
                )
            case _:
                return f"{where} {self.kind}{self.microbatch}.{self.chunk}"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RefDag:
    """Column-stored commands (parallel lists, indexed by command id) and the program of each
    stream: ``programs[2 * rank + s]`` with s = 0 compute, 1 communication.

    Stored as columns because p=64, v=4, m=1024 gives about 1.5 million commands.
    """

    schedule: PipelineSchedule
    costs: ScheduleCosts
    kind: list[int]
    rank: list[int]
    chunk: list[int]
    microbatch: list[int]
    duration_s: list[float]
    deps: list[tuple[int, ...]]
    peer: list[int]
    programs: list[list[int]]

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def pipeline_degree(self) -> int:
        return self.costs.pipeline_degree

    def command(self, index: int) -> Command:
        code = self.kind[index]
        return Command(
            index=index,
            kind=KIND_BY_CODE[code],
            rank=self.rank[index],
            stream=Stream.COMPUTE if code <= _W else Stream.COMM,
            chunk=self.chunk[index],
            microbatch=self.microbatch[index],
            duration_s=self.duration_s[index],
            deps=self.deps[index],
            peer=self.peer[index],
        )


def reference_build_schedule(
    schedule: PipelineSchedule, costs: ScheduleCosts, *, allow_megatron_refused: bool = False
) -> RefDag:
    """The command DAG of one iteration of ``schedule`` with ``costs``.

    Raises :class:`~blueprinting.errors.InvalidStrategyError` (every violated rule) for a
    configuration Megatron-LM refuses at start-up, unless ``allow_megatron_refused`` (used to
    study hypothetical schedules such as the seed contract's m mod p != 0 case).
    """
    p, m, v = costs.pipeline_degree, costs.microbatch_count, costs.virtual_stages
    if not allow_megatron_refused:
        check_megatron(schedule, p, m, v)
    orders = [_plain(order) for order in rank_orders(schedule, p, m, v)]
    return reference_build_from_orders(
        schedule, costs, orders, forward_only=isinstance(schedule, ForwardOnly)
    )


def reference_build_from_orders(
    schedule: PipelineSchedule,
    costs: ScheduleCosts,
    orders: list[FastRankOrder] | list[RankOrder],
    *,
    forward_only: bool = False,
) -> RefDag:
    """The DAG of explicit per-rank orders (the extension point for new schedules, and how tests
    build deliberately broken programs). Raises VerificationError if an order misses or repeats
    a pass, or runs a backward before its forward on the same rank."""
    p, m, v = costs.pipeline_degree, costs.microbatch_count, costs.virtual_stages
    orders = [_plain(order) for order in orders]
    if len(orders) != p:
        raise VerificationError(f"building command DAG: {len(orders)} rank orders for p = {p}")
    n_virtual = p * v
    slot_count = n_virtual * m
    ids: list[list[int]] = [[-1] * slot_count for _ in range(4)]
    t_p2p = costs.p2p_time_s
    fwd, bwd = costs.forward_s, costs.backward_s
    wgt = costs.weight_grad_s

    kind: list[int] = []
    rank: list[int] = []
    chunk: list[int] = []
    micro: list[int] = []
    dur: list[float] = []
    peer: list[int] = []
    problems: list[str] = []

    # Pass 1: compute commands, ids in program order.
    for r, order in enumerate(orders):
        for code, c, j in order.ops:
            if not (0 <= c < v and 0 <= j < m):
                problems.append(f"rank {r}: op ({code}, chunk {c}, mb {j}) out of range")
                continue
            slot = (c * p + r) * m + j
            table = ids[code]
            if table[slot] != -1:
                problems.append(f"rank {r}: {KIND_BY_CODE[code]}{j}.{c} scheduled twice")
                continue
            table[slot] = len(kind)
            if code == _F:
                d = fwd[r][c]
            elif code == _B:
                d = bwd[r][c]
            else:
                w = 0.0 if wgt is None else wgt[r][c]
                d = bwd[r][c] - w if code == _BI else w
            kind.append(code)
            rank.append(r)
            chunk.append(c)
            micro.append(j)
            dur.append(d)
            peer.append(-1)
    n_compute = len(kind)
    fid, bid, biid, wid = ids
    # The pass that sends the input gradient upstream: B, or Bi when backward is split.
    grad_id = [b if b != -1 else bi for b, bi in zip(bid, biid, strict=True)]
    if any(x == -1 for x in fid):
        problems.append("some forward passes are never scheduled")
    if not forward_only and any(x == -1 for x in grad_id):
        problems.append("some backward passes are never scheduled")
    for slot in range(slot_count):
        f, g, w = fid[slot], grad_id[slot], wid[slot]
        if g != -1 and (f == -1 or g < f):
            problems.append(f"command {g} runs a backward before its forward on the same rank")
        if w != -1 and (g == -1 or w < g):
            problems.append(f"command {w} runs a weight gradient before its input gradient")
        if len(problems) > 20:
            break
    if problems:
        raise VerificationError("building command DAG: " + "; ".join(problems[:20]))

    deps: list[tuple[int, ...]] = [()] * n_compute
    programs: list[list[int]] = []
    send_of = [-1] * n_compute
    buckets = costs.dp_buckets
    columns = _Columns(
        kind=kind, rank=rank, chunk=chunk, micro=micro, dur=dur, peer=peer, deps=deps
    )

    # Pass 2: per rank, the compute program, and the communication program in posting order.
    for r, order in enumerate(orders):
        ops = order.ops
        compute_prog = [_slot_id(ids, op, p, m, r) for op in ops]
        ends = _step_ends(order)
        comm_prog: list[int] = []
        step_lo = 0
        last_of_chunk: dict[int, int] = {}
        for pos, cid in enumerate(compute_prog):
            code = kind[cid]
            if code != _F:
                last_of_chunk[chunk[cid]] = pos
            if not ends[pos]:
                continue
            for q in range(step_lo, pos + 1):
                src = compute_prog[q]
                s = chunk[src] * p + r
                code = kind[src]
                if code == _F and s < n_virtual - 1:
                    new_kind, dst = _SEND_F, (s + 1) % p
                elif (code in (_B, _BI)) and s > 0:
                    new_kind, dst = _SEND_B, (s - 1) % p
                else:
                    continue
                tid = len(kind)
                kind.append(new_kind)
                rank.append(r)
                chunk.append(chunk[src])
                micro.append(micro[src])
                dur.append(t_p2p)
                peer.append(dst)
                deps.append((cid,))
                send_of[src] = tid
                comm_prog.append(tid)
            step_lo = pos + 1
        if buckets and buckets[r]:
            last_pos = len(compute_prog) - 1
            posted: list[tuple[int, int]] = []
            for b_index, bucket in enumerate(buckets[r]):
                at = last_pos
                if costs.overlap_grad_reduce:
                    at = last_of_chunk.get(bucket.chunk, last_pos)
                posted.append((at, b_index))
            posted.sort()
            # Merge buckets into the transfer order by posting position.
            merged: list[int] = []
            transfer_pos = [_position_of(compute_prog, deps[t][0]) for t in comm_prog]
            bi = 0
            for t, tpos in zip(comm_prog, transfer_pos, strict=True):
                while bi < len(posted) and posted[bi][0] < tpos:
                    at, index = posted[bi]
                    merged.append(len(kind))
                    _append_bucket(columns, r, compute_prog[at], buckets[r][index])
                    bi += 1
                merged.append(t)
            for at, index in posted[bi:]:
                merged.append(len(kind))
                _append_bucket(columns, r, compute_prog[at], buckets[r][index])
            comm_prog = merged
        programs.append(compute_prog)
        programs.append(comm_prog)

    # Pass 3: receives. Every input of a step's operations is waited for at the step's first one.
    for r, order in enumerate(orders):
        compute_prog = programs[2 * r]
        starts = _step_starts(order)
        waiter = compute_prog[0] if compute_prog else -1
        pending: list[int] = []
        for pos, cid in enumerate(compute_prog):
            if starts[pos]:
                if pending:
                    deps[waiter] = deps[waiter] + tuple(pending)
                    pending = []
                waiter = cid
            code = kind[cid]
            s = chunk[cid] * p + r
            j = micro[cid]
            if code == _F:
                if s > 0:
                    pending.append(send_of[fid[(s - 1) * m + j]])
            elif code in (_B, _BI) and s < n_virtual - 1:
                pending.append(send_of[grad_id[(s + 1) * m + j]])
        if pending:
            deps[waiter] = deps[waiter] + tuple(pending)
        if order.wait_own_sends:
            previous = {_F: -1, _B: -1, _BI: -1}
            for cid in compute_prog:
                code = kind[cid]
                if code == _W:
                    continue
                before = previous[code]
                if before != -1 and send_of[before] != -1:
                    deps[cid] = (*deps[cid], send_of[before])
                previous[code] = cid

    return RefDag(
        schedule=schedule,
        costs=costs,
        kind=kind,
        rank=rank,
        chunk=chunk,
        microbatch=micro,
        duration_s=dur,
        deps=deps,
        peer=peer,
        programs=programs,
    )


def _slot_id(ids: list[list[int]], op: tuple[int, int, int], p: int, m: int, r: int) -> int:
    code, c, j = op
    return ids[code][(c * p + r) * m + j]


def _step_starts(order: RankOrder) -> list[bool]:
    n = len(order.ops)
    if order.step_starts is None:
        return [True] * n
    flags = [False] * n
    for s in order.step_starts:
        flags[s] = True
    return flags


def _step_ends(order: RankOrder) -> list[bool]:
    starts = _step_starts(order)
    n = len(starts)
    return [pos == n - 1 or starts[pos + 1] for pos in range(n)]


def _position_of(program: list[int], command: int) -> int:
    # Compute ids are assigned in program order, so a rank's program is a contiguous range.
    return command - program[0]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _Columns:
    kind: list[int]
    rank: list[int]
    chunk: list[int]
    micro: list[int]
    dur: list[float]
    peer: list[int]
    deps: list[tuple[int, ...]]


def _append_bucket(columns: _Columns, r: int, after: int, bucket: DpBucket) -> None:
    columns.kind.append(_DP)
    columns.rank.append(r)
    columns.chunk.append(bucket.chunk)
    columns.micro.append(-1)
    columns.dur.append(bucket.duration_s)
    columns.peer.append(-1)
    columns.deps.append((after,))


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RankOrder:
    """The seed's RankOrder: ops as a list of (kind, chunk, microbatch) tuples."""

    ops: list[tuple[int, int, int]]
    step_starts: list[int] | None = None
    wait_own_sends: bool = False


def _plain(order: FastRankOrder | RankOrder) -> RankOrder:
    ops = [(int(k), int(c), int(j)) for k, c, j in order.ops]
    starts = None if order.step_starts is None else [int(s) for s in order.step_starts]
    return RankOrder(ops=ops, step_starts=starts, wait_own_sends=order.wait_own_sends)


def reference_simulate(dag: RefDag) -> tuple[list[float], list[float]]:
    """The seed's event-driven engine (start, end per command); raises DeadlockError."""
    n = len(dag)
    dur = dag.duration_s
    deps = dag.deps
    programs = dag.programs
    start = [0.0] * n
    end = [-1.0] * n
    ptr = [0] * len(programs)
    free = [0.0] * len(programs)
    waiters: dict[int, list[int]] = {}
    stack = list(range(len(programs) - 1, -1, -1))
    while stack:
        s = stack.pop()
        prog = programs[s]
        i = ptr[s]
        t = free[s]
        size = len(prog)
        while i < size:
            c = prog[i]
            st = t
            blocked = -1
            for d in deps[c]:
                e = end[d]
                if e < 0.0:
                    blocked = d
                    break
                st = max(st, e)
            if blocked >= 0:
                waiters.setdefault(blocked, []).append(s)
                break
            t = st + dur[c]
            start[c] = st
            end[c] = t
            i += 1
            woken = waiters.pop(c, None)
            if woken is not None:
                stack.extend(woken)
        ptr[s] = i
        free[s] = t
    stuck = [programs[s][ptr[s]] for s in range(len(programs)) if ptr[s] < len(programs[s])]
    if stuck:
        raise DeadlockError("reference engine: deadlock", stuck=[str(c) for c in stuck])
    return start, end
