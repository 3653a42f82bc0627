"""The ``blueprinting plan`` text report: strategy line, time breakdown, memory, FLOPs.

rich is imported inside the function so that importing this module stays cheap.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from blueprinting.analysis.memory import MemoryPeak
from blueprinting.analysis.report import IterationReport
from blueprinting.report.memory_table import GIB, fit_verdict, memory_table

if TYPE_CHECKING:
    from rich.console import Console

BAR_WIDTH = 40


def _expert_row(expert: int, total: int) -> tuple[tuple[str, float], ...]:
    """The routed-expert / dense split of a category (MoE models only)."""
    if expert == 0:
        return ()
    return (
        ("  of which routed experts (over expert-dp)", float(expert)),
        ("  of which dense (over dp x cp)", float(total - expert)),
    )


def _bar(fraction: float) -> str:
    filled = min(BAR_WIDTH, round(max(0.0, fraction) * BAR_WIDTH))
    return "█" * filled + "·" * (BAR_WIDTH - filled)


def render_plan(report: IterationReport, console: Console, *, all_stages: bool = False) -> None:
    from rich.markup import escape
    from rich.table import Table

    spec = report.spec
    mapping = spec.mapping
    console.print(
        f"[bold]{escape(spec.model.name)}[/bold] on [bold]{report.world_size}[/bold] x "
        f"{escape(report.system.accelerator.name)} ({escape(report.system.name)})"
    )
    console.print(
        f"strategy: {mapping}  |  global batch {mapping.batch.global_batch_size}, "
        f"micro batch {mapping.batch.micro_batch_size}, {mapping.microbatch_count} microbatches "
        f"per pipeline"
    )
    total = report.iteration_time_s
    times = Table(title=f"Iteration time {total:.4f} s (critical pipeline stage)")
    times.add_column("term")
    times.add_column("seconds", justify="right")
    times.add_column("share", justify="right")
    for name, seconds in report.breakdown.as_dict().items():
        times.add_row(name, f"{seconds:.4f}", f"{100 * seconds / total:5.1f}%")
    times.add_row("[bold]total[/bold]", f"[bold]{total:.4f}[/bold]", "100.0%")
    console.print(times)

    bubble = report.bubble
    simulated = (
        "not simulated"
        if report.bubble_simulated_s is None
        else f"simulated {report.bubble_simulated_s:.4f} s"
    )
    console.print(
        f"bubble (seed's analytic contract): n_bubble = {bubble.n_bubble} x T_chunk "
        f"{bubble.chunk_time_s:.5f} s - correction {bubble.imbalance_correction_s:.5f} s = "
        f"{bubble.bubble_s:.4f} s; {simulated}; total uses: {report.bubble_source}"
    )
    if report.bubble_simulation_note is not None:
        console.print(f"bubble: {report.bubble_simulation_note}", markup=False)
    dp = report.data_parallel
    if dp.link_s > 0.0:
        console.print(
            f"data parallel: collectives {dp.link_s:.4f} s on the link, "
            f"{dp.grad_sync_exposed_s + dp.param_gather_exposed_s:.4f} s of them exposed; "
            f"{dp.sm_contention_s:.4f} s the compute their hidden part slows (NCCL's ring "
            "kernel holds SMs); dp_comm_exposed is the sum",
            markup=False,
        )

    keys = spec.model.window_keys
    windowed = spec.model.windowed_layers_in(0, spec.model.num_layers)
    if keys is not None and windowed:
        changes = [
            f"a {kind} layer's {1e3 * (w.forward_s + w.backward_s):+.3f} ms"
            for kind, w in (("dense", report.plan.window), ("MoE", report.plan.moe_window))
            if w is not None
        ]
        console.print(
            f"sliding window: {windowed} of {spec.model.num_layers} layers attend at most {keys} "
            f"keys per query; forward + backward change a microbatch: {', '.join(changes)} "
            "(recompute apart; inside the terms above)"
        )

    memory = report.memory
    console.print(
        memory_table(
            memory.stage,
            (
                ("weights", memory.weights),
                *_expert_row(memory.expert_weights, memory.weights),
                ("gradients", memory.gradients),
                *_expert_row(memory.expert_gradients, memory.gradients),
                ("optimizer states", memory.optimizer_states),
                *_expert_row(memory.expert_optimizer_states, memory.optimizer_states),
                ("activations", memory.activations),
                ("other (embedding, logits)", memory.other),
            ),
            memory.total,
            (
                (
                    "allocated peak (max_memory_allocated)",
                    (
                        (_transient_label(memory.peak), memory.transient),
                        ("workspaces", memory.workspace),
                    ),
                    memory.allocated_peak,
                ),
                (
                    "reserved peak (device, nvidia-smi)",
                    (
                        ("allocator reserve", memory.allocator_reserve),
                        ("CUDA context", memory.cuda_context),
                        ("NCCL buffers", memory.nccl_buffers),
                    ),
                    memory.reserved_peak,
                ),
            ),
        )
    )
    verdict = fit_verdict(memory.fits)
    console.print(
        f"[{_bar(memory.reserved_peak / memory.capacity)}] {memory.reserved_peak / GIB:.1f} of "
        f"{memory.capacity / GIB:.1f} GiB at the reserved peak ({memory.peak.value}): "
        f"{verdict}, headroom {memory.headroom / GIB:.2f} GiB"
    )
    if memory.optimizer_step_copy:
        # outside the table's categories: live at the optimizer step only
        console.print(
            f"optimizer step: the fp32 copy of the 16-bit gradients, "
            f"{memory.optimizer_step_copy / GIB:.2f} GiB, made at the step and freed before the "
            "next forward (not in the optimizer states; the step's peak holds it in place of "
            "the activations and buffers freed before it)",
            markup=False,
        )
    offload = report.offload
    if offload is not None:
        # the host's memory, not the GPU's: beside the table, never in its sums
        console.print(
            f"CPU offloading: {offload.layers} layers' activations, {offload.bytes / GIB:.2f} GiB "
            f"in pinned host memory per GPU; copies {offload.device_to_host_s:.4f} s out and "
            f"{offload.host_to_device_s:.4f} s back per microbatch under "
            f"{offload.forward_window_s:.4f} s / {offload.backward_window_s:.4f} s of the other "
            f"layers' passes: the compute waits {offload.exposed_s:.4f} s (offload_exposed)",
            markup=False,
        )

    if all_stages:
        stages = Table(title="Memory per GPU by pipeline stage (GiB)")
        for column in ("stage", "weights", "grads", "optimizer", "activations", "other", "total"):
            stages.add_column(column, justify="right")
        for stage in report.memory_per_stage:
            stages.add_row(
                str(stage.stage),
                *(
                    f"{size / GIB:.2f}"
                    for size in (
                        stage.weights,
                        stage.gradients,
                        stage.optimizer_states,
                        stage.activations,
                        stage.other,
                        stage.total,
                    )
                ),
            )
        console.print(stages)

    console.print(
        f"FLOPs per iteration ({report.flops_convention}): "
        f"model {report.model_flops_per_iteration:.4e}, "
        f"hardware {report.hardware_flops_per_iteration:.4e}"
    )
    console.print(
        f"throughput: {report.tflops_per_gpu:.1f} TFLOP/s per GPU, MFU {100 * report.mfu:.1f}%, "
        f"HFU {100 * report.hfu:.1f}%, {report.tokens_per_second:,.0f} tokens/s"
    )
    tokens = report.train_tokens
    console.print(
        f"time to train {tokens:.3g} tokens: {report.time_to_train_s(tokens) / 86400:,.1f} days"
    )
    if report.megatron_refusals:
        console.print("megatron-lm flags: none, Megatron-LM refuses this strategy:")
        for refusal in report.megatron_refusals:
            console.print(f"  - {refusal}", markup=False)
    else:
        # shlex: a layout such as Et|(tt|)*30L must reach a shell quoted.
        console.print("megatron-lm flags: " + shlex.join(report.megatron_args))


def _transient_label(peak: MemoryPeak) -> str:
    """The memory table's transient row: at the optimizer step it is the fp32 gradient copy's
    excess over the activations and buffers freed before the step, not a working set."""
    if peak is MemoryPeak.OPTIMIZER_STEP:
        return "optimizer step's gradient copy, beyond what it frees"
    return "transient working set"
