"""Model and mapping fixtures built straight from the ADT (no presets).

Provenance: GPT-3 175B as trained in Narayanan et al. 2021 (Table 1; vocab 51200 padded);
Llama-2 70B from Touvron et al. 2023 / its HF config.json (GQA 8 groups, SwiGLU, RMSNorm, RoPE,
untied embeddings, vocab 32000).
"""

from __future__ import annotations

from blueprinting.mapping.model import (
    EmbeddingTying,
    MlpActivation,
    Normalization,
    PositionEmbedding,
    TransformerModelSpec,
)
from blueprinting.mapping.transformer import (
    AllReduce,
    AttentionKernel,
    BatchSpec,
    DataParallel,
    NoRecompute,
    OneForwardOneBackward,
    PipelineParallel,
    RecomputePolicy,
    TensorCommunication,
    TensorParallel,
    TransformerTrainingMappingSpec,
    TransformerTrainingParallelism,
    UnfusedAttention,
)

GPT3_175B = TransformerModelSpec(
    name="gpt3-175b",
    num_layers=96,
    hidden_size=12288,
    num_attention_heads=96,
    num_query_groups=96,
    kv_channels=128,
    ffn_hidden_size=49152,
    seq_length=2048,
    vocab_size=50257,
    padded_vocab_size=51200,
)

LLAMA2_70B = TransformerModelSpec(
    name="llama2-70b",
    num_layers=80,
    hidden_size=8192,
    num_attention_heads=64,
    num_query_groups=8,
    kv_channels=128,
    ffn_hidden_size=28672,
    seq_length=4096,
    vocab_size=32000,
    padded_vocab_size=32000,
    activation=MlpActivation.SWIGLU,
    normalization=Normalization.RMSNORM,
    position_embedding=PositionEmbedding.ROPE,
    embeddings=EmbeddingTying.UNTIED,
    add_bias_linear=False,
)


def training_mapping(
    *,
    tp: int,
    communication: TensorCommunication | None = None,
    recompute: RecomputePolicy | None = None,
    pp: int = 1,
    dp: int = 1,
    micro_batch: int = 1,
    attention: AttentionKernel | None = None,
) -> TransformerTrainingMappingSpec:
    """Korthikanti's unfused attention unless ``attention`` says otherwise: the golden figures
    of these tests are that algebra's."""
    return TransformerTrainingMappingSpec(
        parallelism=TransformerTrainingParallelism(
            tensor=TensorParallel(
                degree=tp, communication=communication if communication else AllReduce()
            ),
            pipeline=PipelineParallel(degree=pp, schedule=OneForwardOneBackward()),
            data=DataParallel(degree=dp),
            recompute=recompute if recompute is not None else NoRecompute(),
        ),
        batch=BatchSpec(global_batch_size=micro_batch * dp * 8, micro_batch_size=micro_batch),
        attention=attention if attention is not None else UnfusedAttention(),
    )
