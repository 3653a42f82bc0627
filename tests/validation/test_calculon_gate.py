"""The Calculon gate's buckets, reasons and rules (validation/calculon_gate.py), on records built
from the committed subset (fixtures/calculon_subset), so that they run without shared/."""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from blueprinting.errors import ProblemCollector
from blueprinting.validation.calculon import CalculonRecord, load_oracle, parse_record
from blueprinting.validation.calculon_gate import (
    ACCEPTED_BY_CALCULON_ONLY,
    CALCULON_MIN_COMPARED_FRACTION,
    CALCULON_TIME_MAX_LIMIT,
    CALCULON_TIME_MEDIAN_LIMIT,
    LAYERS_FILE,
    SYNTHETIC_SUBSET_IDS,
    CalculonExclusion,
    CalculonGate,
    Compared,
    Excluded,
    Refused,
    RejectionVerdict,
    exclusion,
    gate_outcome,
    hbm_capacity_bytes,
    rejection_problems,
    rejection_verdict,
    render_bucket_table,
    run_gate,
    write_oracle_subset,
)

SUBSET_DIR = Path(__file__).parent / "fixtures" / "calculon_subset"
SUBSET = SUBSET_DIR / "calculon_oracle.json"


@pytest.fixture(scope="module")
def base_raw() -> dict[str, object]:
    """Record 1 of the subset (fig1/gpt3-175B_seqsel: t8 p8 v3, selective, rs_ag, 64 microbatches;
    compared by the gate), as raw JSON."""
    records = json.loads(SUBSET.read_text(encoding="utf-8"))
    raw = next(r for r in records if r["id"] == 1)
    assert isinstance(raw, dict)
    return raw


def _variant(
    base: dict[str, object],
    *,
    app: dict[str, object] | None = None,
    ok: bool = True,
    error: str = "Mem tier1 needs 90 GiB but only has 80.000 GiB",
    mem1_gib: float | None = None,
    fields: dict[str, object] | None = None,
    **exe: object,
) -> CalculonRecord:
    """Record ``base`` with its ``exe`` fields ``exe`` and ``fields`` replaced."""
    exe = {**(fields or {}), **exe}
    raw = copy.deepcopy(base)
    inputs = raw["inputs"]
    assert isinstance(inputs, dict)
    if mem1_gib is not None:
        inputs["sys"]["mem1"]["GiB"] = mem1_gib
    inputs["exe"].update(exe)
    inputs["app"].update(app or {})
    if not ok:
        raw["ok"] = False
        del raw["outputs"]
        raw["error"] = {"stage": "compile", "error_type": "Llm.Error", "error": error}
    problems = ProblemCollector(source="inline")
    record = parse_record(raw, problems)
    problems.raise_if_any()
    return record


EXCLUSION_CASES: list[tuple[dict[str, object], CalculonExclusion | None]] = [
    ({}, None),
    ({"ok": False}, CalculonExclusion.CALCULON_REFUSED),
    ({"training": False}, CalculonExclusion.INFERENCE),
    ({"weight_offload": True}, CalculonExclusion.OFFLOAD),
    ({"activations_offload": True}, CalculonExclusion.OFFLOAD),
    ({"optimizer_offload": True, "training": False}, CalculonExclusion.INFERENCE),
    ({"optimizer_offload": True}, CalculonExclusion.OFFLOAD),
    ({"tensor_par_comm_type": "ar", "tensor_par_overlap": "ring"},
     CalculonExclusion.TP_OVERLAP_OVER_ALL_REDUCE),
    # the first reason in CalculonExclusion order wins
    ({"tensor_par_comm_type": "p2p_rs_ag", "tensor_par_overlap": "pipe"},
     CalculonExclusion.TP_OVERLAP_OVER_ALL_REDUCE),
    ({"tensor_par_comm_type": "p2p_rs_ag"}, CalculonExclusion.P2P_RS_AG),
    ({"tensor_par_comm_type": "rs_ag", "tensor_par_overlap": "ring"}, None),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "reason"), EXCLUSION_CASES)
def test_each_exclusion_reason(
    base_raw: dict[str, object], overrides: dict[str, object], reason: CalculonExclusion | None
) -> None:
    exe = dict(overrides)
    ok = bool(exe.pop("ok", True))
    record = _variant(base_raw, ok=ok, fields=exe)
    assert exclusion(record) is reason
    if reason is not None:
        assert gate_outcome(record) == Excluded(record_id=1, reason=reason)


def test_every_exclusion_reason_is_tested_and_explained() -> None:
    assert {reason for _, reason in EXCLUSION_CASES} - {None} == set(CalculonExclusion)
    assert all(reason.why for reason in CalculonExclusion)


#: One strategy per Calculon-only law that breaks it (record 1 is gpt3-175B: 96 blocks, 96 heads
#: of 128, t8 p8 v3, B = 64, b = 1).
LAW_CASES: list[tuple[str, dict[str, object], dict[str, object]]] = [
    ("blocks_per_pipeline_stage",
     {}, {"pipeline_par": 5, "pipeline_interleaving": 1, "num_procs": 40}),
    ("blocks_per_virtual_chunk", {}, {"pipeline_interleaving": 5}),
    # kv_channels = h // heads but h mod heads != 0; tensor_par 1 keeps the shape legal there
    ("hidden_per_head", {"hidden": 12300, "attn_size": 128},
     {"tensor_par": 1, "tensor_par_comm_type": "ar", "num_procs": 8}),
    ("interleaving_pipeline_degree",
     {}, {"pipeline_par": 2, "pipeline_interleaving": 2, "num_procs": 16}),
    ("microbatch_group_bounds", {}, {"batch_size": 4}),
    ("microbatch_group_remainder", {}, {"batch_size": 12}),
    ("sequence_parallel_needs_tensor", {}, {"tensor_par": 1, "num_procs": 8}),
    # multiquery at t > 1: training splits the K/V heads over t (Megatron-Core's divide)
    ("query_groups_vs_tensor", {}, {"attention_type": "multiquery"}),
]  # fmt: skip


@pytest.mark.parametrize(("law", "app", "exe"), LAW_CASES)
def test_each_calculon_only_law_is_one_the_planner_reports(
    base_raw: dict[str, object], law: str, app: dict[str, object], exe: dict[str, object]
) -> None:
    outcome = gate_outcome(_variant(base_raw, app=app, fields=exe))
    assert isinstance(outcome, Refused)
    assert law in outcome.laws
    assert outcome.laws <= ACCEPTED_BY_CALCULON_ONLY


def test_every_calculon_only_law_is_tested() -> None:
    assert {law for law, _, _ in LAW_CASES} == ACCEPTED_BY_CALCULON_ONLY


def test_base_record_is_compared(base_raw: dict[str, object]) -> None:
    outcome = gate_outcome(_variant(base_raw))
    assert isinstance(outcome, Compared)
    assert outcome.spec.mapping.microbatch_count == 64
    assert outcome.theirs_s == base_raw["outputs"]["stats"]["total_time"]  # type: ignore[index]
    assert not outcome.tiled_overlap


@pytest.fixture(scope="module")
def subset_gate() -> CalculonGate:
    return run_gate(load_oracle(SUBSET))


def test_subset_gate_passes_and_every_bucket_is_filled(subset_gate: CalculonGate) -> None:
    assert subset_gate.failures() == []
    assert subset_gate.records == len(SYNTHETIC_SUBSET_IDS) == subset_gate.bucket_total
    assert set(subset_gate.excluded) == set(CalculonExclusion)
    assert set().union(*subset_gate.refused) == ACCEPTED_BY_CALCULON_ONLY - {
        "blocks_per_virtual_chunk"
    }
    assert any(c.tiled_overlap for c in subset_gate.compared)


def test_gate_failures_name_each_broken_rule(subset_gate: CalculonGate) -> None:
    gate = subset_gate
    assert "buckets sum to" in dataclasses.replace(gate, records=gate.records + 1).failures()[0]
    stray = Refused(record_id=-1, laws=frozenset({"world_size"}))
    failures = dataclasses.replace(gate, records=gate.records + 1, outcomes=(*gate.outcomes, stray))
    assert failures.failures() == [
        "record -1 refused by ['world_size'], laws Calculon is not known to lack"
    ]

    def scaled(factor: float, count: int) -> CalculonGate:
        compared = sorted(gate.compared, key=lambda c: abs(c.error))
        moved = {
            c.record_id: dataclasses.replace(c, ours_s=c.theirs_s * factor)
            for c in compared[:count]
        }
        return dataclasses.replace(
            gate, outcomes=tuple(moved.get(o.record_id, o) for o in gate.outcomes)
        )

    worst = scaled(1 + CALCULON_TIME_MAX_LIMIT + 0.01, 1)
    assert [f for f in worst.failures() if "beyond" in f], worst.failures()
    median = scaled(1 + CALCULON_TIME_MEDIAN_LIMIT + 0.01, len(gate.compared))
    assert any(f.startswith("median |error|") for f in median.failures())
    # Refuse enough of the compared records to fall under the minimum fraction.
    keep = int(CALCULON_MIN_COMPARED_FRACTION * len(gate.compared)) - 1
    refused = [
        Refused(record_id=c.record_id, laws=frozenset({"blocks_per_pipeline_stage"}))
        for c in gate.compared[keep:]
    ]
    few = dataclasses.replace(gate, outcomes=(*gate.compared[:keep], *refused))
    few = dataclasses.replace(few, records=few.bucket_total)
    assert [f for f in few.failures() if f.startswith(f"compared {keep} of")], few.failures()


def test_bucket_table_lists_every_bucket(subset_gate: CalculonGate) -> None:
    table = render_bucket_table(subset_gate)
    assert f"| compared | median abs error {subset_gate.median_abs_error:.2%}" in table
    for reason in CalculonExclusion:
        assert f"| excluded | `{reason}`: {reason.why} | {subset_gate.excluded[reason]} |" in table
    assert "| refused | `query_groups_vs_tensor` |" in table
    n = len(SYNTHETIC_SUBSET_IDS)
    assert table.endswith(f"| total | | {n} of {n} records |")


def test_hbm_capacity_is_in_bytes(base_raw: dict[str, object]) -> None:
    # Calculon's Memory: capacity = GiB * 1024**3 (calculon/memory.py, caa4b11); its 80 GiB HBM
    # (systems/a100_80g.json) and the oracle's unlimited variant (GiB = 8e10).
    assert hbm_capacity_bytes(_variant(base_raw, mem1_gib=80)) == 80 * 2**30
    assert hbm_capacity_bytes(_variant(base_raw, mem1_gib=80e9)) == 80_000_000_000 * 2**30
    record = _variant(base_raw)
    assert record.system["mem1"] == base_raw["inputs"]["sys"]["mem1"]  # type: ignore[index]


def test_rejection_verdicts_and_their_problems(base_raw: dict[str, object]) -> None:
    # Calculon's HBM refusal of a strategy our laws accept and our memory model fits: flagged.
    fits = _variant(base_raw, ok=False, mem1_gib=80)
    assert rejection_verdict(fits) == (RejectionVerdict.FITS, frozenset())
    assert rejection_problems([fits]) == ["record 1: Calculon HBM_CAPACITY, here fits []"]
    # The same strategy on a 1 GiB HBM does not fit in our memory model either: no problem.
    small = _variant(base_raw, ok=False, mem1_gib=1)
    assert rejection_verdict(small) == (RejectionVerdict.TOO_BIG, frozenset())
    assert rejection_problems([small]) == []
    # Between our device peak and that peak with the step's fp32 gradient copy held through
    # the backward (Calculon's optimizer states hold it): the verdict says so, no problem.
    from blueprinting.analysis.memory import memory_per_stage
    from blueprinting.validation.calculon import translate

    spec = translate(fits).spec
    stages = memory_per_stage(spec.model, spec.mapping, capacity_bytes=2**50)
    peak = max(stage.reserved_peak for stage in stages)
    with_copy = max(stage.reserved_peak + stage.optimizer_step_copy for stage in stages)
    assert with_copy > peak  # an fp16 record: fp16 gradients, fp32 copy at the step
    between = _variant(base_raw, ok=False, mem1_gib=(peak + with_copy) / 2 / 2**30)
    assert rejection_verdict(between) == (RejectionVerdict.TOO_BIG_WITH_STEP_COPY, frozenset())
    assert rejection_problems([between]) == []
    # A TP split refusal must be matched by a TP divisibility law; a pipeline law is not one.
    uneven = _variant(
        base_raw,
        ok=False,
        error="We should split hidden=5140 between 8 TP partitions evenly",
        pipeline_par=5,
        pipeline_interleaving=1,
        num_procs=40,
    )
    assert rejection_verdict(uneven) == (
        RejectionVerdict.LAW,
        frozenset({"blocks_per_pipeline_stage"}),
    )
    assert rejection_problems([uneven]) == [
        "record 1: Calculon TP_UNEVEN_SPLIT but none of ['attention_heads_per_tensor_rank', "
        "'ffn_per_tensor_rank', 'hidden_per_head', 'query_groups_vs_tensor', "
        "'vocab_per_tensor_rank'] refuses it here (['blocks_per_pipeline_stage'])"
    ]
    unknown = _variant(base_raw, ok=False, error="something new")
    assert rejection_problems([unknown]) == ["record 1: Calculon OTHER, here accepted []"]
    assert rejection_verdict(_variant(base_raw, ok=False, training=False)) is None
    assert rejection_verdict(_variant(base_raw)) is None


def _subset_files(directory: Path) -> tuple[object, object]:
    with gzip.open(directory / LAYERS_FILE, "rt", encoding="utf-8") as f:
        layers = json.load(f)
    return json.loads((directory / "calculon_oracle.json").read_text(encoding="utf-8")), layers


def test_committed_subset_is_the_shared_records(tmp_path: Path) -> None:
    """The fixture is the shared oracle's records, unchanged (SOURCE.md beside it)."""
    from blueprinting.validation.calculon import default_oracle_path

    source = default_oracle_path()
    if source is None or not source.with_name(LAYERS_FILE).is_file():
        pytest.skip("shared/reference/calculon_oracle.json absent: the fixture is used as is")
    try:
        write_oracle_subset(source, SYNTHETIC_SUBSET_IDS, tmp_path)
    except KeyError as error:  # BLUEPRINTING_CALCULON_ORACLE names another oracle file
        pytest.skip(f"the oracle at {source} is not the one the subset was taken from: {error}")
    assert _subset_files(tmp_path) == _subset_files(SUBSET_DIR)
    assert (tmp_path / "calculon_oracle.json").read_bytes() == SUBSET.read_bytes()


def test_subset_of_missing_records_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match=r"records \[-5\]"):
        write_oracle_subset(SUBSET, (1, -5), tmp_path / "out")


#: Calculon caa4b11 run on the variant of subset record 129 below (calculon/llm/llm.py, no
#: data_par_overlap, no optimizer_sharding): its ``block_dp_size`` (= ``block_weight_space``, one
#: byte per fp8 parameter, no embedding) and ``dp_comm_link_time`` (= exposed time), seconds.
CALCULON_FP8_T1P4D4_BLOCK_DP_SIZE = 201_342_976
CALCULON_FP8_T1P4D4_DP_S = 0.02696573


def test_fp8_dp_term_is_megatrons_fp32_gradient_all_reduce(base_raw: dict[str, object]) -> None:
    """Issue 15's DP difference (megatron-5B fp8 on H100, t1 p4 d4, 2 microbatches, DP not
    overlapped): both models expose the whole all-reduce; Megatron-LM sends fp32 gradients
    (``accumulate_allreduce_grads_in_fp32`` is forced under --bf16, the mode TE's fp8 runs in)
    of the blocks, the tied embedding and the final norm, Calculon one byte per block parameter.
    The bytes differ by 4 x 1.1736; on the same collective model the times by 4.674. (The
    variant keeps record 129's Calculon outputs, which this test does not read.)"""
    records = {r.id: r for r in load_oracle(SUBSET)}
    assert records[129].exe.datatype == "float8"
    raw = json.loads(SUBSET.read_text(encoding="utf-8"))
    r129 = next(r for r in raw if r["id"] == 129)
    record = _variant(
        r129,
        tensor_par=1,
        pipeline_par=4,
        data_par=4,
        num_procs=16,
        batch_size=64,
        microbatch_size=8,
        pipeline_par_net=0,
        data_par_net=1,
    )
    outcome = gate_outcome(record)
    assert isinstance(outcome, Compared)
    model = outcome.spec.model
    assert outcome.spec.mapping.microbatch_count == 2
    assert not record.exe.data_par_overlap and not record.exe.optimizer_sharding
    dp = outcome.report.data_parallel
    blocks = model.num_layers // 4
    # The critical stage is the last: its blocks, the tied LM head (= embedding) and final norm.
    params = blocks * CALCULON_FP8_T1P4D4_BLOCK_DP_SIZE + 51200 * 4096 + 2 * 4096
    assert dp.grad_bytes == 4 * params == 5_671_124_992
    assert dp.exposed_s == dp.link_s == dp.grad_sync_s == pytest.approx(0.126045, rel=1e-5)
    assert dp.grad_sync_s / CALCULON_FP8_T1P4D4_DP_S == pytest.approx(4.674, abs=1e-3)
    assert dp.grad_bytes / (blocks * CALCULON_FP8_T1P4D4_BLOCK_DP_SIZE) == pytest.approx(
        4.6944, abs=1e-4
    )
