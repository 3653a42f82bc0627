"""MoE and MLA models built in Python for the algebra tests (DeepSeek-V3 and Mixtral 8x7B
shapes: ``shared/reference/modern_parallelism.md`` section 4; DeepSeek-V3 trimmed to few
layers, the per-layer work is what the tests check)."""

from __future__ import annotations

from blueprinting.mapping.model import (
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


def deepseek_like(layers: int = 4, dense: int = 1, seq: int = 4096) -> TransformerModelSpec:
    return TransformerModelSpec(
        name="deepseek-like",
        num_layers=layers,
        hidden_size=7168,
        num_attention_heads=128,
        num_query_groups=128,
        kv_channels=128,
        ffn_hidden_size=18432,
        seq_length=seq,
        vocab_size=129280,
        padded_vocab_size=129280,
        activation=MlpActivation.SWIGLU,
        normalization=Normalization.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        embeddings=EmbeddingTying.UNTIED,
        add_bias_linear=False,
        self_attention=MultiLatentAttention(
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_head_dim=128,
            qk_pos_emb_head_dim=64,
            v_head_dim=128,
        ),
        feed_forward=MixtureOfExperts(
            num_experts=256,
            top_k=8,
            expert_ffn_hidden_size=2048,
            shared_expert_ffn_hidden_size=2048,
            score_function=RouterScore.SIGMOID,
            expert_bias=True,
            layer_pattern=MoeLayerList(layers=(False,) * dense + (True,) * (layers - dense)),
        ),
    )


def mixtral_like(layers: int = 4, seq: int = 4096) -> TransformerModelSpec:
    return TransformerModelSpec(
        name="mixtral-like",
        num_layers=layers,
        hidden_size=4096,
        num_attention_heads=32,
        num_query_groups=8,
        kv_channels=128,
        ffn_hidden_size=14336,
        seq_length=seq,
        vocab_size=32000,
        padded_vocab_size=32000,
        activation=MlpActivation.SWIGLU,
        normalization=Normalization.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        embeddings=EmbeddingTying.UNTIED,
        add_bias_linear=False,
        feed_forward=MixtureOfExperts(num_experts=8, top_k=2, expert_ffn_hidden_size=14336),
    )
