"""Host (CPU) dispatch: the time the host takes to issue a layer pass's kernels, and the part of
it the GPU waits for (``PhaseCost.host_exposed_s``, the breakdown's ``host_exposed``).

Eager PyTorch issues every op from the host: Python, the autograd and ATen dispatchers, then
the CUDA launch. The GPU runs asynchronously behind it, so the host's time is hidden while the
host stays ahead of the GPU, and exposed where it cannot:

- **after a host sync.** A dropless MoE layer copies its per-expert token counts to the host
  every forward pass (Megatron-Core's alltoall dispatcher: ``.cpu()`` / ``tolist()`` at its
  ``cuda_sync_point`` in ``token_dispatcher.py``; DeepEP's normal dispatch makes the CPU wait on
  a host-mapped counter for the received counts, so it is CUDA-graph compatible only with
  ``num_worst_tokens``; Transformer Engine's grouped GEMM takes the splits as a host list). The
  queue is empty there, and every op after it starts no earlier than the host issues it:
  the pass is timed op by op (:func:`synced_pass_s`) from the sync round to the next one.
  HybridEP and NCCL-EP are assumed to sync the same way (no source read states otherwise; the
  recipes that capture a full iteration with HybridEP imply a sync-free mode that has no
  Blueprinting key). Drop-and-pad MoE (``moe_pad_expert_input_to_capacity``) has static shapes
  and no sync.
- **where the host is slower than the GPU** over a pass without a sync: ``max(0, H - G)``
  (the host cannot run further ahead than the work it has issued).

CUDA graphs over a scope (:mod:`blueprinting.mapping.cuda_graphs`) replay its ops without the
host: a captured scope costs one host op per pass (its graph launch: a graphed callable is one
autograd function call) instead of one per op; ``full_iteration`` captures the whole step, and
no host time is charged. Ops are the IR's tasks (a grouped GEMM issued one call per expert,
``BatchedGemmCalls.CALL_PER_MEMBER``, counts one op per call; Transformer Engine's
``GroupedLinear`` issues per-expert ``torch.empty`` / split work too, TransformerEngine issue
#1499): fewer than the kernels a real layer launches (the router's top-k, softmax and aux-loss
passes, permute metadata, FP8 casts), so the host time is a lower bound.

The per-op host cost is :func:`blueprinting.hardware.host.host_op_s` (a measured figure, not
fitted on any validated row).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import assert_never, final

from blueprinting.hardware.host import host_op_s
from blueprinting.hardware.system import SystemSpec
from blueprinting.mapping.cuda_graphs import CudaGraphs, CudaGraphScope, captured_scopes
from blueprinting.mapping.model import CapacityFactor, TransformerModelSpec
from blueprinting.synthesizer.dialects.transformer.training import (
    BatchedGemmCalls,
    CollectivePurpose,
    SemanticOpName,
)
from blueprinting.synthesizer.stages.distributed.ir import (
    CollectiveTask,
    ComputeTask,
    Phase,
    Task,
    TaskGroup,
)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class HostDispatch:
    """What the host issues for a strategy on a system: ``op_s`` per op, the CUDA graph
    scopes that replay instead (``captured``), and the host syncs of one MoE layer's forward
    pass (``moe_forward_syncs``: 1 dropless, 0 drop-and-pad)."""

    op_s: float
    captured: frozenset[CudaGraphScope] = frozenset()
    moe_forward_syncs: int = 1

    @property
    def full_iteration(self) -> bool:
        return CudaGraphScope.FULL_ITERATION in self.captured


#: The ops of the attention part of a layer (Megatron's ``attn`` scope: input norm, self
#: attention, its bias-dropout-add).
_ATTENTION_OPS = frozenset(
    {
        SemanticOpName.INPUT_NORM,
        SemanticOpName.QKV_PROJECTION,
        SemanticOpName.ATTENTION_SCORES,
        SemanticOpName.SOFTMAX,
        SemanticOpName.ATTENTION_DROPOUT,
        SemanticOpName.ATTENTION_OVER_VALUES,
        SemanticOpName.CORE_ATTENTION,
        SemanticOpName.OUTPUT_PROJECTION,
        SemanticOpName.ATTENTION_RESIDUAL,
        SemanticOpName.MLA_DOWN_PROJECTION,
        SemanticOpName.MLA_LATENT_NORM,
        SemanticOpName.MLA_UP_PROJECTION,
    }
)
_ROUTER_OPS = frozenset({SemanticOpName.ROUTER})
_PREPROCESS_OPS = frozenset({SemanticOpName.MOE_PERMUTE})


def op_scope(task: Task, moe_layer: bool) -> CudaGraphScope | None:
    """The CUDA graph scope whose graph holds ``task`` (None: no scope does, e.g. the stage
    extras). The pre-MLP norm, residual and the MLP ops are ``mlp`` on a dense layer and
    ``moe`` on a MoE layer; the router ``moe_router``, the permute ``moe_preprocess``."""
    op = task.lineage.op
    if op in _ATTENTION_OPS:
        return CudaGraphScope.ATTN
    if not moe_layer:
        return CudaGraphScope.MLP
    if op in _ROUTER_OPS:
        return CudaGraphScope.MOE_ROUTER
    if op in _PREPROCESS_OPS:
        return CudaGraphScope.MOE_PREPROCESS
    return CudaGraphScope.MOE


def _captured(scope: CudaGraphScope | None, captured: frozenset[CudaGraphScope]) -> bool:
    """Whether ``scope``'s ops replay from a graph: ``moe`` holds the router and preprocess."""
    if scope is None:
        return False
    if scope in captured:
        return True
    return CudaGraphScope.MOE in captured and scope in (
        CudaGraphScope.MOE_ROUTER,
        CudaGraphScope.MOE_PREPROCESS,
    )


def host_ops(task: Task) -> int:
    """Host-issued ops of one task: one per call (a grouped GEMM one per member), one per
    step of a P2P ring."""
    match task:
        case ComputeTask(gemm=gemm):
            if gemm is not None and gemm.calls is BatchedGemmCalls.CALL_PER_MEMBER:
                return gemm.batch
            return 1
        case CollectiveTask(steps=steps):
            return steps
        case _ as unreachable:
            assert_never(unreachable)


def synced_pass_s(issue_s: Sequence[float], gpu_s: Sequence[float]) -> float:
    """The GPU time of a pass that starts from an empty queue: op k is issued at the sum of
    the issue times before it and its own, and starts when issued and the op before it has
    finished."""
    issued = 0.0
    finished = 0.0
    for issue, run in zip(issue_s, gpu_s, strict=True):
        issued += issue
        finished = max(finished, issued) + run
    return finished


def _sync_start(tasks: Sequence[Task]) -> int:
    """Where a MoE pass's host sync falls: before the first token dispatch (or, without one, the
    first expert GEMM), after the router and permute that produce the counts."""
    for i, task in enumerate(tasks):
        if isinstance(task, CollectiveTask) and task.purpose is CollectivePurpose.TOKEN_DISPATCH:
            return i
        if isinstance(task, ComputeTask) and task.lineage.op is SemanticOpName.EXPERT_FC1:
            return i
    return 0


def pass_host_exposed_s(
    tasks: Sequence[Task],
    gpu_total_s: float,
    task_gpu_s: Callable[[Task], float],
    host: HostDispatch,
    *,
    moe_layer: bool,
    synced: bool,
) -> float:
    """The host time one layer pass exposes (module docstring): ``tasks`` in issue order,
    ``gpu_total_s`` the pass's critical path on the GPU (the per-task times are scaled to it,
    so overlapped communication keeps its share), ``synced``: the pass holds a host sync."""
    if host.full_iteration or not tasks:
        return 0.0
    issue: list[float] = []
    graphs: set[CudaGraphScope] = set()
    for task in tasks:
        scope = op_scope(task, moe_layer)
        if _captured(scope, host.captured):
            assert scope is not None
            # one launch per graph, charged on its first op
            issue.append(0.0 if scope in graphs else host.op_s)
            graphs.add(scope)
        else:
            issue.append(host_ops(task) * host.op_s)
    if not synced:
        return max(0.0, sum(issue) - gpu_total_s)
    raw = [task_gpu_s(task) for task in tasks]
    total = sum(raw)
    scale = gpu_total_s / total if total > 0 else 0.0
    start = _sync_start(tasks)
    order = list(range(start, len(tasks))) + list(range(start))
    timed = synced_pass_s([issue[i] for i in order], [raw[i] * scale for i in order])
    return max(0.0, timed - gpu_total_s)


def moe_pass_synced(group: TaskGroup, phase: Phase, host: HostDispatch) -> bool:
    """Whether a MoE block's ``phase`` holds the dropless host sync: a forward run of the
    router (the forward, or a recompute of the whole MoE layer)."""
    if host.moe_forward_syncs == 0 or phase not in (Phase.FORWARD, Phase.RECOMPUTE):
        return False
    return any(
        isinstance(t, ComputeTask) and t.phase is phase and t.lineage.op is SemanticOpName.ROUTER
        for t in group.tasks
    )


def training_host_dispatch(
    model: TransformerModelSpec, graphs: CudaGraphs, system: SystemSpec
) -> HostDispatch:
    """What the host issues for ``model`` under ``graphs`` on ``system``."""
    moe = model.moe
    static = (
        moe is not None
        and isinstance(moe.dropping, CapacityFactor)
        and moe.dropping.pad_to_capacity
    )
    return HostDispatch(
        op_s=host_op_s(system.host_cpu),
        captured=captured_scopes(graphs, model),
        moe_forward_syncs=0 if static else 1,
    )
