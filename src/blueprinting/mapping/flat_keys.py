"""The boundary adapter between flat external keys and the typed strategy ADT.

The seed (section "Algebraic data model") makes ``from_mapping`` the one place where flat
configuration keys become a :class:`TrainingSpec`. The keys are Megatron-LM's argument names
(``megatron/training/arguments.py`` and the config dataclasses it builds flags from, at d98e8a64;
summarized in ``shared/reference/megatron_rules.md``), with dashes or underscores and an optional
leading ``--``.

Contract:

- every problem (unknown key, wrong type, conflicting keys, missing key) is collected and raised
  as one :class:`ConfigError`; an unknown key gets a did-you-mean suggestion;
- a ``world_size`` not divisible by ``t * p`` is an :class:`InvalidStrategyError` naming the law
  ``world_size = t * p * d`` (with the expert grid's ``expert_world_size`` on the same world
  size); every other law is left to :mod:`blueprinting.mapping.laws`;
- nothing is repaired: where Megatron-LM silently drops a setting (``overlap_p2p_comm`` without
  interleaving, ``num_query_groups`` without ``group_query_attention``, ``sequence_parallel`` with
  t = 1 in the training script) this adapter refuses or leaves the law to report it;
- defaults are Megatron-LM's where it has one (``micro_batch_size`` 1, ``global_batch_size``
  ``micro_batch_size * d``, ``overlap_p2p_comm`` true with interleaving since Megatron-LM's flag is
  ``--no-overlap-p2p-communication``, ``ffn_hidden_size`` 4h or ``int(8h/3/64)*64`` with SwiGLU,
  ``kv_channels`` h / heads, fp32 when no precision flag is given; for a mixture-of-experts model
  ``expert_tensor_parallel_size`` t, the ``allgather`` dispatcher, no grouped GEMM).

With a base ``model`` (e.g. a preset), model keys override it field by field; a derived field
(``kv_channels``, ``ffn_hidden_size``, ``num_query_groups``) that held its Megatron default in the
base follows the overridden fields, one that was set explicitly keeps its value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType
from typing import assert_never, final

from blueprinting.errors import (
    ConfigError,
    InvalidStrategyError,
    LawViolation,
    UnsupportedError,
    positive_int_problem,
)
from blueprinting.limits import MAX_INT, decimal_value, int_limit_text
from blueprinting.mapping.cuda_graphs import (
    CudaGraphImpl,
    CudaGraphs,
    CudaGraphScope,
    LocalCudaGraphs,
    NoCudaGraphs,
    TransformerEngineCudaGraphs,
    cuda_graph_impl,
    given_scope,
    scope_names,
)
from blueprinting.mapping.model import (
    DEFAULT_DROPOUT,
    AttentionWindow,
    CapacityFactor,
    Datatype,
    DenseFeedForward,
    Dropless,
    EmbeddingTying,
    FeedForward,
    FullAttention,
    LoadBalancing,
    MixtureOfExperts,
    MlpActivation,
    MoeLayerFrequency,
    MoeLayerList,
    MultiLatentAttention,
    Normalization,
    PositionEmbedding,
    RouterScore,
    SelfAttention,
    SlidingWindow,
    SoftmaxType,
    StandardAttention,
    TokenDropping,
    TransformerModelSpec,
    load_imbalance_problem,
)
from blueprinting.mapping.moe_layer_freq import format_moe_layer_freq, parse_moe_layer_freq
from blueprinting.mapping.precision import (
    Fp4Format,
    Fp4Precision,
    Fp4Recipe,
    Fp8Format,
    Fp8Precision,
    Fp8Recipe,
    HighPrecision,
    TrainingPrecision,
)
from blueprinting.mapping.presets import did_you_mean
from blueprinting.mapping.transformer import (
    DEFAULT_RECOMPUTE_MODULES,
    TE_PIPELINE_SPLITS,
    ActivationOffload,
    AllGatherDispatcher,
    AllGatherKV,
    AllReduce,
    AllToAllDispatcher,
    AttentionBackend,
    AttentionKernel,
    BatchSpec,
    BulkOverlap,
    ColumnBackwardOverlap,
    CombinedOneForwardOneBackward,
    ContextParallel,
    CpCommType,
    CpCommunication,
    CrossEntropyFusionImpl,
    CrossEntropyKernel,
    DataParallel,
    DispatcherType,
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
    FusedAttention,
    FusedCrossEntropy,
    GradReduceDtype,
    HeadAllToAll,
    HierarchicalAllToAllRing,
    InferenceSpec,
    InferenceWorkload,
    InterleavedOneForwardOneBackward,
    KernelFusions,
    LayerCpuOffload,
    LayoutStage,
    NoActivationOffload,
    NoOptimizerSharding,
    NoRecompute,
    NoTpCommOverlap,
    OneForwardOneBackward,
    OptimizerSharding,
    PipelinedDgradReduceScatter,
    PipelineParallel,
    PipelineSchedule,
    RecomputeMethod,
    RecomputeModule,
    RecomputePolicy,
    ReduceScatterAllGather,
    ReplicaParallel,
    RingExchange,
    SelectiveRecompute,
    ServingExpertParallel,
    ShardedGradients,
    ShardedParameters,
    ShardingVariant,
    SingleStage,
    StageLayout,
    TensorCommunication,
    TensorParallel,
    TokenDispatcher,
    TpCommOverlap,
    TrainingSpec,
    TransformerInferenceMappingSpec,
    TransformerInferenceParallelism,
    TransformerTrainingMappingSpec,
    TransformerTrainingParallelism,
    UnevenStages,
    UnfusedCrossEntropy,
    UserbufferOverlap,
    ZeroBubbleH1,
    attention_kernel,
    cp_comm_type,
    delays_wgrad,
    dispatcher_overlaps,
    dispatcher_type,
    grad_reduce_datatype,
    inference_schedule,
    parameter_datatype,
    shared_expert_overlaps,
    single_level_communication,
    tensor_communication,
    training_schedule,
)

FlatValue = int | bool | str | float


class _Kind(StrEnum):
    INT = "a positive integer"
    BOOL = "a boolean"
    STR = "a string"
    FP8 = "a boolean or one of 'e4m3', 'hybrid'"
    LIST = "a string or a list of strings or positive integers"
    FP4 = "a boolean or 'e2m1'"
    NUMBER = "a number"
    COUNT = "a non-negative integer"
    LAYER_FREQ = (
        "a positive integer or a list expression of 0/1 such as '([0]*3+[1]*58)' or '[0,1,1]'"
    )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _Key:
    kind: _Kind
    choices: tuple[str, ...] = ()


def _int() -> _Key:
    return _Key(kind=_Kind.INT)


def _bool() -> _Key:
    return _Key(kind=_Kind.BOOL)


def _choice(*choices: str) -> _Key:
    return _Key(kind=_Kind.STR, choices=choices)


# Keys only a training run has; inference_from_mapping refuses them by name.
TRAINING_KEYS: Mapping[str, _Key] = {
    "data_parallel_size": _int(),
    "world_size": _int(),
    "num_layers_per_virtual_pipeline_stage": _int(),
    "num_virtual_stages_per_pipeline_rank": _int(),
    "virtual_pipeline_model_parallel_size": _int(),
    "pipeline_model_parallel_layout": _Key(kind=_Kind.STR),
    "microbatch_group_size_per_vp_stage": _int(),
    "overlap_p2p_comm": _bool(),
    # Blueprinting's own key (Megatron-LM has none): "zb-h1" selects ZeroBubbleH1, "dualpipe" /
    # "dualpipev" DeepSeek's DualPipe / DualPipeV (deepseek-ai/DualPipe; not in Megatron-LM).
    "pipeline_schedule": _choice("1f1b", "zb-h1", "dualpipe", "dualpipev"),
    "decoder_first_pipeline_num_layers": _int(),
    "decoder_last_pipeline_num_layers": _int(),
    "use_distributed_optimizer": _bool(),
    "data_parallel_sharding_strategy": _choice(*(s.value for s in ShardingVariant)),
    "overlap_grad_reduce": _bool(),
    "overlap_param_gather": _bool(),
    "use_megatron_fsdp": _bool(),
    # The gradient reduction datatype (GradReduceDtype): Megatron-Core / Megatron-Bridge's
    # ddp.grad_reduce_in_fp32 and Megatron-LM's two flags; grad_reduce_datatype_of reads them.
    "grad_reduce_in_fp32": _bool(),
    "accumulate_allreduce_grads_in_fp32": _bool(),
    "grad_reduce_in_bf16": _bool(),
    "account_for_embedding_in_pipeline_split": _bool(),
    "account_for_loss_in_pipeline_split": _bool(),
    "recompute_granularity": _choice("full", "selective"),
    "recompute_method": _choice(*(m.value for m in RecomputeMethod)),
    "recompute_num_layers": _int(),
    "recompute_activations": _bool(),
    # Megatron-Core's layer-wise CPU offloading (model_parallel_config.py l.458-480
    # @d98e8a64): Megatron-LM's command line has only --cpu-offloading-num-layers, which turns
    # cpu_offloading on when positive (arguments.py l.1950-1951); Megatron-Bridge sets the
    # config fields.
    "cpu_offloading": _bool(),
    "cpu_offloading_num_layers": _Key(kind=_Kind.COUNT),
    "cpu_offloading_activations": _bool(),
    "cpu_offloading_weights": _bool(),
    # Megatron takes a list (--recompute-modules core_attn mlp); here one string of names
    # separated by spaces or commas.
    "recompute_modules": _Key(kind=_Kind.STR),
    "micro_batch_size": _int(),
    "global_batch_size": _int(),
    "attention_backend": _choice(*(b.value for b in AttentionBackend)),
    "use_flash_attn": _bool(),
    # Kernel fusions that decide the eager passes a block runs (mapping/transformer.py
    # KernelFusions): Megatron-LM's --no-rope-fusion (apply_rope_fusion, default true) and
    # TransformerConfig's use_transformer_engine_op_fuser (default false).
    "apply_rope_fusion": _bool(),
    "use_transformer_engine_op_fuser": _bool(),
    # the loss's kernels (KernelFusions.cross_entropy): Megatron-LM's --cross-entropy-loss-fusion
    # (default false) and --cross-entropy-fusion-impl (native | te, default native; read only
    # with the fusion on, as Megatron-Core's compute_language_model_loss reads it)
    "cross_entropy_loss_fusion": _bool(),
    "cross_entropy_fusion_impl": _choice(*(i.value for i in CrossEntropyFusionImpl)),
    # Transformer Engine userbuffer overlap (model_parallel_config.py l.265-340 @d98e8a64); the
    # switches default true, Megatron-LM's CLI spells them --disable-... (and --no-...).
    # CUDA graphs (mapping/cuda_graphs.py; Megatron-LM arguments.py @307dcf37): the scope is one
    # string of names separated by spaces or commas (Megatron takes a list).
    "cuda_graph_impl": _choice(*(i.value for i in CudaGraphImpl)),
    "cuda_graph_scope": _Key(kind=_Kind.STR),
    "enable_cuda_graph": _bool(),
    "external_cuda_graph": _bool(),
    "tp_comm_overlap": _bool(),
    "tp_comm_overlap_ag": _bool(),
    "disable_tp_comm_overlap_ag": _bool(),
    "tp_comm_overlap_rs": _bool(),
    "disable_tp_comm_overlap_rs": _bool(),
    "tp_comm_bulk_dgrad": _bool(),
    "disable_tp_comm_bulk_dgrad": _bool(),
    "tp_comm_bulk_wgrad": _bool(),
    "disable_tp_comm_bulk_wgrad": _bool(),
    "tp_comm_overlap_rs_dgrad": _bool(),
    # Transformer Engine's low-precision recipe (mapping/precision.py; Megatron-LM
    # transformer_config.py l.584-690, arguments.py l.1095-1109 @d98e8a64). fp8 itself (the
    # format) is a model key for inference's fp8 weights; fp4 is training-only.
    "fp8_recipe": _choice(*(r.value for r in Fp8Recipe), "custom"),
    "fp8_param_gather": _bool(),
    "first_last_layers_bf16": _bool(),
    "num_layers_at_start_in_bf16": _int(),
    "num_layers_at_end_in_bf16": _int(),
    "reuse_grad_buf_for_mxfp8_param_ag": _bool(),
    "fp4": _Key(kind=_Kind.FP4, choices=tuple(f.value for f in Fp4Format)),
    "fp4_recipe": _choice(*(r.value for r in Fp4Recipe), "custom"),
    "fp4_param_gather": _bool(),
    # Transformer Engine's FP8 attention (Megatron-LM --fp8-dot-product-attention /
    # --fp8-multi-head-attention, TransformerConfig fp8_dot_product_attention /
    # fp8_multi_head_attention): false, Megatron's default, is what the planner prices; true is
    # refused as not modelled (_precision)
    "fp8_dot_product_attention": _bool(),
    "fp8_multi_head_attention": _bool(),
}

# Keys both training and inference accept.
SHARED_KEYS: Mapping[str, _Key] = {
    "tensor_model_parallel_size": _int(),
    "pipeline_model_parallel_size": _int(),
    "context_parallel_size": _int(),
    "expert_model_parallel_size": _int(),
    "sequence_parallel": _bool(),
}

#: Context-parallel keys (training only; Megatron-LM ``--cp-comm-type`` takes one value or one
#: per layer, ``--hierarchical-context-parallel-sizes`` the a2a and p2p group sizes).
CONTEXT_KEYS: Mapping[str, _Key] = {
    "cp_comm_type": _Key(kind=_Kind.LIST),
    "hierarchical_context_parallel_sizes": _Key(kind=_Kind.LIST),
}

#: The expert grid's keys (training only; Megatron-LM ``transformer_config.py`` and
#: ``model_parallel_config.py`` fields, ``arguments.py`` flags @d98e8a64; shared reference
#: ``modern_parallelism.md`` section 2.1). ``expert_model_parallel_size`` is a shared key.
EXPERT_KEYS: Mapping[str, _Key] = {
    "expert_tensor_parallel_size": _int(),
    "moe_token_dispatcher_type": _choice(*(d.value for d in DispatcherType)),
    "moe_flex_dispatcher_backend": _choice(*(b.value for b in FlexBackend)),
    "moe_grouped_gemm": _bool(),
    "overlap_moe_expert_parallel_comm": _bool(),
    "moe_shared_expert_overlap": _bool(),
    # an option of the overlapped dispatcher (``--delay-wgrad-compute``, TransformerConfig
    # ``delay_wgrad_compute``); the laws refuse it without the EP overlap
    "delay_wgrad_compute": _bool(),
    # deprecated in Megatron-LM: flex with the deepep backend
    "moe_enable_deepep": _bool(),
    # the SMs the flex library's kernels hold (``--moe-deepep-num-sms``, default 20;
    # ``--moe-hybridep-num-sms``, default 16), each read only with its backend
    "moe_deepep_num_sms": _int(),
    "moe_hybridep_num_sms": _int(),
}

INFERENCE_KEYS: Mapping[str, _Key] = {
    "replicas": _int(),
    "batch_size": _int(),
    "prompt_length": _int(),
    "generated_tokens": _int(),
    "kv_cache_datatype": _choice(*(d.value for d in Datatype)),
}

MODEL_KEYS: Mapping[str, _Key] = {
    "model_name": _Key(kind=_Kind.STR),
    "num_layers": _int(),
    "hidden_size": _int(),
    "num_attention_heads": _int(),
    "group_query_attention": _bool(),
    "num_query_groups": _int(),
    "kv_channels": _int(),
    "ffn_hidden_size": _int(),
    "swiglu": _bool(),
    "squared_relu": _bool(),
    "normalization": _choice(*(n.value for n in Normalization)),
    "apply_layernorm_1p": _bool(),
    "attention_dropout": _Key(kind=_Kind.NUMBER),
    "hidden_dropout": _Key(kind=_Kind.NUMBER),
    # TransformerConfig activation_func_clamp_value (gpt-oss: 7.0): the GLU's clamp
    "activation_func_clamp_value": _Key(kind=_Kind.NUMBER),
    "position_embedding_type": _choice(*(p.value for p in PositionEmbedding)),
    "seq_length": _int(),
    "max_position_embeddings": _int(),
    "vocab_size": _int(),
    "padded_vocab_size": _int(),
    "make_vocab_size_divisible_by": _int(),
    "untie_embeddings_and_output_weights": _bool(),
    "add_bias_linear": _bool(),
    "disable_bias_linear": _bool(),
    "bf16": _bool(),
    "fp16": _bool(),
    "fp8": _Key(kind=_Kind.FP8, choices=tuple(f.value for f in Fp8Format)),
    # Mixture of experts (Megatron-LM transformer_config.py l.700-1030, arguments.py
    # l.3515-3560 @d98e8a64; shared reference modern_parallelism.md section 2.1).
    "num_experts": _int(),
    "moe_router_topk": _int(),
    "moe_ffn_hidden_size": _int(),
    "moe_shared_expert_intermediate_size": _int(),
    "moe_layer_freq": _Key(kind=_Kind.LAYER_FREQ),
    "moe_router_score_function": _choice(*(r.value for r in RouterScore)),
    "moe_router_enable_expert_bias": _bool(),
    "moe_router_pre_softmax": _bool(),
    "moe_router_load_balancing_type": _choice(*(b.value for b in LoadBalancing)),
    "moe_expert_capacity_factor": _Key(kind=_Kind.NUMBER),
    "moe_pad_expert_input_to_capacity": _bool(),
    # Blueprinting's own key (Megatron-LM has none): gamma = max/mean - 1 of the tokens an EP
    # rank receives (shared reference section 2.9); 0, the default, is what Megatron-Bridge's
    # benchmarks force with --moe-router-force-load-balancing.
    "moe_load_imbalance": _Key(kind=_Kind.NUMBER),
    # Multi-head latent attention (MLATransformerConfig; arguments.py hand-written flags).
    "multi_latent_attention": _bool(),
    "q_lora_rank": _int(),
    "kv_lora_rank": _int(),
    "qk_head_dim": _int(),
    "qk_pos_emb_head_dim": _int(),
    "v_head_dim": _int(),
    "qk_layernorm": _bool(),
    "mtp_num_layers": _Key(kind=_Kind.COUNT),
    # Attention sinks and sliding windows (gpt-oss; TransformerConfig softmax_type,
    # window_size = (window_size, 0), window_attn_skip_freq).
    "softmax_type": _choice(*(t.value for t in SoftmaxType)),
    "window_size": _int(),
    "window_attn_skip_freq": _int(),
}

#: Model keys that only a mixture of experts takes: refused without ``num_experts``.
MOE_KEYS = (
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "moe_layer_freq",
    "moe_router_score_function",
    "moe_router_enable_expert_bias",
    "moe_router_pre_softmax",
    "moe_router_load_balancing_type",
    "moe_expert_capacity_factor",
    "moe_pad_expert_input_to_capacity",
    "moe_load_imbalance",
)

#: Model keys that only multi-head latent attention takes.
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")

# Megatron-LM spells a few keys differently as flags than as config fields.
ALIASES: Mapping[str, str] = {
    "microbatch_group_size_per_virtual_pipeline_stage": "microbatch_group_size_per_vp_stage",
    "fp8_format": "fp8",
    "fp4_format": "fp4",
}

_NON_ARCHITECTURE_MODEL_KEYS = frozenset({"model_name", "bf16", "fp16", "fp8"})
_VIRTUAL_KEYS = (
    "num_layers_per_virtual_pipeline_stage",
    "num_virtual_stages_per_pipeline_rank",
    "virtual_pipeline_model_parallel_size",
)


def canonical_key(raw: str) -> str:
    """``--tensor-model-parallel-size`` -> ``tensor_model_parallel_size``; aliases resolved."""
    key = raw.strip().lstrip("-").replace("-", "_")
    return ALIASES.get(key, key)


def _given(keys: Mapping[str, object]) -> frozenset[str]:
    """The canonical names of the keys given a value, parsed or not: a key whose value is wrong
    has its own problem and is never also reported missing."""
    # YAML and JSON callers can hand non-string keys despite the annotation.
    names: list[object] = [k for k, v in keys.items() if v is not None]
    return frozenset(canonical_key(k) for k in names if isinstance(k, str))


def _parse_keys(
    keys: Mapping[str, object],
    allowed: Mapping[str, _Key],
    problems: list[str],
    refused: Mapping[str, str],
) -> dict[str, FlatValue]:
    """Normalize names, reject unknown/refused keys and wrong types; ``None`` means not given."""
    out: dict[str, FlatValue] = {}
    spelled: dict[str, str] = {}
    for raw_key, value in keys.items():
        # YAML and JSON callers can hand non-string keys despite the annotation.
        raw: object = raw_key
        if not isinstance(raw, str):
            problems.append(f"key {raw!r} is not a string")
            continue
        key = canonical_key(raw)
        if key in spelled:
            problems.append(f"key {key!r} is given twice (as {spelled[key]!r} and {raw!r})")
            continue
        spelled[key] = raw
        if key in refused:
            problems.append(f"key {raw!r} {refused[key]}")
            continue
        spec = allowed.get(key)
        if spec is None:
            hint = did_you_mean(key, tuple(allowed))
            problems.append(f"unknown key {raw!r}{hint}")
            continue
        if value is None:
            continue
        parsed = _parse_value(key, value, spec)
        if isinstance(parsed, _Problem):
            problems.append(parsed.text)
        else:
            out[key] = parsed
    return out


@final
@dataclass(frozen=True, slots=True)
class _Problem:
    text: str


def _parse_value(key: str, value: object, spec: _Key) -> FlatValue | _Problem:
    wrong = _Problem(f"{key} must be {spec.kind}, got {value!r} ({type(value).__name__})")
    match spec.kind:
        case _Kind.INT:
            if type(value) is not int:
                return wrong
            if value < 1:
                return _Problem(f"{key} must be a positive integer, got {value!r}")
            if value > MAX_INT:
                return _Problem(
                    f"{key} must be a positive integer at most {int_limit_text()}, got {value!r}"
                )
            return value
        case _Kind.BOOL:
            return value if type(value) is bool else wrong
        case _Kind.STR:
            if not isinstance(value, str):
                return wrong
            if spec.choices and value not in spec.choices:
                hint = did_you_mean(value, spec.choices)
                return _Problem(
                    f"{key} must be one of {', '.join(spec.choices)}, got {value!r}{hint}"
                )
            return value
        case _Kind.FP8 | _Kind.FP4:
            if type(value) is bool:
                return value
            if isinstance(value, str) and value in spec.choices:
                return value
            if isinstance(value, str):
                hint = did_you_mean(value, spec.choices)
                return _Problem(f"{key} must be {spec.kind}, got {value!r}{hint}")
            return wrong
        case _Kind.COUNT:
            if type(value) is not int:
                return wrong
            if not 0 <= value <= MAX_INT:
                return _Problem(
                    f"{key} must be {spec.kind} at most {int_limit_text()}, got {value!r}"
                )
            return value
        case _Kind.NUMBER:
            if type(value) is bool or not isinstance(value, (int, float)):
                return wrong
            if not math.isfinite(value):
                return _Problem(f"{key} must be a finite number, got {value!r}")
            return float(value)
        case _Kind.LAYER_FREQ:
            if type(value) is int:
                if value < 1:
                    return _Problem(f"{key} must be a positive integer, got {value!r}")
                return value
            if isinstance(value, str):
                return value
            if isinstance(value, (list, tuple)) and all(type(x) is int for x in value):
                return "[" + ",".join(str(x) for x in value) + "]"
            return wrong
        case _Kind.LIST:
            # Megatron takes these as nargs lists; one space-separated string here, so that a
            # flat value stays a scalar (a TOML or YAML list is joined).
            if isinstance(value, str):
                return value
            if isinstance(value, (list, tuple)) and all(
                isinstance(x, str) or (type(x) is int and 0 < x <= MAX_INT) for x in value
            ):
                return " ".join(str(x) for x in value)
            return wrong
        case _ as unreachable:
            assert_never(unreachable)


def _get_int(values: Mapping[str, FlatValue], key: str) -> int | None:
    value = values.get(key)
    return value if type(value) is int else None


def _get_bool(values: Mapping[str, FlatValue], key: str) -> bool | None:
    value = values.get(key)
    return value if type(value) is bool else None


def _get_str(values: Mapping[str, FlatValue], key: str) -> str | None:
    value = values.get(key)
    return value if isinstance(value, str) else None


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------
def default_ffn_hidden_size(hidden_size: int, activation: MlpActivation) -> int:
    """Megatron-LM's ``ffn_hidden_size`` default (``arguments.py``): 4h, or with SwiGLU
    ``int((4h * 2/3) / 64) * 64`` so that the two up projections keep about 8h^2 parameters."""
    match activation:
        case MlpActivation.GELU | MlpActivation.SQUARED_RELU:
            return 4 * hidden_size
        case MlpActivation.SWIGLU:
            return (8 * hidden_size) // 192 * 64
        case _ as unreachable:
            assert_never(unreachable)


def padded_vocab(vocab_size: int, divisible_by: int, tensor_degree: int) -> int:
    """Megatron-LM's vocabulary padding (``_vocab_size_with_padding``): round up to a multiple
    of ``make_vocab_size_divisible_by * t``."""
    multiple = divisible_by * tensor_degree
    return -(-vocab_size // multiple) * multiple


def _model(
    values: Mapping[str, FlatValue],
    base: TransformerModelSpec | None,
    tensor_degree: int,
    problems: list[str],
    given: frozenset[str] = frozenset(),
) -> TransformerModelSpec | None:
    if base is None:
        present = given | set(values)
        missing = [
            k
            for k in ("num_layers", "hidden_size", "num_attention_heads", "seq_length")
            if k not in present
        ]
        if "vocab_size" not in present and "padded_vocab_size" not in present:
            missing.append("vocab_size")
        if missing:
            problems.append("no model preset given and model key(s) missing: " + ", ".join(missing))
        if missing or any(k not in values for k in given & MODEL_KEYS.keys()):
            return None

    def pick(key: str, from_base: int, fallback: int = 0) -> int:
        given = _get_int(values, key)
        if given is not None:
            return given
        return from_base if base is not None else fallback

    layers = pick("num_layers", base.num_layers if base else 0)
    hidden = pick("hidden_size", base.hidden_size if base else 0)
    heads = pick("num_attention_heads", base.num_attention_heads if base else 0)
    seq = pick("seq_length", base.seq_length if base else 0)

    swiglu = _get_bool(values, "swiglu")
    squared_relu = _get_bool(values, "squared_relu")
    if swiglu and squared_relu:
        # Megatron-LM arguments.py: ``--squared-relu`` asserts ``not args.swiglu``
        problems.append("swiglu and squared_relu are exclusive (Megatron-LM refuses both)")
    if squared_relu:
        activation = MlpActivation.SQUARED_RELU
    elif swiglu is not None:
        activation = MlpActivation.SWIGLU if swiglu else MlpActivation.GELU
    elif squared_relu is not None and base is not None:
        # squared_relu = false on a squared-ReLU preset falls back to Megatron's GELU
        activation = (
            MlpActivation.GELU if base.activation is MlpActivation.SQUARED_RELU else base.activation
        )
    else:
        activation = base.activation if base else MlpActivation.GELU
    zero_centered = _get_bool(values, "apply_layernorm_1p")
    if zero_centered is None:
        zero_centered = base.layernorm_zero_centered_gamma if base else False
    attention_dropout = _get_number(values, "attention_dropout")
    if attention_dropout is None:
        attention_dropout = base.attention_dropout if base else DEFAULT_DROPOUT
    hidden_dropout = _get_number(values, "hidden_dropout")
    if hidden_dropout is None:
        hidden_dropout = base.hidden_dropout if base else DEFAULT_DROPOUT
    clamp = _get_number(values, "activation_func_clamp_value")
    if clamp is None and base is not None:
        clamp = base.activation_func_clamp_value

    # kv_channels / ffn / query groups: a base value that was Megatron's default follows the
    # overridden fields; an explicit one stays.
    kv = _get_int(values, "kv_channels")
    if kv is None:
        if base is not None and base.kv_channels != base.hidden_size // base.num_attention_heads:
            kv = base.kv_channels
        else:
            kv = hidden // heads
    ffn = _get_int(values, "ffn_hidden_size")
    if ffn is None:
        if base is not None and base.ffn_hidden_size != default_ffn_hidden_size(
            base.hidden_size, base.activation
        ):
            ffn = base.ffn_hidden_size
        else:
            ffn = default_ffn_hidden_size(hidden, activation)

    gqa = _get_bool(values, "group_query_attention")
    groups = _get_int(values, "num_query_groups")
    if gqa is True:
        if groups is None:
            # Megatron-LM's --num-query-groups defaults to 1 (multi-query attention).
            groups = base.num_query_groups if base is not None and base.is_gqa else 1
    elif groups is not None and groups != heads:
        problems.append(
            f"num_query_groups = {groups} needs group_query_attention = true "
            "(Megatron-LM ignores it otherwise)"
        )
    elif gqa is None and base is not None and base.is_gqa:
        groups = base.num_query_groups
    else:
        groups = heads

    vocab = _get_int(values, "vocab_size")
    padded = _get_int(values, "padded_vocab_size")
    divisible = _get_int(values, "make_vocab_size_divisible_by")
    if padded is not None and divisible is not None:
        problems.append("give padded_vocab_size or make_vocab_size_divisible_by, not both")
    if vocab is None:
        vocab = padded if padded is not None else (base.vocab_size if base else 0)
    if padded is None:
        if divisible is not None:
            padded = padded_vocab(vocab, divisible, tensor_degree)
        elif "vocab_size" in values or base is None:
            padded = vocab
        else:
            padded = base.padded_vocab_size
    if padded < vocab:
        problems.append(f"padded_vocab_size = {padded} is smaller than vocab_size = {vocab}")

    normalization_key = _get_str(values, "normalization")
    normalization = (
        Normalization(normalization_key)
        if normalization_key is not None
        else (base.normalization if base else Normalization.LAYERNORM)
    )
    position_key = _get_str(values, "position_embedding_type")
    position = (
        PositionEmbedding(position_key)
        if position_key is not None
        else (base.position_embedding if base else PositionEmbedding.LEARNED_ABSOLUTE)
    )
    max_positions = _get_int(values, "max_position_embeddings")
    if (
        max_positions is not None
        and position is PositionEmbedding.LEARNED_ABSOLUTE
        and max_positions != seq
    ):
        problems.append(
            f"max_position_embeddings = {max_positions} differs from seq_length = {seq}: "
            "Blueprinting sizes the learned position table by seq_length"
        )
    untie = _get_bool(values, "untie_embeddings_and_output_weights")
    embeddings = (
        (EmbeddingTying.UNTIED if untie else EmbeddingTying.TIED)
        if untie is not None
        else (base.embeddings if base else EmbeddingTying.TIED)
    )
    bias = _get_bool(values, "add_bias_linear")
    disable_bias = _get_bool(values, "disable_bias_linear")
    if bias is not None and disable_bias is not None and bias == disable_bias:
        problems.append(
            f"add_bias_linear = {bias} conflicts with disable_bias_linear = {disable_bias}"
        )
    if bias is None:
        bias = (
            (not disable_bias)
            if disable_bias is not None
            else (base.add_bias_linear if base else True)
        )

    self_attention = _self_attention(values, base, gqa=groups != heads, problems=problems)
    feed_forward = _feed_forward(values, base, ffn=ffn, layers=layers, problems=problems)
    window = _attention_window(values, base, problems)
    qk_layernorm = _get_bool(values, "qk_layernorm")
    if qk_layernorm is None:
        qk_layernorm = base.qk_layernorm if base else False
    mtp = _get_int(values, "mtp_num_layers")
    if mtp is None:
        mtp = base.mtp_num_layers if base else 0
    softmax_key = _get_str(values, "softmax_type")
    softmax = (
        SoftmaxType(softmax_key)
        if softmax_key is not None
        else (base.softmax_type if base else SoftmaxType.VANILLA)
    )

    datatype = _datatype(values, base, problems)
    name = _get_str(values, "model_name") or (base.name if base else "custom")
    architecture_given = any(
        k not in _NON_ARCHITECTURE_MODEL_KEYS for k in values if k in MODEL_KEYS
    )
    kept = base is not None and not architecture_given
    published = base.published_parameters if kept and base is not None else None
    published_active = base.published_active_parameters if kept and base is not None else None

    if problems:
        return None
    try:
        return TransformerModelSpec(
            name=name,
            num_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_query_groups=groups,
            kv_channels=kv,
            ffn_hidden_size=ffn,
            seq_length=seq,
            vocab_size=vocab,
            padded_vocab_size=padded,
            activation=activation,
            normalization=normalization,
            position_embedding=position,
            embeddings=embeddings,
            add_bias_linear=bias,
            datatype=datatype,
            published_parameters=published,
            published_active_parameters=published_active,
            self_attention=self_attention,
            feed_forward=feed_forward,
            qk_layernorm=qk_layernorm,
            mtp_num_layers=mtp,
            softmax_type=softmax,
            attention_window=window,
            layernorm_zero_centered_gamma=zero_centered,
            attention_dropout=attention_dropout,
            hidden_dropout=hidden_dropout,
            activation_func_clamp_value=clamp,
        )
    except ConfigError as error:
        problems.extend(error.problems)
        return None


# Megatron-LM's MLA flag defaults (arguments.py, hand-written MLA flags @d98e8a64; shared
# reference section 2.1): q_lora_rank None, kv_lora_rank 32, qk_head_dim 128,
# qk_pos_emb_head_dim 64, v_head_dim 128.
_MLA_DEFAULTS = MultiLatentAttention(
    q_lora_rank=None, kv_lora_rank=32, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128
)


def _self_attention(
    values: Mapping[str, FlatValue],
    base: TransformerModelSpec | None,
    *,
    gqa: bool,
    problems: list[str],
) -> SelfAttention:
    """``multi_latent_attention`` and its ranks; MLA keys without it are refused, and MLA
    with grouped-query attention (Megatron-LM arguments.py l.1973-1974)."""
    flag = _get_bool(values, "multi_latent_attention")
    base_mla = (
        base.self_attention
        if base is not None and isinstance(base.self_attention, MultiLatentAttention)
        else None
    )
    mla_on = flag if flag is not None else base_mla is not None
    if not mla_on:
        for key in MLA_KEYS:
            if key in values:
                problems.append(f"{key} needs multi_latent_attention = true")
        return StandardAttention()
    if gqa:
        problems.append(
            "multi_latent_attention cannot be combined with group_query_attention "
            "(Megatron-LM arguments.py l.1973-1974)"
        )
    start = base_mla or _MLA_DEFAULTS
    try:
        return MultiLatentAttention(
            q_lora_rank=_get_int(values, "q_lora_rank") or start.q_lora_rank,
            kv_lora_rank=_get_int(values, "kv_lora_rank") or start.kv_lora_rank,
            qk_head_dim=_get_int(values, "qk_head_dim") or start.qk_head_dim,
            qk_pos_emb_head_dim=_get_int(values, "qk_pos_emb_head_dim")
            or start.qk_pos_emb_head_dim,
            v_head_dim=_get_int(values, "v_head_dim") or start.v_head_dim,
        )
    except ConfigError as error:
        problems.extend(error.problems)
        return start


def _get_number(values: Mapping[str, FlatValue], key: str) -> float | None:
    value = values.get(key)
    return float(value) if isinstance(value, (int, float)) and type(value) is not bool else None


def _feed_forward(
    values: Mapping[str, FlatValue],
    base: TransformerModelSpec | None,
    *,
    ffn: int,
    layers: int,
    problems: list[str],
) -> FeedForward:
    """``num_experts`` and the MoE keys, checked with Megatron-LM's model-only rules (shared
    reference section 2.12), every violated one reported."""
    base_moe = base.moe if base is not None else None
    experts = _get_int(values, "num_experts")
    if experts is None and base_moe is None:
        for key in MOE_KEYS:
            if key in values:
                problems.append(f"{key} needs num_experts (a mixture of experts)")
        return DenseFeedForward()
    num_experts = experts if experts is not None else (base_moe.num_experts if base_moe else 0)
    # Megatron-LM's defaults: top-k 2, moe_ffn_hidden_size = ffn_hidden_size, softmax scores.
    top_k = _get_int(values, "moe_router_topk") or (base_moe.top_k if base_moe else 2)
    expert_ffn = _get_int(values, "moe_ffn_hidden_size") or (
        base_moe.expert_ffn_hidden_size if base_moe else ffn
    )
    shared = _get_int(values, "moe_shared_expert_intermediate_size")
    if shared is None:
        shared = base_moe.shared_expert_ffn_hidden_size if base_moe else 0
    score_key = _get_str(values, "moe_router_score_function")
    score = (
        RouterScore(score_key)
        if score_key is not None
        else (base_moe.score_function if base_moe else RouterScore.SOFTMAX)
    )
    bias = _get_bool(values, "moe_router_enable_expert_bias")
    if bias is None:
        bias = base_moe.expert_bias if base_moe else False
    pre_softmax = _get_bool(values, "moe_router_pre_softmax")
    if pre_softmax is None:
        pre_softmax = base_moe.pre_softmax if base_moe else False
    balancing_key = _get_str(values, "moe_router_load_balancing_type")
    balancing = (
        LoadBalancing(balancing_key)
        if balancing_key is not None
        else (base_moe.load_balancing if base_moe else LoadBalancing.AUX_LOSS)
    )
    imbalance = _get_number(values, "moe_load_imbalance")
    if imbalance is None:
        imbalance = base_moe.load_imbalance if base_moe else 0.0
    dropping = _token_dropping(values, base_moe, problems)
    pattern = _layer_pattern(values, base_moe, layers, problems)

    if top_k > num_experts:
        problems.append(
            f"moe_router_topk = {top_k} exceeds num_experts = {num_experts} "
            "(Megatron-LM: a token is routed to at most every expert)"
        )
    if bias and score is RouterScore.SOFTMAX:
        problems.append(
            "moe_router_enable_expert_bias needs moe_router_score_function sigmoid or "
            "sqrtsoftplus, got softmax (Megatron-LM transformer_config.py l.2617-2625)"
        )
    sinkhorn = balancing is LoadBalancing.SINKHORN
    if top_k == 1 and score is RouterScore.SOFTMAX and not pre_softmax and not sinkhorn:
        problems.append(
            "moe_router_topk = 1 with moe_router_score_function = softmax needs "
            "moe_router_pre_softmax = true or sinkhorn balancing (Megatron-LM "
            'transformer_config.py l.2661-2669: "Please use --moe-router-pre-softmax when topk '
            'is 1")'
        )
    imbalance_bad = load_imbalance_problem(imbalance, num_experts)
    if imbalance_bad is not None:
        problems.append(imbalance_bad)
    if problems:
        return DenseFeedForward()
    return MixtureOfExperts(
        num_experts=num_experts,
        top_k=top_k,
        expert_ffn_hidden_size=expert_ffn,
        shared_expert_ffn_hidden_size=shared,
        score_function=score,
        expert_bias=bias,
        pre_softmax=pre_softmax,
        load_balancing=balancing,
        dropping=dropping,
        layer_pattern=pattern,
        load_imbalance=imbalance,
    )


def _token_dropping(
    values: Mapping[str, FlatValue], base_moe: MixtureOfExperts | None, problems: list[str]
) -> TokenDropping:
    factor = _get_number(values, "moe_expert_capacity_factor")
    pad = _get_bool(values, "moe_pad_expert_input_to_capacity")
    base_dropping: TokenDropping = base_moe.dropping if base_moe else Dropless()
    if factor is None:
        match base_dropping:
            case CapacityFactor(factor=base_factor, pad_to_capacity=base_pad):
                return CapacityFactor(
                    factor=base_factor, pad_to_capacity=base_pad if pad is None else pad
                )
            case Dropless():
                if pad:
                    problems.append(
                        "moe_pad_expert_input_to_capacity needs moe_expert_capacity_factor "
                        "(Megatron-LM transformer_config.py l.1836-1866)"
                    )
                return Dropless()
            case _ as unreachable:
                assert_never(unreachable)
    if not factor > 0:
        problems.append(
            f"moe_expert_capacity_factor = {factor:g} must be > 0 (Megatron-LM reads a "
            "negative factor as dropless: leave the key out instead)"
        )
        return Dropless()
    return CapacityFactor(factor=factor, pad_to_capacity=bool(pad))


def _layer_pattern(
    values: Mapping[str, FlatValue],
    base_moe: MixtureOfExperts | None,
    layers: int,
    problems: list[str],
) -> MoeLayerFrequency | MoeLayerList:
    raw = values.get("moe_layer_freq")
    if isinstance(raw, (int, str)) and type(raw) is not bool:
        try:
            pattern = parse_moe_layer_freq(raw)
        except ConfigError as error:
            problems.extend(error.problems)
            return MoeLayerFrequency()
    else:
        pattern = base_moe.layer_pattern if base_moe else MoeLayerFrequency()
    if isinstance(pattern, MoeLayerList) and len(pattern.layers) != layers:
        problems.append(
            f"moe_layer_freq lists {len(pattern.layers)} layers, num_layers = {layers} "
            "(Megatron-LM requires one flag per layer)"
        )
    return pattern


def _attention_window(
    values: Mapping[str, FlatValue], base: TransformerModelSpec | None, problems: list[str]
) -> AttentionWindow:
    size = _get_int(values, "window_size")
    every = _get_int(values, "window_attn_skip_freq")
    base_window: AttentionWindow = base.attention_window if base else FullAttention()
    if size is None:
        match base_window:
            case SlidingWindow(size=base_size, full_every=base_every):
                return SlidingWindow(size=base_size, full_every=every or base_every)
            case FullAttention():
                if every is not None:
                    problems.append("window_attn_skip_freq needs window_size")
                return FullAttention()
            case _ as unreachable:
                assert_never(unreachable)
    if every is None and isinstance(base_window, SlidingWindow):
        every = base_window.full_every
    return SlidingWindow(size=size, full_every=every)


def _datatype(
    values: Mapping[str, FlatValue], base: TransformerModelSpec | None, problems: list[str]
) -> Datatype:
    """Megatron-LM's precision flags: fp8 runs on top of bf16 or fp16; bf16 and fp16 exclude
    each other; none of them means fp32."""
    bf16 = _get_bool(values, "bf16")
    fp16 = _get_bool(values, "fp16")
    fp8 = values.get("fp8")
    if bf16 is None and fp16 is None and fp8 is None:
        return base.datatype if base else Datatype.FP32
    if bf16 and fp16:
        problems.append("bf16 and fp16 are both true")
    if fp8 is not None and fp8 is not False:
        return Datatype.FP8
    if bf16:
        return Datatype.BF16
    if fp16:
        return Datatype.FP16
    return Datatype.FP32


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------
def _unsupported_sizes(values: Mapping[str, FlatValue], *, serving: bool = False) -> list[str]:
    """Degrees not modelled: context parallelism when serving (training models it and expert
    parallelism; serving models expert parallelism over the TP group,
    ``ServingExpertParallel``)."""
    out: list[str] = []
    sizes: list[tuple[str, str]] = []
    if serving:
        sizes.append(("context_parallel_size", "context parallelism in serving"))
    for key, what in sizes:
        size = _get_int(values, key)
        if size is not None and size != 1:
            out.append(f"{key} = {size}: {what} is not modelled (only 1 is accepted)")
    return out


def _list_items(text: str) -> list[str]:
    """A space- or comma-separated list, a YAML-style ``[a, b]`` read too."""
    cleaned = text.strip().strip("[]").replace("'", " ").replace('"', " ")
    return [item for item in cleaned.replace(",", " ").split() if item]


#: Spellings Megatron-LM's help text uses that Transformer Engine refuses (section 1.2 of
#: ``shared/reference/modern_parallelism.md``): read as the TE value, emitted as the TE value.
_CP_COMM_SPELLINGS = {"allgather": CpCommType.ALL_GATHER.value}


def _context(
    values: Mapping[str, FlatValue], num_layers: int | None, problems: list[str]
) -> ContextParallel:
    """``context_parallel_size``, ``cp_comm_type`` (one value, or one per layer: then exactly
    ``num_layers`` of them, ``transformer_config.py`` l.3103-3112) and
    ``hierarchical_context_parallel_sizes`` (required by a2a+p2p, arguments.py l.583-585) as
    the cp axis. Different comm types on different layers are not modelled (one block is
    costed for all layers): refused by name."""
    cp = _get_int(values, "context_parallel_size") or 1
    text = _get_str(values, "cp_comm_type")
    sizes_text = _get_str(values, "hierarchical_context_parallel_sizes")
    known = [c.value for c in CpCommType]
    kinds: list[CpCommType] = []
    for raw in _list_items(text) if text is not None else []:
        name = _CP_COMM_SPELLINGS.get(raw, raw)
        if name not in known:
            problems.append(
                f"cp_comm_type: unknown value {raw!r}{did_you_mean(raw, known)}; values: "
                + ", ".join(known)
            )
            continue
        kinds.append(CpCommType(name))
    if text is not None and not kinds and not problems:
        problems.append("cp_comm_type must name at least one comm type, got an empty value")
    if len(kinds) > 1 and num_layers is not None and len(kinds) != num_layers:
        problems.append(
            f"cp_comm_type lists {len(kinds)} values; a list needs one per layer "
            f"(num_layers = {num_layers}) or a single value"
        )
    if len(set(kinds)) > 1:
        problems.append(
            "cp_comm_type mixes "
            + ", ".join(sorted({k.value for k in kinds}))
            + " across layers: per-layer comm types are not modelled yet (one block is costed "
            "for every layer); give one value"
        )
    kind = kinds[0] if kinds else CpCommType.P2P
    sizes: list[int] = []
    if sizes_text is not None:
        for item in _list_items(sizes_text):
            size = decimal_value(item)
            if size is None or not 1 <= size <= MAX_INT:
                problems.append(
                    "hierarchical_context_parallel_sizes must be positive integers at most "
                    f"{int_limit_text()}, got {item[:40]!r}"
                )
            else:
                sizes.append(size)
    communication: CpCommunication
    match kind:
        case CpCommType.P2P | CpCommType.ALL_GATHER | CpCommType.A2A:
            communication = single_level_communication(kind)
        case CpCommType.A2A_P2P:
            if len(sizes) != 2:
                problems.append(
                    "cp_comm_type = a2a+p2p needs hierarchical_context_parallel_sizes = "
                    '<a2a size> <p2p size> (Megatron-LM: "--hierarchical-context-parallel-sizes '
                    f'must be set when a2a+p2p is used"), got {sizes_text!r}'
                )
                communication = RingExchange()
            else:
                communication = HierarchicalAllToAllRing(a2a_size=sizes[0], p2p_size=sizes[1])
        case _ as unreachable:
            assert_never(unreachable)
    if sizes_text is not None and kind is not CpCommType.A2A_P2P:
        problems.append(
            "hierarchical_context_parallel_sizes is read only with cp_comm_type = a2a+p2p "
            f"(got cp_comm_type = {kind.value})"
        )
    return ContextParallel(degree=cp, communication=communication)


def _experts(
    values: Mapping[str, FlatValue],
    model: TransformerModelSpec | None,
    t: int,
    problems: list[str],
) -> ExpertParallel:
    """The expert grid of ``expert_model_parallel_size`` and the :data:`EXPERT_KEYS`, with
    Megatron-LM's defaults for a mixture-of-experts model (``arguments.py`` l.587-588 and the
    ``transformer_config.py`` fields @d98e8a64): ``expert_tensor_parallel_size`` = t,
    ``moe_token_dispatcher_type`` = allgather, ``moe_flex_dispatcher_backend`` = deepep,
    ``moe_grouped_gemm``, ``overlap_moe_expert_parallel_comm`` and
    ``moe_shared_expert_overlap`` false. A dense model keeps the unread default grid; ep > 1 on
    it is left to the ``expert_parallel_needs_moe`` law, the other keys are refused here.

    A key the chosen dispatcher does not read is refused where Megatron-LM would ignore it or
    raise: a backend without flex (``ncclep`` => flex, ``transformer_config.py`` l.1743-1791),
    the EP overlap or the shared-expert overlap with allgather (l.3002-3071, l.1820-1826), the
    deprecated ``moe_enable_deepep`` without flex or beside another backend ("DeepEP backend is
    only supported with flex token dispatcher")."""
    ep = _get_int(values, "expert_model_parallel_size") or 1
    if model is not None and model.moe is None:
        stray = [k for k in EXPERT_KEYS if k in values]
        if stray:
            problems.append(
                f"{', '.join(stray)}: read only for a mixture-of-experts model; model "
                f"{model.name!r} has dense feed-forward layers"
            )
        return ExpertParallel(degree=ep)
    etp = _get_int(values, "expert_tensor_parallel_size") or t
    kind_text = _get_str(values, "moe_token_dispatcher_type")
    backend_text = _get_str(values, "moe_flex_dispatcher_backend")
    deepep = _get_bool(values, "moe_enable_deepep") is True
    kind = DispatcherType(kind_text) if kind_text is not None else DispatcherType.ALLGATHER
    overlap = _get_bool(values, "overlap_moe_expert_parallel_comm") is True
    shared = _get_bool(values, "moe_shared_expert_overlap") is True
    delay = _get_bool(values, "delay_wgrad_compute") is True
    if deepep and kind is not DispatcherType.FLEX:
        problems.append(
            f"moe_enable_deepep = true needs moe_token_dispatcher_type = flex, got {kind.value} "
            '(Megatron-LM: "DeepEP backend is only supported with flex token dispatcher")'
        )
    if deepep and backend_text not in (None, FlexBackend.DEEPEP.value):
        problems.append(
            f"moe_enable_deepep = true selects the deepep backend, which conflicts with "
            f"moe_flex_dispatcher_backend = {backend_text} (Megatron-LM: only one backend is "
            "supported for the flex token dispatcher)"
        )
    sms_keys = FLEX_SMS_KEYS
    dispatcher: TokenDispatcher
    match kind:
        case DispatcherType.FLEX:
            backend = FlexBackend(backend_text) if backend_text is not None else FlexBackend.DEEPEP
            sms: int | None = None
            for other, key in sms_keys.items():
                if key not in values:
                    continue
                if other is backend:
                    sms = _get_int(values, key)
                else:
                    problems.append(
                        f"{key} is read only with moe_flex_dispatcher_backend = {other.value}, "
                        f"got {backend.value}"
                    )
            bad_sms = None if sms is None else positive_int_problem(sms_keys[backend], sms)
            if bad_sms is not None:
                problems.append(bad_sms)
                sms = None
            dispatcher = FlexDispatcher(
                backend=backend,
                overlap=overlap,
                shared_expert_overlap=shared,
                delay_wgrad_compute=delay,
                sms=sms,
            )
        case DispatcherType.ALLTOALL | DispatcherType.ALLGATHER:
            if backend_text is not None:
                problems.append(
                    f"moe_flex_dispatcher_backend = {backend_text} is read only with "
                    f"moe_token_dispatcher_type = flex, got {kind.value} (Megatron-LM "
                    "transformer_config.py l.1743-1791)"
                )
            for key in sms_keys.values():
                if key in values:
                    problems.append(
                        f"{key} is read only with moe_token_dispatcher_type = flex, got "
                        f"{kind.value}"
                    )
            if kind is DispatcherType.ALLTOALL:
                dispatcher = AllToAllDispatcher(
                    overlap=overlap, shared_expert_overlap=shared, delay_wgrad_compute=delay
                )
            else:
                dispatcher = AllGatherDispatcher()
                for key, on, where in (
                    ("overlap_moe_expert_parallel_comm", overlap, "l.3002-3071"),
                    ("moe_shared_expert_overlap", shared, "l.1820-1826"),
                    ("delay_wgrad_compute", delay, "l.3073-3077 (it needs the EP overlap)"),
                ):
                    if on:
                        problems.append(
                            f"{key} = true needs moe_token_dispatcher_type = alltoall or flex, "
                            f"got allgather (Megatron-LM transformer_config.py {where}; "
                            "allgather is Megatron's default dispatcher)"
                        )
        case _ as unreachable:
            assert_never(unreachable)
    return ExpertParallel(
        degree=ep,
        tensor_degree=etp,
        dispatcher=dispatcher,
        grouped_gemm=_get_bool(values, "moe_grouped_gemm") is True,
    )


#: the flat key of each flex library's SMs (``FlexDispatcher.sms``), read with its backend only
FLEX_SMS_KEYS: Mapping[FlexBackend, str] = MappingProxyType(
    {FlexBackend.DEEPEP: "moe_deepep_num_sms", FlexBackend.HYBRIDEP: "moe_hybridep_num_sms"}
)


def grad_reduce_datatype_of(
    values: Mapping[str, FlatValue], datatype: Datatype, problems: list[str]
) -> GradReduceDtype:
    """``DataParallel.grad_reduce_dtype`` from its three keys (:class:`GradReduceDtype`) for a
    model trained in ``datatype``. Megatron-LM's pair: ``accumulate_allreduce_grads_in_fp32``
    gives fp32, ``grad_reduce_in_bf16`` the bf16 parameters' datatype (read only under ``--bf16``:
    refused otherwise), neither Megatron-LM's rule (``arguments.py`` l.1204-1217 @d98e8a64, where
    ``--grad-reduce-in-bf16`` silently wins over the other: refused here). Megatron-Core's
    ``grad_reduce_in_fp32``: fp32, or the parameters' datatype; given beside Megatron-LM's
    keys it must name the datatype they do."""
    fp32_flag = _get_bool(values, "accumulate_allreduce_grads_in_fp32")
    bf16_flag = _get_bool(values, "grad_reduce_in_bf16")
    mcore = _get_bool(values, "grad_reduce_in_fp32")
    params = parameter_datatype(datatype)
    if fp32_flag is True and bf16_flag is True:
        problems.append(
            "accumulate_allreduce_grads_in_fp32 = true contradicts grad_reduce_in_bf16 = true "
            "(fp32 or bf16 gradient reduction: give one; Megatron-LM lets --grad-reduce-in-bf16 "
            "win, arguments.py l.1213-1214)"
        )
        return GradReduceDtype.DEFAULT
    if bf16_flag is True and params is not Datatype.BF16:
        problems.append(
            f"grad_reduce_in_bf16 = true needs bf16 training, the model is {params.value} "
            "(Megatron-LM reads --grad-reduce-in-bf16 only under --bf16, arguments.py "
            "l.1204-1217; grad_reduce_in_fp32 = false reduces in the parameters' datatype)"
        )
        return GradReduceDtype.DEFAULT
    megatron_lm = (
        GradReduceDtype.FP32
        if fp32_flag is True
        else GradReduceDtype.PARAMS
        if bf16_flag is True
        else GradReduceDtype.DEFAULT
    )
    if mcore is None:
        return megatron_lm
    chosen = GradReduceDtype.FP32 if mcore else GradReduceDtype.PARAMS
    given = [
        f"{key} = {str(value).lower()}"
        for key, value in (
            ("accumulate_allreduce_grads_in_fp32", fp32_flag),
            ("grad_reduce_in_bf16", bf16_flag),
        )
        if value is not None
    ]
    if given and grad_reduce_datatype(params, megatron_lm) is not grad_reduce_datatype(
        params, chosen
    ):
        problems.append(
            f"grad_reduce_in_fp32 = {str(mcore).lower()} contradicts {' and '.join(given)}: "
            f"for {params.value} training they reduce gradients in "
            f"{grad_reduce_datatype(params, chosen).value} and "
            f"{grad_reduce_datatype(params, megatron_lm).value} (give one spelling)"
        )
    return chosen


def from_mapping(
    keys: Mapping[str, object], *, model: TransformerModelSpec | None = None
) -> TrainingSpec:
    """Build a training spec from flat Megatron-LM keys (see the module docstring)."""
    problems: list[str] = []
    allowed = {**SHARED_KEYS, **TRAINING_KEYS, **MODEL_KEYS}
    refused = {k: "is an inference key; training uses data_parallel_size" for k in INFERENCE_KEYS}
    values = _parse_keys(keys, {**allowed, **CONTEXT_KEYS, **EXPERT_KEYS}, problems, refused)

    t = _get_int(values, "tensor_model_parallel_size") or 1
    p = _get_int(values, "pipeline_model_parallel_size") or 1
    spec_model = _model(
        {k: v for k, v in values.items() if k in MODEL_KEYS}, model, t, problems, _given(keys)
    )
    context = _context(values, None if spec_model is None else spec_model.num_layers, problems)
    cp = context.degree
    experts = _experts(values, spec_model, t, problems)

    # Data-parallel degree: Megatron derives it as world_size // (t * p * cp).
    d = _get_int(values, "data_parallel_size")
    world = _get_int(values, "world_size")
    world_violation: LawViolation | None = None
    expert_world: LawViolation | None = None
    model_size = t * cp * p
    # The cp factor is spelt out only when cp > 1, so the messages of t x p x d stay as they were.
    names, sizes = ("t * cp * p", f"{t} * {cp} * {p}") if cp > 1 else ("t * p", f"{t} * {p}")
    if d is not None and world is not None and world != model_size * d:
        problems.append(
            f"data_parallel_size = {d} conflicts with world_size = {world} "
            f"(world_size = {names} * d = {sizes} * {d} = {model_size * d})"
        )
    elif d is None and world is None:
        problems.append("one of data_parallel_size or world_size is required")
    elif d is None and world is not None:
        if world % model_size != 0:
            world_violation = LawViolation(
                law="world_size",
                formula=f"world_size = {names} * d",
                values=(
                    (("world_size", world), ("t", t), ("cp", cp), ("p", p))
                    if cp > 1
                    else (("world_size", world), ("t", t), ("p", p))
                ),
                message=f"d = world_size / ({names}) = {world} / ({sizes}) is not integral",
            )
            from blueprinting.mapping.expert_laws import expert_world_violation

            expert_world = (
                expert_world_violation(world, experts.tensor_degree, experts.degree, p)
                if spec_model is not None and spec_model.moe is not None
                else None
            )
        d = max(world // model_size, 1)

    unsupported = _unsupported_sizes(values)
    schedule, layout = _pipeline(
        values,
        p,
        spec_model,
        problems,
        unsupported,
        ep_overlap=dispatcher_overlaps(experts.dispatcher),
    )
    communication = _training_tensor_communication(values, problems)
    sharding = _sharding(values, problems)
    recompute = _recompute(values, problems, unsupported)
    offload = _offload(values, unsupported)
    attention = _attention(values, problems)
    precision = _precision(values, problems, unsupported)
    cuda_graphs = _cuda_graphs(values, problems)
    if spec_model is not None and spec_model.datatype is Datatype.FP8:
        # Training runs the FP8 GEMMs on a base datatype (the recipe holds the FP8 part): fp16
        # or bf16 as given, fp32 with bf16 = false (Megatron's fp32 params), bf16 when neither
        # is given (the old fp8 = "hybrid" input meant bf16).
        base = (
            Datatype.FP16
            if values.get("fp16") is True
            else Datatype.FP32
            if values.get("bf16") is False
            else Datatype.BF16
        )
        spec_model = replace(spec_model, datatype=base)
    grad_reduce = (
        GradReduceDtype.DEFAULT
        if spec_model is None
        else grad_reduce_datatype_of(values, spec_model.datatype, problems)
    )

    # A None here always comes with a problem; the extra tests narrow the types.
    if problems or spec_model is None or d is None:
        raise ConfigError(problems)
    if unsupported:
        raise UnsupportedError("; ".join(unsupported))
    if schedule is None:
        raise ConfigError(problems)
    mbs = _get_int(values, "micro_batch_size") or 1
    gbs = _get_int(values, "global_batch_size") or mbs * d
    spec = TrainingSpec(
        model=spec_model,
        mapping=TransformerTrainingMappingSpec(
            parallelism=TransformerTrainingParallelism(
                tensor=TensorParallel(degree=t, communication=communication),
                pipeline=PipelineParallel(degree=p, schedule=schedule, layout=layout),
                data=DataParallel(
                    degree=d,
                    optimizer_sharding=sharding,
                    overlap_grad_reduce=values.get("overlap_grad_reduce") is True,
                    grad_reduce_dtype=grad_reduce,
                ),
                recompute=recompute,
                context=context,
                experts=experts,
                offload=offload,
            ),
            batch=BatchSpec(global_batch_size=gbs, micro_batch_size=mbs),
            attention=attention,
            precision=precision,
            cuda_graphs=cuda_graphs,
            fusions=KernelFusions(
                apply_rope_fusion=values.get("apply_rope_fusion") is not False,
                use_transformer_engine_op_fuser=values.get("use_transformer_engine_op_fuser")
                is True,
                cross_entropy=_cross_entropy(values),
            ),
        ),
    )
    if world_violation is not None:
        # the expert grid's world law on the given world size, not on the placeholder d's
        expert = [] if expert_world is None else [expert_world]
        raise InvalidStrategyError(
            [world_violation, *_laws_without_data_degree(spec), *expert],
            subject=f"degrees t={t} cp={cp} p={p} world_size={world}"
            if cp > 1
            else f"degrees t={t} p={p} world_size={world}",
        )
    return spec


def _format_on(value: FlatValue | None) -> bool:
    """Whether an ``fp8`` / ``fp4`` format key turns its GEMMs on (a format name or true)."""
    return isinstance(value, str) or value is True


def _precision(
    values: Mapping[str, FlatValue], problems: list[str], unsupported: list[str]
) -> TrainingPrecision:
    """The low-precision keys as a :data:`TrainingPrecision` (mapping/precision.py).

    ``fp8`` (``--fp8-format``) turns FP8 on; ``fp8 = true`` means Transformer Engine's default
    format, ``hybrid``. ``fp4`` (``--fp4-format``) turns FP4 on. A recipe or a param-gather key
    without its format is refused (Megatron-LM ignores the recipe and asserts ``fp8_param => fp8``,
    ``transformer_config.py`` l.1566-1579); FP8 with FP4 is refused (``arguments.py``
    l.1100-1101). Megatron's ``custom`` recipes (a user quantizer factory) are not modelled."""
    fp8, fp4 = values.get("fp8"), values.get("fp4")
    fp8_on, fp4_on = _format_on(fp8), _format_on(fp4)
    if fp8_on and fp4_on:
        problems.append(
            f"fp8 = {fp8!r} and fp4 = {fp4!r} are both set: Megatron-LM runs one low-precision "
            "format (arguments.py l.1100-1101)"
        )
        return HighPrecision()
    for prefix, on in (("fp8", fp8_on), ("fp4", fp4_on)):
        recipe_key, gather_key = f"{prefix}_recipe", f"{prefix}_param_gather"
        if not on and recipe_key in values:
            problems.append(
                f"{recipe_key} = {values[recipe_key]!r} needs {prefix} (--{prefix}-format) set"
            )
        if not on and values.get(gather_key) is True:
            problems.append(
                f"{gather_key} = true needs {prefix} (--{prefix}-format) set "
                "(transformer_config.py l.1566-1579)"
            )
        if values.get(recipe_key) == "custom":
            unsupported.append(f"{recipe_key} = custom (a user quantizer factory) is not modelled")
    for key in ("fp8_dot_product_attention", "fp8_multi_head_attention"):
        if values.get(key) is True:
            unsupported.append(
                f"{key} = true (Transformer Engine's FP8 attention) is not modelled: cuDNN's FP8 "
                "attention rates are published for Blackwell only, and there its sliding-window "
                "backward visits every causal tile (docs/VALIDATION.md, Stop 38); plan it at "
                "the base precision, the default"
            )
    layers = _high_precision_layers(values, fp8_on or fp4_on, problems)
    if fp8_on:
        recipe = _get_str(values, "fp8_recipe")
        chosen = Fp8Recipe(recipe) if recipe in set(Fp8Recipe) else Fp8Recipe.DELAYED
        gather = values.get("fp8_param_gather") is True
        _reuse_grad_buffer(values, chosen, gather, problems, unsupported)
        return Fp8Precision(
            recipe=chosen,
            format=Fp8Format(fp8) if isinstance(fp8, str) else Fp8Format.HYBRID,
            param_gather=gather,
            high_precision_layers=layers,
        )
    _reuse_grad_buffer(values, None, False, problems, unsupported)
    if fp4_on:
        return Fp4Precision(
            param_gather=values.get("fp4_param_gather") is True, high_precision_layers=layers
        )
    return HighPrecision()


def _high_precision_layers(
    values: Mapping[str, FlatValue], low_precision: bool, problems: list[str]
) -> tuple[int, int]:
    """``first_last_layers_bf16`` with ``num_layers_at_start_in_bf16`` /
    ``num_layers_at_end_in_bf16`` (Megatron-LM's defaults 1 and 1, ``arguments.py``): counts
    given without the switch, or the switch without a low-precision recipe, would be ignored by
    Megatron-LM and are refused."""
    on = _get_bool(values, "first_last_layers_bf16") is True
    counts = ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16")
    if not on:
        stray = [k for k in counts if k in values]
        if stray:
            problems.append(
                f"{' and '.join(stray)} need first_last_layers_bf16 = true (Megatron-LM ignores "
                "them otherwise)"
            )
        return (0, 0)
    if not low_precision:
        problems.append("first_last_layers_bf16 = true needs an fp8 or fp4 recipe")
        return (0, 0)
    return (_get_int(values, counts[0]) or 1, _get_int(values, counts[1]) or 1)


def _reuse_grad_buffer(
    values: Mapping[str, FlatValue],
    recipe: Fp8Recipe | None,
    gather: bool,
    problems: list[str],
    unsupported: list[str],
) -> None:
    """``reuse_grad_buf_for_mxfp8_param_ag``: the MXFP8 param all-gather through the idle grad
    buffer, which is how an MXFP8 param gather is costed (analysis/precision_memory.py); it
    belongs to MXFP8 with ``fp8_param_gather``, and the separate-buffer alternative is not
    modelled."""
    reuse = _get_bool(values, "reuse_grad_buf_for_mxfp8_param_ag")
    if reuse is None:
        return
    if recipe is not Fp8Recipe.MXFP8 or not gather:
        if reuse:
            problems.append(
                "reuse_grad_buf_for_mxfp8_param_ag = true needs fp8_recipe = mxfp8 with "
                "fp8_param_gather = true"
            )
        return
    if not reuse:
        unsupported.append(
            "reuse_grad_buf_for_mxfp8_param_ag = false: an MXFP8 param gather through its own "
            "buffer is not modelled (only the grad-buffer path is)"
        )


# Laws whose values involve d: meaningless while d = world_size / (t * p) is not an integer.
_DATA_DEGREE_LAWS = frozenset(
    {
        "expert_world_size",
        "local_batch",
        "microbatch_count",
        "microbatch_group_bounds",
        "microbatch_group_remainder",
        "num_microbatches_positive",
    }
)


def _laws_without_data_degree(spec: TrainingSpec) -> list[LawViolation]:
    """The other laws a strategy with a non-integral d breaks, so that every violation is
    reported at once. ``spec`` carries a placeholder d that is never returned to the caller;
    the laws that read d are left out."""
    from blueprinting.mapping.laws import check_training

    return [
        violation
        for violation in check_training(spec.model, spec.mapping)
        if violation.law not in _DATA_DEGREE_LAWS
    ]


#: The userbuffer switches that default true (each also spelled ``disable_<name>``).
_TP_OVERLAP_SWITCHES = (
    "tp_comm_overlap_ag",
    "tp_comm_overlap_rs",
    "tp_comm_bulk_dgrad",
    "tp_comm_bulk_wgrad",
)


def _training_tensor_communication(
    values: Mapping[str, FlatValue], problems: list[str]
) -> TensorCommunication:
    """``sequence_parallel`` and the ``tp_comm_*`` keys as the TP boundary and its overlap."""
    overlap = _tp_comm_overlap(values, problems)
    if values.get("sequence_parallel") is True:
        return ReduceScatterAllGather(overlap=overlap)
    if isinstance(overlap, UserbufferOverlap):
        problems.append(
            "tp_comm_overlap = true needs sequence_parallel = true (Megatron-LM asserts it at "
            "start-up, megatron/training/arguments.py l.1441)"
        )
    return AllReduce()


def _tp_comm_overlap(values: Mapping[str, FlatValue], problems: list[str]) -> TpCommOverlap:
    """The ``tp_comm_*`` keys as a :data:`TpCommOverlap` (Megatron-LM's defaults: every switch
    on, ``tp_comm_overlap_rs_dgrad`` off; rs_dgrad turns both bulk overlaps off, TE
    ``module/base.py`` l.517-536 @d0067d0d). A switch given without ``tp_comm_overlap = true``,
    or a bulk switch set true beside ``tp_comm_overlap_rs_dgrad = true``, is refused: Megatron-LM
    would ignore it."""
    switches: dict[str, bool] = {}
    for name in _TP_OVERLAP_SWITCHES:
        on, off = _get_bool(values, name), _get_bool(values, f"disable_{name}")
        if on is not None and off is not None and on == off:
            problems.append(f"{name} = {on} conflicts with disable_{name} = {off}")
        elif on is not None:
            switches[name] = on
        elif off is not None:
            switches[name] = not off
    rs_dgrad = _get_bool(values, "tp_comm_overlap_rs_dgrad")
    given = [*switches, *(["tp_comm_overlap_rs_dgrad"] if rs_dgrad is not None else [])]
    if _get_bool(values, "tp_comm_overlap") is not True:
        if given:
            problems.append(
                f"{', '.join(given)} needs tp_comm_overlap = true (Megatron-LM ignores the "
                "tp_comm_* switches otherwise; Blueprinting refuses instead)"
            )
        return NoTpCommOverlap()
    column: ColumnBackwardOverlap
    if rs_dgrad is True:
        bulk = [n for n in ("tp_comm_bulk_dgrad", "tp_comm_bulk_wgrad") if switches.get(n)]
        if bulk:
            problems.append(
                f"tp_comm_overlap_rs_dgrad = true turns {' and '.join(bulk)} off (Transformer "
                "Engine module/base.py l.517-536); set them false or drop them"
            )
        column = PipelinedDgradReduceScatter()
    else:
        column = BulkOverlap(
            dgrad=switches.get("tp_comm_bulk_dgrad", True),
            wgrad=switches.get("tp_comm_bulk_wgrad", True),
        )
    return UserbufferOverlap(
        all_gather=switches.get("tp_comm_overlap_ag", True),
        reduce_scatter=switches.get("tp_comm_overlap_rs", True),
        column_backward=column,
    )


def _accounted_layout(
    values: Mapping[str, FlatValue],
    *,
    p: int,
    v: int,
    model: TransformerModelSpec | None,
    first: int | None,
    last: int | None,
    given: list[str],
    problems: list[str],
) -> tuple[FlexibleStages, int] | None:
    """Megatron-LM's ``account_for_embedding_in_pipeline_split`` / ``..._loss_...``: the
    embedding (the loss) counts as one layer of the first (last) virtual stage, and the
    ``num_layers`` decoder layers plus those units split evenly over the p x v virtual stages
    (``megatron/core/transformer/transformer_block.py`` ``get_num_layers_to_build`` and the
    start-up check that the total divides, ``arguments.py``). Planned as the flexible layout
    it is: ``E t*(k-1) | t*k | ... | t*(k-1) L``."""
    embedding = _get_bool(values, "account_for_embedding_in_pipeline_split") is True
    loss = _get_bool(values, "account_for_loss_in_pipeline_split") is True
    keys = [
        k
        for k, on in (
            ("account_for_embedding_in_pipeline_split", embedding),
            ("account_for_loss_in_pipeline_split", loss),
        )
        if on
    ]
    if first is not None or last is not None:
        problems.append(
            f"{' and '.join(keys)} with decoder_first/last_pipeline_num_layers: Megatron-LM "
            "takes one way to make stages uneven"
        )
        return None
    if "num_layers_per_virtual_pipeline_stage" in given:
        problems.append(
            f"{' and '.join(keys)} with num_layers_per_virtual_pipeline_stage is ambiguous: "
            "give num_virtual_stages_per_pipeline_rank instead"
        )
        return None
    if model is None:
        return None
    stages = p * v
    units = model.num_layers + int(embedding) + int(loss)
    if units % stages != 0:
        problems.append(
            f"{' and '.join(keys)}: num_layers + the accounted embedding / loss = {units} is "
            f"not divisible by the virtual stages p * v = {p} * {v} (Megatron-LM refuses it "
            "at start-up)"
        )
        return None
    per = units // stages
    if per - int(embedding) < 0 or per - int(loss) < 0 or (stages == 1 and per < units):
        problems.append(f"{' and '.join(keys)}: {units} units over {stages} stages")
        return None
    out: list[LayoutStage] = []
    for k in range(stages):
        is_first, is_last = k == 0, k == stages - 1
        blocks = per - (int(embedding) if is_first else 0) - (int(loss) if is_last else 0)
        out.append(LayoutStage(embedding=is_first, decoder_layers=blocks, loss=is_last))
    return FlexibleStages(stages=tuple(out)), v


def _pipeline(
    values: Mapping[str, FlatValue],
    p: int,
    model: TransformerModelSpec | None,
    problems: list[str],
    unsupported: list[str],
    *,
    ep_overlap: bool = False,
) -> tuple[PipelineSchedule | None, StageLayout]:
    first = _get_int(values, "decoder_first_pipeline_num_layers")
    last = _get_int(values, "decoder_last_pipeline_num_layers")
    layout: StageLayout = (
        EvenStages()
        if first is None and last is None
        else UnevenStages(first_stage_layers=first, last_stage_layers=last)
    )
    given = [k for k in _VIRTUAL_KEYS if k in values]
    if len(given) > 1:
        problems.append(f"at most one virtual-pipeline key may be set, got {', '.join(given)}")
        return None, layout
    v = 1
    layout_text = _get_str(values, "pipeline_model_parallel_layout")
    if layout_text is not None:
        flexible = _flexible_layout(values, layout_text, p, problems, unsupported)
        if flexible is None:
            return None, layout
        layout, v = flexible
    elif _get_bool(values, "account_for_embedding_in_pipeline_split") or _get_bool(
        values, "account_for_loss_in_pipeline_split"
    ):
        if given and given != ["num_layers_per_virtual_pipeline_stage"]:
            v = _get_int(values, given[0]) or 1
        accounted = _accounted_layout(
            values, p=p, v=v, model=model, first=first, last=last, given=given, problems=problems
        )
        if accounted is None:
            return None, layout
        layout, v = accounted
    elif given == ["num_layers_per_virtual_pipeline_stage"]:
        per_chunk = _get_int(values, "num_layers_per_virtual_pipeline_stage") or 1
        if first is not None or last is not None:
            problems.append(
                "num_layers_per_virtual_pipeline_stage with uneven first/last stages is "
                "ambiguous: give num_virtual_stages_per_pipeline_rank instead"
            )
        elif model is not None:
            per_stage = model.num_layers // p
            if model.num_layers % p != 0 or per_stage % per_chunk != 0:
                problems.append(
                    f"num_layers_per_virtual_pipeline_stage = {per_chunk} does not divide the "
                    f"blocks per pipeline stage num_layers / p = {model.num_layers} / {p}"
                )
            else:
                v = per_stage // per_chunk
    elif given:
        v = _get_int(values, given[0]) or 1

    group = _get_int(values, "microbatch_group_size_per_vp_stage")
    overlap = _get_bool(values, "overlap_p2p_comm")
    dual = _get_str(values, "pipeline_schedule")
    if dual in ("dualpipe", "dualpipev"):
        extra = [
            k
            for k in (*_VIRTUAL_KEYS, "microbatch_group_size_per_vp_stage", "overlap_p2p_comm")
            if k in values
        ]
        if layout_text is not None:
            extra.append("pipeline_model_parallel_layout")
        if extra:
            problems.append(
                f"pipeline_schedule = {dual} sets its own two chunks per rank: it takes no "
                f"{', '.join(extra)}"
            )
        return (DualPipe() if dual == "dualpipe" else DualPipeV()), layout
    if _get_str(values, "pipeline_schedule") == "zb-h1":
        if v > 1 or group is not None or overlap is not None:
            problems.append(
                "pipeline_schedule = zb-h1 is not interleaved: it takes no virtual-pipeline "
                "key, microbatch_group_size_per_vp_stage or overlap_p2p_comm"
            )
        return ZeroBubbleH1(), layout
    if v > 1:
        # Megatron-LM's flag is --no-overlap-p2p-communication: overlap is on unless refused.
        return (
            training_schedule(
                p,
                v,
                microbatch_group_size=group,
                overlap_p2p_comm=overlap is not False,
                ep_overlap=ep_overlap,
            ),
            layout,
        )
    if group is not None:
        problems.append(
            "microbatch_group_size_per_vp_stage needs an interleaved schedule "
            "(a virtual-pipeline size > 1)"
        )
    if overlap is True:
        problems.append(
            "overlap_p2p_comm = true needs an interleaved schedule (Megatron-LM turns it off "
            "otherwise; Blueprinting refuses instead)"
        )
    return training_schedule(p, ep_overlap=ep_overlap), layout


_LAYOUT_CONFLICTS = (
    "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers",
    "num_layers_per_virtual_pipeline_stage",
    "num_virtual_stages_per_pipeline_rank",
)


def _flexible_layout(
    values: Mapping[str, FlatValue],
    text: str,
    p: int,
    problems: list[str],
    unsupported: list[str],
) -> tuple[FlexibleStages, int] | None:
    """The parsed layout and the v it implies (Megatron-LM ``arguments.py`` l.929-950
    @d98e8a64: v = stages / p, which must be exact; the layout excludes the other layout and
    virtual-pipeline keys, and ``virtual_pipeline_model_parallel_size`` must agree with it, a law
    checked on the typed value)."""
    from blueprinting.mapping.pipeline_layout import parse_pipeline_layout

    conflicts = [k for k in _LAYOUT_CONFLICTS if k in values]
    if conflicts:
        problems.append(
            f"pipeline_model_parallel_layout cannot be set with {', '.join(conflicts)} "
            "(Megatron-LM refuses the combination: arguments.py, transformer_config.py)"
        )
    try:
        layout = parse_pipeline_layout(text)
    except ConfigError as error:
        problems.extend(f"pipeline_model_parallel_layout {text!r}: {e}" for e in error.problems)
        return None
    except UnsupportedError as error:
        unsupported.append(str(error))  # reported with the other unsupported keys
        return None
    n = len(layout.stages)
    given_v = _get_int(values, "virtual_pipeline_model_parallel_size")
    if given_v is not None:
        return layout, given_v
    if n % p != 0:
        problems.append(
            f"pipeline_model_parallel_layout {text!r} has {n} stages, not a multiple of "
            f"pipeline_model_parallel_size = {p} (Megatron-LM: the length must be divisible by p)"
        )
        return None
    return layout, n // p


def _sharding(values: Mapping[str, FlatValue], problems: list[str]) -> OptimizerSharding:
    use_dist = _get_bool(values, "use_distributed_optimizer")
    strategy = _get_str(values, "data_parallel_sharding_strategy")
    gather = values.get("overlap_param_gather") is True
    # Megatron-FSDP (--use-megatron-fsdp) is how Megatron-LM shards gradients (ZeRO-2) and
    # parameters (ZeRO-3); the flags emit it for exactly those two strategies.
    fsdp = _get_bool(values, "use_megatron_fsdp")
    fsdp_strategies = (ShardingVariant.OPTIM_GRADS.value, ShardingVariant.OPTIM_GRADS_PARAMS.value)
    if fsdp is True and strategy not in fsdp_strategies:
        problems.append(
            "use_megatron_fsdp = true needs data_parallel_sharding_strategy = optim_grads or "
            f"optim_grads_params (got {strategy}); plain optimizer sharding is "
            "use_distributed_optimizer"
        )
    elif fsdp is False and strategy in fsdp_strategies:
        problems.append(
            f"data_parallel_sharding_strategy = {strategy} runs in Megatron-FSDP, which "
            "use_megatron_fsdp = false turns off"
        )
    if strategy is None:
        strategy = "optim" if use_dist else "no_shard"
    elif strategy == "no_shard" and use_dist is True:
        problems.append(
            "use_distributed_optimizer = true conflicts with "
            "data_parallel_sharding_strategy = no_shard"
        )
    elif strategy != "no_shard" and use_dist is False:
        problems.append(
            "use_distributed_optimizer = false conflicts with "
            f"data_parallel_sharding_strategy = {strategy}"
        )
    # _parse_keys admitted only the enum's values as the strategy.
    variant = ShardingVariant(strategy)
    if variant is ShardingVariant.NO_SHARD and gather:
        problems.append(
            "overlap_param_gather = true needs a sharded optimizer "
            "(use_distributed_optimizer or a data_parallel_sharding_strategy other than "
            "no_shard)"
        )
    return variant.build(overlap_param_gather=gather)


def _attention(values: Mapping[str, FlatValue], problems: list[str]) -> AttentionKernel:
    """``attention_backend`` (Megatron's default ``auto``: a fused kernel) or the legacy
    ``use_flash_attn = true`` (= ``flash``); both given must agree."""
    backend = _get_str(values, "attention_backend")
    flash = _get_bool(values, "use_flash_attn")
    if flash is True and backend not in (None, AttentionBackend.FLASH.value):
        problems.append(
            f"use_flash_attn = true selects attention_backend = flash, which conflicts with "
            f"attention_backend = {backend}"
        )
        return FusedAttention()
    if backend is None:
        return FusedAttention(backend=AttentionBackend.FLASH) if flash else FusedAttention()
    # _parse_keys admitted only the enum's values.
    return attention_kernel(AttentionBackend(backend))


def _cuda_graph_scope(text: str, problems: list[str]) -> frozenset[CudaGraphScope]:
    """``cuda_graph_scope`` names (spaces or commas; ``[a, b]`` read too), each checked with a
    did-you-mean; an empty string is the empty scope (Megatron's default)."""
    cleaned = text.strip().strip("[]").replace("'", " ").replace('"', " ")
    known = [s.value for s in CudaGraphScope]
    scope: set[CudaGraphScope] = set()
    for name in (n for n in cleaned.replace(",", " ").split() if n):
        if name not in known:
            problems.append(
                f"cuda_graph_scope: unknown scope {name!r}{did_you_mean(name, known)}; "
                f"scopes: {', '.join(known)}"
            )
            continue
        scope.add(CudaGraphScope(name))
    return frozenset(scope)


def _cuda_graphs(values: Mapping[str, FlatValue], problems: list[str]) -> CudaGraphs:
    """``cuda_graph_impl`` (or the deprecated ``enable_cuda_graph`` = local /
    ``external_cuda_graph`` = transformer_engine) and ``cuda_graph_scope``. Spellings that
    disagree, and a scope without an implementation, are refused rather than resolved."""
    impl_text = _get_str(values, "cuda_graph_impl")
    legacy = [
        (key, impl)
        for key, impl in (
            ("enable_cuda_graph", CudaGraphImpl.LOCAL),
            ("external_cuda_graph", CudaGraphImpl.TRANSFORMER_ENGINE),
        )
        if _get_bool(values, key) is True
    ]
    impl = CudaGraphImpl.NONE if impl_text is None else CudaGraphImpl(impl_text)
    if len(legacy) > 1:
        problems.append(
            "enable_cuda_graph = true and external_cuda_graph = true name two CUDA graph "
            "implementations (local and transformer_engine); set cuda_graph_impl instead"
        )
    elif legacy:
        key, legacy_impl = legacy[0]
        if impl_text is not None and impl is not legacy_impl:
            problems.append(
                f"{key} = true means cuda_graph_impl = {legacy_impl.value}, but cuda_graph_impl "
                f"= {impl.value} is given (the flag is Megatron-LM's deprecated spelling)"
            )
        impl = legacy_impl
    scope_text = _get_str(values, "cuda_graph_scope")
    scope = frozenset() if scope_text is None else _cuda_graph_scope(scope_text, problems)
    match impl:
        case CudaGraphImpl.NONE:
            if scope:
                problems.append(
                    f"cuda_graph_scope = {' '.join(scope_names(scope))!r} needs cuda_graph_impl "
                    "= local or transformer_engine (cuda_graph_impl is none)"
                )
            return NoCudaGraphs()
        case CudaGraphImpl.LOCAL:
            return LocalCudaGraphs(scope=scope)
        case CudaGraphImpl.TRANSFORMER_ENGINE:
            return TransformerEngineCudaGraphs(scope=scope)
        case _ as unreachable:
            assert_never(unreachable)


#: The keys :func:`cuda_graphs_from_keys` reads.
_CUDA_GRAPH_KEYS = (
    "cuda_graph_impl",
    "cuda_graph_scope",
    "enable_cuda_graph",
    "external_cuda_graph",
)


def cuda_graphs_from_keys(values: Mapping[str, FlatValue]) -> CudaGraphs:
    """The CUDA graphs that flat ``values`` name, read as :func:`from_mapping` reads them (the
    same value checks and messages, Megatron spellings, the deprecated flags); the other keys
    are ignored. :class:`ConfigError` with every problem."""
    canonical = {canonical_key(key): value for key, value in values.items()}
    problems: list[str] = []
    parsed: dict[str, FlatValue] = {}
    for key in _CUDA_GRAPH_KEYS:
        value = canonical.get(key)
        if value is None:
            continue
        read = _parse_value(key, value, TRAINING_KEYS[key])
        if isinstance(read, _Problem):
            problems.append(read.text)
        else:
            parsed[key] = read
    if problems:
        raise ConfigError(problems)
    graphs = _cuda_graphs(parsed, problems)
    if problems:
        raise ConfigError(problems)
    return graphs


def cuda_graph_keys(graphs: CudaGraphs) -> dict[str, FlatValue]:
    """The CUDA graph keys of a strategy (none when graphs are off, Megatron's default)."""
    impl = cuda_graph_impl(graphs)
    if impl is CudaGraphImpl.NONE:
        return {}
    out: dict[str, FlatValue] = {"cuda_graph_impl": impl.value}
    scope = given_scope(graphs)
    if scope:
        out["cuda_graph_scope"] = " ".join(scope_names(scope))
    return out


def _offload(values: Mapping[str, FlatValue], unsupported: list[str]) -> ActivationOffload:
    """The activation offloading Megatron-Core runs for the ``cpu_offloading`` keys: the first
    ``cpu_offloading_num_layers`` layers' activations when ``cpu_offloading`` is on (given, or,
    as Megatron-LM's command line sets it, implied by a positive layer count); none when it is
    off or the count is 0, as Megatron-Core then offloads nothing
    (``transformer_block.py`` l.304-325 @d98e8a64). The layer count's upper bound is a law."""
    layers = _get_int(values, "cpu_offloading_num_layers") or 0
    enabled = _get_bool(values, "cpu_offloading")
    if not (layers > 0 if enabled is None else enabled):
        return NoActivationOffload()
    if values.get("cpu_offloading_weights") is True:
        unsupported.append(
            "cpu_offloading_weights = true is not modelled (weight offloading has had no effect "
            "since Transformer Engine 2.3, transformer_engine/pytorch/cpu_offload.py); drop it"
        )
    if values.get("cpu_offloading_activations") is False:
        unsupported.append(
            "cpu_offloading_activations = false is not modelled (the layers would offload no "
            "activation); set cpu_offloading = false instead"
        )
    if layers == 0:
        return NoActivationOffload()
    return LayerCpuOffload(num_layers=layers)


def _offload_keys(offload: ActivationOffload) -> dict[str, FlatValue]:
    match offload:
        case NoActivationOffload():
            return {}
        case LayerCpuOffload(num_layers=layers):
            return {"cpu_offloading": True, "cpu_offloading_num_layers": layers}
        case _ as unreachable:
            assert_never(unreachable)


def _offload_args(offload: ActivationOffload) -> list[str]:
    """Megatron-LM's flag: the layer count, which turns ``cpu_offloading`` on
    (``arguments.py`` l.1950-1951 @d98e8a64; the flag exists since commit 310671436c)."""
    match offload:
        case NoActivationOffload():
            return []
        case LayerCpuOffload(num_layers=layers):
            return ["--cpu-offloading-num-layers", str(layers)]
        case _ as unreachable:
            assert_never(unreachable)


def _recompute_modules(text: str, problems: list[str]) -> frozenset[RecomputeModule]:
    """Megatron's ``--recompute-modules`` names (separated by spaces or commas; a YAML-style
    ``[a, b]`` is read too). A module whose layer the model lacks (``moe_act`` on a dense
    model) is a law of the checker (``recompute_module_needs_its_layer``), not a parse error."""
    cleaned = text.strip().strip("[]").replace("'", " ").replace('"', " ")
    names = [name for name in cleaned.replace(",", " ").split() if name]
    if not names:
        problems.append("recompute_modules must name at least one module, got an empty string")
        return frozenset()
    known = [m.value for m in RecomputeModule]
    modules: set[RecomputeModule] = set()
    for name in names:
        if name not in known:
            hint = did_you_mean(name, known)
            problems.append(
                f"recompute_modules: unknown module {name!r}{hint}; modules: {', '.join(known)}"
            )
            continue
        modules.add(RecomputeModule(name))
    return frozenset(modules)


def _recompute(
    values: Mapping[str, FlatValue], problems: list[str], unsupported: list[str]
) -> RecomputePolicy:
    granularity = _get_str(values, "recompute_granularity")
    legacy = _get_bool(values, "recompute_activations")
    method = _get_str(values, "recompute_method")
    layers = _get_int(values, "recompute_num_layers")
    if legacy:
        if granularity == "full":
            problems.append(
                "recompute_activations = true (selective) conflicts with "
                "recompute_granularity = full"
            )
        granularity = "selective"
    if granularity is None or granularity == "selective":
        extra = [k for k in ("recompute_method", "recompute_num_layers") if k in values]
        if extra:
            problems.append(
                f"{', '.join(extra)} need(s) recompute_granularity = full, got "
                f"{granularity or 'no recompute'}"
            )
        modules_text = _get_str(values, "recompute_modules")
        if granularity is None:
            if modules_text is not None:
                problems.append("recompute_modules needs recompute_granularity = selective")
                _recompute_modules(modules_text, problems)  # report bad names too
            return NoRecompute()
        if modules_text is None:
            return SelectiveRecompute()
        modules = _recompute_modules(modules_text, problems)
        return SelectiveRecompute(modules=modules) if modules else SelectiveRecompute()
    if method is None or layers is None:
        missing = [k for k in ("recompute_method", "recompute_num_layers") if k not in values]
        problems.append(f"recompute_granularity = full needs {' and '.join(missing)}")
        return NoRecompute()
    return FullRecompute(method=RecomputeMethod(method), num_layers=layers)


# --------------------------------------------------------------------------------------------
# Inverse: canonical keys and Megatron-LM flags
# --------------------------------------------------------------------------------------------
def _model_to_mapping(model: TransformerModelSpec) -> dict[str, FlatValue]:
    out: dict[str, FlatValue] = {
        "model_name": model.name,
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "group_query_attention": model.is_gqa,
    }
    if model.is_gqa:
        out["num_query_groups"] = model.num_query_groups
    out |= {
        "kv_channels": model.kv_channels,
        "ffn_hidden_size": model.ffn_hidden_size,
        "swiglu": model.activation is MlpActivation.SWIGLU,
        "normalization": model.normalization.value,
        "position_embedding_type": model.position_embedding.value,
        "seq_length": model.seq_length,
        "vocab_size": model.vocab_size,
        "padded_vocab_size": model.padded_vocab_size,
        "untie_embeddings_and_output_weights": model.embeddings is EmbeddingTying.UNTIED,
        "add_bias_linear": model.add_bias_linear,
        "bf16": model.datatype in (Datatype.BF16, Datatype.FP8),
        "fp16": model.datatype is Datatype.FP16,
    }
    # written only when set, like the Megatron flags they mirror
    if model.activation is MlpActivation.SQUARED_RELU:
        out["squared_relu"] = True
    if model.layernorm_zero_centered_gamma:
        out["apply_layernorm_1p"] = True
    if model.attention_dropout != DEFAULT_DROPOUT:
        out["attention_dropout"] = model.attention_dropout
    if model.hidden_dropout != DEFAULT_DROPOUT:
        out["hidden_dropout"] = model.hidden_dropout
    if model.activation_func_clamp_value is not None:
        out["activation_func_clamp_value"] = model.activation_func_clamp_value
    if model.datatype is Datatype.FP8:
        out["fp8"] = "hybrid"
    if model.qk_layernorm:
        out["qk_layernorm"] = True
    match model.self_attention:
        case StandardAttention():
            pass
        case MultiLatentAttention() as mla:
            out["multi_latent_attention"] = True
            if mla.q_lora_rank is not None:
                out["q_lora_rank"] = mla.q_lora_rank
            out |= {
                "kv_lora_rank": mla.kv_lora_rank,
                "qk_head_dim": mla.qk_head_dim,
                "qk_pos_emb_head_dim": mla.qk_pos_emb_head_dim,
                "v_head_dim": mla.v_head_dim,
            }
        case _ as unreachable:
            assert_never(unreachable)
    out |= _moe_keys(model.feed_forward)
    if model.mtp_num_layers:
        out["mtp_num_layers"] = model.mtp_num_layers
    if model.softmax_type is not SoftmaxType.VANILLA:
        out["softmax_type"] = model.softmax_type.value
    match model.attention_window:
        case FullAttention():
            pass
        case SlidingWindow(size=size, full_every=every):
            out["window_size"] = size
            if every is not None:
                out["window_attn_skip_freq"] = every
        case _ as unreachable_window:
            assert_never(unreachable_window)
    return out


def _moe_keys(feed_forward: FeedForward) -> dict[str, FlatValue]:
    match feed_forward:
        case DenseFeedForward():
            return {}
        case MixtureOfExperts() as moe:
            out: dict[str, FlatValue] = {
                "num_experts": moe.num_experts,
                "moe_router_topk": moe.top_k,
                "moe_ffn_hidden_size": moe.expert_ffn_hidden_size,
            }
            if moe.shared_expert_ffn_hidden_size:
                out["moe_shared_expert_intermediate_size"] = moe.shared_expert_ffn_hidden_size
            out["moe_layer_freq"] = format_moe_layer_freq(moe.layer_pattern)
            out["moe_router_score_function"] = moe.score_function.value
            out["moe_router_enable_expert_bias"] = moe.expert_bias
            if moe.pre_softmax:
                out["moe_router_pre_softmax"] = True
            if moe.load_balancing is not LoadBalancing.AUX_LOSS:
                out["moe_router_load_balancing_type"] = moe.load_balancing.value
            match moe.dropping:
                case Dropless():
                    pass
                case CapacityFactor(factor=factor, pad_to_capacity=pad):
                    out["moe_expert_capacity_factor"] = factor
                    out["moe_pad_expert_input_to_capacity"] = pad
                case _ as unreachable:
                    assert_never(unreachable)
            if moe.load_imbalance:
                out["moe_load_imbalance"] = moe.load_imbalance
            return out
        case _ as unreachable:
            assert_never(unreachable)


def to_mapping(spec: TrainingSpec) -> dict[str, FlatValue]:
    """Canonical flat keys (underscores) of a training spec; ``from_mapping`` inverts it.

    The inverse holds for every spec whose schedule is the one the degrees imply (SingleStage for
    p = 1 and v = 1, 1F1B for p > 1 and v = 1, interleaved for v >= 2), whose model has no
    ``published_parameters`` and uses ``overlap_param_gather`` only with a sharded optimizer. The
    precision recipe maps to ``fp8`` / ``fp8_recipe`` / ``fp8_param_gather`` (``fp4`` ...) beside
    the model's ``bf16`` / ``fp16`` (:func:`precision_keys`). A mixture-of-experts spec writes
    every expert key (:func:`expert_keys`); its model's MoE keys are the model part's, so until
    they exist the inverse needs the model as the base: ``from_mapping(to_mapping(x),
    model=x.model) == x``.
    """
    mapping = spec.mapping
    par = mapping.parallelism
    out: dict[str, FlatValue] = {
        "tensor_model_parallel_size": mapping.tensor_degree,
        "pipeline_model_parallel_size": mapping.pipeline_degree,
        "data_parallel_size": mapping.data_degree,
        "sequence_parallel": mapping.sequence_parallel,
    }
    out |= _context_keys(par.context)
    out |= expert_keys(spec)
    out |= _tp_overlap_keys(mapping.tp_comm_overlap)
    out |= _pipeline_keys(par.pipeline)
    out |= _sharding_keys(par.data.optimizer_sharding)
    out["overlap_grad_reduce"] = par.data.overlap_grad_reduce
    out |= grad_reduce_keys(par.data.grad_reduce_dtype, spec.model.datatype)
    out |= _recompute_keys(par.recompute)
    out |= _offload_keys(par.offload)
    out["attention_backend"] = mapping.attention.backend.value
    out |= fusion_keys(mapping.fusions)
    out["micro_batch_size"] = mapping.batch.micro_batch_size
    out["global_batch_size"] = mapping.batch.global_batch_size
    out |= cuda_graph_keys(mapping.cuda_graphs)
    out |= _model_to_mapping(spec.model)
    out |= precision_keys(mapping.precision)
    return out


def _cross_entropy(values: Mapping[str, FlatValue]) -> CrossEntropyKernel:
    """The loss's kernels from Megatron's two keys: ``cross_entropy_fusion_impl`` has an effect
    only with ``cross_entropy_loss_fusion`` (Megatron-Core reads it only then)."""
    if values.get("cross_entropy_loss_fusion") is not True:
        return UnfusedCrossEntropy()
    impl = values.get("cross_entropy_fusion_impl", CrossEntropyFusionImpl.NATIVE.value)
    return FusedCrossEntropy(impl=CrossEntropyFusionImpl(str(impl)))


def fusion_keys(fusions: KernelFusions) -> dict[str, FlatValue]:
    """The fusion switches that differ from Megatron's defaults, as flat keys."""
    out: dict[str, FlatValue] = {}
    if not fusions.apply_rope_fusion:
        out["apply_rope_fusion"] = False
    if fusions.use_transformer_engine_op_fuser:
        out["use_transformer_engine_op_fuser"] = True
    match fusions.cross_entropy:
        case UnfusedCrossEntropy():
            pass
        case FusedCrossEntropy(impl=impl):
            out["cross_entropy_loss_fusion"] = True
            out["cross_entropy_fusion_impl"] = impl.value
        case _ as unreachable:
            assert_never(unreachable)
    return out


def grad_reduce_keys(choice: GradReduceDtype, datatype: Datatype) -> dict[str, FlatValue]:
    """``DataParallel.grad_reduce_dtype`` as Megatron-LM's flat key: none for ``default``,
    ``accumulate_allreduce_grads_in_fp32`` for fp32, ``grad_reduce_in_bf16`` for bf16
    parameters, and, for the parameters' datatype of fp16 / fp32 training (Megatron-LM's
    default there, but not ``default``'s spelling), Megatron-Core's ``grad_reduce_in_fp32 =
    false``. :func:`grad_reduce_datatype_of` reads each back to ``choice``."""
    match choice:
        case GradReduceDtype.DEFAULT:
            return {}
        case GradReduceDtype.FP32:
            return {"accumulate_allreduce_grads_in_fp32": True}
        case GradReduceDtype.PARAMS:
            if datatype in (Datatype.BF16, Datatype.FP8):
                return {"grad_reduce_in_bf16": True}
            return {"grad_reduce_in_fp32": False}
        case _ as unreachable:
            assert_never(unreachable)


def expert_keys(spec: TrainingSpec) -> dict[str, FlatValue]:
    """The expert grid's keys: every one, spelled out, for a mixture-of-experts model (Megatron's
    defaults differ from the ADT's); for a dense model only an ep > 1, which the laws refuse."""
    experts = spec.mapping.parallelism.experts
    if spec.model.moe is None:
        return {} if experts.degree == 1 else {"expert_model_parallel_size": experts.degree}
    dispatcher = experts.dispatcher
    out: dict[str, FlatValue] = {
        "expert_model_parallel_size": experts.degree,
        "expert_tensor_parallel_size": experts.tensor_degree,
        "moe_token_dispatcher_type": dispatcher_type(dispatcher).value,
    }
    match dispatcher:
        case FlexDispatcher(backend=backend, sms=sms):
            out["moe_flex_dispatcher_backend"] = backend.value
            if sms is not None:
                out[FLEX_SMS_KEYS[backend]] = sms
        case AllToAllDispatcher() | AllGatherDispatcher():
            pass
        case _ as unreachable:
            assert_never(unreachable)
    out["moe_grouped_gemm"] = experts.grouped_gemm
    match dispatcher:
        case AllToAllDispatcher() | FlexDispatcher():
            out["overlap_moe_expert_parallel_comm"] = dispatcher_overlaps(dispatcher)
            out["moe_shared_expert_overlap"] = shared_expert_overlaps(dispatcher)
            out["delay_wgrad_compute"] = delays_wgrad(dispatcher)
        case AllGatherDispatcher():
            pass
        case _ as unreachable_dispatcher:
            assert_never(unreachable_dispatcher)
    return out


def _expert_args(spec: TrainingSpec) -> list[str]:
    """Megatron-LM's flags of the expert grid (a mixture-of-experts model only: the laws refuse
    ep > 1 on a dense one): ``--expert-model-parallel-size``, ``--expert-tensor-parallel-size``,
    ``--moe-token-dispatcher-type`` (always written: Megatron's default allgather is rarely
    what a recipe runs), ``--moe-flex-dispatcher-backend`` and the switches that are on."""
    args: list[str] = []
    for key, value in expert_keys(spec).items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args += [flag] if value else []
        else:
            args += [flag, str(value)]
    return args


def _context_keys(context: ContextParallel) -> dict[str, FlatValue]:
    """``context_parallel_size`` and, for cp > 1, ``cp_comm_type`` (TE's spelling) and the
    hierarchical sizes of a2a+p2p (none at cp = 1: Megatron's default)."""
    if context.degree == 1:
        return {}
    communication = context.communication
    out: dict[str, FlatValue] = {
        "context_parallel_size": context.degree,
        "cp_comm_type": cp_comm_type(communication).value,
    }
    match communication:
        case HierarchicalAllToAllRing(a2a_size=a2a, p2p_size=ring):
            out["hierarchical_context_parallel_sizes"] = f"{a2a} {ring}"
        case RingExchange() | AllGatherKV() | HeadAllToAll():
            pass
        case _ as unreachable:
            assert_never(unreachable)
    return out


def precision_keys(precision: TrainingPrecision) -> dict[str, FlatValue]:
    """The Megatron-LM config keys of a low-precision recipe (none for :class:`HighPrecision`)."""
    match precision:
        case HighPrecision():
            return {}
        case Fp8Precision(recipe=recipe, format=fmt, param_gather=gather):
            out: dict[str, FlatValue] = {
                "fp8": fmt.value,
                "fp8_recipe": recipe.value,
                "fp8_param_gather": gather,
            }
            if recipe is Fp8Recipe.MXFP8 and gather:
                out["reuse_grad_buf_for_mxfp8_param_ag"] = True
            return out | _layers_keys(precision)
        case Fp4Precision(recipe=recipe, format=fmt, param_gather=gather):
            fp4: dict[str, FlatValue] = {
                "fp4": fmt.value,
                "fp4_recipe": recipe.value,
                "fp4_param_gather": gather,
            }
            return fp4 | _layers_keys(precision)
        case _ as unreachable:
            assert_never(unreachable)


def _layers_keys(precision: Fp8Precision | Fp4Precision) -> dict[str, FlatValue]:
    start, end = precision.high_precision_layers
    if not start and not end:
        return {}
    return {
        "first_last_layers_bf16": True,
        "num_layers_at_start_in_bf16": start,
        "num_layers_at_end_in_bf16": end,
    }


def _precision_args(precision: TrainingPrecision) -> list[str]:
    """Megatron-LM's flags of a recipe: ``--fp8-format``, ``--fp8-recipe``,
    ``--fp8-param-gather`` (``--fp4-*`` likewise)."""
    args: list[str] = []
    for key, value in precision_keys(precision).items():
        flag = "--" + key.replace("_", "-")
        if key in ("fp8", "fp4"):
            args += [f"{flag}-format", str(value)]
        elif isinstance(value, bool):
            args += [flag] if value else []
        else:
            args += [flag, str(value)]
    return args


def _tp_overlap_keys(overlap: TpCommOverlap) -> dict[str, FlatValue]:
    """The ``tp_comm_*`` keys of an overlap (none when off). TE's split count is not a
    Megatron-LM key (it lives in ``--tp-comm-overlap-cfg``): the inverse holds for the default."""
    match overlap:
        case NoTpCommOverlap():
            return {}
        case UserbufferOverlap(all_gather=ag, reduce_scatter=rs, column_backward=column):
            out: dict[str, FlatValue] = {
                "tp_comm_overlap": True,
                "tp_comm_overlap_ag": ag,
                "tp_comm_overlap_rs": rs,
            }
            match column:
                case BulkOverlap(dgrad=dgrad, wgrad=wgrad):
                    out |= {"tp_comm_bulk_dgrad": dgrad, "tp_comm_bulk_wgrad": wgrad}
                case PipelinedDgradReduceScatter():
                    out |= {
                        "tp_comm_bulk_dgrad": False,
                        "tp_comm_bulk_wgrad": False,
                        "tp_comm_overlap_rs_dgrad": True,
                    }
                case _ as unreachable:
                    assert_never(unreachable)
            return out
        case _ as unreachable:
            assert_never(unreachable)


def _tp_overlap_args(overlap: TpCommOverlap) -> list[str]:
    """Megatron-LM's flags for an overlap: ``--tp-comm-overlap`` and each switch that differs
    from its default. A non-default split count needs a ``--tp-comm-overlap-cfg`` file."""
    match overlap:
        case NoTpCommOverlap():
            return []
        case UserbufferOverlap():
            pass
        case _ as unreachable:
            assert_never(unreachable)
    splits = [overlap.reduce_scatter_splits]
    if isinstance(overlap.column_backward, PipelinedDgradReduceScatter):
        splits.append(overlap.column_backward.splits)
    if any(n != TE_PIPELINE_SPLITS for n in splits):
        raise UnsupportedError(
            f"a pipelined reduce-scatter in {splits} chunks (Transformer Engine's default is "
            f"{TE_PIPELINE_SPLITS}) needs a --tp-comm-overlap-cfg file; Blueprinting writes none"
        )
    keys = _tp_overlap_keys(overlap)
    args = ["--tp-comm-overlap"]
    if keys.get("tp_comm_overlap_rs_dgrad") is True:
        args.append("--tp-comm-overlap-rs-dgrad")
        switches: tuple[str, ...] = _TP_OVERLAP_SWITCHES[:2]
    else:
        switches = _TP_OVERLAP_SWITCHES
    args += [f"--disable-{n.replace('_', '-')}" for n in switches if keys[n] is False]
    return args


def _schedule_keys(schedule: PipelineSchedule) -> dict[str, FlatValue]:
    match schedule:
        case CombinedOneForwardOneBackward(virtual_stages=1):
            return {}  # the dispatcher's overlap_moe_expert_parallel_comm gives it back
        case (
            InterleavedOneForwardOneBackward(
                virtual_stages=v, microbatch_group_size=group, overlap_p2p_comm=overlap
            )
            | CombinedOneForwardOneBackward(
                virtual_stages=v, microbatch_group_size=group, overlap_p2p_comm=overlap
            )
        ):
            out: dict[str, FlatValue] = {"num_virtual_stages_per_pipeline_rank": v}
            if group is not None:
                out["microbatch_group_size_per_vp_stage"] = group
            out["overlap_p2p_comm"] = overlap
            return out
        case ZeroBubbleH1():
            return {"pipeline_schedule": "zb-h1"}
        case DualPipe():
            return {"pipeline_schedule": "dualpipe"}
        case DualPipeV():
            return {"pipeline_schedule": "dualpipev"}
        case SingleStage() | OneForwardOneBackward() | ForwardOnly():
            return {}
        case _ as unreachable:
            assert_never(unreachable)


def _layout_keys(layout: StageLayout) -> dict[str, FlatValue]:
    match layout:
        case UnevenStages(first_stage_layers=first, last_stage_layers=last):
            out: dict[str, FlatValue] = {}
            if first is not None:
                out["decoder_first_pipeline_num_layers"] = first
            if last is not None:
                out["decoder_last_pipeline_num_layers"] = last
            return out
        case FlexibleStages():
            from blueprinting.mapping.pipeline_layout import format_pipeline_layout

            return {"pipeline_model_parallel_layout": format_pipeline_layout(layout)}
        case EvenStages():
            return {}
        case _ as unreachable:
            assert_never(unreachable)


def _pipeline_keys(pipeline: PipelineParallel) -> dict[str, FlatValue]:
    """Schedule and layout keys; a flexible layout implies v, so the virtual-stage count is
    not given beside it (Megatron-LM refuses both)."""
    keys = _schedule_keys(pipeline.schedule)
    if isinstance(pipeline.layout, FlexibleStages):
        keys.pop("num_virtual_stages_per_pipeline_rank", None)
    return keys | _layout_keys(pipeline.layout)


def _sharding_keys(sharding: OptimizerSharding) -> dict[str, FlatValue]:
    strategy = ShardingVariant.of(sharding).value
    match sharding:
        case NoOptimizerSharding():
            return {
                "use_distributed_optimizer": False,
                "data_parallel_sharding_strategy": strategy,
            }
        case DistributedOptimizer():
            return {
                "use_distributed_optimizer": True,
                "data_parallel_sharding_strategy": strategy,
                "overlap_param_gather": sharding.overlap_param_gather,
            }
        case ShardedGradients() | ShardedParameters():
            return {
                "use_distributed_optimizer": True,
                "use_megatron_fsdp": True,
                "data_parallel_sharding_strategy": strategy,
                "overlap_param_gather": sharding.overlap_param_gather,
            }
        case _ as unreachable:
            assert_never(unreachable)


def _recompute_keys(recompute: RecomputePolicy) -> dict[str, FlatValue]:
    match recompute:
        case NoRecompute():
            return {}
        case SelectiveRecompute(modules=modules):
            if modules == DEFAULT_RECOMPUTE_MODULES:
                return {"recompute_granularity": "selective"}
            return {
                "recompute_granularity": "selective",
                "recompute_modules": " ".join(sorted(m.value for m in modules)),
            }
        case FullRecompute(method=method, num_layers=layers):
            return {
                "recompute_granularity": "full",
                "recompute_method": method.value,
                "recompute_num_layers": layers,
            }
        case _ as unreachable:
            assert_never(unreachable)


def to_megatron_args(spec: TrainingSpec) -> list[str]:
    """Megatron-LM command-line flags (``pretrain_gpt.py``, d98e8a64) for a lawful spec.

    Raises :class:`InvalidStrategyError` when a planner or Megatron-LM law is violated: flags are
    only emitted for strategies Megatron-LM would start. The data-parallel degree has no flag:
    Megatron-LM derives it from the launcher's world size, ``t * p * d`` = ``spec.mapping
    .world_size``. ZeRO-2/3 sharding uses Megatron-FSDP (``--use-megatron-fsdp``).
    """
    from blueprinting.mapping.laws import validate_training

    validate_training(spec.model, spec.mapping, megatron=True)
    return megatron_args_of_lawful(spec)


def megatron_args_of_lawful(spec: TrainingSpec) -> list[str]:
    """:func:`to_megatron_args` for a spec the caller has just validated with the Megatron rule
    set (``validate_training(..., megatron=True)``): the same flags, without checking twice."""
    mapping = spec.mapping
    par = mapping.parallelism
    args = [
        "--tensor-model-parallel-size",
        str(mapping.tensor_degree),
        "--pipeline-model-parallel-size",
        str(mapping.pipeline_degree),
    ]
    args += _flags(_context_keys(par.context))
    args += _expert_args(spec)
    schedule_args = _schedule_args(par.pipeline.schedule)
    if isinstance(par.pipeline.layout, FlexibleStages) and schedule_args[:1] == [
        "--num-virtual-stages-per-pipeline-rank"
    ]:
        schedule_args = schedule_args[2:]  # the layout implies v; Megatron-LM refuses both
    args += schedule_args
    args += _flags(_layout_keys(par.pipeline.layout))
    if mapping.sequence_parallel:
        args.append("--sequence-parallel")
    args += _tp_overlap_args(mapping.tp_comm_overlap)
    args += _sharding_args(par.data)
    args += _grad_reduce_args(par.data, spec.model.datatype)
    args += _flags(_recompute_keys(par.recompute))
    args += _offload_args(par.offload)
    if mapping.attention.backend is not AttentionBackend.AUTO:
        # auto is Megatron-LM's default: the flag is spelled out only when it differs.
        args += ["--attention-backend", mapping.attention.backend.value]
    if not mapping.fusions.apply_rope_fusion:
        args.append("--no-rope-fusion")
    if mapping.fusions.use_transformer_engine_op_fuser:
        # a TransformerConfig field, a flag through Megatron-LM's ArgumentGroupFactory
        # (arguments.py l.2373 @d98e8a64; store_true for a false default)
        args.append("--use-transformer-engine-op-fuser")
    match mapping.fusions.cross_entropy:
        case UnfusedCrossEntropy():
            pass
        case FusedCrossEntropy(impl=impl):
            args += ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", impl.value]
        case _ as unreachable_ce:
            assert_never(unreachable_ce)
    args += [
        "--micro-batch-size",
        str(mapping.batch.micro_batch_size),
        "--global-batch-size",
        str(mapping.batch.global_batch_size),
    ]
    args += _model_args(spec.model)
    args += _precision_args(mapping.precision)
    args += _flags(cuda_graph_keys(mapping.cuda_graphs))
    return args


def _schedule_args(schedule: PipelineSchedule) -> list[str]:
    match schedule:
        case CombinedOneForwardOneBackward(virtual_stages=1):
            return []  # --overlap-moe-expert-parallel-comm (the expert flags) selects it
        case (
            InterleavedOneForwardOneBackward(
                virtual_stages=v, microbatch_group_size=group, overlap_p2p_comm=overlap
            )
            | CombinedOneForwardOneBackward(
                virtual_stages=v, microbatch_group_size=group, overlap_p2p_comm=overlap
            )
        ):
            args = ["--num-virtual-stages-per-pipeline-rank", str(v)]
            if group is not None:
                args += ["--microbatch-group-size-per-virtual-pipeline-stage", str(group)]
            if not overlap:
                args.append("--no-overlap-p2p-communication")
            return args
        case ZeroBubbleH1():
            # validate_training(megatron=True) refuses ZB-H1 before this point.
            raise UnsupportedError("Megatron-LM has no flag for the ZB-H1 schedule")
        case DualPipe() | DualPipeV():
            # validate_training(megatron=True) refuses these before this point.
            raise UnsupportedError(
                f"Megatron-LM mainline has no flag for {schedule}: it is the planner-only "
                "pipeline_schedule key (deepseek-ai/DualPipe is a standalone module)"
            )
        case SingleStage() | OneForwardOneBackward() | ForwardOnly():
            return []
        case _ as unreachable:
            assert_never(unreachable)


#: Keys whose value is a list on Megatron-LM's command line (one argument per name).
_LIST_FLAGS = frozenset(
    {"recompute_modules", "hierarchical_context_parallel_sizes", "cuda_graph_scope"}
)


def _flags(keys: Mapping[str, FlatValue]) -> list[str]:
    """Canonical keys as ``--dashed-key value`` flag pairs (list-valued keys: one argument per
    name)."""
    args: list[str] = []
    for key, value in keys.items():
        args.append(f"--{key.replace('_', '-')}")
        args += str(value).split() if key in _LIST_FLAGS else [str(value)]
    return args


def _grad_reduce_args(data: DataParallel, datatype: Datatype) -> list[str]:
    """Megatron-LM's gradient reduction flags for the datatype the plan reduces in
    (:func:`~blueprinting.mapping.transformer.grad_reduce_datatype`): nothing where it is
    Megatron-LM's default for the training datatype, ``--accumulate-allreduce-grads-in-fp32``
    for fp32 under fp16, ``--grad-reduce-in-bf16`` for bf16 under bf16. Megatron-FSDP (ZeRO-2/3)
    reads its own ``--megatron-fsdp-main-grads-dtype`` (default ``auto``: the parameters'
    datatype, ``mcore_fsdp_adapter.py`` l.139-143 and ``megatron_fsdp/param_and_grad_buffer.py``
    ``_resolve_group_grad_dtype`` @d98e8a64), spelled out there."""
    reduced = grad_reduce_datatype(datatype, data.grad_reduce_dtype)
    default = grad_reduce_datatype(datatype, GradReduceDtype.DEFAULT)
    args: list[str] = []
    if reduced is not default:
        args.append(
            "--accumulate-allreduce-grads-in-fp32"
            if reduced is Datatype.FP32
            else "--grad-reduce-in-bf16"
        )
    match data.optimizer_sharding:
        case ShardedGradients() | ShardedParameters():
            args += ["--megatron-fsdp-main-grads-dtype", _FSDP_DTYPE_NAMES[reduced]]
        case NoOptimizerSharding() | DistributedOptimizer():
            pass
        case _ as unreachable:
            assert_never(unreachable)
    return args


_FSDP_DTYPE_NAMES: Mapping[Datatype, str] = MappingProxyType(
    {Datatype.FP32: "fp32", Datatype.BF16: "bf16", Datatype.FP16: "fp16"}
)
"""``--megatron-fsdp-main-grads-dtype``'s choices (``arguments.py`` l.3691 @d98e8a64)."""


def _sharding_args(data: DataParallel) -> list[str]:
    sharding = data.optimizer_sharding
    args: list[str] = []
    match sharding:
        case NoOptimizerSharding():
            pass
        case DistributedOptimizer():
            args.append("--use-distributed-optimizer")
        case ShardedGradients() | ShardedParameters():
            args += [
                "--use-megatron-fsdp",
                "--data-parallel-sharding-strategy",
                ShardingVariant.of(sharding).value,
            ]
        case _ as unreachable:
            assert_never(unreachable)
    if data.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    if not isinstance(sharding, NoOptimizerSharding) and sharding.overlap_param_gather:
        args.append("--overlap-param-gather")
    return args


def _model_args(model: TransformerModelSpec) -> list[str]:
    args = [
        "--num-layers",
        str(model.num_layers),
        "--hidden-size",
        str(model.hidden_size),
        "--ffn-hidden-size",
        str(model.ffn_hidden_size),
        "--num-attention-heads",
        str(model.num_attention_heads),
    ]
    if model.is_gqa:
        args += ["--group-query-attention", "--num-query-groups", str(model.num_query_groups)]
    args += [
        "--kv-channels",
        str(model.kv_channels),
        "--seq-length",
        str(model.seq_length),
        "--max-position-embeddings",
        str(model.seq_length),
        "--position-embedding-type",
        model.position_embedding.value,
        "--normalization",
        model.normalization.value,
    ]
    if model.activation is MlpActivation.SWIGLU:
        args.append("--swiglu")
    if model.activation is MlpActivation.SQUARED_RELU:
        args.append("--squared-relu")
    if model.layernorm_zero_centered_gamma:
        args.append("--apply-layernorm-1p")
    if model.attention_dropout != DEFAULT_DROPOUT:
        args += ["--attention-dropout", f"{model.attention_dropout:g}"]
    if model.hidden_dropout != DEFAULT_DROPOUT:
        args += ["--hidden-dropout", f"{model.hidden_dropout:g}"]
    if model.activation_func_clamp_value is not None:
        args += ["--activation-func-clamp-value", f"{model.activation_func_clamp_value:g}"]
    if model.embeddings is EmbeddingTying.UNTIED:
        args.append("--untie-embeddings-and-output-weights")
    if not model.add_bias_linear:
        args.append("--disable-bias-linear")
    args += [
        "--vocab-size",
        str(model.vocab_size),
        "--padded-vocab-size",
        str(model.padded_vocab_size),
    ]
    args += _architecture_args(model)
    match model.datatype:
        case Datatype.BF16:
            args.append("--bf16")
        case Datatype.FP16:
            args.append("--fp16")
        case Datatype.FP8:
            args += ["--bf16", "--fp8-format", "hybrid"]
        case Datatype.FP32:
            pass
        case _ as unreachable:
            assert_never(unreachable)
    return args


def _architecture_args(model: TransformerModelSpec) -> list[str]:
    """MLA, MoE, MTP, sinks and windows as Megatron-LM flags (booleans as bare switches,
    ``moe_load_imbalance`` left out: Megatron-LM has no such flag)."""
    keys = _model_to_mapping(model)
    args: list[str] = []
    for key in (
        "multi_latent_attention",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_head_dim",
        "qk_pos_emb_head_dim",
        "v_head_dim",
        "qk_layernorm",
        *(k for k in ("num_experts", *MOE_KEYS) if k != "moe_load_imbalance"),
        "mtp_num_layers",
        "softmax_type",
    ):
        value = keys.get(key)
        if value is None or value is False:
            continue
        flag = f"--{key.replace('_', '-')}"
        args += [flag] if value is True else [flag, str(value)]
    window = model.attention_window
    match window:
        case FullAttention():
            pass
        case SlidingWindow(size=size, full_every=every):
            # Megatron-LM's --window-size takes the (left, right) pair.
            args += ["--window-size", f"({size},0)"]
            if every is not None:
                args += ["--window-attn-skip-freq", str(every)]
        case _ as unreachable:
            assert_never(unreachable)
    return args


# --------------------------------------------------------------------------------------------
# Inference
# --------------------------------------------------------------------------------------------
def inference_from_mapping(
    keys: Mapping[str, object], *, model: TransformerModelSpec | None = None
) -> InferenceSpec:
    """Build an inference spec from flat keys: ``tensor_model_parallel_size``,
    ``pipeline_model_parallel_size``, ``replicas``, ``batch_size``, ``prompt_length``,
    ``generated_tokens``, ``kv_cache_datatype`` (default: the model's datatype),
    ``sequence_parallel`` and the model keys. Training-only keys are refused by name. The schedule
    is ForwardOnly for p > 1 and SingleStage for p = 1."""
    problems: list[str] = []
    allowed = {**SHARED_KEYS, **INFERENCE_KEYS, **MODEL_KEYS}
    refused = {
        k: "is a training-only key; inference has replicas instead of data parallelism and no "
        "optimizer, recompute, micro-batches or virtual pipeline"
        for k in TRAINING_KEYS
    } | {
        k: (
            "is a training key: serving runs its experts over the TP group "
            "(expert_model_parallel_size), with no token dispatcher"
        )
        for k in EXPERT_KEYS
    }
    values = _parse_keys(keys, allowed, problems, refused)
    t = _get_int(values, "tensor_model_parallel_size") or 1
    p = _get_int(values, "pipeline_model_parallel_size") or 1
    spec_model = _model(
        {k: v for k, v in values.items() if k in MODEL_KEYS}, model, t, problems, _given(keys)
    )
    given = _given(keys)
    missing = [k for k in ("batch_size", "prompt_length", "generated_tokens") if k not in given]
    if missing:
        problems.append(f"inference key(s) missing: {', '.join(missing)}")
    unsupported = _unsupported_sizes(values, serving=True)
    if problems or spec_model is None:
        raise ConfigError(problems)
    if unsupported:
        raise UnsupportedError("; ".join(unsupported))
    kv_key = _get_str(values, "kv_cache_datatype")
    kv_datatype = Datatype(kv_key) if kv_key is not None else spec_model.datatype
    schedule = inference_schedule(p)
    communication = tensor_communication(values.get("sequence_parallel") is True)
    return InferenceSpec(
        model=spec_model,
        mapping=TransformerInferenceMappingSpec(
            parallelism=TransformerInferenceParallelism(
                tensor=TensorParallel(degree=t, communication=communication),
                pipeline=PipelineParallel(degree=p, schedule=schedule),
                replicas=ReplicaParallel(degree=_get_int(values, "replicas") or 1),
                experts=ServingExpertParallel(
                    degree=_get_int(values, "expert_model_parallel_size") or 1
                ),
            ),
            workload=InferenceWorkload(
                batch_size=_get_int(values, "batch_size") or 1,
                prompt_length=_get_int(values, "prompt_length") or 1,
                generated_tokens=_get_int(values, "generated_tokens") or 1,
                kv_cache_datatype=kv_datatype,
            ),
        ),
    )


def inference_to_mapping(spec: InferenceSpec) -> dict[str, FlatValue]:
    """Canonical flat keys of an inference spec; ``inference_from_mapping`` inverts it."""
    mapping = spec.mapping
    workload = mapping.workload
    out: dict[str, FlatValue] = {
        "tensor_model_parallel_size": mapping.tensor_degree,
        "pipeline_model_parallel_size": mapping.pipeline_degree,
        "replicas": mapping.replica_degree,
        "expert_model_parallel_size": mapping.expert_degree,
        "sequence_parallel": isinstance(
            mapping.parallelism.tensor.communication, ReduceScatterAllGather
        ),
        "batch_size": workload.batch_size,
        "prompt_length": workload.prompt_length,
        "generated_tokens": workload.generated_tokens,
        "kv_cache_datatype": workload.kv_cache_datatype.value,
    }
    return out | _model_to_mapping(spec.model)
