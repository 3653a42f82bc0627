"""The Calculon iteration-time gate, for any oracle file in the format of
``shared/reference/calculon_oracle.json`` (issue 15, item 1).

Every record lands in exactly one bucket (:data:`CalculonOutcome`):

- :class:`Compared`: planned on the system built from the record's own ``sys``
  (:func:`blueprinting.hardware.calculon.system_from_calculon`) and compared with Calculon's
  ``total_time`` after the two exactly computable modelling differences are removed
  (:func:`calculon_equivalent_time`);
- :class:`Excluded`, by a named :class:`CalculonExclusion`: records with no Blueprinting
  counterpart (Calculon refused them, inference, offload, TP overlap over all-reduce TP, the
  ``p2p_rs_ag`` PP send split);
- :class:`Refused`: the planner's laws refuse the translated strategy; each law name is one the
  planner reports (``LawViolation.law``; :mod:`blueprinting.mapping.law_names` where the law has a
  member there) and must be one of :data:`ACCEPTED_BY_CALCULON_ONLY`, Megatron-LM rules Calculon
  does not have.

The counts follow from the records; the only constants are the thresholds
(:data:`CALCULON_TIME_MEDIAN_LIMIT`, :data:`CALCULON_TIME_MAX_LIMIT`,
:data:`CALCULON_MIN_COMPARED_FRACTION`). Calculon's own refusals are checked separately against
the laws (:func:`rejection_verdict`, :data:`REJECTION_VERDICTS`).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, assert_never, final

from blueprinting.errors import ConfigError
from blueprinting.mapping.law_names import Law
from blueprinting.mapping.transformer import TrainingSpec, UserbufferOverlap
from blueprinting.validation.calculon import (
    CalculonRecord,
    CalculonRejection,
    CalculonTensorComm,
    tp_overlap_exclusion,
    translate,
)

if TYPE_CHECKING:
    from blueprinting.analysis.memory import MemoryBreakdown
    from blueprinting.analysis.report import IterationReport

#: Median |error| of the Calculon-equivalent iteration time over the compared records.
CALCULON_TIME_MEDIAN_LIMIT = 0.05
#: Largest |error| of any compared record.
CALCULON_TIME_MAX_LIMIT = 0.15
#: At least this fraction of the candidates (records neither excluded nor Calculon-refused, i.e.
#: compared + refused by laws) must be compared, so that a law or translation regression cannot
#: pass the gate by refusing what it should compare. On the shared oracle 0.83 (its random group
#: alone 0.54, the group a held-out oracle is drawn from).
CALCULON_MIN_COMPARED_FRACTION = 0.4


class CalculonExclusion(StrEnum):
    """Why a record is not compared (each has a record-level test on a synthetic record)."""

    CALCULON_REFUSED = "calculon_refused"
    INFERENCE = "inference"
    OFFLOAD = "offload"
    TP_OVERLAP_OVER_ALL_REDUCE = "tensor_par_overlap"
    P2P_RS_AG = "p2p_rs_ag"

    @property
    def why(self) -> str:
        match self:
            case CalculonExclusion.CALCULON_REFUSED:
                return "Calculon refused it (no figures; checked against the laws separately)"
            case CalculonExclusion.INFERENCE:
                return "inference record (training = false): no training strategy"
            case CalculonExclusion.OFFLOAD:
                return "weight / activation / optimizer offload: Blueprinting has no offload tier"
            case CalculonExclusion.TP_OVERLAP_OVER_ALL_REDUCE:
                return (
                    "tiled TP overlap over all-reduce TP (ar, p2p_rs_ag): Megatron-LM's "
                    "--tp-comm-overlap needs sequence parallelism"
                )
            case CalculonExclusion.P2P_RS_AG:
                return "tensor_par_comm_type = p2p_rs_ag: the PP send split over TP is not modelled"
            case _ as unreachable:
                assert_never(unreachable)


def exclusion(record: CalculonRecord) -> CalculonExclusion | None:
    """The first reason (in :class:`CalculonExclusion` order) the record is not compared."""
    exe = record.exe
    if not record.ok:
        return CalculonExclusion.CALCULON_REFUSED
    if not exe.training:
        return CalculonExclusion.INFERENCE
    if exe.weight_offload or exe.activations_offload or exe.optimizer_offload:
        return CalculonExclusion.OFFLOAD
    if tp_overlap_exclusion(exe) is not None:
        return CalculonExclusion.TP_OVERLAP_OVER_ALL_REDUCE
    if exe.tensor_par_comm_type is CalculonTensorComm.P2P_RS_AG:
        return CalculonExclusion.P2P_RS_AG
    return None


#: Laws the planner applies and Calculon does not; a refusal by any other law is a gate failure.
#: - ``blocks_per_pipeline_stage`` / ``blocks_per_virtual_chunk``: Calculon rounds blocks per stage
#:   up; Megatron-LM without --decoder-first/last-pipeline-num-layers needs L mod (p v) = 0;
#: - ``hidden_per_head``: Calculon takes ``attn_size`` freely, h / heads need not be integral;
#: - ``microbatch_group_bounds`` / ``microbatch_group_remainder`` (the checker's two halves of
#:   ``megatron_microbatch_group``): the interleaved schedule's microbatch groups
#:   (megatron_rules.md); Calculon takes any m;
#: - ``sequence_parallel_needs_tensor``: Megatron-LM refuses sequence parallelism at t = 1, Calculon
#:   runs rs_ag at t = 1 as a no-op;
#: - ``query_groups_vs_tensor`` (training splits the K/V heads over t, Megatron-Core's
#:   ``divide(num_query_groups, t)``): multiquery at t > 1, Calculon replicates the K/V head on
#:   every rank;
#: - ``interleaving_pipeline_degree``: p > 2, or p = 2 with --overlap-p2p-communication, which
#:   Calculon (never overlapping PP sends) does not have.
ACCEPTED_BY_CALCULON_ONLY: frozenset[str] = frozenset(
    {
        Law.BLOCKS_PER_PIPELINE_STAGE.value,
        Law.BLOCKS_PER_VIRTUAL_CHUNK.value,
        "hidden_per_head",
        Law.MEGATRON_INTERLEAVING_MIN_PIPELINE.value,
        "microbatch_group_bounds",
        "microbatch_group_remainder",
        Law.MEGATRON_SEQUENCE_PARALLEL_NEEDS_TP.value,
        Law.QUERY_GROUPS_DIVISIBILITY.value,
    }
)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Compared:
    """``ours_s``: Blueprinting's Calculon-equivalent iteration time; ``theirs_s``: Calculon's
    ``total_time``."""

    record_id: int
    name: str
    ours_s: float
    theirs_s: float
    theirs_dp_exposed_s: float
    tiled_overlap: bool
    spec: TrainingSpec
    report: IterationReport

    @property
    def error(self) -> float:
        return self.ours_s / self.theirs_s - 1.0

    @property
    def dp_note(self) -> str:
        """The two DP terms, the difference the gate does not remove (docs/VALIDATION.md, "The
        DP term": Megatron reduces fp32 gradients, Calculon the datatype's width)."""
        ours = self.report.data_parallel.exposed_s
        return f"DP exposed ours {ours:.4g} s, Calculon {self.theirs_dp_exposed_s:.4g} s"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Excluded:
    record_id: int
    reason: CalculonExclusion


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Refused:
    """The planner's law names (``LawViolation.law``) that refuse the translated strategy."""

    record_id: int
    laws: frozenset[str]


CalculonOutcome: TypeAlias = Compared | Excluded | Refused


def calculon_equivalent_time(report: IterationReport) -> float:
    """Our iteration time with the two exactly computable differences from Calculon removed.

    1. Megatron-LM's async backward TP communication (portable_plan/passes.py
       ``_async_backward_overlap``) hides link time Calculon counts as exposed: added back,
       m x blocks x hidden backward TP time. Not with tiled TP overlap: there Calculon hides every
       TP collective itself (forward, backward and recomm tiles), so nothing is added back.
    2. Calculon has no embedding / LM head / loss (calculon_oracle.md, limit 5): the critical
       stage's extras are taken off, m x (embedding + LM head) time.
    """
    plan = report.plan
    mapping = report.spec.mapping
    m = mapping.microbatch_count
    critical = plan.critical_stage()
    extras = (plan.embedding.total_s if critical.has_embedding else 0.0) + (
        plan.lm_head.total_s if critical.has_lm_head else 0.0
    )
    if isinstance(mapping.tp_comm_overlap, UserbufferOverlap):
        return report.iteration_time_s - m * extras
    block = plan.block
    hidden = (block.backward_activation.comm_s - block.backward_activation.comm_exposed_s) + (
        block.backward_weight.comm_s - block.backward_weight.comm_exposed_s
    )
    return report.iteration_time_s + m * critical.blocks * hidden - m * extras


def gate_outcome(record: CalculonRecord) -> CalculonOutcome:
    """The record's bucket; compared records are planned with the contract bubble (Calculon's
    bubble is the seed's contract, tests/analysis/test_pipeline_contract.py)."""
    from blueprinting.analysis.evaluate import PlanOptions
    from blueprinting.analysis.iteration import BubbleSource
    from blueprinting.api import plan_spec
    from blueprinting.errors import InvalidStrategyError
    from blueprinting.hardware.calculon import system_from_calculon
    from blueprinting.mapping.laws import check_training

    reason = exclusion(record)
    if reason is not None:
        return Excluded(record_id=record.id, reason=reason)
    spec = translate(record).spec
    violations = check_training(spec.model, spec.mapping)
    if violations:
        return Refused(record_id=record.id, laws=frozenset(v.law for v in violations))
    exe = record.exe
    system = system_from_calculon(
        record.system,
        tensor_par_net=exe.tensor_par_net,
        pipeline_par_net=exe.pipeline_par_net,
        data_par_net=exe.data_par_net,
    )
    try:
        report = plan_spec(spec, system, PlanOptions(bubble_source=BubbleSource.CONTRACT))
    except InvalidStrategyError as error:  # the block derivation's own divisibility laws
        return Refused(record_id=record.id, laws=frozenset(v.law for v in error.violations))
    theirs = record.stats["total_time"]
    theirs_dp = record.stats.get("dp_comm_exposed_time")
    # ok training records always carry both (calculon_oracle.md)
    if theirs is None or theirs_dp is None:
        raise ConfigError([f"record {record.id}: total_time / dp_comm_exposed_time missing"])
    return Compared(
        record_id=record.id,
        name=record.name,
        ours_s=calculon_equivalent_time(report),
        theirs_s=theirs,
        theirs_dp_exposed_s=theirs_dp,
        tiled_overlap=isinstance(spec.mapping.tp_comm_overlap, UserbufferOverlap),
        spec=spec,
        report=report,
    )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CalculonGate:
    """Every record's bucket for one oracle file and the gate's verdict on them."""

    records: int
    outcomes: tuple[CalculonOutcome, ...]

    @property
    def compared(self) -> tuple[Compared, ...]:
        return tuple(o for o in self.outcomes if isinstance(o, Compared))

    @property
    def excluded(self) -> Mapping[CalculonExclusion, int]:
        return Counter(o.reason for o in self.outcomes if isinstance(o, Excluded))

    @property
    def refused(self) -> Mapping[frozenset[str], int]:
        return Counter(o.laws for o in self.outcomes if isinstance(o, Refused))

    @property
    def bucket_total(self) -> int:
        return len(self.compared) + sum(self.excluded.values()) + sum(self.refused.values())

    @property
    def candidates(self) -> int:
        """Records the gate translates and checks against the laws: compared + refused."""
        return len(self.compared) + sum(self.refused.values())

    @property
    def compared_fraction(self) -> float:
        return len(self.compared) / self.candidates

    @property
    def median_abs_error(self) -> float:
        """The upper median (``statistics.median_high``) of |error|: a recorded error, not an
        average of two."""
        return statistics.median_high(abs(c.error) for c in self.compared)

    @property
    def worst(self) -> Compared:
        return max(self.compared, key=lambda c: abs(c.error))

    def failures(self) -> list[str]:
        """Every violated gate rule, each naming its values (empty: the gate passes)."""
        out: list[str] = []
        if self.bucket_total != self.records:
            out.append(f"buckets sum to {self.bucket_total}, not the {self.records} records")
        out.extend(
            f"record {o.record_id} refused by {sorted(o.laws - ACCEPTED_BY_CALCULON_ONLY)}, "
            "laws Calculon is not known to lack"
            for o in self.outcomes
            if isinstance(o, Refused) and not o.laws <= ACCEPTED_BY_CALCULON_ONLY
        )
        if not self.compared:
            out.append(f"no record compared ({self.candidates} candidates)")
            return out
        if self.compared_fraction < CALCULON_MIN_COMPARED_FRACTION:
            out.append(
                f"compared {len(self.compared)} of {self.candidates} candidates "
                f"({self.compared_fraction:.1%} < {CALCULON_MIN_COMPARED_FRACTION:.0%})"
            )
        if self.median_abs_error > CALCULON_TIME_MEDIAN_LIMIT:
            out.append(
                f"median |error| {self.median_abs_error:.2%} > {CALCULON_TIME_MEDIAN_LIMIT:.0%}"
            )
        worst = self.worst
        if abs(worst.error) > CALCULON_TIME_MAX_LIMIT:
            out.append(
                f"record {worst.record_id} ({worst.name}) error {worst.error:+.2%} beyond "
                f"{CALCULON_TIME_MAX_LIMIT:.0%} ({worst.dp_note})"
            )
        return out


def run_gate(records: Sequence[CalculonRecord]) -> CalculonGate:
    """Every record's bucket."""
    return CalculonGate(
        records=len(records), outcomes=tuple(gate_outcome(record) for record in records)
    )


def render_bucket_table(gate: CalculonGate) -> str:
    """The buckets as a Markdown table (docs/VALIDATION.md)."""
    rows = [
        "| bucket | reason / laws | records |",
        "|---|---|---|",
        f"| compared | median abs error {gate.median_abs_error:.2%}, max "
        f"{abs(gate.worst.error):.2%} (record {gate.worst.record_id}) | {len(gate.compared)} |",
    ]
    rows += [
        f"| excluded | `{reason}`: {reason.why} | {gate.excluded[reason]} |"
        for reason in CalculonExclusion
        if reason in gate.excluded
    ]
    rows += [
        f"| refused | {' + '.join(f'`{law}`' for law in sorted(laws))} | {count} |"
        for laws, count in sorted(
            gate.refused.items(), key=lambda item: (-item[1], sorted(item[0]))
        )
    ]
    rows.append(f"| total | | {gate.bucket_total} of {gate.records} records |")
    return "\n".join(rows)


# --------------------------------------------------------------------------------------------
# Calculon's own refusals
# --------------------------------------------------------------------------------------------
class RejectionVerdict(StrEnum):
    """What Blueprinting makes of a configuration Calculon refused."""

    LAW = "law"  # a law refuses it too
    TOO_BIG = "too big"  # the laws accept it, and it does not fit in our memory model either
    #: the laws accept it; it fits our memory model, which holds the optimizer's fp32 copy of
    #: 16-bit gradients at the step only (memory.step_copy_bytes), and would not with the copy
    #: held through the backward, as Calculon's optimizer states hold it
    TOO_BIG_WITH_STEP_COPY = "too big with the step's gradient copy"
    FITS = "fits"  # the laws accept it and it fits our memory model
    ACCEPTED = "accepted"  # the laws accept it (a refusal our model has no counterpart of)


#: The laws that must refuse a record Calculon refuses for a structural reason (one of them).
#: TP_UNEVEN_SPLIT: Calculon checks hidden, heads, ffn... split over t; a shape that fails it
#: also breaks a per-rank divisibility or ``hidden_per_head`` here.
STRUCTURAL_LAWS: Mapping[CalculonRejection, frozenset[str]] = {
    CalculonRejection.INTERLEAVING_NOT_A_FACTOR: frozenset({Law.BLOCKS_PER_VIRTUAL_CHUNK.value}),
    CalculonRejection.INTERLEAVING_EXCEEDS_BLOCKS: frozenset({Law.BLOCKS_PER_VIRTUAL_CHUNK.value}),
    CalculonRejection.TP_UNEVEN_SPLIT: frozenset(
        {
            Law.ATTENTION_HEADS_DIVISIBILITY.value,
            Law.QUERY_GROUPS_DIVISIBILITY.value,
            Law.FFN_DIVISIBILITY.value,
            Law.VOCAB_DIVISIBILITY.value,
            "hidden_per_head",
        }
    ),
}

#: Which verdicts each kind of Calculon refusal may get. Offload: Blueprinting has no offload
#: tier, so its capacity / block-count rules have no counterpart. UNSUPPORTED_DATATYPE: the
#: record's ``sys`` lacks the datatype (``system_from_calculon`` refuses such a system when asked
#: for it). NETWORK_TOO_SMALL: t = 16 over 8-GPU NVLink domains, which Blueprinting places
#: across nodes (legal in Megatron-LM, slow). OTHER (an unclassified message) may get none.
REJECTION_VERDICTS: Mapping[CalculonRejection, frozenset[RejectionVerdict]] = {
    CalculonRejection.INTERLEAVING_NOT_A_FACTOR: frozenset({RejectionVerdict.LAW}),
    CalculonRejection.INTERLEAVING_EXCEEDS_BLOCKS: frozenset({RejectionVerdict.LAW}),
    CalculonRejection.TP_UNEVEN_SPLIT: frozenset({RejectionVerdict.LAW}),
    CalculonRejection.HBM_CAPACITY: frozenset(
        {RejectionVerdict.LAW, RejectionVerdict.TOO_BIG, RejectionVerdict.TOO_BIG_WITH_STEP_COPY}
    ),
    CalculonRejection.OFFLOAD_NEEDS_BLOCKS: frozenset(
        {RejectionVerdict.LAW, RejectionVerdict.ACCEPTED}
    ),
    CalculonRejection.OFFLOAD_CAPACITY: frozenset(
        {RejectionVerdict.LAW, RejectionVerdict.ACCEPTED}
    ),
    CalculonRejection.NETWORK_TOO_SMALL: frozenset(
        {RejectionVerdict.LAW, RejectionVerdict.ACCEPTED}
    ),
    CalculonRejection.UNSUPPORTED_DATATYPE: frozenset(
        {RejectionVerdict.LAW, RejectionVerdict.ACCEPTED}
    ),
    CalculonRejection.OTHER: frozenset(),
}


def hbm_capacity_bytes(record: CalculonRecord) -> int:
    """The record's ``sys.mem1`` capacity in bytes (Calculon gives it in GiB)."""
    mem1 = record.system.get("mem1")
    gib = mem1.get("GiB") if isinstance(mem1, Mapping) else None
    if not isinstance(gib, int | float):
        raise ConfigError([f"record {record.id}: sys.mem1.GiB must be a number"])
    return int(gib * 2**30)


def rejection_verdict(record: CalculonRecord) -> tuple[RejectionVerdict, frozenset[str]] | None:
    """Blueprinting's verdict on a record Calculon refused, with the law names that refuse it
    (``None``: not a refused training record)."""
    from blueprinting.analysis.memory import memory_per_stage
    from blueprinting.mapping.laws import check_training

    failure = record.failure
    if failure is None or not record.exe.training:
        return None
    spec = translate(record).spec
    laws = frozenset(v.law for v in check_training(spec.model, spec.mapping))
    if laws:
        return RejectionVerdict.LAW, laws
    if failure.rejection is not CalculonRejection.HBM_CAPACITY:
        return RejectionVerdict.ACCEPTED, laws
    # Calculon counts no NCCL buffers: the whole job in one NVLink domain (the fewest buffers,
    # nvlink_domain=None) is the reading closest to its verdict
    capacity = hbm_capacity_bytes(record)
    stages = memory_per_stage(spec.model, spec.mapping, capacity_bytes=capacity)
    if not all(stage.fits for stage in stages):
        return RejectionVerdict.TOO_BIG, laws
    if any(_with_copy_held_through(stage) > capacity for stage in stages):
        return RejectionVerdict.TOO_BIG_WITH_STEP_COPY, laws
    return RejectionVerdict.FITS, laws


def _with_copy_held_through(stage: MemoryBreakdown) -> int:
    """A lower bound of the device peak with the step's gradient copy held through the backward:
    the backward's peak plus the copy. Where the step sets the peak its transient is the copy's
    excess, not the backward's working set (at least 0), which this leaves out."""
    from blueprinting.analysis.memory import MemoryPeak

    backward = stage.reserved_peak
    if stage.peak is MemoryPeak.OPTIMIZER_STEP:
        backward -= stage.transient
    return backward + stage.optimizer_step_copy


def rejection_problems(records: Iterable[CalculonRecord]) -> list[str]:
    """Every Calculon refusal whose verdict here is not one :data:`REJECTION_VERDICTS` allows, or
    whose structural refusal is not matched by one of its :data:`STRUCTURAL_LAWS`."""
    out: list[str] = []
    for record in records:
        outcome = rejection_verdict(record)
        if outcome is None:
            continue
        verdict, laws = outcome
        assert record.failure is not None
        reason = record.failure.rejection
        if verdict not in REJECTION_VERDICTS[reason]:
            out.append(f"record {record.id}: Calculon {reason.name}, here {verdict} {sorted(laws)}")
        expected = STRUCTURAL_LAWS.get(reason)
        if expected is not None and not laws & expected:
            out.append(
                f"record {record.id}: Calculon {reason.name} but none of {sorted(expected)} "
                f"refuses it here ({sorted(laws)})"
            )
    return out


# --------------------------------------------------------------------------------------------
# A subset of an oracle, in the oracle's own format
# --------------------------------------------------------------------------------------------
LAYERS_FILE = "calculon_oracle_layers.json.gz"


def write_oracle_subset(source: Path, ids: Iterable[int], destination: Path) -> None:
    """Write the records ``ids`` of the oracle ``source`` (and their per-layer statistics from
    the companion beside it) into ``destination`` (a directory), as ``calculon_oracle.json`` and
    :data:`LAYERS_FILE`, byte for byte the records of the source."""
    import gzip

    wanted = set(ids)
    records = [r for r in json.loads(source.read_text(encoding="utf-8")) if r["id"] in wanted]
    missing = wanted - {r["id"] for r in records}
    if missing:
        raise KeyError(f"records {sorted(missing)} are not in {source}")
    with gzip.open(source.with_name(LAYERS_FILE), "rt", encoding="utf-8") as f:
        layers = json.load(f)
    destination.mkdir(parents=True, exist_ok=True)
    (destination / "calculon_oracle.json").write_text(
        json.dumps(records, separators=(",", ":"), sort_keys=True) + "\n", encoding="utf-8"
    )
    subset_layers = {str(r["id"]): layers[str(r["id"])] for r in records if r["ok"]}
    # mtime=0: the same subset gives the same bytes.
    with gzip.GzipFile(destination / LAYERS_FILE, "wb", mtime=0) as out:
        out.write(json.dumps(subset_layers, separators=(",", ":"), sort_keys=True).encode())


#: The records of ``tests/validation/fixtures/calculon_subset`` (taken from the shared oracle): a
#: spread of every bucket (validation, canonical, sweep and random records compared, with tiled
#: TP overlap, fp8, interleaving, DP overlap and sharding; each exclusion; refusals by each
#: Calculon-only law) and one or more Calculon refusal of each kind and verdict.
SYNTHETIC_SUBSET_IDS: tuple[int, ...] = (
    # compared
    1, 3, 7, 13, 23, 36, 52, 58, 98, 102, 104, 118, 129, 137, 180, 204, 249, 304, 344, 345,
    355, 394, 514,
    # refused by laws Calculon lacks
    81, 114, 159, 217, 265, 295, 385, 535,
    # excluded: inference, offload, TP overlap over all-reduce, p2p_rs_ag
    115, 107, 103, 89,
    # refused by Calculon: HBM (law, too big, inference), interleaving (2), TP split, offload
    # (blocks: law, accepted; capacity: accepted, law), network, datatype
    139, 67, 544, 64, 182, 130, 167, 337, 192, 419, 126, 116,
)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m blueprinting.validation.calculon_gate SOURCE DEST``: write the
    :data:`SYNTHETIC_SUBSET_IDS` records of the oracle SOURCE into the directory DEST."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("source", type=Path)
    parser.add_argument("destination", type=Path)
    args = parser.parse_args(argv)
    write_oracle_subset(args.source, SYNTHETIC_SUBSET_IDS, args.destination)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
