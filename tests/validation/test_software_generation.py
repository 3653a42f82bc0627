"""The synchronous TP backward all-reduce of pre-September-2021 Megatron-LM.

``SystemSpec.async_tp_backward_comm = False`` must expose every backward TP collective (the SC'21
code ran the column-parallel input-gradient all-reduce synchronously); the validation predictor
sets it for Narayanan et al. 2021 Table 1 only.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from blueprinting.analysis.evaluate import portable_plan
from blueprinting.hardware.presets import system_preset
from blueprinting.validation.predictor import SYNCHRONOUS_TP_BACKWARD_TABLES, system_for_run
from blueprinting.validation.published import PublishedRun, SourceTable, load_published_runs

RUNS = {run.id: run for run in load_published_runs()}


def _run(run_id: str) -> PublishedRun:
    return RUNS[run_id]


def test_synchronous_backward_exposes_every_tp_collective() -> None:
    run = _run("korthikanti2022_t4_22B_layer_full_nosp")
    system = system_preset(run.system)
    overlapped = portable_plan(run.training_spec(), system).block
    synchronous = portable_plan(
        run.training_spec(), replace(system, async_tp_backward_comm=False)
    ).block
    # Without sequence parallelism the backward all-reduces sit in the activation-grad phase.
    assert synchronous.backward_activation.comm_s > 0.0
    assert synchronous.backward_activation.comm_exposed_s == synchronous.backward_activation.comm_s
    assert overlapped.backward_activation.comm_exposed_s < overlapped.backward_activation.comm_s
    # Only the exposure changes: compute and link time are the same costs.
    for phase in ("forward", "backward_activation", "backward_weight", "recompute"):
        assert getattr(synchronous, phase).compute_s == getattr(overlapped, phase).compute_s
        assert getattr(synchronous, phase).comm_s == getattr(overlapped, phase).comm_s
    assert synchronous.forward == overlapped.forward
    assert synchronous.recompute == overlapped.recompute


def test_default_system_overlaps_like_current_megatron() -> None:
    assert system_preset("dgx-a100-80gb").async_tp_backward_comm is True


@pytest.mark.parametrize("run_id", sorted(RUNS))
def test_only_narayanan_table1_runs_are_costed_synchronously(run_id: str) -> None:
    run = _run(run_id)
    system = system_for_run(run, system_preset(run.system))
    legacy = run.source_table is SourceTable.NARAYANAN2021_TABLE1
    assert system.async_tp_backward_comm is not legacy
    assert frozenset({SourceTable.NARAYANAN2021_TABLE1}) == SYNCHRONOUS_TP_BACKWARD_TABLES


def test_system_section_round_trips_the_knob() -> None:
    from blueprinting.errors import ConfigError
    from blueprinting.hardware.system_mapping import system_from_mapping, system_to_mapping

    legacy = system_from_mapping({"preset": "dgx-a100-80gb", "async_tp_backward_comm": False})
    assert legacy.async_tp_backward_comm is False
    assert legacy == replace(system_preset("dgx-a100-80gb"), async_tp_backward_comm=False)
    assert system_from_mapping(system_to_mapping(legacy)) == legacy
    # The default is not written, so existing [system] files and digests stay as they were.
    assert "async_tp_backward_comm" not in system_to_mapping(system_preset("dgx-a100-80gb"))
    with pytest.raises(ConfigError, match="async_tp_backward_comm must be true or false"):
        system_from_mapping({"preset": "dgx-a100-80gb", "async_tp_backward_comm": "no"})
