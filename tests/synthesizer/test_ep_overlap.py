"""Combined 1F1B's MoE layer in Megatron's two-stream op order
(``model_chunk_schedule_plan.py`` ``TransformerLayerSchedulePlan.run`` @d98e8a64), and what
``--delay-wgrad-compute`` changes in it; the figures are traced by hand in the docstrings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blueprinting.errors import ConfigError
from blueprinting.synthesizer.stages.portable_plan.ep_overlap import (
    MoeLayerPasses,
    combined_layer_timing,
)

EXACT = 1e-12

#: attention 2 / dispatch 1 / experts 3 / combine 1 forward; combine 1, experts dgrad 3 and
#: wgrad 3, dispatch 4, attention dgrad 2 and wgrad 2 backward
SLOW_DISPATCH = MoeLayerPasses(
    forward_attention_s=2.0,
    forward_dispatch_s=1.0,
    forward_experts_s=3.0,
    forward_combine_s=1.0,
    backward_combine_s=1.0,
    backward_experts_dgrad_s=3.0,
    backward_experts_wgrad_s=3.0,
    backward_dispatch_s=4.0,
    backward_attention_dgrad_s=2.0,
    backward_attention_wgrad_s=2.0,
)


def test_without_delayed_wgrad_the_backward_dispatch_waits_for_the_expert_wgrad() -> None:
    """A pair, layer after layer: comm combine_b [0,1], comp attention_f [0,2], experts_b
    (dgrad + wgrad) [2,8], comm dispatch_f [2,3], dispatch_b [8,12] (it waits for the whole
    experts backward), comp experts_f [8,11], comm combine_f [12,13], comp attention_b [12,16];
    the next layer's combine_b waits for attention_b: 16 s a layer, 15 s of work, 1 s of the
    7 s of exchanges exposed, split 2:5 over the forward and the backward."""
    timing = combined_layer_timing(SLOW_DISPATCH, delay_wgrad=False)
    assert timing.pair_s == pytest.approx(16.0, abs=EXACT)
    assert timing.work_s == pytest.approx(15.0, abs=EXACT)
    assert timing.exchange_s == pytest.approx(7.0, abs=EXACT)
    assert timing.exposed_s == pytest.approx(1.0, abs=EXACT)
    assert timing.hidden_s == pytest.approx(6.0, abs=EXACT)
    assert timing.forward_exposed_s == pytest.approx(2.0 / 7.0, abs=EXACT)
    assert timing.backward_exposed_s == pytest.approx(5.0 / 7.0, abs=EXACT)
    assert timing.hidden_by_delayed_wgrad_s == 0.0
    # alone, nothing overlaps: the serial sums
    assert timing.forward_alone_s == pytest.approx(7.0, abs=EXACT)
    assert timing.backward_alone_s == pytest.approx(15.0, abs=EXACT)
    assert timing.unpaired_forward_s == pytest.approx(7.0 - 5.0 - 2.0 / 7.0, abs=EXACT)
    assert timing.unpaired_backward_s == pytest.approx(15.0 - 10.0 - 5.0 / 7.0, abs=EXACT)


def test_delayed_wgrad_fills_the_backward_dispatch() -> None:
    """With the weight gradients split off: experts dgrad [2,5], dispatch_b [5,9] beside the
    experts wgrad [5,8], experts_f [8,11], attention dgrad [11,13], its wgrad [13,15] beside
    the next layer's combine_b; from the second layer on 15 s a layer = the work: the 1 s the
    dispatch exposed is hidden by the delayed wgrad. Alone, the backward's dispatch hides under
    the experts wgrad and its combine under the attention wgrad: 11 s instead of 15 s."""
    timing = combined_layer_timing(SLOW_DISPATCH, delay_wgrad=True)
    assert timing.pair_s == pytest.approx(15.0, abs=EXACT)
    assert timing.exposed_s == pytest.approx(0.0, abs=EXACT)
    assert timing.hidden_by_delayed_wgrad_s == pytest.approx(1.0, abs=EXACT)
    assert timing.backward_alone_s == pytest.approx(11.0, abs=EXACT)
    assert timing.forward_alone_s == pytest.approx(7.0, abs=EXACT)
    assert timing.unpaired_forward_s == pytest.approx(2.0, abs=EXACT)
    assert timing.unpaired_backward_s == pytest.approx(1.0, abs=EXACT)


_TIMES = st.floats(0.0, 10.0, allow_nan=False)


@given(st.lists(_TIMES, min_size=10, max_size=10), st.booleans())
def test_a_pair_lies_between_its_work_and_the_serial_sum(times: list[float], delay: bool) -> None:
    """Conservation: the exchanges hidden and exposed add up to their link time, a pair never
    takes less than its longer stream's work nor more than everything in a row, and the
    delayed wgrad never lengthens a pair."""
    passes = MoeLayerPasses(
        forward_attention_s=times[0],
        forward_dispatch_s=times[1],
        forward_experts_s=times[2],
        forward_combine_s=times[3],
        backward_combine_s=times[4],
        backward_experts_dgrad_s=times[5],
        backward_experts_wgrad_s=times[6],
        backward_dispatch_s=times[7],
        backward_attention_dgrad_s=times[8],
        backward_attention_wgrad_s=times[9],
    )
    timing = combined_layer_timing(passes, delay_wgrad=delay)
    tol = 1e-9
    assert timing.hidden_s + timing.exposed_s == pytest.approx(timing.exchange_s, abs=tol)
    assert -tol <= timing.exposed_s <= timing.exchange_s + tol
    assert timing.pair_s >= timing.work_s - tol
    assert timing.pair_s <= passes.forward_s + passes.backward_s + tol
    assert timing.forward_alone_s == pytest.approx(passes.forward_s, abs=tol)
    assert timing.backward_alone_s <= passes.backward_s + tol
    no_delay = combined_layer_timing(passes, delay_wgrad=False)
    assert timing.pair_s <= no_delay.pair_s + tol
    assert timing.hidden_by_delayed_wgrad_s == pytest.approx(
        no_delay.pair_s - timing.pair_s if delay else 0.0, abs=tol
    )


def test_the_exchange_kernels_sms_slow_the_compute_beside_them() -> None:
    """A flex library holding a share f of the SMs slows the compute it overlaps to first order:
    the steady layer gains f / (1 - f) x the time both streams are busy. Traced by hand: the
    backward's combine (comm, 1 s) runs beside the forward's attention (comp, 1 s) and nothing
    else has a duration, so each layer is 1 s with 1 s of overlap: 1 + 1 x 0.25 / 0.75 at
    f = 0.25; a forward alone overlaps nothing."""
    from dataclasses import replace

    lone = MoeLayerPasses(
        forward_attention_s=1.0,
        forward_dispatch_s=0.0,
        forward_experts_s=0.0,
        forward_combine_s=0.0,
        backward_combine_s=1.0,
        backward_experts_dgrad_s=0.0,
        backward_experts_wgrad_s=0.0,
        backward_dispatch_s=0.0,
        backward_attention_dgrad_s=0.0,
        backward_attention_wgrad_s=0.0,
    )
    assert combined_layer_timing(lone, delay_wgrad=False).pair_s == pytest.approx(1.0, abs=EXACT)
    shared = combined_layer_timing(replace(lone, exchange_sm_share=0.25), delay_wgrad=False)
    assert shared.pair_s == pytest.approx(1.0 + 1.0 / 3.0, abs=EXACT)
    assert shared.forward_alone_s == pytest.approx(1.0, abs=EXACT)
    # SLOW_DISPATCH as traced in test_delayed_wgrad_fills_the_backward_dispatch: with delayed
    # wgrad the pair is 15 s and all 7 s of exchanges run beside compute, 15 + 7 x 0.2 / 0.8;
    # without it 16 s with 6 s beside compute, 16 + 6 x 0.2 / 0.8
    shared_sms = replace(SLOW_DISPATCH, exchange_sm_share=0.2)
    assert combined_layer_timing(SLOW_DISPATCH, delay_wgrad=True).pair_s == pytest.approx(
        15.0, abs=EXACT
    )
    delayed = combined_layer_timing(shared_sms, delay_wgrad=True)
    assert delayed.pair_s == pytest.approx(16.75, abs=EXACT)
    assert combined_layer_timing(shared_sms, delay_wgrad=False).pair_s == pytest.approx(
        17.5, abs=EXACT
    )
    with pytest.raises(ConfigError) as error:
        replace(lone, exchange_sm_share=1.0)
    assert "exchange_sm_share must be in [0, 1)" in str(error.value)
