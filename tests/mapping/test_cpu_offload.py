"""Layer-wise CPU activation offloading: the flat keys both ways, the Megatron flag, the start-up
laws (Megatron-Core ``transformer_config.py`` @d98e8a64), the memory it moves to the host and
the copies the compute waits for (``analysis/offload.py``, Transformer Engine's schedule)."""

from __future__ import annotations

from typing import Any

import pytest

from blueprinting import api
from blueprinting.analysis.memory import stage_activations
from blueprinting.analysis.offload import OffloadCost
from blueprinting.errors import ConfigError, UnsupportedError
from blueprinting.hardware.presets import system_preset
from blueprinting.hardware.system import HostLink
from blueprinting.hardware.system_mapping import system_from_mapping, system_to_mapping
from blueprinting.mapping.flat_keys import from_mapping, to_mapping, to_megatron_args
from blueprinting.mapping.law_names import CPU_OFFLOAD_LAWS, Law
from blueprinting.mapping.laws import check_training
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import (
    LayerCpuOffload,
    NoActivationOffload,
    TrainingSpec,
)

_MODEL = model_preset("llama3-8b")  # 32 layers
_BASE: dict[str, object] = {
    "world_size": 8,
    "tensor_model_parallel_size": 2,
    "sequence_parallel": True,
    "micro_batch_size": 1,
    "global_batch_size": 8,
}


def _spec(**keys: object) -> TrainingSpec:
    return from_mapping({**_BASE, **keys}, model=_MODEL)


def _laws(spec: TrainingSpec) -> list[str]:
    return [v.law for v in check_training(spec.model, spec.mapping)]


@pytest.mark.parametrize(
    ("keys", "offload"),
    [
        ({}, NoActivationOffload()),
        # Megatron-LM's command line: a positive count turns cpu_offloading on
        ({"cpu_offloading_num_layers": 12}, LayerCpuOffload(num_layers=12)),
        # Megatron-Core's config (Megatron-Bridge): both fields
        ({"cpu_offloading": True, "cpu_offloading_num_layers": 12}, LayerCpuOffload(num_layers=12)),
        # off, or on over no layer: Megatron-Core offloads nothing
        ({"cpu_offloading": False, "cpu_offloading_num_layers": 12}, NoActivationOffload()),
        ({"cpu_offloading": True, "cpu_offloading_num_layers": 0}, NoActivationOffload()),
        ({"cpu_offloading": True}, NoActivationOffload()),
        (
            {"cpu_offloading_num_layers": 3, "cpu_offloading_weights": False},
            LayerCpuOffload(num_layers=3),
        ),
    ],
)
def test_the_keys_read_as_megatron_runs_them(
    keys: dict[str, object], offload: LayerCpuOffload | NoActivationOffload
) -> None:
    spec = _spec(**keys)
    assert spec.mapping.parallelism.offload == offload
    # the preset's published parameter count is not a flat key: the mapping round-trips
    assert from_mapping(to_mapping(spec), model=_MODEL).mapping == spec.mapping


def test_the_flag_and_the_strategy_text() -> None:
    spec = _spec(cpu_offloading_num_layers=12)
    args = to_megatron_args(spec)
    at = args.index("--cpu-offloading-num-layers")
    assert args[at + 1] == "12"
    assert "--cpu-offloading-num-layers" not in to_megatron_args(_spec())
    assert str(spec.mapping.parallelism).endswith("recompute=none offload=cpu(12)")
    assert "offload" not in str(_spec().mapping.parallelism)


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        (
            {"cpu_offloading_num_layers": 4, "cpu_offloading_weights": True},
            "cpu_offloading_weights",
        ),
        (
            {"cpu_offloading_num_layers": 4, "cpu_offloading_activations": False},
            "cpu_offloading_activations",
        ),
    ],
)
def test_what_is_not_modelled_is_refused_by_name(keys: dict[str, object], named: str) -> None:
    with pytest.raises(UnsupportedError, match=named):
        _spec(**keys)


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(ConfigError, match="cpu_offloading_num_layers must be a non-negative"):
        _spec(cpu_offloading_num_layers=-1)


def test_every_start_up_rule_is_reported_at_once() -> None:
    spec = _spec(
        cpu_offloading_num_layers=32,
        world_size=16,
        pipeline_model_parallel_size=2,
        recompute_granularity="selective",
        cuda_graph_impl="transformer_engine",
    )
    laws = _laws(spec)
    for law in (
        Law.MEGATRON_CPU_OFFLOAD_LAYERS,
        Law.MEGATRON_CPU_OFFLOAD_PIPELINE,
        Law.MEGATRON_CPU_OFFLOAD_RECOMPUTE,
        Law.MEGATRON_CPU_OFFLOAD_CUDA_GRAPHS,
    ):
        assert laws.count(law.value) == 1, law
    layers = next(
        v
        for v in check_training(spec.model, spec.mapping)
        if v.law == Law.MEGATRON_CPU_OFFLOAD_LAYERS.value
    )
    assert dict(layers.values) == {"cpu_offloading_num_layers": 32, "num_layers": 32}
    assert "less than num_layers = 32" in layers.message


def test_the_largest_count_and_a_whole_iteration_graph_are_lawful() -> None:
    assert _laws(_spec(cpu_offloading_num_layers=31)) == []
    whole = _spec(
        cpu_offloading_num_layers=31, cuda_graph_impl="local", cuda_graph_scope="full_iteration"
    )
    assert not set(_laws(whole)) & {law.value for law in CPU_OFFLOAD_LAWS}


def test_the_search_applies_no_offload_law() -> None:
    assert not any(law.searched for law in CPU_OFFLOAD_LAWS)


def test_the_offloaded_layers_stores_move_to_the_host_exactly() -> None:
    plain = stage_activations(_MODEL, _spec().mapping, 0)
    offloaded = stage_activations(_MODEL, _spec(cpu_offloading_num_layers=12).mapping, 0)
    per_layer = plain.layers_stored // 32
    assert plain.layers_stored == 32 * per_layer
    assert offloaded.layers_stored == 20 * per_layer
    assert offloaded.host_offloaded == 12 * per_layer
    assert plain.host_offloaded == 0
    assert (offloaded.embedding, offloaded.logits) == (plain.embedding, plain.logits)


def test_a_moe_models_offloaded_moe_layers_move_their_excess_too() -> None:
    """DeepSeek-V2-Lite's first layer is dense (moe_layer_freq), the rest MoE."""
    model = model_preset("deepseek-v2-lite")
    keys = {"world_size": 8, "expert_model_parallel_size": 8, "global_batch_size": 8}
    plain = stage_activations(model, from_mapping(keys, model=model).mapping, 0)
    spec = from_mapping({**keys, "cpu_offloading_num_layers": 3}, model=model)
    offloaded = stage_activations(model, spec.mapping, 0)
    assert offloaded.layers_stored + offloaded.host_offloaded == plain.layers_stored
    assert model.moe_layers_in(0, 3) == 2


def test_no_wait_while_the_copies_keep_up_and_exactly_the_excess_after() -> None:
    kept_up = OffloadCost(
        layers=4,
        bytes=8,
        device_to_host_s=1.0,
        host_to_device_s=1.5,
        forward_window_s=2.0,
        backward_window_s=4.0,
    )
    assert kept_up.exposed_s == 0.0
    behind = OffloadCost(
        layers=4,
        bytes=8,
        device_to_host_s=3.0,
        host_to_device_s=5.0,
        forward_window_s=2.0,
        backward_window_s=4.0,
    )
    assert behind.exposed_s == 2.0


def test_the_plan_reports_the_copies_and_adds_what_the_compute_waits() -> None:
    spec = _spec(cpu_offloading_num_layers=12, world_size=4, global_batch_size=8)
    m = spec.mapping.microbatch_count
    host = stage_activations(spec.model, spec.mapping, 0).host_offloaded
    # NVLink-C2C: the copies hide under the other layers' passes
    fast = api.plan_spec(spec, system_preset("dgx-gb200"))
    document: Any = fast.to_json_dict()
    assert document["activation_offload"]["host_bytes"] == host
    assert document["activation_offload"]["device_to_host_s"] == pytest.approx(
        host / 301e9, rel=1e-12
    )
    assert document["activation_offload"]["host_to_device_s"] == pytest.approx(
        host / 346e9, rel=1e-12
    )
    assert document["activation_offload"]["exposed_s"] == 0.0
    assert document["time_breakdown_s"]["offload_exposed"] == 0.0
    assert document["memory_bytes"]["host_offloaded"] == host
    # a link a thousand times slower: the compute waits for the excess, every microbatch
    slow_system = system_from_mapping(
        {
            "preset": "dgx-gb200",
            "host_link": {"device_to_host_bytes_per_s": 301e6, "host_to_device_bytes_per_s": 346e6},
        }
    )
    slow = api.plan_spec(spec, slow_system)
    copies = slow.offload
    assert copies is not None
    waited = max(0.0, host / 301e6 - copies.forward_window_s) + max(
        0.0, host / 346e6 - copies.backward_window_s
    )
    assert waited > 0
    assert slow.breakdown.offload_exposed == pytest.approx(m * waited, rel=1e-12)
    assert slow.iteration_time_s == pytest.approx(sum(slow.breakdown.as_dict().values()), rel=1e-12)
    assert slow.iteration_time_s == pytest.approx(fast.iteration_time_s + m * waited, rel=1e-12)
    assert api.plan_spec(_spec(world_size=4), system_preset("dgx-gb200")).offload is None


def test_a_system_without_a_host_link_is_refused_by_name() -> None:
    spec = _spec(cpu_offloading_num_layers=4)
    assert system_preset("dgx-h100").host_link is None
    with pytest.raises(UnsupportedError, match=r"system\.host_link"):
        api.plan_spec(spec, system_preset("dgx-h100"))


def test_the_host_link_round_trips_and_bad_rates_are_refused() -> None:
    system = system_preset("dgx-gb200")
    assert system_from_mapping(system_to_mapping(system)) == system
    with pytest.raises(ConfigError) as raised:
        system_from_mapping(
            {"preset": "dgx-h100", "host_link": {"device_to_host_bytes_per_s": 0, "x": 1}}
        )
    text = "\n".join(raised.value.problems)
    assert "system.host_link: missing key 'host_to_device_bytes_per_s'" in text
    assert "x" in text
    with pytest.raises(ConfigError, match="must be a positive finite number"):
        HostLink(device_to_host_bytes_per_s=-1.0, host_to_device_bytes_per_s=1.0)


def test_the_plan_text_names_the_host_memory_and_the_wait(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from blueprinting.cli.main import main

    argv = ["plan", "--model", "llama3-8b", "--system", "dgx-gb200", "--gpus", "4"]
    keys = ["tensor_model_parallel_size=2", "sequence_parallel=true", "global_batch_size=8"]
    sets = [arg for key in keys for arg in ("--set", key)]
    assert main([*argv, *sets, "--set", "cpu_offloading_num_layers=30"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "CPU offloading: 30 layers' activations," in text
    assert "in pinned host memory per GPU" in text
    assert "(offload_exposed)" in text
    assert main([*argv, *sets]) == 0
    assert "CPU offloading" not in capsys.readouterr().out
