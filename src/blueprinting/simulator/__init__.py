"""Concrete pipeline schedules: command DAG, its longest path (numpy wavefront), traces, plots.

Data flows one way: :class:`ScheduleCosts` (per-chunk times, from PortablePlanIR or by hand) and a
:data:`~blueprinting.mapping.transformer.PipelineSchedule` -> :func:`build_schedule` ->
:class:`CommandDag` -> :func:`simulate` -> :class:`SimulationResult` -> :func:`write_chrome_trace` /
:func:`plot_timeline`. :mod:`blueprinting.simulator.from_plan` builds the costs from a
PortablePlanIR (imported on its own: it depends on the analysis modules it reads costs from).
"""

from blueprinting.simulator.analytic import (
    analytic_contract_bubble,
    dualpipe_bubble,
    dualpipe_peak_inflight,
    interleaved_p2p_exposed,
    interleaved_peak_inflight,
    one_f_one_b_p2p_exposed,
    one_f_one_b_peak_inflight,
)
from blueprinting.simulator.commands import (
    Command,
    CommandDag,
    CommandKind,
    Stream,
    build_from_orders,
    build_schedule,
)
from blueprinting.simulator.costs import DpBucket, ScheduleCosts
from blueprinting.simulator.engine import SimulationResult, simulate
from blueprinting.simulator.plot import plot_timeline
from blueprinting.simulator.schedules import (
    OpKind,
    RankOrder,
    megatron_violations,
    rank_orders,
)
from blueprinting.simulator.trace import chrome_trace_events, write_chrome_trace

__all__ = [
    "Command",
    "CommandDag",
    "CommandKind",
    "DpBucket",
    "OpKind",
    "RankOrder",
    "ScheduleCosts",
    "SimulationResult",
    "Stream",
    "analytic_contract_bubble",
    "build_from_orders",
    "build_schedule",
    "chrome_trace_events",
    "dualpipe_bubble",
    "dualpipe_peak_inflight",
    "interleaved_p2p_exposed",
    "interleaved_peak_inflight",
    "megatron_violations",
    "one_f_one_b_p2p_exposed",
    "one_f_one_b_peak_inflight",
    "plot_timeline",
    "rank_orders",
    "simulate",
    "write_chrome_trace",
]
