"""MoE models built in Python for the strategy tests (the MoE presets and their keys arrive with
issue 13's model part).

``DEEPSEEK_V3_LIKE``: DeepSeek-V3's architecture as the shared reference
``modern_parallelism.md`` section 4 lists it (deepseek-ai/DeepSeek-V3
``inference/configs/config_671B.json``; 61 layers, h 7168, 128 MLA heads, 256 routed experts of
2048, top-8, one shared expert of 2048, 3 dense layers of 18432, vocabulary 129,280, MTP 1).
``GPT_OSS_LIKE``: GPT-OSS-120B's (same section: 36 layers, h 2880, 64 / 8 heads of 64, 128
experts of 2880, top-4, linear biases, vocabulary 201,088).
"""

from __future__ import annotations

from blueprinting.mapping.model import (
    Datatype,
    EmbeddingTying,
    MixtureOfExperts,
    MlpActivation,
    MoeLayerList,
    MultiLatentAttention,
    Normalization,
    PositionEmbedding,
    RouterScore,
    TransformerModelSpec,
)

DEEPSEEK_V3_MOE = MixtureOfExperts(
    num_experts=256,
    top_k=8,
    expert_ffn_hidden_size=2048,
    shared_expert_ffn_hidden_size=2048,
    score_function=RouterScore.SIGMOID,
    expert_bias=True,
    layer_pattern=MoeLayerList(layers=(False,) * 3 + (True,) * 58),
)

DEEPSEEK_V3_LIKE = TransformerModelSpec(
    name="deepseek-v3",
    num_layers=61,
    hidden_size=7168,
    num_attention_heads=128,
    num_query_groups=128,
    kv_channels=128,
    ffn_hidden_size=18432,
    seq_length=4096,
    vocab_size=129280,
    padded_vocab_size=129280,
    activation=MlpActivation.SWIGLU,
    normalization=Normalization.RMSNORM,
    position_embedding=PositionEmbedding.ROPE,
    embeddings=EmbeddingTying.UNTIED,
    add_bias_linear=False,
    datatype=Datatype.BF16,
    self_attention=MultiLatentAttention(
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_head_dim=128,
        qk_pos_emb_head_dim=64,
        v_head_dim=128,
    ),
    feed_forward=DEEPSEEK_V3_MOE,
    qk_layernorm=True,
    mtp_num_layers=1,
)

GPT_OSS_LIKE = TransformerModelSpec(
    name="gpt-oss-120b",
    num_layers=36,
    hidden_size=2880,
    num_attention_heads=64,
    num_query_groups=8,
    kv_channels=64,
    ffn_hidden_size=2880,
    seq_length=4096,
    vocab_size=201088,
    padded_vocab_size=201088,
    activation=MlpActivation.SWIGLU,
    normalization=Normalization.RMSNORM,
    position_embedding=PositionEmbedding.ROPE,
    embeddings=EmbeddingTying.UNTIED,
    add_bias_linear=True,
    datatype=Datatype.BF16,
    feed_forward=MixtureOfExperts(num_experts=128, top_k=4, expert_ffn_hidden_size=2880),
)
