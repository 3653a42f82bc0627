"""One strategy as a line of ``key=value`` words (for ``--explain`` and for printing search hits).

Accepted keys (case-sensitive; on/off values also accept true/false, yes/no, 1/0):

====================== ======================================================== ===============
key                    meaning                                                  default
====================== ======================================================== ===============
tp                     tensor-parallel degree t                                 1
pp                     pipeline-parallel degree p                               1
dp                     data-parallel degree d (or give ``gpus``)                derived
gpus                   world size N; d = N / (t*p) must be exact                -
v                      virtual stages per pipeline rank (``vp`` also accepted)  1
mbs                    micro-batch size                                         1
gbs                    global batch size (or the ``global_batch_size`` keyword) required
sp                     sequence parallelism (RS+AG): on/off                     off
tp_overlap             ``--tp-comm-overlap`` with Transformer Engine's default  off
                       switches (``UserbufferOverlap()``): on/off (sp=on only)
recompute              none | selective | full | full-uniform | full-block      none
recompute_method       uniform | block (full only)                              uniform
recompute_layers       Megatron's recompute_num_layers (full only)              1
sharding               no_shard | optim | optim_grads | optim_grads_params      no_shard
overlap_grad           overlap_grad_reduce: on/off                              off
overlap_param_gather   on/off (a sharded variant only)                          off
overlap_p2p            overlap_p2p_comm: on/off (v > 1 only)                    off
group                  microbatch group size per virtual stage, or ``default``  default
schedule               ``auto`` (from p and v), ``zb-h1`` (ZeroBubbleH1, v = 1), auto
                       ``dualpipe`` or ``dualpipev`` (DeepSeek's, no v)
layout                 Megatron's ``pipeline_model_parallel_layout`` (no spaces), even
                       e.g. ``Et|(tt|)*30L``; v defaults to its stages / pp
ep                     expert-parallel degree (the expert grid folds inside     1
                       the t * cp * p * d ranks)
etp                    expert tensor-parallel degree                            1
dispatcher             alltoall | allgather | flex-deepep | flex-hybridep |     alltoall
                       flex-ncclep
ep_overlap             ``--overlap-moe-expert-parallel-comm``: on/off           off
                       (alltoall and flex only)
grouped_gemm           ``--moe-grouped-gemm``: on/off                           on
====================== ======================================================== ===============

The expert words default to ``ExpertParallel()``'s values (not to Megatron-LM's flag defaults,
which the flat keys follow: etp = t, allgather, no grouped GEMM); a strategy whose expert grid
is that default is written without them.

The schedule follows from p and v: p = v = 1 is SingleStage, v = 1 < p is 1F1B, v > 1 is
interleaved 1F1B (also with p = 1, which the laws then reject: text is never repaired). An option
given for a variant that does not have it (``overlap_p2p`` with v = 1, ``recompute_layers`` with
selective recompute...) is an error, not ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, assert_never

from blueprinting.errors import ConfigError
from blueprinting.limits import MAX_INT, int_limit_text
from blueprinting.mapping.precision import HighPrecision, PrecisionChoice, TrainingPrecision
from blueprinting.mapping.presets import did_you_mean
from blueprinting.mapping.transformer import (
    AllGatherDispatcher,
    AllReduce,
    AllToAllDispatcher,
    BatchSpec,
    CombinedOneForwardOneBackward,
    ContextParallel,
    CpCommType,
    CpCommunication,
    DataParallel,
    DistributedOptimizer,
    DualPipe,
    DualPipeV,
    EvenStages,
    ExpertParallel,
    FlexBackend,
    FlexDispatcher,
    FlexibleStages,
    ForwardOnly,
    FullRecompute,
    InterleavedOneForwardOneBackward,
    NoOptimizerSharding,
    NoRecompute,
    NoTpCommOverlap,
    OneForwardOneBackward,
    OptimizerSharding,
    PipelineParallel,
    PipelineSchedule,
    RecomputeMethod,
    RecomputePolicy,
    ReduceScatterAllGather,
    SelectiveRecompute,
    ShardedGradients,
    ShardedParameters,
    ShardingVariant,
    SingleStage,
    StageLayout,
    TensorParallel,
    TokenDispatcher,
    TpCommOverlap,
    TransformerTrainingMappingSpec,
    TransformerTrainingParallelism,
    UnevenStages,
    UserbufferOverlap,
    ZeroBubbleH1,
    cp_comm_type,
    dispatcher_overlaps,
    shared_expert_overlaps,
    single_level_communication,
    training_schedule,
)

_KEYS = (
    "tp",
    "cp",
    "cp_comm",
    "pp",
    "dp",
    "gpus",
    "v",
    "vp",
    "mbs",
    "gbs",
    "sp",
    "tp_overlap",
    "recompute",
    "recompute_method",
    "recompute_layers",
    "sharding",
    "overlap_grad",
    "overlap_param_gather",
    "overlap_p2p",
    "group",
    "schedule",
    "layout",
    "precision",
    "ep",
    "etp",
    "dispatcher",
    "ep_overlap",
    "grouped_gemm",
)
_TRUE = ("on", "true", "yes", "1")
_FALSE = ("off", "false", "no", "0")
_RECOMPUTE = ("none", "selective", "full", "full-uniform", "full-block")
_SHARDING = tuple(s.value for s in ShardingVariant)


class _Reader:
    """Typed access to the parsed words, collecting every problem."""

    def __init__(self, words: dict[str, str], problems: list[str]) -> None:
        self.words = words
        self.problems = problems

    def integer(self, key: str, default: int | None) -> int | None:
        text = self.words.get(key)
        if text is None:
            return default
        if not text.isdigit() or text.strip("0") == "":
            self.problems.append(f"{key}={text}: expected a positive integer")
            return default
        # More digits than MAX_INT has are refused before int() (which also refuses strings
        # past Python's 4300-digit conversion limit).
        if len(text) > len(str(MAX_INT)) or int(text) > MAX_INT:
            shown = text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"
            self.problems.append(f"{key}={shown}: exceeds the limit {int_limit_text()}")
            return default
        return int(text)

    def flag(self, key: str) -> bool:
        text = self.words.get(key)
        if text is None:
            return False
        if text.lower() in _TRUE:
            return True
        if text.lower() not in _FALSE:
            self.problems.append(f"{key}={text}: expected on or off")
        return False

    def choice(self, key: str, allowed: tuple[str, ...], default: str) -> str:
        text = self.words.get(key, default)
        if text not in allowed:
            self.problems.append(f"{key}={text}: expected one of {', '.join(allowed)}")
            return default
        return text

    def refuse(self, key: str, why: str) -> None:
        if key in self.words:
            self.problems.append(f"{key}={self.words[key]}: {why}")


def _split(text: str, problems: list[str]) -> dict[str, str]:
    words: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if not sep or not key or not value:
            problems.append(f"{word!r}: expected key=value")
        elif key not in _KEYS:
            problems.append(f"{key}: unknown key (accepted: {', '.join(_KEYS)})")
        elif key in words or (key in ("v", "vp") and ({"v", "vp"} & words.keys())):
            problems.append(f"{key}: given twice")
        else:
            words["v" if key == "vp" else key] = value
    return words


def parse_strategy_text(
    text: str, *, global_batch_size: int | None = None, num_gpus: int | None = None
) -> TransformerTrainingMappingSpec:
    """Parse ``"tp=2 pp=16 v=3 mbs=1 sp=on recompute=selective sharding=optim ..."``.

    ``global_batch_size`` / ``num_gpus`` supply ``gbs`` / ``gpus`` when the text omits them.
    Every problem is reported at once as a :class:`ConfigError`.
    """
    problems: list[str] = []
    r = _Reader(_split(text, problems), problems)
    t = r.integer("tp", 1) or 1
    cp = r.integer("cp", 1) or 1
    precision = _parse_precision(r)
    cp_kind = r.choice("cp_comm", _CP_COMM, CpCommType.P2P.value)
    if cp == 1:
        r.refuse("cp_comm", "only context parallelism (cp > 1) has a comm type")
    p = r.integer("pp", 1) or 1
    layout = _parse_layout(r)
    default_v = 1
    if isinstance(layout, FlexibleStages) and "v" not in r.words:
        stages = len(layout.stages)
        if stages % p != 0:
            problems.append(f"layout: {stages} stages are not a multiple of pp = {p}")
        default_v = max(stages // p, 1)
    v = r.integer("v", default_v) or 1
    mbs = r.integer("mbs", 1) or 1
    gbs = r.integer("gbs", global_batch_size)
    if gbs is None:
        problems.append("gbs: missing (give gbs=... or the global batch size)")
    d = r.integer("dp", None)
    gpus = r.integer("gpus", num_gpus)
    if d is None and gpus is None:
        problems.append("dp: missing (give dp=... or gpus=...)")
    elif d is None and gpus is not None:
        if gpus % (t * cp * p) != 0:
            product = "tp*cp*pp" if cp > 1 else "tp*pp"
            problems.append(f"gpus={gpus}: not a multiple of {product} = {t * cp * p}")
        else:
            d = gpus // (t * cp * p)
    elif d is not None and gpus is not None and "gpus" in r.words and d * t * cp * p != gpus:
        product = "tp*cp*pp*dp" if cp > 1 else "tp*pp*dp"
        problems.append(f"gpus={gpus}: {product} = {t * cp * p * d} differs")

    sp = r.flag("sp")
    tp_overlap = r.flag("tp_overlap")
    if not sp and tp_overlap:
        r.refuse("tp_overlap", "the userbuffer overlap needs sequence parallelism (sp=on)")
    recompute = _parse_recompute(r)
    sharding = _parse_sharding(r)
    overlap_grad = r.flag("overlap_grad")
    experts = _parse_experts(r)
    schedule = _parse_schedule(r, p, v, ep_overlap=dispatcher_overlaps(experts.dispatcher))
    if problems or gbs is None or d is None:
        raise ConfigError(problems, source="strategy text")
    return TransformerTrainingMappingSpec(
        parallelism=TransformerTrainingParallelism(
            tensor=TensorParallel(
                degree=t,
                communication=(
                    ReduceScatterAllGather(
                        overlap=UserbufferOverlap() if tp_overlap else NoTpCommOverlap()
                    )
                    if sp
                    else AllReduce()
                ),
            ),
            pipeline=PipelineParallel(degree=p, schedule=schedule, layout=layout),
            data=DataParallel(
                degree=d, optimizer_sharding=sharding, overlap_grad_reduce=overlap_grad
            ),
            recompute=recompute,
            context=ContextParallel(
                degree=cp, communication=_cp_communication(CpCommType(cp_kind))
            ),
            experts=experts,
        ),
        batch=BatchSpec(global_batch_size=gbs, micro_batch_size=mbs),
        precision=precision,
    )


#: The recipes strategy text names (``PrecisionChoice`` less the base datatypes, which are the
#: model's): ``precision=fp8-tensorwise``.
_RECIPES = {
    choice.value: choice.precision
    for choice in PrecisionChoice
    if choice not in (PrecisionChoice.BF16, PrecisionChoice.FP16)
}


def _parse_precision(r: _Reader) -> TrainingPrecision:
    text = r.words.get("precision")
    if text is None:
        return HighPrecision()
    if text not in _RECIPES:
        r.problems.append(
            f"precision={text}: expected one of {', '.join(_RECIPES)}"
            f"{did_you_mean(text, tuple(_RECIPES))}"
        )
        return HighPrecision()
    return _RECIPES[text]


def precision_text(precision: TrainingPrecision) -> str | None:
    """The strategy-text name of a recipe (None: the base datatype); a recipe with options no
    name carries (a format, a param gather, base-precision layers) is refused."""
    if isinstance(precision, HighPrecision):
        return None
    for name, recipe in _RECIPES.items():
        if recipe == precision:
            return name
    raise ConfigError(
        [f"precision {precision} has no strategy-text name; give the strategy as flat keys"]
    )


_CP_COMM = (CpCommType.P2P.value, CpCommType.ALL_GATHER.value, CpCommType.A2A.value)


def _cp_communication(kind: CpCommType) -> CpCommunication:
    if kind is CpCommType.A2A_P2P:
        raise ConfigError(["cp_comm=a2a+p2p has no strategy-text spelling (give it in a file)"])
    return single_level_communication(kind)


#: The dispatcher words: the types, flex once per backend (``str`` of the variant).
_DISPATCHERS = (
    "alltoall",
    "allgather",
    *(f"flex-{backend.value}" for backend in FlexBackend),
)


def _parse_experts(r: _Reader) -> ExpertParallel:
    ep = r.integer("ep", 1) or 1
    etp = r.integer("etp", 1) or 1
    kind = r.words.get("dispatcher", "alltoall")
    if kind not in _DISPATCHERS:
        r.problems.append(
            f"dispatcher={kind}: expected one of {', '.join(_DISPATCHERS)}"
            f"{did_you_mean(kind, _DISPATCHERS)}"
        )
        kind = "alltoall"
    overlap = r.flag("ep_overlap")
    grouped = r.words.get("grouped_gemm", "on")
    dispatcher: TokenDispatcher
    if kind == "allgather":
        r.refuse("ep_overlap", "the EP overlap needs dispatcher=alltoall or flex-*")
        dispatcher = AllGatherDispatcher()
    elif kind == "alltoall":
        dispatcher = AllToAllDispatcher(overlap=overlap)
    else:
        dispatcher = FlexDispatcher(
            backend=FlexBackend(kind.removeprefix("flex-")), overlap=overlap
        )
    if grouped.lower() not in (*_TRUE, *_FALSE):
        r.problems.append(f"grouped_gemm={grouped}: expected on or off")
    return ExpertParallel(
        degree=ep,
        tensor_degree=etp,
        dispatcher=dispatcher,
        grouped_gemm=grouped.lower() not in _FALSE,
    )


def _expert_words(experts: ExpertParallel) -> list[str]:
    """The expert words (none for the default grid); the shared-expert overlap has none."""
    if experts == ExpertParallel():
        return []
    dispatcher = experts.dispatcher
    if shared_expert_overlaps(dispatcher):
        raise ConfigError(
            [
                f"dispatcher {dispatcher}: the shared-expert overlap has no strategy-text "
                "spelling (give the strategy as flat keys)"
            ]
        )
    # the variant's compact text without its overlap suffix: the _DISPATCHERS word
    name = str(dispatcher).removesuffix("+overlap")
    words = [f"ep={experts.degree}", f"etp={experts.tensor_degree}", f"dispatcher={name}"]
    if dispatcher_overlaps(dispatcher):
        words.append("ep_overlap=on")
    return [*words, f"grouped_gemm={_on(experts.grouped_gemm)}"]


def _parse_recompute(r: _Reader) -> RecomputePolicy:
    kind = r.choice("recompute", _RECOMPUTE, "none")
    if kind in ("none", "selective"):
        r.refuse("recompute_method", f"only full recompute has a method (recompute={kind})")
        r.refuse("recompute_layers", f"only full recompute has a layer count (recompute={kind})")
        return NoRecompute() if kind == "none" else SelectiveRecompute()
    implied = {"full-uniform": "uniform", "full-block": "block"}.get(kind)
    method = r.choice("recompute_method", ("uniform", "block"), implied or "uniform")
    if implied is not None and "recompute_method" in r.words and method != implied:
        r.problems.append(f"recompute_method={method}: contradicts recompute={kind}")
    layers = r.integer("recompute_layers", 1) or 1
    return FullRecompute(method=RecomputeMethod(method), num_layers=layers)


def _parse_sharding(r: _Reader) -> OptimizerSharding:
    variant = ShardingVariant(r.choice("sharding", _SHARDING, ShardingVariant.NO_SHARD))
    gather = r.flag("overlap_param_gather")
    if variant is ShardingVariant.NO_SHARD:
        r.refuse("overlap_param_gather", "needs a sharded optimizer (sharding=no_shard)")
    return variant.build(overlap_param_gather=gather)


def _parse_layout(r: _Reader) -> StageLayout:
    text = r.words.get("layout")
    if text is None:
        return EvenStages()
    from blueprinting.mapping.pipeline_layout import parse_pipeline_layout

    try:
        return parse_pipeline_layout(text)
    except ConfigError as error:
        r.problems.extend(f"layout={text}: {problem}" for problem in error.problems)
        return EvenStages()


def _parse_schedule(r: _Reader, p: int, v: int, *, ep_overlap: bool) -> PipelineSchedule:
    overlap_p2p = r.flag("overlap_p2p")
    group_text = r.words.get("group", "default")
    schedule_text = r.words.get("schedule", "auto")
    if schedule_text in ("dualpipe", "dualpipev"):
        r.refuse("overlap_p2p", "only the interleaved schedule (v > 1) has it")
        r.refuse("group", "only the interleaved schedule (v > 1) has it")
        r.refuse("v", f"schedule={schedule_text} sets its own two chunks per rank")
        return DualPipe() if schedule_text == "dualpipe" else DualPipeV()
    if schedule_text == "zb-h1":
        r.refuse("overlap_p2p", "only the interleaved schedule (v > 1) has it")
        r.refuse("group", "only the interleaved schedule (v > 1) has it")
        if v != 1:
            raise ConfigError([f"schedule=zb-h1 is not interleaved; got v={v}"])
        return ZeroBubbleH1()
    if schedule_text != "auto":
        raise ConfigError(
            [f"schedule must be 'auto', 'zb-h1', 'dualpipe' or 'dualpipev', got {schedule_text!r}"]
        )
    if v == 1:
        r.refuse("overlap_p2p", "only the interleaved schedule (v > 1) has it")
        r.refuse("group", "only the interleaved schedule (v > 1) has it")
        return training_schedule(p, ep_overlap=ep_overlap)
    group = None if group_text == "default" else r.integer("group", None)
    return training_schedule(
        p, v, microbatch_group_size=group, overlap_p2p_comm=overlap_p2p, ep_overlap=ep_overlap
    )


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def format_strategy_text(mapping: TransformerTrainingMappingSpec) -> str:
    """The canonical text of a strategy; ``parse_strategy_text`` reads it back unchanged."""
    par = mapping.parallelism
    return format_strategy_parts(
        tensor=par.tensor,
        context=par.context,
        pipeline=par.pipeline,
        data=par.data,
        experts=par.experts,
        recompute=par.recompute,
        precision=mapping.precision,
        batch=mapping.batch,
    )


_Part = TypeVar("_Part")
_Words = TypeVar("_Words")

#: Entries an identity memo keeps before it starts afresh (each holds its part alive, so that an
#: ``id`` is never reused while its entry stands).
_MEMO_ENTRIES = 4096


def _by_identity(words: Callable[[_Part], _Words]) -> Callable[[_Part], _Words]:
    """``words`` memoized on its argument's identity: a search's rows share their parts (the
    memoized constructors of :mod:`blueprinting.search.space`), and hashing a nested frozen
    dataclass on every call costs more than the words themselves."""
    memo: dict[int, tuple[_Part, _Words]] = {}

    def memoized(part: _Part) -> _Words:
        found = memo.get(id(part))
        if found is not None and found[0] is part:
            return found[1]
        if len(memo) >= _MEMO_ENTRIES:
            memo.clear()
        value = words(part)
        memo[id(part)] = (part, value)
        return value

    return memoized


def format_strategy_parts(
    *,
    tensor: TensorParallel,
    context: ContextParallel,
    pipeline: PipelineParallel,
    data: DataParallel,
    experts: ExpertParallel,
    recompute: RecomputePolicy,
    precision: TrainingPrecision,
    batch: BatchSpec,
) -> str:
    """:func:`format_strategy_text` of a mapping's parts, each part's words memoized on the part
    (immutable values that a search's rows share: ``--csv`` writes the text of every row)."""
    v_words, schedule_words = _pipeline_words(pipeline)
    return " ".join(
        (
            f"tp={tensor.degree}",
            *_context_words(context),
            f"pp={pipeline.degree}",
            f"dp={data.degree}",
            *_cached_expert_words(experts),
            *v_words,
            *_precision_words(precision),
            f"mbs={batch.micro_batch_size}",
            f"gbs={batch.global_batch_size}",
            *_tensor_words(tensor),
            *_recompute_words(recompute),
            *_data_words(data),
            *schedule_words,
        )
    )


@_by_identity
def _context_words(context: ContextParallel) -> tuple[str, ...]:
    if context.degree == 1:
        return ()
    return (f"cp={context.degree}", f"cp_comm={cp_comm_type(context.communication)}")


@_by_identity
def _cached_expert_words(experts: ExpertParallel) -> tuple[str, ...]:
    return tuple(_expert_words(experts))


@_by_identity
def _precision_words(precision: TrainingPrecision) -> tuple[str, ...]:
    recipe = precision_text(precision)
    return () if recipe is None else (f"precision={recipe}",)


@_by_identity
def _pipeline_words(pipeline: PipelineParallel) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the ``v`` word, the schedule's and layout's words: they close the text)."""
    schedule = pipeline.schedule
    v_words: tuple[str, ...] = ()
    schedule_words: tuple[str, ...] = ()
    match schedule:
        case CombinedOneForwardOneBackward(virtual_stages=1):
            pass  # ep_overlap=on gives it back
        case (
            InterleavedOneForwardOneBackward(
                virtual_stages=v, microbatch_group_size=group, overlap_p2p_comm=overlap_p2p
            )
            | CombinedOneForwardOneBackward(
                virtual_stages=v, microbatch_group_size=group, overlap_p2p_comm=overlap_p2p
            )
        ):
            v_words = (f"v={v}",)
            schedule_words = (
                f"overlap_p2p={_on(overlap_p2p)}",
                f"group={'default' if group is None else group}",
            )
        case SingleStage() | OneForwardOneBackward():
            pass
        case ZeroBubbleH1():
            schedule_words = ("schedule=zb-h1",)
        case DualPipe():
            schedule_words = ("schedule=dualpipe",)
        case DualPipeV():
            schedule_words = ("schedule=dualpipev",)
        case ForwardOnly():
            raise ConfigError(["a training strategy cannot use the ForwardOnly schedule"])
        case _ as unreachable:
            assert_never(unreachable)
    layout = pipeline.layout
    match layout:
        case FlexibleStages():
            from blueprinting.mapping.pipeline_layout import format_pipeline_layout

            schedule_words = (*schedule_words, f"layout={format_pipeline_layout(layout)}")
        case EvenStages():
            pass
        case UnevenStages():
            raise ConfigError(["strategy text has no key for uneven first/last stage counts"])
        case _ as unreachable_layout:
            assert_never(unreachable_layout)
    return v_words, schedule_words


@_by_identity
def _tensor_words(tensor: TensorParallel) -> tuple[str, ...]:
    """``sp`` and the userbuffer overlap (``TransformerTrainingMappingSpec.tp_comm_overlap``)."""
    communication = tensor.communication
    match communication:
        case ReduceScatterAllGather():
            return _sequence_parallel_words(communication.overlap)
        case AllReduce():
            return ("sp=off",)
        case _ as unreachable:
            assert_never(unreachable)


def _sequence_parallel_words(overlap: TpCommOverlap) -> tuple[str, ...]:
    match overlap:
        case NoTpCommOverlap():
            return ("sp=on",)
        case UserbufferOverlap():
            if overlap != UserbufferOverlap():
                raise ConfigError(
                    [
                        f"tp_comm_overlap {overlap} is not Transformer Engine's default; "
                        "strategy text spells only tp_overlap=on (give it as flat keys)"
                    ]
                )
            return ("sp=on", "tp_overlap=on")
        case _ as unreachable_overlap:
            assert_never(unreachable_overlap)


@_by_identity
def _recompute_words(recompute: RecomputePolicy) -> tuple[str, ...]:
    match recompute:
        case NoRecompute():
            return ("recompute=none",)
        case SelectiveRecompute():
            return ("recompute=selective",)
        case FullRecompute(method=method, num_layers=layers):
            return ("recompute=full", f"recompute_method={method}", f"recompute_layers={layers}")
        case _ as unreachable:
            assert_never(unreachable)


@_by_identity
def _data_words(data: DataParallel) -> tuple[str, ...]:
    sharding = data.optimizer_sharding
    words: tuple[str, ...] = (f"sharding={ShardingVariant.of(sharding)}",)
    match sharding:
        case NoOptimizerSharding():
            pass
        case DistributedOptimizer() | ShardedGradients() | ShardedParameters():
            words = (*words, f"overlap_param_gather={_on(sharding.overlap_param_gather)}")
        case _ as unreachable:
            assert_never(unreachable)
    return (*words, f"overlap_grad={_on(data.overlap_grad_reduce)}")
