"""Pattern-matching derivation of the local TP block (seed: "Algebraic data model").

The strategy is destructured with the seed's nested class pattern, then each sum-typed field
(communication, schedule, recompute) is matched on its own, so adding a variant makes this module
fail the mypy exhaustive-match gate until it is mapped.

Public API:

- :func:`derive_block_plan(model, mapping) -> LocalBlockPlan`: the local plan (tp degree,
  sequence parallelism, recompute scope). Raises
  :class:`~blueprinting.errors.InvalidStrategyError` listing every violated divisibility law the
  block needs (t | heads, t | query groups, t | ffn, t | padded vocab, t | s under sequence
  parallelism) and for a forward-only schedule in a training mapping; it never repairs.
- :func:`derive_training_block(model, mapping) -> DistributedTaskIR`: lower + verify. The IR
  holds ``block``, ``first_stage`` (embedding) and ``last_stage`` (final norm, LM head,
  cross-entropy) task groups; see :mod:`blueprinting.synthesizer.stages.distributed.ir`.
"""

from __future__ import annotations

from typing import assert_never

from blueprinting.errors import InvalidStrategyError, LawViolation
from blueprinting.mapping.model import TransformerModelSpec
from blueprinting.mapping.transformer import (
    DEFAULT_RECOMPUTE_MODULES,
    AllReduce,
    CombinedOneForwardOneBackward,
    DataParallel,
    DualPipe,
    DualPipeV,
    ExpertParallel,
    ForwardOnly,
    FullRecompute,
    InterleavedOneForwardOneBackward,
    NoRecompute,
    OneForwardOneBackward,
    PipelineParallel,
    PipelineSchedule,
    RecomputePolicy,
    ReduceScatterAllGather,
    SelectiveRecompute,
    SingleStage,
    TensorCommunication,
    TensorParallel,
    TransformerTrainingMappingSpec,
    TransformerTrainingParallelism,
    UnfusedAttention,
    ZeroBubbleH1,
)
from blueprinting.synthesizer.dialects.transformer.training import (
    LocalBlockPlan,
    RecomputeScope,
    eager_passes,
)
from blueprinting.synthesizer.stages.distributed.ir import DistributedTaskIR
from blueprinting.synthesizer.stages.distributed.passes import (
    LowerToDistributedTasks,
    PassContext,
    VerifyDistributedTasks,
)


def _divides(
    law: str, tp: int, name: str, value: int, *, by: str = "tensor_degree"
) -> LawViolation | None:
    if value % tp == 0:
        return None
    return LawViolation(
        law=law,
        formula=f"{name} mod {by} = 0",
        values=((name, value), (by, tp)),
        message=f"{name}={value} is not divisible by {by}={tp}",
    )


def _block_laws(
    model: TransformerModelSpec, tp: int, *, sequence_parallel: bool, cp: int = 1
) -> list[LawViolation]:
    """The divisibility the local block needs (Shoeybi et al. 2019, Section 3; Korthikanti et
    al. 2022, Section 4.2.2 for s mod t; the load-balanced cp split's 2cp chunks)."""
    checks = [
        _divides("tp_divides_heads", tp, "num_attention_heads", model.num_attention_heads),
        _divides("tp_divides_query_groups", tp, "num_query_groups", model.num_query_groups),
        _divides("tp_divides_ffn", tp, "ffn_hidden_size", model.ffn_hidden_size),
        _divides("tp_divides_padded_vocab", tp, "padded_vocab_size", model.padded_vocab_size),
    ]
    if sequence_parallel:
        checks.append(
            _divides("sequence_parallel_divides_sequence", tp * cp, "seq_length", model.seq_length)
        )
    if cp > 1:
        checks.append(_divides("cp_splits_sequence", 2 * cp, "seq_length", model.seq_length))
    return [c for c in checks if c is not None]


def _expert_block_laws(
    model: TransformerModelSpec, experts: ExpertParallel, tp: int, sequence_parallel: bool
) -> list[LawViolation]:
    """What the MoE layer's local work needs (the full MoE law set is in mapping/laws.py):
    E % ep == 0 and etp | F for integral local experts and widths, and sequence parallelism
    when t > 1 (Megatron warns without it; the routed path here is modelled on the rank's
    s/(t cp) tokens only)."""
    moe = model.moe
    if moe is None:
        return []
    checks = [
        _divides(
            "experts_divisible_by_ep",
            experts.degree,
            "num_experts",
            moe.num_experts,
            by="expert_model_parallel_size",
        ),
        _divides(
            "etp_divides_expert_ffn",
            experts.tensor_degree,
            "moe_ffn_hidden_size",
            moe.expert_ffn_hidden_size,
            by="expert_tensor_parallel_size",
        ),
    ]
    if moe.shared_expert_ffn_hidden_size:
        checks.append(
            _divides(
                "tp_divides_shared_expert_ffn",
                tp,
                "moe_shared_expert_intermediate_size",
                moe.shared_expert_ffn_hidden_size,
            )
        )
    out = [c for c in checks if c is not None]
    if tp > 1 and not sequence_parallel:
        out.append(
            LawViolation(
                law="moe_tp_needs_sequence_parallel",
                formula="MoE and t > 1 => sequence_parallel",
                values=(("tensor_model_parallel_size", tp),),
                message=(
                    "MoE layers with tensor parallelism are modelled with sequence parallelism "
                    "(Megatron-LM warns without it: model_parallel_config.py l.560-565)"
                ),
            )
        )
    return out


def derive_block_plan(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec
) -> LocalBlockPlan:
    """Map the strategy's variants to the local block plan."""
    match mapping.parallelism:
        case TransformerTrainingParallelism(
            tensor=TensorParallel(degree=tp, communication=communication),
            pipeline=PipelineParallel(degree=pp, schedule=schedule),
            data=DataParallel(degree=dp),
            recompute=recompute,
            context=context,
            experts=experts,
        ):
            # pp and dp do not change the local block: every stage and replica runs it
            del pp, dp
            sequence_parallel = _sequence_parallel(communication)
            violations = _schedule_violations(schedule)
            violations.extend(
                _block_laws(model, tp, sequence_parallel=sequence_parallel, cp=context.degree)
            )
            if context.degree > 1 and isinstance(mapping.attention, UnfusedAttention):
                violations.append(
                    LawViolation(
                        law="cp_needs_fused_attention",
                        formula="cp > 1 => fused attention",
                        values=(("cp", context.degree),),
                        message="the cp exchanges are modelled for the fused attention kernel",
                    )
                )
            violations.extend(_expert_block_laws(model, experts, tp, sequence_parallel))
            if violations:
                raise InvalidStrategyError(violations, subject=f"local TP block of {model.name}")
            return LocalBlockPlan(
                model=model,
                micro_batch=mapping.batch.micro_batch_size,
                tp=tp,
                sequence_parallel=sequence_parallel,
                recompute=_recompute_scope(recompute),
                strategy=str(mapping.parallelism),
                attention=mapping.attention,
                context=context,
                experts=experts,
                eager=eager_passes(model, mapping.fusions),
                cross_entropy=mapping.fusions.cross_entropy,
                recompute_modules=(
                    recompute.modules
                    if isinstance(recompute, SelectiveRecompute)
                    else DEFAULT_RECOMPUTE_MODULES
                ),
            )
        case _ as unreachable:
            assert_never(unreachable)


def _sequence_parallel(communication: TensorCommunication) -> bool:
    match communication:
        case AllReduce():
            return False
        case ReduceScatterAllGather():
            return True
        case _ as unreachable:
            assert_never(unreachable)


def _schedule_violations(schedule: PipelineSchedule) -> list[LawViolation]:
    match schedule:
        case (
            SingleStage()
            | OneForwardOneBackward()
            | InterleavedOneForwardOneBackward()
            | CombinedOneForwardOneBackward()
            | ZeroBubbleH1()
            | DualPipe()
            | DualPipeV()
        ):
            return []  # training schedules: the block's work does not depend on them
        case ForwardOnly():
            return [
                LawViolation(
                    law="training_schedule",
                    formula="schedule in {SingleStage, 1F1B, interleaved 1F1B}",
                    values=(("schedule", str(schedule)),),
                    message="ForwardOnly is an inference schedule; a training block needs a "
                    "backward pass",
                )
            ]
        case _ as unreachable:
            assert_never(unreachable)


def _recompute_scope(recompute: RecomputePolicy) -> RecomputeScope:
    """Selective recompute re-runs the attention core, full recompute the whole block with its
    TP collectives (Korthikanti et al. 2022, Section 5)."""
    match recompute:
        case NoRecompute():
            return RecomputeScope.NONE
        case SelectiveRecompute():
            return RecomputeScope.SELECTIVE
        case FullRecompute():
            return RecomputeScope.WHOLE_BLOCK
        case _ as unreachable:
            assert_never(unreachable)


def derive_training_block(
    model: TransformerModelSpec,
    mapping: TransformerTrainingMappingSpec,
    ctx: PassContext | None = None,
) -> DistributedTaskIR:
    """Derive, lower and verify the local TP block with its first/last-stage extras."""
    context = ctx if ctx is not None else PassContext()
    plan = derive_block_plan(model, mapping)
    ir = LowerToDistributedTasks().run(plan, context)
    return VerifyDistributedTasks().run(ir, context)
