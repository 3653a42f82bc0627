"""Measured dense training throughput of 2024-2026, and scoring the iteration time on it (issue 12).

The fixture ``tests/validation/fixtures/modern_runs.toml`` carries, in the project's own format,
the 79 dense records of ``shared/reference/modern_runs.json`` (see ``modern_runs.md`` there):
Megatron-Bridge's performance summary (Llama 3 8B / 70B, Llama 3.1 405B on DGX-H100, DGX-B200,
DGX-GB200; NeMo containers 25.09 to 26.06), NeMo's 24.07 performance summary (GPT-3, Llama 2 / 3,
Nemotron on DGX-H100, FP8) and NeMo's long-sequence page (Llama 2 7B on H100 and Llama 3 8B on
B200 at 4k to 1M tokens with context parallelism, FP8).

Each run keeps the model (a preset, or every field as Megatron-LM flat keys), the named machine's
system preset, its GPU count (``world_size``) and the Megatron-LM flat keys a user reproducing the
recipe sets (the fixture's header says which and why), with Megatron's own names, including the
ones Blueprinting does not read yet (``cp_comm_type``, ``fp8_recipe``, ``fp4_format``, ...).

Scoring (:func:`compare_modern_runs`): the measured iteration time is
``global_batch_size x seq_length / (tokens_per_s_per_gpu x num_gpus)`` (``modern_runs.md``:
tokens/s per GPU is convention-free); a run that prints only model TFLOP/s names its FLOP
convention (:class:`~blueprinting.analysis.flops.FlopsConvention`) and the time is those FLOPs /
(TFLOP/s x GPUs). Each run is planned with ``blueprinting.api.plan_spec`` on its preset, with the
plan's default options; a run the planner refuses is "not planned" with the planner's own message.
Gates (issue 12 item 7): median |relative error| <= :data:`MEDIAN_ERROR_LIMIT` and max <=
:data:`MAX_ERROR_LIMIT` over the planned runs, and every dense run planned. No efficiency is
fitted on these runs: they are held out.
"""

from __future__ import annotations

import difflib
import re
import statistics
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, assert_never, final

from blueprinting.analysis.flops import FlopsConvention
from blueprinting.errors import (
    BlueprintingError,
    ConfigError,
    InvalidStrategyError,
    ProblemCollector,
    RuleSet,
    UnsupportedError,
)
from blueprinting.mapping.flat_keys import FlatValue, canonical_key, from_mapping
from blueprinting.mapping.law_names import Law
from blueprinting.mapping.model import TransformerModelSpec
from blueprinting.mapping.precision import (
    Fp4Precision,
    Fp4Recipe,
    Fp8Precision,
    Fp8Recipe,
    PrecisionChoice,
    precision_choice,
)
from blueprinting.mapping.transformer import TrainingSpec
from blueprinting.validation.attainable import ErrorFloor, MeasuredInput, max_error_floor
from blueprinting.validation.fields import (
    enum_or_none,
    fixture_path,
    flat_key_values,
    integer,
    number_or_none,
    run_tables,
    string,
    strings,
    toml_table,
)

if TYPE_CHECKING:
    from blueprinting.validation.predictor import PlanCache

#: Issue 12 item 7: median |relative error| of the iteration time over the planned runs.
MEDIAN_ERROR_LIMIT = 0.08
#: Issue 12 item 7: largest |relative error| of the iteration time over the planned runs.
MAX_ERROR_LIMIT = 0.20


class ModernSource(StrEnum):
    """Where a run comes from (the shared JSON's ``source_key``; module docstring)."""

    MEGATRON_BRIDGE = "megatron_bridge_perf_summary"
    NEMO_24_07 = "nemo_24.07_perf_summary"
    NEMO_LONG_SEQUENCE = "nemo_long_sequence_cp"
    #: The mixture-of-experts rows (validation/modern_moe.py).
    MEGATRON_BRIDGE_MOE = "megatron_bridge_perf_summary_moe"
    MOE_MODELZOO_MIXTRAL = "megatron_moe_modelzoo_mixtral"


class ModernExclusion(StrEnum):
    """Why a dense row is left out of the comparison and the gates (the fixture's
    ``excluded``; the loader refuses a reason the run does not meet, :meth:`ModernRun.
    exclusion_problem`).

    - ``inconsistent_layout``: the reference flags the source table INCONSISTENT (its printed
      DP, ``dp_table``, is not GPUs / (t x p x cp)) and, at the stated GPU count, the global
      batch is not a multiple of micro-batch x d, which Megatron-LM refuses at start-up
      (``megatron/core/num_microbatches_calculator.py``: global batch divisible by micro batch
      times data-parallel size): the run cannot have run as printed, and re-reading its GPU
      count or DP would be a repair the source does not state.
    - ``inconsistent_expert_grid``: a MoE row the reference flags INCONSISTENT LAYOUT (a note
      starting so) whose expert grid cannot be placed on its GPUs: the GPU count is not a
      multiple of etp x ep x p, which Megatron-Core refuses at start-up (``parallel_state.py``:
      the expert grid etp x ep x expert-dp x p must fill the world, as t x cp x d x p does):
      the run cannot have run as printed, and re-reading its EP or its GPU count would be a
      repair the source does not state.
    - ``known_regression``: the publisher of the figure says it measures a known software
      regression, to be fixed in a later release (the fixture's ``exclusion_reason`` quotes
      where): the planner prices the kernels as they run without it, so the row would score
      the bug, not the plan. The row and its figure stay in the table.
    """

    INCONSISTENT_LAYOUT = "inconsistent_layout"
    INCONSISTENT_EXPERT_GRID = "inconsistent_expert_grid"
    KNOWN_REGRESSION = "known_regression"


class ReferenceField(StrEnum):
    """A field of the shared reference's record (``modern_runs.json`` ``strategy``) a fixture
    row may depart from (``reference_departures``, with a ``departure_reason`` naming the
    primary source): where the reference derived it from a later revision of the recipe than
    the release that measured the row."""

    DISPATCHER = "dispatcher"


#: How the reference marks a row whose printed layout cannot run (``modern_runs.json`` notes).
INCONSISTENT_LAYOUT_NOTE = "INCONSISTENT LAYOUT"


class GpuGeneration(StrEnum):
    """The accelerator generation a row's error is summarised under."""

    HOPPER = "hopper"
    BLACKWELL = "blackwell"


#: The generation of each system preset a modern run may name (``hardware/presets.py``).
SYSTEM_GENERATIONS: Mapping[str, GpuGeneration] = MappingProxyType(
    {
        "dgx-h100": GpuGeneration.HOPPER,
        "dgx-h200": GpuGeneration.HOPPER,
        "dgx-h800": GpuGeneration.HOPPER,
        "dgx-b200": GpuGeneration.BLACKWELL,
        "dgx-b300": GpuGeneration.BLACKWELL,
        "dgx-gb200": GpuGeneration.BLACKWELL,
        "dgx-gb300": GpuGeneration.BLACKWELL,
    }
)


#: The recipe a run's flat keys set, as Megatron-LM reads them: ``fp4_format`` with
#: ``fp4_recipe`` (default nvfp4) is FP4; else ``fp8_format`` (``fp8``) with ``fp8_recipe``
#: (default delayed, ``transformer_config.py``) is FP8; else bf16 / fp16
#: (``modern_parallelism.md`` 3.1). The names are the search's ``--precision`` recipes.
PrecisionRecipe = PrecisionChoice

_FP8_RECIPES: Mapping[str, PrecisionRecipe] = MappingProxyType(
    {r.value: precision_choice(Fp8Precision(recipe=r)) for r in Fp8Recipe}
)
_FP4_RECIPES: Mapping[str, PrecisionRecipe] = MappingProxyType(
    {r.value: precision_choice(Fp4Precision(recipe=r)) for r in Fp4Recipe}
)


def precision_recipe(keys: Mapping[str, FlatValue]) -> PrecisionRecipe:
    """The recipe ``keys`` set; :class:`ConfigError` naming a value that is not a recipe."""
    canonical = {canonical_key(key): value for key, value in keys.items()}
    fp4 = canonical.get("fp4_format", canonical.get("fp4"))
    fp8 = canonical.get("fp8")
    if fp4 not in (None, False):
        recipe = str(canonical.get("fp4_recipe", "nvfp4"))
        if recipe not in _FP4_RECIPES:
            raise ConfigError([f"fp4_recipe {recipe!r} is not one of {', '.join(_FP4_RECIPES)}"])
        return _FP4_RECIPES[recipe]
    if fp8 not in (None, False):
        recipe = str(canonical.get("fp8_recipe", "delayed"))
        if recipe not in _FP8_RECIPES:
            raise ConfigError([f"fp8_recipe {recipe!r} is not one of {', '.join(_FP8_RECIPES)}"])
        return _FP8_RECIPES[recipe]
    if canonical.get("fp16") is True:
        return PrecisionRecipe.FP16
    return PrecisionRecipe.BF16


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ModernMeasured:
    """What the source prints per GPU (``None``: not printed)."""

    tokens_per_s_per_gpu: float | None = None
    model_tflops_per_gpu: float | None = None


#: The NeMo container a row's ``framework`` names: "NeMo container 26.02.01", "NeMo 24.07
#: container", "NeMo 25.04.rc2 (Megatron-Core)". Megatron-Bridge's performance summaries are one
#: table per container; NeMo's pages name theirs.
_RELEASE_PATTERN = re.compile(r"\bNeMo(?: container)? (\d{2})\.(\d{2})(?:\.(rc)?(\d+))?\b")

#: The summary group of the rows whose ``framework`` names no container (the ModelZoo's Mixtral
#: runs: "Megatron-Core").
UNSTATED_RELEASE = "unstated"


def software_release(framework: str) -> str | None:
    """The NeMo container release a ``framework`` text names (``"26.02.01"``, ``"25.04.rc2"``),
    None where it names none."""
    match = _RELEASE_PATTERN.search(framework)
    if match is None:
        return None
    year, month, candidate, number = match.groups()
    if number is None:
        return f"{year}.{month}"
    return f"{year}.{month}.{'rc' if candidate else ''}{number}"


def release_order(release: str) -> tuple[int, int, int, int]:
    """Chronological order of :func:`software_release` values: a release candidate before its
    release, the release before its patch releases (25.04.rc2 < 25.04 < 25.04.01)."""
    year, month, *rest = release.split(".")
    if not rest:
        return (int(year), int(month), 1, 0)
    (tail,) = rest
    if tail.startswith("rc"):
        return (int(year), int(month), 0, int(tail[2:]))
    return (int(year), int(month), 2, int(tail))


#: Figures of ``[run.measured]``.
MEASURED_KEYS: tuple[str, ...] = ("tokens_per_s_per_gpu", "model_tflops_per_gpu")


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ModernRun:
    """One measured run: provenance, the model, the system, its flat keys and its figures."""

    id: str
    source: ModernSource
    provenance: str
    framework: str
    system: str
    gpu: str
    num_gpus: int
    model_preset: str | None
    model_keys: Mapping[str, FlatValue]
    strategy_keys: Mapping[str, FlatValue]
    measured: ModernMeasured
    recipe: PrecisionRecipe
    precision_stated: str
    flops_convention: FlopsConvention | None = None
    dp_table: int | None = None
    notes: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()
    #: The performance config the recipe's settings were transcribed from (repo, release,
    #: commit, paths); empty where no such config is at hand.
    recipe_source: str = ""
    #: What that config states that no Blueprinting flat key carries (named, never modelled).
    unkeyed_settings: tuple[str, ...] = ()
    excluded: ModernExclusion | None = None
    #: Where the source states the exclusion's cause (required for ``known_regression``).
    exclusion_reason: str = ""
    #: Megatron-LM start-up rules (law names) the run breaks and is planned without, because
    #: its launcher never checks them (Megatron-Bridge builds Megatron-Core's configs directly
    #: and never calls Megatron-LM's ``arguments.py``); ``waiver_reason`` says so with its
    #: source. The predictor checks that exactly these Megatron rules are broken.
    waived_megatron_rules: tuple[Law, ...] = ()
    waiver_reason: str = ""
    #: Fields of the shared reference's record the row departs from, and the primary source
    #: that says so (both or neither; ``tests/validation`` checks each still differs).
    reference_departures: tuple[ReferenceField, ...] = ()
    departure_reason: str = ""

    @property
    def generation(self) -> GpuGeneration:
        return SYSTEM_GENERATIONS[self.system]

    @property
    def release(self) -> str | None:
        """The NeMo container the row was measured in (:func:`software_release`)."""
        return software_release(self.framework)

    @property
    def inputs(self) -> Hashable:
        """What the predictor reads of the run: the system, the training spec its keys build
        (so aliases and stated defaults that plan alike compare equal) and the Megatron rules it
        is planned without; the release, provenance and notes are not inputs. Raises what
        :meth:`training_spec` raises for keys the adapter refuses."""
        return (self.system, self.training_spec(), self.waived_megatron_rules)

    def _size(self, key: str) -> int:
        value = self.strategy_keys.get(key, 1)
        return value if type(value) is int else 1

    @property
    def tensor_parallel(self) -> int:
        return self._size("tensor_model_parallel_size")

    @property
    def pipeline_parallel(self) -> int:
        return self._size("pipeline_model_parallel_size")

    @property
    def context_parallel(self) -> int:
        return self._size("context_parallel_size")

    @property
    def data_parallel(self) -> int:
        """``num_gpus / (t x p x cp)``, as Megatron derives it from the world size."""
        return self.num_gpus // (
            self.tensor_parallel * self.pipeline_parallel * self.context_parallel
        )

    @property
    def global_batch_size(self) -> int:
        return self._size("global_batch_size")

    @property
    def model_name(self) -> str:
        if self.model_preset is not None:
            return self.model_preset
        name = self.model_keys.get("model_name")
        return name if isinstance(name, str) else "custom"

    @property
    def seq_length(self) -> int:
        value = self.model_keys.get("seq_length")
        if type(value) is int:
            return value
        return self.base_model().seq_length if self.model_preset is not None else 1

    def base_model(self) -> TransformerModelSpec:
        """The model preset (raises :class:`ConfigError` for an unknown name)."""
        from blueprinting.mapping.presets import model_preset

        if self.model_preset is None:
            raise ConfigError([f"run {self.id!r} names no model preset"])
        return model_preset(self.model_preset)

    def flat_keys(self) -> dict[str, FlatValue]:
        """Model and strategy keys with the GPU count as ``world_size``."""
        return {**self.model_keys, **self.strategy_keys, "world_size": self.num_gpus}

    def training_spec(self) -> TrainingSpec:
        """The run as a :class:`TrainingSpec`, built by the flat-key adapter (``from_mapping``):
        whatever it refuses is refused with its own message."""
        base = self.base_model() if self.model_preset is not None else None
        return from_mapping(self.flat_keys(), model=base)

    def exclusion_problem(self) -> str | None:
        """Why :attr:`excluded` does not hold for this run (None: it holds, or none is named)."""
        match self.excluded:
            case None:
                return None
            case ModernExclusion.KNOWN_REGRESSION:
                if not self.exclusion_reason:
                    return (
                        f"excluded = {self.excluded} needs an exclusion_reason quoting where the "
                        "source names the regression"
                    )
                return None
            case ModernExclusion.INCONSISTENT_LAYOUT:
                if self.exclusion_reason:
                    return (
                        "exclusion_reason is for known_regression; inconsistent_layout is "
                        "checked by its rule"
                    )
                d = self.data_parallel
                micro = self._size("micro_batch_size")
                if self.dp_table is None or self.dp_table == d:
                    return (
                        f"excluded = {self.excluded} needs a dp_table other than GPUs / (t x p "
                        f"x cp) = {d} (got {self.dp_table})"
                    )
                if micro < 1 or d < 1:
                    # the planner refuses such a layout by its own laws; not this rule's case
                    return (
                        f"excluded = {self.excluded} needs micro_batch_size >= 1 and d = GPUs / "
                        f"(t x p x cp) >= 1 (got {micro} and {d})"
                    )
                if self.global_batch_size % (micro * d) == 0:
                    return (
                        f"excluded = {self.excluded}, but global_batch_size = "
                        f"{self.global_batch_size} divides over micro_batch_size x d = "
                        f"{micro} x {d}: the run plans"
                    )
                return None
            case ModernExclusion.INCONSISTENT_EXPERT_GRID:
                if self.exclusion_reason:
                    return (
                        "exclusion_reason is for known_regression; inconsistent_expert_grid is "
                        "checked by its rule"
                    )
                if not any(note.startswith(INCONSISTENT_LAYOUT_NOTE) for note in self.notes):
                    return (
                        f"excluded = {self.excluded} needs the reference's note starting "
                        f"{INCONSISTENT_LAYOUT_NOTE!r}"
                    )
                ep = self._size("expert_model_parallel_size")
                # Megatron-LM's default expert_tensor_parallel_size is t (arguments.py)
                etp = (
                    self._size("expert_tensor_parallel_size")
                    if "expert_tensor_parallel_size" in self.strategy_keys
                    else self.tensor_parallel
                )
                grid = etp * ep * self.pipeline_parallel
                if self.num_gpus % grid == 0:
                    return (
                        f"excluded = {self.excluded}, but {self.num_gpus} GPUs hold etp x ep x p "
                        f"= {etp} x {ep} x {self.pipeline_parallel}: the expert grid fits"
                    )
                return None
            case _ as unreachable:
                assert_never(unreachable)

    def exclusion_message(self) -> str:
        """The table's note for an excluded run ("" for one that is compared)."""
        match self.excluded:
            case None:
                return ""
            case ModernExclusion.INCONSISTENT_LAYOUT:
                return f"excluded ({self.excluded}): the reference flags its layout inconsistent"
            case ModernExclusion.INCONSISTENT_EXPERT_GRID:
                return (
                    f"excluded ({self.excluded}): the reference flags its layout inconsistent; "
                    f"{self.num_gpus} GPUs cannot hold its expert grid"
                )
            case ModernExclusion.KNOWN_REGRESSION:
                return f"excluded ({self.excluded}): {self.exclusion_reason}"
            case _ as unreachable:
                assert_never(unreachable)

    def measured_iteration_time_s(self) -> float:
        """Seconds per iteration: from tokens/s per GPU when printed, else from model TFLOP/s
        under :attr:`flops_convention` (module docstring)."""
        tokens = self.global_batch_size * self.seq_length
        if self.measured.tokens_per_s_per_gpu is not None:
            return tokens / (self.measured.tokens_per_s_per_gpu * self.num_gpus)
        from dataclasses import replace

        from blueprinting.analysis.flops import implied_iteration_time_s, model_flops_per_iteration

        convention = self.flops_convention
        tflops = self.measured.model_tflops_per_gpu
        if convention is None or tflops is None:
            raise ConfigError([f"run {self.id!r} has neither tokens/s nor TFLOP/s + convention"])
        model = replace(self.base_model(), seq_length=self.seq_length)
        flops = model_flops_per_iteration(model, self.global_batch_size, convention)
        return implied_iteration_time_s(float(flops), self.num_gpus, tflops * 1e12)


def default_fixture_path() -> Path:
    """``tests/validation/fixtures/modern_runs.toml`` of the checkout this module is in."""
    return fixture_path("modern_runs.toml")


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------
def _measured(raw: Mapping[str, object], where: str, problems: ProblemCollector) -> ModernMeasured:
    unknown = sorted(set(raw) - set(MEASURED_KEYS))
    if unknown:
        problems.add(f"{where} has unknown keys: {', '.join(unknown)}")
    figures = {key: number_or_none(raw, key, where, problems) for key in MEASURED_KEYS}
    for key, value in figures.items():
        if value is not None and value <= 0:
            problems.add(f"{where}.{key} must be positive, got {value!r}")
    if all(value is None for value in figures.values()):
        problems.add(f"{where} reports no figure")
    return ModernMeasured(
        tokens_per_s_per_gpu=figures["tokens_per_s_per_gpu"],
        model_tflops_per_gpu=figures["model_tflops_per_gpu"],
    )


def _waived_rules(
    raw: Mapping[str, object], where: str, problems: ProblemCollector
) -> tuple[Law, ...]:
    """``waived_megatron_rules``: each the name of a Megatron-LM start-up rule (a
    :class:`Law` of the Megatron rule set), none twice; an unknown name gets a did-you-mean."""
    names = strings(raw, "waived_megatron_rules", where, problems)
    megatron = sorted(law.value for law in Law if law.ruleset is RuleSet.MEGATRON)
    laws: list[Law] = []
    for name in names:
        if name in megatron:
            laws.append(Law(name))
            continue
        close = difflib.get_close_matches(name, megatron, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.add(f"{where}.waived_megatron_rules: {name!r} is not a Megatron-LM rule{hint}")
    if len(set(names)) != len(names):
        problems.add(f"{where}.waived_megatron_rules names a rule twice: {list(names)}")
    return tuple(laws)


def _departures(
    raw: Mapping[str, object], where: str, problems: ProblemCollector
) -> tuple[ReferenceField, ...]:
    """``reference_departures``: each a :class:`ReferenceField`, none twice."""
    names = strings(raw, "reference_departures", where, problems)
    known = [field.value for field in ReferenceField]
    fields: list[ReferenceField] = []
    for name in names:
        if name in known:
            fields.append(ReferenceField(name))
        else:
            problems.add(f"{where}.reference_departures: {name!r} is not one of {', '.join(known)}")
    if len(set(names)) != len(names):
        problems.add(f"{where}.reference_departures names a field twice: {list(names)}")
    return tuple(fields)


def _run(raw: Mapping[str, object], where: str, problems: ProblemCollector) -> ModernRun | None:
    run_id = string(raw, "id", where, problems)
    where = f"run {run_id!r}" if run_id else where
    model_keys = flat_key_values(
        toml_table(raw.get("model"), f"{where}.model", problems), f"{where}.model", problems
    )
    strategy_keys = flat_key_values(
        toml_table(raw.get("strategy"), f"{where}.strategy", problems),
        f"{where}.strategy",
        problems,
    )
    both = sorted(set(model_keys) & set(strategy_keys))
    if both:
        problems.add(f"{where}: key(s) in both model and strategy: {', '.join(both)}")
    for key in ("tensor_model_parallel_size", "global_batch_size"):
        integer(strategy_keys, key, f"{where}.strategy", problems, fallback=1)
    # the degrees the row's data-parallel size is derived from (ModernRun.data_parallel), and
    # the global batch its microbatches are
    for key in (
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
        "global_batch_size",
    ):
        value = strategy_keys.get(key)
        if type(value) is int and value < 1:
            problems.add(f"{where}.strategy.{key} must be positive, got {value}")
    measured = _measured(
        toml_table(raw.get("measured"), f"{where}.measured", problems),
        f"{where}.measured",
        problems,
    )
    system = string(raw, "system", where, problems)
    # an empty name is a string too: refused here (every row is scored by its GPU generation)
    if isinstance(raw.get("system"), str) and system not in SYSTEM_GENERATIONS:
        problems.add(
            f"{where}.system {system!r} is not one of {', '.join(sorted(SYSTEM_GENERATIONS))}"
        )
    num_gpus = integer(raw, "num_gpus", where, problems, fallback=1)
    if num_gpus < 1:
        problems.add(f"{where}.num_gpus must be positive, got {num_gpus}")
    model_preset: str | None = None
    if raw.get("model_preset") is not None:
        model_preset = string(raw, "model_preset", where, problems) or None
    convention = enum_or_none(FlopsConvention, raw, "flops_convention", where, problems)
    if measured.tokens_per_s_per_gpu is None and (
        convention is None or model_preset is None or measured.model_tflops_per_gpu is None
    ):
        problems.add(
            f"{where}: without tokens_per_s_per_gpu the run needs model_tflops_per_gpu, "
            "a flops_convention and a model preset"
        )
    try:
        recipe = precision_recipe(strategy_keys)
    except ConfigError as error:
        for problem in error.problems:
            problems.add(f"{where}.strategy: {problem}")
        recipe = PrecisionRecipe.BF16
    dp_table = raw.get("dp_table")
    if dp_table is not None and type(dp_table) is not int:
        problems.add(f"{where}.dp_table must be an integer, got {dp_table!r}")
        dp_table = None
    source = enum_or_none(ModernSource, raw, "source", where, problems)
    if source is None:
        problems.add(f"{where}.source is required")
        return None
    run = ModernRun(
        id=run_id,
        source=source,
        provenance=string(raw, "provenance", where, problems),
        framework=string(raw, "framework", where, problems),
        system=system,
        gpu=string(raw, "gpu", where, problems),
        num_gpus=num_gpus,
        model_preset=model_preset,
        model_keys=MappingProxyType(model_keys),
        strategy_keys=MappingProxyType(strategy_keys),
        measured=measured,
        recipe=recipe,
        precision_stated=string(raw, "precision_stated", where, problems),
        flops_convention=convention,
        dp_table=dp_table if type(dp_table) is int else None,
        notes=strings(raw, "notes", where, problems),
        assumptions=strings(raw, "assumptions", where, problems),
        recipe_source=(
            string(raw, "recipe_source", where, problems) if "recipe_source" in raw else ""
        ),
        unkeyed_settings=strings(raw, "unkeyed_settings", where, problems),
        excluded=enum_or_none(ModernExclusion, raw, "excluded", where, problems),
        exclusion_reason=(
            string(raw, "exclusion_reason", where, problems) if "exclusion_reason" in raw else ""
        ),
        waived_megatron_rules=_waived_rules(raw, where, problems),
        waiver_reason=(
            string(raw, "waiver_reason", where, problems) if "waiver_reason" in raw else ""
        ),
        reference_departures=_departures(raw, where, problems),
        departure_reason=(
            string(raw, "departure_reason", where, problems) if "departure_reason" in raw else ""
        ),
    )
    if bool(run.reference_departures) != bool(run.departure_reason):
        problems.add(
            f"{where}: reference_departures and departure_reason go together (the field and the "
            "primary source that contradicts the reference)"
        )
    if run.waived_megatron_rules and not run.waiver_reason:
        problems.add(f"{where}: waived_megatron_rules needs a waiver_reason (who skips the rule)")
    if run.exclusion_reason and run.excluded is None:
        problems.add(f"{where}: exclusion_reason without excluded")
    if run.waiver_reason and not run.waived_megatron_rules:
        problems.add(f"{where}: waiver_reason without waived_megatron_rules")
    if run.waived_megatron_rules and run_id and not problems.problems:
        # a waiver that no longer matches the run is the fixture's error, not a refusal
        try:
            check_waiver(run, run.training_spec())
        except (ConfigError, InvalidStrategyError) as error:
            problems.add(f"{where}: waived_megatron_rules do not match: {planner_message(error)}")
    exclusion = run.exclusion_problem()
    if exclusion is not None:
        problems.add(f"{where}: {exclusion}")
    return run if run_id else None


def load_modern_runs(path: Path | None = None) -> tuple[ModernRun, ...]:
    """Read the fixture (default :func:`default_fixture_path`), reporting every problem at once."""
    source = path if path is not None else default_fixture_path()
    problems = ProblemCollector(source=str(source))
    runs = run_tables(source, "modern runs", problems, _run)
    problems.raise_if_any()
    return tuple(runs)


# --------------------------------------------------------------------------------------------
# Predictions
# --------------------------------------------------------------------------------------------
#: A run -> its predicted iteration time in seconds; a :class:`BlueprintingError` means "not
#: planned", with its message.
ModernPredictor = Callable[[ModernRun], float]


def planner_message(error: BlueprintingError) -> str:
    """The planner's own words, on one line: every problem or violated law."""
    if isinstance(error, ConfigError):
        return "; ".join(error.problems)
    if isinstance(error, InvalidStrategyError):
        return "; ".join(str(violation) for violation in error.violations)
    return " ".join(str(error).split())


def check_waiver(run: ModernRun, spec: TrainingSpec) -> None:
    """Raise unless the Megatron-LM rules ``spec`` breaks are exactly the run's
    ``waived_megatron_rules``: a broken rule not waived is the planner's refusal
    (:class:`InvalidStrategyError`), a waived rule not broken a fixture error
    (:class:`ConfigError`). The planner's own laws are never waived (the plan checks them)."""
    from blueprinting.hardware.presets import system_preset
    from blueprinting.mapping.laws import check_training

    violations = check_training(
        spec.model,
        spec.mapping,
        megatron=True,
        accelerator=system_preset(run.system).accelerator.support,
    )
    broken = {v.law for v in violations if v.ruleset is RuleSet.MEGATRON}
    waived = set(run.waived_megatron_rules)
    unexpected = [v for v in violations if v.ruleset is RuleSet.MEGATRON and v.law not in waived]
    if unexpected:
        raise InvalidStrategyError(unexpected, subject=f"{spec.model.name}: {spec.mapping}")
    unused = sorted(waived - broken)
    if unused:
        raise ConfigError(
            [f"run {run.id!r}: waived Megatron-LM rule(s) not broken: {', '.join(unused)}"]
        )


def api_modern_predictor(plans: PlanCache | None = None) -> ModernPredictor:
    """A predictor backed by ``blueprinting.api.plan_spec`` (the plan's default options), on the
    run's system preset: ``plan --json``'s ``iteration_time_s``, through ``plans`` (a new cache
    when None).

    Raises :class:`UnsupportedError` (with the reason) when the cost model is not installed.
    """
    from blueprinting.validation.predictor import PlanCache

    cache = PlanCache() if plans is None else plans

    def predict(run: ModernRun) -> float:
        spec = run.training_spec()
        if run.waived_megatron_rules:
            check_waiver(run, spec)
        values = cache.values(spec, run.system, megatron_rules=not run.waived_megatron_rules)
        time = values.get("iteration_time_s")
        if isinstance(time, bool) or not isinstance(time, int | float):
            raise UnsupportedError(f"plan report of {run.id!r} has no iteration_time_s")
        return float(time)

    return predict


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ModernRow:
    """One run: its layout, measured and predicted iteration time (s), or why it is not
    planned (``not_planned``: the planner's message; empty when planned)."""

    run_id: str
    source: ModernSource
    model: str
    system: str
    generation: GpuGeneration
    num_gpus: int
    tensor_parallel: int
    pipeline_parallel: int
    context_parallel: int
    data_parallel: int
    recipe: PrecisionRecipe
    measured_s: float
    predicted_s: float | None
    not_planned: str = ""
    #: The run's ``waived_megatron_rules`` (planned without them).
    waived_megatron_rules: tuple[str, ...] = ()
    #: The NeMo container the run was measured in (:func:`software_release`); None: unstated.
    release: str | None = None

    @property
    def planned(self) -> bool:
        return self.predicted_s is not None

    @property
    def note(self) -> str:
        """The planner's message where not planned; the waived Megatron-LM rules where planned
        without them; else empty."""
        if not self.planned or not self.waived_megatron_rules:
            return self.not_planned
        return "planned without Megatron-LM's " + ", ".join(self.waived_megatron_rules)

    @property
    def relative_error(self) -> float | None:
        """(predicted - measured) / measured; ``None`` when not planned."""
        if self.predicted_s is None:
            return None
        return (self.predicted_s - self.measured_s) / self.measured_s


class SummaryAxis(StrEnum):
    """How the error summaries split the rows."""

    ALL = "all"
    GENERATION = "generation"
    RECIPE = "recipe"
    RELEASE = "release"


class GateKind(StrEnum):
    """What an iteration-time gate measures (the dense runs' and the MoE runs' share them)."""

    MEDIAN_ERROR = "median_error"
    MAX_ERROR = "max_error"
    ALL_PLANNED = "all_planned"


class ScoredRow(Protocol):
    """What the summaries and gates read of a scored run."""

    @property
    def run_id(self) -> str: ...

    @property
    def planned(self) -> bool: ...

    @property
    def relative_error(self) -> float | None: ...


AxisT = TypeVar("AxisT", bound=StrEnum)
GateT = TypeVar("GateT", bound=StrEnum)
RowT = TypeVar("RowT", bound=ScoredRow)


@final
# no slots: a slotted dataclass is a new class object, which a Generic frozen dataclass
# trips over on Python 3.11 (TypeError from super(); cpython gh-90562)
@dataclass(frozen=True, kw_only=True)
class ErrorSummary(Generic[AxisT]):
    """|relative error| over the planned rows of one group; ``None`` when none is planned."""

    axis: AxisT
    group: str
    rows: int
    planned: int
    median_abs_error: float | None
    max_abs_error: float | None
    mean_error: float | None


def error_summary(axis: AxisT, group: str, rows: Sequence[ScoredRow]) -> ErrorSummary[AxisT]:
    errors = [error for row in rows if (error := row.relative_error) is not None]
    magnitudes = [abs(error) for error in errors]
    return ErrorSummary(
        axis=axis,
        group=group,
        rows=len(rows),
        planned=len(errors),
        median_abs_error=statistics.median(magnitudes) if magnitudes else None,
        max_abs_error=max(magnitudes) if magnitudes else None,
        mean_error=statistics.fmean(errors) if errors else None,
    )


class ModernGate(StrEnum):
    """The issue 12 item 7 gates."""

    MEDIAN_ERROR = "iteration time: median |error| (planned rows)"
    MAX_ERROR = "iteration time: max |error| (planned rows)"
    ALL_PLANNED = "every dense row planned"


@final
# no slots: a slotted dataclass is a new class object, which a Generic frozen dataclass
# trips over on Python 3.11 (TypeError from super(); cpython gh-90562)
@dataclass(frozen=True, kw_only=True)
class GateResult(Generic[GateT]):
    """``value``: the median or max |error| over ``count`` planned rows, or (ALL_PLANNED) the
    fraction of rows planned; ``failing``: the rows breaking it; ``gate`` names it."""

    gate: GateT
    kind: GateKind
    count: int
    value: float | None
    limit: float
    failing: tuple[str, ...]
    #: The least value any predictor reading only the runs' inputs reaches (MAX_ERROR gates;
    #: :mod:`blueprinting.validation.attainable`), None where not derived.
    floor: ErrorFloor | None = None

    @property
    def attainable(self) -> bool:
        """False where :attr:`floor` shows that no predictor can pass the gate on these rows."""
        return self.floor is None or self.floor.value <= self.limit

    @property
    def passed(self) -> bool:
        if self.count == 0 or self.value is None:
            return False
        match self.kind:
            case GateKind.MEDIAN_ERROR:
                return self.value <= self.limit
            case GateKind.MAX_ERROR:
                return self.value <= self.limit and not self.failing
            case GateKind.ALL_PLANNED:
                return self.value >= self.limit and not self.failing
            case _ as unreachable:
                assert_never(unreachable)


ModernGateResult = GateResult[ModernGate]


def iteration_gates(
    rows: Sequence[ScoredRow],
    names: tuple[GateT, GateT, GateT],
    *,
    median_limit: float,
    max_limit: float,
    max_floor: ErrorFloor | None = None,
) -> tuple[GateResult[GateT], GateResult[GateT], GateResult[GateT]]:
    """The median and max |error| over the planned rows and the share of rows planned, named
    ``names`` (median, max, all planned); ``max_floor`` is the max gate's floor
    (:func:`planned_floor`)."""
    planned = [row for row in rows if row.planned]
    magnitudes = {row.run_id: abs(row.relative_error or 0.0) for row in planned}
    median_name, max_name, all_name = names
    return (
        GateResult(
            gate=median_name,
            kind=GateKind.MEDIAN_ERROR,
            count=len(planned),
            value=statistics.median(magnitudes.values()) if magnitudes else None,
            limit=median_limit,
            failing=(),
        ),
        GateResult(
            gate=max_name,
            kind=GateKind.MAX_ERROR,
            count=len(planned),
            value=max(magnitudes.values()) if magnitudes else None,
            limit=max_limit,
            failing=tuple(run_id for run_id, error in magnitudes.items() if error > max_limit),
            floor=max_floor,
        ),
        GateResult(
            gate=all_name,
            kind=GateKind.ALL_PLANNED,
            count=len(rows),
            value=len(planned) / len(rows) if rows else None,
            limit=1.0,
            failing=tuple(row.run_id for row in rows if not row.planned),
        ),
    )


@final
# no slots: a slotted dataclass is a new class object, which a Generic frozen dataclass
# trips over on Python 3.11 (TypeError from super(); cpython gh-90562)
@dataclass(frozen=True, kw_only=True)
class IterationValidation(Generic[RowT, AxisT, GateT]):
    """Scored rows, their error summaries and their gates."""

    rows: tuple[RowT, ...]
    summaries: tuple[ErrorSummary[AxisT], ...]
    gates: tuple[GateResult[GateT], ...]

    @property
    def passed(self) -> bool:
        return all(result.passed for result in self.gates)

    @property
    def planned_rows(self) -> tuple[RowT, ...]:
        return tuple(row for row in self.rows if row.planned)

    @property
    def not_planned_rows(self) -> tuple[RowT, ...]:
        return tuple(row for row in self.rows if not row.planned)

    def gate(self, gate: GateT) -> GateResult[GateT]:
        return next(result for result in self.gates if result.gate is gate)


ModernValidation = IterationValidation[ModernRow, SummaryAxis, ModernGate]


def release_groups(
    rows: Sequence[RowT], release: Callable[[RowT], str | None]
) -> list[tuple[str, list[RowT]]]:
    """``rows`` grouped by their container release, oldest first, the rows naming none last
    (:data:`UNSTATED_RELEASE`): the split that shows the error against the software's age.
    Where the error moves with the release, the recipes of that release may be what moved
    (docs/VALIDATION.md, Stop 39: the same inputs measured in several containers mostly move
    by 0-5%)."""
    named = sorted({r for row in rows if (r := release(row)) is not None}, key=release_order)
    groups = [(name, [row for row in rows if release(row) == name]) for name in named]
    unstated = [row for row in rows if release(row) is None]
    return groups + ([(UNSTATED_RELEASE, unstated)] if unstated else [])


def summarise(rows: Sequence[ModernRow]) -> tuple[ErrorSummary[SummaryAxis], ...]:
    """All rows, then per GPU generation, then per precision recipe (each in its enum's order),
    then per container release (:func:`release_groups`); groups without rows are left out."""
    out = [error_summary(SummaryAxis.ALL, "all", rows)]
    for generation in GpuGeneration:
        members = [row for row in rows if row.generation is generation]
        if members:
            out.append(error_summary(SummaryAxis.GENERATION, generation.value, members))
    for recipe in PrecisionRecipe:
        members = [row for row in rows if row.recipe is recipe]
        if members:
            out.append(error_summary(SummaryAxis.RECIPE, recipe.value, members))
    for name, members in release_groups(rows, lambda row: row.release):
        out.append(error_summary(SummaryAxis.RELEASE, name, members))
    return tuple(out)


def planned_floor(scored: Iterable[tuple[ModernRun, ModernRow]]) -> ErrorFloor | None:
    """The floor of the max-|error| gate over the planned rows of ``scored`` (run, its row):
    runs with equal inputs (:attr:`ModernRun.inputs`) get one prediction; None where no row is
    planned."""
    return max_error_floor(
        MeasuredInput(run_id=row.run_id, inputs=run.inputs, measured_s=row.measured_s)
        for run, row in scored
        if row.planned
    )


def _gates(rows: Sequence[ModernRow], floor: ErrorFloor | None) -> tuple[ModernGateResult, ...]:
    return iteration_gates(
        rows,
        (ModernGate.MEDIAN_ERROR, ModernGate.MAX_ERROR, ModernGate.ALL_PLANNED),
        median_limit=MEDIAN_ERROR_LIMIT,
        max_limit=MAX_ERROR_LIMIT,
        max_floor=floor,
    )


def score_modern_runs(predict: ModernPredictor, runs: Sequence[ModernRun]) -> tuple[ModernRow, ...]:
    """One row per run, in order: ``predict``'s iteration time, or why it has none (an excluded
    run's reason; a :class:`BlueprintingError` raised for a run leaves it not planned, with the
    planner's message). The dense and MoE sections both score through it."""
    rows: list[ModernRow] = []
    for run in runs:
        predicted: float | None
        if run.excluded is not None:
            predicted = None
            message = run.exclusion_message()
        else:
            try:
                predicted = predict(run)
                message = ""
            except BlueprintingError as error:
                predicted = None
                message = planner_message(error)
        rows.append(
            ModernRow(
                run_id=run.id,
                source=run.source,
                model=run.model_name,
                system=run.system,
                generation=run.generation,
                num_gpus=run.num_gpus,
                tensor_parallel=run.tensor_parallel,
                pipeline_parallel=run.pipeline_parallel,
                context_parallel=run.context_parallel,
                data_parallel=run.data_parallel,
                recipe=run.recipe,
                measured_s=run.measured_iteration_time_s(),
                predicted_s=predicted,
                not_planned=message,
                waived_megatron_rules=tuple(str(law) for law in run.waived_megatron_rules),
                release=run.release,
            )
        )
    return tuple(rows)


def compare_modern_runs(
    predict: ModernPredictor, runs: Sequence[ModernRun] | None = None
) -> ModernValidation:
    """Score ``predict`` on ``runs`` (default: the fixture; :func:`score_modern_runs`), then the
    summaries and the issue 12 gates."""
    chosen = load_modern_runs() if runs is None else runs
    rows = score_modern_runs(predict, chosen)
    # Excluded rows stay in the table and the summaries' row counts, outside the gates.
    compared = [(run, row) for run, row in zip(chosen, rows, strict=True) if run.excluded is None]
    return ModernValidation(
        rows=rows,
        summaries=summarise(rows),
        gates=_gates([row for _, row in compared], planned_floor(compared)),
    )


class GateJson(Protocol):
    """What a gate result of any validation section shows in ``validate --json``."""

    @property
    def gate(self) -> StrEnum: ...
    @property
    def count(self) -> int: ...
    @property
    def value(self) -> float | None: ...
    @property
    def limit(self) -> float: ...
    @property
    def failing(self) -> tuple[str, ...]: ...
    @property
    def passed(self) -> bool: ...
    @property
    def floor(self) -> ErrorFloor | None: ...


def gates_json(results: Sequence[GateJson]) -> list[dict[str, object]]:
    """The ``gates`` list of a ``validate --json`` section (memory, modern, MoE).
    ``attainable_floor`` is the least value any predictor reading only the runs' inputs reaches
    (null where none is derived), ``floor_runs`` the runs that set it and
    ``floor_prediction_s`` the prediction that attains it on them."""
    return [
        {
            "name": str(result.gate),
            "count": result.count,
            "value": result.value,
            "limit": result.limit,
            "failing": list(result.failing),
            "passed": result.passed,
            "attainable_floor": None if result.floor is None else result.floor.value,
            "floor_runs": [] if result.floor is None else list(result.floor.runs),
            "floor_prediction_s": None if result.floor is None else result.floor.prediction_s,
        }
        for result in results
    ]


def summaries_json(summaries: Sequence[ErrorSummary[Any]]) -> list[dict[str, object]]:
    """The ``summaries`` list of the modern and MoE sections."""
    return [
        {
            "axis": str(summary.axis),
            "group": summary.group,
            "rows": summary.rows,
            "planned": summary.planned,
            "median_abs_error": summary.median_abs_error,
            "max_abs_error": summary.max_abs_error,
            "mean_error": summary.mean_error,
        }
        for summary in summaries
    ]


def modern_row_json(row: ModernRow, grid: Mapping[str, object] | None = None) -> dict[str, object]:
    """One row of the modern or MoE section; ``grid``: the MoE row's expert grid, written after
    the dense layout."""
    return {
        "run": row.run_id,
        "source": str(row.source),
        "model": row.model,
        "system": row.system,
        "generation": str(row.generation),
        "gpus": row.num_gpus,
        "t": row.tensor_parallel,
        "p": row.pipeline_parallel,
        "cp": row.context_parallel,
        "d": row.data_parallel,
        **(grid or {}),
        "recipe": str(row.recipe),
        "release": row.release,
        "measured_iteration_time_s": row.measured_s,
        "predicted_iteration_time_s": row.predicted_s,
        "relative_error": row.relative_error,
        "planned": row.planned,
        "not_planned": row.not_planned,
        "waived_megatron_rules": list(row.waived_megatron_rules),
    }


def modern_to_json_dict(validation: ModernValidation) -> dict[str, object]:
    """The ``modern`` object of ``blueprinting validate --json`` (seconds; errors as fractions)."""
    return {
        "passed": validation.passed,
        "gates": gates_json(validation.gates),
        "summaries": summaries_json(validation.summaries),
        "rows": [modern_row_json(row) for row in validation.rows],
        "planned_runs": len(validation.planned_rows),
        "not_planned_runs": len(validation.not_planned_rows),
    }
