"""Built-in model presets, each with the parameter count its source publishes.

Sources (architecture numbers and published counts):

- ``gpt-*``: Narayanan et al. 2021 (arXiv:2104.04473), Table 1; counts are the table's billions
  (computed by the paper with Eq. 2). GPT architecture per Megatron-LM defaults: LayerNorm, GELU,
  FFN = 4h, learned absolute positions, tied embeddings, biases, vocabulary 51,200 (GPT-2 BPE
  50,257 padded), s = 2048 (``shared/reference/published_runs.json``).
- ``megatron-22b``, ``gpt3-175b``, ``mt-nlg-530b``, ``megatron-1t``: Korthikanti et al. 2022
  (arXiv:2205.05198), Table 3 ("22B", "175B (GPT-3)", "530B (MT-NLG)", "1T"); GPT-3 from Brown et
  al. 2020, Table 2.1; MT-NLG from Smith et al. 2022 (arXiv:2201.11990), Section 3.
- ``bloom-176b``: BigScience, BLOOM (arXiv:2211.05100), Table 3 and the ``bigscience/bloom``
  model card (176,247,271,424 parameters); ALiBi positions (no parameters, stored as ``none``),
  vocabulary 250,680 padded to 250,880. BLOOM's extra embedding LayerNorm (2h = 28,672
  parameters) is not modelled: 1.6e-10 of the total.
- ``llama2-*``: Touvron et al. 2023 (arXiv:2307.09288), Table 1 and the ``meta-llama/Llama-2-*-hf``
  ``config.json``; counts are those of the released checkpoints (safetensors metadata).
- ``llama3-*``: Llama Team 2024, "The Llama 3 Herd of Models" (arXiv:2407.21783), Table 3 and the
  ``meta-llama/Meta-Llama-3-8B``/``-70B`` and ``Llama-3.1-405B`` ``config.json``; seq_length is the
  8,192-token pre-training context; counts are the released checkpoints'.

Mixture-of-experts presets (architecture from each owner's Hugging Face ``config.json``, the
Megatron flags of yanring/Megatron-MoE-ModelZoo ``model_configs/benchmarking/*.yaml`` @e8650517
where NVIDIA runs them; shared reference ``modern_parallelism.md`` section 4). ``seq_length`` is
the pre-training context before any long-context extension. Published total / active counts,
each at the precision its owner prints it (``PUBLISHED_ROUNDING``), and which embedding
matrices the active count includes (``PUBLISHED_ACTIVE_COUNT``; DeepSeek's and Moonshot's fit
one of embedding / LM head, not both):

- ``deepseek-v3``: DeepSeek-V3 Technical Report (arXiv:2412.19437), Section 1 / 4.2: 671B total,
  37B activated per token, MTP excluded (the 685B of the HF checkpoint adds the 14B MTP module);
  ``deepseek-ai/DeepSeek-V3`` ``config.json`` (= ``inference/configs/config_671B.json``).
- ``deepseek-v2-lite``: DeepSeek-V2 (arXiv:2405.04434), Appendix B and the
  ``deepseek-ai/DeepSeek-V2-Lite`` model card: 15.7B total, 2.4B activated; its ``config.json``.
- ``kimi-k2``: Kimi K2 technical report (arXiv:2507.20534) and the ``moonshotai/Kimi-K2-Instruct``
  model card: 1T total ("1.04 trillion"), 32B activated; its ``config.json`` (model_type
  ``kimi_k2``, DeepSeek-V3's architecture with 384 experts, 64 heads, one dense layer, vocabulary
  163,840, no MTP).
- ``mixtral-8x7b``, ``mixtral-8x22b``: Mistral AI, "Mixtral of Experts" (arXiv:2401.04088) and the
  Mixtral 8x22B announcement: 46.7B / 12.9B and 141B / 39B (active counted with embedding and
  head); ``mistralai/Mixtral-8x7B-v0.1`` / ``Mixtral-8x22B-v0.1`` ``config.json`` (vocabulary
  32,000); 32K and 64K context.
- ``qwen3-30b-a3b``, ``qwen3-235b-a22b``: Qwen3 Technical Report (arXiv:2505.09388), Table 2 and
  the ``Qwen/Qwen3-30B-A3B`` / ``Qwen3-235B-A22B`` model cards: 30.5B / 3.3B and 235B / 22B;
  their ``config.json`` (QK RMSNorm, 128 experts, top-8, no shared expert); 4,096-token S1/S2
  pre-training context.
- ``gpt-oss-120b``, ``gpt-oss-20b``: OpenAI, gpt-oss-120b & gpt-oss-20b model card
  (arXiv:2508.10925), Table 1: 116.83B / 5.13B and 20.91B / 3.61B, the active count including the
  unembedding but not the embedding; ``openai/gpt-oss-*`` ``config.json`` (biases on QKV, O,
  router and experts; learned attention sinks; 128-token sliding window on alternate layers;
  initial context 4,096 before YaRN).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from types import MappingProxyType

from blueprinting.errors import ConfigError
from blueprinting.mapping.model import (
    ActiveCount,
    EmbeddingTying,
    MixtureOfExperts,
    MlpActivation,
    MoeLayerList,
    MultiLatentAttention,
    Normalization,
    PositionEmbedding,
    RouterScore,
    SlidingWindow,
    SoftmaxType,
    TransformerModelSpec,
)

_GPT_VOCAB = 50257
_GPT_PADDED_VOCAB = 51200


def _gpt(name: str, layers: int, hidden: int, heads: int, published: int) -> TransformerModelSpec:
    return TransformerModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=heads,
        kv_channels=hidden // heads,
        ffn_hidden_size=4 * hidden,
        seq_length=2048,
        vocab_size=_GPT_VOCAB,
        padded_vocab_size=_GPT_PADDED_VOCAB,
        published_parameters=published,
    )


def _llama(
    name: str,
    *,
    layers: int,
    hidden: int,
    heads: int,
    groups: int,
    ffn: int,
    seq: int,
    vocab: int,
    published: int,
) -> TransformerModelSpec:
    return TransformerModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=groups,
        kv_channels=hidden // heads,
        ffn_hidden_size=ffn,
        seq_length=seq,
        vocab_size=vocab,
        padded_vocab_size=vocab,
        activation=MlpActivation.SWIGLU,
        normalization=Normalization.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        embeddings=EmbeddingTying.UNTIED,
        add_bias_linear=False,
        published_parameters=published,
    )


_B = 1_000_000_000


def _first_dense(dense: int, layers: int) -> MoeLayerList:
    """DeepSeek's ``first_k_dense_replace``: Megatron's ``([0]*dense+[1]*(layers-dense))``."""
    return MoeLayerList(layers=(False,) * dense + (True,) * (layers - dense))


def _deepseek(
    name: str,
    *,
    layers: int,
    hidden: int,
    heads: int,
    ffn: int,
    vocab: int,
    q_lora: int | None,
    moe: MixtureOfExperts,
    mtp: int,
    published: int,
    active: int,
) -> TransformerModelSpec:
    """DeepSeek-V2/V3-style model: MLA (kv_lora 512, heads of 128 + 64 rope, v 128), SwiGLU,
    RMSNorm, untied embeddings, no linear biases (ZOO ``DeepSeek-V3.yaml`` flags)."""
    return TransformerModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=heads,
        kv_channels=128,
        ffn_hidden_size=ffn,
        seq_length=4096,
        vocab_size=vocab,
        padded_vocab_size=vocab,
        activation=MlpActivation.SWIGLU,
        normalization=Normalization.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        embeddings=EmbeddingTying.UNTIED,
        add_bias_linear=False,
        published_parameters=published,
        published_active_parameters=active,
        self_attention=MultiLatentAttention(
            q_lora_rank=q_lora,
            kv_lora_rank=512,
            qk_head_dim=128,
            qk_pos_emb_head_dim=64,
            v_head_dim=128,
        ),
        feed_forward=moe,
        qk_layernorm=True,
        mtp_num_layers=mtp,
    )


def _moe_gqa(
    name: str,
    *,
    layers: int,
    hidden: int,
    heads: int,
    groups: int,
    head_dim: int,
    ffn: int,
    seq: int,
    vocab: int,
    moe: MixtureOfExperts,
    published: int,
    active: int,
    qk_layernorm: bool = False,
) -> TransformerModelSpec:
    """Mixtral / Qwen3-MoE: GQA, SwiGLU experts, RMSNorm, rope, untied, no linear biases."""
    return TransformerModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=groups,
        kv_channels=head_dim,
        ffn_hidden_size=ffn,
        seq_length=seq,
        vocab_size=vocab,
        padded_vocab_size=vocab,
        activation=MlpActivation.SWIGLU,
        normalization=Normalization.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        embeddings=EmbeddingTying.UNTIED,
        add_bias_linear=False,
        published_parameters=published,
        published_active_parameters=active,
        feed_forward=moe,
        qk_layernorm=qk_layernorm,
    )


def _gpt_oss(
    name: str, *, layers: int, experts: int, published: int, active: int
) -> TransformerModelSpec:
    """gpt-oss: h 2880, 64 query heads of 64 in 8 groups, every layer MoE (top-4 of 2880-wide
    experts), biases everywhere, attention sinks, alternating 128-token window, YaRN positions
    and the GLU clamped at 7.0 (Megatron-Bridge r0.6.0 @6124fbe38
    ``src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py`` l.65 ``position_embedding_type =
    "yarn"``, l.83 ``activation_func_clamp_value = 7.0``; r0.2.0 @046518960
    ``gpt_oss_provider.py`` l.59 and l.84)."""
    return TransformerModelSpec(
        name=name,
        num_layers=layers,
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
        position_embedding=PositionEmbedding.YARN,
        embeddings=EmbeddingTying.UNTIED,
        add_bias_linear=True,
        published_parameters=published,
        published_active_parameters=active,
        feed_forward=MixtureOfExperts(num_experts=experts, top_k=4, expert_ffn_hidden_size=2880),
        softmax_type=SoftmaxType.LEARNABLE,
        attention_window=SlidingWindow(size=128, full_every=2),
        activation_func_clamp_value=7.0,
    )


_ALL: tuple[TransformerModelSpec, ...] = (
    # Narayanan et al. 2021, Table 1 (published in billions to one decimal).
    _gpt("gpt-1.7b", 24, 2304, 24, 1_700_000_000),
    _gpt("gpt-3.6b", 30, 3072, 32, 3_600_000_000),
    _gpt("gpt-7.5b", 36, 4096, 32, 7_500_000_000),
    _gpt("gpt-18b", 40, 6144, 48, 18_400_000_000),
    _gpt("gpt-39b", 48, 8192, 64, 39_100_000_000),
    _gpt("gpt-76b", 60, 10240, 80, 76_100_000_000),
    _gpt("gpt-145b", 80, 12288, 96, 145_600_000_000),
    _gpt("gpt-310b", 96, 16384, 128, 310_100_000_000),
    _gpt("gpt-530b", 105, 20480, 128, 529_600_000_000),
    _gpt("gpt-1008b", 128, 25600, 160, 1_008_000_000_000),
    # Korthikanti et al. 2022, Table 3.
    _gpt("megatron-22b", 48, 6144, 64, 22 * _B),
    _gpt("gpt3-175b", 96, 12288, 96, 175 * _B),
    _gpt("mt-nlg-530b", 105, 20480, 128, 530 * _B),
    _gpt("megatron-1t", 128, 25600, 160, 1000 * _B),
    TransformerModelSpec(
        name="bloom-176b",
        num_layers=70,
        hidden_size=14336,
        num_attention_heads=112,
        num_query_groups=112,
        kv_channels=128,
        ffn_hidden_size=4 * 14336,
        seq_length=2048,
        vocab_size=250680,
        padded_vocab_size=250880,
        position_embedding=PositionEmbedding.NONE,
        published_parameters=176_247_271_424,
    ),
    _llama(
        "llama2-7b",
        layers=32,
        hidden=4096,
        heads=32,
        groups=32,
        ffn=11008,
        seq=4096,
        vocab=32000,
        published=6_738_415_616,
    ),
    _llama(
        "llama2-13b",
        layers=40,
        hidden=5120,
        heads=40,
        groups=40,
        ffn=13824,
        seq=4096,
        vocab=32000,
        published=13_015_864_320,
    ),
    _llama(
        "llama2-70b",
        layers=80,
        hidden=8192,
        heads=64,
        groups=8,
        ffn=28672,
        seq=4096,
        vocab=32000,
        published=68_976_648_192,
    ),
    _llama(
        "llama3-8b",
        layers=32,
        hidden=4096,
        heads=32,
        groups=8,
        ffn=14336,
        seq=8192,
        vocab=128256,
        published=8_030_261_248,
    ),
    _llama(
        "llama3-70b",
        layers=80,
        hidden=8192,
        heads=64,
        groups=8,
        ffn=28672,
        seq=8192,
        vocab=128256,
        published=70_553_706_496,
    ),
    _llama(
        "llama3-405b",
        layers=126,
        hidden=16384,
        heads=128,
        groups=8,
        ffn=53248,
        seq=8192,
        vocab=128256,
        published=405_853_388_800,
    ),
    _deepseek(
        "deepseek-v3",
        layers=61,
        hidden=7168,
        heads=128,
        ffn=18432,
        vocab=129280,
        q_lora=1536,
        moe=MixtureOfExperts(
            num_experts=256,
            top_k=8,
            expert_ffn_hidden_size=2048,
            shared_expert_ffn_hidden_size=2048,
            score_function=RouterScore.SIGMOID,
            expert_bias=True,
            layer_pattern=_first_dense(3, 61),
        ),
        mtp=1,
        published=671 * _B,
        active=37 * _B,
    ),
    _deepseek(
        "deepseek-v2-lite",
        layers=27,
        hidden=2048,
        heads=16,
        ffn=10944,
        vocab=102400,
        q_lora=None,
        moe=MixtureOfExperts(
            num_experts=64,
            top_k=6,
            expert_ffn_hidden_size=1408,
            shared_expert_ffn_hidden_size=2 * 1408,
            layer_pattern=_first_dense(1, 27),
        ),
        mtp=0,
        published=15_700_000_000,
        active=2_400_000_000,
    ),
    _deepseek(
        "kimi-k2",
        layers=61,
        hidden=7168,
        heads=64,
        ffn=18432,
        vocab=163840,
        q_lora=1536,
        moe=MixtureOfExperts(
            num_experts=384,
            top_k=8,
            expert_ffn_hidden_size=2048,
            shared_expert_ffn_hidden_size=2048,
            score_function=RouterScore.SIGMOID,
            expert_bias=True,
            layer_pattern=_first_dense(1, 61),
        ),
        mtp=0,
        published=1000 * _B,
        active=32 * _B,
    ),
    _moe_gqa(
        "mixtral-8x7b",
        layers=32,
        hidden=4096,
        heads=32,
        groups=8,
        head_dim=128,
        ffn=14336,
        seq=32768,
        vocab=32000,
        moe=MixtureOfExperts(num_experts=8, top_k=2, expert_ffn_hidden_size=14336),
        published=46_700_000_000,
        active=12_900_000_000,
    ),
    _moe_gqa(
        "mixtral-8x22b",
        layers=56,
        hidden=6144,
        heads=48,
        groups=8,
        head_dim=128,
        ffn=16384,
        seq=65536,
        vocab=32000,
        moe=MixtureOfExperts(num_experts=8, top_k=2, expert_ffn_hidden_size=16384),
        published=141 * _B,
        active=39 * _B,
    ),
    _moe_gqa(
        "qwen3-30b-a3b",
        layers=48,
        hidden=2048,
        heads=32,
        groups=4,
        head_dim=128,
        ffn=6144,
        seq=4096,
        vocab=151936,
        moe=MixtureOfExperts(num_experts=128, top_k=8, expert_ffn_hidden_size=768),
        published=30_500_000_000,
        active=3_300_000_000,
        qk_layernorm=True,
    ),
    _moe_gqa(
        "qwen3-235b-a22b",
        layers=94,
        hidden=4096,
        heads=64,
        groups=4,
        head_dim=128,
        ffn=12288,
        seq=4096,
        vocab=151936,
        moe=MixtureOfExperts(num_experts=128, top_k=8, expert_ffn_hidden_size=1536),
        published=235 * _B,
        active=22 * _B,
        qk_layernorm=True,
    ),
    _gpt_oss("gpt-oss-20b", layers=24, experts=32, published=20_910_000_000, active=3_610_000_000),
    _gpt_oss(
        "gpt-oss-120b", layers=36, experts=128, published=116_830_000_000, active=5_130_000_000
    ),
)

MODEL_PRESETS: Mapping[str, TransformerModelSpec] = MappingProxyType({m.name: m for m in _ALL})
"""Every built-in model by name, in the order ``blueprinting presets`` lists them."""


# Half a unit of each source's last published digit: a count printed as "1.7B" only says the
# true value lies in [1.65B, 1.75B). Narayanan et al. 2021 print Table 1 to 0.1B (the 1.7B model
# computes to 1.652B with their own Eq. 2), Korthikanti et al. 2022 to 1B; checkpoint counts are
# exact.
PUBLISHED_ROUNDING: Mapping[str, int] = MappingProxyType(
    {
        **{m.name: 50_000_000 for m in _ALL if m.name.startswith("gpt-")},
        **{name: 500_000_000 for name in ("megatron-22b", "gpt3-175b", "mt-nlg-530b")},
        "megatron-1t": 500_000_000,
        # MoE owners print billions: to 1B, to 0.1B, or (gpt-oss) to 0.01B.
        **{name: 500_000_000 for name in ("deepseek-v3", "mixtral-8x22b", "qwen3-235b-a22b")},
        "kimi-k2": 500_000_000_000,
        **{name: 50_000_000 for name in ("deepseek-v2-lite", "mixtral-8x7b", "qwen3-30b-a3b")},
        **{name: 5_000_000 for name in ("gpt-oss-20b", "gpt-oss-120b")},
    }
)

# The active counts' rounding: as the totals, except Kimi K2's "32B" (to 1B).
PUBLISHED_ACTIVE_ROUNDING: Mapping[str, int] = MappingProxyType(
    {**PUBLISHED_ROUNDING, "kimi-k2": 500_000_000}
)

#: Which embedding matrices each owner's active count includes (module docstring).
PUBLISHED_ACTIVE_COUNT: Mapping[str, ActiveCount] = MappingProxyType(
    {
        **{
            m.name: ActiveCount.EMBEDDING_AND_HEAD
            for m in _ALL
            if m.published_active_parameters is not None
        },
        # one of embedding / head: the two are the same size, the figures cannot tell which
        **{name: ActiveCount.HEAD_ONLY for name in ("deepseek-v3", "deepseek-v2-lite", "kimi-k2")},
        "gpt-oss-20b": ActiveCount.HEAD_ONLY,
        "gpt-oss-120b": ActiveCount.HEAD_ONLY,
    }
)


def did_you_mean(name: str, choices: list[str] | tuple[str, ...]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or ``""`` when none is close."""
    close = difflib.get_close_matches(name, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def model_preset(name: str) -> TransformerModelSpec:
    """The built-in model called ``name``; :class:`ConfigError` with a suggestion otherwise."""
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        hint = did_you_mean(name, tuple(MODEL_PRESETS))
        raise ConfigError([f"unknown model preset {name!r}{hint}"]) from None
