"""The model description: what a transformer is, independent of how it is parallelized.

Parameter counting follows Narayanan et al. 2021, Section 5.1 (Eq. 2) generalized to grouped-query
attention (Ainslie et al. 2023), gated MLPs (Shazeer 2020, SwiGLU) and RMSNorm (Zhang & Sennrich
2019), the way Megatron-LM builds those layers (``megatron/core/transformer``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import assert_never, final

from blueprinting.errors import ConfigError, positive_int_problems


class Datatype(StrEnum):
    """Training/compute datatype of weights and activations."""

    FP32 = "float32"
    FP16 = "float16"
    BF16 = "bfloat16"
    FP8 = "float8"

    @property
    def bytes(self) -> int:
        match self:
            case Datatype.FP32:
                return 4
            case Datatype.FP16 | Datatype.BF16:
                return 2
            case Datatype.FP8:
                return 1
            case _ as unreachable:
                assert_never(unreachable)


class Normalization(StrEnum):
    LAYERNORM = "LayerNorm"
    RMSNORM = "RMSNorm"


class MlpActivation(StrEnum):
    """GELU: up projection h->f; SwiGLU: gate and up projections h->f each (Shazeer 2020)."""

    GELU = "gelu"
    SWIGLU = "swiglu"


class PositionEmbedding(StrEnum):
    """Learned absolute positions add s*h parameters; rotary (RoPE) adds none; ``none`` (Megatron's
    ``--position-embedding-type none``) adds none either, and stands for position schemes without
    parameters such as ALiBi (Press et al. 2022), which BLOOM uses."""

    LEARNED_ABSOLUTE = "learned_absolute"
    ROPE = "rope"
    NONE = "none"


class EmbeddingTying(StrEnum):
    """Whether the LM head reuses the input embedding matrix (Megatron default: tied)."""

    TIED = "tied"
    UNTIED = "untied"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TransformerModelSpec:
    """A decoder-only transformer.

    ``num_query_groups`` equals ``num_attention_heads`` for multi-head attention and is smaller for
    grouped-query attention. ``kv_channels`` is the per-head dimension (Megatron default h / heads).
    ``padded_vocab_size`` is the embedding table's row count as Megatron pads it; when a user gives
    only ``vocab_size`` the laws check the padded value against TP, they never pad it silently.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    ffn_hidden_size: int
    seq_length: int
    vocab_size: int
    padded_vocab_size: int
    activation: MlpActivation = MlpActivation.GELU
    normalization: Normalization = Normalization.LAYERNORM
    position_embedding: PositionEmbedding = PositionEmbedding.LEARNED_ABSOLUTE
    embeddings: EmbeddingTying = EmbeddingTying.TIED
    add_bias_linear: bool = True
    datatype: Datatype = Datatype.BF16
    published_parameters: int | None = None

    def __post_init__(self) -> None:
        problems = positive_int_problems(
            None,
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            num_query_groups=self.num_query_groups,
            kv_channels=self.kv_channels,
            ffn_hidden_size=self.ffn_hidden_size,
            seq_length=self.seq_length,
            vocab_size=self.vocab_size,
            padded_vocab_size=self.padded_vocab_size,
        )
        if problems:
            raise ConfigError(problems, source=f"model {self.name!r}")

    # Derived projections -------------------------------------------------------------------
    @property
    def is_gqa(self) -> bool:
        return self.num_query_groups != self.num_attention_heads

    @property
    def query_projection_size(self) -> int:
        """Width of Q: heads * kv_channels (equals h in the default Megatron layout)."""
        return self.num_attention_heads * self.kv_channels

    @property
    def kv_projection_size(self) -> int:
        """Width of K (and of V): query_groups * kv_channels."""
        return self.num_query_groups * self.kv_channels

    @property
    def mlp_up_width(self) -> int:
        """Output width of the first MLP GEMM (SwiGLU fuses gate and up: 2f)."""
        match self.activation:
            case MlpActivation.GELU:
                return self.ffn_hidden_size
            case MlpActivation.SWIGLU:
                return 2 * self.ffn_hidden_size
            case _ as unreachable:
                assert_never(unreachable)

    @property
    def norm_parameters(self) -> int:
        """Parameters of one norm: LayerNorm has gain and bias, RMSNorm only gain."""
        match self.normalization:
            case Normalization.LAYERNORM:
                return 2 * self.hidden_size
            case Normalization.RMSNORM:
                return self.hidden_size
            case _ as unreachable:
                assert_never(unreachable)

    @property
    def block_parameters(self) -> int:
        """Parameters of one transformer block (attention + MLP + two norms)."""
        h = self.hidden_size
        qkv_out = self.query_projection_size + 2 * self.kv_projection_size
        attn = h * qkv_out + self.query_projection_size * h
        mlp = h * self.mlp_up_width + self.ffn_hidden_size * h
        biases = 0
        if self.add_bias_linear:
            biases = qkv_out + h + self.mlp_up_width + h
        return attn + mlp + biases + 2 * self.norm_parameters

    @property
    def embedding_parameters(self) -> int:
        """Word embedding (padded vocab) plus learned positions when used."""
        words = self.padded_vocab_size * self.hidden_size
        match self.position_embedding:
            case PositionEmbedding.LEARNED_ABSOLUTE:
                return words + self.seq_length * self.hidden_size
            case PositionEmbedding.ROPE | PositionEmbedding.NONE:
                return words
            case _ as unreachable:
                assert_never(unreachable)

    @property
    def output_layer_parameters(self) -> int:
        """LM-head weights that are not shared with the embedding."""
        match self.embeddings:
            case EmbeddingTying.TIED:
                return 0
            case EmbeddingTying.UNTIED:
                return self.padded_vocab_size * self.hidden_size
            case _ as unreachable:
                assert_never(unreachable)

    @property
    def num_parameters(self) -> int:
        """Total parameters: blocks, embeddings, untied LM head and the final norm."""
        return (
            self.num_layers * self.block_parameters
            + self.embedding_parameters
            + self.output_layer_parameters
            + self.norm_parameters
        )
