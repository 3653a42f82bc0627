"""[system] sections and system files: presets plus overrides, round trips, error reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blueprinting.errors import ConfigError
from blueprinting.hardware.efficiency import ConstantEfficiency, SteppedEfficiency
from blueprinting.hardware.presets import SYSTEM_PRESETS, system_preset
from blueprinting.hardware.system import (
    ByRankLayout,
    CommGroup,
    FixedTiers,
    LinkTier,
    ParallelDim,
    RankLayout,
)
from blueprinting.hardware.system_mapping import (
    load_system,
    system_from_mapping,
    system_to_mapping,
)
from blueprinting.mapping.model import Datatype


@pytest.mark.parametrize("name", list(SYSTEM_PRESETS))
def test_presets_round_trip_through_json(name: str) -> None:
    system = SYSTEM_PRESETS[name]
    mapping = json.loads(json.dumps(system_to_mapping(system)))
    assert system_from_mapping(mapping) == system


def test_preset_alone_is_the_preset() -> None:
    assert system_from_mapping({"preset": "dgx-h100"}) == system_preset("dgx-h100")


def test_overrides_by_name() -> None:
    system = system_from_mapping(
        {
            "preset": "dgx-a100-80gb",
            "name": "selene-calibrated",
            "accelerator": {
                "matrix": {"bfloat16": {"efficiency": 0.6}},
                "hbm": {"efficiency": 0.8},
            },
            "scale_out": {"efficiency": {"model": "steps", "steps": [[1e6, 0.9], [0, 0.5]]}},
            "rank_layout": "tp-pp-dp",
        }
    )
    base = system_preset("dgx-a100-80gb")
    assert system.name == "selene-calibrated"
    assert system.accelerator.matrix.rate(Datatype.BF16).efficiency == ConstantEfficiency(
        fraction=0.6
    )
    # Untouched siblings keep the preset's values.
    assert system.accelerator.matrix.rate(Datatype.FP16) == base.accelerator.matrix.rate(
        Datatype.FP16
    )
    assert system.accelerator.hbm.efficiency == ConstantEfficiency(fraction=0.8)
    assert system.accelerator.hbm.bandwidth_bytes_per_s == 2039e9
    assert isinstance(system.scale_out.efficiency, SteppedEfficiency)
    assert system.network_assignment == ByRankLayout(layout=RankLayout.TP_PP_DP)


def test_fixed_tiers_replace_the_presets_layout() -> None:
    system = system_from_mapping(
        {
            "preset": "dgx-h100",
            "fixed_tiers": {"tp": "intra_node", "pp": "scale_out", "dp": "scale_out"},
        }
    )
    assert system.network_assignment == FixedTiers(
        tensor=LinkTier.INTRA_NODE, pipeline=LinkTier.SCALE_OUT, data=LinkTier.SCALE_OUT
    )


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as raised:
        system_from_mapping(
            {
                "preset": "dgx-a100-80gb",
                "gpus_per_nod": 4,
                "processing_mode": "rooflin",
                "accelerator": {"hbm": {"efficiency": 1.5}},
                "intra_node": {"latency_s": "fast"},
            },
            source="cluster.toml",
        )
    assert raised.value.source == "cluster.toml"
    assert raised.value.problems == (
        "system: unknown key 'gpus_per_nod' (did you mean 'gpus_per_node'?); known keys: "
        "preset, name, gpus_per_node, nvlink_domain_size, nvlink_domain_placement, "
        "processing_mode, rank_layout, fixed_tiers, accelerator, intra_node, scale_out, "
        "async_tp_backward_comm, host_cpu, host_link, runtime, ep_kernels",
        "system.processing_mode: unknown value 'rooflin' (did you mean 'roofline'?); "
        "choices: no_overlap, roofline",
        "system.accelerator.hbm.efficiency: ConstantEfficiency.fraction must be a fraction in "
        "(0, 1], got 1.5",
        "system.intra_node.latency_s must be a number, got 'fast'",
    )


def test_full_mapping_without_preset_needs_every_part() -> None:
    with pytest.raises(ConfigError) as raised:
        system_from_mapping({"name": "bare", "gpus_per_node": 4})
    assert raised.value.problems == (
        "system: missing key 'accelerator'",
        "system: missing key 'intra_node'",
        "system: missing key 'scale_out'",
    )


def test_load_toml_with_system_table(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(
        '[system]\npreset = "dgx-a100-40gb"\ngpus_per_node = 4\n'
        "[system.intra_node]\nbandwidth_bytes_per_s = 150e9\n"
        "[system.intra_node.costs]\np2p = [1.0]\n",
        encoding="utf-8",
    )
    system = load_system(path)
    assert system.gpus_per_node == 4
    assert system.node.link.bandwidth_bytes_per_s == 150e9
    assert system.node.link.costs == system_preset("dgx-a100-40gb").node.link.costs


def test_load_json_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "mi300x.json"
    path.write_text(json.dumps(system_to_mapping(system_preset("mi300x-8"))), encoding="utf-8")
    assert load_system(path) == system_preset("mi300x-8")


def test_load_rejects_other_suffixes(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("system: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        load_system(path)
    assert raised.value.problems == ("system file must end in .toml or .json, got '.yaml'",)


def test_nvlink_domain_round_trips_and_overrides() -> None:
    gb200 = system_preset("dgx-gb200")
    mapping = system_to_mapping(gb200)
    assert (mapping["gpus_per_node"], mapping["nvlink_domain_size"]) == (4, 72)
    # A system whose domain is its node writes no key (the default).
    assert "nvlink_domain_size" not in system_to_mapping(system_preset("dgx-h100"))
    # Two DGX H100 joined by an external NVLink switch: a 16-GPU domain of 8-GPU nodes.
    joined = system_from_mapping({"preset": "dgx-h100", "nvlink_domain_size": 16})
    assert joined.node.domain_size == 16
    assert joined.gpus_per_node == 8
    tp16 = joined.comm_group(ParallelDim.TENSOR, tensor=16, pipeline=1, data=2)
    assert tp16 == CommGroup(
        size=16, tier=LinkTier.INTRA_NODE, ranks_per_node=8, ranks_per_domain=16
    )


def test_bad_nvlink_domain_sizes_are_reported_with_the_rest() -> None:
    with pytest.raises(ConfigError) as raised:
        system_from_mapping(
            {"preset": "dgx-gb200", "nvlink_domain_size": 70, "processing_mode": "rooflin"}
        )
    assert raised.value.problems == (
        "system.processing_mode: unknown value 'rooflin' (did you mean 'roofline'?); "
        "choices: no_overlap, roofline",
        "system: NodeSpec.nvlink_domain_size must be a multiple of gpus_per_node (4), got 70",
    )
    with pytest.raises(ConfigError) as raised:
        system_from_mapping({"preset": "dgx-gb200", "nvlink_domain_size": 0})
    assert raised.value.problems == (
        "system: NodeSpec.nvlink_domain_size must be a positive integer, got 0",
    )
    with pytest.raises(ConfigError) as raised:
        system_from_mapping({"preset": "dgx-gb200", "nvlink_domain_size": "72", "name": 3})
    assert raised.value.problems == (
        "system.name must be a string, got 3",
        "system.nvlink_domain_size must be an integer, got '72'",
    )
    # Changing the tray size of an NVL72 preset alone breaks the multiple: said, not guessed.
    with pytest.raises(ConfigError) as raised:
        system_from_mapping({"preset": "dgx-gb200", "gpus_per_node": 16})
    assert raised.value.problems == (
        "system: NodeSpec.nvlink_domain_size must be a multiple of gpus_per_node (16), got 72",
    )


def test_ep_kernel_tables_round_trip_and_a_users_table_replaces_the_presets() -> None:
    """``[system.ep_kernels.<backend>]``: a library's measured dispatch / combine rates; a
    table given for one backend replaces the preset's for it whole (its lists are one
    measurement), the other backend's stays; every problem at once, with a did-you-mean."""
    from blueprinting.mapping.transformer import FlexBackend

    mine = {
        "source": "my cluster's test_hybrid_ep.py",
        "sms": 24,
        "ranks": [8, 64],
        "dispatch_bytes_per_s": [5.0e11, 4.0e11],
        "combine_bytes_per_s": [5.0e11, 3.0e11],
    }
    system = system_from_mapping({"preset": "dgx-gb200", "ep_kernels": {"hybridep": mine}})
    by_backend = {table.backend: table for table in system.node.ep_kernels}
    assert by_backend[FlexBackend.HYBRIDEP].ranks == (8, 64)
    assert by_backend[FlexBackend.HYBRIDEP].source == "my cluster's test_hybrid_ep.py"
    assert (
        by_backend[FlexBackend.DEEPEP]
        == {t.backend: t for t in system_preset("dgx-gb200").node.ep_kernels}[FlexBackend.DEEPEP]
    )
    assert system_from_mapping(json.loads(json.dumps(system_to_mapping(system)))) == system
    with pytest.raises(ConfigError) as error:
        system_from_mapping(
            {
                "preset": "dgx-gb200",
                "ep_kernels": {
                    "hybrid": mine,
                    "deepep": {**mine, "ranks": [8], "sms": 0, "bandwidth": 1},
                },
            }
        )
    problems = " | ".join(error.value.problems)
    assert "unknown key 'hybrid' (did you mean 'hybridep'?)" in problems
    assert "unknown key 'bandwidth'" in problems
    assert "dispatch_bytes_per_s has 2 values for 1 group sizes" in problems


def test_infinite_hardware_figures_are_refused() -> None:
    """Fuzz seed 1272 case 7138: ``capacity_bytes = inf`` passed the positivity check and
    reached ``int()`` as an OverflowError. Rates, sizes and latencies must be finite."""
    with pytest.raises(ConfigError) as raised:
        system_from_mapping(
            {
                "preset": "dgx-h100",
                "accelerator": {"hbm": {"capacity_bytes": float("inf")}},
                "intra_node": {"latency_s": float("inf")},
                "scale_out": {"bandwidth_bytes_per_s": float("nan")},
            }
        )
    problems = " | ".join(raised.value.problems)
    assert "MemorySpec.capacity_bytes must be a positive number, got inf" in problems
    assert "LinkSpec.latency_s must be >= 0, got inf" in problems
    assert "LinkSpec.bandwidth_bytes_per_s must be a positive number, got nan" in problems
