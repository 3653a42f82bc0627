"""DistributedTaskIR values: one local tensor-parallel block as a task graph.

The IR materializes the work of ONE rank of the (tp, cp) mesh for ONE microbatch. Its
:class:`LogicalMesh` has the ``tp`` axis and, under context parallelism, the ``cp`` axis (and
for a2a+p2p its two levels ``cp_a2a`` x ``cp_p2p`` = cp) (names and sizes, no devices, like
JAX's ``AbstractMesh``); it says nothing about pipeline or data parallelism (seed:
"DistributedTaskIR currently materializes one local TP block"). A cp rank holds s/cp tokens;
its attention core exchanges K/V over the cp axis (``CollectivePurpose.KV_EXCHANGE`` tasks:
a ring of P2P steps, an all-gather / reduce-scatter, or all-to-alls).

Reading the IR (the contract for the PortablePlanIR stage)::

    ir = derive_training_block(model, mapping)      # training_derivation.py
    for group in ir.groups:                           # block, first_stage, last_stage
        for task in group.tasks:                      # topological (dependency) order
            match task:
                case ComputeTask(phase=ph, kind=k, work=w, gemm=g, deps=d, lineage=l): ...
                    # w.matrix_flops, w.vector_flops, w.flops, w.bytes_read, w.bytes_written
                    # g: GemmShape(m, n, k, batch) or None, for shape-dependent efficiency
                case CollectiveTask(phase=ph, kind=k, bytes=n, axis=a, deps=d, lineage=l): ...
                    # ir.mesh.size(a) is the group size
                case _ as unreachable: assert_never(unreachable)

``ir.block`` is the repeated transformer block (and ``ir.moe_block`` a MoE model's MoE layer,
on a mesh with the expert axes ``ep``, ``etp`` and ``etp_ep``: its token dispatch and combine
are ``CollectivePurpose.TOKEN_DISPATCH`` tasks over them); ``ir.first_stage`` (embedding) and
``ir.last_stage`` (final norm, LM head, cross-entropy) are added once to the first and the last
pipeline stage. Phases: FORWARD, BACKWARD_ACTIVATION_GRAD, BACKWARD_WEIGHT_GRAD, RECOMPUTE; the
RECOMPUTE tasks are the extra forward work recomputation adds before the backward pass (a
consumer modelling a stored block under ``FullRecompute(method=BLOCK)`` drops them).
Dependencies name task ids of the same group.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeAlias, assert_never, final

from blueprinting.errors import VerificationError
from blueprinting.synthesizer.dialects.transformer.training import (
    AttentionShape,
    CollectiveKind,
    CollectivePurpose,
    DomainForwarding,
    FlexExchange,
    GemmShape,
    OpKind,
    Placement,
    SemanticOpName,
    Work,
)

__all__ = [
    "CollectiveKind",
    "CollectivePurpose",
    "CollectiveTask",
    "ComputeTask",
    "DistributedTaskIR",
    "GemmShape",
    "Lineage",
    "LogicalMesh",
    "MeshAxis",
    "OpKind",
    "Phase",
    "Task",
    "TaskGroup",
    "Work",
]


class Phase(StrEnum):
    FORWARD = "forward"
    BACKWARD_ACTIVATION_GRAD = "backward_activation_grad"
    BACKWARD_WEIGHT_GRAD = "backward_weight_grad"
    RECOMPUTE = "recompute"

    @property
    def short(self) -> str:
        match self:
            case Phase.FORWARD:
                return "fwd"
            case Phase.BACKWARD_ACTIVATION_GRAD:
                return "agrad"
            case Phase.BACKWARD_WEIGHT_GRAD:
                return "wgrad"
            case Phase.RECOMPUTE:
                return "recomp"
            case _ as unreachable:
                assert_never(unreachable)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MeshAxis:
    name: str
    size: int

    def __post_init__(self) -> None:
        if not self.name or self.size < 1:
            raise VerificationError(f"checking mesh axis: bad axis {self.name!r}={self.size}")


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LogicalMesh:
    """Axis names and sizes only; there are no devices to ask about."""

    axes: tuple[MeshAxis, ...]

    def size(self, name: str) -> int:
        for axis in self.axes:
            if axis.name == name:
                return axis.size
        raise VerificationError(f"checking mesh: no axis named {name!r} in {self}")

    def __str__(self) -> str:
        return "mesh(" + ", ".join(f"{a.name}={a.size}" for a in self.axes) + ")"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Lineage:
    """Which semantic op a local task comes from and which piece of it.

    ``shards`` is the number of distinct pieces the semantic op's work is split into over the
    tp axis (1: every rank does all of it, the work is replicated). ``source``/``target`` are the
    DTensor-style placements of the task's input and output (S(dim), R, P).
    """

    op: SemanticOpName
    shards: int
    source: Placement
    target: Placement

    def __str__(self) -> str:
        return f"{self.op}[{self.source}->{self.target} /{self.shards}]"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeTask:
    id: str
    phase: Phase
    kind: OpKind
    work: Work
    lineage: Lineage
    gemm: GemmShape | None = None
    attention: AttentionShape | None = None
    deps: tuple[str, ...] = ()
    #: kernels the host launches for it (an eager chain: one per PyTorch op)
    launches: int = 1

    def __post_init__(self) -> None:
        w = self.work
        if min(w.matrix_flops, w.vector_flops, w.bytes_read, w.bytes_written) < 0:
            raise VerificationError(f"checking task {self.id}: negative work {w}")

    @property
    def flops(self) -> int:
        return self.work.flops

    @property
    def bytes_read(self) -> int:
        return self.work.bytes_read

    @property
    def bytes_written(self) -> int:
        return self.work.bytes_written


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveTask:
    """A collective (or a ring of P2P steps) over one mesh axis. ``bytes`` is one step's
    message; a ring of ``steps`` P2P transfers moves ``steps * bytes`` (``total_bytes``); every
    other collective has one step."""

    id: str
    phase: Phase
    kind: CollectiveKind
    purpose: CollectivePurpose
    bytes: int
    axis: str
    lineage: Lineage
    deps: tuple[str, ...] = ()
    steps: int = 1
    #: a token dispatch forwarded per NVLink domain (DeepEP; None: plain)
    forwarding: DomainForwarding | None = None
    #: a flex dispatcher's exchange in its library's kernels (None: an NCCL collective)
    flex: FlexExchange | None = None

    def __post_init__(self) -> None:
        if self.bytes < 0:
            raise VerificationError(f"checking task {self.id}: negative bytes {self.bytes}")
        if self.steps < 1:
            raise VerificationError(f"checking task {self.id}: {self.steps} steps")

    @property
    def total_bytes(self) -> int:
        return self.steps * self.bytes


Task: TypeAlias = ComputeTask | CollectiveTask


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TaskGroup:
    """A named list of tasks in dependency order (each task's deps come before it)."""

    name: str
    tasks: tuple[Task, ...]

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)

    def compute_tasks(self) -> tuple[ComputeTask, ...]:
        return tuple(t for t in self.tasks if isinstance(t, ComputeTask))

    def collective_tasks(self) -> tuple[CollectiveTask, ...]:
        return tuple(t for t in self.tasks if isinstance(t, CollectiveTask))

    def flops(self, phase: Phase | None = None) -> int:
        return sum(t.flops for t in self.compute_tasks() if phase in (None, t.phase))

    def matrix_flops(self, phase: Phase | None = None) -> int:
        return sum(t.work.matrix_flops for t in self.compute_tasks() if phase in (None, t.phase))

    def collective_bytes(
        self, phase: Phase | None = None, purpose: CollectivePurpose | None = None
    ) -> int:
        return sum(
            t.total_bytes
            for t in self.collective_tasks()
            if phase in (None, t.phase) and purpose in (None, t.purpose)
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class DistributedTaskIR:
    """One local TP block (plus first/last-stage extras) for one microbatch on one tp rank."""

    mesh: LogicalMesh
    strategy: str
    model: str
    micro_batch: int
    seq_length: int
    block: TaskGroup
    first_stage: TaskGroup
    last_stage: TaskGroup
    #: the MoE layer (routed experts and their token dispatch) of a MoE model; ``block`` is
    #: then its dense layer (the first-k-dense layers, or those ``moe_layer_freq`` skips)
    moe_block: TaskGroup | None = None
    #: a model's sliding-window layers: ``block`` / ``moe_block`` with the attention core over
    #: the window's band (None where the model has no windowed layer of that kind)
    windowed_block: TaskGroup | None = None
    windowed_moe_block: TaskGroup | None = None

    @property
    def groups(self) -> tuple[TaskGroup, ...]:
        base = (self.block, self.first_stage, self.last_stage)
        optional = (self.moe_block, self.windowed_block, self.windowed_moe_block)
        return (*base, *(g for g in optional if g is not None))

    @property
    def tp(self) -> int:
        return self.mesh.size("tp")

    @property
    def cp(self) -> int:
        """The cp degree (1 when the mesh has no cp axis)."""
        return self.mesh.size("cp") if any(a.name == "cp" for a in self.mesh.axes) else 1
