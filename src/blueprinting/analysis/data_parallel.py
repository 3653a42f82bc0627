"""Data-parallel gradient synchronization and parameter gathering, per GPU per iteration.

What each optimizer-sharding variant sends over the DP group (Rajbhandari et al. 2020, ZeRO,
Section 5; Megatron-LM ``docs/user-guide/features/dist_optimizer.md``; Megatron-core
``distributed/param_and_grad_buffer.py`` for bucketing):

| variant | per iteration | per microbatch |
|---|---|---|
| NoOptimizerSharding | all-reduce of the gradients | - |
| DistributedOptimizer | reduce-scatter of gradients + all-gather of updated params | - |
| ShardedGradients | reduce-scatter of gradients + all-gather of updated params | - |
| ShardedParameters | - | all-gather params before forward and backward, reduce-scatter grads |

Overlap. ``overlap_grad_reduce`` launches each bucket's reduction as soon as the last microbatch's
backward has produced it, so it hides behind the rest of that backward. We follow Calculon's
window model (calculon/llm/llm.py, caa4b11, "DP overlap"): all virtual chunks but the last
finishing one hide their reduction behind ``p`` chunk backwards (interleaved 1F1B runs p
microbatches through a chunk before moving on), the last chunk hides all blocks but one behind its
own backward.
``overlap_param_gather`` hides the all-gather of updated parameters behind the next iteration's
first forward (Megatron dispatches it bucket by bucket in the forward pre-hook).

SMs. A hidden collective is not free: NCCL's ring kernel runs one thread block per channel, each
on an SM (:attr:`~blueprinting.hardware.system.RuntimeMemory.nccl_ring_ctas`: 24 of an H100's
132, 32 of a B200's 148), so the compute it hides behind runs on the rest. To first order, as
Transformer Engine's userbuffer overlap and combined 1F1B's exchanges are costed, that compute
is lengthened by ``f / (1 - f)`` x the hidden time, ``f`` the SMs' share
(:func:`collective_sm_overhead`): ``DataParallelCost.sm_contention_s``, part of the exposed
time. What the one figure leaves out (a review of NCCL @5067397c): a communicator's channels
follow its own topology (``src/graph/connect.cc`` doubles fewer than 16; ``NCCL_MIN_NCHANNELS``
/ ``NCCL_MAX_NCHANNELS`` and ``minCTAs`` / ``maxCTAs`` cap them), groups of one GPU per node may
run the PAT algorithm, NVLS and CollNet have channel counts of their own, a thread block shares
its SM with whatever else fits there, and under pipelining part of the overlap window can be
bubble, where nothing is slowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, assert_never, final

from blueprinting.hardware.collectives import CollectiveKind
from blueprinting.hardware.polymorphic import Real, maximum, where
from blueprinting.hardware.system import CommGroup, SystemSpec, held_sm_overhead

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

from blueprinting.mapping.transformer import (
    DataParallel,
    DistributedOptimizer,
    NoOptimizerSharding,
    ShardedGradients,
    ShardedParameters,
)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class DataParallelCost:
    """DP communication of the critical stage's GPU for one iteration.

    ``link_s`` is the total time the DP collectives occupy the link; ``exposed_s`` what they add
    to the iteration's critical path: ``grad_sync_exposed_s + param_gather_exposed_s`` (their
    unhidden part) ``+ sm_contention_s`` (the compute their hidden part slows).
    """

    grad_bytes: int
    param_gather_bytes: int
    grad_sync_s: float
    param_gather_s: float
    link_s: float
    exposed_s: float
    grad_sync_exposed_s: float
    param_gather_exposed_s: float
    #: the compute the hidden collectives slow by holding SMs (module docstring); in exposed_s
    sm_contention_s: float

    def then(self, other: DataParallelCost) -> DataParallelCost:
        """This sync and then ``other`` on the same GPU (a MoE model's dense buckets, then its
        expert buckets over expert-dp)."""
        return DataParallelCost(
            grad_bytes=self.grad_bytes + other.grad_bytes,
            param_gather_bytes=self.param_gather_bytes + other.param_gather_bytes,
            grad_sync_s=self.grad_sync_s + other.grad_sync_s,
            param_gather_s=self.param_gather_s + other.param_gather_s,
            link_s=self.link_s + other.link_s,
            exposed_s=self.exposed_s + other.exposed_s,
            grad_sync_exposed_s=self.grad_sync_exposed_s + other.grad_sync_exposed_s,
            param_gather_exposed_s=self.param_gather_exposed_s + other.param_gather_exposed_s,
            sm_contention_s=self.sm_contention_s + other.sm_contention_s,
        )


def collective_sm_overhead(system: SystemSpec) -> float:
    """``f / (1 - f)``, ``f`` = the share of the accelerator's SMs NCCL's ring kernel holds
    (module docstring); 0 where the system gives no SM count or no NCCL channel count."""
    return held_sm_overhead(system.runtime.nccl_ring_ctas, system.accelerator.sm_count)


def sm_contention_s(link_s: Real, exposed_s: Real, overhead: float) -> Real:
    """What the DP collectives' hidden part (``link_s - exposed_s``) adds to the compute it
    hides behind, at ``overhead`` = :func:`collective_sm_overhead`; numbers or columns."""
    return overhead * (link_s - exposed_s)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class OverlapWindows:
    """The compute a DP collective can hide behind (seconds), from PortablePlanIR."""

    blocks_per_chunk: int
    virtual_stages: int
    pipeline_degree: int
    block_backward_s: float
    chunk_backward_s: float
    stage_forward_s: float
    microbatch_count: int


def grad_sync_exposed(
    total_s: Real,
    *,
    blocks_per_chunk: Real,
    virtual_stages: Real,
    pipeline_degree: Real,
    block_backward_s: Real,
    chunk_backward_s: Real,
) -> Real:
    """Calculon's overlap window model (module docstring): the exposed part of a gradient
    reduction of ``total_s`` overlapped with the backward, on numbers or columns (the counts
    as floats there, exact below 2**53)."""
    blocks = blocks_per_chunk * virtual_stages
    per_block = total_s / maximum(blocks, blocks * 0.0 + 1.0)
    zero = total_s * 0.0
    chunk_sync = blocks_per_chunk * per_block
    early_chunks = virtual_stages - 1
    early_window = pipeline_degree * chunk_backward_s
    early_exposed = early_chunks * maximum(zero, chunk_sync - early_window)
    later_blocks = maximum(zero, blocks_per_chunk - 1)
    last_chunk_hidden = later_blocks * per_block
    last_window = later_blocks * block_backward_s
    # The last block's bucket can only start once the whole backward is done.
    last_exposed = per_block + maximum(zero, last_chunk_hidden - last_window)
    return where((blocks == 0) | (total_s == 0.0), total_s, early_exposed + last_exposed)


def _windowed(total_s: float, windows: OverlapWindows) -> float:
    return grad_sync_exposed(
        total_s,
        blocks_per_chunk=float(windows.blocks_per_chunk),
        virtual_stages=float(windows.virtual_stages),
        pipeline_degree=float(windows.pipeline_degree),
        block_backward_s=windows.block_backward_s,
        chunk_backward_s=windows.chunk_backward_s,
    )


def unsharded_exposure(
    all_reduce_s: Real, *, overlap_grad_reduce: bool | npt.NDArray[np.bool_], hidden: Real
) -> tuple[Real, Real, Real, Real]:
    """(grad sync, param gather, their exposed parts) without optimizer sharding: one
    all-reduce, ``hidden`` its exposed part under the overlap window (:func:`grad_sync_exposed`)."""
    zero = all_reduce_s * 0.0
    return all_reduce_s, zero, where(overlap_grad_reduce, hidden, all_reduce_s), zero


def optimizer_sharded_exposure(
    reduce_scatter_s: Real,
    all_gather_s: Real,
    *,
    overlap_grad_reduce: bool | npt.NDArray[np.bool_],
    overlap_param_gather: bool | npt.NDArray[np.bool_],
    hidden: Real,
    stage_forward_s: Real,
) -> tuple[Real, Real, Real, Real]:
    """The distributed optimizer (and sharded gradients): a reduce-scatter of the gradients
    behind the backward, an all-gather of the updated parameters behind the next iteration's
    first forward."""
    zero = all_gather_s * 0.0
    gather_exposed = where(
        overlap_param_gather, maximum(zero, all_gather_s - stage_forward_s), all_gather_s
    )
    sync_exposed = where(overlap_grad_reduce, hidden, reduce_scatter_s)
    return reduce_scatter_s, all_gather_s, sync_exposed, gather_exposed


def parameter_sharded_exposure(
    reduce_scatter_s: Real,
    all_gather_s: Real,
    *,
    microbatches: Real,
    overlap_grad_reduce: bool | npt.NDArray[np.bool_],
    overlap_param_gather: bool | npt.NDArray[np.bool_],
    hidden: Real,
    stage_forward_s: Real,
    chunk_backward_s: Real,
) -> tuple[Real, Real, Real, Real]:
    """ZeRO-3: per microbatch, parameter all-gathers before its forward and its backward and a
    reduce-scatter of its gradients (``reduce_scatter_s`` / ``all_gather_s``: one of each;
    ``hidden``: one reduce-scatter's exposed part under the window)."""
    m = microbatches
    zero = all_gather_s * 0.0
    sync = m * reduce_scatter_s
    gather = 2 * m * all_gather_s
    # With prefetching, each gather hides behind the previous unit's compute; what stays
    # exposed is the excess over one forward (before forward) and one backward.
    per_fw = maximum(zero, gather / (2 * m) - stage_forward_s)
    per_bw = maximum(zero, gather / (2 * m) - chunk_backward_s)
    gather_exposed = where(overlap_param_gather, m * (per_fw + per_bw), gather)
    # Each microbatch reduce-scatters its own gradients behind its own backward.
    sync_exposed = where(overlap_grad_reduce, m * hidden, sync)
    return sync, gather, sync_exposed, gather_exposed


def data_parallel_cost(
    *,
    data: DataParallel,
    stage_parameters: int,
    param_bytes: int,
    grad_bytes: int,
    group: CommGroup,
    system: SystemSpec,
    windows: OverlapWindows,
    param_gather_size: int | None = None,
) -> DataParallelCost:
    """DP cost for a GPU holding ``stage_parameters`` parameters (already divided by t);
    ``param_gather_size``: the all-gather's bytes when a low-precision param gather shrinks it
    (:func:`blueprinting.analysis.precision_memory.param_gather_bytes`; None: ``stage_parameters
    x param_bytes``)."""
    grads = stage_parameters * grad_bytes
    params = stage_parameters * param_bytes if param_gather_size is None else param_gather_size
    if group.size == 1:  # d x cp ranks: context parallelism alone still reduces gradients
        return DataParallelCost(
            grad_bytes=grads,
            param_gather_bytes=0,
            grad_sync_s=0.0,
            param_gather_s=0.0,
            link_s=0.0,
            exposed_s=0.0,
            grad_sync_exposed_s=0.0,
            param_gather_exposed_s=0.0,
            sm_contention_s=0.0,
        )

    def time(kind: CollectiveKind, size: int) -> float:
        return system.collective_time(kind, size, group)

    overhead = collective_sm_overhead(system)

    match data.optimizer_sharding:
        case NoOptimizerSharding():
            all_reduce = time(CollectiveKind.ALL_REDUCE, grads)
            sync, _, sync_exposed, _ = unsharded_exposure(
                all_reduce,
                overlap_grad_reduce=data.overlap_grad_reduce,
                hidden=_windowed(all_reduce, windows),
            )
            contention = sm_contention_s(sync, sync_exposed, overhead)
            return DataParallelCost(
                grad_bytes=grads,
                param_gather_bytes=0,
                grad_sync_s=sync,
                param_gather_s=0.0,
                link_s=sync,
                exposed_s=sync_exposed + contention,
                grad_sync_exposed_s=sync_exposed,
                param_gather_exposed_s=0.0,
                sm_contention_s=contention,
            )
        case (
            DistributedOptimizer(overlap_param_gather=overlap_gather)
            | ShardedGradients(overlap_param_gather=overlap_gather)
        ):
            reduce_scatter = time(CollectiveKind.REDUCE_SCATTER, grads)
            sync, gather, sync_exposed, gather_exposed = optimizer_sharded_exposure(
                reduce_scatter,
                time(CollectiveKind.ALL_GATHER, params),
                overlap_grad_reduce=data.overlap_grad_reduce,
                overlap_param_gather=overlap_gather,
                hidden=_windowed(reduce_scatter, windows),
                stage_forward_s=windows.stage_forward_s,
            )
            contention = sm_contention_s(sync + gather, sync_exposed + gather_exposed, overhead)
            return DataParallelCost(
                grad_bytes=grads,
                param_gather_bytes=params,
                grad_sync_s=sync,
                param_gather_s=gather,
                link_s=sync + gather,
                exposed_s=sync_exposed + gather_exposed + contention,
                grad_sync_exposed_s=sync_exposed,
                param_gather_exposed_s=gather_exposed,
                sm_contention_s=contention,
            )
        case ShardedParameters(overlap_param_gather=overlap_gather):
            per_microbatch_sync = time(CollectiveKind.REDUCE_SCATTER, grads)
            sync, gather, sync_exposed, gather_exposed = parameter_sharded_exposure(
                per_microbatch_sync,
                time(CollectiveKind.ALL_GATHER, params),
                microbatches=float(windows.microbatch_count),
                overlap_grad_reduce=data.overlap_grad_reduce,
                overlap_param_gather=overlap_gather,
                hidden=_windowed(per_microbatch_sync, windows),
                stage_forward_s=windows.stage_forward_s,
                chunk_backward_s=windows.chunk_backward_s,
            )
            contention = sm_contention_s(sync + gather, sync_exposed + gather_exposed, overhead)
            return DataParallelCost(
                grad_bytes=grads,
                param_gather_bytes=params,
                grad_sync_s=sync,
                param_gather_s=gather,
                link_s=sync + gather,
                exposed_s=sync_exposed + gather_exposed + contention,
                grad_sync_exposed_s=sync_exposed,
                param_gather_exposed_s=gather_exposed,
                sm_contention_s=contention,
            )
        case _ as unreachable:
            assert_never(unreachable)


def stage_data_parallel_cost(
    *,
    data: DataParallel,
    parameters: tuple[int, int],
    param_bytes: int,
    grad_bytes: int,
    groups: tuple[CommGroup, CommGroup],
    system: SystemSpec,
    windows: OverlapWindows,
    param_gather_sizes: tuple[int, int] | None = None,
) -> DataParallelCost:
    """A stage's DP cost for its (dense, routed-expert) ``parameters``: the dense ones reduce
    (and shard) over ``groups[0]`` (d x cp), then the experts' own buckets over ``groups[1]``
    (expert-dp; Megatron-Core ``distributed_data_parallel.py`` l.273-293 @d98e8a64);
    ``param_gather_sizes`` the two all-gathers' bytes (None: the parameters' bytes)."""
    dense, expert = parameters
    gathers = (None, None) if param_gather_sizes is None else param_gather_sizes
    cost = data_parallel_cost(
        data=data,
        stage_parameters=dense,
        param_bytes=param_bytes,
        grad_bytes=grad_bytes,
        group=groups[0],
        system=system,
        windows=windows,
        param_gather_size=gathers[0],
    )
    if expert == 0:
        return cost
    return cost.then(
        data_parallel_cost(
            data=data,
            stage_parameters=expert,
            param_bytes=param_bytes,
            grad_bytes=grad_bytes,
            group=groups[1],
            system=system,
            windows=windows,
            param_gather_size=gathers[1],
        )
    )
