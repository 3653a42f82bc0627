"""Execution of a :class:`~blueprinting.simulator.commands.CommandDag`: a longest path.

Every stream runs its program in order, so the schedule is static and only times are unknown:
a command starts at ``max(end of its stream predecessor, end of each dependency)`` and ends
``duration`` later, i.e. its end is a longest path in the DAG. :func:`simulate_many` computes it
as a numpy wavefront: each step takes the head of every stream whose dependencies have all
finished, so one step advances the whole pipeline and a schedule takes as many steps as its
longest chain of commands, whatever its size. Where transfers never queue behind an earlier
step's and DP buckets trail their stream (the common case), transfers are timed inline and the
wavefront runs over compute commands only (:func:`_compute_wavefront`: 8,192 compute passes per
rank and so about 8,300 steps for p=64, v=4, m=1024), then the transfers and buckets of every
rank are timed at once. A step is a dozen numpy calls on a few dozen numbers, so its cost is
per call: one-dimensional arrays, preallocated outputs, the distinct duration vectors side by
side as lanes of one step (:func:`_chain_longest_path`); the plan path's P2P-free,
pipeline-only and full runs share one DAG and one wavefront, the last two one column.
The sums and maxima are the ones the seed's event-driven engine performed, so start and end
times are equal bit for bit (``tests/simulator/reference_engine.py`` keeps that engine;
``tests/simulator/test_engine_reference.py`` and ``test_engine_equality.py`` compare them on
every schedule). Streams whose head can never start hold commands that can never start: a
deadlock, raised as :class:`~blueprinting.errors.DeadlockError`, never a hang.

Definitions (seconds):

- ``pipeline_flush_s``: end of the last compute command on any rank.
- ``makespan_s``: end of the last command of any kind (includes DP reduction after the flush).
- ``busy_s_per_rank[r]``: total compute-stream time of rank r.
- ``idle_s_per_rank[r] = pipeline_flush_s - busy_s_per_rank[r]``: compute-stream idle time
  of rank r between the iteration's start and the pipeline flush.
- ``bubble_s = min_r idle_s_per_rank[r] = pipeline_flush_s - max_r busy_s_per_rank[r]``: the
  idle time of the busiest rank, i.e. how much longer the flush is than the bottleneck stage's
  own work. For uniform chunks and zero latency it is (p-1)(tf+tb) for every schedule Megatron
  accepts (Narayanan et al. 2021, Section 2.2; shared/reference/schedules.md section 4).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import final

import numpy as np

from blueprinting.errors import DeadlockError
from blueprinting.simulator.commands import (
    _B,
    _DP,
    _F,
    _SEND_B,
    _SEND_F,
    _W,
    CommandDag,
    FloatArray,
    IntArray,
)

_SUM_IS_SEQUENTIAL = sys.version_info < (3, 12)
"""Python 3.12 made ``sum`` of floats compensated (Neumaier); earlier versions add in order."""


@final
@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class SimulationResult:
    dag: CommandDag
    start_s: FloatArray
    end_s: FloatArray
    makespan_s: float
    pipeline_flush_s: float
    bubble_s: float
    busy_s_per_rank: tuple[float, ...]
    idle_s_per_rank: tuple[float, ...]
    comm_busy_s_per_rank: tuple[float, ...]
    peak_inflight_per_rank: tuple[int, ...]
    peak_activation_bytes_per_rank: tuple[float, ...]

    @property
    def bubble_fraction(self) -> float:
        """bubble_s / busiest rank's compute time (Narayanan et al. 2021, Section 2.2.1)."""
        busiest = max(self.busy_s_per_rank)
        return self.bubble_s / busiest if busiest > 0.0 else 0.0


def simulate(dag: CommandDag) -> SimulationResult:
    """Run ``dag``; raise DeadlockError naming the stuck commands if it cannot finish."""
    return simulate_many(dag, [dag.duration_s])[0]


def simulate_many(dag: CommandDag, durations: Sequence[FloatArray]) -> list[SimulationResult]:
    """Run ``dag`` once per duration vector (each of ``len(dag)`` seconds, in one wavefront);
    the results' ``dag`` is ``dag`` itself, whatever durations they ran with."""
    n = len(dag)
    columns = len(durations)
    # One contiguous row per run; the wavefronts read it as its (n, columns) transpose.
    by_run = np.zeros((columns, n), dtype=np.float64)
    for k, d in enumerate(durations):
        by_run[k] = d
    start, end = _wavefront(dag, by_run.T)
    held = _held_activations(dag)
    compute = np.concatenate(dag.programs[0::2]) if dag.programs else np.zeros(0, np.int64)
    compute_dur = [row[compute] for row in by_run]
    busy: list[tuple[float, ...]] = []
    for k in range(columns):
        # Runs with the same compute durations have the same busy times: sum once.
        same = [i for i in range(k) if (compute_dur[i] == compute_dur[k]).all()]
        busy.append(busy[same[0]] if same else _busy(dag, by_run[k], 0))
    return [
        _summarise(
            dag,
            start=np.ascontiguousarray(start[:, k]),
            end=np.ascontiguousarray(end[:, k]),
            duration=by_run[k],
            busy=busy[k],
            held=held,
        )
        for k in range(columns)
    ]


def _busy(dag: CommandDag, duration: FloatArray, stream: int) -> tuple[float, ...]:
    """Total time of stream ``stream`` (0 compute, 1 communication) of every rank: Python's
    ``sum`` over the program, in program order."""
    programs = dag.programs[stream::2]
    if _SUM_IS_SEQUENTIAL:
        # Before 3.12 ``sum`` adds floats one by one, as ``np.cumsum`` does (a quarter of the
        # cost); ``0.0 +`` turns an all -0.0 total into ``sum``'s 0.0.
        return tuple(
            0.0 + float(np.cumsum(duration[program])[-1]) if program.shape[0] else 0
            for program in programs
        )
    return tuple(sum(duration[program].tolist()) for program in programs)


def _wavefront(dag: CommandDag, dur: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Start and end of every command (rows) for every duration column: the compute-only
    wavefront where it applies and is exact, else the wavefront over every command."""
    fast = _compute_wavefront(dag, dur)
    return fast if fast is not None else _full_wavefront(dag, dur)


def _compute_wavefront(dag: CommandDag, dur: FloatArray) -> tuple[FloatArray, FloatArray] | None:
    """The wavefront over compute commands only (half the steps), or None where it does not
    apply.

    A transfer waits for one compute command P (the last op of its step) and, on its stream,
    for the command before it. The transfers a step posts leave one after the other: the j-th
    ends at ``end(P) + c`` added j times, c being the P2P time (the same for every transfer
    of a run). That holds as long as no step's first transfer waits for an earlier step's
    transfers, which is checked afterwards; so a compute command starts at the maximum of its
    predecessor's end and those sums, the same floating-point operations the full wavefront
    does. DP buckets must trail their communication stream, or take no time in any column (the
    plan path's P2P-free and pipeline-only runs with ``overlap_grad_reduce``): a bucket then
    ends when the command before it and its producer have, and never delays the transfer
    after it, whose producer comes later on the same compute stream. Buckets are timed
    afterwards along their stream. Where a check
    fails, or on a deadlock (the full wavefront names every stuck stream), the answer is None."""
    n = len(dag)
    columns = dur.shape[1]
    setup = _compute_setup(dag)
    if setup is None:
        return None
    if setup.interleaved and any(
        (dur[:, k][np.concatenate(setup.tails)] != 0).any() for k in range(columns)
    ):
        # A bucket with a duration between transfers can delay them: the full wavefront.
        return None
    transfers, producer, compute = setup.transfers, setup.producer, setup.compute
    rows_of, moving, extra_hops = setup.rows_of, setup.moving, setup.extra_hops
    hop = dur[transfers[0]] if transfers.shape[0] else np.zeros(columns, dtype=np.float64)
    if transfers.shape[0] and any(
        not (dur[:, k][transfers] == hop[k]).all() for k in range(columns)
    ):
        return None
    # Columns that differ only in DP bucket durations (the plan path's pipeline-only and full
    # runs) share every compute and transfer time: run each distinct one once.
    distinct: list[int] = []
    copy_of: list[int] = []
    for k in range(columns):
        same = [
            i
            for i, d in enumerate(distinct)
            if hop[d] == hop[k] and (dur[:, d][compute] == dur[:, k][compute]).all()
        ]
        if not same:
            distinct.append(k)
        copy_of.append(same[0] if same else len(distinct) - 1)
    rows = setup.rows
    duration = np.zeros((len(distinct), rows), dtype=np.float64)
    for row, k in zip(duration, distinct, strict=True):
        row[rows_of] = dur[:, k][compute]
    timed = _chain_longest_path(
        waits=setup.waits,
        depth=setup.depth,
        duration=duration,
        hop=hop[distinct],
        heads=setup.firsts,
        never=setup.never,
        zero_row=setup.zero_row,
        pad_row=setup.pad_row,
        extra_hops=extra_hops,
    )
    del duration  # its memory serves the outputs
    if timed is None:
        return None
    begin, end = timed
    # Outputs are built column by column ((columns, n), each column contiguous: numpy's 1-D
    # gathers and scatters are several times faster than 2-D ones) and returned transposed,
    # as (n, columns) views.
    start_out = np.zeros((columns, n), dtype=np.float64)
    end_out = np.zeros((columns, n), dtype=np.float64)
    levels, pair, block = setup.levels, setup.pair, setup.block
    moving_producer = setup.moving_producer
    n_compute = compute.shape[0]
    for k in range(columns):
        start_k, end_k = start_out[k], end_out[k]
        twin = copy_of.index(copy_of[k])
        if twin < k:
            # Same compute and transfer times as an earlier column (DP buckets come later).
            start_k[:] = start_out[twin]
            end_k[:] = end_out[twin]
            continue
        if block is None:
            start_k[compute] = begin[copy_of[k]][rows_of]
            end_k[compute] = end[copy_of[k]][rows_of]
        else:
            streams, length = block
            rows_used = streams * (length + 1)
            start_k[:n_compute].reshape(block)[:] = begin[copy_of[k], :rows_used].reshape(
                streams, length + 1
            )[:, :length]
            end_k[:n_compute].reshape(block)[:] = end[copy_of[k], :rows_used].reshape(
                streams, length + 1
            )[:, :length]
        # Transfers of every rank at once, burst level by burst level: the first of a burst
        # leaves when its producer ends, the j-th when the (j-1)-th has arrived (the same
        # additions as the full wavefront's).
        sent_start = np.empty(moving.shape[0], dtype=np.float64)
        sent_end = np.empty(moving.shape[0], dtype=np.float64)
        if extra_hops == 0:  # one transfer per producer
            np.take(end_k, moving_producer, out=sent_start)
            np.add(sent_start, hop[k], out=sent_end)
        for j, level in enumerate(levels if extra_hops else ()):
            if j:
                sent_start[level] = sent_end[level - 1]
            else:
                sent_start[level] = end_k[moving_producer[level]]
            sent_end[level] = sent_start[level] + hop[k]
        if (sent_end[pair] > sent_start[pair + 1]).any():
            return None
        start_k[moving] = sent_start
        end_k[moving] = sent_end
    per_column = dur.T
    zero = np.zeros(columns, np.float64)
    for tail, previous in zip(setup.tails, setup.tail_previous, strict=True):
        for bucket, before in zip(tail.tolist(), previous.tolist(), strict=True):
            free = end_out[:, before] if before >= 0 else zero
            begin_b = np.maximum(free, end_out[:, producer[bucket]])
            start_out[:, bucket] = begin_b
            end_out[:, bucket] = begin_b + per_column[:, bucket]
    return start_out.T, end_out.T


@final
@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class _ComputeSetup:
    """What :func:`_compute_wavefront` derives from the DAG's order alone (its docstring):
    built once per :class:`~blueprinting.simulator.commands.DagTopology`."""

    transfers: IntArray
    producer: IntArray
    tails: list[IntArray]
    tail_previous: list[IntArray]
    interleaved: bool
    movings: list[IntArray]
    moving: IntArray
    extra_hops: int
    rows: int
    zero_row: int
    pad_row: int
    compute: IntArray
    rows_of: IntArray
    waits: IntArray
    depth: IntArray
    firsts: IntArray
    never: IntArray
    levels: list[IntArray]
    pair: IntArray
    moving_producer: IntArray
    block: tuple[int, int] | None


_NOT_APPLICABLE = "not applicable"


def _compute_setup(dag: CommandDag) -> _ComputeSetup | None:
    """The set-up of the compute-only wavefront; memoised on the DAG's topology (the DAGs of
    one topology differ in durations only)."""
    memo = dag.topology.engine_setup if dag.topology is not None else None
    if memo is not None:
        found = memo.get("compute")
        if isinstance(found, _ComputeSetup):
            return found
        if found == _NOT_APPLICABLE:
            return None
    setup = _build_compute_setup(dag)
    if memo is not None:
        memo["compute"] = _NOT_APPLICABLE if setup is None else setup
    return setup


def _build_compute_setup(dag: CommandDag) -> _ComputeSetup | None:
    n = len(dag)
    kind = dag.kind
    compute_programs = dag.programs[0::2]
    comm_programs = dag.programs[1::2]
    transfers = np.flatnonzero((kind == _SEND_F) | (kind == _SEND_B))
    producer = dag.deps[:, 0]
    burst = np.zeros(n, dtype=np.int64)  # 0 for the first transfer a step posts, 1, 2, ...
    tails: list[IntArray] = []
    tail_previous: list[IntArray] = []
    movings: list[IntArray] = []
    interleaved = False
    for program in comm_programs:
        bucket = kind[program] == _DP
        first = int(np.argmax(bucket)) if bucket.any() else program.shape[0]
        interleaved |= not bucket[first:].all()
        # Every bucket with the command before it on its stream (-1 for the first).
        at = np.flatnonzero(bucket)
        tails.append(program[at])
        tail_previous.append(np.where(at > 0, program[np.maximum(at - 1, 0)], -1))
        moving = program[~bucket]
        movings.append(moving)
        if moving.shape[0]:
            starts = np.concatenate([[True], producer[moving[1:]] != producer[moving[:-1]]])
            group = np.flatnonzero(starts)
            burst[moving] = np.arange(moving.shape[0]) - group[np.cumsum(starts) - 1]
    extra_hops = int(burst.max(initial=0))
    lengths = np.array([program.shape[0] for program in compute_programs], dtype=np.int64)
    base = np.concatenate([[0], np.cumsum(lengths + 1)]).astype(np.int64)
    rows = int(base[-1]) + 2
    zero_row, pad_row = rows - 2, rows - 1
    new_id = np.full(n, pad_row, dtype=np.int64)
    for r, program in enumerate(compute_programs):
        new_id[program] = base[r] + np.arange(program.shape[0], dtype=np.int64)
    compute = np.flatnonzero(kind <= _W)
    rows_of = new_id[compute]
    width = dag.deps.shape[1] + 1
    waits = np.empty((width, rows), dtype=np.int64)
    waits[0, rows_of] = rows_of - 1
    firsts = base[:-1]
    waits[0, firsts] = zero_row
    cross = dag.deps[compute]
    waits[1:, rows_of] = np.where(cross >= 0, new_id[producer[cross]], pad_row).T
    never = base[1:] - 1
    waits[:, never] = never
    waits[:, zero_row] = zero_row
    waits[:, pad_row] = pad_row
    depth = np.zeros((width - 1, rows), dtype=np.int64)
    depth[:, rows_of] = np.where(cross >= 0, burst[np.maximum(cross, 0)], 0).T
    moving = np.concatenate(movings) if movings else np.zeros(0, dtype=np.int64)
    level_of = burst[moving]
    del burst
    levels = [np.flatnonzero(level_of == j) for j in range(extra_hops + 1)]
    # A burst's first transfer must not queue behind the previous burst of its stream.
    program_first = np.zeros(moving.shape[0], dtype=np.bool_)
    firsts_at = np.cumsum([0, *(x.shape[0] for x in movings[:-1])])
    program_first[firsts_at[firsts_at < moving.shape[0]]] = True
    pair = np.flatnonzero((level_of[1:] == 0) & ~program_first[1:])
    moving_producer = producer[moving]
    # Compute commands numbered 0.. in program order and streams of one length (what
    # build_from_orders gives every schedule here): the rows are then a (streams, length + 1)
    # block whose last column is the never rows, copied without index arrays.
    n_compute = compute.shape[0]
    block = None
    if (
        n_compute
        and (lengths == lengths[0]).all()
        and np.array_equal(np.concatenate(compute_programs), np.arange(n_compute))
    ):
        block = (lengths.shape[0], int(lengths[0]))
    for shared in (waits, depth, compute, rows_of, moving, moving_producer):
        shared.flags.writeable = False  # every DAG of the topology reads them
    return _ComputeSetup(
        transfers=transfers,
        producer=producer,
        tails=tails,
        tail_previous=tail_previous,
        interleaved=interleaved,
        movings=movings,
        moving=moving,
        extra_hops=extra_hops,
        rows=rows,
        zero_row=zero_row,
        pad_row=pad_row,
        compute=compute,
        rows_of=rows_of,
        waits=waits,
        depth=depth,
        firsts=firsts,
        never=never,
        levels=levels,
        pair=pair,
        moving_producer=moving_producer,
        block=block,
    )


def _chain_longest_path(
    *,
    waits: IntArray,
    depth: IntArray,
    duration: FloatArray,
    hop: FloatArray,
    heads: IntArray,
    never: IntArray,
    zero_row: int,
    pad_row: int,
    extra_hops: int,
) -> tuple[FloatArray, FloatArray] | None:
    """Start and end (``(columns, rows)``) of rows laid out stream by stream, each stream's
    rows contiguous and followed by its ``never`` row; ``waits[0]`` is the stream predecessor
    (``zero_row`` for a first row), ``waits[1:]`` the cross-stream waits, each reached through
    ``depth + 1`` sequential additions of the column's ``hop`` (the transfers of a burst leave
    one after the other). None on a deadlock.

    One numpy step per row of the longest stream: every step gathers the heads' waits, takes
    their maximum and writes ``begin + duration`` to every head, and the ready heads (finite
    end) move on. Everything is one-dimensional, the columns side by side (row ``k * rows + i``
    of column k), because numpy's 1-D integer gathers and scatters cost a fraction of 2-D
    ones, and the per-step work is a few dozen heads. A finished row's end is kept together
    with its ends plus one, two, ... hops, so a cross wait is a single gather from the array
    of its depth; the additions are those the event-driven engine makes, in its order, so the
    times are equal bit for bit."""
    columns, rows = duration.shape
    n_flat = columns * rows
    offset = (np.arange(columns, dtype=np.int64) * rows)[:, None]
    # Cross waits grouped by depth: gathers[j] holds, for each row, its waits of depth j
    # (padded with pad_row, which ends at -inf in every array).
    gathers: list[list[IntArray]] = []
    cross, cross_depth = waits[1:], depth
    for j in range(extra_hops + 1):
        chosen = np.where(cross_depth == j, cross, pad_row)
        useful = [row for row in chosen if (row != pad_row).any()]
        gathers.append([(row[None, :] + offset).reshape(-1) for row in useful])
    # The never rows wait for themselves in the first array: they never become ready.
    flat_never = (never[None, :] + offset).reshape(-1)
    if not gathers[0]:
        gathers[0].append(np.full(n_flat, pad_row, dtype=np.int64) + offset.repeat(rows))
    gathers[0][0][flat_never] = flat_never
    end = np.full(n_flat, np.inf, dtype=np.float64)
    end[zero_row + offset[:, 0]] = 0.0
    end[pad_row + offset[:, 0]] = -np.inf
    hopped = [end.copy() for _ in range(extra_hops + 1)]
    flat_duration = duration.reshape(-1).copy()
    flat_duration[flat_never] = np.inf
    head = (heads[None, :] + offset).reshape(-1)
    stops = flat_never
    step_hop = np.repeat(hop, heads.shape[0])
    pred = (waits[0][None, :] + offset).reshape(-1)
    plan = [(array, index) for array, group in zip(hopped, gathers, strict=True) for index in group]
    (first_array, first_index), other_waits = plan[0], plan[1:]
    first_hopped, other_hopped = hopped[0], hopped[1:]
    # Preallocated outputs: a ufunc writing into ``out`` costs about a microsecond less than
    # one allocating, and a step makes a dozen calls on a few dozen numbers.
    width = head.shape[0]
    begin = np.empty(width, dtype=np.float64)
    finish = np.empty(width, dtype=np.float64)
    sent = np.empty(width, dtype=np.float64)
    ready = np.empty(width, dtype=np.bool_)
    unfinished = np.full(width, np.inf, dtype=np.float64)
    maximum, add, less = np.maximum, np.add, np.less
    previous = head.copy()
    while True:
        for _ in range(16):
            # The stream predecessor's end is read back (a gather is cheaper than a select).
            maximum(end[pred[head]], first_array[first_index[head]], out=begin)
            for array, index in other_waits:
                maximum(begin, array[index[head]], out=begin)
            add(begin, flat_duration[head], out=finish)
            end[head] = finish
            add(finish, step_hop, out=sent)
            first_hopped[head] = sent
            for array in other_hopped:
                add(sent, step_hop, out=sent)
                array[head] = sent
            less(finish, unfinished, out=ready)
            add(head, ready, out=head)
        if (head == stops).all():
            break
        if (head == previous).all():
            return None
        previous = head.copy()
    begin_all = end[pred]
    for array, index in plan:
        begin_all = maximum(begin_all, array[index])
    return begin_all.reshape(columns, rows), end.reshape(columns, rows)


def _full_wavefront(dag: CommandDag, dur: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Start and end of every command (rows) for every duration column (module docstring).

    Internally the commands are renumbered stream by stream, each stream's program a contiguous
    range followed by one row that never finishes, so a stream's head is a row index that
    moves by one when the head runs. A command that has not run ends at +inf, so the latest end
    a head waits for is finite exactly when it is ready, and writing ``begin + duration`` to
    every head changes only the ready ones (the others stay at +inf). Starts are recomputed
    from the final ends afterwards with the same maxima."""
    n = len(dag)
    lengths = np.array([program.shape[0] for program in dag.programs], dtype=np.int64)
    base = np.concatenate([[0], np.cumsum(lengths + 1)]).astype(np.int64)
    rows = int(base[-1]) + 1
    zero_row = rows - 1  # a finished command ending at 0: what padding and first commands see
    new_id = np.empty(n, dtype=np.int64)
    for s, program in enumerate(dag.programs):
        new_id[program] = base[s] + np.arange(program.shape[0], dtype=np.int64)
    width = dag.deps.shape[1] + 1
    # waits[k, row]: the k-th command the row waits for (0: its stream predecessor).
    waits = np.empty((width, rows), dtype=np.int64)
    waits[1:, new_id] = np.where(dag.deps >= 0, new_id[dag.deps], zero_row).T
    waits[0, new_id] = new_id - 1
    firsts = base[:-1]
    waits[0, firsts] = zero_row
    never = base[1:] - 1
    waits[:, never] = never
    waits[:, zero_row] = zero_row
    columns = dur.shape[1]
    duration = np.zeros((columns, rows), dtype=np.float64)
    duration[:, new_id] = dur[:n].T
    end = np.full((columns, rows), np.inf, dtype=np.float64)
    end[:, zero_row] = 0.0
    head = firsts.copy()
    last = head.copy()
    while True:
        for _ in range(16):
            gathered = end[:, waits[:, head]]
            begin = gathered[:, 0]
            for k in range(1, width):
                begin = np.maximum(begin, gathered[:, k])
            end[:, head] = begin + duration[:, head]
            head += begin[0] < np.inf
        if (head == never).all():
            break
        if (head == last).all():
            stuck = np.flatnonzero(head < never)
            _raise_deadlock(dag, _old_ids(dag, head[stuck], base))
        last = head.copy()
    start = np.maximum.reduce(end[:, waits], axis=1)
    start, end = start.T, end.T
    return start[new_id], end[new_id]


def _old_ids(dag: CommandDag, heads: IntArray, base: IntArray) -> IntArray:
    streams = np.searchsorted(base, heads, side="right") - 1
    return np.array(
        [
            int(dag.programs[s][h - base[s]])
            for s, h in zip(streams.tolist(), heads.tolist(), strict=True)
        ],
        dtype=np.int64,
    )


def _raise_deadlock(dag: CommandDag, heads: IntArray) -> None:
    n = len(dag)
    names = [str(dag.command(int(c))) for c in heads.tolist() if c < n]
    raise DeadlockError(
        f"simulating {dag.schedule}: {len(names)} stream(s) stuck, commands that can never "
        f"start: {', '.join(names)}",
        stuck=names,
    )


def _held_activations(dag: CommandDag) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Peak in-flight microbatch-chunks and their bytes per rank (the order alone sets them).

    Activations of a forward are held until the pass that consumes them last: the backward, or
    the weight-gradient pass when backward is split; forward-only programs release them at
    once."""
    act = dag.costs.activation_bytes
    peaks: list[int] = []
    peak_bytes: list[float] = []
    for r in range(dag.pipeline_degree):
        compute = dag.programs[2 * r]
        codes = dag.kind[compute]
        # A full backward or a weight-gradient pass releases; an input-gradient pass does not.
        releases = (codes == _W) | (codes == _B)
        step = np.where(codes == _F, 1, np.where(releases, -1, 0))
        release = 1 if releases.any() else -1
        peak = int(np.cumsum(step).max(initial=0)) if release != -1 else int((codes == _F).any())
        peaks.append(peak)
        if act is None:
            peak_bytes.append(0.0)
            continue
        size = np.asarray(act[r], dtype=np.float64)[dag.chunk[compute]]
        held = np.cumsum(step * size) if release != -1 else size * (codes == _F)
        peak_bytes.append(max(0.0, float(held.max(initial=0.0))))
    return tuple(peaks), tuple(peak_bytes)


def _summarise(
    dag: CommandDag,
    *,
    start: FloatArray,
    end: FloatArray,
    duration: FloatArray,
    busy: tuple[float, ...],
    held: tuple[tuple[int, ...], tuple[float, ...]],
) -> SimulationResult:
    flush = 0.0
    makespan = 0.0
    for r in range(dag.pipeline_degree):
        compute = dag.programs[2 * r]
        comm = dag.programs[2 * r + 1]
        if compute.shape[0]:
            last = float(end[compute[-1]])
            flush = max(flush, last)
            makespan = max(makespan, last)
        if comm.shape[0]:
            makespan = max(makespan, float(end[comm].max()))
    idle = tuple(flush - b for b in busy)
    return SimulationResult(
        dag=dag,
        start_s=start,
        end_s=end,
        makespan_s=makespan,
        pipeline_flush_s=flush,
        bubble_s=min(idle) if idle else 0.0,
        busy_s_per_rank=busy,
        idle_s_per_rank=idle,
        comm_busy_s_per_rank=_busy(dag, duration, 1),
        peak_inflight_per_rank=held[0],
        peak_activation_bytes_per_rank=held[1],
    )
