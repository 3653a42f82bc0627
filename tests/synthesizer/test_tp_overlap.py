"""Transformer Engine userbuffer overlap (issue 20): the formulas, and Llama 3 70B on 64 H100s.

Formulas: ``synthesizer/stages/portable_plan/tp_overlap.py`` (TE ``comm_gemm_overlap.cpp`` and
``module/base.py`` @d0067d0d). The figures below are derived by hand from them.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from blueprinting.api import plan
from blueprinting.errors import ConfigError, InvalidStrategyError
from blueprinting.hardware.collectives import CollectiveKind
from blueprinting.hardware.presets import system_preset
from blueprinting.hardware.system import ParallelDim
from blueprinting.mapping.flat_keys import from_mapping, to_mapping, to_megatron_args
from blueprinting.mapping.laws import check_training
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import (
    BulkOverlap,
    PipelinedDgradReduceScatter,
    ReduceScatterAllGather,
    UserbufferOverlap,
)
from blueprinting.synthesizer.dialects.transformer.training import SemanticOpName
from blueprinting.synthesizer.dialects.transformer.training_derivation import (
    derive_training_block,
)
from blueprinting.synthesizer.stages.distributed.ir import ComputeTask, Phase
from blueprinting.synthesizer.stages.portable_plan import tp_overlap
from blueprinting.synthesizer.stages.portable_plan.passes import PlanContext, chunk_time
from blueprinting.synthesizer.stages.portable_plan.precision import OpPrecision


def test_ring_exchange_hides_every_step_but_keeps_one_bare_chunk() -> None:
    # chunk 1, slowed 1 / (1 - 0.25) = 4/3; step 6 / 3 = 2 > 4/3: comm-bound by 2/3 per step.
    got = tp_overlap.ring_exchange(chunk_s=1.0, link_s=6.0, chunks=4, sm_fraction=0.25)
    assert got.compute_s == pytest.approx(3 * 4 / 3 + 1)
    assert got.exposed_s == pytest.approx(3 * (2 - 4 / 3))
    # compute-bound: nothing exposed, the slowdown stays in the compute
    got = tp_overlap.ring_exchange(chunk_s=1.0, link_s=1.5, chunks=4, sm_fraction=0.5)
    assert got.compute_s == pytest.approx(7.0)
    assert got.exposed_s == 0.0


def test_pipelined_reduce_scatter_exposes_the_last_chunk_once() -> None:
    # slowed 1 / 0.5 = 2 = step 8 / 4: the last RS chunk (2) stays exposed, counted once.
    got = tp_overlap.pipelined_reduce_scatter(chunk_s=1.0, link_s=8.0, splits=4, sm_fraction=0.5)
    assert got.compute_s == pytest.approx(8.0)
    assert got.exposed_s == pytest.approx(2.0)


def test_bulk_runs_the_gemm_on_the_remaining_sms() -> None:
    got = tp_overlap.bulk(gemm_s=3.0, link_s=5.0, sm_fraction=0.25)
    assert got.compute_s == pytest.approx(4.0)
    assert got.exposed_s == pytest.approx(1.0)
    assert tp_overlap.sm_fraction(16, 132) == 16 / 132
    assert tp_overlap.sm_fraction(16, None) == 0.0


_BASE = {
    "tensor_model_parallel_size": 4,
    "pipeline_model_parallel_size": 4,
    "sequence_parallel": True,
    "use_distributed_optimizer": True,
    "micro_batch_size": 1,
    "global_batch_size": 64,
}


def test_flat_keys_round_trip_and_megatron_flags() -> None:
    model = model_preset("llama3-70b")
    keys = {**_BASE, "world_size": 64, "tp_comm_overlap": True, "disable_tp_comm_bulk_wgrad": True}
    spec = from_mapping(keys, model=model)
    assert spec.mapping.parallelism.tensor.communication == ReduceScatterAllGather(
        overlap=UserbufferOverlap(column_backward=BulkOverlap(dgrad=True, wgrad=False))
    )
    flat = to_mapping(spec)
    assert {k: v for k, v in flat.items() if k.startswith("tp_comm")} == {
        "tp_comm_overlap": True,
        "tp_comm_overlap_ag": True,
        "tp_comm_overlap_rs": True,
        "tp_comm_bulk_dgrad": True,
        "tp_comm_bulk_wgrad": False,
    }
    assert from_mapping(flat, model=model).mapping == spec.mapping
    args = to_megatron_args(spec)
    assert args[args.index("--sequence-parallel") + 1 :][:2] == [
        "--tp-comm-overlap",
        "--disable-tp-comm-bulk-wgrad",
    ]
    rs_dgrad = from_mapping(
        {**keys, "disable_tp_comm_bulk_wgrad": None, "tp_comm_overlap_rs_dgrad": True},
        model=model,
    )
    assert rs_dgrad.mapping.tp_comm_overlap == UserbufferOverlap(
        column_backward=PipelinedDgradReduceScatter(splits=4)
    )
    assert "--tp-comm-overlap-rs-dgrad" in to_megatron_args(rs_dgrad)
    assert from_mapping(to_mapping(rs_dgrad), model=model).mapping == rs_dgrad.mapping


def test_flat_key_refusals() -> None:
    model = model_preset("llama3-70b")
    keys = {**_BASE, "world_size": 64}
    with pytest.raises(ConfigError) as caught:
        from_mapping({**keys, "sequence_parallel": False, "tp_comm_overlap": True}, model=model)
    assert "tp_comm_overlap = true needs sequence_parallel = true" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        from_mapping({**keys, "tp_comm_overlap_ag": False}, model=model)
    assert "tp_comm_overlap_ag needs tp_comm_overlap = true" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        from_mapping(
            {
                **keys,
                "tp_comm_overlap": True,
                "tp_comm_overlap_ag": False,
                "disable_tp_comm_overlap_ag": False,
            },
            model=model,
        )
    assert "tp_comm_overlap_ag = False conflicts with disable_tp_comm_overlap_ag = False" in str(
        caught.value
    )


def test_start_up_laws() -> None:
    model = model_preset("llama3-70b")
    spec = from_mapping(
        {**_BASE, "world_size": 64, "tp_comm_overlap": True, "micro_batch_size": 1}, model=model
    )
    assert check_training(model, spec.mapping) == ()
    tensor = replace(spec.mapping.parallelism.tensor, degree=1)
    odd = replace(spec.mapping, parallelism=replace(spec.mapping.parallelism, tensor=tensor))
    laws = {v.law for v in check_training(model, odd)}
    assert "tp_comm_overlap_needs_sequence_parallel" in laws
    # seq 8190 * b 1 is not a multiple of t = 4 (nor is 8190 itself: local_sequence too)
    short = replace(model, seq_length=8190)
    with pytest.raises(InvalidStrategyError) as caught:
        to_megatron_args(replace(spec, model=short))
    names = {v.law for v in caught.value.violations}
    assert {"tp_comm_overlap_buffer_shape", "local_sequence"} <= names


def test_llama3_70b_on_64_h100s_hides_tp_comm() -> None:
    """Done-when check of issue 20: t = 4, SP, 1F1B p = 4, d = 4, B = 64 on dgx-h100."""
    plain = plan(system="dgx-h100", model="llama3-70b", gpus=64, settings=_BASE)
    over = plan(
        system="dgx-h100", model="llama3-70b", gpus=64, settings={**_BASE, "tp_comm_overlap": True}
    )
    assert over.breakdown.tp_comm_exposed < plain.breakdown.tp_comm_exposed
    assert over.iteration_time_s < plain.iteration_time_s
    assert "--tp-comm-overlap" in over.megatron_args
    doc = json.loads(json.dumps(over.to_json_dict()))
    plain_doc = json.loads(json.dumps(plain.to_json_dict()))
    tp = doc["tp_comm"]
    assert tp["overlap"] == "ub(ag=ring,rs=pipe/4,bulk=dgrad+wgrad)"
    assert doc["strategy"]["tp_comm_overlap"] is True
    total = tp["iteration"]
    assert total["exposed_s"] == pytest.approx(doc["time_breakdown_s"]["tp_comm_exposed"])
    assert total["hidden_s"] == pytest.approx(total["link_s"] - total["exposed_s"])
    assert total["link_s"] == pytest.approx(plain_doc["tp_comm"]["iteration"]["link_s"])
    assert total["overlap_compute_s"] > 0
    assert plain_doc["tp_comm"]["overlap"] == "none"

    # One overlapped GEMM by hand: fc2 (MLP_DOWN) forward, pipelined RS in 4 chunks on
    # 132 - 16 SMs; the last RS chunk stays exposed.
    system = system_preset("dgx-h100")
    spec = over.spec
    ctx = PlanContext(spec=spec, system=system)
    group = ctx.group(ParallelDim.TENSOR)
    tasks = derive_training_block(spec.model, spec.mapping).block.tasks
    fc2 = next(
        t
        for t in tasks
        if isinstance(t, ComputeTask)
        and t.phase is Phase.FORWARD
        and t.lineage.op is SemanticOpName.MLP_DOWN
    )
    assert fc2.gemm is not None and (fc2.gemm.m, fc2.gemm.n, fc2.gemm.k) == (8192, 7168, 8192)
    chunk = chunk_time(
        fc2, 4, system, OpPrecision(datatype=spec.model.datatype, recipe=spec.mapping.precision)
    )
    link = system.collective_time(CollectiveKind.REDUCE_SCATTER, 8192 * 8192 * 2, group)
    slowed = chunk / (1 - 16 / 132)
    step = link / 4
    assert slowed > step  # compute-bound: only the last chunk's RS is exposed
    fc2_time = 4 * slowed + step
    got = tp_overlap.pipelined_reduce_scatter(
        chunk_s=chunk, link_s=link, splits=4, sm_fraction=16 / 132
    )
    assert got.compute_s + got.exposed_s == pytest.approx(fc2_time)
    assert got.exposed_s == pytest.approx(step)
    # In the plan's forward: both row-parallel RS leave their last chunk, both rings hide fully.
    assert over.plan.block.forward.comm_exposed_s == pytest.approx(2 * step)
    assert tp["block"]["forward"]["hidden_s"] == pytest.approx(4 * link - 2 * step)
