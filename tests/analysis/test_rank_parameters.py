"""Per-rank parameter counts (analysis/rank_parameters.py): at t = etp = ep = 1 they are the
model's own counts for every preset; the splits are exact where the widths divide."""

from __future__ import annotations

import pytest

from blueprinting.analysis.rank_parameters import (
    block_linear_weights_per_rank,
    block_parameters_per_rank,
    moe_block_linear_weights_per_rank,
    moe_block_parameters_per_rank,
)
from blueprinting.mapping.presets import MODEL_PRESETS, model_preset
from blueprinting.mapping.transformer import ExpertParallel


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_one_rank_holds_the_models_own_layer_counts(name: str) -> None:
    model = model_preset(name)
    assert block_parameters_per_rank(model, 1) == model.block_parameters
    dense, routed = moe_block_parameters_per_rank(model, 1, ExpertParallel())
    if model.moe is None:
        assert (dense, routed) == (0, 0)
    else:
        assert dense + routed == model.moe_block_parameters
        assert routed == model.routed_expert_parameters


def test_expert_grid_splits_the_routed_experts_and_only_them() -> None:
    """DeepSeek-V3 at t 2 with etp 2 x ep 8: E / ep = 32 experts of F / etp = 1024 each; the
    dense part (attention, shared expert, router, norms) does not depend on the expert grid."""
    model = model_preset("deepseek-v3")
    h = 7168
    grid = ExpertParallel(degree=8, tensor_degree=2)
    dense, routed = moe_block_parameters_per_rank(model, 2, grid)
    assert routed == 32 * 3 * h * 1024
    assert dense == moe_block_parameters_per_rank(model, 2, ExpertParallel())[0]
    # the TE linears are the GEMM weights: no norms, router or biases
    linear_dense, linear_routed = moe_block_linear_weights_per_rank(model, 2, grid)
    assert linear_routed == routed  # no expert biases in DeepSeek-V3
    assert dense - linear_dense == (
        1536
        + 512  # the q and kv latent norms (RMSNorm)
        + h * 256
        + 256  # the router and its expert bias
        + 2 * h  # the two layer norms
    )


def test_mla_linear_weights_are_the_projections() -> None:
    """Section 2.10 of the shared reference: Q 48.8M, KV 20.9M, O 117.4M per layer at t = 1,
    of which the latent norms (1536 + 512) are not linear weights."""
    model = model_preset("deepseek-v3")
    dense_mlp = 3 * 7168 * 18432
    assert block_linear_weights_per_rank(model, 1) == 187_107_328 - 2048 + dense_mlp
