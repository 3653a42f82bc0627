"""The command DAG of one iteration of the whole pipeline.

Each pipeline rank owns two streams: a compute stream (forward, backward, weight-gradient passes)
and a communication stream (P2P transfers and data-parallel gradient-reduction buckets). A stream
runs its commands in program order, one at a time; a command starts when its stream is free and
every command it depends on has finished.

P2P model (eager send, blocking receive). A transfer is a command on the *sender's*
communication stream that starts once the producing step has finished and takes
``ScheduleCosts.p2p_time_s``; the sender's compute stream never waits for it. The receiving
rank's compute stream waits for the transfer at the step where Megatron-LM posts the receive
(see :mod:`blueprinting.simulator.schedules`). With this model the simulation reproduces the
closed forms of shared/reference/schedules.md section 4 (see
:mod:`blueprinting.simulator.analytic`).

The DAG is built with numpy, all ranks at once (p=64, v=4, m=1024 is about a million commands);
``tests/simulator/reference_engine.py`` keeps the seed's command-by-command builder, and the tests
check that both give the same commands, ids, dependencies and programs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeAlias, final

import numpy as np
import numpy.typing as npt

from blueprinting.errors import VerificationError
from blueprinting.mapping.transformer import (
    CombinedOneForwardOneBackward,
    ForwardOnly,
    PipelineSchedule,
)
from blueprinting.simulator.costs import ScheduleCosts
from blueprinting.simulator.schedules import (
    OpKind,
    RankOrder,
    StageGraph,
    check_megatron,
    rank_orders,
    stage_graph,
)


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


IntArray: TypeAlias = npt.NDArray[np.int64]
FloatArray: TypeAlias = npt.NDArray[np.float64]


@final
@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class CommandDag:
    """Column-stored commands (numpy arrays indexed by command id) and the program of each
    stream: ``programs[2 * rank + s]`` with s = 0 compute, 1 communication.

    ``deps[c]`` lists the commands ``c`` waits for besides its stream predecessor, padded with
    -1 (an ``(n, k)`` array). Stored as columns because p=64, v=4, m=1024 gives about a million
    commands.
    """

    schedule: PipelineSchedule
    costs: ScheduleCosts
    kind: IntArray
    rank: IntArray
    chunk: IntArray
    microbatch: IntArray
    duration_s: FloatArray
    deps: IntArray
    peer: IntArray
    programs: tuple[IntArray, ...]
    topology: DagTopology | None = None
    """What the DAG shares with every DAG of its order and bucket layout (None for one built
    by hand): the engine keys its own set-up on it."""

    def __len__(self) -> int:
        return int(self.kind.shape[0])

    @property
    def pipeline_degree(self) -> int:
        return self.costs.pipeline_degree

    def command(self, index: int) -> Command:
        code = int(self.kind[index])
        return Command(
            index=index,
            kind=KIND_BY_CODE[code],
            rank=int(self.rank[index]),
            stream=Stream.COMPUTE if code <= _W else Stream.COMM,
            chunk=int(self.chunk[index]),
            microbatch=int(self.microbatch[index]),
            duration_s=float(self.duration_s[index]),
            deps=tuple(int(d) for d in self.deps[index] if d >= 0),
            peer=int(self.peer[index]),
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class DagTopology:
    """The part of a :class:`CommandDag` its durations do not change: the columns other than
    ``duration_s`` (read-only arrays, shared by the DAGs built from it), and where the durations
    go: ``transfers`` (the P2P commands), ``bucket_ids`` with the rank and index in
    ``ScheduleCosts.dp_buckets[rank]`` of each, ``alone`` (compute ops alone in their step, the
    combined 1F1B unpaired passes). ``engine_setup`` is the engine's memo of its set-up for this
    topology (:mod:`blueprinting.simulator.engine`)."""

    kind: IntArray
    rank: IntArray
    chunk: IntArray
    microbatch: IntArray
    deps: IntArray
    peer: IntArray
    programs: tuple[IntArray, ...]
    n_compute: int
    alone: npt.NDArray[np.bool_]
    transfers: IntArray
    bucket_ids: IntArray
    bucket_rank: IntArray
    bucket_index: IntArray
    engine_setup: dict[str, object] = field(default_factory=dict)

    @property
    def commands(self) -> int:
        return int(self.kind.shape[0])


_TopologyKey: TypeAlias = tuple[PipelineSchedule, int, int, int, tuple[tuple[int, ...], ...], bool]
_TOPOLOGIES: dict[_TopologyKey, DagTopology] = {}
MAX_CACHED_COMMANDS = 1 << 21
"""Commands the topology cache holds at most, all entries together (about 70 bytes each: the
int64 columns and dependencies): calibration and validation rebuild the same pipelines with
other costs, a p = 64, v = 4, m = 1024 pipeline is about a million commands."""


def _cached_topology(
    schedule: PipelineSchedule, costs: ScheduleCosts, *, p: int, m: int, v: int
) -> DagTopology:
    """The topology of ``schedule`` for ``costs``' shape, built once per (schedule, p, m, v,
    bucket chunks, overlap_grad_reduce) while it fits :data:`MAX_CACHED_COMMANDS`."""
    chunks = _bucket_chunks(costs)
    key: _TopologyKey = (schedule, p, m, v, chunks, costs.overlap_grad_reduce)
    found = _TOPOLOGIES.pop(key, None)
    if found is None:
        found = _topology(
            rank_orders(schedule, p, m, v),
            p=p,
            v=v,
            microbatches=m,
            bucket_chunks=chunks,
            overlap_grad_reduce=costs.overlap_grad_reduce,
            forward_only=isinstance(schedule, ForwardOnly),
            graph=stage_graph(schedule, p, m, v),
        )
    if found.commands <= MAX_CACHED_COMMANDS:
        held = sum(entry.commands for entry in _TOPOLOGIES.values())
        while _TOPOLOGIES and held + found.commands > MAX_CACHED_COMMANDS:
            oldest = next(iter(_TOPOLOGIES))  # insertion order: the least recently used
            held -= _TOPOLOGIES.pop(oldest).commands
        _TOPOLOGIES[key] = found
    return found


def build_schedule(
    schedule: PipelineSchedule, costs: ScheduleCosts, *, allow_megatron_refused: bool = False
) -> CommandDag:
    """The command DAG of one iteration of ``schedule`` with ``costs``.

    Raises :class:`~blueprinting.errors.InvalidStrategyError` (every violated rule) for a
    configuration Megatron-LM refuses at start-up, unless ``allow_megatron_refused`` (used to
    study hypothetical schedules such as the seed contract's m mod p != 0 case).
    """
    p, m, v = costs.pipeline_degree, costs.microbatch_count, costs.virtual_stages
    unpaired = costs.unpaired_forward_s is not None or costs.unpaired_backward_s is not None
    if unpaired and not isinstance(schedule, CombinedOneForwardOneBackward):
        raise VerificationError(
            f"building command DAG: unpaired pass costs are combined 1F1B's, not {schedule}'s"
        )
    if not allow_megatron_refused:
        check_megatron(schedule, p, m, v)
    return _with_costs(schedule, costs, _cached_topology(schedule, costs, p=p, m=m, v=v))


def _ops_array(ops: IntArray | Sequence[tuple[int, int, int]]) -> IntArray:
    return np.asarray(ops, dtype=np.int64).reshape(-1, 3)


def _order_problems(
    code: IntArray, ch: IntArray, mb: IntArray, rk: IntArray, *, p: int, m: int, v: int
) -> tuple[list[tuple[int, str]], npt.NDArray[np.bool_]]:
    """Out-of-range and repeated ops (with their op index, for ordering) and the mask of the
    ops that get a command id."""
    bad = (ch < 0) | (ch >= v) | (mb < 0) | (mb >= m)
    found: list[tuple[int, str]] = [
        (i, f"rank {rk[i]}: op ({code[i]}, chunk {ch[i]}, mb {mb[i]}) out of range")
        for i in np.flatnonzero(bad).tolist()
    ]
    key = np.where(bad, 4 * p * v * m, (code * (p * v) + ch * p + rk) * m + mb)
    repeat = np.zeros(key.shape[0], dtype=np.bool_)
    if (np.bincount(key, minlength=4 * p * v * m + 1)[:-1] > 1).any():
        order = np.argsort(key, kind="stable")
        sorted_key = key[order]
        repeat[order[1:]] = (sorted_key[1:] == sorted_key[:-1]) & ~bad[order[1:]]
    for i in np.flatnonzero(repeat).tolist():
        name = KIND_BY_CODE[int(code[i])]
        found.append((i, f"rank {rk[i]}: {name}{mb[i]}.{ch[i]} scheduled twice"))
    return found, ~(bad | repeat)


def _step_bounds(
    orders: list[RankOrder], lengths: IntArray, offsets: IntArray
) -> tuple[IntArray, IntArray]:
    """For every op (global index) the first and the last op of its step."""
    n = int(offsets[-1])
    flags = np.zeros(n, dtype=np.bool_)
    explicit = [order for order in orders if order.receive_at is not None]
    if explicit:
        if len(explicit) != len(orders) or any(o.send_after is None for o in orders):
            raise VerificationError("building command DAG: every rank or none sets receive_at")
        at = [np.asarray(o.receive_at, np.int64) + offsets[r] for r, o in enumerate(orders)]
        after = [np.asarray(o.send_after, np.int64) + offsets[r] for r, o in enumerate(orders)]
        return np.concatenate(at), np.concatenate(after)
    if all(order.step_starts is None for order in orders):
        every = np.arange(n, dtype=np.int64)  # one op per step
        return every, every
    for r, order in enumerate(orders):
        if lengths[r] == 0:
            continue
        if order.step_starts is None:
            flags[offsets[r] : offsets[r + 1]] = True
        else:
            flags[offsets[r] + np.asarray(order.step_starts, dtype=np.int64)] = True
        flags[offsets[r]] = True
    first = np.flatnonzero(flags)
    step = np.cumsum(flags) - 1
    last = np.append(first[1:] - 1, n - 1)
    return first[step], last[step]


def build_from_orders(
    schedule: PipelineSchedule,
    costs: ScheduleCosts,
    orders: list[RankOrder],
    *,
    forward_only: bool = False,
    graph: StageGraph | None = None,
) -> CommandDag:
    """The DAG of explicit per-rank orders (the extension point for new schedules, and how tests
    build deliberately broken programs). ``graph`` places every (rank, chunk) in the pipeline
    (default: Megatron's virtual stage c*p + r, one line of ``costs.microbatch_count``
    microbatches). Raises VerificationError if an order misses or repeats a pass, or runs a
    backward before its forward on the same rank (or a pass before its same-rank input)."""
    p, v = costs.pipeline_degree, costs.virtual_stages
    topology = _topology(
        orders,
        p=p,
        v=v,
        microbatches=costs.microbatch_count,
        bucket_chunks=_bucket_chunks(costs),
        overlap_grad_reduce=costs.overlap_grad_reduce,
        forward_only=forward_only,
        graph=graph,
    )
    return _with_costs(schedule, costs, topology)


def _bucket_chunks(costs: ScheduleCosts) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(bucket.chunk for bucket in stage) for stage in costs.dp_buckets)


def _topology(
    orders: list[RankOrder],
    *,
    p: int,
    v: int,
    microbatches: int,
    bucket_chunks: tuple[tuple[int, ...], ...],
    overlap_grad_reduce: bool,
    forward_only: bool,
    graph: StageGraph | None,
) -> DagTopology:
    """Everything of :func:`build_from_orders` that the durations do not change."""
    if graph is None:
        graph = StageGraph(
            position=tuple(tuple(c * p + r for c in range(v)) for r in range(p)),
            line_starts=(0,),
            microbatches=microbatches,
        )
    m = graph.microbatches
    if len(orders) != p:
        raise VerificationError(f"building command DAG: {len(orders)} rank orders for p = {p}")
    n_virtual = p * v
    slot_count = n_virtual * m
    arrays = [_ops_array(order.ops) for order in orders]
    lengths = np.array([a.shape[0] for a in arrays], dtype=np.int64)
    # One contiguous array per field (every later pass reads them whole).
    code, ch, mb = (
        np.concatenate([a[:, field] for a in arrays]) if arrays else np.zeros(0, dtype=np.int64)
        for field in range(3)
    )
    del arrays
    rk = np.repeat(np.arange(p, dtype=np.int64), lengths)

    # Pass 1: compute commands, ids in program order; every problem at once. A valid order
    # (in range, every pass once) fills as many slots as it has ops: the slots are written
    # first and the problems looked for only when the count is short.
    ids = np.full((4, slot_count), -1, dtype=np.int64)
    in_range = not ((ch < 0) | (ch >= v) | (mb < 0) | (mb >= m)).any()
    if in_range:
        ids[code, (ch * p + rk) * m + mb] = np.arange(code.shape[0], dtype=np.int64)
    problems: list[str] = []
    if not in_range or np.count_nonzero(ids != -1) != code.shape[0]:
        found, kept = _order_problems(code, ch, mb, rk, p=p, m=m, v=v)
        found.sort()
        problems = [message for _, message in found]
        code, ch, mb, rk = code[kept], ch[kept], mb[kept], rk[kept]
        ids.fill(-1)
        ids[code, (ch * p + rk) * m + mb] = np.arange(code.shape[0], dtype=np.int64)
    n_compute = int(code.shape[0])
    fid, bid, biid, wid = ids
    grad_id = np.where(bid != -1, bid, biid)
    if (fid == -1).any():
        problems.append("some forward passes are never scheduled")
    if not forward_only and (grad_id == -1).any():
        problems.append("some backward passes are never scheduled")
    early_grad = (grad_id != -1) & ((fid == -1) | (grad_id < fid))
    early_weight = (wid != -1) & ((grad_id == -1) | (wid < grad_id))
    for slot in np.flatnonzero(early_grad | early_weight).tolist():
        if len(problems) > 20:
            break
        if early_grad[slot]:
            problems.append(
                f"command {grad_id[slot]} runs a backward before its forward on the same rank"
            )
        if early_weight[slot]:
            problems.append(f"command {wid[slot]} runs a weight gradient before its input gradient")
    if problems:
        raise VerificationError("building command DAG: " + "; ".join(problems[:20]))

    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    step_first, step_last = _step_bounds(orders, lengths, offsets)
    # Combined 1F1B: a pass alone in its step has no partner to hide its all-to-alls under.
    alone = step_first == step_last
    # Topology: position q of every op, the rank/slot of positions q - 1 and q + 1.
    position = np.asarray(graph.position, dtype=np.int64).reshape(p, v)
    rank_at = np.empty(n_virtual, dtype=np.int64)
    slot_at = np.empty(n_virtual, dtype=np.int64)
    rank_at[position] = np.arange(p, dtype=np.int64)[:, None]
    slot_at[position] = np.arange(v, dtype=np.int64)[None, :] * p + np.arange(p)[:, None]
    starts = np.zeros(n_virtual + 1, dtype=np.bool_)
    starts[list(graph.line_starts)] = True
    starts[n_virtual] = True
    pos = position[rk, ch]
    first_stage = starts[pos]
    last_stage = starts[pos + 1]
    prev_q = np.maximum(pos - 1, 0)
    next_q = np.minimum(pos + 1, n_virtual - 1)
    del pos
    is_grad = (code == _B) | (code == _BI)
    has_input = (code == _F) & ~first_stage
    has_grad_input = is_grad & ~last_stage
    local_f = has_input & (rank_at[prev_q] == rk) & graph.local_handoff
    local_b = has_grad_input & (rank_at[next_q] == rk) & graph.local_handoff
    if graph.local_handoff:
        own = np.arange(n_compute, dtype=np.int64)
        late = local_f & (fid[slot_at[prev_q] * m + mb] > own)
        late |= local_b & (grad_id[slot_at[next_q] * m + mb] > own)
    else:
        late = np.zeros(1, dtype=np.bool_)  # every hand-over is a message: none is late
    if late.any():
        first_late = int(np.flatnonzero(late)[0])
        raise VerificationError(
            f"building command DAG: command {first_late} runs before its input from the same "
            "rank's other chunk"
        )
    sends_fwd = (code == _F) & ~last_stage
    sends_bwd = is_grad & ~first_stage
    if graph.local_handoff:
        sends_fwd &= rank_at[next_q] != rk
        sends_bwd &= rank_at[prev_q] != rk
    sending = np.flatnonzero(sends_fwd | sends_bwd)
    t_rank = rk[sending]
    t_count = np.bincount(t_rank, minlength=p).astype(np.int64)

    # Pass 2: DP buckets per rank, posted at the stage's last compute command, or with
    # overlap_grad_reduce at the last backward (weight-gradient) pass of the bucket's chunk.
    buckets = bucket_chunks
    b_count = np.array([len(buckets[r]) if buckets else 0 for r in range(p)], dtype=np.int64)
    comm_base = n_compute + np.concatenate([[0], np.cumsum(t_count + b_count)]).astype(np.int64)
    t_first = np.concatenate([[0], np.cumsum(t_count)]).astype(np.int64)
    tid = comm_base[t_rank] + (np.arange(sending.shape[0], dtype=np.int64) - t_first[t_rank])
    send_of = np.full(n_compute, -1, dtype=np.int64)
    send_of[sending] = tid
    t_after = step_last[sending]
    bucket_rows: list[tuple[int, int, int, int]] = []  # (id, rank, chunk, index on the rank)
    bucket_after: list[int] = []
    programs: list[IntArray] = []
    not_forward = code != _F
    for r in range(p):
        lo, hi = int(offsets[r]), int(offsets[r + 1])
        compute_prog = np.arange(lo, hi, dtype=np.int64)
        transfers = tid[t_first[r] : t_first[r + 1]]
        comm_prog = transfers
        if buckets and buckets[r]:
            last_pos = hi - lo - 1
            last_of_chunk = np.full(v, -1, dtype=np.int64)
            local = np.flatnonzero(not_forward[lo:hi])
            last_of_chunk[ch[lo + local]] = local  # increasing positions: the last one wins
            posted: list[tuple[int, int]] = []
            for b_index, bucket_chunk in enumerate(buckets[r]):
                at = last_pos
                if overlap_grad_reduce and last_of_chunk[bucket_chunk] >= 0:
                    at = int(last_of_chunk[bucket_chunk])
                posted.append((at, b_index))
            posted.sort()
            bucket_ids = int(comm_base[r]) + int(t_count[r]) + np.arange(len(posted))
            for (at, index), bucket_id in zip(posted, bucket_ids.tolist(), strict=True):
                bucket_rows.append((bucket_id, r, buckets[r][index], index))
                bucket_after.append(lo + at)
            transfer_pos = t_after[t_first[r] : t_first[r + 1]] - lo
            where = np.searchsorted(transfer_pos, [at for at, _ in posted], side="right")
            comm_prog = np.insert(transfers, where, bucket_ids)
        programs.append(compute_prog)
        programs.append(comm_prog)

    n = int(comm_base[-1])
    kind = np.empty(n, dtype=np.int64)
    rank = np.empty(n, dtype=np.int64)
    chunk = np.empty(n, dtype=np.int64)
    micro = np.empty(n, dtype=np.int64)
    peer = np.full(n, -1, dtype=np.int64)
    kind[:n_compute], rank[:n_compute], chunk[:n_compute] = code, rk, ch
    micro[:n_compute] = mb
    kind[tid] = np.where(sends_fwd[sending], _SEND_F, _SEND_B)
    rank[tid], chunk[tid], micro[tid] = t_rank, ch[sending], mb[sending]
    peer[tid] = np.where(sends_fwd[sending], rank_at[next_q[sending]], rank_at[prev_q[sending]])
    # The op fields live on as the DAG's columns: drop the copies (half a million ops each),
    # so the dependencies below reuse their memory.
    code, ch, mb, rk = kind[:n_compute], chunk[:n_compute], micro[:n_compute], rank[:n_compute]
    del t_rank, sending
    bucket_ids = np.array([row[0] for row in bucket_rows], dtype=np.int64)
    bucket_rank = np.array([row[1] for row in bucket_rows], dtype=np.int64)
    bucket_index = np.array([row[3] for row in bucket_rows], dtype=np.int64)
    if bucket_rows:
        kind[bucket_ids] = _DP
        rank[bucket_ids] = bucket_rank
        chunk[bucket_ids] = [row[2] for row in bucket_rows]
        micro[bucket_ids] = -1

    # Pass 3: dependencies. A transfer waits for the last op of its step, a bucket for the op
    # it is posted at; every input of a step's ops is received before the step's first op;
    # with wait_own_sends, an op also waits for the previous same-kind op's outgoing message.
    recv_src = np.full(n_compute, -1, dtype=np.int64)
    is_f = has_input & ~local_f
    is_b = has_grad_input & ~local_b
    recv_src[is_f] = send_of[fid[slot_at[prev_q[is_f]] * m + mb[is_f]]]
    recv_src[is_b] = send_of[grad_id[slot_at[next_q[is_b]] * m + mb[is_b]]]
    receiving = np.flatnonzero(recv_src != -1)
    # Explicit receive points need not be monotone in op order: group by waiter, stably.
    waiter = step_first[receiving]
    if (waiter[1:] < waiter[:-1]).any():
        order = np.argsort(waiter, kind="stable")
        receiving, waiter = receiving[order], waiter[order]
    # A step's receives all go to its first op, in op order: consecutive in ``receiving``.
    new_group = np.concatenate([[True], waiter[1:] != waiter[:-1]])[: waiter.shape[0]]
    group_start = np.flatnonzero(new_group)
    receive_column = (
        np.arange(receiving.shape[0], dtype=np.int64) - group_start[np.cumsum(new_group) - 1]
    )
    group_sizes = np.diff(np.append(group_start, receiving.shape[0]))
    own_cmd = np.zeros(0, dtype=np.int64)
    own_src = np.zeros(0, dtype=np.int64)
    waiting = [r for r, order in enumerate(orders) if order.wait_own_sends]
    if waiting:
        own = np.isin(rk, waiting) & (code != _W)
        idx = np.flatnonzero(own)
        grouped = idx[np.lexsort((idx, code[idx], rk[idx]))]
        same = (rk[grouped[1:]] == rk[grouped[:-1]]) & (code[grouped[1:]] == code[grouped[:-1]])
        cmd, before = grouped[1:][same], grouped[:-1][same]
        has = send_of[before] != -1
        own_cmd, own_src = cmd[has], send_of[before[has]]
    width = max(
        1,
        int(group_sizes.max(initial=0)) + (1 if own_cmd.shape[0] else 0),
    )
    deps = np.full((n, width), -1, dtype=np.int64)
    deps[waiter, receive_column] = recv_src[receiving]
    if own_cmd.shape[0]:
        # After the receives of its step's first op (receivers are compute commands).
        counts = np.zeros(n_compute, dtype=np.int64)
        counts[waiter[group_start]] = group_sizes
        deps[own_cmd, counts[own_cmd]] = own_src
    deps[tid, 0] = t_after
    if bucket_rows:
        deps[bucket_ids, 0] = bucket_after
    shared = (kind, rank, chunk, micro, deps, peer, tid, bucket_ids, bucket_rank, bucket_index)
    for array in (*shared, alone, *programs):
        array.flags.writeable = False  # shared by every DAG of this topology
    return DagTopology(
        kind=kind,
        rank=rank,
        chunk=chunk,
        microbatch=micro,
        deps=deps,
        peer=peer,
        programs=tuple(programs),
        n_compute=n_compute,
        alone=alone,
        transfers=tid,
        bucket_ids=bucket_ids,
        bucket_rank=bucket_rank,
        bucket_index=bucket_index,
    )


def _with_costs(
    schedule: PipelineSchedule, costs: ScheduleCosts, topology: DagTopology
) -> CommandDag:
    """The DAG of ``topology`` with the durations of ``costs``."""
    p, v = costs.pipeline_degree, costs.virtual_stages
    n_compute = topology.n_compute
    code = topology.kind[:n_compute]
    rk = topology.rank[:n_compute]
    ch = topology.chunk[:n_compute]
    forward = np.asarray(costs.forward_s, dtype=np.float64)
    backward = np.asarray(costs.backward_s, dtype=np.float64)
    weight = (
        np.zeros_like(forward)
        if costs.weight_grad_s is None
        else np.asarray(costs.weight_grad_s, dtype=np.float64)
    )
    # Duration of every (kind, rank, chunk), indexed by OpKind: one gather for all ops.
    by_kind = np.stack([forward, backward, backward - weight, weight])
    dur = by_kind.reshape(-1)[(code * p + rk) * v + ch]
    for kind_code, extra in ((_F, costs.unpaired_forward_s), (_B, costs.unpaired_backward_s)):
        if extra is not None:
            add = np.asarray(extra, dtype=np.float64)[rk, ch]
            dur = dur + np.where(topology.alone & (code == kind_code), add, 0.0)
    duration = np.empty(topology.kind.shape[0], dtype=np.float64)
    duration[:n_compute] = dur
    duration[topology.transfers] = costs.p2p_time_s
    if topology.bucket_ids.shape[0]:
        buckets = costs.dp_buckets
        duration[topology.bucket_ids] = [
            buckets[r][i].duration_s
            for r, i in zip(
                topology.bucket_rank.tolist(), topology.bucket_index.tolist(), strict=True
            )
        ]
    return CommandDag(
        schedule=schedule,
        costs=costs,
        kind=topology.kind,
        rank=topology.rank,
        chunk=topology.chunk,
        microbatch=topology.microbatch,
        duration_s=duration,
        deps=topology.deps,
        peer=topology.peer,
        programs=topology.programs,
        topology=topology,
    )
