"""parse_strategy_text / format_strategy_text: accepted keys, errors, round trip."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.errors import ConfigError
from blueprinting.mapping.transformer import (
    AllGatherDispatcher,
    AllToAllDispatcher,
    BatchSpec,
    DataParallel,
    DistributedOptimizer,
    ExpertParallel,
    FlexBackend,
    FlexDispatcher,
    FullRecompute,
    InterleavedOneForwardOneBackward,
    NoRecompute,
    OneForwardOneBackward,
    RecomputeMethod,
    ReduceScatterAllGather,
    SelectiveRecompute,
    SingleStage,
    TensorParallel,
    TokenDispatcher,
    TransformerTrainingMappingSpec,
    UserbufferOverlap,
    ZeroBubbleH1,
    dispatcher_overlaps,
)
from blueprinting.search.space import (
    candidate_to_spec,
    enumerate_strategies,
    format_strategy_text,
    parse_strategy_text,
)
from tests.search.test_space import TINY, TINY_SPACES
from tests.strategies import with_ep_overlap


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
        "tp_overlap, recompute, recompute_method, recompute_layers, sharding, overlap_grad, "
        "overlap_param_gather, overlap_p2p, group, schedule, layout, precision, ep, etp, "
        "dispatcher, ep_overlap, grouped_gemm)",
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


def test_tp_overlap_round_trips_and_needs_sequence_parallelism() -> None:
    text = "tp=4 pp=2 dp=8 mbs=1 gbs=64 sp=on tp_overlap=on recompute=none sharding=no_shard"
    mapping = parse_strategy_text(text)
    assert mapping.parallelism.tensor == TensorParallel(
        degree=4, communication=ReduceScatterAllGather(overlap=UserbufferOverlap())
    )
    assert format_strategy_text(mapping) == f"{text} overlap_grad=off"
    assert parse_strategy_text(format_strategy_text(mapping)) == mapping
    # off is the default and is not written
    plain = parse_strategy_text(text.replace("tp_overlap=on", "tp_overlap=off"))
    assert plain.parallelism.tensor.communication == ReduceScatterAllGather()
    assert "tp_overlap" not in format_strategy_text(plain)
    with pytest.raises(ConfigError) as info:
        parse_strategy_text("tp=4 dp=1 gbs=8 tp_overlap=on")
    assert info.value.problems == (
        "tp_overlap=on: the userbuffer overlap needs sequence parallelism (sp=on)",
    )
    # Switches other than Transformer Engine's defaults have no strategy-text spelling.
    custom = dataclasses.replace(
        mapping,
        parallelism=dataclasses.replace(
            mapping.parallelism,
            tensor=TensorParallel(
                degree=4,
                communication=ReduceScatterAllGather(
                    overlap=UserbufferOverlap(reduce_scatter=False)
                ),
            ),
        ),
    )
    with pytest.raises(ConfigError) as refused:
        format_strategy_text(custom)
    assert refused.value.problems == (
        "tp_comm_overlap ub(ag=ring,bulk=dgrad+wgrad) is not Transformer Engine's default; "
        "strategy text spells only tp_overlap=on (give it as flat keys)",
    )


TINY_TABLE = enumerate_strategies(TINY, TINY_SPACES[0]).table
OVERLAP_TABLE = enumerate_strategies(TINY, TINY_SPACES[3]).table


def test_the_overlap_table_has_both_kinds_of_sequence_parallel_rows() -> None:
    """Every lawful sp row (t = 3: Megatron refuses sp at t = 1, and t = 6 does not split the
    tiny model's 3 K/V heads) comes with and without the overlap, so the round trip below sees
    both."""
    overlap, sp = OVERLAP_TABLE.tp_comm_overlap, OVERLAP_TABLE.sequence_parallel
    assert set(np.unique(OVERLAP_TABLE.tensor[overlap]).tolist()) == {3}
    assert int(overlap.sum()) == int((sp & ~overlap).sum()) > 0


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=len(TINY_TABLE) - 1))
def test_round_trip_of_enumerated_candidates(i: int) -> None:
    mapping: TransformerTrainingMappingSpec = candidate_to_spec(TINY_TABLE, i, TINY).mapping
    assert parse_strategy_text(format_strategy_text(mapping)) == mapping


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=len(OVERLAP_TABLE) - 1))
def test_round_trip_of_candidates_with_tp_overlap(i: int) -> None:
    mapping = candidate_to_spec(OVERLAP_TABLE, i, TINY).mapping
    text = format_strategy_text(mapping)
    assert ("tp_overlap=on" in text) == bool(OVERLAP_TABLE.tp_comm_overlap[i])
    assert parse_strategy_text(text) == mapping


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


def test_expert_grid_words() -> None:
    """DeepSeek-V3's trained grid (PP16, EP64 on 2048 GPUs) as a line, and back."""
    text = (
        "tp=1 pp=16 dp=128 ep=64 etp=1 dispatcher=flex-deepep ep_overlap=on grouped_gemm=on "
        "mbs=1 gbs=15360 sp=off recompute=none sharding=optim overlap_param_gather=off "
        "overlap_grad=off"
    )
    mapping = parse_strategy_text(text)
    assert mapping.parallelism.experts == ExpertParallel(
        degree=64,
        tensor_degree=1,
        dispatcher=FlexDispatcher(backend=FlexBackend.DEEPEP, overlap=True),
    )
    assert mapping.expert_data_degree == 2
    assert format_strategy_text(mapping) == text
    # the default grid is written without expert words, and read back as the default
    dense = parse_strategy_text("tp=2 dp=4 gbs=8")
    assert dense.parallelism.experts == ExpertParallel()
    assert "ep=" not in format_strategy_text(dense)


@pytest.mark.parametrize(
    "dispatcher",
    [
        AllToAllDispatcher(),
        AllToAllDispatcher(overlap=True),
        AllGatherDispatcher(),
        *(FlexDispatcher(backend=b, overlap=o) for b in FlexBackend for o in (False, True)),
    ],
    ids=str,
)
@pytest.mark.parametrize("grouped_gemm", [False, True])
def test_every_dispatcher_round_trips(dispatcher: TokenDispatcher, grouped_gemm: bool) -> None:
    base = parse_strategy_text("tp=2 pp=2 dp=4 gbs=64 sp=on")
    experts = ExpertParallel(
        degree=4, tensor_degree=2, dispatcher=dispatcher, grouped_gemm=grouped_gemm
    )
    # the EP overlap selects combined 1F1B
    pipeline = dataclasses.replace(
        base.parallelism.pipeline,
        schedule=with_ep_overlap(
            base.parallelism.pipeline.schedule, dispatcher_overlaps(dispatcher)
        ),
    )
    mapping = dataclasses.replace(
        base, parallelism=dataclasses.replace(base.parallelism, experts=experts, pipeline=pipeline)
    )
    assert parse_strategy_text(format_strategy_text(mapping)) == mapping


def test_expert_words_refuse_what_a_dispatcher_lacks() -> None:
    with pytest.raises(ConfigError) as info:
        parse_strategy_text("dp=8 gbs=8 ep=8 dispatcher=allgather ep_overlap=on grouped_gemm=maybe")
    assert info.value.problems == (
        "ep_overlap=on: the EP overlap needs dispatcher=alltoall or flex-*",
        "grouped_gemm=maybe: expected on or off",
    )
    with pytest.raises(ConfigError) as info:
        parse_strategy_text("dp=8 gbs=8 ep=8 dispatcher=flex-deepepp")
    assert info.value.problems == (
        "dispatcher=flex-deepepp: expected one of alltoall, allgather, flex-deepep, "
        "flex-hybridep, flex-ncclep (did you mean 'flex-deepep'?)",
    )
    dense = parse_strategy_text("dp=8 gbs=8")
    shared = dataclasses.replace(
        dense,
        parallelism=dataclasses.replace(
            dense.parallelism,
            experts=ExpertParallel(
                degree=8, dispatcher=AllToAllDispatcher(shared_expert_overlap=True)
            ),
        ),
    )
    with pytest.raises(ConfigError) as info:
        format_strategy_text(shared)
    assert info.value.problems == (
        "dispatcher alltoall+shared-overlap: the shared-expert overlap has no strategy-text "
        "spelling (give the strategy as flat keys)",
    )


def test_the_columnwise_texts_are_the_specs_texts() -> None:
    """``strategy_texts`` (what ``--csv`` writes for every candidate) is the text of each row's
    spec, built from the same memoized parts: every row of the tiny spaces and of a MoE space
    with cp, cp comm types, expert grids, dispatchers and interleaving."""
    from blueprinting.mapping.presets import model_preset
    from blueprinting.mapping.transformer import CpCommType
    from blueprinting.search.space import SearchSpace, strategy_texts

    mixtral = model_preset("mixtral-8x7b")
    moe = SearchSpace(
        gpu_counts=(32,),
        global_batch_size=32,
        max_microbatch_size=2,
        context_parallel=None,
        cp_comm_types=(CpCommType.P2P, CpCommType.ALL_GATHER),
        expert_parallel=None,
        dispatchers=(AllToAllDispatcher(), AllToAllDispatcher(overlap=True), AllGatherDispatcher()),
    )
    cases = [(TINY, enumerate_strategies(TINY, space).table) for space in TINY_SPACES]
    cases.append((mixtral, enumerate_strategies(mixtral, moe).table))
    for model, table in cases:
        # any order, as the ranking's (every 13th MoE row: 9,168 of 119,174 keeps it quick)
        rows = np.arange(len(table))[:: -13 if model is mixtral else -1]
        expected = [
            format_strategy_text(candidate_to_spec(table, int(i), model).mapping) for i in rows
        ]
        texts = strategy_texts(table, rows, model)
        assert texts == expected
        # and independently of the shared parts: each text reads back as the row's mapping
        for i, text in list(zip(rows, texts, strict=True))[::97]:
            assert parse_strategy_text(text) == candidate_to_spec(table, int(i), model).mapping
    mixtral_table = cases[-1][1]
    assert len(mixtral_table) > 1000
    assert len(np.unique(mixtral_table.context)) > 1 and len(np.unique(mixtral_table.expert)) > 1
