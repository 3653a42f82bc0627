"""Loading the Calculon oracle and translating its records into Blueprinting specs.

Records come from ``shared/reference/calculon_oracle.json`` (Calculon caa4b11) or
``BLUEPRINTING_CALCULON_ORACLE``, and from the committed subset (fixtures/calculon_subset); tests
on the first skip when it is absent, and none holds a count of either file. The translator itself
is also tested on an inline record.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from blueprinting.errors import ConfigError, ProblemCollector, UnsupportedError
from blueprinting.mapping.model import Datatype
from blueprinting.mapping.transformer import (
    AllReduce,
    BatchSpec,
    DataParallel,
    FullRecompute,
    InterleavedOneForwardOneBackward,
    NoOptimizerSharding,
    NoRecompute,
    PipelinedDgradReduceScatter,
    PipelineParallel,
    RecomputeMethod,
    ReduceScatterAllGather,
    SelectiveRecompute,
    ShardedGradients,
    SingleStage,
    TensorParallel,
    TransformerTrainingParallelism,
    UserbufferOverlap,
)
from blueprinting.validation.calculon import (
    CALCULON_TP_OVERLAP,
    ORACLE_ENV,
    CalculonRecord,
    CalculonRejection,
    classify_rejection,
    default_oracle_path,
    load_oracle,
    parse_record,
    summarize_rejections,
    tp_overlap_exclusion,
    translate,
)

SUBSET = Path(__file__).parent / "fixtures" / "calculon_subset" / "calculon_oracle.json"


@pytest.fixture(scope="module", params=["oracle", "subset"])
def oracle(request: pytest.FixtureRequest) -> dict[int, CalculonRecord]:
    path = SUBSET if request.param == "subset" else default_oracle_path()
    if path is None or not path.is_file():
        pytest.skip(
            f"calculon_oracle.json not found (set {ORACLE_ENV} or BLUEPRINTING_SHARED); "
            "the committed subset still runs"
        )
    return {record.id: record for record in load_oracle(path)}


def _known(oracle: dict[int, CalculonRecord], record_id: int, name: str) -> CalculonRecord:
    """Record ``record_id`` of the shared oracle, when this oracle holds it."""
    record = oracle.get(record_id)
    if record is None or record.name != name:
        pytest.skip(f"this oracle has no record {record_id} {name!r}")
    return record


def _exe(**overrides: object) -> dict[str, object]:
    exe: dict[str, object] = {
        "num_procs": 64, "tensor_par": 8, "pipeline_par": 8, "data_par": 1,
        "tensor_par_net": 0, "pipeline_par_net": 1, "data_par_net": 1,
        "batch_size": 64, "microbatch_size": 1, "datatype": "float16",
        "fused_activation": False, "attention_type": "multihead",
        "activation_recompute": "none", "pipeline_interleaving": 3,
        "optimizer_sharding": False, "tensor_par_comm_type": "ar",
        "tensor_par_overlap": "none", "seq_par_ag_redo": False, "data_par_overlap": False,
        "weight_offload": False, "activations_offload": False, "optimizer_offload": False,
        "training": True,
    }  # fmt: skip
    exe.update(overrides)
    return exe


def _record(**exe_overrides: object) -> CalculonRecord:
    problems = ProblemCollector()
    record = parse_record(
        {
            "id": 7,
            "group": "canonical",
            "name": "inline",
            "ok": False,
            "inputs": {
                "model_name": "gpt3-175B",
                "system_name": "a100_80g",
                "app": {
                    "hidden": 12288,
                    "feedforward": 49152,
                    "seq_size": 2048,
                    "attn_heads": 96,
                    "attn_size": 128,
                    "num_blocks": 96,
                },
                "exe": _exe(**exe_overrides),
                "sys": {},
            },
            "error": {
                "stage": "compile",
                "error_type": "Llm.Error",
                "error": "Mem tier1 needs 9 GiB",
            },
        },
        problems,
    )
    problems.raise_if_any()
    return record


def test_inline_record_translates_exactly() -> None:
    translation = translate(_record())
    spec = translation.spec
    assert spec.mapping.parallelism == TransformerTrainingParallelism(
        tensor=TensorParallel(degree=8, communication=AllReduce()),
        pipeline=PipelineParallel(
            degree=8, schedule=InterleavedOneForwardOneBackward(virtual_stages=3)
        ),
        data=DataParallel(degree=1, optimizer_sharding=NoOptimizerSharding()),
        recompute=NoRecompute(),
    )
    assert spec.mapping.batch == BatchSpec(global_batch_size=64, micro_batch_size=1)
    model = spec.model
    assert (model.num_layers, model.hidden_size, model.ffn_hidden_size) == (96, 12288, 49152)
    assert (model.num_attention_heads, model.num_query_groups, model.kv_channels) == (96, 96, 128)
    assert (model.seq_length, model.vocab_size, model.padded_vocab_size) == (2048, 51200, 51200)
    assert model.add_bias_linear is False
    assert model.datatype is Datatype.FP16
    # Calculon's block_weight_space for t = 1: 4h + 4·a·d·h + 2·h·f elements (no biases).
    assert model.block_parameters == 4 * 12288 + 4 * 96 * 128 * 12288 + 2 * 12288 * 49152
    assert translation.untranslated == ()


def test_each_knob_maps_to_its_variant() -> None:
    spec = translate(
        _record(
            tensor_par_comm_type="rs_ag",
            activation_recompute="full",
            optimizer_sharding=True,
            data_par_overlap=True,
            pipeline_par=1,
            pipeline_interleaving=1,
            data_par=8,
            attention_type="multiquery",
            datatype="bfloat16",
        )
    ).spec
    parallelism = spec.mapping.parallelism
    assert parallelism.tensor.communication == ReduceScatterAllGather()
    assert parallelism.pipeline.schedule == SingleStage()
    assert parallelism.data == DataParallel(
        degree=8, optimizer_sharding=ShardedGradients(), overlap_grad_reduce=True
    )
    assert parallelism.recompute == FullRecompute(method=RecomputeMethod.UNIFORM, num_layers=1)
    assert spec.model.num_query_groups == 1
    assert spec.model.datatype is Datatype.BF16


def test_untranslated_knobs_are_listed() -> None:
    translation = translate(
        _record(
            tensor_par_comm_type="p2p_rs_ag",
            tensor_par_overlap="ring",
            seq_par_ag_redo=True,
            fused_activation=True,
            weight_offload=True,
        )
    )
    assert translation.spec.mapping.parallelism.tensor.communication == AllReduce()
    assert translation.untranslated == (
        "tensor_par_overlap=ring over all-reduce TP (tensor_par_comm_type=p2p_rs_ag): "
        "Megatron-LM's --tp-comm-overlap needs sequence parallelism",
        "seq_par_ag_redo",
        "fused_activation",
        "weight_offload",
        "tensor_par_comm_type=p2p_rs_ag (PP send split over TP)",
    )


def test_calculon_tp_overlap_is_tp_comm_overlap_with_rs_dgrad() -> None:
    # --tp-comm-overlap --tp-comm-overlap-rs-dgrad with Transformer Engine's default methods:
    # ring all-gathers, reduce-scatters pipelined in 4 splits, the dgrad reduce-scatter too.
    assert (
        UserbufferOverlap(
            all_gather=True,
            reduce_scatter=True,
            reduce_scatter_splits=4,
            column_backward=PipelinedDgradReduceScatter(splits=4),
        )
        == CALCULON_TP_OVERLAP
    )


@pytest.mark.parametrize("overlap", ["ring", "pipe"])
def test_tiled_overlap_with_sequence_parallelism_translates(overlap: str) -> None:
    record = _record(tensor_par_comm_type="rs_ag", tensor_par_overlap=overlap)
    translation = translate(record)
    assert translation.spec.mapping.parallelism.tensor == TensorParallel(
        degree=8, communication=ReduceScatterAllGather(overlap=CALCULON_TP_OVERLAP)
    )
    assert tp_overlap_exclusion(record.exe) is None
    assert translation.untranslated == ()


@pytest.mark.parametrize(
    ("comm", "overlap"), [("ar", "ring"), ("ar", "pipe"), ("p2p_rs_ag", "pipe")]
)
def test_tiled_overlap_over_all_reduce_is_excluded_with_its_reason(comm: str, overlap: str) -> None:
    record = _record(tensor_par_comm_type=comm, tensor_par_overlap=overlap)
    reason = (
        f"tensor_par_overlap={overlap} over all-reduce TP (tensor_par_comm_type={comm}): "
        "Megatron-LM's --tp-comm-overlap needs sequence parallelism"
    )
    assert tp_overlap_exclusion(record.exe) == reason
    translation = translate(record)
    # Never silently mapped: the strategy keeps its all-reduce TP and the knob is listed.
    assert translation.spec.mapping.parallelism.tensor.communication == AllReduce()
    assert translation.untranslated[0] == reason


def test_no_overlap_has_no_exclusion() -> None:
    assert tp_overlap_exclusion(_record().exe) is None
    assert tp_overlap_exclusion(_record(tensor_par_comm_type="rs_ag").exe) is None


def test_bad_tp_overlap_value_is_a_problem() -> None:
    with pytest.raises(ConfigError, match="tensor_par_overlap"):
        _record(tensor_par_overlap="rings")


#: The tiled-overlap records over all-reduce TP of the shared oracle (comm type, overlap).
TILED_OVER_ALL_REDUCE = {
    103: ("ar", "ring"),
    105: ("ar", "pipe"),
    147: ("ar", "ring"),
    307: ("ar", "pipe"),
    374: ("ar", "pipe"),
    222: ("p2p_rs_ag", "pipe"),
    244: ("p2p_rs_ag", "ring"),
    300: ("p2p_rs_ag", "pipe"),
    469: ("p2p_rs_ag", "pipe"),
}


def test_oracle_tiled_overlap_records(oracle: dict[int, CalculonRecord]) -> None:
    """The ok training records with tiled TP overlap and no offload: those with rs_ag translate
    to CALCULON_TP_OVERLAP, those over all-reduce TP are excluded, each with its reason."""
    tiled = {
        rid: r
        for rid, r in oracle.items()
        if r.ok and r.exe.training and str(r.exe.tensor_par_overlap) != "none"
        if not (r.exe.weight_offload or r.exe.activations_offload or r.exe.optimizer_offload)
    }
    for rid, record in tiled.items():
        comm, overlap = str(record.exe.tensor_par_comm_type), str(record.exe.tensor_par_overlap)
        tensor = translate(record).spec.mapping.parallelism.tensor
        if comm == "rs_ag":
            assert tp_overlap_exclusion(record.exe) is None, rid
            assert tensor.communication == ReduceScatterAllGather(overlap=CALCULON_TP_OVERLAP)
            assert rid not in TILED_OVER_ALL_REDUCE
            continue
        assert TILED_OVER_ALL_REDUCE.get(rid, (comm, overlap)) == (comm, overlap)
        assert tensor.communication == AllReduce(), rid
        assert tp_overlap_exclusion(record.exe) == (
            f"tensor_par_overlap={overlap} over all-reduce TP (tensor_par_comm_type={comm}): "
            "Megatron-LM's --tp-comm-overlap needs sequence parallelism"
        )


def test_inference_records_are_refused() -> None:
    with pytest.raises(UnsupportedError, match="inference records"):
        translate(_record(training=False))


def test_bad_record_reports_every_problem() -> None:
    problems = ProblemCollector(source="inline")
    parse_record({"id": 1, "group": "elsewhere", "ok": True, "inputs": {"exe": {}}}, problems)
    with pytest.raises(ConfigError) as info:
        problems.raise_if_any()
    text = "\n".join(info.value.problems)
    assert "group: unknown value 'elsewhere'" in text
    assert "tensor_par must be an integer" in text
    assert "app must be an object" in text


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("Pipeline interleaving must be a factor value of the number of blocks per processor",
         CalculonRejection.INTERLEAVING_NOT_A_FACTOR),
        ("Pipeline interleaving must be less than or equal to the number of blocks per processor",
         CalculonRejection.INTERLEAVING_EXCEEDS_BLOCKS),
        ("We should split hidden=5140 between 8 TP partitions evenly",
         CalculonRejection.TP_UNEVEN_SPLIT),
        ("Offloading requires each processor to handle at least 3 blocks",
         CalculonRejection.OFFLOAD_NEEDS_BLOCKS),
        ("Mem tier1 needs 1.199 TiB but only has 80.000 GiB", CalculonRejection.HBM_CAPACITY),
        ("Mem tier2 needs 20.320 MiB but only has 0.000 iB", CalculonRejection.OFFLOAD_CAPACITY),
        ("Network tier0 isn't big enough", CalculonRejection.NETWORK_TOO_SMALL),
        ("Unsupported type: bfloat16", CalculonRejection.UNSUPPORTED_DATATYPE),
        ("something new", CalculonRejection.OTHER),
    ],
)  # fmt: skip
def test_classify_rejection(message: str, reason: CalculonRejection) -> None:
    assert classify_rejection(message) is reason


# --------------------------------------------------------------------------------------------
# On the oracle file
# --------------------------------------------------------------------------------------------
def test_oracle_records_are_complete(oracle: dict[int, CalculonRecord]) -> None:
    """Every record Calculon computed carries its 96 stats (calculon_oracle.md), every other one
    its refusal."""
    assert oracle
    for record in oracle.values():
        assert (len(record.stats) == 96) if record.ok else (record.failure is not None)


def test_rejections_grouped(oracle: dict[int, CalculonRecord]) -> None:
    """Every refusal message is one of the known kinds; the kinds sum to the refusals."""
    summary = summarize_rejections(oracle.values())
    assert CalculonRejection.OTHER not in summary, [
        r.failure.error
        for r in oracle.values()
        if r.failure is not None and r.failure.rejection is CalculonRejection.OTHER
    ]
    assert sum(summary.values()) == sum(not record.ok for record in oracle.values())
    assert list(summary.values()) == sorted(summary.values(), reverse=True)


def test_validation_record_seqsel(oracle: dict[int, CalculonRecord]) -> None:
    """Record 1: fig1/gpt3-175B_seqsel (Korthikanti 2022 Fig. 1, selective + SP, t8 p8 v3)."""
    record = _known(oracle, 1, "fig1/gpt3-175B_seqsel")
    translation = translate(record)
    parallelism = translation.spec.mapping.parallelism
    assert parallelism == TransformerTrainingParallelism(
        tensor=TensorParallel(degree=8, communication=ReduceScatterAllGather()),
        pipeline=PipelineParallel(
            degree=8, schedule=InterleavedOneForwardOneBackward(virtual_stages=3)
        ),
        data=DataParallel(degree=1),
        recompute=SelectiveRecompute(),
    )
    assert translation.untranslated == ("seq_par_ag_redo",)
    assert translation.spec.mapping.microbatch_count == 64
    # Calculon's own weight figure for this record: block_weight_space = B·(4h + (4·a·d·h + 2hf)/t).
    h, f = 12288, 49152
    assert record.stats["block_weight_space"] == 2 * (4 * h + (4 * 96 * 128 * h + 2 * h * f) // 8)


def test_random_record_with_sharding_and_multiquery(oracle: dict[int, CalculonRecord]) -> None:
    """Record 130: gpt3-13B, t8 p16 d4, full recompute, rs_ag, optimizer sharding, MQA; Calculon
    refused it because hidden 5140 does not split over 8 TP ranks."""
    record = _known(
        oracle, 130, "r001_gpt3-13B_a100_80g_roofline_float16_t8p16d4v1_mbs8_gbs512_full_rs_ag"
    )
    assert record.failure is not None
    assert record.failure.rejection is CalculonRejection.TP_UNEVEN_SPLIT
    spec = translate(record).spec
    assert spec.model.hidden_size == 5140
    assert spec.model.num_query_groups == 1
    assert spec.mapping.parallelism.data == DataParallel(
        degree=4, optimizer_sharding=ShardedGradients()
    )
    assert spec.mapping.parallelism.recompute == FullRecompute()
    assert spec.mapping.batch == BatchSpec(global_batch_size=512, micro_batch_size=8)
    assert spec.mapping.world_size == record.exe.num_procs == 512


def test_every_training_record_translates(oracle: dict[int, CalculonRecord]) -> None:
    training = [record for record in oracle.values() if record.exe.training]
    assert training
    for record in training:
        assert translate(record).spec.mapping.world_size == record.exe.num_procs


def test_oracle_path_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    target = tmp_path / "oracle.json"
    target.write_text("[]", encoding="utf-8")
    monkeypatch.setenv(ORACLE_ENV, os.fspath(target))
    assert default_oracle_path() == target
    assert load_oracle() == ()
