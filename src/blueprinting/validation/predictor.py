"""The bridge from the cost model (``blueprinting.api.plan``) to the validation engine.

This is the only place that knows how a plan report spells the figures the papers measured; the
rest of :mod:`blueprinting.validation` sees :class:`Prediction` only. ``blueprinting.api`` is
imported when a predictor is asked for, so this module loads while the cost model does not exist.

Contract assumed of the cost model (one call per published run)::

    report = plan(run.training_spec(), system=run.system)   # system: preset name
    values = report.to_json_dict()                          # nested dict of JSON scalars

and the dotted paths of :data:`REPORT_PATHS` inside ``values`` (SI units). A path that is absent
leaves that figure unpredicted; it does not fail the run.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from blueprinting.errors import UnsupportedError
from blueprinting.validation.comparison import Prediction, Predictor
from blueprinting.validation.published import PublishedRun

#: Prediction field -> dotted path in ``plan(...).to_json_dict()``.
REPORT_PATHS: Mapping[str, str] = {
    "iteration_time_s": "iteration.time_s",
    "layer_forward_s": "block.forward_time_s",
    "layer_backward_s": "block.backward_time_s",
    "activation_memory_bytes": "memory.activations_bytes",
    "static_memory_bytes": "memory.static_bytes",
}


def _lookup(values: Mapping[str, object], path: str) -> float | None:
    node: object = values
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
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


def api_predictor() -> Predictor:
    """A predictor backed by ``blueprinting.api.plan``.

    Raises :class:`UnsupportedError` (with the reason) when the cost model is not installed.
    """
    try:
        api = importlib.import_module("blueprinting.api")
    except ImportError as error:
        raise UnsupportedError(f"blueprinting.api cannot be imported ({error})") from error
    plan = getattr(api, "plan", None)
    if not callable(plan):
        raise UnsupportedError("blueprinting.api has no callable plan()")

    def predict(run: PublishedRun) -> Prediction:
        report = plan(run.training_spec(), system=run.system)
        values = report.to_json_dict()
        if not isinstance(values, Mapping):
            raise UnsupportedError(f"plan report of {run.id!r} is not a JSON object")
        return prediction_from_report(values)

    return predict
