"""A sweep's definition: the grid (models x systems x GPU counts x global batches x sequence
lengths), the search options every cell shares, and the per-system prices; read from a SWEEP.toml
or from flags, and validated in full before any engine starts.

A SWEEP.toml holds the same names as the flags, with underscores::

    model = ["gpt3-175b", "llama3-70b"]      # model presets
    system = ["dgx-h100", "dgx-b200"]        # system presets
    gpus = [256, 512, 1024]
    global_batch = [1024, 2048]
    seq_length = [4096]                      # optional: each model's preset length
    train_tokens = 15_000_000_000_000        # optional (search's default: 300B)
    memory_headroom_gib = 0.0                # optional search options ...
    max_micro_batch = 8
    allow_cross_node_tp = false
    megatron_rules = true
    flops_convention = "megatron-legacy"

    [price]                                  # USD per GPU-hour, per system (optional)
    dgx-h100 = 2.5

A grid key given as a single value is a one-element list. Every problem (an unknown key or
preset, an empty list, a repeated value, a non-positive count, a cell whose search space is over
``MAX_SEARCH_ROWS``) is reported at once as one :class:`ConfigError`.

Precision is a search option, not a grid axis: ``precision = ["bf16", "fp8-tensorwise"]`` is
``search --precision`` for every cell (each cell's best strategy names its recipe); a recipe a
listed system cannot run is refused up front (``precision_recipe_accelerator``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from itertools import product
from pathlib import Path
from typing import final

from blueprinting.analysis.flops import FlopsConvention
from blueprinting.errors import ConfigError, positive_int_problem
from blueprinting.limits import MAX_SEARCH_ROWS, MAX_SWEEP_CELLS
from blueprinting.mapping.pipeline_layout import PipelineLayouts
from blueprinting.mapping.precision import HighPrecision, PrecisionChoice, TrainingPrecision
from blueprinting.mapping.presets import MODEL_PRESETS, did_you_mean

#: --memory-headroom-gib above this (2**33 GiB, 9.2 EB) is no headroom any GPU has (as search).
MAX_HEADROOM_GIB = 2.0**33

#: The grid's keys, in the order cells are enumerated (the first varies slowest).
GRID_KEYS = ("model", "system", "gpus", "global_batch", "seq_length")
OPTION_KEYS = (
    "train_tokens",
    "memory_headroom_gib",
    "max_micro_batch",
    "allow_cross_node_tp",
    "megatron_rules",
    "flops_convention",
    "precision",
    "pipeline_layouts",
)
KNOWN_KEYS = (*GRID_KEYS, *OPTION_KEYS, "price")

#: Problems listed one by one before the rest are counted ("and N more").
MAX_LISTED_PROBLEMS = 20


class PlotMetric(StrEnum):
    """What the per-model panels of ``--plot`` show against the GPU count."""

    TOKENS_PER_SECOND = "tokens-per-second"
    COST = "cost"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """One point of the grid: one full search. ``seq_length`` is the resolved length (the
    preset's unless the sweep lists lengths)."""

    model: str
    system: str
    gpus: int
    global_batch: int
    seq_length: int

    @property
    def key(self) -> str:
        """The identity the output folder records (what resume compares)."""
        return f"{self.model}|{self.system}|{self.gpus}|{self.global_batch}|{self.seq_length}"

    def __str__(self) -> str:
        return f"{self.model} {self.system} N={self.gpus} B={self.global_batch} s={self.seq_length}"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CellSearchOptions:
    """The ``blueprinting search`` options every cell uses (same meanings and defaults).

    There is no objective: a cell has one GPU count and one global batch, for which iteration
    time, tokens/s, time-to-train and GPU-hours rank alike (``search/rank.py``)."""

    train_tokens: int
    memory_headroom_gib: float = 0.0
    max_micro_batch: int | None = None
    allow_cross_node_tp: bool = False
    megatron_rules: bool = True
    flops_convention: FlopsConvention = FlopsConvention.MEGATRON_LEGACY
    #: ``search --precision``: the recipes every cell's search crosses (empty: the model's
    #: datatype only); the best strategy of a cell names its recipe in its strategy text.
    precision: tuple[PrecisionChoice, ...] = ()
    #: ``search --pipeline-layouts``: the stage layouts every cell's search enumerates
    pipeline_layouts: PipelineLayouts = PipelineLayouts.EVEN

    def to_json(self) -> dict[str, int | float | bool | str | None]:
        out: dict[str, int | float | bool | str | None] = {
            "train_tokens": self.train_tokens,
            "memory_headroom_gib": self.memory_headroom_gib,
            "max_micro_batch": self.max_micro_batch,
            "allow_cross_node_tp": self.allow_cross_node_tp,
            "megatron_rules": self.megatron_rules,
            "flops_convention": str(self.flops_convention),
            "precision": " ".join(c.value for c in self.precision) or None,
        }
        # written only when not the default: a folder of an earlier version (whose manifest
        # has no such key) resumes under the default
        if self.pipeline_layouts is not PipelineLayouts.EVEN:
            out["pipeline_layouts"] = str(self.pipeline_layouts)
        return out

    @property
    def recipes(self) -> tuple[TrainingPrecision, ...]:
        """The search's ``SearchSpace.precision``."""
        if not self.precision:
            return (HighPrecision(),)
        out: list[TrainingPrecision] = []
        for choice in self.precision:
            if choice.precision not in out:
                out.append(choice.precision)
        return tuple(out)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SweepDefinition:
    """A validated sweep (build it with :func:`definition_from_mapping`)."""

    models: tuple[str, ...]
    systems: tuple[str, ...]
    gpus: tuple[int, ...]
    global_batches: tuple[int, ...]
    seq_lengths: tuple[int, ...] | None
    """None: each model at its preset's ``seq_length``."""
    options: CellSearchOptions
    prices: tuple[tuple[str, float], ...] = ()
    """USD per GPU-hour by system; a system without one gets no cost."""

    def cells(self) -> tuple[Cell, ...]:
        return tuple(
            Cell(model=model, system=system, gpus=n, global_batch=b, seq_length=s)
            for model in self.models
            for system in self.systems
            for n in self.gpus
            for b in self.global_batches
            for s in self._lengths(model)
        )

    def _lengths(self, model: str) -> tuple[int, ...]:
        if self.seq_lengths is None:
            return (MODEL_PRESETS[model].seq_length,)
        return self.seq_lengths

    def price(self, system: str) -> float | None:
        return dict(self.prices).get(system)


# --------------------------------------------------------------------------------------------
# Reading and validation
# --------------------------------------------------------------------------------------------
def _as_list(key: str, value: object, problems: list[str]) -> list[object] | None:
    if isinstance(value, list):
        if not value:
            problems.append(f"{key} must not be an empty list")
            return None
        return value
    return [value]


def _no_repeats(key: str, values: list[object], problems: list[str]) -> None:
    seen: list[object] = []
    for value in values:
        if value in seen:
            problems.append(f"{key} lists {value!r} more than once")
        else:
            seen.append(value)


def _names(
    key: str, value: object, choices: tuple[str, ...], kind: str, problems: list[str]
) -> tuple[str, ...]:
    values = _as_list(key, value, problems)
    if values is None:
        return ()
    names: list[str] = []
    for i, item in enumerate(values):
        if not isinstance(item, str):
            problems.append(f"{key}[{i}] must be a {kind} name (a string), got {item!r}")
        elif item not in choices:
            problems.append(f"{key}[{i}]: unknown {kind} {item!r}{did_you_mean(item, choices)}")
        else:
            names.append(item)
    _no_repeats(key, values, problems)
    return tuple(names)


def _counts(key: str, value: object, problems: list[str]) -> tuple[int, ...]:
    values = _as_list(key, value, problems)
    if values is None:
        return ()
    counts: list[int] = []
    for i, item in enumerate(values):
        problem = positive_int_problem(f"{key}[{i}]", item)
        if problem is None:
            assert isinstance(item, int)
            counts.append(item)
        else:
            problems.append(problem)
    _no_repeats(key, values, problems)
    return tuple(counts)


def _bool(data: Mapping[str, object], key: str, default: bool, problems: list[str]) -> bool:
    value = data.get(key, default)
    if isinstance(value, bool):
        return value
    problems.append(f"{key} must be true or false, got {value!r}")
    return default


def _options(data: Mapping[str, object], problems: list[str]) -> CellSearchOptions:
    from blueprinting.search.rank import DEFAULT_TRAIN_TOKENS

    train_tokens = data.get("train_tokens", DEFAULT_TRAIN_TOKENS)
    problem = positive_int_problem("train_tokens", train_tokens)
    if problem is not None:
        problems.append(problem)
        train_tokens = DEFAULT_TRAIN_TOKENS
    headroom = data.get("memory_headroom_gib", 0.0)
    if isinstance(headroom, bool) or not isinstance(headroom, int | float):
        problems.append(f"memory_headroom_gib must be a number, got {headroom!r}")
        headroom = 0.0
    elif not 0 <= headroom < MAX_HEADROOM_GIB:  # NaN fails both
        problems.append(
            f"memory_headroom_gib must be >= 0 and below {MAX_HEADROOM_GIB:g}, got {headroom}"
        )
        headroom = 0.0
    micro = data.get("max_micro_batch")
    if micro is not None and (problem := positive_int_problem("max_micro_batch", micro)):
        problems.append(problem)
        micro = None
    convention_text = data.get("flops_convention", str(FlopsConvention.MEGATRON_LEGACY))
    choices = tuple(str(c) for c in FlopsConvention)
    if convention_text in choices:
        convention = FlopsConvention(convention_text)
    else:
        hint = did_you_mean(str(convention_text), choices)
        problems.append(
            f"flops_convention: unknown convention {convention_text!r}{hint}; "
            f"choices: {', '.join(choices)}"
        )
        convention = FlopsConvention.MEGATRON_LEGACY
    assert isinstance(train_tokens, int)
    assert micro is None or isinstance(micro, int)
    recipes: list[PrecisionChoice] = []
    raw = data.get("precision")
    for name in [] if raw is None else raw if isinstance(raw, list) else [raw]:
        known = tuple(c.value for c in PrecisionChoice)
        if not isinstance(name, str) or name not in known:
            problems.append(
                f"precision: unknown recipe {name!r}{did_you_mean(str(name), known)}; "
                f"recipes: {', '.join(known)}"
            )
        elif PrecisionChoice(name) in recipes:
            problems.append(f"precision: {name} is listed twice")
        else:
            recipes.append(PrecisionChoice(name))
    layouts_text = data.get("pipeline_layouts", str(PipelineLayouts.EVEN))
    layouts = PipelineLayouts.EVEN
    if layouts_text in tuple(str(x) for x in PipelineLayouts):
        layouts = PipelineLayouts(layouts_text)
    else:
        known = tuple(str(x) for x in PipelineLayouts)
        problems.append(
            f"pipeline_layouts: {layouts_text!r} is not one of {', '.join(known)}"
            f"{did_you_mean(str(layouts_text), known)}"
        )
    return CellSearchOptions(
        train_tokens=train_tokens,
        memory_headroom_gib=float(headroom),
        max_micro_batch=micro,
        allow_cross_node_tp=_bool(data, "allow_cross_node_tp", False, problems),
        megatron_rules=_bool(data, "megatron_rules", True, problems),
        flops_convention=convention,
        precision=tuple(recipes),
        pipeline_layouts=layouts,
    )


def _prices(
    value: object, systems: tuple[str, ...], problems: list[str]
) -> tuple[tuple[str, float], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        problems.append(f"price must be a table of system = USD per GPU-hour, got {value!r}")
        return ()
    prices: list[tuple[str, float]] = []
    for system, price in value.items():
        if system not in systems:
            hint = did_you_mean(str(system), systems)
            problems.append(f"price[{system!r}]: {system!r} is not a system of the sweep{hint}")
        elif (
            isinstance(price, bool)
            or not isinstance(price, int | float)
            or not math.isfinite(price)
            or price < 0
        ):
            problems.append(
                f"price[{system!r}] must be a finite number >= 0 (USD per GPU-hour), got {price!r}"
            )
        else:
            prices.append((str(system), float(price)))
    return tuple(prices)


def _space_problems(definition: SweepDefinition) -> list[str]:
    """Cells whose search space ``enumerate_strategies`` would refuse by its size bound alone
    (``space_rows``, divisor counts: cheap even for 10^5 cells)."""
    from blueprinting.hardware.presets import system_preset
    from blueprinting.search.space import SearchSpace, space_rows

    problems: list[str] = []
    per_node = {name: system_preset(name).gpus_per_node for name in definition.systems}
    for model_name, system_name, n, b in product(
        definition.models, definition.systems, definition.gpus, definition.global_batches
    ):
        model = MODEL_PRESETS[model_name]
        space = SearchSpace(
            gpu_counts=(n,),
            global_batch_size=b,
            gpus_per_node=per_node[system_name],
            allow_cross_node_tp=definition.options.allow_cross_node_tp,
            megatron_rules=definition.options.megatron_rules,
            max_microbatch_size=definition.options.max_micro_batch,
            precision=definition.options.recipes,
            pipeline_layouts=definition.options.pipeline_layouts,
        )
        rows = space_rows(model, space)
        if rows > MAX_SEARCH_ROWS:
            problems.append(
                f"cell {model_name} {system_name} N={n} B={b}: the search space has {rows:,} "
                f"law-relevant rows, over the limit of {MAX_SEARCH_ROWS:,} (MAX_SEARCH_ROWS); "
                "set max_micro_batch or choose a GPU count or batch with fewer divisors"
            )
    return problems


def _listed(problems: list[str]) -> list[str]:
    if len(problems) <= MAX_LISTED_PROBLEMS:
        return problems
    extra = len(problems) - MAX_LISTED_PROBLEMS
    return [*problems[:MAX_LISTED_PROBLEMS], f"... and {extra:,} more"]


def definition_from_mapping(data: Mapping[str, object], *, source: str) -> SweepDefinition:
    """The sweep ``data`` describes (a SWEEP.toml's table, or flags merged over it);
    :class:`ConfigError` naming every problem otherwise."""
    from blueprinting.hardware.presets import SYSTEM_PRESETS

    problems: list[str] = []
    for key in data:
        if key not in KNOWN_KEYS:
            problems.append(f"unknown key {key!r}{did_you_mean(str(key), KNOWN_KEYS)}")
    for key in ("model", "system", "gpus", "global_batch"):
        if key not in data:
            problems.append(f"{key} is required (a list)")
    models = _names("model", data.get("model", []), tuple(MODEL_PRESETS), "model", problems)
    systems = _names("system", data.get("system", []), tuple(SYSTEM_PRESETS), "system", problems)
    gpus = _counts("gpus", data.get("gpus", []), problems)
    batches = _counts("global_batch", data.get("global_batch", []), problems)
    lengths = _counts("seq_length", data["seq_length"], problems) if "seq_length" in data else None
    options = _options(data, problems)
    prices = _prices(data.get("price"), systems, problems)
    if problems:
        raise ConfigError(_listed(problems), source=source)
    definition = SweepDefinition(
        models=models,
        systems=systems,
        gpus=gpus,
        global_batches=batches,
        seq_lengths=lengths,
        options=options,
        prices=prices,
    )
    cells = len(models) * len(systems) * len(gpus) * len(batches) * len(lengths or (1,))
    if cells > MAX_SWEEP_CELLS:
        raise ConfigError(
            [
                f"the grid has {cells:,} cells, over the limit of {MAX_SWEEP_CELLS:,} "
                "(MAX_SWEEP_CELLS)"
            ],
            source=source,
        )
    space = _precision_problems(definition) + _space_problems(definition)
    if space:
        raise ConfigError(_listed(space), source=source)
    return definition


def _precision_problems(definition: SweepDefinition) -> list[str]:
    """Each recipe a listed system cannot run (``precision_recipe_accelerator``, the search's
    own refusal, said before Ray starts) and each base datatype that is not a listed model's."""
    from blueprinting.hardware.presets import system_preset
    from blueprinting.mapping.model import Datatype
    from blueprinting.mapping.precision_laws import accelerator_violation

    problems: list[str] = []
    base = {PrecisionChoice.BF16: Datatype.BF16, PrecisionChoice.FP16: Datatype.FP16}
    for choice in definition.options.precision:
        if choice in base:
            problems += [
                f"precision {choice}: model {name} is {MODEL_PRESETS[name].datatype.value}; a "
                "base datatype is the model's, not a recipe"
                for name in definition.models
                if MODEL_PRESETS[name].datatype is not base[choice]
            ]
            continue
        if not definition.options.megatron_rules:
            continue
        for name in definition.systems:
            violation = accelerator_violation(
                choice.precision, system_preset(name).accelerator.support
            )
            if violation is not None:
                problems.append(f"precision {choice} on {name}: {violation.message}")
    return problems


def read_sweep_file(path: Path) -> dict[str, object]:
    """A SWEEP.toml's top-level table (not yet validated: see :func:`definition_from_mapping`)."""
    from blueprinting.mapping.documents import parse_toml, read_text

    data = parse_toml(read_text(path, what="sweep file"), str(path))
    if not isinstance(data, dict):  # tomllib always gives a table; kept for the type
        raise ConfigError(["a sweep file is a TOML table"], source=str(path))
    return data


def parse_price(text: str) -> tuple[str, float] | str:
    """``SYSTEM=USD_PER_GPU_HOUR`` as a pair, or the problem with it."""
    system, sep, value = text.partition("=")
    if not sep or not system:
        return f"--price {text!r}: expected SYSTEM=USD_PER_GPU_HOUR (e.g. dgx-h100=2.5)"
    try:
        return system, float(value)
    except ValueError:
        return f"--price {text!r}: {value!r} is not a number"
