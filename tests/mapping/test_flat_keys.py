"""from_mapping, to_mapping, to_megatron_args, inference_from_mapping: exact errors, values."""

from __future__ import annotations

import pytest

from blueprinting.errors import ConfigError, InvalidStrategyError
from blueprinting.mapping.model import (
    Datatype,
    EmbeddingTying,
    MlpActivation,
    Normalization,
    PositionEmbedding,
)
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import (
    AllReduce,
    DistributedOptimizer,
    ForwardOnly,
    FullRecompute,
    InterleavedOneForwardOneBackward,
    NoOptimizerSharding,
    NoRecompute,
    OneForwardOneBackward,
    RecomputeMethod,
    ReduceScatterAllGather,
    SelectiveRecompute,
    ShardedParameters,
    SingleStage,
    UnevenStages,
    from_mapping,
    inference_from_mapping,
    to_mapping,
    to_megatron_args,
)

GPT3_KEYS: dict[str, object] = {
    "tensor_model_parallel_size": 8,
    "pipeline_model_parallel_size": 8,
    "num_virtual_stages_per_pipeline_rank": 3,
    "world_size": 1024,
    "sequence_parallel": True,
    "recompute_granularity": "selective",
    "use_distributed_optimizer": True,
    "micro_batch_size": 1,
    "global_batch_size": 1536,
    "bf16": True,
}


def _problems(keys: dict[str, object]) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as error:
        from_mapping(keys, model=model_preset("gpt3-175b"))
    return error.value.problems


def test_gpt3_keys_build_the_published_strategy() -> None:
    spec = from_mapping(GPT3_KEYS, model=model_preset("gpt3-175b"))
    assert str(spec) == "gpt3-175b: TP8(rs+ag) PP8(1F1B x3) DP16(dist-opt) recompute=selective"
    schedule = spec.mapping.parallelism.pipeline.schedule
    # Megatron-LM's flag is --no-overlap-p2p-communication: overlap is on by default.
    assert schedule == InterleavedOneForwardOneBackward(virtual_stages=3, overlap_p2p_comm=True)
    assert spec.mapping.microbatch_count == 96
    assert spec.model.published_parameters == 175_000_000_000


def test_dashes_and_leading_double_dash_are_accepted() -> None:
    keys = {"--tensor-model-parallel-size": 8, "data-parallel-size": 2}
    spec = from_mapping(keys, model=model_preset("gpt3-175b"))
    assert (spec.mapping.tensor_degree, spec.mapping.data_degree) == (8, 2)
    assert spec.mapping.parallelism.pipeline.schedule == SingleStage()
    assert spec.mapping.batch.global_batch_size == 2  # Megatron default: mbs * d


def test_every_problem_is_collected_in_one_error() -> None:
    problems = _problems(
        {
            "tensor_model_paralel_size": 8,
            "data_parallel_size": 2,
            "world_size": 64,
            "num_virtual_stages_per_pipeline_rank": 2,
            "virtual_pipeline_model_parallel_size": 2,
            "use_distributed_optimizer": False,
            "data_parallel_sharding_strategy": "optim",
            "micro_batch_size": "1",
            "sequence_parallel": 1,
        }
    )
    assert problems == (
        "unknown key 'tensor_model_paralel_size' (did you mean 'tensor_model_parallel_size'?)",
        "micro_batch_size must be a positive integer, got '1' (str)",
        "sequence_parallel must be a boolean, got 1 (int)",
        "data_parallel_size = 2 conflicts with world_size = 64 "
        "(world_size = t * p * d = 1 * 1 * 2 = 2)",
        "at most one virtual-pipeline key may be set, got num_virtual_stages_per_pipeline_rank, "
        "virtual_pipeline_model_parallel_size",
        "use_distributed_optimizer = false conflicts with data_parallel_sharding_strategy = optim",
    )


def test_world_size_not_divisible_names_the_law() -> None:
    with pytest.raises(InvalidStrategyError) as error:
        from_mapping(
            {"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 3, "world_size": 100},
            model=model_preset("gpt3-175b"),
        )
    (violation,) = error.value.violations
    assert violation.law == "world_size"
    assert violation.formula == "world_size = t * p * d"
    assert violation.message == "d = world_size / (t * p) = 100 / (8 * 3) is not integral"


def test_layers_per_virtual_stage_gives_v() -> None:
    spec = from_mapping(
        {
            "pipeline_model_parallel_size": 8,
            "num_layers_per_virtual_pipeline_stage": 4,
            "data_parallel_size": 1,
            "global_batch_size": 64,
        },
        model=model_preset("gpt3-175b"),
    )
    assert spec.mapping.virtual_stages == 3  # (96 / 8) / 4


def test_overlap_and_group_without_interleaving_are_refused() -> None:
    problems = _problems(
        {
            "pipeline_model_parallel_size": 8,
            "data_parallel_size": 1,
            "overlap_p2p_comm": True,
            "microbatch_group_size_per_vp_stage": 8,
        }
    )
    assert problems == (
        "microbatch_group_size_per_vp_stage needs an interleaved schedule "
        "(a virtual-pipeline size > 1)",
        "overlap_p2p_comm = true needs an interleaved schedule (Megatron-LM turns it off "
        "otherwise; Blueprinting refuses instead)",
    )


def test_recompute_keys() -> None:
    base = {"data_parallel_size": 1, "pipeline_model_parallel_size": 8}
    legacy = from_mapping({**base, "recompute_activations": True}, model=model_preset("gpt3-175b"))
    assert legacy.mapping.parallelism.recompute == SelectiveRecompute()
    full = from_mapping(
        {
            **base,
            "recompute_granularity": "full",
            "recompute_method": "block",
            "recompute_num_layers": 4,
        },
        model=model_preset("gpt3-175b"),
    )
    assert full.mapping.parallelism.recompute == FullRecompute(
        method=RecomputeMethod.BLOCK, num_layers=4
    )
    assert _problems({**base, "recompute_granularity": "full"}) == (
        "recompute_granularity = full needs recompute_method and recompute_num_layers",
    )
    assert _problems(
        {**base, "recompute_granularity": "selective", "recompute_method": "uniform"}
    ) == ("recompute_method need(s) recompute_granularity = full, got selective",)


def test_sharding_strategies() -> None:
    base: dict[str, object] = {"data_parallel_size": 4}
    plain = from_mapping(base, model=model_preset("gpt3-175b"))
    assert plain.mapping.parallelism.data.optimizer_sharding == NoOptimizerSharding()
    fsdp = from_mapping(
        {**base, "data_parallel_sharding_strategy": "optim_grads_params"},
        model=model_preset("gpt3-175b"),
    )
    assert fsdp.mapping.parallelism.data.optimizer_sharding == ShardedParameters()
    assert _problems({**base, "overlap_param_gather": True}) == (
        "overlap_param_gather = true needs a sharded optimizer (use_distributed_optimizer or a "
        "data_parallel_sharding_strategy other than no_shard)",
    )


def test_model_keys_without_preset() -> None:
    spec = from_mapping(
        {
            "data_parallel_size": 1,
            "num_layers": 32,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "group_query_attention": True,
            "num_query_groups": 8,
            "swiglu": True,
            "normalization": "RMSNorm",
            "position_embedding_type": "rope",
            "seq_length": 8192,
            "vocab_size": 128256,
            "untie_embeddings_and_output_weights": True,
            "disable_bias_linear": True,
            "bf16": True,
        }
    )
    model = spec.model
    assert model.name == "custom"
    assert model.ffn_hidden_size == 10880  # int(8 * 4096 / 3 / 64) * 64, Megatron's default
    assert (model.num_query_groups, model.kv_channels) == (8, 128)
    assert model.activation is MlpActivation.SWIGLU
    assert model.normalization is Normalization.RMSNORM
    assert model.position_embedding is PositionEmbedding.ROPE
    assert model.embeddings is EmbeddingTying.UNTIED
    assert model.add_bias_linear is False
    assert model.datatype is Datatype.BF16
    assert model.padded_vocab_size == 128256


def test_missing_model_keys_without_preset() -> None:
    with pytest.raises(ConfigError) as error:
        from_mapping({"data_parallel_size": 1, "num_layers": 2})
    assert error.value.problems == (
        "no model preset given and model key(s) missing: hidden_size, num_attention_heads, "
        "seq_length, vocab_size",
    )


def test_make_vocab_size_divisible_by_pads_like_megatron() -> None:
    spec = from_mapping(
        {
            "tensor_model_parallel_size": 8,
            "data_parallel_size": 1,
            "vocab_size": 50257,
            "make_vocab_size_divisible_by": 128,
        },
        model=model_preset("gpt3-175b"),
    )
    assert spec.model.padded_vocab_size == 51200
    assert spec.model.published_parameters is None  # the architecture keys changed the model


def test_overriding_hidden_size_updates_default_derived_fields() -> None:
    spec = from_mapping(
        {"data_parallel_size": 1, "hidden_size": 6144}, model=model_preset("gpt3-175b")
    )
    assert (spec.model.kv_channels, spec.model.ffn_hidden_size) == (64, 24576)


def test_num_query_groups_without_gqa_flag_is_refused() -> None:
    assert _problems({"data_parallel_size": 1, "num_query_groups": 8}) == (
        "num_query_groups = 8 needs group_query_attention = true "
        "(Megatron-LM ignores it otherwise)",
    )


def test_to_mapping_of_the_gpt3_strategy() -> None:
    spec = from_mapping(GPT3_KEYS, model=model_preset("gpt3-175b"))
    flat = to_mapping(spec)
    assert {k: flat[k] for k in list(flat)[:14]} == {
        "tensor_model_parallel_size": 8,
        "pipeline_model_parallel_size": 8,
        "data_parallel_size": 16,
        "sequence_parallel": True,
        "num_virtual_stages_per_pipeline_rank": 3,
        "overlap_p2p_comm": True,
        "use_distributed_optimizer": True,
        "data_parallel_sharding_strategy": "optim",
        "overlap_param_gather": False,
        "overlap_grad_reduce": False,
        "recompute_granularity": "selective",
        "attention_backend": "auto",
        "micro_batch_size": 1,
        "global_batch_size": 1536,
    }


def test_megatron_args_of_the_gpt3_strategy() -> None:
    spec = from_mapping(GPT3_KEYS, model=model_preset("gpt3-175b"))
    assert " ".join(to_megatron_args(spec)) == (
        "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 "
        "--num-virtual-stages-per-pipeline-rank 3 --sequence-parallel "
        "--use-distributed-optimizer --recompute-granularity selective "
        "--micro-batch-size 1 --global-batch-size 1536 "
        "--num-layers 96 --hidden-size 12288 --ffn-hidden-size 49152 --num-attention-heads 96 "
        "--kv-channels 128 --seq-length 2048 --max-position-embeddings 2048 "
        "--position-embedding-type learned_absolute --normalization LayerNorm "
        "--vocab-size 50257 --padded-vocab-size 51200 --bf16"
    )


def test_megatron_args_of_a_llama_fsdp_full_recompute_strategy() -> None:
    spec = from_mapping(
        {
            "tensor_model_parallel_size": 8,
            "pipeline_model_parallel_size": 2,
            "decoder_first_pipeline_num_layers": 30,
            "data_parallel_size": 4,
            "data_parallel_sharding_strategy": "optim_grads_params",
            "overlap_grad_reduce": True,
            "overlap_param_gather": True,
            "recompute_granularity": "full",
            "recompute_method": "uniform",
            "recompute_num_layers": 1,
            "global_batch_size": 64,
        },
        model=model_preset("llama3-70b"),
    )
    assert spec.mapping.parallelism.pipeline.layout == UnevenStages(first_stage_layers=30)
    # Megatron-FSDP's gradient datatype defaults to the parameters' (auto): the plan's fp32 is
    # spelled out
    assert " ".join(to_megatron_args(spec)[:23]) == (
        "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 2 "
        "--decoder-first-pipeline-num-layers 30 --use-megatron-fsdp "
        "--data-parallel-sharding-strategy optim_grads_params --overlap-grad-reduce "
        "--overlap-param-gather --megatron-fsdp-main-grads-dtype fp32 "
        "--recompute-granularity full --recompute-method uniform "
        "--recompute-num-layers 1 --micro-batch-size 1 --global-batch-size 64"
    )
    assert "--group-query-attention --num-query-groups 8" in " ".join(to_megatron_args(spec))
    assert to_megatron_args(spec)[-1] == "--bf16"


def test_megatron_args_refuse_an_unlawful_strategy() -> None:
    spec = from_mapping(
        {"pipeline_model_parallel_size": 7, "data_parallel_size": 1},
        model=model_preset("gpt3-175b"),
    )
    with pytest.raises(InvalidStrategyError, match="blocks_per_pipeline_stage = 96 / 7"):
        to_megatron_args(spec)


# --------------------------------------------------------------------------------------------
# Inference
# --------------------------------------------------------------------------------------------
def test_inference_from_mapping() -> None:
    spec = inference_from_mapping(
        {
            "tensor_model_parallel_size": 8,
            "pipeline_model_parallel_size": 2,
            "replicas": 4,
            "batch_size": 16,
            "prompt_length": 1024,
            "generated_tokens": 256,
            "kv_cache_datatype": "float8",
        },
        model=model_preset("llama2-70b"),
    )
    assert str(spec) == "llama2-70b: TP8(ar) PP2(fwd) R4"
    assert spec.mapping.parallelism.pipeline.schedule == ForwardOnly()
    assert spec.mapping.parallelism.tensor.communication == AllReduce()
    assert spec.mapping.workload.kv_cache_datatype is Datatype.FP8
    assert spec.mapping.world_size == 64

    single = inference_from_mapping(
        {"batch_size": 1, "prompt_length": 8, "generated_tokens": 8},
        model=model_preset("llama2-7b"),
    )
    assert single.mapping.parallelism.pipeline.schedule == SingleStage()
    assert single.mapping.workload.kv_cache_datatype is Datatype.BF16


def test_inference_refuses_training_keys() -> None:
    with pytest.raises(ConfigError) as error:
        inference_from_mapping(
            {"data_parallel_size": 2, "recompute_granularity": "full", "batch_size": 1},
            model=model_preset("llama2-7b"),
        )
    reason = (
        "is a training-only key; inference has replicas instead of data parallelism and no "
        "optimizer, recompute, micro-batches or virtual pipeline"
    )
    assert error.value.problems == (
        f"key 'data_parallel_size' {reason}",
        f"key 'recompute_granularity' {reason}",
        "inference key(s) missing: prompt_length, generated_tokens",
    )


def test_training_refuses_inference_keys() -> None:
    assert _problems({"data_parallel_size": 1, "replicas": 2}) == (
        "key 'replicas' is an inference key; training uses data_parallel_size",
    )


def test_schedule_mapping_follows_the_degrees() -> None:
    one = from_mapping(
        {"pipeline_model_parallel_size": 4, "data_parallel_size": 1},
        model=model_preset("gpt3-175b"),
    )
    assert one.mapping.parallelism.pipeline.schedule == OneForwardOneBackward()
    assert one.mapping.parallelism.tensor.communication == AllReduce()
    assert one.mapping.parallelism.recompute == NoRecompute()
    sp = from_mapping(
        {"tensor_model_parallel_size": 2, "sequence_parallel": True, "data_parallel_size": 1},
        model=model_preset("gpt3-175b"),
    )
    assert sp.mapping.parallelism.tensor.communication == ReduceScatterAllGather()
    dist = from_mapping(
        {"use_distributed_optimizer": True, "data_parallel_size": 2},
        model=model_preset("gpt3-175b"),
    )
    assert dist.mapping.parallelism.data.optimizer_sharding == DistributedOptimizer()
