"""Calculon alignment gate, block level (calculon-ai/calculon at caa4b11; field guide
shared/reference/calculon_oracle.md).

For every ``ok`` oracle record, per GPU and per microbatch:

- matrix work (GEMM + batched attention matmuls) of one block's forward, activation-gradient and
  weight-gradient passes equals Calculon's GEMM/BMM layers exactly (per-layer file);
- Calculon's block totals minus our matrix work equal exactly its non-matrix layers (element-wise
  ops and the TP reduction adds that Blueprinting does not count as matrix work);
- TP collective bytes per base block (forward, backward, re-communication) are equal, with the
  documented differences below checked as exact terms.

Documented definition differences (checked, not ignored):
1. multiquery with t > 1: Calculon replicates the single K/V head on every rank; Megatron (and
   Blueprinting) require t | query groups. We derive the multihead block and check that the
   difference is exactly Calculon's replicated K/V GEMMs minus our sharded ones.
2. Sequence parallelism without ``seq_par_ag_redo``: Calculon keeps the gathered inputs instead of
   re-gathering them for the weight gradient (Megatron re-gathers). Its recomm misses exactly our
   REGATHER bytes, except under selective recompute where it re-gathers the attention input (one
   of our two REGATHERs).
3. ``p2p_rs_ag`` is Calculon's all-reduce block with RS/AG only at pipeline edges: base blocks
   are compared as all-reduce blocks.
4. Calculon has no biases: the model is derived with ``add_bias_linear=False``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import cast

import pytest

from blueprinting.mapping.model import Datatype, TransformerModelSpec
from blueprinting.mapping.transformer import (
    AllReduce,
    BatchSpec,
    DataParallel,
    FullRecompute,
    NoRecompute,
    OneForwardOneBackward,
    PipelineParallel,
    RecomputeModule,
    RecomputePolicy,
    ReduceScatterAllGather,
    SelectiveRecompute,
    SingleStage,
    TensorParallel,
    TransformerTrainingMappingSpec,
    TransformerTrainingParallelism,
    UnfusedAttention,
    UserbufferOverlap,
)
from blueprinting.synthesizer.dialects.transformer.training import CollectivePurpose
from blueprinting.synthesizer.dialects.transformer.training_derivation import (
    derive_training_block,
)
from blueprinting.synthesizer.stages.distributed.ir import Phase
from blueprinting.validation.calculon import default_oracle_path

Json = dict[str, object]

MATRIX_SUFFIXES = (
    "_Query",
    "_Key",
    "_Value",
    "_QKV_AG",
    "_Query_AG",
    "_Multihead_Key_Query",
    "_Multihead_Attn",
    "_MLP",
    "_MLP_RS",
    "_Mlp1",
    "_Mlp1_AG",
    "_Mlp2",
    "_Mlp2_RS",
)
KV_SUFFIXES = ("_Key", "_Value")


def _oracle_paths() -> tuple[Path, Path] | None:
    """The oracle (``default_oracle_path``) and its per-layer companion beside it."""
    main = default_oracle_path()
    return None if main is None else (main, main.with_name("calculon_oracle_layers.json.gz"))


@pytest.fixture(scope="module")
def oracle() -> tuple[list[Json], dict[str, list[Json]]]:
    paths = _oracle_paths()
    if paths is None:
        pytest.skip(
            "Calculon oracle not found (set BLUEPRINTING_CALCULON_ORACLE or provide shared/)"
        )
    main, layers = paths
    if not main.is_file():
        pytest.skip(f"Calculon oracle {main} (BLUEPRINTING_CALCULON_ORACLE) does not exist")
    if not layers.is_file():
        pytest.skip(f"per-layer Calculon oracle missing next to {main}")
    records = cast(list[Json], json.loads(main.read_text()))
    with gzip.open(layers, "rt") as f:
        per_layer = cast(dict[str, list[Json]], json.load(f))
    return records, per_layer


def _num(d: object, key: str) -> int:
    assert isinstance(d, dict)
    value = d[key]
    assert isinstance(value, int | float)
    assert float(value).is_integer(), (key, value)
    return int(value)


def _specs(record: Json) -> tuple[TransformerModelSpec, TransformerTrainingMappingSpec]:
    inputs = cast(dict[str, dict[str, object]], record["inputs"])
    app, exe = inputs["app"], inputs["exe"]
    heads = _num(app, "attn_heads")
    model = TransformerModelSpec(
        name=str(inputs["model_name"]),
        num_layers=_num(app, "num_blocks"),
        hidden_size=_num(app, "hidden"),
        num_attention_heads=heads,
        num_query_groups=heads,  # multiquery: see difference 1
        kv_channels=_num(app, "attn_size"),
        ffn_hidden_size=_num(app, "feedforward"),
        seq_length=_num(app, "seq_size"),
        vocab_size=51200,
        padded_vocab_size=51200 * _num(exe, "tensor_par"),
        add_bias_linear=False,
        datatype=Datatype(str(exe["datatype"])),
    )
    recompute: RecomputePolicy
    match exe["activation_recompute"]:
        case "none":
            recompute = NoRecompute()
        case "attn_only":
            recompute = SelectiveRecompute()
        case "full":
            recompute = FullRecompute()
        case other:
            raise AssertionError(f"unknown recompute {other!r}")
    tp, pp = _num(exe, "tensor_par"), _num(exe, "pipeline_par")
    sp = exe["tensor_par_comm_type"] == "rs_ag"
    mapping = TransformerTrainingMappingSpec(
        parallelism=TransformerTrainingParallelism(
            tensor=TensorParallel(
                degree=tp, communication=ReduceScatterAllGather() if sp else AllReduce()
            ),
            pipeline=PipelineParallel(
                degree=pp, schedule=OneForwardOneBackward() if pp > 1 else SingleStage()
            ),
            data=DataParallel(degree=_num(exe, "data_par")),
            recompute=recompute,
        ),
        batch=BatchSpec(
            global_batch_size=_num(exe, "batch_size"),
            micro_batch_size=_num(exe, "microbatch_size"),
        ),
        attention=UnfusedAttention(),  # Calculon's attention stores the s x s scores
    )
    return model, mapping


def _layer_sum(layers: list[Json], key: str, suffixes: tuple[str, ...] | None) -> int:
    total = 0.0
    for layer in layers:
        name = str(layer["name"])
        if suffixes is None or name.endswith(suffixes):
            value = layer[key]
            assert isinstance(value, int | float)
            total += value
    assert total.is_integer()
    return int(total)


def _check_record(record: Json, layers: list[Json]) -> list[str]:
    problems: list[str] = []
    inputs = cast(dict[str, dict[str, object]], record["inputs"])
    exe, app = inputs["exe"], inputs["app"]
    outputs = cast(dict[str, dict[str, object]], record["outputs"])
    stats = outputs["stats"]
    model, mapping = _specs(record)
    ir = derive_training_block(model, mapping)
    block = ir.block
    tp, b = mapping.tensor_degree, mapping.batch.micro_batch_size
    multiquery = exe["attention_type"] == "multiquery"
    training = bool(exe["training"])
    rid = record["id"]

    def expect(what: str, ours: int, theirs: int) -> None:
        if ours != theirs:
            problems.append(f"record {rid} {what}: ours {ours} != Calculon {theirs}")

    phases = (
        ("fw", Phase.FORWARD),
        ("agrad", Phase.BACKWARD_ACTIVATION_GRAD),
        ("wgrad", Phase.BACKWARD_WEIGHT_GRAD),
    )
    for key, phase in phases:
        if not training and key != "fw":
            continue
        ours = block.matrix_flops(phase)
        theirs = _layer_sum(layers, f"{key}_flops", MATRIX_SUFFIXES)
        if multiquery:
            # difference 1: our K/V columns are 2*groups/t*kv wide; Calculon's one head is
            # replicated: 2 * (2 b s h kv) per pass
            h, kv, s = _num(app, "hidden"), _num(app, "attn_size"), _num(app, "seq_size")
            ours_kv = 2 * (2 * b * s * h * (model.num_query_groups // tp) * kv)
            replicated_kv = 2 * (2 * b * s * h * kv)
            expect(
                f"{key} K/V layers (replicated multiquery)",
                replicated_kv,
                _layer_sum(layers, f"{key}_flops", KV_SUFFIXES),
            )
            ours = ours - ours_kv + replicated_kv
        expect(f"{key} matrix flops", ours, theirs)
        # Calculon's block total = its matrix layers + its element-wise layers (incl. reductions)
        elementwise = _layer_sum(layers, f"{key}_flops", None) - theirs
        expect(
            f"block_{key}_flops - matrix", _num(stats, f"block_{key}_flops") - theirs, elementwise
        )

    fw_tp = block.collective_bytes(Phase.FORWARD)
    expect("baseblock_fw_tp_size", fw_tp, _num(stats, "baseblock_fw_tp_size"))
    if not training:
        return problems
    bw_tp = block.collective_bytes(Phase.BACKWARD_ACTIVATION_GRAD)
    expect("baseblock_bw_tp_size", bw_tp, _num(stats, "baseblock_bw_tp_size"))
    regather = block.collective_bytes(purpose=CollectivePurpose.REGATHER)
    recomm = block.collective_bytes(Phase.RECOMPUTE) + regather
    if mapping.sequence_parallel and not exe["seq_par_ag_redo"]:
        # difference 2
        kept = regather // 2 if isinstance(mapping.parallelism.recompute, SelectiveRecompute) else 0
        recomm = recomm - regather + kept
    expect("baseblock_recomm_size", recomm, _num(stats, "baseblock_recomm_size"))
    return problems


def test_block_matrix_work_and_tp_bytes_match_calculon(
    oracle: tuple[list[Json], dict[str, list[Json]]],
) -> None:
    records, per_layer = oracle
    ok = [r for r in records if r["ok"]]
    assert len(ok) >= 200, "oracle unexpectedly small"
    problems: list[str] = []
    for record in ok:
        problems.extend(_check_record(record, per_layer[str(record["id"])]))
    assert problems == [], f"{len(problems)} mismatch(es):\n" + "\n".join(problems[:50])


# --------------------------------------------------------------------------------------------
# Iteration-level gate (issue #5, item 3)
# --------------------------------------------------------------------------------------------
# Each ``ok`` training record is translated (validation/calculon.py ``translate``), costed on
# the system built from the record's own ``sys`` (hardware/calculon.py ``system_from_calculon``,
# which reproduces Calculon's op and collective times) and compared with Calculon's stats.
#
# Records left out, with the reason:
# - offload (weight / activation / optimizer): Blueprinting models no offload tier traffic;
# - ``tensor_par_overlap`` ring / pipe over all-reduce TP (``ar``, ``p2p_rs_ag``): Megatron-LM's
#   ``--tp-comm-overlap`` needs sequence parallelism (``tp_overlap_exclusion``); with ``rs_ag``
#   the record is translated to ``CALCULON_TP_OVERLAP`` (validation/calculon.py) and compared;
# - ``tensor_par_comm_type = p2p_rs_ag``: the PP send split over TP is not modelled;
# - inference records: no training strategy;
# - records Blueprinting's laws refuse and Calculon accepts (checked below, by law):
#   ``blocks_per_pipeline_stage`` / ``blocks_per_virtual_chunk`` (Calculon rounds blocks per
#   stage up; Megatron-LM without --decoder-first/last-pipeline-num-layers needs L % (p v) = 0) and
#   ``hidden_per_head`` (Calculon takes ``attn_size`` freely; h / heads is not integral there);
#   ``microbatch_group_remainder`` / ``microbatch_group_bounds`` (Megatron-LM's interleaved
#   schedule needs m mod N = 0 or >= p for its microbatch groups, megatron_rules.md; Calculon takes
#   any m); ``sequence_parallel_needs_tensor`` (Megatron-LM refuses sequence parallelism at t = 1;
#   Calculon runs rs_ag at t = 1 as a no-op); ``tp_divides_query_groups`` (multiquery at t > 1:
#   Calculon replicates the K/V head on every rank, Megatron-LM needs t | query groups; see
#   difference 1 at the top of this file); ``interleaving_pipeline_degree`` (Megatron-LM's
#   interleaved schedule needs p > 2, or p = 2 with --overlap-p2p-communication, which Calculon,
#   never overlapping PP sends, does not have).
#
# Iteration time: the two models differ in two documented, exactly computable terms, removed
# from ours before comparing ("Calculon-equivalent" time):
# 1. Megatron-LM's async backward TP communication (portable_plan/passes.py
#    ``_async_backward_overlap``) hides link time Calculon counts as exposed: added back,
#    m x blocks x hidden backward TP time. Not for a tiled-overlap record: there Calculon hides
#    every TP collective itself (forward, backward and recomm tiles), so nothing is added back;
# 2. Calculon has no embedding / LM head / loss: the critical stage's extras are taken off,
#    m x (embedding + LM head) time.
# What remains differs by the optimizer model (ours: Adam on the owned parameters incl. the
# embedding; Calculon: 11 FLOP/param per block), the DP overlap model, and the bubble (Calculon's
# pessimistic interleaving term, schedules.md): median |error| must be <= 5% and every record
# within 15%.
CALCULON_TIME_MEDIAN_LIMIT = 0.05
CALCULON_TIME_MAX_LIMIT = 0.15
_EXCLUDED_KNOBS = ("offload", "tensor_par_overlap", "p2p_rs_ag")
_ACCEPTED_BY_CALCULON_ONLY = frozenset(
    {
        "blocks_per_pipeline_stage",
        "blocks_per_virtual_chunk",
        "hidden_per_head",
        "interleaving_pipeline_degree",
        "microbatch_group_bounds",
        "microbatch_group_remainder",
        "sequence_parallel_needs_tensor",
        "tp_divides_query_groups",
    }
)


@pytest.fixture(scope="module")
def iteration_comparison(
    oracle: tuple[list[Json], dict[str, list[Json]]],
) -> dict[str, object]:
    from blueprinting.analysis.evaluate import PlanOptions
    from blueprinting.analysis.iteration import BubbleSource
    from blueprinting.api import plan_spec

    CONTRACT_BUBBLE = PlanOptions(bubble_source=BubbleSource.CONTRACT)  # noqa: N806
    from blueprinting.errors import InvalidStrategyError, UnsupportedError
    from blueprinting.hardware.calculon import system_from_calculon
    from blueprinting.mapping.laws import check_training
    from blueprinting.validation.calculon import CalculonRecord, load_oracle, translate

    paths = _oracle_paths()
    assert paths is not None
    typed: dict[int, CalculonRecord] = {record.id: record for record in load_oracle(paths[0])}
    records, _ = oracle
    compared: list[tuple[int, float, str]] = []
    tiled: dict[int, tuple[float, float]] = {}
    excluded: dict[str, int] = {}
    refused_by_laws: dict[int, frozenset[str]] = {}
    mismatches: list[str] = []
    memory_mismatches: list[str] = []
    for raw in records:
        if not raw["ok"]:
            continue
        record = typed[cast(int, raw["id"])]
        try:
            translation = translate(record)
        except UnsupportedError:
            excluded["inference"] = excluded.get("inference", 0) + 1
            continue
        knobs = [k for k in translation.untranslated if any(x in k for x in _EXCLUDED_KNOBS)]
        if knobs:
            key = next(x for x in _EXCLUDED_KNOBS if any(x in k for k in knobs))
            excluded[key] = excluded.get(key, 0) + 1
            continue
        spec = translation.spec
        violations = check_training(spec.model, spec.mapping)
        if violations:
            refused_by_laws[record.id] = frozenset(v.law for v in violations)
            continue
        inputs = cast(Json, raw["inputs"])
        exe = cast(Json, inputs["exe"])
        system = system_from_calculon(
            cast(Json, inputs["sys"]),
            tensor_par_net=_num(exe, "tensor_par_net"),
            pipeline_par_net=_num(exe, "pipeline_par_net"),
            data_par_net=_num(exe, "data_par_net"),
        )
        try:
            # Calculon's bubble is the seed's contract (tests/analysis/test_pipeline_contract.py);
            # compare like with like.
            report = plan_spec(spec, system, CONTRACT_BUBBLE)
        except InvalidStrategyError as error:
            refused_by_laws[record.id] = frozenset(v.law for v in error.violations)
            continue
        outputs = cast(Json, raw["outputs"])
        stats = cast(Json, outputs["stats"])
        internal = cast(Json, outputs["internal"])
        plan = report.plan
        m = spec.mapping.microbatch_count
        if m != _num(internal, "num_microbatches"):
            mismatches.append(f"{record.id}: microbatches {m} != {internal['num_microbatches']}")
        if plan.stages[0].blocks != _num(internal, "blocks_per_proc"):
            mismatches.append(
                f"{record.id}: blocks {plan.stages[0].blocks} != {internal['blocks_per_proc']}"
            )
        memory_mismatches.extend(
            _memory_mismatches(
                record.id,
                spec,
                stats,
                internal,
                fused_activation=exe["fused_activation"] is True,
                ag_redo=exe["seq_par_ag_redo"] is True,
            )
        )
        block = plan.block
        hidden = (block.backward_activation.comm_s - block.backward_activation.comm_exposed_s) + (
            block.backward_weight.comm_s - block.backward_weight.comm_exposed_s
        )
        critical = plan.critical_stage()
        extras = (plan.embedding.total_s if critical.has_embedding else 0.0) + (
            plan.lm_head.total_s if critical.has_lm_head else 0.0
        )
        theirs = float(cast(float, stats["total_time"]))
        if isinstance(spec.mapping.tp_comm_overlap, UserbufferOverlap):
            ours = report.iteration_time_s - m * extras
            tiled[record.id] = (ours, theirs)
        else:
            ours = report.iteration_time_s + m * critical.blocks * hidden - m * extras
        compared.append((record.id, ours / theirs - 1.0, str(raw["name"])))
    return {
        "compared": compared,
        "tiled": tiled,
        "excluded": excluded,
        "refused": refused_by_laws,
        "mismatches": mismatches,
        "memory_mismatches": memory_mismatches,
    }


def _memory_mismatches(
    record_id: int,
    spec: object,
    stats: Json,
    internal: Json,
    *,
    fused_activation: bool,
    ag_redo: bool,
) -> list[str]:
    """Per-GPU memory terms defined the same way by both models, compared exactly.

    - weights: Calculon's ``weight_space`` is ``blocks_per_proc x block parameters x B``; the
      block parameter count must equal ours (``block_parameters_per_rank``) exactly. The bytes
      differ by definition only where the datatype is fp8 (Calculon 1 B/param; Megatron-LM keeps
      bf16 weights, precision_recipe) and by our embedding / LM head (Calculon has none).
    - stored activations of one block (Korthikanti's per-layer figure, ``layer_activation_bytes``)
      equal Calculon's ``block_act_storage_space`` for no recompute and selective recompute,
      except Calculon's known bug 2 (selective without sequence parallelism): it is short of ours
      by exactly ``2 b s h`` bytes; with sequence parallelism but no ``seq_par_ag_redo`` it keeps
      the gathered QKV and MLP-up inputs (difference 2), ``2 b s h B (t-1)/t`` more.
      Not compared with ``fused_activation`` (GeLU fused into the
      MLP-up GEMM, not modelled here): Calculon then usually stores ``b s (ffn/t) B`` less, but
      not under selective recompute with sequence parallelism (record 90). Full recompute:
      Calculon stores nothing per block and checkpoints
      ``b s h B`` (``block_act_checkpoint_size``), ours ``checkpoint_bytes`` (equal without SP).
    - not compared exactly (documented in analysis/memory.py and calculon_oracle.md bug 4):
      gradients (Calculon keeps fp32 gradients for one block only), optimizer states (its
      ``optimizer_sharding`` also shards gradients; no fp16 main gradients), and the in-flight
      activation total (its factor ``min(m, p)(1 + (p-1)/(v p))`` for every schedule).
    """
    from blueprinting.analysis.memory import layer_activation_bytes
    from blueprinting.analysis.rank_parameters import block_parameters_per_rank
    from blueprinting.mapping.transformer import TrainingSpec

    assert isinstance(spec, TrainingSpec)
    model, mapping = spec.model, spec.mapping
    t = mapping.tensor_degree
    width = _num(internal, "bytes_per_element")
    bpp = _num(internal, "blocks_per_proc")
    out: list[str] = []
    params = block_parameters_per_rank(model, t)
    if bpp * params * width != _num(stats, "weight_space"):
        out.append(f"{record_id}: weights {bpp * params * width} != {stats['weight_space']}")
    recompute = mapping.parallelism.recompute
    if isinstance(recompute, FullRecompute) or fused_activation:
        return out
    sp = isinstance(mapping.parallelism.tensor.communication, ReduceScatterAllGather)
    ours = layer_activation_bytes(
        model,
        micro_batch=mapping.batch.micro_batch_size,
        tensor_degree=t,
        sequence_parallel=sp,
        attention=UnfusedAttention(),
        recomputed=frozenset()
        if isinstance(recompute, NoRecompute)
        else frozenset({RecomputeModule.CORE_ATTN}),
        activation_bytes=width,
    )
    theirs = _num(stats, "block_act_storage_space")
    b, s, h = mapping.batch.micro_batch_size, model.seq_length, model.hidden_size
    if isinstance(recompute, SelectiveRecompute) and not sp:
        theirs += 2 * b * s * h
    if sp and not ag_redo:
        # Difference 2 (top of file): the gathered QKV and MLP-up inputs are kept whole.
        theirs -= 2 * b * s * h * width * (t - 1) // t
    if ours != theirs:
        out.append(f"{record_id}: block activations {ours} != {theirs}")
    return out


def test_calculon_memory_terms_defined_alike_are_exact(
    iteration_comparison: dict[str, object],
) -> None:
    assert iteration_comparison["memory_mismatches"] == []


def test_calculon_microbatches_and_blocks_per_stage_are_exact(
    iteration_comparison: dict[str, object],
) -> None:
    assert iteration_comparison["mismatches"] == []


def test_calculon_exclusions_are_the_documented_ones(
    oracle: tuple[list[Json], dict[str, list[Json]]],
    iteration_comparison: dict[str, object],
) -> None:
    excluded = cast(dict[str, int], iteration_comparison["excluded"])
    refused = cast(dict[int, frozenset[str]], iteration_comparison["refused"])
    compared = cast(list[tuple[int, float, str]], iteration_comparison["compared"])
    assert all(laws <= _ACCEPTED_BY_CALCULON_ONLY for laws in refused.values()), refused
    # A record with several excluded knobs counts under the first of _EXCLUDED_KNOBS.
    # tensor_par_overlap: the 9 tiled-overlap records over all-reduce TP (5 ar, 4 p2p_rs_ag);
    # the 10 with rs_ag are translated: 6 compared, 4 refused by laws (159, 217, 265, 295).
    assert excluded == {"inference": 15, "offload": 21, "tensor_par_overlap": 9, "p2p_rs_ag": 24}
    assert len(refused) == 24
    assert {159, 217, 265, 295} <= refused.keys()
    assert len(compared) == 120
    ok = [raw for raw in oracle[0] if raw["ok"]]
    assert len(ok) == 213
    assert len(compared) == len(ok) - sum(excluded.values()) - len(refused)
    # Recount from the raw oracle fields, not through translate(): inference records
    # (exe.training false), then, in _EXCLUDED_KNOBS order, any offload flag, a TP overlap other
    # than "none" over all-reduce TP (ar, p2p_rs_ag), and the p2p_rs_ag TP communication.
    recount: dict[str, int] = {}
    for raw in ok:
        exe = cast(Json, cast(Json, raw["inputs"])["exe"])
        if exe["training"] is not True:
            key = "inference"
        elif any(exe[k] is True for k in exe if k.endswith("_offload")):
            key = "offload"
        elif exe["tensor_par_overlap"] != "none" and exe["tensor_par_comm_type"] != "rs_ag":
            key = "tensor_par_overlap"
        elif exe["tensor_par_comm_type"] == "p2p_rs_ag":
            key = "p2p_rs_ag"
        else:
            continue
        recount[key] = recount.get(key, 0) + 1
    assert recount == excluded


def test_calculon_iteration_time_within_tolerance(
    iteration_comparison: dict[str, object],
) -> None:
    compared = cast(list[tuple[int, float, str]], iteration_comparison["compared"])
    errors = sorted(abs(error) for _, error, _ in compared)
    median = errors[len(errors) // 2]
    worst = max(compared, key=lambda item: abs(item[1]))
    assert median <= CALCULON_TIME_MEDIAN_LIMIT, median
    assert abs(worst[1]) <= CALCULON_TIME_MAX_LIMIT, worst
    # Pinned (issue 20): 120 records with the 6 tiled-overlap ones; on the 114 of before,
    # median 4.88%, max 13.9% (record 39).
    assert len(errors) == 120
    assert median == pytest.approx(0.04916, abs=1e-4)
    assert worst[0] == 204
    assert abs(worst[1]) == pytest.approx(0.14944, abs=1e-4)
    before = sorted(abs(e) for rid, e, _ in compared if rid not in TILED_OVERLAP_ERRORS)
    assert len(before) == 114
    assert before[len(before) // 2] == pytest.approx(0.04885, abs=1e-4)
    assert before[-1] == pytest.approx(0.13885, abs=1e-4)


#: Calculon's tiled TP overlap records (``tensor_par_overlap`` ring / pipe with ``rs_ag``),
#: translated to ``CALCULON_TP_OVERLAP``: (our Calculon-equivalent iteration time, Calculon's
#: ``total_time``), seconds. The remaining differences are per record in docs/VALIDATION.md.
TILED_OVERLAP_ERRORS = {
    104: (22.2847, 21.2351),  # ring, gpt3-175B t8 p8, full recompute
    106: (22.2847, 22.7491),  # pipe, same strategy: TE's methods do not depend on ring / pipe
    137: (0.28073, 0.24428),  # pipe, megatron-5B t8 p1, selective
    204: (0.14633, 0.12730),  # ring, megatron-126M t4 p1, selective + seq_par_ag_redo
    304: (0.11119, 0.12285),  # ring, megatron-5B t8 p2, full recompute
    344: (17.0774, 17.0996),  # pipe, anthropic-52B t4 p8 v2, no recompute
}


def test_calculon_tiled_tp_overlap_records(
    iteration_comparison: dict[str, object],
) -> None:
    tiled = cast(dict[int, tuple[float, float]], iteration_comparison["tiled"])
    assert tiled.keys() == TILED_OVERLAP_ERRORS.keys()
    for record_id, (ours, theirs) in TILED_OVERLAP_ERRORS.items():
        got_ours, got_theirs = tiled[record_id]
        assert got_ours == pytest.approx(ours, rel=1e-4), record_id
        assert got_theirs == pytest.approx(theirs, rel=1e-4), record_id
        assert abs(got_ours / got_theirs - 1.0) <= CALCULON_TIME_MAX_LIMIT, record_id


def test_configurations_calculon_rejects_are_rejected_here(
    oracle: tuple[list[Json], dict[str, list[Json]]],
) -> None:
    """Every structural refusal of Calculon is a law violation here; capacity refusals are
    refused by a law or found not to fit by Blueprinting's memory model, except the documented
    system-level and offload cases below."""
    from blueprinting.analysis.memory import memory_per_stage
    from blueprinting.errors import UnsupportedError
    from blueprinting.mapping.laws import check_training
    from blueprinting.validation.calculon import CalculonRejection, load_oracle, translate

    paths = _oracle_paths()
    assert paths is not None
    records = {cast(int, raw["id"]): raw for raw in oracle[0]}
    outcome: dict[tuple[CalculonRejection, str], int] = {}
    for record in load_oracle(paths[0]):
        if record.failure is None:
            continue
        try:
            spec = translate(record).spec
        except UnsupportedError:
            continue
        reason = record.failure.rejection
        if check_training(spec.model, spec.mapping):
            verdict = "law"
        elif reason is CalculonRejection.HBM_CAPACITY:
            inputs = cast(Json, records[record.id]["inputs"])
            mem1 = cast(Json, cast(Json, inputs["sys"])["mem1"])
            capacity = int(cast(float, mem1["GiB"]))
            stages = memory_per_stage(spec.model, spec.mapping, capacity_bytes=capacity)
            verdict = "fits" if all(stage.fits for stage in stages) else "too big"
        else:
            verdict = "accepted"
        outcome[(reason, verdict)] = outcome.get((reason, verdict), 0) + 1
    assert outcome == {
        (CalculonRejection.HBM_CAPACITY, "law"): 40,
        (CalculonRejection.HBM_CAPACITY, "too big"): 46,
        (CalculonRejection.TP_UNEVEN_SPLIT, "law"): 13,
        (CalculonRejection.INTERLEAVING_NOT_A_FACTOR, "law"): 31,
        (CalculonRejection.INTERLEAVING_EXCEEDS_BLOCKS, "law"): 15,
        # Offload: Blueprinting has no offload tier; these are its capacity / block-count rules.
        (CalculonRejection.OFFLOAD_CAPACITY, "law"): 1,
        (CalculonRejection.OFFLOAD_CAPACITY, "accepted"): 3,
        (CalculonRejection.OFFLOAD_NEEDS_BLOCKS, "law"): 7,
        (CalculonRejection.OFFLOAD_NEEDS_BLOCKS, "accepted"): 1,
        # System-level: the record's sys lacks bfloat16 (system_from_calculon refuses such a
        # system when asked for that datatype), and t = 16 over 8-GPU NVLink domains, which
        # Blueprinting places across nodes (legal in Megatron-LM, slow) instead of refusing.
        (CalculonRejection.UNSUPPORTED_DATATYPE, "accepted"): 1,
        (CalculonRejection.NETWORK_TOO_SMALL, "accepted"): 1,
    }
