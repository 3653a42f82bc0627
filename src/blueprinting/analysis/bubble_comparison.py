"""Where the seed's analytic bubble contract and the simulated schedule differ, term by term.

With c_f, c_b the P2P times PortablePlanIR adds to the forward and backward chunk, tf, tb the
chunk compute critical paths (so T_chunk = tf + c_f + tb + c_b) and ``extra`` the contract's
interleaving term, the contract is (seed, "Pipeline-schedule mapping")

    T_contract = (p - 1 + extra) T_chunk - T_imbalance_correction

and the difference to the simulated bubble (the busiest rank's idle time, P2P free) splits exactly
into

    T_contract - T_simulated =   extra x T_chunk                       (interleaving term)
                               + (p - 1)(c_f + c_b)                    (P2P counted in T_chunk)
                               - T_imbalance_correction
                               + ((p - 1)(tf + tb) - T_simulated)      (schedule residual)

- interleaving term: for v >= 2 and m mod p != 0 the contract adds (v - 1)(p - m mod p) chunks.
  No schedule Megatron-LM runs has that bubble: it refuses the default group size N = p there,
  and with a legal N > p the bubble stays (p - 1)(tf + tb) for uniform chunks
  (shared/reference/schedules.md section 4). It is Calculon's pessimistic reasoning
  (calculon/llm/llm.py, caa4b11, bubble computation).
- P2P: the simulated bubble leaves P2P out; the simulated P2P delay is reported (and, with the
  simulated bubble source, charged) as pp_comm_exposed.
- residual: what the schedule itself adds beyond (p - 1)(tf + tb) of the largest chunk: the
  embedding and LM-head extras on the first and last virtual stages and uneven stages
  (schedules.md section 4 shows the imbalance correction overestimates uneven bubbles).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from blueprinting.analysis.pipeline_contract import BubbleContract
from blueprinting.synthesizer.stages.portable_plan.ir import PortablePlanIR


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class BubbleComparison:
    """The terms of the module docstring's split (seconds); ``difference_s`` is their sum."""

    contract_s: float
    simulated_s: float
    interleaving_term_s: float
    extra_interleaving_chunks: int
    p2p_in_chunk_s: float
    imbalance_correction_s: float
    uniform_bubble_s: float
    schedule_residual_s: float

    @property
    def difference_s(self) -> float:
        """T_contract - T_simulated (positive: the contract overestimates)."""
        return self.contract_s - self.simulated_s


def compare_bubble(
    plan: PortablePlanIR, contract: BubbleContract, simulated_s: float
) -> BubbleComparison:
    """Split ``contract.bubble_s - simulated_s`` (module docstring)."""
    p = plan.pipeline_degree
    p2p = plan.p2p_forward_s + plan.p2p_backward_s if p > 1 else 0.0
    uniform = (p - 1) * (contract.chunk_time_s - p2p) if p > 1 else 0.0
    return BubbleComparison(
        contract_s=contract.bubble_s,
        simulated_s=simulated_s,
        interleaving_term_s=contract.extra_interleaving_bubbles * contract.chunk_time_s,
        extra_interleaving_chunks=contract.extra_interleaving_bubbles,
        p2p_in_chunk_s=(p - 1) * p2p if p > 1 else 0.0,
        imbalance_correction_s=contract.imbalance_correction_s,
        uniform_bubble_s=uniform,
        schedule_residual_s=uniform - simulated_s,
    )


def explain(
    comparison: BubbleComparison, *, p: int, v: int, m: int, megatron_runs: bool = True
) -> list[str]:
    """One sentence per non-zero term of the split. ``megatron_runs`` False: the simulated
    schedule is a hypothetical Megatron-LM refuses."""
    lines: list[str] = []
    c = comparison
    if c.extra_interleaving_chunks:
        extra = (
            f"the contract adds (v-1)(p - m mod p) = ({v}-1)({p} - {m % p}) = "
            f"{c.extra_interleaving_chunks} chunks = {c.interleaving_term_s:.6g} s "
            "for m mod p != 0; "
        )
        if megatron_runs:
            extra += (
                "no schedule Megatron-LM runs has them: it refuses m mod p != 0 with the "
                "default group size N = p, and with a legal N > p the bubble stays "
                "(p-1)(tf+tb) (shared/reference/schedules.md section 4), so the contract "
                f"overestimates this schedule by {c.difference_s:.6g} s in all"
            )
        else:
            extra += (
                "this schedule is one Megatron-LM refuses, the kind the extra term describes "
                "(shared/reference/schedules.md section 4)"
            )
        lines.append(extra)
    if c.p2p_in_chunk_s:
        lines.append(
            f"the contract's T_chunk holds one P2P transfer each way: (p-1)(c_f+c_b) = "
            f"{c.p2p_in_chunk_s:.6g} s; the simulated bubble is P2P-free and the simulated "
            "P2P delay is reported as pp_comm_exposed"
        )
    if c.imbalance_correction_s:
        lines.append(
            f"the contract subtracts an imbalance correction of {c.imbalance_correction_s:.6g} s "
            "for uneven stages"
        )
    if c.schedule_residual_s:
        sign = "shorter" if c.schedule_residual_s > 0 else "longer"
        cause = (
            "first/last-stage extras (embedding, LM head + loss) and uneven stages shift the "
            "busiest rank's idle"
        )
        if not megatron_runs:
            cause = "the hypothetical schedule's own dependency bubbles, and " + cause
        lines.append(
            f"the simulated bubble is {abs(c.schedule_residual_s):.6g} s {sign} than "
            f"(p-1)(tf+tb) = {c.uniform_bubble_s:.6g} s of the largest chunk: {cause}"
        )
    return lines
