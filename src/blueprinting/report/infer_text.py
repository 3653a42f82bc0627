"""The ``blueprinting infer`` text report and the ``infer --search`` table.

rich is imported inside the functions so that importing this module stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blueprinting.inference.analysis import InferenceReport, PhaseBounds
from blueprinting.report.memory_table import GIB, fit_verdict, memory_table

if TYPE_CHECKING:
    from rich.console import Console

MS = 1e3


def _bounds_row(name: str, bounds: PhaseBounds, *, experts: bool) -> tuple[str, ...]:
    row = (
        name,
        f"{bounds.modelled_s * MS:.3f}",
        f"{bounds.compute_s * MS:.3f}",
        f"{bounds.hbm_s * MS:.3f}",
        f"{bounds.tp_comm_s * MS:.3f}",
        f"{bounds.weight_bytes / GIB:.2f}",
        f"{bounds.expert_weight_bytes / GIB:.2f}",
        f"{bounds.kv_cache_bytes / GIB:.2f}",
        f"{bounds.activation_bytes / GIB:.2f}",
    )
    # the routed-expert part of the weights: a column of MoE models only
    return row if experts else row[:6] + row[7:]


def render_inference(report: InferenceReport, console: Console) -> None:
    from rich.markup import escape
    from rich.table import Table

    spec = report.spec
    workload = spec.mapping.workload
    console.print(
        f"[bold]{escape(spec.model.name)}[/bold] served on [bold]{spec.mapping.world_size}[/bold] "
        f"x {escape(report.system.accelerator.name)} ({escape(report.system.name)})"
    )
    console.print(
        f"strategy: {spec.mapping}  |  {report.replicas} replica(s) of {report.gpus_per_replica} "
        f"GPUs; batch {workload.batch_size} ({report.microbatches} microbatch(es) of "
        f"{report.microbatch_size}), prompt {workload.prompt_length}, "
        f"{workload.generated_tokens} generated tokens, KV cache {workload.kv_cache_datatype}"
    )
    times = Table(title="Latency and throughput (per replica unless stated)")
    times.add_column("figure")
    times.add_column("value", justify="right")
    times.add_row(
        "prefill latency = time to first token", f"{report.prefill_latency_s * MS:.2f} ms"
    )
    times.add_row("decode latency per token, mean", f"{report.decode_round_mean_s * MS:.3f} ms")
    times.add_row(
        "decode latency per token, final context", f"{report.decode_round_final_s * MS:.3f} ms"
    )
    times.add_row("request latency (prefill + all decode)", f"{report.request_latency_s:.3f} s")
    times.add_row("tokens/s per replica", f"{report.tokens_per_second_per_replica:,.0f}")
    times.add_row("tokens/s, deployment", f"{report.tokens_per_second:,.0f}")
    console.print(times)

    bounds = Table(title="Modelled time vs. speed-of-light bounds (one pass of the batch), ms; GiB")
    for column in (
        "phase",
        "modelled",
        "compute",
        "HBM",
        "TP comm",
        "weights",
        *(("of which experts",) if report.experts is not None else ()),
        "KV",
        "act.",
    ):
        bounds.add_column(column, justify="right" if column != "phase" else "left")
    moe = report.experts is not None
    bounds.add_row(*_bounds_row("prefill", report.prefill_bounds, experts=moe))
    bounds.add_row(*_bounds_row("decode (mean step)", report.decode_bounds, experts=moe))
    console.print(bounds)
    experts = report.experts
    if experts is not None:
        console.print(
            f"experts: EP{experts.expert_parallel_size} x expert TP "
            f"{experts.expert_tensor_parallel_size} over each stage's TP group, "
            f"{experts.experts_per_rank} of {experts.num_experts} experts per GPU, "
            f"{experts.moe_layers} MoE layers; expected distinct experts touched per MoE layer "
            f"(uniform top-{experts.top_k} routing): prefill "
            f"{experts.prefill_experts_touched:.2f} ({experts.prefill_tokens} tokens), decode "
            f"step {experts.decode_experts_touched:.2f} ({experts.decode_tokens} tokens)"
        )
    window = report.attention_window
    if window is not None:
        console.print(
            f"attention: sliding window on {window['windowed_layers']} of {window['layers']} "
            f"layers; each attends at most {window['window_keys']} keys and keeps that many "
            "tokens in its KV cache"
        )

    memory = report.memory
    weight_rows = (
        (("weights", memory.weights),)
        if experts is None
        else (
            ("weights, dense part", memory.dense_weights),
            ("weights, routed experts", memory.expert_weights),
        )
    )
    console.print(
        memory_table(
            memory.stage,
            (
                *weight_rows,
                ("KV cache", memory.kv_cache),
                ("activations", memory.activations),
            ),
            memory.total,
        )
    )
    verdict = fit_verdict(memory.fits)
    console.print(
        f"{memory.total / GIB:.1f} of {memory.capacity / GIB:.1f} GiB: {verdict}; "
        f"largest batch that fits: {report.max_batch_that_fits}"
    )


def render_search(reports: tuple[InferenceReport, ...], console: Console, *, title: str) -> None:
    from rich.table import Table

    table = Table(title=title)
    for column in (
        "#",
        "strategy",
        "batch",
        "TTFT ms",
        "decode ms/token",
        "tokens/s/replica",
        "tokens/s",
        "GiB/GPU",
        "max batch",
    ):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for rank, report in enumerate(reports, start=1):
        table.add_row(
            str(rank),
            str(report.spec.mapping),
            str(report.spec.mapping.workload.batch_size),
            f"{report.time_to_first_token_s * MS:.1f}",
            f"{report.decode_round_mean_s * MS:.3f}",
            f"{report.tokens_per_second_per_replica:,.0f}",
            f"{report.tokens_per_second:,.0f}",
            f"{report.memory.total / GIB:.1f}",
            str(report.max_batch_that_fits),
        )
    console.print(table)
