"""The activation offloading laws: Megatron-Core's start-up rules for layer-wise CPU offloading
(``megatron/core/transformer/transformer_config.py`` ``__post_init__`` @d98e8a64, the same
checks at ``core_v0.14.0``), reported with every other law by
:func:`blueprinting.mapping.laws.check_training`.

- ``cpu_offloading_num_layers``: fewer offloaded layers than the model has, l.1884-1889 ("CPU
  offloading can be done only for layers less than {num_layers}"); Transformer Engine refuses
  the same bound (``cpu_offload.py``: ``num_layers > model_layers - 1``);
- ``cpu_offloading_pipeline``: no pipeline parallelism, l.1891 ("Currently there is no support
  for Pipeline parallelism with CPU offloading");
- ``cpu_offloading_recompute``: no activation recomputation, l.1896 ("CPU offloading does not
  work when activation recomputation is enabled");
- ``cpu_offloading_cuda_graphs``: no CUDA graphs but a whole-iteration one, l.2800-2801 ("CUDA
  graphs not supported with CPU offloading"; any graph at ``core_v0.14.0``).

Megatron's rules against fine-grained activation offloading and the MoE paged stash beside it
(l.2127-2130, 2211-2212) name features the planner does not model.
"""

from __future__ import annotations

from typing import assert_never

from blueprinting.errors import LawViolation
from blueprinting.mapping.cuda_graphs import (
    CudaGraphScope,
    LocalCudaGraphs,
    NoCudaGraphs,
    TransformerEngineCudaGraphs,
)
from blueprinting.mapping.law_names import Law, law_violation
from blueprinting.mapping.model import TransformerModelSpec
from blueprinting.mapping.transformer import (
    LayerCpuOffload,
    NoActivationOffload,
    NoRecompute,
    TransformerTrainingMappingSpec,
)


def offload_laws(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec
) -> list[LawViolation]:
    """Every violated activation offloading law (module docstring); all are Megatron's."""
    match mapping.parallelism.offload:
        case NoActivationOffload():
            return []
        case LayerCpuOffload(num_layers=layers):
            return _layer_offload_laws(model, mapping, layers)
        case _ as unreachable:
            assert_never(unreachable)


def _layer_offload_laws(
    model: TransformerModelSpec, mapping: TransformerTrainingMappingSpec, layers: int
) -> list[LawViolation]:
    out: list[LawViolation] = []
    if layers >= model.num_layers:
        out.append(
            law_violation(
                Law.MEGATRON_CPU_OFFLOAD_LAYERS,
                f"cpu_offloading_num_layers = {layers}: CPU offloading can be done only for "
                f"layers less than num_layers = {model.num_layers}",
                cpu_offloading_num_layers=layers,
                num_layers=model.num_layers,
            )
        )
    p = mapping.pipeline_degree
    if p > 1:
        out.append(
            law_violation(
                Law.MEGATRON_CPU_OFFLOAD_PIPELINE,
                f"cpu_offloading with pipeline_model_parallel_size = {p}: 'Currently there is "
                "no support for Pipeline parallelism with CPU offloading'",
                pipeline_model_parallel_size=p,
            )
        )
    recompute = mapping.parallelism.recompute
    if not isinstance(recompute, NoRecompute):
        out.append(
            law_violation(
                Law.MEGATRON_CPU_OFFLOAD_RECOMPUTE,
                f"cpu_offloading with recompute = {recompute}: 'CPU offloading does not work "
                "when activation recomputation is enabled'",
                recompute=str(recompute),
            )
        )
    graphs = mapping.cuda_graphs
    whole_iteration = isinstance(graphs, LocalCudaGraphs) and graphs.scope == frozenset(
        {CudaGraphScope.FULL_ITERATION}
    )
    if not isinstance(graphs, NoCudaGraphs) and not whole_iteration:
        assert isinstance(graphs, LocalCudaGraphs | TransformerEngineCudaGraphs)
        out.append(
            law_violation(
                Law.MEGATRON_CPU_OFFLOAD_CUDA_GRAPHS,
                f"cpu_offloading with cuda_graph_impl = {graphs}: 'CUDA graphs not supported "
                "with CPU offloading' (only a whole-iteration graph, cuda_graph_impl = local "
                "with cuda_graph_scope = full_iteration)",
                cuda_graph_impl=str(graphs),
            )
        )
    return out
