"""validate and calibrate plan each strategy once, and the figures that do not read the
iteration time without the schedule simulation (issue #18, validation/predictor.PlanCache)."""

from __future__ import annotations

import pytest

import blueprinting.api
from blueprinting.hardware.presets import system_preset
from blueprinting.validation.comparison import needs_iteration_time
from blueprinting.validation.predictor import (
    REPORT_PATHS,
    PlanCache,
    prediction_from_report,
    system_for_run,
)
from blueprinting.validation.published import PublishedRun, SourceTable, load_published_runs


def _run(table: SourceTable) -> PublishedRun:
    return next(run for run in load_published_runs() if run.source_table is table)


def test_iteration_figures_decide_the_simulation() -> None:
    runs = load_published_runs()
    # Table 1 reports TFLOP/s (through the iteration time); Table 4 per-layer times only.
    assert all(needs_iteration_time(r) for r in runs if r.source_table.name.endswith("TABLE1"))
    assert not needs_iteration_time(_run(SourceTable.KORTHIKANTI2022_TABLE4))


def test_a_strategy_is_planned_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    real = blueprinting.api.plan_spec

    def counted(*args: object, **kwargs: object) -> object:
        options = args[2]
        calls.append(bool(options.simulate))  # type: ignore[attr-defined]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(blueprinting.api, "plan_spec", counted)
    run = _run(SourceTable.KORTHIKANTI2022_TABLE4)
    spec, system = run.training_spec(), system_preset(run.system)
    cache = PlanCache()
    unsimulated = cache.values(spec, system, simulate=False)
    assert cache.values(spec, system, simulate=False) is unsimulated
    assert calls == [False]
    simulated = cache.values(spec, system)
    assert cache.values(spec, system) is simulated
    # once there, a simulated report serves a request without the simulation
    assert cache.values(spec, system, simulate=False) is simulated
    other = PlanCache()
    assert other.values(spec, system) is not simulated
    assert other.values(spec, system, simulate=False) is other.values(spec, system)
    assert calls == [False, True, True]


@pytest.mark.parametrize(
    "table", [SourceTable.KORTHIKANTI2022_TABLE4, SourceTable.NARAYANAN2021_TABLE1]
)
def test_the_simulation_changes_only_the_iteration_time(table: SourceTable) -> None:
    """Every figure but the iteration time is the same with and without the simulation, so a
    run measured only on those is planned without it (exactly: equal floats)."""
    run = _run(table)
    spec, system = run.training_spec(), system_for_run(run, system_preset(run.system))
    with_simulation = PlanCache().values(spec, system)
    without = PlanCache().values(spec, system, simulate=False)
    assert with_simulation["bubble"] != without["bubble"]  # the simulation did run
    a, b = prediction_from_report(with_simulation), prediction_from_report(without)
    for field in REPORT_PATHS:
        if field != "iteration_time_s":
            assert getattr(a, field) == getattr(b, field) is not None, field
