"""MoE and MLA models for the algebra tests: the ``deepseek-v3`` and ``mixtral-8x7b`` presets
trimmed to a few layers at s = 4096 (the per-layer work is what the tests check)."""

from __future__ import annotations

from dataclasses import replace

from blueprinting.mapping.model import MixtureOfExperts, MoeLayerList, TransformerModelSpec
from blueprinting.mapping.presets import model_preset


def deepseek_like(layers: int = 4, dense: int = 1, seq: int = 4096) -> TransformerModelSpec:
    base = model_preset("deepseek-v3")
    moe = base.moe
    assert moe is not None
    pattern = MoeLayerList(layers=(False,) * dense + (True,) * (layers - dense))
    return replace(
        base,
        name="deepseek-like",
        num_layers=layers,
        seq_length=seq,
        mtp_num_layers=0,
        feed_forward=replace(moe, layer_pattern=pattern),
        published_parameters=None,
        published_active_parameters=None,
    )


def mixtral_like(layers: int = 4, seq: int = 4096) -> TransformerModelSpec:
    base = model_preset("mixtral-8x7b")
    assert isinstance(base.feed_forward, MixtureOfExperts)
    return replace(
        base,
        name="mixtral-like",
        num_layers=layers,
        seq_length=seq,
        published_parameters=None,
        published_active_parameters=None,
    )
