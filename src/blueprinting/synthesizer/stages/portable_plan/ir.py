"""PortablePlanIR: the costed local plan, times and sizes only (seed: "PortablePlan pass contract").

It is produced from DistributedTaskIR by costing every task on a system, and holds, for one GPU:

- the forward, backward (activation- and weight-gradient) and recompute critical paths of one
  local TP block, each split into compute time and TP-communication time (link and exposed);
- the first-stage (embedding) and last-stage (LM head and loss) extras;
- the blocks each physical pipeline stage holds and how they split into virtual chunks;
- the P2P message between adjacent stages.

It says nothing about devices or about how PP and DP compose: iteration analysis does that from the
typed program. The forward and backward *chunk* critical paths of the seed's 1F1B contract are
derived here (``forward_chunk_s`` / ``backward_chunk_s``) following Calculon's decomposition
(Isaev et al., SC'23, "Calculon", Section 3: a chunk is its blocks' compute plus their exposed TP
communication plus one P2P transfer at the chunk's edge).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias, cast, final

from blueprinting.errors import VerificationError
from blueprinting.hardware.polymorphic import maximum, where
from blueprinting.synthesizer.stages.portable_plan.ep_overlap import CombinedLayerTiming


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseCost:
    """One phase of one unit of work on one GPU.

    ``compute_s`` is the serial compute time of its tasks; ``comm_s`` the link time of its TP
    collectives; ``comm_exposed_s`` the part of that on the critical path (equal to ``comm_s``
    unless communication is overlapped); ``cp_comm_s`` / ``cp_comm_exposed_s`` the same for the
    context-parallel K/V exchanges. ``flops`` and ``bytes_moved`` are local counts.
    ``overlap_compute_s`` is the part of ``compute_s`` that overlapping TP communication costs the
    GEMMs (chunked GEMMs' lower efficiency, SMs held by communication kernels; 0 without
    userbuffer overlap). ``quantize_s`` is the part of ``compute_s`` the low-precision recipe's
    quantization kernels take (:meth:`~.precision.OpPrecision.quantized_bytes`; 0 at the base
    precision).
    """

    compute_s: float
    comm_s: float = 0.0
    comm_exposed_s: float = 0.0
    flops: int = 0
    bytes_moved: int = 0
    overlap_compute_s: float = 0.0
    cp_comm_s: float = 0.0
    cp_comm_exposed_s: float = 0.0
    #: a MoE layer's token dispatch and combine (expert-parallel all-to-alls / gathers)
    ep_comm_s: float = 0.0
    ep_comm_exposed_s: float = 0.0
    quantize_s: float = 0.0
    #: the host (CPU) issue time the GPU waits for (:mod:`.host_dispatch`)
    host_exposed_s: float = 0.0

    @property
    def comm_hidden_s(self) -> float:
        return self.comm_s - self.comm_exposed_s

    @property
    def critical_path_s(self) -> float:
        return (
            self.compute_s
            + self.comm_exposed_s
            + self.cp_comm_exposed_s
            + self.ep_comm_exposed_s
            + self.host_exposed_s
        )

    def scaled(self, factor: int) -> PhaseCost:
        return PhaseCost(
            compute_s=self.compute_s * factor,
            comm_s=self.comm_s * factor,
            comm_exposed_s=self.comm_exposed_s * factor,
            flops=self.flops * factor,
            bytes_moved=self.bytes_moved * factor,
            overlap_compute_s=self.overlap_compute_s * factor,
            cp_comm_s=self.cp_comm_s * factor,
            cp_comm_exposed_s=self.cp_comm_exposed_s * factor,
            ep_comm_s=self.ep_comm_s * factor,
            ep_comm_exposed_s=self.ep_comm_exposed_s * factor,
            quantize_s=self.quantize_s * factor,
            host_exposed_s=self.host_exposed_s * factor,
        )


ZERO_PHASE = PhaseCost(compute_s=0.0)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class BlockCost:
    """Critical paths of one local transformer block for one microbatch."""

    forward: PhaseCost
    backward_activation: PhaseCost
    backward_weight: PhaseCost
    recompute: PhaseCost = ZERO_PHASE

    @property
    def forward_s(self) -> float:
        return self.forward.critical_path_s

    @property
    def backward_s(self) -> float:
        """Backward critical path without recompute."""
        return self.backward_activation.critical_path_s + self.backward_weight.critical_path_s

    @property
    def backward_with_recompute_s(self) -> float:
        return self.backward_s + self.recompute.critical_path_s


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ExtraCost:
    """Work that only the first (embedding) or last (LM head, loss) pipeline stage does."""

    forward: PhaseCost
    backward: PhaseCost

    @property
    def total_s(self) -> float:
        return self.forward.critical_path_s + self.backward.critical_path_s


NO_EXTRA = ExtraCost(forward=ZERO_PHASE, backward=ZERO_PHASE)

#: a block cost of zero in every phase (a difference that changes nothing)
NO_BLOCK_CHANGE = BlockCost(
    forward=ZERO_PHASE, backward_activation=ZERO_PHASE, backward_weight=ZERO_PHASE
)

if TYPE_CHECKING:
    from blueprinting.hardware.polymorphic import Column, IntColumn

# numpy stays off the plan's import path (the CLI's start-up): the column types are names.
#: A count of blocks, or a column of counts (the vectorized search's candidates).
Count: TypeAlias = "int | IntColumn"
#: A time in seconds, or a column of times.
Seconds: TypeAlias = "float | Column"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCounts:
    """The blocks of a chunk or a stage by kind: dense and MoE, the recomputed ones of each,
    and the sliding-window ones of each (sub-counts that add their kind's change). On numbers
    (``StagePlan``) or columns (the vectorized search), one formula for both below."""

    dense: Count
    moe: Count
    dense_recomputed: Count
    moe_recomputed: Count
    windowed: Count
    windowed_recomputed: Count
    moe_windowed: Count
    moe_windowed_recomputed: Count


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class KindTimes:
    """One kind of block's critical paths: forward, backward (without recompute), recompute."""

    forward: Seconds
    backward: Seconds
    recompute: Seconds

    @staticmethod
    def of(block: BlockCost) -> KindTimes:
        return KindTimes(
            forward=block.forward_s,
            backward=block.backward_s,
            recompute=block.recompute.critical_path_s,
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LayerTimes:
    """The costed kinds of ``PortablePlanIR``: the dense block, the MoE block (the dense one
    for a dense model) and the sliding-window changes of each (zero without windows)."""

    block: KindTimes
    moe: KindTimes
    window: KindTimes
    moe_window: KindTimes


def layers_forward_s(n: LayerCounts, t: LayerTimes) -> Seconds:
    """Forward critical path of ``n``'s blocks, P2P excluded (a chunk's, or a stage's)."""
    return cast(
        "Seconds",
        n.dense * t.block.forward
        + n.moe * t.moe.forward
        + n.windowed * t.window.forward
        + n.moe_windowed * t.moe_window.forward,
    )


def layers_backward_s(n: LayerCounts, t: LayerTimes) -> Seconds:
    """Backward critical path of ``n``'s blocks with their recompute, P2P excluded."""
    return cast(
        "Seconds",
        n.dense * t.block.backward
        + n.moe * t.moe.backward
        + n.dense_recomputed * t.block.recompute
        + n.moe_recomputed * t.moe.recompute
        + n.windowed * t.window.backward
        + n.windowed_recomputed * t.window.recompute
        + n.moe_windowed * t.moe_window.backward
        + n.moe_windowed_recomputed * t.moe_window.recompute,
    )


def mean_block_backward_s(n: LayerCounts, t: LayerTimes) -> Seconds:
    """One block's backward (recompute excluded) averaged over a stage's blocks of each kind:
    the window the data-parallel overlap gives each gradient bucket
    (``analysis/data_parallel.py``); the dense block's exactly on a stage of dense
    full-attention blocks (or none)."""
    blocks = n.dense + n.moe
    mixed = (n.moe + n.windowed + n.moe_windowed > 0) & (blocks > 0)
    mean = cast(
        "Column",
        (
            n.dense * t.block.backward
            + n.moe * t.moe.backward
            + n.windowed * t.window.backward
            + n.moe_windowed * t.moe_window.backward
        )
        / maximum(blocks, 1),
    )
    return cast("Seconds", where(mixed, mean, cast("Column", t.block.backward)))


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StagePlan:
    """One physical pipeline stage: its blocks per virtual chunk, how many of them recompute
    their forward in backward, and which extras it carries."""

    index: int
    blocks_per_chunk: tuple[int, ...]
    recomputed_blocks_per_chunk: tuple[int, ...]
    has_embedding: bool
    has_lm_head: bool
    #: how many of each chunk's blocks (and of its recomputed ones) are MoE layers (empty: none)
    moe_blocks_per_chunk: tuple[int, ...] = ()
    moe_recomputed_per_chunk: tuple[int, ...] = ()
    #: the chunk holding the recipe's first (last) base-precision layers, None when this stage
    #: holds none of them (``PortablePlanIR.first_layers`` / ``last_layers``)
    first_layers_chunk: int | None = None
    last_layers_chunk: int | None = None
    #: how many of each chunk's dense blocks (and of its recomputed ones) are sliding-window
    #: layers (empty: the model has none; ``PortablePlanIR.window``), and of its MoE blocks
    #: (``PortablePlanIR.moe_window``)
    windowed_blocks_per_chunk: tuple[int, ...] = ()
    windowed_recomputed_per_chunk: tuple[int, ...] = ()
    moe_windowed_per_chunk: tuple[int, ...] = ()
    moe_windowed_recomputed_per_chunk: tuple[int, ...] = ()

    @property
    def blocks(self) -> int:
        return sum(self.blocks_per_chunk)

    @property
    def recomputed_blocks(self) -> int:
        return sum(self.recomputed_blocks_per_chunk)

    @property
    def moe_blocks(self) -> int:
        return sum(self.moe_blocks_per_chunk)

    @property
    def moe_recomputed_blocks(self) -> int:
        return sum(self.moe_recomputed_per_chunk)

    @property
    def dense_blocks(self) -> int:
        return self.blocks - self.moe_blocks

    @property
    def dense_recomputed_blocks(self) -> int:
        return self.recomputed_blocks - self.moe_recomputed_blocks

    @property
    def windowed_blocks(self) -> int:
        """The stage's dense sliding-window blocks."""
        return sum(self.windowed_blocks_per_chunk)

    @property
    def windowed_recomputed_blocks(self) -> int:
        return sum(self.windowed_recomputed_per_chunk)

    @property
    def moe_windowed_blocks(self) -> int:
        """The stage's MoE sliding-window blocks."""
        return sum(self.moe_windowed_per_chunk)

    @property
    def moe_windowed_recomputed_blocks(self) -> int:
        return sum(self.moe_windowed_recomputed_per_chunk)

    def chunk_windowed(self, chunk: int) -> tuple[int, int, int, int]:
        """(dense sliding-window blocks, the recomputed ones, MoE sliding-window blocks, the
        recomputed ones) of chunk ``chunk``."""
        if not self.windowed_blocks_per_chunk:
            return 0, 0, 0, 0
        return (
            self.windowed_blocks_per_chunk[chunk],
            self.windowed_recomputed_per_chunk[chunk],
            self.moe_windowed_per_chunk[chunk],
            self.moe_windowed_recomputed_per_chunk[chunk],
        )

    def chunk_counts(self, chunk: int) -> LayerCounts:
        """Virtual chunk ``chunk``'s blocks by kind."""
        moe, moe_recomputed = self.chunk_moe(chunk)
        windowed, windowed_recomputed, moe_windowed, moe_windowed_recomputed = self.chunk_windowed(
            chunk
        )
        return LayerCounts(
            dense=self.blocks_per_chunk[chunk] - moe,
            moe=moe,
            dense_recomputed=self.recomputed_blocks_per_chunk[chunk] - moe_recomputed,
            moe_recomputed=moe_recomputed,
            windowed=windowed,
            windowed_recomputed=windowed_recomputed,
            moe_windowed=moe_windowed,
            moe_windowed_recomputed=moe_windowed_recomputed,
        )

    @property
    def counts(self) -> LayerCounts:
        """The stage's blocks by kind, over all its chunks."""
        return LayerCounts(
            dense=self.dense_blocks,
            moe=self.moe_blocks,
            dense_recomputed=self.dense_recomputed_blocks,
            moe_recomputed=self.moe_recomputed_blocks,
            windowed=self.windowed_blocks,
            windowed_recomputed=self.windowed_recomputed_blocks,
            moe_windowed=self.moe_windowed_blocks,
            moe_windowed_recomputed=self.moe_windowed_recomputed_blocks,
        )

    def chunk_moe(self, chunk: int) -> tuple[int, int]:
        """(MoE blocks, recomputed MoE blocks) of virtual chunk ``chunk``."""
        if not self.moe_blocks_per_chunk:
            return 0, 0
        return self.moe_blocks_per_chunk[chunk], self.moe_recomputed_per_chunk[chunk]


def _subcounts_exceed(
    holders: tuple[int, ...],
    holders_recomputed: tuple[int, ...],
    counts: tuple[int, ...],
    recomputed: tuple[int, ...],
) -> bool:
    """Whether per-chunk sub-counts of some blocks (a stage's MoE blocks within all its blocks,
    its windowed dense blocks within its dense ones, its windowed MoE blocks within its MoE
    ones), and of those the recomputed, fail to lie within the holders and their recomputed
    ones (empty counts: none of that kind, which holds)."""
    if not counts:
        return False
    chunks = len(holders)
    return (
        len(counts) != chunks
        or len(recomputed) != chunks
        or any(
            not (0 <= kr <= k <= b and kr <= r)
            for b, r, k, kr in zip(holders, holders_recomputed, counts, recomputed, strict=True)
        )
    )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PortablePlanIR:
    """The costed local plan of one training strategy on one system (see module docstring)."""

    block: BlockCost
    embedding: ExtraCost
    lm_head: ExtraCost
    stages: tuple[StagePlan, ...]
    #: what the first / last decoder layers a low-precision recipe keeps at the base precision
    #: add on the embedding's / the loss's stage (``--first-last-layers-bf16``)
    first_layers: ExtraCost = NO_EXTRA
    last_layers: ExtraCost = NO_EXTRA
    #: a MoE model's MoE layer (``block`` is then its dense layer)
    moe_block: BlockCost | None = None
    #: the multi-token-prediction depths on the loss's stage (``--mtp-num-layers``)
    mtp: ExtraCost = NO_EXTRA
    #: the MoE layer under combined 1F1B (``--overlap-moe-expert-parallel-comm``):
    #: ``moe_block`` is then its steady state, and this its pair / alone times
    ep_overlap: CombinedLayerTiming | None = None
    #: a sliding-window dense / MoE layer minus the full one (``passes.window_delta``), added
    #: once per windowed block of that kind of a chunk (``StagePlan.windowed_blocks_per_chunk``
    #: / ``moe_windowed_per_chunk``; None: no windowed layer of that kind)
    window: BlockCost | None = None
    moe_window: BlockCost | None = None
    #: a windowed MoE layer's pair / alone times under combined 1F1B (None: no such layer or
    #: no EP overlap; ``ep_overlap`` is the full layer's)
    moe_window_ep_overlap: CombinedLayerTiming | None = None
    p2p_forward_s: float
    p2p_backward_s: float
    p2p_bytes: int

    def __post_init__(self) -> None:
        self.verify()

    def verify(self) -> None:
        """Structural invariants: stages indexed 0..p-1, equal chunk counts, non-negative times."""
        problems: list[str] = []
        if not self.stages:
            problems.append("a plan needs at least one pipeline stage")
        for position, stage in enumerate(self.stages):
            if stage.index != position:
                problems.append(f"stage at position {position} has index {stage.index}")
            if len(stage.blocks_per_chunk) != len(self.stages[0].blocks_per_chunk):
                problems.append(f"stage {stage.index} has a different virtual chunk count")
            if any(b < 0 for b in stage.blocks_per_chunk):
                problems.append(f"stage {stage.index} has a negative block count")
            if len(stage.recomputed_blocks_per_chunk) != len(stage.blocks_per_chunk) or any(
                not 0 <= r <= b
                for r, b in zip(
                    stage.recomputed_blocks_per_chunk, stage.blocks_per_chunk, strict=True
                )
            ):
                problems.append(f"stage {stage.index} recomputes blocks it does not hold")
                continue
            blocks, rerun = stage.blocks_per_chunk, stage.recomputed_blocks_per_chunk
            moe, moe_rerun = stage.moe_blocks_per_chunk, stage.moe_recomputed_per_chunk
            if _subcounts_exceed(blocks, rerun, moe, moe_rerun) or (moe and self.moe_block is None):
                problems.append(f"stage {stage.index} has MoE blocks it does not hold")
                continue
            # the windowed dense blocks lie within the dense ones, the windowed MoE within the MoE
            none = (0,) * len(blocks)
            moe_held, moe_held_rerun = moe or none, moe_rerun or none
            dense = tuple(b - m for b, m in zip(blocks, moe_held, strict=True))
            dense_rerun = tuple(r - m for r, m in zip(rerun, moe_held_rerun, strict=True))
            windowed = stage.windowed_blocks_per_chunk
            moe_windowed = stage.moe_windowed_per_chunk
            if (
                _subcounts_exceed(dense, dense_rerun, windowed, stage.windowed_recomputed_per_chunk)
                or _subcounts_exceed(
                    moe_held, moe_held_rerun, moe_windowed, stage.moe_windowed_recomputed_per_chunk
                )
                or len(windowed) != len(moe_windowed)
                or (any(windowed) and self.window is None)
                or (any(moe_windowed) and self.moe_window is None)
            ):
                problems.append(f"stage {stage.index} has windowed blocks it does not hold")
        times = (self.p2p_forward_s, self.p2p_backward_s)
        if any(t < 0 for t in times) or self.p2p_bytes < 0:
            problems.append("P2P time and size must be non-negative")
        if problems:
            raise VerificationError("PortablePlanIR: " + "; ".join(problems))

    # Derived projections ----------------------------------------------------------------
    @property
    def pipeline_degree(self) -> int:
        return len(self.stages)

    @property
    def virtual_stages(self) -> int:
        return len(self.stages[0].blocks_per_chunk)

    @property
    def max_blocks_per_chunk(self) -> int:
        return max(max(stage.blocks_per_chunk) for stage in self.stages)

    @property
    def max_blocks_per_stage(self) -> int:
        return max(stage.blocks for stage in self.stages)

    @property
    def total_blocks(self) -> int:
        return sum(stage.blocks for stage in self.stages)

    def _moe(self) -> BlockCost:
        return self.block if self.moe_block is None else self.moe_block

    def _window(self) -> BlockCost:
        return NO_BLOCK_CHANGE if self.window is None else self.window

    def _moe_window(self) -> BlockCost:
        return NO_BLOCK_CHANGE if self.moe_window is None else self.moe_window

    def layer_times(self) -> LayerTimes:
        """The plan's costed kinds for :func:`layers_forward_s` and its siblings."""
        return LayerTimes(
            block=KindTimes.of(self.block),
            moe=KindTimes.of(self._moe()),
            window=KindTimes.of(self._window()),
            moe_window=KindTimes.of(self._moe_window()),
        )

    def chunk_forward_s(self, stage: StagePlan, chunk: int) -> float:
        """Forward critical path of one virtual chunk's blocks (dense and MoE), P2P excluded."""
        return float(layers_forward_s(stage.chunk_counts(chunk), self.layer_times()))

    def chunk_backward_s(self, stage: StagePlan, chunk: int) -> float:
        """Backward (with recompute) critical path of one virtual chunk, P2P excluded."""
        return float(layers_backward_s(stage.chunk_counts(chunk), self.layer_times()))

    def unpaired_window_change_s(self) -> tuple[float, float]:
        """(forward, backward): what a windowed MoE layer's pass alone adds under combined
        1F1B (``CombinedLayerTiming.unpaired_*``) minus the full layer's (0 without both)."""
        full, windowed = self.ep_overlap, self.moe_window_ep_overlap
        if full is None or windowed is None:
            return 0.0, 0.0
        return (
            windowed.unpaired_forward_s - full.unpaired_forward_s,
            windowed.unpaired_backward_s - full.unpaired_backward_s,
        )

    def stage_block_backward_s(self, stage: StagePlan) -> float:
        """One block's backward critical path on ``stage``: :func:`mean_block_backward_s`."""
        return float(mean_block_backward_s(stage.counts, self.layer_times()))

    def forward_chunk_s(self) -> float:
        """T_forward_chunk: forward critical path of the largest virtual chunk, with its edge
        P2P send."""
        longest = max(
            self.chunk_forward_s(stage, c)
            for stage in self.stages
            for c in range(len(stage.blocks_per_chunk))
        )
        return longest + self._p2p(self.p2p_forward_s)

    def backward_chunk_s(self) -> float:
        """T_backward_chunk: backward (with recompute) of the largest virtual chunk, with its
        edge P2P."""
        longest = max(
            self.chunk_backward_s(stage, c)
            for stage in self.stages
            for c in range(len(stage.blocks_per_chunk))
        )
        return longest + self._p2p(self.p2p_backward_s)

    def stage_microbatch_compute_s(self, stage: StagePlan) -> float:
        """Forward + backward (+ recompute) critical path of one microbatch on ``stage``,
        extras included, P2P excluded."""
        work = sum(
            self.chunk_forward_s(stage, c) + self.chunk_backward_s(stage, c)
            for c in range(len(stage.blocks_per_chunk))
        )
        if stage.has_embedding:
            work += self.embedding.total_s
        if stage.first_layers_chunk is not None:
            work += self.first_layers.total_s
        if stage.has_lm_head:
            work += self.lm_head.total_s + self.mtp.total_s
        if stage.last_layers_chunk is not None:
            work += self.last_layers.total_s
        return work

    def critical_stage(self) -> StagePlan:
        """The stage with the longest per-microbatch critical path (first one on ties)."""
        return max(self.stages, key=self.stage_microbatch_compute_s)

    def _p2p(self, seconds: float) -> float:
        return seconds if self.pipeline_degree > 1 else 0.0
