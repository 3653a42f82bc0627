"""Search over serving strategies: (t, ep, p, replicas, batch) on a fixed number of GPUs.

Candidates: ``t`` in the divisors of the GPUs per node (TP stays inside a node, where the
all-reduces of every block are affordable; Narayanan et al. 2021, Section 3.2, takeaway #1),
``p`` in the divisors of the layer count with ``t * p`` dividing the GPU count, ``replicas =
gpus / (t p)``, ``ep`` (MoE models only; 1 otherwise) in the divisors of ``t`` that divide the
number of experts (the serving layout splits the experts over the TP group), and ``batch`` in
the powers of two up to the largest batch that fits (plus that largest batch itself).
Strategies that break a law are skipped, never repaired. A latency target
keeps the candidates whose mean decode latency per token is at most the target.

Objectives: ``throughput`` ranks by deployment tokens/s (higher first), ``latency`` by mean decode
latency per token (lower first); ties go to the fewer GPUs per replica, then the smaller batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import assert_never, final

from blueprinting.errors import ConfigError, InvalidStrategyError
from blueprinting.hardware.system import SystemSpec
from blueprinting.inference.analysis import AttentionCache, InferenceReport, analyze_inference
from blueprinting.inference.memory import max_batch_that_fits
from blueprinting.mapping.transformer import (
    InferenceSpec,
    PipelineParallel,
    ReplicaParallel,
    ServingExpertParallel,
    TensorParallel,
    TransformerInferenceMappingSpec,
    TransformerInferenceParallelism,
    divisors,
    inference_schedule,
)
from blueprinting.synthesizer.dialects.transformer.inference_derivation import (
    derive_inference_plan,
)


class Objective(StrEnum):
    THROUGHPUT = "throughput"
    LATENCY = "latency"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SearchOptions:
    objective: Objective = Objective.THROUGHPUT
    latency_target_s: float | None = None
    top: int = 10
    megatron: bool = True

    def __post_init__(self) -> None:
        problems = []
        if self.latency_target_s is not None and not self.latency_target_s > 0:
            problems.append(f"latency target must be > 0 s, got {self.latency_target_s!r}")
        if self.top < 1:
            problems.append(f"top must be >= 1, got {self.top!r}")
        if problems:
            raise ConfigError(problems)


def _batches(largest: int) -> list[int]:
    """Powers of two up to ``largest``, and ``largest`` itself; none when nothing fits."""
    if largest < 1:
        return []
    out = []
    batch = 1
    while batch <= largest:
        out.append(batch)
        batch *= 2
    if largest not in out:
        out.append(largest)
    return out


def _with(
    spec: InferenceSpec, *, t: int, p: int, replicas: int, batch: int, ep: int = 1
) -> InferenceSpec:
    parallelism = TransformerInferenceParallelism(
        tensor=TensorParallel(
            degree=t, communication=spec.mapping.parallelism.tensor.communication
        ),
        pipeline=PipelineParallel(degree=p, schedule=inference_schedule(p)),
        replicas=ReplicaParallel(degree=replicas),
        experts=ServingExpertParallel(degree=ep),
    )
    workload = replace(spec.mapping.workload, batch_size=batch)
    return InferenceSpec(
        model=spec.model,
        mapping=TransformerInferenceMappingSpec(parallelism=parallelism, workload=workload),
    )


def expert_degrees(spec: InferenceSpec, t: int) -> list[int]:
    """The ep a t-wide TP group can serve: divisors of t that divide the experts (MoE only)."""
    moe = spec.model.moe
    if moe is None:
        return [1]
    return [ep for ep in divisors(t) if moe.num_experts % ep == 0]


def _key(report: InferenceReport, objective: Objective) -> tuple[float, int, int, int]:
    # at equal figures, the smaller ep (fewer expert ranks to balance) comes first
    tie = (
        report.gpus_per_replica,
        report.spec.mapping.workload.batch_size,
        report.spec.mapping.expert_degree,
    )
    match objective:
        case Objective.THROUGHPUT:
            return (-report.tokens_per_second, *tie)
        case Objective.LATENCY:
            return (report.decode_round_mean_s, *tie)
        case _ as unreachable:
            assert_never(unreachable)


def search_layouts(spec: InferenceSpec, system: SystemSpec) -> list[tuple[int, int, int]]:
    """The (t, p, ep) layouts the search analyses, listed (and so counted) before any is: t
    divides the node, p the layer count, t p the GPU count, ep per :func:`expert_degrees`."""
    gpus = spec.mapping.world_size
    return [
        (t, p, ep)
        for t in divisors(system.gpus_per_node)
        for p in divisors(spec.model.num_layers)
        if gpus % (t * p) == 0
        for ep in expert_degrees(spec, t)
    ]


def search_inference(
    spec: InferenceSpec,
    system: SystemSpec,
    options: SearchOptions | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[InferenceReport, ...]:
    """The best ``options.top`` strategies on ``spec.mapping.world_size`` GPUs, best first;
    ``progress(done, total)`` is called before each (t, p, ep) layout and after the last."""
    chosen = SearchOptions() if options is None else options
    gpus = spec.mapping.world_size
    found: list[InferenceReport] = []
    # One model, system and KV datatype throughout: the layouts share decode attention costs.
    attention: AttentionCache = {}
    layouts = search_layouts(spec, system)
    for done, (t, p, ep) in enumerate(layouts):
        if progress is not None:
            progress(done, len(layouts))
        found.extend(
            _layout_reports(
                spec, system, chosen, attention, t=t, p=p, ep=ep, replicas=gpus // (t * p)
            )
        )
    if progress is not None:
        progress(len(layouts), len(layouts))
    found.sort(key=lambda report: _key(report, chosen.objective))
    return tuple(found[: chosen.top])


def _layout_reports(
    spec: InferenceSpec,
    system: SystemSpec,
    chosen: SearchOptions,
    attention: AttentionCache,
    *,
    t: int,
    p: int,
    ep: int,
    replicas: int,
) -> list[InferenceReport]:
    """Every batch of one lawful (t, ep, p, replicas) layout that meets the latency target;
    none when the layout breaks a law."""
    capacity = system.accelerator.hbm.capacity_bytes
    probe = _with(spec, t=t, p=p, replicas=replicas, batch=1, ep=ep)
    try:
        plan = derive_inference_plan(probe.model, probe.mapping, megatron=chosen.megatron)
    except InvalidStrategyError:
        return []
    largest = max_batch_that_fits(plan, capacity=capacity)
    out = []
    for batch in _batches(largest):
        candidate = _with(spec, t=t, p=p, replicas=replicas, batch=batch, ep=ep)
        report = analyze_inference(
            candidate,
            system,
            megatron=chosen.megatron,
            max_batch=largest,
            attention_cache=attention,
        )
        target = chosen.latency_target_s
        if target is not None and report.decode_round_mean_s > target:
            continue
        out.append(report)
    return out
