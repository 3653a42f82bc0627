"""The loss stage's multi-token-prediction activations (analysis/memory.py ``mtp_stored_bytes``):
per depth and in-flight microbatch, the depth's decoder layer (the last layer's kind), five
``rows x h`` tensors (enorm and hnorm inputs, eh_proj's 2h input, the final norm's input) and its
own output head (fp32 logits of the vocabulary shard and the head's input); under full uniform
recompute only the two checkpointed inputs and the head (Megatron-LM
``multi_token_prediction.py`` @00611e6e)."""

from __future__ import annotations

from dataclasses import replace

from blueprinting.analysis.memory import stage_activations
from blueprinting.mapping.transformer import (
    AllToAllDispatcher,
    BatchSpec,
    DataParallel,
    DistributedOptimizer,
    ExpertParallel,
    FullRecompute,
    NoRecompute,
    PipelineParallel,
    RecomputeMethod,
    SingleStage,
    TensorParallel,
    TransformerTrainingMappingSpec,
    TransformerTrainingParallelism,
)
from tests.synthesizer.moe_models import deepseek_like

H, S, VOCAB = 7168, 4096, 129280  # deepseek-v3: hidden, the trimmed model's s, padded vocab (t = 1)


def _mapping(recompute: NoRecompute | FullRecompute) -> TransformerTrainingMappingSpec:
    return TransformerTrainingMappingSpec(
        parallelism=TransformerTrainingParallelism(
            tensor=TensorParallel(degree=1),
            pipeline=PipelineParallel(degree=1, schedule=SingleStage()),
            data=DataParallel(degree=8, optimizer_sharding=DistributedOptimizer()),
            experts=ExpertParallel(degree=8, dispatcher=AllToAllDispatcher()),
            recompute=recompute,
        ),
        batch=BatchSpec(global_batch_size=8, micro_batch_size=1),
    )


def _mtp(depths: int, recompute: NoRecompute | FullRecompute) -> int:
    model = replace(deepseek_like(), mtp_num_layers=depths)
    return stage_activations(model, _mapping(recompute), 0).mtp


def test_without_mtp_nothing_is_added() -> None:
    assert _mtp(0, NoRecompute()) == 0


def test_each_depth_adds_its_layer_tensors_and_head() -> None:
    one, two = _mtp(1, NoRecompute()), _mtp(2, NoRecompute())
    assert two == 2 * one
    head = 4 * S * VOCAB + 2 * S * H  # fp32 logits + the head's bf16 input, one microbatch
    model = deepseek_like()  # the last layer is a MoE layer: the depth's layer is one too
    moe_layer = stage_activations(model, _mapping(NoRecompute()), 0).layers_stored
    dense_first = stage_activations(
        replace(model, num_layers=1), _mapping(NoRecompute()), 0
    ).layers_stored
    # deepseek_like(4 layers, 1 dense): stored = dense + 3 MoE layers
    per_moe_layer = (moe_layer - dense_first) // 3
    assert one == per_moe_layer + 5 * 2 * S * H + head


def test_full_uniform_recompute_keeps_two_inputs_and_the_head() -> None:
    full = FullRecompute(method=RecomputeMethod.UNIFORM, num_layers=1)
    assert _mtp(1, full) == 2 * 2 * S * H + 4 * S * VOCAB + 2 * S * H
