"""Published measured training runs, as typed records (issue #5).

The fixture ``tests/validation/fixtures/published_runs.toml`` carries, in the project's own format,
every figure of ``shared/reference/published_runs.json``:

* Narayanan et al. 2021 (SC'21, arXiv:2104.04473), Table 1: TFLOP/s per GPU of ten GPT models,
  counted with the paper's Eq. (3), which includes the recompute forward pass.
* Korthikanti et al. 2022 (arXiv:2205.05198), Table 5: iteration times with full recompute versus
  selective recompute + sequence parallelism; Table 4: forward / backward time of one 22B layer;
  Section 6.3 and the abstract: MFU of the 530B run on 2240 GPUs; Appendix C: microbatch-level
  recompute.
* Korthikanti et al. 2022, Figures 1 and 7 as read by Calculon (``calculon/llm/validation.py``):
  per-GPU activation memory in GiB and as a percentage of the tensor-parallel baseline.

Measured figures keep the paper's unit, named in the field (``layer_forward_ms``); predictions
are SI and :mod:`blueprinting.validation.comparison` converts. The model is built directly as a
:class:`TransformerModelSpec` (GPT as these papers trained it: learned absolute positions,
LayerNorm, GELU, tied embeddings, biases, ``kv_channels = h / heads``, vocabulary padded the way
Megatron-LM pads it). The strategy stays as Megatron-LM flat keys;
:meth:`PublishedRun.training_spec` hands them to the flat-key adapter.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import assert_never, final

from blueprinting.errors import ConfigError, ProblemCollector
from blueprinting.mapping.flat_keys import FlatValue, from_mapping, padded_vocab
from blueprinting.mapping.model import (
    Datatype,
    EmbeddingTying,
    MlpActivation,
    Normalization,
    PositionEmbedding,
    TransformerModelSpec,
)
from blueprinting.mapping.transformer import TrainingSpec
from blueprinting.validation.fields import (
    enum_or_none,
    fixture_path,
    flat_key_values,
    integer,
    number_or_none,
    positive_number,
    run_tables,
    string,
    strings,
    toml_table,
)

#: Megatron-LM's ``--make-vocab-size-divisible-by`` default (``megatron/training/arguments.py``).
MEGATRON_VOCAB_DIVISIBLE_BY = 128


class SourceTable(StrEnum):
    """Which published table or figure a row comes from (the shared JSON's ``source_key``)."""

    NARAYANAN2021_TABLE1 = "narayanan2021_table1"
    KORTHIKANTI2022_TABLE5 = "korthikanti2022_table5"
    KORTHIKANTI2022_TABLE4 = "korthikanti2022_table4"
    KORTHIKANTI2022_TEXT = "korthikanti2022_text"
    CALCULON_FIG1 = "calculon_validation_fig1"
    CALCULON_FIG7 = "calculon_validation_fig7"


class FlopsConvention(StrEnum):
    """How a published FLOP count was defined.

    ``narayanan2021_eq3``: Narayanan et al. 2021, Eq. (3),
    ``F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))`` per iteration; it counts the recompute forward
    pass, so with full recompute it is a hardware-FLOPs count.
    ``korthikanti2022_model_flops``: Korthikanti et al. 2022, Section 6.3 model FLOPs,
    ``F = 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))``, no recompute; MFU = F / (time · n · peak).
    """

    NARAYANAN2021_EQ3 = "narayanan2021_eq3"
    KORTHIKANTI2022_MODEL_FLOPS = "korthikanti2022_model_flops"

    def iteration_flops(self, model: TransformerModelSpec, global_batch_size: int) -> float:
        """FLOPs of one training iteration under this convention (``V`` = unpadded vocab, as the
        papers use 51200); the formulas live in :mod:`blueprinting.analysis.flops`."""
        from blueprinting.analysis.flops import narayanan_eq3_flops, narayanan_model_flops

        shape = {
            "batch": global_batch_size,
            "seq_length": model.seq_length,
            "num_layers": model.num_layers,
            "hidden_size": model.hidden_size,
            "vocab_size": model.vocab_size,
        }
        match self:
            case FlopsConvention.NARAYANAN2021_EQ3:
                return float(narayanan_eq3_flops(**shape))
            case FlopsConvention.KORTHIKANTI2022_MODEL_FLOPS:
                return float(narayanan_model_flops(**shape))
            case _ as unreachable:
                assert_never(unreachable)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredFigures:
    """The figures a paper reports for one run, in the paper's units (``None``: not reported).

    ``tflops_per_gpu`` follows ``flops_convention``; ``mfu_pct`` / ``hfu_pct`` are percentages of
    the 16-bit peak; ``memory_*_GiB`` are GiB (2**30 bytes) on the first pipeline stage's GPU;
    ``activation_memory_pct_of_tp_baseline`` is a percentage of ``baseline_run``'s activations.
    """

    tflops_per_gpu: float | None = None
    flops_convention: FlopsConvention | None = None
    pct_of_peak: float | None = None
    aggregate_pflops: float | None = None
    iteration_time_s: float | None = None
    mfu_pct: float | None = None
    hfu_pct: float | None = None
    mfu_convention: FlopsConvention | None = None
    throughput_increase_vs_full_pct: float | None = None
    layer_forward_ms: float | None = None
    layer_backward_ms: float | None = None
    layer_fwd_plus_bwd_ms: float | None = None
    overhead_vs_baseline_pct: float | None = None
    memory_activations_GiB: float | None = None  # noqa: N815  (unit spelled as the source does)
    memory_params_grads_optimizer_GiB: float | None = None  # noqa: N815
    activation_memory_pct_of_tp_baseline: float | None = None
    baseline_run: str | None = None


#: The measured figures that are changes in percent (may be negative); the others are
#: magnitudes.
_SIGNED_MEASURED_KEYS = frozenset({"throughput_increase_vs_full_pct", "overhead_vs_baseline_pct"})

#: Measured keys of the fixture, in the order :class:`MeasuredFigures` declares them.
MEASURED_KEYS: tuple[str, ...] = (
    "tflops_per_gpu",
    "pct_of_peak",
    "aggregate_pflops",
    "iteration_time_s",
    "mfu_pct",
    "hfu_pct",
    "throughput_increase_vs_full_pct",
    "layer_forward_ms",
    "layer_backward_ms",
    "layer_fwd_plus_bwd_ms",
    "overhead_vs_baseline_pct",
    "memory_activations_GiB",
    "memory_params_grads_optimizer_GiB",
    "activation_memory_pct_of_tp_baseline",
)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AlternativeAssumption:
    """Another reading of a strategy fact that the run's sources leave ambiguous.

    The run's own ``strategy`` is the fixture's primary reading (the one the shared reference
    records); an alternative is scored beside it, labelled, and never enters a gate: a planner
    must not pick, per row, whichever reading fits its model best. ``strategy`` holds only the
    flat keys that change.
    """

    label: str
    reason: str
    strategy: Mapping[str, FlatValue]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedRun:
    """One published measurement: where it comes from, the model, the strategy and the figures."""

    id: str
    source_table: SourceTable
    provenance: str
    system: str
    gpu: str
    num_gpus: int
    peak_tflops_16bit: float
    model: TransformerModelSpec
    params_b: float | None
    strategy_keys: Mapping[str, FlatValue]
    measured: MeasuredFigures
    notes: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()
    implied_iteration_time_s: float | None = None
    alternatives: tuple[AlternativeAssumption, ...] = ()

    def under(self, alternative: AlternativeAssumption) -> PublishedRun:
        """This run read with ``alternative``'s strategy keys (id ``<id>[<label>]``)."""
        return replace(
            self,
            id=f"{self.id}[{alternative.label}]",
            strategy_keys=MappingProxyType({**self.strategy_keys, **alternative.strategy}),
            assumptions=(*self.assumptions, f"{alternative.label}: {alternative.reason}"),
            alternatives=(),
        )

    @property
    def global_batch_size(self) -> int:
        value = self.strategy_keys.get("global_batch_size")
        if type(value) is not int:
            raise ConfigError(
                [f"global_batch_size must be an integer, got {value!r}"], source=self.id
            )
        return value

    def training_spec(self) -> TrainingSpec:
        """The run as a :class:`TrainingSpec`, built by the flat-key adapter (``from_mapping``)."""
        return from_mapping(dict(self.strategy_keys), model=self.model)


def padded_vocab_size(vocab_size: int, tensor_parallel: int) -> int:
    """Megatron-LM's padding with its default ``make_vocab_size_divisible_by`` = 128
    (:func:`blueprinting.mapping.flat_keys.padded_vocab`; see megatron_rules.md)."""
    return padded_vocab(vocab_size, MEGATRON_VOCAB_DIVISIBLE_BY, tensor_parallel)


def gpt_model(
    *,
    name: str,
    num_layers: int,
    hidden_size: int,
    num_attention_heads: int,
    ffn_hidden_size: int,
    seq_length: int,
    vocab_size: int,
    tensor_parallel: int,
    datatype: Datatype,
    published_parameters: int | None = None,
) -> TransformerModelSpec:
    """The GPT of Narayanan 2021 / Korthikanti 2022: MHA, learned positions, LayerNorm, GELU,
    tied embeddings, biases, ``kv_channels = h / heads``, Megatron-padded vocabulary."""
    return TransformerModelSpec(
        name=name,
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_attention_heads=num_attention_heads,
        num_query_groups=num_attention_heads,
        # a head count below 1 is refused by TransformerModelSpec itself; no division by it first
        kv_channels=hidden_size // max(1, num_attention_heads),
        ffn_hidden_size=ffn_hidden_size,
        seq_length=seq_length,
        vocab_size=vocab_size,
        padded_vocab_size=padded_vocab_size(vocab_size, tensor_parallel),
        activation=MlpActivation.GELU,
        normalization=Normalization.LAYERNORM,
        position_embedding=PositionEmbedding.LEARNED_ABSOLUTE,
        embeddings=EmbeddingTying.TIED,
        add_bias_linear=True,
        datatype=datatype,
        published_parameters=published_parameters,
    )


def default_fixture_path() -> Path:
    """``tests/validation/fixtures/published_runs.toml`` of the checkout this module is in."""
    return fixture_path("published_runs.toml")


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------
_table = toml_table


def _int(raw: Mapping[str, object], key: str, where: str, problems: ProblemCollector) -> int:
    # 1 on error, not 0: gpt_model divides by these while the loader goes on collecting.
    return integer(raw, key, where, problems, fallback=1)


def _positive_int(
    raw: Mapping[str, object], key: str, where: str, problems: ProblemCollector
) -> int:
    """A count that divides a figure (fuzz seed 1272 case 41418: ``num_gpus = 0`` reached the
    TFLOP/s per GPU as a ZeroDivisionError); 1 on error, as :func:`_int`."""
    value = _int(raw, key, where, problems)
    if value < 1:
        problems.add(f"{where}.{key} must be a positive integer, got {value}")
        return 1
    return value


def _datatype(strategy: Mapping[str, FlatValue]) -> Datatype:
    if strategy.get("fp16") is True:
        return Datatype.FP16
    if strategy.get("bf16") is True:
        return Datatype.BF16
    return Datatype.FP32


def _alternatives(
    raw: Mapping[str, object],
    strategy: Mapping[str, FlatValue],
    where: str,
    problems: ProblemCollector,
) -> tuple[AlternativeAssumption, ...]:
    value = raw.get("alternative", [])
    if not isinstance(value, list):
        problems.add(f"{where}.alternative must be an array of tables ([[run.alternative]])")
        return ()
    alternatives: list[AlternativeAssumption] = []
    for index, item in enumerate(value):
        item_where = f"{where}.alternative[{index}]"
        table = _table(item, item_where, problems)
        keys = flat_key_values(
            _table(table.get("strategy"), f"{item_where}.strategy", problems),
            f"{item_where}.strategy",
            problems,
        )
        if not keys:
            problems.add(f"{item_where}.strategy must change at least one key")
        same = sorted(key for key, flat in keys.items() if strategy.get(key) == flat)
        if same:
            problems.add(f"{item_where}.strategy repeats the run's own value of {', '.join(same)}")
        alternatives.append(
            AlternativeAssumption(
                label=string(table, "label", item_where, problems),
                reason=string(table, "reason", item_where, problems),
                strategy=MappingProxyType(keys),
            )
        )
    labels = [alternative.label for alternative in alternatives]
    if len(set(labels)) != len(labels):
        problems.add(f"{where}.alternative labels must be distinct, got {labels}")
    return tuple(alternatives)


def _run(raw: Mapping[str, object], where: str, problems: ProblemCollector) -> PublishedRun | None:
    run_id = string(raw, "id", where, problems)
    where = f"run {run_id!r}" if run_id else where
    source_table = enum_or_none(SourceTable, raw, "source_table", where, problems)
    model_raw = _table(raw.get("model"), f"{where}.model", problems)
    strategy_raw = _table(raw.get("strategy"), f"{where}.strategy", problems)
    measured_raw = _table(raw.get("measured"), f"{where}.measured", problems)
    derived_raw = _table(raw.get("derived", {}), f"{where}.derived", problems)

    strategy = flat_key_values(strategy_raw, f"{where}.strategy", problems)
    for key in ("tensor_model_parallel_size", "global_batch_size"):
        _int(strategy_raw, key, f"{where}.strategy", problems)

    unknown = sorted(set(measured_raw) - set(MEASURED_KEYS))
    if unknown:
        problems.add(f"{where}.measured has unknown keys: {', '.join(unknown)}")
    figures = {
        key: number_or_none(measured_raw, key, f"{where}.measured", problems)
        for key in MEASURED_KEYS
    }
    for key, value in figures.items():
        # every error is relative to the measured figure: it must be finite and non-zero, and
        # all but the two changes in percent are magnitudes (positive)
        signed = key in _SIGNED_MEASURED_KEYS
        if value is not None and not (
            math.isfinite(value) and (value != 0 if signed else value > 0)
        ):
            kind = "a finite non-zero number" if signed else "a positive finite number"
            problems.add(f"{where}.measured.{key} must be {kind}, got {value!r}")
            figures[key] = None
    baseline_run = raw.get("baseline_run")
    if baseline_run is not None and not isinstance(baseline_run, str):
        problems.add(f"{where}.baseline_run must be a string")
        baseline_run = None
    measured = MeasuredFigures(
        **figures,
        flops_convention=enum_or_none(FlopsConvention, raw, "flops_convention", where, problems),
        mfu_convention=enum_or_none(FlopsConvention, raw, "mfu_convention", where, problems),
        baseline_run=baseline_run,
    )

    model_where = f"{where}.model"
    params_b = number_or_none(model_raw, "params_b", model_where, problems)
    if params_b is not None and not (math.isfinite(params_b * 1e9) and params_b > 0):
        # a published count is a positive number of billions (inf would overflow an int count)
        problems.add(f"{model_where}.params_b must be a positive finite number, got {params_b!r}")
        params_b = None
    tensor = strategy.get("tensor_model_parallel_size", 1)
    try:
        model = gpt_model(
            name=string(model_raw, "name", model_where, problems),
            num_layers=_int(model_raw, "num_layers", model_where, problems),
            hidden_size=_int(model_raw, "hidden_size", model_where, problems),
            num_attention_heads=_int(model_raw, "num_attention_heads", model_where, problems),
            ffn_hidden_size=_int(model_raw, "ffn_hidden_size", model_where, problems),
            seq_length=_int(model_raw, "seq_length", model_where, problems),
            vocab_size=_int(model_raw, "vocab_size", model_where, problems),
            tensor_parallel=tensor if type(tensor) is int and tensor > 0 else 1,
            datatype=_datatype(strategy),
            published_parameters=None if params_b is None else round(params_b * 1e9),
        )
    except ConfigError as error:
        for problem in error.problems:
            problems.add(f"{model_where}: {problem}")
        return None
    if source_table is None or not run_id:
        return None
    return PublishedRun(
        id=run_id,
        source_table=source_table,
        provenance=string(raw, "provenance", where, problems),
        system=string(raw, "system", where, problems),
        gpu=string(raw, "gpu", where, problems),
        num_gpus=_positive_int(raw, "num_gpus", where, problems),
        peak_tflops_16bit=positive_number(raw, "peak_tflops_16bit", where, problems),
        model=model,
        params_b=params_b,
        strategy_keys=MappingProxyType(strategy),
        measured=measured,
        notes=strings(raw, "notes", where, problems),
        assumptions=strings(raw, "assumptions", where, problems),
        implied_iteration_time_s=number_or_none(
            derived_raw, "implied_iteration_time_s", f"{where}.derived", problems
        ),
        alternatives=_alternatives(raw, strategy, where, problems),
    )


def load_published_runs(path: Path | None = None) -> tuple[PublishedRun, ...]:
    """Read the fixture (default :func:`default_fixture_path`), reporting every problem at once."""
    source = path if path is not None else default_fixture_path()
    problems = ProblemCollector(source=str(source))
    runs = run_tables(source, "published runs", problems, _run)
    ids = [run.id for run in runs]
    known = set(ids)
    for run in runs:
        baseline = run.measured.baseline_run
        if baseline is not None and baseline not in known:
            problems.add(f"run {run.id!r}: baseline_run {baseline!r} is not a run of this file")
    problems.raise_if_any()
    return tuple(runs)
