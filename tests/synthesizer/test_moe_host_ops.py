"""The kernels a MoE layer's IR tasks launch beyond the one each costs
(``portable_plan/host_dispatch.py`` ``moe_extra_host_ops`` / ``moe_layer_host_ops``): exact
counts for small configurations, derived by hand from the constants' sources."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import pytest

from blueprinting.hardware.presets import SYSTEM_PRESETS
from blueprinting.mapping.cuda_graphs import NoCudaGraphs
from blueprinting.mapping.model import LoadBalancing
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import (
    AllGatherDispatcher,
    AllToAllDispatcher,
    FlexBackend,
    FlexDispatcher,
)
from blueprinting.synthesizer.dialects.transformer.training import SemanticOpName
from blueprinting.synthesizer.dialects.transformer.training_derivation import (
    derive_training_block,
)
from blueprinting.synthesizer.stages.distributed.ir import ComputeTask, Phase, Task, TaskGroup
from blueprinting.synthesizer.stages.portable_plan.host_dispatch import (
    DispatchKernels,
    MoeLayerHost,
    dispatch_kernels,
    host_ops,
    moe_layer_host_ops,
    pass_host_exposed_s,
    training_host_dispatch,
)
from tests.synthesizer.moe_models import deepseek_like, mixtral_like
from tests.synthesizer.test_moe_block import _mapping

_FC = (SemanticOpName.EXPERT_FC1, SemanticOpName.EXPERT_FC2)
_OPS = (
    SemanticOpName.ROUTER,
    SemanticOpName.MOE_PERMUTE,
    SemanticOpName.MOE_SORT_CHUNKS,
    SemanticOpName.EXPERT_FC1,
    SemanticOpName.EXPERT_FC2,
    SemanticOpName.MOE_UNSORT_CHUNKS,
    SemanticOpName.MOE_UNPERMUTE,
)
_F, _A, _W = Phase.FORWARD, Phase.BACKWARD_ACTIVATION_GRAD, Phase.BACKWARD_WEIGHT_GRAD


def _bf16(task: ComputeTask) -> bool:
    return False


def _casts(task: ComputeTask) -> bool:
    """What a low-precision recipe quantizes: the grouped GEMMs' inputs and output gradients."""
    return task.lineage.op in _FC and task.phase in (_F, _A)


def _counts(group: TaskGroup, layer: MoeLayerHost, quantized: bool) -> dict[tuple[str, str], int]:
    ops = moe_layer_host_ops(group, layer, _casts if quantized else _bf16)
    out: Counter[tuple[str, str]] = Counter()
    for task in group.tasks:
        if isinstance(task, ComputeTask) and task.lineage.op in _OPS:
            out[(task.lineage.op.value, task.phase.short)] += ops(task)
    return dict(out)


def _moe_group(model: object, **mapping: object) -> TaskGroup:
    ir = derive_training_block(model, _mapping(**mapping))  # type: ignore[arg-type]
    assert ir.moe_block is not None
    return ir.moe_block


def test_deepseek_like_alltoall_ep8_bf16_counts() -> None:
    """DeepSeek-V3's MoE layer (E = 256, sigmoid scores with an expert bias, aux loss, shared
    experts) at ep 8 under the alltoall dispatcher: 32 local experts, BF16 (no casts).

    - router forward: gate GEMM 1 + fused top-k 1 + aux loss 5 + expert bias 2 = 9;
      data gradient: gate dgrad 1 + top-k 1 + aux loss 4 = 6; weight gradient: gate wgrad 1;
    - permute forward: permute 1 + row-id map 3 + counts 2 + DtoH 1 + grid counts 5 + grid
      DtoH 4 = 16; data gradient: the unpermute of the gradient 1;
    - chunk sort and unsort (32 local experts): forward the sort 1 + its map 1 = 2, data
      gradient the re-sort 1;
    - FC1 / FC2: one GEMM per local expert in every phase = 32;
    - unpermute forward: 1 + shared-expert add 1 = 2; data gradient 1."""
    group = _moe_group(deepseek_like(), ep=8, dp=8)
    layer = MoeLayerHost(
        dispatcher=DispatchKernels.ALLTOALL, load_balancing=LoadBalancing.AUX_LOSS, expert_bias=True
    )
    assert _counts(group, layer, quantized=False) == {
        ("router", "fwd"): 9,
        ("router", "agrad"): 6,
        ("router", "wgrad"): 1,
        ("moe_permute", "fwd"): 16,
        ("moe_permute", "agrad"): 1,
        ("moe_sort_chunks", "fwd"): 2,
        ("moe_sort_chunks", "agrad"): 1,
        ("moe_unsort_chunks", "fwd"): 2,
        ("moe_unsort_chunks", "agrad"): 1,
        ("expert_fc1", "fwd"): 32,
        ("expert_fc1", "agrad"): 32,
        ("expert_fc1", "wgrad"): 32,
        ("expert_fc2", "fwd"): 32,
        ("expert_fc2", "agrad"): 32,
        ("expert_fc2", "wgrad"): 32,
        ("moe_unpermute", "fwd"): 2,
        ("moe_unpermute", "agrad"): 1,
    }


def test_a_quantizing_recipe_adds_one_cast_per_split() -> None:
    """Transformer Engine's ``split_quantize`` casts each of the 32 splits: FC1 and FC2 forward
    and data gradient go from 32 to 64 host ops; the weight gradient reads the casts' columnwise
    copies (32 GEMMs, no cast)."""
    group = _moe_group(deepseek_like(), ep=8, dp=8)
    layer = MoeLayerHost(
        dispatcher=DispatchKernels.ALLTOALL, load_balancing=LoadBalancing.AUX_LOSS, expert_bias=True
    )
    counts = _counts(group, layer, quantized=True)
    for op in ("expert_fc1", "expert_fc2"):
        assert (counts[(op, "fwd")], counts[(op, "agrad")], counts[(op, "wgrad")]) == (64, 64, 32)
    assert counts[("router", "fwd")] == 9


def test_mixtral_like_without_an_expert_grid() -> None:
    """Mixtral (E = 8, softmax, aux loss, no expert bias, no shared experts) at ep 1: 8 local
    experts and no token exchange, so the alltoall preprocess has no grid counts nor their
    copies: permute forward 1 + 3 + 2 + 1 = 7; the chunk sort 1 + 1 = 2; unpermute forward 1;
    the router forward 1 + 1 + 5 = 7. Without a load-balancing loss the router is 2 and 2."""
    group = _moe_group(mixtral_like())
    layer = MoeLayerHost(
        dispatcher=DispatchKernels.ALLTOALL,
        load_balancing=LoadBalancing.AUX_LOSS,
        expert_bias=False,
    )
    counts = _counts(group, layer, quantized=False)
    assert counts[("moe_permute", "fwd")] == 7
    assert counts[("moe_sort_chunks", "fwd")] == 2
    assert counts[("moe_unpermute", "fwd")] == 1
    assert counts[("router", "fwd")] == 7
    assert counts[("expert_fc1", "fwd")] == 8
    free = replace(layer, load_balancing=LoadBalancing.NONE)
    counts = _counts(group, free, quantized=False)
    assert (counts[("router", "fwd")], counts[("router", "agrad")]) == (2, 2)


def _flex_counts(backend: FlexBackend, kernels: DispatchKernels) -> dict[tuple[str, str], int]:
    group = _moe_group(mixtral_like(), ep=8, dp=1, dispatcher=FlexDispatcher(backend=backend))
    layer = MoeLayerHost(
        dispatcher=kernels, load_balancing=LoadBalancing.AUX_LOSS, expert_bias=False
    )
    return _counts(group, layer, quantized=False)


def test_deepep_counts_its_topk_layout_notify_and_multihot_kernels() -> None:
    """DeepEP (Mixtral-like at ep 8, no shared experts): the permute forward is the permute 1 +
    TE's row-id map 3 + ``torch.topk`` 1 + ``get_dispatch_layout`` 1 + the dispatch's notify 1
    + ``fused_indices_to_multihot`` 1 = 8; its data gradient the permute 1 + topk's scatter 1 +
    the dispatch backward's (a combine) notify 1 + the multihot backward 1 = 4; the unpermute
    forward 1 + the combine's notify 1 = 2, its data gradient 1 + the combine backward's (a
    dispatch) notify 1 = 2. No chunk sort."""
    counts = _flex_counts(FlexBackend.DEEPEP, DispatchKernels.DEEPEP)
    assert (counts[("moe_permute", "fwd")], counts[("moe_permute", "agrad")]) == (8, 4)
    assert (counts[("moe_unpermute", "fwd")], counts[("moe_unpermute", "agrad")]) == (2, 2)
    assert ("moe_sort_chunks", "fwd") not in counts
    assert counts[("router", "fwd")] == 7


def test_hybridep_counts_its_metadata_kernels_instead_of_tes_row_id_map() -> None:
    """HybridEP: the permute forward is its own permute kernel 1 + the routing-map all-gather
    1 + the metadata preprocessing 1 + the tokens-per-expert pad 1 = 4 (no TE row-id map); the
    combine and the backward reuse the handle: 1 each."""
    counts = _flex_counts(FlexBackend.HYBRIDEP, DispatchKernels.HYBRIDEP)
    assert (counts[("moe_permute", "fwd")], counts[("moe_permute", "agrad")]) == (4, 1)
    assert (counts[("moe_unpermute", "fwd")], counts[("moe_unpermute", "agrad")]) == (1, 1)
    assert ("moe_sort_chunks", "fwd") not in counts


def test_ncclep_and_allgather_keep_the_row_id_map_only() -> None:
    """NCCL-EP's preprocessing is not counted from source: the permute 1 + TE's row-id map 3."""
    counts = _flex_counts(FlexBackend.NCCLEP, DispatchKernels.NCCLEP)
    assert (counts[("moe_permute", "fwd")], counts[("moe_permute", "agrad")]) == (4, 1)
    assert (counts[("moe_unpermute", "fwd")], counts[("moe_unpermute", "agrad")]) == (1, 1)


def test_dispatch_kernels_follow_the_dispatcher_and_flex_backend() -> None:
    assert dispatch_kernels(AllToAllDispatcher()) is DispatchKernels.ALLTOALL
    assert dispatch_kernels(AllGatherDispatcher()) is DispatchKernels.ALLGATHER
    expected = {
        FlexBackend.DEEPEP: DispatchKernels.DEEPEP,
        FlexBackend.HYBRIDEP: DispatchKernels.HYBRIDEP,
        FlexBackend.NCCLEP: DispatchKernels.NCCLEP,
    }
    for backend, kernels in expected.items():
        assert dispatch_kernels(FlexDispatcher(backend=backend, overlap=True)) is kernels
        host = training_host_dispatch(
            model_preset("qwen3-30b-a3b"),
            NoCudaGraphs(),
            SYSTEM_PRESETS["dgx-b200"],
            dispatcher=FlexDispatcher(backend=backend),
        )
        assert host.moe is not None and host.moe.dispatcher is kernels


def test_collectives_and_dense_blocks_keep_one_op_per_call() -> None:
    ir = derive_training_block(deepseek_like(), _mapping(ep=8, dp=8))
    assert ir.moe_block is not None
    layer = MoeLayerHost(
        dispatcher=DispatchKernels.ALLTOALL, load_balancing=LoadBalancing.AUX_LOSS, expert_bias=True
    )
    ops = moe_layer_host_ops(ir.moe_block, layer, _bf16)
    others: list[Task] = [
        t for t in ir.moe_block.tasks if not (isinstance(t, ComputeTask) and t.lineage.op in _OPS)
    ]
    assert others and all(ops(t) == host_ops(t) for t in others)
    system = SYSTEM_PRESETS["dgx-b200"]
    dense = training_host_dispatch(
        model_preset("llama3-8b"), NoCudaGraphs(), system, dispatcher=AllToAllDispatcher()
    )
    assert dense.moe is None
    moe = training_host_dispatch(
        model_preset("deepseek-v3"), NoCudaGraphs(), system, dispatcher=AllToAllDispatcher()
    )
    assert moe.moe == layer
    assert moe.dense_key == dense.dense_key


def test_the_extras_enter_the_pass_exposure_exactly() -> None:
    """A forward pass with no GPU time exposes every host op: DeepSeek-like at ep 8 adds
    (9 - 1) router + (16 - 1) permute + (2 - 1) x 2 chunk sorts + (2 - 1) unpermute = 26 ops
    to its IR tasks' count."""
    group = _moe_group(deepseek_like(), ep=8, dp=8)
    host = training_host_dispatch(
        deepseek_like(), NoCudaGraphs(), SYSTEM_PRESETS["dgx-b200"], dispatcher=AllToAllDispatcher()
    )
    assert host.moe is not None
    forward = [t for t in group.tasks if t.phase is Phase.FORWARD]

    def exposed(task_ops: Callable[[Task], int]) -> float:
        return pass_host_exposed_s(
            forward, 0.0, lambda t: 0.0, host, moe_layer=True, synced=False, task_ops=task_ops
        )

    plain = exposed(host_ops)
    assert plain == pytest.approx(sum(host_ops(t) for t in forward) * host.op_s, rel=1e-12)
    extra = exposed(moe_layer_host_ops(group, host.moe, _bf16)) - plain
    assert extra == pytest.approx(26 * host.op_s, rel=1e-9)
