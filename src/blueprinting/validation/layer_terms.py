"""What the A100 GEMM fraction absorbs: Korthikanti et al. 2022 Table 4 split into its terms.

Issue 15 asks that efficiencies be adopted on the microbenchmarks' merit and that what a fit
absorbs be named. The A100 GEMM fraction (``hardware/presets.py``: 0.72 on the single-point
NVLink figure 0.78 / 10 us, 0.75 since the presets take the NVLink sweep fit) is fitted on the ten
per-layer times of Table 4 (one 22B layer, t = 8, five recompute / SP variants); the cuBLASLt
shape fit :data:`~blueprinting.hardware.presets.A100_GEMM_FIT` and the NVLink alpha-beta fit
:data:`~blueprinting.hardware.presets.A100_NVLINK_FIT` are the microbenchmarks' figures. This
module splits each figure, as the planner costs it, into

* ``gemm``: the four linears (QKV, output projection, MLP up / down), activation and weight
  gradients;
* ``attention_matmul``: the unfused attention core's batched GEMMs (``Q K^T``, ``A V``);
* ``softmax_dropout``: the fused scale-mask-softmax and the attention dropout, memory-bound;
* ``elementwise``: layernorms, bias-GeLU, bias-dropout-add;
* ``tp_comm`` and ``tp_comm_hidden``: the TP all-reduces (or SP all-gathers / reduce-scatters)
  and the part the async backward overlap hides;

whose sum less the hidden part is the planner's ``block_time_s`` (``tests/validation/
test_layer_terms.py`` checks the identity), and prices three costs of the 2022 Megatron-LM that
the planner does not model (:func:`candidate_costs`; each with its source there). They are
reported, not costed by the planner: docs/VALIDATION.md ("What the A100 fraction absorbs") gives
the tables and why the microbenchmark fits are not adopted with them (Narayanan 2021 Table 1
would get worse). ``python -m blueprinting.validation.layer_terms`` prints those tables.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import assert_never, final

from blueprinting.analysis.evaluate import portable_plan
from blueprinting.hardware.collectives import CollectiveKind as LinkCollective
from blueprinting.hardware.efficiency import ConstantEfficiency, GemmShapeEfficiency
from blueprinting.hardware.presets import A100_GEMM_FIT, A100_NVLINK_FIT, system_preset
from blueprinting.hardware.system import ParallelDim, SystemSpec
from blueprinting.mapping.model import Datatype
from blueprinting.mapping.transformer import TrainingSpec
from blueprinting.synthesizer.dialects.transformer.training import SemanticOpName
from blueprinting.synthesizer.dialects.transformer.training_derivation import (
    derive_training_block,
)
from blueprinting.synthesizer.stages.distributed.ir import (
    CollectiveTask,
    ComputeTask,
    Phase,
    TaskGroup,
)
from blueprinting.synthesizer.stages.portable_plan.passes import PlanContext, work_time
from blueprinting.validation.published import PublishedRun, SourceTable, load_published_runs

_LINEARS = frozenset(
    {
        SemanticOpName.QKV_PROJECTION,
        SemanticOpName.OUTPUT_PROJECTION,
        SemanticOpName.MLP_UP,
        SemanticOpName.MLP_DOWN,
    }
)
_ATTENTION_MATMULS = frozenset(
    {SemanticOpName.ATTENTION_SCORES, SemanticOpName.ATTENTION_OVER_VALUES}
)
_SOFTMAX_DROPOUT = frozenset({SemanticOpName.SOFTMAX, SemanticOpName.ATTENTION_DROPOUT})
_FORWARD = frozenset({Phase.FORWARD})
_BACKWARD = frozenset({Phase.BACKWARD_ACTIVATION_GRAD, Phase.BACKWARD_WEIGHT_GRAD, Phase.RECOMPUTE})

#: Channels (one CTA, one SM each: NVIDIA/nccl issue #689, the maintainer) NCCL's ring
#: all-reduce runs on an 8-GPU HGX / DGX A100 with NVSwitch: "Channel 00/24" .. "23/24" in the
#: NCCL_DEBUG=INFO log of NVIDIA/nccl-tests issue #100.
A100_NCCL_RING_CHANNELS = 24
#: Bytes the DDP hook's ``main_grad.add_(grad)`` moves per parameter with a 16-bit gradient
#: buffer: read both, write one (candidate_costs).
_GRAD_ACCUMULATION_BYTES_PER_ELEMENT = 3


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LayerTerms:
    """One Table 4 figure (forward, or backward with its recompute) split into the planner's
    terms (module docstring), seconds; ``kernels`` counts the compute tasks."""

    gemm_s: float
    attention_matmul_s: float
    softmax_dropout_s: float
    elementwise_s: float
    tp_comm_s: float
    tp_comm_hidden_s: float
    kernels: int

    @property
    def total_s(self) -> float:
        """The planner's figure: every term, less the TP time the backward overlap hides."""
        return (
            self.gemm_s
            + self.attention_matmul_s
            + self.softmax_dropout_s
            + self.elementwise_s
            + self.tp_comm_s
            - self.tp_comm_hidden_s
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CandidateCosts:
    """Backward costs of one layer that the 2021-22 Megatron-LM pays and the planner does not
    model (:func:`candidate_costs`), seconds."""

    gradient_accumulation_s: float
    bias_gradient_s: float
    nccl_sm_share_s: float

    @property
    def total_s(self) -> float:
        return self.gradient_accumulation_s + self.bias_gradient_s + self.nccl_sm_share_s


def _block(spec: TrainingSpec) -> TaskGroup:
    return derive_training_block(spec.model, spec.mapping).block


def _terms(
    group: TaskGroup, spec: TrainingSpec, system: SystemSpec, phases: frozenset[Phase]
) -> tuple[float, float, float, float, float, int]:
    tp_group = PlanContext(spec=spec, system=system).group(ParallelDim.TENSOR)
    gemm = matmul = softmax = elementwise = comm = 0.0
    kernels = 0
    for task in group.tasks:
        if task.phase not in phases:
            continue
        match task:
            case ComputeTask():
                seconds = work_time(
                    task.work, task.gemm, system, spec.model.datatype, task.attention
                )
                kernels += 1
                op = task.lineage.op
                if op in _LINEARS:
                    gemm += seconds
                elif op in _ATTENTION_MATMULS:
                    matmul += seconds
                elif op in _SOFTMAX_DROPOUT:
                    softmax += seconds
                else:
                    elementwise += seconds
            case CollectiveTask():
                comm += system.collective_time(
                    LinkCollective(task.kind.value), task.bytes, tp_group
                )
            case _ as unreachable:
                assert_never(unreachable)
    return gemm, matmul, softmax, elementwise, comm, kernels


def layer_terms(spec: TrainingSpec, system: SystemSpec) -> tuple[LayerTerms, LayerTerms]:
    """(forward, backward with recompute) of one transformer block of ``spec`` on ``system``.

    Only for high-precision dense blocks without context parallelism (Table 4's): the
    decomposition reads the TP collectives and the base datatype's rates only."""
    group = _block(spec)
    block = portable_plan(spec, system).block
    hidden = {
        Phase.FORWARD: block.forward.comm_hidden_s,
        Phase.RECOMPUTE: block.recompute.comm_hidden_s,
    }
    backward_hidden = (
        block.backward_activation.comm_hidden_s
        + block.backward_weight.comm_hidden_s
        + hidden[Phase.RECOMPUTE]
    )

    def figure(phases: frozenset[Phase], hidden_s: float) -> LayerTerms:
        gemm, matmul, softmax, elementwise, comm, kernels = _terms(group, spec, system, phases)
        return LayerTerms(
            gemm_s=gemm,
            attention_matmul_s=matmul,
            softmax_dropout_s=softmax,
            elementwise_s=elementwise,
            tp_comm_s=comm,
            tp_comm_hidden_s=hidden_s,
            kernels=kernels,
        )

    return figure(_FORWARD, hidden[Phase.FORWARD]), figure(_BACKWARD, backward_hidden)


def candidate_costs(spec: TrainingSpec, system: SystemSpec) -> CandidateCosts:
    """The backward costs of one block that Megatron-LM of 2021-22 pays beyond the planner's ops,
    each priced from its source (none is fitted):

    * gradient accumulation: with ``--fp16`` and without ``--accumulate-allreduce-grads-in-fp32``
      (the default), ``gradient_accumulation_fusion`` is switched off
      (``megatron/arguments.py`` l.176-188 @d898a8991d, the 2022-05-25 merge of sequence
      parallelism) and the local DDP's backward hook runs ``param.main_grad.add_(param.grad)``
      into a 16-bit buffer once per parameter and microbatch (``megatron/model/distributed.py``
      l.167-177, the same at the SC'21 commit 6985e58938): 3 x 2 bytes per weight at the HBM
      rate (biases and norm parameters, under 0.1%, left out);
    * bias gradients of the column-parallel linears as their own reduction kernels: the QKV
      linear's ``grad_output.sum(dim=0)`` (``megatron/mpu/layers.py`` l.301 @d898a8991d) and
      fc1's (``skip_bias_add``, ``megatron/model/transformer.py`` l.82-87), whose
      ``GeLUFunction.backward`` returns a full-size bias gradient that autograd sums to the bias
      (``megatron/model/fused_bias_gelu.py``), each reading the output gradient at the HBM
      rate; the planner folds them into the weight-gradient GEMM's roofline, where they cost
      nothing;
    * the SMs NCCL holds while a hidden backward collective runs beside its GEMM: the ring kernel
      takes :data:`A100_NCCL_RING_CHANNELS` of the accelerator's SMs, so the GEMM beside it runs
      ``u = 24 / 108`` slower for the hidden time: ``u x hidden`` (first order; Transformer
      Engine's bulk overlap, ``tp_overlap.py``, is costed the same way).
    """
    group = _block(spec)
    block = portable_plan(spec, system).block
    width = spec.model.datatype.bytes
    accumulation = bias = 0.0
    if spec.model.datatype is Datatype.FP16:
        weights = sum(
            task.gemm.n * task.gemm.k
            for task in group.tasks
            if isinstance(task, ComputeTask)
            and task.phase is Phase.FORWARD
            and task.lineage.op in _LINEARS
            and task.gemm is not None
        )
        accumulation = system.memory_time(_GRAD_ACCUMULATION_BYTES_PER_ELEMENT * width * weights)
    for task in group.tasks:
        if (
            isinstance(task, ComputeTask)
            and task.phase is Phase.BACKWARD_WEIGHT_GRAD
            and task.lineage.op in (SemanticOpName.QKV_PROJECTION, SemanticOpName.MLP_UP)
            and task.gemm is not None
            and task.work.vector_flops > 0
        ):
            bias += system.memory_time(task.gemm.m * task.gemm.k * width)
    sms = system.accelerator.sm_count
    share = 0.0 if sms is None else A100_NCCL_RING_CHANNELS / sms
    hidden = block.backward_activation.comm_hidden_s + block.backward_weight.comm_hidden_s
    return CandidateCosts(
        gradient_accumulation_s=accumulation, bias_gradient_s=bias, nccl_sm_share_s=share * hidden
    )


def a100_microbenchmark_system(system: SystemSpec) -> SystemSpec:
    """``system`` (an A100 preset) with the microbenchmark fits the preset reports but does not
    adopt: the cuBLASLt shape fit for every matrix datatype and the NVLink alpha-beta fit."""
    peak_fraction, half_dim, half_flops = A100_GEMM_FIT
    gemm = GemmShapeEfficiency(
        peak_fraction=peak_fraction, half_saturation_dim=half_dim, half_saturation_flops=half_flops
    )
    accelerator = system.accelerator
    matrix = replace(
        accelerator.matrix,
        rates=tuple(replace(rate, efficiency=gemm) for rate in accelerator.matrix.rates),
    )
    latency, efficiency = A100_NVLINK_FIT
    link = replace(
        system.node.link, latency_s=latency, efficiency=ConstantEfficiency(fraction=efficiency)
    )
    return replace(
        system,
        accelerator=replace(accelerator, matrix=matrix),
        node=replace(system.node, link=link),
    )


def table4_runs() -> tuple[PublishedRun, ...]:
    """The ten-figure subset the A100 fraction is fitted on (five runs)."""
    return tuple(
        run
        for run in load_published_runs()
        if run.source_table is SourceTable.KORTHIKANTI2022_TABLE4
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def markdown_tables(runs: Sequence[PublishedRun]) -> str:
    """The decomposition tables of docs/VALIDATION.md: per figure, the terms on the preset (GEMM
    0.75, NVLink 47 us / 0.69) and on the microbenchmark fits, the measured time, and what the
    fit leaves unexplained before and after the candidate costs (ms)."""
    lines = [
        "| figure | system | GEMM | attn matmul | softmax + dropout | elementwise "
        "| TP comm (hidden) | predicted | measured | error | measured - predicted "
        "| + candidates: error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        spec = run.training_spec()
        preset = system_preset(run.system)
        fitted = a100_microbenchmark_system(preset)
        label = run.id.removeprefix("korthikanti2022_t4_22B_layer_")
        measured = (run.measured.layer_forward_ms, run.measured.layer_backward_ms)
        for name, system in (("preset", preset), ("fits", fitted)):
            extra = candidate_costs(spec, system).total_s
            for figure, terms, ms, added in zip(
                ("fwd", "bwd"), layer_terms(spec, system), measured, (0.0, extra), strict=True
            ):
                if ms is None:
                    continue
                predicted = terms.total_s
                lines.append(
                    f"| {label} {figure} | {name} | {_ms(terms.gemm_s)} "
                    f"| {_ms(terms.attention_matmul_s)} | {_ms(terms.softmax_dropout_s)} "
                    f"| {_ms(terms.elementwise_s)} | {_ms(terms.tp_comm_s)} "
                    f"({_ms(terms.tp_comm_hidden_s)}) | {_ms(predicted)} | {ms:.1f} "
                    f"| {predicted * 1e3 / ms - 1:+.1%} | {ms - predicted * 1e3:+.2f} "
                    f"| {(predicted + added) * 1e3 / ms - 1:+.1%} |"
                )
    lines += [
        "",
        "| run | system | gradient accumulation | bias gradients | NCCL SM share | total |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        spec = run.training_spec()
        preset = system_preset(run.system)
        for name, system in (("preset", preset), ("fits", a100_microbenchmark_system(preset))):
            costs = candidate_costs(spec, system)
            lines.append(
                f"| {run.id.removeprefix('korthikanti2022_t4_22B_layer_')} | {name} "
                f"| {_ms(costs.gradient_accumulation_s)} | {_ms(costs.bias_gradient_s)} "
                f"| {_ms(costs.nccl_sm_share_s)} | {_ms(costs.total_s)} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    del argv
    sys.stdout.write(markdown_tables(table4_runs()) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
