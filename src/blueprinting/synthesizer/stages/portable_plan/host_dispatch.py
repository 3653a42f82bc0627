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
  HybridEP's dropless dispatch synchronizes its stream after the metadata preprocessing to read
  the tokens per expert on the host (DeepEP hybrid-ep @94a9f8f6 ``executor/executor.cu``
  ``metadata_preprocess_core``, ``non_blocking`` false when Megatron passes no
  ``num_permuted_tokens``: no ``moe_expert_rank_capacity_factor``, which has no Blueprinting
  key; the recipes that capture a full iteration with HybridEP run that sync-free budget).
  NCCL-EP is assumed to sync the same way. Drop-and-pad MoE
  (``moe_pad_expert_input_to_capacity``) has static shapes and no sync.
- **where the host is slower than the GPU** over a pass without a sync: ``max(0, H - G)``
  (the host cannot run further ahead than the work it has issued).

CUDA graphs over a scope (:mod:`blueprinting.mapping.cuda_graphs`) replay its ops without the
host: a captured scope costs one host op per pass (its graph launch: a graphed callable is one
autograd function call) instead of one per op; ``full_iteration`` captures the whole step, and
no host time is charged.

Ops are the IR's tasks (a grouped GEMM issued one call per expert,
``BatchedGemmCalls.CALL_PER_MEMBER``, counts one op per call), and on a MoE layer the kernels
its tasks stand for beyond their one costed kernel (:func:`moe_extra_host_ops`, counted in the
source as the performance recipes run it; :class:`MoeLayerHost`): the router's fused top-k and
aux-loss kernels and their backward, the alltoall dispatcher's token-count arithmetic and
device-to-host copies, the flex dispatchers' preprocessing (DeepEP's top-k, layout, notify and
multihot kernels; HybridEP's routing-map all-gather, metadata and pad kernels), the fused
permute's row-id map, the chunk sort's map, and Transformer Engine's per-split quantization of
each grouped GEMM's input and output gradient under a low-precision recipe. Host-side work
that launches no kernel (allocations, views, autograd bookkeeping, ``tolist``) is not counted,
so the host time stays a lower bound.

The per-op host cost is :func:`blueprinting.hardware.host.host_op_s` (a measured figure, not
fitted on any validated row).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import assert_never, final

from blueprinting.hardware.host import host_op_s
from blueprinting.hardware.system import SystemSpec
from blueprinting.mapping.cuda_graphs import CudaGraphs, CudaGraphScope, captured_scopes
from blueprinting.mapping.model import CapacityFactor, LoadBalancing, TransformerModelSpec
from blueprinting.mapping.transformer import (
    AllGatherDispatcher,
    AllToAllDispatcher,
    FlexBackend,
    FlexDispatcher,
    TokenDispatcher,
)
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


class DispatchKernels(StrEnum):
    """Whose kernels a MoE layer's token dispatch launches (:func:`dispatch_kernels`): the
    dispatcher (``--moe-token-dispatcher-type``) and, for ``flex``, its backend
    (``--moe-flex-dispatcher-backend``), whose preprocessing differs (the constants below)."""

    ALLTOALL = "alltoall"
    ALLGATHER = "allgather"
    DEEPEP = "flex-deepep"
    HYBRIDEP = "flex-hybridep"
    NCCLEP = "flex-ncclep"


def dispatch_kernels(dispatcher: TokenDispatcher) -> DispatchKernels:
    match dispatcher:
        case AllToAllDispatcher():
            return DispatchKernels.ALLTOALL
        case AllGatherDispatcher():
            return DispatchKernels.ALLGATHER
        case FlexDispatcher(backend=backend):
            match backend:
                case FlexBackend.DEEPEP:
                    return DispatchKernels.DEEPEP
                case FlexBackend.HYBRIDEP:
                    return DispatchKernels.HYBRIDEP
                case FlexBackend.NCCLEP:
                    return DispatchKernels.NCCLEP
                case _ as unreachable_backend:
                    assert_never(unreachable_backend)
        case _ as unreachable:
            assert_never(unreachable)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MoeLayerHost:
    """What decides the kernels a MoE layer launches beyond its IR tasks
    (:func:`moe_extra_host_ops`): the dispatcher and its flex backend
    (:class:`DispatchKernels`), whether the router trains with an auxiliary loss (``aux_loss``,
    ``seq_aux_loss``, ``global_aux_loss``; the sequence-level and global variants are counted
    as the plain one, whose kernels they share, a lower bound for their extra reshapes and
    tracker updates) and whether it updates an expert bias (``--moe-router-enable-expert-bias``)."""

    dispatcher: DispatchKernels
    load_balancing: LoadBalancing
    expert_bias: bool

    @property
    def aux_loss(self) -> bool:
        # a match, so that a new balancing must say whether it runs the aux-loss kernels
        match self.load_balancing:
            case (
                LoadBalancing.AUX_LOSS | LoadBalancing.SEQ_AUX_LOSS | LoadBalancing.GLOBAL_AUX_LOSS
            ):
                return True
            case LoadBalancing.SINKHORN | LoadBalancing.QUANTILE_BALANCING | LoadBalancing.NONE:
                return False
            case _ as unreachable:
                assert_never(unreachable)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class HostDispatch:
    """What the host issues for a strategy on a system: ``op_s`` per op, the CUDA graph
    scopes that replay instead (``captured``), the host syncs of one MoE layer's forward
    pass (``moe_forward_syncs``: 1 dropless, 0 drop-and-pad) and what its MoE layer launches
    beyond its IR tasks (``moe``; None: a dense model)."""

    op_s: float
    captured: frozenset[CudaGraphScope] = frozenset()
    moe_forward_syncs: int = 1
    moe: MoeLayerHost | None = None

    @property
    def dense_key(self) -> tuple[float, frozenset[CudaGraphScope], int]:
        """The fields a dense block's host time reads (``moe`` only touches MoE layers)."""
        return (self.op_s, self.captured, self.moe_forward_syncs)

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
    kernel of an eager chain (``ComputeTask.launches``), one per step of a P2P ring."""
    match task:
        case ComputeTask(gemm=gemm, launches=launches):
            if gemm is not None and gemm.calls is BatchedGemmCalls.CALL_PER_MEMBER:
                return gemm.batch
            return launches
        case CollectiveTask(steps=steps):
            return steps
        case _ as unreachable:
            assert_never(unreachable)


# Kernels a MoE layer's IR task launches beyond its one costed kernel, counted in the source
# the Megatron-Bridge performance recipes run (``moe_router_fusion``, ``moe_permute_fusion``,
# ``moe_grouped_gemm``, dropless): NVIDIA/Megatron-LM @d98e8a64 ``megatron/core/transformer/
# moe/router.py`` (``TopKRouter.routing``, ``_apply_aux_loss``, ``_apply_expert_bias``),
# ``moe_utils.py`` and ``token_dispatcher.py`` (``MoEAlltoAllTokenDispatcher``), and
# NVIDIA/TransformerEngine @d0067d0d ``transformer_engine/pytorch/module/grouped_linear.py``
# (the ``m_splits`` path) and ``pytorch/triton/permutation.py``. A kernel counts as one host op at
# the measured per-op cost; allocations, views and host-only bookkeeping are not counted.

#: The fused top-k with score function (TE ``fused_topk_with_score_function``): one kernel in
#: the forward, one in the backward, beside the gate GEMM the IR costs.
ROUTER_TOPK_OPS = (1, 1)
#: An auxiliary loss (forward): the fused aux-loss scores, ``routing_map.sum(dim=0)``, the fused
#: loss (TE ``fused_moe_aux_loss``), and the metrics tracker's ``aux_loss / coeff`` and
#: ``values[layer] += loss``; the reduction of the counts over tp x cp is not counted (no kernel
#: at tp x cp = 1). Backward: ``MoEAuxLossAutoScaler``'s ``ones_like`` and scale multiply, the
#: fused loss's and the scores' backward.
ROUTER_AUX_LOSS_OPS = (5, 4)
#: The expert-bias bookkeeping (forward only): ``local_tokens_per_expert += routing_map.sum(0)``.
ROUTER_EXPERT_BIAS_OPS = 2
#: The alltoall dispatcher's ``preprocess``: ``routing_map.sum(dim=0).long()`` (always), then
#: under an expert grid (ep x etp > 1) the input splits' sum, the gathered counts' contiguous
#: slice and three sums (``num_global_tokens_per_rank``, ``output_splits_tp``,
#: ``num_tokens_per_local_expert``).
ALLTOALL_COUNT_OPS = 2
ALLTOALL_GRID_COUNT_OPS = 5
#: ``_maybe_dtoh_and_synchronize``'s device-to-host copies: the tokens per expert, and under an
#: expert grid the input, output and TP output splits.
ALLTOALL_DTOH_OPS = 1
ALLTOALL_GRID_DTOH_OPS = 4
#: The fused permute's row-id map (TE ``make_row_id_map``: three Triton passes) before the
#: permute kernel the IR costs.
PERMUTE_ROW_ID_MAP_OPS = 3
#: ``sort_chunks_by_idxs`` (fused, TE ``sort_chunks_by_map``): the chunk-sort map
#: (``make_chunk_sort_map``) before each forward sort the IR costs; the backward re-sorts with
#: the saved map.
CHUNK_SORT_MAP_OPS = 1
#: ``output += shared_expert_output`` in the combine's postprocess.
SHARED_EXPERT_ADD_OPS = 1

# The flex dispatchers' own preprocessing (Megatron-LM @d98e8a64 ``token_dispatcher.py``
# ``MoEFlexTokenDispatcher``, ``_DeepepManager``, ``_HybridEPManager``; ``fused_a2a.py``), at
# tp = 1 (``_initialize_metadata``'s expand over the TP ranks is a view there; every validated
# flex row runs tp = 1) and with the routing probabilities already fp32 (the managers cast them
# otherwise: one more kernel each way on a router without ``moe_router_dtype = fp32``, which has
# no Blueprinting key, so not counted).
#
# DeepEP (deepseek-ai/DeepEP v1.2.1 @9af0e0d0 ``csrc/deep_ep.cpp``, the ``Buffer`` API Megatron's
# ``fused_a2a.py`` calls): ``setup_metadata``'s ``torch.topk`` (the routing map to indices; its
# backward a scatter), ``get_dispatch_layout`` (one kernel), and before every dispatch or combine
# kernel -- forward, and the backward's reversed pair -- its ``notify_dispatch`` /
# ``cached_notify_dispatch`` / ``cached_notify_combine`` (internode: ``notify_dispatch`` /
# ``cached_notify``) kernel, beside the exchange the IR costs. The received indices become a
# multihot map before the TE fused permute (its row-id map counted above): Megatron's Triton
# ``fused_indices_to_multihot`` (one kernel forward, one backward) under
# ``enable_megatron_core_experimental``, which Megatron-Bridge's DeepSeek performance recipes set
# (r0.3.0+ ``scripts/performance/configs/deepseek/deepseek_llm_pretrain.py``); without it the
# eager ``_indices_to_multihot`` issues about 13 ATen ops (zeros, masks, two boolean indexings,
# ``repeat_interleave``, two ``index_put_``), counted as the fused one (a lower bound).

#: ``torch.topk`` forward, its backward's scatter.
DEEPEP_TOPK_OPS = (1, 1)
#: ``Buffer.get_dispatch_layout`` (forward).
DEEPEP_LAYOUT_OPS = 1
#: The notify kernel before each DeepEP dispatch or combine kernel.
DEEPEP_NOTIFY_OPS = 1
#: ``fused_indices_to_multihot``: forward, backward.
DEEPEP_MULTIHOT_OPS = (1, 1)

# HybridEP (deepseek-ai/DeepEP branch hybrid-ep @94a9f8f6 ``deep_ep/hybrid_ep_buffer.py``
# ``dispatch_with_permute``, ``csrc/hybrid_ep/hybrid_ep.cu`` ``metadata_preprocessing``,
# ``executor/executor.cu``): the dropless forward dispatch first all-gathers the routing map
# over the EP group (``allgather_routing_map``: the custom all-gather kernel inside one NVLink
# domain, NCCL's ``all_gather_into_tensor`` across them), runs the metadata preprocessing kernel
# and the tokens-per-expert pad kernel (then ``cudaStreamSynchronize``: the dropless host sync),
# then the dispatch kernel (the IR's exchange) and its own permute kernel (the IR's permute op;
# ``moe_permute_fusion_into_hybridep`` is off by default and in every recipe read). The combine
# and both backward passes reuse the handle: unpermute + combine, dispatch + permute, as the IR
# costs them. HybridEP permutes with its own kernel, not TE's: no row-id map.

#: ``allgather_routing_map``, the preprocessing kernel, ``pad_tokens_per_expert`` (forward).
HYBRIDEP_METADATA_OPS = 3


def _forward_like(phase: Phase) -> bool:
    return phase in (Phase.FORWARD, Phase.RECOMPUTE)


def moe_extra_host_ops(
    task: ComputeTask,
    layer: MoeLayerHost,
    *,
    local_experts: int,
    expert_grid: bool,
    shared_experts: bool,
    quantized: bool,
) -> int:
    """Kernels ``task`` of a MoE layer launches beyond the one its cost counts (the constants
    above): ``local_experts`` the grouped GEMMs' splits, ``expert_grid`` whether the layer
    exchanges tokens (ep x etp > 1), ``quantized`` whether the task's GEMM quantizes its input
    or output gradient (Transformer Engine's ``split_quantize``: one cast kernel per split).
    The router's auxiliary loss is counted on every forward run, the recompute's too (Megatron
    skips it only without autograd). The backward's extras sit on the data-gradient task."""
    op, phase = task.lineage.op, task.phase
    forward = _forward_like(phase)
    backward = phase is Phase.BACKWARD_ACTIVATION_GRAD
    if not (forward or backward):
        return 0
    side = 0 if forward else 1
    if op is SemanticOpName.ROUTER:
        ops = ROUTER_TOPK_OPS[side] + (ROUTER_AUX_LOSS_OPS[side] if layer.aux_loss else 0)
        return ops + (ROUTER_EXPERT_BIAS_OPS if forward and layer.expert_bias else 0)
    if op is SemanticOpName.MOE_PERMUTE:
        return _permute_extra_ops(layer.dispatcher, forward=forward, expert_grid=expert_grid)
    if op in (SemanticOpName.MOE_SORT_CHUNKS, SemanticOpName.MOE_UNSORT_CHUNKS):
        return CHUNK_SORT_MAP_OPS if forward else 0
    if op is SemanticOpName.MOE_UNPERMUTE:
        # the combine's notify kernel (forward), the dispatch's in its backward
        notify = DEEPEP_NOTIFY_OPS if layer.dispatcher is DispatchKernels.DEEPEP else 0
        return notify + (SHARED_EXPERT_ADD_OPS if forward and shared_experts else 0)
    if op in (SemanticOpName.EXPERT_FC1, SemanticOpName.EXPERT_FC2):
        return local_experts if quantized else 0
    return 0


def _permute_extra_ops(kernels: DispatchKernels, *, forward: bool, expert_grid: bool) -> int:
    """The kernels of the permute task beyond its costed one: the dispatcher's preprocessing
    (forward) and, for DeepEP, the backward's multihot gradient and combine notify. NCCL-EP's
    preprocessing is not counted (TE's row-id map only)."""
    match kernels:
        case DispatchKernels.ALLTOALL:
            if not forward:
                return 0
            ops = PERMUTE_ROW_ID_MAP_OPS + ALLTOALL_COUNT_OPS + ALLTOALL_DTOH_OPS
            if expert_grid:
                ops += ALLTOALL_GRID_COUNT_OPS + ALLTOALL_GRID_DTOH_OPS
            return ops
        case DispatchKernels.ALLGATHER | DispatchKernels.NCCLEP:
            return PERMUTE_ROW_ID_MAP_OPS if forward else 0
        case DispatchKernels.DEEPEP:
            side = 0 if forward else 1
            ops = DEEPEP_TOPK_OPS[side] + DEEPEP_NOTIFY_OPS + DEEPEP_MULTIHOT_OPS[side]
            if forward:
                ops += PERMUTE_ROW_ID_MAP_OPS + DEEPEP_LAYOUT_OPS
            return ops
        case DispatchKernels.HYBRIDEP:
            return HYBRIDEP_METADATA_OPS if forward else 0
        case _ as unreachable:
            assert_never(unreachable)


def moe_layer_host_ops(
    group: TaskGroup, layer: MoeLayerHost, quantized: Callable[[ComputeTask], bool]
) -> Callable[[Task], int]:
    """The host ops of each task of a MoE block's ``group``: :func:`host_ops` plus
    :func:`moe_extra_host_ops`, with the layer's facts read off its tasks (the local experts
    from the grouped GEMM's batch, the expert grid from its token dispatch)."""
    local_experts = 1
    expert_grid = shared = False
    for t in group.tasks:
        match t:
            case ComputeTask(lineage=lineage, gemm=gemm):
                if lineage.op is SemanticOpName.EXPERT_FC1 and gemm is not None:
                    local_experts = gemm.batch
                shared = shared or lineage.op is SemanticOpName.SHARED_EXPERT_UP
            case CollectiveTask(purpose=purpose):
                expert_grid = expert_grid or purpose is CollectivePurpose.TOKEN_DISPATCH
            case _ as unreachable:
                assert_never(unreachable)

    def ops(task: Task) -> int:
        match task:
            case ComputeTask():
                return host_ops(task) + moe_extra_host_ops(
                    task,
                    layer,
                    local_experts=local_experts,
                    expert_grid=expert_grid,
                    shared_experts=shared,
                    quantized=quantized(task),
                )
            case CollectiveTask():
                return host_ops(task)
            case _ as unreachable:
                assert_never(unreachable)

    return ops


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
    task_ops: Callable[[Task], int] = host_ops,
) -> float:
    """The host time one layer pass exposes (module docstring): ``tasks`` in issue order,
    ``gpu_total_s`` the pass's critical path on the GPU (the per-task times are scaled to it,
    so overlapped communication keeps its share), ``synced``: the pass holds a host sync,
    ``task_ops`` the host ops of an uncaptured task (:func:`moe_layer_host_ops` on a MoE
    layer)."""
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
            issue.append(task_ops(task) * host.op_s)
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
    model: TransformerModelSpec,
    graphs: CudaGraphs,
    system: SystemSpec,
    *,
    dispatcher: TokenDispatcher,
) -> HostDispatch:
    """What the host issues for ``model`` under ``graphs`` on ``system``, its MoE layers'
    tokens dispatched by ``dispatcher``."""
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
        moe=None
        if moe is None
        else MoeLayerHost(
            dispatcher=dispatch_kernels(dispatcher),
            load_balancing=moe.load_balancing,
            expert_bias=moe.expert_bias,
        ),
    )
