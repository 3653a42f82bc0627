"""Megatron-LM's ``pipeline_model_parallel_layout``: the parser (every error, with positions),
the laws on the typed layout, the flat keys and flags, and where the blocks, the embedding and
the loss land (issue 14 item 1)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blueprinting.analysis.evaluate import portable_plan
from blueprinting.analysis.memory import stage_parameters
from blueprinting.analysis.stage_layout import chunk_layer_counts, stage_layer_counts
from blueprinting.errors import ConfigError, InvalidStrategyError
from blueprinting.hardware.system_mapping import system_from_mapping
from blueprinting.mapping.config_file import load_config
from blueprinting.mapping.laws import check_training, flexible_layout_laws
from blueprinting.mapping.pipeline_layout import format_pipeline_layout, parse_pipeline_layout
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import (
    FlexibleStages,
    InterleavedOneForwardOneBackward,
    LayoutStage,
    from_mapping,
    to_mapping,
    to_megatron_args,
)
from blueprinting.search.strategy_text import format_strategy_text, parse_strategy_text
from blueprinting.simulator.from_plan import schedule_costs

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt3-175b-selene.toml"
GPT3 = model_preset("gpt3-175b")  # 96 blocks


def _problems(text: str) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as caught:
        parse_pipeline_layout(text)
    return caught.value.problems


def test_megatron_bridge_example_parses() -> None:
    layout = parse_pipeline_layout("Et|(tt|)*30L")
    assert len(layout.stages) == 32
    assert layout.stages[0] == LayoutStage(embedding=True, decoder_layers=1)
    assert layout.stages[1:31] == (LayoutStage(decoder_layers=2),) * 30
    assert layout.stages[31] == LayoutStage(loss=True)
    assert sum(s.decoder_layers for s in layout.stages) == 61
    assert layout.stages[31].position == 11  # the 'L' after the group


def test_repetition_commas_and_empty_stages_follow_megatron() -> None:
    # Megatron's docstring examples: commas are cosmetic, x*n repeats one character.
    assert parse_pipeline_layout("Et*3|(tt|)*2,t|L") == parse_pipeline_layout("Ettt|tt|tt|t|L")
    assert parse_pipeline_layout("E|t*0|L").stages[1] == LayoutStage()
    assert len(parse_pipeline_layout("E||L").stages) == 3


def test_format_round_trips() -> None:
    for text in ("Et|(tt|)*30L", "E|t*12|t*12|tL", "Et*3|t*3|tt|ttL", "EtL"):
        layout = parse_pipeline_layout(text)
        assert parse_pipeline_layout(format_pipeline_layout(layout)) == layout
    assert format_pipeline_layout(parse_pipeline_layout("Et|(tt|)*30L")) == "Et|(tt|)*30L"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Et|Tt|L",
            "invalid layer character 'T' at position 3 (known: E (embedding), t (decoder "
            "block), m (MTP layer), L (loss)); did you mean 't'?",
        ),
        ("Et|x|L", "invalid layer character 'x' at position 3"),
        ("Et)|L", "')' at position 2 closes no '('"),
        ("E(tt|L", "'(' at position 1 is never closed"),
        ("E((t)*2)*2|L", "'(' at position 2 is nested in the group opened at position 1"),
        ("E()*2|L", "the group at position 1 is empty"),
        ("E(tt|)L", "the group at position 1 needs a repetition count: (...)*n"),
        ("Et*|L", "'*' at position 2 needs a repetition count"),
        ("tE|L", "'E' at position 1 must be the first layer of its stage"),
        ("Et|LtL", "'L' at position 3 must be the last layer of its stage"),
        ("EEt|L", "a second 'E' at position 1 in one stage"),
        ("Et|tLL", "a second 'L' at position 5 in one stage"),
    ],
)
def test_every_syntax_error_names_its_position(text: str, expected: str) -> None:
    assert any(problem.startswith(expected) for problem in _problems(text)), _problems(text)


def test_empty_layout_and_all_problems_at_once() -> None:
    assert _problems("  ") == ("the layout string is empty",)
    problems = _problems("tE|x|LtL")
    assert len(problems) == 4  # E not first, x unknown, L not last, a second L


def test_mtp_depths_parse_into_their_stage_and_format_back() -> None:
    """Megatron-Bridge's DeepSeek-V3 layout for PP4 x VP4: 16 stages, the MTP depth in the
    loss's stage after its blocks."""
    text = "Et*4|(t*4|)*14tmL"
    layout = parse_pipeline_layout(text)
    assert len(layout.stages) == 16
    assert sum(stage.decoder_layers for stage in layout.stages) == 61
    assert [stage.mtp_layers for stage in layout.stages] == [0] * 15 + [1]
    assert parse_pipeline_layout(format_pipeline_layout(layout)) == layout
    assert _problems("Etmt|L") == (
        "'t' at position 3 after an 'm' of its stage (Megatron-LM builds the MTP depths after "
        "the decoder blocks)",
    )


def test_mtp_depths_a_layout_names_are_the_models_and_sit_with_the_loss() -> None:
    model = model_preset("deepseek-v3")  # mtp_num_layers = 1
    laws = flexible_layout_laws(61, parse_pipeline_layout("Et*4|(t*4|)*14tmL"), 4, 4, 1)
    assert laws == []
    misplaced = flexible_layout_laws(61, parse_pipeline_layout("Et*4m|(t*4|)*14tL"), 4, 4, 1)
    assert [f"{v.law}: {v.message}" for v in misplaced] == [
        "layout_mtp_layers: the layout holds 1 MTP depths (m) in stage 0, the model has "
        "mtp_num_layers = 1, costed on the last stage (with the loss)"
    ]
    # without 'm' the depths stay where the default puts them, with the loss
    assert flexible_layout_laws(61, parse_pipeline_layout("Et*4|(t*4|)*14tL"), 4, 4, 1) == []
    two = flexible_layout_laws(61, parse_pipeline_layout("Et*4|(t*4|)*14tmmL"), 4, 4, 1)
    assert [v.law for v in two] == ["layout_mtp_layers"]
    assert model.mtp_num_layers == 1


def _spec(layout: str, p: int, **extra: int | str | bool) -> object:
    keys: dict[str, int | str | bool] = {
        "tensor_model_parallel_size": 8,
        "pipeline_model_parallel_size": p,
        "data_parallel_size": 1,
        "global_batch_size": 64,
        "pipeline_model_parallel_layout": layout,
        **extra,
    }
    return from_mapping(keys, model=GPT3)


def _laws(layout: str, p: int, **extra: int | str | bool) -> list[str]:
    spec = _spec(layout, p, **extra)
    return [f"{v.law}: {v.message}" for v in check_training(spec.model, spec.mapping)]  # type: ignore[attr-defined]


def test_laws_layout_covers_the_model_exactly() -> None:
    assert _laws("Et*47|t*48L", 2) == [
        "layout_covers_model: the layout holds 95 decoder blocks (t), the model has 96"
    ]
    assert _laws("Et*47|t*49L", 2) == []


def test_laws_stage_count_against_a_given_virtual_size() -> None:
    laws = _laws("Et*47|t*49L", 2, virtual_pipeline_model_parallel_size=2)
    assert laws[0] == "layout_stage_count: the layout has 2 stages, p * v = 2 * 2 = 4"


def test_laws_embedding_first_and_loss_last_with_positions() -> None:
    laws = _laws("t*48|Et*48L|L", 3)
    assert laws == [
        "layout_embedding_first: the embedding (E) must be given once, in the first stage (0); "
        "found in stage 1 (position 5 of the layout string)",
        "layout_loss_last: the loss (L) must be given once, in the last stage (2); found in "
        "stage 1 (position 5 of the layout string), stage 2 (position 12 of the layout string)",
    ]
    missing = _laws("t*48|t*48", 2)
    assert missing[0].endswith("found in no stage")


def test_stage_count_must_be_a_multiple_of_p() -> None:
    with pytest.raises(ConfigError, match="has 3 stages, not a multiple of"):
        _spec("Et*32|t*32|t*32L", 2)


def test_megatron_refuses_the_layout_beside_other_layout_keys() -> None:
    with pytest.raises(ConfigError, match="cannot be set with decoder_first_pipeline_num_layers"):
        _spec("Et*47|t*49L", 2, decoder_first_pipeline_num_layers=47)
    with pytest.raises(ConfigError, match="cannot be set with num_virtual_stages_per"):
        _spec("Et*47|t*49L", 2, num_virtual_stages_per_pipeline_rank=1)


def test_syntax_errors_reach_from_mapping_as_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"'Et\|Tt\|L'.*position 3"):
        _spec("Et|Tt|L", 3)


def test_layout_gives_v_blocks_per_chunk_and_flags_back() -> None:
    text = "Et*12|(t*14|)*6L"  # 8 stages on p = 4: v = 2
    spec = _spec(text, 4)
    pipeline = spec.mapping.parallelism.pipeline  # type: ignore[attr-defined]
    assert isinstance(pipeline.layout, FlexibleStages)
    assert isinstance(pipeline.schedule, InterleavedOneForwardOneBackward)
    assert pipeline.schedule.virtual_stages == 2
    # virtual stage c * p + r: rank 3 holds stages 3 and 7.
    assert chunk_layer_counts(GPT3, pipeline) == ((12, 14), (14, 14), (14, 14), (14, 0))
    assert stage_layer_counts(GPT3, pipeline) == (26, 28, 28, 14)
    flat = to_mapping(spec)  # type: ignore[arg-type]
    assert flat["pipeline_model_parallel_layout"] == "Et*12|(t*14|)*6L"
    assert "num_virtual_stages_per_pipeline_rank" not in flat
    assert from_mapping(flat).mapping == spec.mapping  # type: ignore[attr-defined]
    args = to_megatron_args(spec)  # type: ignore[arg-type]
    at = args.index("--pipeline-model-parallel-layout")
    assert args[at + 1] == "Et*12|(t*14|)*6L"
    assert "--num-virtual-stages-per-pipeline-rank" not in args


def test_strategy_text_takes_the_layout() -> None:
    mapping = parse_strategy_text("tp=8 pp=2 dp=1 gbs=16 layout=Et*47|t*49L")
    assert isinstance(mapping.parallelism.pipeline.layout, FlexibleStages)
    assert mapping.virtual_stages == 1
    assert parse_strategy_text(format_strategy_text(mapping)) == mapping
    with pytest.raises(ConfigError, match=r"layout=Et\|x: invalid layer character 'x'"):
        parse_strategy_text("tp=8 pp=2 dp=1 gbs=16 layout=Et|x")


def test_embedding_and_loss_in_their_own_stages_carry_their_costs() -> None:
    config = load_config(EXAMPLE)
    assert config.training is not None
    system = system_from_mapping(dict(config.system), source=config.source)
    base = config.training
    layout = parse_pipeline_layout("E|(t*16|)*6L")  # p = 8: stage 0 only E, stage 7 only L
    pipeline = replace(
        base.mapping.parallelism.pipeline,
        schedule=replace(base.mapping.parallelism.pipeline.schedule, virtual_stages=1)
        if isinstance(base.mapping.parallelism.pipeline.schedule, InterleavedOneForwardOneBackward)
        else base.mapping.parallelism.pipeline.schedule,
        layout=layout,
    )
    from blueprinting.mapping.transformer import OneForwardOneBackward

    pipeline = replace(pipeline, schedule=OneForwardOneBackward())
    mapping = replace(
        base.mapping, parallelism=replace(base.mapping.parallelism, pipeline=pipeline)
    )
    spec = replace(base, mapping=mapping)
    assert check_training(spec.model, spec.mapping, megatron=False) == ()
    plan = portable_plan(spec, system)
    costs = schedule_costs(plan, spec, system)
    assert costs.forward_s[0][0] == plan.embedding.forward.critical_path_s
    assert costs.forward_s[7][0] == plan.lm_head.forward.critical_path_s
    assert costs.forward_s[3][0] == 16 * plan.block.forward_s
    first, last = stage_parameters(spec.model, mapping, 0), stage_parameters(spec.model, mapping, 7)
    assert first.total == first.embedding > 0
    assert last.total == last.output_layer + last.final_norm > 0
    with pytest.raises(InvalidStrategyError):
        from blueprinting.mapping.laws import validate_training

        validate_training(
            spec.model, replace(mapping, batch=replace(mapping.batch, global_batch_size=7))
        )


# ---- the search's balanced layouts ---------------------------------------------------------
@pytest.mark.parametrize(
    ("layers", "mtp", "stages", "text"),
    [
        # Megatron-Bridge's Llama 3.1 405B at PP 16 x VP 8
        (126, 0, 128, "E|(t|)*126L"),
        # NVIDIA's DeepSeek-V3 GB200 reproduce guide (Megatron-LM @1d9edcf8c7c1), PP 8 x VP 4
        (61, 0, 32, "Et|(tt|)*30L"),
        # Megatron-Bridge's 25.09 H100 DeepSeek-V3 recipe, with its MTP depth
        (61, 1, 32, "Et|(tt|)*30mL"),
        (61, 0, 16, "Et*3|(t*4|)*14ttL"),
        (12, 0, 1, "Et*12L"),
        (7, 0, 3, "Ett|t*3|ttL"),
    ],
)
def test_balanced_layouts_reproduce_the_published_ones(
    layers: int, mtp: int, stages: int, text: str
) -> None:
    from blueprinting.mapping.pipeline_layout import balanced_layout

    layout = balanced_layout(layers, mtp, stages)
    assert layout is not None and format_pipeline_layout(layout) == text
    assert layout == parse_pipeline_layout(text)


@given(
    layers=st.integers(min_value=1, max_value=200),
    mtp=st.integers(min_value=0, max_value=3),
    p=st.integers(min_value=1, max_value=32),
    v=st.integers(min_value=1, max_value=8),
)
def test_a_balanced_layout_is_lawful_and_balanced(layers: int, mtp: int, p: int, v: int) -> None:
    """Every unit (a block, the embedding, an MTP depth, the loss) lands once; stages hold
    units differing by at most one, the heavier first; Megatron's layout rules hold. None
    exactly where the last stage cannot hold the MTP depths and the loss."""
    from blueprinting.mapping.pipeline_layout import balanced_layout

    stages = p * v
    layout = balanced_layout(layers, mtp, stages)
    units = layers + 2 + mtp
    if units // stages < 1 + mtp:
        assert layout is None
        return
    assert layout is not None
    assert flexible_layout_laws(layers, layout, p, v, mtp) == []
    sizes = [s.decoder_layers + s.embedding + s.loss + s.mtp_layers for s in layout.stages]
    assert sum(sizes) == units
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)
