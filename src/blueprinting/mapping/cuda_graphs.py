"""CUDA graphs in the training strategy: Megatron-LM's ``--cuda-graph-impl`` and
``--cuda-graph-scope`` (and the deprecated ``--enable-cuda-graph`` / ``--external-cuda-graph``).

Megatron-LM ``megatron/training/arguments.py`` @307dcf37 (``_add_inference_args``,
``validate_args`` "CUDA Graphs"):

- ``none``: every kernel is issued from the host, op by op (eager PyTorch);
- ``local``: Megatron-Core's own capture (``megatron/core/transformer/cuda_graphs.py``); with
  no scope, each transformer layer's forward and backward is one graph; with
  ``full_iteration``, the whole forward-backward step is (``training.py`` wraps
  ``forward_backward_func``). ``--enable-cuda-graph`` is the deprecated spelling;
- ``transformer_engine``: Transformer Engine's ``make_graphed_callables`` over the scopes
  named (``attn``, ``mlp``, ``moe``, ``moe_router``, ``moe_preprocess``, ``mamba``); with no
  scope Megatron fills a default from the model: ``attn mlp`` for a dense model, ``attn moe``
  when every layer is MoE, ``attn mlp moe`` otherwise (:func:`captured_scopes`).
  ``--external-cuda-graph`` is the deprecated spelling.

The scope is kept as given (a frozenset of :class:`CudaGraphScope`), never repaired: the laws
(:mod:`blueprinting.mapping.cuda_graph_laws`) refuse what Megatron refuses at start-up. What a
scope removes from the host's issue time is ``synthesizer/stages/portable_plan/host_dispatch.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeAlias, assert_never, final

from blueprinting.mapping.model import TransformerModelSpec


class CudaGraphImpl(StrEnum):
    """``--cuda-graph-impl``."""

    NONE = "none"
    LOCAL = "local"
    TRANSFORMER_ENGINE = "transformer_engine"


class CudaGraphScope(StrEnum):
    """One entry of ``--cuda-graph-scope`` (Megatron's ``CudaGraphScope``)."""

    FULL_ITERATION = "full_iteration"
    ATTN = "attn"
    MLP = "mlp"
    MOE = "moe"
    MOE_ROUTER = "moe_router"
    MOE_PREPROCESS = "moe_preprocess"
    MAMBA = "mamba"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class NoCudaGraphs:
    """``--cuda-graph-impl none`` (Megatron's default): eager launches."""

    def __str__(self) -> str:
        return "none"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LocalCudaGraphs:
    """``--cuda-graph-impl local``; ``scope`` empty (per-layer graphs) or ``full_iteration``
    (a law refuses anything else)."""

    scope: frozenset[CudaGraphScope] = field(default_factory=frozenset)

    def __str__(self) -> str:
        return "local" + _scope_suffix(self.scope)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TransformerEngineCudaGraphs:
    """``--cuda-graph-impl transformer_engine`` over ``scope`` (empty: Megatron's default for
    the model, :func:`captured_scopes`)."""

    scope: frozenset[CudaGraphScope] = field(default_factory=frozenset)

    def __str__(self) -> str:
        return "transformer_engine" + _scope_suffix(self.scope)


CudaGraphs: TypeAlias = NoCudaGraphs | LocalCudaGraphs | TransformerEngineCudaGraphs


def _scope_suffix(scope: frozenset[CudaGraphScope]) -> str:
    return "" if not scope else "(" + " ".join(scope_names(scope)) + ")"


def scope_names(scope: frozenset[CudaGraphScope]) -> list[str]:
    """The scope in Megatron's enum order (stable for keys, flags and messages)."""
    order = list(CudaGraphScope)
    return [s.value for s in sorted(scope, key=order.index)]


def cuda_graph_impl(graphs: CudaGraphs) -> CudaGraphImpl:
    match graphs:
        case NoCudaGraphs():
            return CudaGraphImpl.NONE
        case LocalCudaGraphs():
            return CudaGraphImpl.LOCAL
        case TransformerEngineCudaGraphs():
            return CudaGraphImpl.TRANSFORMER_ENGINE
        case _ as unreachable:
            assert_never(unreachable)


def given_scope(graphs: CudaGraphs) -> frozenset[CudaGraphScope]:
    """The scope as the user gave it (empty for ``none``)."""
    match graphs:
        case NoCudaGraphs():
            return frozenset()
        case LocalCudaGraphs(scope=scope) | TransformerEngineCudaGraphs(scope=scope):
            return scope
        case _ as unreachable:
            assert_never(unreachable)


def captured_scopes(graphs: CudaGraphs, model: TransformerModelSpec) -> frozenset[CudaGraphScope]:
    """The scopes whose ops replay from a graph. ``local`` without a scope captures whole
    layers: reported as ``attn`` + ``mlp`` / ``moe`` (what a layer holds); ``full_iteration``
    as itself. ``transformer_engine`` without a scope: Megatron's default for the model
    (``arguments.py`` @307dcf37 ``validate_args``)."""
    moe = model.moe is not None
    every_layer_moe = moe and model.num_dense_layers == 0
    layer = frozenset(
        {CudaGraphScope.ATTN}
        | ({CudaGraphScope.MOE} if moe else set())
        | (set() if every_layer_moe else {CudaGraphScope.MLP})
    )
    match graphs:
        case NoCudaGraphs():
            return frozenset()
        case LocalCudaGraphs(scope=scope):
            return scope if scope else layer
        case TransformerEngineCudaGraphs(scope=scope):
            return scope if scope else layer
        case _ as unreachable:
            assert_never(unreachable)
