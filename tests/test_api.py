"""``blueprinting.api.build_spec``: the GPU count is never dropped silently."""

from __future__ import annotations

import pytest

from blueprinting.api import build_spec
from blueprinting.errors import ConfigError

SETTINGS = {
    "tensor_model_parallel_size": 8,
    "pipeline_model_parallel_size": 8,
    "global_batch_size": 1536,
}


def test_gpus_set_the_data_parallel_degree() -> None:
    spec = build_spec(model="gpt3-175b", gpus=1024, settings=SETTINGS)
    assert spec.mapping.world_size == 1024
    assert spec.mapping.data_degree == 1024 // (8 * 8)


def test_gpus_agreeing_with_data_parallel_size_are_accepted() -> None:
    spec = build_spec(model="gpt3-175b", gpus=1024, settings={**SETTINGS, "data_parallel_size": 16})
    assert spec.mapping.world_size == 1024


def test_gpus_conflicting_with_data_parallel_size_are_refused() -> None:
    # 8 * 8 * 2 = 128 GPUs, not 1024: before, the 1024 was ignored and a 128-GPU plan returned.
    with pytest.raises(ConfigError) as info:
        build_spec(model="gpt3-175b", gpus=1024, settings={**SETTINGS, "data_parallel_size": 2})
    assert any("conflicts with world_size = 1024" in p for p in info.value.problems)
