"""Passes over DistributedTaskIR (xDSL ``ModulePass`` style).

Each pass is a frozen dataclass with a ``name`` and ``run(ir, ctx) -> ir``; every pass takes a
verified IR and returns a verified one (the lowering takes the derivation's
:class:`~blueprinting.synthesizer.dialects.transformer.training.LocalBlockPlan`).

- :class:`LowerToDistributedTasks`: ``LocalBlockPlan -> DistributedTaskIR``; materializes the
  local block, the first-stage and the last-stage task groups with phases, dependencies and
  lineage.
- :class:`VerifyDistributedTasks`: raises :class:`~blueprinting.errors.VerificationError` when
  ids repeat, a dependency is unknown or comes later, a collective runs over a missing axis, or
  the DTensor placement chain of the forward or the backward is broken (a partial or sharded
  activation consumed where a replicated one is needed without its collective).
- :class:`PrintDistributedTaskIR` and :func:`print_ir`: the readable text form used by golden
  tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import pairwise
from typing import TextIO, TypeAlias, assert_never, cast, final

from blueprinting.errors import VerificationError
from blueprinting.mapping.transformer import ExpertParallel, HierarchicalAllToAllRing
from blueprinting.synthesizer.dialects.transformer.training import (
    CP_A2A_AXIS,
    CP_AXIS,
    CP_P2P_AXIS,
    EP_AXIS,
    ETP_AXIS,
    ETP_EP_AXIS,
    RECOMPUTE_FROM_GATHERED_INPUT,
    ROUTED_EXPERT_OPS,
    TP_AXIS,
    BoundaryCollective,
    CollectiveKind,
    CollectivePurpose,
    ContextExchange,
    Direction,
    LocalBlockPlan,
    Partial,
    Placement,
    Placements,
    Replicate,
    SemanticOp,
    SemanticOpName,
    Shard,
    ShardDim,
    TpSharding,
    Work,
    block_ops,
    boundary_collectives,
    context_exchanges,
    expert_exchanges,
    first_stage_collectives,
    first_stage_ops,
    last_stage_collectives,
    last_stage_ops,
    placements,
    shards_of,
)
from blueprinting.synthesizer.stages.distributed.ir import (
    CollectiveTask,
    ComputeTask,
    DistributedTaskIR,
    Lineage,
    LogicalMesh,
    MeshAxis,
    Phase,
    Task,
    TaskGroup,
)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PassContext:
    """Options shared by a pipeline of passes."""

    verify_between: bool = True


# --------------------------------------------------------------------------------------------
# Lowering
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _PlacementPlan:
    """What placing a task reads of its plan: the rank's TP degree and sequence parallelism."""

    tp: int
    sequence_parallel: bool


@dataclass(slots=True)
class _GroupBuilder:
    plan: _PlacementPlan
    tasks: list[Task] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    #: each (sharding, shard dim)'s placements and shard count on this plan's tp and SP
    placed: dict[tuple[TpSharding, ShardDim], tuple[Placements, int]] = field(default_factory=dict)

    def fresh(self, base: str) -> str:
        candidate, n = base, 2
        while candidate in self.ids:
            candidate, n = f"{base}#{n}", n + 1
        self.ids.add(candidate)
        return candidate

    def compute(self, op: SemanticOp, phase: Phase, deps: tuple[str | None, ...]) -> str | None:
        sp = self.plan.sequence_parallel
        key = (op.sharding, op.shard_dim)
        found = self.placed.get(key)
        if found is None:
            found = self.placed[key] = (
                placements(op.sharding, tp=self.plan.tp, sequence_parallel=sp, dim=op.shard_dim),
                shards_of(op.sharding, tp=self.plan.tp, sequence_parallel=sp),
            )
        pl, shards = found
        work, source, target = _phase_view(op, phase, pl, sp, self.plan.tp)
        if work.is_empty:
            return None
        task_id = self.fresh(f"{phase.short}.{op.name}")
        self.tasks.append(
            ComputeTask(
                id=task_id,
                phase=phase,
                kind=op.kind,
                work=work,
                gemm=op.gemm,
                attention=op.attention,
                launches=_launches(op, phase),
                deps=_clean(deps),
                lineage=Lineage(
                    op=op.name,
                    shards=shards,
                    source=source,
                    target=target,
                ),
            )
        )
        return task_id

    def exchange(self, x: ContextExchange, phase: Phase, deps: tuple[str | None, ...]) -> str:
        task_id = self.fresh(f"{phase.short}.{x.op}.{x.axis}.{x.kind}.{x.carries}")
        source, target = _exchange_placements(x)
        self.tasks.append(
            CollectiveTask(
                id=task_id,
                phase=phase,
                kind=x.kind,
                purpose=x.purpose,
                bytes=x.bytes,
                steps=x.steps,
                axis=x.axis,
                forwarding=x.forwarding,
                flex=x.flex,
                deps=_clean(deps),
                lineage=Lineage(op=x.op, shards=1, source=source, target=target),
            )
        )
        return task_id

    def collective(self, c: BoundaryCollective, phase: Phase, deps: tuple[str | None, ...]) -> str:
        task_id = self.fresh(f"{phase.short}.{c.after}.{c.kind}")
        self.tasks.append(
            CollectiveTask(
                id=task_id,
                phase=phase,
                kind=c.kind,
                purpose=c.purpose,
                bytes=c.bytes,
                axis=TP_AXIS,
                deps=_clean(deps),
                lineage=Lineage(op=c.after, shards=1, source=c.source, target=c.target),
            )
        )
        return task_id


def _launches(op: SemanticOp, phase: Phase) -> int:
    """The kernels the host launches for ``op`` in ``phase`` (:attr:`SemanticOp.launches`; a
    weight gradient is one kernel)."""
    match phase:
        case Phase.FORWARD | Phase.RECOMPUTE:
            return op.launches[0]
        case Phase.BACKWARD_ACTIVATION_GRAD:
            return op.launches[1]
        case Phase.BACKWARD_WEIGHT_GRAD:
            return 1
        case _ as unreachable:
            assert_never(unreachable)


def _phase_view(
    op: SemanticOp, phase: Phase, pl: Placements, sequence_parallel: bool, tp: int
) -> tuple[Work, Placement, Placement]:
    """The op's work and input/output placements in one phase."""
    match phase:
        case Phase.FORWARD | Phase.RECOMPUTE:
            return op.forward, pl.forward_in, pl.forward_out
        case Phase.BACKWARD_ACTIVATION_GRAD:
            return op.activation_grad, pl.backward_in, pl.backward_out
        case Phase.BACKWARD_WEIGHT_GRAD:
            target = _weight_grad_placement(op, sequence_parallel) if tp > 1 else Replicate()
            return op.weight_grad, pl.backward_in, target
        case _ as unreachable:
            assert_never(unreachable)


def _exchange_placements(x: ContextExchange) -> tuple[Placement, Placement]:
    """DTensor-style placements on the cp axis: a ring keeps the sequence sharded, the
    all-gather replicates K/V (its reduce-scatter shards the partial dK/dV back), the
    all-to-all trades the sequence split for a head split and back."""
    seq, heads = Shard(dim=ShardDim.SEQ), Shard(dim=ShardDim.HEADS)
    match x.kind:
        case CollectiveKind.P2P:
            return seq, seq
        case CollectiveKind.ALL_GATHER:
            return seq, Replicate()
        case CollectiveKind.REDUCE_SCATTER:
            return Partial(), seq
        case CollectiveKind.ALL_TO_ALL:
            return (seq, heads) if x.before else (heads, seq)
        case CollectiveKind.ALL_REDUCE:
            return Partial(), Replicate()
        case _ as unreachable:
            assert_never(unreachable)


def _clean(deps: tuple[str | None, ...]) -> tuple[str, ...]:
    if None not in deps:  # most tasks: no tuple to rebuild
        return cast("tuple[str, ...]", deps)
    return tuple(d for d in deps if d is not None)


def _weight_grad_placement(op: SemanticOp, sequence_parallel: bool) -> Placement:
    """Weight gradients of sharded weights are shards; token-wise ops (norm gains, biases)
    see only their tokens under sequence parallelism, so their gradients are partial sums."""
    match op.sharding:
        case TpSharding.COLUMN | TpSharding.ROW | TpSharding.REPLICATED:
            return Shard(dim=op.shard_dim)
        case TpSharding.TOKENS:
            return Partial() if sequence_parallel else Replicate()
        case TpSharding.HEADS | TpSharding.FEATURES | TpSharding.VOCAB:
            return Shard(dim=op.shard_dim)
        case _ as unreachable:
            assert_never(unreachable)


_NO_EXCHANGE: list[ContextExchange] = []
_NO_COLLECTIVE: list[BoundaryCollective] = []
#: the task each recomputed op of a span produced, by op name
_Produced: TypeAlias = tuple[tuple[SemanticOpName, str], ...]
#: one phase's lowering of a span: its tasks in order, the state it leaves, and its task ids
_Lowered: TypeAlias = tuple[tuple[Task, ...], object, frozenset[str]]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _Span:
    """A run of a group's ops with everything lowering them reads: the rank's TP degree and
    sequence parallelism (their placements), the ops, each op's boundary collectives, the
    context / expert exchanges around them, and which of them are recomputed. A value: two
    equal spans lower to the same tasks from the same entry state."""

    tp: int
    sequence_parallel: bool
    ops: tuple[SemanticOp, ...]
    collectives: tuple[tuple[BoundaryCollective, ...], ...]
    exchanges: tuple[ContextExchange, ...]
    recomputed: tuple[bool, ...]


def _span(
    plan: LocalBlockPlan,
    ops: tuple[SemanticOp, ...],
    collectives: dict[SemanticOpName, tuple[BoundaryCollective, ...]],
    exchanges: tuple[ContextExchange, ...],
    recomputes: Callable[[SemanticOpName], bool],
) -> _Span:
    names = {op.name for op in ops}
    return _Span(
        tp=plan.tp,
        sequence_parallel=plan.sequence_parallel,
        ops=ops,
        collectives=tuple(collectives.get(op.name, ()) for op in ops),
        exchanges=tuple(x for x in exchanges if x.op in names),
        recomputed=tuple(recomputes(op.name) for op in ops),
    )


@dataclass(slots=True)
class _SpanLowering:
    """Lowers one span phase by phase, each from the state the span before it (forward,
    recompute) or after it (backward) leaves: ``last`` / ``frontier`` the task the next one
    waits on, and for the recompute whether a recomputed segment is open."""

    span: _Span
    plan: _PlacementPlan
    exchanges_at: dict[tuple[SemanticOpName, Direction, bool], list[ContextExchange]]
    collectives_at: dict[
        tuple[SemanticOpName, Direction, CollectivePurpose], list[BoundaryCollective]
    ]

    @classmethod
    def of(cls, span: _Span) -> _SpanLowering:
        # The exchanges and collectives of each (op, direction, ...) in their given order,
        # indexed once: a search lowers thousands of groups and looks each op up in every phase.
        exchanges_at: dict[tuple[SemanticOpName, Direction, bool], list[ContextExchange]] = {}
        for x in span.exchanges:
            exchanges_at.setdefault((x.op, x.direction, x.before), []).append(x)
        collectives_at: dict[
            tuple[SemanticOpName, Direction, CollectivePurpose], list[BoundaryCollective]
        ] = {}
        for op, listed in zip(span.ops, span.collectives, strict=True):
            for c in listed:
                collectives_at.setdefault((op.name, c.direction, c.purpose), []).append(c)
        return cls(
            span=span,
            plan=_PlacementPlan(tp=span.tp, sequence_parallel=span.sequence_parallel),
            exchanges_at=exchanges_at,
            collectives_at=collectives_at,
        )

    def around(self, op: SemanticOp, direction: Direction, before: bool) -> list[ContextExchange]:
        return self.exchanges_at.get((op.name, direction, before), _NO_EXCHANGE)

    def of_op(
        self, op: SemanticOp, direction: Direction, purpose: CollectivePurpose
    ) -> list[BoundaryCollective]:
        return self.collectives_at.get((op.name, direction, purpose), _NO_COLLECTIVE)

    def _forward_op(
        self, g: _GroupBuilder, op: SemanticOp, phase: Phase, last: str | None, starts: bool
    ) -> str | None:
        """One op's forward (or recompute) tasks after ``last``; ``starts``: the op opens a
        recomputed segment."""
        column = op.sharding is TpSharding.COLUMN
        fw = self.of_op(op, Direction.FORWARD, CollectivePurpose.BOUNDARY)
        if phase is Phase.RECOMPUTE and starts and op.name in RECOMPUTE_FROM_GATHERED_INPUT:
            # the segment's checkpoint is this op's gathered input (a whole-block
            # recompute, which starts at the block input, re-runs the gather)
            fw = []
        if column:
            for c in fw:
                last = g.collective(c, phase, (last,))
        for x in self.around(op, Direction.FORWARD, True):
            last = g.exchange(x, phase, (last,))
        task = g.compute(op, phase, (last,))
        last = task or last
        for x in self.around(op, Direction.FORWARD, False):
            last = g.exchange(x, phase, (last,))
        if not column:
            for c in fw:
                last = g.collective(c, phase, (last,))
        # statistics are forward-only and never recomputed with a different result
        if phase is Phase.FORWARD:
            for c in self.of_op(op, Direction.FORWARD, CollectivePurpose.STATISTIC):
                last = g.collective(c, phase, (last,))
        return last

    def forward(self, last: str | None) -> _Lowered:
        g = _GroupBuilder(plan=self.plan)
        for op in self.span.ops:
            last = self._forward_op(g, op, Phase.FORWARD, last, starts=False)
        return tuple(g.tasks), last, frozenset(g.ids)

    def recompute(self, state: tuple[bool, str | None]) -> tuple[_Lowered, _Produced]:
        """Each contiguous run of recomputed ops restarts from what the forward stored before
        it (a checkpoint input), so it is its own chain with no dependency on the previous run;
        a run may go on from the span before. Also: the task each recomputed op produced."""
        g = _GroupBuilder(plan=self.plan)
        open_, last = state
        produced: dict[SemanticOpName, str] = {}
        for op, recomputed in zip(self.span.ops, self.span.recomputed, strict=True):
            if not recomputed:
                open_, last = False, None
                continue
            starts = not open_
            if starts:
                open_, last = True, None
            last = self._forward_op(g, op, Phase.RECOMPUTE, last, starts=starts)
            if last is not None:
                produced[op.name] = last
        return (tuple(g.tasks), (open_, last), frozenset(g.ids)), tuple(produced.items())

    def backward(self, frontier: str | None, produced: _Produced) -> _Lowered:
        g = _GroupBuilder(plan=self.plan)
        recomputed = dict(produced)
        for op in reversed(self.span.ops):
            column = op.sharding is TpSharding.COLUMN
            bw = self.of_op(op, Direction.BACKWARD, CollectivePurpose.BOUNDARY)
            regather = self.of_op(op, Direction.BACKWARD, CollectivePurpose.REGATHER)
            if not column:
                for c in bw:
                    frontier = g.collective(c, Phase.BACKWARD_ACTIVATION_GRAD, (frontier,))
            for x in self.around(op, Direction.BACKWARD, True):
                frontier = g.exchange(x, Phase.BACKWARD_ACTIVATION_GRAD, (frontier,))
            output_grad = frontier
            recompute_dep = recomputed.get(op.name)
            agrad = g.compute(op, Phase.BACKWARD_ACTIVATION_GRAD, (output_grad, recompute_dep))
            for x in self.around(op, Direction.BACKWARD, False):
                agrad = g.exchange(x, Phase.BACKWARD_ACTIVATION_GRAD, (agrad or output_grad,))
            gathered = tuple(
                g.collective(c, Phase.BACKWARD_WEIGHT_GRAD, (output_grad,)) for c in regather
            )
            g.compute(op, Phase.BACKWARD_WEIGHT_GRAD, (output_grad, recompute_dep, *gathered))
            frontier = agrad or output_grad
            if column:
                for c in bw:
                    frontier = g.collective(c, Phase.BACKWARD_ACTIVATION_GRAD, (frontier,))
        return tuple(g.tasks), frontier, frozenset(g.ids)


@dataclass(slots=True)
class _SpanMemo:
    """A span's lowering and its phases' results by entry state."""

    lowering: _SpanLowering
    forward: dict[str | None, _Lowered] = field(default_factory=dict)
    recompute: dict[tuple[bool, str | None], tuple[_Lowered, _Produced]] = field(
        default_factory=dict
    )
    backward: dict[tuple[str | None, _Produced], _Lowered] = field(default_factory=dict)


#: lowered spans by value (bounded: a dropped entry is lowered again to the same tasks)
_SPANS: dict[_Span, _SpanMemo] = {}
_SPANS_LIMIT = 4096


def _span_memo(span: _Span, *, shared: bool) -> _SpanMemo:
    if not shared:
        return _SpanMemo(lowering=_SpanLowering.of(span))
    found = _SPANS.get(span)
    if found is None:
        if len(_SPANS) >= _SPANS_LIMIT:
            _SPANS.clear()
        found = _SPANS[span] = _SpanMemo(lowering=_SpanLowering.of(span))
    return found


def _lower_spans(memos: list[_SpanMemo]) -> list[tuple[Task, ...]] | None:
    """The tasks of the spans' phases in group order (forward and recompute span by span, the
    backward from the last span back), or None where two spans would give one task id in a
    phase (lowered as one span, :func:`_GroupBuilder.fresh` numbers the second)."""
    parts: list[tuple[Task, ...]] = []
    ids: list[frozenset[str]] = []
    last: str | None = None
    for m in memos:
        done = m.forward.get(last)
        if done is None:
            done = m.forward[last] = m.lowering.forward(last)
        parts.append(done[0])
        ids.append(done[2])
        last = cast("str | None", done[1])
    state: tuple[bool, str | None] = (False, None)
    produced: list[_Produced] = []
    for m in memos:
        found = m.recompute.get(state)
        if found is None:
            found = m.recompute[state] = m.lowering.recompute(state)
        parts.append(found[0][0])
        ids.append(found[0][2])
        state = cast("tuple[bool, str | None]", found[0][1])
        produced.append(found[1])
    frontier: str | None = None
    for m, made in zip(reversed(memos), reversed(produced), strict=True):
        key = (frontier, made)
        done = m.backward.get(key)
        if done is None:
            done = m.backward[key] = m.lowering.backward(frontier, made)
        parts.append(done[0])
        ids.append(done[2])
        frontier = cast("str | None", done[1])
    n = len(memos)
    for phase in range(3):
        sets = ids[phase * n : (phase + 1) * n]
        if len(frozenset().union(*sets)) != sum(len(one) for one in sets):
            return None
    return parts


def _lower_group(
    name: str,
    plan: LocalBlockPlan,
    ops: tuple[SemanticOp, ...],
    collectives: dict[SemanticOpName, tuple[BoundaryCollective, ...]],
    recomputes: Callable[[SemanticOpName], bool],
    *,
    exchanges: tuple[ContextExchange, ...] = (),
    split: tuple[int, ...] = (),
) -> TaskGroup:
    """The group's tasks: the forward of every op, each recomputed segment, then the backward
    from the last op back.

    ``split``: where to cut the ops into spans, each lowered once per value and entry state
    (:data:`_SPANS`) and reused by every group that holds an equal span: a search's MoE blocks
    differ across ep / etp / dispatcher only in their routed experts, so their attention and
    shared-expert spans are lowered once and share their task objects. The tasks are the ones
    lowering the ops as one span gives (ids, dependencies, order); where the spans would repeat
    an op name or a task id, the ops are lowered as one span."""
    bounds = (0, *split, len(ops))
    names = {op.name for op in ops}
    if split and len(names) == len(ops):
        spans = [
            _span(plan, ops[a:b], collectives, exchanges, recomputes) for a, b in pairwise(bounds)
        ]
        parts = _lower_spans([_span_memo(s, shared=True) for s in spans])
        if parts is not None:
            return TaskGroup(name=name, tasks=tuple(t for part in parts for t in part))
    whole = _span(plan, ops, collectives, exchanges, recomputes)
    parts = _lower_spans([_span_memo(whole, shared=False)])
    assert parts is not None  # one span: its own ids are distinct
    return TaskGroup(name=name, tasks=tuple(t for part in parts for t in part))


def _mesh_axes(plan: LocalBlockPlan) -> tuple[MeshAxis, ...]:
    """tp, then cp when cp > 1 (Megatron's rank order tp-cp-...), then the two levels of an
    a2a+p2p exchange (the a2a level on consecutive cp ranks, TE's ``cp_group[0]``)."""
    axes = [MeshAxis(name=TP_AXIS, size=plan.tp)]
    experts = plan.local_experts
    if experts is not None:
        u, ep = experts.expert_tensor_degree, experts.expert_degree
        axes += [
            MeshAxis(name=name, size=size)
            for name, size in ((ETP_AXIS, u), (EP_AXIS, ep), (ETP_EP_AXIS, u * ep))
            if size > 1
        ]
    if plan.cp > 1:
        axes.append(MeshAxis(name=CP_AXIS, size=plan.cp))
        communication = plan.context.communication
        if isinstance(communication, HierarchicalAllToAllRing):
            axes += [
                MeshAxis(name=CP_A2A_AXIS, size=communication.a2a_size),
                MeshAxis(name=CP_P2P_AXIS, size=communication.p2p_size),
            ]
    return tuple(axes)


@lru_cache(maxsize=1024)
def _dense_groups(plan: LocalBlockPlan) -> tuple[TaskGroup, TaskGroup, TaskGroup]:
    """The block, first-stage and last-stage groups of ``plan`` (one with a canonical
    strategy summary and expert grid: these groups read neither)."""
    model, b, tp, sp = plan.model, plan.micro_batch, plan.tp, plan.sequence_parallel
    cp = plan.cp
    local = plan.local
    block = _lower_group(
        "block",
        plan,
        block_ops(model, local, attention=plan.attention, eager=plan.eager),
        boundary_collectives(model, b, tp=tp, sequence_parallel=sp, cp=cp),
        plan.recomputes,
        exchanges=context_exchanges(model, local, plan.context),
    )
    first = _lower_group(
        "first_stage",
        plan,
        first_stage_ops(model, local),
        first_stage_collectives(model, b, tp=tp, sequence_parallel=sp, cp=cp),
        lambda _: False,
    )
    last = _lower_group(
        "last_stage",
        plan,
        last_stage_ops(model, local, plan.cross_entropy),
        last_stage_collectives(model, b, tp=tp, sequence_parallel=sp, cp=cp),
        lambda _: False,
    )
    return block, first, last


@lru_cache(maxsize=1024)
def _moe_group(plan: LocalBlockPlan) -> TaskGroup:
    """The MoE block's group of ``plan`` (one with a canonical strategy summary, which the
    group does not read: plans that differ only in what the summary names, such as the TP
    communication overlap, share it)."""
    experts = plan.local_experts
    assert experts is not None  # only a MoE model has a MoE block
    model, b, tp, sp, local = (
        plan.model,
        plan.micro_batch,
        plan.tp,
        plan.sequence_parallel,
        plan.local,
    )
    ops = block_ops(model, local, attention=plan.attention, experts=experts, eager=plan.eager)
    routed = [i for i, op in enumerate(ops) if op.name in ROUTED_EXPERT_OPS]
    return _lower_group(
        "windowed_moe_block" if plan.windowed else "moe_block",
        plan,
        ops,
        boundary_collectives(model, b, tp=tp, sequence_parallel=sp, cp=plan.cp),
        plan.recomputes,
        exchanges=(
            *context_exchanges(model, local, plan.context),
            *expert_exchanges(model, experts, plan.experts.dispatcher),
        ),
        # the attention before the routed experts and the shared experts after them do not
        # read the expert grid: lowered once for every ep / etp / dispatcher
        split=(routed[0], routed[-1] + 1) if routed else (),
    )


@lru_cache(maxsize=1024)
def _windowed_block_group(plan: LocalBlockPlan) -> TaskGroup:
    """A sliding-window dense layer: the block of ``plan`` (a dense plan, as
    :func:`_dense_groups` is given) with its attention core over the window's band."""
    model, b, tp, sp = plan.model, plan.micro_batch, plan.tp, plan.sequence_parallel
    local = plan.local
    return _lower_group(
        "windowed_block",
        plan,
        block_ops(model, local, attention=plan.attention, eager=plan.eager),
        boundary_collectives(model, b, tp=tp, sequence_parallel=sp, cp=plan.cp),
        plan.recomputes,
        exchanges=context_exchanges(model, local, plan.context),
    )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LowerToDistributedTasks:
    """Materialize one local TP block (and the stage extras) from a local block plan."""

    name: str = "lower-to-distributed-tasks"

    def run(self, plan: LocalBlockPlan, ctx: PassContext) -> DistributedTaskIR:
        model, b = plan.model, plan.micro_batch
        # The groups are memoized (a search lowers thousands of plans): the dense ones read
        # neither the expert grid nor the strategy's summary, so plans that differ only there
        # (a search's ep / etp / dispatcher / TP-overlap axes) share them; the MoE block reads
        # the grid but not the summary.
        block, first, last = _dense_groups(replace(plan, strategy="", experts=ExpertParallel()))
        moe_block = None if model.moe is None else _moe_group(replace(plan, strategy=""))
        # a model's sliding-window layers, dense and MoE, each lowered whole with the window
        layers = model.num_layers
        windowed_moe = model.windowed_moe_layers_in(0, layers)
        windowed_dense = model.windowed_layers_in(0, layers) - windowed_moe
        windowed_block = (
            _windowed_block_group(
                replace(plan, strategy="", experts=ExpertParallel(), windowed=True)
            )
            if windowed_dense
            else None
        )
        windowed_moe_block = (
            _moe_group(replace(plan, strategy="", windowed=True)) if windowed_moe else None
        )
        ir = DistributedTaskIR(
            mesh=LogicalMesh(axes=_mesh_axes(plan)),
            moe_block=moe_block,
            windowed_block=windowed_block,
            windowed_moe_block=windowed_moe_block,
            strategy=plan.strategy,
            model=model.name,
            micro_batch=b,
            seq_length=model.seq_length,
            block=block,
            first_stage=first,
            last_stage=last,
        )
        if ctx.verify_between:
            VerifyDistributedTasks().run(ir, ctx)
        return ir


# --------------------------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------------------------
def _check_chain(group: TaskGroup, phases: tuple[Phase, ...], problems: list[str]) -> None:
    """Consecutive tasks of ``phases`` hand each other their placements; in the recompute
    phase a task that does not depend on the chain's last task starts a new chain (a
    recomputed segment starts from a stored input: no dependency at all, or, under context
    parallelism, only the K/V exchange that re-gathers the stored K and V; found by the
    hypothesis contract test on selective core_attn + layernorm recompute at t 2, cp 2)."""
    current: Placement | None = None
    last: str | None = None
    for task in group.tasks:
        if task.phase not in phases:
            continue
        if isinstance(task, CollectiveTask) and task.purpose is not CollectivePurpose.BOUNDARY:
            continue
        if task.phase is Phase.RECOMPUTE and (not task.deps or last not in task.deps):
            current = None
        if current is not None and task.lineage.source != current:
            problems.append(
                f"{group.name}/{task.id}: consumes {task.lineage.source} but the "
                f"{'/'.join(p.short for p in phases)} chain holds {current}"
            )
        current = task.lineage.target
        last = task.id


#: groups that passed the checks, by identity and tp (an entry holds its group, so the id is
#: not reused while it lives), with the mesh axes their collectives run over: on another mesh
#: only those axes are checked again (the other checks read the tasks and tp alone: a search's
#: dense groups are shared by meshes that differ in the expert axes); bounded, a dropped entry
#: is checked again
_VERIFIED: dict[tuple[int, int], tuple[TaskGroup, tuple[str, ...]]] = {}
_VERIFIED_LIMIT = 4096


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyDistributedTasks:
    """Check structure and placement consistency; return the IR unchanged."""

    name: str = "verify-distributed-tasks"

    def run(self, ir: DistributedTaskIR, ctx: PassContext) -> DistributedTaskIR:
        problems: list[str] = []
        axes = {a.name: a.size for a in ir.mesh.axes}
        for group in ir.groups:
            known = _VERIFIED.get((id(group), ir.tp))
            if (
                known is not None
                and known[0] is group
                and all(axes.get(a, 0) > 1 for a in known[1])
            ):
                continue  # this group passed; its collectives' axes are here, of size > 1
            before = len(problems)
            seen: set[str] = set()
            for task in group.tasks:
                if task.id in seen:
                    problems.append(f"{group.name}/{task.id}: duplicate task id")
                for dep in task.deps:
                    if dep not in seen:
                        problems.append(f"{group.name}/{task.id}: depends on unknown {dep!r}")
                seen.add(task.id)
                match task:
                    case CollectiveTask(axis=axis):
                        if axis not in axes:
                            problems.append(f"{group.name}/{task.id}: no mesh axis {axis!r}")
                        elif axes[axis] == 1:
                            problems.append(f"{group.name}/{task.id}: collective over size 1")
                    case ComputeTask(lineage=lineage):
                        if lineage.shards not in (1, ir.tp):
                            problems.append(f"{group.name}/{task.id}: bad shard count")
                    case _ as unreachable:
                        assert_never(unreachable)
            _check_chain(group, (Phase.FORWARD,), problems)
            _check_chain(group, (Phase.RECOMPUTE,), problems)
            _check_chain(group, (Phase.BACKWARD_ACTIVATION_GRAD,), problems)
            if len(problems) == before:
                if len(_VERIFIED) >= _VERIFIED_LIMIT:
                    _VERIFIED.clear()
                used = {t.axis for t in group.tasks if isinstance(t, CollectiveTask)}
                _VERIFIED[(id(group), ir.tp)] = (group, tuple(sorted(used)))
        if problems:
            raise VerificationError(
                f"checking DistributedTaskIR of {ir.model} ({ir.strategy}):\n"
                + "\n".join(f"  - {p}" for p in problems)
            )
        return ir


# --------------------------------------------------------------------------------------------
# Printing
# --------------------------------------------------------------------------------------------
def _task_line(task: Task, tp: int, axis_sizes: dict[str, int] | None = None) -> str:
    axis_sizes = axis_sizes or {}
    deps = f"  <- {', '.join(task.deps)}" if task.deps else ""
    match task:
        case ComputeTask(id=tid, kind=kind, work=w, gemm=gemm, lineage=lineage):
            shape = f" {gemm}" if gemm is not None else ""
            return (
                f"  {tid:<44} {kind:<15} {lineage}{shape} mm={w.matrix_flops} vec={w.vector_flops}"
                f" rd={w.bytes_read} wr={w.bytes_written}{deps}"
            )
        case CollectiveTask(
            id=tid, kind=kind, purpose=purpose, bytes=n, axis=axis, lineage=lin, steps=steps
        ):
            size = tp if axis == TP_AXIS else axis_sizes.get(axis, 0)
            ring = f" x{steps} steps" if steps > 1 else ""
            return (
                f"  {tid:<44} {kind:<15} {lin} {purpose} over {axis}({size}) bytes={n}{ring}{deps}"
            )
        case _ as unreachable:
            assert_never(unreachable)


def print_ir(ir: DistributedTaskIR) -> str:
    """The IR's text form: a header, then each group's tasks and per-phase totals."""
    lines = [
        f"DistributedTaskIR {ir.model}: {ir.strategy}",
        f"  {ir.mesh} micro_batch={ir.micro_batch} seq_length={ir.seq_length}",
    ]
    for group in ir.groups:
        lines.append(f"group {group.name} ({len(group.tasks)} tasks)")
        sizes = {a.name: a.size for a in ir.mesh.axes}
        lines.extend(_task_line(task, ir.tp, sizes) for task in group.tasks)
        for phase in Phase:
            flops = group.flops(phase)
            comm = group.collective_bytes(phase)
            if flops or comm:
                lines.append(
                    f"  total {phase.short:<7} flops={flops} matrix={group.matrix_flops(phase)}"
                    f" collective_bytes={comm}"
                )
    return "\n".join(lines) + "\n"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PrintDistributedTaskIR:
    """Write :func:`print_ir` to ``stream``; return the IR unchanged."""

    stream: TextIO
    name: str = "print-distributed-tasks"

    def run(self, ir: DistributedTaskIR, ctx: PassContext) -> DistributedTaskIR:
        self.stream.write(print_ir(ir))
        return ir
