"""The host-dispatch model (``portable_plan/host_dispatch.py``): the op-by-op pass after a host
sync, the ``host_exposed`` breakdown term, and what CUDA graphs remove."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blueprinting.api import plan_spec
from blueprinting.hardware.host import HostCpu, host_op_s
from blueprinting.hardware.presets import SYSTEM_PRESETS
from blueprinting.mapping.cuda_graphs import CudaGraphScope, TransformerEngineCudaGraphs
from blueprinting.mapping.flat_keys import from_mapping
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import AllToAllDispatcher, TrainingSpec
from blueprinting.synthesizer.stages.portable_plan.host_dispatch import (
    synced_pass_s,
    training_host_dispatch,
)

_QWEN = model_preset("qwen3-30b-a3b")


def _qwen(**keys: object) -> TrainingSpec:
    base: dict[str, object] = {
        "world_size": 8,
        "expert_model_parallel_size": 8,
        "micro_batch_size": 1,
        "global_batch_size": 64,
        "moe_token_dispatcher_type": "alltoall",
    }
    return from_mapping({**base, **keys}, model=_QWEN)


def test_the_per_op_figures_are_the_cited_measurements() -> None:
    """TransformerEngine issue #2053: torch.nn.Linear forward CPU time, DGX H100 and GB200."""
    assert host_op_s(HostCpu.X86) == 13.48e-6
    assert host_op_s(HostCpu.GRACE) == 37.08e-6
    assert SYSTEM_PRESETS["dgx-b200"].host_cpu is HostCpu.X86
    assert SYSTEM_PRESETS["dgx-gb200"].host_cpu is HostCpu.GRACE


def test_a_synced_pass_op_by_op() -> None:
    # ops issued at 1, 2, 3; each runs 0.5 once issued: the host bounds the pass
    assert synced_pass_s([1.0, 1.0, 1.0], [0.5, 0.5, 0.5]) == 3.5
    # one long op first: the later ones are issued while it runs
    assert synced_pass_s([1.0, 1.0, 1.0], [5.0, 0.5, 0.5]) == 7.0
    assert synced_pass_s([], []) == 0.0


@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=1e-3), st.floats(min_value=0.0, max_value=1e-3)
        ),
        min_size=1,
        max_size=40,
    )
)
def test_a_synced_pass_is_bounded_by_its_host_and_gpu_times(ops: list[tuple[float, float]]) -> None:
    issue = [i for i, _ in ops]
    gpu = [g for _, g in ops]
    timed = synced_pass_s(issue, gpu)
    tolerance = 1e-12
    assert timed >= sum(gpu) - tolerance
    assert timed >= sum(issue) + gpu[-1] - tolerance
    assert timed <= sum(issue) + sum(gpu) + tolerance


def test_the_breakdown_term_sums_into_the_iteration() -> None:
    report = plan_spec(_qwen(), "dgx-b200")
    terms = report.breakdown
    assert terms.host_exposed > 0.0
    assert terms.total_s == pytest.approx(report.iteration_time_s, rel=1e-12)
    breakdown = report.to_json_dict()["time_breakdown_s"]
    assert isinstance(breakdown, dict)
    assert breakdown["host_exposed"] == terms.host_exposed


def test_full_iteration_graphs_expose_no_host_time() -> None:
    eager = plan_spec(_qwen(), "dgx-b200").breakdown
    graphed = plan_spec(
        _qwen(cuda_graph_impl="local", cuda_graph_scope="full_iteration"), "dgx-b200"
    ).breakdown
    assert graphed.host_exposed == 0.0
    # the GPU work itself does not change
    assert graphed.forward == eager.forward and graphed.backward == eager.backward


def test_scoped_graphs_remove_their_ops_host_time() -> None:
    """On a Grace host the eager Qwen3-30B-A3B pass at micro-batch 1 is host-bound; capturing
    attention and the router leaves the dispatch and experts' ops to the host. On a Xeon the
    host keeps up except for the refill after the sync, which the scopes do not touch."""
    scoped_keys = {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": "attn moe_router"}
    eager = plan_spec(_qwen(), "dgx-gb200").breakdown.host_exposed
    scoped = plan_spec(_qwen(**scoped_keys), "dgx-gb200").breakdown.host_exposed
    assert 0.0 < scoped < eager
    x86_eager = plan_spec(_qwen(), "dgx-b200").breakdown.host_exposed
    x86_scoped = plan_spec(_qwen(**scoped_keys), "dgx-b200").breakdown.host_exposed
    assert x86_scoped == x86_eager


def test_a_grace_host_exposes_more_than_a_xeon() -> None:
    spec = _qwen()
    x86 = plan_spec(spec, "dgx-b200").breakdown.host_exposed
    grace = plan_spec(spec, "dgx-gb200").breakdown.host_exposed
    assert grace > x86


def test_drop_and_pad_has_no_host_sync() -> None:
    padded = _qwen(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)
    system = SYSTEM_PRESETS["dgx-b200"]
    assert (
        training_host_dispatch(
            padded.model, padded.mapping.cuda_graphs, system, dispatcher=AllToAllDispatcher()
        ).moe_forward_syncs
        == 0
    )
    dropless = _qwen()
    assert (
        training_host_dispatch(
            dropless.model, dropless.mapping.cuda_graphs, system, dispatcher=AllToAllDispatcher()
        ).moe_forward_syncs
        == 1
    )
    captured = training_host_dispatch(
        dropless.model,
        TransformerEngineCudaGraphs(scope=frozenset({CudaGraphScope.ATTN})),
        system,
        dispatcher=AllToAllDispatcher(),
    ).captured
    assert captured == {CudaGraphScope.ATTN}


def test_a_large_dense_layer_hides_its_host_time() -> None:
    """GPT-3 175B's layers run milliseconds of GEMMs per pass: the host stays ahead."""
    spec = from_mapping(
        {
            "tensor_model_parallel_size": 8,
            "pipeline_model_parallel_size": 8,
            "world_size": 64,
            "micro_batch_size": 1,
            "global_batch_size": 64,
        },
        model=model_preset("gpt3-175b"),
    )
    assert plan_spec(spec, "dgx-a100-80gb").breakdown.host_exposed == 0.0
