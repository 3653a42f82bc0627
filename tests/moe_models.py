"""MoE models for the strategy tests: the ``deepseek-v3`` and ``gpt-oss-120b`` presets
(architectures and sources in ``blueprinting.mapping.presets``), without their published
counts, which a model read back through its architecture keys does not carry."""

from __future__ import annotations

from dataclasses import replace

from blueprinting.mapping.model import MixtureOfExperts, TransformerModelSpec
from blueprinting.mapping.presets import model_preset


def _unpublished(name: str) -> TransformerModelSpec:
    return replace(model_preset(name), published_parameters=None, published_active_parameters=None)


DEEPSEEK_V3_LIKE = _unpublished("deepseek-v3")
GPT_OSS_LIKE = _unpublished("gpt-oss-120b")

_moe = DEEPSEEK_V3_LIKE.feed_forward
assert isinstance(_moe, MixtureOfExperts)
DEEPSEEK_V3_MOE: MixtureOfExperts = _moe
