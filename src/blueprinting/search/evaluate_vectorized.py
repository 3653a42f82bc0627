"""Vectorized evaluation of a candidate table: the scalar plan's figures, for every row at once.

Every figure here is the one ``blueprinting.api.plan_spec(spec, system,
PlanOptions(bubble_source=BubbleSource.CONTRACT))`` reports for the same row
(``tests/search/test_evaluate_vectorized.py`` compares every candidate of a small space field by
field, relative error <= 1e-9). The search ranks on the seed's *contract* bubble
(:mod:`blueprinting.analysis.pipeline_contract`), never on the simulated one.

How it stays exact and cheap
----------------------------
Each formula exists once (the project's rule). A figure is either computed by the scalar code
itself once per distinct value of the knobs it reads (a *key*), or by the scalar module's own
function applied to numpy columns: the formulas the plan evaluates on Python numbers are written
on numbers *or* columns (:mod:`blueprinting.hardware.polymorphic`: ``where``, ``minimum``,
``maximum``), and this module only selects a row's variant with ``numpy.select`` where the plan
``match``-es the spec's sum type:

================================ ================================= ===============================
scalar code                      reads                             here
================================ ================================= ===============================
``portable_plan`` block/extras   t, sp, TP overlap, recompute      scalar, per key
                                 scope, b, TP group, cp, recipe    (``_block_costs``)
``passes.p2p_message``           t, p, d, b, sp                    scalar, per key
``stage_parameters``             t, p, stage                       scalar, per key
``system.collective_time`` (DP)  t, p, d, stage                    scalar, per key
``adam_step_cost``               owned parameters                  scalar, per key
``layer_activation_bytes`` /     t, b, sp                          scalar, per key
``checkpoint_bytes``
``hardware_flops_per_iteration`` recompute, p, v                   scalar, per key
``STAGE_WORK_TERMS``             the stage's counts                the same terms, on columns
``pipeline_contract`` terms      p, v, m, chunk times              the same functions, on columns
(``extra_interleaving_bubbles``,
``bubble_seconds``, ...)
``overlapped_p2p_exposed`` /     p, v, m, P2P time                 the same functions, on columns
``blocking_p2p_exposed``
``data_parallel`` exposures      collective times, windows         the same functions, on columns
(``grad_sync_exposed``, one
per sharding variant)
``memory`` compositions          everything                        the same functions, on columns
(``state_bytes``,
``gathered_whole``, the stored /
working bytes per recompute
variant, ``interleaved_slot``,
the embedding and logits
buffers, ``overhead_parts``,
``peak_bytes``)
critical / most-loaded stage     everything                        numpy selection (``_critical_
                                                                   choice``, below)
================================ ================================= ===============================

The columns rely on what the enumeration guarantees (``search/space.py``): an even stage
layout (``L mod (p*v) == 0``: every stage and every chunk holds the same number of blocks) and a
schedule in {SingleStage, 1F1B, interleaved 1F1B}. Under an even layout a dense model's critical
and most loaded stage is the first or the last one (the middle stages carry neither extra, and
in-flight microbatches do not grow with the stage index). A MoE model's stages also differ by
their dense layers (DeepSeek's first_k_dense_replace): ``passes.stage_plans`` is called once per
(p, v, recompute) key and the first stage of each distinct (MoE layers per chunk, extras)
signature stands for its class (``_layout``); its largest chunk is taken over every distinct
chunk composition. The MoE block (``PortablePlanIR.moe_block``) is costed by the scalar code per
(t, sp, recompute scope, b, cp, recipe, ep, etp, dispatcher, N) key beside the dense block; the
stage parameters' dense and routed-expert parts and a MoE layer's stored bytes per key; the DP
exposures run once for the dense buckets (d x cp) and once for the experts'
(expert-dp), as ``data_parallel.stage_data_parallel_cost`` composes them.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import final

import numpy as np
import numpy.typing as npt

from blueprinting.analysis.data_parallel import (
    collective_sm_overhead,
    grad_sync_exposed,
    optimizer_sharded_exposure,
    parameter_sharded_exposure,
    sm_contention_s,
    unsharded_exposure,
)
from blueprinting.analysis.evaluate import portable_plan
from blueprinting.analysis.flops import (
    FlopsConvention,
    hardware_flops_per_iteration,
    model_flops_per_iteration,
)
from blueprinting.analysis.iteration import (
    STAGE_WORK_TERMS,
    CostedPart,
    PhaseField,
    WorkCount,
    block_work_count,
    blocking_p2p_exposed,
    costed_part,
    overlapped_p2p_exposed,
    phase_field,
    unpaired_ep_exposed_s,
)
from blueprinting.analysis.memory import (
    PEAK_PHASES,
    backward_working_bytes,
    block_stored_bytes,
    block_working_bytes,
    ceil_div,
    checkpoint_bytes,
    context_transient_bytes,
    embedding_buffer_bytes,
    expert_grid,
    gathered_whole,
    gathers_ahead,
    interleaved_group_reached,
    interleaved_peak,
    interleaved_slot,
    layer_activation_bytes,
    local_sequence_model,
    logits_buffer_bytes,
    logits_transient_bytes,
    low_precision_weight_extra,
    moe_layer_bytes,
    mtp_depth_stored_bytes,
    mtp_stored_bytes,
    nccl_buffer_bytes,
    one_f_one_b_in_flight,
    overhead_parts,
    paired_forward_bytes,
    peak_bytes,
    peak_phase_index,
    persistent_recipe,
    plain_stored_bytes,
    precision_recipe,
    selective_working_bytes,
    sequence_rows,
    sharding_level,
    stage_activations,
    stage_param_gather_bytes,
    stage_parameters,
    state_bytes,
    step_copy_bytes,
    step_copy_excess,
    uniform_stored_bytes,
    uniform_working_bytes,
)
from blueprinting.analysis.optimizer_step import adam_step_cost, owned_parameters
from blueprinting.analysis.pipeline_contract import (
    bubble_count,
    bubble_seconds,
    extra_interleaving_bubbles,
    imbalance_correction,
)
from blueprinting.analysis.report import JsonValue
from blueprinting.errors import ConfigError
from blueprinting.hardware.collectives import CollectiveKind
from blueprinting.hardware.system import (
    Engine,
    LinkTier,
    NodeSpec,
    ParallelDim,
    RuntimeMemory,
    SystemSpec,
)
from blueprinting.limits import MAX_INT, int_limit_text
from blueprinting.mapping.model import EmbeddingTying, TransformerModelSpec
from blueprinting.mapping.precision import high_precision_layers
from blueprinting.mapping.transformer import (
    SelectiveRecompute,
    UnfusedAttention,
    dispatcher_overlaps,
)
from blueprinting.search.space import (
    RECOMPUTE_CODES,
    SHARDING_CODES,
    CandidateTable,
    RecomputeVariant,
    ShardingVariant,
    candidate_to_spec,
)
from blueprinting.synthesizer.stages.portable_plan.ir import (
    KindTimes,
    LayerCounts,
    LayerTimes,
    layers_backward_s,
    layers_forward_s,
    mean_block_backward_s,
)
from blueprinting.synthesizer.stages.portable_plan.passes import (
    PlanContext,
    p2p_message,
    stage_plans,
)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

_CODE = {variant: RECOMPUTE_CODES.index(variant) for variant in RecomputeVariant}
_SHARD = {variant: SHARDING_CODES.index(variant) for variant in ShardingVariant}
_TIER = {tier: index for index, tier in enumerate(LinkTier)}


def _keys(*columns: npt.NDArray[np.int64] | npt.NDArray[np.bool_]) -> tuple[IntArray, IntArray]:
    """(one representative row per distinct key, the key index of every row): the keys in
    lexicographic order of the columns, each represented by its first row.

    Each column is replaced by its rank among the column's distinct values and the ranks are
    combined in mixed radix into one int64 code, which orders the keys as the columns do
    lexicographically: the same result as ``np.unique(np.stack(columns, 1), axis=0)``, whose
    row-wise sort is the slow part of a large search."""
    code = np.zeros(len(columns[0]), dtype=np.int64)
    radix = 1
    for column in columns:
        values, rank = np.unique(np.asarray(column, dtype=np.int64), return_inverse=True)
        size = len(values)
        if radix * size > MAX_INT:
            # the codes would overflow: recombine the codes so far into their dense ranks
            _, code = np.unique(code, return_inverse=True)
            radix = int(code.max()) + 1
            # at most rows x rows codes: a table has far fewer than 3e9 rows
            assert radix * size <= MAX_INT
        code = code * size + rank.reshape(-1)
        radix *= size
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return first.astype(np.int64), inverse.reshape(-1).astype(np.int64)


def _per_key(first: IntArray, inverse: IntArray, value: Callable[[int], float]) -> FloatArray:
    """``value(representative row)`` for each key, spread over the rows."""
    return np.array([value(int(i)) for i in first], dtype=np.float64)[inverse]


def _per_key_int(first: IntArray, inverse: IntArray, value: Callable[[int], int]) -> IntArray:
    return np.array([value(int(i)) for i in first], dtype=np.int64)[inverse]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CandidateFigures:
    """The scalar report's figures, one array entry per candidate row (names follow
    ``IterationReport.to_json_dict``; units SI)."""

    # time_breakdown_s
    forward: FloatArray
    backward: FloatArray
    recompute: FloatArray
    pipeline_bubble: FloatArray
    tp_comm_exposed: FloatArray
    pp_comm_exposed: FloatArray
    dp_comm_exposed: FloatArray
    optimizer: FloatArray
    cp_comm_exposed: FloatArray
    ep_comm_exposed: FloatArray
    host_exposed: FloatArray
    # bubble
    bubble_contract_s: FloatArray
    bubble_chunk_time_s: FloatArray
    bubble_n: IntArray
    bubble_extra_interleaving: IntArray
    bubble_imbalance_correction_s: FloatArray
    critical_stage: IntArray
    # memory_bytes (the most loaded stage)
    memory_weights: IntArray
    memory_gradients: IntArray
    memory_optimizer_states: IntArray
    memory_optimizer_step_copy: IntArray
    memory_activations: IntArray
    memory_other: IntArray
    memory_total: IntArray
    memory_transient: IntArray
    memory_workspace: IntArray
    memory_allocator_reserve: IntArray
    memory_cuda_context: IntArray
    memory_nccl_buffers: IntArray
    memory_allocated_peak: IntArray
    memory_allocator_reserved_peak: IntArray
    memory_reserved_peak: IntArray
    memory_peak: IntArray  # index into memory.PEAK_PHASES
    memory_capacity: int
    memory_stage: IntArray
    # dp_comm
    dp_grad_bytes: IntArray
    dp_param_gather_bytes: IntArray
    dp_link_s: FloatArray
    dp_exposed_s: FloatArray
    dp_sm_contention_s: FloatArray
    # optimizer_step
    optimizer_parameters: IntArray
    optimizer_flops: IntArray
    optimizer_bytes_moved: IntArray
    # FLOPs
    flops_convention: FlopsConvention
    model_flops_per_iteration: int
    hardware_flops_key: IntArray
    hardware_flops_values: tuple[int, ...]
    peak_flops_per_gpu: float
    tokens_per_iteration: int
    world_size: IntArray
    microbatch_count: IntArray

    def __len__(self) -> int:
        return int(self.forward.shape[0])

    @property
    def iteration_time_s(self) -> FloatArray:
        """``TimeBreakdown.total_s``, summed in its order."""
        return (
            self.forward
            + self.backward
            + self.recompute
            + self.pipeline_bubble
            + self.tp_comm_exposed
            + self.cp_comm_exposed
            + self.ep_comm_exposed
            + self.host_exposed
            + self.pp_comm_exposed
            + self.dp_comm_exposed
            + self.optimizer
        )

    @property
    def memory_headroom(self) -> IntArray:
        return self.memory_capacity - self.memory_reserved_peak

    @property
    def fits_in_memory(self) -> BoolArray:
        return self.memory_reserved_peak <= self.memory_capacity

    @property
    def hardware_flops_per_iteration(self) -> FloatArray:
        return np.array(self.hardware_flops_values, dtype=np.float64)[self.hardware_flops_key]

    @property
    def tokens_per_second(self) -> FloatArray:
        return self.tokens_per_iteration / self.iteration_time_s

    @property
    def tflops_per_gpu(self) -> FloatArray:
        return self.model_flops_per_iteration / (self.iteration_time_s * self.world_size) / 1e12

    @property
    def mfu(self) -> FloatArray:
        return self.model_flops_per_iteration / (
            self.iteration_time_s * self.world_size * self.peak_flops_per_gpu
        )

    @property
    def hfu(self) -> FloatArray:
        return self.hardware_flops_per_iteration / (
            self.iteration_time_s * self.world_size * self.peak_flops_per_gpu
        )

    def row_json(self, i: int) -> dict[str, JsonValue]:
        """Row ``i`` as the subset of ``IterationReport.to_json_dict()`` this module computes
        (same keys, same nesting)."""
        iteration = float(self.iteration_time_s[i])
        return {
            "world_size": int(self.world_size[i]),
            "microbatch_count": int(self.microbatch_count[i]),
            "iteration_time_s": iteration,
            "time_breakdown_s": {
                "forward": float(self.forward[i]),
                "backward": float(self.backward[i]),
                "recompute": float(self.recompute[i]),
                "pipeline_bubble": float(self.pipeline_bubble[i]),
                "tp_comm_exposed": float(self.tp_comm_exposed[i]),
                "cp_comm_exposed": float(self.cp_comm_exposed[i]),
                "ep_comm_exposed": float(self.ep_comm_exposed[i]),
                "host_exposed": float(self.host_exposed[i]),
                "pp_comm_exposed": float(self.pp_comm_exposed[i]),
                "dp_comm_exposed": float(self.dp_comm_exposed[i]),
                "optimizer": float(self.optimizer[i]),
            },
            "bubble": {
                "contract_s": float(self.bubble_contract_s[i]),
                "chunk_time_s": float(self.bubble_chunk_time_s[i]),
                "n_bubble": int(self.bubble_n[i]),
                "extra_interleaving_bubbles": int(self.bubble_extra_interleaving[i]),
                "imbalance_correction_s": float(self.bubble_imbalance_correction_s[i]),
            },
            "model_flops_per_iteration": self.model_flops_per_iteration,
            "hardware_flops_per_iteration": self.hardware_flops_values[
                int(self.hardware_flops_key[i])
            ],
            "flops_convention": str(self.flops_convention),
            "peak_flops_per_gpu": self.peak_flops_per_gpu,
            "tflops_per_gpu": float(self.tflops_per_gpu[i]),
            "mfu": float(self.mfu[i]),
            "hfu": float(self.hfu[i]),
            "tokens_per_iteration": self.tokens_per_iteration,
            "tokens_per_second": float(self.tokens_per_second[i]),
            "memory_bytes": {
                "weights": int(self.memory_weights[i]),
                "gradients": int(self.memory_gradients[i]),
                "optimizer_states": int(self.memory_optimizer_states[i]),
                "optimizer_step_copy": int(self.memory_optimizer_step_copy[i]),
                "activations": int(self.memory_activations[i]),
                "other": int(self.memory_other[i]),
                "total": int(self.memory_total[i]),
                "transient": int(self.memory_transient[i]),
                "workspace": int(self.memory_workspace[i]),
                "allocated_peak": int(self.memory_allocated_peak[i]),
                "allocator_reserve": int(self.memory_allocator_reserve[i]),
                "allocator_reserved_peak": int(self.memory_allocator_reserved_peak[i]),
                "cuda_context": int(self.memory_cuda_context[i]),
                "nccl_buffers": int(self.memory_nccl_buffers[i]),
                "reserved_peak": int(self.memory_reserved_peak[i]),
                "capacity": self.memory_capacity,
                "headroom": int(self.memory_headroom[i]),
                "stage": int(self.memory_stage[i]),
                "peak_at": PEAK_PHASES[int(self.memory_peak[i])].value,
            },
            "fits_in_memory": bool(self.fits_in_memory[i]),
            "dp_comm": {
                "grad_bytes": int(self.dp_grad_bytes[i]),
                "param_gather_bytes": int(self.dp_param_gather_bytes[i]),
                "link_s": float(self.dp_link_s[i]),
                "exposed_s": float(self.dp_exposed_s[i]),
                "sm_contention_s": float(self.dp_sm_contention_s[i]),
            },
            "optimizer_step": {
                "parameters": int(self.optimizer_parameters[i]),
                "flops": int(self.optimizer_flops[i]),
                "bytes_moved": int(self.optimizer_bytes_moved[i]),
                "time_s": float(self.optimizer[i]),
            },
        }


# --------------------------------------------------------------------------------------------
# PortablePlanIR pieces, per key (synthesizer/stages/portable_plan/passes.py)
# --------------------------------------------------------------------------------------------
#: ``LayerTimes`` / ``KindTimes`` field names: the order :func:`_block_arrays` reads a plan's
#: layer times in and spreads them back over the columns
_KINDS = tuple(f.name for f in fields(LayerTimes))
_KIND_TIMES = tuple(f.name for f in fields(KindTimes))


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _BlockArrays:
    """``PortablePlanIR.block`` / ``embedding`` / ``lm_head`` terms, spread over the rows."""

    forward_compute: FloatArray
    forward_comm: FloatArray
    backward_activation_compute: FloatArray
    backward_activation_comm: FloatArray
    backward_weight_compute: FloatArray
    backward_weight_comm: FloatArray
    recompute_compute: FloatArray
    recompute_comm: FloatArray
    embedding_forward_compute: FloatArray
    embedding_forward_comm: FloatArray
    embedding_backward_compute: FloatArray
    embedding_backward_comm: FloatArray
    embedding_total_s: FloatArray
    lm_head_forward_compute: FloatArray
    lm_head_forward_comm: FloatArray
    lm_head_backward_compute: FloatArray
    lm_head_backward_comm: FloatArray
    lm_head_total_s: FloatArray
    #: combined 1F1B's unpaired extra per MoE layer (forward + backward; 0 without the overlap)
    moe_unpaired_s: FloatArray
    #: ``PortablePlanIR.unpaired_window_change_s`` (forward + backward; 0 without it)
    moe_window_unpaired_s: FloatArray
    #: every (part, time) of ``iteration.STAGE_WORK_TERMS``, per row
    parts: dict[tuple[CostedPart, PhaseField], FloatArray]
    #: ``PortablePlanIR.layer_times`` on columns (the plan's own choice of the MoE block and
    #: the window changes, read as the plan reads them)
    layers: LayerTimes


def _scope(recompute: IntArray) -> IntArray:
    """The derivation's recompute scope: none / attention core / whole block."""
    full = (recompute == _CODE[RecomputeVariant.FULL_UNIFORM]) | (
        recompute == _CODE[RecomputeVariant.FULL_BLOCK]
    )
    return np.where(full, 2, np.where(recompute == _CODE[RecomputeVariant.SELECTIVE], 1, 0))


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Run the block with Python's cyclic garbage collector off (restored after, as found).

    Costing thousands of block configurations allocates millions of small objects (the tasks,
    their costs, the memo entries), most of them kept alive by the memos and none of them in a
    reference cycle: each young-generation collection walks them for nothing (about 15% of the
    CPU time of ``benchmarks/bench_slow_commands.py``'s MoE searches). Reference counting still
    frees everything that is dropped; only cycles wait for the next collection."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _block_costs(
    table: CandidateTable,
    model: TransformerModelSpec,
    system: SystemSpec,
    groups: dict[ParallelDim, tuple[IntArray, IntArray]],
    progress: Callable[[int, int], None] | None,
) -> _BlockArrays:
    tp_tier, tp_per_node = groups[ParallelDim.TENSOR]
    cp_tier, cp_per_node = groups[ParallelDim.CONTEXT]
    # --first-last-layers-bf16: the base-precision layers' extras read where they sit (p, v)
    # and whether their chunk recomputes them (passes.base_layer_runs); zeros elsewhere
    base = _base_precision_rows(table)
    first, inverse = _keys(
        np.where(base, table.pipeline, 0),
        np.where(base, table.virtual_stages, 0),
        np.where(base, table.recompute_num_layers, 0),
        table.tensor,
        table.sequence_parallel,
        # the userbuffer overlap changes the block's TP collectives (passes._userbuffer_overlap)
        # and nothing else the search reads: no memory term, no P2P message
        table.tp_comm_overlap,
        _scope(table.recompute),
        table.micro_batch,
        tp_tier,
        tp_per_node,
        table.context,
        table.cp_comm,
        cp_tier,
        cp_per_node,
        table.precision,
        # the expert grid: the MoE block's dispatch and experts (zeros for a dense model), its
        # groups placed on the world's strides (passes.expert_groups)
        *_expert_key(table, model),
    )
    part_keys = sorted({(part, time) for e in STAGE_WORK_TERMS.values() for _, part, time in e})
    distinct_parts = sorted({part for part, _ in part_keys})
    part_rows: list[list[float]] = []
    layer_rows: list[list[float]] = []
    rows = []
    with _collector_paused():
        for done, i in enumerate(first):
            if progress is not None:
                progress(done, len(first))
            plan = portable_plan(candidate_to_spec(table, int(i), model), system)
            block, emb, lm = plan.block, plan.embedding, plan.lm_head
            costed = {part: costed_part(plan, part) for part in distinct_parts}
            part_rows.append([phase_field(costed[part], time) for part, time in part_keys])
            kinds = plan.layer_times()
            layer_rows.append(
                [
                    getattr(getattr(kinds, kind), time)
                    for kind, time in itertools.product(_KINDS, _KIND_TIMES)
                ]
            )
            rows.append(
                (  # in the field order of _BlockArrays
                    block.forward.compute_s,
                    block.forward.comm_exposed_s,
                    block.backward_activation.compute_s,
                    block.backward_activation.comm_exposed_s,
                    block.backward_weight.compute_s,
                    block.backward_weight.comm_exposed_s,
                    block.recompute.compute_s,
                    block.recompute.comm_exposed_s,
                    emb.forward.compute_s,
                    emb.forward.comm_exposed_s,
                    emb.backward.compute_s,
                    emb.backward.comm_exposed_s,
                    # PortablePlanIR.stage_microbatch_compute_s adds the base-precision layers to
                    # the stages of the embedding and of the loss
                    emb.total_s + plan.first_layers.total_s,
                    lm.forward.compute_s,
                    lm.forward.comm_exposed_s,
                    lm.backward.compute_s,
                    lm.backward.comm_exposed_s,
                    lm.total_s + plan.last_layers.total_s + plan.mtp.total_s,
                    0.0
                    if plan.ep_overlap is None
                    else plan.ep_overlap.unpaired_forward_s + plan.ep_overlap.unpaired_backward_s,
                    sum(plan.unpaired_window_change_s()),
                )
            )
    if progress is not None:
        progress(len(first), len(first))
    values = np.array(rows, dtype=np.float64)[inverse]
    part_values = np.array(part_rows, dtype=np.float64)[inverse]
    layer_values = np.array(layer_rows, dtype=np.float64)[inverse]
    names = [f.name for f in fields(_BlockArrays) if f.name not in ("parts", "layers")]
    column = iter(range(len(_KINDS) * len(_KIND_TIMES)))

    def kind_times() -> KindTimes:
        return KindTimes(**{time: layer_values[:, next(column)] for time in _KIND_TIMES})

    return _BlockArrays(
        **{name: values[:, j] for j, name in enumerate(names)},
        parts={key: part_values[:, j] for j, key in enumerate(part_keys)},
        layers=LayerTimes(**{kind: kind_times() for kind in _KINDS}),
    )


def _expert_key(
    table: CandidateTable, model: TransformerModelSpec
) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    """(ep, etp, dispatcher, N) where the model has experts, zeros otherwise (a dense model's
    rows all plan the default grid)."""
    if model.moe is None:
        zero = np.zeros_like(table.tensor)
        return zero, zero, zero, zero
    return table.expert, table.expert_tensor, table.dispatcher, table.num_gpus


def _p2p_time(table: CandidateTable, model: TransformerModelSpec, system: SystemSpec) -> FloatArray:
    """``passes.p2p_message`` (the PP message time), per (t, p, d, b, sp)."""
    first, inverse = _keys(
        table.tensor,
        table.pipeline,
        table.data,
        table.micro_batch,
        table.sequence_parallel,
        table.context,
    )

    def value(i: int) -> float:
        spec = candidate_to_spec(table, i, model)
        return p2p_message(PlanContext(spec=spec, system=system))[1]

    return _per_key(first, inverse, value)


def _groups(
    table: CandidateTable, system: SystemSpec
) -> dict[ParallelDim, tuple[IntArray, IntArray]]:
    """(tier code, ranks per node) of each dimension's group, per (t, p, d, cp)."""
    first, inverse = _keys(table.tensor, table.pipeline, table.data, table.context)
    out: dict[ParallelDim, tuple[IntArray, IntArray]] = {}
    for dim in ParallelDim:
        placed = [
            system.comm_group(
                dim,
                tensor=int(table.tensor[i]),
                pipeline=int(table.pipeline[i]),
                data=int(table.data[i]),
                context=int(table.context[i]),
            )
            for i in first
        ]
        tier = np.array([_TIER[g.tier] for g in placed], dtype=np.int64)[inverse]
        per_node = np.array([g.ranks_per_node for g in placed], dtype=np.int64)[inverse]
        out[dim] = (tier, per_node)
    return out


# --------------------------------------------------------------------------------------------
# Layout (analysis/stage_layout.py, PortablePlanIR projections) under an even split
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _StageColumns:
    """One representative stage per row (``passes.stage_plans``): its index and counts."""

    index: IntArray
    dense_blocks: IntArray
    moe_blocks: IntArray
    dense_recomputed: IntArray
    moe_recomputed: IntArray
    #: the sliding-window dense blocks, and those recomputed; the MoE ones
    windowed: IntArray
    windowed_recomputed: IntArray
    moe_windowed: IntArray
    moe_windowed_recomputed: IntArray
    #: per virtual chunk (columns 0..max v - 1, zero-padded): the blocks that are not MoE
    dense_per_chunk: IntArray
    #: per virtual chunk (zero-padded): every block (a balanced layout's chunks differ)
    blocks_per_chunk: IntArray

    @property
    def counts(self) -> LayerCounts:
        """``StagePlan.counts`` on columns."""
        return LayerCounts(
            dense=self.dense_blocks,
            moe=self.moe_blocks,
            dense_recomputed=self.dense_recomputed,
            moe_recomputed=self.moe_recomputed,
            windowed=self.windowed,
            windowed_recomputed=self.windowed_recomputed,
            moe_windowed=self.moe_windowed,
            moe_windowed_recomputed=self.moe_windowed_recomputed,
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _Layout:
    """What ``passes.stage_plans`` says of every row's layout, per (p, v, recompute) key.

    ``stages``: the stages that can be critical or most loaded: under the enumeration's even
    layout (``L mod (p v) == 0``) stages differ only by their MoE layers and their extras, so
    the first stage of each distinct (MoE and sliding-window layers per chunk, extras)
    signature stands for every stage of it: equal work, and no fewer in-flight microbatches
    than the later ones (a dense model without windows keeps the first and the last stage, as
    before). ``chunks``: every distinct chunk composition (dense, MoE, recomputed dense,
    recomputed MoE, then ``StagePlan.chunk_windowed``'s four), for the largest chunk."""

    stages: tuple[_StageColumns, ...]
    chunks: tuple[LayerCounts, ...]
    #: ``PortablePlanIR.max_blocks_per_stage`` / ``max_blocks_per_chunk`` per row (over every
    #: stage, not only the representatives)
    max_stage_blocks: IntArray
    max_chunk_blocks: IntArray


#: ``LayerCounts``'s fields in order: a chunk composition's columns
_COUNT_FIELDS: tuple[str, ...] = tuple(LayerCounts.__dataclass_fields__)


def _layout(table: CandidateTable, model: TransformerModelSpec) -> _Layout:
    first, inverse = _keys(
        table.pipeline, table.virtual_stages, table.recompute, table.recompute_num_layers
    )
    width = int(table.virtual_stages.max())
    keyed_stages: list[list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]] = []
    keyed_chunks: list[list[tuple[int, ...]]] = []
    keyed_most: list[tuple[int, int]] = []
    for i in first:
        plans = stage_plans(candidate_to_spec(table, int(i), model))
        keyed_most.append(
            (
                max(plan.blocks for plan in plans),
                max(max(plan.blocks_per_chunk) for plan in plans),
            )
        )
        chosen: list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = []
        even = len({plan.blocks_per_chunk for plan in plans}) == 1
        if model.moe is None and model.window_keys is None and even:
            candidates = [plans[0], plans[-1]]
        else:
            # a balanced layout's stages differ by their blocks per chunk too
            seen: set[tuple[object, ...]] = set()
            candidates = []
            for plan in plans:
                signature = (
                    plan.blocks_per_chunk,
                    plan.moe_blocks_per_chunk,
                    plan.moe_recomputed_per_chunk,
                    plan.windowed_blocks_per_chunk,
                    plan.windowed_recomputed_per_chunk,
                    plan.moe_windowed_per_chunk,
                    plan.moe_windowed_recomputed_per_chunk,
                    plan.has_embedding,
                    plan.has_lm_head,
                )
                if signature not in seen:
                    seen.add(signature)
                    candidates.append(plan)
        for plan in candidates:
            dense = tuple(b - plan.chunk_moe(c)[0] for c, b in enumerate(plan.blocks_per_chunk))
            chosen.append(
                (
                    (
                        plan.index,
                        plan.dense_blocks,
                        plan.moe_blocks,
                        plan.dense_recomputed_blocks,
                        plan.moe_recomputed_blocks,
                        plan.windowed_blocks,
                        plan.windowed_recomputed_blocks,
                        plan.moe_windowed_blocks,
                        plan.moe_windowed_recomputed_blocks,
                    ),
                    dense + (0,) * (width - len(dense)),
                    plan.blocks_per_chunk + (0,) * (width - len(plan.blocks_per_chunk)),
                )
            )
        keyed_stages.append(chosen)
        compositions: list[tuple[int, ...]] = sorted(
            {
                tuple(int(getattr(plan.chunk_counts(c), name)) for name in _COUNT_FIELDS)
                for plan in plans
                for c in range(len(plan.blocks_per_chunk))
            }
        )
        keyed_chunks.append(compositions)
    # pad every key to the longest list by repeating its last entry: a repeated stage is never
    # strictly larger than itself, so the first-on-ties choices below are unchanged
    n_stages = max(len(x) for x in keyed_stages)
    n_chunks = max(len(x) for x in keyed_chunks)
    stages = []
    for j in range(n_stages):
        rows = [x[min(j, len(x) - 1)] for x in keyed_stages]
        counts = np.array([r[0] for r in rows], dtype=np.int64)[inverse]
        per_chunk = np.array([r[1] for r in rows], dtype=np.int64).reshape(len(rows), width)
        all_chunk = np.array([r[2] for r in rows], dtype=np.int64).reshape(len(rows), width)
        stages.append(
            _StageColumns(
                index=counts[:, 0],
                dense_blocks=counts[:, 1],
                moe_blocks=counts[:, 2],
                dense_recomputed=counts[:, 3],
                moe_recomputed=counts[:, 4],
                windowed=counts[:, 5],
                windowed_recomputed=counts[:, 6],
                moe_windowed=counts[:, 7],
                moe_windowed_recomputed=counts[:, 8],
                dense_per_chunk=per_chunk[inverse],
                blocks_per_chunk=all_chunk[inverse],
            )
        )
    chunks = []
    for j in range(n_chunks):
        composition = np.array([x[min(j, len(x) - 1)] for x in keyed_chunks], dtype=np.int64)
        chunks.append(
            LayerCounts(**{name: composition[inverse, k] for k, name in enumerate(_COUNT_FIELDS)})
        )
    most = np.array(keyed_most, dtype=np.int64)[inverse]
    return _Layout(
        stages=tuple(stages),
        chunks=tuple(chunks),
        max_stage_blocks=most[:, 0],
        max_chunk_blocks=most[:, 1],
    )


def _uneven(table: CandidateTable, model: TransformerModelSpec) -> BoolArray:
    """The rows whose layers do not split evenly over p v chunks: they run their balanced layout
    (``space.layout_of``, ``PipelineLayouts.BALANCED``)."""
    return np.asarray(
        model.num_layers % (table.pipeline * table.virtual_stages) != 0, dtype=np.bool_
    )


def _layout_v(table: CandidateTable, model: TransformerModelSpec) -> IntArray:
    """v where a stage's parameters read it (a key column, 0 elsewhere): a MoE stage's MoE
    layers read v (passes.stage_plans), and so does a balanced layout's stage."""
    v = table.virtual_stages
    if model.moe is not None:
        return v
    return np.where(_uneven(table, model), v, 0)


def _select(choice: IntArray, options: list[IntArray]) -> IntArray:
    """``options[choice[i]][i]`` per row."""
    return np.choose(choice, options)


# --------------------------------------------------------------------------------------------
# Iteration (analysis/iteration.py)
# --------------------------------------------------------------------------------------------
def _stage_compute(stage: _StageColumns, p: IntArray, c: _BlockArrays) -> FloatArray:
    """``PortablePlanIR.stage_microbatch_compute_s`` of a representative stage."""
    times = c.layers
    work = np.asarray(
        layers_forward_s(stage.counts, times) + layers_backward_s(stage.counts, times),
        dtype=np.float64,
    )
    work = np.where(stage.index == 0, work + c.embedding_total_s, work)
    return np.where(stage.index == p - 1, work + c.lm_head_total_s, work)


def _critical_choice(layout: _Layout, p: IntArray, c: _BlockArrays) -> IntArray:
    """Which representative stage is ``PortablePlanIR.critical_stage`` (first on ties)."""
    best = _stage_compute(layout.stages[0], p, c)
    choice = np.zeros(p.shape, dtype=np.int64)
    for j, stage in enumerate(layout.stages[1:], start=1):
        work = _stage_compute(stage, p, c)
        better = work > best
        choice = np.where(better, j, choice)
        best = np.where(better, work, best)
    return choice


def _stage_work(
    *,
    p: IntArray,
    critical: IntArray,
    m: IntArray,
    counts: dict[WorkCount, IntArray],
    c: _BlockArrays,
) -> dict[str, FloatArray]:
    """``iteration.stage_work``: the same term table (``STAGE_WORK_TERMS``) on arrays; ``counts``
    the critical stage's block counts (the extras follow from its index)."""
    counts = {
        **counts,
        WorkCount.HAS_EMBEDDING: (critical == 0).astype(np.int64),
        WorkCount.HAS_LM_HEAD: (critical == p - 1).astype(np.int64),
        # base-precision layers (a recipe's high_precision_layers): the enumeration's even
        # layout keeps them with the embedding's stage and the loss's (their parts are zero
        # without them)
        WorkCount.HAS_FIRST_LAYERS: (critical == 0).astype(np.int64),
        WorkCount.HAS_LAST_LAYERS: (critical == p - 1).astype(np.int64),
    }
    out: dict[str, FloatArray] = {}
    for name, entries in STAGE_WORK_TERMS.items():
        total = np.zeros(p.shape, dtype=np.float64)
        for count, part, time in entries:
            total = total + counts[count] * c.parts[(part, time)]
        out[name] = m * total
    return out


def _pipeline_p2p_exposed(table: CandidateTable, m: IntArray, p2p_s: FloatArray) -> FloatArray:
    """``iteration.pipeline_p2p_exposed`` (forward and backward P2P times are equal)."""
    p, v = table.pipeline, table.virtual_stages
    per_microbatch_chunk = p2p_s + p2p_s
    overlapped = (v > 1) & table.overlap_p2p_comm
    exposed = np.where(
        overlapped,
        overlapped_p2p_exposed(p.astype(np.float64), v.astype(np.float64), per_microbatch_chunk),
        blocking_p2p_exposed(m.astype(np.float64), v.astype(np.float64), per_microbatch_chunk),
    )
    return np.where(p == 1, 0.0, exposed)


# --------------------------------------------------------------------------------------------
# Data parallelism (analysis/data_parallel.py)
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _Windows:
    """``data_parallel.OverlapWindows`` per row."""

    m: IntArray
    blocks_per_chunk: IntArray
    virtual_stages: IntArray
    pipeline_degree: IntArray
    block_backward_s: FloatArray
    chunk_backward_s: FloatArray
    stage_forward_s: FloatArray


def _dp_bucket(
    table: CandidateTable,
    w: _Windows,
    times: FloatArray,
    *,
    single: BoolArray,
    grad_bytes: IntArray,
    gather_bytes: IntArray,
    sm_overhead: float,
) -> tuple[IntArray, IntArray, FloatArray, FloatArray, FloatArray]:
    """``data_parallel.data_parallel_cost`` of one bucket set: (grad bytes, param-gather bytes,
    link, exposed with the hidden part's SM contention, that contention); ``times`` the
    (all-reduce, reduce-scatter, all-gather) seconds per row, ``single`` where the group has
    one rank, ``sm_overhead`` :func:`data_parallel.collective_sm_overhead`."""
    all_reduce_s, reduce_scatter_s, all_gather_s = times[:, 0], times[:, 1], times[:, 2]
    sharding = table.sharding
    no_shard = sharding == _SHARD[ShardingVariant.NO_SHARD]
    zero3 = sharding == _SHARD[ShardingVariant.OPTIM_GRADS_PARAMS]

    def hidden(total_s: FloatArray) -> FloatArray:
        return grad_sync_exposed(
            total_s,
            blocks_per_chunk=w.blocks_per_chunk.astype(np.float64),
            virtual_stages=w.virtual_stages.astype(np.float64),
            pipeline_degree=w.pipeline_degree.astype(np.float64),
            block_backward_s=w.block_backward_s,
            chunk_backward_s=w.chunk_backward_s,
        )

    grad_overlap, gather_overlap = table.overlap_grad_reduce, table.overlap_param_gather
    unsharded = unsharded_exposure(
        all_reduce_s, overlap_grad_reduce=grad_overlap, hidden=hidden(all_reduce_s)
    )
    sharded_hidden = hidden(reduce_scatter_s)
    optimizer = optimizer_sharded_exposure(
        reduce_scatter_s,
        all_gather_s,
        overlap_grad_reduce=grad_overlap,
        overlap_param_gather=gather_overlap,
        hidden=sharded_hidden,
        stage_forward_s=w.stage_forward_s,
    )
    parameters = parameter_sharded_exposure(
        reduce_scatter_s,
        all_gather_s,
        microbatches=np.maximum(w.m, 1).astype(np.float64),
        overlap_grad_reduce=grad_overlap,
        overlap_param_gather=gather_overlap,
        hidden=sharded_hidden,
        stage_forward_s=w.stage_forward_s,
        chunk_backward_s=w.chunk_backward_s,
    )
    sync, gather, sync_exposed, gather_exposed = (
        np.where(no_shard, a, np.where(zero3, c, b))
        for a, b, c in zip(unsharded, optimizer, parameters, strict=True)
    )
    link = np.where(single, 0.0, sync + gather)
    unhidden = np.where(single, 0.0, sync_exposed + gather_exposed)
    contention = sm_contention_s(link, unhidden, sm_overhead)
    gathered = np.where(single | no_shard, 0, gather_bytes)
    return grad_bytes, gathered, link, unhidden + contention, contention


# --------------------------------------------------------------------------------------------
# Memory (analysis/memory.py)
# --------------------------------------------------------------------------------------------
def _interleaved_chunk_count(
    peak: IntArray, m: IntArray, n: IntArray, v: IntArray, chunk: IntArray
) -> IntArray:
    """``in_flight_microbatches(...)[chunk]`` of interleaved 1F1B: the sum over the schedule
    table's groups of :func:`memory.interleaved_slot`, up to the last group any row reaches."""
    safe_n = np.maximum(n, 1)
    count = np.zeros_like(peak)
    index = 0
    while True:
        reached = np.asarray(
            interleaved_group_reached(
                index=index, group=safe_n, microbatches=m, virtual=v, peak=peak
            )
        )
        if not reached.any():
            break
        slot = interleaved_slot(
            peak=peak, microbatches=m, group=safe_n, virtual=v, index=index, chunk=chunk
        )
        count += np.where(reached, slot, 0)
        index += 1
    return count


def _combined(table: CandidateTable, model: TransformerModelSpec) -> npt.NDArray[np.bool_]:
    """Rows that run combined 1F1B: a MoE model's dispatcher with the EP overlap
    (``space.candidate_to_spec`` -> ``training_schedule``)."""
    if model.moe is None:
        return np.zeros(table.pipeline.shape, dtype=np.bool_)
    overlaps = np.array([dispatcher_overlaps(k) for k in table.dispatchers], dtype=np.bool_)
    return np.asarray(overlaps[table.dispatcher], dtype=np.bool_)


def _in_flight_chunk(
    table: CandidateTable,
    stage: IntArray,
    m: IntArray,
    chunk: int,
    combined: npt.NDArray[np.bool_],
) -> IntArray:
    """``in_flight_microbatches(...)[chunk]`` (rows with fewer chunks: whatever; the caller
    weighs them by 0); combined 1F1B counts as interleaving."""
    p, v = table.pipeline, table.virtual_stages
    n = np.where(table.microbatch_group > 0, table.microbatch_group, p)
    peak = interleaved_peak(pipeline=p, stage=stage, virtual=v, group=n, microbatches=m)
    interleaved = _interleaved_chunk_count(peak, m, n, v, np.full_like(v, chunk))
    simple = np.where(
        p == 1, np.ones_like(p), one_f_one_b_in_flight(pipeline=p, stage=stage, microbatches=m)
    )
    return np.where((v > 1) | combined, interleaved, simple)


def _in_flight(
    table: CandidateTable, stage: IntArray, m: IntArray, combined: npt.NDArray[np.bool_]
) -> tuple[IntArray, IntArray, IntArray]:
    """(sum, first entry, last entry) of ``in_flight_microbatches`` at ``stage``."""
    p, v = table.pipeline, table.virtual_stages
    one_f_one_b = one_f_one_b_in_flight(pipeline=p, stage=stage, microbatches=m)
    single = np.ones_like(p)
    n = np.where(table.microbatch_group > 0, table.microbatch_group, p)
    peak = interleaved_peak(pipeline=p, stage=stage, virtual=v, group=n, microbatches=m)
    interleaved = (v > 1) | combined
    i_total = np.minimum(peak, m * v)
    i_first = _interleaved_chunk_count(peak, m, n, v, np.zeros_like(v))
    i_last = _interleaved_chunk_count(peak, m, n, v, v - 1)
    simple = np.where(p == 1, single, one_f_one_b)
    return (
        np.where(interleaved, i_total, simple),
        np.where(interleaved, i_first, simple),
        np.where(interleaved, i_last, simple),
    )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _StageMemory:
    weights: IntArray
    gradients: IntArray
    optimizer: IntArray
    activations: IntArray
    other: IntArray
    transient: IntArray
    workspace: IntArray
    allocator_reserve: IntArray
    cuda_context: IntArray
    nccl_buffers: IntArray
    peak: IntArray  # index into memory.PEAK_PHASES
    step_copy: IntArray  # memory.step_copy_bytes, outside ``optimizer``

    @property
    def total(self) -> IntArray:
        return self.weights + self.gradients + self.optimizer + self.activations + self.other

    @property
    def peaks(self) -> tuple[IntArray, IntArray, IntArray]:
        """``memory.peak_bytes`` per row."""
        return peak_bytes(
            total=self.total,
            transient=self.transient,
            workspace=self.workspace,
            allocator_reserve=self.allocator_reserve,
            cuda_context=self.cuda_context,
            nccl_buffers=self.nccl_buffers,
        )


def _stage_memory(
    table: CandidateTable,
    model: TransformerModelSpec,
    *,
    runtime: RuntimeMemory,
    node: NodeSpec,
    rep: _StageColumns,
    m: IntArray,
    layer_full: IntArray,
    layer_kept: IntArray,
    checkpoint: IntArray,
    working_bytes: IntArray,
    logits_bytes: IntArray,
    moe_full: IntArray,
    moe_kept: IntArray,
) -> _StageMemory:
    """``memory.stage_memory`` of the representative stage ``rep`` (per row) under an even
    layout; ``moe_full`` / ``moe_kept``: what a MoE layer stores (0 for a dense model)."""
    recipe = precision_recipe(model.datatype, table.grad_reduce_dtype)
    p, t, v = table.pipeline, table.tensor, table.virtual_stages
    stage = rep.index
    d = table.data * table.context  # the distributed optimizer shards over d x cp
    moe_key = _expert_key(table, model)
    layout_v = _layout_v(table, model)
    # ZeRO-3 holds its unit (and the prefetched next) whole, the dense parameters first
    first_s, inverse_s = _keys(table.sharding, table.overlap_param_gather)
    shardings = [
        candidate_to_spec(table, int(i), model).mapping.parallelism.data.optimizer_sharding
        for i in first_s
    ]
    level = np.array([sharding_level(x) for x in shardings], dtype=np.int64)[inverse_s]
    ahead = np.array([gathers_ahead(x) for x in shardings], dtype=np.bool_)[inverse_s]
    # A stage's parameters read t, p, the stage, the layout (v) and the expert grid's shape, not
    # the sharding, the dispatcher or the GPU count; the weight extra reads the precision and
    # whether the parameters are sharded (ZeRO-3): one strategy per such key (issue 18: keyed by
    # the full sharding and the GPU count, a Qwen3-30B-A3B search over 4 and 1,536 GPUs asked
    # 3,425 strategies per stage where 828 carry all the answers).
    first, inverse = _keys(
        t, p, stage, table.precision, moe_key[0], moe_key[1], layout_v, level == 3
    )
    mappings = [candidate_to_spec(table, int(i), model).mapping for i in first]
    params = [
        stage_parameters(model, mapping, int(stage[i]))
        for i, mapping in zip(first, mappings, strict=True)
    ]
    count = np.array([s.dense_total for s in params], dtype=np.int64)[inverse]
    experts = np.array([s.expert_total for s in params], dtype=np.int64)[inverse]
    largest = np.array([s.largest_unit for s in params], dtype=np.int64)[inverse]
    # memory.low_precision_weight_extra (0 under ZeRO-3, hence the ZeRO-3 flag in the key)
    weight_extra = np.array(
        [
            low_precision_weight_extra(model, mapping, s.blocks, recipe.param, s.moe_blocks)
            for s, mapping in zip(params, mappings, strict=True)
        ],
        dtype=np.int64,
    )[inverse]
    # expert-dp reads the GPU count beside the grid
    first_e, inverse_e = _keys(p, *moe_key)
    expert_dp = np.array(
        [candidate_to_spec(table, int(i), model).mapping.expert_data_degree for i in first_e],
        dtype=np.int64,
    )[inverse_e]

    gathered = gathered_whole(level, count + experts, largest, ahead)
    dense_gathered = np.minimum(count, gathered)
    expert_gathered = np.maximum(0, gathered - count)
    held = persistent_recipe(recipe)
    dense_parts = state_bytes(count, recipe=held, level=level, degree=d, gathered=dense_gathered)
    expert_parts = state_bytes(
        experts, recipe=held, level=level, degree=expert_dp, gathered=expert_gathered
    )
    # memory.step_copy_bytes: the fp32 copy of 16-bit gradients, at the step only
    copy = step_copy_bytes(
        count, recipe=recipe, level=level, degree=d, gathered=dense_gathered
    ) + step_copy_bytes(
        experts, recipe=recipe, level=level, degree=expert_dp, gathered=expert_gathered
    )
    weights = dense_parts[0] + expert_parts[0]
    gradients = dense_parts[1] + expert_parts[1]
    optimizer = dense_parts[2] + expert_parts[2]
    weights = weights + weight_extra

    # stage_activations: every chunk holds L/(p v) blocks under an even split; a balanced
    # layout's chunks are summed one by one (its rows have v <= BALANCED_LAYOUT_MAX_VIRTUAL)
    combined = _combined(table, model)
    total_in_flight, first_in_flight, last_in_flight = _in_flight(table, stage, m, combined)
    uneven = _uneven(table, model)
    layers = model.num_layers // (p * v)
    n = np.maximum(table.recompute_num_layers, 1)
    r = table.recompute
    # a full recompute's group works on MoE layers when the stage holds any
    full = np.where(rep.moe_blocks > 0, moe_full, layer_full)
    # under the even layout every chunk holds ``layers`` blocks, so a chunk formula evaluated
    # on the stage's in-flight total is the scalar plan's sum over its chunks
    layer_microbatches = total_in_flight * layers
    uniform = uniform_stored_bytes(total_in_flight, layers, n, checkpoint)
    block = block_stored_bytes(total_in_flight, layers, n, checkpoint, full)
    largest_chunk = layers
    per_chunk_flight: dict[int, IntArray] = {}

    def chunk_flight(chunk: int) -> IntArray:
        if chunk not in per_chunk_flight:
            per_chunk_flight[chunk] = _in_flight_chunk(table, stage, m, chunk, combined)
        return per_chunk_flight[chunk]

    if uneven.any():
        width = int(v[uneven].max())
        odd = (0 * p, 0 * p, 0 * p, 0 * p)
        for chunk in range(width):
            blocks_here = np.where(chunk < v, rep.blocks_per_chunk[:, chunk], 0)
            flight = chunk_flight(chunk)
            odd = (
                odd[0] + flight * blocks_here,
                odd[1] + uniform_stored_bytes(flight, blocks_here, n, checkpoint),
                odd[2] + block_stored_bytes(flight, blocks_here, n, checkpoint, full),
                np.maximum(odd[3], blocks_here),
            )
        layer_microbatches = np.where(uneven, odd[0], layer_microbatches)
        uniform = np.where(uneven, odd[1], uniform)
        block = np.where(uneven, odd[2], block)
        largest_chunk = np.where(uneven, odd[3], largest_chunk)
    has_blocks = largest_chunk > 0
    # memory._stage_activations: a MoE layer stores its excess over a dense one, counted over
    # the in-flight microbatches of each chunk: all of a chunk's blocks but its dense ones
    moe_in_flight = np.zeros_like(p)
    if model.moe is not None:
        moe_in_flight = layer_microbatches
        for chunk in range(rep.dense_per_chunk.shape[1]):
            dense_here = rep.dense_per_chunk[:, chunk]
            if dense_here.any():
                moe_in_flight = moe_in_flight - chunk_flight(chunk) * dense_here
    stored = np.select(
        [
            r == _CODE[RecomputeVariant.NONE],
            r == _CODE[RecomputeVariant.SELECTIVE],
            r == _CODE[RecomputeVariant.FULL_UNIFORM],
            r == _CODE[RecomputeVariant.FULL_BLOCK],
        ],
        [
            plain_stored_bytes(layer_microbatches, moe_in_flight, layer_full, moe_full),
            plain_stored_bytes(layer_microbatches, moe_in_flight, layer_kept, moe_kept),
            uniform,
            block,
        ],
    )
    # memory._stage_activations: combined 1F1B's paired forward, one layer of what a forward
    # stores under the row's recompute (memory._forward_layer_stores)
    selective = r == _CODE[RecomputeVariant.SELECTIVE]
    plain = r == _CODE[RecomputeVariant.NONE]
    paired = paired_forward_bytes(
        in_flight=total_in_flight,
        microbatches=m,
        virtual=v,
        moe_blocks=rep.moe_blocks,
        layer=np.where(plain, layer_full, np.where(selective, layer_kept, checkpoint)),
        moe_layer=np.where(plain, moe_full, np.where(selective, moe_kept, checkpoint)),
    )
    stored = stored + np.where(combined & has_blocks, paired, 0)
    working = np.select(
        [
            r == _CODE[RecomputeVariant.SELECTIVE],
            r == _CODE[RecomputeVariant.FULL_UNIFORM],
            r == _CODE[RecomputeVariant.FULL_BLOCK],
        ],
        [
            selective_working_bytes(has_blocks, layer_full, layer_kept),
            uniform_working_bytes(np.minimum(n, largest_chunk), full, checkpoint),
            block_working_bytes(has_blocks, full, checkpoint),
        ],
        default=0,
    )
    s = model.seq_length // table.context  # a cp rank's tokens
    h = model.hidden_size
    rows = sequence_rows(s, t, table.sequence_parallel)
    b = table.micro_batch

    embedding = np.where(
        stage == 0,
        embedding_buffer_bytes(
            first_in_flight,
            micro_batch=b,
            tokens=s,
            rows=rows,
            hidden=h,
            dropout=model.has_hidden_dropout,
        ),
        0,
    )
    vocab_shard = ceil_div(np.full_like(t, model.padded_vocab_size), t)
    logits = np.where(
        stage == p - 1,
        logits_buffer_bytes(
            last_in_flight,
            micro_batch=b,
            tokens=s,
            vocab_shard=vocab_shard,
            rows=rows,
            hidden=h,
            activation=recipe.activation,
        ),
        0,
    )
    if model.mtp_num_layers:
        # memory._mtp_depth: the depth's layer has the last decoder layer's kind
        moe_last = model.mtp_layer_is_moe
        depth = mtp_depth_stored_bytes(
            selective=r == _CODE[RecomputeVariant.SELECTIVE],
            uniform=r == _CODE[RecomputeVariant.FULL_UNIFORM],
            full_layer=moe_full if moe_last else layer_full,
            kept_layer=moe_kept if moe_last else layer_kept,
            micro_batch=b,
            rows=rows,
            hidden=h,
            activation=recipe.activation,
        )
        head = logits_buffer_bytes(
            np.ones_like(b),
            micro_batch=b,
            tokens=s,
            vocab_shard=vocab_shard,
            rows=rows,
            hidden=h,
            activation=recipe.activation,
        )
        mtp = mtp_stored_bytes(last_in_flight, depths=model.mtp_num_layers, depth=depth, head=head)
        stored = stored + np.where(stage == p - 1, mtp, 0)
    # memory.stage_overheads: under an even layout every stage holds blocks; the NCCL buffers
    # read t, p, d, cp and its exchange (and so the job's NVLink domain), v, the expert grid
    # and whether the stage is the first, a middle one or the last.
    edge = np.where(stage == 0, 0, np.where(stage == p - 1, 2, 1))
    first_n, inverse_n = _keys(
        t, p, table.data, table.context, table.cp_comm, edge, v, *moe_key[:3]
    )
    tied = model.embeddings is EmbeddingTying.TIED
    # the expert grid and the CP exchange read a few columns: one strategy per their key, not
    # per NCCL key (issue 18: 5,175 strategies built for three stages of a Qwen3-30B-A3B search)
    first_g, inverse_g = _keys(table.context, table.cp_comm, *moe_key[:3])
    grids = []
    for i in first_g:
        mapping = candidate_to_spec(table, int(i), model).mapping
        grids.append((expert_grid(model, mapping), mapping.parallelism.context.communication))

    def nccl_at(i: int) -> int:
        world = int(t[i]) * int(p[i]) * int(table.data[i]) * int(table.context[i])
        experts, cp_communication = grids[int(inverse_g[i])]
        return nccl_buffer_bytes(
            runtime,
            tensor=int(t[i]),
            pipeline=int(p[i]),
            data=int(table.data[i]),
            stage=int(stage[i]),
            tied=tied,
            context=int(table.context[i]),
            nvlink_domain=node.placed_domain_size(world),
            experts=experts,
            virtual_stages=int(v[i]),
            cp_communication=cp_communication,
        )

    nccl = np.array([nccl_at(int(i)) for i in first_n], dtype=np.int64)[inverse_n]
    backward_working = np.where(has_blocks, working_bytes, 0)
    logits_transient = np.where(stage == p - 1, logits_bytes, 0)
    activations = stored + working
    base_rows = _base_precision_rows(table)
    if base_rows.any():
        # --first-last-layers-bf16 (reachable through the API's SearchSpace only): those
        # layers' stores and working sets are the scalar plan's, memory.stage_activations
        activations = np.where(
            base_rows, _scalar_activations(table, model, stage, base_rows), activations
        )
    step = step_copy_excess(copy=copy, activations=activations, other=embedding + logits)
    transient, workspace, reserve, context, nccl_buffers = overhead_parts(
        working=backward_working,
        logits=logits_transient,
        nccl_buffers=nccl,
        runtime=runtime,
        step=step,
    )
    return _StageMemory(
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        activations=activations,
        other=embedding + logits,
        transient=transient,
        workspace=workspace,
        allocator_reserve=reserve,
        cuda_context=context,
        nccl_buffers=nccl_buffers,
        peak=peak_phase_index(working=backward_working, logits=logits_transient, step=step),
        step_copy=copy,
    )


def _base_precision_rows(table: CandidateTable) -> npt.NDArray[np.bool_]:
    """Rows whose recipe keeps first / last layers at the base precision."""
    flags = np.array([high_precision_layers(x) != (0, 0) for x in table.precisions], dtype=np.bool_)
    return np.asarray(flags[table.precision], dtype=np.bool_)


def _scalar_activations(
    table: CandidateTable, model: TransformerModelSpec, stage: IntArray, rows: npt.NDArray[np.bool_]
) -> IntArray:
    """``memory.stage_activations``' activation bytes (stored, working, MTP, paired forward) of
    ``rows`` at their representative stage; 0 elsewhere."""
    out = np.zeros(table.tensor.shape, dtype=np.int64)
    seen: dict[tuple[object, int], int] = {}
    for i in np.flatnonzero(rows):
        mapping = candidate_to_spec(table, int(i), model).mapping
        key = (mapping, int(stage[i]))
        if key not in seen:
            seen[key] = stage_activations(model, mapping, int(stage[i])).on_gpu
        out[i] = seen[key]
    return out


def _layer_bytes(
    table: CandidateTable, model: TransformerModelSpec
) -> tuple[IntArray, IntArray, IntArray, IntArray, IntArray, IntArray, IntArray]:
    """(``layer_activation_bytes`` with and without the attention core, ``checkpoint_bytes``,
    ``backward_working_bytes``, ``logits_transient_bytes``): what reads only t, b and sp."""
    x = precision_recipe(model.datatype).activation
    first, inverse = _keys(
        table.tensor,
        table.micro_batch,
        table.sequence_parallel,
        table.context,
        table.cp_comm,
        # a recipe keeps the linears' inputs quantized (memory.layer_activation_bytes)
        table.precision,
        *_expert_key(table, model),
    )
    # every candidate plans the attention kernel candidate_to_spec gives it (one for all rows)
    attention = candidate_to_spec(table, 0, model).mapping.attention
    full_model = model

    def local(i: int) -> TransformerModelSpec:
        return local_sequence_model(full_model, int(table.context[i]))

    # the modules the space's one selective variant recomputes (Megatron's default)
    selective = RecomputeVariant.SELECTIVE.build(1)
    modules = selective.modules if isinstance(selective, SelectiveRecompute) else frozenset()

    def layer(i: int, *, core: bool) -> int:
        return layer_activation_bytes(
            local(i),
            micro_batch=int(table.micro_batch[i]),
            tensor_degree=int(table.tensor[i]),
            sequence_parallel=bool(table.sequence_parallel[i]),
            attention=attention,
            recomputed=frozenset() if core else modules,
            activation_bytes=x,
            precision=candidate_to_spec(table, i, full_model).mapping.precision,
        )

    def checkpoint(i: int) -> int:
        return checkpoint_bytes(
            local(i),
            micro_batch=int(table.micro_batch[i]),
            tensor_degree=int(table.tensor[i]),
            sequence_parallel=bool(table.sequence_parallel[i]),
            activation_bytes=x,
        )

    def working(i: int) -> int:
        return backward_working_bytes(
            local(i),
            micro_batch=int(table.micro_batch[i]),
            tensor_degree=int(table.tensor[i]),
            sequence_parallel=bool(table.sequence_parallel[i]),
            attention=attention,
            activation_bytes=x,
        ) + context_transient_bytes(
            local(i),
            micro_batch=int(table.micro_batch[i]),
            tensor_degree=int(table.tensor[i]),
            context=candidate_to_spec(table, i, full_model).mapping.parallelism.context,
        )

    def logits(i: int) -> int:
        return logits_transient_bytes(
            local(i),
            micro_batch=int(table.micro_batch[i]),
            tensor_degree=int(table.tensor[i]),
            activation_bytes=x,
        )

    return (
        _per_key_int(first, inverse, lambda i: layer(i, core=True)),
        _per_key_int(first, inverse, lambda i: layer(i, core=False)),
        _per_key_int(first, inverse, checkpoint),
        _per_key_int(first, inverse, working),
        _per_key_int(first, inverse, logits),
        *_moe_layer_bytes(table, model),
    )


def _moe_layer_bytes(
    table: CandidateTable, model: TransformerModelSpec
) -> tuple[IntArray, IntArray]:
    """``memory.moe_layer_bytes`` per key (zeros for a dense model); what a MoE layer keeps
    under selective recompute reads the recomputed modules, hence the selective flag."""
    if model.moe is None:
        zero = np.zeros_like(table.tensor)
        return zero, zero
    first, inverse = _keys(
        table.tensor,
        table.micro_batch,
        table.sequence_parallel,
        table.context,
        table.cp_comm,
        table.precision,
        *_expert_key(table, model),
        _scope(table.recompute) == 1,
    )
    pairs = [moe_layer_bytes(model, candidate_to_spec(table, int(i), model).mapping) for i in first]
    values = np.array(pairs, dtype=np.int64).reshape(-1, 2)[inverse]
    return values[:, 0], values[:, 1]


def _check_int64_range(table: CandidateTable, model: TransformerModelSpec) -> None:
    """Refuse a table whose byte counts could pass int64 (the columns are int64 and numpy wraps
    silently). No stage of any candidate stores more than ``4 L B`` layers' activations of one
    sequence (in-flight microbatches x layers per stage x micro-batch <= 2 L B, doubled for
    working sets) plus 64 bytes per parameter."""
    x = precision_recipe(model.datatype).activation
    per_sequence = layer_activation_bytes(
        model,
        micro_batch=1,
        tensor_degree=1,
        sequence_parallel=False,
        # an upper bound whatever the kernel: unfused attention stores the s x s scores
        attention=UnfusedAttention(),
        recomputed=frozenset(),
        activation_bytes=x,
    )
    bound = 4 * model.num_layers * table.global_batch_size * per_sequence
    bound += 64 * model.num_parameters
    if bound > MAX_INT:
        raise ConfigError(
            [
                "search: byte counts could exceed the int64 limit "
                f"{int_limit_text()}: 4 x num_layers x global_batch x one sequence's layer "
                f"activations + 64 B x parameters = 4 x {model.num_layers} x "
                f"{table.global_batch_size} x {per_sequence} + 64 x {model.num_parameters} = "
                f"{bound:.3e}; use a smaller global batch"
            ],
            source="search",
        )


# --------------------------------------------------------------------------------------------
# The whole evaluation (analysis/evaluate.py evaluate_plan)
# --------------------------------------------------------------------------------------------
def evaluate_candidates(
    table: CandidateTable,
    model: TransformerModelSpec,
    system: SystemSpec,
    *,
    flops_convention: FlopsConvention = FlopsConvention.MEGATRON_LEGACY,
    progress: Callable[[int, int], None] | None = None,
) -> CandidateFigures:
    """The contract-bubble plan figures of every row of ``table`` (module docstring).

    ``progress(done, total)`` is called while the block costs are computed, the longest step.
    """
    if len(table) == 0:
        raise ValueError("evaluate_candidates needs at least one candidate")
    _check_int64_range(table, model)
    t, p, d, v = table.tensor, table.pipeline, table.data, table.virtual_stages
    m = table.microbatch_count
    groups = _groups(table, system)
    c = _block_costs(table, model, system, groups, progress)
    p2p_s = _p2p_time(table, model, system)
    # PortablePlanIR._p2p: chunk edges only carry P2P time when p > 1.
    edge_p2p = np.where(p > 1, p2p_s, 0.0)

    layout = _layout(table, model)
    # PortablePlanIR.max_blocks_per_chunk / max_blocks_per_stage (L / (p v) and L / p under an
    # even split; a balanced layout's largest)
    blocks_per_chunk = layout.max_chunk_blocks
    stage_blocks = layout.max_stage_blocks
    choice = _critical_choice(layout, p, c)
    options = list(layout.stages)
    critical = _select(choice, [s.index for s in options])
    crit = LayerCounts(
        **{
            name: _select(choice, [getattr(s.counts, name) for s in options])
            for name in _COUNT_FIELDS
        }
    )
    layer_times = c.layers

    # bubble_contract: the largest chunk of any stage (PortablePlanIR.forward_chunk_s /
    # backward_chunk_s), over the distinct chunk compositions
    forward_longest = np.zeros(p.shape, dtype=np.float64)
    backward_longest = np.zeros(p.shape, dtype=np.float64)
    for chunk in layout.chunks:
        forward_longest = np.maximum(forward_longest, layers_forward_s(chunk, layer_times))
        backward_longest = np.maximum(backward_longest, layers_backward_s(chunk, layer_times))
    forward_chunk_s = forward_longest + edge_p2p
    backward_chunk_s = backward_longest + edge_p2p
    # iteration.bubble_contract costs the imbalance with the MoE block where there is one
    correction = np.where(
        p == 1,
        0.0,
        imbalance_correction(
            p=p.astype(np.float64),
            max_blocks_per_stage=stage_blocks.astype(np.float64),
            total_blocks=np.full(p.shape, float(model.num_layers)),
            block_fw_bw_s=np.asarray(
                c.layers.moe.forward + (c.layers.moe.backward + c.layers.moe.recompute),
                dtype=np.float64,
            ),
        ),
    )
    chunk_time = np.where(p == 1, 0.0, forward_chunk_s + backward_chunk_s)
    # analytic_bubble(p=1, v=1, ...) without pipelining: no extra chunks
    extra = np.where(p > 1, extra_interleaving_bubbles(p, v, m), 0)
    n_bubble = bubble_count(p, extra)
    bubble_s = bubble_seconds(n_bubble.astype(np.float64), chunk_time, correction)

    work = _stage_work(
        p=p,
        critical=critical,
        m=m,
        counts={
            count: np.asarray(blocks, dtype=np.int64)
            for count in WorkCount
            if (blocks := block_work_count(crit, count)) is not None
        },
        c=c,
    )
    forward, backward, recompute = work["forward"], work["backward"], work["recompute"]
    tp_exposed, cp_exposed = work["tp_comm_exposed"], work["cp_comm_exposed"]
    microbatch_group = np.where(table.microbatch_group > 0, table.microbatch_group, p)
    ep_exposed = work["ep_comm_exposed"]
    # iteration.plan_unpaired_ep_exposed_s: the MoE layers' extra, then the windowed ones' change
    for moe_layers, unpaired_s in (
        (crit.moe, c.moe_unpaired_s),
        (crit.moe_windowed, c.moe_window_unpaired_s),
    ):
        ep_exposed = ep_exposed + unpaired_ep_exposed_s(
            p=p,
            v=v,
            group=microbatch_group,
            m=m,
            stage=critical,
            moe_blocks=moe_layers,
            unpaired_s=unpaired_s,
        )
    pp_exposed = _pipeline_p2p_exposed(table, m, p2p_s)

    # stage_data_parallel_cost: the dense buckets over d x cp, then the experts' over expert-dp
    recipe = precision_recipe(model.datatype, table.grad_reduce_dtype)
    cp = table.context
    dense = d * cp  # dense gradients reduce and shard over d x cp
    moe_key = _expert_key(table, model)
    layout_v = _layout_v(table, model)
    first, inverse = _keys(t, p, d, cp, critical, table.precision, *moe_key, layout_v)
    keyed: list[tuple[int, int, int, int, int]] = []
    keyed_times: list[tuple[float, ...]] = []
    for i in first:
        spec = candidate_to_spec(table, int(i), model)
        mapping = spec.mapping
        stage_params = stage_parameters(model, mapping, int(critical[i]))
        counts = (stage_params.dense_total, stage_params.expert_total)
        gathers = stage_param_gather_bytes(model, mapping, stage_params, recipe.param)
        context = PlanContext(spec=spec, system=system)
        keyed.append((*counts, *gathers, mapping.expert_data_degree))
        row: list[float] = []
        for count, gather_size, group in zip(
            counts,
            gathers,
            (context.gradient_group(), context.expert_gradient_group()),
            strict=True,
        ):
            if group.size == 1 or count == 0:
                row.extend((0.0, 0.0, 0.0))
                continue
            row.extend(
                (
                    system.collective_time(CollectiveKind.ALL_REDUCE, count * recipe.grad, group),
                    system.collective_time(
                        CollectiveKind.REDUCE_SCATTER, count * recipe.grad, group
                    ),
                    system.collective_time(CollectiveKind.ALL_GATHER, gather_size, group),
                )
            )
        keyed_times.append(tuple(row))
    keyed_ints = np.array(keyed, dtype=np.int64)[inverse]
    params, expert_params = keyed_ints[:, 0], keyed_ints[:, 1]
    gather_bytes, expert_gather_bytes = keyed_ints[:, 2], keyed_ints[:, 3]
    expert_dp = keyed_ints[:, 4]
    times = np.array(keyed_times, dtype=np.float64)[inverse]
    # PortablePlanIR.chunk_forward_s summed over the critical stage's chunks
    stage_forward_s = np.asarray(layers_forward_s(crit, layer_times), dtype=np.float64)
    windows = _Windows(
        m=m,
        blocks_per_chunk=blocks_per_chunk,
        virtual_stages=v,
        pipeline_degree=p,
        block_backward_s=np.asarray(mean_block_backward_s(crit, layer_times), dtype=np.float64),
        chunk_backward_s=backward_chunk_s,
        stage_forward_s=stage_forward_s,
    )
    sharding = table.sharding
    no_shard = sharding == _SHARD[ShardingVariant.NO_SHARD]
    sm_overhead = collective_sm_overhead(system)
    dense_dp = _dp_bucket(
        table,
        windows,
        times[:, 0:3],
        single=dense == 1,
        grad_bytes=params * recipe.grad,
        gather_bytes=gather_bytes,
        sm_overhead=sm_overhead,
    )
    expert_dp_cost = _dp_bucket(
        table,
        windows,
        times[:, 3:6],
        single=expert_dp == 1,
        grad_bytes=expert_params * recipe.grad,
        gather_bytes=expert_gather_bytes,
        sm_overhead=sm_overhead,
    )
    # DataParallelCost.then: the expert buckets add only where the stage has experts
    has_experts = expert_params > 0
    grads_bytes = dense_dp[0] + np.where(has_experts, expert_dp_cost[0], 0)
    dp_gather_bytes = dense_dp[1] + np.where(has_experts, expert_dp_cost[1], 0)
    dp_link = dense_dp[2] + np.where(has_experts, expert_dp_cost[2], 0.0)
    dp_exposed = dense_dp[3] + np.where(has_experts, expert_dp_cost[3], 0.0)
    dp_contention = dense_dp[4] + np.where(has_experts, expert_dp_cost[4], 0.0)

    # adam_step_cost over the owned parameters (optimizer_step.owned_parameters, dense then
    # experts, as evaluate._owned_parameters calls it)
    sharded = ~no_shard
    owned = owned_parameters(params, degree=dense, sharded=sharded) + owned_parameters(
        expert_params, degree=expert_dp, sharded=sharded
    )
    owned_values, owned_inverse = np.unique(owned, return_inverse=True)
    steps = [
        adam_step_cost(
            parameters=int(n_owned),
            param_bytes=recipe.param,
            grad_bytes=recipe.grad,
            datatype=model.datatype,
            system=system,
        )
        for n_owned in owned_values
    ]
    optimizer_s = np.array([s.time_s for s in steps], dtype=np.float64)[owned_inverse]
    optimizer_flops = np.array([s.flops for s in steps], dtype=np.int64)[owned_inverse]
    optimizer_moved = np.array([s.bytes_moved for s in steps], dtype=np.int64)[owned_inverse]

    # memory_per_stage over the representative stages, the earlier on ties (most_loaded)
    layer_full, layer_kept, checkpoint, working, logits, moe_full, moe_kept = _layer_bytes(
        table, model
    )
    layer = {
        "m": m,
        "layer_full": layer_full,
        "layer_kept": layer_kept,
        "checkpoint": checkpoint,
        "working_bytes": working,
        "logits_bytes": logits,
        "moe_full": moe_full,
        "moe_kept": moe_kept,
    }
    at = [
        _stage_memory(table, model, runtime=system.runtime, node=system.node, rep=rep, **layer)
        for rep in layout.stages
    ]
    peaks = [stage.peaks for stage in at]
    heaviest = np.zeros(p.shape, dtype=np.int64)
    top = peaks[0][2]
    for j in range(1, len(at)):
        heavier = peaks[j][2] > top  # memory.most_loaded: by reserved_peak
        heaviest = np.where(heavier, j, heaviest)
        top = np.where(heavier, peaks[j][2], top)

    def worst(values: list[IntArray]) -> IntArray:
        return _select(heaviest, values)

    # FLOPs
    first_f, inverse_f = _keys(table.recompute, table.recompute_num_layers, p, v)
    hardware_values = tuple(
        hardware_flops_per_iteration(
            model, candidate_to_spec(table, int(i), model).mapping, flops_convention
        )
        for i in first_f
    )
    peak = system.accelerator.engine(Engine.MATRIX).rate(model.datatype).peak_flop_per_s
    return CandidateFigures(
        forward=forward,
        backward=backward,
        recompute=recompute,
        pipeline_bubble=bubble_s,
        tp_comm_exposed=tp_exposed,
        cp_comm_exposed=cp_exposed,
        ep_comm_exposed=ep_exposed,
        host_exposed=work["host_exposed"],
        pp_comm_exposed=pp_exposed,
        dp_comm_exposed=dp_exposed,
        optimizer=optimizer_s,
        bubble_contract_s=bubble_s,
        bubble_chunk_time_s=chunk_time,
        bubble_n=n_bubble,
        bubble_extra_interleaving=extra,
        bubble_imbalance_correction_s=correction,
        critical_stage=critical,
        memory_weights=worst([x.weights for x in at]),
        memory_gradients=worst([x.gradients for x in at]),
        memory_optimizer_states=worst([x.optimizer for x in at]),
        memory_optimizer_step_copy=worst([x.step_copy for x in at]),
        memory_activations=worst([x.activations for x in at]),
        memory_other=worst([x.other for x in at]),
        memory_total=worst([x.total for x in at]),
        memory_transient=worst([x.transient for x in at]),
        memory_workspace=worst([x.workspace for x in at]),
        memory_allocator_reserve=worst([x.allocator_reserve for x in at]),
        memory_cuda_context=worst([x.cuda_context for x in at]),
        memory_nccl_buffers=worst([x.nccl_buffers for x in at]),
        memory_allocated_peak=worst([x[0] for x in peaks]),
        memory_allocator_reserved_peak=worst([x[1] for x in peaks]),
        memory_reserved_peak=worst([x[2] for x in peaks]),
        memory_peak=worst([x.peak for x in at]),
        memory_capacity=int(system.accelerator.hbm.capacity_bytes),
        memory_stage=worst([rep.index for rep in layout.stages]),
        dp_grad_bytes=grads_bytes,
        dp_param_gather_bytes=dp_gather_bytes,
        dp_link_s=dp_link,
        dp_exposed_s=dp_exposed,
        dp_sm_contention_s=dp_contention,
        optimizer_parameters=owned,
        optimizer_flops=optimizer_flops,
        optimizer_bytes_moved=optimizer_moved,
        flops_convention=flops_convention,
        model_flops_per_iteration=model_flops_per_iteration(
            model, table.global_batch_size, flops_convention
        ),
        hardware_flops_key=inverse_f,
        hardware_flops_values=hardware_values,
        peak_flops_per_gpu=peak,
        tokens_per_iteration=table.global_batch_size * model.seq_length,
        world_size=t * cp * p * d,
        microbatch_count=m,
    )
