"""The CUDA graph laws: Megatron-LM's start-up rules for ``--cuda-graph-impl`` /
``--cuda-graph-scope`` (``megatron/training/arguments.py`` @307dcf37, ``validate_args``,
"CUDA Graphs"), reported with every other law by :func:`blueprinting.mapping.laws.check_training`.

- ``cuda_graph_full_recompute``: any CUDA graphs refuse ``recompute_granularity = full``;
- ``cuda_graph_local_scope``: ``local`` takes no scope or ``full_iteration`` only;
- ``cuda_graph_te_full_iteration``: ``transformer_engine`` refuses ``full_iteration``;
- the ``transformer_engine`` scope rules: not both ``moe`` and ``moe_router``;
  ``moe_preprocess`` needs ``moe_router``; ``moe`` / ``moe_router`` need routed experts;
  ``mlp`` needs a dense MLP layer; ``moe`` needs the alltoall dispatcher with drop-and-pad
  (``moe_expert_capacity_factor`` and ``moe_pad_expert_input_to_capacity``: static shapes, no
  flex or allgather); ``moe_preprocess`` under alltoall without drop-and-pad refuses a
  capacity factor (its device-to-host copies in the preprocess step).
- ``cuda_graph_scope_needs_its_layer`` (planner): ``mamba`` needs Mamba layers, which no
  Blueprinting model has.

The ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments`` and TE RNG tracker rules are about the
environment, not the strategy, and are not modelled.
"""

from __future__ import annotations

from blueprinting.errors import LawViolation
from blueprinting.mapping.cuda_graphs import (
    CudaGraphScope,
    LocalCudaGraphs,
    NoCudaGraphs,
    TransformerEngineCudaGraphs,
    given_scope,
    scope_names,
)
from blueprinting.mapping.law_names import Law, law_violation
from blueprinting.mapping.model import CapacityFactor, TransformerModelSpec
from blueprinting.mapping.transformer import (
    AllToAllDispatcher,
    FullRecompute,
    TransformerTrainingMappingSpec,
    dispatcher_type,
)


def cuda_graph_laws(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec
) -> list[LawViolation]:
    """Every violated CUDA graph law (module docstring), planner and Megatron ones; the caller
    keeps the rule sets it applies."""
    graphs = mapping.cuda_graphs
    if isinstance(graphs, NoCudaGraphs):
        return []
    out: list[LawViolation] = []
    scope = given_scope(graphs)
    shown = " ".join(scope_names(scope)) or "(empty)"
    if CudaGraphScope.MAMBA in scope:
        out.append(
            law_violation(
                Law.CUDA_GRAPH_SCOPE_NEEDS_LAYER,
                "cuda_graph_scope names mamba, but the model has no Mamba layers",
                cuda_graph_scope=shown,
            )
        )
    if isinstance(mapping.parallelism.recompute, FullRecompute):
        out.append(
            law_violation(
                Law.MEGATRON_CUDA_GRAPH_FULL_RECOMPUTE,
                f"cuda_graph_impl = {graphs} refuses recompute_granularity = full: "
                "'recompute_granularity must not be full when CUDA Graphs are enabled' "
                "(Megatron-LM arguments.py)",
                recompute_granularity="full",
            )
        )
    if isinstance(graphs, LocalCudaGraphs):
        if scope and scope != {CudaGraphScope.FULL_ITERATION}:
            out.append(
                law_violation(
                    Law.MEGATRON_CUDA_GRAPH_LOCAL_SCOPE,
                    f"cuda_graph_impl = local takes only cuda_graph_scope = full_iteration (or "
                    f"none), got {shown}; the other scopes need cuda_graph_impl = "
                    "transformer_engine (Megatron-LM arguments.py)",
                    cuda_graph_scope=shown,
                )
            )
        return out
    assert isinstance(graphs, TransformerEngineCudaGraphs)
    out.extend(_te_scope_laws(model, mapping, scope, shown))
    return out


def _te_scope_laws(
    model: TransformerModelSpec,
    mapping: TransformerTrainingMappingSpec,
    scope: frozenset[CudaGraphScope],
    shown: str,
) -> list[LawViolation]:
    out: list[LawViolation] = []

    def refuse(law: Law, message: str, **values: str | int | bool | None) -> None:
        out.append(law_violation(law, message, cuda_graph_scope=shown, **values))

    if CudaGraphScope.FULL_ITERATION in scope:
        refuse(
            Law.MEGATRON_CUDA_GRAPH_TE_FULL_ITERATION,
            "cuda_graph_impl = transformer_engine refuses cuda_graph_scope full_iteration "
            "(a whole-iteration graph is cuda_graph_impl = local)",
        )
    if {CudaGraphScope.MOE, CudaGraphScope.MOE_ROUTER} <= scope:
        refuse(
            Law.MEGATRON_CUDA_GRAPH_MOE_AND_ROUTER,
            "cuda_graph_scope must not contain both moe and moe_router",
        )
    if CudaGraphScope.MOE_PREPROCESS in scope and CudaGraphScope.MOE_ROUTER not in scope:
        refuse(
            Law.MEGATRON_CUDA_GRAPH_PREPROCESS_NEEDS_ROUTER,
            "cuda_graph_scope moe_preprocess is only supported with moe_router",
        )
    moe = model.moe
    if moe is None:
        if scope & {CudaGraphScope.MOE, CudaGraphScope.MOE_ROUTER}:
            refuse(
                Law.MEGATRON_CUDA_GRAPH_MOE_SCOPE_NEEDS_MOE,
                "cuda_graph_scope moe / moe_router needs routed experts; the model is dense",
            )
        return out
    if CudaGraphScope.MLP in scope and model.num_dense_layers == 0:
        refuse(
            Law.MEGATRON_CUDA_GRAPH_MLP_NEEDS_DENSE_LAYER,
            "cuda_graph_scope mlp captures dense MLP layers, and every layer of the model is MoE",
        )
    dispatcher = mapping.parallelism.experts.dispatcher
    dropping = moe.dropping
    drop_and_pad = isinstance(dropping, CapacityFactor) and dropping.pad_to_capacity
    if not isinstance(dispatcher, AllToAllDispatcher):
        if CudaGraphScope.MOE in scope:
            refuse(
                Law.MEGATRON_CUDA_GRAPH_MOE_STATIC_SHAPES,
                f"cuda_graph_scope moe is not supported with the {dispatcher_type(dispatcher)} "
                "token dispatcher (flex and allgather have dynamic shapes)",
                moe_token_dispatcher_type=dispatcher_type(dispatcher).value,
            )
        return out
    if drop_and_pad:
        return out
    if CudaGraphScope.MOE in scope:
        refuse(
            Law.MEGATRON_CUDA_GRAPH_MOE_STATIC_SHAPES,
            "cuda_graph_scope moe needs drop-and-pad MoE (moe_expert_capacity_factor with "
            "moe_pad_expert_input_to_capacity): dropless shapes change every step",
            moe_pad_expert_input_to_capacity=False,
        )
    if isinstance(dropping, CapacityFactor) and CudaGraphScope.MOE_PREPROCESS in scope:
        refuse(
            Law.MEGATRON_CUDA_GRAPH_PREPROCESS_SYNC,
            "cuda_graph_scope moe_preprocess is not supported with a capacity factor without "
            "padding: the preprocess step copies the token counts to the host",
            moe_expert_capacity_factor=str(dropping.factor),
        )
    return out
