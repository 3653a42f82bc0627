"""The vectorized figures against the scalar plan, every candidate of small spaces, field by
field (relative error <= 1e-9 on floats, equality on integers), contract bubble on both sides."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from blueprinting.analysis.evaluate import PlanOptions
from blueprinting.analysis.iteration import BubbleSource
from blueprinting.analysis.report import JsonValue
from blueprinting.api import plan_spec
from blueprinting.hardware.presets import system_preset
from blueprinting.mapping.laws import check_training
from blueprinting.mapping.model import MoeLayerList, SlidingWindow, TransformerModelSpec
from blueprinting.mapping.precision import Fp4Precision, Fp8Precision, Fp8Recipe, HighPrecision
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import (
    AllGatherDispatcher,
    AllToAllDispatcher,
    CpCommType,
    FlexDispatcher,
    GradReduceDtype,
)
from blueprinting.search.evaluate_vectorized import evaluate_candidates
from blueprinting.search.space import (
    PipelineLayouts,
    RecomputeVariant,
    SearchSpace,
    ShardingVariant,
    candidate_to_spec,
    enumerate_strategies,
)

REL = 1e-9


#: ``memory_bytes`` keys of the plan the search's rows leave out: the expert split and the
#: host's offloaded stores (the search plans no CPU offloading); any other key the plan gains
#: must reach the search's rows too
_PLAN_ONLY_MEMORY_KEYS = frozenset({"expert", "host_offloaded"})


def _mismatches(fast: JsonValue, exact: JsonValue, path: str) -> list[str]:
    if isinstance(fast, dict):
        assert isinstance(exact, dict)
        missing = []
        if path == ".memory_bytes":
            missing = [
                f"{path}.{key}: missing from the search's row"
                for key in sorted(set(exact) - set(fast) - _PLAN_ONLY_MEMORY_KEYS)
            ]
        return missing + [
            m for key in fast for m in _mismatches(fast[key], exact[key], f"{path}.{key}")
        ]
    if isinstance(fast, float) or isinstance(exact, float):
        assert isinstance(fast, int | float) and isinstance(exact, int | float)
        if fast == exact or abs(fast - exact) <= REL * max(abs(fast), abs(exact)):
            return []
        return [f"{path}: {fast!r} != {exact!r}"]
    return [] if fast == exact else [f"{path}: {fast!r} != {exact!r}"]


SPACES = [
    pytest.param(
        "gpt-1.7b",
        "dgx-a100-80gb",
        SearchSpace(gpu_counts=(8,), global_batch_size=8, max_microbatch_size=2),
        id="gpt-1.7b-a100",
    ),
    pytest.param(
        "llama3-8b",
        "dgx-h100",
        SearchSpace(
            gpu_counts=(16,),
            global_batch_size=8,
            max_microbatch_size=1,
            recompute=tuple(RecomputeVariant),
            recompute_num_layers=(1, 2),
            overlap_grad_reduce=(True,),
        ),
        id="llama3-8b-h100-every-recompute",
    ),
    pytest.param(
        "llama3-8b",
        "dgx-h100",
        SearchSpace(
            gpu_counts=(32,),
            global_batch_size=8,
            max_microbatch_size=1,
            recompute=(RecomputeVariant.NONE, RecomputeVariant.FULL_UNIFORM),
            overlap_grad_reduce=(True,),
            context_parallel=None,
            cp_comm_types=(CpCommType.P2P, CpCommType.ALL_GATHER, CpCommType.A2A),
        ),
        id="llama3-8b-h100-context-parallel",
    ),
    pytest.param(
        "llama3-8b",
        "dgx-b200",
        SearchSpace(
            gpu_counts=(16,),
            global_batch_size=8,
            max_microbatch_size=1,
            recompute=(RecomputeVariant.NONE, RecomputeVariant.FULL_UNIFORM),
            overlap_grad_reduce=(True,),
            precision=(
                HighPrecision(),
                Fp8Precision(recipe=Fp8Recipe.TENSORWISE),
                Fp8Precision(recipe=Fp8Recipe.MXFP8),
                Fp4Precision(),
            ),
        ),
        id="llama3-8b-b200-precision-recipes",
    ),
    pytest.param(
        "llama3-8b",
        "dgx-h100",
        SearchSpace(
            gpu_counts=(16,),
            global_batch_size=8,
            max_microbatch_size=1,
            recompute=(
                RecomputeVariant.NONE,
                RecomputeVariant.SELECTIVE,
                RecomputeVariant.FULL_BLOCK,
            ),
            overlap_grad_reduce=(True,),
            # --first-last-layers-bf16 (the API's SearchSpace only): those layers store as bf16
            precision=(Fp8Precision(recipe=Fp8Recipe.TENSORWISE, high_precision_layers=(1, 1)),),
        ),
        id="llama3-8b-h100-base-precision-layers",
    ),
    pytest.param(
        "llama3-8b",
        "dgx-h100",
        SearchSpace(
            gpu_counts=(16,),
            global_batch_size=8,
            max_microbatch_size=2,
            recompute=(RecomputeVariant.NONE, RecomputeVariant.SELECTIVE),
            overlap_grad_reduce=(True,),
            tp_comm_overlap=(False, True),
        ),
        id="llama3-8b-h100-tp-comm-overlap",
    ),
    pytest.param(
        "llama3-8b",
        "dgx-h100",
        SearchSpace(
            gpu_counts=(16,),
            global_batch_size=8,
            max_microbatch_size=2,
            recompute=(RecomputeVariant.NONE, RecomputeVariant.SELECTIVE),
            grad_reduce_dtype=GradReduceDtype.PARAMS,
        ),
        id="llama3-8b-h100-bf16-gradient-reduction",
    ),
    pytest.param(
        # a 256-token window on two of every three layers: p = 4 stages hold 6, 5, 5, 6
        dataclasses.replace(
            model_preset("llama3-8b"),
            name="llama3-8b-swa",
            attention_window=SlidingWindow(size=255, full_every=3),
        ),
        "dgx-h100",
        SearchSpace(
            gpu_counts=(32,),
            global_batch_size=8,
            max_microbatch_size=1,
            recompute=(RecomputeVariant.NONE, RecomputeVariant.SELECTIVE),
            overlap_grad_reduce=(True,),
            context_parallel=None,
            cp_comm_types=(CpCommType.P2P, CpCommType.ALL_GATHER, CpCommType.A2A),
        ),
        id="llama3-8b-sliding-window-context-parallel",
    ),
]


def _compared(
    model: TransformerModelSpec, system_name: str, space: SearchSpace
) -> tuple[list[int], list[str]]:
    """(the rows compared, every mismatch) of every candidate of ``space`` against the scalar
    plan (contract bubble)."""
    system = system_preset(system_name)
    table = enumerate_strategies(model, space).table
    figures = evaluate_candidates(table, model, system)
    options = PlanOptions(bubble_source=BubbleSource.CONTRACT)
    compared: list[int] = []
    problems: list[str] = []
    for i in range(len(table)):
        # Megatron refuses overlap_param_gather without overlap_grad_reduce; the search drops
        # those rows itself (search/rank.py), the scalar planner refuses them.
        if table.overlap_param_gather[i] and not table.overlap_grad_reduce[i]:
            continue
        spec = candidate_to_spec(table, i, model)
        exact = plan_spec(spec, system, options).to_json_dict()
        problems.extend(f"{spec.mapping}: {m}" for m in _mismatches(figures.row_json(i), exact, ""))
        compared.append(i)
    return compared, problems


@pytest.mark.parametrize(("model_name", "system_name", "space"), SPACES)
def test_every_candidate_matches_the_scalar_plan(
    model_name: str | TransformerModelSpec, system_name: str, space: SearchSpace
) -> None:
    model = model_preset(model_name) if isinstance(model_name, str) else model_name
    compared, problems = _compared(model, system_name, space)
    assert len(compared) > 500
    assert problems == []


BALANCED_SPACES = [
    pytest.param(
        # 30 blocks: p = 4 and 8, and v = 3, 4, 6, 7, 8 at p = 2, run balanced layouts
        dataclasses.replace(model_preset("llama3-8b"), name="llama3-8b-30-layers", num_layers=30),
        SearchSpace(
            gpu_counts=(16,),
            global_batch_size=8,
            max_microbatch_size=1,
            recompute=(RecomputeVariant.NONE, RecomputeVariant.FULL_UNIFORM),
            recompute_num_layers=(1, 2),
            overlap_grad_reduce=(True,),
            sharding=(ShardingVariant.OPTIM,),
            pipeline_layouts=PipelineLayouts.BALANCED,
        ),
        400,
        id="dense-30-layers",
    ),
    pytest.param(
        # 27 layers, the first dense, one MTP depth in the loss's stage
        dataclasses.replace(model_preset("deepseek-v2-lite"), mtp_num_layers=1),
        SearchSpace(
            gpu_counts=(16,),
            global_batch_size=8,
            max_microbatch_size=1,
            recompute=(
                RecomputeVariant.NONE,
                RecomputeVariant.SELECTIVE,
                RecomputeVariant.FULL_UNIFORM,
            ),
            overlap_grad_reduce=(True,),
            sharding=(ShardingVariant.OPTIM,),
            expert_parallel=(4,),
            pipeline_layouts=PipelineLayouts.BALANCED,
        ),
        150,
        id="moe-mtp",
    ),
]


@pytest.mark.parametrize(("model", "space", "least"), BALANCED_SPACES)
def test_balanced_layout_candidates_match_the_scalar_plan(
    model: TransformerModelSpec, space: SearchSpace, least: int
) -> None:
    """Rows whose blocks do not split over p v plan a balanced ``pipeline_model_parallel_layout``
    (``search/space.py`` ``layout_of``): stages of different block counts, chunks of different
    sizes, the embedding and the loss on lighter chunks. Every candidate against the scalar
    plan, as above."""
    table = enumerate_strategies(model, space).table
    compared, problems = _compared(model, "dgx-h100", space)
    uneven = [
        i for i in compared if model.num_layers % int(table.pipeline[i] * table.virtual_stages[i])
    ]
    assert len(uneven) >= least
    assert problems == []


def test_gpt3_sample_matches_the_scalar_plan() -> None:
    """A spread sample of the full GPT-3 175B / 1024-GPU space (issue #8's benchmark case)."""
    model = model_preset("gpt3-175b")
    system = system_preset("dgx-a100-80gb")
    table = enumerate_strategies(
        model, SearchSpace(gpu_counts=(1024,), global_batch_size=1536)
    ).table
    figures = evaluate_candidates(table, model, system)
    keep = ~(table.overlap_param_gather & ~table.overlap_grad_reduce)
    rows = np.flatnonzero(keep)[:: max(1, int(keep.sum()) // 150)]
    problems = []
    for i in rows:
        spec = candidate_to_spec(table, int(i), model)
        exact = plan_spec(spec, system, PlanOptions(bubble_source=BubbleSource.CONTRACT))
        problems.extend(_mismatches(figures.row_json(int(i)), exact.to_json_dict(), str(spec)))
    assert problems == []


def test_tp_comm_overlap_changes_only_the_block_tp_communication() -> None:
    """llama3-8b on 16 H100, t = 8 with sequence parallelism: the overlapped twin of a row hides
    TP communication (smaller tp_comm_exposed) and keeps every memory figure."""
    model = model_preset("llama3-8b")
    system = system_preset("dgx-h100")
    table = enumerate_strategies(
        model,
        SearchSpace(
            gpu_counts=(16,),
            global_batch_size=8,
            max_microbatch_size=1,
            sequence_parallel=(True,),
            recompute=(RecomputeVariant.NONE,),
            tp_comm_overlap=(False, True),
        ),
    ).table
    figures = evaluate_candidates(table, model, system)
    on = np.flatnonzero(table.tp_comm_overlap & (table.tensor == 8))
    assert on.shape[0] > 0
    for i in on:
        twin = np.flatnonzero(
            ~table.tp_comm_overlap
            & (table.tensor == table.tensor[i])
            & (table.pipeline == table.pipeline[i])
            & (table.virtual_stages == table.virtual_stages[i])
            & (table.overlap_p2p_comm == table.overlap_p2p_comm[i])
            & (table.microbatch_group == table.microbatch_group[i])
            & (table.sharding == table.sharding[i])
            & (table.overlap_param_gather == table.overlap_param_gather[i])
            & (table.overlap_grad_reduce == table.overlap_grad_reduce[i])
        )
        assert twin.shape == (1,)
        j = int(twin[0])
        assert figures.tp_comm_exposed[i] < figures.tp_comm_exposed[j]
        assert figures.memory_reserved_peak[i] == figures.memory_reserved_peak[j]


def _trimmed_deepseek_v3() -> TransformerModelSpec:
    """DeepSeek-V3 cut to 12 layers (3 dense first, as its first_k_dense_replace), 16 experts
    and 1024 tokens: the dense first layers, MLA, shared experts and the MTP depth on the loss
    stage, small enough to plan every row."""
    full = model_preset("deepseek-v3")
    moe = full.moe
    assert moe is not None
    trimmed = dataclasses.replace(
        moe, num_experts=16, layer_pattern=MoeLayerList(layers=(False,) * 3 + (True,) * 9)
    )
    return dataclasses.replace(
        full, name="deepseek-v3-12", num_layers=12, feed_forward=trimmed, seq_length=1024
    )


def _trimmed_gpt_oss() -> TransformerModelSpec:
    """GPT-OSS-120B cut to 12 layers (windows on the even ones, sinks on all), 16 experts and
    1024 tokens."""
    full = model_preset("gpt-oss-120b")
    moe = full.moe
    assert moe is not None
    return dataclasses.replace(
        full,
        name="gpt-oss-12",
        num_layers=12,
        feed_forward=dataclasses.replace(moe, num_experts=16),
        seq_length=1024,
    )


MOE_SPACES = [
    pytest.param(
        model_preset("mixtral-8x7b"),
        "dgx-h100",
        SearchSpace(
            gpu_counts=(16,),
            global_batch_size=8,
            max_microbatch_size=1,
            recompute=(RecomputeVariant.NONE, RecomputeVariant.SELECTIVE),
            sharding=(ShardingVariant.NO_SHARD, ShardingVariant.OPTIM_GRADS_PARAMS),
            overlap_grad_reduce=(True,),
            expert_tensor_parallel=(1, 2),
            dispatchers=(
                AllToAllDispatcher(),
                AllGatherDispatcher(),
                FlexDispatcher(),
                AllToAllDispatcher(overlap=True),
            ),
        ),
        id="mixtral-8x7b-h100",
    ),
    pytest.param(
        model_preset("mixtral-8x7b"),
        "dgx-h100",
        SearchSpace(
            gpu_counts=(16,),
            global_batch_size=8,
            max_microbatch_size=1,
            recompute=(RecomputeVariant.NONE, RecomputeVariant.SELECTIVE),
            sharding=(ShardingVariant.OPTIM, ShardingVariant.OPTIM_GRADS),
            overlap_grad_reduce=(False, True),
            expert_tensor_parallel=(1, 2),
            dispatchers=(AllToAllDispatcher(), AllToAllDispatcher(overlap=True)),
            grad_reduce_dtype=GradReduceDtype.PARAMS,
        ),
        id="mixtral-8x7b-h100-bf16-gradient-reduction",
    ),
    pytest.param(
        _trimmed_deepseek_v3(),
        "dgx-gb200",
        SearchSpace(
            gpu_counts=(32,),
            global_batch_size=16,
            max_microbatch_size=1,
            recompute=(RecomputeVariant.SELECTIVE, RecomputeVariant.FULL_BLOCK),
            recompute_num_layers=(1, 2),
            sharding=(ShardingVariant.OPTIM, ShardingVariant.OPTIM_GRADS_PARAMS),
            overlap_grad_reduce=(True,),
            dispatchers=(AllToAllDispatcher(), FlexDispatcher(overlap=True)),
        ),
        id="deepseek-v3-12-layers-gb200",
    ),
    pytest.param(
        _trimmed_gpt_oss(),
        "dgx-h100",
        SearchSpace(
            gpu_counts=(16,),
            global_batch_size=8,
            max_microbatch_size=1,
            recompute=(RecomputeVariant.NONE, RecomputeVariant.SELECTIVE),
            overlap_grad_reduce=(True,),
            context_parallel=None,
            cp_comm_types=(CpCommType.P2P, CpCommType.ALL_GATHER, CpCommType.A2A),
            dispatchers=(AllToAllDispatcher(), FlexDispatcher(), AllToAllDispatcher(overlap=True)),
        ),
        id="gpt-oss-12-layers-windows-sinks-h100",
    ),
]


@pytest.mark.parametrize(("model", "system_name", "space"), MOE_SPACES)
def test_moe_candidates_match_the_scalar_plan(
    model: TransformerModelSpec, system_name: str, space: SearchSpace
) -> None:
    """ep, etp and the dispatcher in the space: a spread sample of at least 400 rows, every
    field of the vectorized figures against the scalar plan (the ep_comm_exposed and
    host_exposed terms, the expert parts of memory and DP, the dense first layers' stage)."""
    system = system_preset(system_name)
    table = enumerate_strategies(model, space).table
    figures = evaluate_candidates(table, model, system)
    keep = ~(table.overlap_param_gather & ~table.overlap_grad_reduce)
    rows = np.flatnonzero(keep)[:: max(1, int(keep.sum()) // 450)]
    assert rows.shape[0] >= 400
    # the sample spans the expert axes
    assert len(set(table.expert[rows].tolist())) > 2
    assert len(set(table.dispatcher[rows].tolist())) == len(space.dispatchers)
    options = PlanOptions(bubble_source=BubbleSource.CONTRACT)
    problems: list[str] = []
    for i in rows:
        spec = candidate_to_spec(table, int(i), model)
        assert check_training(model, spec.mapping) == ()
        exact = plan_spec(spec, system, options).to_json_dict()
        problems.extend(
            f"{spec.mapping}: {m}" for m in _mismatches(figures.row_json(int(i)), exact, "")
        )
    assert problems == []
    assert float(figures.ep_comm_exposed.max()) > 0.0
    # the host-dispatch term is checked row by row above; the spaces reach host-bound rows
    assert float(figures.host_exposed.max()) > 0.0
