"""SimulationReport: a plan, the full simulation of its schedule, and the contract comparison.

The JSON (``blueprinting simulate --json``) is the plan's JSON plus a ``simulation`` object; its
keys are a public contract (README, "simulate"): add, never rename. Seconds and counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from blueprinting.analysis.bubble_comparison import BubbleComparison, compare_bubble, explain
from blueprinting.analysis.report import IterationReport, JsonValue
from blueprinting.errors import DeadlockError, UnsupportedError
from blueprinting.simulator.engine import SimulationResult
from blueprinting.simulator.from_plan import simulate_plan_all, simulation_passes
from blueprinting.simulator.schedules import megatron_violations

MAX_CLI_PASSES = 8_000_000
"""Compute passes above which ``simulate`` refuses (several seconds and gigabytes beyond)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SimulationReport:
    """``result`` is None when the schedule deadlocks; ``stuck`` then names the commands that
    can never start. ``megatron_refusals`` lists the start-up rules Megatron-LM would raise (the
    schedule is then simulated as a hypothetical)."""

    plan: IterationReport
    result: SimulationResult | None
    stuck: tuple[str, ...] | None
    comparison: BubbleComparison | None
    megatron_refusals: tuple[str, ...]
    pipeline: SimulationResult | None = None
    """The same DAG with DP buckets free (the plan path's pipeline-only run)."""

    @property
    def iteration(self) -> IterationAgreement | None:
        """The simulated iteration time and where it differs from the plan's (None on a
        deadlock)."""
        if self.result is None or self.pipeline is None:
            return None
        return iteration_agreement(self.plan, self.result, self.pipeline)

    @property
    def explanation(self) -> list[str]:
        if self.comparison is None:
            return []
        mapping = self.plan.spec.mapping
        return explain(
            self.comparison,
            p=mapping.pipeline_degree,
            v=self.plan.plan.virtual_stages,
            m=mapping.microbatch_count,
            megatron_runs=not self.megatron_refusals,
        )

    def simulation_json(self) -> dict[str, JsonValue]:
        result = self.result
        comparison: JsonValue = None
        if self.comparison is not None:
            c = self.comparison
            comparison = {
                "contract_s": c.contract_s,
                "simulated_s": c.simulated_s,
                "difference_s": c.difference_s,
                "interleaving_term_s": c.interleaving_term_s,
                "extra_interleaving_chunks": c.extra_interleaving_chunks,
                "p2p_in_chunk_s": c.p2p_in_chunk_s,
                "imbalance_correction_s": c.imbalance_correction_s,
                "uniform_bubble_s": c.uniform_bubble_s,
                "schedule_residual_s": c.schedule_residual_s,
                "explanation": list(self.explanation),
            }
        agreement = self.iteration
        out: dict[str, JsonValue] = {
            "schedule": str(self.plan.spec.mapping.parallelism.pipeline.schedule),
            "megatron_refusals": list(self.megatron_refusals),
            "deadlock": None if self.stuck is None else list(self.stuck),
            "contract_comparison": comparison,
        }
        if result is None:
            out |= {
                "commands": None,
                "makespan_s": None,
                "pipeline_flush_s": None,
                "bubble_s": None,
                "busy_s_per_rank": None,
                "idle_s_per_rank": None,
                "comm_busy_s_per_rank": None,
                "peak_inflight_per_rank": None,
                "iteration_time_s": None,
                "iteration_terms_s": None,
                "plan_difference_s": None,
                "plan_difference_terms_s": None,
                "plan_difference_reasons": None,
            }
            return out
        out |= {
            "commands": len(result.dag),
            "makespan_s": result.makespan_s,
            "pipeline_flush_s": result.pipeline_flush_s,
            "bubble_s": result.bubble_s,
            "busy_s_per_rank": list(result.busy_s_per_rank),
            "idle_s_per_rank": list(result.idle_s_per_rank),
            "comm_busy_s_per_rank": list(result.comm_busy_s_per_rank),
            "peak_inflight_per_rank": list(result.peak_inflight_per_rank),
        }
        if agreement is not None:
            out |= {
                "iteration_time_s": agreement.iteration_time_s,
                "iteration_terms_s": {
                    "makespan": agreement.makespan_s,
                    "param_gather_exposed": agreement.param_gather_exposed_s,
                    "optimizer": agreement.optimizer_s,
                },
                "plan_difference_s": agreement.difference_s,
                "plan_difference_terms_s": {
                    "pipeline": agreement.pipeline_difference_s,
                    "dp_grad_sync": agreement.dp_grad_sync_difference_s,
                    "dp_sm_contention": agreement.dp_sm_contention_s,
                },
                "plan_difference_reasons": list(agreement.reasons),
            }
        return out

    def to_json_dict(self) -> dict[str, JsonValue]:
        values = self.plan.to_json_dict()
        values["simulation"] = self.simulation_json()
        return values


def simulation_report(report: IterationReport) -> SimulationReport:
    """Simulate ``report``'s plan in full (compute, P2P, DP buckets) and compare bubbles.

    A schedule Megatron-LM refuses (reachable with ``--no-megatron-rules``) is simulated as a
    hypothetical and its refusals listed; it may deadlock."""
    spec, plan = report.spec, report.plan
    schedule = spec.mapping.parallelism.pipeline.schedule
    m = spec.mapping.microbatch_count
    passes = simulation_passes(schedule, plan, m)
    if passes > MAX_CLI_PASSES:
        raise UnsupportedError(
            f"simulating {schedule} with p={plan.pipeline_degree}, v={plan.virtual_stages}, "
            f"m={m}: {passes:,} compute passes exceed the limit of {MAX_CLI_PASSES:,}"
        )
    refusals = tuple(
        violation.message
        for violation in megatron_violations(schedule, plan.pipeline_degree, m, plan.virtual_stages)
    )
    refused = bool(refusals)
    try:
        simulation = report.simulation
        if simulation is None:
            simulation = simulate_plan_all(
                plan, spec, report.system, allow_megatron_refused=refused
            )
    except DeadlockError as error:
        return SimulationReport(
            plan=report,
            result=None,
            stuck=error.stuck,
            comparison=None,
            megatron_refusals=refusals,
        )
    bubble_s = report.bubble_simulated_s
    if bubble_s is None:
        bubble_s = simulation.bubble.bubble_s
    return SimulationReport(
        plan=report,
        result=simulation.full,
        stuck=None,
        comparison=compare_bubble(plan, report.bubble, bubble_s),
        megatron_refusals=refusals,
        pipeline=simulation.pipeline,
    )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class IterationAgreement:
    """The simulated iteration and its difference from the plan's, term by term (seconds).

    The simulation runs compute, P2P and the DP gradient reduction (``makespan_s``); the
    distributed optimizer's all-gather of updated parameters and the optimizer step run after
    it and are not commands, so they are added as the plan computes them. What remains of
    ``plan - simulated`` is split into ``pipeline_difference_s`` (the plan's forward + backward +
    recompute + tp + cp + bubble + pp terms against the full simulation's pipeline flush),
    ``dp_grad_sync_difference_s`` (the plan's exposed gradient reduction of the critical stage
    against the simulated tail, makespan - flush) and ``dp_sm_contention_s`` (the compute the
    plan's hidden DP collectives slow by holding SMs, ``DataParallelCost.sm_contention_s``,
    which the simulation does not model)."""

    makespan_s: float
    param_gather_exposed_s: float
    optimizer_s: float
    plan_iteration_time_s: float
    pipeline_difference_s: float
    dp_grad_sync_difference_s: float
    dp_sm_contention_s: float
    reasons: tuple[str, ...]

    @property
    def iteration_time_s(self) -> float:
        return self.makespan_s + self.param_gather_exposed_s + self.optimizer_s

    @property
    def difference_s(self) -> float:
        """plan - simulated iteration time."""
        return self.plan_iteration_time_s - self.iteration_time_s


AGREEMENT_NOTE_S = 1e-9
"""Differences below this (seconds) get no sentence."""


def iteration_agreement(
    report: IterationReport, full: SimulationResult, pipeline: SimulationResult
) -> IterationAgreement:
    """Compose the simulated iteration and split its difference from ``report``'s."""
    terms = report.breakdown
    dp = report.data_parallel
    plan_pipeline = (
        terms.forward
        + terms.backward
        + terms.recompute
        + terms.tp_comm_exposed
        + terms.cp_comm_exposed
        + terms.ep_comm_exposed
        + terms.host_exposed
        + terms.pipeline_bubble
        + terms.pp_comm_exposed
    )
    pipeline_diff = plan_pipeline - full.pipeline_flush_s
    tail = full.makespan_s - full.pipeline_flush_s
    dp_diff = terms.dp_comm_exposed - dp.sm_contention_s - dp.param_gather_exposed_s - tail
    reasons: list[str] = []
    if abs(pipeline_diff) > AGREEMENT_NOTE_S:
        contention = full.pipeline_flush_s - pipeline.pipeline_flush_s
        why = (
            f"the plan's pipeline terms use the {report.bubble_source} bubble"
            if report.bubble_source != "simulated"
            else "the plan's pipeline terms are the simulated flush without DP buckets"
        )
        reasons.append(
            f"pipeline {pipeline_diff:+.6g} s: {why}; DP buckets competing with P2P on the "
            f"communication stream delay the full simulation's flush by {contention:.6g} s"
        )
    if abs(dp_diff) > AGREEMENT_NOTE_S:
        reasons.append(
            f"dp_grad_sync {dp_diff:+.6g} s: the plan charges the critical stage's exposed "
            f"gradient reduction ({dp.grad_sync_exposed_s:.6g} s) after its own work; the "
            f"simulation runs every rank's buckets on its own stream, and the reduction ends "
            f"{tail:.6g} s after the pipeline flush"
        )
    if dp.sm_contention_s > AGREEMENT_NOTE_S:
        reasons.append(
            f"dp_sm_contention {dp.sm_contention_s:+.6g} s: the plan lengthens the compute its "
            "hidden data-parallel collectives run beside by the SMs NCCL's ring kernel holds; "
            "the simulation does not model it"
        )
    return IterationAgreement(
        makespan_s=full.makespan_s,
        param_gather_exposed_s=dp.param_gather_exposed_s,
        optimizer_s=terms.optimizer,
        plan_iteration_time_s=report.iteration_time_s,
        pipeline_difference_s=pipeline_diff,
        dp_grad_sync_difference_s=dp_diff,
        dp_sm_contention_s=dp.sm_contention_s,
        reasons=tuple(reasons),
    )
