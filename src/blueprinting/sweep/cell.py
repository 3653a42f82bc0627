"""One cell of a sweep: exactly ``blueprinting search`` for its model, system, GPU count and
global batch (``search.rank.run_search``; the best strategy re-planned by ``exact_reports``, as
``search --json`` does), reduced to one row.

Every figure of a row comes from the search and the scalar plan; this module computes none
itself except GPU-hours, which is the plan's time-to-train (``IterationReport.time_to_train_s``)
times the GPU count over 3,600 (the ``gpu-hours`` objective of ``search/rank.py``), and cost,
GPU-hours times the user's price.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, TypeAlias, assert_never, final

from blueprinting.errors import ConfigError
from blueprinting.report.memory_table import GIB
from blueprinting.sweep.definition import Cell, CellSearchOptions

if TYPE_CHECKING:
    from blueprinting.analysis.report import JsonValue
    from blueprinting.mapping.model import TransformerModelSpec
    from blueprinting.search.space import EnumerationReport

#: Rejection reasons a no-lawful-strategy row names (the most frequent first).
LISTED_REJECTIONS = 3


class CellStatus(StrEnum):
    """A row's ``status`` column."""

    OK = "ok"
    NO_LAWFUL_STRATEGY = "no-lawful-strategy"
    NO_FITTING_STRATEGY = "no-fitting-strategy"
    REFUSED = "refused"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class BestStrategy:
    """The search's rank-1 strategy and its scalar plan's figures."""

    strategy_text: str
    megatron_args: tuple[str, ...]
    iteration_time_s: float
    tokens_per_second: float
    mfu: float
    memory_reserved_peak_bytes: int
    memory_limit_bytes: int
    time_to_train_s: float
    gpu_hours: float


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class NoLawfulStrategy:
    """Every enumerated strategy breaks a law; ``reason`` names the most frequent ones."""

    reason: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class NoFittingStrategy:
    """Lawful strategies exist but none fits: the smallest device peak is over the limit."""

    smallest_peak_bytes: int
    memory_limit_bytes: int

    @property
    def reason(self) -> str:
        return (
            f"no lawful strategy fits in memory: the smallest reserved peak is "
            f"{self.smallest_peak_bytes / GIB:.2f} GiB, over the limit of "
            f"{self.memory_limit_bytes / GIB:.2f} GiB (capacity less headroom)"
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SearchRefused:
    """The search refused the cell by one of its limits (``limits.py``), e.g. too many lawful
    candidates."""

    reason: str


CellOutcome: TypeAlias = BestStrategy | NoLawfulStrategy | NoFittingStrategy | SearchRefused


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SweepRow:
    """A cell, the search's counts, and what it found."""

    cell: Cell
    train_tokens: int
    candidates_enumerated: int
    candidates_valid: int
    candidates_fit: int
    outcome: CellOutcome

    @property
    def status(self) -> CellStatus:
        match self.outcome:
            case BestStrategy():
                return CellStatus.OK
            case NoLawfulStrategy():
                return CellStatus.NO_LAWFUL_STRATEGY
            case NoFittingStrategy():
                return CellStatus.NO_FITTING_STRATEGY
            case SearchRefused():
                return CellStatus.REFUSED
            case _ as unreachable:
                assert_never(unreachable)

    @property
    def reason(self) -> str | None:
        """Why the cell has no best strategy (None when it has one)."""
        match self.outcome:
            case BestStrategy():
                return None
            case NoLawfulStrategy(reason=reason) | SearchRefused(reason=reason):
                return reason
            case NoFittingStrategy() as no_fit:
                return no_fit.reason
            case _ as unreachable:
                assert_never(unreachable)

    def record(self, price: float | None) -> dict[str, JsonValue]:
        """The flat row (``RECORD_COLUMNS``) of the Parquet file, the CSV and ``--json``;
        ``price`` in USD per GPU-hour gives the cost column."""
        c = self.cell
        row: dict[str, JsonValue] = {
            "model": c.model,
            "system": c.system,
            "gpus": c.gpus,
            "global_batch": c.global_batch,
            "seq_length": c.seq_length,
            "status": str(self.status),
            "reason": self.reason,
            "strategy_text": None,
            "megatron_args": None,
            "iteration_time_s": None,
            "tokens_per_second": None,
            "mfu": None,
            "memory_reserved_peak_bytes": None,
            "memory_limit_bytes": None,
            "train_tokens": self.train_tokens,
            "time_to_train_s": None,
            "gpu_hours": None,
            "price_usd_per_gpu_hour": price,
            "cost_usd": None,
            "candidates_enumerated": self.candidates_enumerated,
            "candidates_valid": self.candidates_valid,
            "candidates_fit": self.candidates_fit,
        }
        match self.outcome:
            case BestStrategy() as best:
                row["strategy_text"] = best.strategy_text
                row["megatron_args"] = list(best.megatron_args)
                row["iteration_time_s"] = best.iteration_time_s
                row["tokens_per_second"] = best.tokens_per_second
                row["mfu"] = best.mfu
                row["memory_reserved_peak_bytes"] = best.memory_reserved_peak_bytes
                row["memory_limit_bytes"] = best.memory_limit_bytes
                row["time_to_train_s"] = best.time_to_train_s
                row["gpu_hours"] = best.gpu_hours
                row["cost_usd"] = None if price is None else best.gpu_hours * price
            case NoFittingStrategy() as no_fit:
                row["memory_reserved_peak_bytes"] = no_fit.smallest_peak_bytes
                row["memory_limit_bytes"] = no_fit.memory_limit_bytes
            case NoLawfulStrategy() | SearchRefused():
                pass
            case _ as unreachable:
                assert_never(unreachable)
        return row


#: Columns of a record, in order.
RECORD_COLUMNS = (
    "model",
    "system",
    "gpus",
    "global_batch",
    "seq_length",
    "status",
    "reason",
    "strategy_text",
    "megatron_args",
    "iteration_time_s",
    "tokens_per_second",
    "mfu",
    "memory_reserved_peak_bytes",
    "memory_limit_bytes",
    "train_tokens",
    "time_to_train_s",
    "gpu_hours",
    "price_usd_per_gpu_hour",
    "cost_usd",
    "candidates_enumerated",
    "candidates_valid",
    "candidates_fit",
)


def _text(record: Mapping[str, object], key: str) -> str:
    value = record[key]
    assert isinstance(value, str), (key, value)
    return value


def _int(record: Mapping[str, object], key: str) -> int:
    value = record[key]
    assert isinstance(value, int) and not isinstance(value, bool), (key, value)
    return value


def _float(record: Mapping[str, object], key: str) -> float:
    value = record[key]
    assert isinstance(value, float), (key, value)
    return value


def row_from_record(record: Mapping[str, object]) -> SweepRow:
    """The row a record was made from (the output folder's files are written by
    :meth:`SweepRow.record`; resume reads them back)."""
    cell = Cell(
        model=_text(record, "model"),
        system=_text(record, "system"),
        gpus=_int(record, "gpus"),
        global_batch=_int(record, "global_batch"),
        seq_length=_int(record, "seq_length"),
    )
    outcome: CellOutcome
    match CellStatus(_text(record, "status")):
        case CellStatus.OK:
            args = record["megatron_args"]
            assert isinstance(args, list)
            outcome = BestStrategy(
                strategy_text=_text(record, "strategy_text"),
                megatron_args=tuple(str(a) for a in args),
                iteration_time_s=_float(record, "iteration_time_s"),
                tokens_per_second=_float(record, "tokens_per_second"),
                mfu=_float(record, "mfu"),
                memory_reserved_peak_bytes=_int(record, "memory_reserved_peak_bytes"),
                memory_limit_bytes=_int(record, "memory_limit_bytes"),
                time_to_train_s=_float(record, "time_to_train_s"),
                gpu_hours=_float(record, "gpu_hours"),
            )
        case CellStatus.NO_LAWFUL_STRATEGY:
            outcome = NoLawfulStrategy(reason=_text(record, "reason"))
        case CellStatus.NO_FITTING_STRATEGY:
            outcome = NoFittingStrategy(
                smallest_peak_bytes=_int(record, "memory_reserved_peak_bytes"),
                memory_limit_bytes=_int(record, "memory_limit_bytes"),
            )
        case CellStatus.REFUSED:
            outcome = SearchRefused(reason=_text(record, "reason"))
        case _ as unreachable:
            assert_never(unreachable)
    return SweepRow(
        cell=cell,
        train_tokens=_int(record, "train_tokens"),
        candidates_enumerated=_int(record, "candidates_enumerated"),
        candidates_valid=_int(record, "candidates_valid"),
        candidates_fit=_int(record, "candidates_fit"),
        outcome=outcome,
    )


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------
def cell_model(cell: Cell) -> TransformerModelSpec:
    """The cell's model: its preset at the cell's sequence length."""
    from blueprinting.mapping.presets import model_preset

    model = model_preset(cell.model)
    if model.seq_length == cell.seq_length:
        return model
    return replace(model, seq_length=cell.seq_length)


def _no_lawful_reason(report: EnumerationReport) -> str:
    counts = sorted(((count, str(law)) for law, count in report.rejections if count), reverse=True)
    named = ", ".join(f"{law} ({count:,})" for count, law in counts[:LISTED_REJECTIONS])
    more = len(counts) - LISTED_REJECTIONS
    tail = f" and {more} more law(s)" if more > 0 else ""
    return (
        f"no strategy satisfies the laws: all {report.candidates_enumerated:,} enumerated "
        f"candidates are rejected, most often by {named}{tail}"
    )


def evaluate_cell(cell: Cell, options: CellSearchOptions) -> SweepRow:
    """The row of one cell: ``blueprinting search`` with the cell's values and ``options``."""
    from blueprinting.hardware.presets import system_preset
    from blueprinting.search.rank import RankOptions, exact_reports, run_search
    from blueprinting.search.space import (
        SearchSpace,
        candidate_to_spec,
        enumerate_strategies,
        format_strategy_text,
    )

    model = cell_model(cell)
    system = system_preset(cell.system)
    space = SearchSpace(
        gpu_counts=(cell.gpus,),
        global_batch_size=cell.global_batch,
        gpus_per_node=system.gpus_per_node,
        allow_cross_node_tp=options.allow_cross_node_tp,
        megatron_rules=options.megatron_rules,
        max_microbatch_size=options.max_micro_batch,
        precision=options.recipes,
        pipeline_layouts=options.pipeline_layouts,
    )

    def row(outcome: CellOutcome, enumerated: int = 0, valid: int = 0, fit: int = 0) -> SweepRow:
        return SweepRow(
            cell=cell,
            train_tokens=options.train_tokens,
            candidates_enumerated=enumerated,
            candidates_valid=valid,
            candidates_fit=fit,
            outcome=outcome,
        )

    # run_search refuses an empty lawful set as a bug-class VerificationError; enumerating first
    # (about 2% of a search) tells that case apart without catching it.
    try:
        enumeration = enumerate_strategies(model, space)
    except ConfigError as refused:
        return row(SearchRefused(reason="; ".join(refused.problems)))
    if len(enumeration.table) == 0:
        law_report = enumeration.report
        return row(
            NoLawfulStrategy(reason=_no_lawful_reason(law_report)),
            law_report.candidates_enumerated,
        )
    result = run_search(
        model,
        system,
        space,
        RankOptions(
            memory_headroom_bytes=int(options.memory_headroom_gib * GIB),
            train_tokens=options.train_tokens,
            flops_convention=options.flops_convention,
        ),
    )
    counts = (result.candidates_enumerated, result.candidates_valid, result.candidates_fit)
    if result.candidates_fit == 0:
        smallest = int(result.figures.memory_reserved_peak.min())
        return row(
            NoFittingStrategy(
                smallest_peak_bytes=smallest, memory_limit_bytes=result.memory_limit_bytes
            ),
            *counts,
        )
    best_row = result.order[:1]
    (report,) = exact_reports(result, best_row)
    time_to_train = report.time_to_train_s(options.train_tokens)
    best = BestStrategy(
        strategy_text=format_strategy_text(
            candidate_to_spec(result.table, int(best_row[0]), model).mapping
        ),
        megatron_args=report.megatron_args,
        iteration_time_s=report.iteration_time_s,
        tokens_per_second=report.tokens_per_second,
        mfu=report.mfu,
        memory_reserved_peak_bytes=report.memory.reserved_peak,
        memory_limit_bytes=result.memory_limit_bytes,
        time_to_train_s=time_to_train,
        gpu_hours=time_to_train * report.world_size / 3600.0,
    )
    return row(best, *counts)
