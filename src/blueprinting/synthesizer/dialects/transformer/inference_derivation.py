"""Pattern-matching derivation of the local inference plan (seed: "inference mapping contract").

The inference strategy is destructured with the seed's nested class pattern; each sum-typed field
(communication, schedule) is matched on its own, so a new variant fails the exhaustive-match gate
here until it is mapped. Training-only constructs are refused with an error that names them:

* a training pipeline schedule (1F1B, interleaved 1F1B, ZB-H1): inference has no backward pass,
  its static pipeline is :class:`ForwardOnly` (p > 1) or :class:`SingleStage` (p = 1);
* :class:`DataParallel` in the replicas slot (only reachable by bypassing the type checker):
  independent serving replicas synchronize no gradients, so they are :class:`ReplicaParallel`.

The remaining laws are :func:`blueprinting.mapping.laws.check_inference`'s, all reported at once.

Public API:

- :class:`LocalInferencePlan`: tp, pp, replicas, stage block counts, the workload; its
  :meth:`~LocalInferencePlan.prefill` and :meth:`~LocalInferencePlan.decode` give the
  :class:`~blueprinting.synthesizer.dialects.transformer.inference.InferenceStepWork` of a step.
- :func:`derive_inference_plan(model, mapping, *, megatron=True) -> LocalInferencePlan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_never, final

from blueprinting.analysis.stage_layout import stage_layer_counts
from blueprinting.errors import InvalidStrategyError, LawViolation
from blueprinting.mapping.laws import check_inference
from blueprinting.mapping.model import Datatype, TransformerModelSpec
from blueprinting.mapping.transformer import (
    AllReduce,
    CombinedOneForwardOneBackward,
    DataParallel,
    DualPipe,
    DualPipeV,
    ForwardOnly,
    InferenceWorkload,
    InterleavedOneForwardOneBackward,
    OneForwardOneBackward,
    PipelineParallel,
    PipelineSchedule,
    ReduceScatterAllGather,
    ReplicaParallel,
    SingleStage,
    TensorCommunication,
    TensorParallel,
    TransformerInferenceMappingSpec,
    TransformerInferenceParallelism,
    ZeroBubbleH1,
)
from blueprinting.synthesizer.dialects.transformer.inference import (
    InferenceStepDims,
    InferenceStepWork,
    inference_step_work,
)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LocalInferencePlan:
    """What one GPU of a replica runs: its TP block and the pipeline layout of the replica."""

    model: TransformerModelSpec
    tp: int
    pp: int
    replicas: int
    sequence_parallel: bool
    workload: InferenceWorkload
    stage_blocks: tuple[int, ...]
    strategy: str
    #: expert parallelism over the TP group (1 for a dense model)
    ep: int = 1
    #: MoE layers among each stage's blocks (all 0 for a dense model)
    stage_moe_blocks: tuple[int, ...] = ()

    @property
    def expert_tensor_degree(self) -> int:
        return max(1, self.tp // self.ep)

    def moe_blocks(self, stage: int) -> int:
        return self.stage_moe_blocks[stage] if self.stage_moe_blocks else 0

    def windowed_blocks(self, stage: int) -> int:
        """Sliding-window layers among stage ``stage``'s (0 when no layer is windowed)."""
        first = sum(self.stage_blocks[:stage])
        return self.model.windowed_layers_in(first, self.stage_blocks[stage])

    def prefill(self, batch: int) -> InferenceStepWork:
        """``batch`` sequences of ``prompt_length`` tokens, empty cache."""
        dims = InferenceStepDims(
            batch=batch, new_tokens=self.workload.prompt_length, cached_tokens=0
        )
        return self._step(dims)

    def decode(self, batch: int, cached_tokens: int) -> InferenceStepWork:
        """One new token per sequence on ``cached_tokens`` cached ones."""
        dims = InferenceStepDims(batch=batch, new_tokens=1, cached_tokens=cached_tokens)
        return self._step(dims)

    def _step(self, dims: InferenceStepDims) -> InferenceStepWork:
        kv = self.workload.kv_cache_datatype
        key = (self.model, dims, self.tp, self.sequence_parallel, kv, self.ep)
        found = _STEPS.get(key)
        if found is None:
            found = inference_step_work(
                self.model,
                dims,
                tp=self.tp,
                sequence_parallel=self.sequence_parallel,
                kv_datatype=kv,
                ep=self.ep,
            )
            if len(_STEPS) >= _MAX_STEPS:
                _STEPS.clear()
            _STEPS[key] = found
        return found


_STEPS: dict[
    tuple[TransformerModelSpec, InferenceStepDims, int, bool, Datatype, int], InferenceStepWork
] = {}
"""The steps derived so far (a pure function of the key): a search derives the same prefill
and decode steps for every pipeline depth and replica count of a (t, ep, batch)."""
_MAX_STEPS = 4096


def _stage_moe_blocks(
    model: TransformerModelSpec, stage_blocks: tuple[int, ...]
) -> tuple[int, ...]:
    """The MoE layers of each stage: stage s holds the consecutive layers after those of the
    stages before it."""
    out = []
    first = 0
    for blocks in stage_blocks:
        out.append(model.moe_layers_in(first, blocks))
        first += blocks
    return tuple(out)


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
        case SingleStage() | ForwardOnly():
            return []
        case (
            OneForwardOneBackward()
            | InterleavedOneForwardOneBackward()
            | CombinedOneForwardOneBackward()
            | ZeroBubbleH1()
            | DualPipe()
            | DualPipeV()
        ):
            return [
                LawViolation(
                    law="inference_schedule",
                    formula="schedule in {SingleStage, ForwardOnly}",
                    values=(("schedule", str(schedule)),),
                    message=f"{type(schedule).__name__} ({schedule}) is a training schedule; "
                    "inference runs the static ForwardOnly pipeline (no backward pass)",
                )
            ]
        case _ as unreachable:
            assert_never(unreachable)


def _replica_violations(replicas: object) -> list[LawViolation]:
    """``replicas`` is typed ReplicaParallel; a DataParallel here only arrives by bypassing the
    type checker, and would mislabel serving replicas as gradient-synchronizing ranks."""
    if isinstance(replicas, ReplicaParallel):
        return []
    name = type(replicas).__name__
    hint = (
        "; DataParallel synchronizes gradients, serving replicas are ReplicaParallel"
        if isinstance(replicas, DataParallel)
        else ""
    )
    return [
        LawViolation(
            law="inference_replicas",
            formula="replicas is ReplicaParallel",
            values=(("replicas", str(replicas)),),
            message=f"{name} is not an inference replica dimension{hint}",
        )
    ]


def derive_inference_plan(
    model: TransformerModelSpec,
    mapping: TransformerInferenceMappingSpec,
    *,
    megatron: bool = True,
) -> LocalInferencePlan:
    """Map the inference strategy's variants to the local plan; raise
    :class:`InvalidStrategyError` listing every violated law (training constructs first)."""
    match mapping.parallelism:
        case TransformerInferenceParallelism(
            tensor=TensorParallel(degree=tp, communication=communication),
            pipeline=PipelineParallel(degree=pp, schedule=schedule) as pipeline,
            replicas=replicas,
        ):
            violations = _schedule_violations(schedule)
            violations.extend(_replica_violations(replicas))
            if violations:
                # The remaining laws presume an inference schedule: report these first.
                raise InvalidStrategyError(violations, subject=f"inference plan of {model.name}")
            laws = check_inference(model, mapping, megatron=megatron)
            if laws:
                raise InvalidStrategyError(laws, subject=f"{model.name}: {mapping}")
            stage_blocks = stage_layer_counts(model, pipeline)
            return LocalInferencePlan(
                model=model,
                tp=tp,
                pp=pp,
                replicas=replicas.degree,
                sequence_parallel=_sequence_parallel(communication),
                workload=mapping.workload,
                stage_blocks=stage_blocks,
                strategy=str(mapping.parallelism),
                ep=mapping.expert_degree,
                stage_moe_blocks=_stage_moe_blocks(model, stage_blocks),
            )
        case _ as unreachable:
            assert_never(unreachable)
