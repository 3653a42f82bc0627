"""Event-driven execution of a :class:`~blueprinting.simulator.commands.CommandDag`.

Every stream runs its program in order, so the schedule is fixed and only times are unknown:
a command starts at ``max(stream free, end of each dependency)``. The engine advances one stream
at a time as far as its dependencies allow and parks it on the first unfinished dependency;
finishing that command wakes the stream. Each command is visited once (O(commands + deps)),
which is what makes p=64, v=4, m=1024 take about a second. Streams still parked when no stream
can move hold commands that can never start: a deadlock, raised as
:class:`~blueprinting.errors.DeadlockError`, never a hang.

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

from dataclasses import dataclass
from typing import final

from blueprinting.errors import DeadlockError
from blueprinting.simulator.commands import _B, _F, _W, CommandDag


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SimulationResult:
    dag: CommandDag
    start_s: list[float]
    end_s: list[float]
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
        names = [str(dag.command(c)) for c in stuck]
        raise DeadlockError(
            f"simulating {dag.schedule}: {len(stuck)} stream(s) stuck, commands that can never "
            f"start: {', '.join(names)}",
            stuck=names,
        )
    return _summarise(dag, start, end)


def _summarise(dag: CommandDag, start: list[float], end: list[float]) -> SimulationResult:
    p = dag.pipeline_degree
    kind = dag.kind
    dur = dag.duration_s
    chunk = dag.chunk
    act = dag.costs.activation_bytes
    busy: list[float] = []
    comm_busy: list[float] = []
    peaks: list[int] = []
    peak_bytes: list[float] = []
    flush = 0.0
    makespan = 0.0
    for r in range(p):
        compute = dag.programs[2 * r]
        comm = dag.programs[2 * r + 1]
        busy.append(sum(dur[c] for c in compute))
        comm_busy.append(sum(dur[c] for c in comm))
        if compute:
            flush = max(flush, end[compute[-1]])
            makespan = max(makespan, end[compute[-1]])
        if comm:
            makespan = max(makespan, *(end[c] for c in comm))
        # Activations of a forward are held until the pass that consumes them last: the
        # backward, or the weight-gradient pass when backward is split; forward-only
        # programs release them at once.
        codes = [kind[c] for c in compute]
        release = _W if _W in codes else _B if _B in codes else -1
        held = 0
        peak = 0
        held_b = 0.0
        peak_b = 0.0
        row = act[r] if act is not None else None
        for c, code in zip(compute, codes, strict=True):
            size = row[chunk[c]] if row is not None else 0.0
            if code == _F:
                held += 1
                held_b += size
                peak = max(peak, held)
                peak_b = max(peak_b, held_b)
                if release == -1:
                    held -= 1
                    held_b -= size
            elif code == release:
                held -= 1
                held_b -= size
        peaks.append(peak)
        peak_bytes.append(peak_b)
    idle = tuple(flush - b for b in busy)
    return SimulationResult(
        dag=dag,
        start_s=start,
        end_s=end,
        makespan_s=makespan,
        pipeline_flush_s=flush,
        bubble_s=min(idle) if idle else 0.0,
        busy_s_per_rank=tuple(busy),
        idle_s_per_rank=idle,
        comm_busy_s_per_rank=tuple(comm_busy),
        peak_inflight_per_rank=tuple(peaks),
        peak_activation_bytes_per_rank=tuple(peak_b for peak_b in peak_bytes),
    )
