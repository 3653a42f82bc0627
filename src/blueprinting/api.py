"""The Python API: the same reach as the CLI, for notebooks and scripts.

    from blueprinting.api import plan
    report = plan(model="gpt3-175b", system="dgx-a100-80gb", gpus=1024,
                  settings={"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 8,
                            "global_batch_size": 1536, "sequence_parallel": True})
    report.iteration_time_s, report.mfu, report.to_json_dict()

or ``plan(spec, system=...)`` with a :class:`~blueprinting.mapping.transformer.TrainingSpec`.
Every strategy is checked against the laws first (all violations raised at once).
"""

from __future__ import annotations

from collections.abc import Mapping

from blueprinting.analysis.evaluate import PlanOptions, evaluate_plan
from blueprinting.analysis.report import IterationReport
from blueprinting.errors import ConfigError, InvalidStrategyError
from blueprinting.hardware.presets import system_preset
from blueprinting.hardware.system import SystemSpec
from blueprinting.mapping.flat_keys import (
    from_mapping,
    megatron_args_of_lawful,
    to_mapping,
    to_megatron_args,
)
from blueprinting.mapping.laws import validate_training
from blueprinting.mapping.model import TransformerModelSpec
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import TrainingSpec

__all__ = ["IterationReport", "PlanOptions", "plan", "plan_spec", "resolve_system"]


def resolve_system(system: SystemSpec | str) -> SystemSpec:
    return system_preset(system) if isinstance(system, str) else system


def _megatron_args(
    spec: TrainingSpec, *, megatron_rules: bool
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Megatron-LM's flags and, for a strategy Megatron-LM refuses (reachable only with
    ``megatron_rules=False``), no flags and the rules it breaks: no command line runs it.
    With ``megatron_rules`` the caller has validated ``spec`` under them already."""
    if megatron_rules:
        return tuple(megatron_args_of_lawful(spec)), ()
    try:
        return tuple(to_megatron_args(spec)), ()
    except InvalidStrategyError as refused:
        return (), tuple(str(violation) for violation in refused.violations)


def plan_spec(
    spec: TrainingSpec,
    system: SystemSpec | str,
    options: PlanOptions | None = None,
    *,
    bubble_simulated_s: float | None = None,
) -> IterationReport:
    """Check ``spec`` against every law, then evaluate it on ``system``."""
    chosen = PlanOptions() if options is None else options
    resolved = resolve_system(system)
    validate_training(
        spec.model,
        spec.mapping,
        megatron=chosen.megatron_rules,
        accelerator=resolved.accelerator.support,
    )
    flags, refusals = _megatron_args(spec, megatron_rules=chosen.megatron_rules)
    return evaluate_plan(
        spec,
        resolved,
        chosen,
        strategy_keys=to_mapping(spec),
        megatron_args=flags,
        megatron_refusals=refusals,
        bubble_simulated_s=bubble_simulated_s,
    )


def build_spec(
    *,
    model: TransformerModelSpec | str,
    gpus: int | None = None,
    settings: Mapping[str, object] | None = None,
) -> TrainingSpec:
    """A TrainingSpec from a model (preset name or spec), a GPU count and flat Megatron keys."""
    base = model_preset(model) if isinstance(model, str) else model
    keys: dict[str, object] = dict(settings or {})
    if gpus is not None:
        if "world_size" in keys and keys["world_size"] != gpus:
            raise ConfigError([f"gpus = {gpus} conflicts with world_size = {keys['world_size']}"])
        # Always passed on: from_mapping refuses a data_parallel_size that disagrees with it.
        keys["world_size"] = gpus
    return from_mapping(keys, model=base)


def plan(
    spec: TrainingSpec | None = None,
    *,
    system: SystemSpec | str = "dgx-a100-80gb",
    model: TransformerModelSpec | str | None = None,
    gpus: int | None = None,
    settings: Mapping[str, object] | None = None,
    options: PlanOptions | None = None,
) -> IterationReport:
    """Plan one training strategy: pass a spec, or a model with flat Megatron keys."""
    if spec is None:
        if model is None:
            raise ConfigError(["plan() needs a TrainingSpec or a model (preset name or spec)"])
        spec = build_spec(model=model, gpus=gpus, settings=settings)
    elif model is not None or settings is not None or gpus is not None:
        raise ConfigError(["plan() takes either a spec or model/gpus/settings, not both"])
    return plan_spec(spec, system, options)
