"""parse_strategy_text / format_strategy_text: accepted keys, errors, round trip."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.errors import ConfigError
from blueprinting.mapping.transformer import (
    BatchSpec,
    DataParallel,
    DistributedOptimizer,
    FullRecompute,
    InterleavedOneForwardOneBackward,
    NoRecompute,
    OneForwardOneBackward,
    RecomputeMethod,
    ReduceScatterAllGather,
    SelectiveRecompute,
    SingleStage,
    TensorParallel,
    TransformerTrainingMappingSpec,
    ZeroBubbleH1,
)
from blueprinting.search.space import (
    candidate_to_spec,
    enumerate_strategies,
    format_strategy_text,
    parse_strategy_text,
)
from tests.search.test_space import TINY, TINY_SPACES


def test_parse_issue_example() -> None:
    mapping = parse_strategy_text(
        "tp=2 pp=16 v=3 mbs=1 sp=on recompute=selective sharding=optim",
        num_gpus=1024,
        global_batch_size=1536,
    )
    par = mapping.parallelism
    assert par.tensor == TensorParallel(degree=2, communication=ReduceScatterAllGather())
    assert par.pipeline.degree == 16
    assert par.pipeline.schedule == InterleavedOneForwardOneBackward(virtual_stages=3)
    assert par.data == DataParallel(degree=32, optimizer_sharding=DistributedOptimizer())
    assert par.recompute == SelectiveRecompute()
    assert mapping.batch == BatchSpec(global_batch_size=1536, micro_batch_size=1)


def test_defaults_and_schedules() -> None:
    single = parse_strategy_text("dp=4 gbs=8")
    assert single.parallelism.pipeline.schedule == SingleStage()
    assert single.parallelism.recompute == NoRecompute()
    assert single.batch.micro_batch_size == 1
    flat = parse_strategy_text("pp=4 dp=2 gbs=8 recompute=full-block recompute_layers=3")
    assert flat.parallelism.pipeline.schedule == OneForwardOneBackward()
    assert flat.parallelism.recompute == FullRecompute(method=RecomputeMethod.BLOCK, num_layers=3)
    # Interleaving with p = 1 is representable; the laws reject it, the parser does not repair it.
    odd = parse_strategy_text("vp=2 dp=1 gbs=1")
    assert odd.parallelism.pipeline.schedule == InterleavedOneForwardOneBackward(virtual_stages=2)


def test_every_problem_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        parse_strategy_text(
            "tp=0 foo=1 sp=maybe v=1 overlap_p2p=on recompute=selective recompute_layers=2 "
            "sharding=no_shard overlap_param_gather=on tp=2 bare"
        )
    assert info.value.problems == (
        "foo: unknown key (accepted: tp, cp, cp_comm, pp, dp, gpus, v, vp, mbs, gbs, sp, "
        "recompute, recompute_method, recompute_layers, sharding, overlap_grad, "
        "overlap_param_gather, overlap_p2p, group, schedule, layout, precision)",
        "tp: given twice",
        "'bare': expected key=value",
        "tp=0: expected a positive integer",
        "gbs: missing (give gbs=... or the global batch size)",
        "dp: missing (give dp=... or gpus=...)",
        "sp=maybe: expected on or off",
        "recompute_layers=2: only full recompute has a layer count (recompute=selective)",
        "overlap_param_gather=on: needs a sharded optimizer (sharding=no_shard)",
        "overlap_p2p=on: only the interleaved schedule (v > 1) has it",
    )


def test_gpus_must_factor() -> None:
    with pytest.raises(ConfigError) as info:
        parse_strategy_text("tp=8 pp=3 gpus=64 gbs=64")
    assert info.value.problems == ("gpus=64: not a multiple of tp*pp = 24",)
    with pytest.raises(ConfigError) as info:
        parse_strategy_text("tp=8 dp=2 gpus=64 gbs=64")
    assert info.value.problems == ("gpus=64: tp*pp*dp = 16 differs",)


def test_canonical_text() -> None:
    mapping = parse_strategy_text(
        "tp=8 pp=8 v=2 gpus=1024 gbs=1536 sp=on recompute=selective sharding=optim "
        "overlap_grad=on group=12"
    )
    assert format_strategy_text(mapping) == (
        "tp=8 pp=8 dp=16 v=2 mbs=1 gbs=1536 sp=on recompute=selective sharding=optim "
        "overlap_param_gather=off overlap_grad=on overlap_p2p=off group=12"
    )


TINY_TABLE = enumerate_strategies(TINY, TINY_SPACES[0]).table


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=len(TINY_TABLE) - 1))
def test_round_trip_of_enumerated_candidates(i: int) -> None:
    mapping: TransformerTrainingMappingSpec = candidate_to_spec(TINY_TABLE, i, TINY).mapping
    assert parse_strategy_text(format_strategy_text(mapping)) == mapping


def test_zero_bubble_schedule_round_trips() -> None:
    mapping = parse_strategy_text("tp=2 pp=4 dp=2 gbs=16 schedule=zb-h1")
    assert mapping.parallelism.pipeline.schedule == ZeroBubbleH1()
    assert parse_strategy_text(format_strategy_text(mapping)) == mapping
    with pytest.raises(ConfigError):
        parse_strategy_text("pp=4 v=2 gbs=16 schedule=zb-h1")


def test_integers_past_the_limit_are_refused_without_converting_them() -> None:
    """Found by the CLI fuzz benchmark: a 5000-digit value escaped as Python's int-conversion
    ValueError."""
    with pytest.raises(ConfigError) as info:
        parse_strategy_text(f"tp=1 gbs=8 dp=1 v={'9' * 5000} pp={2**63}")
    assert set(info.value.problems) == {
        "v=99999999999999999999...(5000 characters): exceeds the limit "
        "2**63 - 1 = 9223372036854775807",
        "pp=9223372036854775808: exceeds the limit 2**63 - 1 = 9223372036854775807",
    }
