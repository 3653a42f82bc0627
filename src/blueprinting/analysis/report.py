"""IterationReport: every figure of one plan, with how it was obtained, and its JSON form.

The JSON keys are a public contract (README, "plan --json"); add, never rename. Units: seconds,
bytes, FLOPs (counts), FLOP/s, tokens per second. ``mfu`` and ``hfu`` are fractions in [0, 1].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, final

from blueprinting.analysis import flops
from blueprinting.analysis.data_parallel import DataParallelCost
from blueprinting.analysis.flops import FlopsConvention
from blueprinting.analysis.iteration import (
    BubbleSource,
    TimeBreakdown,
    plan_unpaired_ep_exposed_s,
    stage_cp_comm,
    stage_ep_comm,
    stage_quantize_s,
    stage_tp_comm,
)
from blueprinting.analysis.memory import MemoryBreakdown, stage_activations
from blueprinting.analysis.offload import OffloadCost
from blueprinting.analysis.optimizer_step import OptimizerStepCost
from blueprinting.analysis.pipeline_contract import BubbleContract
from blueprinting.hardware.system import SystemSpec
from blueprinting.mapping.transformer import TrainingSpec, delays_wgrad
from blueprinting.synthesizer.stages.portable_plan.ir import BlockCost, PhaseCost, PortablePlanIR

if TYPE_CHECKING:
    from blueprinting.simulator.from_plan import PlanSimulation

JsonScalar = int | float | str | bool | None
JsonValue = JsonScalar | list["JsonValue"] | dict[str, "JsonValue"]


def _stage_memory_json(stage: MemoryBreakdown) -> dict[str, JsonValue]:
    """One pipeline stage's bytes per GPU by category and its peaks (``memory_bytes`` is the
    most loaded stage's object of the same keys, plus capacity, headroom and the verdict)."""
    return {
        "stage": stage.stage,
        "weights": stage.weights,
        "gradients": stage.gradients,
        "optimizer_states": stage.optimizer_states,
        "optimizer_step_copy": stage.optimizer_step_copy,
        "activations": stage.activations,
        "other": stage.other,
        "total": stage.total,
        "transient": stage.transient,
        "workspace": stage.workspace,
        "allocated_peak": stage.allocated_peak,
        "allocator_reserve": stage.allocator_reserve,
        "cuda_context": stage.cuda_context,
        "nccl_buffers": stage.nccl_buffers,
        "reserved_peak": stage.reserved_peak,
        "expert": _expert_memory_json(stage),
    }


def _phase_links(
    block: BlockCost, times: Callable[[PhaseCost], tuple[float, float]]
) -> dict[str, JsonValue]:
    """Per phase of one block and microbatch: a communication's ``link_s``, ``hidden_s`` and
    ``exposed_s`` (``times`` gives its (link, exposed) pair of a phase)."""
    out: dict[str, JsonValue] = {}
    for name, phase in (
        ("forward", block.forward),
        ("backward_activation", block.backward_activation),
        ("backward_weight", block.backward_weight),
        ("recompute", block.recompute),
    ):
        link, exposed = times(phase)
        out[name] = {"link_s": link, "hidden_s": link - exposed, "exposed_s": exposed}
    return out


def _expert_memory_json(stage: MemoryBreakdown) -> dict[str, JsonValue]:
    """The routed experts' part of weights, gradients and optimizer states (sharded over
    expert-dp); ``dense`` is the rest (sharded over d x cp). All zero for a dense model."""
    return {
        "weights": stage.expert_weights,
        "gradients": stage.expert_gradients,
        "optimizer_states": stage.expert_optimizer_states,
        "dense_weights": stage.weights - stage.expert_weights,
        "dense_gradients": stage.gradients - stage.expert_gradients,
        "dense_optimizer_states": stage.optimizer_states - stage.expert_optimizer_states,
    }


def _offload_json(offload: OffloadCost | None) -> dict[str, JsonValue] | None:
    """Per microbatch: the offloaded layers, their stores in pinned host memory, each copy's time
    and the layers' passes it hides under, and what the compute waits."""
    if offload is None:
        return None
    return {
        "layers": offload.layers,
        "host_bytes": offload.bytes,
        "device_to_host_s": offload.device_to_host_s,
        "host_to_device_s": offload.host_to_device_s,
        "forward_window_s": offload.forward_window_s,
        "backward_window_s": offload.backward_window_s,
        "exposed_s": offload.exposed_s,
    }


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class IterationReport:
    """One training plan, evaluated."""

    spec: TrainingSpec
    system: SystemSpec
    plan: PortablePlanIR
    breakdown: TimeBreakdown
    bubble: BubbleContract
    bubble_simulated_s: float | None
    bubble_source: BubbleSource
    bubble_simulated_p2p_exposed_s: float | None
    bubble_simulation_note: str | None
    flops_convention: FlopsConvention
    model_flops_per_iteration: int
    hardware_flops_per_iteration: int
    peak_flops_per_gpu: float
    memory: MemoryBreakdown
    memory_per_stage: tuple[MemoryBreakdown, ...]
    data_parallel: DataParallelCost
    optimizer: OptimizerStepCost
    strategy_keys: dict[str, int | bool | str | float]
    megatron_args: tuple[str, ...]
    train_tokens: int
    megatron_refusals: tuple[str, ...] = ()
    """Megatron-LM start-up rules the strategy breaks (then ``megatron_args`` is empty)."""
    simulation: PlanSimulation | None = None
    """The plan path's simulation of the schedule (one DAG, three runs) when it ran; ``blueprinting
    simulate`` reuses it instead of building the schedule again."""
    offload: OffloadCost | None = None
    """Layer-wise CPU offloading's copies per microbatch (None without offloading)."""

    @property
    def iteration_time_s(self) -> float:
        return self.breakdown.total_s

    @property
    def world_size(self) -> int:
        return self.spec.mapping.world_size

    @property
    def tokens_per_iteration(self) -> int:
        return flops.tokens_per_iteration(
            self.spec.model, self.spec.mapping.batch.global_batch_size
        )

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_iteration / self.iteration_time_s

    @property
    def tflops_per_gpu(self) -> float:
        """Model FLOPs per second per GPU, in TFLOP/s (Megatron's reported throughput figure
        uses the same numerator under the named convention)."""
        achieved = flops.achieved_flops_per_gpu(
            self.model_flops_per_iteration, self.iteration_time_s, self.world_size
        )
        return achieved / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization (Chowdhery et al. 2022, PaLM, Appendix B)."""
        return flops.mfu(
            self.model_flops_per_iteration,
            self.iteration_time_s,
            self.world_size,
            self.peak_flops_per_gpu,
        )

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilization: counts recomputed forwards (Korthikanti et al. 2022)."""
        return flops.hfu(
            self.hardware_flops_per_iteration,
            self.iteration_time_s,
            self.world_size,
            self.peak_flops_per_gpu,
        )

    def time_to_train_s(self, tokens: int) -> float:
        """Seconds to process ``tokens`` tokens at this iteration rate (whole iterations)."""
        return flops.time_to_train_s(
            self.spec.model,
            self.spec.mapping.batch.global_batch_size,
            tokens,
            self.iteration_time_s,
        )

    def _quantization_json(self) -> dict[str, JsonValue]:
        """The low-precision recipe's quantization kernels (Transformer Engine's casts of each
        linear's input and output gradient, memory-bound at the HBM rate): per block phase and
        over the critical stage's iteration, already inside the compute terms."""
        block = self.plan.block
        return {
            "recipe": str(self.spec.mapping.precision),
            "block_s": {
                "forward": block.forward.quantize_s,
                "backward_activation": block.backward_activation.quantize_s,
                "backward_weight": block.backward_weight.quantize_s,
                "recompute": block.recompute.quantize_s,
            },
            "iteration_s": stage_quantize_s(
                self.plan, self.plan.critical_stage(), self.spec.mapping.microbatch_count
            ),
        }

    def _tp_comm_json(self) -> dict[str, JsonValue]:
        """TP communication per block phase and over the iteration of the critical stage: link
        time, the part hidden behind GEMMs, the part exposed, and what hiding it costs the GEMMs
        (``overlap_compute_s``, already inside the compute terms)."""
        block = self.plan.block
        phases: dict[str, JsonValue] = {}
        for name, phase in (
            ("forward", block.forward),
            ("backward_activation", block.backward_activation),
            ("backward_weight", block.backward_weight),
            ("recompute", block.recompute),
        ):
            phases[name] = {
                "link_s": phase.comm_s,
                "hidden_s": phase.comm_hidden_s,
                "exposed_s": phase.comm_exposed_s,
                "overlap_compute_s": phase.overlap_compute_s,
            }
        total = stage_tp_comm(
            self.plan, self.plan.critical_stage(), self.spec.mapping.microbatch_count
        )
        overlap = str(self.spec.mapping.tp_comm_overlap)
        return {
            "overlap": overlap or "none",
            "block": phases,
            "iteration": {
                "link_s": total.link_s,
                "hidden_s": total.hidden_s,
                "exposed_s": total.exposed_s,
                "overlap_compute_s": total.overlap_compute_s,
            },
        }

    def _cp_comm_json(self) -> dict[str, JsonValue]:
        """The context-parallel K/V exchanges: the cp axis, per block phase and over the
        critical stage's iteration, link time, the part hidden behind attention and the part
        exposed (``iteration.exposed_s`` = ``time_breakdown_s.cp_comm_exposed``)."""
        context = self.spec.mapping.parallelism.context
        phases = _phase_links(self.plan.block, lambda ph: (ph.cp_comm_s, ph.cp_comm_exposed_s))
        total = stage_cp_comm(
            self.plan, self.plan.critical_stage(), self.spec.mapping.microbatch_count
        )
        return {
            "degree": context.degree,
            "communication": str(context.communication) if context.degree > 1 else "none",
            "block": phases,
            "iteration": {
                "link_s": total.link_s,
                "hidden_s": total.hidden_s,
                "exposed_s": total.exposed_s,
            },
        }

    def _ep_comm_json(self) -> dict[str, JsonValue]:
        """The MoE layers' expert grid and token dispatch: degrees, dispatcher, per MoE-block
        phase and over the critical stage's iteration the link time, hidden and exposed
        (``iteration.exposed_s`` = ``time_breakdown_s.ep_comm_exposed``); null blocks for a
        dense model."""
        mapping = self.spec.mapping
        experts = mapping.parallelism.experts
        moe = self.plan.moe_block
        total = stage_ep_comm(self.plan, self.plan.critical_stage(), mapping.microbatch_count)
        unpaired = self._unpaired_ep_s()
        phases: JsonValue = (
            None
            if moe is None
            else _phase_links(moe, lambda ph: (ph.ep_comm_s, ph.ep_comm_exposed_s))
        )
        return {
            "expert_model_parallel_size": experts.degree,
            "expert_tensor_parallel_size": experts.tensor_degree,
            "expert_data_parallel_size": mapping.expert_data_degree,
            "dispatcher": str(experts.dispatcher),
            "moe_block": phases,
            "moe_block_time_s": None
            if moe is None
            else {
                "forward": moe.forward_s,
                "backward": moe.backward_s,
                "recompute": moe.recompute.critical_path_s,
            },
            "moe_layers_on_critical_stage": self.plan.critical_stage().moe_blocks,
            "combined_1f1b": self._combined_json(),
            "iteration": {
                "link_s": total.link_s,
                "hidden_s": total.hidden_s - unpaired,
                "exposed_s": total.exposed_s + unpaired,
            },
        }

    def _attention_window_json(self) -> JsonValue:
        """The model's sliding-window layers as trained (null when no layer keeps a window):
        the keys a windowed query attends at most, how many layers are windowed (in the model
        and on the critical stage), and what one windowed dense / MoE layer changes against the
        full one per microbatch (``PortablePlanIR.window`` / ``moe_window``, mostly negative:
        already inside the breakdown's terms; null where the model has no windowed layer of
        that kind)."""
        model = self.spec.model
        keys = model.window_keys
        windowed = model.windowed_layers_in(0, model.num_layers)
        if keys is None or not windowed:
            return None
        critical = self.plan.critical_stage()

        def change(window: BlockCost | None) -> JsonValue:
            if window is None:
                return None
            return {
                "forward": window.forward_s,
                "backward": window.backward_s,
                "recompute": window.recompute.critical_path_s,
            }

        return {
            "window_keys": keys,
            "windowed_layers": windowed,
            "layers": model.num_layers,
            "windowed_layers_on_critical_stage": (
                critical.windowed_blocks + critical.moe_windowed_blocks
            ),
            "dense_layer_change_s": change(self.plan.window),
            "moe_layer_change_s": change(self.plan.moe_window),
        }

    def _combined_json(self) -> JsonValue:
        """Combined 1F1B's overlap of one MoE layer (null without the EP overlap): the
        co-scheduled pair and the passes alone, the exchanges hidden and exposed in a pair, what
        ``--delay-wgrad-compute`` hides by running the weight gradients under the backward's
        dispatch, and the critical stage's unpaired warm-up / cool-down passes' extra exposure
        (part of ``iteration.exposed_s``)."""
        timing = self.plan.ep_overlap
        if timing is None:
            return None
        mapping = self.spec.mapping
        return {
            "delay_wgrad_compute": delays_wgrad(mapping.parallelism.experts.dispatcher),
            "pair_s": timing.pair_s,
            "forward_alone_s": timing.forward_alone_s,
            "backward_alone_s": timing.backward_alone_s,
            "pair_exchange_s": timing.exchange_s,
            "pair_hidden_s": timing.hidden_s,
            "pair_exposed_s": timing.exposed_s,
            "pair_hidden_by_delayed_wgrad_s": timing.hidden_by_delayed_wgrad_s,
            "unpaired_forward_s": timing.unpaired_forward_s,
            "unpaired_backward_s": timing.unpaired_backward_s,
            "unpaired_exposed_s": self._unpaired_ep_s(),
        }

    def _unpaired_ep_s(self) -> float:
        mapping = self.spec.mapping
        return plan_unpaired_ep_exposed_s(
            mapping.parallelism.pipeline.schedule,
            self.plan,
            self.plan.critical_stage(),
            mapping.microbatch_count,
        )

    def to_json_dict(self) -> dict[str, JsonValue]:
        """The ``plan --json`` object (README documents each key and unit)."""
        memory = self.memory
        block = self.plan.block
        bubble: dict[str, JsonValue] = {
            "contract_s": self.bubble.bubble_s,
            "chunk_time_s": self.bubble.chunk_time_s,
            "n_bubble": self.bubble.n_bubble,
            "extra_interleaving_bubbles": self.bubble.extra_interleaving_bubbles,
            "imbalance_correction_s": self.bubble.imbalance_correction_s,
            "simulated_s": self.bubble_simulated_s,
            "used": str(self.bubble_source),
            "simulated_p2p_exposed_s": self.bubble_simulated_p2p_exposed_s,
            "simulation_note": self.bubble_simulation_note,
        }
        breakdown: dict[str, JsonValue] = dict(self.breakdown.as_dict())
        strategy: dict[str, JsonValue] = dict(self.strategy_keys)
        return {
            "model": self.spec.model.name,
            "system": self.system.name,
            "summary": str(self.spec.mapping),
            "world_size": self.world_size,
            "microbatch_count": self.spec.mapping.microbatch_count,
            "iteration_time_s": self.iteration_time_s,
            "time_breakdown_s": breakdown,
            "bubble": bubble,
            "model_flops_per_iteration": self.model_flops_per_iteration,
            "hardware_flops_per_iteration": self.hardware_flops_per_iteration,
            "flops_convention": str(self.flops_convention),
            "peak_flops_per_gpu": self.peak_flops_per_gpu,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "tokens_per_iteration": self.tokens_per_iteration,
            "tokens_per_second": self.tokens_per_second,
            "time_to_train": {
                "tokens": self.train_tokens,
                "iterations": flops.iterations_to_train(
                    self.spec.model, self.spec.mapping.batch.global_batch_size, self.train_tokens
                ),
                "seconds": self.time_to_train_s(self.train_tokens),
                "days": self.time_to_train_s(self.train_tokens) / 86400,
            },
            "memory_bytes": {
                "weights": memory.weights,
                "gradients": memory.gradients,
                "optimizer_states": memory.optimizer_states,
                # the fp32 copy of 16-bit gradients, live at the optimizer step only
                "optimizer_step_copy": memory.optimizer_step_copy,
                "activations": memory.activations,
                "other": memory.other,
                "total": memory.total,
                "transient": memory.transient,
                "workspace": memory.workspace,
                "allocated_peak": memory.allocated_peak,
                "allocator_reserve": memory.allocator_reserve,
                "allocator_reserved_peak": memory.allocator_reserved_peak,
                "cuda_context": memory.cuda_context,
                "nccl_buffers": memory.nccl_buffers,
                "reserved_peak": memory.reserved_peak,
                "capacity": memory.capacity,
                "headroom": memory.headroom,
                "stage": memory.stage,
                "peak_at": memory.peak.value,
                "expert": _expert_memory_json(memory),
                # pinned host memory, not the GPU's: layer-wise CPU offloading's stores
                "host_offloaded": stage_activations(
                    self.spec.model, self.spec.mapping, memory.stage
                ).host_offloaded,
            },
            "fits_in_memory": memory.fits,
            "memory_total_bytes_per_stage": [stage.total for stage in self.memory_per_stage],
            "memory_allocated_peak_bytes_per_stage": [
                stage.allocated_peak for stage in self.memory_per_stage
            ],
            "memory_reserved_peak_bytes_per_stage": [
                stage.reserved_peak for stage in self.memory_per_stage
            ],
            "memory_activations_bytes_per_stage": [
                stage.activations for stage in self.memory_per_stage
            ],
            "memory_activations_stored_bytes_per_stage": [
                stage_activations(self.spec.model, self.spec.mapping, stage.stage).layers_stored
                for stage in self.memory_per_stage
            ],
            "memory_bytes_per_stage": [
                _stage_memory_json(stage) for stage in self.memory_per_stage
            ],
            "memory_static_bytes_per_stage": [
                stage.weights + stage.gradients + stage.optimizer_states
                for stage in self.memory_per_stage
            ],
            "block_time_s": {
                "forward": block.forward_s,
                "backward": block.backward_s,
                "recompute": block.recompute.critical_path_s,
                "backward_with_recompute": block.backward_with_recompute_s,
            },
            "attention_window": self._attention_window_json(),
            "quantization": self._quantization_json(),
            "tp_comm": self._tp_comm_json(),
            "cp_comm": self._cp_comm_json(),
            "ep_comm": self._ep_comm_json(),
            "dp_comm": {
                "grad_bytes": self.data_parallel.grad_bytes,
                "param_gather_bytes": self.data_parallel.param_gather_bytes,
                "link_s": self.data_parallel.link_s,
                "exposed_s": self.data_parallel.exposed_s,
                "sm_contention_s": self.data_parallel.sm_contention_s,
            },
            "optimizer_step": {
                "parameters": self.optimizer.parameters,
                "flops": self.optimizer.flops,
                "bytes_moved": self.optimizer.bytes_moved,
                "time_s": self.optimizer.time_s,
            },
            "activation_offload": _offload_json(self.offload),
            "strategy": strategy,
            "megatron_args": list(self.megatron_args),
            "megatron_refusals": list(self.megatron_refusals),
        }
