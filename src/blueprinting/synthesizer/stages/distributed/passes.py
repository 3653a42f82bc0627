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
from typing import TextIO, assert_never, cast, final

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
@dataclass(slots=True)
class _GroupBuilder:
    plan: LocalBlockPlan
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


def _lower_group(
    name: str,
    plan: LocalBlockPlan,
    ops: tuple[SemanticOp, ...],
    collectives: dict[SemanticOpName, tuple[BoundaryCollective, ...]],
    recomputes: Callable[[SemanticOpName], bool],
    *,
    exchanges: tuple[ContextExchange, ...] = (),
) -> TaskGroup:
    g = _GroupBuilder(plan=plan)
    # The exchanges and collectives of each (op, direction, ...) in their given order, indexed
    # once: a search lowers thousands of groups and looks each op up in every phase.
    exchanges_at: dict[tuple[SemanticOpName, Direction, bool], list[ContextExchange]] = {}
    for x in exchanges:
        exchanges_at.setdefault((x.op, x.direction, x.before), []).append(x)
    collectives_at: dict[
        tuple[SemanticOpName, Direction, CollectivePurpose], list[BoundaryCollective]
    ] = {}
    for name_, listed in collectives.items():
        for c in listed:
            collectives_at.setdefault((name_, c.direction, c.purpose), []).append(c)
    none: list[ContextExchange] = []
    no_collective: list[BoundaryCollective] = []

    def around(op: SemanticOp, direction: Direction, before: bool) -> list[ContextExchange]:
        return exchanges_at.get((op.name, direction, before), none)

    def of(
        op: SemanticOp, direction: Direction, purpose: CollectivePurpose
    ) -> list[BoundaryCollective]:
        return collectives_at.get((op.name, direction, purpose), no_collective)

    def forward(phase: Phase, selected: list[SemanticOp]) -> dict[SemanticOpName, str]:
        last: str | None = None
        produced: dict[SemanticOpName, str] = {}
        for op in selected:
            column = op.sharding is TpSharding.COLUMN
            fw = of(op, Direction.FORWARD, CollectivePurpose.BOUNDARY)
            if (
                phase is Phase.RECOMPUTE
                and op is selected[0]
                and op.name in RECOMPUTE_FROM_GATHERED_INPUT
            ):
                # the segment's checkpoint is this op's gathered input (a whole-block
                # recompute, which starts at the block input, re-runs the gather)
                fw = []
            if column:
                for c in fw:
                    last = g.collective(c, phase, (last,))
            for x in around(op, Direction.FORWARD, True):
                last = g.exchange(x, phase, (last,))
            task = g.compute(op, phase, (last,))
            last = task or last
            for x in around(op, Direction.FORWARD, False):
                last = g.exchange(x, phase, (last,))
            if not column:
                for c in fw:
                    last = g.collective(c, phase, (last,))
            # statistics are forward-only and never recomputed with a different result
            if phase is Phase.FORWARD:
                for c in of(op, Direction.FORWARD, CollectivePurpose.STATISTIC):
                    last = g.collective(c, phase, (last,))
            if last is not None:
                produced[op.name] = last
        return produced

    forward(Phase.FORWARD, list(ops))
    # Each contiguous run of recomputed ops restarts from what the forward stored before it
    # (a checkpoint input), so it is its own chain with no dependency on the previous run.
    recomputed: dict[SemanticOpName, str] = {}
    segment: list[SemanticOp] = []
    for op in (*ops, None):
        if op is not None and recomputes(op.name):
            segment.append(op)
        elif segment:
            recomputed |= forward(Phase.RECOMPUTE, segment)
            segment = []

    frontier: str | None = None
    for op in reversed(ops):
        column = op.sharding is TpSharding.COLUMN
        bw = of(op, Direction.BACKWARD, CollectivePurpose.BOUNDARY)
        regather = of(op, Direction.BACKWARD, CollectivePurpose.REGATHER)
        if not column:
            for c in bw:
                frontier = g.collective(c, Phase.BACKWARD_ACTIVATION_GRAD, (frontier,))
        for x in around(op, Direction.BACKWARD, True):
            frontier = g.exchange(x, Phase.BACKWARD_ACTIVATION_GRAD, (frontier,))
        output_grad = frontier
        recompute_dep = recomputed.get(op.name)
        agrad = g.compute(op, Phase.BACKWARD_ACTIVATION_GRAD, (output_grad, recompute_dep))
        for x in around(op, Direction.BACKWARD, False):
            agrad = g.exchange(x, Phase.BACKWARD_ACTIVATION_GRAD, (agrad or output_grad,))
        gathered = tuple(
            g.collective(c, Phase.BACKWARD_WEIGHT_GRAD, (output_grad,)) for c in regather
        )
        g.compute(op, Phase.BACKWARD_WEIGHT_GRAD, (output_grad, recompute_dep, *gathered))
        frontier = agrad or output_grad
        if column:
            for c in bw:
                frontier = g.collective(c, Phase.BACKWARD_ACTIVATION_GRAD, (frontier,))
    return TaskGroup(name=name, tasks=tuple(g.tasks))


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
        block_ops(model, local, attention=plan.attention),
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
        last_stage_ops(model, local),
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
    return _lower_group(
        "moe_block",
        plan,
        block_ops(model, local, attention=plan.attention, experts=experts),
        boundary_collectives(model, b, tp=tp, sequence_parallel=sp, cp=plan.cp),
        plan.recomputes,
        exchanges=(
            *context_exchanges(model, local, plan.context),
            *expert_exchanges(model, experts, plan.experts.dispatcher),
        ),
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
        ir = DistributedTaskIR(
            mesh=LogicalMesh(axes=_mesh_axes(plan)),
            moe_block=moe_block,
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
    phase a task with no dependency starts a new chain (a recomputed segment starts from a
    stored input)."""
    current: Placement | None = None
    for task in group.tasks:
        if task.phase not in phases:
            continue
        if isinstance(task, CollectiveTask) and task.purpose is not CollectivePurpose.BOUNDARY:
            continue
        if task.phase is Phase.RECOMPUTE and not task.deps:
            current = None
        if current is not None and task.lineage.source != current:
            problems.append(
                f"{group.name}/{task.id}: consumes {task.lineage.source} but the "
                f"{'/'.join(p.short for p in phases)} chain holds {current}"
            )
        current = task.lineage.target


#: groups that passed the checks on a mesh, by identity (an entry holds its group, so the id is
#: not reused while it lives); bounded, a dropped entry is checked again
_VERIFIED: dict[tuple[int, tuple[tuple[tuple[str, int], ...], int]], TaskGroup] = {}
_VERIFIED_LIMIT = 4096


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyDistributedTasks:
    """Check structure and placement consistency; return the IR unchanged."""

    name: str = "verify-distributed-tasks"

    def run(self, ir: DistributedTaskIR, ctx: PassContext) -> DistributedTaskIR:
        problems: list[str] = []
        axes = {a.name: a.size for a in ir.mesh.axes}
        mesh = (tuple(axes.items()), ir.tp)
        for group in ir.groups:
            known = _VERIFIED.get((id(group), mesh))
            if known is group:
                continue  # this very group passed on this mesh (the dense groups are shared)
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
                _VERIFIED[(id(group), mesh)] = group
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
