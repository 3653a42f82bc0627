"""The laws of the expert grid: Megatron's MoE parallel folding and its dispatcher rules.

Reported with every other law by :func:`blueprinting.mapping.laws.check_training`. Sources: the
shared reference ``modern_parallelism.md`` sections 2.2 (layout rules), 2.4 (overlap
constraints) and 2.12 (MoE start-up rules), which cite Megatron-LM @d98e8a64.

The world stays the dense grid ``N = t * cp * p * d``; within each pipeline stage the same
``N / p`` ranks run the routed experts as ``etp * ep * expert_dp`` (``parallel_state.py``
l.858-906). Planner laws (the analysis divides by these):

- ``expert_parallel_needs_moe``: ep > 1 or etp > 1 on a dense model (Megatron-LM
  ``arguments.py`` l.1655-1658 asserts the experts are set when ep > 1; an etp it would ignore is
  refused, never dropped);
- ``expert_world_size``: ``N mod (etp * ep * p) == 0`` (``parallel_state.py`` l.874-884), which
  is the same statement as ``etp * ep * expert_dp == t * cp * d`` per stage with an integral
  expert_dp; :func:`blueprinting.mapping.flat_keys.from_mapping` checks it on the given world
  size when d is not integral;
- ``experts_per_expert_rank``: ``num_experts mod ep == 0`` (``arguments.py`` l.1655-1658,
  ``moe_layer.py`` l.184-187);
- ``expert_ffn_per_expert_tensor_rank``: ``moe_ffn_hidden_size mod etp == 0`` (implicit in
  Megatron: ``moe/experts.py`` l.210-238 splits each expert's columns over ETP; the fused SwiGLU
  FC1 of 2F columns then splits too);
- ``shared_expert_ffn_per_tensor_rank``: the shared experts use the dense TP group
  (``moe/shared_experts.py`` l.127-131), so their total width splits over t;
- ``moe_tp_needs_sequence_parallel``: the MoE block is modelled with sequence parallelism
  whenever t > 1 (the derivation refuses the other layout; Megatron-LM warns without it,
  ``model_parallel_config.py`` l.560-565), so the checker reports it with the others.

Megatron-LM rules (``transformer_config.py`` unless named):

- ``expert_tensor_parallel_without_bias``: linear biases need etp = 1 (l.2612-2615);
- ``expert_parallel_needs_sequence_parallel``: ep > 1 and t > 1 need sequence parallelism.
  Megatron-LM at d98e8a64 only warns ("sequence parallelism must be used",
  ``model_parallel_config.py`` l.560-565; earlier releases raised it and its own tests skip the
  combination). Blueprinting has no warning channel: a warning Megatron prints for a layout its
  developers do not run is a refusal of the Megatron rule set (``--no-megatron-rules`` drops it);
- ``flex_dispatcher_needs_expert_grid``: flex needs etp * ep > 1 (``token_dispatcher.py``
  l.1836, 1854);
- ``flex_dispatcher_no_pad_to_capacity``: flex refuses padding to capacity (l.1868-1881);
- ``ep_overlap_*``: ``--overlap-moe-expert-parallel-comm`` needs ep > 1, an interleaved schedule
  when p > 1, no full recompute and no ``moe`` recompute module, at most one MTP layer and a
  16-bit base (l.3002-3071); that it needs alltoall or flex is the ADT's shape (only those
  dispatchers carry it) and ``from_mapping``'s refusal of the key beside allgather;
- ``shared_expert_overlap``: ``--moe-shared-expert-overlap`` needs shared experts, excludes the
  EP overlap (l.3039-3041) and the ``shared_experts`` recompute module (l.1991-1997);
- ``moe_act_recompute_needs_grouped_gemm``: the ``moe_act`` recompute module needs the grouped
  GEMM (l.1940-2025).

Not checked, and why: ``--moe-grouped-gemm`` needs compute capability >= 8.0 (``arguments.py``
l.1378-1380), but the accelerator description carries no compute capability (every preset is
SM 8.0 or newer, or an AMD part whose TE build has grouped GEMMs); the distributed optimizer
instances rule (``parallel_state.py`` l.922-926) needs ``num_distributed_optimizer_instances``,
which is always 1 here; the rank-order rule ``D_e == d`` (l.898-902) needs an order not ending in
pp, and the order is always Megatron's default ``tp-cp-ep-dp-pp``; the torch FSDP2 rule (ep == 1,
``arguments.py`` l.1034-1037) needs ``--use-torch-fsdp2``, which is not a key (the ZeRO-2/3
variants run Megatron-FSDP, which supports EP since v0.15); the capacity-factor rules of section
2.12 read only the model, except flex with padding (above).
"""

from __future__ import annotations

from typing import assert_never

from blueprinting.errors import LawViolation
from blueprinting.mapping.law_names import Law, law_violation
from blueprinting.mapping.model import CapacityFactor, Datatype, Dropless, TransformerModelSpec
from blueprinting.mapping.transformer import (
    AllGatherDispatcher,
    AllToAllDispatcher,
    CombinedOneForwardOneBackward,
    DualPipe,
    DualPipeV,
    FlexDispatcher,
    ForwardOnly,
    FullRecompute,
    InterleavedOneForwardOneBackward,
    OneForwardOneBackward,
    PipelineSchedule,
    RecomputeModule,
    SingleStage,
    TransformerTrainingMappingSpec,
    ZeroBubbleH1,
    delays_wgrad,
    dispatcher_overlaps,
    recomputed_modules,
    shared_expert_overlaps,
)


def expert_world_violation(world: int, etp: int, ep: int, p: int) -> LawViolation | None:
    """``expert_world_size`` on a world size: None when ``etp * ep * p`` divides it."""
    grid = etp * ep * p
    if world % grid == 0:
        return None
    return law_violation(
        Law.EXPERT_WORLD_SIZE,
        f"world_size = {world} is not divisible by etp * ep * p = {etp} * {ep} * {p} = {grid} "
        '(Megatron-LM parallel_state.py l.874-884: "not divisible by '
        'expert_tensor_model_pipeline_parallel size"): the expert grid etp x ep x expert-dp '
        "does not tile the ranks of a pipeline stage",
        world_size=world,
        etp=etp,
        ep=ep,
        p=p,
    )


def _interleaved(schedule: PipelineSchedule) -> bool:
    """Whether Megatron's virtual pipeline is set (``virtual_pipeline_model_parallel_size``)."""
    match schedule:
        case InterleavedOneForwardOneBackward():
            return True
        case CombinedOneForwardOneBackward(virtual_stages=v):
            return v > 1
        case (
            SingleStage()
            | OneForwardOneBackward()
            | ForwardOnly()
            | ZeroBubbleH1()
            | DualPipe()
            | DualPipeV()
        ):
            return False
        case _ as unreachable:
            assert_never(unreachable)


def _ep_overlap_laws(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec
) -> list[LawViolation]:
    """The rules of ``--overlap-moe-expert-parallel-comm`` (module docstring)."""
    ep = mapping.expert_degree
    p = mapping.pipeline_degree
    recompute = mapping.parallelism.recompute
    out: list[LawViolation] = []
    if ep == 1:
        out.append(
            law_violation(
                Law.MEGATRON_EP_OVERLAP_NEEDS_EP,
                "overlap_moe_expert_parallel_comm needs expert_model_parallel_size > 1, got 1 "
                "(transformer_config.py l.3002-3071): there is no all-to-all to hide",
                ep=ep,
            )
        )
    if p > 1 and not _interleaved(mapping.parallelism.pipeline.schedule):
        out.append(
            law_violation(
                Law.MEGATRON_EP_OVERLAP_NEEDS_VIRTUAL_PIPELINE,
                f"overlap_moe_expert_parallel_comm with p = {p} needs the interleaved schedule "
                f"(a virtual pipeline size), got {mapping.parallelism.pipeline.schedule} "
                "(transformer_config.py l.3002-3071)",
                p=p,
                schedule=str(mapping.parallelism.pipeline.schedule),
            )
        )
    if isinstance(recompute, FullRecompute) or RecomputeModule.MOE in recomputed_modules(recompute):
        out.append(
            law_violation(
                Law.MEGATRON_EP_OVERLAP_RECOMPUTE,
                f"overlap_moe_expert_parallel_comm refuses recompute = {recompute} (full "
                "recompute and the moe recompute module re-run the layer it splits; "
                "transformer_config.py l.3002-3071)",
                recompute=str(recompute),
            )
        )
    if model.mtp_num_layers > 1:
        out.append(
            law_violation(
                Law.MEGATRON_EP_OVERLAP_MTP,
                "overlap_moe_expert_parallel_comm takes at most 1 multi-token-prediction layer, "
                f"got mtp_num_layers = {model.mtp_num_layers} (transformer_config.py "
                "l.3002-3071)",
                mtp_num_layers=model.mtp_num_layers,
            )
        )
    if model.datatype is Datatype.FP32:
        out.append(
            law_violation(
                Law.MEGATRON_EP_OVERLAP_DATATYPE,
                "overlap_moe_expert_parallel_comm needs bf16 or fp16, got float32 "
                "(transformer_config.py l.3002-3071)",
                datatype=model.datatype.value,
            )
        )
    return out


def _shared_overlap_laws(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec, shared_width: int
) -> list[LawViolation]:
    dispatcher = mapping.parallelism.experts.dispatcher
    reasons: list[str] = []
    if shared_width == 0:
        reasons.append(f"model {model.name!r} has no shared experts")
    if dispatcher_overlaps(dispatcher):
        reasons.append(
            "it excludes overlap_moe_expert_parallel_comm (transformer_config.py l.3039-3041)"
        )
    if RecomputeModule.SHARED_EXPERTS in recomputed_modules(mapping.parallelism.recompute):
        reasons.append(
            "it excludes the shared_experts recompute module (transformer_config.py l.1991-1997)"
        )
    if not reasons:
        return []
    return [
        law_violation(
            Law.MEGATRON_SHARED_EXPERT_OVERLAP,
            "moe_shared_expert_overlap = true: " + "; ".join(reasons),
            shared_expert_width=shared_width,
            ep_overlap=dispatcher_overlaps(dispatcher),
        )
    ]


def expert_laws(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec
) -> list[LawViolation]:
    """Every violated law of the expert grid, planner and Megatron-LM (the caller keeps the
    rule sets it checks)."""
    experts = mapping.parallelism.experts
    ep, etp = experts.degree, experts.tensor_degree
    t = mapping.tensor_degree
    moe = model.moe
    if moe is None:
        if ep == 1 and etp == 1:
            return []
        return [
            law_violation(
                Law.EXPERT_PARALLEL_NEEDS_MOE,
                f"expert_model_parallel_size = {ep} and expert_tensor_parallel_size = {etp} "
                f"need a mixture-of-experts model; {model.name!r} has dense feed-forward "
                "layers (Megatron-LM arguments.py l.1655-1658: the experts must be set for "
                "ep > 1)",
                ep=ep,
                etp=etp,
            )
        ]
    out: list[LawViolation] = []
    world = expert_world_violation(mapping.world_size, etp, ep, mapping.pipeline_degree)
    if world is not None:
        out.append(world)
    if moe.num_experts % ep != 0:
        out.append(
            law_violation(
                Law.EXPERTS_PER_EXPERT_RANK,
                f"num_experts = {moe.num_experts} is not divisible by expert_model_parallel_size "
                f"= {ep}: an expert rank would hold {moe.num_experts / ep:g} experts "
                "(Megatron-LM arguments.py l.1655-1658, moe_layer.py l.184-187)",
                num_experts=moe.num_experts,
                ep=ep,
            )
        )
    ffn = moe.expert_ffn_hidden_size
    if ffn % etp != 0:
        out.append(
            law_violation(
                Law.EXPERT_FFN_DIVISIBILITY,
                f"moe_ffn_hidden_size = {ffn} does not split over expert_tensor_parallel_size = "
                f"{etp} ranks (each expert's columns are partitioned over ETP, moe/experts.py "
                "l.210-238; Megatron-LM does not check it at start-up)",
                moe_ffn_hidden_size=ffn,
                etp=etp,
            )
        )
    shared = moe.shared_expert_ffn_hidden_size
    if shared % t != 0:
        out.append(
            law_violation(
                Law.SHARED_EXPERT_FFN_DIVISIBILITY,
                f"moe_shared_expert_intermediate_size = {shared} does not split over t = {t} "
                "ranks (the shared experts use the dense TP group, moe/shared_experts.py "
                "l.127-131)",
                moe_shared_expert_intermediate_size=shared,
                t=t,
            )
        )
    if t > 1 and not mapping.sequence_parallel:
        out.append(
            law_violation(
                Law.MOE_TP_NEEDS_SEQUENCE_PARALLEL,
                f"MoE layers with t = {t} are modelled with sequence parallelism only "
                "(Megatron-LM warns without it: model_parallel_config.py l.560-565)",
                t=t,
                sequence_parallel=False,
            )
        )
    if etp > 1 and model.add_bias_linear:
        out.append(
            law_violation(
                Law.MEGATRON_EXPERT_TENSOR_WITHOUT_BIAS,
                f"routed experts with add_bias_linear = true need expert_tensor_parallel_size = "
                f"1, got {etp} (transformer_config.py l.2612-2615)",
                etp=etp,
                add_bias_linear=True,
            )
        )
    if ep > 1 and t > 1 and not mapping.sequence_parallel:
        out.append(
            law_violation(
                Law.MEGATRON_EP_NEEDS_SEQUENCE_PARALLEL,
                f"expert_model_parallel_size = {ep} with t = {t} needs sequence_parallel: "
                'Megatron-LM warns "sequence parallelism must be used" (model_parallel_config.py '
                "l.560-565; earlier releases refused it), Blueprinting refuses it under the "
                "Megatron rule set",
                ep=ep,
                t=t,
                sequence_parallel=False,
            )
        )
    dispatcher = experts.dispatcher
    match dispatcher:
        case FlexDispatcher(backend=backend):
            if etp * ep == 1:
                out.append(
                    law_violation(
                        Law.MEGATRON_FLEX_NEEDS_EXPERT_GRID,
                        f"moe_token_dispatcher_type = flex ({backend}) needs etp * ep > 1, got "
                        f'{etp} * {ep} (token_dispatcher.py l.1836, 1854: "Flex token '
                        'dispatcher requires TPxEP > 1")',
                        etp=etp,
                        ep=ep,
                    )
                )
            match moe.dropping:
                case CapacityFactor(pad_to_capacity=True):
                    out.append(
                        law_violation(
                            Law.MEGATRON_FLEX_NO_PAD_TO_CAPACITY,
                            "moe_token_dispatcher_type = flex does not support "
                            "moe_pad_expert_input_to_capacity (transformer_config.py "
                            "l.1868-1881)",
                            moe_pad_expert_input_to_capacity=True,
                        )
                    )
                case CapacityFactor() | Dropless():
                    pass
                case _ as unreachable_dropping:
                    assert_never(unreachable_dropping)
        case AllToAllDispatcher() | AllGatherDispatcher():
            pass
        case _ as unreachable:
            assert_never(unreachable)
    if dispatcher_overlaps(dispatcher):
        out.extend(_ep_overlap_laws(model, mapping))
    if delays_wgrad(dispatcher) and not dispatcher_overlaps(dispatcher):
        out.append(
            law_violation(
                Law.MEGATRON_DELAY_WGRAD_NEEDS_EP_OVERLAP,
                "delay_wgrad_compute needs overlap_moe_expert_parallel_comm (transformer_config.py "
                "l.3073-3077 @d98e8a64: the weight gradients it delays fill the combined-1F1B "
                f"all-to-all wait), got dispatcher {dispatcher}",
                dispatcher=str(dispatcher),
            )
        )
    schedule = mapping.parallelism.pipeline.schedule
    if isinstance(schedule, CombinedOneForwardOneBackward) != dispatcher_overlaps(dispatcher):
        out.append(
            law_violation(
                Law.COMBINED_SCHEDULE_MATCHES_DISPATCHER,
                f"schedule {schedule} with dispatcher {dispatcher}: Megatron runs combined 1F1B "
                "exactly when overlap_moe_expert_parallel_comm is on (schedules.py l.1485)",
                schedule=str(schedule),
                dispatcher=str(dispatcher),
            )
        )
    if shared_expert_overlaps(dispatcher):
        out.extend(_shared_overlap_laws(model, mapping, shared))
    if (
        RecomputeModule.MOE_ACT in recomputed_modules(mapping.parallelism.recompute)
        and not experts.grouped_gemm
    ):
        out.append(
            law_violation(
                Law.MEGATRON_MOE_ACT_RECOMPUTE,
                "recompute module moe_act needs moe_grouped_gemm = true (transformer_config.py "
                "l.1940-2025)",
                moe_grouped_gemm=False,
            )
        )
    return out
