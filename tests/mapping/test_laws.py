"""The laws: exact messages for representative violations, uneven layouts, inference."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.errors import InvalidStrategyError, RuleSet
from blueprinting.mapping.laws import (
    balanced_layout_hint,
    check_inference,
    check_training,
    stage_blocks,
    uneven_split_hint,
    validate_training,
)
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import (
    EvenStages,
    InferenceSpec,
    OneForwardOneBackward,
    PipelineParallel,
    TrainingSpec,
    UnevenStages,
    from_mapping,
    inference_from_mapping,
)


def _spec(**keys: object) -> TrainingSpec:
    return from_mapping(keys, model=model_preset("gpt3-175b"))


def _messages(spec: TrainingSpec, *, megatron: bool = True) -> list[str]:
    return [str(v) for v in check_training(spec.model, spec.mapping, megatron=megatron)]


def test_blocks_per_pipeline_stage_message() -> None:
    spec = _spec(pipeline_model_parallel_size=7, data_parallel_size=1, global_batch_size=7)
    assert _messages(spec) == [
        "[planner] blocks_per_pipeline_stage: blocks_per_pipeline_stage = 96 / 7 is not integral"
        "; Megatron-LM runs it uneven with decoder_first_pipeline_num_layers = 13 and "
        "decoder_last_pipeline_num_layers = 13 (13/14/14/14/14/14/13), or "
        "account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split "
        "((96 + 2) / 7 = 14 units a stage)"
    ]
    (violation,) = check_training(spec.model, spec.mapping)
    assert violation.values == (("transformer_blocks", 96), ("p", 7))
    assert violation.formula == "blocks_per_pipeline_stage = transformer_blocks / p"


def test_every_violation_is_reported_at_once() -> None:
    spec = _spec(
        tensor_model_parallel_size=5,
        pipeline_model_parallel_size=2,
        num_virtual_stages_per_pipeline_rank=5,
        data_parallel_size=3,
        sequence_parallel=True,
        micro_batch_size=2,
        global_batch_size=20,
        recompute_granularity="full",
        recompute_method="uniform",
        recompute_num_layers=49,
        overlap_p2p_comm=False,
    )
    assert _messages(spec) == [
        "[planner] local_batch: local_batch = 20 / 3 is not integral",
        "[planner] microbatch_count: microbatch_count = 20 / (3 * 2) is not integral",
        "[planner] blocks_per_virtual_chunk: blocks_per_virtual_chunk = 96 / (2 * 5) is not "
        "integral; Megatron-LM runs it with pipeline_model_parallel_layout = "
        "'Et*9|(t*10|)*7t*9|t*8L' (the embedding, the loss one layer each, spread evenly; it "
        "sets v, in place of the virtual stage count)",
        "[planner] attention_heads_per_tensor_rank: attention_heads_per_tensor_rank = 96 / 5 is "
        "not integral",
        "[planner] query_groups_vs_tensor: num_query_groups = 96 is not divisible by t = 5 "
        "(Megatron-Core splits the K/V heads over the TP ranks: attention.py "
        "divide(num_query_groups, t))",
        "[planner] ffn_per_tensor_rank: ffn_per_tensor_rank = 49152 / 5 is not integral",
        # 51200 / 5 = 10240: the padded vocabulary splits.
        "[planner] recompute_num_layers: recompute_num_layers = 49 is outside 1..48 (blocks per "
        "pipeline stage)",
        "[planner] local_sequence: local_sequence = 2048 / 5 is not integral",
        "[megatron] interleaving_pipeline_degree: interleaving needs p > 2 (or p = 2 with "
        "overlap_p2p_comm), got p = 2",
        "[megatron] microbatch_group_remainder: m mod N = 3 mod 2 = 1 is neither 0 nor >= p = 2",
    ]
    assert [v.law for v in check_training(spec.model, spec.mapping, megatron=False)] == [
        "local_batch",
        "microbatch_count",
        "blocks_per_virtual_chunk",
        "attention_heads_per_tensor_rank",
        "query_groups_vs_tensor",
        "ffn_per_tensor_rank",
        "recompute_num_layers",
        "local_sequence",
    ]


def test_validate_training_raises_with_all_violations() -> None:
    spec = _spec(pipeline_model_parallel_size=7, data_parallel_size=3, global_batch_size=10)
    with pytest.raises(InvalidStrategyError) as error:
        validate_training(spec.model, spec.mapping)
    assert [v.law for v in error.value.violations] == [
        "local_batch",
        "microbatch_count",
        "blocks_per_pipeline_stage",
    ]
    assert str(error.value).startswith(
        "checking gpt3-175b: TP1(ar) PP7(1F1B) DP3(no-shard) recompute=none: 3 law(s) violated:"
    )


def test_megatron_microbatch_group_rules() -> None:
    # p = 4, N = 4 (default), m = 6: m mod N = 2 < p.
    spec = _spec(
        pipeline_model_parallel_size=4,
        num_virtual_stages_per_pipeline_rank=2,
        data_parallel_size=1,
        global_batch_size=6,
    )
    assert [(v.law, v.ruleset) for v in check_training(spec.model, spec.mapping)] == [
        ("microbatch_group_remainder", RuleSet.MEGATRON)
    ]
    # m = 2 < N = p = 4 breaks the bounds and the remainder rule.
    small = _spec(
        pipeline_model_parallel_size=4,
        num_virtual_stages_per_pipeline_rank=2,
        data_parallel_size=1,
        global_batch_size=2,
    )
    assert [v.message for v in check_training(small.model, small.mapping)] == [
        "p <= N <= m fails: 4 <= 4 <= 2",
        "m mod N = 2 mod 4 = 2 is neither 0 nor >= p = 4",
    ]


def test_sequence_parallel_needs_tensor_parallelism() -> None:
    spec = _spec(sequence_parallel=True, data_parallel_size=1)
    assert _messages(spec) == [
        "[megatron] sequence_parallel_needs_tensor: sequence parallelism needs t > 1, got t = 1"
    ]
    assert _messages(spec, megatron=False) == []


def test_uneven_stages() -> None:
    pipeline = PipelineParallel(
        degree=8, schedule=OneForwardOneBackward(), layout=UnevenStages(first_stage_layers=6)
    )
    assert stage_blocks(96, pipeline) is None  # 90 / 7 is not integral
    fits = PipelineParallel(
        degree=8,
        schedule=OneForwardOneBackward(),
        layout=UnevenStages(first_stage_layers=12, last_stage_layers=6),
    )
    assert stage_blocks(96, fits) == (12, 13, 13, 13, 13, 13, 13, 6)
    even = PipelineParallel(degree=8, schedule=OneForwardOneBackward(), layout=EvenStages())
    assert stage_blocks(96, even) == (12,) * 8

    spec = _spec(
        pipeline_model_parallel_size=8,
        decoder_first_pipeline_num_layers=6,
        data_parallel_size=1,
        global_batch_size=8,
    )
    assert _messages(spec) == [
        "[planner] blocks_per_middle_stage: blocks_per_middle_stage = 90 / 7 is not a positive "
        "integer"
    ]
    interleaved = _spec(
        pipeline_model_parallel_size=8,
        decoder_first_pipeline_num_layers=12,
        decoder_last_pipeline_num_layers=6,
        num_virtual_stages_per_pipeline_rank=2,
        data_parallel_size=1,
        global_batch_size=8,
    )
    assert _messages(interleaved) == [
        "[planner] blocks_per_virtual_chunk: blocks_per_virtual_chunk = 13 / 2 is not integral "
        "on the middle stage(s)"
    ]


def _inference(**keys: object) -> InferenceSpec:
    return inference_from_mapping(keys, model=model_preset("gpt3-175b"))


def test_inference_laws() -> None:
    ok = _inference(
        tensor_model_parallel_size=8,
        pipeline_model_parallel_size=4,
        batch_size=8,
        prompt_length=1024,
        generated_tokens=1024,
    )
    assert check_inference(ok.model, ok.mapping) == ()
    bad = _inference(
        tensor_model_parallel_size=5,
        pipeline_model_parallel_size=7,
        sequence_parallel=True,
        batch_size=8,
        prompt_length=2047,
        generated_tokens=2,
    )
    assert [v.law for v in check_inference(bad.model, bad.mapping)] == [
        "blocks_per_pipeline_stage",
        "attention_heads_per_tensor_rank",
        "query_groups_vs_tensor",
        "ffn_per_tensor_rank",
        "context_length",
        "local_sequence",
    ]


def test_training_splits_the_kv_heads_serving_may_replicate_them() -> None:
    """Megatron-Core's attention divides the K/V heads over t (``divide(num_query_groups,
    world_size)``): training at t = 8 with 4 groups is refused before the block derivation (the
    search once enumerated it and stopped there); serving may replicate each K/V head on t / g
    ranks."""
    from blueprinting.api import build_spec

    spec = build_spec(
        model="qwen3-30b-a3b",
        gpus=16,
        settings={
            "tensor_model_parallel_size": 8,
            "expert_model_parallel_size": 2,
            "sequence_parallel": True,
            "global_batch_size": 16,
        },
    )
    violations = check_training(spec.model, spec.mapping, megatron=False)
    assert [v.law for v in violations] == ["query_groups_vs_tensor"]
    assert violations[0].message.startswith("num_query_groups = 4 is not divisible by t = 8")
    from blueprinting.mapping.flat_keys import inference_from_mapping
    from blueprinting.mapping.laws import check_inference

    serving = inference_from_mapping(
        {
            "tensor_model_parallel_size": 8,
            "batch_size": 1,
            "prompt_length": 128,
            "generated_tokens": 16,
        },
        model=spec.model,
    )
    served = [v.law for v in check_inference(serving.model, serving.mapping, megatron=False)]
    assert "query_groups_vs_tensor" not in served


def _uneven(num_layers: int, p: int, first: int | None, last: int | None) -> tuple[int, ...] | None:
    layout = UnevenStages(first_stage_layers=first, last_stage_layers=last)
    return stage_blocks(
        num_layers, PipelineParallel(degree=p, schedule=OneForwardOneBackward(), layout=layout)
    )


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 12), num_layers=st.integers(2, 80))
def test_the_uneven_hint_is_a_most_even_split_megatron_runs(p: int, num_layers: int) -> None:
    """Wherever p does not divide the blocks (and there are at least p), the message names a
    decoder_first / decoder_last split the planner accepts, as even as any such split can be
    (brute force over every pair)."""
    hint = uneven_split_hint(num_layers, p)
    if num_layers % p == 0 or num_layers < p:
        # fewer blocks than stages: only Megatron's own accounting can place them
        assert num_layers % p == 0 or "decoder_" not in hint
        return
    first = re.search(r"decoder_first_pipeline_num_layers = (\d+)", hint)
    last = re.search(r"decoder_last_pipeline_num_layers = (\d+)", hint)
    counts = _uneven(
        num_layers, p, int(first[1]) if first else None, int(last[1]) if last else None
    )
    assert counts is not None and sum(counts) == num_layers
    spreads = [
        max(c) - min(c)
        for a in (None, *range(1, num_layers + 1))
        for b in (None, *range(1, num_layers + 1))
        if (a or b) and (c := _uneven(num_layers, p, a, b)) is not None
    ]
    assert max(counts) - min(counts) == min(spreads)
    assert ("account_for_embedding_in_pipeline_split" in hint) == ((num_layers + 2) % p == 0)


def test_the_uneven_hint_for_llama3_405b_on_16_stages() -> None:
    """The Llama 3 paper's 7-layer first and last stages, and Megatron's own accounting."""
    assert uneven_split_hint(126, 16) == (
        "; Megatron-LM runs it uneven with decoder_first_pipeline_num_layers = 7 and "
        "decoder_last_pipeline_num_layers = 7 (7/8/8/8/8/8/8/8/8/8/8/8/8/8/8/7), or "
        "account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split "
        "((126 + 2) / 16 = 8 units a stage)"
    )
    assert uneven_split_hint(3, 4) == ""


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 8), v=st.integers(2, 4), per_chunk=st.integers(1, 6))
def test_the_uneven_hint_with_virtual_stages_passes_the_uneven_laws(
    p: int, v: int, per_chunk: int
) -> None:
    """With v virtual stages every suggested count is a multiple of v: a model of
    v x per_chunk x p + v blocks (p does not divide it) gets a split the uneven laws accept."""
    num_layers = v * (per_chunk * p + 1)
    hint = uneven_split_hint(num_layers, p, v)
    first = re.search(r"decoder_first_pipeline_num_layers = (\d+)", hint)
    last = re.search(r"decoder_last_pipeline_num_layers = (\d+)", hint)
    assert first or last
    layout = UnevenStages(
        first_stage_layers=int(first[1]) if first else None,
        last_stage_layers=int(last[1]) if last else None,
    )
    spec = _spec(
        pipeline_model_parallel_size=p,
        virtual_pipeline_model_parallel_size=v,
        num_layers=num_layers,
        data_parallel_size=1,
        global_batch_size=p,
    )
    pipeline = replace(spec.mapping.parallelism.pipeline, layout=layout)
    assert stage_blocks(num_layers, pipeline) is not None
    mapping = replace(
        spec.mapping, parallelism=replace(spec.mapping.parallelism, pipeline=pipeline)
    )
    laws = {found.law for found in check_training(spec.model, mapping, megatron=False)}
    assert not laws & {"blocks_per_virtual_chunk", "blocks_per_middle_stage"}


def test_the_virtual_chunk_law_names_the_balanced_layout() -> None:
    """DeepSeek-V3's 61 layers and one MTP depth over 8 x 4 virtual stages: NVIDIA's own
    layout (the GB200 reproduce guide's `Et|(tt|)*30mL`)."""
    assert balanced_layout_hint(61, 1, 32) == (
        "; Megatron-LM runs it with pipeline_model_parallel_layout = 'Et|(tt|)*30mL' (the "
        "embedding, the loss and each MTP depth one layer each, spread evenly; it sets v, in "
        "place of the virtual stage count)"
    )
    assert uneven_split_hint(126, 16, 8) == (
        "; Megatron-LM runs it uneven with account_for_embedding_in_pipeline_split and "
        "account_for_loss_in_pipeline_split ((126 + 2) / 128 = 1 unit a virtual stage)"
    )


def test_serving_gets_no_training_hint() -> None:
    """decoder_first/last and account_for_* are training-only keys: serving's layout law names
    none of them (96 / 7 stages)."""
    bad = _inference(
        tensor_model_parallel_size=8,
        pipeline_model_parallel_size=7,
        batch_size=8,
        prompt_length=1024,
        generated_tokens=8,
    )
    laws = check_inference(bad.model, bad.mapping)
    (stage_law,) = [v for v in laws if v.law.startswith("blocks")]
    assert stage_law.message == "blocks_per_pipeline_stage = 96 / 7 is not integral"


def test_dualpipev_gets_no_layout_hint() -> None:
    """DualPipeV places its own two chunks a rank, and takes no layout string; the uneven
    split still applies (96 over 5 ranks, each count a multiple of its 2 chunks)."""
    spec = _spec(
        pipeline_model_parallel_size=5,
        pipeline_schedule="dualpipev",
        data_parallel_size=1,
        global_batch_size=40,
    )
    messages = {v.law: v.message for v in check_training(spec.model, spec.mapping, megatron=False)}
    assert "pipeline_model_parallel_layout" not in messages.get("blocks_per_virtual_chunk", "")
    assert messages["blocks_per_pipeline_stage"].endswith(
        "decoder_first_pipeline_num_layers = 18 and decoder_last_pipeline_num_layers = 18 "
        "(18/20/20/20/18)"
    )


def test_the_layout_hint_stays_within_what_the_parser_reads() -> None:
    """More virtual stages than a layout string may expand to (65,536), or a run of blocks past
    its per-stage bound: no layout is named (and none is built)."""
    assert balanced_layout_hint(1_000_001, 0, 1024 * 128) == ""
    assert balanced_layout_hint(2_200_001, 0, 4) == ""
    assert balanced_layout_hint(61, 1, 32) != ""
