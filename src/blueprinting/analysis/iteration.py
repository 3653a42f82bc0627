"""Iteration analysis: compose PP and DP from the typed program around PortablePlanIR.

The iteration time of the critical pipeline stage's GPU is a sum of named terms, each counted once
(the decomposition of Calculon's ``total_time``, Isaev et al. SC'23, Section 3; it is verified
there to equal the sum on every record):

    T = forward + backward + recompute + pipeline_bubble
        + tp_comm_exposed + cp_comm_exposed + ep_comm_exposed + host_exposed + offload_exposed
        + pp_comm_exposed + dp_comm_exposed + optimizer

with, for m microbatches, v virtual chunks and the critical stage's B blocks:

- forward / backward / recompute: m x (B x block compute + the stage's embedding / LM-head extras);
- tp_comm_exposed: m x B x exposed TP collective time of a block (forward, backward, recompute);
- cp_comm_exposed: m x B x the exposed context-parallel K/V exchange of a block (a p2p ring
  overlapped step by step with the attention it feeds; all-gather and all-to-all exposed);
- ep_comm_exposed: m x the MoE blocks x a MoE layer's exposed token dispatch and combine
  (all exposed, unless ``--overlap-moe-expert-parallel-comm`` hides them under another
  micro-batch's compute);
- host_exposed: m x the blocks x the host (CPU) issue time a layer pass exposes: after the
  dropless MoE layer's host sync, and wherever the host issues slower than the GPU runs
  (``synthesizer/stages/portable_plan/host_dispatch.py``; CUDA graphs remove a scope's ops);
- offload_exposed: m x what the compute waits for layer-wise CPU offloading's copies, beyond the
  layers' passes they hide under (:mod:`.offload`; offloading needs p = 1, so no stage waits
  for another);
- pp_comm_exposed: blocking P2P (Megatron's default): m x v x (send forward + send backward);
  interleaved with ``overlap_p2p_comm``: 2 (p v - 1) transfers, the warm-up and cool-down ones
  (``../shared/reference/schedules.md`` §4);
- pipeline_bubble: the seed's analytic contract (:mod:`.pipeline_contract`) or the concrete
  scheduler's measured bubble, whichever the caller selects. The simulated bubble is the busiest
  rank's idle time with P2P free; the simulated delay real P2P adds to the pipeline flush then
  replaces the analytic pp_comm_exposed, so the pipeline part of the total (work + bubble + P2P)
  is exactly the simulated flush;
- dp_comm_exposed: :mod:`.data_parallel`; optimizer: :mod:`.optimizer_step`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import assert_never, final

import numpy as np
import numpy.typing as npt

from blueprinting.analysis.pipeline_contract import (
    BubbleContract,
    analytic_bubble,
    combined_warmup,
    imbalance_correction,
)
from blueprinting.hardware.polymorphic import Real
from blueprinting.mapping.transformer import (
    CombinedOneForwardOneBackward,
    DualPipe,
    DualPipeV,
    ForwardOnly,
    InterleavedOneForwardOneBackward,
    OneForwardOneBackward,
    PipelineSchedule,
    SingleStage,
    TransformerTrainingMappingSpec,
    ZeroBubbleH1,
)
from blueprinting.synthesizer.stages.portable_plan.ir import (
    ZERO_PHASE,
    BlockCost,
    Count,
    LayerCounts,
    PhaseCost,
    PortablePlanIR,
    StagePlan,
)


class BubbleSource(StrEnum):
    """Which bubble figure the iteration total uses."""

    CONTRACT = "contract"
    SIMULATED = "simulated"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TimeBreakdown:
    """Seconds per iteration, each term once; ``total_s`` is their sum by definition."""

    forward: float
    backward: float
    recompute: float
    pipeline_bubble: float
    tp_comm_exposed: float
    pp_comm_exposed: float
    dp_comm_exposed: float
    optimizer: float
    cp_comm_exposed: float = 0.0
    ep_comm_exposed: float = 0.0
    host_exposed: float = 0.0
    offload_exposed: float = 0.0

    @property
    def total_s(self) -> float:
        return (
            self.forward
            + self.backward
            + self.recompute
            + self.pipeline_bubble
            + self.tp_comm_exposed
            + self.cp_comm_exposed
            + self.ep_comm_exposed
            + self.host_exposed
            + self.offload_exposed
            + self.pp_comm_exposed
            + self.dp_comm_exposed
            + self.optimizer
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "forward": self.forward,
            "backward": self.backward,
            "recompute": self.recompute,
            "pipeline_bubble": self.pipeline_bubble,
            "tp_comm_exposed": self.tp_comm_exposed,
            "cp_comm_exposed": self.cp_comm_exposed,
            "ep_comm_exposed": self.ep_comm_exposed,
            "host_exposed": self.host_exposed,
            "offload_exposed": self.offload_exposed,
            "pp_comm_exposed": self.pp_comm_exposed,
            "dp_comm_exposed": self.dp_comm_exposed,
            "optimizer": self.optimizer,
        }


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StageWork:
    """Per-iteration work terms of one stage (everything but bubble, DP and optimizer)."""

    forward: float
    backward: float
    recompute: float
    tp_comm_exposed: float
    cp_comm_exposed: float = 0.0
    ep_comm_exposed: float = 0.0
    host_exposed: float = 0.0

    @property
    def total_s(self) -> float:
        return (
            self.forward
            + self.backward
            + self.recompute
            + self.tp_comm_exposed
            + self.cp_comm_exposed
            + self.ep_comm_exposed
            + self.host_exposed
        )


class WorkCount(StrEnum):
    """How many times per microbatch a stage runs a costed part."""

    BLOCKS = "blocks"  # the dense layers (every layer of a dense model)
    RECOMPUTED_BLOCKS = "recomputed_blocks"
    MOE_BLOCKS = "moe_blocks"
    MOE_RECOMPUTED_BLOCKS = "moe_recomputed_blocks"
    HAS_EMBEDDING = "has_embedding"  # 1 or 0
    HAS_LM_HEAD = "has_lm_head"  # 1 or 0
    HAS_FIRST_LAYERS = "has_first_layers"  # 1 or 0: the recipe's first base-precision layers
    HAS_LAST_LAYERS = "has_last_layers"  # 1 or 0: its last ones
    #: the sliding-window dense layers, which add ``PortablePlanIR.window`` to their block, and
    #: MoE layers, which add ``moe_window``
    WINDOWED_BLOCKS = "windowed_blocks"
    WINDOWED_RECOMPUTED_BLOCKS = "windowed_recomputed_blocks"
    MOE_WINDOWED_BLOCKS = "moe_windowed_blocks"
    MOE_WINDOWED_RECOMPUTED_BLOCKS = "moe_windowed_recomputed_blocks"


class CostedPart(StrEnum):
    """A phase of the costed block or of a stage extra (``PortablePlanIR``)."""

    BLOCK_FORWARD = "block.forward"
    BLOCK_BACKWARD_ACTIVATION = "block.backward_activation"
    BLOCK_BACKWARD_WEIGHT = "block.backward_weight"
    BLOCK_RECOMPUTE = "block.recompute"
    MOE_BLOCK_FORWARD = "moe_block.forward"
    MOE_BLOCK_BACKWARD_ACTIVATION = "moe_block.backward_activation"
    MOE_BLOCK_BACKWARD_WEIGHT = "moe_block.backward_weight"
    MOE_BLOCK_RECOMPUTE = "moe_block.recompute"
    EMBEDDING_FORWARD = "embedding.forward"
    EMBEDDING_BACKWARD = "embedding.backward"
    LM_HEAD_FORWARD = "lm_head.forward"
    LM_HEAD_BACKWARD = "lm_head.backward"
    FIRST_LAYERS_FORWARD = "first_layers.forward"
    FIRST_LAYERS_BACKWARD = "first_layers.backward"
    LAST_LAYERS_FORWARD = "last_layers.forward"
    LAST_LAYERS_BACKWARD = "last_layers.backward"
    MTP_FORWARD = "mtp.forward"
    MTP_BACKWARD = "mtp.backward"
    WINDOW_FORWARD = "window.forward"
    WINDOW_BACKWARD_ACTIVATION = "window.backward_activation"
    WINDOW_BACKWARD_WEIGHT = "window.backward_weight"
    WINDOW_RECOMPUTE = "window.recompute"
    MOE_WINDOW_FORWARD = "moe_window.forward"
    MOE_WINDOW_BACKWARD_ACTIVATION = "moe_window.backward_activation"
    MOE_WINDOW_BACKWARD_WEIGHT = "moe_window.backward_weight"
    MOE_WINDOW_RECOMPUTE = "moe_window.recompute"


class PhaseField(StrEnum):
    """A time of a :class:`~blueprinting.synthesizer.stages.portable_plan.ir.PhaseCost`."""

    COMPUTE = "compute_s"
    TP_EXPOSED = "comm_exposed_s"
    CP_EXPOSED = "cp_comm_exposed_s"
    EP_EXPOSED = "ep_comm_exposed_s"
    HOST_EXPOSED = "host_exposed_s"


_RUNS = (
    (WorkCount.BLOCKS, CostedPart.BLOCK_FORWARD),
    (WorkCount.BLOCKS, CostedPart.BLOCK_BACKWARD_ACTIVATION),
    (WorkCount.BLOCKS, CostedPart.BLOCK_BACKWARD_WEIGHT),
    (WorkCount.RECOMPUTED_BLOCKS, CostedPart.BLOCK_RECOMPUTE),
    (WorkCount.MOE_BLOCKS, CostedPart.MOE_BLOCK_FORWARD),
    (WorkCount.MOE_BLOCKS, CostedPart.MOE_BLOCK_BACKWARD_ACTIVATION),
    (WorkCount.MOE_BLOCKS, CostedPart.MOE_BLOCK_BACKWARD_WEIGHT),
    (WorkCount.MOE_RECOMPUTED_BLOCKS, CostedPart.MOE_BLOCK_RECOMPUTE),
    (WorkCount.HAS_EMBEDDING, CostedPart.EMBEDDING_FORWARD),
    (WorkCount.HAS_EMBEDDING, CostedPart.EMBEDDING_BACKWARD),
    (WorkCount.HAS_LM_HEAD, CostedPart.LM_HEAD_FORWARD),
    (WorkCount.HAS_LM_HEAD, CostedPart.LM_HEAD_BACKWARD),
    (WorkCount.HAS_FIRST_LAYERS, CostedPart.FIRST_LAYERS_FORWARD),
    (WorkCount.HAS_FIRST_LAYERS, CostedPart.FIRST_LAYERS_BACKWARD),
    (WorkCount.HAS_LAST_LAYERS, CostedPart.LAST_LAYERS_FORWARD),
    (WorkCount.HAS_LAST_LAYERS, CostedPart.LAST_LAYERS_BACKWARD),
    (WorkCount.HAS_LM_HEAD, CostedPart.MTP_FORWARD),
    (WorkCount.HAS_LM_HEAD, CostedPart.MTP_BACKWARD),
    (WorkCount.WINDOWED_BLOCKS, CostedPart.WINDOW_FORWARD),
    (WorkCount.WINDOWED_BLOCKS, CostedPart.WINDOW_BACKWARD_ACTIVATION),
    (WorkCount.WINDOWED_BLOCKS, CostedPart.WINDOW_BACKWARD_WEIGHT),
    (WorkCount.WINDOWED_RECOMPUTED_BLOCKS, CostedPart.WINDOW_RECOMPUTE),
    (WorkCount.MOE_WINDOWED_BLOCKS, CostedPart.MOE_WINDOW_FORWARD),
    (WorkCount.MOE_WINDOWED_BLOCKS, CostedPart.MOE_WINDOW_BACKWARD_ACTIVATION),
    (WorkCount.MOE_WINDOWED_BLOCKS, CostedPart.MOE_WINDOW_BACKWARD_WEIGHT),
    (WorkCount.MOE_WINDOWED_RECOMPUTED_BLOCKS, CostedPart.MOE_WINDOW_RECOMPUTE),
)
_FORWARD_PARTS = frozenset(
    {
        CostedPart.BLOCK_FORWARD,
        CostedPart.MOE_BLOCK_FORWARD,
        CostedPart.EMBEDDING_FORWARD,
        CostedPart.LM_HEAD_FORWARD,
        CostedPart.FIRST_LAYERS_FORWARD,
        CostedPart.LAST_LAYERS_FORWARD,
        CostedPart.MTP_FORWARD,
        CostedPart.WINDOW_FORWARD,
        CostedPart.MOE_WINDOW_FORWARD,
    }
)

_RECOMPUTE_PARTS = frozenset(
    {
        CostedPart.BLOCK_RECOMPUTE,
        CostedPart.MOE_BLOCK_RECOMPUTE,
        CostedPart.WINDOW_RECOMPUTE,
        CostedPart.MOE_WINDOW_RECOMPUTE,
    }
)

#: The stage-work formula, written once: each breakdown term is m x the sum of count x time
#: over its (count, part, time) entries. :func:`stage_work` evaluates it on one plan, the
#: vectorized search (``search/evaluate_vectorized.py``) on arrays of candidates.
STAGE_WORK_TERMS: dict[str, tuple[tuple[WorkCount, CostedPart, PhaseField], ...]] = {
    "forward": tuple(
        (count, part, PhaseField.COMPUTE) for count, part in _RUNS if part in _FORWARD_PARTS
    ),
    "backward": tuple(
        (count, part, PhaseField.COMPUTE)
        for count, part in _RUNS
        if part not in _FORWARD_PARTS and part not in _RECOMPUTE_PARTS
    ),
    "recompute": (
        (WorkCount.RECOMPUTED_BLOCKS, CostedPart.BLOCK_RECOMPUTE, PhaseField.COMPUTE),
        (WorkCount.MOE_RECOMPUTED_BLOCKS, CostedPart.MOE_BLOCK_RECOMPUTE, PhaseField.COMPUTE),
        (WorkCount.WINDOWED_RECOMPUTED_BLOCKS, CostedPart.WINDOW_RECOMPUTE, PhaseField.COMPUTE),
        (
            WorkCount.MOE_WINDOWED_RECOMPUTED_BLOCKS,
            CostedPart.MOE_WINDOW_RECOMPUTE,
            PhaseField.COMPUTE,
        ),
    ),
    "tp_comm_exposed": tuple((count, part, PhaseField.TP_EXPOSED) for count, part in _RUNS),
    "cp_comm_exposed": tuple((count, part, PhaseField.CP_EXPOSED) for count, part in _RUNS),
    "ep_comm_exposed": tuple((count, part, PhaseField.EP_EXPOSED) for count, part in _RUNS),
    "host_exposed": tuple((count, part, PhaseField.HOST_EXPOSED) for count, part in _RUNS),
}


class BlockPhase(StrEnum):
    """A phase of a :class:`~blueprinting.synthesizer.stages.portable_plan.ir.BlockCost`."""

    FORWARD = "forward"
    BACKWARD_ACTIVATION = "backward_activation"
    BACKWARD_WEIGHT = "backward_weight"
    RECOMPUTE = "recompute"


def _phase_of(block: BlockCost | None, phase: BlockPhase) -> PhaseCost:
    """One phase of an optional costed block (zero where the plan has no such block)."""
    if block is None:
        return ZERO_PHASE
    match phase:
        case BlockPhase.FORWARD:
            return block.forward
        case BlockPhase.BACKWARD_ACTIVATION:
            return block.backward_activation
        case BlockPhase.BACKWARD_WEIGHT:
            return block.backward_weight
        case BlockPhase.RECOMPUTE:
            return block.recompute
        case _ as unreachable:
            assert_never(unreachable)


def costed_part(plan: PortablePlanIR, part: CostedPart) -> PhaseCost:
    match part:
        case CostedPart.BLOCK_FORWARD:
            return plan.block.forward
        case CostedPart.BLOCK_BACKWARD_ACTIVATION:
            return plan.block.backward_activation
        case CostedPart.BLOCK_BACKWARD_WEIGHT:
            return plan.block.backward_weight
        case CostedPart.BLOCK_RECOMPUTE:
            return plan.block.recompute
        case CostedPart.MOE_BLOCK_FORWARD:
            return _phase_of(plan.moe_block, BlockPhase.FORWARD)
        case CostedPart.MOE_BLOCK_BACKWARD_ACTIVATION:
            return _phase_of(plan.moe_block, BlockPhase.BACKWARD_ACTIVATION)
        case CostedPart.MOE_BLOCK_BACKWARD_WEIGHT:
            return _phase_of(plan.moe_block, BlockPhase.BACKWARD_WEIGHT)
        case CostedPart.MOE_BLOCK_RECOMPUTE:
            return _phase_of(plan.moe_block, BlockPhase.RECOMPUTE)
        case CostedPart.EMBEDDING_FORWARD:
            return plan.embedding.forward
        case CostedPart.EMBEDDING_BACKWARD:
            return plan.embedding.backward
        case CostedPart.LM_HEAD_FORWARD:
            return plan.lm_head.forward
        case CostedPart.LM_HEAD_BACKWARD:
            return plan.lm_head.backward
        case CostedPart.FIRST_LAYERS_FORWARD:
            return plan.first_layers.forward
        case CostedPart.FIRST_LAYERS_BACKWARD:
            return plan.first_layers.backward
        case CostedPart.LAST_LAYERS_FORWARD:
            return plan.last_layers.forward
        case CostedPart.LAST_LAYERS_BACKWARD:
            return plan.last_layers.backward
        case CostedPart.MTP_FORWARD:
            return plan.mtp.forward
        case CostedPart.MTP_BACKWARD:
            return plan.mtp.backward
        case CostedPart.WINDOW_FORWARD:
            return _phase_of(plan.window, BlockPhase.FORWARD)
        case CostedPart.WINDOW_BACKWARD_ACTIVATION:
            return _phase_of(plan.window, BlockPhase.BACKWARD_ACTIVATION)
        case CostedPart.WINDOW_BACKWARD_WEIGHT:
            return _phase_of(plan.window, BlockPhase.BACKWARD_WEIGHT)
        case CostedPart.WINDOW_RECOMPUTE:
            return _phase_of(plan.window, BlockPhase.RECOMPUTE)
        case CostedPart.MOE_WINDOW_FORWARD:
            return _phase_of(plan.moe_window, BlockPhase.FORWARD)
        case CostedPart.MOE_WINDOW_BACKWARD_ACTIVATION:
            return _phase_of(plan.moe_window, BlockPhase.BACKWARD_ACTIVATION)
        case CostedPart.MOE_WINDOW_BACKWARD_WEIGHT:
            return _phase_of(plan.moe_window, BlockPhase.BACKWARD_WEIGHT)
        case CostedPart.MOE_WINDOW_RECOMPUTE:
            return _phase_of(plan.moe_window, BlockPhase.RECOMPUTE)
        case _ as unreachable:
            assert_never(unreachable)


def block_work_count(n: LayerCounts, count: WorkCount) -> Count | None:
    """How many of ``n``'s blocks a block count names (None for a stage extra's 1 or 0): the
    one mapping the plan (:func:`work_count`) and the vectorized search read."""
    match count:
        case WorkCount.BLOCKS:
            return n.dense
        case WorkCount.RECOMPUTED_BLOCKS:
            return n.dense_recomputed
        case WorkCount.MOE_BLOCKS:
            return n.moe
        case WorkCount.MOE_RECOMPUTED_BLOCKS:
            return n.moe_recomputed
        case WorkCount.WINDOWED_BLOCKS:
            return n.windowed
        case WorkCount.WINDOWED_RECOMPUTED_BLOCKS:
            return n.windowed_recomputed
        case WorkCount.MOE_WINDOWED_BLOCKS:
            return n.moe_windowed
        case WorkCount.MOE_WINDOWED_RECOMPUTED_BLOCKS:
            return n.moe_windowed_recomputed
        case (
            WorkCount.HAS_EMBEDDING
            | WorkCount.HAS_LM_HEAD
            | WorkCount.HAS_FIRST_LAYERS
            | WorkCount.HAS_LAST_LAYERS
        ):
            return None
        case _ as unreachable:
            assert_never(unreachable)


def work_count(stage: StagePlan, count: WorkCount) -> int:
    match count:
        case WorkCount.HAS_EMBEDDING:
            return int(stage.has_embedding)
        case WorkCount.HAS_LM_HEAD:
            return int(stage.has_lm_head)
        case WorkCount.HAS_FIRST_LAYERS:
            return int(stage.first_layers_chunk is not None)
        case WorkCount.HAS_LAST_LAYERS:
            return int(stage.last_layers_chunk is not None)
        case (
            WorkCount.BLOCKS
            | WorkCount.RECOMPUTED_BLOCKS
            | WorkCount.MOE_BLOCKS
            | WorkCount.MOE_RECOMPUTED_BLOCKS
            | WorkCount.WINDOWED_BLOCKS
            | WorkCount.WINDOWED_RECOMPUTED_BLOCKS
            | WorkCount.MOE_WINDOWED_BLOCKS
            | WorkCount.MOE_WINDOWED_RECOMPUTED_BLOCKS
        ):
            blocks = block_work_count(stage.counts, count)
            assert isinstance(blocks, int)
            return blocks
        case _ as unreachable:
            assert_never(unreachable)


def phase_field(phase: PhaseCost, time: PhaseField) -> float:
    match time:
        case PhaseField.COMPUTE:
            return phase.compute_s
        case PhaseField.TP_EXPOSED:
            return phase.comm_exposed_s
        case PhaseField.CP_EXPOSED:
            return phase.cp_comm_exposed_s
        case PhaseField.EP_EXPOSED:
            return phase.ep_comm_exposed_s
        case PhaseField.HOST_EXPOSED:
            return phase.host_exposed_s
        case _ as unreachable:
            assert_never(unreachable)


def stage_work(plan: PortablePlanIR, stage: StagePlan, microbatches: int) -> StageWork:
    """m x (the stage's blocks + its extras), split into the breakdown's terms
    (:data:`STAGE_WORK_TERMS`)."""
    terms = {
        name: microbatches
        * sum(
            work_count(stage, count) * phase_field(costed_part(plan, part), time)
            for count, part, time in entries
        )
        for name, entries in STAGE_WORK_TERMS.items()
    }
    return StageWork(**terms)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StageTpComm:
    """A stage's TP communication over one iteration: link time, the part on the critical path
    (``exposed_s`` is the breakdown's ``tp_comm_exposed``), and what overlapping it cost the
    GEMMs (``overlap_compute_s``, inside forward / backward / recompute)."""

    link_s: float
    exposed_s: float
    overlap_compute_s: float

    @property
    def hidden_s(self) -> float:
        return self.link_s - self.exposed_s


def stage_tp_comm(plan: PortablePlanIR, stage: StagePlan, microbatches: int) -> StageTpComm:
    """m x the TP communication of the stage's blocks and extras (the same terms as
    :func:`stage_work`'s ``tp_comm_exposed``)."""
    phases = _stage_phases(plan, stage)
    return StageTpComm(
        link_s=microbatches * sum(n * ph.comm_s for n, ph in phases),
        exposed_s=microbatches * sum(n * ph.comm_exposed_s for n, ph in phases),
        overlap_compute_s=microbatches * sum(n * ph.overlap_compute_s for n, ph in phases),
    )


def stage_quantize_s(plan: PortablePlanIR, stage: StagePlan, microbatches: int) -> float:
    """m x the low-precision recipe's quantization kernels in the stage's blocks and extras
    (``PhaseCost.quantize_s``: already inside forward / backward / recompute; the
    base-precision layers' extras take theirs off)."""
    return microbatches * sum(n * ph.quantize_s for n, ph in _stage_phases(plan, stage))


def _stage_phases(plan: PortablePlanIR, stage: StagePlan) -> list[tuple[int, PhaseCost]]:
    """(times per microbatch, phase) of everything a stage runs: the rows of ``_RUNS``."""
    return [(work_count(stage, count), costed_part(plan, part)) for count, part in _RUNS]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StageLinkTime:
    """A stage's communication of one kind over one iteration: link time and the part on the
    critical path (the breakdown's ``cp_comm_exposed`` / ``ep_comm_exposed``)."""

    link_s: float
    exposed_s: float

    @property
    def hidden_s(self) -> float:
        return self.link_s - self.exposed_s


def _stage_link_time(
    plan: PortablePlanIR,
    stage: StagePlan,
    microbatches: int,
    link: Callable[[PhaseCost], float],
    exposed: Callable[[PhaseCost], float],
) -> StageLinkTime:
    phases = _stage_phases(plan, stage)
    return StageLinkTime(
        link_s=microbatches * sum(n * link(ph) for n, ph in phases),
        exposed_s=microbatches * sum(n * exposed(ph) for n, ph in phases),
    )


def stage_cp_comm(plan: PortablePlanIR, stage: StagePlan, microbatches: int) -> StageLinkTime:
    """m x the cp exchanges of the stage's blocks and extras."""
    return _stage_link_time(
        plan, stage, microbatches, lambda ph: ph.cp_comm_s, lambda ph: ph.cp_comm_exposed_s
    )


def stage_ep_comm(plan: PortablePlanIR, stage: StagePlan, microbatches: int) -> StageLinkTime:
    """m x the MoE layers' token dispatch and combine of the stage."""
    return _stage_link_time(
        plan, stage, microbatches, lambda ph: ph.ep_comm_s, lambda ph: ph.ep_comm_exposed_s
    )


def bubble_contract(plan: PortablePlanIR, microbatches: int) -> BubbleContract:
    """The seed's contract fed with this plan's chunk critical paths."""
    p = plan.pipeline_degree
    if p == 1:
        return analytic_bubble(p=1, v=1, m=microbatches, forward_chunk_s=0.0, backward_chunk_s=0.0)
    block = plan.block if plan.moe_block is None else plan.moe_block
    correction = imbalance_correction(
        p=float(p),
        max_blocks_per_stage=float(plan.max_blocks_per_stage),
        total_blocks=float(plan.total_blocks),
        block_fw_bw_s=block.forward_s + block.backward_with_recompute_s,
    )
    return analytic_bubble(
        p=p,
        v=plan.virtual_stages,
        m=microbatches,
        forward_chunk_s=plan.forward_chunk_s(),
        backward_chunk_s=plan.backward_chunk_s(),
        imbalance_correction_s=correction,
    )


def overlapped_p2p_exposed(pipeline: Real, virtual: Real, per_chunk_s: Real) -> Real:
    """Interleaved 1F1B with ``overlap_p2p_comm``: only the warm-up's chain of ``p v - 1``
    chunk sends waits on the link (module docstring); on numbers or columns (the counts as
    floats, exact below 2**53)."""
    return (pipeline * virtual - 1) * per_chunk_s


def blocking_p2p_exposed(microbatches: Real, virtual: Real, per_chunk_s: Real) -> Real:
    """Blocking sends: every microbatch's forward and backward through every chunk waits for
    its P2P (module docstring); on numbers or columns."""
    return microbatches * virtual * per_chunk_s


def pipeline_p2p_exposed(
    schedule: PipelineSchedule, plan: PortablePlanIR, microbatches: int
) -> float:
    """Exposed P2P time per iteration (module docstring)."""
    p, v = plan.pipeline_degree, plan.virtual_stages
    if p == 1:
        return 0.0
    per_microbatch_chunk = plan.p2p_forward_s + plan.p2p_backward_s
    match schedule:
        case (
            InterleavedOneForwardOneBackward(overlap_p2p_comm=True)
            | CombinedOneForwardOneBackward(overlap_p2p_comm=True)
        ):
            return overlapped_p2p_exposed(float(p), float(v), per_microbatch_chunk)
        case (
            InterleavedOneForwardOneBackward()
            | CombinedOneForwardOneBackward()
            | OneForwardOneBackward()
            | ZeroBubbleH1()
            | DualPipe()
            | DualPipeV()
        ):
            # DualPipe / DualPipeV: the blocking estimate of 1F1B per chunk (v = 1 / 2); the
            # simulation times their real overlap.
            return blocking_p2p_exposed(float(microbatches), float(v), per_microbatch_chunk)
        case ForwardOnly():
            return microbatches * v * plan.p2p_forward_s
        case SingleStage():
            return 0.0
        case _ as unreachable:
            assert_never(unreachable)


def unpaired_ep_exposed_s(
    *,
    p: npt.ArrayLike,
    v: npt.ArrayLike,
    group: npt.ArrayLike,
    m: npt.ArrayLike,
    stage: npt.ArrayLike,
    moe_blocks: npt.ArrayLike,
    unpaired_s: npt.ArrayLike,
) -> npt.NDArray[np.float64]:
    """Combined 1F1B's passes without a partner on stage ``stage``: its
    :func:`~.pipeline_contract.combined_warmup` warm-up forwards and as many cool-down
    backwards run alone, each MoE layer of them exposing ``unpaired_s`` (a forward's and a
    backward's extra over their share of a co-scheduled pair,
    ``CombinedLayerTiming.unpaired_forward_s + unpaired_backward_s``) on top of the steady
    state the block costs hold; the stage's MoE layers taken evenly over its v chunks. On
    arrays too (the vectorized search's ``ep_comm_exposed``)."""
    warm = combined_warmup(p, v, m, group, stage)
    return np.asarray(
        warm * np.asarray(moe_blocks, dtype=np.float64) / np.asarray(v) * np.asarray(unpaired_s),
        dtype=np.float64,
    )


def plan_unpaired_ep_exposed_s(
    schedule: PipelineSchedule, plan: PortablePlanIR, stage: StagePlan, microbatches: int
) -> float:
    """:func:`unpaired_ep_exposed_s` of one plan (0 unless combined 1F1B with MoE layers)."""
    timing = plan.ep_overlap
    match schedule:
        case CombinedOneForwardOneBackward(virtual_stages=v, microbatch_group_size=group):
            if timing is None:
                return 0.0
            p = plan.pipeline_degree
            window_forward, window_backward = plan.unpaired_window_change_s()
            # the stage's MoE layers at the full layer's extra, its windowed ones changed by
            # theirs (the formula is linear in layers x extra)
            return sum(
                float(
                    unpaired_ep_exposed_s(
                        p=p,
                        v=v,
                        group=p if group is None else group,
                        m=microbatches,
                        stage=stage.index,
                        moe_blocks=layers,
                        unpaired_s=extra,
                    )
                )
                for layers, extra in (
                    (stage.moe_blocks, timing.unpaired_forward_s + timing.unpaired_backward_s),
                    (stage.moe_windowed_blocks, window_forward + window_backward),
                )
            )
        case (
            SingleStage()
            | OneForwardOneBackward()
            | InterleavedOneForwardOneBackward()
            | ForwardOnly()
            | ZeroBubbleH1()
            | DualPipe()
            | DualPipeV()
        ):
            return 0.0
        case _ as unreachable:
            assert_never(unreachable)


def compose_breakdown(
    *,
    mapping: TransformerTrainingMappingSpec,
    plan: PortablePlanIR,
    bubble_s: float,
    dp_exposed_s: float,
    optimizer_s: float,
    pp_comm_exposed_s: float | None = None,
    critical: StagePlan | None = None,
    offload_exposed_s: float = 0.0,
) -> TimeBreakdown:
    """The critical stage's iteration breakdown; ``pp_comm_exposed_s`` None means the analytic
    P2P term (:func:`pipeline_p2p_exposed`); ``critical`` is ``plan.critical_stage()``, passed
    by a caller that has it already; ``offload_exposed_s``: m x what the stage's compute waits
    for activation offloading copies (:mod:`.offload`)."""
    m = mapping.microbatch_count
    stage = plan.critical_stage() if critical is None else critical
    work = stage_work(plan, stage, m)
    schedule = mapping.parallelism.pipeline.schedule
    return TimeBreakdown(
        forward=work.forward,
        backward=work.backward,
        recompute=work.recompute,
        pipeline_bubble=bubble_s,
        tp_comm_exposed=work.tp_comm_exposed,
        cp_comm_exposed=work.cp_comm_exposed,
        ep_comm_exposed=work.ep_comm_exposed + plan_unpaired_ep_exposed_s(schedule, plan, stage, m),
        host_exposed=work.host_exposed,
        offload_exposed=offload_exposed_s,
        pp_comm_exposed=(
            pipeline_p2p_exposed(mapping.parallelism.pipeline.schedule, plan, m)
            if pp_comm_exposed_s is None
            else pp_comm_exposed_s
        ),
        dp_comm_exposed=dp_exposed_s,
        optimizer=optimizer_s,
    )
