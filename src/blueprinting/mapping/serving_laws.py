"""The laws of expert parallelism in serving, called by :func:`blueprinting.mapping.laws.
check_inference` and reported with the others.

The serving layout (:class:`blueprinting.mapping.transformer.ServingExpertParallel`) splits each
MoE layer's routed experts over ``ep`` ranks of the stage's TP group and each expert's FFN over
the other ``t / ep``. Its rules, the serving engines' own start-up checks:

* ``t mod ep = 0``: the EP ranks are TP ranks (TensorRT-LLM asserts ``moe_tp_size *
  moe_ep_size == tp_size``; vLLM's EP size is TP x DP, with DP = 1 here);
* ``num_experts mod ep = 0``: every EP rank holds the same number of experts (Megatron-LM's
  ``E % e == 0``, ``shared/reference/modern_parallelism.md`` section 2.2; vLLM places
  ``E / ep`` experts per rank without redundant experts);
* ``moe_ffn_hidden_size mod (t / ep) = 0``: each expert's FFN columns split evenly over its
  expert tensor ranks (the implicit rule of section 2.2's table);
* ``ep = 1`` for a dense model (no experts to split).
"""

from __future__ import annotations

from blueprinting.errors import LawViolation
from blueprinting.mapping.model import TransformerModelSpec
from blueprinting.mapping.transformer import TransformerInferenceMappingSpec


def _violation(law: str, formula: str, message: str, **values: int) -> LawViolation:
    return LawViolation(law=law, formula=formula, values=tuple(values.items()), message=message)


def serving_expert_laws(
    model: TransformerModelSpec, mapping: TransformerInferenceMappingSpec
) -> list[LawViolation]:
    """Every violated expert-parallel law of a serving strategy (module docstring)."""
    ep = mapping.expert_degree
    t = mapping.tensor_degree
    moe = model.moe
    if moe is None:
        if ep == 1:
            return []
        return [
            _violation(
                "expert_parallel_needs_experts",
                "expert_model_parallel_size = 1 for a dense model",
                f"expert_model_parallel_size = {ep} but {model.name} has no routed experts",
                expert_model_parallel_size=ep,
            )
        ]
    out: list[LawViolation] = []
    if t % ep != 0:
        out.append(
            _violation(
                "serving_experts_in_tensor_group",
                "t mod expert_model_parallel_size = 0",
                f"t = {t} is not a multiple of expert_model_parallel_size = {ep}: serving "
                "splits the experts over ranks of the TP group",
                t=t,
                expert_model_parallel_size=ep,
            )
        )
    if moe.num_experts % ep != 0:
        out.append(
            _violation(
                "experts_per_expert_rank",
                "num_experts mod expert_model_parallel_size = 0",
                f"num_experts = {moe.num_experts} is not a multiple of "
                f"expert_model_parallel_size = {ep}",
                num_experts=moe.num_experts,
                expert_model_parallel_size=ep,
            )
        )
    if t % ep == 0 and moe.expert_ffn_hidden_size % (t // ep) != 0:
        out.append(
            _violation(
                "expert_ffn_per_expert_tensor_rank",
                "moe_ffn_hidden_size mod (t / expert_model_parallel_size) = 0",
                f"moe_ffn_hidden_size = {moe.expert_ffn_hidden_size} is not a multiple of "
                f"t / expert_model_parallel_size = {t // ep}",
                moe_ffn_hidden_size=moe.expert_ffn_hidden_size,
                expert_tensor_degree=t // ep,
            )
        )
    return out
