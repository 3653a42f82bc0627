"""Closed forms the simulator is checked against (shared/reference/schedules.md).

These are formulas, not simulations: the tests compare them with :func:`simulate`.
"""

from __future__ import annotations

from blueprinting.analysis.pipeline_contract import analytic_bubble


def analytic_contract_bubble(
    p: int, v: int, m: int, tf: float, tb: float, *, imbalance_correction: float = 0.0
) -> float:
    """The seed's analytic 1F1B contract (seed spec, "Pipeline-schedule mapping"), exactly:

        T_chunk  = tf + tb                      (one VIRTUAL chunk's forward + backward)
        n_bubble = (p - 1) + extra
        extra    = (v - 1)(p - m mod p)  if m mod p != 0 else 0
        T_bubble = n_bubble * T_chunk - imbalance_correction

    For every schedule Megatron-LM accepts, the simulated bubble is (p-1)(tf+tb): the extra term
    over-estimates it by (v-1)(p - m mod p)(tf+tb) whenever v >= 2 and m mod p != 0 (a case
    Megatron only runs with a microbatch group size N > p, schedules.md section 4). The extra
    term follows Calculon's pessimistic bubble reasoning (calculon/llm/llm.py).

    The formula itself lives once, in
    :func:`blueprinting.analysis.pipeline_contract.analytic_bubble`; this is its scalar shorthand
    for the simulator's cross-checks.
    """
    return analytic_bubble(
        p=p,
        v=v,
        m=m,
        forward_chunk_s=tf,
        backward_chunk_s=tb,
        imbalance_correction_s=imbalance_correction,
    ).bubble_s


def one_f_one_b_peak_inflight(p: int, m: int, r: int) -> int:
    """Non-interleaved 1F1B, rank r: min(p - r, m) microbatches in flight (schedules.md 5)."""
    return min(p - r, m)


def interleaved_peak_inflight(p: int, v: int, m: int, n: int, r: int) -> int:
    """Interleaved 1F1B, rank r: min(2(p-r-1) + (v-1)N + 1, m v) chunks in flight
    (schedules.md 5; the warm-up count of Megatron's interleaved schedule plus one)."""
    return min(2 * (p - r - 1) + (v - 1) * n + 1, m * v)


def one_f_one_b_p2p_exposed(p: int, m: int, c: float) -> float:
    """Makespan added by a P2P latency c per hop in non-interleaved 1F1B, m >= 2:
    c [2(p-1) + 2(m - 2 - floor((m-2)/p))] (schedules.md 4); 1F1B does not hide latency in
    its steady state because each rank waits for the gradient of the forward it just sent."""
    return c * (2 * (p - 1) + 2 * (m - 2 - (m - 2) // p))


def interleaved_p2p_exposed(p: int, v: int, c: float) -> float:
    """Makespan added by a P2P latency c per hop in interleaved 1F1B with overlapped
    (asynchronous) P2P: 2(p v - 1) c, independent of m, valid while c <= tf (schedules.md 4):
    only the fill and drain of the p v virtual stages see it."""
    return 2 * (p * v - 1) * c


def dualpipe_bubble(
    stages: int, forward_and_backward: float, backward: float, weight: float
) -> float:
    """The DualPipe README's bubble for DualPipe and DualPipeV, as written:
    ``(PP/2 - 1)(F&B + B - 3W)`` with PP the number of pipeline stages (p for DualPipe, 2p for
    DualPipeV on p ranks), F&B one forward and one backward chunk run together (F + B here: the
    simulator overlaps no communication inside them), B a full backward, W its weight-gradient
    part. The simulation (bubble = idle time of the busiest rank) equals it when B - W = F and
    differs otherwise (``tests/simulator/test_dualpipe.py``)."""
    return (stages / 2 - 1) * (forward_and_backward + backward - 3 * weight)


def dualpipe_peak_inflight(stages: int) -> int:
    """Activation memory per device of DualPipe and DualPipeV, in chunks: PP + 1 (DualPipe
    README table); the simulation gives it on every rank."""
    return stages + 1
