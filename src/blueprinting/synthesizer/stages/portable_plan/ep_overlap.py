"""Combined 1F1B's layer-level overlap of the expert-parallel all-to-alls, timed in its real op
order; the one implementation the plan, the vectorized search (through the plan's block costs)
and the simulator (through :class:`~blueprinting.simulator.costs.ScheduleCosts`) read.

Megatron-Core ``models/common/model_chunk_schedule_plan.py`` (@d98e8a64,
``TransformerLayerSchedulePlan.run``) splits a MoE layer into ``pre_dispatch_computation``
(attention -> norm -> router -> dispatch preprocess), ``moe_dispatch`` (the all-to-all),
``mlp`` (the routed experts) and ``moe_combine`` (the all-to-all and its unpermute). The
forward of one micro-batch and the backward of another are issued layer by layer on two CUDA
streams, in this order:

    comm stream:  combine_bwd | dispatch_fwd -> dispatch_bwd | combine_fwd
    comp stream:  pre_dispatch_fwd | mlp_bwd -> (mlp_bwd_dw) -> mlp_fwd | pre_dispatch_bwd
                  -> (pre_dispatch_bwd_dw)

Each node waits on its own micro-batch's event (the previous node of its forward or its
backward chain) and runs after the previous node of its stream. With ``--delay-wgrad-compute``
the weight-gradient GEMMs (``backward_dw``) are split from the data-gradient ones: the mlp's
run on the comp stream while ``dispatch_bwd`` is in flight (``backward_dw`` records no event,
so the all-to-all waits only for the data gradient), the attention's at the end of the layer,
beside the next layer's ``combine_bwd``. Without it the weight gradients are part of
``mlp_bwd`` and ``pre_dispatch_bwd``.

A layer's time in a steady stream of identical layers is the increment of the two-stream
schedule per layer (:func:`_steady_increment`); the first layer's edge is not counted.

A flex library's exchange kernels hold a share ``f`` of the GPU's SMs while they run (DeepEP's
and HybridEP's ``num_sms``: the Hybrid-EP README's point is "achieve excellent performance with
as few SMs as possible"), so the compute that runs beside them runs on the rest. Taken to first
order, as Transformer Engine's userbuffer overlap is (:func:`.tp_overlap.sm_fraction`): the
layer is lengthened by ``f / (1 - f)`` x the time the two streams overlap in the schedule
(compute slowed in proportion to the SMs it loses; the lengthened compute is not re-scheduled).
NCCL's all-to-all (the alltoall dispatcher) holds SMs too: its grouped send / receive kernel
runs one thread block per P2P channel, ``p2pnChannels`` of them
(:attr:`~blueprinting.hardware.system.RuntimeMemory.nccl_p2p_ctas`: 32 on H100 and Blackwell,
``f`` = 32 / 132 on H100). Checked on Megatron-Bridge's own A/B (Qwen3-30B-A3B, 16 H100, EP 16,
``docs/training/communication-overlap.md`` @067f987df0: 41.25 -> 31.31 s with the overlap): the
overlap saves 8.45 s in the model with NCCL's SMs, 12.64 s with ``f = 0``
(``tests/validation/test_moe_docs_runs.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from blueprinting.errors import ConfigError

_COMP, _COMM = 0, 1
_STEADY_LAYERS = 4
"""Layers simulated to read the steady per-layer increment (the two-stream pattern repeats
from the second layer on: each layer's ops depend only on the previous layer's tails)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MoeLayerPasses:
    """One MoE layer's nodes for one micro-batch on one GPU (seconds). ``*_attention_*`` is
    ``pre_dispatch_computation`` (everything but the routed experts and the token exchanges,
    with its exposed TP / CP communication; the backward's includes recompute);
    ``*_experts_*`` the ``mlp`` node; ``*_dispatch_s`` / ``*_combine_s`` the expert-parallel
    exchanges (all-to-all, and the etp gathers beside it) with the unpermute in the combine."""

    forward_attention_s: float
    forward_dispatch_s: float
    forward_experts_s: float
    forward_combine_s: float
    backward_combine_s: float
    backward_experts_dgrad_s: float
    backward_experts_wgrad_s: float
    backward_dispatch_s: float
    backward_attention_dgrad_s: float
    backward_attention_wgrad_s: float
    #: the share of the SMs the exchange kernels hold while they run (module docstring)
    exchange_sm_share: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.exchange_sm_share < 1.0:
            raise ConfigError(
                [
                    "MoeLayerPasses.exchange_sm_share must be in [0, 1): the exchange kernels "
                    f"would hold every SM, got {self.exchange_sm_share!r}"
                ]
            )

    @property
    def forward_s(self) -> float:
        return (
            self.forward_attention_s
            + self.forward_dispatch_s
            + self.forward_experts_s
            + self.forward_combine_s
        )

    @property
    def backward_s(self) -> float:
        return (
            self.backward_combine_s
            + self.backward_experts_dgrad_s
            + self.backward_experts_wgrad_s
            + self.backward_dispatch_s
            + self.backward_attention_dgrad_s
            + self.backward_attention_wgrad_s
        )

    @property
    def forward_exchange_s(self) -> float:
        return self.forward_dispatch_s + self.forward_combine_s

    @property
    def backward_exchange_s(self) -> float:
        return self.backward_dispatch_s + self.backward_combine_s


def _two_streams(
    passes: MoeLayerPasses, layers: int, *, forward: bool, backward: bool, delay_wgrad: bool
) -> tuple[float, float]:
    """(makespan, time both streams are busy) of ``layers`` layers of
    ``TransformerLayerSchedulePlan.run`` (module docstring) with the forward, the backward or
    both; ops in Megatron's issue order."""
    free = [0.0, 0.0]
    f_tail = b_tail = 0.0
    end = 0.0
    busy: tuple[list[tuple[float, float]], list[tuple[float, float]]] = ([], [])

    def run(stream: int, duration: float, after: float) -> float:
        nonlocal end
        start = max(free[stream], after)
        free[stream] = start + duration
        end = max(end, free[stream])
        if duration > 0.0:
            busy[stream].append((start, free[stream]))
        return free[stream]

    x = passes
    mlp_bwd = x.backward_experts_dgrad_s + (0.0 if delay_wgrad else x.backward_experts_wgrad_s)
    attn_bwd = x.backward_attention_dgrad_s + (0.0 if delay_wgrad else x.backward_attention_wgrad_s)
    for _ in range(layers):
        combine_b = run(_COMM, x.backward_combine_s, b_tail) if backward else 0.0
        attn_f = run(_COMP, x.forward_attention_s, f_tail) if forward else 0.0
        mlp_b = run(_COMP, mlp_bwd, combine_b) if backward else 0.0
        dispatch_f = run(_COMM, x.forward_dispatch_s, attn_f) if forward else 0.0
        if backward and delay_wgrad:
            run(_COMP, x.backward_experts_wgrad_s, mlp_b)
        dispatch_b = run(_COMM, x.backward_dispatch_s, mlp_b) if backward else 0.0
        if forward:
            mlp_f = run(_COMP, x.forward_experts_s, dispatch_f)
            f_tail = run(_COMM, x.forward_combine_s, mlp_f)
        if backward:
            b_tail = run(_COMP, attn_bwd, dispatch_b)
            if delay_wgrad:
                run(_COMP, x.backward_attention_wgrad_s, b_tail)
    # a stream's intervals never overlap each other (each op starts when the last one ends)
    both = sum(
        max(0.0, min(a_end, b_end) - max(a_start, b_start))
        for a_start, a_end in busy[_COMP]
        for b_start, b_end in busy[_COMM]
    )
    return end, both


def _steady_increment(
    passes: MoeLayerPasses, *, forward: bool, backward: bool, delay_wgrad: bool
) -> float:
    """One steady layer's time: the schedule's increment per layer, lengthened by the SM share
    the exchange kernels take from the compute beside them (module docstring)."""

    def span(layers: int) -> tuple[float, float]:
        return _two_streams(
            passes, layers, forward=forward, backward=backward, delay_wgrad=delay_wgrad
        )

    (end, both), (before, both_before) = span(_STEADY_LAYERS), span(_STEADY_LAYERS - 1)
    share = passes.exchange_sm_share
    return end - before + (both - both_before) * share / (1.0 - share)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CombinedLayerTiming:
    """One MoE layer under combined 1F1B (seconds per layer, steady state).

    ``pair_s``: a forward and a backward co-scheduled; ``forward_alone_s`` /
    ``backward_alone_s``: a warm-up forward / cool-down backward without a partner;
    ``*_work_s``: the nodes other than the exchanges (what cannot hide); ``*_exchange_s``: the
    exchanges. ``exposed_s = pair_s - work_s`` is the part of the exchanges on the pair's
    critical path, ``hidden_s`` the rest; ``hidden_by_delayed_wgrad_s``: how much of
    ``hidden_s`` exists only because ``--delay-wgrad-compute`` runs the weight gradients under
    the backward's dispatch (0 without it). ``exposed_s`` is split over the two passes in
    proportion to their exchanges (the plan books each in its phase)."""

    pair_s: float
    forward_alone_s: float
    backward_alone_s: float
    forward_work_s: float
    backward_work_s: float
    forward_exchange_s: float
    backward_exchange_s: float
    hidden_by_delayed_wgrad_s: float

    @property
    def work_s(self) -> float:
        return self.forward_work_s + self.backward_work_s

    @property
    def exchange_s(self) -> float:
        return self.forward_exchange_s + self.backward_exchange_s

    @property
    def exposed_s(self) -> float:
        return min(self.exchange_s, max(0.0, self.pair_s - self.work_s))

    @property
    def hidden_s(self) -> float:
        return self.exchange_s - self.exposed_s

    @property
    def forward_exposed_s(self) -> float:
        share = self.forward_exchange_s / self.exchange_s if self.exchange_s > 0.0 else 0.0
        return self.exposed_s * share

    @property
    def backward_exposed_s(self) -> float:
        return self.exposed_s - self.forward_exposed_s

    @property
    def unpaired_forward_s(self) -> float:
        """What a forward alone adds over its share of a pair."""
        return max(0.0, self.forward_alone_s - self.forward_work_s - self.forward_exposed_s)

    @property
    def unpaired_backward_s(self) -> float:
        """What a backward alone adds over its share of a pair."""
        return max(0.0, self.backward_alone_s - self.backward_work_s - self.backward_exposed_s)


def combined_layer_timing(passes: MoeLayerPasses, *, delay_wgrad: bool) -> CombinedLayerTiming:
    """Time one MoE layer of combined 1F1B in Megatron's op order (module docstring)."""

    def increment(*, forward: bool, backward: bool, delay: bool) -> float:
        return _steady_increment(passes, forward=forward, backward=backward, delay_wgrad=delay)

    pair_s = increment(forward=True, backward=True, delay=delay_wgrad)
    hidden_by_wgrad = (
        max(0.0, increment(forward=True, backward=True, delay=False) - pair_s)
        if delay_wgrad
        else 0.0
    )
    return CombinedLayerTiming(
        pair_s=pair_s,
        forward_alone_s=increment(forward=True, backward=False, delay=delay_wgrad),
        backward_alone_s=increment(forward=False, backward=True, delay=delay_wgrad),
        forward_work_s=passes.forward_s - passes.forward_exchange_s,
        backward_work_s=passes.backward_s - passes.backward_exchange_s,
        forward_exchange_s=passes.forward_exchange_s,
        backward_exchange_s=passes.backward_exchange_s,
        hidden_by_delayed_wgrad_s=hidden_by_wgrad,
    )
