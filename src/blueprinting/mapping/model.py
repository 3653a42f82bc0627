"""The model description: what a transformer is, independent of how it is parallelized.

Parameter counting follows Narayanan et al. 2021, Section 5.1 (Eq. 2) generalized to grouped-query
attention (Ainslie et al. 2023), gated MLPs (Shazeer 2020, SwiGLU) and RMSNorm (Zhang & Sennrich
2019), the way Megatron-LM builds those layers (``megatron/core/transformer``). Mixture-of-experts
layers, multi-head latent attention and multi-token prediction follow Megatron-LM's own count
(``megatron/training/theoretical_memory_usage.py`` l.12-200 @d98e8a64; shared reference
``modern_parallelism.md`` sections 2.6, 2.10, 2.11): routed experts ``E * (h*up + F*h)``, shared
experts the same at their total width, a replicated ``h x E`` router (plus ``E`` expert biases when
aux-loss-free balancing is on), MLA's down/up projections with their norms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeAlias, assert_never, final

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


#: Megatron-LM's ``--attention-dropout`` and ``--hidden-dropout`` default (arguments.py)
DEFAULT_DROPOUT = 0.1


class Normalization(StrEnum):
    LAYERNORM = "LayerNorm"
    RMSNORM = "RMSNorm"


class MlpActivation(StrEnum):
    """GELU: up projection h->f; SwiGLU: gate and up projections h->f each (Shazeer 2020);
    squared ReLU: up projection h->f, ``relu(x) ** 2`` (So et al. 2021, "Primer", Section 3;
    Megatron-LM ``--squared-relu``, the Nemotron models' activation)."""

    GELU = "gelu"
    SWIGLU = "swiglu"
    SQUARED_RELU = "squared_relu"


class PositionEmbedding(StrEnum):
    """Learned absolute positions add s*h parameters; rotary (RoPE) adds none; ``yarn`` is RoPE
    with YaRN's frequency scaling (Peng et al. 2023; Megatron's ``--position-embedding-type
    yarn``, ``YarnRotaryEmbedding``; GPT-OSS: Megatron-Bridge r0.6.0 @6124fbe38
    ``src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py`` l.65), no parameters either, but
    Megatron runs its fused RoPE kernel only for ``rope`` (``training.eager_passes``); ``none``
    (Megatron's ``--position-embedding-type none``) adds none either, and stands for position
    schemes without parameters such as ALiBi (Press et al. 2022), which BLOOM uses."""

    LEARNED_ABSOLUTE = "learned_absolute"
    ROPE = "rope"
    YARN = "yarn"
    NONE = "none"


class EmbeddingTying(StrEnum):
    """Whether the LM head reuses the input embedding matrix (Megatron default: tied)."""

    TIED = "tied"
    UNTIED = "untied"


class ActiveCount(StrEnum):
    """Which embedding matrices an owner's published active-parameter count includes (shared
    reference section 4): Mixtral, Qwen3 and DeepSeek count the input embedding and the LM head;
    OpenAI's gpt-oss model card counts the unembedding only."""

    EMBEDDING_AND_HEAD = "embedding-and-head"
    HEAD_ONLY = "head-only"


class RouterScore(StrEnum):
    """Megatron's ``--moe-router-score-function``."""

    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"
    SQRTSOFTPLUS = "sqrtsoftplus"


class SoftmaxType(StrEnum):
    """Megatron's ``--softmax-type`` (``transformer_config.py`` ``softmax_type`` @d98e8a64):
    ``learnable`` adds one learned sink logit per attention head and layer (GPT-OSS's attention
    sinks, OpenAI gpt-oss model card arXiv:2508.10925); ``off-by-one`` a fixed one, no
    parameters."""

    VANILLA = "vanilla"
    OFF_BY_ONE = "off-by-one"
    LEARNABLE = "learnable"


# --------------------------------------------------------------------------------------------
# Attention window: which keys a query sees
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FullAttention:
    """Every layer attends to every earlier position (causal)."""

    def __str__(self) -> str:
        return "full"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SlidingWindow:
    """Local attention: a query sees itself and the ``size`` positions before it (Megatron/TE
    ``window_size = (size, 0)``). With ``full_every`` N, layer i (0-based) keeps full attention
    iff ``(i + 1) % N == 0`` (Megatron's ``window_attn_skip_freq``); None: every layer is
    windowed. GPT-OSS: window 128 on even layers, full on odd ones (Megatron-Bridge
    ``gpt_oss_provider.py`` window_size (128, 0), window_attn_skip_freq 2; HF ``layer_types``
    alternating from ``sliding_attention``).

    Parameters are unchanged. FLOPs: Megatron-LM's counter ignores the window (full causal);
    the ``megatron-bridge`` convention counts the window's exact causal context
    (``analysis/flops.py``)."""

    size: int
    full_every: int | None = None

    def __post_init__(self) -> None:
        problems = positive_int_problems(
            None,
            window_size=self.size,
            **({} if self.full_every is None else {"window_attn_skip_freq": self.full_every}),
        )
        if problems:
            raise ConfigError(problems, source="sliding-window attention")

    def is_windowed(self, layer: int) -> bool:
        return self.full_every is None or (layer + 1) % self.full_every != 0

    @property
    def keys(self) -> int:
        """The most keys one query attends: itself and the ``size`` positions before it."""
        return self.size + 1

    def windowed_layers_in(self, count: int) -> int:
        """Windowed layers among ``0 .. count - 1``, in closed form (issue 18: counts reach
        2**63 - 1)."""
        return count if self.full_every is None else count - count // self.full_every

    def windowed_layers_between(self, start: int, count: int) -> int:
        """Windowed layers among ``start .. start + count - 1`` (a pipeline stage's layers)."""
        return self.windowed_layers_in(start + count) - self.windowed_layers_in(start)

    def __str__(self) -> str:
        full = "" if self.full_every is None else f"/full-every-{self.full_every}"
        return f"swa{self.size}{full}"


AttentionWindow: TypeAlias = FullAttention | SlidingWindow


class LoadBalancing(StrEnum):
    """``--moe-router-load-balancing-type`` (Megatron-LM ``transformer_config.py``): which
    balancing the router trains with. The GPU work does not depend on it (the auxiliary losses
    are a few element-wise passes over the scores); the host issue time does (the aux-loss
    variants launch their kernels: ``host_dispatch.ROUTER_AUX_LOSS_OPS``), and so do Megatron's
    start-up rules."""

    AUX_LOSS = "aux_loss"
    SEQ_AUX_LOSS = "seq_aux_loss"
    GLOBAL_AUX_LOSS = "global_aux_loss"
    SINKHORN = "sinkhorn"
    QUANTILE_BALANCING = "quantile_balancing"
    NONE = "none"


# --------------------------------------------------------------------------------------------
# Attention: which projections a layer's self-attention has
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StandardAttention:
    """Multi-head or grouped-query attention: Q of ``heads * kv_channels``, K and V of
    ``query_groups * kv_channels`` each, an output projection back to h."""

    def __str__(self) -> str:
        return "gqa"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MultiLatentAttention:
    """DeepSeek-V2's multi-head latent attention (arXiv:2405.04434, Section 2.1; Megatron-LM
    ``MLATransformerConfig``): Q optionally through a ``q_lora_rank`` bottleneck, K/V jointly
    compressed to ``kv_lora_rank`` plus one shared rope key of ``qk_pos_emb_head_dim``, then
    expanded per head to ``qk_head_dim`` (no-rope part of K) and ``v_head_dim``. ``q_lora_rank``
    None: Q is one ``h -> heads * (qk_head_dim + qk_pos_emb_head_dim)`` projection."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_head_dim: int
    qk_pos_emb_head_dim: int
    v_head_dim: int

    def __post_init__(self) -> None:
        problems = positive_int_problems(
            None,
            kv_lora_rank=self.kv_lora_rank,
            qk_head_dim=self.qk_head_dim,
            qk_pos_emb_head_dim=self.qk_pos_emb_head_dim,
            v_head_dim=self.v_head_dim,
            **({} if self.q_lora_rank is None else {"q_lora_rank": self.q_lora_rank}),
        )
        if problems:
            raise ConfigError(problems, source="multi-latent attention")

    @property
    def qk_dim(self) -> int:
        """Per-head width of Q and K: the no-rope part plus the rope part."""
        return self.qk_head_dim + self.qk_pos_emb_head_dim

    def __str__(self) -> str:
        q = "none" if self.q_lora_rank is None else str(self.q_lora_rank)
        return f"mla(q={q},kv={self.kv_lora_rank})"


SelfAttention: TypeAlias = StandardAttention | MultiLatentAttention


# --------------------------------------------------------------------------------------------
# Feed-forward: dense MLP in every layer, or mixture of experts on a layer pattern
# --------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Dropless:
    """Every routed token is computed (Megatron's default: ``moe_expert_capacity_factor`` None)."""

    def __str__(self) -> str:
        return "dropless"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityFactor:
    """Each expert takes at most ``ceil(local_tokens * k / E * factor)`` tokens, the rest dropped;
    ``pad_to_capacity`` pads every expert to exactly that (``moe_pad_expert_input_to_capacity``)."""

    factor: float
    pad_to_capacity: bool = False

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise ConfigError([f"moe_expert_capacity_factor = {self.factor} must be > 0"])

    def __str__(self) -> str:
        return f"cf{self.factor:g}" + ("+pad" if self.pad_to_capacity else "")


TokenDropping: TypeAlias = Dropless | CapacityFactor


def _residues_in(start: int, count: int, n: int, f: int) -> int:
    """How many i in ``start .. start + count - 1`` have i = 0 (mod n) and i = f - 1 (mod f):
    none unless gcd(n, f) = 1, else one residue x0 modulo n f (x0 = n ((f - 1) n^-1 mod f))."""
    if count <= 0 or math.gcd(n, f) != 1:
        return 0
    x0 = n * ((f - 1) * pow(n, -1, f) % f) if f > 1 else 0
    period = n * f
    return (start + count - 1 - x0) // period - (start - 1 - x0) // period


def _full_moe_layers_in(
    pattern: MoeLayerPattern, window: SlidingWindow, start: int, count: int, full_every: int
) -> int:
    """MoE layers among ``start .. start + count - 1`` that the window skips (full attention)."""
    match pattern:
        case MoeLayerList():
            return sum(
                1
                for i in range(start, start + count)
                if pattern.is_moe(i) and not window.is_windowed(i)
            )
        case MoeLayerFrequency(every=n):
            return _residues_in(start, count, n, full_every)
        case _ as unreachable:
            assert_never(unreachable)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MoeLayerFrequency:
    """Megatron's ``--moe-layer-freq N``: layer i (0-based) is MoE iff ``i % N == 0``."""

    every: int = 1

    def __post_init__(self) -> None:
        problems = positive_int_problems(None, moe_layer_freq=self.every)
        if problems:
            raise ConfigError(problems)

    def is_moe(self, layer: int) -> bool:
        return layer % self.every == 0

    def moe_layers_in(self, start: int, count: int) -> int:
        """MoE layers among ``start .. start + count - 1``: the multiples of N there, in closed
        form (a layer count may be as large as 2**63 - 1; issue 18)."""
        n = self.every
        return (start + count + n - 1) // n - (start + n - 1) // n

    def __str__(self) -> str:
        return str(self.every)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MoeLayerList:
    """Megatron's ``--moe-layer-freq "([0]*3+[1]*58)"``: one flag per decoder layer, 1 = MoE."""

    layers: tuple[bool, ...]

    def is_moe(self, layer: int) -> bool:
        return self.layers[layer]

    def moe_layers_in(self, start: int, count: int) -> int:
        """MoE layers among ``start .. start + count - 1`` (the list holds one flag a layer)."""
        return sum(self.layers[start : start + count])

    def __str__(self) -> str:
        return "[" + ",".join("1" if m else "0" for m in self.layers) + "]"


MoeLayerPattern: TypeAlias = MoeLayerFrequency | MoeLayerList


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class DenseFeedForward:
    """Every layer's feed-forward is the dense MLP of ``ffn_hidden_size``."""

    def __str__(self) -> str:
        return "dense"


def load_imbalance_problem(value: float, num_experts: int) -> str | None:
    """The bound on ``moe_load_imbalance`` (gamma = max / mean - 1 over the EP ranks): the
    hottest of ep <= E ranks receives at most every routed token, so 0 <= gamma <= E - 1 (fuzz
    seed 1272 case 18358: inf reached an integer token count as an OverflowError)."""
    limit = max(0, num_experts - 1)
    if 0 <= value <= limit:
        return None
    return (
        f"moe_load_imbalance = {value:g} must be >= 0 and at most num_experts - 1 = {limit} "
        "(the hottest EP rank receives at most every routed token)"
    )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MixtureOfExperts:
    """Routed experts on the layers ``layer_pattern`` marks (the others keep the dense MLP of
    ``ffn_hidden_size``): ``num_experts`` experts of ``expert_ffn_hidden_size``, each token sent
    to ``top_k``; shared experts of *total* width ``shared_expert_ffn_hidden_size`` (0: none;
    Megatron's ``moe_shared_expert_intermediate_size``); ``expert_bias`` the aux-loss-free
    balancing bias (``moe_router_enable_expert_bias``, E fp32 values per layer).

    ``load_imbalance`` is gamma = max/mean - 1 of the tokens an EP rank receives (shared
    reference section 2.9); 0 is what Megatron-Bridge's benchmarks force
    (``--moe-router-force-load-balancing``). It inflates the hottest rank's expert GEMMs and
    its dispatch and combine receive bytes."""

    num_experts: int
    top_k: int
    expert_ffn_hidden_size: int
    shared_expert_ffn_hidden_size: int = 0
    score_function: RouterScore = RouterScore.SOFTMAX
    expert_bias: bool = False
    #: ``--moe-router-pre-softmax``: the softmax over all E scores before the top-k (DeepSeek-V2
    #: style; Megatron requires it for top-1 with softmax scores). The router's work is the
    #: same either way: only the order of the normalization and the selection differs.
    pre_softmax: bool = False
    load_balancing: LoadBalancing = LoadBalancing.AUX_LOSS
    dropping: TokenDropping = field(default_factory=Dropless)
    layer_pattern: MoeLayerPattern = field(default_factory=MoeLayerFrequency)
    load_imbalance: float = 0.0

    def __post_init__(self) -> None:
        problems = positive_int_problems(
            None,
            num_experts=self.num_experts,
            moe_router_topk=self.top_k,
            moe_ffn_hidden_size=self.expert_ffn_hidden_size,
        )
        if self.shared_expert_ffn_hidden_size < 0:
            problems.append(
                "moe_shared_expert_intermediate_size = "
                f"{self.shared_expert_ffn_hidden_size} must be > 0 when given"
            )
        if self.top_k > self.num_experts > 0:
            problems.append(
                f"moe_router_topk = {self.top_k} exceeds num_experts = {self.num_experts}"
            )
        imbalance = load_imbalance_problem(self.load_imbalance, self.num_experts)
        if imbalance is not None:
            problems.append(imbalance)
        if problems:
            raise ConfigError(problems, source="mixture of experts")

    def __str__(self) -> str:
        shared = (
            f"+shared{self.shared_expert_ffn_hidden_size}"
            if self.shared_expert_ffn_hidden_size
            else ""
        )
        return f"moe(E={self.num_experts},k={self.top_k},F={self.expert_ffn_hidden_size}{shared})"


FeedForward: TypeAlias = DenseFeedForward | MixtureOfExperts


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
    #: the publisher's active-parameter count (MoE models), as published
    published_active_parameters: int | None = None
    self_attention: SelfAttention = field(default_factory=StandardAttention)
    feed_forward: FeedForward = field(default_factory=DenseFeedForward)
    #: RMSNorm/LayerNorm on each head's Q and K (``--qk-layernorm``; Qwen3, DeepSeek's MLA)
    qk_layernorm: bool = False
    #: multi-token-prediction depths (``--mtp-num-layers``; DeepSeek-V3: 1)
    mtp_num_layers: int = 0
    #: ``learnable`` adds GPT-OSS's per-head attention sinks
    softmax_type: SoftmaxType = SoftmaxType.VANILLA
    #: full causal attention, or GPT-OSS's alternating sliding window
    attention_window: AttentionWindow = field(default_factory=FullAttention)
    #: the norms learn ``1 + gamma`` (Megatron-LM ``--apply-layernorm-1p``, Transformer Engine's
    #: ``zero_centered_gamma``; the Nemotron models): the same parameters and cost
    layernorm_zero_centered_gamma: bool = False
    #: dropout probabilities (Megatron-LM ``--attention-dropout`` on the attention scores,
    #: ``--hidden-dropout`` on the embedding and the two bias-dropout-adds; both default 0.1).
    #: At 0 PyTorch's dropout returns its input (ATen ``dropout``: ``p == 0`` skips the kernel):
    #: no mask is stored and no dropout work runs
    attention_dropout: float = DEFAULT_DROPOUT
    hidden_dropout: float = DEFAULT_DROPOUT
    #: Megatron's ``activation_func_clamp_value`` (TransformerConfig, Megatron-LM @2edffadb
    #: ``transformer_config.py`` l.199): a GLU's gate clamped to ``<= v`` and its linear half to
    #: ``[-v, v]`` before the activation (GPT-OSS: 7.0, Megatron-Bridge r0.6.0 @6124fbe38
    #: ``gpt_oss_bridge.py`` l.83); None: no clamp. The same parameters; what it costs depends
    #: on the kernel that runs it (``training.eager_passes``)
    activation_func_clamp_value: float | None = None

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
        if self.mtp_num_layers < 0:
            problems.append(f"mtp_num_layers = {self.mtp_num_layers} must be >= 0")
        for name, p in (
            ("attention_dropout", self.attention_dropout),
            ("hidden_dropout", self.hidden_dropout),
        ):
            if not 0 <= p < 1:
                problems.append(f"{name} = {p!r} must be a probability in [0, 1)")
        clamp = self.activation_func_clamp_value
        if clamp is not None and not (0 < clamp < math.inf):
            problems.append(f"activation_func_clamp_value = {clamp!r} must be a finite number > 0")
        if problems:
            raise ConfigError(problems, source=f"model {self.name!r}")

    @property
    def has_attention_dropout(self) -> bool:
        """Whether the attention scores pass a dropout that stores a mask."""
        return self.attention_dropout > 0

    @property
    def has_hidden_dropout(self) -> bool:
        """Whether the embedding and the residual adds pass a dropout that stores a mask."""
        return self.hidden_dropout > 0

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
            case MlpActivation.GELU | MlpActivation.SQUARED_RELU:
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

    def norm_of(self, width: int) -> int:
        """Parameters of one norm over ``width`` features."""
        match self.normalization:
            case Normalization.LAYERNORM:
                return 2 * width
            case Normalization.RMSNORM:
                return width
            case _ as unreachable:
                assert_never(unreachable)

    # Layer kinds ---------------------------------------------------------------------------
    @property
    def moe(self) -> MixtureOfExperts | None:
        """The mixture of experts, or None for a dense model."""
        match self.feed_forward:
            case DenseFeedForward():
                return None
            case MixtureOfExperts() as moe:
                return moe
            case _ as unreachable:
                assert_never(unreachable)

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` (0-based) has routed experts."""
        moe = self.moe
        return moe is not None and moe.layer_pattern.is_moe(layer)

    @property
    def mtp_layer_is_moe(self) -> bool:
        """Whether a multi-token-prediction depth's decoder layer has routed experts: it has the
        last decoder layer's kind (Megatron-LM builds it from that layer's spec,
        ``multi_token_prediction.py`` @00611e6e)."""
        return self.is_moe_layer(self.num_layers - 1)

    def moe_layers_in(self, start: int, count: int) -> int:
        """MoE decoder layers among ``start .. start + count - 1`` (0-based)."""
        moe = self.moe
        return 0 if moe is None else moe.layer_pattern.moe_layers_in(start, count)

    @property
    def num_moe_layers(self) -> int:
        return self.moe_layers_in(0, self.num_layers)

    def windowed_moe_layers_in(self, start: int, count: int) -> int:
        """Decoder layers among ``start .. start + count - 1`` that are both MoE layers and
        sliding-window layers, in closed form for the periodic patterns (counts reach 2**63 - 1,
        issue 18): the MoE layers less those a window skips. Under ``moe_layer_freq`` N and
        ``window_attn_skip_freq`` F a skipped MoE layer has i = 0 (mod N) and i = -1 (mod F),
        one residue modulo N F when gcd(N, F) = 1 (Chinese remainder theorem), none otherwise."""
        moe, window = self.moe, self.attention_window
        if moe is None:
            return 0
        routed = moe.layer_pattern.moe_layers_in(start, count)
        match window:
            case FullAttention():
                return 0
            case SlidingWindow(full_every=None):
                return routed
            case SlidingWindow(full_every=f):
                assert f is not None
                return routed - _full_moe_layers_in(moe.layer_pattern, window, start, count, f)
            case _ as unreachable:
                assert_never(unreachable)

    def windowed_layers_in(self, start: int, count: int) -> int:
        """Sliding-window decoder layers among ``start .. start + count - 1`` (0-based)."""
        window = self.attention_window
        match window:
            case FullAttention():
                return 0
            case SlidingWindow():
                return window.windowed_layers_between(start, count)
            case _ as unreachable:
                assert_never(unreachable)

    @property
    def window_keys(self) -> int | None:
        """The most keys a query of a windowed layer attends (None: no layer is windowed)."""
        window = self.attention_window
        match window:
            case FullAttention():
                return None
            case SlidingWindow():
                return window.keys
            case _ as unreachable:
                assert_never(unreachable)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    # Parameters per part -------------------------------------------------------------------
    @property
    def attention_projection_parameters(self) -> tuple[int, int, int]:
        """(Q, K+V, O) weights of one layer's self-attention, without biases.

        GQA: ``h*n*d``, ``2*h*g*d``, ``n*d*h``. MLA (Megatron-LM ``theoretical_memory_usage.py``
        l.62-82 @d98e8a64; shared reference section 2.10): Q ``h*n*(d_n+d_r)`` or through LoRA
        ``q_lora*(h + n*(d_n+d_r)) + norm(q_lora)``; KV ``kv_lora*(h + n*(d_n+d_v)) +
        norm(kv_lora) + h*d_r``; O ``n*d_v*h`` (DeepSeek-V3: 48.8M, 20.9M, 117.4M)."""
        h = self.hidden_size
        n = self.num_attention_heads
        match self.self_attention:
            case StandardAttention():
                q_size = self.query_projection_size
                return h * q_size, 2 * h * self.kv_projection_size, q_size * h
            case MultiLatentAttention() as mla:
                if mla.q_lora_rank is None:
                    q = h * n * mla.qk_dim
                else:
                    q = mla.q_lora_rank * (h + n * mla.qk_dim) + self.norm_of(mla.q_lora_rank)
                kv = (
                    mla.kv_lora_rank * (h + n * (mla.qk_head_dim + mla.v_head_dim))
                    + self.norm_of(mla.kv_lora_rank)
                    + h * mla.qk_pos_emb_head_dim
                )
                return q, kv, n * mla.v_head_dim * h
            case _ as unreachable:
                assert_never(unreachable)

    @property
    def attention_parameters(self) -> int:
        """Self-attention of one layer: projections, their biases, QK norms, attention sinks
        (not the input norm). Biases with ``add_bias_linear``: GQA's on Q, K, V and O, MLA's on
        O only."""
        q, kv, o = self.attention_projection_parameters
        params = q + kv + o + self.attention_sink_parameters
        match self.self_attention:
            case StandardAttention():
                if self.add_bias_linear:
                    params += self.query_projection_size + 2 * self.kv_projection_size
                    params += self.hidden_size
                if self.qk_layernorm:
                    params += 2 * self.norm_of(self.kv_channels)
                return params
            case MultiLatentAttention():
                return params + (self.hidden_size if self.add_bias_linear else 0)
            case _ as unreachable:
                assert_never(unreachable)

    @property
    def attention_sink_parameters(self) -> int:
        """One learned sink logit per head with ``softmax_type = learnable`` (GPT-OSS)."""
        match self.softmax_type:
            case SoftmaxType.LEARNABLE:
                return self.num_attention_heads
            case SoftmaxType.VANILLA | SoftmaxType.OFF_BY_ONE:
                return 0
            case _ as unreachable:
                assert_never(unreachable)

    def _mlp_parameters(self, ffn: int) -> int:
        """One MLP of width ``ffn``: up (2*ffn wide with SwiGLU), down, their biases."""
        h = self.hidden_size
        up = 2 * ffn if self.activation is MlpActivation.SWIGLU else ffn
        return h * up + ffn * h + ((up + h) if self.add_bias_linear else 0)

    def expert_shard_parameters(self, expert_tensor_degree: int) -> tuple[int, int]:
        """(up, down) parameters of one routed expert on one of its ``expert_tensor_degree``
        ranks: the up projection's columns and its bias split, the down projection's rows
        split and its bias whole on every rank (added after the reduction). (0, 0) for a dense
        model; their sum at etp = 1 is :attr:`expert_parameters`."""
        moe = self.moe
        if moe is None:
            return 0, 0
        h, bias = self.hidden_size, self.add_bias_linear
        ffn = moe.expert_ffn_hidden_size // expert_tensor_degree
        up = 2 * ffn if self.activation is MlpActivation.SWIGLU else ffn
        return h * up + (up if bias else 0), ffn * h + (h if bias else 0)

    @property
    def dense_mlp_parameters(self) -> int:
        """The dense MLP (``ffn_hidden_size``) of a layer without routed experts."""
        return self._mlp_parameters(self.ffn_hidden_size)

    @property
    def expert_parameters(self) -> int:
        """One routed expert (0 for a dense model)."""
        moe = self.moe
        return 0 if moe is None else self._mlp_parameters(moe.expert_ffn_hidden_size)

    @property
    def routed_expert_parameters(self) -> int:
        """All routed experts of one MoE layer."""
        moe = self.moe
        return 0 if moe is None else moe.num_experts * self.expert_parameters

    @property
    def shared_expert_parameters(self) -> int:
        """The shared experts of one MoE layer, at their total width (TP-sharded like a dense
        MLP, Megatron ``moe/shared_experts.py``)."""
        moe = self.moe
        if moe is None or moe.shared_expert_ffn_hidden_size == 0:
            return 0
        return self._mlp_parameters(moe.shared_expert_ffn_hidden_size)

    @property
    def router_parameters(self) -> int:
        """The replicated ``h x E`` gate of one MoE layer, its bias with linear biases, the
        aux-loss-free expert bias."""
        moe = self.moe
        if moe is None:
            return 0
        e = moe.num_experts
        return (
            self.hidden_size * e
            + (e if self.add_bias_linear else 0)
            + (e if moe.expert_bias else 0)
        )

    @property
    def block_parameters(self) -> int:
        """Parameters of one dense transformer block (attention + MLP + two norms); the layer
        kind of every layer of a dense model."""
        return self.attention_parameters + self.dense_mlp_parameters + 2 * self.norm_parameters

    @property
    def moe_block_parameters(self) -> int:
        """Parameters of one MoE block: attention, router, every routed and shared expert, norms."""
        return (
            self.attention_parameters
            + self.router_parameters
            + self.routed_expert_parameters
            + self.shared_expert_parameters
            + 2 * self.norm_parameters
        )

    def layer_parameters(self, layer: int) -> int:
        return self.moe_block_parameters if self.is_moe_layer(layer) else self.block_parameters

    def layer_active_parameters(self, layer: int) -> int:
        """Parameters one token passes through in ``layer``: top-k routed experts, not all E."""
        moe = self.moe
        if moe is None or not self.is_moe_layer(layer):
            return self.block_parameters
        return self.moe_block_parameters - (moe.num_experts - moe.top_k) * self.expert_parameters

    @property
    def mtp_layer_parameters(self) -> int:
        """One multi-token-prediction depth without the shared embedding and LM head
        (Megatron ``MultiTokenPredictionLayer``): ``eh_proj`` (2h -> h), the embedding, hidden
        and final norms, and one decoder layer of the last layer's kind."""
        h = self.hidden_size
        return 2 * h * h + 3 * self.norm_parameters + self.layer_parameters(self.num_layers - 1)

    @property
    def mtp_parameters(self) -> int:
        return self.mtp_num_layers * self.mtp_layer_parameters

    @property
    def embedding_parameters(self) -> int:
        """Word embedding (padded vocab) plus learned positions when used."""
        words = self.padded_vocab_size * self.hidden_size
        match self.position_embedding:
            case PositionEmbedding.LEARNED_ABSOLUTE:
                return words + self.seq_length * self.hidden_size
            case PositionEmbedding.ROPE | PositionEmbedding.YARN | PositionEmbedding.NONE:
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
        """Total parameters: blocks, embeddings, untied LM head and the final norm (MTP depths
        excluded, as DeepSeek-V3's 671B excludes them; see ``mtp_parameters``)."""
        moe_layers = self.moe_layers_in(0, self.num_layers)
        # per kind of layer, not per layer: a layer count may be as large as 2**63 - 1 (issue 18)
        return (
            (self.num_layers - moe_layers) * self.block_parameters
            + (moe_layers * self.moe_block_parameters if moe_layers else 0)
            + self.embedding_parameters
            + self.output_layer_parameters
            + self.norm_parameters
        )

    @property
    def active_parameters(self) -> int:
        """Parameters one token uses: ``num_parameters`` with top-k routed experts per MoE layer
        instead of all E (embedding and LM head both counted; owners' conventions differ, see
        shared reference section 4)."""
        return (
            self.layers_active_parameters
            + self.embedding_parameters
            + self.output_layer_parameters
            + self.norm_parameters
        )

    @property
    def layers_active_parameters(self) -> int:
        """The sum of :meth:`layer_active_parameters` over the decoder layers, per kind of layer
        (a layer count may be as large as 2**63 - 1: no loop over layers, issue 18)."""
        moe = self.moe
        moe_layers = self.moe_layers_in(0, self.num_layers)
        dense = (self.num_layers - moe_layers) * self.block_parameters
        if moe is None or moe_layers == 0:
            return dense
        routed_off = (moe.num_experts - moe.top_k) * self.expert_parameters
        return dense + moe_layers * (self.moe_block_parameters - routed_off)

    def active_parameters_as(self, convention: ActiveCount) -> int:
        """``active_parameters`` under an owner's convention: ``head-only`` leaves out the input
        embedding (the word table when untied, learned positions either way)."""
        match convention:
            case ActiveCount.EMBEDDING_AND_HEAD:
                return self.active_parameters
            case ActiveCount.HEAD_ONLY:
                words = self.padded_vocab_size * self.hidden_size
                shared_with_head = words if self.embeddings is EmbeddingTying.TIED else 0
                return self.active_parameters - (self.embedding_parameters - shared_with_head)
            case _ as unreachable:
                assert_never(unreachable)
