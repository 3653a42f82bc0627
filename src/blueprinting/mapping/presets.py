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
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from types import MappingProxyType

from blueprinting.errors import ConfigError
from blueprinting.mapping.model import (
    EmbeddingTying,
    MlpActivation,
    Normalization,
    PositionEmbedding,
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
