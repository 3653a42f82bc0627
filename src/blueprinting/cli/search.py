"""``blueprinting search``: rank every legal strategy of a space by a model objective.

``blueprinting search --model gpt3-175b --system dgx-a100-80gb --gpus 1024 --global-batch 1536
[--top K] [--objective ...] [--json | --csv FILE] [--explain "tp=2 pp=16 ..."]``

Every figure uses the seed's contract bubble; the listed strategies are re-planned with the scalar
planner (``blueprinting plan``) and their JSON objects are that plan's.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import shlex
import sys
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, TextIO, assert_never, cast

from blueprinting.analysis.flops import FlopsConvention
from blueprinting.errors import ConfigError
from blueprinting.limits import (
    MAX_INT,
    MAX_SEARCH_LISTED,
    decimal_value,
    search_blocks_notice,
    search_candidates_notice,
    search_csv_notice,
)
from blueprinting.mapping.pipeline_layout import PipelineLayouts
from blueprinting.mapping.transformer import CpCommType, GradReduceDtype
from blueprinting.report.memory_table import GIB

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from blueprinting.analysis.report import IterationReport, JsonValue
    from blueprinting.mapping.model import TransformerModelSpec
    from blueprinting.mapping.precision import TrainingPrecision
    from blueprinting.mapping.transformer import TokenDispatcher, TransformerTrainingMappingSpec
    from blueprinting.search.rank import SearchResult, Standing


class TpCommOverlapChoice(StrEnum):
    """``--tp-comm-overlap``: which userbuffer overlaps (Transformer Engine's default
    switches) the sequence-parallel rows with t > 1 take."""

    OFF = "off"
    ON = "on"
    BOTH = "both"

    @property
    def values(self) -> tuple[bool, ...]:
        """``SearchSpace.tp_comm_overlap``."""
        match self:
            case TpCommOverlapChoice.OFF:
                return (False,)
            case TpCommOverlapChoice.ON:
                return (True,)
            case TpCommOverlapChoice.BOTH:
                return (False, True)
            case _ as unreachable:
                assert_never(unreachable)


#: --memory-headroom-gib above this (2**33 GiB, 9.2 EB) is no headroom any GPU has.
MAX_HEADROOM_GIB = 2.0**33


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from blueprinting.search.rank import DEFAULT_TRAIN_TOKENS, Objective

    parser.add_argument("--model", required=True, help="model preset")
    parser.add_argument("--system", default="dgx-a100-80gb", help="system preset (%(default)s)")
    parser.add_argument(
        "--gpus", type=int, nargs="+", required=True, help="GPU count(s) N to search over"
    )
    parser.add_argument("--global-batch", type=int, required=True, help="global batch size B")
    parser.add_argument(
        "--top", type=int, default=10, help="strategies listed (0: all; %(default)s)"
    )
    parser.add_argument(
        "--objective",
        choices=[str(o) for o in Objective],
        default=str(Objective.ITERATION_TIME),
        help="what to minimize (default: %(default)s)",
    )
    parser.add_argument(
        "--train-tokens",
        type=int,
        default=DEFAULT_TRAIN_TOKENS,
        help="tokens for time-to-train and gpu-hours (default: %(default)s)",
    )
    parser.add_argument(
        "--memory-headroom-gib",
        type=float,
        default=0.0,
        help="HBM to keep free per GPU, GiB (default: %(default)s)",
    )
    parser.add_argument(
        "--max-micro-batch", type=int, default=None, help="largest micro-batch size tried"
    )
    parser.add_argument(
        "--allow-cross-node-tp", action="store_true", help="let TP groups span nodes"
    )
    parser.add_argument(
        "--seq-length", type=int, default=None, help="sequence length (default: the preset's)"
    )
    parser.add_argument(
        "--context-parallel",
        nargs="+",
        default=["1"],
        metavar="CP",
        help="context-parallel degrees to try, or 'auto' for every divisor the laws allow "
        "(default: 1)",
    )
    parser.add_argument(
        "--expert-parallel",
        nargs="+",
        default=["auto"],
        metavar="EP",
        help="expert-parallel degrees of a MoE model (expert_model_parallel_size), or 'auto' "
        "for every divisor of num_experts whose grid folds into t x cp x d (default: auto)",
    )
    parser.add_argument(
        "--expert-tensor-parallel",
        nargs="+",
        default=["1"],
        metavar="ETP",
        help="expert-tensor-parallel degrees of a MoE model (expert_tensor_parallel_size), or "
        "'auto' for every divisor of moe_ffn_hidden_size (default: 1)",
    )
    parser.add_argument(
        "--dispatcher",
        nargs="+",
        default=["alltoall"],
        metavar="DISPATCHER",
        help="token dispatchers of a MoE model: alltoall, allgather, flex-deepep, flex-hybridep, "
        "flex-ncclep; '+overlap' after alltoall or flex-* adds "
        "--overlap-moe-expert-parallel-comm (default: alltoall)",
    )
    parser.add_argument(
        "--precision",
        nargs="+",
        default=None,
        metavar="RECIPE",
        help="precision recipes to cross with every strategy: the model's datatype (bf16 / "
        "fp16) or fp8-delayed, fp8-tensorwise, fp8-blockwise, mxfp8, nvfp4 (default: the "
        "model's datatype only)",
    )
    parser.add_argument(
        "--grad-reduce-dtype",
        default=GradReduceDtype.DEFAULT.value,
        choices=[choice.value for choice in GradReduceDtype],
        help="the gradient buffers' and DP reduction's datatype of every strategy: default "
        "(Megatron-LM's: fp32 for bf16 training), fp32, or params (the parameters' datatype: "
        "--grad-reduce-in-bf16, what the Megatron-Bridge performance recipes set; default: "
        "%(default)s)",
    )
    parser.add_argument(
        "--pipeline-layouts",
        default=PipelineLayouts.EVEN.value,
        choices=[choice.value for choice in PipelineLayouts],
        help="stage layouts to search: even (Megatron's default split, num_layers mod (p x v) "
        "== 0) or balanced (also, where the layers do not split, a "
        "--pipeline-model-parallel-layout that spreads the embedding, blocks, MTP depths and "
        "loss evenly over p x v virtual stages, v <= 8: Llama 3.1 405B at PP 16, DeepSeek-V3 "
        "at PP 8; default: %(default)s)",
    )
    parser.add_argument(
        "--cp-comm-type",
        nargs="+",
        default=["p2p"],
        metavar="TYPE",
        help="cp_comm_type values crossed with every cp > 1: p2p, all_gather, a2a (default: p2p)",
    )
    parser.add_argument(
        "--tp-comm-overlap",
        default=str(TpCommOverlapChoice.OFF),
        metavar="|".join(TpCommOverlapChoice),
        help="Transformer Engine's userbuffer TP communication overlap (--tp-comm-overlap, "
        "default switches) on the sequence-parallel strategies with t > 1: off, on, or both "
        "(each such strategy with and without it; default: %(default)s)",
    )
    parser.add_argument(
        "--no-megatron-rules",
        action="store_true",
        help="apply only the planner's laws, not Megatron-LM's start-up rules",
    )
    parser.add_argument(
        "--flops-convention",
        choices=[str(c) for c in FlopsConvention],
        default=str(FlopsConvention.MEGATRON_LEGACY),
        help="how model/hardware FLOPs are counted (default: %(default)s)",
    )
    parser.add_argument(
        "--explain", metavar="STRATEGY", help='say where a strategy stands ("tp=8 pp=8 v=3 ...")'
    )
    parser.add_argument(
        "--html",
        metavar="FILE",
        help="also write the Pareto front and the listed strategies as one self-contained "
        "HTML file (opens with no network)",
    )
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument(
        "--csv", metavar="FILE", help="write the full ranked list as CSV ('-': stdout)"
    )


def _result(args: argparse.Namespace) -> SearchResult:
    from blueprinting.hardware.presets import system_preset
    from blueprinting.mapping.presets import model_preset
    from blueprinting.search.rank import Objective, RankOptions, run_search
    from blueprinting.search.space import SearchSpace

    problems = []
    if args.top < 0:
        problems.append(f"--top must be >= 0, got {args.top}")
    elif args.top > MAX_SEARCH_LISTED and args.csv is None:
        problems.append(_listing_problem(f"--top {args.top}", args.top))
    if not 0 <= args.memory_headroom_gib < MAX_HEADROOM_GIB:  # NaN fails both
        problems.append(
            f"--memory-headroom-gib must be >= 0 and below {MAX_HEADROOM_GIB:g}, "
            f"got {args.memory_headroom_gib}"
        )
    if args.train_tokens < 1:
        problems.append(f"--train-tokens must be >= 1, got {args.train_tokens}")
    context = _context_degrees(list(args.context_parallel), problems)
    expert = _auto_degrees("--expert-parallel", list(args.expert_parallel), problems)
    expert_tensor = _auto_degrees(
        "--expert-tensor-parallel", list(args.expert_tensor_parallel), problems
    )
    dispatchers = _dispatchers(list(args.dispatcher), problems)
    precision_names: list[str] | None = args.precision
    comm_types = _cp_comm_types(list(args.cp_comm_type), problems)
    tp_overlap = _tp_comm_overlap(args.tp_comm_overlap, problems)
    if args.seq_length is not None and args.seq_length < 1:
        problems.append(f"--seq-length must be a positive integer, got {args.seq_length}")
    if problems:
        raise ConfigError(problems, source="search")
    model = model_preset(args.model)
    if args.seq_length is not None:
        model = dataclasses.replace(model, seq_length=args.seq_length)
    precisions = _precisions(precision_names, model)
    system = system_preset(args.system)
    space = SearchSpace(
        precision=precisions,
        context_parallel=context,
        cp_comm_types=comm_types,
        tp_comm_overlap=tp_overlap.values,
        expert_parallel=expert,
        expert_tensor_parallel=expert_tensor,
        dispatchers=dispatchers,
        gpu_counts=tuple(args.gpus),
        global_batch_size=args.global_batch,
        gpus_per_node=system.gpus_per_node,
        allow_cross_node_tp=args.allow_cross_node_tp,
        megatron_rules=not args.no_megatron_rules,
        max_microbatch_size=args.max_micro_batch,
        grad_reduce_dtype=GradReduceDtype(args.grad_reduce_dtype),
        pipeline_layouts=PipelineLayouts(args.pipeline_layouts),
    )
    options = RankOptions(
        objective=Objective(args.objective),
        memory_headroom_bytes=int(args.memory_headroom_gib * GIB),
        train_tokens=args.train_tokens,
        flops_convention=FlopsConvention(args.flops_convention),
    )
    told: list[int] = []

    def notice(total: int, say: Callable[[str], None]) -> None:
        # once, before the first configuration is costed: the space's size is known by then
        if not told:
            told.append(total)
            if (text := search_blocks_notice(total)) is not None:
                say(text)

    def sized(candidates: int, say: Callable[[str], None]) -> None:
        if (text := search_candidates_notice(candidates)) is not None:
            say(text)

    if args.json or args.csv is not None or not sys.stderr.isatty():
        return run_search(
            model,
            system,
            space,
            options,
            progress=lambda _, total: notice(total, lambda text: print(text, file=sys.stderr)),
            sized=lambda count: sized(count, lambda text: print(text, file=sys.stderr)),
        )
    from rich.console import Console
    from rich.progress import Progress

    # the bar and the notice on stderr, the stream whose terminal was checked: stdout stays the
    # report's
    with Progress(transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task("costing blocks", total=None)

        def say(text: str) -> None:
            # printed above the live bar, which redraws below it
            bar.console.print(text, markup=False, highlight=False, soft_wrap=True)

        def tick(done: int, total: int) -> None:
            notice(total, say)
            bar.update(task, completed=done, total=total)

        return run_search(
            model,
            system,
            space,
            options,
            progress=tick,
            sized=lambda count: sized(count, say),
        )


def _precisions(
    names: list[str] | None, model: TransformerModelSpec
) -> tuple[TrainingPrecision, ...]:
    """``--precision``: recipes on the model's base datatype; bf16 / fp16 name that datatype
    (a different one is the model's, not a recipe: refused)."""
    from blueprinting.mapping.model import Datatype
    from blueprinting.mapping.precision import HighPrecision, PrecisionChoice
    from blueprinting.mapping.presets import did_you_mean

    if names is None:
        return (HighPrecision(),)
    known = [c.value for c in PrecisionChoice]
    problems: list[str] = []
    out: list[TrainingPrecision] = []
    for name in names:
        if name not in known:
            problems.append(
                f"--precision: unknown recipe {name!r}{did_you_mean(name, known)}; recipes: "
                + ", ".join(known)
            )
            continue
        choice = PrecisionChoice(name)
        base = {PrecisionChoice.BF16: Datatype.BF16, PrecisionChoice.FP16: Datatype.FP16}
        if choice in base and base[choice] is not model.datatype:
            problems.append(
                f"--precision {name}: the model {model.name} is {model.datatype.value}; a base "
                "datatype is the model's, not a recipe (low-precision recipes run on top of it)"
            )
            continue
        if choice.precision not in out:
            out.append(choice.precision)
    if problems:
        raise ConfigError(problems, source="search")
    return tuple(out)


def _context_degrees(values: list[str], problems: list[str]) -> tuple[int, ...] | None:
    """``--context-parallel``: positive integers, or ``auto`` alone."""
    if values == ["auto"]:
        return None
    out: list[int] = []
    for value in values:
        degree = decimal_value(value)
        if degree is None or not 1 <= degree <= MAX_INT:
            problems.append(
                "--context-parallel takes positive integers at most 2**63 - 1 or 'auto', got "
                f"{value[:40]!r}"
            )
        else:
            out.append(degree)
    return tuple(out) if out else (1,)


def _auto_degrees(flag: str, values: list[str], problems: list[str]) -> tuple[int, ...] | None:
    """``--expert-parallel`` / ``--expert-tensor-parallel``: positive integers, or ``auto``
    alone (None: every divisor, see ``SearchSpace``)."""
    if values == ["auto"]:
        return None
    out: list[int] = []
    for value in values:
        degree = decimal_value(value)
        if degree is None or not 1 <= degree <= MAX_INT:
            problems.append(
                f"{flag} takes positive integers at most 2**63 - 1 or 'auto', got {value[:40]!r}"
            )
        elif degree not in out:
            out.append(degree)
    return tuple(out) if out else (1,)


def _dispatchers(values: list[str], problems: list[str]) -> tuple[TokenDispatcher, ...]:
    """``--dispatcher``: the variants' compact text (``str``), e.g. ``flex-deepep+overlap``."""
    from blueprinting.mapping.presets import did_you_mean
    from blueprinting.mapping.transformer import (
        AllGatherDispatcher,
        AllToAllDispatcher,
        FlexBackend,
        FlexDispatcher,
    )

    choices: list[TokenDispatcher] = [AllGatherDispatcher()]
    for overlap in (False, True):
        choices.append(AllToAllDispatcher(overlap=overlap))
        choices.extend(FlexDispatcher(backend=b, overlap=overlap) for b in FlexBackend)
    known = {str(choice): choice for choice in choices}
    out: list[TokenDispatcher] = []
    for value in values:
        if value not in known:
            problems.append(
                f"--dispatcher: unknown dispatcher {value!r}{did_you_mean(value, list(known))}; "
                "dispatchers: " + ", ".join(known)
            )
        elif known[value] not in out:
            out.append(known[value])
    return tuple(out) if out else (AllToAllDispatcher(),)


def _cp_comm_types(values: list[str], problems: list[str]) -> tuple[CpCommType, ...]:
    from blueprinting.mapping.presets import did_you_mean

    searched = [CpCommType.P2P.value, CpCommType.ALL_GATHER.value, CpCommType.A2A.value]
    out: list[CpCommType] = []
    for value in values:
        name = "all_gather" if value == "allgather" else value
        if name not in searched:
            problems.append(
                f"--cp-comm-type: {value!r} is not searched{did_you_mean(value, searched)}; "
                "searched: " + ", ".join(searched)
            )
        elif CpCommType(name) not in out:
            out.append(CpCommType(name))
    return tuple(out) if out else (CpCommType.P2P,)


def _tp_comm_overlap(value: str, problems: list[str]) -> TpCommOverlapChoice:
    from blueprinting.mapping.presets import did_you_mean

    known = [str(c) for c in TpCommOverlapChoice]
    if value not in known:
        problems.append(
            f"--tp-comm-overlap: {value!r} is not one of {', '.join(known)}"
            f"{did_you_mean(value, known)}"
        )
        return TpCommOverlapChoice.OFF
    return TpCommOverlapChoice(value)


def _listing_problem(what: str, count: int) -> str:
    return (
        f"{what} lists {count:,} strategies, each re-planned by the scalar planner; the limit "
        f"is {MAX_SEARCH_LISTED} (MAX_SEARCH_LISTED): use a smaller --top, or --csv for every "
        "candidate"
    )


def _listed(result: SearchResult, top: int) -> list[int]:
    rows = result.order if top == 0 else result.order[:top]
    return [int(r) for r in rows]


def _strategy_text(result: SearchResult, row: int) -> str:
    from blueprinting.search.space import candidate_to_spec
    from blueprinting.search.strategy_text import format_strategy_text

    return format_strategy_text(candidate_to_spec(result.table, row, result.model).mapping)


def _json_object(
    result: SearchResult, reports: list[IterationReport], rows: list[int]
) -> dict[str, JsonValue]:
    ranked: list[JsonValue] = []
    for rank, (row, report) in enumerate(zip(rows, reports, strict=True), start=1):
        entry = report.to_json_dict()
        entry["rank"] = rank
        entry["score"] = float(result.score[row])
        entry["strategy_text"] = _strategy_text(result, row)
        ranked.append(entry)
    rejections: dict[str, JsonValue] = dict(result.rejections())
    pareto: list[JsonValue] = [
        {
            "strategy_text": _strategy_text(result, int(row)),
            "iteration_time_s": float(result.figures.iteration_time_s[row]),
            "memory_total_bytes": int(result.figures.memory_total[row]),
            "memory_reserved_peak_bytes": int(result.figures.memory_reserved_peak[row]),
        }
        for row in result.pareto()
    ]
    return {
        "model": result.model.name,
        "system": result.system.name,
        "objective": str(result.options.objective),
        "bubble_source": "contract",
        "memory_headroom_bytes": result.options.memory_headroom_bytes,
        "candidates_enumerated": result.candidates_enumerated,
        "candidates_valid": result.candidates_valid,
        "candidates_fit": result.candidates_fit,
        "rejections": rejections,
        "seconds": result.seconds,
        "ranked": ranked,
        "pareto_front": pareto,
    }


#: The breakdown columns of the CSV, each a ``CandidateFigures`` field of the same name.
_CSV_BREAKDOWN = (
    "forward",
    "backward",
    "recompute",
    "pipeline_bubble",
    "tp_comm_exposed",
    "pp_comm_exposed",
    "dp_comm_exposed",
    "optimizer",
    "cp_comm_exposed",
)
CSV_COLUMNS = (
    "rank",
    "strategy",
    "world_size",
    "score",
    "iteration_time_s",
    "tokens_per_second",
    "mfu",
    *_CSV_BREAKDOWN,
    "memory_total_bytes",
    "memory_stage",
)


def write_csv(result: SearchResult, stream: TextIO) -> None:
    """Every candidate that fits, best first, with the breakdown columns. Each column is taken
    in rank order as Python numbers at once (``tolist``: the same floats and ints as indexing
    row by row, without a numpy scalar per cell; a search writes tens of thousands of rows)."""
    import numpy as np

    f = result.figures
    order = result.order

    def floats(values: npt.NDArray[np.generic]) -> list[float]:
        # the writer formats a float with str(), which is repr() (the shortest round trip)
        return cast("list[float]", np.asarray(values)[order].astype(np.float64).tolist())

    def ints(values: npt.NDArray[np.generic]) -> list[int]:
        return [int(x) for x in np.asarray(values)[order].tolist()]

    breakdown = [floats(getattr(f, name)) for name in _CSV_BREAKDOWN]
    columns = zip(
        ints(f.world_size),
        floats(result.score),
        floats(f.iteration_time_s),
        floats(f.tokens_per_second),
        floats(f.mfu),
        *breakdown,
        ints(f.memory_total),
        ints(f.memory_stage),
        strict=True,
    )
    from blueprinting.search.space import strategy_texts

    if (notice := search_csv_notice(len(order))) is not None:
        print(notice, file=sys.stderr, flush=True)
    texts = strategy_texts(result.table, order, result.model)
    writer = csv.writer(stream)
    writer.writerow(CSV_COLUMNS)
    writer.writerows(
        (rank, text, world, *figures)
        for rank, (text, (world, *figures)) in enumerate(zip(texts, columns, strict=True), start=1)
    )


def describe_standing(result: SearchResult, text: str, standing: Standing, top: int) -> str:
    """One paragraph saying where ``text`` stands in ``result``."""
    from blueprinting.search.rank import ExcludedByLaw, ExcludedByMemory, NotInSpace, Ranked

    match standing:
        case ExcludedByLaw(violations=violations):
            lines = [f"{text}: excluded by {len(violations)} law(s):"]
            lines.extend(f"  - {v}" for v in violations)
            return "\n".join(lines)
        case NotInSpace(layout_differs=True):
            return (
                f"{text}: legal, but not in the searched space: its p and v are searched with "
                "another pipeline layout (the even split where the layers split over p x v, "
                "else the balanced layout of --pipeline-layouts balanced; plan this one with "
                "pipeline_model_parallel_layout)"
            )
        case NotInSpace():
            return (
                f"{text}: legal, but not in the searched space (a knob takes a value the space "
                "does not list, a pipeline layout only under --pipeline-layouts balanced; see "
                "`blueprinting search --help`)"
            )
        case ExcludedByMemory(total_bytes=total, limit_bytes=limit):
            return (
                f"{text}: excluded by memory: the most loaded stage needs {total / GIB:.2f} GiB, "
                f"over the limit {limit / GIB:.2f} GiB (capacity less headroom)"
            )
        case Ranked(rank=rank, of=of, score=score, best_score=best):
            where = f"in the top {top}" if top == 0 or rank <= top else f"not in the top {top}"
            objective = result.options.objective
            return (
                f"{text}: rank {rank} of {of} ({where}); {objective} {abs(score):.6g} vs best "
                f"{abs(best):.6g}, {100 * standing.gap:+.2f}%"
            )
        case _ as unreachable:
            assert_never(unreachable)


def _explain_mapping(args: argparse.Namespace) -> TransformerTrainingMappingSpec:
    """The ``--explain`` strategy, parsed before the search runs: a text the parser refuses is
    refused in milliseconds, not after a search of many seconds (issue 18)."""
    from blueprinting.search.strategy_text import parse_strategy_text

    counts = set(args.gpus)
    gpus = next(iter(counts)) if len(counts) == 1 else None
    return parse_strategy_text(args.explain, global_batch_size=args.global_batch, num_gpus=gpus)


def _explain(
    result: SearchResult, text: str, mapping: TransformerTrainingMappingSpec, top: int
) -> str:
    from blueprinting.mapping.transformer import TrainingSpec
    from blueprinting.search.rank import standing

    spec = TrainingSpec(model=result.model, mapping=mapping)
    return describe_standing(result, text, standing(result, spec), top)


TABLE_COLUMNS = (
    "#",
    "strategy",
    "iter s",
    "MFU",
    "fwd",
    "bwd",
    "recomp",
    "bubble",
    "TP",
    "PP",
    "DP",
    "optim",
    "CP",
    "EP",
    "mem GiB",
)


def _print_text(result: SearchResult, reports: list[IterationReport], rows: list[int]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from blueprinting.mapping.law_names import Law

    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(
        f"[bold]{escape(result.model.name)}[/bold] on {escape(result.system.name)}: "
        f"{result.candidates_enumerated:,} enumerated, {result.candidates_valid:,} legal, "
        f"{result.candidates_fit:,} fit in memory, in {result.seconds:.2f} s "
        f"({result.candidates_valid / result.seconds:,.0f} candidates/s). "
        f"Objective: {result.options.objective}; bubble: the seed's contract."
    )
    table = Table(title=f"top {len(rows)}")
    for name in TABLE_COLUMNS:
        table.add_column(name, justify="left" if name == "strategy" else "right")
    for rank, report in enumerate(reports, start=1):
        b = report.breakdown
        table.add_row(
            str(rank),
            f"{report.spec.mapping} b={report.spec.mapping.batch.micro_batch_size}",
            f"{report.iteration_time_s:.3f}",
            f"{report.mfu:.3f}",
            *(
                f"{x:.3f}"
                for x in (
                    b.forward,
                    b.backward,
                    b.recompute,
                    b.pipeline_bubble,
                    b.tp_comm_exposed,
                    b.pp_comm_exposed,
                    b.dp_comm_exposed,
                    b.optimizer,
                    b.cp_comm_exposed,
                    b.ep_comm_exposed,
                )
            ),
            f"{report.memory.total / GIB:.1f}",
        )
    console.print(table)
    front = result.pareto()
    console.print(f"Pareto front (iteration time vs peak memory): {len(front)} strategies")
    for row in front[:10]:
        console.print(
            f"  {float(result.figures.iteration_time_s[row]):.3f} s  "
            f"{int(result.figures.memory_total[row]) / GIB:6.1f} GiB  "
            f"{_strategy_text(result, int(row))}",
            highlight=False,
        )
    console.print("Megatron-LM flags:")
    for rank, report in enumerate(reports, start=1):
        # shlex: a layout (Et|(tt|)*30L) or a layer pattern ([0]*3+[1]*58) must reach a shell
        # quoted, as plan's text prints them
        flags = shlex.join(report.megatron_args)
        console.print(f"  #{rank}: {flags}", highlight=False, soft_wrap=True)
    nonzero = {k: v for k, v in result.rejections().items() if v}
    console.print(f"Rejections: {nonzero}", highlight=False, soft_wrap=True)
    uneven = nonzero.get(str(Law.BLOCKS_PER_PIPELINE_STAGE), 0)
    if uneven and result.space.pipeline_layouts is PipelineLayouts.EVEN:
        console.print(
            f"{uneven:,} candidates split num_layers = {result.model.num_layers} unevenly over "
            "their pipeline stages; --pipeline-layouts balanced searches those whose p x v "
            "virtual stages (v <= 8) can hold a balanced --pipeline-model-parallel-layout",
            highlight=False,
            soft_wrap=True,
        )


def run(args: argparse.Namespace) -> int:
    from blueprinting.cli.output_paths import check_output_paths
    from blueprinting.search.rank import exact_reports

    if args.html is not None and args.explain is not None:
        raise ConfigError(["--html writes the ranked list; it does not go with --explain"])
    check_output_paths(("--html", args.html), ("--csv", args.csv))
    explained = None if args.explain is None else _explain_mapping(args)
    result = _result(args)
    if explained is not None:
        print(_explain(result, args.explain, explained, args.top))
        return 0
    if args.csv is not None:
        if args.csv == "-":
            write_csv(result, sys.stdout)
        else:
            with open(args.csv, "w", newline="", encoding="utf-8") as stream:
                write_csv(result, stream)
        if args.html is None:
            return 0
    rows = _listed(result, args.top)
    if len(rows) > MAX_SEARCH_LISTED:
        raise ConfigError([_listing_problem("--top 0", len(rows))], source="search")
    reports = exact_reports(result, result.order[: len(rows)])
    document = _json_object(result, reports, rows)
    if args.html is not None:
        from blueprinting.report.html.page import write_html
        from blueprinting.report.html.search import render_search_html

        write_html(render_search_html(document), args.html)
    if args.csv is not None:
        return 0
    if args.json:
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    _print_text(result, reports, rows)
    return 0
