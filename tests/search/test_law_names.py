"""The shared law names: the exact strings the scalar checker and the search report."""

from __future__ import annotations

from blueprinting.errors import RuleSet
from blueprinting.mapping.law_names import (
    CPU_OFFLOAD_LAWS,
    CUDA_GRAPH_LAWS,
    EXPERT_LAWS,
    MEGATRON_LAWS,
    PLANNER_LAWS,
    Law,
)


def test_names_and_rulesets() -> None:
    assert [str(law) for law in PLANNER_LAWS] == [
        "world_size",
        "local_batch",
        "microbatch_count",
        "blocks_per_pipeline_stage",
        "blocks_per_virtual_chunk",
        "local_sequence",
        "attention_heads_per_tensor_rank",
        "query_groups_vs_tensor",
        "ffn_per_tensor_rank",
        "vocab_per_tensor_rank",
        "schedule_matches_pipeline",
        "recompute_num_layers",
        "cp_sequence_split",
        "cp_hierarchical_sizes",
        "base_precision_layers",
        "expert_parallel_needs_moe",
        "expert_world_size",
        "experts_per_expert_rank",
        "expert_ffn_per_expert_tensor_rank",
        "shared_expert_ffn_per_tensor_rank",
        "moe_tp_needs_sequence_parallel",
        "recompute_module_needs_its_layer",
        "combined_schedule_matches_dispatcher",
        "cuda_graph_scope_needs_its_layer",
    ]
    assert [str(law) for law in MEGATRON_LAWS] == [
        "interleaving_pipeline_degree",
        "megatron_microbatch_group",
        "sequence_parallel_needs_tensor",
        "overlap_param_gather_needs_overlap_grad_reduce",
        "fused_attention_support",
        "attention_backend_runs_window_and_sinks",
        "tp_comm_overlap_needs_sequence_parallel",
        "tp_comm_overlap_buffer_shape",
        "tp_comm_overlap_quantizer",
        "cross_entropy_te_fusion",
        "cp_a2a_heads",
        "cp_needs_fused_attention",
        "cp_sliding_window_comm_type",
        "cp_softmax_type_needs_a2a",
        "precision_recipe_accelerator",
        "low_precision_param_gather_needs_sharded_optimizer",
        "expert_tensor_parallel_without_bias",
        "expert_parallel_needs_sequence_parallel",
        "flex_dispatcher_needs_expert_grid",
        "flex_dispatcher_no_pad_to_capacity",
        "ep_overlap_needs_expert_parallel",
        "ep_overlap_needs_virtual_pipeline",
        "ep_overlap_recompute",
        "ep_overlap_mtp_layers",
        "ep_overlap_datatype",
        "delay_wgrad_needs_ep_overlap",
        "shared_expert_overlap",
        "moe_act_recompute_needs_grouped_gemm",
        "fp8_delayed_scaling_recompute",
        "cuda_graph_full_recompute",
        "cuda_graph_local_scope",
        "cuda_graph_te_full_iteration",
        "cuda_graph_moe_and_moe_router",
        "cuda_graph_moe_preprocess_needs_moe_router",
        "cuda_graph_moe_scope_needs_moe",
        "cuda_graph_mlp_needs_dense_layer",
        "cuda_graph_moe_needs_drop_and_pad",
        "cuda_graph_moe_preprocess_host_copies",
        "cpu_offloading_num_layers",
        "cpu_offloading_pipeline",
        "cpu_offloading_recompute",
        "cpu_offloading_cuda_graphs",
    ]
    # the search varies the expert grid (issue 13 item 5): its laws are searched
    assert [law for law in Law if not law.searched] == [
        Law.BASE_PRECISION_LAYERS,
        # the search plans Megatron's default (unfused) cross-entropy
        Law.MEGATRON_CROSS_ENTROPY_TE_FUSION,
        Law.MEGATRON_PRECISION_RECIPE_ACCELERATOR,
        Law.MEGATRON_PARAM_GATHER_NEEDS_SHARDING,
        Law.MEGATRON_DELAY_WGRAD_NEEDS_EP_OVERLAP,
        Law.COMBINED_SCHEDULE_MATCHES_DISPATCHER,
        Law.MEGATRON_FP8_DELAYED_RECOMPUTE,
        # the search plans no CUDA graphs, nor activation offloading
        *CUDA_GRAPH_LAWS,
        *CPU_OFFLOAD_LAWS,
    ]
    assert len(EXPERT_LAWS) == 19
    assert all(law.ruleset is RuleSet.MEGATRON for law in MEGATRON_LAWS)
    assert all(law.ruleset is RuleSet.PLANNER for law in PLANNER_LAWS)
    assert Law.MEGATRON_MICROBATCH_GROUP.formula == (
        "v > 1 => p <= G <= m and (m mod G == 0 or m mod G >= p), G defaults to p"
    )
    assert all(law.formula for law in Law)


def test_the_scalar_checker_uses_the_same_names() -> None:
    """Each shared name is a law the scalar checker reports (megatron_microbatch_group is the
    search's union of the checker's microbatch_group_bounds and microbatch_group_remainder)."""
    from pathlib import Path

    from blueprinting.mapping import (
        cuda_graph_laws,
        expert_laws,
        laws,
        offload_laws,
        precision_laws,
    )

    source = Path(laws.__file__).read_text()
    scalar_only = {Law.MEGATRON_MICROBATCH_GROUP, Law.WORLD_SIZE}
    # the precision laws live in their own module and report by Law member
    precision = Path(precision_laws.__file__).read_text()
    # so do the expert grid's
    expert = Path(expert_laws.__file__).read_text()
    # and the CUDA graph laws
    graphs = Path(cuda_graph_laws.__file__).read_text()
    # and the offloading laws
    offload = Path(offload_laws.__file__).read_text()
    for law in Law:
        if law in scalar_only:
            continue
        assert (
            f'"{law}"' in source
            or f"Law.{law.name}" in source
            or f"Law.{law.name}" in precision
            or f"Law.{law.name}" in expert
            or f"Law.{law.name}" in graphs
            or f"Law.{law.name}" in offload
        ), law
