"""Layer counts of a layer range in closed form (issue 18: fuzz cases with huge layer or MTP
counts hung counting them one by one), equal to counting them one by one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from blueprinting.mapping.model import MoeLayerFrequency, MoeLayerList, SlidingWindow


@given(every=st.integers(1, 12), start=st.integers(0, 200), count=st.integers(0, 200))
def test_frequency_count_equals_the_layer_by_layer_count(
    every: int, start: int, count: int
) -> None:
    pattern = MoeLayerFrequency(every=every)
    expected = sum(1 for layer in range(start, start + count) if pattern.is_moe(layer))
    assert pattern.moe_layers_in(start, count) == expected


@given(flags=st.lists(st.booleans(), min_size=1, max_size=64), data=st.data())
def test_list_count_equals_the_layer_by_layer_count(flags: list[bool], data: st.DataObject) -> None:
    pattern = MoeLayerList(layers=tuple(flags))
    start = data.draw(st.integers(0, len(flags)))
    count = data.draw(st.integers(0, len(flags) - start))
    expected = sum(1 for layer in range(start, start + count) if pattern.is_moe(layer))
    assert pattern.moe_layers_in(start, count) == expected


def test_a_huge_range_is_counted_at_once() -> None:
    # 2**63 - 1 layers, every second one MoE: layers 0, 2, ..., 2**63 - 2
    assert MoeLayerFrequency(every=2).moe_layers_in(0, 2**63 - 1) == 2**62


@given(
    size=st.integers(1, 64),
    full_every=st.one_of(st.none(), st.integers(1, 8)),
    count=st.integers(0, 300),
)
def test_windowed_count_equals_the_layer_by_layer_count(
    size: int, full_every: int | None, count: int
) -> None:
    window = SlidingWindow(size=size, full_every=full_every)
    assert window.windowed_layers_in(count) == sum(
        1 for layer in range(count) if window.is_windowed(layer)
    )


@given(
    layers=st.integers(1, 40),
    every=st.integers(1, 5),
    preset=st.sampled_from(["gpt-1.7b", "mixtral-8x7b", "deepseek-v2-lite"]),
)
def test_parameter_sums_per_kind_of_layer_equal_the_layer_by_layer_sums(
    layers: int, every: int, preset: str
) -> None:
    """num_parameters and active_parameters sum per kind of layer (fuzz seed 1203 case 75484:
    ``plan --set num_layers=4294967296`` summed 2**32 layers one by one for minutes)."""
    from dataclasses import replace

    from blueprinting.mapping.model import MixtureOfExperts
    from blueprinting.mapping.presets import model_preset

    model = model_preset(preset)
    if isinstance(model.feed_forward, MixtureOfExperts):
        ffn = replace(model.feed_forward, layer_pattern=MoeLayerFrequency(every=every))
        model = replace(model, feed_forward=ffn)
    model = replace(
        model, num_layers=layers, published_parameters=None, published_active_parameters=None
    )
    outside = model.embedding_parameters + model.output_layer_parameters + model.norm_parameters
    assert model.num_parameters == outside + sum(model.layer_parameters(i) for i in range(layers))
    assert model.layers_active_parameters == sum(
        model.layer_active_parameters(i) for i in range(layers)
    )
    assert model.active_parameters == outside + model.layers_active_parameters


def test_a_huge_layer_count_sums_at_once() -> None:
    from dataclasses import replace

    from blueprinting.mapping.presets import model_preset

    model = replace(model_preset("gpt-1.7b"), num_layers=2**62, published_parameters=None)
    per_layer = model.block_parameters
    assert model.layers_active_parameters == 2**62 * per_layer
    assert model.num_parameters == 2**62 * per_layer + (
        model.embedding_parameters + model.output_layer_parameters + model.norm_parameters
    )
