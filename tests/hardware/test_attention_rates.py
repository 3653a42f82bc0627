"""A narrow sliding window's fused-kernel rate against cuDNN's measured SDPA training benchmark.

Figures (NVIDIA/cudnn-frontend, ``benchmark/sdpa_benchmark_training/results``): GB200, bf16,
d = 64, causal with a sliding window, FLOPs of the window's band only, the benchmark's own
TFLOP/s and milliseconds.

- ``gpt_oss/gb200/gpt_oss_20260813_110803.csv`` @20dc108987f2 (cuDNN 9.27): window 128, B 2 x
  128 heads; s = 4096: forward 0.207 ms (163 TFLOP/s), backward 0.458 ms (185).
- ``gb200_919_only_cudnn/gpt_oss_20260226_175022.csv`` @afa9f7c0be7e (cuDNN 9.19.1): window
  1024, B 2 x 64 heads (8 KV heads); s = 32768: forward 632, backward 660 TFLOP/s.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blueprinting.hardware.attention import (
    BACKWARD_FLOPS_PER_PAIR_DIM,
    FORWARD_FLOPS_PER_PAIR_DIM,
    GB200_FLASH_ATTENTION_4,
    H100_FLASH_ATTENTION_2,
    NARROW_WINDOW_FRACTION,
    NARROW_WINDOW_KEYS,
    windowed_attention_pairs,
    windowed_rate_fraction,
    windowed_rate_seq_length,
)


def _combined(forward_tflops: float, backward_tflops: float) -> float:
    """Forward + backward TFLOP/s in the module's convention (backward 2.5 x the forward)."""
    return 3.5 / (1 / forward_tflops + 2.5 / backward_tflops)


def test_the_narrow_window_fraction_is_cudnns_measured_rate_over_the_rule() -> None:
    measured = _combined(163, 185)
    assert measured == pytest.approx(178.1, abs=0.05)
    rule = GB200_FLASH_ATTENTION_4.flop_per_s(
        seq_length=windowed_rate_seq_length(4096, NARROW_WINDOW_KEYS), head_dim=64
    )
    assert rule / 1e12 == pytest.approx(398.6, abs=0.05)
    assert round(measured / (rule / 1e12), 2) == NARROW_WINDOW_FRACTION == 0.45


def test_gpt_oss_window_kernel_time_on_gb200_against_cudnn() -> None:
    """The benchmark's shape timed by the model: B x heads = 256, s = 4096, 128 keys; forward
    + backward within 2% of cuDNN's 0.207 + 0.458 ms."""
    keys, s, batch_heads, d = 128, 4096, 256, 64
    pairs = windowed_attention_pairs(s, keys) * batch_heads
    rate = GB200_FLASH_ATTENTION_4.flop_per_s(
        seq_length=windowed_rate_seq_length(s, keys), head_dim=d, window_keys=keys
    )
    seconds = (FORWARD_FLOPS_PER_PAIR_DIM + BACKWARD_FLOPS_PER_PAIR_DIM) * d * pairs / rate
    assert seconds * 1e3 == pytest.approx(0.207 + 0.458, rel=0.02)


def test_a_wide_window_keeps_the_rule_on_gb200() -> None:
    """1024 keys (2W = 2048, inside the table): the rule alone, within 1% of cuDNN's steady
    state at s = 32k."""
    assert windowed_rate_fraction(1024, 512) == 1.0
    rule = GB200_FLASH_ATTENTION_4.flop_per_s(
        seq_length=windowed_rate_seq_length(32768, 1024), head_dim=64, window_keys=1024
    )
    assert rule / 1e12 == pytest.approx(_combined(632, 660), rel=0.01)


def test_the_fraction_by_window() -> None:
    assert windowed_rate_fraction(None, 512) == 1.0
    assert windowed_rate_fraction(256, 512) == 1.0
    assert windowed_rate_fraction(NARROW_WINDOW_KEYS, 512) == NARROW_WINDOW_FRACTION
    assert windowed_rate_fraction(16, 512) == NARROW_WINDOW_FRACTION
    # GPT-OSS's 129 keys: a hundredth of an octave above the measured 128
    assert windowed_rate_fraction(129, 512) == pytest.approx(0.45 + 0.55 * 0.011227, rel=1e-4)
    # full attention and a window as long as the table's rows read the table unchanged
    assert H100_FLASH_ATTENTION_2.flop_per_s(
        seq_length=512, head_dim=64, window_keys=256
    ) == H100_FLASH_ATTENTION_2.flop_per_s(seq_length=512, head_dim=64)


@given(keys=st.integers(1, 4096), more=st.integers(1, 4096))
def test_the_fraction_never_falls_as_the_window_widens(keys: int, more: int) -> None:
    low, high = windowed_rate_fraction(keys, 512), windowed_rate_fraction(keys + more, 512)
    assert NARROW_WINDOW_FRACTION <= low <= high <= 1.0
