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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_never, final

from blueprinting.hardware.collectives import CollectiveKind
from blueprinting.hardware.system import CommGroup, SystemSpec
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

    ``link_s`` is the total time the DP collectives occupy the link; ``exposed_s`` the part of it
    on the iteration's critical path: ``grad_sync_exposed_s + param_gather_exposed_s``.
    """

    grad_bytes: int
    param_gather_bytes: int
    grad_sync_s: float
    param_gather_s: float
    link_s: float
    exposed_s: float
    grad_sync_exposed_s: float
    param_gather_exposed_s: float

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
        )


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


def _grad_sync_exposed(total_s: float, windows: OverlapWindows) -> float:
    """Calculon's overlap window model (see module docstring)."""
    blocks = windows.blocks_per_chunk * windows.virtual_stages
    if blocks == 0 or total_s == 0.0:
        return total_s
    per_block = total_s / blocks
    chunk_sync = windows.blocks_per_chunk * per_block
    early_chunks = windows.virtual_stages - 1
    early_window = windows.pipeline_degree * windows.chunk_backward_s
    early_exposed = early_chunks * max(0.0, chunk_sync - early_window)
    last_chunk_hidden = max(0, windows.blocks_per_chunk - 1) * per_block
    last_window = max(0, windows.blocks_per_chunk - 1) * windows.block_backward_s
    # The last block's bucket can only start once the whole backward is done.
    last_exposed = per_block + max(0.0, last_chunk_hidden - last_window)
    return early_exposed + last_exposed


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
        )

    def time(kind: CollectiveKind, size: int) -> float:
        return system.collective_time(kind, size, group)

    match data.optimizer_sharding:
        case NoOptimizerSharding():
            sync = time(CollectiveKind.ALL_REDUCE, grads)
            sync_exposed = _grad_sync_exposed(sync, windows) if data.overlap_grad_reduce else sync
            return DataParallelCost(
                grad_bytes=grads,
                param_gather_bytes=0,
                grad_sync_s=sync,
                param_gather_s=0.0,
                link_s=sync,
                exposed_s=sync_exposed,
                grad_sync_exposed_s=sync_exposed,
                param_gather_exposed_s=0.0,
            )
        case (
            DistributedOptimizer(overlap_param_gather=overlap_gather)
            | ShardedGradients(overlap_param_gather=overlap_gather)
        ):
            sync = time(CollectiveKind.REDUCE_SCATTER, grads)
            gather = time(CollectiveKind.ALL_GATHER, params)
            sync_exposed = _grad_sync_exposed(sync, windows) if data.overlap_grad_reduce else sync
            gather_exposed = (
                max(0.0, gather - windows.stage_forward_s) if overlap_gather else gather
            )
            return DataParallelCost(
                grad_bytes=grads,
                param_gather_bytes=params,
                grad_sync_s=sync,
                param_gather_s=gather,
                link_s=sync + gather,
                exposed_s=sync_exposed + gather_exposed,
                grad_sync_exposed_s=sync_exposed,
                param_gather_exposed_s=gather_exposed,
            )
        case ShardedParameters(overlap_param_gather=overlap_gather):
            m = windows.microbatch_count
            per_microbatch_sync = time(CollectiveKind.REDUCE_SCATTER, grads)
            sync = m * per_microbatch_sync
            gather = 2 * m * time(CollectiveKind.ALL_GATHER, params)
            # With prefetching, each gather hides behind the previous unit's compute; what stays
            # exposed is the excess over one forward (before forward) and one backward.
            if overlap_gather:
                per_fw = max(0.0, gather / (2 * m) - windows.stage_forward_s)
                per_bw = max(0.0, gather / (2 * m) - windows.chunk_backward_s)
                gather_exposed = m * (per_fw + per_bw)
            else:
                gather_exposed = gather
            # Each microbatch reduce-scatters its own gradients behind its own backward.
            sync_exposed = (
                m * _grad_sync_exposed(per_microbatch_sync, windows)
                if data.overlap_grad_reduce
                else sync
            )
            return DataParallelCost(
                grad_bytes=grads,
                param_gather_bytes=params,
                grad_sync_s=sync,
                param_gather_s=gather,
                link_s=sync + gather,
                exposed_s=sync_exposed + gather_exposed,
                grad_sync_exposed_s=sync_exposed,
                param_gather_exposed_s=gather_exposed,
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
