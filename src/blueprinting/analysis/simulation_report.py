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
from blueprinting.simulator.from_plan import (
    simulate_plan,
    simulated_bubble,
    simulation_passes,
)
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
        result = simulate_plan(plan, spec, report.system, allow_megatron_refused=refused)
        bubble_s = report.bubble_simulated_s
        if bubble_s is None:
            bubble_s = simulated_bubble(
                plan, spec, report.system, allow_megatron_refused=refused
            ).bubble_s
    except DeadlockError as error:
        return SimulationReport(
            plan=report,
            result=None,
            stuck=error.stuck,
            comparison=None,
            megatron_refusals=refusals,
        )
    return SimulationReport(
        plan=report,
        result=result,
        stuck=None,
        comparison=compare_bubble(plan, report.bubble, bubble_s),
        megatron_refusals=refusals,
    )
