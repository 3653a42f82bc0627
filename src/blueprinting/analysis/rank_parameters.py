"""Parameters and Transformer Engine linear weights of one layer on one rank: counted once, for
the memory analysis (weights, gradients, optimizer states), the precision recipes' weight
copies and parameter gathers (:mod:`.precision_memory`) and serving's resident weights.

Tensor parallelism per Shoeybi et al. 2019, Section 3 (column-parallel QKV and MLP-up,
row-parallel output projection and MLP-down; K/V groups replicated when t exceeds them). MLA per
Megatron-Core ``multi_latent_attention.py``: the down projections and the latent norms whole on
every TP rank, the up projections column-parallel, the output row-parallel. MoE per Megatron-LM
``theoretical_memory_usage.py`` l.198-306 @d98e8a64's three buckets: attention, shared experts
(on the dense TP group) and norms TP-sharded or whole, the router replicated, the routed
experts over etp x ep. At t = 1 (etp = ep = 1) every count equals the model's own
(``TransformerModelSpec.block_parameters`` / ``moe_block_parameters``).
"""

from __future__ import annotations

from typing import assert_never

from blueprinting.mapping.model import (
    MlpActivation,
    MultiLatentAttention,
    StandardAttention,
    TransformerModelSpec,
)
from blueprinting.mapping.transformer import ExpertParallel
from blueprinting.synthesizer.dialects.transformer.inference import kv_groups_per_rank


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def kv_width_per_rank(model: TransformerModelSpec, tensor_degree: int) -> int:
    """K (or V) width on one TP rank: groups are split over t, or replicated when t > groups."""
    return model.kv_channels * kv_groups_per_rank(model, tensor_degree)


def attention_weights_per_rank(model: TransformerModelSpec, tensor_degree: int) -> int:
    """The self-attention's linear weights (TE linears) on one TP rank, no biases or norms."""
    t = tensor_degree
    h = model.hidden_size
    match model.self_attention:
        case StandardAttention():
            q = _ceil_div(model.query_projection_size, t)
            return h * (q + 2 * kv_width_per_rank(model, t)) + q * h
        case MultiLatentAttention() as mla:
            heads = _ceil_div(model.num_attention_heads, t)
            q_lora = mla.q_lora_rank
            down = h * ((q_lora or 0) + mla.kv_lora_rank + mla.qk_pos_emb_head_dim)
            q_up = (h if q_lora is None else q_lora) * heads * mla.qk_dim
            kv_up = mla.kv_lora_rank * heads * (mla.qk_head_dim + mla.v_head_dim)
            return down + q_up + kv_up + heads * mla.v_head_dim * h
        case _ as unreachable:
            assert_never(unreachable)


def attention_parameters_per_rank(model: TransformerModelSpec, tensor_degree: int) -> int:
    """Self-attention parameters on one TP rank: its linear weights, their biases (GQA's on
    Q, K, V and O, MLA's on O), the QK or latent norms, the attention sinks."""
    t = tensor_degree
    h = model.hidden_size
    params = attention_weights_per_rank(model, t)
    match model.self_attention:
        case StandardAttention():
            if model.add_bias_linear:
                params += _ceil_div(model.query_projection_size, t)
                params += 2 * kv_width_per_rank(model, t) + h
            if model.qk_layernorm:
                params += 2 * model.norm_of(model.kv_channels)
            return params + _ceil_div(model.attention_sink_parameters, t)
        case MultiLatentAttention() as mla:
            norms = model.norm_of(mla.kv_lora_rank)
            if mla.q_lora_rank is not None:
                norms += model.norm_of(mla.q_lora_rank)
            return params + norms + (h if model.add_bias_linear else 0)
        case _ as unreachable:
            assert_never(unreachable)


def _mlp_widths(model: TransformerModelSpec, ffn: int, tensor_degree: int) -> tuple[int, int]:
    f = _ceil_div(ffn, tensor_degree)
    return (2 * f if model.activation is MlpActivation.SWIGLU else f), f


def mlp_weights_per_rank(model: TransformerModelSpec, ffn: int, tensor_degree: int) -> int:
    """A TP-sharded MLP of width ``ffn``: the column-parallel up and row-parallel down weights."""
    up, f = _mlp_widths(model, ffn, tensor_degree)
    return model.hidden_size * (up + f)


def mlp_parameters_per_rank(model: TransformerModelSpec, ffn: int, tensor_degree: int) -> int:
    """:func:`mlp_weights_per_rank` and the two biases."""
    up, _ = _mlp_widths(model, ffn, tensor_degree)
    bias = (up + model.hidden_size) if model.add_bias_linear else 0
    return mlp_weights_per_rank(model, ffn, tensor_degree) + bias


def block_parameters_per_rank(model: TransformerModelSpec, tensor_degree: int) -> int:
    """Parameters of one dense block on one TP rank (attention, MLP, two norms)."""
    return (
        attention_parameters_per_rank(model, tensor_degree)
        + mlp_parameters_per_rank(model, model.ffn_hidden_size, tensor_degree)
        + 2 * model.norm_parameters
    )


def block_linear_weights_per_rank(model: TransformerModelSpec, tensor_degree: int) -> int:
    """The TE linear weights of one dense block on one TP rank (QKV, proj, FC1, FC2, or MLA's
    projections): what a low-precision recipe quantizes."""
    return attention_weights_per_rank(model, tensor_degree) + mlp_weights_per_rank(
        model, model.ffn_hidden_size, tensor_degree
    )


def _shared_ffn(model: TransformerModelSpec) -> int:
    moe = model.moe
    return 0 if moe is None else moe.shared_expert_ffn_hidden_size


def expert_parameters_per_rank(model: TransformerModelSpec, experts: ExpertParallel) -> int:
    """One MoE layer's routed experts on one rank: E / ep experts, each at its etp shard
    (:meth:`TransformerModelSpec.expert_shard_parameters`). Training's expert grid and
    serving's (ep x t/ep of the TP group) both count it here."""
    moe = model.moe
    if moe is None:
        return 0
    return (
        moe.num_experts
        // experts.degree
        * sum(model.expert_shard_parameters(experts.tensor_degree))
    )


def moe_block_parameters_per_rank(
    model: TransformerModelSpec, tensor_degree: int, experts: ExpertParallel
) -> tuple[int, int]:
    """(dense part, routed-expert part) of one MoE block on one rank: attention, shared
    experts, the replicated router and the norms; the routed experts (module docstring).
    (0, 0) for a dense model."""
    if model.moe is None:
        return 0, 0
    shared = _shared_ffn(model)
    dense = (
        attention_parameters_per_rank(model, tensor_degree)
        + (mlp_parameters_per_rank(model, shared, tensor_degree) if shared else 0)
        + model.router_parameters
        + 2 * model.norm_parameters
    )
    return dense, expert_parameters_per_rank(model, experts)


def moe_block_linear_weights_per_rank(
    model: TransformerModelSpec, tensor_degree: int, experts: ExpertParallel
) -> tuple[int, int]:
    """(dense, routed-expert) TE linear weights of one MoE block on one rank: the attention's
    and the shared experts' linears; the experts' ``GroupedLinear`` weights (biases left out).
    The router's gate is not a TE linear. (0, 0) for a dense model."""
    moe = model.moe
    if moe is None:
        return 0, 0
    shared = _shared_ffn(model)
    dense = attention_weights_per_rank(model, tensor_degree) + (
        mlp_weights_per_rank(model, shared, tensor_degree) if shared else 0
    )
    f = moe.expert_ffn_hidden_size // experts.tensor_degree
    up = 2 * f if model.activation is MlpActivation.SWIGLU else f
    return dense, moe.num_experts // experts.degree * model.hidden_size * (up + f)
