"""The names of the laws, shared by the scalar checker (:mod:`blueprinting.mapping.laws`) and the
vectorized filter of the strategy search (:mod:`blueprinting.search.laws_vectorized`).

Both report violations under these names, so a rejection count from the search and a violation
from ``check_training`` refer to the same rule; the one exception is ``megatron_microbatch_group``,
the search's union of the checker's ``microbatch_group_bounds`` and ``microbatch_group_remainder``
(``world_size`` is checked by ``from_mapping``). ``overlap_param_gather_needs_overlap_grad_reduce``
reads only the data-parallel overlap knobs, so the search applies it per option of those knobs
(:func:`blueprinting.search.laws_vectorized.free_option_violations`). The expert grid's laws
(:data:`EXPERT_LAWS`, checked by :mod:`blueprinting.mapping.expert_laws`) are searched too: the
search varies ep, etp and the dispatcher. Notation: t, p, d
tensor/pipeline/data degrees, N GPUs, v virtual stages, L blocks, B global batch, b micro-batch
size, m = B // (d*b) microbatches, G microbatch group size per virtual stage (``None`` means
Megatron's default, p).

Sources: the seed spec ("Composition and divisibility laws", "Tensor-parallel mapping"),
``/work/shared/reference/megatron_rules.md`` (Megatron-LM ``arguments.py``,
``transformer_config.py``, ``model_parallel_config.py``) and ``schedules.md`` section 3
(Megatron-LM ``pipeline_parallel/schedules.py``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import assert_never

from blueprinting.errors import LawViolation, RuleSet


class Law(StrEnum):
    """One law; ``formula`` is what must hold, ``ruleset`` whose rule it is."""

    # Planner laws (seed spec).
    WORLD_SIZE = "world_size"
    LOCAL_BATCH = "local_batch"
    MICROBATCH_COUNT = "microbatch_count"
    BLOCKS_PER_PIPELINE_STAGE = "blocks_per_pipeline_stage"
    BLOCKS_PER_VIRTUAL_CHUNK = "blocks_per_virtual_chunk"
    SEQUENCE_PARALLEL_DIVISIBILITY = "local_sequence"
    ATTENTION_HEADS_DIVISIBILITY = "attention_heads_per_tensor_rank"
    QUERY_GROUPS_DIVISIBILITY = "query_groups_vs_tensor"
    FFN_DIVISIBILITY = "ffn_per_tensor_rank"
    VOCAB_DIVISIBILITY = "vocab_per_tensor_rank"
    SCHEDULE_MATCHES_PIPELINE = "schedule_matches_pipeline"
    RECOMPUTE_NUM_LAYERS_RANGE = "recompute_num_layers"
    CP_SEQUENCE_SPLIT = "cp_sequence_split"
    CP_HIERARCHICAL_SIZES = "cp_hierarchical_sizes"
    BASE_PRECISION_LAYERS = "base_precision_layers"
    EXPERT_PARALLEL_NEEDS_MOE = "expert_parallel_needs_moe"
    EXPERT_WORLD_SIZE = "expert_world_size"
    EXPERTS_PER_EXPERT_RANK = "experts_per_expert_rank"
    EXPERT_FFN_DIVISIBILITY = "expert_ffn_per_expert_tensor_rank"
    SHARED_EXPERT_FFN_DIVISIBILITY = "shared_expert_ffn_per_tensor_rank"
    MOE_TP_NEEDS_SEQUENCE_PARALLEL = "moe_tp_needs_sequence_parallel"
    RECOMPUTE_MODULE_NEEDS_LAYER = "recompute_module_needs_its_layer"
    # Megatron-LM start-up rules.
    MEGATRON_INTERLEAVING_MIN_PIPELINE = "interleaving_pipeline_degree"
    MEGATRON_MICROBATCH_GROUP = "megatron_microbatch_group"
    MEGATRON_SEQUENCE_PARALLEL_NEEDS_TP = "sequence_parallel_needs_tensor"
    MEGATRON_OVERLAP_PARAM_GATHER = "overlap_param_gather_needs_overlap_grad_reduce"
    MEGATRON_FUSED_ATTENTION_SUPPORT = "fused_attention_support"
    MEGATRON_ATTENTION_BACKEND_WINDOW_SINKS = "attention_backend_runs_window_and_sinks"
    MEGATRON_TP_COMM_OVERLAP_NEEDS_SP = "tp_comm_overlap_needs_sequence_parallel"
    MEGATRON_TP_COMM_OVERLAP_BUFFER = "tp_comm_overlap_buffer_shape"
    MEGATRON_TP_COMM_OVERLAP_QUANTIZER = "tp_comm_overlap_quantizer"
    MEGATRON_CROSS_ENTROPY_TE_FUSION = "cross_entropy_te_fusion"
    MEGATRON_CP_A2A_HEADS = "cp_a2a_heads"
    MEGATRON_CP_NEEDS_FUSED_ATTENTION = "cp_needs_fused_attention"
    MEGATRON_CP_SLIDING_WINDOW = "cp_sliding_window_comm_type"
    MEGATRON_CP_SOFTMAX_TYPE = "cp_softmax_type_needs_a2a"
    MEGATRON_PRECISION_RECIPE_ACCELERATOR = "precision_recipe_accelerator"
    MEGATRON_PARAM_GATHER_NEEDS_SHARDING = "low_precision_param_gather_needs_sharded_optimizer"
    MEGATRON_EXPERT_TENSOR_WITHOUT_BIAS = "expert_tensor_parallel_without_bias"
    MEGATRON_EP_NEEDS_SEQUENCE_PARALLEL = "expert_parallel_needs_sequence_parallel"
    MEGATRON_FLEX_NEEDS_EXPERT_GRID = "flex_dispatcher_needs_expert_grid"
    MEGATRON_FLEX_NO_PAD_TO_CAPACITY = "flex_dispatcher_no_pad_to_capacity"
    MEGATRON_EP_OVERLAP_NEEDS_EP = "ep_overlap_needs_expert_parallel"
    MEGATRON_EP_OVERLAP_NEEDS_VIRTUAL_PIPELINE = "ep_overlap_needs_virtual_pipeline"
    MEGATRON_EP_OVERLAP_RECOMPUTE = "ep_overlap_recompute"
    MEGATRON_EP_OVERLAP_MTP = "ep_overlap_mtp_layers"
    MEGATRON_EP_OVERLAP_DATATYPE = "ep_overlap_datatype"
    MEGATRON_DELAY_WGRAD_NEEDS_EP_OVERLAP = "delay_wgrad_needs_ep_overlap"
    COMBINED_SCHEDULE_MATCHES_DISPATCHER = "combined_schedule_matches_dispatcher"
    MEGATRON_SHARED_EXPERT_OVERLAP = "shared_expert_overlap"
    MEGATRON_MOE_ACT_RECOMPUTE = "moe_act_recompute_needs_grouped_gemm"
    MEGATRON_FP8_DELAYED_RECOMPUTE = "fp8_delayed_scaling_recompute"
    CUDA_GRAPH_SCOPE_NEEDS_LAYER = "cuda_graph_scope_needs_its_layer"
    MEGATRON_CUDA_GRAPH_FULL_RECOMPUTE = "cuda_graph_full_recompute"
    MEGATRON_CUDA_GRAPH_LOCAL_SCOPE = "cuda_graph_local_scope"
    MEGATRON_CUDA_GRAPH_TE_FULL_ITERATION = "cuda_graph_te_full_iteration"
    MEGATRON_CUDA_GRAPH_MOE_AND_ROUTER = "cuda_graph_moe_and_moe_router"
    MEGATRON_CUDA_GRAPH_PREPROCESS_NEEDS_ROUTER = "cuda_graph_moe_preprocess_needs_moe_router"
    MEGATRON_CUDA_GRAPH_MOE_SCOPE_NEEDS_MOE = "cuda_graph_moe_scope_needs_moe"
    MEGATRON_CUDA_GRAPH_MLP_NEEDS_DENSE_LAYER = "cuda_graph_mlp_needs_dense_layer"
    MEGATRON_CUDA_GRAPH_MOE_STATIC_SHAPES = "cuda_graph_moe_needs_drop_and_pad"
    MEGATRON_CUDA_GRAPH_PREPROCESS_SYNC = "cuda_graph_moe_preprocess_host_copies"
    MEGATRON_CPU_OFFLOAD_LAYERS = "cpu_offloading_num_layers"
    MEGATRON_CPU_OFFLOAD_PIPELINE = "cpu_offloading_pipeline"
    MEGATRON_CPU_OFFLOAD_RECOMPUTE = "cpu_offloading_recompute"
    MEGATRON_CPU_OFFLOAD_CUDA_GRAPHS = "cpu_offloading_cuda_graphs"

    @property
    def searched(self) -> bool:
        """Whether the strategy search applies the law (its vectorized filter,
        ``search/laws_vectorized.py``, has a mask for it)."""
        return self not in (
            # the precision recipe is one per search, checked before enumerating
            Law.MEGATRON_PRECISION_RECIPE_ACCELERATOR,
            Law.MEGATRON_PARAM_GATHER_NEEDS_SHARDING,
            # the searched recipes keep no layer at the base precision
            Law.BASE_PRECISION_LAYERS,
            # the recipe is one per search and its one selective variant recomputes
            # Megatron's default core_attn, which no recipe refuses
            Law.MEGATRON_FP8_DELAYED_RECOMPUTE,
            # the search plans Megatron's default (unfused) cross-entropy
            Law.MEGATRON_CROSS_ENTROPY_TE_FUSION,
            # the search never sets delay_wgrad_compute, and derives the schedule from the
            # dispatcher (training_schedule), so neither can fail there
            Law.MEGATRON_DELAY_WGRAD_NEEDS_EP_OVERLAP,
            Law.COMBINED_SCHEDULE_MATCHES_DISPATCHER,
            # the search plans no CUDA graphs (cuda_graph_impl none), so none of their laws
            # can fail there
            *CUDA_GRAPH_LAWS,
            # nor activation offloading
            *CPU_OFFLOAD_LAWS,
        )

    @property
    def ruleset(self) -> RuleSet:
        if self.name.startswith("MEGATRON_"):
            return RuleSet.MEGATRON
        return RuleSet.PLANNER

    @property
    def formula(self) -> str:
        """The condition that must hold (what a violation reports as its formula)."""
        match self:
            case Law.WORLD_SIZE:
                return "t * p * d == N"
            case Law.LOCAL_BATCH:
                return "B mod d == 0"
            case Law.MICROBATCH_COUNT:
                return "B mod (d * b) == 0"
            case Law.BLOCKS_PER_PIPELINE_STAGE:
                return "L mod p == 0"
            case Law.BLOCKS_PER_VIRTUAL_CHUNK:
                return "L mod (p * v) == 0"
            case Law.SEQUENCE_PARALLEL_DIVISIBILITY:
                return "sequence parallel (RS+AG) => seq_length mod (t * cp) == 0"
            case Law.ATTENTION_HEADS_DIVISIBILITY:
                return "num_attention_heads mod t == 0"
            case Law.QUERY_GROUPS_DIVISIBILITY:
                # training's (the search's); serving also takes t mod num_query_groups == 0
                return "num_query_groups mod t == 0"
            case Law.FFN_DIVISIBILITY:
                return "ffn_hidden_size mod t == 0"
            case Law.VOCAB_DIVISIBILITY:
                return "padded_vocab_size mod t == 0"
            case Law.SCHEDULE_MATCHES_PIPELINE:
                return "v > 1 => p > 1 (SingleStage iff p == 1, 1F1B iff p > 1 and v == 1)"
            case Law.RECOMPUTE_NUM_LAYERS_RANGE:
                return "full recompute => 1 <= recompute_num_layers <= L // p"
            case Law.CP_SEQUENCE_SPLIT:
                return "cp > 1 => seq_length mod (2 * cp) == 0"
            case Law.CP_HIERARCHICAL_SIZES:
                return "cp_comm_type a2a+p2p => a2a_size * p2p_size == cp"
            case Law.BASE_PRECISION_LAYERS:
                return "num_layers_at_start_in_bf16 + num_layers_at_end_in_bf16 <= num_layers"
            case Law.MEGATRON_INTERLEAVING_MIN_PIPELINE:
                return "v > 1 => p > 2 or (p == 2 and overlap_p2p_comm)"
            case Law.MEGATRON_MICROBATCH_GROUP:
                return "v > 1 => p <= G <= m and (m mod G == 0 or m mod G >= p), G defaults to p"
            case Law.MEGATRON_SEQUENCE_PARALLEL_NEEDS_TP:
                return "sequence parallel => t > 1"
            case Law.MEGATRON_OVERLAP_PARAM_GATHER:
                return "overlap_param_gather => overlap_grad_reduce"
            case Law.MEGATRON_FUSED_ATTENTION_SUPPORT:
                return "fused attention => datatype in {fp16, bf16, fp8} and kv_channels <= 256"
            case Law.MEGATRON_TP_COMM_OVERLAP_NEEDS_SP:
                return "tp_comm_overlap => sequence parallel and t > 1"
            case Law.MEGATRON_TP_COMM_OVERLAP_BUFFER:
                return "tp_comm_overlap => (seq_length * micro_batch) mod t == 0"
            case Law.MEGATRON_CROSS_ENTROPY_TE_FUSION:
                return "cross_entropy_loss_fusion => cross_entropy_fusion_impl = native"
            case Law.MEGATRON_TP_COMM_OVERLAP_QUANTIZER:
                return (
                    "tp_comm_overlap => recipe in {base precision, delayed / tensorwise FP8, MXFP8}"
                )
            case Law.MEGATRON_CP_A2A_HEADS:
                return (
                    "cp_comm_type a2a (a2a+p2p) => local query heads and local KV heads "
                    "mod cp (a2a_size) == 0"
                )
            case Law.MEGATRON_CP_NEEDS_FUSED_ATTENTION:
                return "cp > 1 => fused attention (Transformer Engine flash / cuDNN backends)"
            case Law.MEGATRON_ATTENTION_BACKEND_WINDOW_SINKS:
                return (
                    "window_size set => attention_backend != local; "
                    "softmax_type != vanilla => attention_backend != flash"
                )
            case Law.MEGATRON_CP_SLIDING_WINDOW:
                return "cp > 1 and sliding-window layers => cp_comm_type in {a2a, all_gather}"
            case Law.MEGATRON_CP_SOFTMAX_TYPE:
                return "cp > 1 and softmax_type != vanilla (attention sinks) => cp_comm_type = a2a"
            case Law.MEGATRON_PRECISION_RECIPE_ACCELERATOR:
                return "the recipe's GEMM format is one the accelerator runs"
            case Law.MEGATRON_PARAM_GATHER_NEEDS_SHARDING:
                return "fp8_param_gather or fp4_param_gather => a sharded (distributed) optimizer"
            case Law.EXPERT_PARALLEL_NEEDS_MOE:
                return "ep > 1 or etp > 1 => the model has routed experts (num_experts)"
            case Law.EXPERT_WORLD_SIZE:
                return "N mod (etp * ep * p) == 0, so that etp * ep * expert_dp == t * cp * d"
            case Law.EXPERTS_PER_EXPERT_RANK:
                return "num_experts mod ep == 0"
            case Law.EXPERT_FFN_DIVISIBILITY:
                return "moe_ffn_hidden_size mod etp == 0"
            case Law.SHARED_EXPERT_FFN_DIVISIBILITY:
                return "moe_shared_expert_intermediate_size mod t == 0"
            case Law.MOE_TP_NEEDS_SEQUENCE_PARALLEL:
                return "MoE and t > 1 => sequence_parallel"
            case Law.MEGATRON_EXPERT_TENSOR_WITHOUT_BIAS:
                return "routed experts and etp > 1 => not add_bias_linear"
            case Law.MEGATRON_EP_NEEDS_SEQUENCE_PARALLEL:
                return "ep > 1 and t > 1 => sequence parallel"
            case Law.MEGATRON_FLEX_NEEDS_EXPERT_GRID:
                return "moe_token_dispatcher_type flex => etp * ep > 1"
            case Law.MEGATRON_FLEX_NO_PAD_TO_CAPACITY:
                return "moe_token_dispatcher_type flex => not moe_pad_expert_input_to_capacity"
            case Law.MEGATRON_EP_OVERLAP_NEEDS_EP:
                return "overlap_moe_expert_parallel_comm => ep > 1"
            case Law.MEGATRON_EP_OVERLAP_NEEDS_VIRTUAL_PIPELINE:
                return "overlap_moe_expert_parallel_comm and p > 1 => interleaved schedule (v > 1)"
            case Law.MEGATRON_EP_OVERLAP_RECOMPUTE:
                return (
                    "overlap_moe_expert_parallel_comm => no full recompute and no moe in "
                    "recompute_modules"
                )
            case Law.MEGATRON_EP_OVERLAP_MTP:
                return "overlap_moe_expert_parallel_comm => mtp_num_layers <= 1"
            case Law.MEGATRON_EP_OVERLAP_DATATYPE:
                return "overlap_moe_expert_parallel_comm => datatype in {bf16, fp16}"
            case Law.MEGATRON_DELAY_WGRAD_NEEDS_EP_OVERLAP:
                return "delay_wgrad_compute => overlap_moe_expert_parallel_comm"
            case Law.COMBINED_SCHEDULE_MATCHES_DISPATCHER:
                return "schedule is combined 1F1B <=> overlap_moe_expert_parallel_comm"
            case Law.MEGATRON_SHARED_EXPERT_OVERLAP:
                return (
                    "moe_shared_expert_overlap => shared experts, not "
                    "overlap_moe_expert_parallel_comm, no shared_experts in recompute_modules"
                )
            case Law.MEGATRON_MOE_ACT_RECOMPUTE:
                return "moe_act in recompute_modules => moe_grouped_gemm"
            case Law.MEGATRON_FP8_DELAYED_RECOMPUTE:
                return "fp8_recipe = delayed => no moe_act, layernorm in recompute_modules"
            case Law.CUDA_GRAPH_SCOPE_NEEDS_LAYER:
                return "mamba in cuda_graph_scope => Mamba layers (the planner models none)"
            case Law.MEGATRON_CUDA_GRAPH_FULL_RECOMPUTE:
                return "cuda_graph_impl != none => recompute_granularity != full"
            case Law.MEGATRON_CUDA_GRAPH_LOCAL_SCOPE:
                return "cuda_graph_impl = local => cuda_graph_scope is empty or full_iteration"
            case Law.MEGATRON_CUDA_GRAPH_TE_FULL_ITERATION:
                return "cuda_graph_impl = transformer_engine => full_iteration not in scope"
            case Law.MEGATRON_CUDA_GRAPH_MOE_AND_ROUTER:
                return "not both moe and moe_router in cuda_graph_scope"
            case Law.MEGATRON_CUDA_GRAPH_PREPROCESS_NEEDS_ROUTER:
                return "moe_preprocess in cuda_graph_scope => moe_router in cuda_graph_scope"
            case Law.MEGATRON_CUDA_GRAPH_MOE_SCOPE_NEEDS_MOE:
                return "moe or moe_router in cuda_graph_scope => routed experts (num_experts > 1)"
            case Law.MEGATRON_CUDA_GRAPH_MLP_NEEDS_DENSE_LAYER:
                return "mlp in cuda_graph_scope => a dense MLP layer in the model"
            case Law.MEGATRON_CUDA_GRAPH_MOE_STATIC_SHAPES:
                return (
                    "moe in cuda_graph_scope => alltoall dispatcher with "
                    "moe_expert_capacity_factor and moe_pad_expert_input_to_capacity"
                )
            case Law.MEGATRON_CUDA_GRAPH_PREPROCESS_SYNC:
                return (
                    "moe_preprocess in cuda_graph_scope and alltoall without drop-and-pad => "
                    "no moe_expert_capacity_factor"
                )
            case Law.MEGATRON_CPU_OFFLOAD_LAYERS:
                return "cpu_offloading => 0 <= cpu_offloading_num_layers < L"
            case Law.MEGATRON_CPU_OFFLOAD_PIPELINE:
                return "cpu_offloading => p == 1"
            case Law.MEGATRON_CPU_OFFLOAD_RECOMPUTE:
                return "cpu_offloading => recompute_granularity is none"
            case Law.MEGATRON_CPU_OFFLOAD_CUDA_GRAPHS:
                return "cpu_offloading => cuda_graph_impl = none, or local with full_iteration"
            case Law.RECOMPUTE_MODULE_NEEDS_LAYER:
                return (
                    "moe_act, moe in recompute_modules => MoE layers; shared_experts => shared "
                    "experts; mla_up_proj => multi-latent attention"
                )
            case _ as unreachable:
                assert_never(unreachable)


#: The laws of the expert grid (:mod:`blueprinting.mapping.expert_laws`), which the search
#: applies over its ep, etp and dispatcher axes (``search/laws_vectorized.py``).
EXPERT_LAWS: frozenset[Law] = frozenset(
    {
        Law.EXPERT_PARALLEL_NEEDS_MOE,
        Law.EXPERT_WORLD_SIZE,
        Law.EXPERTS_PER_EXPERT_RANK,
        Law.EXPERT_FFN_DIVISIBILITY,
        Law.SHARED_EXPERT_FFN_DIVISIBILITY,
        Law.MOE_TP_NEEDS_SEQUENCE_PARALLEL,
        Law.MEGATRON_EXPERT_TENSOR_WITHOUT_BIAS,
        Law.MEGATRON_EP_NEEDS_SEQUENCE_PARALLEL,
        Law.MEGATRON_FLEX_NEEDS_EXPERT_GRID,
        Law.MEGATRON_FLEX_NO_PAD_TO_CAPACITY,
        Law.MEGATRON_EP_OVERLAP_NEEDS_EP,
        Law.MEGATRON_EP_OVERLAP_NEEDS_VIRTUAL_PIPELINE,
        Law.MEGATRON_EP_OVERLAP_RECOMPUTE,
        Law.MEGATRON_EP_OVERLAP_MTP,
        Law.MEGATRON_EP_OVERLAP_DATATYPE,
        Law.MEGATRON_DELAY_WGRAD_NEEDS_EP_OVERLAP,
        Law.COMBINED_SCHEDULE_MATCHES_DISPATCHER,
        Law.MEGATRON_SHARED_EXPERT_OVERLAP,
        Law.MEGATRON_MOE_ACT_RECOMPUTE,
    }
)

PLANNER_LAWS: tuple[Law, ...] = tuple(law for law in Law if law.ruleset is RuleSet.PLANNER)
MEGATRON_LAWS: tuple[Law, ...] = tuple(law for law in Law if law.ruleset is RuleSet.MEGATRON)


def law_violation(law: Law, message: str, **values: str | int | bool | None) -> LawViolation:
    """A violation of ``law`` with its formula and rule set, the values named as given."""
    return LawViolation(
        law=law.value,
        formula=law.formula,
        values=tuple(values.items()),
        message=message,
        ruleset=law.ruleset,
    )


#: The activation offloading laws (:mod:`blueprinting.mapping.offload_laws`); the search plans
#: no offloading, so it applies none of them.
CPU_OFFLOAD_LAWS: tuple[Law, ...] = (
    Law.MEGATRON_CPU_OFFLOAD_LAYERS,
    Law.MEGATRON_CPU_OFFLOAD_PIPELINE,
    Law.MEGATRON_CPU_OFFLOAD_RECOMPUTE,
    Law.MEGATRON_CPU_OFFLOAD_CUDA_GRAPHS,
)

#: The CUDA graph laws (:mod:`blueprinting.mapping.cuda_graph_laws`); the search plans no CUDA
#: graphs, so it applies none of them.
CUDA_GRAPH_LAWS: tuple[Law, ...] = (
    Law.CUDA_GRAPH_SCOPE_NEEDS_LAYER,
    Law.MEGATRON_CUDA_GRAPH_FULL_RECOMPUTE,
    Law.MEGATRON_CUDA_GRAPH_LOCAL_SCOPE,
    Law.MEGATRON_CUDA_GRAPH_TE_FULL_ITERATION,
    Law.MEGATRON_CUDA_GRAPH_MOE_AND_ROUTER,
    Law.MEGATRON_CUDA_GRAPH_PREPROCESS_NEEDS_ROUTER,
    Law.MEGATRON_CUDA_GRAPH_MOE_SCOPE_NEEDS_MOE,
    Law.MEGATRON_CUDA_GRAPH_MLP_NEEDS_DENSE_LAYER,
    Law.MEGATRON_CUDA_GRAPH_MOE_STATIC_SHAPES,
    Law.MEGATRON_CUDA_GRAPH_PREPROCESS_SYNC,
)
