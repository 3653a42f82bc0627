"""The bridge from the cost model (``blueprinting.api.plan_spec``) to the validation engine.

This is the only place that knows how a plan report spells the figures the papers measured; the
rest of :mod:`blueprinting.validation` sees :class:`Prediction` only. ``blueprinting.api`` is
imported when a predictor is asked for, so the validation engine loads without the cost model.

One call per published run::

    report = plan_spec(run.training_spec(), run.system)   # system: preset name
    values = report.to_json_dict()                        # the ``plan --json`` object

and the dotted paths of :data:`REPORT_PATHS` inside ``values`` (SI units; a numeric part indexes
a list). A path that is absent leaves that figure unpredicted; it does not fail the run.
Korthikanti et al. 2022 and Calculon measure memory on the first pipeline stage's GPU, hence the
``.0`` of the per-stage lists. Their activation figures are what the in-flight blocks store
(Korthikanti Eqs. 1-2 and Table 2), so the prediction is ``layers_stored``, without the transient
working set recomputation rebuilds in backward (which the plan's memory total does count).
Table 4's backward time includes the recompute forward.

Software generation. The runs of Narayanan et al. 2021 (Table 1) used the Megatron-LM of the SC'21
artifact (commit 6985e58938, 2021-08-18, per ``examples/sc21/README``), which predates the
asynchronous backward all-reduce of column-parallel linears (commit cf7efd4f5a, 2021-08-30): each
is costed on its system with ``async_tp_backward_comm = False``
(:data:`SYNCHRONOUS_TP_BACKWARD_TABLES`), uniformly for the whole table. Korthikanti et al. 2022
(Tables 4-5) ran the 2022 code, which overlaps it, as the preset does.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, final

from blueprinting.errors import UnsupportedError
from blueprinting.hardware.system import SystemSpec
from blueprinting.validation.comparison import Prediction, Predictor, needs_iteration_time
from blueprinting.validation.published import PublishedRun, SourceTable

if TYPE_CHECKING:
    from blueprinting.mapping.transformer import TrainingSpec

#: Tables measured with a Megatron-LM whose TP backward all-reduce was synchronous (docstring).
SYNCHRONOUS_TP_BACKWARD_TABLES: frozenset[SourceTable] = frozenset(
    {SourceTable.NARAYANAN2021_TABLE1}
)


def system_for_run(run: PublishedRun, system: SystemSpec) -> SystemSpec:
    """``system`` as the software of ``run``'s paper ran on it (module docstring)."""
    if run.source_table in SYNCHRONOUS_TP_BACKWARD_TABLES:
        return replace(system, async_tp_backward_comm=False)
    return system


#: Prediction field -> dotted path in ``plan_spec(...).to_json_dict()``.
REPORT_PATHS: Mapping[str, str] = {
    "iteration_time_s": "iteration_time_s",
    "layer_forward_s": "block_time_s.forward",
    "layer_backward_s": "block_time_s.backward_with_recompute",
    "activation_memory_bytes": "memory_activations_stored_bytes_per_stage.0",
    "static_memory_bytes": "memory_static_bytes_per_stage.0",
}


def _lookup(values: Mapping[str, object], path: str) -> float | None:
    node: object = values
    for part in path.split("."):
        if isinstance(node, Mapping):
            if part not in node:
                return None
            node = node[part]
        elif isinstance(node, Sequence) and not isinstance(node, str) and part.isdigit():
            index = int(part)
            if index >= len(node):
                return None
            node = node[index]
        else:
            return None
    if isinstance(node, bool) or not isinstance(node, int | float):
        return None
    return float(node)


def prediction_from_report(values: Mapping[str, object]) -> Prediction:
    """Read the figures of :data:`REPORT_PATHS` out of a report's JSON dict."""
    return Prediction(
        iteration_time_s=_lookup(values, REPORT_PATHS["iteration_time_s"]),
        layer_forward_s=_lookup(values, REPORT_PATHS["layer_forward_s"]),
        layer_backward_s=_lookup(values, REPORT_PATHS["layer_backward_s"]),
        activation_memory_bytes=_lookup(values, REPORT_PATHS["activation_memory_bytes"]),
        static_memory_bytes=_lookup(values, REPORT_PATHS["static_memory_bytes"]),
    )


def cost_model_function(name: str) -> Callable[..., Any]:
    """``blueprinting.api.<name>``, imported now (the engine itself loads without the cost model).

    Raises :class:`UnsupportedError` (with the reason) when the cost model is not installed or
    has no such function.
    """
    try:
        api = importlib.import_module("blueprinting.api")
    except ImportError as error:
        raise UnsupportedError(f"blueprinting.api cannot be imported ({error})") from error
    function: object = getattr(api, name, None)
    if not callable(function):
        raise UnsupportedError(f"blueprinting.api has no callable {name}()")
    return function


@final
class PlanCache:
    """The plan reports (``plan --json`` objects) of one validation or calibration run, each
    strategy planned once however many rows, readings and fixtures ask for it (issue #18: the
    dense and MoE fixtures repeat strategies, and ``validate`` answers in seconds).

    ``simulate=False`` plans without the schedule simulation (``PlanOptions.simulate``): exact
    for every figure but the iteration time and what derives from it, since the simulation
    only chooses the bubble; a simulated report serves such a request too. Plans that raise
    are not kept (the error is raised again on the next request)."""

    def __init__(self) -> None:
        self._plan_spec = cost_model_function("plan_spec")
        self._values: dict[tuple[object, object, bool, bool], Mapping[str, object]] = {}

    def values(
        self,
        spec: TrainingSpec,
        system: SystemSpec | str,
        *,
        simulate: bool = True,
        megatron_rules: bool = True,
    ) -> Mapping[str, object]:
        """``plan_spec(spec, system).to_json_dict()`` (planned at most once);
        ``megatron_rules=False`` checks the planner's laws alone (``plan --no-megatron-rules``)."""
        found = self._values.get((spec, system, True, megatron_rules))
        if found is None and not simulate:
            found = self._values.get((spec, system, False, megatron_rules))
        if found is not None:
            return found
        from blueprinting.analysis.evaluate import PlanOptions

        options = PlanOptions(simulate=simulate, megatron_rules=megatron_rules)
        values = self._plan_spec(spec, system, options).to_json_dict()
        if not isinstance(values, Mapping):
            raise UnsupportedError(f"plan report of {spec} is not a JSON object")
        self._values[(spec, system, simulate, megatron_rules)] = values
        return values


def api_predictor(plans: PlanCache | None = None) -> Predictor:
    """A predictor backed by ``blueprinting.api.plan_spec`` (the plan's default options), through
    ``plans`` (a new cache when None). A run with no measured figure compared through the
    iteration time is planned without the simulation (:class:`PlanCache`).

    Raises :class:`UnsupportedError` (with the reason) when the cost model is not installed.
    """
    cache = PlanCache() if plans is None else plans

    from blueprinting.hardware.presets import system_preset

    def predict(run: PublishedRun) -> Prediction:
        return prediction_from_report(
            cache.values(
                run.training_spec(),
                system_for_run(run, system_preset(run.system)),
                simulate=needs_iteration_time(run),
            )
        )

    return predict


def system_predictor(system: SystemSpec, plans: PlanCache | None = None) -> Predictor:
    """A predictor that costs every run on ``system`` instead of the run's preset (calibration),
    planned as :func:`api_predictor` plans."""
    cache = PlanCache() if plans is None else plans

    def predict(run: PublishedRun) -> Prediction:
        return prediction_from_report(
            cache.values(
                run.training_spec(),
                system_for_run(run, system),
                simulate=needs_iteration_time(run),
            )
        )

    return predict
