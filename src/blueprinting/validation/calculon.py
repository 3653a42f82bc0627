"""The Calculon oracle: typed records and their translation into Blueprinting specs.

``shared/reference/calculon_oracle.json`` (path overridable with ``BLUEPRINTING_CALCULON_ORACLE``)
holds Calculon's outputs (calculon-ai/calculon at caa4b11; Isaev et al., SC'23) for 381
configurations, each with the ``app`` (model) and ``exe`` (execution) inputs Calculon read.
:func:`translate` turns a record's ``app`` + ``exe`` into a :class:`TrainingSpec` built directly
from the strategy ADT, and :func:`classify_rejection` names why Calculon refused a configuration,
so that each refusal can be checked against the Blueprinting law that should refuse it too.

Translation choices (Calculon's semantics per ``calculon_oracle.md``):

* model: MHA (``multiquery`` -> one query group), GELU, LayerNorm, no linear biases (Calculon's
  ``block_weight_space`` counts none), ``ffn = feedforward``, ``kv_channels = attn_size``,
  ``seq = seq_size``, vocabulary 51200 padded per Megatron-LM (Calculon has no embedding);
* ``tensor_par_comm_type``: ``rs_ag`` -> :class:`ReduceScatterAllGather`; ``ar`` and ``p2p_rs_ag``
  (all-reduce inside the block, only the pipeline send split over TP: Narayanan 2021's
  scatter/gather optimization) -> :class:`AllReduce`;
* ``tensor_par_overlap`` ring / pipe with ``rs_ag`` -> :class:`ReduceScatterAllGather` with
  :data:`CALCULON_TP_OVERLAP` (``--tp-comm-overlap --tp-comm-overlap-rs-dgrad``, see there);
  with ``ar`` or ``p2p_rs_ag`` it has no Megatron-LM counterpart (``--tp-comm-overlap`` needs
  sequence parallelism, ``arguments.py`` l.1441-1442 @d98e8a64): the record keeps
  :class:`AllReduce` and :func:`tp_overlap_exclusion` names why it cannot be compared;
* ``pipeline_interleaving`` v > 1 -> :class:`InterleavedOneForwardOneBackward` (v), else p = 1 ->
  :class:`SingleStage`, else :class:`OneForwardOneBackward`; a p = 1, v > 1 record stays
  interleaved so the laws can refuse it (nothing is silently repaired);
* ``optimizer_sharding`` shards optimizer states AND gradients -> :class:`ShardedGradients`;
  ``data_par_overlap`` -> ``overlap_grad_reduce``;
* ``activation_recompute``: ``none`` / ``attn_only`` / ``full`` -> :class:`NoRecompute` /
  :class:`SelectiveRecompute` / :class:`FullRecompute` (uniform, 1 block);
* ``batch_size`` / ``microbatch_size`` -> :class:`BatchSpec`.

Knobs with no Blueprinting counterpart (TP overlap over all-reduce TP, offloading, fused activation,
``seq_par_ag_redo``) are listed in :attr:`CalculonTranslation.untranslated`, never dropped
silently.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import assert_never, final

from blueprinting.errors import ConfigError, ProblemCollector, UnsupportedError
from blueprinting.mapping.model import (
    Datatype,
    EmbeddingTying,
    MlpActivation,
    Normalization,
    PositionEmbedding,
    TransformerModelSpec,
)
from blueprinting.mapping.transformer import (
    AllReduce,
    BatchSpec,
    DataParallel,
    FullRecompute,
    InterleavedOneForwardOneBackward,
    NoOptimizerSharding,
    NoRecompute,
    OneForwardOneBackward,
    OptimizerSharding,
    PipelinedDgradReduceScatter,
    PipelineParallel,
    PipelineSchedule,
    RecomputeMethod,
    RecomputePolicy,
    ReduceScatterAllGather,
    SelectiveRecompute,
    ShardedGradients,
    SingleStage,
    TensorCommunication,
    TensorParallel,
    TrainingSpec,
    TransformerTrainingMappingSpec,
    TransformerTrainingParallelism,
    UnfusedAttention,
    UserbufferOverlap,
)
from blueprinting.validation.fields import MappingNoun, as_mapping, boolean, choice, integer, string
from blueprinting.validation.published import padded_vocab_size

ORACLE_ENV = "BLUEPRINTING_CALCULON_ORACLE"
#: Calculon hard-codes this vocabulary (``Llm.Application.num_parameters``).
CALCULON_VOCAB_SIZE = 51200


class CalculonGroup(StrEnum):
    VALIDATION = "validation"
    CANONICAL = "canonical"
    SWEEP_GPT3_1024 = "sweep_gpt3_1024"
    RANDOM = "random"


class CalculonRecompute(StrEnum):
    NONE = "none"
    ATTN_ONLY = "attn_only"
    FULL = "full"


class CalculonTensorComm(StrEnum):
    AR = "ar"
    RS_AG = "rs_ag"
    P2P_RS_AG = "p2p_rs_ag"


class CalculonTpOverlap(StrEnum):
    """Calculon's ``tensor_par_overlap``: tiled TP communication / GEMM overlap
    (``calculon/llm/layers.py`` ``LinearOverlapped``, caa4b11)."""

    NONE = "none"
    RING = "ring"
    PIPE = "pipe"


class CalculonAttention(StrEnum):
    MULTIHEAD = "multihead"
    MULTIQUERY = "multiquery"


class CalculonRejection(StrEnum):
    """Why Calculon refused a configuration (grouped ``error.error`` strings)."""

    INTERLEAVING_NOT_A_FACTOR = "interleaving does not divide blocks per processor"
    INTERLEAVING_EXCEEDS_BLOCKS = "interleaving exceeds blocks per processor"
    TP_UNEVEN_SPLIT = "dimension not divisible by TP degree"
    OFFLOAD_NEEDS_BLOCKS = "offloading needs >= 3 blocks per processor"
    HBM_CAPACITY = "HBM (mem tier 1) capacity exceeded"
    OFFLOAD_CAPACITY = "offload memory (mem tier 2) capacity exceeded"
    NETWORK_TOO_SMALL = "network tier smaller than its parallel group"
    UNSUPPORTED_DATATYPE = "datatype unsupported by the system"
    OTHER = "other"


_REJECTION_PATTERNS: tuple[tuple[re.Pattern[str], CalculonRejection], ...] = (
    (re.compile(r"interleaving must be a factor"), CalculonRejection.INTERLEAVING_NOT_A_FACTOR),
    (
        re.compile(r"interleaving must be less than or equal"),
        CalculonRejection.INTERLEAVING_EXCEEDS_BLOCKS,
    ),
    (
        re.compile(r"should split \w+=\d+ between \d+ TP partitions"),
        CalculonRejection.TP_UNEVEN_SPLIT,
    ),
    (re.compile(r"Offloading requires each processor"), CalculonRejection.OFFLOAD_NEEDS_BLOCKS),
    (re.compile(r"Mem tier1 needs"), CalculonRejection.HBM_CAPACITY),
    (re.compile(r"Mem tier2 needs"), CalculonRejection.OFFLOAD_CAPACITY),
    (re.compile(r"Network tier\d+ isn't big enough"), CalculonRejection.NETWORK_TOO_SMALL),
    (re.compile(r"Unsupported type"), CalculonRejection.UNSUPPORTED_DATATYPE),
)


def classify_rejection(message: str) -> CalculonRejection:
    for pattern, rejection in _REJECTION_PATTERNS:
        if pattern.search(message):
            return rejection
    return CalculonRejection.OTHER


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CalculonApp:
    """Calculon's ``models/*.json``: one transformer, Calculon's names."""

    hidden: int
    feedforward: int
    seq_size: int
    attn_heads: int
    attn_size: int
    num_blocks: int


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CalculonExecution:
    """Calculon's ``Llm.Execution`` (the 23 knobs of ``calculon llm``)."""

    num_procs: int
    tensor_par: int
    pipeline_par: int
    data_par: int
    tensor_par_net: int
    pipeline_par_net: int
    data_par_net: int
    batch_size: int
    microbatch_size: int
    datatype: Datatype
    fused_activation: bool
    attention_type: CalculonAttention
    activation_recompute: CalculonRecompute
    pipeline_interleaving: int
    optimizer_sharding: bool
    tensor_par_comm_type: CalculonTensorComm
    tensor_par_overlap: CalculonTpOverlap
    seq_par_ag_redo: bool
    data_par_overlap: bool
    weight_offload: bool
    activations_offload: bool
    optimizer_offload: bool
    training: bool


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CalculonFailure:
    stage: str
    error_type: str
    error: str

    @property
    def rejection(self) -> CalculonRejection:
        return classify_rejection(self.error)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CalculonRecord:
    """One oracle record. ``stats`` holds Calculon's 96 output figures when ``ok``."""

    id: int
    group: CalculonGroup
    name: str
    model_name: str
    system_name: str
    app: CalculonApp
    exe: CalculonExecution
    ok: bool
    stats: Mapping[str, float | None]
    failure: CalculonFailure | None
    #: Calculon's ``System`` JSON as read (``hardware/calculon.py`` ``system_from_calculon``).
    system: Mapping[str, object]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CalculonTranslation:
    spec: TrainingSpec
    untranslated: tuple[str, ...]


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------
def default_oracle_path() -> Path | None:
    """``$BLUEPRINTING_CALCULON_ORACLE``, else ``shared/reference/calculon_oracle.json`` beside
    an ancestor of this file (or of ``$BLUEPRINTING_SHARED``); ``None`` when absent."""
    explicit = os.environ.get(ORACLE_ENV)
    if explicit:
        return Path(explicit)
    shared = os.environ.get("BLUEPRINTING_SHARED")
    candidates = [Path(shared)] if shared else []
    candidates += [parent / "shared" for parent in Path(__file__).resolve().parents]
    for candidate in candidates:
        path = candidate / "reference" / "calculon_oracle.json"
        if path.is_file():
            return path
    return None


def _mapping(value: object, where: str, problems: ProblemCollector) -> Mapping[str, object]:
    return as_mapping(value, where, problems, noun=MappingNoun.JSON_OBJECT)


def _app(raw: Mapping[str, object], where: str, problems: ProblemCollector) -> CalculonApp:
    return CalculonApp(
        hidden=integer(raw, "hidden", where, problems, fallback=0),
        feedforward=integer(raw, "feedforward", where, problems, fallback=0),
        seq_size=integer(raw, "seq_size", where, problems, fallback=0),
        attn_heads=integer(raw, "attn_heads", where, problems, fallback=0),
        attn_size=integer(raw, "attn_size", where, problems, fallback=0),
        num_blocks=integer(raw, "num_blocks", where, problems, fallback=0),
    )


def _exe(raw: Mapping[str, object], where: str, problems: ProblemCollector) -> CalculonExecution:
    return CalculonExecution(
        num_procs=integer(raw, "num_procs", where, problems, fallback=0),
        tensor_par=integer(raw, "tensor_par", where, problems, fallback=0),
        pipeline_par=integer(raw, "pipeline_par", where, problems, fallback=0),
        data_par=integer(raw, "data_par", where, problems, fallback=0),
        tensor_par_net=integer(raw, "tensor_par_net", where, problems, fallback=0),
        pipeline_par_net=integer(raw, "pipeline_par_net", where, problems, fallback=0),
        data_par_net=integer(raw, "data_par_net", where, problems, fallback=0),
        batch_size=integer(raw, "batch_size", where, problems, fallback=0),
        microbatch_size=integer(raw, "microbatch_size", where, problems, fallback=0),
        datatype=choice(Datatype, raw, "datatype", where, problems),
        fused_activation=boolean(raw, "fused_activation", where, problems),
        attention_type=choice(CalculonAttention, raw, "attention_type", where, problems),
        activation_recompute=choice(
            CalculonRecompute, raw, "activation_recompute", where, problems
        ),
        pipeline_interleaving=integer(raw, "pipeline_interleaving", where, problems, fallback=0),
        optimizer_sharding=boolean(raw, "optimizer_sharding", where, problems),
        tensor_par_comm_type=choice(
            CalculonTensorComm, raw, "tensor_par_comm_type", where, problems
        ),
        tensor_par_overlap=choice(CalculonTpOverlap, raw, "tensor_par_overlap", where, problems),
        seq_par_ag_redo=boolean(raw, "seq_par_ag_redo", where, problems),
        data_par_overlap=boolean(raw, "data_par_overlap", where, problems),
        weight_offload=boolean(raw, "weight_offload", where, problems),
        activations_offload=boolean(raw, "activations_offload", where, problems),
        optimizer_offload=boolean(raw, "optimizer_offload", where, problems),
        training=boolean(raw, "training", where, problems),
    )


def _stats(
    raw: Mapping[str, object], where: str, problems: ProblemCollector
) -> dict[str, float | None]:
    stats: dict[str, float | None] = {}
    for key, value in raw.items():
        if value is None:
            stats[key] = None
        elif isinstance(value, int | float) and not isinstance(value, bool):
            stats[key] = float(value)
        else:
            problems.add(f"{where}.{key} must be a number or null")
    return stats


def parse_record(raw: Mapping[str, object], problems: ProblemCollector) -> CalculonRecord:
    where = f"record {raw.get('id')!r}"
    inputs = _mapping(raw.get("inputs"), f"{where}.inputs", problems)
    ok = boolean(raw, "ok", where, problems)
    stats: dict[str, float | None] = {}
    failure: CalculonFailure | None = None
    if ok:
        outputs = _mapping(raw.get("outputs"), f"{where}.outputs", problems)
        stats = _stats(
            _mapping(outputs.get("stats"), f"{where}.outputs.stats", problems), where, problems
        )
    else:
        error = _mapping(raw.get("error"), f"{where}.error", problems)
        failure = CalculonFailure(
            stage=string(error, "stage", f"{where}.error", problems),
            error_type=string(error, "error_type", f"{where}.error", problems),
            error=string(error, "error", f"{where}.error", problems),
        )
    return CalculonRecord(
        id=integer(raw, "id", where, problems, fallback=0),
        group=choice(CalculonGroup, raw, "group", where, problems),
        name=string(raw, "name", where, problems),
        model_name=string(inputs, "model_name", f"{where}.inputs", problems),
        system_name=string(inputs, "system_name", f"{where}.inputs", problems),
        app=_app(_mapping(inputs.get("app"), f"{where}.app", problems), f"{where}.app", problems),
        exe=_exe(_mapping(inputs.get("exe"), f"{where}.exe", problems), f"{where}.exe", problems),
        ok=ok,
        stats=MappingProxyType(stats),
        failure=failure,
        system=MappingProxyType(dict(_mapping(inputs.get("sys"), f"{where}.inputs.sys", problems))),
    )


def load_oracle(path: Path | None = None) -> tuple[CalculonRecord, ...]:
    """Every record of the oracle file (default :func:`default_oracle_path`)."""
    source = path if path is not None else default_oracle_path()
    if source is None:
        raise ConfigError(
            [f"calculon_oracle.json not found; set {ORACLE_ENV} or BLUEPRINTING_SHARED"]
        )
    try:
        document = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(
            [f"cannot read the Calculon oracle: {error}"], source=str(source)
        ) from error
    if not isinstance(document, list):
        raise ConfigError(["expected a JSON list of records"], source=str(source))
    problems = ProblemCollector(source=str(source))
    records = tuple(parse_record(_mapping(raw, "record", problems), problems) for raw in document)
    problems.raise_if_any()
    return records


# --------------------------------------------------------------------------------------------
# Translation
# --------------------------------------------------------------------------------------------
def _query_groups(app: CalculonApp, attention: CalculonAttention) -> int:
    match attention:
        case CalculonAttention.MULTIHEAD:
            return app.attn_heads
        case CalculonAttention.MULTIQUERY:
            return 1
        case _ as unreachable:
            assert_never(unreachable)


def translate_model(app: CalculonApp, exe: CalculonExecution, *, name: str) -> TransformerModelSpec:
    """Calculon's ``app`` as the model Calculon computes (MHA/MQA, GELU, LayerNorm, no biases)."""
    return TransformerModelSpec(
        name=name,
        num_layers=app.num_blocks,
        hidden_size=app.hidden,
        num_attention_heads=app.attn_heads,
        num_query_groups=_query_groups(app, exe.attention_type),
        kv_channels=app.attn_size,
        ffn_hidden_size=app.feedforward,
        seq_length=app.seq_size,
        vocab_size=CALCULON_VOCAB_SIZE,
        padded_vocab_size=padded_vocab_size(CALCULON_VOCAB_SIZE, max(exe.tensor_par, 1)),
        activation=MlpActivation.GELU,
        normalization=Normalization.LAYERNORM,
        position_embedding=PositionEmbedding.LEARNED_ABSOLUTE,
        embeddings=EmbeddingTying.TIED,
        add_bias_linear=False,
        datatype=exe.datatype,
    )


#: The Megatron-LM strategy a Calculon ``rs_ag`` record with ``tensor_par_overlap`` ring or pipe
#: translates to: ``--tp-comm-overlap --tp-comm-overlap-rs-dgrad`` with Transformer Engine's
#: default methods (``module/base.py`` l.336-396 @d0067d0d). Calculon tiles each of the four
#: TP linears (qkv, proj, fc1, fc2) with its own collective in ``t`` tiles, one method for all
#: (``calculon/llm/layers.py`` ``LinearOverlapped``, caa4b11; shared/reference/calculon_oracle.md).
#: Per Calculon layer and pass, the TE counterpart:
#:
#: - qkv / fc1 forward all-gather -> ring exchange in t chunks (``all_gather``): Calculon's
#:   ``ring`` exactly; its ``pipe`` exposes one more tile (TE refuses a pipelined all-gather);
#: - proj / fc2 forward reduce-scatter -> pipelined in TE's 4 splits (``reduce_scatter``):
#:   Calculon's ``pipe`` up to the tile count (t there) and its double count of the exposed
#:   tile (bug 3, not copied); its ``ring`` exposes no tile (TE's ring-exchange RS needs a
#:   ``--tp-comm-overlap-cfg`` file, which Blueprinting does not model);
#: - proj / fc2 backward all-gather of the output gradient -> ring exchange (``all_gather``);
#: - qkv / fc1 backward reduce-scatter of the input gradient, tiled by Calculon with the same
#:   layer's dgrad GEMM -> pipelined behind the dgrad GEMM (``PipelinedDgradReduceScatter``, the
#:   structural match; TE's default bulk overlap puts it beside the wgrad GEMM instead);
#: - the re-gather for the weight gradient (Calculon's tiled recomm) -> Megatron's async overlap
#:   behind the dgrad GEMM (rs_dgrad turns both bulk overlaps off).
#:
#: Not translated: Calculon's SM share ``processor_usage`` (0.15 of the GEMM rate while a tile
#: communicates); Blueprinting's share is the communication kernel's SMs over ``sm_count``,
#: which a Calculon system does not give (so 0).
CALCULON_TP_OVERLAP = UserbufferOverlap(column_backward=PipelinedDgradReduceScatter())


def tp_overlap_exclusion(exe: CalculonExecution) -> str | None:
    """Why a record's ``tensor_par_overlap`` has no Megatron-LM counterpart (``None``: it has
    one, or the record has no overlap). Calculon tiles the all-reduce of ``ar`` blocks (and of
    ``p2p_rs_ag`` base blocks) with the GEMM before or after it; Megatron-LM's
    ``--tp-comm-overlap`` exists only with sequence parallelism (``arguments.py`` l.1441-1442
    @d98e8a64), so such a record cannot be written as a Megatron strategy."""
    match exe.tensor_par_overlap:
        case CalculonTpOverlap.NONE:
            return None
        case CalculonTpOverlap.RING | CalculonTpOverlap.PIPE:
            pass
        case _ as unreachable:
            assert_never(unreachable)
    match exe.tensor_par_comm_type:
        case CalculonTensorComm.RS_AG:
            return None
        case CalculonTensorComm.AR | CalculonTensorComm.P2P_RS_AG:
            return (
                f"tensor_par_overlap={exe.tensor_par_overlap} over all-reduce TP "
                f"(tensor_par_comm_type={exe.tensor_par_comm_type}): Megatron-LM's "
                "--tp-comm-overlap needs sequence parallelism"
            )
        case _ as unreachable_comm:
            assert_never(unreachable_comm)


def _communication(exe: CalculonExecution) -> TensorCommunication:
    match exe.tensor_par_comm_type:
        case CalculonTensorComm.RS_AG:
            if exe.tensor_par_overlap is CalculonTpOverlap.NONE:
                return ReduceScatterAllGather()
            return ReduceScatterAllGather(overlap=CALCULON_TP_OVERLAP)
        case CalculonTensorComm.AR | CalculonTensorComm.P2P_RS_AG:
            return AllReduce()
        case _ as unreachable:
            assert_never(unreachable)


def _schedule(exe: CalculonExecution) -> PipelineSchedule:
    if exe.pipeline_interleaving > 1:
        return InterleavedOneForwardOneBackward(virtual_stages=exe.pipeline_interleaving)
    if exe.pipeline_par == 1:
        return SingleStage()
    return OneForwardOneBackward()


def _recompute(recompute: CalculonRecompute) -> RecomputePolicy:
    match recompute:
        case CalculonRecompute.NONE:
            return NoRecompute()
        case CalculonRecompute.ATTN_ONLY:
            return SelectiveRecompute()
        case CalculonRecompute.FULL:
            return FullRecompute(method=RecomputeMethod.UNIFORM, num_layers=1)
        case _ as unreachable:
            assert_never(unreachable)


def _untranslated(exe: CalculonExecution) -> tuple[str, ...]:
    knobs = [
        tp_overlap_exclusion(exe) or "",
        "seq_par_ag_redo" if exe.seq_par_ag_redo else "",
        "fused_activation" if exe.fused_activation else "",
        "weight_offload" if exe.weight_offload else "",
        "activations_offload" if exe.activations_offload else "",
        "optimizer_offload" if exe.optimizer_offload else "",
        "tensor_par_comm_type=p2p_rs_ag (PP send split over TP)"
        if exe.tensor_par_comm_type is CalculonTensorComm.P2P_RS_AG
        else "",
    ]
    return tuple(knob for knob in knobs if knob)


def translate(record: CalculonRecord) -> CalculonTranslation:
    """The record's ``app`` + ``exe`` as a :class:`TrainingSpec`.

    Raises :class:`UnsupportedError` for inference records (``training = false``) and
    :class:`ConfigError` for values the ADT refuses on their own (e.g. a zero degree).
    """
    exe = record.exe
    if not exe.training:
        raise UnsupportedError(
            f"translating Calculon record {record.id}: inference records (training=false) "
            "have no training strategy"
        )
    sharding: OptimizerSharding = (
        ShardedGradients() if exe.optimizer_sharding else NoOptimizerSharding()
    )
    parallelism = TransformerTrainingParallelism(
        tensor=TensorParallel(degree=exe.tensor_par, communication=_communication(exe)),
        pipeline=PipelineParallel(degree=exe.pipeline_par, schedule=_schedule(exe)),
        data=DataParallel(
            degree=exe.data_par,
            optimizer_sharding=sharding,
            overlap_grad_reduce=exe.data_par_overlap,
        ),
        recompute=_recompute(exe.activation_recompute),
    )
    mapping = TransformerTrainingMappingSpec(
        parallelism=parallelism,
        batch=BatchSpec(global_batch_size=exe.batch_size, micro_batch_size=exe.microbatch_size),
        # Calculon models attention as separate batched matmuls and a softmax over the stored
        # s x s scores (calculon/llm/layers.py): the unfused kernel.
        attention=UnfusedAttention(),
    )
    model = translate_model(record.app, exe, name=record.model_name)
    return CalculonTranslation(
        spec=TrainingSpec(model=model, mapping=mapping), untranslated=_untranslated(exe)
    )


def summarize_rejections(records: Iterable[CalculonRecord]) -> Mapping[CalculonRejection, int]:
    """How many records Calculon refused, per :class:`CalculonRejection` (most frequent first)."""
    counts = Counter(record.failure.rejection for record in records if record.failure is not None)
    return dict(counts.most_common())


def rejected(
    records: Sequence[CalculonRecord], reason: CalculonRejection
) -> tuple[CalculonRecord, ...]:
    return tuple(r for r in records if r.failure is not None and r.failure.rejection is reason)
