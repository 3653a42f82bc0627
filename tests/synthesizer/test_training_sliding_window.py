"""Sliding-window layers in training (GPT-OSS: a 128-token window on alternate layers): the fused
kernel's work over the window's band, its rate, the per-layer change the plan adds per chunk,
and Transformer Engine's context-parallel rules for windows and sinks."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.api import build_spec, plan_spec
from blueprinting.errors import InvalidStrategyError, VerificationError
from blueprinting.hardware.attention import (
    FORWARD_FLOPS_PER_PAIR_DIM,
    H100_FLASH_ATTENTION_2,
    causal_attention_pairs,
    windowed_attention_pairs,
    windowed_rate_seq_length,
)
from blueprinting.mapping.laws import check_training
from blueprinting.mapping.model import (
    FullAttention,
    MoeLayerFrequency,
    MoeLayerList,
    SlidingWindow,
    SoftmaxType,
)
from blueprinting.mapping.presets import model_preset
from blueprinting.simulator.from_plan import schedule_costs
from blueprinting.synthesizer.dialects.transformer.inference import attended_pairs

GPT_OSS = model_preset("gpt-oss-120b")
#: t1 p4 ep8 on 32 H100s: 9 of the 36 layers a stage, windows on the even ones
KEYS = {
    "pipeline_model_parallel_size": 4,
    "expert_model_parallel_size": 8,
    "global_batch_size": 64,
    "micro_batch_size": 1,
}


def _plan(model=GPT_OSS, gpus=32, **extra: object):  # type: ignore[no-untyped-def]
    return plan_spec(build_spec(model=model, gpus=gpus, settings={**KEYS, **extra}), "dgx-h100")


def test_band_pairs_in_flash_attentions_convention() -> None:
    # s W - W^2 / 2: GPT-OSS's W = 129 at s = 4096
    assert windowed_attention_pairs(4096, 129) == 4096 * 129 - 129 * 129 // 2 == 520_064
    # a window as long as the sequence is the causal mask, in the causal convention
    assert windowed_attention_pairs(4096, 4096) == causal_attention_pairs(4096) == 8_388_608
    assert windowed_attention_pairs(100, 5000) == causal_attention_pairs(100)
    assert windowed_rate_seq_length(4096, 129) == 258
    assert windowed_rate_seq_length(4096, None) == 4096
    assert windowed_rate_seq_length(200, 129) == 200


@settings(max_examples=300, deadline=None)
@given(s=st.integers(1, 1 << 20), keys=st.integers(1, 1 << 20))
def test_band_pairs_differ_from_the_exact_count_by_the_conventions_diagonal(
    s: int, keys: int
) -> None:
    """The exact count (serving's ``attended_pairs``: sum of min(i + 1, W)) exceeds the
    convention's band by W / 2 (s / 2 for the causal mask), up to rounding."""
    exact = attended_pairs(s, 0, keys)
    band = windowed_attention_pairs(s, keys)
    slack = min(s, keys) // 2
    assert exact - band in (slack, slack + 1)


#: cuDNN's SDPA backward on SM120 (cudnn-frontend PR #505 "Add sliding-window attention support
#: to the SM120 FROST SDPA backward engine", merged 2026-08-07, its bwd+swa table: cudnn column,
#: median microseconds, B1 H16 D64 causal): (s, window_size_left, windowed us, causal us)
CUDNN_SM120_BACKWARD = (
    (4096, 511, 171.0, 558.2),
    (4096, 1023, 276.6, 558.2),
    (16384, 511, 791.8, 6447.7),
    (16384, 1023, 1169.2, 6447.7),
)


@pytest.mark.parametrize(("s", "window", "windowed_us", "causal_us"), CUDNN_SM120_BACKWARD)
def test_windowed_to_causal_time_against_cudnn(
    s: int, window: int, windowed_us: float, causal_us: float
) -> None:
    """The windowed kernel's time over the causal one's: band pairs at the rate read at
    min(s, 2W) (H100 FA2's curve shape), against cuDNN's measured ratio. At s = 4096, GPT-OSS's
    training length, within 5%; at 16k the ratio is 10-30% low because the causal kernel's rate
    rises faster with s on cuDNN / SM120 than on H100 FA2's table (next test)."""
    keys = window + 1
    rate = H100_FLASH_ATTENTION_2.flop_per_s
    modelled = (
        windowed_attention_pairs(s, keys)
        / rate(seq_length=windowed_rate_seq_length(s, keys), head_dim=64)
    ) / (causal_attention_pairs(s) / rate(seq_length=s, head_dim=64))
    measured = windowed_us / causal_us
    error = modelled / measured - 1
    if s == 4096:
        assert abs(error) < 0.05
    else:
        # the causal baseline's shape, not the window's: below
        assert -0.30 < error < -0.10


@pytest.mark.parametrize("window", [511, 1023])
def test_a_windowed_kernels_time_scales_with_its_band(window: int) -> None:
    """Past 2W the model reads one rate, so the windowed time scales as the band's pairs; so
    does cuDNN's measured one between 4k and 16k (within 11%). Its causal rate rises 38% over
    the same range where H100 FA2's table rises 10%: that, not the window, is the 16k rows'
    deviation above."""
    keys = window + 1
    times = {s: t for s, w, t, _ in CUDNN_SM120_BACKWARD if w == window}
    pairs = windowed_attention_pairs(16384, keys) / windowed_attention_pairs(4096, keys)
    assert times[16384] / times[4096] == pytest.approx(pairs, rel=0.11)
    rate = H100_FLASH_ATTENTION_2.flop_per_s
    assert rate(seq_length=windowed_rate_seq_length(16384, keys), head_dim=64) == rate(
        seq_length=windowed_rate_seq_length(4096, keys), head_dim=64
    )
    cudnn_causal_rise = (16 * 558.2) / 6447.7  # 16x the pairs in 11.6x the time
    fa2_causal_rise = rate(seq_length=16384, head_dim=64) / rate(seq_length=4096, head_dim=64)
    assert cudnn_causal_rise == pytest.approx(1.385, abs=0.001)
    assert fa2_causal_rise == pytest.approx(284 / 257)


def test_gpt_oss_stages_count_their_windowed_layers() -> None:
    plan = _plan().plan
    # every GPT-OSS layer is a MoE layer: its windowed ones are counted as such
    assert [s.moe_windowed_per_chunk for s in plan.stages] == [(5,), (4,), (5,), (4,)]
    assert [s.windowed_blocks_per_chunk for s in plan.stages] == [(0,)] * 4
    assert [s.moe_windowed_recomputed_per_chunk for s in plan.stages] == [(0,)] * 4
    # selective recompute (Megatron's default module, core_attn) re-runs every attention core
    selective = _plan(recompute_granularity="selective").plan
    assert [s.moe_windowed_recomputed_per_chunk for s in selective.stages] == [
        (5,),
        (4,),
        (5,),
        (4,),
    ]
    # full recompute of each stage's first 2 layers (0-1, 9-10, 18-19, 27-28): one windowed
    full = _plan(
        recompute_granularity="full", recompute_method="block", recompute_num_layers=2
    ).plan
    assert [s.moe_windowed_recomputed_per_chunk for s in full.stages] == [(1,)] * 4
    interleaved = _plan(num_layers_per_virtual_pipeline_stage=3).plan
    # chunks of 3 layers from 0, 3, 6, 9 (stage 0: layers 0-2, 12-14, 24-26)
    assert [s.moe_windowed_per_chunk for s in interleaved.stages] == [
        (2, 2, 2),
        (1, 1, 1),
        (2, 2, 2),
        (1, 1, 1),
    ]


def test_the_window_changes_only_the_attention_core_by_hand() -> None:
    """H100 FA2 at d = 64 (microbenchmarks.md 3.1): 257 TFLOP/s at 4k, 141 at 512 (the clamp
    for 2W = 258) times the short-kernel fraction at 258 tokens, 0.45 + 0.55 log2(258 / 256)
    (cuDNN's measured 128-key window on GB200, ``hardware.attention.short_kernel_fraction``).
    One layer's forward on b = 1, 64 heads."""
    report = _plan()
    assert report.plan.window is None  # no dense layer
    window = report.plan.moe_window
    assert window is not None
    per_pair = FORWARD_FLOPS_PER_PAIR_DIM * 64 * 64
    full_s = per_pair * causal_attention_pairs(4096) / 257e12
    windowed_s = per_pair * 520_064 / (141e12 * (0.45 + (1.0 - 0.45) * math.log2(258 / 256)))
    assert window.forward.flops == per_pair * (520_064 - 8_388_608)
    assert window.forward.compute_s == pytest.approx(windowed_s - full_s, rel=1e-12)
    # the backward is 2.5 x the forward in the convention, at the same rates
    assert window.backward_activation.compute_s == pytest.approx(
        2.5 * window.forward.compute_s, rel=1e-12
    )
    assert window.backward_weight.compute_s == 0.0
    assert window.recompute.compute_s == 0.0  # no recompute
    # selective recompute re-runs the forward core
    selective = _plan(recompute_granularity="selective").plan.moe_window
    assert selective is not None
    assert selective.recompute.compute_s == pytest.approx(window.forward.compute_s, rel=1e-12)

    full = _plan(model=dataclasses.replace(GPT_OSS, attention_window=FullAttention()))
    assert full.plan.window is None and full.plan.moe_window is None
    for windowed_stage, full_stage in zip(report.plan.stages, full.plan.stages, strict=True):
        n = windowed_stage.moe_windowed_blocks
        change = n * (window.forward_s + window.backward_s + window.recompute.critical_path_s)
        assert report.plan.stage_microbatch_compute_s(windowed_stage) == pytest.approx(
            full.plan.stage_microbatch_compute_s(full_stage) + change, rel=1e-12
        )
    assert report.iteration_time_s < full.iteration_time_s


def test_unfused_attention_saves_nothing_from_a_window() -> None:
    """The unfused ops compute and mask the whole s x s scores: the change is zero."""
    window = _plan(attention_backend="unfused").plan.moe_window
    assert window is not None
    assert window.forward_s == window.backward_s == window.recompute.critical_path_s == 0.0


def test_the_simulator_carries_the_windows_in_its_chunks() -> None:
    report = _plan()
    spec = build_spec(model=GPT_OSS, gpus=32, settings=KEYS)
    costs = schedule_costs(report.plan, spec, report.system, with_dp=False)
    for stage, forward, backward in zip(
        report.plan.stages, costs.forward_s, costs.backward_s, strict=True
    ):
        assert sum(forward) + sum(backward) == pytest.approx(
            report.plan.stage_microbatch_compute_s(stage), rel=1e-12
        )


def _cp_laws(model, cp_comm_type: str) -> set[str]:  # type: ignore[no-untyped-def]
    spec = build_spec(
        model=model,
        gpus=64,
        settings={
            **KEYS,
            "context_parallel_size": 2,
            "cp_comm_type": cp_comm_type,
            **(
                {"hierarchical_context_parallel_sizes": [2, 1]} if cp_comm_type == "a2a+p2p" else {}
            ),
        },
    )
    return {v.law for v in check_training(spec.model, spec.mapping)}


def test_transformer_engines_cp_rules_for_windows_and_sinks() -> None:
    window, sinks = "cp_sliding_window_comm_type", "cp_softmax_type_needs_a2a"
    # GPT-OSS has both: only a2a runs
    assert _cp_laws(GPT_OSS, "a2a") == set()
    assert _cp_laws(GPT_OSS, "p2p") == {window, sinks}
    assert _cp_laws(GPT_OSS, "all_gather") == {sinks}
    assert _cp_laws(GPT_OSS, "a2a+p2p") == {window, sinks}
    # windows without sinks: a2a and all_gather
    windows_only = dataclasses.replace(GPT_OSS, softmax_type=SoftmaxType.VANILLA)
    assert _cp_laws(windows_only, "all_gather") == set()
    assert _cp_laws(windows_only, "p2p") == {window}
    # no windowed layer (a window on every layer but skipped on all): no window rule
    never_windowed = dataclasses.replace(
        windows_only, attention_window=SlidingWindow(size=128, full_every=1)
    )
    assert _cp_laws(never_windowed, "p2p") == set()


def test_the_cp_rules_refuse_with_their_values() -> None:
    spec = build_spec(model=GPT_OSS, gpus=64, settings={**KEYS, "context_parallel_size": 2})
    with pytest.raises(InvalidStrategyError) as refused:
        plan_spec(spec, "dgx-h100")
    message = str(refused.value)
    assert "cp_sliding_window_comm_type" in message
    assert "18 of 36 layers" in message
    assert "cp_softmax_type_needs_a2a" in message


def test_plan_json_reports_the_window() -> None:
    report = _plan()
    window = report.plan.moe_window
    assert window is not None
    got = report.to_json_dict()["attention_window"]
    assert got == {
        "window_keys": 129,
        "windowed_layers": 18,
        "layers": 36,
        "windowed_layers_on_critical_stage": report.plan.critical_stage().moe_windowed_blocks,
        "dense_layer_change_s": None,
        "moe_layer_change_s": {
            "forward": window.forward_s,
            "backward": window.backward_s,
            "recompute": 0.0,
        },
    }
    assert got["windowed_layers_on_critical_stage"] in (4, 5)
    full = _plan(model=dataclasses.replace(GPT_OSS, attention_window=FullAttention()))
    assert full.to_json_dict()["attention_window"] is None


def test_backends_that_cannot_run_windows_or_sinks() -> None:
    """Megatron-Core's own attention (local) runs no window; the flash backend leaves TE only
    FlashAttention, which runs no attention sinks."""
    law = "attention_backend_runs_window_and_sinks"
    for backend, expected in (
        ("auto", 0),
        ("fused", 0),
        ("unfused", 0),
        ("local", 1),
        ("flash", 1),
    ):
        spec = build_spec(model=GPT_OSS, gpus=32, settings={**KEYS, "attention_backend": backend})
        violated = [v for v in check_training(spec.model, spec.mapping) if v.law == law]
        assert len(violated) == expected, backend
    plain = dataclasses.replace(GPT_OSS, softmax_type=SoftmaxType.VANILLA)
    spec = build_spec(model=plain, gpus=32, settings={**KEYS, "attention_backend": "flash"})
    assert check_training(spec.model, spec.mapping) == ()
    unwindowed = dataclasses.replace(GPT_OSS, attention_window=FullAttention())
    spec = build_spec(model=unwindowed, gpus=32, settings={**KEYS, "attention_backend": "local"})
    assert check_training(spec.model, spec.mapping) == ()


def test_the_plan_verifies_its_windowed_counts() -> None:
    """A stage's windowed blocks lie within its blocks (and the recomputed ones within its
    recomputed), and need the window's cost: the IR refuses anything else."""
    plan = _plan().plan
    stage = plan.stages[0]
    with pytest.raises(VerificationError, match="stage 0 has windowed blocks it does not hold"):
        dataclasses.replace(plan, moe_window=None)
    too_many = dataclasses.replace(stage, moe_windowed_per_chunk=(10,))
    with pytest.raises(VerificationError, match="stage 0 has windowed blocks it does not hold"):
        dataclasses.replace(plan, stages=(too_many, *plan.stages[1:]))
    unrecomputed = dataclasses.replace(stage, moe_windowed_recomputed_per_chunk=(1,))
    with pytest.raises(VerificationError, match="stage 0 has windowed blocks it does not hold"):
        dataclasses.replace(plan, stages=(unrecomputed, *plan.stages[1:]))
    # each kind within its own blocks: GPT-OSS's 9 layers a stage are all MoE, so no dense one
    # can be windowed, and the MoE windowed count cannot pass the MoE blocks
    dense_windowed = dataclasses.replace(stage, windowed_blocks_per_chunk=(1,))
    with pytest.raises(VerificationError, match="stage 0 has windowed blocks it does not hold"):
        dataclasses.replace(plan, stages=(dense_windowed, *plan.stages[1:]))
    fewer_moe = dataclasses.replace(stage, moe_blocks_per_chunk=(4,), moe_recomputed_per_chunk=(0,))
    with pytest.raises(VerificationError, match="stage 0 has windowed blocks it does not hold"):
        dataclasses.replace(plan, stages=(fewer_moe, *plan.stages[1:]))
    # a MoE count past the blocks is refused the same way
    moe = dataclasses.replace(stage, moe_blocks_per_chunk=(10,))
    with pytest.raises(VerificationError, match="stage 0 has MoE blocks it does not hold"):
        dataclasses.replace(plan, stages=(moe, *plan.stages[1:]))


def test_a_window_that_skips_every_layer_plans_as_full_attention() -> None:
    """window_attn_skip_freq 1 keeps every layer full: no windowed count, no change, and the
    plan equals the full-attention model's (Megatron's local backend still refuses the
    window_size it asserts on)."""
    report = _plan(window_attn_skip_freq=1)
    assert report.plan.window is None and report.plan.moe_window is None
    assert all(s.windowed_blocks_per_chunk == () for s in report.plan.stages)
    full = _plan(model=dataclasses.replace(GPT_OSS, attention_window=FullAttention()))
    assert report.iteration_time_s == full.iteration_time_s
    assert report.to_json_dict()["attention_window"] is None
    spec = build_spec(
        model=GPT_OSS,
        gpus=32,
        settings={**KEYS, "window_attn_skip_freq": 1, "attention_backend": "local"},
    )
    assert "attention_backend_runs_window_and_sinks" in {
        v.law for v in check_training(spec.model, spec.mapping)
    }


def test_the_window_uncovers_host_time_it_no_longer_hides() -> None:
    """The windowed MoE layer is costed whole: where the host issues a layer's ops slower
    than the shorter GPU work runs them, the change carries the host time it uncovers
    (GPT-OSS with every layer windowed, t2 cp2 a2a on 64 H100s, the review's case)."""
    every = dataclasses.replace(GPT_OSS, attention_window=SlidingWindow(size=128))
    report = _plan(
        model=every,
        gpus=64,
        tensor_model_parallel_size=2,
        sequence_parallel=True,
        context_parallel_size=2,
        cp_comm_type="a2a",
        pipeline_model_parallel_size=2,
        expert_tensor_parallel_size=1,
    )
    window = report.plan.moe_window
    assert window is not None
    assert window.forward.compute_s < 0.0
    assert window.forward.host_exposed_s > 0.0
    # the saving on the critical path is smaller than the shorter core's compute alone: the
    # difference of the two cores (the first version) would have overstated it by this much
    assert window.forward.compute_s < window.forward_s < 0.0
    assert window.forward_s - window.forward.compute_s >= window.forward.host_exposed_s


@settings(max_examples=300, deadline=None)
@given(
    every=st.integers(1, 9),
    full_every=st.one_of(st.none(), st.integers(1, 9)),
    start=st.integers(0, 200),
    count=st.integers(0, 200),
)
def test_windowed_moe_layers_by_brute_force(
    every: int, full_every: int | None, start: int, count: int
) -> None:
    moe = GPT_OSS.moe
    assert moe is not None
    model = dataclasses.replace(
        GPT_OSS,
        num_layers=400,
        feed_forward=dataclasses.replace(moe, layer_pattern=MoeLayerFrequency(every=every)),
        attention_window=SlidingWindow(size=128, full_every=full_every),
    )
    brute = sum(
        1
        for i in range(start, start + count)
        if i % every == 0 and (full_every is None or (i + 1) % full_every != 0)
    )
    assert model.windowed_moe_layers_in(start, count) == brute
    listed = dataclasses.replace(
        model,
        feed_forward=dataclasses.replace(
            moe, layer_pattern=MoeLayerList(layers=tuple(i % every == 0 for i in range(400)))
        ),
    )
    assert listed.windowed_moe_layers_in(start, count) == brute


def test_dense_and_moe_windowed_layers_each_take_their_change() -> None:
    """A model with dense and MoE layers and a window on two of every three: each stage counts
    its windowed layers by kind, and adds each kind's change."""
    moe = GPT_OSS.moe
    assert moe is not None
    mixed = dataclasses.replace(
        GPT_OSS,
        num_layers=12,
        feed_forward=dataclasses.replace(moe, layer_pattern=MoeLayerFrequency(every=2)),
        attention_window=SlidingWindow(size=128, full_every=3),
    )
    report = _plan(model=mixed, gpus=16, pipeline_model_parallel_size=2)
    plan = report.plan
    assert plan.window is not None and plan.moe_window is not None
    # layers 0-5: windowed 0, 1, 3, 4 (2 and 5 full); MoE 0, 2, 4
    first, second = plan.stages
    assert (first.windowed_blocks_per_chunk, first.moe_windowed_per_chunk) == ((2,), (2,))
    # layers 6-11: windowed 6, 7, 9, 10; MoE 6, 8, 10
    assert (second.windowed_blocks_per_chunk, second.moe_windowed_per_chunk) == ((2,), (2,))
    full = _plan(
        model=dataclasses.replace(mixed, attention_window=FullAttention()),
        gpus=16,
        pipeline_model_parallel_size=2,
    ).plan
    for stage, full_stage in zip(plan.stages, full.stages, strict=True):
        change = 2 * (plan.window.forward_s + plan.window.backward_s) + 2 * (
            plan.moe_window.forward_s + plan.moe_window.backward_s
        )
        assert plan.stage_microbatch_compute_s(stage) == pytest.approx(
            full.stage_microbatch_compute_s(full_stage) + change, rel=1e-12
        )


def test_the_data_parallel_window_is_the_stages_own_block_backward() -> None:
    """The gradient buckets' overlap window per block is the mean backward of the stage's
    blocks (here GPT-OSS: MoE layers, half of them windowed), not the dense block's, which
    the model does not have; a dense full-attention stage keeps the dense block's exactly."""
    plan = _plan().plan
    moe, window = plan.moe_block, plan.moe_window
    assert moe is not None and window is not None
    for stage in plan.stages:
        expected = (
            stage.moe_blocks * moe.backward_s + stage.moe_windowed_blocks * window.backward_s
        ) / stage.blocks
        assert plan.stage_block_backward_s(stage) == pytest.approx(expected, rel=1e-12)
        assert plan.stage_block_backward_s(stage) > plan.block.backward_s
    dense = plan_spec(
        build_spec(model="llama3-8b", gpus=8, settings={"pipeline_model_parallel_size": 2}),
        "dgx-h100",
    ).plan
    assert all(dense.stage_block_backward_s(s) == dense.block.backward_s for s in dense.stages)


def test_combined_1f1b_unpaired_passes_carry_the_windowed_layers_change() -> None:
    """Under the EP overlap a windowed MoE layer has its own pair / alone times: the stage's
    unpaired warm-up and cool-down passes add the full layer's extra per MoE layer and the
    windowed layer's change per windowed one (the plan, the simulator's matrices)."""
    from blueprinting.analysis.iteration import (
        plan_unpaired_ep_exposed_s,
        unpaired_ep_exposed_s,
    )

    # EP 16 over two nodes: the all-to-alls outlast what a pass alone hides (at EP 8 in one
    # node neither layer leaves an unpaired extra)
    keys = {
        "moe_token_dispatcher_type": "alltoall",
        "overlap_moe_expert_parallel_comm": True,
        "num_layers_per_virtual_pipeline_stage": 3,
        "expert_model_parallel_size": 16,
    }
    report = _plan(gpus=64, **keys)
    plan = report.plan
    full, windowed = plan.ep_overlap, plan.moe_window_ep_overlap
    assert full is not None and windowed is not None
    change = plan.unpaired_window_change_s()
    assert change == (
        windowed.unpaired_forward_s - full.unpaired_forward_s,
        windowed.unpaired_backward_s - full.unpaired_backward_s,
    )
    assert change != (0.0, 0.0)
    spec = build_spec(model=GPT_OSS, gpus=64, settings={**KEYS, **keys})
    schedule = spec.mapping.parallelism.pipeline.schedule
    m = spec.mapping.microbatch_count
    for stage in plan.stages:

        def extra(layers: int, per_layer: float, index: int = stage.index) -> float:
            return float(
                unpaired_ep_exposed_s(
                    p=4, v=3, group=4, m=m, stage=index, moe_blocks=layers, unpaired_s=per_layer
                )
            )

        expected = extra(
            stage.moe_blocks, full.unpaired_forward_s + full.unpaired_backward_s
        ) + extra(stage.moe_windowed_blocks, sum(change))
        assert plan_unpaired_ep_exposed_s(schedule, plan, stage, m) == pytest.approx(
            expected, rel=1e-12
        )
    costs = schedule_costs(plan, spec, report.system, with_dp=False)
    assert costs.unpaired_forward_s is not None
    first = plan.stages[0]
    assert costs.unpaired_forward_s[0][0] == pytest.approx(
        first.moe_blocks_per_chunk[0] * full.unpaired_forward_s
        + first.moe_windowed_per_chunk[0] * change[0],
        rel=1e-12,
    )
